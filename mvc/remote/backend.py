"""The bucket interface: the few calls a remote needs from an object store.

The vocabulary (bucket, key, etag, conditional put) is ``mvc.remote.bucket``'s.
This module is the bottom of ``mvc.remote``: the implementations
(``FolderBucket`` in ``bucket``, ``S3Bucket`` in ``s3``) import it, and it
imports neither, so no import cycle runs between them.
"""

import re
import secrets
from abc import ABC, abstractmethod
from typing import Optional

from ..errors import BadInput, PreconditionFailed, UntrustedAnswer

_KEY = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_LISTENERS: list = []


def on_notice(listener) -> None:
    """Call ``listener(message)`` for each notice a remote gives while it works ("waiting for
    server ..., retry 2/5"); the CLI prints them."""
    _LISTENERS.append(listener)


def notify(message: str) -> None:
    for listener in list(_LISTENERS):
        listener(message)


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key) or any(part in (".", "..") for part in key.split("/")):
        raise BadInput(f"{key!r} is not a valid remote key")
    return key


class Bucket(ABC):
    """The interface (see the module). Keys are relative to the remote's prefix. Every
    implementation passes one contract suite (``tests/test_remote_bucket.py``)."""

    url = ""
    away = False  # whether the server stopped answering for longer than the command's deadline

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; NotFound."""
        raise NotImplementedError

    @abstractmethod
    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the object; NotFound; RemoteCorrupt (naming the key) if it is shorter."""
        raise NotImplementedError

    def get_range_into(self, key: str, start: int, stop: int, sinks: list) -> None:
        """Bytes [start, stop) of the object written into ``sinks`` (writable byte views, in order,
        their lengths summing to ``stop - start``); raises as ``get_range``. A store that can
        receive straight into them (S3) saves a buffer and a copy of every byte."""
        scatter(self.get_range(key, start, stop), sinks)

    @abstractmethod
    def get_tail(self, key: str, n: int) -> tuple:
        """(the last ``n`` bytes (fewer if the object is smaller), the object's size); NotFound."""
        raise NotImplementedError

    @abstractmethod
    def get_versioned(self, key: str) -> Optional[tuple]:
        """(bytes, etag) of the object, or None if absent."""
        raise NotImplementedError

    @abstractmethod
    def put(self, key: str, data, if_match: Optional[str] = None, if_absent: bool = False) -> str:
        """Write the whole object (durable when this returns); its new etag.

        ``if_match`` / ``if_absent``: the conditions above (PreconditionFailed).
        """
        raise NotImplementedError

    @abstractmethod
    def list(self, prefix: str) -> list:
        """[(key, size)] of every object whose key starts with ``prefix``, sorted by key."""
        raise NotImplementedError

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object (a no-op if absent)."""
        raise NotImplementedError

    @abstractmethod
    def list_times(self, prefix: str) -> list:
        """[(key, size, when it was last written, seconds since the epoch by the store's clock)]."""
        raise NotImplementedError

    def list_stamps(self, prefix: str) -> list:
        """[(key, size, stamp)] as ``list``, where ``stamp`` (msgpack-able) changes whenever the
        object is written again: a cache of what an object held notices it changed. Here the
        last-modified time; a store with etags in its listings adds them."""
        return [(key, size, when) for key, size, when in self.list_times(prefix)]

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
                raise UntrustedAnswer(f"{self.url} does not honour conditional writes (If-None-Match / If-Match); "
                                      "mvc cannot move refs there without risking lost updates: use a store "
                                      "that does (AWS S3, SeaweedFS 4.48 or later, MinIO)", url=self.url, key=key)
            self.put(key, b"3", if_match=etag)
        finally:
            self.delete(key)

    def close(self) -> None:
        pass


def scatter(data, sinks: list) -> None:
    """Copy ``data`` into ``sinks`` (writable byte views, in order, their lengths summing to its length)."""
    view, pos = memoryview(data), 0
    for sink in sinks:
        sink[:] = view[pos:pos + len(sink)]
        pos += len(sink)
