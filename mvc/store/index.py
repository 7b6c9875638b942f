"""The index: one LMDB environment holding everything small and transactional.

Named databases (``docs/format.md`` gives keys and values exactly):

- ``chunks``   chunk id -> Location (pack name, offset, length): the entries of
  repositories older than pack indexes, and per-chunk overrides of them (an empty value: a
  tombstone, the chunk is not indexed though a registered pack index lists it)
- ``packidx``  pack name -> (sequence number, entries): the packs whose pack index
  (``packindex``, ``pack-<name>.pidx``) is part of the chunk index; a chunk is located by
  the ``chunks`` table first, then by the newest registered pack that lists it. Both are
  derived data, rebuildable from the packs' trailers
- ``tensors``, ``trees``, ``commits``   object id -> canonical encoding
- ``refs``     ref name -> direct (id + flags) or symbolic (target name)
- ``reflog``   ref name, NUL, sequence number -> encoded entry
- ``locks``    branch name -> encoded lock holder
- ``meta``     repository settings (``chunk_size``)
- ``pruned``   commit id -> encoded note (time, policy): retention kept the
  commit's record but gc deleted its tree and tensors

Only one process writes at a time (LMDB's writer lock); readers never
block. This is the only module that imports ``lmdb``.
"""

import errno
import itertools
import os
import struct
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import lmdb
import numpy as np

from .. import encoding, hashing
from ..errors import BadInput, CorruptObject, MvcError, NotRegular, ReaderClash, ReadOnlyRepository
from . import idarray, packindex
from .fs import check_file, open_file
from .packs import (INDEX_RAW, Location, cached_trailer_view, decode_location, encode_location, pack_filename,
                    walked_view)

OBJECT_KINDS = ("tensors", "trees", "commits")
DB_NAMES = ("chunks",) + OBJECT_KINDS + ("refs", "reflog", "locks", "meta", "pruned", "packidx")
OPTIONAL_DBS = ("packidx",)  # absent from repositories older than pack indexes: made when first written
TOMBSTONE = b""  # a chunks value: not indexed, though a registered pack index lists the id
REGISTRATION = struct.Struct("<QQ")  # packidx value: sequence number, entries
TRAILERS_HELD = 16  # pack trailers a transaction keeps mapped
MISSING = "missing"  # a registered pack whose file is gone: its chunks are located there, offset 0
NEXT_SEQ = b"next-seq"  # packidx key (not 16 bytes, so no pack name) of the next sequence number
# packidx key (not 16 bytes) of a random token every registration and unregistration rewrites: with
# the entry count and NEXT_SEQ (which an mvc that writes no token changes too) a transaction
# knows the registry is as a view was built under without reading every registration
VERSION = b"version"
_SEQ = struct.Struct(">Q")
DIRECT, SYMBOLIC = 0, 1
FLAG_PROTECTED = 1
# Address space only (the file grows as it is used): 1 TiB, because a repository of 4e8
# chunk entries (a 1 TB model, 100 checkpoints: docs/scale.md) needs an index of about 125 GB.
MAP_SIZE = 1 << 40
MIN_MAP_SIZE = 1 << 26  # tried when the address space for MAP_SIZE is refused (ulimit -v)
MAX_KEY = 480  # LMDB's key limit is 511 bytes; a reflog key adds 9 to a ref name
LOCK_FILE_BYTES = 8192  # what LMDB makes of lock.mdb for its 126 reader slots
FULL_BELOW = 16 << 20  # free bytes under which an I/O error of the index is taken for a full disk


@dataclass(frozen=True)
class RefValue:
    """A ref: either direct (``id``) or symbolic (``target``, a ref name)."""

    id: Optional[bytes] = None
    target: Optional[str] = None
    protected: bool = False


SEALED = 0xC1  # a byte msgpack never uses and no legacy ref starts with
CHECK_BYTES = 8
SEALED_DBS = ("refs", "reflog", "locks", "pruned")  # values with no content id of their own


def _check(db: str, key: bytes, inner: bytes) -> bytes:
    return hashing.digest(db.encode() + b"\x00" + key + b"\x00" + inner)[:CHECK_BYTES]


def seal(db: str, key: bytes, inner: bytes) -> bytes:
    """``inner`` with a checksum over the db, key and value, so a flipped byte is detected."""
    return bytes([SEALED]) + _check(db, key, inner) + inner


def unseal(db: str, key: bytes, raw: bytes, what: str) -> bytes:
    """The inner value of a sealed value (legacy unsealed values pass as they are).

    CorruptObject naming ``what`` if its checksum does not match (``field`` "checksum"; a ref's:
    ``kind`` "ref" and ``name`` the ref, others ``kind`` "index").
    """
    if not raw or raw[0] != SEALED:
        return raw
    inner = raw[1 + CHECK_BYTES:]
    if len(raw) < 1 + CHECK_BYTES or raw[1:1 + CHECK_BYTES] != _check(db, key, inner):
        ref = db == "refs"
        raise CorruptObject(f"{what} is damaged in the index (checksum mismatch)", kind="ref" if ref else "index",
                            field="checksum", name=key.decode("utf-8", "replace") if ref else None)
    return inner


def reflog_entry(raw: bytes) -> Optional[dict]:
    """A raw reflog entry decoded, if it is well formed: a map whose ``old`` and
    ``new`` are commit ids or nil (``time`` defaults to 0); None if it is damaged."""
    try:
        entry = encoding.unpack(raw, "reflog entry")
    except CorruptObject:
        return None
    if type(entry) is not dict:
        return None
    if not all(entry.get(k) is None or (type(entry.get(k)) is bytes and len(entry[k]) == 32) for k in ("old", "new")):
        return None
    return entry


def _encode_ref(value: RefValue) -> bytes:
    if value.target is not None:
        return bytes([SYMBOLIC]) + value.target.encode()
    return bytes([DIRECT]) + value.id + bytes([FLAG_PROTECTED if value.protected else 0])


def _decode_ref(name: str, raw: bytes) -> RefValue:
    if raw[:1] == bytes([SYMBOLIC]):
        return RefValue(target=raw[1:].decode("utf-8", "replace"))
    if raw[:1] == bytes([DIRECT]) and len(raw) == 34:
        return RefValue(id=raw[1:33], protected=bool(raw[33] & FLAG_PROTECTED))
    raise CorruptObject(f"ref {name!r} has a damaged value in the index", kind="ref", name=name)


def check_key(name: str) -> None:
    """BadInput for a ref or branch name too long to be an index key."""
    if len(name.encode()) > MAX_KEY:
        raise BadInput(f"name {name[:40]!r}... is {len(name.encode())} bytes long; names may be at most "
                       f"{MAX_KEY} bytes")


def _location(raw: bytes) -> Location:
    return decode_location(raw)  # 28 bytes (raw record) or 66 (encoded): packs.py


SCAN_BATCH = 1 << 16  # chunk entries a scan holds at once: about 6 MB
# A chunk index value of a raw record as numpy reads it (INDEX_RAW's layout, 28 bytes).
RAW_VALUE = np.dtype([("pack", "V16"), ("offset", "<u8"), ("length", "<u4")])
assert RAW_VALUE.itemsize == INDEX_RAW.size
# Locations as columns: ``size`` is the decoded size, ``bad`` marks a value that does not decode.
LOCATIONS = np.dtype([("pack", "V16"), ("offset", "<u8"), ("length", "<u4"), ("size", "<i8"), ("kind", "u1"),
                      ("bad", "?")])


@dataclass
class ChunkBatch:
    """Consecutive entries of the chunk table, in id order, as arrays.

    ``ids``: an id array (``idarray``); ``locs``: their locations (LOCATIONS);
    ``bases``: {row: (base id, depth)} of the delta records among them; ``bad``: {row:
    why} of the values that do not decode (their ``locs`` row is zero).
    """

    ids: np.ndarray
    locs: np.ndarray
    bases: dict
    bad: dict


def location_row(locs: np.ndarray, i: int, delta: Optional[tuple] = None) -> Location:
    """Row ``i`` of a LOCATIONS array as a Location; ``delta`` is its (base id, depth), if any."""
    row = locs[i]
    kind = int(row["kind"])
    base, depth = delta or (None, 0)
    return Location(locs["pack"][i:i + 1].tobytes(), int(row["offset"]), int(row["length"]), kind,
                    int(row["size"]) if kind else -1, depth, base)


def _batch(keys: list, values: list) -> ChunkBatch:
    """The ChunkBatch of raw keys and values read from the chunk table."""
    n = len(values)
    locs = np.zeros(n, dtype=LOCATIONS)
    raw = np.fromiter(map(len, values), dtype=np.int64, count=n) == INDEX_RAW.size
    plain = np.flatnonzero(raw)
    if len(plain):
        parsed = np.frombuffer(b"".join(values if len(plain) == n else [values[i] for i in plain]), RAW_VALUE)
        for name in ("pack", "offset", "length"):
            locs[name][plain] = parsed[name]
        locs["size"][plain] = parsed["length"]
    bases, bad = {}, {}
    for i in np.flatnonzero(~raw).tolist():  # encoded records (repack) and damage: one at a time
        try:
            loc = decode_location(values[i])
        except CorruptObject as exc:
            locs["bad"][i] = True
            bad[i] = str(exc)
            continue
        locs[i] = (loc.pack, loc.offset, loc.length, loc.size, loc.kind, False)
        if loc.base is not None:
            bases[i] = (loc.base, loc.depth)
    return ChunkBatch(idarray.pack(keys), locs, bases, bad)


def _table_batches(entries, batch: int, skip_tombstones: bool = False) -> Iterator[ChunkBatch]:
    """ChunkBatches of (key, value) rows of the chunks table; keys that are no ids left out."""
    while True:
        rows = list(itertools.islice(entries, batch))
        if not rows:
            return
        if len(b"".join(k for k, _ in rows)) != idarray.WIDTH * len(rows):
            rows = [(k, v) for k, v in rows if len(k) == idarray.WIDTH]
        if skip_tombstones:
            rows = [(k, v) for k, v in rows if v != TOMBSTONE]
        if rows:
            keys, values = zip(*rows)
            yield _batch(list(keys), list(values))


def _after(prefix: bytes) -> Optional[bytes]:
    """The smallest key above every key that starts with ``prefix`` (None: no bound)."""
    head = prefix.rstrip(b"\xff")
    return head[:-1] + bytes([head[-1] + 1]) if head else None


def _sliced(b: ChunkBatch, start: int, stop: int) -> ChunkBatch:
    if start == 0 and stop >= len(b.ids):
        return b
    keep = range(start, min(stop, len(b.ids)))
    return ChunkBatch(b.ids[start:stop], b.locs[start:stop], {i - start: v for i, v in b.bases.items() if i in keep},
                      {i - start: v for i, v in b.bad.items() if i in keep})


def _id_order(ids: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The order that sorts ``ids`` (an id array), ties by ``rank`` ascending: the u64 heads of the
    ids sorted as numbers, and the whole ids where two share 16 bytes (numbers sort far faster)."""
    if not len(ids):
        return np.zeros(0, dtype=np.int64)
    heads, tails = packindex.halves(ids)
    order = np.argsort(heads)  # not stable, far faster than lexsort: runs of equal heads are ordered below
    h = heads[order]
    same = h[1:] == h[:-1]
    if same.any():  # within each run: by tail, rank, then place (lexsort's order of the three columns)
        run = np.flatnonzero(np.concatenate([[False], same]) | np.concatenate([same, [False]]))
        within = order[run]
        order[run] = within[np.lexsort((within, rank[within], tails[within], h[run]))]
    h, t = heads[order], tails[order]
    tie = (h[1:] == h[:-1]) & (t[1:] == t[:-1])
    if tie.any() and (ids[order][1:][tie] != ids[order][:-1][tie]).any():
        order = np.argsort(rank, kind="stable")
        order = order[np.argsort(ids[order], kind="stable")]
    return order


def _combined(a: ChunkBatch, b: ChunkBatch) -> ChunkBatch:
    """The entries of two ChunkBatches with no id in common, in id order."""
    ids = np.concatenate([a.ids, b.ids])
    order = _id_order(ids, np.zeros(len(ids), dtype=np.int64))
    where = np.empty(len(ids), dtype=np.int64)
    where[order] = np.arange(len(ids))
    n = len(a.ids)
    bases = {int(where[i]): v for i, v in a.bases.items()}
    bases.update({int(where[n + i]): v for i, v in b.bases.items()})
    bad = {int(where[i]): v for i, v in a.bad.items()}
    bad.update({int(where[n + i]): v for i, v in b.bad.items()})
    return ChunkBatch(ids[order], np.concatenate([a.locs, b.locs])[order], bases, bad)


class Txn:
    """One LMDB transaction, speaking in mvc's types.

    ``repo_dir``: the folder the index lives in (``.mvc``), where the files
    that records name live (the holder files of branch locks)."""

    def __init__(self, txn, dbs: dict, repo_dir: Path):
        self._txn = txn
        self._dbs = dbs
        self.repo_dir = repo_dir
        # facts its users derive once per transaction (which pack files are on disk: PackStore.keeps)
        self.memo: dict = {}

    # chunks: the ``chunks`` table first (entries of older repositories, overrides, tombstones),
    # then the registered pack indexes, newest pack first
    def chunk(self, cid: bytes) -> Optional[Location]:
        raw = self._txn.get(cid, db=self._dbs["chunks"])
        if raw is not None:
            return None if raw == TOMBSTONE else _location(raw)
        return self._listed(cid)

    def put_chunk(self, cid: bytes, loc: Location, overwrite: bool = False) -> bool:
        """Index ``cid`` at ``loc``; False (and nothing changed) if it is indexed and not ``overwrite``."""
        if not overwrite and self.chunk(cid) is not None:
            return False
        self.set_chunk(cid, loc)
        return True

    def set_chunk(self, cid: bytes, loc: Optional[Location]) -> None:
        """Make ``chunk(cid)`` return ``loc`` (None: not indexed), with a ``chunks`` entry only
        where the registered pack indexes alone would say otherwise."""
        db = self._dbs["chunks"]
        if self._view() is not None and self._listed(cid) == loc:
            self._txn.delete(cid, db=db)
        elif loc is None:
            if self._view() is None:
                self._txn.delete(cid, db=db)
            else:
                self._txn.put(cid, TOMBSTONE, db=db)
        else:
            self._txn.put(cid, encode_location(loc), db=db)

    def chunks_among(self, ids: Iterable[bytes]) -> dict:
        """{id: Location} of those of ``ids`` the chunk index holds (no Location for the rest)."""
        get, db, found = self._txn.get, self._dbs["chunks"], {}
        ids = ids if isinstance(ids, list) else list(ids)
        rest = ids
        if self._table_entries():
            rest = []
            for cid in ids:
                raw = get(cid, db=db)
                if raw is None:
                    rest.append(cid)
                elif raw != TOMBSTONE:
                    found[cid] = _location(raw)
        if rest and self._view() is not None:
            found.update(self._listed_many(rest))
        return found

    def put_new_chunks(self, ids: list, values: list) -> list:
        """Put chunk index values (``encode_location``'s bytes) under ``ids`` where no entry is
        yet; the positions in ``ids`` of those that already had one (left as they were), in one
        ``putmulti``. In the order given, not sorted by id: sorted puts fill LMDB's pages to the
        brim, and a gc on a full disk then found no free page to delete a garbage entry with
        (tests/test_probe.py); at 3·10⁵ new chunks the sorted order was not measurably faster."""
        db = self._dbs["chunks"]
        if not ids:
            return []
        keys = b"".join(ids)
        if self._view() is not None or len(keys) != idarray.WIDTH * len(ids):
            # pack indexes (or odd ids): one at a time, in the order given
            whole = len(keys) == idarray.WIDTH * len(ids)
            known = self.chunks_among(ids) if whole else {}
            out = []
            for i, (cid, raw) in enumerate(zip(ids, values)):
                if cid in known if whole else self.chunk(cid) is not None:
                    out.append(i)
                else:
                    self._txn.put(cid, raw, db=db)
            return out
        with self._txn.cursor(db=db) as cursor:
            consumed, added = cursor.putmulti(list(zip(ids, values)), dupdata=False, overwrite=False)
        if added == consumed:
            return []
        # some were indexed already: those whose value is not the one just offered (each new value
        # names this batch's new pack, so no older entry can equal it)
        get = self._txn.get
        return [i for i, (cid, raw) in enumerate(zip(ids, values)) if get(cid, db=db) != raw]

    def delete_chunk(self, cid: bytes) -> None:
        self.set_chunk(cid, None)

    def drop_entry(self, cid: bytes) -> None:
        """Delete ``cid``'s entry in the chunks table itself (the pack indexes then locate it)."""
        self._txn.delete(cid, db=self._dbs["chunks"])

    def chunks(self) -> Iterator[tuple]:
        for batch in self.chunk_batches():
            raw = batch.ids.tobytes()
            for i in range(len(batch.ids)):
                if i in batch.bad:
                    raise CorruptObject(batch.bad[i], kind="index", field="location")
                yield raw[i * idarray.WIDTH:(i + 1) * idarray.WIDTH], location_row(batch.locs, i, batch.bases.get(i))

    def chunk_batches(self, batch: Optional[int] = None, lo: bytes = b"",
                      hi: Optional[bytes] = None) -> Iterator[ChunkBatch]:
        """The chunk index in id order, ``batch`` (default SCAN_BATCH) entries at a time: the
        entries with ``lo`` <= id < ``hi`` (``hi`` None: to the end), so that a walk can take the
        uniform id space a slice at a time.

        One cursor pass: LMDB reads its B-tree's leaves in order, where a
        ``chunk`` call per id would land on a random leaf each time (a cache
        miss per tree level once the table outgrows the caches, a disk read
        once it outgrows memory). A key that is not 32 bytes long is no
        chunk id and is left out. With registered pack indexes, the id space
        is taken a run of first-byte slices at a time (about ``batch`` pack
        index entries each), the table's entries of the run merged in.
        """
        batch = batch or SCAN_BATCH
        view = self._view()
        if view is None:
            yield from _table_batches(self._table(lo, hi), batch, skip_tombstones=True)
            return
        # the table's entries are taken as spread evenly over the id space, as ids are
        counts = view.counts() + self._table_entries() // packindex.FANOUT
        first = lo[0] if lo else 0
        last = min(packindex.FANOUT, hi[0] + 1) if hi else packindex.FANOUT
        b = first
        while b < last:
            e, total = b + 1, counts[b]
            while e < last and total + counts[e] <= batch:
                total += counts[e]
                e += 1
            rlo = lo if b == first and lo else bytes([b])
            rhi = bytes([e]) if e < packindex.FANOUT else None
            if hi is not None and (rhi is None or hi < rhi):
                rhi = hi
            merged = self._merged(view, b, e, rlo, rhi)
            for at in range(0, len(merged.ids), batch):
                yield _sliced(merged, at, at + batch)
            b = e

    def drop_chunks(self) -> None:
        """Empty the chunk index (before rebuilding it from packs): the table and the registrations."""
        self._txn.drop(self._dbs["chunks"], delete=False)
        if self._dbs.get("packidx") is not None:
            self._txn.drop(self._dbs["packidx"], delete=False)
        self.memo.pop("pack indexes", None)

    # -- pack indexes
    def registered_packs(self) -> list:
        """(sequence number, pack name, entries) of the registered packs, newest first."""
        db = self._dbs.get("packidx")
        if db is None:
            return []
        out = []
        for key, raw in self._txn.cursor(db=db):
            if len(key) == packindex.NAME and len(raw) == REGISTRATION.size:
                out.append(REGISTRATION.unpack(raw) + (key,))
        return [(seq, name, n) for seq, n, name in sorted(out, reverse=True)]

    def unreadable_packs(self) -> list:
        """Registered packs whose pack index cannot be read (their chunks look absent), newest first."""
        view = self._view()
        return [] if view is None else [name for name in view.names if name in view.broken]

    def register_pack(self, name: bytes, entries: int) -> None:
        """Make the pack index of pack ``name`` (``pack-<name>.pidx`` beside it, written and
        fsynced) part of the chunk index when this transaction commits, as the newest pack."""
        db = self._packidx_db()
        known, before = self._known_view()
        raw = self._txn.get(NEXT_SEQ, db=db)
        if raw is not None and len(raw) == _SEQ.size:
            seq = _SEQ.unpack(raw)[0]
        else:  # no counter (or a damaged one): above every registration
            seq = max([0] + [s + 1 for s, _, _ in self.registered_packs()])
        self._txn.put(name, REGISTRATION.pack(seq, entries), db=db)
        self._txn.put(NEXT_SEQ, _SEQ.pack(seq + 1), db=db)
        self._txn.put(VERSION, os.urandom(8), db=db)
        self.memo.pop("pack indexes", None)
        if known:  # the view of the registry now, built from the one before: a tier more, not every pack again
            folder, stamp = self.repo_dir / "packs", self.registry_stamp()
            self.memo["pack indexes"] = packindex.registered(folder, ((seq, name),), stamp) if before is None \
                else packindex.added(folder, before, seq, name, stamp)

    def _known_view(self) -> tuple:
        """(True, the view of the registry as it is now, None if it has no packs) where this process
        has it without reading every registration, else (False, None)."""
        if "pack indexes" in self.memo:
            return True, self.memo["pack indexes"]
        view = packindex.unchanged(self.repo_dir / "packs", self.registry_stamp())
        return view is not None, view

    def _changed(self, packs: Optional[tuple]) -> None:
        """The registry changed to ``packs`` (None: not known): the view of them, built from the one
        before (some tiers fewer), so that the transactions after this one find the registry
        as their view was built under instead of reading every registration again."""
        self.memo.pop("pack indexes", None)
        if packs is not None:
            folder = self.repo_dir / "packs"
            self.memo["pack indexes"] = packindex.registered(folder, packs, self.registry_stamp()) if packs else None

    def unregister_packs(self, names: Iterable[bytes]) -> list:
        """Take packs ``names`` out of the chunk index (before their files are deleted); the chunks
        table's tombstones for ids no registered pack lists any more go too. Returns the names
        that were registered."""
        db = self._dbs.get("packidx")
        if db is None:
            return []
        view = self._view()
        gone = [name for name in names if self._txn.get(name, db=db) is not None]
        if not gone:
            return []
        ids = []
        for name in gone:
            t = self._trailer(name)
            if t is not MISSING:
                ids.append(t.table["id"])
        for name in gone:
            self._txn.delete(name, db=db)
        self._txn.put(VERSION, os.urandom(8), db=db)
        dropped = set(gone)
        self._changed(None if view is None else tuple(p for p in view.packs if p[1] not in dropped))
        if ids and view is not None and self._table_entries():
            chunks, after = self._dbs["chunks"], self._view()
            for cid in idarray.ids(np.concatenate(ids)):
                if self._txn.get(cid, db=chunks) == TOMBSTONE and (after is None or self._listed(cid) is None):
                    self._txn.delete(cid, db=chunks)
        return gone

    def table_among(self, ids: list) -> dict:
        """{id: raw value} of those of ``ids`` that have an entry in the chunks table itself."""
        n = self._table_entries()
        if not n:
            return {}
        db, out = self._dbs["chunks"], {}
        if n < len(ids) // 4:  # a few overrides: one pass over them, not a lookup per id
            wanted = set(ids)
            return {k: v for k, v in self._txn.cursor(db=db) if k in wanted}
        for cid in ids:
            raw = self._txn.get(cid, db=db)
            if raw is not None:
                out[cid] = raw
        return out

    def _packidx_db(self):
        db = self._dbs.get("packidx")
        if db is None:  # a repository opened read-only that predates pack indexes
            raise MvcError("the index has no pack index registry: open the repository writable")
        return db

    def _table_entries(self) -> int:
        return self._txn.stat(self._dbs["chunks"])["entries"]

    def _table(self, lo: bytes, hi: Optional[bytes]) -> Iterator[tuple]:
        cursor = self._txn.cursor(db=self._dbs["chunks"])
        entries = cursor.iternext() if not lo or cursor.set_range(lo) else iter(())
        if hi is not None:
            entries = itertools.takewhile(lambda row: row[0] < hi, entries)
        return entries

    def _view(self) -> Optional["packindex.Registered"]:
        if "pack indexes" not in self.memo:
            folder, stamp = self.repo_dir / "packs", self.registry_stamp()
            view = packindex.unchanged(folder, stamp)  # O(1): no read of every registration
            if view is None:
                packs = tuple((seq, name) for seq, name, _ in self.registered_packs())
                view = packindex.registered(folder, packs, stamp) if packs else None
            self.memo["pack indexes"] = view
        return self.memo["pack indexes"]

    def registry_stamp(self) -> Optional[tuple]:
        """(token, entries, NEXT_SEQ) of the pack registry, None where it has no token: it differs
        after any change of the registered set, by this mvc (the token) or by one that writes no
        token (a registration moves NEXT_SEQ, an unregistration the entry count)."""
        db = self._dbs.get("packidx")
        token = self._txn.get(VERSION, db=db) if db is not None else None
        if token is None:
            return None
        return token, self._txn.stat(db)["entries"], self._txn.get(NEXT_SEQ, db=db)

    def _trailer(self, name: bytes):
        """The TrailerView of pack ``name``, once per transaction: read from its records where its
        trailer is damaged, MISSING if the pack file is gone (or cannot be read)."""
        views = self.memo.setdefault("trailers", OrderedDict())
        if name in views:
            views.move_to_end(name)
        else:
            while len(views) >= TRAILERS_HELD:  # each mapping holds a descriptor: a few at a time
                views.popitem(last=False)
            path = self.repo_dir / "packs" / pack_filename(name)
            try:
                views[name] = cached_trailer_view(path, name)
            except (FileNotFoundError, NotRegular):  # what it is reading it says (PackStore.locate)
                views[name] = MISSING
            except CorruptObject:
                try:
                    views[name] = walked_view(path, name)
                except (FileNotFoundError, CorruptObject):
                    views[name] = MISSING
        return views[name]

    def _full_ids(self, view, k: int, rows: np.ndarray, prove: bool = True):
        """The ids pack number ``k``'s trailer lists at ``rows`` (zeros past its end); None if
        its pack is gone and ``prove`` is False (the index's prefix is then taken as it is, for a
        location that names the missing pack: see ``_located``)."""
        out = np.zeros(len(rows), dtype=idarray.ID)
        t = self._trailer(view.names[k])
        if t is MISSING:
            return None if not prove else out
        ok = rows < len(t.table)
        out[ok] = t.table["id"][rows[ok]]
        return out if prove or ok.all() else (out, ~ok)

    def _located(self, view, pack: np.ndarray, row: np.ndarray) -> tuple:
        """(LOCATIONS array, bases {i: (base, depth)}, bad {i: why}) of entries (pack number, row)."""
        n = len(pack)
        locs = np.zeros(n, dtype=LOCATIONS)
        bases, bad = {}, {}
        order = np.argsort(pack, kind="stable")
        cuts = np.flatnonzero(np.diff(pack[order])) + 1
        for sel in np.split(order, cuts) if n else []:
            name = view.names[int(pack[sel[0]])]
            t = self._trailer(name)
            locs["pack"][sel] = np.frombuffer(name, dtype="V16")[0]
            if t is not MISSING:  # else where in it and how long is lost with it: offset 0, which no record has
                sel = sel[row[sel] < len(t.table)]  # the rest: records cut off a damaged pack, likewise
            if t is MISSING or not len(sel):
                continue
            entries, deltas, wrong = t.locations(row[sel])
            locs["offset"][sel], locs["length"][sel] = entries["offset"], entries["length"]
            if t.version >= 2:
                locs["kind"][sel] = entries["kind"]
                locs["size"][sel] = np.where(entries["kind"] != 0, entries["size"], entries["length"])
            else:
                locs["size"][sel] = entries["length"]
            for i, delta in deltas.items():
                bases[int(sel[i])] = delta
            for i, why in wrong.items():
                bad[int(sel[i])] = why
                locs[int(sel[i])] = (bytes(16), 0, 0, 0, 0, True)
        return locs, bases, bad

    def _listed_many(self, ids: list) -> dict:
        """{id: Location} of ``ids`` as the registered pack indexes alone locate them."""
        view = self._view()
        arr = idarray.pack(ids)
        pack, row = view.locate(arr, lambda k, rows: self._full_ids(view, k, rows, prove=False))
        hit = np.flatnonzero(pack >= 0)
        locs, bases, bad = self._located(view, pack[hit], row[hit])
        out = {}
        for j, i in enumerate(hit.tolist()):
            if j in bad:
                raise CorruptObject(bad[j], kind="index", field="location")
            out[ids[i]] = location_row(locs, j, bases.get(j))
        return out

    def _listed(self, cid: bytes) -> Optional[Location]:
        view = self._view()
        if view is None or len(cid) != idarray.WIDTH:
            return None
        head, tail = int.from_bytes(cid[:8], "big"), int.from_bytes(cid[8:16], "big")
        for tier in view.tiers:
            heads, j = tier.heads, int(tier.heads.searchsorted(np.uint64(head)))
            while j < len(heads) and int(heads[j]) == head:
                if int(tier.tails[j]) == tail:
                    name = tier.names[int(tier.packs[j])]
                    t = self._trailer(name)
                    row = int(tier.rows[j])
                    if t is MISSING or row >= len(t.table):  # a pack that cannot say where: offset 0
                        return Location(name, 0, 0)
                    loc = t.location(row, cid)
                    if loc is not None:
                        return loc
                j += 1
        return None

    def _merged(self, view, first: int, last: int, lo: bytes, hi: Optional[bytes]) -> ChunkBatch:
        """The chunk index's entries with first id byte in [first, last) and lo <= id < hi: the
        pack indexes' (newest copy of each id) and the table's, the table's winning."""
        pack, row = view.entries(first, last)
        ids = np.zeros(len(pack), dtype=idarray.ID)
        order = np.argsort(pack, kind="stable")
        cuts = np.flatnonzero(np.diff(pack[order])) + 1
        for sel in np.split(order, cuts) if len(pack) else []:
            ids[sel] = self._full_ids(view, int(pack[sel[0]]), row[sel])
        keep = ids >= lo if lo else np.ones(len(ids), dtype=bool)
        if hi is not None:
            keep &= ids < hi
        keep &= ids != np.zeros(1, dtype=idarray.ID)  # an entry its trailer does not prove (unreadable pack)
        ids, pack, row = ids[keep], pack[keep], row[keep]
        order = _id_order(ids, pack)  # by id, the newest pack first among copies
        ids, pack, row = ids[order], pack[order], row[order]
        first_copy = np.ones(len(ids), dtype=bool)
        first_copy[1:] = ids[1:] != ids[:-1]
        ids, pack, row = ids[first_copy], pack[first_copy], row[first_copy]
        table = [(k, v) for k, v in self._table(lo, hi) if len(k) == idarray.WIDTH]
        if table:
            keys = idarray.pack([k for k, _ in table])
            shadowed = idarray.find(np.sort(keys), ids) >= 0
            ids, pack, row = ids[~shadowed], pack[~shadowed], row[~shadowed]
            table = [(k, v) for k, v in table if v != TOMBSTONE]
        locs, bases, bad = self._located(view, pack, row)
        listed = ChunkBatch(ids, locs, bases, bad)
        if not table:
            return listed
        return _combined(listed, _batch([k for k, _ in table], [v for _, v in table]))

    # objects
    def get(self, kind: str, oid: bytes) -> Optional[bytes]:
        return self._txn.get(oid, db=self._dbs[kind])

    def put(self, kind: str, oid: bytes, data: bytes) -> bool:
        """Store an object; False if it was already there (ids are content)."""
        return self._txn.put(oid, data, db=self._dbs[kind], overwrite=False)

    def delete(self, kind: str, oid: bytes) -> None:
        self._txn.delete(oid, db=self._dbs[kind])

    def ids(self, kind: str, prefix: bytes = b"") -> Iterator[bytes]:
        if kind == "chunks" and self._view() is not None:  # the chunk index, pack indexes included
            for batch in self.chunk_batches(lo=prefix, hi=_after(prefix)):
                yield from idarray.ids(batch.ids)
            return
        cursor = self._txn.cursor(db=self._dbs[kind])
        if not cursor.set_range(prefix):
            return
        for key in cursor.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                return
            yield key

    # refs
    def _sealed(self, db: str, key: bytes, what: str) -> Optional[bytes]:
        raw = self._txn.get(key, db=self._dbs[db])
        return None if raw is None else unseal(db, key, raw, what)

    def _put_sealed(self, db: str, key: bytes, inner: bytes) -> None:
        self._txn.put(key, seal(db, key, inner), db=self._dbs[db])

    def ref(self, name: str) -> Optional[RefValue]:
        raw = self._sealed("refs", name.encode(), f"ref {name!r}")
        return None if raw is None else _decode_ref(name, raw)

    def set_ref(self, name: str, value: RefValue) -> None:
        check_key(name)
        self._put_sealed("refs", name.encode(), _encode_ref(value))

    def delete_ref(self, name: str) -> None:
        self._txn.delete(name.encode(), db=self._dbs["refs"])

    def refs(self, prefix: str = "") -> Iterator[tuple]:
        for key in self.ids("refs", prefix.encode()):
            name = key.decode("utf-8", "replace")
            yield name, self.ref(name)

    # reflog
    def append_reflog(self, name: str, entry: dict) -> None:
        prefix = name.encode() + b"\x00"
        cursor = self._txn.cursor(db=self._dbs["reflog"])
        found = cursor.set_range(name.encode() + b"\x01")
        found = cursor.prev() if found else cursor.last()
        seq = 0
        if found and cursor.key().startswith(prefix):
            seq = _SEQ.unpack(cursor.key()[len(prefix):])[0] + 1
        self._put_sealed("reflog", prefix + _SEQ.pack(seq), encoding.pack(entry))

    def reflog(self, name: Optional[str] = None) -> Iterator[tuple]:
        """(ref name, sequence, entry) in order, for one ref or all."""
        for ref, seq, raw in self.reflog_raw(name):
            yield ref, seq, encoding.unpack(raw, f"reflog entry of {ref}")

    def reflog_raw(self, name: Optional[str] = None) -> Iterator[tuple]:
        """(ref name, sequence, encoded entry): for checkers that decode each entry themselves.

        An entry whose checksum does not match comes out as b"" (which no
        decoder accepts), so checkers report it and deleters can remove it.
        """
        prefix = b"" if name is None else name.encode() + b"\x00"
        for key in self.ids("reflog", prefix):
            # the sequence is 8 big-endian bytes that may hold NULs: split by length
            ref, seq = key[:-_SEQ.size - 1], key[-_SEQ.size:]
            try:
                raw = self._sealed("reflog", key, "reflog entry")
            except CorruptObject:
                raw = b""
            yield ref.decode("utf-8", "replace"), _SEQ.unpack(seq)[0], raw

    def delete_reflog(self, name: str, seq: int) -> None:
        self._txn.delete(name.encode() + b"\x00" + _SEQ.pack(seq), db=self._dbs["reflog"])

    # locks
    def lock(self, name: str) -> Optional[dict]:
        raw = self._sealed("locks", name.encode(), f"the lock on {name!r}")
        return None if raw is None else encoding.unpack(raw, f"lock on {name!r}")

    def put_lock(self, name: str, holder: dict) -> None:
        check_key(name)
        self._put_sealed("locks", name.encode(), encoding.pack(holder))

    def delete_lock(self, name: str) -> None:
        self._txn.delete(name.encode(), db=self._dbs["locks"])

    def locks(self) -> Iterator[tuple]:
        for key in self.ids("locks"):
            name = key.decode("utf-8", "replace")
            yield name, self.lock(name)

    # meta
    def meta(self, key: str) -> Optional[bytes]:
        return self._txn.get(key.encode(), db=self._dbs["meta"])

    def put_meta(self, key: str, value: bytes) -> None:
        self._txn.put(key.encode(), value, db=self._dbs["meta"])

    # pruned commits
    def pruned(self, oid: bytes) -> Optional[dict]:
        """The note of a commit whose data retention pruned, or None."""
        what = f"pruned note of commit {oid.hex()[:12]}"
        raw = self._sealed("pruned", oid, what)
        return None if raw is None else encoding.unpack(raw, what)

    def put_pruned(self, oid: bytes, note: dict) -> None:
        self._put_sealed("pruned", oid, encoding.pack(note))

    def delete_pruned(self, oid: bytes) -> None:
        self._txn.delete(oid, db=self._dbs["pruned"])


# LMDB allows one environment per file per process, so every Index on the
# same path shares one: {(pid, real path): [environment, databases, users]}.
_OPEN: dict = {}
_OPEN_LOCK = threading.Lock()
_WRITING = threading.local()


def _writing() -> list:
    """The environments this thread is in a write transaction of."""
    if not hasattr(_WRITING, "envs"):
        _WRITING.envs = []
    return _WRITING.envs


def _open_env(path: Path, create: bool) -> tuple:
    key = (os.getpid(), os.path.realpath(path))  # a forked child must not reuse its parent's
    with _OPEN_LOCK:
        entry = _OPEN.get(key)
        if entry is None and any(k[1] == key[1] for k in _OPEN):
            # LMDB forbids using an environment after fork(), and lmdb will
            # not open a second one on the same file in the child either.
            raise MvcError(f"{path} was opened by the parent of this forked process, which cannot "
                           "use it; open the repository only in the child, or start it with 'spawn'")
        if entry is None:
            env, dbs = _new_env(Path(key[1]), create)
            entry = _OPEN[key] = [env, dbs, 0]
        entry[2] += 1
        return key, entry[0], entry[1]


def _new_env(path: Path, create: bool) -> tuple:
    """(environment, databases), read-only where the index folder is not writable."""
    if not create:
        for name in ("data.mdb", "lock.mdb"):
            try:
                check_file(path / name)  # LMDB follows links: refuse them first
            except FileNotFoundError:
                if name == "data.mdb":
                    raise CorruptObject(f"the index at {path} cannot be opened: it has no data.mdb; restore "
                                        ".mvc/index from a backup", kind="index") from None
    readonly = not create and not os.access(path, os.W_OK)
    if not readonly:
        _allocate_lock_file(path)
    size, env = MAP_SIZE, None
    while env is None:
        try:
            env = lmdb.open(str(path), subdir=True, create=create, max_dbs=len(DB_NAMES), map_size=size,
                            readahead=False, meminit=False, readonly=readonly, lock=not readonly)
        except lmdb.MemoryError:
            if size <= MIN_MAP_SIZE:
                raise MvcError(f"the index at {path} cannot be mapped: the process may not use enough "
                               "address space (ulimit -v); raise the limit") from None
            size //= 4  # grown again on demand by a write that needs it (Index._grow)
        except lmdb.Error as exc:
            raise _damaged(path, exc) from None
    try:
        if not readonly:
            env.reader_check()  # slots of readers killed mid-transaction would pin pages for good
        dbs = {n: env.open_db(n.encode(), create=create) for n in DB_NAMES if n not in OPTIONAL_DBS}
        for n in OPTIONAL_DBS:  # an older repository lacks them: made where it may be written
            try:
                dbs[n] = env.open_db(n.encode(), create=False)
            except lmdb.NotFoundError:
                if not readonly:
                    dbs[n] = env.open_db(n.encode(), create=True)
    except lmdb.Error as exc:
        env.close()
        raise _damaged(path, exc) from None
    return env, dbs


def _allocate_lock_file(path: Path) -> None:
    """Give lock.mdb real disk blocks before LMDB maps it.

    LMDB makes lock.mdb with ftruncate (a sparse file) and writes its reader
    table through a memory map: on a full disk that store is a SIGBUS that
    kills the process without a word (``init``, or any command once
    lock.mdb is missing). Allocated here first, a full disk is an OSError.
    """
    try:
        os.mkdir(path)  # LMDB would make it; the lock file goes in it first
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _full(path, "its folder") from None
        return  # LMDB says what is wrong
    try:
        fd = open_file(path / "lock.mdb", os.O_RDWR | os.O_CREAT)
    except (PermissionError, FileNotFoundError):
        return  # another user's repository, opened to read: LMDB decides
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _full(path, "its lock file") from None
        raise
    try:
        os.posix_fallocate(fd, 0, max(os.fstat(fd).st_size, LOCK_FILE_BYTES))
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _full(path, "its lock file") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    finally:
        os.close(fd)


def _full(path: Path, what: str = "") -> OSError:
    """The OSError of a disk too full for the index at ``path`` (``filename`` is the index folder)."""
    free = _free_bytes(path)
    notes = [n for n in (what, f"{free // 1024} KiB free" if free is not None else "") if n]
    return OSError(errno.ENOSPC, f"No space left on device for the index{' (' + '; '.join(notes) + ')' if notes else ''}"
                                 ": nothing was changed; free some space on that disk and try again", str(path))


def _free_bytes(path: Path) -> Optional[int]:
    try:
        st = os.statvfs(path if os.path.isdir(path) else path.parent)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _disk_full(path: Path, exc) -> bool:
    """Whether an LMDB error is a full disk: it says so, or it is an I/O error
    (LMDB's word for a short write) on a disk with next to nothing free."""
    text = str(exc)
    if "No space left" in text or "Disk quota" in text:
        return True
    free = _free_bytes(path)
    return "Input/output error" in text and free is not None and free < FULL_BELOW


def _reader_clash(exc) -> bool:
    """Whether LMDB refused a reader slot because another process holds this pid's:
    its reader table locks a byte of lock.mdb at the pid's offset, and a process of
    another pid namespace with the same pid number holds it (EAGAIN)."""
    return "mdb_txn_begin" in str(exc) and os.strerror(errno.EAGAIN) in str(exc)


def _clash(path: Path) -> Exception:
    return ReaderClash(f"the index at {path} cannot take this process as a reader: another live process "
                       f"has its pid number ({os.getpid()}), which happens when containers with pid "
                       "namespaces of their own share a repository; nothing is damaged",
                       path=str(path), pid=os.getpid())


def _damaged(path: Path, exc) -> Exception:
    if _disk_full(path, exc):
        return _full(path)
    if _reader_clash(exc):
        return _clash(path)
    if isinstance(exc, (lmdb.ReadonlyError,)) or "Permission denied" in str(exc):
        return CorruptObject(f"the index at {path} cannot be opened: {exc}; check the folder's permissions",
                             kind="index")
    return CorruptObject(f"the index at {path} cannot be opened ({exc}): it is damaged or was written by "
                         "another mvc version; restore .mvc/index from a backup (commits and refs live "
                         "there; the packs hold only chunk data)", kind="index")


def _close_env(key: str) -> None:
    with _OPEN_LOCK:
        entry = _OPEN.get(key)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] <= 0:
            del _OPEN[key]
            entry[0].close()


def read_only(mvc_dir) -> ReadOnlyRepository:
    return ReadOnlyRepository("the repository is read-only here (its index folder is not writable); "
                              "nothing was changed", path=mvc_dir)


class Index:
    """The LMDB environment of one repository (shared by every Index on it in a process)."""

    def __init__(self, path: Path, create: bool = False):
        self.path = Path(path)
        self._key, self.env, self.dbs = _open_env(path, create)
        self._closed = False

    @contextmanager
    def read(self) -> Iterator[Txn]:
        """A read transaction: a snapshot at least as new as every write committed before the call."""
        with self._errors():
            txn = self.env.begin(write=False, buffers=False)
            if self._behind(txn):
                txn.abort()
                self._recover()
                txn = self.env.begin(write=False, buffers=False)
            with txn:
                yield Txn(txn, self.dbs, self.path.parent)

    def _behind(self, txn) -> bool:
        """Whether read transaction ``txn`` started before the newest committed write.

        LMDB hands a new reader the transaction id that the last writer published in
        lock.mdb after it wrote its meta page. A writer killed between the two (the meta
        page's synchronous write is a good part of a commit, and a SIGKILL that arrives
        during it ends the process right after it) leaves the commit durable and seen by
        every process that opens the index later (opening runs a write transaction, which
        recovers), but this process's readers would keep the older snapshot until then.
        The meta pages themselves say which write is newest (``info``)."""
        return not self.readonly and txn.id() < self.env.info()["last_txnid"]

    def _recover(self) -> None:
        """Take and release the writer's lock: LMDB recovers the published transaction id
        from the meta pages when the lock's last holder died (or, if a live writer is
        between the two steps, this waits the moment it takes to finish)."""
        if self.env in _writing():
            return  # this thread writes: it holds the lock, and recovered on taking it
        self.env.begin(write=True).abort()

    @property
    def readonly(self) -> bool:
        return self.env.flags().get("readonly", False)

    def writing_here(self) -> bool:
        """Whether this thread is inside a write transaction of this index (a second one
        here would wait on its own lock)."""
        return self.env in _writing()

    @contextmanager
    def write(self) -> Iterator[Txn]:
        """A write transaction: committed (durably) if the block succeeds, else aborted.

        A write that fills the map grows it (up to MAP_SIZE) and runs again,
        so the block must not have effects outside the transaction before
        its last statement; MvcError past MAP_SIZE.
        """
        if self.readonly:
            raise read_only(self.path.parent)
        with self._errors():
            self.env.reader_check()  # a dead reader's slot would pin old pages: clear it first
            with self.env.begin(write=True) as txn:
                writing = _writing()
                writing.append(self.env)
                try:
                    yield Txn(txn, self.dbs, self.path.parent)
                finally:
                    writing.remove(self.env)

    @contextmanager
    def _errors(self):
        try:
            yield
        except lmdb.MapFullError:
            if self._grow():
                raise MvcError("the index filled the space this process may map; it was grown: "
                               "run the command again") from None
            raise MvcError(f"the index reached its {MAP_SIZE >> 30} GiB limit; nothing was changed") from None
        except lmdb.ReadersFullError:
            raise MvcError("too many processes and threads are reading the index at once (126); "
                           "try again when some have finished") from None
        except lmdb.DiskError:
            raise OSError(errno.ENOSPC, "No space left on device for the index; its transaction was "
                                        "rolled back, free some space and try again") from None
        except lmdb.Error as exc:
            if _disk_full(self.path, exc):
                raise _full(self.path, "its transaction was rolled back") from None
            if _reader_clash(exc):
                raise _clash(self.path) from None
            raise CorruptObject(f"the index failed: {exc}", kind="index") from None

    def _grow(self) -> bool:
        """Double the map (after a MapFullError below MAP_SIZE); False if at the limit or refused."""
        size = self.env.info()["map_size"]
        if size >= MAP_SIZE:
            return False
        try:
            self.env.set_mapsize(min(MAP_SIZE, size * 4))
        except lmdb.Error:
            return False
        return True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _close_env(self._key)
