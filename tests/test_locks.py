"""Branch write locks and the gc lock, with real processes as the other holders."""

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

import mvc
from conftest import run_cli as cli
from mvc.errors import GcLockBusy, LockDamaged
from mvc.store import holderfiles, processes

# A child that does one thing to the repository, says "ready", and lives until its stdin closes.
HOLDER = r"""
import sys, mvc
repo = mvc.Repository.open(sys.argv[1])
action = sys.argv[2]
if action == "lock":
    repo.locks.lock(sys.argv[3])
elif action == "named":
    repo.locks.lock(sys.argv[3], named=True, owner=sys.argv[4])
elif action == "gc":
    held = repo.gc_lock.exclusive()
    held.__enter__()
elif action == "commit":
    held = repo.gc_lock.shared()
    held.__enter__()
print("ready", flush=True)
sys.stdin.read()
"""


class Child:
    def __init__(self, repo, *args):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(repo.root), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def child(repo):
    children = []

    def start(*args):
        children.append(Child(repo, *args))
        return children[-1]
    yield start
    for c in children:
        if c.proc.poll() is None:
            c.stop()


def state(n=1):
    return {"w": torch.arange(40, dtype=torch.float32) * n}


def test_lock_is_idempotent_and_listed(repo):
    assert repo.locks.get("main") is None
    lock = repo.locks.lock("main")
    assert (lock.branch, lock.pid, lock.host, lock.named, lock.stale) == ("main", os.getpid(),
                                                                         socket.gethostname(), False, False)
    assert abs(lock.since - time.time()) < 3600
    assert repo.locks.lock("main") == lock
    assert repo.locks.get("main") == lock
    assert repo.locks.list() == [lock]
    repo.commit(state(), "owner commits")
    repo.locks.unlock("main")
    assert repo.locks.get("main") is None and repo.locks.list() == []
    repo.locks.unlock("main")  # unlocking an unlocked branch is a no-op


def test_live_holder_in_another_process_blocks_lock_and_commit(repo, child):
    first = repo.commit(state(1), "before")
    holder = child("lock", "main")
    with pytest.raises(mvc.LockHeld) as err:
        repo.locks.lock("main")
    assert f"pid {holder.pid} on {socket.gethostname()}" in str(err.value)
    with pytest.raises(mvc.LockHeld) as err:
        repo.commit(state(2), "blocked")
    message = str(err.value)
    assert f"pid {holder.pid}" in message and "since" in message
    assert (err.value.branch, err.value.named, err.value.here) == ("main", False, True)
    assert repo.resolve("main") == first.id
    repo.commit(state(3), "other branch", branch="side")  # only main is locked
    with pytest.raises(mvc.LockHeld):
        repo.locks.unlock("main")
    with pytest.raises(mvc.LockHeld):
        repo.create_branch("main", "side", force=True)
    repo.checkout("side")
    with pytest.raises(mvc.LockHeld):
        repo.delete_branch("main", force=True)
    assert repo.resolve("main") == first.id


def test_dead_owner_on_this_host_is_taken_over(repo, child):
    holder = child("lock", "main")
    holder.stop()
    stale = repo.locks.get("main")
    assert stale.pid == holder.pid and stale.stale
    repo.commit(state(), "a stale lock does not block")
    lock = repo.locks.lock("main")
    assert lock.pid == os.getpid() and not lock.stale


def test_reused_pid_is_not_the_owner(repo, child):
    other = child("lock", "side")  # a live process; forge a lock naming its pid with another start time
    with repo.index.write() as txn:
        txn.put_lock("main", {"host": socket.gethostname(), "pid": other.pid, "since": time.time(),
                              "owner": "x@y", "started": "some-earlier-boot/1", "named": False})
    assert repo.locks.get("main").stale
    assert repo.locks.lock("main").pid == os.getpid()


def test_lock_from_another_host_is_never_assumed_dead(repo):
    with repo.index.write() as txn:
        txn.put_lock("main", {"host": "gpu-node-7", "pid": 999999, "since": time.time() - 7200,
                              "owner": "bob@gpu-node-7", "started": None, "named": False})
    assert not repo.locks.get("main").stale
    with pytest.raises(mvc.LockHeld) as err:
        repo.commit(state(), "blocked")
    assert "pid 999999 on gpu-node-7" in str(err.value) and "2 h ago" in str(err.value)
    assert (err.value.host, err.value.here) == ("gpu-node-7", False) and "cannot be told" in str(err.value)
    repo.locks.unlock("main", force=True)
    repo.commit(state(), "free again")


def dead_pid() -> int:
    """The pid of a process that ran here and was reaped."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def forge_lock(repo, pid: int, drop=(), **fields):
    """A process lock on main naming ``pid`` of this host, boot and pid namespace; ``fields``
    replace fields, ``drop`` leaves some out (as an older mvc did)."""
    value = {"host": socket.gethostname(), "pid": pid, "since": time.time(), "owner": "x@y",
             "started": f"{processes.boot_id()}/1", "named": False, "pidns": processes.pid_namespace(), **fields}
    with repo.index.write() as txn:
        txn.put_lock("main", {k: v for k, v in value.items() if k not in drop})


OTHER_PIDNS = "pid:[4026530000]"
needs_proc = pytest.mark.skipif(processes.pid_namespace() in (None, OTHER_PIDNS), reason="no /proc/self/ns/pid")


@needs_proc
def test_a_gone_pid_of_another_pid_namespace_is_not_taken_for_dead(repo):
    # a container sharing this host's name and kernel (docker run --network=host) numbers its own processes:
    # a pid that runs nothing here may be its live writer
    pid = dead_pid()
    forge_lock(repo, pid, pidns=OTHER_PIDNS)
    lock = repo.locks.get("main")
    assert not lock.stale
    assert (lock.host, lock.pidns) == (socket.gethostname(), OTHER_PIDNS)
    with pytest.raises(mvc.LockHeld) as err:
        repo.commit(state(), "blocked")
    assert err.value.here is False and "cannot be told" in str(err.value) and "another container" in str(err.value)
    with pytest.raises(mvc.LockHeld):
        repo.locks.lock("main")
    with pytest.raises(mvc.LockHeld):
        repo.locks.unlock("main")
    forge_lock(repo, pid)  # the same lock from this pid namespace: its process is gone
    assert repo.locks.get("main").stale
    repo.commit(state(), "taken over")
    assert repo.locks.lock("main").pidns == processes.pid_namespace()


@needs_proc
def test_an_older_mvcs_lock_without_pid_namespace_holds_until_forced(repo):
    forge_lock(repo, dead_pid(), drop=("pidns",))
    lock = repo.locks.get("main")
    assert not lock.stale and lock.pidns is None
    with pytest.raises(mvc.LockHeld) as err:
        repo.commit(state(), "blocked")
    assert err.value.here is False and "not recorded" in str(err.value)
    repo.locks.unlock("main", force=True)
    repo.commit(state(), "free again")


def test_an_older_mvcs_lock_from_an_earlier_boot_is_stale(repo, child):
    other = child("lock", "side")  # a live pid, which the reboot made another process
    forge_lock(repo, other.pid, drop=("pidns",), started="some-earlier-boot/1")
    assert repo.locks.get("main").stale
    assert repo.locks.lock("main").pid == os.getpid()


UNSHARE = ["unshare", "--user", "--pid", "--mount-proc", "--kill-child"]
TRY_LOCK = r"""
import sys, mvc
repo = mvc.Repository.open(sys.argv[1])
try:
    repo.locks.lock(sys.argv[2])
    print("took")
except mvc.LockHeld as exc:
    print("held", exc.here)
"""


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(UNSHARE + ["true"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture
def in_new_pid_namespace():
    """A function running ``argv`` in a new user and pid namespace (a container's view of this host)."""
    if not unshare_works():
        pytest.skip("'unshare --user --pid' is not permitted here")
    return lambda argv, **kw: subprocess.Popen(UNSHARE + argv, text=True, **kw)


@needs_proc
def test_a_live_holder_in_another_pid_namespace_keeps_its_lock(repo, in_new_pid_namespace):
    holder = in_new_pid_namespace([sys.executable, "-c", HOLDER, str(repo.root), "lock", "main"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "ready"
        lock = repo.locks.get("main")
        assert lock.pid != holder.pid and not lock.stale  # its own pid there names another process here
        assert lock.host == socket.gethostname() and lock.pidns not in (None, processes.pid_namespace())
        with pytest.raises(mvc.LockHeld) as err:
            repo.commit(state(), "blocked")
        assert err.value.here is True and "holder file shows that it still runs" in str(err.value)
        with pytest.raises(mvc.LockHeld):
            repo.locks.lock("main")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert repo.locks.get("main").stale  # gone now (exited without unlocking): its holder file is free
    assert holder_files(repo) == [f"holder-{lock.flock}.lock"]  # it goes with its record, on takeover
    assert repo.locks.lock("main").pid == os.getpid() and f"holder-{lock.flock}.lock" not in holder_files(repo)


@needs_proc
def test_a_live_holder_whose_holder_file_was_removed_keeps_its_lock(repo, in_new_pid_namespace):
    # a cleanup script (or 'rm .mvc/locks/*') removes the file of a trainer running in a container:
    # the trainer still runs, so its lock must still hold; nobody can tell here, so only force breaks it
    holder = in_new_pid_namespace([sys.executable, "-c", HOLDER, str(repo.root), "lock", "main"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "ready"
        lock = repo.locks.get("main")
        holderfiles.path(repo.dir / "locks", lock.flock).unlink()
        removed = repo.locks.get("main")
        assert not removed.stale and removed.evidence == "holder file removed"
        with pytest.raises(mvc.LockHeld) as err:
            repo.commit(state(), "blocked")
        assert err.value.here is False and "holder file was removed" in str(err.value)
        with pytest.raises(mvc.LockHeld):
            repo.locks.lock("main")
        # nor from another container (its python is not pid 1 there: the holder is pid 1 in its own,
        # and LMDB's reader table, keyed by pid number, would refuse a second reader with that pid)
        writer = in_new_pid_namespace(["sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-c", TRY_LOCK,
                                       str(repo.root), "main"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = writer.communicate(timeout=120)
        assert out.split() == ["held", "False"], err
        refused = cli(repo, "unlock", "main")
        assert refused.exit_code == 1 and "holder file was removed" in refused.stderr
        assert "if it is gone, free the lock with 'mvc unlock --force main'" in refused.stderr  # deliberately
        assert repo.locks.get("main").flock == lock.flock
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert not repo.locks.get("main").stale  # nothing here can tell it exited either: it holds until forced
    repo.locks.unlock("main", force=True)
    assert repo.locks.lock("main").pid == os.getpid()


@needs_proc
def test_a_writer_in_another_pid_namespace_does_not_break_a_live_lock(repo, in_new_pid_namespace):
    repo.locks.lock("main")  # this process, whose pid means nothing in the new namespace
    writer = in_new_pid_namespace([sys.executable, "-c", TRY_LOCK, str(repo.root), "main"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    assert out.split() == ["held", "True"]  # told by this process's holder file, not assumed
    assert repo.locks.get("main").pid == os.getpid()


def holder_files(repo) -> list:
    return sorted(p.name for p in (repo.dir / "locks").glob("holder-*"))


def wait_until_free(repo, lock, timeout=60.0) -> None:
    """Wait for the kernel to drop the flock of a holder killed through its parent (unshare)."""
    deadline = time.monotonic() + timeout
    while holderfiles.probe(repo.dir / "locks", lock.flock) is holderfiles.Flock.HELD:
        assert time.monotonic() < deadline, "the killed holder's flock was never dropped"
        time.sleep(0.05)


@needs_proc
@pytest.mark.parametrize("holder_in", ["this pid namespace", "a pid namespace of its own"])
def test_a_killed_holder_is_taken_over_from_another_pid_namespace(repo, in_new_pid_namespace, holder_in):
    # a training container OOM-killed and restarted in its pod: same host name and kernel, new pid namespace
    argv = [sys.executable, "-c", HOLDER, str(repo.root), "lock", "main"]
    start = (lambda argv, **kw: subprocess.Popen(argv, text=True, **kw)) if holder_in == "this pid namespace" \
        else in_new_pid_namespace
    holder = start(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "ready"
    killed = repo.locks.get("main")
    assert not killed.stale and holder_files(repo) == [f"holder-{killed.flock}.lock"]
    holder.kill()  # SIGKILL (of unshare, whose --kill-child kills the holder in its namespace)
    holder.wait(timeout=60)
    wait_until_free(repo, killed)
    restarted = in_new_pid_namespace([sys.executable, "-c", TRY_LOCK, str(repo.root), "main"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = restarted.communicate(timeout=120)
    assert restarted.returncode == 0, err
    assert out.split() == ["took"]
    left = holder_files(repo)
    taken = repo.locks.get("main")
    assert taken.pidns not in (None, processes.pid_namespace()) and taken.flock != killed.flock
    assert left == [f"holder-{taken.flock}.lock"]  # the killed holder's file went with its lock
    assert taken.stale  # that one exited without unlocking too
    mine = repo.locks.lock("main")
    assert mine.pid == os.getpid() and holder_files(repo) == [f"holder-{mine.flock}.lock"]
    repo.locks.unlock("main")
    assert holder_files(repo) == []


def test_a_stopped_holder_keeps_its_lock(repo, child):
    holder = child("lock", "main")
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        lock = repo.locks.get("main")
        assert not lock.stale and lock.pid == holder.pid
        with pytest.raises(mvc.LockHeld) as err:
            repo.locks.lock("main")
        assert err.value.here is True
        if unshare_works() and processes.pid_namespace() is not None:  # nor from a container's namespace
            writer = subprocess.run(UNSHARE + [sys.executable, "-c", TRY_LOCK, str(repo.root), "main"],
                                    capture_output=True, text=True, timeout=120)
            assert writer.stdout.split() == ["held", "True"], writer.stderr
        assert holder_files(repo) == [f"holder-{lock.flock}.lock"]
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    holder.stop()


def test_no_holder_file_is_left_after_unlock_or_takeover(repo, child):
    lock = repo.locks.lock("main")
    assert holder_files(repo) == [f"holder-{lock.flock}.lock"]
    assert repo.locks.lock("main") == lock and holder_files(repo) == [f"holder-{lock.flock}.lock"]  # idempotent
    repo.locks.unlock("main")
    assert holder_files(repo) == []
    holder = child("lock", "main")
    holder.proc.kill()
    holder.proc.wait()
    dead = repo.locks.get("main")
    assert dead.stale and holder_files(repo) == [f"holder-{dead.flock}.lock"]  # found free, left to its record
    repo.locks.lock("main", named=True, owner="alice")  # a takeover by a named lock has no holder file
    assert holder_files(repo) == []
    repo.locks.unlock("main", owner="alice")
    other = child("lock", "main")
    held = repo.locks.get("main")
    repo.locks.unlock("main", force=True)  # its process still runs, but its lock is gone: so is its file
    assert holder_files(repo) == [] and other.proc.poll() is None
    lock = repo.locks.lock("main")
    assert holder_files(repo) == [f"holder-{lock.flock}.lock"] and lock.flock != held.flock


FORK_HOLDER = r"""
import os, sys, time, mvc
repo = mvc.Repository.open(sys.argv[1])
repo.locks.lock("main")
pid = os.fork()
if pid == 0:
    print("forked", flush=True)  # past the fork hooks, which close its copies of the holder file
    time.sleep(120)
    os._exit(0)
print(pid, flush=True)
sys.stdin.read()
"""


def test_a_forked_child_does_not_keep_its_parents_lock(repo):
    # a trainer's data loader workers (forked) outlive it for a while: the lock ends with the trainer
    holder = subprocess.Popen([sys.executable, "-c", FORK_HOLDER, str(repo.root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    lines = {holder.stdout.readline().strip() for _ in range(2)}  # in either order
    forked = int((lines - {"forked"}).pop())
    try:
        assert not repo.locks.get("main").stale
        holder.kill()
        holder.wait(timeout=60)
        assert processes.process_alive(forked, None)
        assert repo.locks.get("main").stale
    finally:
        os.kill(forked, signal.SIGKILL)


def test_holder_files_no_record_names_are_swept_once_free(repo):
    lock_dir = repo.dir / "locks"
    orphan, busy = (lock_dir / f"holder-{c * 32}.lock" for c in "ab")
    orphan.touch()  # what a process killed between making its file and writing its record left
    busy.touch()
    fd = os.open(busy, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a process about to write its record
        lock = repo.locks.lock("main")
        assert holder_files(repo) == sorted([busy.name, f"holder-{lock.flock}.lock"])
    finally:
        os.close(fd)
    repo.locks.unlock("main")
    repo.locks.lock("side")
    assert busy.name not in holder_files(repo)


def test_a_holder_file_token_that_names_another_path_is_damage(repo):
    forge_lock(repo, os.getpid(), flock="../../elsewhere")
    with pytest.raises(LockDamaged):
        repo.locks.get("main")
    repo.locks.unlock("main", force=True)
    assert repo.locks.get("main") is None


def test_named_lock_outlives_its_process_and_admits_its_owner(repo, child):
    holder = child("named", "main", "alice")
    holder.stop()
    lock = repo.locks.get("main")
    assert lock.named and lock.owner == "alice" and not lock.stale
    with pytest.raises(mvc.LockHeld) as err:
        repo.commit(state(1), "bob", author="bob")
    assert (err.value.branch, err.value.owner, err.value.named, err.value.remote) == ("main", "alice", True, None)
    landed = repo.commit(state(2), "alice", author="alice")
    assert repo.resolve("main") == landed.id
    with pytest.raises(mvc.LockHeld):
        repo.locks.unlock("main", owner="bob")
    repo.locks.unlock("main", owner="alice")
    assert repo.locks.get("main") is None


def test_damaged_lock_record_is_reported_and_can_be_forced_away(repo):
    with repo.index.write() as txn:
        txn.put_lock("main", {"host": 3})
    with pytest.raises(LockDamaged) as err:
        repo.locks.get("main")
    assert (err.value.branch, err.value.remote) == ("main", None)
    with pytest.raises(mvc.CorruptObject):
        repo.commit(state(), "refused")
    repo.locks.unlock("main", force=True)
    repo.commit(state(), "fine")


def test_commit_and_load_fail_clearly_while_gc_holds_the_lock(repo, child):
    repo.commit(state(), "before gc")
    repo.lock_timeout = 0.2
    gc = child("gc")
    with pytest.raises(mvc.LockHeld) as err:
        repo.commit(state(), "waits, then gives up")
    assert f"gc is running (pid {gc.pid} on {socket.gethostname()}" in str(err.value)
    with pytest.raises(GcLockBusy) as err:
        repo.load("main")
    assert err.value.waited_for == "gc" and f"pid {gc.pid}" in err.value.holder
    gc.stop()
    repo.commit(state(), "gc is gone")


def test_commit_waits_for_gc_to_finish(repo, child):
    gc = child("gc")
    done, hashing = [], threading.Event()
    # progress is first called after the commit has passed the gc lock and hashed
    worker = threading.Thread(target=lambda: done.append(
        repo.commit(state(), "waited", progress=lambda *_: hashing.set())))
    worker.start()
    assert not hashing.wait(1.0), "the commit went on while gc held the lock"
    assert worker.is_alive() and repo.head().id is None
    gc.stop()
    assert hashing.wait(60)
    worker.join(timeout=60)
    assert done and repo.resolve("main") == done[0].id


def test_killed_gc_releases_its_lock(repo, child):
    gc = child("gc")
    gc.proc.kill()
    gc.proc.wait()
    repo.lock_timeout = 5
    repo.commit(state(), "the kernel dropped the flock")


def test_gc_waits_for_running_commits(repo, child):
    child("commit")
    repo.lock_timeout = 0.2
    with pytest.raises(GcLockBusy) as err:
        with repo.gc_lock.exclusive():
            pass
    assert (err.value.waited_for, err.value.timeout) == ("commits", 0.2)




def test_cli_lock_list_and_unlock(repo):
    import json
    result = cli(repo, "lock", "main", "--owner", "alice")
    assert result.exit_code == 0 and "for alice" in result.output
    assert "'mvc unlock main --owner alice' releases it" in result.output  # the advice that works
    assert cli(repo, "lock", "main", "--owner", "alice").exit_code == 0  # already hers: no-op
    listed = json.loads(cli(repo, "lock", "--list", "--json").output)
    assert [(x["branch"], x["owner"], x["named"], x["pid"] > 0) for x in listed] == [("main", "alice", True, True)]
    assert "main\tlocked by alice" in cli(repo, "lock", "--list").output
    with pytest.raises(mvc.LockHeld):
        repo.commit(state(), "bob is refused", author="bob")
    refused = cli(repo, "unlock", "main", "--owner", "bob")
    assert refused.exit_code == 1
    assert refused.output.strip().splitlines() == [refused.output.strip()]  # one line, no traceback
    assert refused.output.startswith("mvc: error: cannot unlock branch 'main': it is locked by alice")
    assert cli(repo, "unlock", "main", "--owner", "alice").output == "unlocked branch 'main'\n"
    assert cli(repo, "unlock", "main").output == "branch 'main' was not locked\n"
    cli(repo, "lock", "main", "--owner", "alice")
    assert cli(repo, "unlock", "--force", "main").exit_code == 0
    assert repo.locks.get("main") is None


def test_cli_lock_usage_errors_exit_2(repo):
    assert cli(repo, "lock").exit_code == 2
    assert cli(repo, "lock", "main", "--list").exit_code == 2


READ_AND_WAIT = r"""
import sys, mvc
repo = mvc.Repository.open(sys.argv[1])
list(repo.log())  # takes a reader slot, which LMDB keys by pid
print("ready", flush=True)
sys.stdin.readline()
"""


@needs_proc
def test_a_reader_whose_pid_another_containers_reader_has_is_told_so_not_sent_to_a_backup(repo, in_new_pid_namespace):
    """Pid 1 of one container reads the repository; pid 1 of another cannot take a reader slot
    (LMDB's reader table is keyed by pid number): that is a clash to explain, not damage."""
    holder = in_new_pid_namespace([sys.executable, "-c", READ_AND_WAIT, str(repo.root)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "ready"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        clash = subprocess.run(UNSHARE + [sys.executable, "-m", "mvc", "log"], cwd=repo.root, env=env,
                               capture_output=True, text=True, timeout=120)
        assert clash.returncode == 1, clash.stdout + clash.stderr
        assert "another live process has its pid number (1)" in clash.stderr and "backup" not in clash.stderr
        assert "--pid=host" in clash.stderr and "Traceback" not in clash.stderr
    finally:
        holder.kill()
        holder.wait()
    assert repo.fsck().ok


def test_an_older_mvc_refuses_a_repository_whose_locks_name_their_holders(repo, monkeypatch):
    """An mvc that knows only the six fields of a lock record would read this one as damaged and
    advise forcing it open while its trainer runs: FORMAT names the new fields before any is written."""
    from mvc import ondisk
    assert ondisk.LOCK_HOLDERS not in ondisk.read_format(repo.dir)[1]
    repo.locks.lock("main")
    assert ondisk.LOCK_HOLDERS in ondisk.read_format(repo.dir)[1]
    monkeypatch.setattr(ondisk, "KNOWN_EXTENSIONS", ondisk.KNOWN_EXTENSIONS - {ondisk.LOCK_HOLDERS})
    with pytest.raises(mvc.UnsupportedFormat) as exc:
        mvc.Repository.open(repo.root)
    assert exc.value.problem == "extensions" and ondisk.LOCK_HOLDERS in exc.value.extensions
