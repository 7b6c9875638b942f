"""Hostile repositories and long runs: every read verified, nothing outside
.mvc ever written, no FIFO read, dead readers and thousands of packs survived.

Each test builds the damage for real (bytes edited in data.mdb, symlinks,
FIFOs, SIGKILLed processes, a lowered descriptor limit) and checks what a
user sees.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import mvc
from mvc.store.index import MAX_KEY
from mvc.errors import Unstorable, WalkDamaged
from mvc.store.fs import NotRegular
from mvc.store.packs import pack_filename

from conftest import SMALL_CHUNK

PY = sys.executable


def _replace_in_index(repo, old: bytes, new: bytes) -> None:
    """Edit bytes of data.mdb in place, as a bit flip on disk would (same length)."""
    repo.close()
    path = repo.dir / "index" / "data.mdb"
    data = path.read_bytes()
    assert data.count(old) >= 1, old
    path.write_bytes(data.replace(old, new))


def _run(code: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


# -- 1. every object read is verified ------------------------------------------

def test_a_value_edited_in_the_index_is_caught_by_load(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    repo.commit({"note": "needle-17", "w": torch.arange(6.0)}, "m")
    _replace_in_index(repo, b"needle-17", b"needle-19")
    repo = mvc.Repository.open(tmp_path)
    with pytest.raises(mvc.CorruptObject) as exc:
        repo.load("HEAD")
    assert exc.value.id is not None and exc.value.kind == "tree"
    assert not repo.fsck().ok
    repo.close()


def test_a_message_edited_in_the_index_is_caught_by_log_and_show(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    c = repo.commit({"w": torch.ones(3)}, "loss was 0.50 here", metrics={"loss": 0.5})
    _replace_in_index(repo, b"loss was 0.50", b"loss was 0.25")
    repo = mvc.Repository.open(tmp_path)
    with pytest.raises(mvc.CorruptObject) as exc:
        list(repo.log())
    assert (exc.value.kind, exc.value.id) == ("commit", c.id)
    with pytest.raises(mvc.CorruptObject):
        repo.get_commit("HEAD")
    repo.close()


def test_a_tensor_shape_swapped_in_the_index_is_caught(repo):
    from mvc.objects import TensorObject
    c = repo.commit({"w": torch.zeros(3, 4)}, "m")
    tid = bytes.fromhex(repo.entries(c.id)[0].tensor_id)
    with repo.index.write() as txn:
        obj = repo.objects.tensor(txn, tid)
        forged = TensorObject(obj.dtype, (4, 3), obj.chunk_size, obj.chunks).encode()
        txn._txn.put(tid, forged, db=txn._dbs["tensors"])  # what a flipped byte in data.mdb leaves
    with pytest.raises(mvc.CorruptObject) as exc:  # it decodes, but its bytes do not hash to its id
        repo.load(c.id)
    assert (exc.value.kind, exc.value.id) == ("tensor", tid.hex())


def test_a_flipped_ref_is_detected_not_followed(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    c = repo.commit({"w": torch.ones(2)}, "m")
    repo.create_tag("v1", c.id)
    with repo.index.read() as txn:
        raw = txn._txn.get(b"tags/v1", db=txn._dbs["refs"])
    flipped = raw[:20] + bytes([raw[20] ^ 1]) + raw[21:]  # inside the commit id
    with repo.index.write() as txn:
        txn._txn.put(b"tags/v1", flipped, db=txn._dbs["refs"])
    with pytest.raises(mvc.CorruptObject) as exc:
        repo.resolve("v1")
    assert (exc.value.kind, exc.value.field, exc.value.name) == ("ref", "checksum", "tags/v1")
    report = repo.fsck()
    assert [d.kind for d in report.damage] == ["corrupt-ref"]
    with pytest.raises(mvc.CorruptObject):  # gc agrees with fsck and deletes nothing
        repo.gc()
    repo.close()


def test_a_damaged_reflog_entry_fsck_reports_and_gc_refuses(repo):
    repo.commit({"w": torch.ones(2)}, "m")
    with repo.index.write() as txn:
        key = next(iter(txn.ids("reflog")))
        txn._txn.put(key, b"\xc1" + bytes(8) + b"\x92\x01", db=txn._dbs["reflog"])
    assert [d.kind for d in repo.fsck().damage] == ["corrupt-reflog"]
    with pytest.raises(WalkDamaged) as err:
        repo.gc()
    assert err.value.kind == "corrupt-reflog"
    assert repo.reflog.expire(damaged=True) == 1
    assert repo.fsck().ok and repo.gc().commits_removed == 0


# -- 2. never outside the repository ---------------------------------------------

def test_gc_gate_as_a_symlink_is_refused_and_its_target_untouched(repo, tmp_path):
    repo.commit({"w": torch.ones(2)}, "m")
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    gate = repo.dir / "locks" / "gc.gate"
    if gate.exists():
        gate.unlink()
    gate.symlink_to(target)
    with pytest.raises(NotRegular) as err:
        repo.gc()
    assert err.value.path == str(gate)
    with pytest.raises(mvc.MvcError):
        repo.load()
    assert target.read_text() == "keep me"


def test_a_dangling_gc_lock_link_creates_nothing(repo, tmp_path):
    repo.commit({"w": torch.ones(2)}, "m")
    lock = repo.dir / "locks" / "gc.lock"
    if lock.exists():
        lock.unlink()
    lock.symlink_to(tmp_path / "created-by-mvc")
    with pytest.raises(NotRegular):
        repo.load()
    assert not (tmp_path / "created-by-mvc").exists()


def test_a_pack_replaced_by_a_symlink_is_never_read(repo, tmp_path):
    c = repo.commit({"w": torch.arange(40.0)}, "m")
    pack = next((repo.dir / "packs").glob("pack-*.pack"))
    outside = tmp_path / "outside.pack"
    os.rename(pack, outside)
    pack.symlink_to(outside)
    with pytest.raises(NotRegular):
        repo.load(c.id)
    kinds = {d.kind for d in repo.fsck().damage}
    assert "not-a-regular-file" in kinds


def test_format_and_index_files_as_links_are_refused(tmp_path):
    mvc.Repository.init(tmp_path / "a").close()
    fmt = tmp_path / "a" / ".mvc" / "FORMAT"
    real = tmp_path / "FORMAT.real"
    os.rename(fmt, real)
    fmt.symlink_to(real)
    with pytest.raises(mvc.NotARepository):
        mvc.Repository.open(tmp_path / "a")
    mvc.Repository.init(tmp_path / "b").close()
    data = tmp_path / "b" / ".mvc" / "index" / "data.mdb"
    os.rename(data, tmp_path / "data.mdb")
    data.symlink_to(tmp_path / "data.mdb")
    with pytest.raises(NotRegular):
        mvc.Repository.open(tmp_path / "b")


# -- 3. a FIFO is damage to report, never to read -----------------------------------

def test_a_fifo_in_packs_does_not_hang_fsck_or_gc(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    repo.commit({"w": torch.arange(20.0)}, "m")
    repo.close()
    os.mkfifo(tmp_path / ".mvc" / "packs" / pack_filename(b"\x01" * 16))
    done = _run(f"""
        import mvc
        repo = mvc.Repository.open({str(tmp_path)!r})
        r = repo.fsck(quick=True)
        print(sorted(d.kind for d in r.damage))
        g = repo.gc(grace=0)
        print(g.notes)
        print(repo.fsck().ok)
    """, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "['not-a-regular-file']" and "not a regular file" in lines[1]


def test_a_fifo_in_place_of_a_referenced_pack_fails_load_at_once(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    repo.commit({"w": torch.arange(20.0)}, "m")
    pack = next((tmp_path / ".mvc" / "packs").glob("pack-*.pack"))
    repo.close()
    pack.unlink()
    os.mkfifo(pack)
    done = _run(f"""
        import mvc
        try:
            mvc.Repository.open({str(tmp_path)!r}).load()
        except mvc.MvcError as exc:
            print(type(exc).__name__, exc)
    """, timeout=60)
    assert done.returncode == 0 and "FIFO" in done.stdout, done.stdout + done.stderr


# -- 5. dead readers ------------------------------------------------------------

def test_readers_killed_mid_transaction_do_not_fill_the_reader_table(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    repo.commit({"w": torch.ones(2)}, "m")
    repo.close()
    # One process holds every one of LMDB's 126 reader slots, then dies by SIGKILL.
    child = subprocess.Popen([PY, "-c", textwrap.dedent(f"""
        import sys, time, lmdb
        env = lmdb.open({str(tmp_path / '.mvc' / 'index')!r}, max_dbs=16)
        txns = [env.begin() for _ in range(126)]
        print("ready", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGKILL)
    child.wait()
    repo = mvc.Repository.open(tmp_path)  # clears the dead slots
    assert repo.commit({"w": torch.zeros(2)}, "after").branch == "main"  # committed, not refused
    assert [c.message for c in repo.log()] == ["after", "m"]
    repo.close()


# -- 6. thousands of packs under the usual descriptor limit ------------------------------

@pytest.mark.slow
def test_many_packs_load_fsck_and_diff_under_a_low_descriptor_limit(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    state = {}
    for i in range(300):  # one pack per commit, all live
        state[f"t{i}"] = torch.full((4,), float(i))
        repo.commit(state, f"c{i}")
    repo.close()
    done = _run(f"""
        import resource, mvc
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
        repo = mvc.Repository.open({str(tmp_path)!r})
        s = repo.load()
        assert len(s) == 300 and float(s["t299"][0]) == 299.0
        assert repo.fsck().ok
        assert len(repo.diff("HEAD~299", "HEAD").changed()) == 299
        print("ok", repo.chunks.packs.open_count())
    """, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "ok" and int(done.stdout.split()[1]) <= 128


# -- 7. retention reads each commit once ---------------------------------------------

def test_retention_reads_each_commit_once_however_many_branches_share_it(repo, monkeypatch):
    for i in range(30):
        repo.commit({"w": torch.full((2,), float(i))}, f"c{i}", metrics={"loss": float(i)})
    for b in range(20):
        repo.create_branch(f"b{b}", "HEAD")
    reads = []
    real = repo.objects.commit
    monkeypatch.setattr(repo.objects, "commit", lambda txn, oid: reads.append(oid) or real(txn, oid))
    report = repo.gc(keep_last=3)
    retention_reads = len(reads)
    assert len(report.pruned) == 27
    assert retention_reads <= 30, retention_reads


# -- 8. reflog expiry and lost data -------------------------------------------------

def test_reflog_expiry_lets_gc_reclaim_a_force_moved_branch(repo):
    old = repo.commit({"w": torch.randn(64)}, "old")
    repo.create_branch("side", old.id)
    repo.commit({"w": torch.randn(64)}, "new", branch="side")
    repo.create_branch("side", old.id, force=True)  # the "new" commit is now only in the reflog
    assert repo.gc(grace=0).commits_removed == 0
    assert repo.reflog.expire() > 0
    assert repo.gc(grace=0).commits_removed == 1
    assert repo.fsck().ok


def test_commits_whose_data_is_lost_can_be_pruned_so_gc_runs_again(repo):
    c1 = repo.commit({"a": torch.randn(32)}, "one")
    c2 = repo.commit({"a": torch.randn(32), "b": torch.randn(32)}, "two")
    lost = next(e for e in repo.entries(c2.id) if e.key == "b")
    with repo.index.write() as txn:  # c2's tensor "b" is lost for good
        txn.delete("tensors", bytes.fromhex(lost.tensor_id))
    report = repo.fsck()
    assert not report.ok and {c2.id} == {c for d in report.damage for c in d.commits}
    with pytest.raises(WalkDamaged) as err:
        repo.gc()
    assert (err.value.kind, err.value.id) == ("missing-tensor", lost.tensor_id)
    assert mvc.fsck.prune_lost(repo) == (c2.id,)
    assert repo.fsck().ok
    repo.gc(grace=0)
    assert repo.fsck().ok
    with pytest.raises(mvc.CommitPruned) as exc:
        repo.load(c2.id)
    assert exc.value.id == c2.id
    assert repo.load(c1.id)["a"].shape == (32,)


# -- 9. one depth limit, checked at commit -----------------------------------------

def test_the_deepest_state_mvc_accepts_can_be_read_checked_and_exported(repo, tmp_path):
    from mvc.traverse import MAX_DEPTH
    deep = torch.ones(2)
    for _ in range(MAX_DEPTH):
        deep = {"x": deep}
    repo.commit(deep, "deep")
    assert repo.fsck().ok
    repo.gc()
    assert repo.export("HEAD", tmp_path / "deep.pt").path.exists()
    too_deep = {"x": deep}
    with pytest.raises(Unstorable) as err:
        repo.commit(too_deep, "deeper")
    assert err.value.reason == "depth"


# -- 10. misleading index errors -------------------------------------------------

def test_a_read_only_repository_can_still_be_read(tmp_path):
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=SMALL_CHUNK)
    repo.commit({"w": torch.arange(5.0)}, "m")
    repo.close()
    (tmp_path / "ro").mkdir()
    code = textwrap.dedent(f"""
        import mvc
        repo = mvc.Repository.open({str(tmp_path / 'ro')!r})
        print([c.message for c in repo.log()], repo.load()["w"].tolist())
        try:
            repo.create_branch("x")
        except mvc.MvcError as exc:
            print("refused:", exc)
    """)
    # A read-only bind mount in a mount namespace of its own (gone when it exits).
    script = (f"mount --bind {tmp_path / 'r'} {tmp_path / 'ro'} && "
              f"mount -o remount,bind,ro {tmp_path / 'ro'} && exec {PY} -c \"$0\"")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, code], capture_output=True, text=True,
                          timeout=60)
    if "mount" in done.stderr and done.returncode != 0:
        pytest.skip(f"no read-only bind mount here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "['m'] [0.0, 1.0, 2.0, 3.0, 4.0]" in done.stdout and "read-only" in done.stdout


def test_a_small_address_space_limit_still_opens_the_index(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=SMALL_CHUNK)
    repo.commit({"w": torch.ones(2)}, "m")
    repo.close()
    done = _run(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # under the 64 GiB map
        import mvc
        repo = mvc.Repository.open({str(tmp_path)!r})
        repo.create_branch("b")
        print([c.message for c in repo.log()])
    """)
    assert done.returncode == 0, done.stderr
    assert "['m']" in done.stdout


def test_an_overlong_branch_name_is_refused_before_anything_is_written(repo):
    name = "b" * (MAX_KEY + 1)
    with pytest.raises(mvc.InvalidRefName) as err:
        repo.commit({"w": torch.ones(2)}, "m", branch=name)
    assert err.value.name == name and "longer than" in err.value.problem
    assert list((repo.dir / "packs").iterdir()) == []


# -- 12. non-contiguous tensors are copied a piece at a time ----------------------------

def test_strided_tensors_are_not_all_copied_at_once(tmp_path):
    done = _run(f"""
        import resource, torch, mvc
        repo = mvc.Repository.init({str(tmp_path)!r})
        views = {{f"t{{i}}": torch.randn(2048, 2048).t() for i in range(16)}}  # 16 x 16 MiB, strided
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        repo.commit(views, "m")
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(grown // 1024)
    """, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) < 100  # MiB: a few copies at a time, not all 256 MiB


# -- 13. smaller -------------------------------------------------------------------

def test_heads_and_tags_prefixes_mean_the_same_in_log_and_checkout(repo):
    c = repo.commit({"w": torch.ones(2)}, "m")
    repo.create_branch("dev")
    assert [x.id for x in repo.log("heads/dev")] == [c.id]
    assert repo.checkout("heads/dev") == mvc.Head("dev", c.id)
    repo.create_tag("v1")
    assert repo.resolve("tags/v1") == c.id


def test_a_nested_tensor_is_bad_input(repo):
    nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(Unstorable) as err:
        repo.commit({"n": nt}, "m")
    assert (err.value.key, err.value.reason) == ("n", "nested-tensor")


def test_cli_reflog_expire_fsck_prune_lost_and_gc_expire_reflog(repo):
    from conftest import run_cli
    old = repo.commit({"w": torch.randn(64)}, "old")
    repo.create_branch("side", old.id)
    repo.commit({"w": torch.randn(64)}, "new", branch="side")
    repo.create_branch("side", old.id, force=True)
    assert run_cli(repo, "reflog", "expire", "--expire", "x").exit_code == 2
    result = run_cli(repo, "reflog", "expire", "side")
    assert result.exit_code == 0 and result.output.startswith("expired ")
    result = run_cli(repo, "gc", "--expire-reflog", "0", "--grace", "0", "--json")
    assert result.exit_code == 0 and json.loads(result.output)["commits_removed"] == 1
    c = repo.commit({"a": torch.randn(8), "b": torch.randn(8)}, "lost")
    lost = next(e for e in repo.entries(c.id) if e.key == "b")
    with repo.index.write() as txn:
        txn.delete("tensors", bytes.fromhex(lost.tensor_id))
    assert run_cli(repo, "fsck").exit_code == 1
    result = run_cli(repo, "fsck", "--prune-lost")
    assert result.exit_code == 0 and f"as pruned: {c.id[:12]}" in result.output
    assert run_cli(repo, "gc").exit_code == 0


def test_a_forged_pt_whose_views_expand_far_beyond_the_file_is_refused(repo, tmp_path):
    from conftest import run_cli
    small = torch.zeros(1)
    huge = small.as_strided((65536, 65536), (0, 0))  # 16 GiB of float32 named by 4 bytes
    torch.save({"w": huge}, tmp_path / "forged.pt")
    assert (tmp_path / "forged.pt").stat().st_size < 4096
    result = run_cli(repo, "commit", str(tmp_path / "forged.pt"), "-m", "x")
    assert result.exit_code == 1 and "would expand to" in result.stderr
    assert result.stderr.count("\n") == 1 and repo.head().id is None
    torch.save({"w": torch.randn(64, 64), "t": torch.randn(64, 64).t()}, tmp_path / "fine.pt")
    assert run_cli(repo, "commit", str(tmp_path / "fine.pt"), "-m", "ok").exit_code == 0


def test_a_forged_state_dict_whose_views_expand_is_refused_too(repo, tmp_path):
    """torch.load gives a state_dict back as an OrderedDict: the guard looks inside it as inside a dict."""
    from collections import OrderedDict

    from conftest import run_cli
    huge = torch.zeros(1).as_strided((4096, 8192), (0, 0))  # 128 MiB of float32 named by 4 bytes
    torch.save(OrderedDict(w=huge), tmp_path / "forged.pt")
    result = run_cli(repo, "commit", str(tmp_path / "forged.pt"), "-m", "x")
    assert result.exit_code == 1 and "would expand to" in result.stderr
    assert repo.head().id is None


def test_gc_repack_merges_hundreds_of_small_live_packs_into_one(repo):
    state = {}
    for i in range(120):
        state[f"t{i}"] = torch.full((4,), float(i))
        repo.commit(state, f"c{i}")
    packs = lambda: sorted((repo.dir / "packs").glob("pack-*.pack"))  # noqa: E731
    assert len(packs()) == 120
    repo.gc(grace=0)
    assert len(packs()) == 120  # a plain gc leaves all-live packs alone
    repo.gc(grace=0, repack=True)
    assert len(packs()) == 1
    assert repo.fsck().ok
    back = repo.load()
    assert all(torch.equal(back[k], v) for k, v in state.items())
