"""The chunk store: the one seam that decides where chunk bytes live.

Vocabulary:

- **chunk**: at most ``chunk_size`` bytes of one tensor; its id is their
  BLAKE3 digest.
- **request**: one chunk to read: its id, the buffer its bytes go into
  (exactly the chunk's length) and ``what``, the words that name it in an
  error ("tensor 'model.w' in commit 1a2b3c4d5e6f").
- **run**: requests whose records lie back to back in one pack, read with
  one system call.

Every reader and writer of chunk bytes in mvc goes through a ``ChunkStore``:
commit writes through ``writer()``, load, diff, export and gc's rewrite read
through ``read()``, fsck and the scheduled scan re-hash through ``check_packs()``
(the one pack checker; ``verify()`` is what it re-reads records with). ``PackStore``, the
local packs indexed in LMDB, is the first implementation; how another one
plugs in is in ``docs/architecture.md``.

Call order of a write (what "finished" means):

1. ``w = store.writer()``; ``w.add(id, data)`` for each chunk the caller
   found ``missing``. Nothing is visible to any reader yet.
2. ``w.seal()``: the bytes are durable (fsynced) but still unreferenced;
   a crash now leaves only garbage that gc reclaims. (A ``writer(durable=False)``
   batch, a remote's cache, skips the fsync: its reader fetches a torn copy again.)
3. ``w.publish(txn)`` inside the caller's index write transaction: the
   chunks become readable exactly when that transaction commits, together
   with the objects that reference them.
``w.abort()`` at any point before ``publish`` drops everything written.

Every byte ``read`` returns has been re-hashed and matched with its id;
a mismatch raises ``HashMismatch`` (``verify.py``) naming ``what``; nothing is ever
returned unverified. A record may hold an encoding of its chunk (byte-grouped
zstd, or a delta against a base chunk: ``codec``); it is decoded, bases
first (at most ``codec.MAX_DEPTH`` deep), and the decoded bytes are what is
hashed, so an encoding can never hand back other bytes than its id names.
"""

import os
import stat
import threading
from collections import Counter
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from .. import hashing
from ..errors import (BadChunkLocation, BadEncoding, ChecksumMismatch, CorruptObject, HashMismatch,
                      ObjectNotFound, PackDamaged, PackMissing)
from . import codec, idarray, packindex
from .verify import BAD_RECORD, CHECKSUM, intact, mismatch, record_fault, verified
from .compact import Compacted, compact
from .fs import entries, fsync_dir, open_file
from .index import RAW_VALUE, TOMBSTONE, read_only
from .packs import (NAME_BYTES, PACK_NAME, RECORD_HEAD, Location, PackReader, PackWriter, decode_location, list_packs,
                    pack_filename, read_locations, read_trailer, read_trailer_table, salvage_records)

THREADS = max(1, min(8, os.cpu_count() or 1))
# Bytes read with one call and then hashed: small enough to still be in the
# CPU cache when hashed (one pass through memory instead of two), large
# enough for the kernel's readahead on a cold pack.
RUN_BYTES = 1 << 20
MAX_RUN = 500  # chunks in one read: each takes two of the kernel's 1024 iovec slots
TASK_BYTES = 16 << 20  # work handed to one thread at a time: amortises the pool's per-task cost
CODED_TASK_BYTES = 4 << 20  # the same for encoded records, counted in decoded bytes

# Kinds of problem ``verify`` and ``check_packs`` report (BAD_RECORD and CHECKSUM: ``verify.record_fault``).
SHORT_PACK, UNREADABLE = "damaged-pack", "missing-pack"
BAD_ENCODING, BROKEN_BASE = "bad-encoding", "broken-delta-base"

# What a checker above the seam may know of a pack's layout: a record takes this many bytes
# of its pack beyond its data (its header), and a pack's file name is ``pack_filename(name)``.
RECORD_OVERHEAD = RECORD_HEAD.size


def pack_named(file_name: str) -> Optional[bytes]:
    """The 16-byte name of the sealed pack whose file is called ``file_name``; None for another file."""
    found = PACK_NAME.fullmatch(file_name)
    return bytes.fromhex(found.group(1)) if found else None


@dataclass
class Request:
    """One chunk to read into ``buffer`` (a writable buffer of its exact length)."""

    id: bytes
    buffer: object
    what: str = ""


@dataclass(frozen=True)
class Problem:
    """A chunk ``verify`` found broken: ``kind`` is one of the kinds above; ``offset``: where
    its record's data lies in its pack (as the caller located it)."""

    kind: str
    id: bytes
    detail: str
    offset: int = 0


@dataclass(frozen=True)
class PackCheck:
    """What ``check_packs`` found in one sealed pack: the Problems of the records it re-read,
    or, where the pack as a whole cannot be read (``kind`` UNREADABLE: missing; SHORT_PACK: its
    header or trailer is damaged), ``error`` and no record checked."""

    pack: str  # its file name
    name: bytes  # its 16-byte name
    records: int  # records re-read and re-hashed
    bytes: int  # their stored bytes
    problems: tuple = ()
    error: str = ""
    kind: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems and not self.error


def batches(items: list, size_of: Callable, limit: int = TASK_BYTES) -> list:
    """``items`` in order, cut into lists of about ``limit`` bytes each."""
    out, current, total = [], [], 0
    for item in items:
        current.append(item)
        total += size_of(item)
        if total >= limit:
            out.append(current)
            current, total = [], 0
    if current:
        out.append(current)
    return out


def runs(jobs: list, limit: int = RUN_BYTES) -> list:
    """(Location, x) jobs cut into runs whose records lie back to back in one pack.

    Jobs keep their order; a run holds at most MAX_RUN chunks and about
    ``limit`` bytes.
    """
    out, size = [], 0
    for job in jobs:
        loc = job[0]
        if out and len(out[-1]) < MAX_RUN and size < limit:
            last = out[-1][-1][0]
            if last.pack == loc.pack and loc.offset == last.offset + last.length + RECORD_HEAD.size:
                out[-1].append(job)
                size += loc.length
                continue
        out.append([job])
        size = loc.length
    return out


class ChunkStore(ABC):
    """Where chunk bytes live: the interface every store implements.

    ``txn`` arguments are index transactions of the repository; a store
    that keeps its own catalogue may ignore them. ``index`` is the
    repository's index, for the calls that write it themselves. A store
    that adds one concern to another (a cache, fault injection in the
    tests) subclasses ``Forwarding``.
    """

    # -- what it holds

    @abstractmethod
    def has(self, cid: bytes, txn) -> bool:
        """Whether this store can read chunk ``cid``."""

    def missing(self, ids: Iterable[bytes], txn) -> set:
        """The ids among ``ids`` this store cannot read."""
        return {cid for cid in ids if not self.has(cid, txn)}

    def remote_only(self, ids: Iterable[bytes], txn) -> set:
        """The ids among ``ids`` this store reads from elsewhere (a remote), not from local packs.

        fsck and gc count these as present though the chunk index lacks them.
        """
        return set()

    def reindex(self, txn, packs: list) -> Optional[tuple]:
        """Index the sealed local packs ``packs`` [(name, path)] in write transaction ``txn`` from
        their trailers, the chunk index having been emptied; where several hold an id, the first
        in ``packs`` wins. (chunks, duplicates); None if this store indexes an entry per chunk
        (the caller then puts them)."""
        return None

    def lost(self, ids: list, txn) -> dict:
        """{id: pack name} of those of ``ids`` that the index lists in a local pack that cannot say
        where (its file is gone, or cut short before the record): fsck reports them as that
        pack's damage. Empty for a store without pack indexes."""
        return {}

    def keeps(self, cid: bytes, txn) -> bool:
        """Whether this store holds chunk ``cid`` itself, not through a remote: what a writer may skip
        writing. A cache's remote is no such proof (its listing may be older than a remote gc)."""
        return self.has(cid, txn)

    def kept(self, ids: list, txn) -> set:
        """Those of ``ids`` this store ``keeps`` (a commit asks once per batch of hashed chunks)."""
        return {cid for cid in ids if self.keeps(cid, txn)}

    @abstractmethod
    def locate(self, cid: bytes, txn, what: str = "") -> Location:
        """Where chunk ``cid``'s record lies: its stored length (``length``) and
        decoded size (``size``) differ for an encoded record. ObjectNotFound
        naming ``what`` if this store cannot read it."""

    def length(self, cid: bytes, txn, what: str = "") -> int:
        """The chunk's decoded length: what a read's buffer must hold."""
        return self.locate(cid, txn, what).size

    def lengths(self, ids: Iterable[bytes], txn) -> dict:
        """{id: decoded length} of those of ``ids`` this store can read (a store that looks ids up
        elsewhere asks for them together)."""
        ids = list(ids)
        absent = self.missing(ids, txn)
        return {cid: self.length(cid, txn) for cid in ids if cid not in absent}

    @abstractmethod
    def records(self, txn) -> Iterator[tuple]:
        """(id, Location) of every record this store holds locally (what compaction may rewrite)."""

    def pack_files(self) -> list:
        """The PackFiles of this store's local packs folder, sealed and ``.tmp``
        (``store/packs.py``), what gc and eviction plan with; none for a store
        without local packs. Nothing outside store/ lists the folder itself."""
        return []

    # -- what its packs hold (nothing outside store/ reads the pack layout itself)

    def pack_records(self, name: bytes) -> np.ndarray:
        """The records local sealed pack ``name`` lists in its trailer (its checksum verified), as
        a ``packs.TRAILER`` array (id, offset, stored length) sorted by offset: what fsck and gc
        plan with. PackMissing if there is no such pack, PackDamaged if it is no intact sealed
        pack (NotRegular if a link or FIFO stands in its place)."""
        raise _no_pack(name)

    def pack_locations(self, name: bytes) -> list:
        """(id, Location) of every record local sealed pack ``name`` lists, by offset; raises
        as ``pack_records``."""
        raise _no_pack(name)

    def salvage(self, name: bytes, limit: int) -> Iterator[tuple]:
        """(id, bytes) of each record of local pack ``name``, whose trailer is damaged, that
        proves itself (hashes, or decodes alone, to its id), read in order from its header;
        ``limit`` bounds a record's length."""
        return iter(())

    def check_packs(self, packs: Iterable[tuple], txn=None, threads: int = THREADS,
                    progress=None) -> Iterator[PackCheck]:
        """Re-read and re-hash local sealed packs' records: one PackCheck per (pack name, records)
        of ``packs``. ``records`` None: every record the pack's trailer lists (a missing pack,
        or one whose header or trailer is damaged, is a PackCheck with ``error``); else
        {id: Location} of the records of that pack to check (fsck's reachable ones, a scan's
        slice). With ``txn``, a delta base not among them is located in the index (a mapping
        may say otherwise through its ``get``). Never raises on damage: the one pack checker
        of fsck and the scheduled scan, derived from ``pack_locations`` and ``verify``."""
        for name, records in packs:
            if records is None:
                try:
                    records = dict(self.pack_locations(name))
                except (CorruptObject, OSError) as exc:
                    kind = UNREADABLE if isinstance(exc, (PackMissing, FileNotFoundError)) else SHORT_PACK
                    yield PackCheck(pack_filename(name), name, 0, 0, error=str(exc), kind=kind)
                    continue
            found = self.verify(records, txn, threads, progress) if records else []
            yield PackCheck(pack_filename(name), name, len(records), sum(loc.length for loc in records.values()),
                            tuple(found))

    # -- writing

    @abstractmethod
    def writer(self) -> "ChunkWriter":
        """A new batch of chunks to add (see the module's call order)."""

    @abstractmethod
    def adopt(self, locations: dict) -> "ChunkWriter":
        """A sealed batch that another writer (a rank's process) wrote and
        reported as {chunk id: (pack name, offset, length)}: each checked to
        be where it says, then published like any batch. BadInput names the
        first that is not (publish nothing then)."""

    @abstractmethod
    def accept_encoded(self) -> None:
        """From now on new batches may hold encoded records (the repository's
        FORMAT lists the encoded-records extension)."""

    # -- reading

    @abstractmethod
    def read(self, requests: list, txn, progress: Optional[Callable[[int], None]] = None,
             threads: int = THREADS) -> None:
        """Fill every request's buffer with its verified bytes, using up to ``threads`` threads.

        ``progress(n)`` is called with the bytes of each finished piece.
        Raises ObjectNotFound (not here), ChecksumMismatch / CorruptObject.
        """

    @abstractmethod
    def read_stored(self, cid: bytes, txn, what: str = "") -> tuple:
        """(Location, the record's stored bytes) of a local record, proven to decode to ``cid``."""

    def read_one(self, cid: bytes, txn, what: str = "") -> bytes:
        buffer = bytearray(self.length(cid, txn, what))
        self.read([Request(cid, buffer, what)], txn)
        return bytes(buffer)

    @abstractmethod
    def verify(self, locations: dict, txn=None, threads: int = THREADS, progress=None) -> list:
        """Re-read and re-hash chunks {id: where the index says they are}; the
        Problems found (never raises on damage)."""

    # -- reclaiming space

    @abstractmethod
    def compact(self, index, rewrite: list, drop: Iterable = (), remove: Iterable = (), via=None) -> "Compacted":
        """Rewrite packs without their garbage (``store/compact.py`` says how).

        ``rewrite``: (pack name, [(id, Location) to keep]) per pack; ``drop``:
        (id, Location) entries to delete from the index; ``remove``: names of
        other files of the store to delete (packs holding nothing live,
        stale ``.tmp`` files). ``via``: the outermost store, through which
        the kept records are read and written (a decorator passes itself,
        so its concern applies to compaction too). Needs the exclusive gc lock.
        """

    def close(self) -> None:
        pass


def _no_pack(name: bytes) -> PackMissing:
    fname = pack_filename(name)
    return PackMissing(f"pack {fname} is missing (this store keeps no local packs)", pack=fname, problem="missing")


class Forwarding(ChunkStore):
    """A store that adds one concern to ``inner``: every call goes to ``inner``
    unless the subclass overrides it (a cache, a fault injector). Calls the ABC
    derives from others (``missing`` from ``has``, ``length`` from ``locate``,
    ``read_one``) stay derived, so a subclass that overrides ``locate``
    changes ``length`` with it."""

    def __init__(self, inner: ChunkStore):
        self.inner = inner

    def has(self, cid, txn):
        return self.inner.has(cid, txn)

    def remote_only(self, ids, txn):
        return self.inner.remote_only(ids, txn)

    def keeps(self, cid, txn):
        return self.inner.keeps(cid, txn)

    def lost(self, ids, txn):
        return self.inner.lost(ids, txn)

    def reindex(self, txn, packs):
        return self.inner.reindex(txn, packs)

    def locate(self, cid, txn, what=""):
        return self.inner.locate(cid, txn, what)

    def records(self, txn):
        return self.inner.records(txn)

    def pack_files(self):
        return self.inner.pack_files()

    def pack_records(self, name):
        return self.inner.pack_records(name)

    def pack_locations(self, name):
        return self.inner.pack_locations(name)

    def salvage(self, name, limit):
        return self.inner.salvage(name, limit)

    def writer(self, durable: bool = True):
        # asked plainly when durable, so a wrapper whose writer() takes no argument still works
        return self.inner.writer(durable) if not durable else self.inner.writer()

    def adopt(self, locations):
        return self.inner.adopt(locations)

    def accept_encoded(self):
        self.inner.accept_encoded()

    def read(self, requests, txn, progress=None, threads=THREADS):
        self.inner.read(requests, txn, progress, threads)

    def read_stored(self, cid, txn, what=""):
        return self.inner.read_stored(cid, txn, what)

    def verify(self, locations, txn=None, threads=THREADS, progress=None):
        return self.inner.verify(locations, txn, threads, progress)

    def compact(self, index, rewrite, drop=(), remove=(), via=None):
        return self.inner.compact(index, rewrite, drop, remove, via or self)

    def close(self):
        self.inner.close()


class ChunkWriter(ABC):
    """A batch of new chunks: ``add`` …, ``seal``, ``publish(txn)``; or ``abort``."""

    @abstractmethod
    def add(self, cid: bytes, data) -> bool:
        """Add a chunk; False if this batch already holds it."""

    def add_many(self, ids: list, data, size: int, rows: list) -> int:
        """Add chunks ``data[r * size:(r + 1) * size]`` (the last row may be shorter, where
        ``data`` ends) for each row r of ``rows``, under ``ids``; the bytes of those added
        (not those the batch already held)."""
        view = memoryview(data).cast("B")
        return sum(len(piece) for cid, piece in ((cid, view[r * size:(r + 1) * size]) for cid, r in zip(ids, rows))
                   if self.add(cid, piece))

    def add_record(self, cid: bytes, payload, kind: int = codec.RAW, size: int = -1, depth: int = 0,
                   base: Optional[bytes] = None) -> bool:
        """Add a record whose stored bytes are ``payload``: the chunk itself
        (RAW) or an encoding of it (``codec``) that decodes to ``size``
        bytes, which the caller has proven. False if the batch holds it."""
        if kind != codec.RAW:
            raise TypeError(f"{type(self).__name__} takes only raw records")
        return self.add(cid, payload)

    @abstractmethod
    def seal(self) -> None:
        """Make the batch durable (still invisible to readers)."""

    def register(self, txn) -> bool:
        """Register the sealed batch's pack index in ``txn`` and nothing more (the caller sets each
        chunk's entry itself, as compaction and repack do); False if it has none."""
        return False

    @abstractmethod
    def publish(self, txn) -> None:
        """Index the batch in ``txn``: visible when it commits."""

    @abstractmethod
    def abort(self) -> None:
        """Drop everything written (before ``publish``)."""

    @property
    @abstractmethod
    def count(self) -> int:
        """Chunks in the batch."""

    @property
    def locations(self) -> dict:
        """{id: Location} of the batch's chunks, once sealed."""
        return {}


def _where(loc: Location) -> str:
    return f"offset {loc.offset} in {pack_filename(loc.pack)}"


def _named(cid: bytes, what: str) -> str:
    return f"chunk {cid.hex()[:12]}" + (f" of {what}" if what else "")


def _undecodable(cid: bytes, what: str, failed: bytes, where: str, why) -> BadEncoding:
    """The error for chunk ``cid`` whose chain did not decode: ``failed`` is the record at fault
    (``cid`` itself or one of its delta bases), lying at ``where``."""
    if failed == cid:
        return BadEncoding(f"{_named(cid, what)} cannot be decoded ({why})", id=cid, where=where)
    return BadEncoding(f"{_named(cid, what)} cannot be decoded: the record of its delta base "
                       f"{failed.hex()[:12]} at {where} does not decode ({why})", id=cid, base=failed, where=where)


class _Bases:
    """The decoded, verified bytes of delta bases that several records of one read need
    (``shared``): each is decoded once per read, not once per record above it. Kept until the
    read ends, so a read holds at most one chunk per shared base on top of its buffers."""

    def __init__(self, store: "PackStore", shared: set):
        self.store, self.shared, self.held, self.lock = store, shared, {}, threading.Lock()

    def get(self, cid: bytes, loc: Location, chain: list):
        """Base ``cid``'s bytes (its own bases in ``chain``), or None if only one record needs it."""
        if cid not in self.shared:
            return None
        with self.lock:
            held = self.held.get(cid)
        if held is None:  # two threads may both decode it; either copy is verified
            held = bytearray(loc.size)
            self.store.decode(cid, loc, chain, held, "a shared delta base", bases=self)
            with self.lock:
                held = self.held.setdefault(cid, held)
        return held


class PackStore(ChunkStore):
    """Chunks in the local ``packs/`` folder, located through the index's chunk table.

    ``pack_indexes``: called once before the first pack index is written (it lists the
    ``pack-indexes`` extension in FORMAT); given, every durable batch writes its pack's index
    and registers the pack instead of putting an index entry per chunk. None: entries per
    chunk, as repositories older than pack indexes have them."""

    def __init__(self, directory: Path, pack_version: int = 1, readonly: bool = False,
                 pack_indexes: Optional[Callable[[], None]] = None):
        self.directory = Path(directory)
        self.pack_indexes = pack_indexes
        self.readonly = readonly  # the repository may only be read here: writer() refuses at once
        self.packs = PackReader(self.directory)
        self._scratch = threading.local()
        # 2 once the repository's FORMAT lists the encoded-records extension:
        # then every new pack is a version 2 pack, able to hold encoded records.
        self.pack_version = pack_version

    # -- writing -------------------------------------------------------------

    def has(self, cid: bytes, txn) -> bool:
        return txn.chunk(cid) is not None

    def keeps(self, cid: bytes, txn) -> bool:
        """Whether the index locates ``cid`` in a pack that is on disk (and every base of its
        delta chain too). An entry naming a pack that is gone (deleted by an mvc whose repack
        left entries behind, or by hand) is no reason to skip writing the bytes: the commit would
        name a chunk nobody holds."""
        return on_disk(txn, self.directory, txn.chunk(cid))

    def kept(self, ids: list, txn) -> set:
        return {cid for cid, loc in txn.chunks_among(ids).items() if on_disk(txn, self.directory, loc)}

    def records(self, txn) -> Iterator[tuple]:
        return txn.chunks()

    def pack_files(self) -> list:
        return list_packs(self.directory)

    def _pack_path(self, name: bytes) -> Path:
        """The path of sealed pack ``name``; PackMissing if it is not there."""
        path = self.directory / pack_filename(name)
        if not os.path.lexists(path):
            raise PackMissing(f"pack {path.name} is missing", pack=path.name, problem="missing")
        return path

    def pack_records(self, name: bytes) -> np.ndarray:
        table = read_trailer_table(self._pack_path(name))
        return table[np.argsort(table["offset"], kind="stable")]

    def pack_locations(self, name: bytes) -> list:
        return sorted(read_locations(self._pack_path(name), name), key=lambda item: item[1].offset)

    def salvage(self, name: bytes, limit: int) -> Iterator[tuple]:
        return salvage_records(self._pack_path(name), limit)

    def writer(self, durable: bool = True) -> "PackBatch":
        """``durable`` False: a batch of copies of bytes safe elsewhere (a remote's cache), not fsynced."""
        if self.readonly:
            raise read_only(self.directory.parent)
        return PackBatch(self.directory, self.pack_version, durable, self._listed if durable else None)

    def _listed(self) -> None:
        """Say the repository has pack indexes (once per store) before the first is written."""
        if self.pack_indexes is not None:
            self.pack_indexes()
            self.pack_indexes = _done

    def accept_encoded(self) -> None:
        self.pack_version = 2

    def compact(self, index, rewrite: list, drop: Iterable = (), remove: Iterable = (), via=None) -> Compacted:
        return compact(self, index, rewrite, drop, remove, via or self)

    # -- reading -------------------------------------------------------------

    def adopt(self, locations: dict) -> "ChunkWriter":
        by_pack: dict = {}
        for cid, where in locations.items():
            if not (type(cid) is bytes and len(cid) == hashing.DIGEST_SIZE and type(where) in (list, tuple) and len(where) == 3
                    and type(where[0]) is bytes and len(where[0]) == NAME_BYTES
                    and all(type(x) is int and x >= 0 for x in where[1:])):
                raise BadChunkLocation(f"a rank reported a malformed chunk location for {cid!r:.40}", problem="malformed")
            by_pack.setdefault(where[0], {})[cid] = Location(*where)
        present = {name for name, regular in entries(self.directory) if regular and PACK_NAME.fullmatch(name)}
        out = {}
        for name, locs in by_pack.items():
            fname = pack_filename(name)
            if fname not in present:
                raise BadChunkLocation(f"pack {fname} that a rank wrote is not in {self.directory} (not sealed, or "
                                       "gc removed it while the save ran longer than gc's grace period); nothing "
                                       "was committed, save again", pack=fname, problem="missing-pack")
            try:
                listed = {(cid, off, n) for cid, off, n in read_trailer(self.directory / fname)}
            except (CorruptObject, OSError) as exc:
                raise BadChunkLocation(f"pack {fname} that a rank wrote cannot be read: {exc}; nothing was committed",
                                       pack=fname, problem="unreadable") from None
            for cid, loc in locs.items():
                if (cid, loc.offset, loc.length) not in listed:
                    raise BadChunkLocation(f"pack {fname} does not hold chunk {cid.hex()[:12]} where its rank said; "
                                           "nothing was committed", pack=fname, id=cid, problem="not-listed")
                out[cid] = loc
        return _Adopted(self.directory, out, self._listed if self.pack_indexes is not None else None)

    def locate(self, cid: bytes, txn, what: str = "") -> Location:
        loc = txn.chunk(cid)
        if loc is None:
            raise ObjectNotFound(f"{_named(cid, what)} is missing from the index", id=cid)
        if loc.offset == 0:  # listed by the index of a registered pack that cannot say where
            fname = pack_filename(loc.pack)
            try:
                os.close(open_file(self.directory / fname))  # NotRegular for a link or FIFO in its place
            except FileNotFoundError:
                raise PackMissing(f"pack {fname} is missing", pack=fname, problem="missing") from None
            raise PackDamaged(f"pack {fname} is truncated or damaged before the record of {_named(cid, what)}",
                              pack=fname, problem="truncated")
        return loc

    def reindex(self, txn, packs: list) -> Optional[tuple]:
        """Write each pack's index from its trailer (fsynced) and register it, the first pack of
        ``packs`` last (the newest registration wins where several packs hold an id)."""
        if self.pack_indexes is None:
            return None
        self._listed()
        seen = []
        for name, path in reversed(packs):
            ids = read_trailer_table(path)["id"].astype(idarray.ID)
            packindex.write(packindex.pidx_path(self.directory, name), [name], [ids])
            txn.register_pack(name, len(ids))
            seen.append(ids)
        fsync_dir(self.directory)
        every = np.concatenate(seen) if seen else np.zeros(0, dtype=idarray.ID)
        unique = len(idarray.unique(every)[0]) if len(every) else 0
        return unique, len(every) - unique

    def lost(self, ids: list, txn) -> dict:
        """{id: pack name} of those of ``ids`` that the index of a registered pack lists where that
        pack cannot say (its file is gone, or cut short before the record): offset 0."""
        out = {cid: loc.pack for cid, loc in txn.chunks_among(ids).items() if loc.offset == 0}
        # a registered pack whose index went with it (the folder lost): what nothing locates is
        # taken as the newest such pack's, so fsck says a pack is gone, not only its chunks
        gone = [name for name in txn.unreadable_packs() if not on_disk(txn, self.directory, Location(name, 0, 0))]
        if gone:
            out.update({cid: gone[0] for cid in ids if cid not in out and txn.chunk(cid) is None})
        return out

    def length(self, cid: bytes, txn, what: str = "") -> int:
        return self.locate(cid, txn, what).size  # decoded: what the caller's buffer must hold

    def read(self, requests: list, txn, progress=None, threads: int = THREADS) -> None:
        jobs, dense, coded = [], [], []
        first, copies = {}, []  # a chunk asked for twice (equal tensors) is read and decoded once
        for req in requests:
            loc = self.locate(req.id, txn, req.what)
            if loc.size != memoryview(req.buffer).nbytes:
                raise CorruptObject(f"{_named(req.id, req.what)} has the wrong length in the index", id=req.id)
            if req.id in first:
                copies.append((first[req.id], req))
                continue
            first[req.id] = req
            if loc.base is not None:  # each alone, with its chain of bases looked up here, in the transaction's thread
                coded.append([(loc, req, self.chain(req.id, loc, txn, req.what))])
            elif loc.coded:
                dense.append((loc, req))
            else:
                jobs.append((loc, req))
        pieces, packed = runs(jobs), runs(dense)
        # Cold packs: start the kernel reading every run now, so the reads
        # below find it in the cache instead of waiting for the disk in turn.
        self.packs.prefetch([[job[0] for job in run] for run in pieces + packed])

        uses = Counter(base for (_, _, chain), in coded for base, _ in chain)
        bases = _Bases(self, {base for base, n in uses.items() if n > 1})

        def work(task):
            for run in task:
                if len(run[0]) == 3:
                    self._read_coded(*run[0], bases)
                elif run[0][0].coded:
                    self._read_packed(run)
                else:
                    self._read_run(run)
            return sum(job[0].size for run in task for job in run)
        # Decoding costs several times the CPU per byte of hashing: smaller
        # tasks, so that every thread has work until the end of a read.
        tasks = batches(pieces, lambda run: sum(job[0].size for job in run)) + \
            batches(packed + coded, lambda run: sum(job[0].size for job in run), CODED_TASK_BYTES)
        if len(tasks) <= 1 or threads <= 1:
            for task in tasks:
                n = work(task)
                if progress:
                    progress(n)
        else:
            with ThreadPoolExecutor(min(threads, len(tasks))) as pool:
                for n in pool.map(work, tasks):
                    if progress:
                        progress(n)
        for source, req in copies:  # verified bytes, copied
            memoryview(req.buffer).cast("B")[:] = memoryview(source.buffer).cast("B")
        if copies and progress:
            progress(sum(memoryview(req.buffer).nbytes for _, req in copies))

    def chain(self, cid: bytes, loc: Location, txn, what: str = "") -> list:
        """[(id, Location)] of a record's bases, nearest first (empty unless a delta)."""
        out, seen = [], {cid}
        while loc.base is not None:
            if len(out) >= codec.MAX_DEPTH or loc.base in seen:
                raise CorruptObject(f"{_named(cid, what)} has a chain of deltas deeper than "
                                    f"{codec.MAX_DEPTH} or one that loops", id=cid)
            base = loc.base
            seen.add(base)
            loc = self.locate(base, txn, f"the delta base of {_named(cid, what)}")
            out.append((base, loc))
        return out

    def decode(self, cid: bytes, loc: Location, chain: list, out, what: str = "", payload=None,
               bases: "Optional[_Bases]" = None) -> None:
        """Decode the record at ``loc`` (its stored bytes ``payload`` if already
        read; bases from ``chain``) into ``out``, verified against ``cid``;
        HashMismatch / CorruptObject naming ``what``. ``bases``: decoded bases
        this read shares between records; the chain starts from the nearest."""
        start, deltas = None, chain
        if bases is not None:
            for k, (base, base_loc) in enumerate(chain):
                try:
                    start = bases.get(base, base_loc, chain[k + 1:])
                except HashMismatch:  # named as without the cache: by this record, and its damaged base
                    raise mismatch(cid, what, _where(loc), base) from None
                except BadEncoding as exc:  # likewise: the record that failed is named, not this one
                    raise _undecodable(cid, what, bytes.fromhex(exc.base) if exc.base else base, exc.where,
                                       exc) from None
                if start is not None:
                    deltas = chain[:k]
                    break
        # the deepest base first: it decodes alone into ``out``, each delta above it is XORed in there
        ids = [base for base, _ in reversed(deltas)] + [cid]
        places = [base_loc for _, base_loc in reversed(deltas)] + [loc]
        links, at = [], 0
        try:
            for at, place in enumerate(places):
                data = payload if place is loc and payload is not None else self.packs.read(place)
                if place.size != loc.size:
                    raise CorruptObject("a delta record's base has another length")
                if place.kind == codec.DELTA and codec.delta_base(data) != place.base:
                    raise CorruptObject("the delta record names another base than the index")
                links.append((place.kind, data))
            codec.decode_chain(links, loc.size, out, start)
        except CorruptObject as exc:
            at = exc.link if isinstance(exc, BadEncoding) else at
            raise _undecodable(cid, what, ids[at], _where(places[at]), exc) from None
        if not intact(cid, out):
            broken = [b for b, _ in chain if not self._intact(b, chain)]
            raise mismatch(cid, what, _where(loc), broken[0] if broken else None)

    def _intact(self, base_id: bytes, chain: list) -> bool:
        at = [i for i, (b, _) in enumerate(chain) if b == base_id][0]
        try:
            out = bytearray(chain[at][1].size)
            self.decode(base_id, chain[at][1], chain[at + 1:], out)
            return True
        except (CorruptObject, ChecksumMismatch):
            return False

    def _read_coded(self, loc: Location, req: Request, chain: list, bases: "Optional[_Bases]" = None) -> None:
        self.decode(req.id, loc, chain, req.buffer, req.what, bases=bases)

    def _read_packed(self, run: list) -> None:
        # Encoded records that decode alone, back to back in one pack: one
        # read into this thread's scratch buffer, then each record decoded
        # straight into its request's buffer (the caller's tensor) and hashed
        # there while still in the CPU cache.
        payloads = self._buffers(run)
        self.packs.read_run([loc for loc, _ in run], payloads)
        for (loc, req), payload in zip(run, payloads):
            self.decode(req.id, loc, [], req.buffer, req.what, payload)

    def read_stored(self, cid: bytes, txn, what: str = "") -> tuple:
        """(Location, the record's stored bytes) of chunk ``cid``, proven to decode to it."""
        loc = self.locate(cid, txn, what)
        if not loc.coded:
            data = bytearray(loc.length)
            self.read([Request(cid, data, what)], txn)
            return loc, bytes(data)
        payload = self.packs.read(loc)
        self.decode(cid, loc, self.chain(cid, loc, txn, what), bytearray(loc.size), what, payload)
        return loc, payload

    def _read_run(self, run: list) -> None:
        # Record headers matter only to rebuilding the index (verify checks
        # them); the bytes themselves prove themselves against their id.
        self.packs.read_run([loc for loc, _ in run], [req.buffer for _, req in run])
        for loc, req in run:
            verified(req.id, req.buffer, req.what, _where(loc))

    # -- checking ------------------------------------------------------------

    def verify(self, locations: dict, txn=None, threads: int = THREADS, progress=None) -> list:
        """Re-read and re-hash chunks {id: Location}, headers included; the Problems found.

        Reads go through the same runs as ``read``, into a scratch buffer per thread. With
        ``txn``, a delta base not among ``locations`` is located in the index.
        """
        jobs = sorted(((loc, cid) for cid, loc in locations.items()), key=lambda j: (j[0].pack, j[0].offset))
        pieces = runs([job for job in jobs if not job[0].coded]) + [[job] for job in jobs if job[0].coded]

        def work(task):
            found = []
            for run in task:
                found += self._verify_coded(*run[0], locations, txn) if run[0][0].coded else self._verify_run(run)
            return found, sum(loc.length for run in task for loc, _ in run)
        problems = []
        tasks = batches(pieces, lambda run: sum(loc.length for loc, _ in run))
        with ThreadPoolExecutor(max(1, min(threads, len(tasks) or 1))) as pool:
            for found, n in pool.map(work, tasks):
                problems += found
                if progress:
                    progress(n)
        return problems

    def _buffers(self, run: list) -> list:
        size = sum(loc.length for loc, _ in run)
        buf = getattr(self._scratch, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._scratch.buf = bytearray(max(size, RUN_BYTES + (256 << 10)))
        view, out, at = memoryview(buf), [], 0
        for loc, _ in run:
            out.append(view[at:at + loc.length])
            at += loc.length
        return out

    def _verify_run(self, run: list) -> list:
        buffers = self._buffers(run)
        first = run[0][0]
        try:
            heads = self.packs.read_run([loc for loc, _ in run], buffers)
        except CorruptObject as exc:
            if len(run) > 1:  # find which records are short, one by one
                return [p for job in run for p in self._verify_run([job])]
            kind = UNREADABLE if isinstance(exc, PackMissing) else SHORT_PACK
            return [Problem(kind, run[0][1], f"pack {pack_filename(first.pack)} ends before offset {first.offset}"
                            if kind == SHORT_PACK else str(exc), first.offset)]
        problems = []
        for (loc, cid), head, buffer in zip(run, heads, buffers):
            fault = record_fault(cid, loc.length, head, buffer)
            where = f"offset {loc.offset} in {pack_filename(loc.pack)}"
            if fault == BAD_RECORD:
                problems.append(Problem(BAD_RECORD, cid, f"the record header before {where} does not name "
                                        "this chunk and length", loc.offset))
            elif fault == CHECKSUM:
                problems.append(Problem(CHECKSUM, cid, f"its {loc.length} bytes at {where} do not hash to its "
                                        "id (BLAKE3 mismatch)", loc.offset))
        return problems

    def _verify_coded(self, loc: Location, cid: bytes, locations: dict, txn=None) -> list:
        """The Problems of one encoded record: its header, its bases, its decoded bytes. A base
        not among ``locations`` is looked up in the index (``txn``), where one is given: a
        scan verifies a slice of the packs, and a delta's base may lie outside it."""
        buffer = bytearray(loc.length)
        where = f"offset {loc.offset} in {pack_filename(loc.pack)}"
        try:
            (head,) = self.packs.read_run([loc], [buffer])
        except CorruptObject as exc:
            kind = UNREADABLE if isinstance(exc, PackMissing) else SHORT_PACK
            return [Problem(kind, cid, str(exc), loc.offset)]
        if RECORD_HEAD.unpack(head) != (cid, loc.length):
            return [Problem(BAD_RECORD, cid, f"the record header before {where} does not name this chunk and length",
                            loc.offset)]
        chain, at = [], loc
        while at.base is not None:
            base = locations.get(at.base)
            if base is None and txn is not None:
                try:
                    base = txn.chunk(at.base)
                except CorruptObject:
                    base = None
            if base is None or len(chain) >= codec.MAX_DEPTH or at.base == cid:
                return [Problem(BROKEN_BASE, cid, f"its delta base {at.base.hex()[:12]} cannot be read "
                                "(missing, or the chain is too deep or loops)", loc.offset)]
            chain.append((at.base, base))
            at = base
        try:
            self.decode(cid, loc, chain, bytearray(loc.size), payload=bytes(buffer))
        except HashMismatch as exc:
            broken = exc.base is not None
            return [Problem(BROKEN_BASE if broken else CHECKSUM, cid, f"the record at {where} does not decode to "
                            f"its id ({'a delta base is damaged' if broken else 'BLAKE3 mismatch'})", loc.offset)]
        except BadEncoding as exc:
            if exc.base is not None:  # the base's own record is at fault: it is reported as itself
                return [Problem(BROKEN_BASE, cid, f"the record at {where} is a delta on {exc.base[:12]}, whose "
                                f"record at {exc.where} does not decode", loc.offset)]
            return [Problem(BAD_ENCODING, cid, f"the record at {where} cannot be decoded: {exc}", loc.offset)]
        except CorruptObject as exc:
            return [Problem(BAD_ENCODING, cid, f"the record at {where} cannot be decoded: {exc}", loc.offset)]
        return []

    def close(self) -> None:
        self.packs.close()
        packindex.forget(self.directory)


def on_disk(txn, directory: Path, loc: Optional[Location]) -> bool:
    """Whether the record at ``loc`` lies in a pack file of ``directory``, and so do the records
    of its delta chain (looked up in ``txn``). Each pack file is looked at once per transaction."""
    known = txn.memo.setdefault("packs on disk", {})
    for _ in range(codec.MAX_DEPTH + 1):
        if loc is None:
            return False
        if loc.pack not in known:
            try:
                known[loc.pack] = stat.S_ISREG(os.lstat(directory / pack_filename(loc.pack)).st_mode)
            except OSError:
                known[loc.pack] = False
        if not known[loc.pack]:
            return False
        if loc.base is None:
            return True
        loc = txn.chunk(loc.base)
    return False  # a chain deeper than any record may have: it does not decode


def publish(txn, directory: Path, located: dict) -> None:
    """Index {id: Location} of new records in the packs folder ``directory``. An id already
    indexed keeps its first copy, unless that copy (or its delta chain) lies in a pack that is
    gone: then the new one replaces it (``PackStore.keeps`` had the writer write it for that)."""
    for cid, loc in located.items():
        if not txn.put_chunk(cid, loc) and not on_disk(txn, directory, txn.chunk(cid)):
            txn.put_chunk(cid, loc, overwrite=True)


def _publish_raw(txn, directory: Path, writer: PackWriter) -> None:
    """``publish`` for a pack of raw records only, its index values built as one array and
    put in one loop: a commit of millions of small chunks spends no Location per chunk."""
    ids = writer.ids
    values = np.empty(len(ids), dtype=RAW_VALUE)
    values["pack"], values["offset"], values["length"] = writer.name, writer.offsets, writer.lengths
    blob, width = values.tobytes(), RAW_VALUE.itemsize
    for row in txn.put_new_chunks(ids, [blob[i:i + width] for i in range(0, len(blob), width)]):
        if not on_disk(txn, directory, txn.chunk(ids[row])):
            txn.put_chunk(ids[row], writer.location(row), overwrite=True)


def _done() -> None:
    pass


def _register(txn, directory: Path, writer: PackWriter) -> None:
    """Register the pack ``writer`` sealed (its pack index written): its chunks are indexed when
    ``txn`` commits. A chunks-table entry of one of its ids stays where it names a copy on disk
    (the first copy wins, as with entries per chunk); a tombstone, or an entry naming a pack that
    is gone, goes, so that this pack's copy is the one indexed."""
    _register_ids(txn, directory, writer.name, writer.ids)


def _register_ids(txn, directory: Path, name: bytes, ids: list) -> None:
    """``_register`` of pack ``name`` whose trailer lists ``ids``."""
    shadow = txn.table_among(ids)
    txn.register_pack(name, len(ids))
    for cid, raw in shadow.items():
        if raw != TOMBSTONE:
            try:
                if on_disk(txn, directory, decode_location(raw)):
                    continue
            except CorruptObject:
                pass
        txn.drop_entry(cid)


class PackBatch(ChunkWriter):
    """New chunks appended to one new pack of this process.

    ``indexed``: called before the pack's index is written at ``seal`` (None: no pack index;
    ``publish`` puts an index entry per chunk)."""

    def __init__(self, directory: Path, version: int = 1, durable: bool = True,
                 indexed: Optional[Callable[[], None]] = None):
        self.directory = directory
        self.version = version
        self.durable = durable  # False: not fsynced (``PackWriter``)
        self.indexed = indexed
        self._pidx = False  # its pack index is written
        self._writer: Optional[PackWriter] = None
        self._rows: dict = {}  # id -> its row in the writer
        self.bytes = 0

    def add(self, cid: bytes, data) -> bool:
        if cid in self._rows:
            return False
        if self._writer is None:
            self._writer = PackWriter(self.directory, self.version, self.durable)
        self._rows[cid] = len(self._writer.ids)
        self._writer.append(cid, data)
        self.bytes += self._writer.lengths[-1]
        return True

    def add_many(self, ids: list, data, size: int, rows: list) -> int:
        if not ids:
            return 0
        if self._writer is None:
            self._writer = PackWriter(self.directory, self.version, self.durable)
        known, fresh, where = self._rows, [], []
        row = len(self._writer.ids)
        for cid, r in zip(ids, rows):
            if cid not in known:
                known[cid] = row
                row += 1
                fresh.append(cid)
                where.append(r)
        before = self._writer.offset
        self._writer.append_rows(fresh, data, size, where)
        added = self._writer.offset - before - RECORD_HEAD.size * len(fresh)
        self.bytes += added
        return added

    def add_record(self, cid: bytes, payload, kind: int = codec.RAW, size: int = -1, depth: int = 0,
                   base: Optional[bytes] = None) -> bool:
        """Add a record whose stored bytes are ``payload``: the chunk itself
        (RAW) or an encoding of it (``codec``) that decodes to ``size`` bytes.
        The caller has proven the encoding decodes to ``cid``. False if this
        batch already holds the chunk."""
        if kind == codec.RAW:
            return self.add(cid, payload)
        if cid in self._rows:
            return False
        if self._writer is None:
            self._writer = PackWriter(self.directory, self.version, self.durable)
        row = len(self._writer.ids)
        self._writer.add(cid, payload, kind, size, depth, base)
        self._rows[cid] = row
        self.bytes += self._writer.lengths[-1]
        return True

    def seal(self) -> None:
        if self._writer is not None:
            self._writer.seal()
            if self.indexed is not None:
                self.indexed()
                self.write_index()

    def write_index(self) -> None:
        """Write (and fsync) the sealed pack's index, ``pack-<name>.pidx`` beside it."""
        w = self._writer
        packindex.write(packindex.pidx_path(self.directory, w.name), [w.name], [idarray.pack(w.ids)])
        fsync_dir(self.directory)
        self._pidx = True

    def register(self, txn) -> bool:
        """Register the sealed pack's index in ``txn`` with no more (compaction sets each of its
        chunks' entries itself); False if it has none."""
        if not self._pidx:
            return False
        txn.register_pack(self._writer.name, len(self._writer.ids))
        return True

    def publish(self, txn) -> None:
        if self._writer is None:
            return
        if self._pidx:
            _register(txn, self.directory, self._writer)
        elif self._writer.coding:
            publish(txn, self.directory, self.locations)
        else:
            _publish_raw(txn, self.directory, self._writer)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()

    @property
    def count(self) -> int:
        return len(self._rows)

    @property
    def locations(self) -> dict:
        if self._writer is None:
            return {}
        return {cid: self._writer.location(row) for cid, row in self._rows.items()}


class _Adopted(ChunkWriter):
    """Chunks another process wrote into sealed packs, checked by ``PackStore.adopt``.

    ``indexed``: called before the first pack index is written (None: no pack indexes; an index
    entry per chunk, as a repository older than them keeps). With it, each adopted pack gets its
    pack index from its trailer and is registered, as a commit's own pack is: a sharded save of
    millions of chunks per rank puts no entry per chunk."""

    def __init__(self, directory: Path, located: dict, indexed: Optional[Callable[[], None]] = None):
        self._directory, self._located, self._indexed = directory, located, indexed

    def add(self, cid: bytes, data) -> bool:
        raise TypeError("an adopted batch is sealed: it takes no chunks")

    def seal(self) -> None:
        pass

    def publish(self, txn) -> None:
        if self._indexed is None:
            publish(txn, self._directory, self._located)
            return
        self._indexed()
        registered = {name for _, name, _ in txn.registered_packs()}
        for name in sorted({loc.pack for loc in self._located.values()} - registered):
            ids = read_trailer_table(self._directory / pack_filename(name))["id"].astype(idarray.ID)
            packindex.write(packindex.pidx_path(self._directory, name), [name], [ids])
            fsync_dir(self._directory)  # durable before the transaction that registers it commits
            _register_ids(txn, self._directory, name, idarray.ids(ids))

    def abort(self) -> None:
        pass  # the packs are the ranks'; unreferenced, gc reclaims them

    @property
    def count(self) -> int:
        return len(self._located)
