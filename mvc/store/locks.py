"""Write locks: branch locks, kept in the index, and the gc lock, a file lock.

- **branch lock**: a record in the index ``locks`` db naming who may move a
  branch. Two kinds:

  - a *process lock* (``repo.locks.lock(b)``, what a training run takes)
    belongs to one process: its host, pid, start time (which tells a reused
    pid from the owner), pid namespace, and the token of its *holder file*
    (``flock``): ``.mvc/locks/holder-<token>.lock``, which the process keeps
    flocked while it holds the lock (``mvc.store.holderfiles``). It lapses
    when the process dies. A writer of the same kernel (the same boot id)
    tells by the holder file, whatever its pid namespace: a training
    container restarted in its pod (same host name, new pid namespace)
    takes its predecessor's lock over. A writer that sees the same host,
    boot and pid namespace also asks the pid; one on the same host after a
    reboot takes the lock over. Anywhere else, for a lock without a
    holder file (an older mvc's) from another pid namespace, and for one
    whose holder file someone removed, nobody can tell, so it holds until
    ``mvc unlock --force``: another host, or a container that shares this
    host's name and kernel but has pids of its own (``docker run
    --network=host``, see ``mvc.store.processes``).
  - a *named lock* (``repo.locks.lock(b, named=True)``, what ``mvc lock``
    takes) belongs to an owner name, by default the commit author
    (``$MVC_AUTHOR`` or ``user@host``). It holds until unlocked, and every
    process committing as that author counts as its owner.

- **holder**: the identity a caller presents: this process (host, pid,
  start time, pid namespace) and its owner name. (Its holder file is not
  part of it: a process is the owner of its lock by pid, as it always was.)
- **gc lock**: ``.mvc/locks/gc.lock``, taken with ``flock``: shared by every
  commit and load for their whole duration, exclusive by gc. gc first takes
  ``gc.gate`` exclusively, which new commits must pass (shared, briefly), so
  a stream of commits cannot starve gc. The kernel drops flocks when their
  process dies: a killed commit or gc never leaves this lock behind.
"""

import errno
import fcntl
import getpass
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from ..errors import BranchLocked, CorruptObject, GcLockBusy, LockDamaged, LockHeld
from . import holderfiles
from .fs import ensure_dir, open_file, read_small
from .holderfiles import Flock
from .processes import Seen, pid_namespace, process_alive, same_boot, seen, start_token

GC_LOCK = "gc.lock"
GC_GATE = "gc.gate"
_FIELDS = {"host": str, "pid": int, "since": float, "owner": str, "started": (str, type(None)), "named": bool,
           "pidns": (str, type(None)), "flock": (str, type(None))}
# records of an mvc that made no holder files, and of one that did not record the pid namespace either
_KNOWN_FIELDS = (set(_FIELDS), set(_FIELDS) - {"flock"}, set(_FIELDS) - {"flock", "pidns"})


@dataclass(frozen=True)
class BranchLock:
    """Who holds a branch's write lock, and since when."""

    branch: str
    host: str
    pid: int  # the process that took it (for a named lock: only for information)
    since: float  # seconds since the Unix epoch
    owner: str  # the owner's name: the commit author, or what ``mvc lock --owner`` said
    started: Optional[str] = None  # the process's start token (boot id / start ticks); None if unknown
    named: bool = False  # held by the owner name until unlocked, not by the process
    pidns: Optional[str] = None  # the process's pid namespace; None if unknown (or an older mvc's lock)
    flock: Optional[str] = None  # the token of its holder file; None if it has none (or an older mvc's lock)
    stale: bool = False  # its process is gone (judged here): the next writer takes it over
    # how its liveness was told here: "pid", "holder file" or "reboot"; "" where it cannot be told,
    # "holder file removed" where it cannot because its holder file is gone (then it holds until forced)
    evidence: str = field(default="", compare=False)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
        ago = _ago(time.time() - self.since)
        if self.named:
            return f"{self.owner} (from {self.host}) since {when} ({ago})"
        return f"pid {self.pid} on {self.host} ({self.owner}) since {when} ({ago})"


@dataclass(frozen=True)
class Holder:
    """The identity a caller presents: this process and its owner name."""

    host: str
    pid: int
    started: Optional[str]
    owner: str
    pidns: Optional[str] = None


def default_author() -> str:
    """Who acts: $MVC_AUTHOR, else user@host (commit authors and lock owners)."""
    author = os.environ.get("MVC_AUTHOR")
    if author:
        return author
    try:
        user = getpass.getuser()
    except Exception:  # no user database entry (containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def this_process(owner: str) -> Holder:
    pid = os.getpid()
    return Holder(socket.gethostname(), pid, start_token(pid), owner, pid_namespace())


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


# -- branch locks (in an index transaction) -----------------------------------

def _decode(branch: str, value, lock_dir: Path) -> BranchLock:
    if type(value) is not dict or set(value) not in _KNOWN_FIELDS or not all(
            isinstance(value.get(k), t) for k, t in _FIELDS.items()):
        raise LockDamaged(f"the lock on branch {branch!r} is damaged", branch=branch)
    if value.get("flock") is not None and not holderfiles.valid(value["flock"]):  # it names a path
        raise LockDamaged(f"the lock on branch {branch!r} is damaged: its holder file token is not one",
                          branch=branch)
    lock = BranchLock(branch, value["host"], value["pid"], value["since"], value["owner"],
                      value["started"], value["named"], value.get("pidns"), value.get("flock"))
    stale, evidence = _judge(lock, lock_dir)
    return BranchLock(**{**lock.__dict__, "stale": stale, "evidence": evidence})


def _where(lock: BranchLock) -> Seen:
    return seen(lock.host, lock.started, lock.pidns)


def _by_flock(lock: BranchLock) -> bool:
    """Whether the lock's holder file tells its liveness: it has one, made in this boot of this kernel.

    The index is LMDB, which only processes of one kernel may share, so the
    holder file sits on a filesystem this kernel's flocks cover, and a free
    file means a dead holder, whatever host name and pid namespace it had.
    Another boot id is another kernel (this machine before a reboot, or
    another that shares its name): its flocks are gone or were never seen here.
    """
    return lock.flock is not None and same_boot(lock.started)


def _judge(lock: BranchLock, lock_dir: Path) -> tuple:
    """(stale, evidence): whether the lock's process is known to be gone, so the next writer
    may take it over, and what told (``BranchLock.evidence``).

    It is alive if its pid runs where the pid means it (``HERE``: a holder
    that somehow closed its holder file still counts) or if anyone holds
    its holder file (a holder in another pid namespace; see ``holderfiles``
    for forked children). Otherwise it is stale if its holder file, made in
    this boot, is free (``_by_flock``), or it was written on this host in an
    earlier boot (``ENDED``: the index is LMDB, which only processes of one
    kernel may share, so this machine wrote it before it rebooted), or it is
    ``HERE`` (its pid is gone). A missing holder file proves nothing: anyone
    may remove it while its holder runs. Any other lock cannot be judged
    (one of another machine, of another pid namespace without a holder file:
    an older mvc's, or whose holder file was removed): it holds until ``mvc
    unlock --force``, since taking over a live writer's lock loses history,
    and process locks have no expiry that would free it later.
    """
    if lock.named:
        return False, ""
    where = _where(lock)
    if where is Seen.HERE and process_alive(lock.pid, lock.started):
        return False, "pid"
    flock = None if lock.flock is None else holderfiles.probe(lock_dir, lock.flock)
    if flock is Flock.HELD:
        return False, "holder file"
    if flock is Flock.FREE and _by_flock(lock):
        return True, "holder file"
    if where is Seen.ENDED:
        return True, "reboot"
    if where is Seen.HERE:
        return True, "pid"
    return False, "holder file removed" if flock is Flock.MISSING else ""


def _encode(lock: BranchLock) -> dict:
    return {"host": lock.host, "pid": lock.pid, "since": float(lock.since), "owner": lock.owner,
            "started": lock.started, "named": lock.named, "pidns": lock.pidns, "flock": lock.flock}


def lock_dir(txn) -> Path:
    """Where the holder files of the locks in ``txn``'s index live (beside the gc lock)."""
    return txn.repo_dir / "locks"


def get(txn, branch: str) -> Optional[BranchLock]:
    """The lock on ``branch`` or None; CorruptObject if its record is damaged."""
    value = txn.lock(branch)
    return None if value is None else _decode(branch, value, lock_dir(txn))


def all_locks(txn) -> list:
    return [_decode(name, value, lock_dir(txn)) for name, value in txn.locks()]


def owns(lock: BranchLock, me: Holder) -> bool:
    if lock.named:
        return lock.owner == me.owner
    same = (lock.host, lock.pid, lock.pidns) == (me.host, me.pid, me.pidns)  # pids repeat across containers
    return same and lock.started in (None, me.started)


def _refuse(lock: BranchLock, doing: str) -> LockHeld:
    here = lock.evidence in ("pid", "holder file")  # its liveness was judged, not assumed
    return BranchLocked(f"cannot {doing} branch {lock.branch!r}: it is locked by {lock.describe()}"
                        f"{_liveness(lock, here)}", branch=lock.branch, owner=lock.owner, host=lock.host,
                        named=lock.named, here=here)


def _liveness(lock: BranchLock, judged: bool) -> str:
    if lock.named or _where(lock) is Seen.HERE:
        return ""
    if judged:  # its pid means nothing here: say why it still counts as running
        return f"; its holder file shows that it still runs ({_elsewhere(lock)})"
    if lock.evidence == "holder file removed":
        return f"; its holder file was removed, so whether it still runs cannot be told from here ({_elsewhere(lock)})"
    return f"; whether it still runs cannot be told from here ({_elsewhere(lock)})"


def _elsewhere(lock: BranchLock) -> str:
    if lock.host != socket.gethostname():
        return "another host"
    if lock.pidns is None:
        return "its pid namespace was not recorded: an older mvc's lock"
    return f"it runs in pid namespace {lock.pidns}, another container"


def acquire(txn, branch: str, me: Holder, named: bool, flock: Optional[str] = None) -> BranchLock:
    """Lock ``branch`` for ``me``; idempotent for its owner, takes over a stale lock.

    ``flock``: the token of the holder file ``me`` holds (``holderfiles.take``)
    for a process lock. The lock returned keeps the owner's own token when it
    was already the owner's: the caller then drops the new one. The holder
    file of a lock taken over is removed, and so are holder files no record
    names and no process holds. Raises LockHeld naming the holder if another
    live owner holds it.
    """
    current = get(txn, branch)
    if current is not None and owns(current, me):
        return current
    if current is not None and not current.stale:
        raise _refuse(current, "lock")
    lock = BranchLock(branch, me.host, me.pid, time.time(), me.owner, None if named else me.started, named,
                      None if named else me.pidns, None if named else flock)
    txn.put_lock(branch, _encode(lock))
    # files of dead holders only: should the transaction abort, removing them changed no judgement
    if current is not None:  # taken over: its holder is dead, so its file says so with or without it
        holderfiles.drop(lock_dir(txn), current.flock)
    holderfiles.sweep(lock_dir(txn), _named_flocks(txn))
    return lock


def _named_flocks(txn) -> set:
    """The holder file tokens the lock records name (damaged records are only skipped here)."""
    out = set()
    for name in txn.ids("locks"):
        try:
            value = txn.lock(name.decode("utf-8", "replace"))
        except CorruptObject:
            continue
        if isinstance(value, dict):
            out.add(value.get("flock"))
    return out


def release(txn, branch: str, me: Holder, force: bool) -> Optional[str]:
    """Unlock ``branch``; a no-op if it is not locked.

    Returns the token of the holder file the removed lock named (or None),
    for the caller to ``holderfiles.drop`` once the transaction committed:
    until then the lock is still its holder's. Raises LockHeld if another
    live owner holds it and ``force`` is false. A damaged lock record can
    only be removed with ``force`` (its holder file, if any, is swept once free).
    """
    if force:
        try:
            current = get(txn, branch)
        except CorruptObject:
            current = None
        txn.delete_lock(branch)
        return None if current is None else current.flock
    current = get(txn, branch)
    if current is None:
        return None
    if not owns(current, me) and not current.stale:
        raise _refuse(current, "unlock")
    txn.delete_lock(branch)
    return current.flock


def check_writer(txn, branch: str, me: Holder) -> None:
    """Raise LockHeld if someone other than ``me`` holds a live lock on ``branch``."""
    current = get(txn, branch)
    if current is not None and not current.stale and not owns(current, me):
        raise _refuse(current, "write to")


# -- the gc lock (flock) ------------------------------------------------------

def _open(path: Path) -> Optional[int]:
    """The lock file's descriptor; None in a repository this user may only read
    and whose lock file was never made (no gc can have run there)."""
    try:
        ensure_dir(path.parent)
        return open_file(path, os.O_RDWR | os.O_CREAT)
    except (PermissionError, OSError) as exc:
        if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
            raise
    try:
        return open_file(path)  # flock works on a read-only descriptor too
    except FileNotFoundError:
        return None


def _try_flock(fd: Optional[int], mode: int, timeout: float) -> bool:
    """Take ``flock(fd, mode)``, polling for up to ``timeout`` seconds; False if it stayed busy."""
    if fd is None:
        return True
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def _gc_holder(lock_dir: Path) -> str:
    try:
        text = read_small(lock_dir / GC_GATE, 4096).decode().split()
        pid, host, since = text[0], text[1], float(text[2])
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
        return f"pid {pid} on {host}, started {when}"
    except (OSError, IndexError, ValueError, CorruptObject):
        return "pid unknown"


@contextmanager
def shared_gc_lock(lock_dir: Path, timeout: float) -> Iterator[None]:
    """Held by a commit or load while it runs, so gc cannot delete what it relies on.

    Waits up to ``timeout`` seconds for a running gc; raises LockHeld
    ('gc is running (pid ...)') if it does not finish in time.
    """
    gate = _open(lock_dir / GC_GATE)
    lock = None
    try:
        if _try_flock(gate, fcntl.LOCK_SH, timeout):
            lock = _open(lock_dir / GC_LOCK)
            if _try_flock(lock, fcntl.LOCK_SH, timeout):
                if gate is not None:
                    os.close(gate)
                gate = None
                yield
                return
        holder = _gc_holder(lock_dir)
        raise GcLockBusy(f"gc is running ({holder}) and did not finish within {timeout:.0f} s; "
                         "try again when it is done", waited_for="gc", holder=holder, timeout=timeout)
    finally:
        for fd in (gate, lock):
            if fd is not None:
                os.close(fd)


@contextmanager
def exclusive_gc_lock(lock_dir: Path, timeout: float) -> Iterator[None]:
    """Held by gc: no commit or load runs meanwhile (new ones wait at the gate).

    Raises LockHeld if another gc runs or commits keep running for ``timeout`` seconds.
    """
    gate = _open(lock_dir / GC_GATE)
    if gate is None:
        raise LockHeld(f"cannot take the gc lock in {lock_dir}: the repository is read-only here")
    lock = None
    try:
        if not _try_flock(gate, fcntl.LOCK_EX, timeout):
            holder = _gc_holder(lock_dir)
            raise GcLockBusy(f"another gc is running ({holder}); try again when it is done", waited_for="gc",
                             holder=holder, timeout=timeout)
        try:  # who runs gc, for the commits that wait; gc must still run on a full disk
            os.ftruncate(gate, 0)
            os.pwrite(gate, f"{os.getpid()} {socket.gethostname()} {time.time()}\n".encode(), 0)
        except OSError:
            pass
        lock = _open(lock_dir / GC_LOCK)
        if not _try_flock(lock, fcntl.LOCK_EX, timeout):
            raise GcLockBusy(f"commits kept running for {timeout:.0f} s, so gc could not start; "
                             "run it again between checkpoints", waited_for="commits", timeout=timeout)
        yield
    finally:
        for fd in (lock, gate):
            if fd is not None:
                os.close(fd)


LOCK_TIMEOUT = 60.0  # seconds a commit or load waits for a running gc (and gc for them)


class GcLock:
    """The gc lock of one repository: ``shared()`` for commits and reads, ``exclusive()`` for gc."""

    def __init__(self, lock_dir: Path, timeout: float = LOCK_TIMEOUT):
        self.dir = Path(lock_dir)
        self.timeout = timeout

    def shared(self):
        return shared_gc_lock(self.dir, self.timeout)

    def exclusive(self):
        return exclusive_gc_lock(self.dir, self.timeout)
