"""Opening files inside ``.mvc`` without trusting what is there.

A repository may come from anywhere (a colleague's tarball, a damaged disk),
so every file mvc opens or creates under ``.mvc`` is opened with
``O_NOFOLLOW`` (a symlink is refused, never followed out of the repository)
and ``O_NONBLOCK`` (a FIFO or device cannot hang the open), then checked with
``fstat`` to be a regular file. Folders are checked the same way. Anything
else is damage: ``NotRegular``, a ``CorruptObject`` naming the path.
"""

import errno
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path

from ..errors import NotRegular

_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path, mode: int, want: str) -> NotRegular:
    return NotRegular(f"{path} is {_kind(mode)}, not {want}; the repository is damaged or was tampered "
                      "with: remove it (mvc never follows links inside .mvc)", path=path)


def open_file(path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor of the regular file ``path``; NotRegular for anything else.

    ``flags`` may add ``O_CREAT``/``O_EXCL``/``O_WRONLY``/``O_RDWR``.
    Raises FileNotFoundError as ``os.open`` does.
    """
    try:
        fd = os.open(path, flags | _SAFE, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink (ELOOP) or a FIFO opened for writing
            raise _refuse(path, os.lstat(path).st_mode, "a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode, "a regular file")
        os.set_blocking(fd, True)  # O_NONBLOCK was only for the open
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_dir(path) -> Path:
    """``path`` if it is a real folder (not a symlink to one); NotRegular otherwise.

    FileNotFoundError if it does not exist.
    """
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        raise _refuse(path, mode, "a folder")
    return Path(path)


def ensure_dir(path) -> Path:
    """Create folder ``path`` if missing; NotRegular if something else is there."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    return check_dir(path)


def check_file(path) -> Path:
    """``path`` if it is a regular file (not a link); NotRegular otherwise; FileNotFoundError if absent."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(path, mode, "a regular file")
    return Path(path)


def entries(folder) -> list:
    """(name, is a regular file) for each entry of ``folder``, sorted by name; nothing is followed."""
    with os.scandir(check_dir(folder)) as it:
        return sorted((e.name, e.is_file(follow_symlinks=False)) for e in it)


def read_small(path, limit: int = 1 << 20) -> bytes:
    """The bytes of a small regular file (at most ``limit``); NotRegular / FileNotFoundError."""
    fd = open_file(path)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def atomic_write(path, data, tmp_dir=None) -> None:
    """Replace file ``path`` with the bytes ``data`` through ``atomic_file``."""
    with atomic_file(path, tmp_dir) as f:
        view, done = memoryview(data).cast("B"), 0
        while done < len(view):
            done += f.write(view[done:done + (1 << 30)])


@contextmanager
def atomic_file(path, tmp_dir=None, replace: bool = True, tmp=None, mode: int = 0o644):
    """An unbuffered file that becomes ``path`` when the block ends without error:
    a reader (and a crash) sees the old file or the new, never a mix. The one
    atomic write of mvc (the FORMAT file, exports, a folder remote's objects,
    bisect's state).

    Written under a new temporary name (``tmp``, else a random one in ``tmp_dir``,
    default ``path``'s folder; on the same filesystem), its bytes handed to disk
    as they come (``start_writeback``), fsynced, put in place, and the folder
    fsynced. ``replace`` False: linked, so FileExistsError if ``path`` appeared
    meanwhile (a rename would overwrite it). ``mode`` is the new file's, less
    the umask. On any error the temporary file is removed and ``path`` is as it was."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else Path(tmp_dir or path.parent) / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            fd = None
            yield _Writeback(f)
            os.fsync(f.fileno())
        _put_in_place(tmp, path, replace)
    except BaseException:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def _put_in_place(tmp: Path, path: Path, replace: bool) -> None:
    if replace:
        os.rename(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if ``path`` appeared meanwhile, unlike a rename
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise  # FileExistsError among them
        os.rename(tmp, path)  # a filesystem without hard links
        return
    os.unlink(tmp)


class _Writeback:
    """An unbuffered file whose bytes start going to disk every WRITEBACK_BYTES
    as they are written (``start_writeback``), so the fsync at the end finds
    little left to write."""

    def __init__(self, f):
        self.f, self.offset, self.started = f, 0, 0

    def write(self, data) -> int:
        n = self.f.write(data)
        self.offset += n
        if self.offset - self.started >= WRITEBACK_BYTES:
            start_writeback(self.f.fileno(), self.started, self.offset - self.started)
            self.started = self.offset
        return n

    def __getattr__(self, name):  # flush, fileno, ...: the file's own
        return getattr(self.f, name)


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_file_range():
    try:
        import ctypes
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint], ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
WRITEBACK_BYTES = 8 << 20  # files mvc writes and fsyncs start their disk writes every this many bytes
_WRITE = 2  # SYNC_FILE_RANGE_WRITE: start writing the range back, do not wait for it


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing ``nbytes`` at ``offset`` of ``fd`` to
    disk now, without waiting. Durability still comes from fsync; this only
    spreads the disk writes over the time the file is written, so the final
    fsync finds little left to do. A no-op where the call does not exist."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _WRITE)  # advice: its result does not matter
