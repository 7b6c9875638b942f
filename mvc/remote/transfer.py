"""Moving chunk bytes to and from a remote: ranged reads of packs, verified; packs built and uploaded.

Reads: the wanted chunks are grouped by remote pack and cut into spans of
records that lie close together (gaps under ``GAP`` bytes are read and
thrown away, spans stop near ``SPAN_BYTES``), read with one ranged GET each,
several at once. Every chunk is BLAKE3-hashed against its id the moment
it arrives; only then is it handed on. Writes: chunks go into packs of
about ``layout.PACK_BYTES``, read straight into the upload buffer through
the chunk store (which verifies them), and several packs upload at once.
"""

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from ..errors import RemoteCorrupt
from ..store.chunks import Request
from ..store.packformat import RECORD_HEAD
from ..store.verify import intact, mismatch, verified
from . import layout
from .bucket import NotFound, RemoteError, RemoteUnreachable

GAP = 256 << 10
SPAN_BYTES = 16 << 20
THREADS = 8
UPLOADS = 3  # packs in flight at once: bounded memory (3 x PACK_BYTES), the link kept busy
CUT_FILL = 8  # a pack ends where a new source begins once it is 1/8 full (see pack_groups)


def spans(locations: dict) -> list:
    """[(pack name, start, stop, [(id, Location)])]: the ranged reads that fetch ``locations``."""
    return _runs(((loc.pack, loc.offset, loc.length, (cid, loc)) for cid, loc in locations.items()), GAP)


def _runs(entries, gap: int) -> list:
    """[(group, start, stop, [payload])]: ranged reads of records (group, offset, length, payload),
    per group (a pack) in offset order; records less than ``gap`` bytes apart share a read of at
    most SPAN_BYTES."""
    by_group = defaultdict(list)
    for group, offset, length, payload in entries:
        by_group[group].append((offset, length, payload))
    out = []
    for group, items in by_group.items():
        items.sort(key=lambda item: item[0])
        current = None
        for offset, length, payload in items:
            if current and offset - current[2] <= gap and offset + length - current[1] <= SPAN_BYTES:
                current[2] = max(current[2], offset + length)
                current[3].append(payload)
            else:
                current = [group, offset, offset + length, [payload]]
                out.append(current)
    return [tuple(s) for s in out]


def _in_threads(one: Callable, work: list, threads: int) -> list:
    """``one(item)`` for every item of ``work``, in up to ``threads`` threads; what they return."""
    if len(work) <= 1 or threads <= 1:
        return [one(item) for item in work]
    with ThreadPoolExecutor(min(threads, len(work))) as pool:
        return list(pool.map(one, work))


def fetch_chunks(bucket, locations: dict, deliver: Callable, what: Callable = lambda cid: "",
                 progress: Optional[Callable[[int], None]] = None, threads: int = THREADS) -> int:
    """Read every chunk {id: remote Location}, verify it, and call ``deliver(id, bytes)``.

    ``what(id)`` names what a chunk is for in errors (a tensor's key path and
    commit). ``deliver`` may run in several threads at once. Returns the bytes read
    from the remote (chunk data plus the gaps read along). Raises
    ChecksumMismatch naming the remote pack when bytes do not hash to their
    id (nothing of that chunk is delivered), NotFound / RemoteError.
    """
    def one(span):
        name, start, stop, items = span
        key = layout.pack_key(layout.CHUNK_PACKS, name)
        data = memoryview(bucket.get_range(key, start, stop))
        for cid, loc in items:
            piece = data[loc.offset - start:loc.offset - start + loc.length]
            deliver(cid, verified(cid, piece, what(cid), f"remote pack {key}", key=key))
        if progress:
            progress(sum(loc.length for _, loc in items))
        return stop - start
    return _each_span(locations, one, threads)


def fetch_into(bucket, locations: dict, buffers: dict, done: Callable, what: Callable = lambda cid: "",
               progress: Optional[Callable[[int], None]] = None, threads: int = THREADS) -> int:
    """Read every chunk {id: remote Location} straight into ``buffers[id]`` (a writable buffer of
    its length), verify it there, and call ``done(id)``; returns the bytes read from the remote.

    ``fetch_chunks`` without its buffer per ranged read and its copy of every
    byte: the record headers and gaps of a span go to a scratch buffer, each
    record into its chunk's buffer. A chunk whose bytes do not hash to its id
    is zeroed again (no unverified bytes are left in a caller's buffer) and
    raises ChecksumMismatch naming the remote pack; NotFound / RemoteError.
    """
    def one(span):
        name, start, stop, items = span
        key = layout.pack_key(layout.CHUNK_PACKS, name)
        sinks, pos, scratch = [], start, None
        for cid, loc in items:  # in offset order
            if loc.offset > pos:
                if scratch is None or len(scratch) < loc.offset - pos:
                    scratch = memoryview(bytearray(max(loc.offset - pos, RECORD_HEAD.size)))
                sinks.append(scratch[:loc.offset - pos])
            sinks.append(memoryview(buffers[cid]).cast("B"))
            pos = loc.offset + loc.length
        bucket.get_range_into(key, start, stop, sinks)
        for cid, loc in items:
            view = memoryview(buffers[cid]).cast("B")
            if not intact(cid, view):
                view[:] = bytes(len(view))
                raise mismatch(cid, what(cid), f"remote pack {key}", key=key)
            done(cid)
        if progress:
            progress(sum(loc.length for _, loc in items))
        return stop - start
    return _each_span(locations, one, threads)


def _each_span(locations: dict, one: Callable, threads: int) -> int:
    """``one(span)`` for every ranged read of ``spans(locations)``, in threads; the sum of what they return."""
    return sum(_in_threads(one, spans(locations), threads))


def verify_chunks(bucket, locations: dict, threads: int = THREADS) -> dict:
    """Read back every chunk {id: remote Location} and re-hash it; {id: (pack key, why)} of those whose
    remote copy is not intact (the pack is gone or short, or the bytes do not hash to the id).

    Eviction and ``fsck --fetch`` use it: a catalogue entry only says a
    trailer listed the record; only the bytes say the copy is good.
    """
    bad, guard = {}, threading.Lock()

    def one(span):
        name, start, stop, items = span
        key = layout.pack_key(layout.CHUNK_PACKS, name)
        try:
            data = memoryview(bucket.get_range(key, start, stop))
        except NotFound:
            why = {cid: (key, "the remote pack is gone") for cid, _ in items}
        except (RemoteError, RemoteCorrupt) as exc:  # RemoteCorrupt: the pack is cut short or empty
            if isinstance(exc, RemoteUnreachable):
                raise  # a server that does not answer says nothing about its bytes
            why = {cid: (key, f"the remote pack cannot be read: {exc}") for cid, _ in items}
        else:
            mismatch = "its bytes on the remote do not hash to its id (BLAKE3 mismatch)"
            why = {cid: (key, mismatch) for cid, loc in items
                   if not intact(cid, data[loc.offset - start:loc.offset - start + loc.length])}
        with guard:
            bad.update(why)
    _in_threads(one, spans(locations), threads)
    return bad


def pack_groups(items: list, limit: Optional[int] = None, cuts: frozenset = frozenset(),
                hard: Optional[int] = None) -> list:
    """(id, length) items cut into lists of about ``limit`` (``layout.PACK_BYTES``) bytes each, one pack per list.

    ``cuts``: indices of items where a new source begins (a local pack: one rank's shards, one
    commit's new chunks); a pack at least ``1/CUT_FILL`` full ends there, so a reader of one rank's
    shards finds them in that rank's packs, not in packs it shares with its neighbours. ``hard``:
    an index where a pack ends however full it is."""
    limit = limit or layout.PACK_BYTES
    out, current, size = [], [], 0
    for i, item in enumerate(items):
        if current and (size + item[1] > limit or (i in cuts and size * CUT_FILL >= limit) or i == hard):
            out.append(current)
            current, size = [], 0
        current.append(item)
        size += item[1]
    if current:
        out.append(current)
    return out


class Uploader:
    """Uploads pack images, ``UPLOADS`` at a time, recording each in the catalogue once it is durable.

    The memory of an image that went up is handed to the next one
    (``reserve``): a new 32 MiB buffer is fresh pages the kernel must zero
    and map one by one, which measured 0.44 s of the main thread's time per
    256 MiB pushed here (about 45 ms a pack, a tenth of the whole push),
    while a reused one costs nothing.
    """

    def __init__(self, bucket, catalogue, progress: Optional[Callable[[int], None]] = None):
        self.bucket, self.catalogue, self.progress = bucket, catalogue, progress
        self.pool = ThreadPoolExecutor(UPLOADS)
        self.slots = threading.Semaphore(UPLOADS + 1)  # images built ahead of the uploads: bounded memory
        self.free: list = []  # buffers of images sent, for the next ones
        self.guard = threading.Lock()
        self.pending = []
        self.packs = self.bytes = 0

    def submit(self, folder: str, image: layout.PackImage, hint: Optional[bytes] = None) -> None:
        """Upload ``image`` as a new pack under ``folder``; ``hint``: an object pack's where hint,
        put at its key before the pack (so a pack listed has its hint there already)."""
        key = layout.pack_key(folder, layout.new_name())
        self.pending.append(self.pool.submit(self._send, key, image, hint))
        self._reap(block=False)

    def reserve(self, size: int) -> bytearray:
        """Wait for room for one more image in memory; a buffer of at least ``size`` bytes,
        one a sent image left where one fits."""
        self.slots.acquire()
        with self.guard:
            fits = [b for b in self.free if len(b) >= size]
            if fits:
                self.free.remove(fits[0])
                return fits[0]
            if self.free:
                self.free.pop(0)  # too small for this image: let it go rather than hold it
        # a full pack's: room for one a little fuller than this one (groups differ by up to a chunk)
        return bytearray(max(size, layout.PACK_BYTES + (layout.PACK_BYTES >> 6)) if size > layout.PACK_BYTES // 2
                         else size)

    def _send(self, key: str, image: layout.PackImage, hint: Optional[bytes] = None) -> int:
        try:
            if hint is not None:
                self.bucket.put(layout.where_key(key), hint)
            etag = self.bucket.put(key, image.data)
            entries = [(cid, off, n) for (cid, n), off in zip(image.items, image.offsets)]
            self.catalogue.add_pack(key, entries, sent=(len(image.data), etag))
            if self.progress:
                self.progress(len(image.data))
            return len(image.data)
        finally:
            with self.guard:
                self.free.append(image.buffer)
            self.slots.release()

    def _reap(self, block: bool) -> None:
        keep = []
        for future in self.pending:
            if block or future.done():
                self.bytes += future.result()
                self.packs += 1
            else:
                keep.append(future)
        self.pending = keep

    def finish(self) -> None:
        """Wait for every upload; re-raises the first failure."""
        try:
            self._reap(block=True)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


def expect(progress, nbytes: int) -> None:
    """Tell a ``progress(nbytes)`` callback that has an ``expect`` method (the CLI's, for an ETA)
    how many more bytes the transfer will move; a plain callable is left alone."""
    announce = getattr(progress, "expect", None)
    if announce is not None and nbytes:
        announce(nbytes)


def upload_chunks(repo, bucket, catalogue, chunks: list, progress=None, cuts: frozenset = frozenset(),
                  hard: Optional[int] = None) -> tuple:
    """Pack and upload (id, length) chunks read through ``repo.chunks``; (packs, bytes) sent.
    ``cuts``, ``hard``: as ``pack_groups``'s.

    The caller holds ``repo.gc_lock.shared()``.
    """
    expect(progress, sum(length for _, length in chunks))
    uploader = Uploader(bucket, catalogue, progress)
    try:
        for group in pack_groups(chunks, cuts=cuts, hard=hard):
            # Every chunk is read back through the chunk store, verified against
            # its id, before it goes into an image, although the local store
            # checked it when it was written: a pack's own checksum (its
            # footer's BLAKE3) covers only its trailer, so a record's bytes
            # are proven by nothing but their id, and bytes that rotted on
            # this disk would become the remote's copy, the one a user falls
            # back on. One BLAKE3 pass (0.5-0.7 s of CPU per GiB here, on
            # bytes the read just brought into the CPU cache) is the cheapest
            # proof; pack files cannot go up whole anyway, as a remote pack
            # holds only what the remote lacks.
            image = layout.PackImage(group, uploader.reserve(layout.PackImage.size(group)))
            with repo.index.read() as txn:
                repo.chunks.read([Request(cid, image.slot(i), "a chunk to push") for i, (cid, _) in enumerate(group)],
                                 txn)
            uploader.submit(layout.CHUNK_PACKS, image)
    finally:
        uploader.finish()
    return uploader.packs, uploader.bytes


def upload_objects(bucket, catalogue, records: list, hints: Optional[Callable] = None) -> tuple:
    """Upload (id, bytes) object records as object packs; (packs, bytes) sent. ``hints(ids)``: the
    where hint of a pack of the records ``ids`` (None: none), put just before that pack."""
    return upload_records(bucket, catalogue, layout.OBJECT_PACKS, records, hints)


def upload_records(bucket, catalogue, folder: str, records: list, hints: Optional[Callable] = None) -> tuple:
    """Upload (id, bytes) records, each already verified, as packs under ``folder``; (packs, bytes)
    sent. ``hints``: as ``upload_objects``'s."""
    uploader, data = Uploader(bucket, catalogue), dict(records)
    try:
        for group in pack_groups([(oid, len(raw)) for oid, raw in records]):
            image = layout.PackImage(group, uploader.reserve(layout.PackImage.size(group)))
            for i, (oid, _) in enumerate(group):
                image.slot(i)[:] = data[oid]
            uploader.submit(folder, image, hints([oid for oid, _ in group]) if hints is not None else None)
    finally:
        uploader.finish()
    return uploader.packs, uploader.bytes


def read_pack_records(bucket, key: str, entries: list) -> dict:
    """{id: bytes} of every record of remote pack ``key`` (read whole), each verified against its id."""
    data = memoryview(bucket.get(key))
    out = {}
    for oid, offset, length in entries:
        piece = data[offset:offset + length]
        if len(piece) != length:
            raise RemoteCorrupt(f"remote pack {key} is shorter than its trailer says; nothing was stored", key=key,
                                id=oid)
        out[oid] = bytes(verified(oid, piece, where=f"remote pack {key}", noun="object", key=key))
    return out



# object records at most this long are read without knowing their kind (a pack's trailer does not
# say it): pruned notes, most commits and trees, and tensor objects of at most about 110 chunks
SMALL_RECORD = 4 << 10


def record_reads(located: dict, gap: int = 4 << 10) -> int:
    """How many ranged GETs ``read_records`` makes for ``located``."""
    return len(_runs(((key, offset, length, None) for key, offset, length in located.values()), gap))


def read_records(bucket, located: dict, gap: int = 4 << 10, threads: int = THREADS,
                 failed: Optional[dict] = None) -> dict:
    """{id: bytes} of object records {id: (object pack key, data offset, length)}, read with ranged
    GETs (records of one pack less than ``gap`` bytes apart share one), each verified against its
    id. Raises RemoteCorrupt (bytes that do not hash to their id, a pack cut short), NotFound.
    With ``failed`` (a dict), such a record is put there ({id: the error}) instead, and every
    other record is still read and verified (a span that does not read fails each of its records)."""
    work = _runs(((key, offset, length, (offset, length, oid)) for oid, (key, offset, length) in located.items()), gap)
    out, guard = {}, threading.Lock()

    def record(key, data, start, offset, length, oid):
        piece = data[offset - start:offset - start + length]
        if len(piece) != length:
            raise RemoteCorrupt(f"remote pack {key} is shorter than its trailer says; nothing was stored",
                                key=key, id=oid)
        return bytes(verified(oid, piece, where=f"remote pack {key}", noun="object", key=key))

    def one(span):
        key, start, stop, items = span
        got, bad = {}, {}
        try:
            data = memoryview(bucket.get_range(key, start, stop))
        except NotFound as exc:
            if failed is None:
                raise
            bad = {oid: exc for _, _, oid in items}
        else:
            for offset, length, oid in items:
                try:
                    got[oid] = record(key, data, start, offset, length, oid)
                except RemoteCorrupt as exc:
                    if failed is None:
                        raise
                    bad[oid] = exc
        with guard:
            out.update(got)
            if bad:
                failed.update(bad)
    _in_threads(one, work, threads)
    return out
