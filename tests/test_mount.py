"""mvc mount on real FUSE: a repository as read-only model folders.

Every test mounts with the real ``mvc mount`` in a process of its own (the
kernel answers a mounted file's reads through it; a read from the process
that serves them could wait on itself) and unmounts with ``mvc umount``.
A machine that cannot mount fails these tests: CI installs fuse3 and runs
as root, so a skip would hide a broken mount.
"""

import errno
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import mvc
from mvc import mount as mounting
from mvc.errors import MountError

from conftest import run_cli
from damage import flip_bit, records

CHUNK = 64 << 10
WAIT = 60  # seconds a mount may take to come up or go away (the machine is shared)


class Mount:
    """``mvc mount`` of ``root`` at ``where`` in a process of its own, live once made."""

    def __init__(self, root: Path, where: Path, *args):
        where.mkdir(exist_ok=True)
        self.root, self.where = root, where
        self.proc = subprocess.Popen([sys.executable, "-m", "mvc", "-C", str(root), "mount", str(where), "--json",
                                      *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + WAIT
        while not self.live():
            if self.proc.poll() is not None:
                pytest.fail(f"mvc mount exited {self.proc.returncode}: {self.proc.stderr.read()}")
            assert time.monotonic() < deadline, "mvc mount did not come up"
            time.sleep(0.05)
        self.stats, self.stderr = None, ""

    def live(self) -> bool:
        try:
            return mounting.mounted(self.where) == "fuse.mvc" and bool(os.listdir(self.where))
        except OSError:  # a dead mount this one clears first
            return False

    def stop(self) -> dict:
        """Unmount with ``mvc umount``; what the mount served ({} if it was killed)."""
        gc.collect()  # tensors a loader mapped from the mount keep it busy until they go
        if mounting.mounted(self.where) == "fuse.mvc":
            out = run_cli(self.root, "umount", self.where)
            assert out.exit_code == 0, out.output
        stdout, self.stderr = self.proc.communicate(timeout=WAIT)
        self.stats = json.loads(stdout) if stdout.strip() else {}
        return self.stats

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=WAIT)


@pytest.fixture
def mounts():
    made = []

    def start(root, where, *args):
        made.append(Mount(root, where, *args))
        return made[-1]
    yield start
    for m in made:  # whatever a failed test left: never a mount in pytest's folders
        for _ in range(5):
            if not mounting.mounted(m.where):
                break
            subprocess.run(["fusermount3", "-u", "-z", str(m.where)], capture_output=True)
        if m.proc.poll() is None:
            try:
                m.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # a failed test still holds a file of it open
                m.kill()


def state_of_every_dtype():
    torch.manual_seed(0)
    return {"w": torch.randn(300, 100), "b": torch.arange(1000), "h": torch.randn(77).half(),
            "bf": torch.randn(33, 5).to(torch.bfloat16), "mask": torch.rand(50) > 0.5,
            "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4), "i8": torch.randint(-100, 100, (9,), dtype=torch.int8),
            "lr": 0.1, "note": "plain values are left out"}


@pytest.fixture
def root(tmp_path):
    mvc.Repository.init(tmp_path / "repo", chunk_size=CHUNK).close()
    return tmp_path / "repo"


def test_safe_open_on_a_mounted_file_gives_every_tensor_bit_for_bit(root, tmp_path, mounts):
    with mvc.Repository.open(root) as repo:
        c = repo.commit(state_of_every_dtype(), "one")
        repo.create_tag("v1.0")
        repo.export("main", tmp_path / "exported.safetensors")
        state = repo.load("main")
    m = mounts(root, tmp_path / "mnt")
    where = m.where
    assert sorted(os.listdir(where)) == ["HEAD", "commits", "main", "tags"]
    assert os.readlink(where / "main") == f"commits/{c.id}"
    assert os.readlink(where / "tags" / "v1.0") == f"../commits/{c.id}"
    assert os.readlink(where / "commits" / c.id[:12]) == c.id  # a short id links to the full one
    assert os.listdir(where / "commits") == [c.id]
    for name in ("main", "HEAD", "tags/v1.0", f"commits/{c.id}", f"commits/{c.id[:12]}"):
        path = where / name / "model.safetensors"
        with safe_open(path, framework="pt") as f:
            assert set(f.keys()) == {k for k, v in state.items() if isinstance(v, torch.Tensor)}
            for key in f.keys():
                got = f.get_tensor(key)
                assert got.dtype == state[key].dtype and torch.equal(got, state[key]), key
            del got  # it maps the mounted file: the mount is busy while it lives
    # the same bytes as an export: one home for the header
    assert (where / "main" / "model.safetensors").read_bytes() == (tmp_path / "exported.safetensors").read_bytes()
    assert (where / "main" / "model.safetensors").stat().st_mtime == pytest.approx(c.time, abs=1e-3)
    with pytest.raises(OSError) as err:
        open(where / "main" / "model.safetensors", "r+b")
    assert err.value.errno in (errno.EROFS, errno.EACCES)
    stats = m.stop()
    assert stats["errors"] == 0 and stats["reads"] > 0 and mounting.mounted(where) is None


def test_a_branch_moves_when_its_ref_moves_and_a_commit_folder_never_changes(root, tmp_path, mounts):
    with mvc.Repository.open(root) as repo:
        first = repo.commit({"w": torch.ones(1000)}, "one")
        m = mounts(root, tmp_path / "mnt")
        old = (m.where / "main" / "model.safetensors").read_bytes()
        size = (m.where / f"commits/{first.id}/model.safetensors").stat().st_size
        second = repo.commit({"w": torch.full((2000,), 2.0), "v": torch.zeros(3)}, "two")
        repo.create_branch("feature/x", first.id)
    deadline = time.monotonic() + WAIT
    while os.readlink(m.where / "main") != f"commits/{second.id}":  # the kernel may keep a name a second
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert load_file(m.where / "main" / "model.safetensors")["w"].eq(2.0).all()
    assert (m.where / f"commits/{first.id}/model.safetensors").read_bytes() == old
    assert (m.where / f"commits/{first.id}/model.safetensors").stat().st_size == size
    assert os.readlink(m.where / "feature" / "x") == f"../commits/{first.id}"
    assert load_file(m.where / "feature" / "x" / "model.safetensors")["w"].eq(1.0).all()
    m.stop()


def test_mount_of_one_revision_shows_it_at_the_top(root, tmp_path, mounts):
    with mvc.Repository.open(root) as repo:
        first = repo.commit({"w": torch.arange(10)}, "one")
        repo.commit({"w": torch.arange(20)}, "two")
    m = mounts(root, tmp_path / "mnt", "--rev", "main~1")
    assert os.listdir(m.where) == ["model.safetensors"]
    assert torch.equal(load_file(m.where / "model.safetensors")["w"], torch.arange(10))
    m.stop()
    assert first.id


def test_transformers_from_pretrained_loads_a_model_folder_from_the_mount(root, tmp_path, mounts):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    source = tmp_path / "hf"
    model.save_pretrained(source, max_shard_size="20KB")  # shards and an index file
    (source / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    assert run_cli(root, "commit", source).exit_code == 0
    assert run_cli(root, "export", "main", "-o", tmp_path / "exported").exit_code == 0
    m = mounts(root, tmp_path / "mnt")
    here = m.where / "main"
    assert sorted(os.listdir(here)) == sorted(os.listdir(source))
    for name in os.listdir(source):
        # configs as committed; shards as mvc's export writes them (one header building)
        assert (here / name).read_bytes() == (tmp_path / "exported" / name).read_bytes(), name
        if not name.endswith(".safetensors"):
            assert (here / name).read_bytes() == (source / name).read_bytes(), name
    loaded = transformers.AutoModel.from_pretrained(here)
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    del loaded, a, b  # its weights may map the mounted files: the mount is busy while they live
    m.stop()


def test_loading_two_of_fifty_tensors_reads_a_small_share_of_the_commit(root, tmp_path, mounts):
    torch.manual_seed(0)
    state = {f"layer{i:02d}": torch.randn(512, 1024) for i in range(50)}  # 2 MiB each, 100 MiB in all
    with mvc.Repository.open(root) as repo:
        repo.commit(state, "fifty")
    m = mounts(root, tmp_path / "mnt")
    with safe_open(m.where / "main" / "model.safetensors", framework="pt") as f:
        for key in ("layer07", "layer31"):
            assert torch.equal(f.get_tensor(key), state[key])
    stats = m.stop()
    total = sum(t.nbytes for t in state.values())
    assert 2 * state["layer07"].nbytes <= stats["chunk_bytes_read"] <= total // 10, stats


def test_a_flipped_byte_in_a_pack_fails_that_range_with_eio_and_nothing_else(root, tmp_path, mounts):
    torch.manual_seed(0)
    state = {"a": torch.randn(4 * CHUNK // 4), "b": torch.randn(4 * CHUNK // 4)}
    with mvc.Repository.open(root) as repo:
        repo.commit(state, "two tensors")
        entry = next(e for e in repo.entries("main") if e.path == ("b",))
        bad = entry.chunks[2]  # b's third chunk
        path, _, offset, _ = next(r for r in records(repo) if r[1] == bad)
    flip_bit(path, offset + 100)
    torch.save(state["b"], tmp_path / "b.pt")
    m = mounts(root, tmp_path / "mnt")
    file = m.where / "main" / "model.safetensors"
    header = 8 + int.from_bytes(file.open("rb").read(8), "little")
    fd = os.open(file, os.O_RDONLY)
    try:
        layout = json.loads(os.pread(fd, header - 8, 8))
        a0, a1 = layout["a"]["data_offsets"]
        b0, _ = layout["b"]["data_offsets"]
        got = os.pread(fd, a1 - a0, header + a0)
        assert got == state["a"].numpy().tobytes()  # the other tensor reads whole
        assert os.pread(fd, CHUNK, header + b0) == state["b"].numpy().tobytes()[:CHUNK]  # b's first chunk too
        with pytest.raises(OSError) as err:
            os.pread(fd, 4096, header + b0 + 2 * CHUNK + 4096)
        assert err.value.errno == errno.EIO
        # a loader gets an error (a mapped file's bad page is SIGBUS), never wrong bytes
        child = subprocess.run([sys.executable, "-c", "import sys, torch; from safetensors.torch import load_file; "
                                f"t = load_file(sys.argv[1])['b']; print(torch.equal(t, torch.load(sys.argv[2])))",
                                str(file), str(tmp_path / "b.pt")], capture_output=True, text=True)
        assert child.returncode != 0 and "True" not in child.stdout, (child.returncode, child.stdout, child.stderr)
    finally:
        os.close(fd)
    stats = m.stop()
    assert stats["errors"] >= 1
    lines = [line for line in m.stderr.splitlines() if line.startswith("mvc mount:")]
    assert lines and all("tensor 'b'" in line and "EIO" in line for line in lines)


def test_kill_9_leaves_nothing_behind_and_a_new_mount_works(root, tmp_path, mounts):
    with mvc.Repository.open(root) as repo:
        repo.commit(state_of_every_dtype(), "one")
    m = mounts(root, tmp_path / "mnt")
    assert torch.equal(load_file(m.where / "main" / "model.safetensors")["w"], state_of_every_dtype()["w"])
    m.kill()
    with pytest.raises(OSError) as err:
        os.listdir(m.where)
    assert err.value.errno == errno.ENOTCONN  # the kernel's dead mount
    again = mounts(root, tmp_path / "mnt")  # clears it and mounts again
    state = state_of_every_dtype()
    got = load_file(again.where / "main" / "model.safetensors")
    assert all(torch.equal(got[k], state[k]) for k in got)
    del got
    with mvc.Repository.open(root) as repo:  # the repository took no harm: commits, fsck clean
        repo.commit({"w": torch.ones(3)}, "after")
        assert repo.fsck().ok
    again.stop()
    assert not any(p.name.startswith("holder-") for p in (root / ".mvc" / "locks").iterdir())


def test_sigint_unmounts_and_reports(root, tmp_path, mounts):
    with mvc.Repository.open(root) as repo:
        repo.commit({"w": torch.ones(10)}, "one")
    m = mounts(root, tmp_path / "mnt")
    load_file(m.where / "main" / "model.safetensors")
    m.proc.send_signal(signal.SIGINT)
    stdout, stderr = m.proc.communicate(timeout=WAIT)
    assert m.proc.returncode == 0, stderr
    assert json.loads(stdout)["reads"] >= 1
    assert mounting.mounted(m.where) is None


def test_umount_and_mount_refuse_clearly(root, tmp_path):
    (tmp_path / "plain").mkdir()
    out = run_cli(root, "umount", tmp_path / "plain")
    assert out.exit_code == 1 and "is not an mvc mount" in out.stderr
    with mvc.Repository.open(root) as repo:
        with pytest.raises(MountError) as err:
            mounting.check_mountpoint(repo, tmp_path / "missing")
        assert err.value.problem == "not-a-folder"
        with pytest.raises(MountError) as err:
            mounting.check_mountpoint(repo, root / ".mvc" / "packs")
        assert err.value.problem == "inside-repository"
        with pytest.raises(MountError) as err:
            mounting.check_mountpoint(repo, root)  # files a mount would hide
        assert err.value.problem == "not-empty"
    out = run_cli(root, "mount", "..")
    assert out.exit_code == 1 and "holds files" in out.stderr


def test_a_lazy_clone_mounted_fetches_only_what_is_read(tmp_path, seaweedfs, mounts):
    from conftest import pushed_repo
    torch.manual_seed(0)
    state = {f"layer{i:02d}": torch.randn(512, 512) for i in range(50)}  # 1 MiB each
    url = seaweedfs.url()
    pushed_repo(tmp_path / "a", url, seaweedfs.endpoint, [(state, "fifty")], CHUNK).close()
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint)
    assert lazy.status().chunks == 0
    lazy.close()
    m = mounts(tmp_path / "lz", tmp_path / "mnt")
    with safe_open(m.where / "main" / "model.safetensors", framework="pt") as f:
        for key in ("layer03", "layer42"):
            assert torch.equal(f.get_tensor(key), state[key])
    stats = m.stop()
    total = sum(t.nbytes for t in state.values())
    assert stats["chunk_bytes_read"] <= total // 10, stats
    with mvc.Repository.open(tmp_path / "lz") as lazy:  # what was fetched stays, verified, and nothing more
        held = lazy.status()
        assert 2 * (1 << 20) // CHUNK <= held.chunks <= (total // 10) // CHUNK, held
        assert lazy.fsck().ok


def test_reading_ahead_past_damage_still_serves_the_range_asked_for(root):
    """The view alone (no FUSE): a read that would also fetch a damaged chunk ahead of it
    returns its own bytes; the damaged range raises ChecksumMismatch."""
    from mvc.errors import ChecksumMismatch
    torch.manual_seed(0)
    a = torch.randn(4 * CHUNK // 4)
    with mvc.Repository.open(root) as repo:
        c = repo.commit({"a": a}, "one")
        bad = next(e for e in repo.entries("main") if e.path == ("a",)).chunks[2]
        path, _, offset, _ = next(r for r in records(repo) if r[1] == bad)
    flip_bit(path, offset + 7)
    with mvc.Repository.open(root) as repo:
        view = mounting.RepositoryView(repo)
        file = view.node(f"/commits/{c.id}/model.safetensors")[1]
        start = len(file.header)
        raw = a.numpy().tobytes()
        assert view.read(file, start, CHUNK, c.id) == raw[:CHUNK]
        # a run of reads from the start: a chunk's worth read on past this one, the damaged one
        assert view.read(file, start + CHUNK, CHUNK, c.id, since=start) == raw[CHUNK:2 * CHUNK]
        assert view.stats.chunks_read == 2
        with pytest.raises(ChecksumMismatch) as err:
            view.read(file, start + 2 * CHUNK + 10, 100, c.id)
        assert "tensor 'a'" in str(err.value)
        assert view.read(file, start + 3 * CHUNK, CHUNK, c.id) == raw[3 * CHUNK:]
        assert view.node(f"/commits/{c.id[:10]}") == ("link", c.id)
        assert view.node("/commits/zz") is None and view.node("/no-such-branch") is None


def test_a_pruned_commit_is_not_listed_and_its_folder_says_why(root):
    from mvc.errors import CommitPruned
    with mvc.Repository.open(root) as repo:
        old = repo.commit({"w": torch.ones(10)}, "old")
        new = repo.commit({"w": torch.zeros(10)}, "new")
        assert repo.gc(keep_last=1, grace=0).pruned == (old.id,)
        view = mounting.RepositoryView(repo)
        assert view.node("/commits")[1] == [new.id]
        with pytest.raises(CommitPruned):
            view.node(f"/commits/{old.id}")


def test_a_mounted_revision_is_signed_in_place_and_the_reference_tool_agrees(root, tmp_path, mounts):
    from test_oms import keypair, reference
    with mvc.Repository.open(root) as repo:
        c = repo.commit(state_of_every_dtype(), "one")
    private, public = keypair(tmp_path)
    m = mounts(root, tmp_path / "mnt")
    sig = tmp_path / "sig" / "model.sig"
    sig.parent.mkdir()
    out = run_cli(root, "sign-model", m.where / "main", "--key", private, "--signature", sig)
    assert out.exit_code == 0 and f"names mvc commit {c.id}" in out.stdout, out.output
    # the reference tool refuses a model path that is a link (main is one): give it the commit's folder
    ok = reference("verify", "key", "--public_key", public, "--signature", sig, m.where / "commits" / c.id)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    said = run_cli(root, "verify-model", m.where / "tags" / ".." / "main", "--key", public, "--signature", sig)
    assert said.exit_code == 0 and f"mvc commit {c.id}" in said.stdout
    m.stop()


def test_a_stopped_mount_is_refused_and_unmounted_without_hanging(root, tmp_path, mounts):
    with mvc.Repository.open(root) as repo:
        repo.commit({"w": torch.ones(10)}, "one")
    m = mounts(root, tmp_path / "mnt")
    m.proc.send_signal(signal.SIGSTOP)  # alive but answering nothing (a stuck or stopped process)
    try:
        cli = [sys.executable, "-m", "mvc", "-C", str(root)]
        again = subprocess.run([*cli, "mount", str(m.where)], capture_output=True, text=True, timeout=WAIT)
        assert again.returncode == 1 and "already a mount" in again.stderr, again.stderr
        out = subprocess.run([*cli, "umount", str(m.where)], capture_output=True, text=True, timeout=WAIT)
        assert out.returncode == 0, out.stderr
        assert mounting.mounted(m.where) is None
    finally:
        m.proc.send_signal(signal.SIGCONT)
    m.proc.communicate(timeout=WAIT)
    assert m.proc.returncode == 0


def test_threads_reading_a_tensor_first_at_once_all_get_its_bytes(tmp_path):
    repo = mvc.Repository.init(tmp_path / "small", chunk_size=64)
    state = {f"t{i}": torch.arange(64, dtype=torch.float32) + i for i in range(400)}
    commit = repo.commit(state, "many tensors").id
    expected = (tmp_path / "x.safetensors")
    assert run_cli(repo, "export", commit, "-o", expected).exit_code == 0
    expected = expected.read_bytes()
    failures = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: the kernel sends a file's first reads from several
    try:
        for _ in range(3):
            view = mounting.RepositoryView(repo)
            synth = view.node(f"/commits/{commit}/model.safetensors")[1]
            start = threading.Barrier(8)

            def first_reads():
                start.wait()
                for seg in synth.segments:
                    try:
                        if view.read(synth, seg.start, 8, commit) != expected[seg.start:seg.start + 8]:
                            failures.append(("bytes", seg.path))
                    except Exception as exc:  # noqa: BLE001 (a failed read is what this test looks for)
                        failures.append(repr(exc))
            readers = [threading.Thread(target=first_reads) for _ in range(8)]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
    finally:
        sys.setswitchinterval(interval)
        repo.close()
    assert failures == []


def test_signing_a_mounted_folder_in_place_says_to_write_the_signature_elsewhere(root, tmp_path, mounts):
    from test_oms import keypair
    with mvc.Repository.open(root) as repo:
        repo.commit({"w": torch.ones(10)}, "one")
    private, _ = keypair(tmp_path)
    m = mounts(root, tmp_path / "mnt")
    out = run_cli(root, "sign-model", m.where / "main", "--key", private)  # the docs' first try
    m.stop()
    assert out.exit_code == 1 and "read-only" in out.stderr and "signature elsewhere" in out.stderr, out.output
    assert out.stderr.count("\n") == 1


def test_a_mount_reached_through_a_linked_folder_is_found_by_umount_and_mount(root, tmp_path, mounts):
    with mvc.Repository.open(root) as repo:
        repo.commit({"w": torch.ones(10)}, "one")
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "linked")  # as a home folder or /tmp often is
    try:
        m = mounts(root, tmp_path / "linked" / "mnt")
        again = run_cli(root, "mount", m.where)
        assert again.exit_code == 1 and "already a mount" in again.stderr, again.output
        out = run_cli(root, "umount", m.where)
        assert out.exit_code == 0, out.output
        assert mounting.mounted(tmp_path / "real" / "mnt") is None
        m.proc.communicate(timeout=WAIT)
    finally:  # the fixture looks for the mount where it was asked for; it lies at real/mnt
        subprocess.run(["fusermount3", "-u", "-z", str(tmp_path / "real" / "mnt")], capture_output=True)
