"""A chunk store that misbehaves at one chosen call, as restic's test backends do.

``Faulty(inner, ...)`` is a ``mvc.store.chunks.Forwarding`` decorator: every
call goes to ``inner`` except at the call chosen to misbehave:

- ``fail_read=N``: the Nth read (``read`` or ``read_stored``) raises
  ``OSError(EIO)``, as a dying disk or a dropped connection does;
- ``fail_write=N``: the Nth write (``add``/``add_record``/``seal`` of any
  batch) raises ``OSError(ENOSPC)``, as a full disk does;
- ``flip_read=N``: during the Nth read, one bit of the first requested
  record is really flipped where it is stored (``where(id, txn)`` gives the
  file and offset: a local pack, or the remote folder's pack) and put back
  after the read: the store's verification must catch it. That is bytes
  that came back wrong once (a bad cable, a flaky controller), not damage
  that stays.

``calls`` counts reads and writes, so a test can see a fault was reached.
"""

import errno
import os

from mvc.store.chunks import THREADS, ChunkWriter, Forwarding


class Faulty(Forwarding):
    def __init__(self, inner, fail_read=None, fail_write=None, flip_read=None, where=None):
        super().__init__(inner)
        self.fail_read, self.fail_write, self.flip_read, self.where = fail_read, fail_write, flip_read, where
        self.calls = {"read": 0, "write": 0}
        self.fired = False

    def _read(self, first_id, txn, call):
        self.calls["read"] += 1
        n = self.calls["read"]
        if n == self.fail_read:
            self.fired = True
            raise OSError(errno.EIO, "injected read error")
        if n == self.flip_read and first_id is not None:
            place = self.where(first_id, txn)
            if place is not None:
                self.fired = True
                with _flipped(*place):
                    return call()
        return call()

    def read(self, requests, txn, progress=None, threads=THREADS):
        first = requests[0].id if requests else None
        return self._read(first, txn, lambda: self.inner.read(requests, txn, progress, threads))

    def read_stored(self, cid, txn, what=""):
        return self._read(cid, txn, lambda: self.inner.read_stored(cid, txn, what))

    def writer(self):
        return _FaultyWriter(self.inner.writer(), self)

    def write_call(self):
        self.calls["write"] += 1
        if self.calls["write"] == self.fail_write:
            self.fired = True
            raise OSError(errno.ENOSPC, "injected: no space left on device")


class _FaultyWriter(ChunkWriter):
    def __init__(self, inner, store: Faulty):
        self.inner, self.store = inner, store

    def add(self, cid, data):
        self.store.write_call()
        return self.inner.add(cid, data)

    def add_record(self, cid, payload, kind=0, size=-1, depth=0, base=None):
        self.store.write_call()
        return self.inner.add_record(cid, payload, kind, size, depth, base)

    def seal(self):
        self.store.write_call()
        self.inner.seal()

    def publish(self, txn):
        self.inner.publish(txn)

    def abort(self):
        self.inner.abort()

    @property
    def count(self):
        return self.inner.count

    @property
    def locations(self):
        return self.inner.locations


class _flipped:
    """One bit at ``offset`` of ``path`` flipped for the length of a with block."""

    def __init__(self, path, offset):
        self.path, self.offset = path, offset

    def _flip(self):
        fd = os.open(self.path, os.O_RDWR)
        try:
            byte = os.pread(fd, 1, self.offset)
            os.pwrite(fd, bytes([byte[0] ^ 0x10]), self.offset)
        finally:
            os.close(fd)

    def __enter__(self):
        self._flip()

    def __exit__(self, *exc):
        self._flip()
