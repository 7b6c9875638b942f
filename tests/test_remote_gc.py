"""A remote's lifecycle: delete a remote branch or tag, prune tracking refs, gc on the remote
(retention, orphans of killed pushes), and a real concurrent push racing a remote gc.

Runs on a real S3 server (``s3`` fixture, tests/s3server.py).
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import mvc

from conftest import pushed_repo, same
from conftest import run_cli as cli
from mvc.errors import RemoteBusy, RemoteDamaged
from mvc.remote import collect, layout
from mvc.store import packindex
from mvc.remote.bucket import open_bucket

CHUNK = 1024


def state(seed: int, n: int = 8 * 1024) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g), "step": seed}


@pytest.fixture
def pushed(tmp_path, s3):
    url = s3.url()
    repo = pushed_repo(tmp_path / "a", url, s3.endpoint, [(state(0), "first")], CHUNK)
    yield repo, url
    repo.close()


def test_delete_a_remote_branch_and_prune_its_tracking_ref(pushed, tmp_path, s3):
    repo, url = pushed
    repo.commit(state(1), "exp work", branch="exp")
    repo.create_tag("v1", "exp")
    repo.remotes.push(refs=("exp", "v1"))
    other = mvc.Repository.clone(url, tmp_path / "b", endpoint_url=s3.endpoint)
    assert {r.name for r in other.remotes.branches()} >= {"origin/exp"}
    result = cli(tmp_path / "a", "push", "origin", ":exp")
    assert result.exit_code == 0 and "deleted" in result.output, result.output
    assert "origin/exp" not in {r.name for r in repo.remotes.branches()}
    result = cli(tmp_path / "a", "push", "origin", "--delete", "v1")
    assert result.exit_code == 0, result.output
    result = cli(tmp_path / "a", "push", "origin", "--delete", "nope")
    assert result.exit_code == 1 and "no branch or tag 'nope'" in result.output
    other.remotes.fetch()
    assert "origin/exp" in {r.name for r in other.remotes.branches()}  # kept until --prune, as git does
    report = other.remotes.fetch(prune=True)
    assert [u.status for u in report.refs if u.ref == "remotes/origin/exp"] == ["pruned"]
    assert "origin/exp" not in {r.name for r in other.remotes.branches()}
    other.delete_tag("v1")  # the tag came here as a local tag (as in git): it would keep exp's commit
    other.reflog.expire("v1")  # and its reflog would, for 30 days
    gc = other.gc(grace=0)
    assert gc.chunks_removed > 0  # the deleted branch's tracking ref (and its reflog) kept them alive before
    repo.commit(state(2), "exp again", branch="exp")
    assert repo.remotes.push(refs=("exp",)).refs[0].status == "new"  # the tombstone gives way to a new branch
    other.close()


def test_remote_gc_retention_and_orphans_of_a_killed_push(pushed, tmp_path, s3):
    repo, url = pushed
    for i in (1, 2, 3):
        repo.commit(state(i), f"v{i}")
        repo.remotes.push()
    orphan = _orphan_pack(url, s3)  # what a push killed before it moved a ref leaves behind
    report = repo.remotes.fsck()
    assert report.ok and orphan in [k for k, _ in report.unreferenced]
    young = repo.remotes.gc()  # default grace: an hour
    assert young.packs_deleted == () and orphan in young.young
    result = cli(tmp_path / "a", "gc", "--remote", "origin", "--keep-last", "2", "--grace", "0")
    assert result.exit_code == 0 and "pruned 2 commits" in result.output, result.output
    keys = [k for k, _ in s3.keys(url, layout.CHUNK_PACKS)]
    assert orphan not in keys
    report = repo.remotes.fsck()
    assert report.ok and report.unreferenced == (), report
    clone = mvc.Repository.clone(url, tmp_path / "c", endpoint_url=s3.endpoint)
    assert same(clone.load("main"), state(3)) and same(clone.load("main~1"), state(2))
    with pytest.raises(mvc.CommitPruned):
        clone.load("main~3")
    assert [c.message for c in clone.log("main")] == ["v3", "v2", "v1", "first"]
    clone.close()


def _orphan_pack(url, s3) -> str:
    bucket = open_bucket(url, s3.endpoint)
    data = os.urandom(3000)
    from mvc import hashing
    image = layout.PackImage([(hashing.digest(data), len(data))])
    image.slot(0)[:] = data
    key = layout.pack_key(layout.CHUNK_PACKS, layout.new_name())
    bucket.put(key, image.data)
    bucket.close()
    return key


HOLDER = textwrap.dedent("""
    import sys, time, mvc
    from mvc.remote import lease
    from mvc.remote.connection import Connection
    repo = mvc.Repository.open(sys.argv[1])
    conn = Connection(repo, "origin")
    with lease.held(conn, sys.argv[2]):
        print("READY", flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("kind", ["gc", "push"])
def test_the_lease_of_a_killed_process_does_not_block_the_next_command(pushed, tmp_path, s3, kind):
    """A remote gc or repair (or push) killed by SIGKILL left its lease for its 300 s to run out:
    every push, gc and repair was refused meanwhile, naming a dead process as busy. A lease of a
    process of this host that no longer runs counts as expired; one from another host still waits."""
    repo, url = pushed
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "a"), kind], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
        with pytest.raises(RemoteBusy):  # alive: it holds the remote
            repo.remotes.gc(grace=0)
    finally:
        child.kill()
        child.wait()
    repo.commit(state(6), "after the kill")
    repo.remotes.push()  # at once, not in five minutes
    repo.remotes.gc(grace=0)
    from mvc.remote import lease
    bucket = open_bucket(url, s3.endpoint)
    key = f"{lease.FOLDER}gc-{'ab' * 8}"
    bucket.put(key, mvc.encoding.pack({"kind": "gc", "owner": "x", "host": "another-host", "pid": 1,
                                       "started": "boot/1", "since": time.time(), "expires": time.time() + 60.0}))
    bucket.close()
    with pytest.raises(RemoteBusy):  # another host's process: it cannot be seen from here, so it waits
        repo.remotes.push()


def test_a_lease_is_judged_by_its_pid_only_where_the_pid_means_its_writer():
    import socket
    from mvc.remote import lease
    from mvc.store import processes
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    written = {"kind": "push", "host": socket.gethostname(), "pid": int(gone.stdout),
               "started": f"{processes.boot_id()}/1", "pidns": processes.pid_namespace(), "expires": time.time() + 60}
    assert lease._gone(written)  # this host, boot and pid namespace: its writer is gone
    # each of these waits for the expiry instead: nobody here can tell whether its writer runs
    assert not lease._gone({**written, "pidns": "pid:[4026530000]"})  # a container sharing this host's name
    assert not lease._gone({k: v for k, v in written.items() if k != "pidns"})  # an older mvc's
    assert not lease._gone({**written, "started": "another-boot/1"})  # same name, another machine (or boot)
    assert not lease._gone({**written, "host": "another-host"})


def test_a_push_and_a_remote_gc_exclude_each_other(pushed, tmp_path, s3):
    repo, url = pushed
    from mvc.remote import lease
    from mvc.remote.connection import Connection
    conn = Connection(repo, "origin")
    try:
        with lease.held(conn, lease.GC):
            repo.commit(state(5), "while gc runs")
            with pytest.raises(RemoteBusy) as caught:
                repo.remotes.push()
            assert caught.value.kind == "gc" and caught.value.remote == "origin"
        with lease.held(conn, lease.PUSH):
            with pytest.raises(RemoteBusy) as caught:
                repo.remotes.gc(grace=0)
            assert caught.value.kind == "push"
    finally:
        conn.close()
    repo.remotes.push()
    assert repo.remotes.gc(grace=0).packs_deleted == ()


# Pushes branches b0, b1, ... one after the other, each a commit with new chunks (made by the
# parent beforehand, so this process needs no torch), trying again while a remote gc runs.
# Each push pauses a second between its uploads and its ref move, as a push with more to
# upload would: the window in which a gc that did not see it would delete its new packs.
PUSHER = textwrap.dedent("""
    import sys, time, mvc
    from mvc.errors import RemoteBusy
    from mvc.remote import sync
    move_refs = sync._move_refs

    def slow_move_refs(*args, **kwargs):
        time.sleep(1.0)
        return move_refs(*args, **kwargs)
    sync._move_refs = slow_move_refs
    repo = mvc.Repository.open(sys.argv[1])
    pushed = busy = 0
    for i in range(int(sys.argv[2])):
        while True:
            try:
                repo.remotes.push(refs=(f"b{i}",))
                pushed += 1
                break
            except RemoteBusy:
                busy += 1
                time.sleep(0.05)
    repo.close()
    print(pushed, busy)
""")


def test_a_real_concurrent_push_racing_remote_gcs_loses_nothing(pushed, tmp_path, s3):
    repo, url = pushed
    for i in range(3):
        repo.commit(state(100 + i), f"b{i}", branch=f"b{i}")
    proc = subprocess.Popen([sys.executable, "-c", PUSHER, str(tmp_path / "a"), "3"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    gcs = busy = deleted = 0
    while proc.poll() is None:
        _orphan_pack(url, s3)  # garbage for each gc to find, as killed pushes leave
        try:
            deleted += len(repo.remotes.gc(grace=0, keep_last=1).packs_deleted)
            gcs += 1
        except RemoteBusy:
            busy += 1
        time.sleep(0.1)  # back to back, the two would mostly take turns backing off
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    pushed_n, push_busy = map(int, out.split())
    assert pushed_n == 3 and gcs >= 1 and deleted >= 1, (out, gcs, busy, deleted)
    report = repo.remotes.fsck()  # every ref's closure is intact: no needed pack was deleted
    assert report.ok, report.problems
    clone = mvc.Repository.clone(url, tmp_path / "c", endpoint_url=s3.endpoint)
    for i in range(3):
        assert same(clone.load(f"origin/b{i}"), state(100 + i))
    assert clone.fsck().verified
    clone.close()


def test_a_remote_gc_that_deletes_upgrades_a_layout_1_remote_on_s3(tmp_path, seaweedfs):
    from test_remote import as_layout_1
    url = seaweedfs.url()
    repo = pushed_repo(tmp_path / "a", url, seaweedfs.endpoint, [(state(0), "first")], CHUNK)
    try:
        repo.commit(state(1), "exp", branch="exp")
        repo.remotes.push(refs=("exp",))
        repo.remotes.push(refs=(":exp",))  # a tombstone: exp's packs are garbage
        as_layout_1(lambda key: seaweedfs.get(url, key), lambda key, data: seaweedfs.put(url, key, data),
                    [key for key, _ in seaweedfs.keys(url, "refs/")])
        assert repo.remotes.gc(grace=0, dry_run=True).packs_deleted
        assert seaweedfs.get(url, "MVCREMOTE") == f"mvc-remote 1\nchunk-size {CHUNK}\n".encode()
        assert repo.remotes.gc(grace=0).packs_deleted
        assert seaweedfs.get(url, "MVCREMOTE") == f"mvc-remote 2\nchunk-size {CHUNK}\n".encode()
        with mvc.Repository.clone(url, tmp_path / "b", endpoint_url=seaweedfs.endpoint) as clone:
            assert same(clone.load("main"), repo.load("main")) and clone.remotes.fsck().ok
    finally:
        repo.close()


# -- the walk and sweep in bounded memory (a folder remote: the plan, not the store, is under test) ----

SMALL = 64


def _history(tmp_path):
    """A repository pushed to a folder remote: main with a pruned commit, exp sharing most of
    main's chunks, a tag, a deleted branch and an orphan object pack's worth of garbage."""
    repo = mvc.Repository.init(tmp_path / "h", chunk_size=SMALL)
    repo.remotes.add("origin", str(tmp_path / "remote"))
    base = {"w": torch.arange(512, dtype=torch.float32), "b": torch.zeros(64)}
    for i in range(3):
        s = {k: v.clone() for k, v in base.items()}
        s["w"][:16 * (i + 1)] = float(i + 1)  # each commit changes a few chunks, shares the rest
        repo.commit(s, f"main {i}")
        repo.remotes.push()
    repo.create_tag("v0", "main~1")
    s = {k: v.clone() for k, v in base.items()}
    s["b"][:] = 7.0
    repo.commit(s, "exp", branch="exp")
    repo.commit({"gone": torch.randn(256, generator=torch.Generator().manual_seed(5))}, "doomed", branch="doomed")
    repo.remotes.push(refs=("exp", "v0"))
    repo.remotes.push(refs=("doomed",))  # packs of its own
    repo.remotes.gc(keep_last=1, branch="main", grace=0)  # prunes main~2 (main~1 is tagged): a pruned note
    repo.remotes.push(refs=(":doomed",))  # its packs are garbage now
    return repo


def _old_plan(repo) -> tuple:
    """(needed chunk ids, {pack key: (needed, listed)}) as remote gc planned before it was
    sliced: every object decoded, every needed chunk id in one set."""
    from mvc import reach
    from mvc.remote import transfer
    from mvc.remote.catalogue import read_trailer
    from mvc.remote.connection import Connection, classify
    conn = Connection(repo, "origin")
    try:
        conn.catalogue.refresh(conn.bucket)
        objects, notes = {}, {}
        for key in conn.catalogue.object_packs():
            for oid, data in transfer.read_pack_records(conn.bucket, key, read_trailer(conn.bucket, key)).items():
                kind, obj = classify(data, oid)
                if kind == "pruned":
                    notes[obj["commit"]] = oid
                else:
                    objects[oid] = (kind, obj)
        need = set()

        def get(kind, oid):
            need.add(oid)
            return objects[oid][1]
        tips = [oid for oid, _, _ in conn.remote_refs().values()]
        chunks = {cid for cid, _ in reach.closure(get, tips, notes.__contains__)}
        need |= {notes[oid] for oid in need if oid in notes} | chunks
        counts = {key: (sum(1 for i in ids if i in need), len(ids)) for key, ids in conn.catalogue.pack_ids().items()}
        return chunks, counts
    finally:
        conn.close()


def _expected(repo, tmp_path) -> tuple:
    """(garbage keys, mixed count, reclaimed bytes) of the old plan, every pack older than the grace."""
    _, counts = _old_plan(repo)
    bucket = open_bucket(str(tmp_path / "remote"))
    try:
        sizes = {k: n for folder in (layout.CHUNK_PACKS, layout.OBJECT_PACKS) for k, n, _ in bucket.list_times(folder)
                 if layout.pack_name(k) is not None}
    finally:
        bucket.close()
    garbage = sorted(k for k, (live, _) in counts.items() if not live)
    return garbage, sum(0 < live < listed for live, listed in counts.values()), sum(sizes[k] for k in garbage)


def test_sliced_remote_gc_plans_what_the_whole_remote_in_memory_planned(tmp_path):
    repo = _history(tmp_path)
    garbage, mixed, reclaimed = _expected(repo, tmp_path)
    assert garbage and mixed  # the history makes both: the deleted branch's packs, shared ones
    one = repo.remotes.gc(grace=0, dry_run=True)
    assert (sorted(one.packs_deleted), one.mixed, one.bytes_reclaimed) == (garbage, mixed, reclaimed)
    assert one.young == () and one.unreadable == ()
    tiny = collect.gc_remote(repo, "origin", grace=0, dry_run=True, budget=1)  # a step per first byte
    assert tiny == one
    done = repo.remotes.gc(grace=0)
    assert sorted(done.packs_deleted) == garbage and done.bytes_reclaimed == reclaimed
    assert repo.remotes.fsck().ok
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "c")
    for rev, here in (("main", "main"), ("main~1", "main~1"), ("v0", "v0"), ("origin/exp", "exp")):
        assert same(clone.load(rev), repo.load(here))
    with pytest.raises(mvc.CommitPruned):
        clone.load("main~2")
    clone.close()
    assert not [p for p in (repo.dir / "tmp").iterdir() if p.name.startswith("walk-")]  # the scratch is gone
    repo.close()


def test_remote_gc_sends_the_needed_chunk_ids_through_a_spill_read_a_slice_at_a_time(tmp_path, monkeypatch):
    repo = _history(tmp_path)
    chunks, _ = _old_plan(repo)
    seen = {"slices": [], "files": set()}

    class Watched(packindex.IdSpill):
        def slices(self, budget):
            for b, e, ids in super().slices(budget):
                seen["files"] |= {p.name for p in self.folder.iterdir()}
                seen["slices"].append((b, e, ids))
                yield b, e, ids
    monkeypatch.setattr(collect, "IdSpill", Watched)
    collect.gc_remote(repo, "origin", grace=0, dry_run=True, budget=8)
    got = seen["slices"]
    assert len(got) > 1 and all(b < e for b, e, _ in got) and [e for _, e, _ in got][-1] == 256
    assert all(b == e0 for (_, e0, _), (b, _, _) in zip(got, got[1:]))  # consecutive slices, the id space once
    ids = [cid for _, _, part in got for cid in part.tolist()]
    assert ids == sorted(set(ids)) and set(ids) == chunks  # each needed chunk once, in order, none else
    assert seen["files"] == {f"{cid[0]:02x}" for cid in chunks}  # on disk, a file per first byte
    repo.close()


def test_remote_gc_stops_before_deleting_when_the_refs_need_an_object_no_pack_holds(tmp_path):
    repo = _history(tmp_path)
    bucket = open_bucket(str(tmp_path / "remote"))
    tip = bytes.fromhex(repo.resolve("exp"))
    key = next(k for k, _ in bucket.list(layout.OBJECT_PACKS)
               if layout.pack_name(k) is not None and tip in dict(
                   (oid, 0) for oid, _, _ in collect.read_trailer(bucket, k)))
    bucket.delete(key)
    before = sorted(k for k, _ in bucket.list(""))
    with pytest.raises(RemoteDamaged) as err:
        repo.remotes.gc(grace=0)
    assert err.value.remote == "origin" and tip in err.value.ids
    assert sorted(k for k, _ in bucket.list("")) == before  # nothing deleted
    bucket.close()
    repo.close()


def test_remote_gc_stops_before_deleting_when_a_needed_tensor_object_does_not_decode(tmp_path):
    from mvc import encoding
    from mvc.errors import CorruptObject
    from mvc.objects import CommitObject, TensorLeaf, TreeObject, object_id
    from mvc.remote import transfer
    from mvc.remote.connection import Connection
    repo = _history(tmp_path)
    bad = encoding.pack({"chunk_size": SMALL, "chunks": [bytes(32)], "dtype": "F32", "shape": [64], "type": "tensor"})
    tree = TreeObject({"w": TensorLeaf(object_id(bad))}).encode()  # 256 bytes in 64-byte chunks: 4 ids, not 1
    commit = CommitObject(object_id(tree), (), "bad", "me", 1_700_000_000_000_000).encode()
    conn = Connection(repo, "origin")
    transfer.upload_objects(conn.bucket, conn.catalogue, [(object_id(x), x) for x in (bad, tree, commit)])
    conn.bucket.put(layout.REFS + "heads/bad", layout.encode_ref(object_id(commit), False))
    conn.close()
    bucket = open_bucket(str(tmp_path / "remote"))
    before = sorted(k for k, _ in bucket.list(""))
    with pytest.raises(CorruptObject) as err:
        repo.remotes.gc(grace=0)
    assert err.value.kind == "tensor" and err.value.field == "chunks"
    assert sorted(k for k, _ in bucket.list("")) == before  # nothing deleted
    bucket.close()
    repo.close()
