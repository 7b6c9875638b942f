"""Buckets: the few calls a remote needs from an object store, whatever backs it.

Vocabulary:

- **bucket**: a flat namespace of keys (``packs/1a2b….pack``) naming objects
  of bytes. ``S3Bucket`` (``mvc.remote.s3``) speaks S3; ``FolderBucket``
  keeps the same keys as files in a folder on this machine.
- **etag**: an opaque tag of one version of an object. A conditional put
  names the etag it expects to replace (``if_match``, S3's ``If-Match``) or
  that no object may exist yet (``if_absent``, ``If-None-Match: *``); when
  the condition fails nothing is written and ``PreconditionFailed`` is
  raised. Refs move only this way, so two writers never lose an update.

Every call either completes or raises an ``MvcError``: ``NotFound`` for an
absent key, ``PreconditionFailed`` for a lost conditional write,
``RemoteError`` (one line saying what to do) for anything else. Transient
failures are retried inside the implementation before that.
"""

import fcntl
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import urlparse

from .. import hashing
from ..errors import BadInput, RemoteError, RemoteUnreachable, UntrustedAnswer  # noqa: F401  (re-exported)
from ..store import fs

_KEY = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_LISTENERS: list = []


def on_notice(listener) -> None:
    """Call ``listener(message)`` for each notice a remote gives while it works ("waiting for
    server ..., retry 2/5"); the CLI prints them."""
    _LISTENERS.append(listener)


def notify(message: str) -> None:
    for listener in list(_LISTENERS):
        listener(message)


class NotFound(RemoteError):
    """The key names no object on the remote."""


class PreconditionFailed(RemoteError):
    """A conditional put lost: the object changed (or appeared) since it was read."""


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key) or any(part in (".", "..") for part in key.split("/")):
        raise BadInput(f"{key!r} is not a valid remote key")
    return key


class Bucket:
    """The interface (see the module). Keys are relative to the remote's prefix."""

    url = ""

    def get(self, key: str) -> bytes:
        """The object's bytes; NotFound."""
        raise NotImplementedError

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the object; NotFound; RemoteError if it is shorter."""
        raise NotImplementedError

    def get_tail(self, key: str, n: int) -> tuple:
        """(the last ``n`` bytes (fewer if the object is smaller), the object's size); NotFound."""
        raise NotImplementedError

    def get_versioned(self, key: str) -> Optional[tuple]:
        """(bytes, etag) of the object, or None if absent."""
        raise NotImplementedError

    def put(self, key: str, data, if_match: Optional[str] = None, if_absent: bool = False) -> str:
        """Write the whole object (durable when this returns); its new etag.

        ``if_match`` / ``if_absent``: the conditions above (PreconditionFailed).
        """
        raise NotImplementedError

    def list(self, prefix: str) -> list:
        """[(key, size)] of every object whose key starts with ``prefix``, sorted by key."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove the object (a no-op if absent)."""
        raise NotImplementedError

    def list_times(self, prefix: str) -> list:
        """[(key, size, when it was last written, seconds since the epoch by the store's clock)]."""
        raise NotImplementedError

    def check_conditional(self) -> None:
        """RemoteError unless the store honours If-None-Match: * and If-Match.

        Probes with a scratch object under ``tmp/`` and removes it.
        """
        key = f"tmp/probe-{secrets.token_hex(8)}"
        etag = self.put(key, b"1", if_absent=True)
        try:
            for kwargs in ({"if_absent": True}, {"if_match": '"0123456789abcdef0123456789abcdef"'}):
                try:
                    self.put(key, b"2", **kwargs)
                except PreconditionFailed:
                    continue
                raise RemoteError(f"{self.url} does not honour conditional writes (If-None-Match / If-Match); "
                                  "mvc cannot move refs there without risking lost updates: use a store "
                                  "that does (AWS S3, SeaweedFS 4.48 or later, MinIO)")
            self.put(key, b"3", if_match=etag)
        finally:
            self.delete(key)

    def close(self) -> None:
        pass


class FolderBucket(Bucket):
    """Objects as files under a folder of this machine (``file://`` URLs and plain paths).

    Files are written to ``.tmp/`` first, fsynced and renamed into place, so
    an object is always whole. Conditional puts hold ``flock`` on ``.lock``;
    etags are the BLAKE3 of the contents. Nothing is followed through links.
    """

    def __init__(self, root, create: bool = False):
        self.root = Path(root).absolute()
        self.url = str(self.root)
        try:
            if create:
                self.root.mkdir(parents=True, exist_ok=True)
            fs.check_dir(self.root)
        except FileNotFoundError:
            raise RemoteError(f"remote folder {self.root} does not exist") from None
        except OSError as exc:
            raise RemoteError(f"remote folder {self.root} cannot be used: {exc.strerror or exc}") from None

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _read(self, key: str, start: int = 0, stop: Optional[int] = None) -> tuple:
        try:
            fd = fs.open_file(self._path(key))
        except FileNotFoundError:
            raise NotFound(f"{key} is missing from remote {self.url}") from None
        try:
            size = os.fstat(fd).st_size
            if start < 0:
                start = max(0, size + start)
            stop = size if stop is None else stop
            data = os.pread(fd, max(0, stop - start), start) if stop > start else b""
            if len(data) != max(0, stop - start):
                raise RemoteError(f"{key} on remote {self.url} is shorter than expected ({size} bytes)")
            return data, size
        finally:
            os.close(fd)

    def get(self, key: str) -> bytes:
        return self._read(key)[0]

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        return self._read(key, start, stop)[0]

    def get_tail(self, key: str, n: int) -> tuple:
        return self._read(key, -n)

    def get_versioned(self, key: str) -> Optional[tuple]:
        try:
            data = self.get(key)
        except NotFound:
            return None
        return data, hashing.digest(data).hex()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = fs.open_file(self.root / ".lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def put(self, key: str, data, if_match: Optional[str] = None, if_absent: bool = False) -> str:
        path = self._path(key)
        if if_match is None and not if_absent:
            self._write(path, data)
            return hashing.digest(data).hex()
        with self._locked():
            current = self.get_versioned(key)
            if (if_absent and current is not None) or (if_match is not None and (current is None or current[1] != if_match)):
                raise PreconditionFailed(f"{key} on remote {self.url} changed meanwhile")
            self._write(path, data)
        return hashing.digest(data).hex()

    def _write(self, path: Path, data) -> None:
        tmp_dir = fs.ensure_dir(self.root / ".tmp")
        tmp = tmp_dir / f"{secrets.token_hex(8)}.tmp"
        fd = fs.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            view, done = memoryview(data).cast("B"), 0
            while done < len(view):
                done += os.write(fd, view[done:done + (1 << 30)])
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        for parent in reversed(path.relative_to(self.root).parents[:-1]):
            fs.ensure_dir(self.root / parent)
        os.rename(tmp, path)
        fs.fsync_dir(path.parent)

    def list(self, prefix: str) -> list:
        out = []
        base = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        if not base.is_dir() or base.is_symlink():
            return out
        for folder, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                key = os.path.relpath(os.path.join(folder, name), self.root).replace(os.sep, "/")
                if key.startswith(prefix) and not name.startswith(".") and _KEY.fullmatch(key):
                    out.append((key, os.lstat(os.path.join(folder, name)).st_size))
        return sorted(out)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def list_times(self, prefix: str) -> list:
        out = []
        for key, size in self.list(prefix):
            try:
                out.append((key, size, os.lstat(self._path(key)).st_mtime))
            except FileNotFoundError:
                pass
        return out


def parse_url(url: str) -> tuple:
    """("s3", bucket, prefix) or ("folder", absolute path, ""); BadInput for other URLs."""
    if not isinstance(url, str) or not url:
        raise BadInput("a remote URL is empty")
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        bucket, prefix = parsed.netloc, parsed.path.strip("/")
        if len(bucket) < 3 or not re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z0-9]", bucket):
            raise BadInput(f"{url!r}: an S3 bucket name has 3-63 lowercase letters, digits, '.' or '-'")
        if prefix:
            check_key(prefix)
        return "s3", bucket, prefix
    if parsed.scheme == "file":
        return "folder", os.path.abspath(parsed.path), ""
    if parsed.scheme == "" or re.fullmatch(r"[A-Za-z]", parsed.scheme or ""):
        return "folder", os.path.abspath(url), ""
    raise BadInput(f"remote URL {url!r} is not supported: use s3://BUCKET/PREFIX, file:///PATH or a path")


def open_bucket(url: str, endpoint_url: Optional[str] = None, create: bool = False) -> Bucket:
    """The bucket a remote URL names (``create``: make a folder remote's folder)."""
    kind, where, prefix = parse_url(url)
    if kind == "folder":
        return FolderBucket(where, create=create)
    from .s3 import S3Bucket  # boto3 is imported only for S3 remotes
    return S3Bucket(where, prefix, endpoint_url)
