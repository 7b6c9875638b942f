"""Holder files: a process lock's proof of life that pid namespaces cannot hide.

- **holder file**: ``.mvc/locks/holder-<token>.lock``, an empty file that
  the process holding a branch's process lock keeps ``flock(LOCK_EX)``-ed
  through a descriptor it keeps open for as long as it holds the lock. The
  kernel drops a flock when the last descriptor of it closes, so when the
  process dies, however it dies, the file is free. Unlike a pid, this says
  the same to every process of the kernel, whatever its pid namespace: a
  training container restarted in the same pod (same host name, new pid
  namespace) can tell that its predecessor's lock is dead.
- **token**: 16 random bytes as 32 lowercase hex digits, new for each lock
  taken; the lock record names it (``flock``), so a number is never reused.

What a flock says holds only among processes of one kernel (one boot of one
machine): callers judge a free file as a dead holder only for a record
written in this boot (``processes.same_boot``). A held file means a live
holder (or, for a moment, a process judging it: that errs toward alive). A
missing file means nothing: anyone who may write the folder can remove a
live holder's file (a cleanup script, ``rm .mvc/locks/*``), so its absence
is no proof of death, and judges never remove a named file themselves (it
goes when its record does, on unlock or takeover).

A creator takes the flock, then checks that the file is still linked: a
remover of files no record names (``sweep``) unlinks
only while it holds the flock itself, so a file that is still linked once
its creator holds the flock stays until its creator lets go. ``drop``
unlinks without the flock: it is for files whose record is gone or whose
holder is dead.

Children forked without exec share the descriptor, and with it the flock:
the lock would outlive its holder while they run. That errs on the safe
side (the lock looks alive), but would keep a killed trainer's lock while
its forked data loader workers linger, and a process lock belongs to its
process, not to its children. So a child forked through ``os.fork``
(multiprocessing, DataLoader workers) closes its copies at once; one forked
by C code that skips Python's fork hooks keeps the flock until it exits.
The descriptors are ``O_CLOEXEC``: a program started with exec never holds one.
"""

import enum
import errno
import fcntl
import os
import re
import secrets
from pathlib import Path
from typing import Optional

from .fs import ensure_dir, open_file

PREFIX, SUFFIX = "holder-", ".lock"
_TOKEN = re.compile(r"[0-9a-f]{32}")
_HELD: dict = {}  # token -> the descriptor this process holds its flock through


def valid(token) -> bool:
    """Whether ``token`` (from a record others wrote: any type) can name a holder file."""
    return isinstance(token, str) and _TOKEN.fullmatch(token) is not None


def path(lock_dir: Path, token: str) -> Path:
    return Path(lock_dir) / f"{PREFIX}{token}{SUFFIX}"


def tokens(lock_dir: Path) -> list:
    """The tokens of the holder files in ``lock_dir``, sorted."""
    try:
        names = os.listdir(lock_dir)
    except OSError:
        return []
    found = (name[len(PREFIX):-len(SUFFIX)] for name in names if name.startswith(PREFIX) and name.endswith(SUFFIX))
    return sorted(token for token in found if valid(token))


def take(lock_dir: Path) -> Optional[str]:
    """A new holder file, flocked and kept open by this process: its token.

    None if it cannot be made (a read-only or full folder): the lock is then
    judged by its pid alone, as locks were before holder files.
    """
    _forget_removed()
    try:
        ensure_dir(lock_dir)
        for _ in range(8):  # another try only if a sweep removed the file between our open and our flock
            token = secrets.token_hex(16)
            fd = open_file(path(lock_dir, token), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            if _keep(lock_dir, token, fd):
                return token
    except OSError:
        pass
    return None


def _keep(lock_dir: Path, token: str, fd: int) -> bool:
    """Flock the new file ``fd`` and keep it if it is still linked; else close it."""
    try:
        if _flock(fd) and os.fstat(fd).st_nlink > 0:
            _HELD[token] = fd
            return True
    except OSError:  # a filesystem without flock: no holder file at all
        os.close(fd)
        drop(lock_dir, token)
        raise
    os.close(fd)  # a sweep holds it or removed it, and removes it
    return False


def drop(lock_dir: Path, token: Optional[str]) -> None:
    """Remove holder file ``token`` and let go of its flock if this process holds it.

    Called once the record that named it is gone or replaced (or was never
    written), so whether the file is judged meanwhile does not matter."""
    if token is None:
        return
    try:
        os.unlink(path(lock_dir, token))
    except OSError:  # gone already, or a folder this process may not write: a later sweep removes it
        pass
    fd = _HELD.pop(token, None)
    if fd is not None:
        os.close(fd)


class Flock(enum.Enum):
    """What a holder file says of its holder (``probe``)."""

    HELD = "held"  # some process of this kernel holds its flock: the holder (or its judge, for a moment)
    FREE = "free"  # it is there and nobody holds it: its holder is gone (if it is of this kernel)
    MISSING = "missing"  # someone removed it: that says nothing of its holder
    UNKNOWN = "unknown"  # it cannot be opened or flocked (permissions, a filesystem without flock)


def probe(lock_dir: Path, token: str, reap: bool = False) -> Flock:
    """What holder file ``token`` says: whether some process of this kernel holds its flock.

    ``reap``: remove it if it is free (only for files no record names: ``sweep``).
    """
    try:
        fd = open_file(path(lock_dir, token))  # flock needs no write access
    except FileNotFoundError:
        return Flock.MISSING
    except OSError:
        return Flock.UNKNOWN
    try:
        try:
            if not _flock(fd):
                return Flock.HELD
        except OSError:  # ENOLCK and the like: a filesystem without flock
            return Flock.UNKNOWN
        if reap:
            drop(lock_dir, token)  # unlinked while we hold its flock: see the module docstring
        return Flock.FREE
    finally:
        os.close(fd)


def sweep(lock_dir: Path, named: set) -> list:
    """Remove the holder files no process holds, other than those ``named`` by lock records; their paths.

    What a process killed between making its file and writing its record
    left, and the file of a damaged record removed with ``--force``. A file
    a record names is left to its record: it goes on unlock and takeover.
    """
    removed = []
    for token in tokens(lock_dir):
        if token not in named and probe(lock_dir, token, reap=True) is Flock.FREE:
            removed.append(path(lock_dir, token))
    return removed


def _flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        return False


def _forget_removed() -> None:
    """Close the descriptors of held files someone removed (``mvc unlock --force``, a deleted repository):
    their records are gone, so the flocks mean nothing, and a long run should not collect descriptors."""
    for token, fd in list(_HELD.items()):
        if os.fstat(fd).st_nlink == 0:
            os.close(_HELD.pop(token))


def _after_fork_in_child() -> None:
    """A forked child is not the lock's process: close its copies, so the flock ends with the holder."""
    for fd in _HELD.values():
        try:
            os.close(fd)  # never LOCK_UN: that would unlock the parent's flock too (one open file)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
