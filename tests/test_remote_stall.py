"""A push or a remote gc stopped (SIGSTOP: Ctrl-Z, a paused VM, a long GC pause) for longer than
its lease, while the other runs in another process: nothing a ref names is ever deleted.

Each test runs real processes: the stalled side stops itself with SIGSTOP at one step of its
work (a few lines below wrap that step), the other side runs to the end in another process,
then the stalled one gets SIGCONT and finishes or fails. The remote must then serve every ref
(``fsck --remote`` passes, a fresh clone loads it bit for bit), and a rerun of a failed push
lands. On the SeaweedFS fixture and on a folder remote.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import mvc

from conftest import same
from mvc.errors import RemoteBusy

CHUNK = 1024
LEASE_S = "3"  # the lease's life for every process here: a stall outlives it at once


def tensor(seed: int, n: int = 4 * 1024) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=["seaweedfs", "folder"])
def remote(request, tmp_path):
    """(url, endpoint) of an empty remote."""
    if request.param == "folder":
        return str(tmp_path / "remote"), None
    s3 = request.getfixturevalue("seaweedfs")
    return s3.url(), s3.endpoint


@pytest.fixture
def reused(tmp_path, remote, monkeypatch):
    """A repository whose remote holds, only in packs of a deleted branch, the chunks and the
    tensor object of ``w``; main here has a new commit (not pushed) that reuses ``w`` and adds
    ``v``. A push of main counts on those packs; a gc (grace 0) finds them garbage."""
    monkeypatch.setenv("MVC_REMOTE_LEASE_S", LEASE_S)
    url, endpoint = remote
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=CHUNK)
    repo.commit({"step": 0, "u": tensor(0)}, "first")
    repo.remotes.add("origin", url, endpoint)
    repo.remotes.push()
    repo.commit({"w": tensor(1)}, "x", branch="x")
    repo.remotes.push(refs=("x",))
    repo.remotes.push(refs=(":x",))
    repo.delete_branch("x", force=True)
    new = {"step": 1, "u": tensor(0), "w": tensor(1), "v": tensor(2)}
    repo.commit(new, "reuses w")
    yield repo, url, endpoint, new
    repo.close()


STOP = textwrap.dedent("""
    import os, signal, sys

    def stop_at(owner, name, label, step, before=False, keys=None):
        '''Wrap owner.name so that this process stops itself (SIGSTOP) the first time it is called
        (with a key under one of ``keys``), after the call or before it.'''
        real = getattr(owner, name)
        state = {"done": False}

        def wrapper(*args, **kwargs):
            hit = label == step and not state["done"] and (keys is None or str(args[1]).startswith(keys))
            if hit and before:
                state["done"] = True
                print("STOPPED", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            out = real(*args, **kwargs)
            if hit and not before:
                state["done"] = True
                print("STOPPED", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            return out
        setattr(owner, name, wrapper)
""")

# A push of main that stops at one step: after taking its lease, after reading the refs it moves,
# after listing the remote's packs, after uploading chunks, after uploading objects, after its last
# lease check (right before it moves the ref).
PUSH = STOP + textwrap.dedent("""
    import mvc
    from mvc.remote import catalogue, lease, sync, transfer
    step = sys.argv[2]
    stop_at(lease.Lease, "take", "lease", step)
    stop_at(sync, "_read_targets", "refs", step)
    stop_at(catalogue.Catalogue, "refresh", "listing", step)
    stop_at(transfer, "upload_chunks", "chunks", step)
    stop_at(transfer, "upload_objects", "objects", step)
    stop_at(lease.Lease, "check", "check", step)
    repo = mvc.Repository.open(sys.argv[1])
    try:
        repo.remotes.push()
        print("PUSHED", flush=True)
    except mvc.MvcError as exc:
        print("FAILED", type(exc).__name__, exc, flush=True)
        sys.exit(1)
""")

# A remote gc (grace 0) that stops right before it deletes its first pack: past its last lease
# check, so nothing but the protocol keeps it from deleting once it runs again.
GC = STOP + textwrap.dedent("""
    import mvc
    from mvc.remote.bucket import FolderBucket
    from mvc.remote.s3 import S3Bucket
    for cls in (FolderBucket, S3Bucket):
        stop_at(cls, "delete", "delete", sys.argv[2], before=True, keys=("packs/", "objects/"))
    repo = mvc.Repository.open(sys.argv[1])
    try:
        report = repo.remotes.gc(grace=0)
        print("COLLECTED", len(report.packs_deleted), flush=True)
    except mvc.MvcError as exc:
        print("FAILED", type(exc).__name__, exc, flush=True)
        sys.exit(1)
""")


def _start(script: str, root, step: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, str(root), step], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def _run_gc(root) -> subprocess.CompletedProcess:
    """A remote gc (grace 0) in another process, tried again while the stalled push's lease lives."""
    for _ in range(200):
        done = subprocess.run([sys.executable, "-c", GC, str(root), "never"], capture_output=True, text=True,
                              env=dict(os.environ), timeout=120)
        if "RemoteBusy" not in done.stdout:
            return done
    raise AssertionError(f"the remote gc never got its lease: {done.stdout} {done.stderr}")


def _stopped(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "STOPPED", (line, proc.stderr.read() if proc.poll() is not None else "")


def _serves(repo, url, endpoint, tmp_path, tip_state: dict, name: str) -> None:
    """The remote serves main whole: fsck --remote passes and a fresh clone loads it bit for bit."""
    report = repo.remotes.fsck()
    assert report.ok, report.problems
    clone = mvc.Repository.clone(url, tmp_path / name, endpoint_url=endpoint)
    try:
        assert same(clone.load("main"), tip_state)
        assert clone.fsck().ok
    finally:
        clone.close()


@pytest.mark.parametrize("step", ["lease", "refs", "listing", "chunks", "objects", "check"])
def test_a_push_stalled_past_its_lease_never_names_what_a_gc_deleted(reused, tmp_path, step):
    repo, url, endpoint, new = reused
    push = _start(PUSH, tmp_path / "a", step)
    try:
        _stopped(push)
        gc = _run_gc(tmp_path / "a")  # the push's lease runs out meanwhile; the gc takes over
        assert gc.returncode == 0 and "COLLECTED" in gc.stdout, (gc.stdout, gc.stderr)
    finally:
        os.kill(push.pid, signal.SIGCONT)
    out, err = push.communicate(timeout=120)
    if push.returncode == 0:
        _serves(repo, url, endpoint, tmp_path, new, "c1")
    else:  # refused, with a clear error, having moved nothing: the remote still serves the old tip
        assert "FAILED RemoteBusy" in out, (out, err)
        _serves(repo, url, endpoint, tmp_path, {"step": 0, "u": tensor(0)}, "c1")
        repo.remotes.push()  # the rerun lands
        _serves(repo, url, endpoint, tmp_path, new, "c2")


def test_a_gc_stalled_past_its_lease_never_deletes_what_a_push_counted_on(reused, tmp_path):
    repo, url, endpoint, new = reused
    gc = _start(GC, tmp_path / "a", "delete")
    try:
        _stopped(gc)  # past its last lease check, about to delete a pack of the deleted branch
        deadline = time.monotonic() + 120  # its lease runs out (a few seconds); the push goes ahead
        while True:
            try:
                repo.remotes.push()
                break
            except RemoteBusy:
                assert time.monotonic() < deadline, "the stalled gc's lease never ran out"
                time.sleep(0.1)  # a count of tries ran out before the lease on a busy machine
    finally:
        os.kill(gc.pid, signal.SIGCONT)
    out, err = gc.communicate(timeout=120)
    assert ("FAILED RemoteBusy" in out or "COLLECTED" in out) and "Traceback" not in err, (out, err)
    _serves(repo, url, endpoint, tmp_path, new, "c1")
