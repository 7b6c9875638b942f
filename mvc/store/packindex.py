"""Pack indexes: immutable sorted files that say which pack holds a chunk, searched in numpy.

The chunk index of a repository with the ``pack-indexes`` extension (``docs/format.md`` 5.9):
a commit writes its pack's index (``pack-<name>.pidx``) and registers the pack in its index
transaction (``index.Txn.register_pack``); ``Registered`` is the set a transaction sees, kept
per process as a few tiers (``Tier``) so a lookup searches a handful of arrays.

Vocabulary:

- **prefix**: the first ``PREFIX`` (16) bytes of a chunk id. An index keeps prefixes, not
  whole ids: a prefix that matches is only a candidate, proven by the whole id its pack's
  trailer lists for that record (``Candidates.verify``). A damaged or colliding index can
  therefore make a chunk look absent, never make another chunk's record look like it.
- **row**: a record's place in its pack's trailer (0-based); the trailer gives its offset,
  stored length and coding, so the index repeats none of them.
- **pack index**: the entries of one or more packs, sorted by (prefix, pack number, row).
  One written per pack as it is sealed costs what its new chunks cost; a **multi-pack
  index** merges many (as Git's midx does) so that a lookup searches one array.
- **fan-out**: entry counts by the first id byte (cumulative, 256 of them): where each
  1/256 slice of the uniform id space starts, so merges and scans work a slice at a time
  in bounded memory.

File layout (little-endian; ``docs/format.md`` 5.9)::

    header   b"MVCPIDX1" | pack count u32 | entry count u64 | prefix width u8 (16) | 3 zero bytes
    names    pack count x 16-byte pack names (pack number = place in this list)
    fan-out  256 x u64: entries whose id's first byte is <= b
    heads    entry count x u64: id bytes 0-7 read big-endian (so numbers sort as the bytes do)
    tails    entry count x u64: id bytes 8-15, likewise
    packs    entry count x u32 pack number
    rows     entry count x u32 row
    (entries ascending by head, tail, pack number, row)
    footer   BLAKE3 of the BLAKE3 digests of every byte before it in 1 MiB blocks (32)

An entry costs 24 bytes, whatever the number of packs.

The view (``registered``): every tier is a file, memory-mapped, so a process holds the pages
the kernel keeps mapped (and may drop), not an array per entry in its own memory; a mapping
holds no file descriptor (``map_readonly``), so thousands of packs can be mapped at once. Past
MAX_TIERS tiers, runs of the newest are merged (``_fewer``, a geometric policy) into a
multi-pack index ``multi-<id>.midx``, ``<id>`` naming the exact ordered list of packs it
covers (``midx_path``). A commit's view is built from the one before (``added``): it shares
that view's tiers and its list of packs (``_Order``, appended to), so it costs the new pack and
the tiers, not every registered pack. The multi-pack indexes:

- **derived data**: a cache of the packs' own ``.pidx`` files, written by whichever process
  first needs it (a reader too) under a name of its own, fsynced and renamed into place
  (two writers of one write the same bytes); where it cannot be written (a read-only folder,
  a full disk) the merge is held in memory as before, never failing a read. A new process
  finds the ones on disk whose list is a run of its registered packs (``_on_disk``).
- **trust**: lookups prove every hit against the trailer, so a damaged file only makes a
  chunk look absent; but a walk (``Registered.entries``: fsck, gc) takes an absent entry for
  a chunk not located, so before the first walk each multi-pack index is checked once per
  process (checksum, order, fan-out, in bounded memory: ``Registered.trust``); one that fails
  is deleted and rebuilt from the packs' own indexes.
- **garbage**: a writer deletes the multi-pack indexes its merge replaced (a process that
  maps one keeps its pages); ``collect`` (after packs are deleted) deletes those that name a
  pack whose file is gone, and temporary files of killed writers.
"""

import ctypes
import mmap
import operator
import os
import re
import struct
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from .. import hashing
from ..errors import CorruptObject
from . import idarray
from .fs import open_file
from .packs import forget_trailer_views, pack_filename

MAGIC = b"MVCPIDX1"
HEAD = struct.Struct("<8sIQB3s")
PREFIX = 16
NAME = 16
FANOUT = 256
DIGEST = 32
ENTRY_BYTES = PREFIX + 4 + 4
BLOCK = 1 << 20  # the checksum's block
COLUMNS = ("<u8", "<u8", "<u4", "<u4")  # heads, tails, packs, rows


def _damaged(path, why: str) -> CorruptObject:
    return CorruptObject(f"pack index {Path(path).name} is damaged: {why}; it is derived data, rebuild it "
                         "from the packs", kind="pack-index")


def halves(ids: np.ndarray) -> tuple:
    """(heads, tails) of an id array (``idarray``): its bytes 0-7 and 8-15 as u64 numbers read
    big-endian, so that numbers compare as the bytes do (numpy searches numbers far faster
    than 16-byte strings)."""
    raw = np.ascontiguousarray(ids).view(">u8").reshape(len(ids), idarray.WIDTH // 8)
    return raw[:, 0].astype("<u8"), raw[:, 1].astype("<u8")


def _first_bytes(heads: np.ndarray) -> np.ndarray:
    return (heads >> np.uint64(56)).astype(np.intp)


def fanout_of(heads: np.ndarray) -> np.ndarray:
    return np.cumsum(np.bincount(_first_bytes(heads), minlength=FANOUT)).astype("<u8")


def _sorted(heads: np.ndarray, tails: np.ndarray, packs: np.ndarray, rows: np.ndarray) -> tuple:
    """The entries in index order: by head alone where heads are unique (one sort of numbers),
    by all four columns where two share a head (the same chunk in two packs, or a 64-bit tie)."""
    order = np.argsort(heads, kind="stable")
    ordered = heads[order]
    if len(ordered) > 1 and (ordered[1:] == ordered[:-1]).any():
        order = np.lexsort((rows, packs, tails, heads))
    return heads[order], tails[order], packs[order], rows[order]


class _Checksum:
    """BLAKE3 of the BLAKE3 digests of the bytes in BLOCK-sized blocks: computed as a file is
    written, a block at a time, so a writer never holds the file (hashing owns BLAKE3)."""

    def __init__(self):
        self.pending, self.digests = bytearray(), []

    def update(self, data) -> None:
        self.pending += data
        while len(self.pending) >= BLOCK:
            self.digests.append(hashing.digest(bytes(self.pending[:BLOCK])))
            del self.pending[:BLOCK]

    def digest(self) -> bytes:
        return hashing.digest(b"".join(self.digests + [hashing.digest(bytes(self.pending))]))


def write_summed(path, pieces, tmp=None) -> None:
    """Write ``pieces`` (bytes-like, in order) to ``path``, then their checksum (``_Checksum``, 32
    bytes): under ``tmp`` (default ``path`` + ``.tmp``), fsynced and renamed into place; the
    temporary file is deleted if the write fails. A derived file's writer (a pack index, a
    remote catalogue's table) whose readers check it with ``summed``."""
    path = Path(path)
    tmp = Path(str(path) + ".tmp") if tmp is None else Path(tmp)
    check = _Checksum()
    try:
        with open(tmp, "wb") as f:
            for piece in pieces:
                f.write(piece)
                check.update(piece)
            f.write(check.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def summed(buf) -> bool:
    """Whether the file ``buf`` (its bytes, mapped) ends with the checksum ``write_summed`` gives
    the bytes before it (read a block at a time)."""
    check, view = _Checksum(), memoryview(buf).cast("B")
    for at in range(0, len(view) - DIGEST, BLOCK):
        check.update(view[at:min(at + BLOCK, len(view) - DIGEST)])
    return check.digest() == bytes(view[-DIGEST:])


def _write_parts(path: Path, names: list, count: int, fanout: np.ndarray, parts, tmp=None) -> None:
    """Write an index file whose entries are ``parts()``'s (heads, tails, packs, rows) slices, in
    order; each column is written in a pass of its own over them. ``tmp``: the temporary name
    (default ``path`` + ``.tmp``), deleted if the write fails."""
    def pieces():
        yield HEAD.pack(MAGIC, len(names), count, PREFIX, bytes(3))
        yield b"".join(names)
        yield fanout.astype("<u8").tobytes()
        for column, dtype in enumerate(COLUMNS):
            for part in parts():
                yield np.ascontiguousarray(part[column]).astype(dtype).tobytes()
    write_summed(path, pieces(), tmp)


def write(path, names: list, ids_by_pack: list) -> None:
    """Write the pack index of packs ``names`` (16-byte names), ``ids_by_pack[k]`` being the id
    array of pack k's trailer in row order. Holds the whole index in memory: for one pack (the
    one a commit seals); ``merge`` makes a multi-pack index in bounded memory."""
    if len(names) != len(ids_by_pack) or any(len(n) != NAME for n in names):
        raise ValueError("one 16-byte name per id array")
    ids = np.concatenate(ids_by_pack) if ids_by_pack else np.zeros(0, dtype=idarray.ID)
    heads, tails = halves(ids)
    packs = np.repeat(np.arange(len(ids_by_pack), dtype="<u4"), [len(x) for x in ids_by_pack])
    rows = np.concatenate([np.arange(len(x), dtype="<u4") for x in ids_by_pack]) if ids_by_pack else \
        np.zeros(0, dtype="<u4")
    columns = _sorted(heads, tails, packs, rows)
    _write_parts(Path(path), list(names), len(ids), fanout_of(columns[0]), lambda: iter([columns]))


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_FAILED = ctypes.c_void_p(-1).value


def map_readonly(fd: int, size: int):
    """The file ``fd`` read-only mapped, as a buffer that unmaps itself when its last view goes.
    Not ``mmap.mmap``: CPython's mapping keeps a descriptor open, and a view of many packs (or a
    merge of their indexes) would run out of them; the kernel's mapping needs none."""
    addr = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == _FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    buf = (ctypes.c_char * size).from_address(addr)
    # unmapped when the last view goes, never at interpreter exit: an exit hook that runs after
    # weakref's own (closing a repository, a push waited for) may still read through a view
    weakref.finalize(buf, _LIBC.munmap, addr, size).atexit = False
    return buf


class PackIndex:
    """One pack index file, memory-mapped (the mapping goes with the last array that views it;
    it holds no descriptor). CorruptObject if its layout is not one; its checksum is checked by
    ``verify`` only (a lookup proves each hit anyway)."""

    def __init__(self, path, in_memory: bool = False):
        self.path = Path(path)
        fd = open_file(self.path)
        try:
            size = os.fstat(fd).st_size
            if in_memory:  # read whole
                with os.fdopen(os.dup(fd), "rb") as f:
                    self._map = f.read()
                size = len(self._map)
            else:
                self._map = map_readonly(fd, size) if size else None
        finally:
            os.close(fd)
        if size < HEAD.size or self._map is None:
            raise _damaged(self.path, "it is shorter than its header")
        magic, npacks, count, width, _ = HEAD.unpack_from(self._map)
        if magic != MAGIC or width != PREFIX:
            raise _damaged(self.path, "it has no valid header")
        at = HEAD.size
        need = at + npacks * NAME + FANOUT * 8 + count * ENTRY_BYTES + DIGEST
        if size != need:
            raise _damaged(self.path, f"it is {size} bytes long where its header says {need}")
        buf = memoryview(self._map).cast("B")
        self.names = [bytes(buf[at + k * NAME:at + (k + 1) * NAME]) for k in range(npacks)]
        at += npacks * NAME
        self.fanout = np.frombuffer(buf, dtype="<u8", count=FANOUT, offset=at)
        at += FANOUT * 8
        self.heads = np.frombuffer(buf, dtype="<u8", count=count, offset=at)
        at += count * 8
        self.tails = np.frombuffer(buf, dtype="<u8", count=count, offset=at)
        at += count * 8
        self.packs = np.frombuffer(buf, dtype="<u4", count=count, offset=at)
        at += count * 4
        self.rows = np.frombuffer(buf, dtype="<u4", count=count, offset=at)
        if count and (int(self.fanout[-1]) != count or (np.diff(self.fanout.astype(np.int64)) < 0).any()):
            raise _damaged(self.path, "its fan-out table does not add up")

    def __len__(self) -> int:
        return len(self.heads)

    def verify(self, budget: int = 1 << 20) -> None:
        """CorruptObject unless the checksum matches and the entries are sorted, in range and
        counted by the fan-out table: read a run of first-byte slices of about ``budget`` entries
        at a time (bounded memory whatever the index's size)."""
        if not summed(self._map):
            raise _damaged(self.path, "its checksum does not match")
        starts = slice_starts(self.fanout)
        for b, e, s, t in slice_runs(self.fanout, budget):
            heads, tails = self.heads[s:t], self.tails[s:t]
            down = (heads[1:] < heads[:-1]) | ((heads[1:] == heads[:-1]) & (tails[1:] < tails[:-1]))
            if down.any() or (t > s and int(self.packs[s:t].max()) >= len(self.names)):
                raise _damaged(self.path, "its entries are out of order or name a pack it does not list")
            first = _first_bytes(heads)
            if len(first) and (int(first[0]) < b or int(first[-1]) >= e) or \
                    (np.bincount(first - b, minlength=e - b)[:e - b] != np.diff(starts[b:e + 1])).any():
                raise _damaged(self.path, "its fan-out table does not match its entries")

    def candidates(self, ids: np.ndarray, start: int = 0, stop: Optional[int] = None) -> "Candidates":
        """Every entry (among entries ``start:stop``) whose first 16 id bytes match one of
        ``ids`` (an id array, any order; searched in sorted order, which numpy's binary
        search turns into neighbouring probes)."""
        stop = len(self) if stop is None else stop
        heads, tails = halves(ids)
        order = np.argsort(heads, kind="stable")
        lo, hi = np.empty(len(ids), dtype=np.int64), np.empty(len(ids), dtype=np.int64)
        lo[order] = np.searchsorted(self.heads[start:stop], heads[order], "left") + start
        hi[order] = np.searchsorted(self.heads[start:stop], heads[order], "right") + start
        one = np.flatnonzero(hi - lo == 1)
        miss = one[self.tails[lo[one]] != tails[one]]
        hi[miss] = lo[miss]  # its head alone matched
        return Candidates(self, lo, hi)

    def slices(self, budget: int) -> Iterator[tuple]:
        """(first byte, last byte + 1, entry start, entry stop) of runs of the 256 first-byte
        slices holding ``budget`` entries at most (one slice above it alone): the id space in
        pieces a planner can hold in bounded memory."""
        return slice_runs(self.fanout, budget)

    def close(self) -> None:
        """Drop this object's arrays; the mapping goes with the last array that views it."""
        for name in ("heads", "tails", "packs", "rows", "fanout"):
            setattr(self, name, None)
        self._map = None


class Candidates:
    """The entries a lookup found: ``lo[i]:hi[i]`` in the index are the ones whose prefix matches
    needle i (empty: absent). Almost always one or none."""

    def __init__(self, index: PackIndex, lo: np.ndarray, hi: np.ndarray):
        self.index, self.lo, self.hi = index, lo, hi

    def verify(self, ids: np.ndarray, full_ids) -> tuple:
        """(pack number, row) per needle, -1 where none of its candidates is it: ``full_ids(pack
        number, rows)`` returns the id array its pack's trailer lists at ``rows`` (or what
        ``_proven`` takes for a pack that cannot say)."""
        n = len(ids)
        pack = np.full(n, -1, dtype=np.int64)
        row = np.full(n, -1, dtype=np.int64)
        one = np.flatnonzero(self.hi - self.lo == 1)
        at = self.lo[one]
        packs, rows = self.index.packs[at].astype(np.int64), self.index.rows[at].astype(np.int64)
        by_pack = np.argsort(packs, kind="stable")
        cuts = np.flatnonzero(np.diff(packs[by_pack])) + 1
        for sel in np.split(by_pack, cuts) if len(by_pack) else []:  # each pack's trailer asked once
            k = int(packs[sel[0]])
            ok = _proven(full_ids(k, rows[sel]), ids[one[sel]])
            pack[one[sel[ok]]], row[one[sel[ok]]] = k, rows[sel[ok]]
        for i in np.flatnonzero(self.hi - self.lo > 1).tolist():  # a shared prefix: each checked
            for j in range(int(self.lo[i]), int(self.hi[i])):
                k, r = int(self.index.packs[j]), int(self.index.rows[j])
                if _proven(full_ids(k, np.array([r])), ids[i:i + 1])[0]:
                    pack[i], row[i] = k, r
                    break
        return pack, row


def _proven(got, needles: np.ndarray) -> np.ndarray:
    """Which needles the trailer's ids ``got`` prove. ``got`` may be None (the pack's file is
    gone: every prefix match is taken) or (ids, unknown) where rows marked ``unknown`` cannot
    be read from the pack and are taken likewise, for a location that names the damaged pack."""
    if got is None:
        return np.ones(len(needles), dtype=bool)
    if isinstance(got, tuple):
        return (got[0] == needles) | got[1]
    return got == needles


def merge(path, inputs: list, budget: int = 1 << 22, tmp=None) -> None:
    """Write the multi-pack index of the pack indexes ``inputs`` (open PackIndex objects; a pack
    that several list is taken from the first). Memory: the entries of one step of about
    ``budget`` entries (whole 1/256 slices of the id space), not the whole index."""
    names, number, keep = [], {}, []
    for idx in inputs:
        keep.append(np.array([name not in number for name in idx.names], dtype=bool))
        for name in idx.names:
            number.setdefault(name, len(number))
            if len(names) < len(number):
                names.append(name)
    maps = [np.array([number[n] for n in idx.names], dtype="<u4") for idx in inputs]

    def picked(k: int, b: int, e: int) -> tuple:
        """Input k's entries whose first byte is in [b, e): (heads, tails, packs, rows), its own packs only."""
        idx, start = inputs[k], slice_starts(inputs[k].fanout)
        s, t = start[b], start[e]
        heads, tails, packs, rows = idx.heads[s:t], idx.tails[s:t], idx.packs[s:t], idx.rows[s:t]
        if not keep[k].all():
            sel = keep[k][packs]
            heads, tails, packs, rows = heads[sel], tails[sel], packs[sel], rows[sel]
        return heads, tails, maps[k][packs], rows

    counts = np.zeros(FANOUT, dtype=np.int64)
    for k, idx in enumerate(inputs):
        if keep[k].all():
            counts += np.diff(slice_starts(idx.fanout))
        else:
            for b in range(FANOUT):
                counts[b] += len(picked(k, b, b + 1)[0])
    fanout = np.cumsum(counts).astype("<u8")

    def parts():
        for b, e, _, _ in slice_runs(fanout, budget):
            got = [picked(k, b, e) for k in range(len(inputs))]
            yield _sorted(*(np.concatenate([g[c] for g in got]).astype(d) if got else np.zeros(0, dtype=d)
                            for c, d in enumerate(COLUMNS)))
    _write_parts(Path(path), names, int(fanout[-1]), fanout, parts, tmp)


def slice_starts(fanout: np.ndarray) -> np.ndarray:
    """Where each first-byte slice starts, and the end: 257 offsets."""
    return np.concatenate([[0], fanout.astype(np.int64)])


def slice_runs(fanout: np.ndarray, budget: int) -> Iterator[tuple]:
    """(first byte, last byte + 1, entry start, entry stop) of runs of first-byte slices holding
    ``budget`` entries at most (one slice above it alone)."""
    starts, b = slice_starts(fanout), 0
    while b < FANOUT:
        e = b + 1
        while e < FANOUT and starts[e + 1] - starts[b] <= budget:
            e += 1
        yield b, e, int(starts[b]), int(starts[e])
        b = e


def index_lookup(index: PackIndex, ids: np.ndarray, full_ids) -> tuple:
    """(pack number, row) per id of ``ids``, -1 where absent; ``full_ids(pack number, rows)``
    gives the id array that pack's trailer lists at ``rows``."""
    return index.candidates(ids).verify(ids, full_ids)


def lookup(index: PackIndex, ids: np.ndarray, trailers: dict) -> tuple:
    """``index_lookup`` proven against ``trailers`` ({pack name: its pack's TRAILER array,
    ``packs.read_trailer_table``})."""
    return index_lookup(index, ids, lambda k, rows: trailers[index.names[k]]["id"][rows])


def open_index(path) -> Optional[PackIndex]:
    """The PackIndex at ``path``, None if there is none."""
    try:
        return PackIndex(path)
    except FileNotFoundError:
        return None


class IdSpill:
    """Chunk ids set aside on disk by the first byte of their id, so that a walk of any size
    (the live set of fsck or gc) is held a slice of the id space at a time: ``add`` as the
    walk meets them, then ``slices`` reads each run of slices back, sorted and unique.
    Memory: one buffer of ``FLUSH`` ids, and one step's ids when read back."""

    FLUSH = 1 << 16

    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.counts = np.zeros(FANOUT, dtype=np.int64)
        self._pending, self._size = [], 0

    def add(self, ids: np.ndarray) -> None:
        self._pending.append(ids)
        self._size += len(ids)
        if self._size >= self.FLUSH:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        ids = np.concatenate(self._pending)
        self._pending, self._size = [], 0
        first = np.ascontiguousarray(ids).view(np.uint8).reshape(len(ids), idarray.WIDTH)[:, 0]
        order = np.argsort(first, kind="stable")
        starts = slice_starts(np.cumsum(np.bincount(first, minlength=FANOUT)))
        ids = ids[order]
        for b in np.flatnonzero(np.diff(starts)).tolist():
            with open(self.folder / f"{b:02x}", "ab") as f:
                f.write(ids[starts[b]:starts[b + 1]].tobytes())
        self.counts += np.diff(starts)

    def slices(self, budget: int) -> Iterator[tuple]:
        """(first byte, last byte + 1, sorted unique id array of the ids added there)."""
        self.flush()
        for b, e, _, _ in slice_runs(np.cumsum(self.counts), budget):
            parts = [np.fromfile(self.folder / f"{x:02x}", dtype=idarray.ID) for x in range(b, e) if self.counts[x]]
            yield b, e, _unique(np.concatenate(parts) if parts else np.zeros(0, dtype=idarray.ID))


def _unique(ids: np.ndarray) -> np.ndarray:
    """``np.unique`` of an id array, sorting numbers (the heads) instead of 32-byte strings: ids
    that share a head are the same id but in rare 64-bit ties, which take the string sort."""
    heads, _ = halves(ids)
    order = np.argsort(heads, kind="stable")
    ids, heads = ids[order], heads[order]
    same = heads[1:] == heads[:-1]
    if (ids[1:][same] != ids[:-1][same]).any():
        return np.unique(ids)
    return ids[np.concatenate([[True], ~same])] if len(ids) else ids


def classify(index: PackIndex, spill: IdSpill, full_ids, budget: int = 1 << 20) -> Iterator[tuple]:
    """Per run of first-byte slices, a walk's ids against the index: (ids, pack number and row
    of each, -1 where the index lacks it, and the index positions of the entries none of the
    ids uses: garbage). What gc's sweep and fsck's locate step need, a slice at a time."""
    starts = slice_starts(index.fanout)
    for b, e, ids in spill.slices(budget):
        s, t = int(starts[b]), int(starts[e])
        found = index.candidates(ids, s, t)
        lo, hi = found.lo, found.hi
        pack, row = found.verify(ids, full_ids)
        used = np.zeros(t - s, dtype=bool)
        hit = np.flatnonzero(pack >= 0)
        one = hit[(hi[hit] - lo[hit]) == 1]
        used[lo[one] - s] = True
        for i in hit[(hi[hit] - lo[hit]) > 1].tolist():  # a shared prefix: the entry that matched
            for j in range(int(lo[i]), int(hi[i])):
                if int(index.packs[j]) == pack[i] and int(index.rows[j]) == row[i]:
                    used[j - s] = True
        yield ids, pack, row, np.flatnonzero(~used) + s


# -- the registered pack indexes of a repository, as the chunk index reads them ------------------

MAX_TIERS = 8  # searched one after the other; more are merged into fewer
MERGE_BUDGET = 1 << 20  # entries a view's merge holds at a time (about 24 MiB of them)
MIDX_NAME = re.compile(r"multi-([0-9a-f]{32})\.midx")  # group 1: the id of the packs it covers
MIDX_TMP = re.compile(r"multi-[0-9a-f]{32}\.midx\.[0-9a-f-]+\.tmp")  # one being written (or left by a kill)
TMP_GRACE_S = 3600  # a temporary file untouched this long is no write in progress


def midx_path(folder, names: list) -> Path:
    """Where the multi-pack index of packs ``names`` (in this order) is kept: its file name is
    the BLAKE3 of the names, so it says which packs it covers before it is opened."""
    return Path(folder) / f"multi-{hashing.digest(b''.join(names))[:16].hex()}.midx"


class Tier:
    """Entries of one or more registered packs in index order, searched as one array: a pack index
    file (per-pack or multi-pack, memory-mapped: ``index``) or, where no multi-pack index could be
    written, several merged in memory (``index`` None). ``names``: its packs, newest first (a
    smaller pack number is a newer pack, so among entries of one prefix the newest comes first).
    ``trusted``: its entries may be walked (in memory, or a file whose checksum was checked)."""

    candidates = PackIndex.candidates
    slices = PackIndex.slices

    def __init__(self, names: list, heads, tails, packs, rows, fanout=None, index: Optional[PackIndex] = None):
        self.names, self.heads, self.tails, self.packs, self.rows = names, heads, tails, packs, rows
        self.fanout = fanout_of(heads) if fanout is None else fanout
        self.index = index
        self.trusted = not self.derived
        self.placed = None  # (order, each pack's place there) as a view last numbered them: ``_placed``

    def __len__(self) -> int:
        return len(self.heads)

    @classmethod
    def of(cls, idx: PackIndex) -> "Tier":
        return cls(list(idx.names), idx.heads, idx.tails, idx.packs, idx.rows, idx.fanout, idx)

    @property
    def derived(self) -> bool:
        """Whether it is a multi-pack index file (a cache that may be thrown away and rebuilt)."""
        return self.index is not None and MIDX_NAME.fullmatch(self.index.path.name) is not None


def merge_tiers(tiers: list) -> Tier:
    """One tier of ``tiers`` (newest first), in memory: pack numbers renumbered in that order."""
    names, parts, base = [], [], 0
    for tier in tiers:
        names += tier.names
        parts.append((tier.heads, tier.tails, tier.packs.astype("<u4") + np.uint32(base), tier.rows))
        base += len(tier.names)
    columns = [np.concatenate([p[c] for p in parts]).astype(d) for c, d in enumerate(COLUMNS)]
    return Tier(names, *_sorted(*columns))


def merged_tier(folder: Path, tiers: list) -> Tier:
    """One tier of ``tiers`` (newest first): their multi-pack index, written in bounded memory
    (``merge``) to a temporary name, fsynced and renamed into place, then mapped. Derived data
    written by whichever process first needs it: where it cannot be written (a read-only folder,
    a full disk) the merge is made in memory instead, never failing a read. The multi-pack
    indexes among ``tiers`` are deleted (a process that maps one keeps its pages)."""
    names = [name for tier in tiers for name in tier.names]
    path = midx_path(folder, names)
    tmp = path.with_name(f"{path.name}.{os.getpid():x}-{threading.get_ident():x}-{os.urandom(4).hex()}.tmp")
    try:
        merge(path, tiers, MERGE_BUDGET, tmp=tmp)
        idx = PackIndex(path)
    except (OSError, CorruptObject):
        return merge_tiers(tiers)
    tier = Tier.of(idx)
    tier.trusted = True  # this process wrote it from trusted tiers
    for old in tiers:
        if old.derived and old.index.path != path:
            _unlink(old.index.path)
    return tier


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:  # gone already, or a read-only folder: it is only a cache
        pass


class _Order:
    """The registered packs oldest first ((sequence, name) as two lists, and {name: place}),
    shared by the views built one from another so that a commit's view costs what its new pack
    does, not a list of every pack: only ever appended to, so a view that sees its first
    ``count`` sees the same packs however many a later view adds."""

    def __init__(self, packs=()):
        self.seqs = [seq for seq, _ in packs]
        self.names = [name for _, name in packs]
        self.place = {name: i for i, name in enumerate(self.names)}
        self._lock = threading.Lock()

    def extended(self, count: int, packs) -> "_Order":
        """An order of this one's first ``count`` packs and then ``packs`` ((sequence, name),
        oldest first): this one, appended to, where no view was built on its first ``count``
        yet; else a copy (a view built on one that another was built on already, as after a
        transaction that registered a pack and aborted)."""
        with self._lock:
            if len(self.names) == count:
                for seq, name in packs:
                    self.place[name] = len(self.names)
                    self.seqs.append(seq)
                    self.names.append(name)
                return self
        return _Order(list(zip(self.seqs[:count], self.names[:count])) + list(packs))


class _Names(Sequence):
    """A view's pack names, newest first (a pack's number is its place here), read through the
    order it shares with the views built from it: no list of every pack per view."""

    __slots__ = ("_order", "_count")

    def __init__(self, order: _Order, count: int):
        self._order, self._count = order, count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._count))]
        k = operator.index(k)
        if k < 0:
            k += self._count
        if not 0 <= k < self._count:
            raise IndexError("pack number out of range")
        return self._order.names[self._count - 1 - k]

    def __iter__(self):
        return reversed(self._order.names[:self._count])

    def __contains__(self, name) -> bool:
        place = self._order.place.get(name)
        return place is not None and place < self._count

    def index(self, name, start: int = 0, stop: Optional[int] = None) -> int:
        if name not in self:
            raise ValueError(f"{name!r} is not a registered pack")
        k = self._count - 1 - self._order.place[name]
        if k < start or (stop is not None and k >= stop):
            raise ValueError(f"{name!r} is not in that range")
        return k

    def __eq__(self, other) -> bool:
        if isinstance(other, (list, tuple, _Names)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"_Names({list(self)!r})"


def _placed(tier: "Tier", order: _Order) -> np.ndarray:
    """Where each of ``tier``'s packs is in ``order`` (a view that sees ``count`` packs numbers
    the tier's pack k ``count - 1 - places[k]``), kept with the tier: a pack's place never
    changes, while its number changes with every newer pack."""
    got = tier.placed
    if got is None or got[0] is not order:
        got = (order, np.array([order.place[n] for n in tier.names], dtype=np.int64))
        tier.placed = got
    return got[1]


class Registered:
    """The pack indexes a transaction's snapshot registers, newest pack first, as a few tiers.

    ``names``: the packs, newest first (a pack's number is its place here); ``packs``: their
    (sequence, name) pairs, likewise; ``broken``: {pack name: why} of registered packs whose
    index file cannot be read (their chunks look absent). Lookups (``locate``) prove every hit
    against its pack's trailer, so they search any tier; walks (``entries``, ``counts``: fsck,
    gc) first check the checksum of each multi-pack index (``trust``), since an entry missing
    there would look like a chunk that is not located.

    A view built from the one before (``added``) shares its list of packs (``_Order``) and its
    tiers, and numbers a tier's packs from their places in that list when asked: a commit's view
    costs its new pack and the tiers, not every registered pack."""

    def __init__(self, folder: Path, packs: tuple, tiers: list, broken: dict, stamp=None):
        self._setup(folder, _Order(packs[::-1]), len(packs), tiers, broken, stamp)

    @classmethod
    def _of(cls, folder: Path, order: _Order, count: int, tiers: list, broken: dict, stamp) -> "Registered":
        view = cls.__new__(cls)
        view._setup(folder, order, count, tiers, broken, stamp)
        return view

    def _setup(self, folder, order: _Order, count: int, tiers: list, broken: dict, stamp) -> None:
        self.folder, self.tiers, self.broken = folder, tiers, broken
        self.stamp = stamp  # the registry stamp it was built under (``unchanged``)
        self._order, self._count = order, count
        self.names = _Names(order, count)
        self._packs = None
        self._lock = threading.Lock()

    @property
    def packs(self) -> tuple:
        """(sequence, name) of the packs, newest first: made when first asked (a commit never asks)."""
        if self._packs is None:
            seqs, names = self._order.seqs[:self._count], self._order.names[:self._count]
            self._packs = tuple(zip(reversed(seqs), reversed(names)))
        return self._packs

    def newest(self) -> Optional[int]:
        """The sequence number of the newest pack (None: no packs)."""
        return self._order.seqs[self._count - 1] if self._count else None

    @property
    def numbers(self) -> list:
        """Per tier, the pack number of each of its packs (made when asked: O(packs))."""
        return [self._count - 1 - _placed(tier, self._order) for tier in self.tiers]

    def locate(self, ids: np.ndarray, full_ids) -> tuple:
        """(pack number, row) per id of ``ids`` (an id array), -1 where no registered pack lists it;
        the newest pack that does wins. ``full_ids(pack number, rows)``: the ids that pack's
        trailer lists at ``rows`` (proof of each hit)."""
        pack = np.full(len(ids), -1, dtype=np.int64)
        row = np.full(len(ids), -1, dtype=np.int64)
        todo = np.arange(len(ids))
        top = self._count - 1
        for tier in self.tiers:
            if not len(todo):
                break
            places = _placed(tier, self._order)
            want = ids[todo]
            p, r = tier.candidates(want).verify(want, lambda k, rows: full_ids(top - int(places[k]), rows))
            hit = p >= 0
            pack[todo[hit]], row[todo[hit]] = top - places[p[hit]], r[hit]
            todo = todo[~hit]
        return pack, row

    def trust(self) -> None:
        """Check each multi-pack index not yet checked in this process (its checksum, order and
        fan-out, in bounded memory); one that fails is deleted and its packs' own indexes
        merged anew in its place, so that a damaged cache never hides an entry from a walk."""
        with self._lock:
            for i, tier in enumerate(self.tiers):
                if tier.trusted:
                    continue
                try:
                    tier.index.verify(MERGE_BUDGET)
                    tier.trusted = True
                    continue
                except CorruptObject:
                    _unlink(tier.index.path)
                singles, broken = _singles(self.folder, tier.names)
                self.broken.update(broken)
                names = [n for n in tier.names if n not in broken]
                fresh = merged_tier(self.folder, singles) if len(singles) > 1 else \
                    singles[0] if singles else Tier(names, *(np.zeros(0, dtype=d) for d in COLUMNS))
                self.tiers[i] = fresh

    def entries(self, first: int, last: int) -> tuple:
        """(pack numbers, rows) of every entry whose id's first byte is in [first, last), all tiers."""
        self.trust()
        packs, rows = [], []
        top = self._count - 1
        for tier in self.tiers:
            start = slice_starts(tier.fanout)
            s, t = int(start[first]), int(start[last])
            packs.append(top - _placed(tier, self._order)[tier.packs[s:t].astype(np.int64)])
            rows.append(tier.rows[s:t].astype(np.int64))
        if not packs:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(packs), np.concatenate(rows)

    def counts(self) -> np.ndarray:
        """Entries per first id byte, all tiers together (256)."""
        self.trust()
        out = np.zeros(FANOUT, dtype=np.int64)
        for tier in self.tiers:
            out += np.diff(slice_starts(tier.fanout))
        return out


def pidx_path(folder: Path, name: bytes) -> Path:
    return Path(folder) / f"pack-{name.hex()}.pidx"


_VIEWS: dict = {}  # (pid, folder) -> the Registered built last there
_VIEWS_LOCK = threading.Lock()


def unchanged(folder, stamp) -> Optional[Registered]:
    """The Registered set this process built last for pack folder ``folder`` if it was built under
    registry ``stamp`` (``Txn.registry_stamp``: it changes with every registration), else None."""
    with _VIEWS_LOCK:
        last = _VIEWS.get((os.getpid(), str(Path(folder))))
    return last if last is not None and stamp is not None and last.stamp == stamp else None


def registered(folder, packs: tuple, stamp=None) -> Registered:
    """The Registered set of ``packs`` ((sequence, name), newest first) in pack folder ``folder``.
    Built from the one built last for that folder where it can be (packs registered since, as
    another process's commits add them: ``_extended``), else from the multi-pack indexes on disk
    that cover runs of them, the packs' own indexes for the rest; tiers past MAX_TIERS are merged
    (``_fewer``) into a multi-pack index. ``stamp``: the registry's stamp these packs were read
    under (see ``unchanged``)."""
    folder = Path(folder)
    key = (os.getpid(), str(folder))
    with _VIEWS_LOCK:
        last = _VIEWS.get(key)
    if last is not None and len(last.names) == len(packs) and last.packs == packs:
        last.stamp = stamp
        return last
    new = len(packs) - len(last.names) if last is not None else 0
    if new > 0 and packs[new:] == last.packs:  # only newer packs than the last view's
        return _remember(folder, _extended(folder, last, packs[:new], stamp))
    tiers, broken = _reuse(last, packs) if last is not None else ([], {})
    names = [name for _, name in packs]
    covered = {name for tier in tiers for name in tier.names} | set(broken)
    rest = [name for name in names if name not in covered]
    # the files on disk are looked for when this process has no view to build on (a view built on
    # adds the new packs' own indexes; a scan per commit would cost every multi-pack index's names)
    found, got = (_on_disk(folder, rest) if not tiers else {}), []
    at = 0
    while at < len(rest):
        tier = found.get((at, rest[at]))
        if tier is not None:
            got.append(tier)
            at += len(tier.names)
            continue
        single, why = _single(folder, rest[at])
        if single is None:
            broken[rest[at]] = why
        else:
            got.append(single)
        at += 1
    tiers = _fewer(got + tiers, lambda group: merged_tier(folder, group))
    view = Registered(folder, packs, tiers, broken, stamp)
    if last is not None:  # packs taken out of the index: no mapping may keep their space
        kept = set(view.names)
        forget_trailer_views(folder / pack_filename(n) for n in last.names if n not in kept)
    return _remember(folder, view)


def added(folder, last: Registered, seq: int, name: bytes, stamp=None) -> Registered:
    """The Registered set of ``last``'s packs and pack ``name`` registered as the newest, with
    sequence number ``seq`` (a commit's): built from ``last`` (``_extended``) in time independent
    of the number of packs, where ``name`` is new and newer than them; else as ``registered``
    builds it."""
    folder = Path(folder)
    if name in last.names or (last.newest() is not None and seq <= last.newest()):
        packs = [(seq, name)] + [p for p in last.packs if p[1] != name]
        return registered(folder, tuple(sorted(packs, reverse=True)), stamp)
    return _remember(folder, _extended(folder, last, ((seq, name),), stamp))


def _extended(folder: Path, last: Registered, new: tuple, stamp) -> Registered:
    """The Registered set of ``last``'s packs and ``new`` ((sequence, name), newest first, each
    newer than every pack of ``last``): ``last``'s tiers and list of packs (appended to, not
    copied), a tier per new pack, the newest tiers merged past MAX_TIERS. Costs the new packs and
    the tiers (and the merges, whose sizes grow geometrically), not every registered pack."""
    order = last._order.extended(last._count, new[::-1])
    got, broken = [], dict(last.broken)
    for seq, name in new:
        single, why = _single(folder, name)
        if single is None:
            broken[name] = why
            continue
        single.placed = (order, np.array([order.place[name]], dtype=np.int64))
        got.append(single)

    def merged(group: list) -> Tier:
        tier = merged_tier(folder, group)
        if tier.names == [n for g in group for n in g.names]:  # numbered as the tiers it merges
            tier.placed = (order, np.concatenate([_placed(g, order) for g in group]))
        return tier
    tiers = _fewer(got + last.tiers, merged)
    return Registered._of(folder, order, last._count + len(new), tiers, broken, stamp)


def _remember(folder: Path, view: Registered) -> Registered:
    """``view``, kept as the one built last for pack folder ``folder`` (``unchanged``, ``registered``)."""
    with _VIEWS_LOCK:
        _VIEWS[(os.getpid(), str(folder))] = view
    return view


def _single(folder: Path, name: bytes) -> tuple:
    """(Tier of pack ``name``'s own index, None) or (None, why it cannot be read)."""
    try:
        idx = PackIndex(pidx_path(folder, name))
    except (OSError, CorruptObject) as exc:
        return None, str(exc)
    if idx.names != [name]:
        return None, f"{pidx_path(folder, name).name} does not index pack {name.hex()}"
    return Tier.of(idx), None


def _singles(folder: Path, names: list) -> tuple:
    """([Tier of each pack's own index], {name: why} of those that cannot be read)."""
    tiers, broken = [], {}
    for name in names:
        tier, why = _single(folder, name)
        if tier is None:
            broken[name] = why
        else:
            tiers.append(tier)
    return tiers, broken


def _on_disk(folder: Path, names: list) -> dict:
    """{(place, first name): Tier} of the multi-pack indexes in ``folder`` whose pack list is
    the run of ``names`` (newest first) starting at that place; the longest where several start
    there. One whose packs' files are gone is garbage (those packs are never registered again)
    and is deleted; one whose list matches no run is left (another snapshot may use it)."""
    place = {name: i for i, name in enumerate(names)}
    out = {}
    for path in _midx_files(folder):
        listed = _listed_names(path)
        if listed is None:
            continue
        if midx_path(folder, listed) != path:  # its name does not say what it covers
            _unlink(path)
            continue
        first = place.get(listed[0]) if listed else None
        if first is None or names[first:first + len(listed)] != listed:
            if any(not os.path.lexists(folder / pack_filename(n)) for n in listed):
                _unlink(path)
            continue
        have = out.get((first, listed[0]))
        if have is not None and len(have.names) >= len(listed):
            continue
        try:
            idx = PackIndex(path)
        except (OSError, CorruptObject):
            _unlink(path)
            continue
        if idx.names != listed:
            continue
        out[(first, listed[0])] = Tier.of(idx)
    return out


def _midx_files(folder: Path) -> list:
    try:
        with os.scandir(folder) as it:
            return sorted(Path(e.path) for e in it if MIDX_NAME.fullmatch(e.name) and e.is_file(follow_symlinks=False))
    except OSError:
        return []


def _listed_names(path: Path) -> Optional[list]:
    """The pack names a multi-pack index's header lists (None if it has no valid header)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD.size)
            if len(head) != HEAD.size:
                return None
            magic, npacks, _, width, _ = HEAD.unpack(head)
            if magic != MAGIC or width != PREFIX:
                return None
            raw = f.read(npacks * NAME)
    except OSError:
        return None
    if len(raw) != npacks * NAME:
        return None
    return [raw[k * NAME:(k + 1) * NAME] for k in range(npacks)]


def collect(folder) -> list:
    """Delete the multi-pack indexes of pack folder ``folder`` that name a pack whose file is
    gone (a pack is deleted after it is taken out of the index and never registered again, so
    such an index can never be used), and their temporary files left by killed writers;
    returns the paths deleted. Run after packs are deleted."""
    folder, gone = Path(folder), []
    for path in _midx_files(folder):
        listed = _listed_names(path)
        if listed is None or any(not os.path.lexists(folder / pack_filename(n)) for n in listed):
            _unlink(path)
            gone.append(path)
    try:
        with os.scandir(folder) as it:
            tmps = [Path(e.path) for e in it if MIDX_TMP.fullmatch(e.name)]
    except OSError:
        tmps = []
    return gone + delete_stale(tmps, TMP_GRACE_S)


def delete_stale(paths, grace: float) -> list:
    """Delete those of ``paths`` untouched for ``grace`` seconds (a younger one may be a write in
    progress in another process); the paths deleted."""
    gone = []
    for path in paths:
        try:
            if time.time() - os.lstat(path).st_mtime > grace:
                os.unlink(path)
                gone.append(path)
        except OSError:  # gone already, or a read-only folder
            pass
    return gone


def forget(folder) -> None:
    """Drop what this process keeps of pack folder ``folder`` (its repository was closed)."""
    with _VIEWS_LOCK:
        last = _VIEWS.pop((os.getpid(), str(Path(folder))), None)
    if last is not None:
        forget_trailer_views(Path(folder) / pack_filename(n) for n in last.names)


def _reuse(last: Registered, packs: tuple) -> tuple:
    """(tiers, broken) of ``last`` that ``packs`` still registers, or nothing if a pack it lacks
    is older than one it has, or some of a tier's packs went (tiers are kept newest first, and
    whole: such a set is built anew, from the files, which are mapped, not read)."""
    keep = {name for _, name in packs}
    seqs = dict((name, seq) for seq, name in packs)
    had = set(last.names)  # once: a set per pack made each commit cost the square of the packs
    old = [seqs[n] for n in had if n in keep]
    new = [seq for seq, name in packs if name not in had]
    if old and new and min(new) < max(old):
        return [], {}
    tiers = [tier for tier in last.tiers if any(n in keep for n in tier.names)]
    if any(n not in keep for tier in tiers for n in tier.names):
        return [], {}
    return tiers, {n: why for n, why in last.broken.items() if n in keep}


def merge_group(sizes: list, most: int) -> int:
    """How many of the newest of files of ``sizes`` entries (newest first) to merge into one now
    (0: none): where there are more than ``most``, the newest as long as they hold at least half
    as many entries as the next older one (and enough that at most ``most`` are left), so sizes
    grow geometrically and each entry is merged a few times at most."""
    if len(sizes) <= most:
        return 0
    j, total = 1, sizes[0] + sizes[1]
    while j + 1 < len(sizes) and (total * 2 > sizes[j + 1] or len(sizes) - j > most):
        j += 1
        total += sizes[j]
    return j + 1


def _fewer(tiers: list, merged=merge_tiers) -> list:
    """``tiers`` (newest first) with runs of the newest merged (``merged``) while there are more
    than MAX_TIERS (``merge_group``)."""
    while k := merge_group([len(t) for t in tiers], MAX_TIERS):
        tiers = [merged(tiers[:k])] + tiers[k:]
    return tiers
