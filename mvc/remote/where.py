"""Where hints: which chunk packs of a remote hold the chunks of a tensor object (``docs/format.md`` 11.8).

Vocabulary:

- **where hint** (``where/<name>``): written by a push just before the object
  pack ``objects/<name>.pack``, for the tensor objects in that pack: per
  tensor, its **runs**, (first chunk index, chunk pack name) in chunk order,
  each saying where the chunks from its index up to the next run's lie.
  The pusher knows: the packs it just wrote, and the catalogue's locations
  of the chunks the remote held already. A few runs a tensor: a push writes
  a tensor's chunks one after the other, and each rank of a sharded save
  uploads its own.
- **noted tensor**: a tensor object a lazy reader decoded in this process
  (``Noted``); the chunk ids it wants are looked up among theirs, so a miss
  finds the tensor, the chunk index, and through its hint the one pack to read.

A lazy clone lists the chunk packs without reading their trailers; a chunk
lookup that misses reads unread trailers (``Catalogue.read_unread``). With
a hint it reads the trailers of the packs the hint names for the chunks it
wants first, then (if some are still not found: a stale hint, one from a
push that did not know, none at all) newest first as before. So a rank of
a sharded load reads its own packs' trailers, not the other ranks', and a
tensor only old packs hold does not read every newer trailer first.

A lazy clone's push (and a rank's ``upload_shards`` on a fresh host) uses
the hints the other way round: it reads the trailers the hints of the
tensors it sends and of their predecessors name, so a chunk the last
checkpoint holds is found there, and sends again one no trailer it read
lists rather than read every trailer to prove it absent
(``mvc.remote.sync._held``; docs/format.md 11.8).

A hint is only ever a speed matter: it chooses which trailers to read
first; the locations come from those trailers, and every byte read is
verified against its BLAKE3 id. A hint that is missing (an older pusher, a
repair's new object pack), damaged (it does not decode) or stale (a remote
gc or repair moved the chunks: the pack it names is gone or does not list
them) costs only the trailers it made a reader read in vain.
"""

import threading
from collections import OrderedDict
from typing import Callable, Optional

import numpy as np

from .. import encoding
from ..errors import CorruptObject
from . import layout
from .bucket import NotFound

VERSION = 1
_RUN = np.dtype([("start", "<u8"), ("pack", "<u4")])
UNKNOWN = 0xFFFFFFFF  # a run whose chunks the pusher located in no pack
MAX_BYTES = 64 << 20  # a hint larger than this is not read (one object pack's tensors list far less)


# -- writing (push) ---------------------------------------------------------------

def runs(chunks, where: Callable[[bytes], Optional[bytes]]) -> list:
    """[(first chunk index, pack name or None)] of a tensor's ``chunks``, ``where(id)`` naming
    the pack each lies in (None: not known)."""
    out = []
    for i, cid in enumerate(chunks):
        name = where(cid)
        if not out or out[-1][1] != name:
            out.append((i, name))
    return out


def encode(tensors: dict) -> bytes:
    """The bytes of a where hint: {tensor id: runs} as canonical msgpack
    ``{"version": 1, "packs": [bin(16)], "tensors": [[bin(32), bin(12·k)]]}``, each tensor's runs
    ``k`` little-endian (u64 first chunk index, u32 index into ``packs`` or 0xFFFFFFFF)."""
    names: dict = {}
    listed = []
    for tid in sorted(tensors):
        table = np.zeros(len(tensors[tid]), dtype=_RUN)
        for i, (start, name) in enumerate(tensors[tid]):
            table[i] = (start, UNKNOWN if name is None else names.setdefault(name, len(names)))
        listed.append([tid, table.tobytes()])
    return encoding.pack({"version": VERSION, "packs": list(names), "tensors": listed})


def decode(data: bytes) -> dict:
    """{tensor id: (first chunk indices as a u64 array, [pack name or None per run])} of a hint's
    bytes; CorruptObject if they are not one this mvc writes."""
    value = encoding.unpack(data, "where hint")
    if type(value) is not dict or value.get("version") != VERSION or type(value.get("packs")) is not list \
            or type(value.get("tensors")) is not list:
        raise CorruptObject("a where hint is not one this mvc reads")
    packs = value["packs"]
    if not all(type(n) is bytes and len(n) == layout.NAME_BYTES for n in packs):
        raise CorruptObject("a where hint names a pack wrongly")
    out = {}
    for entry in value["tensors"]:
        if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not bytes or len(entry[0]) != 32 \
                or type(entry[1]) is not bytes or not entry[1] or len(entry[1]) % _RUN.itemsize:
            raise CorruptObject("a where hint lists a tensor wrongly")
        table = np.frombuffer(entry[1], dtype=_RUN)
        starts, index = table["start"].astype(np.uint64), table["pack"]
        if starts[0] != 0 or (len(starts) > 1 and not bool(np.all(starts[1:] > starts[:-1]))) \
                or bool(np.any((index >= len(packs)) & (index != UNKNOWN))):
            raise CorruptObject("a where hint lists runs wrongly")
        out[entry[0]] = (starts, [None if p == UNKNOWN else packs[p] for p in index.tolist()])
    return out


def read(bucket, object_pack: str) -> Optional[bytes]:
    """The bytes of object pack ``object_pack``'s where hint, or None if it has none. RemoteError."""
    key = layout.where_key(object_pack)
    try:
        data = bucket.get(key)
    except NotFound:
        return None
    return data if len(data) <= MAX_BYTES else None


# -- reading (a lazy reader) ------------------------------------------------------

class Noted:
    """The tensor objects a lazy reader decoded (the last ``LIMIT`` chunks' worth), and which of them hold an id.

    ``note`` keeps the first 8 bytes of each chunk id of a tensor read (8 bytes a chunk: a
    fetch or a walk of a large history keeps no more than ``LIMIT`` of them); ``holders``
    builds, once after new tensors were noted, a table of them sorted (20 bytes a chunk: the
    first 41 bits of the id and the row in the low ``ROW_BITS``, one u64 sorted by ``np.sort``,
    0.2-0.8 s a 4·10⁶ chunks here; and each row's tensor and index) and looks the wanted ids up in
    it with numpy. Readers note their tensors first and then look their chunks up (a load, a DCP view,
    a walk), and a lookup asks only while some trailer is unread, reading at least one each
    time: few builds. A prefix shared by two ids can only pick a wrong pack: a speed matter,
    as every hint.
    """

    LIMIT = 1 << 22  # chunks: every chunk of a 1 TB model at 256 KiB a chunk
    ROW_BITS = 23  # a table row's bits in its key: at most LIMIT rows (a tensor of more chunks is not noted)

    def __init__(self):
        self._tensors: OrderedDict = OrderedDict()  # tensor id -> its chunk ids' keys
        self._count = 0
        self._table = None  # (tensor ids, keys, tensor slots, chunk indices), keys sorted
        self._lock = threading.Lock()

    def note(self, tid: bytes, chunks) -> None:
        if not chunks or len(chunks) > self.LIMIT:
            return
        with self._lock:
            if tid in self._tensors:
                return
        keys = _keys(chunks)
        with self._lock:
            if tid in self._tensors:
                return
            self._tensors[tid] = keys
            self._count += len(keys)
            while self._count > self.LIMIT:
                self._count -= len(self._tensors.popitem(last=False)[1])
            self._table = None

    def holders(self, ids) -> dict:
        """{tensor id: chunk indices (an array)} of noted tensors holding some of ``ids``, one holder an id."""
        ids = [cid for cid in ids if len(cid) == 32]
        with self._lock:
            if not ids or not self._tensors:
                return {}
            if self._table is None:
                self._table = _table(self._tensors, self.ROW_BITS)
            tids, keys, slots, indices = self._table
        shift = np.uint64(self.ROW_BITS)
        want = (_keys(ids) >> shift) << shift  # the prefix, row 0: the first row of that prefix
        at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        hit = (keys[at] >> shift) << shift == want
        rows = (keys[at[hit]] & np.uint64((1 << self.ROW_BITS) - 1)).astype(np.int64)
        slots, indices = slots[rows], indices[rows]
        return {tids[s]: indices[slots == s] for s in np.unique(slots).tolist()}


def _keys(ids) -> np.ndarray:
    """The first 8 bytes of each 32-byte id, as u64."""
    return np.frombuffer(b"".join(ids), dtype="<u8").reshape(-1, 4)[:, 0].copy()


def _table(tensors: OrderedDict, row_bits: int) -> tuple:
    """(tensor ids, keys: id prefix and row in one u64, sorted; each row's tensor slot and chunk index)."""
    tids = list(tensors)
    counts = np.array([len(tensors[t]) for t in tids], dtype=np.int64)
    keys = np.concatenate([tensors[t] for t in tids])
    slots = np.repeat(np.arange(len(tids), dtype=np.uint32), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    indices = np.arange(len(keys), dtype=np.int64) - starts
    shift = np.uint64(row_bits)
    keys = np.sort(((keys >> shift) << shift) | np.arange(len(keys), dtype=np.uint64))
    return tids, keys, slots, indices


def packs_for(holders: dict, hint_of: Callable[[bytes], Optional[tuple]]) -> set:
    """The chunk pack keys the hints of ``holders`` ({tensor id: chunk indices}) name for those
    indices; ``hint_of(tensor id)`` gives a tensor's (starts, names) or None."""
    out = set()
    for tid, indices in holders.items():
        hint = hint_of(tid)
        if hint is None:
            continue
        starts, names = hint
        for run in np.unique(np.searchsorted(starts, indices.astype(np.uint64), side="right") - 1).tolist():
            if run >= 0 and names[run] is not None:
                out.add(layout.pack_key(layout.CHUNK_PACKS, names[run]))
    return out
