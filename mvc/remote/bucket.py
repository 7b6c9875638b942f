"""Buckets: the few calls a remote needs from an object store, whatever backs it.

Vocabulary:

- **bucket**: a flat namespace of keys (``packs/1a2b….pack``) naming objects
  of bytes. ``Bucket`` (``mvc.remote.backend``) is the interface, which
  ``S3Bucket`` (``mvc.remote.s3``) speaks as S3 and ``FolderBucket`` (here) as
  files in a folder on this machine; ``open_bucket`` picks one by URL.
- **etag**: an opaque tag of one version of an object. A conditional put
  names the etag it expects to replace (``if_match``, S3's ``If-Match``) or
  that no object may exist yet (``if_absent``, ``If-None-Match: *``); when
  the condition fails nothing is written and ``PreconditionFailed`` is
  raised. Refs move only this way, so two writers never lose an update.

Every call either completes or raises an ``MvcError``: ``NotFound`` for an
absent key, ``PreconditionFailed`` for a lost conditional write,
``RemoteCorrupt`` (naming the key) for a ranged read past an object's end
(a pack cut short or emptied),
``RemoteError`` (one line saying what to do) for anything else. Transient
failures are retried inside the implementation before that.
"""

import fcntl
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import urlparse

from .. import hashing
from ..errors import (BadInput, NotFound, PreconditionFailed, RemoteCorrupt, RemoteError,  # noqa: F401
                      RemoteUnreachable, UntrustedAnswer)  # re-exported: the errors of every bucket
from ..store import fs
from .backend import _KEY, Bucket, check_key, notify, on_notice  # noqa: F401  (re-exported: the interface)

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
            raise NotFound(f"{key} is missing from remote {self.url}", key=key) from None
        try:
            size = os.fstat(fd).st_size
            if start < 0:
                start = max(0, size + start)
            stop = size if stop is None else stop
            data = os.pread(fd, max(0, stop - start), start) if stop > start else b""
            if len(data) != max(0, stop - start):
                raise RemoteCorrupt(f"{key} on remote {self.url} is shorter than expected ({size} bytes, bytes "
                                    f"{start}-{stop - 1} asked for): it was cut short or emptied", key=key)
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
                raise PreconditionFailed(f"{key} on remote {self.url} changed meanwhile", key=key)
            self._write(path, data)
        return hashing.digest(data).hex()

    def _write(self, path: Path, data) -> None:
        for parent in reversed(path.relative_to(self.root).parents[:-1]):
            fs.ensure_dir(self.root / parent)
        fs.atomic_write(path, data, tmp_dir=fs.ensure_dir(self.root / ".tmp"))

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
