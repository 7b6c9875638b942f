"""The catalogue: what one remote holds and where, as this repository last saw it.

Built from the trailers of the remote's packs (each read once: packs are
immutable), kept at ``.mvc/remotes/NAME/``: chunk locations, chunk id ->
(remote pack name, data offset, length), in sorted table files
(``mvc.remote.tables``, 48 bytes an entry, under ``tables/``); the rest in an
LMDB environment of its own (an ``mvc.store.index.Index``), whose ``meta``
holds ``tables`` -> [generation, the table names, newest first], ``in:KEY``
-> the table holding chunk pack KEY's entries (its **home**: an entry of
another table naming it is stale), ``pack:KEY`` -> the ids object pack KEY
lists, ``used:PACK`` -> when this repository last read local pack PACK (LRU
eviction), and whose ``tensors`` database maps object id -> its location in
an object pack. A catalogue from before the tables (chunk entries in LMDB) is
converted when first opened: its chunk packs become unread (below), so they
are read again as lookups need them.

A lazy clone lists the chunk packs without reading their trailers
(``refresh(bucket, trailers=False)``): such a pack is **unread**
(``unread:KEY`` -> its listing stamp). Every chunk lookup is still complete
against the listing: one that misses reads unread trailers (a batch at a
time, in threads) until it finds its ids or none is left unread, so an id is
called absent only once every listed pack's trailer was read. So a load
reads the trailers it needs (and, at worst, all of them), never more than a
refresh would. Where hints (``mvc.remote.where``: which packs hold a
tensor's chunks, written by the push) choose the trailers read first:
``near(ids)`` (set by the cache) names the packs the hints of the tensors
holding ``ids`` give, and those are read before the newest-first search,
which reads on only for ids they did not list. ``where:KEY`` caches object
pack KEY's hint (empty: it has none). A push or a rank's upload from a lazy
clone does not prove a chunk absent (that reads every trailer): it reads the
trailers the hints of what it sends and of their predecessors name
(``read_named``, ``hinted_packs``) and sends again a chunk none read lists
(``mvc.remote.sync._held``), so the remote may list an id in several packs;
a lookup takes the newest table's entry. An unread pack listed again with
another size or stamp, or whose trailer does not read when it is needed, is
**damaged**
(``damaged:KEY`` -> its stamp): packs are written whole and never modified.

It is derived data: deleting the folder loses nothing; the next command
that needs it lists the remote and reads the trailers again; a table file
found missing or damaged is dropped and its packs marked unread. ``refresh``
also forgets packs that are no longer listed (deleted on the remote), so
nothing is evicted locally on the strength of a copy that is gone.
"""

import os
import shutil
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from .. import encoding
from ..errors import CorruptObject
from ..store import fs, idarray
from ..store.index import Index
from ..store.packs import Location
from . import layout, tables, where
from .bucket import NotFound, RemoteError

TAIL_BYTES = 64 << 10  # read from a pack's end first: footer and (usually) the whole trailer
THREADS = 8
MIN_PACK_BYTES = len(layout.HEADER) + 4 + layout.FOOTER.size  # header, an empty trailer, the footer
_LOC = struct.Struct("<16sQI")
OBJECTS_DB = "tensors"  # this environment's object table: id -> location in an object pack
LOST = "lost:"  # meta key prefix: chunk id (hex) -> b"", see Catalogue.lost
TABLES = "tables"  # meta: [generation, [table names, newest first]]
HOME = "in:"  # meta key prefix: chunk pack key -> the name of the table holding its entries
FORMAT = "format"  # meta: b"2" once chunk locations are in tables (a catalogue from before is converted)
FLUSH = 1 << 20  # entries of trailers read that one table holds at most (about 150 MiB while written)


def folder(repo_dir: Path, name: str) -> Path:
    return Path(repo_dir) / "remotes" / name


def forget(repo_dir: Path, name: str) -> None:
    """Delete a remote's catalogue (it is rebuilt on demand)."""
    shutil.rmtree(folder(repo_dir, name), ignore_errors=True)


class _View:
    """The tables as one generation of the listing names them, mapped: ``homed[t]``, a flag per
    pack table t lists, says the table is that pack's home; ``live`` is ``homed`` less the packs
    a command avoids."""

    def __init__(self, gen: int, got: list, homes: dict, avoid: frozenset, reuse: Optional[dict] = None):
        self.gen, self.tables, self.homes, self.avoid = gen, got, homes, avoid
        reuse = reuse or {}
        self.homed, self.live = [], []
        for t in got:
            homed, live = reuse.get(t.name) or _flags(t, homes, avoid)
            self.homed.append(homed)
            self.live.append(live)

    def then(self, gen: int, got: list, changes: dict) -> "_View":
        """The view of generation ``gen``, this one's writer having listed tables ``got`` and
        moved the packs ``changes`` ({pack name: new home, None: none}): flags are computed
        again only for the tables that gained or lost a home (a view costs the packs it lists,
        and a push adds a table a pack)."""
        homes, touched = dict(self.homes), set()
        for name, home in changes.items():
            touched |= {homes.get(name), home}
            if home is None:
                homes.pop(name, None)
            else:
                homes[name] = home
        reuse = {t.name: (h, v) for t, h, v in zip(self.tables, self.homed, self.live) if t.name not in touched}
        return _View(gen, got, homes, self.avoid, reuse)


def _flags(table, homes: dict, avoid: frozenset) -> tuple:
    """(homed, live) flags of ``table``'s packs."""
    homed = np.array([homes.get(n) == table.name for n in table.names], dtype=bool)
    if not avoid:
        return homed, homed
    return homed, homed & np.array([n not in avoid for n in table.names], dtype=bool)


class Catalogue:
    def __init__(self, repo_dir: Path, name: str):
        path = folder(repo_dir, name)
        fs.ensure_dir(Path(repo_dir) / "remotes")
        fs.ensure_dir(path)
        # opened without create once it exists, so a planted link in place of data.mdb is refused
        self.index = Index(path, create=not os.path.lexists(path / "data.mdb"))
        self.tables_dir = path / "tables"
        if not self.index.readonly:
            fs.ensure_dir(self.tables_dir)
            self._convert()
        # names of packs the lookups treat as absent: those a remote gc condemned (a push must
        # not count on them, docs/format.md 11.6)
        self.avoid: frozenset = frozenset()
        # () -> the remote's bucket: set by the connection, so a lookup can read unread trailers
        self.source: Optional[Callable] = None
        # (chunk ids) -> chunk pack keys to read first when they are looked for: set by the cache
        self.near: Optional[Callable] = None
        # measures for benchmarks and tests: trailers this catalogue read, their bytes (trailer
        # and footer), and how many of them a hint named
        self.trailers_read = self.trailer_bytes = self.trailers_hinted = 0
        self._reading = threading.Lock()
        self._writing = threading.RLock()
        self._hints: dict = {}  # object pack key -> its decoded where hint ({} if none)
        self._view: Optional[_View] = None
        self._trusted: set = set()  # tables whose checksum this process checked, or which it wrote

    def shun(self, keys) -> None:
        """Treat the packs ``keys`` as absent in every lookup from now on (for this command)."""
        self.avoid = frozenset(name for key in keys if (name := layout.pack_name(key)) is not None)
        self._view = None

    # -- lookups ----------------------------------------------------------------

    def chunk(self, cid: bytes) -> Optional[Location]:
        """Where the remote holds chunk ``cid`` (None: nowhere)."""
        return self.chunks([cid]).get(cid)

    def has_chunk(self, cid: bytes) -> bool:
        return self.chunk(cid) is not None

    def chunks(self, ids: Iterable[bytes], complete: bool = True) -> dict:
        """{id: Location} of the ids the remote holds. ``complete``: an id no trailer read so far
        lists is looked for in the unread ones (read until it is found); False: only those read."""
        ids = list(ids)
        out = self._find(ids)
        if complete and len(out) < len(set(ids)) and self.source is not None:
            found: dict = {}
            self.read_unread({cid for cid in ids if cid not in out}, found)
            out.update(found)
        return out

    def _find(self, ids: list, homed: bool = False) -> dict:
        """{id: Location} of those of ``ids`` the tables list (``homed``: packs avoided too)."""
        if not ids:
            return {}
        view = self.view()
        arr = idarray.pack(ids)
        at, entry = tables.locate(view.tables, view.homed if homed else view.live, arr)
        out = {}
        for t in np.unique(at[at >= 0]).tolist():
            sel = np.flatnonzero(at == t)
            table, rows = view.tables[t], entry[sel]
            for i, k, offset, length in zip(sel.tolist(), table.packs[rows].tolist(), table.offsets[rows].tolist(),
                                            table.lengths[rows].tolist()):
                out[ids[i]] = Location(table.names[k], offset, length)
        return out

    def view(self) -> _View:
        """The tables of the listing's newest generation, mapped (the last one built, if current).
        A table the listing names that is missing or damaged is dropped (its packs become unread)
        and the listing read again."""
        while True:
            with self.index.read() as txn:
                gen, names = _listing(txn)
                last = self._view
                if last is not None and last.gen == gen:
                    return last
                homes = _homes(txn)
            opened = {t.name: t for t in last.tables} if last is not None else {}
            got, bad = [], []
            for name in names:
                table = opened.get(name)
                if table is None:
                    try:
                        table = tables.open_table(self.tables_dir, name)
                    except CorruptObject:
                        table = None
                if table is None:
                    bad.append(name)
                else:
                    got.append(table)
            if not bad:
                view = _View(gen, got, homes, self.avoid)
                self._view = view
                return view
            self._drop_tables(gen, bad)

    def _drop_tables(self, gen: int, names: list) -> None:
        """Drop tables ``names`` from the listing if it is still generation ``gen`` (a merge may have
        replaced them since: then nothing), the packs whose home they were noted unread
        (``_unread_again``). CorruptObject where this cannot write."""
        if self.index.readonly:
            raise CorruptObject(f"catalogue table {names[0]} of {self.tables_dir.parent.name!r} is missing or "
                                "damaged and this repository is read-only; it is derived data: delete "
                                f"{self.tables_dir.parent} where it can be written", kind="catalogue-table")
        lost = set(names)
        with self._writing, self.index.write() as txn:
            now, listed = _listing(txn)
            if now != gen:
                return
            for key in [k.decode() for k in txn.ids("meta", HOME.encode())]:
                if txn.meta(key).decode() in lost:
                    _unread_again(txn, key[len(HOME):], HOME)
            txn.put_meta(TABLES, encoding.pack([gen + 1, [n for n in listed if n not in lost]]))
        for name in names:
            tables.unlink(tables.path_of(self.tables_dir, name))

    def unread(self) -> dict:
        """{chunk pack key: its listing stamp} of the packs listed whose trailers were not read."""
        with self.index.read() as txn:
            return {key.decode()[7:]: encoding.unpack(txn.meta(key.decode()), "catalogue entry")
                    for key in txn.ids("meta", b"unread:")}

    def damaged(self) -> list:
        """Keys of the listed packs found damaged before their trailers were read (see the module's docstring)."""
        with self.index.read() as txn:
            return sorted(key.decode()[8:] for key in txn.ids("meta", b"damaged:"))

    def read_unread(self, wanted: Optional[set] = None, found: Optional[dict] = None) -> int:
        """Read unread trailers in ``read_order`` until every id of ``wanted`` is located (None: read
        them all), putting their Locations in ``found``; how many were read. Each batch (read in threads) is as large as all before it
        (1, 1, 2, 4 ... up to ``THREADS``): at most twice the trailers needed, in few round trips.
        Raises RemoteError."""
        with self._reading:
            pending = self.unread()
            if not pending or self.source is None:
                return 0
            bucket, done = self.source(), 0
            keys = read_order(pending)
            hinted = self._hinted(wanted, pending)
            if hinted:  # read first, in one batch; then newest first for what they do not list
                keys = hinted + [key for key in keys if key not in hinted]
            while keys:
                size = THREADS if wanted is None else min(THREADS, max(1, done))
                if hinted:
                    size, hinted = len(hinted), []
                    self.trailers_hinted += size
                batch, keys = keys[:size], keys[size:]
                listed = self._read_packs(bucket, {key: pending[key] for key in batch}, wanted is not None)
                self._settle()
                done += len(batch)
                if wanted is not None:
                    hits = [cid for ids in listed for cid in ids if cid in wanted]  # only these can be found now
                    for cid, loc in self._find(hits).items():
                        if cid in wanted:
                            wanted.discard(cid)
                            if found is not None:
                                found[cid] = loc
                    if not wanted:
                        break
            return done

    def lazy(self) -> bool:
        """Whether some listed chunk pack's trailer is unread (a lazy clone's catalogue)."""
        with self.index.read() as txn:
            return any(True for _ in txn.ids("meta", b"unread:"))

    def read_named(self, keys: Iterable[str]) -> int:
        """Read now, in one batch, the trailers of those of chunk packs ``keys`` still unread (where
        hints named them: a push's lookups, ``mvc.remote.sync``); how many. RemoteError."""
        keys = set(keys)
        if not keys or self.source is None:
            return 0
        with self._reading:
            pending = self.unread()
            batch = {key: pending[key] for key in keys if key in pending}
            if batch:
                self._read_packs(self.source(), batch)
                self._settle()
                self.trailers_hinted += len(batch)
            return len(batch)

    def hinted_packs(self, tids: Iterable[bytes]) -> set:
        """The chunk pack keys the where hints of tensor objects ``tids`` name, every run's (those
        the remote holds no object or hint of name none). RemoteError."""
        out = set()
        for tid in tids:
            try:
                hint = self.hint(tid)
            except CorruptObject:
                continue
            if hint is not None:
                out.update(layout.pack_key(layout.CHUNK_PACKS, name) for name in hint[1] if name is not None)
        return out

    def _hinted(self, wanted: Optional[set], pending: dict) -> list:
        """The unread packs (``pending``) the hints name for ``wanted``, in reading order."""
        if not wanted or self.near is None:
            return []
        try:
            keys = self.near(wanted)
        except (RemoteError, CorruptObject):  # a hint is only a speed matter: search as without one
            return []
        return read_order({key: pending[key] for key in keys if key in pending})

    def hint(self, tid: bytes) -> Optional[tuple]:
        """Tensor object ``tid``'s where hint, (first chunk indices, pack names) of its runs
        (``where.decode``), from the hint of the object pack the catalogue lists it in; None if
        there is none (or it does not decode). RemoteError."""
        located = self.object_locations([tid])
        if not located or self.source is None:
            return None
        key = located[tid][0]
        if key not in self._hints:
            with self.index.read() as txn:
                raw = txn.meta("where:" + key)
            if raw is None:
                raw = where.read(self.source(), key) or b""
                if not self.index.readonly:
                    with self.index.write() as txn:
                        txn.put_meta("where:" + key, raw)
            try:
                self._hints[key] = where.decode(raw) if raw else {}
            except CorruptObject:  # damaged: searched for as without one
                self._hints[key] = {}
        return self._hints[key].get(tid)

    def _read_packs(self, bucket, stamps: dict, ids: bool = False) -> list:
        """Read the trailers of packs {key: (size, stamp)} and catalogue them (the chunk packs of
        up to FLUSH entries in one table); one that does not read (damaged, or deleted since it
        was listed) is noted damaged or forgotten. Returns the id lists of those read if ``ids``
        (a lookup's; a whole refresh keeps none: they are in the tables)."""
        def read(key):
            if stamps[key][0] < MIN_PACK_BYTES:  # a zero-byte object, say: no reader can parse it
                return key, CorruptObject
            try:
                return key, _read_table(bucket, key)
            except CorruptObject:
                return key, CorruptObject
            except NotFound:
                return key, NotFound
        listed, batch = [], []
        keys = sorted(stamps)
        with ThreadPoolExecutor(THREADS) as pool:
            # a window of trailers at a time: read ahead of the tables written, never all of them in memory
            for key, entries in (got for at in range(0, len(keys), 2 * THREADS)
                                 for got in pool.map(read, keys[at:at + 2 * THREADS])):
                self.trailers_read += 1
                if isinstance(entries, tuple):
                    entries, nbytes = entries
                    self.trailer_bytes += nbytes
                    if ids:
                        listed.append(entries[0])
                    if key.startswith(layout.OBJECT_PACKS):
                        self.add_table(key, *entries, stamps[key])
                        continue
                    batch.append((key, idarray.pack(entries[0]), entries[1], entries[2], stamps[key], None))
                    if sum(len(b[1]) for b in batch) >= FLUSH:
                        self._catalogue(batch, compact=False)  # merged once, at the end: each entry moves once
                        batch = []
                    continue
                with self.index.write() as txn:
                    txn.delete("meta", ("unread:" + key).encode())
                    if entries is CorruptObject and key.startswith(layout.CHUNK_PACKS):
                        txn.put_meta("damaged:" + key, encoding.pack(_plain(stamps[key])))
        self._catalogue(batch, compact=False)
        self._compact()
        return listed

    def has_objects(self, ids: Iterable[bytes]) -> set:
        with self.index.read() as txn:
            return {oid for oid in ids if (raw := txn.get(OBJECTS_DB, oid)) is not None
                    and _LOC.unpack(raw)[0] not in self.avoid}

    def object_packs(self) -> dict:
        """{object pack key: [ids it lists]}."""
        with self.index.read() as txn:
            out = {}
            for key in txn.ids("meta", b"pack:" + layout.OBJECT_PACKS.encode()):
                out[key.decode()[5:]] = _listed_ids(txn.meta(key.decode()))
            return out

    def pack_ids(self) -> dict:
        """{pack key: [ids its trailer lists]} of every catalogued pack (a chunk pack's in id order)."""
        out = self.object_packs()
        view = self.view()
        for table, homed in zip(view.tables, view.homed):
            rows = np.flatnonzero(tables.live_of(homed, table.packs))
            packs = table.packs[rows]
            order = np.argsort(packs, kind="stable")
            rows, packs = rows[order], packs[order]
            cuts = np.flatnonzero(np.diff(packs)) + 1
            for part in np.split(np.arange(len(rows)), cuts) if len(rows) else []:
                ids = tables.joined(table.heads[rows[part]], table.rests[rows[part]])
                out[layout.pack_key(layout.CHUNK_PACKS, table.names[int(packs[part[0]])])] = idarray.ids(ids)
        for key in self._homes_keys():  # a pack whose trailer lists no record
            out.setdefault(key, [])
        return out

    def held(self, chunks: Iterable[tuple], objects: set) -> dict:
        """{pack key: (how many of the ids its trailer lists are needed, how many it lists)} of
        every catalogued pack: a chunk pack's ids are needed if ``chunks`` has them (it yields
        (first byte, last byte + 1, sorted id array), as ``packindex.IdSpill.slices`` does), an
        object pack's if in ``objects``. For a remote gc's sweep, in bounded memory."""
        view = self._checked()
        out = {key: (sum(1 for oid in ids if oid in objects), len(ids)) for key, ids in self.object_packs().items()}
        out.update(dict.fromkeys(self._homes_keys(), (0, 0)))  # a chunk pack whose trailer lists no record
        for table, homed, (live, total) in zip(view.tables, view.homed, tables.held(view.tables, view.homed, chunks)):
            for k in np.flatnonzero(homed).tolist():
                out[layout.pack_key(layout.CHUNK_PACKS, table.names[k])] = (int(live[k]), int(total[k]))
        return out

    def _checked(self) -> _View:
        """The view, each of its tables' checksums checked (once in this process: those it wrote
        need none). One that fails is dropped, its packs noted unread: a count that a sweep
        deletes by must not come from a damaged table (a pack not counted is kept)."""
        while True:
            view = self.view()
            bad = []
            for table in view.tables:
                if table.name not in self._trusted:
                    try:
                        table.verify()
                        self._trusted.add(table.name)
                    except CorruptObject:
                        bad.append(table.name)
            if not bad:
                return view
            self._drop_tables(view.gen, bad)

    def pack_keys(self) -> set:
        """Keys of the packs catalogued (their trailers read) or listed unread."""
        with self.index.read() as txn:
            return {key.decode()[5:] for key in txn.ids("meta", b"pack:")} | \
                {key.decode()[len(HOME):] for key in txn.ids("meta", HOME.encode())} | \
                {key.decode()[7:] for key in txn.ids("meta", b"unread:")}

    def _homes_keys(self) -> set:
        with self.index.read() as txn:
            return {key.decode()[len(HOME):] for key in txn.ids("meta", HOME.encode())}

    def object_locations(self, ids: Iterable[bytes]) -> dict:
        """{id: (object pack key, data offset, length)} of the ids the remote's object packs hold."""
        with self.index.read() as txn:
            out = {}
            for oid in ids:
                raw = txn.get(OBJECTS_DB, oid)
                if raw is not None:
                    name, offset, length = _LOC.unpack(raw)
                    if name not in self.avoid:
                        out[oid] = (layout.pack_key(layout.OBJECT_PACKS, name), offset, length)
            return out

    def remote_bytes(self) -> tuple:
        """(chunks, bytes of chunk data) the remote holds, as catalogued (unread trailers read first)."""
        self.read_unread()
        view = self.view()
        return tables.distinct(view.tables, view.homed)

    # -- updates ----------------------------------------------------------------

    def add_pack(self, key: str, entries: list, stamp: Optional[tuple] = None, sent: Optional[tuple] = None) -> None:
        """Record pack ``key`` with its trailer's (id, offset, length) entries; ``stamp``: its
        (size, stamp) in the listing its trailer was read after. ``sent``: (size, etag) of a pack
        this repository just uploaded, whose stamp no listing gave yet: the next refresh takes
        the listed stamp if the listing shows that upload (same size, and same etag where the
        listing has one) and reads the trailer once more otherwise (neither known: always)."""
        if key.startswith(layout.CHUNK_PACKS):
            self._catalogue([(key, idarray.pack([cid for cid, _, _ in entries]),
                              np.array([o for _, o, _ in entries], dtype=np.uint64),
                              np.array([n for _, _, n in entries], dtype=np.uint64), stamp, sent)])
            return
        name = layout.pack_name(key)
        with self.index.write() as txn:
            for cid, offset, length in entries:
                txn.put(OBJECTS_DB, cid, _LOC.pack(name, offset, length))
            txn.put_meta("pack:" + key, encoding.pack([cid for cid, _, _ in entries]))
            _mark_read(txn, key, stamp, sent)

    def add_table(self, key: str, ids: list, offsets, lengths, stamp: Optional[tuple] = None) -> None:
        """``add_pack`` of a trailer as ``read_trailer_table`` gives it."""
        if key.startswith(layout.CHUNK_PACKS):
            self._catalogue([(key, idarray.pack(ids), offsets, lengths, stamp, None)])
        else:
            self.add_pack(key, list(zip(ids, offsets.tolist(), lengths.tolist())), stamp)

    def _catalogue(self, packs: list, compact: bool = True) -> None:
        """Catalogue chunk packs ``packs``, (key, id array, offsets, lengths, stamp, sent) each,
        in one new table that becomes their home; then (``compact``) merge tables if there are
        too many."""
        if not packs:
            return
        table = tables.write(self.tables_dir, [(layout.pack_name(key), ids, offsets, lengths)
                                               for key, ids, offsets, lengths, _, _ in packs])
        self._trusted.add(table.name)
        with self._writing:
            with self.index.write() as txn:
                gen, names = _listing(txn)
                for key, _, _, _, stamp, sent in packs:
                    txn.put_meta(HOME + key, table.name.encode())
                    _mark_read(txn, key, stamp, sent)
                txn.put_meta(TABLES, encoding.pack([gen + 1, [table.name] + names]))
            self._advance(gen, lambda view: [table] + view.tables, dict.fromkeys(table.names, table.name))
        if compact:
            self._compact()

    def _advance(self, gen: int, got: Callable, changes: dict) -> None:
        """After this catalogue's own write took the listing from generation ``gen`` to the next:
        the next view from the last (``_View.then``; ``got(view)``: its tables) where the last is
        of ``gen``, else none (built afresh when next needed)."""
        last = self._view
        self._view = last.then(gen + 1, got(last), changes) if last is not None and last.gen == gen else None

    def _compact(self) -> None:
        """Where there are more than ``tables.MAX_TABLES`` tables, merge the newest into one (as many
        as ``tables.group`` says: at most MAX_TABLES are left), keeping only the entries of packs
        whose home they are; the merged table becomes those packs' home unless another writer
        changed it meanwhile (then their entries there are stale)."""
        with self._writing:
            view = self.view()
            k = tables.group([len(t) for t in view.tables])
            if not k:
                return
            inputs = view.tables[:k]
            merged = tables.merge(self.tables_dir, inputs, view.homed[:k])
            if all(t.name in self._trusted for t in inputs):
                self._trusted.add(merged.name)
            was = [t.name for t in inputs]
            with self.index.write() as txn:
                gen, names = _listing(txn)
                at = next((i for i in range(len(names) - k + 1) if names[i:i + k] == was), None)
                moved = {}
                if at is not None:
                    for table in inputs:
                        for name in table.names:
                            key = HOME + layout.pack_key(layout.CHUNK_PACKS, name)
                            if txn.meta(key) == table.name.encode():
                                txn.put_meta(key, merged.name.encode())
                                moved[name] = merged.name
                    names = names[:at] + [merged.name] + names[at + k:]
                    txn.put_meta(TABLES, encoding.pack([gen + 1, names]))
            if at is None:  # another writer merged them first
                tables.unlink(merged.path)
                return
            self._advance(gen, lambda view: view.tables[:at] + [merged] + view.tables[at + k:], moved)
            for table in inputs:
                tables.unlink(table.path)  # a process that maps one keeps its pages
            tables.sweep(self.tables_dir, set(names))

    def _convert(self) -> None:
        """Convert a catalogue from before the tables (its chunk entries in LMDB): its chunk packs
        become unread (``_unread_again``: read again as lookups need them), its chunk entries
        are dropped."""
        with self.index.read() as txn:
            if txn.meta(FORMAT) is not None:
                return
            old = [key.decode()[5:] for key in txn.ids("meta", ("pack:" + layout.CHUNK_PACKS).encode())]
        with self.index.write() as txn:
            for key in old:
                _unread_again(txn, key, "pack:")
            txn.drop_chunks()
            txn.put_meta(FORMAT, b"2")

    def _ids_in(self, keys: Iterable[str]) -> list:
        """The ids the catalogued chunk packs ``keys`` list (from their home tables)."""
        view, out = self.view(), []
        by_table: dict = {}
        for key in keys:
            home = view.homes.get(layout.pack_name(key))
            if home is not None:
                by_table.setdefault(home, []).append(layout.pack_name(key))
        for table in view.tables:
            if table.name in by_table:
                rows = table.entries_of(table.number[n] for n in by_table[table.name] if n in table.number)
                out += idarray.ids(tables.joined(table.heads[rows], table.rests[rows]))
        return out

    def forget_packs(self, keys: Iterable[str]) -> set:
        """Forget the catalogued packs ``keys`` (gone from the remote, or to be read again); the
        ids they listed (a chunk listed by another pack too included: see ``refresh``)."""
        keys = set(keys)
        orphans = set(self._ids_in(key for key in keys if key.startswith(layout.CHUNK_PACKS)))
        chunk_packs = [key for key in keys if key.startswith(layout.CHUNK_PACKS)]
        with self._writing:
            with self.index.write() as txn:
                for key in keys:
                    orphans |= self._drop_pack(txn, key)
                if chunk_packs:
                    gen, names = _listing(txn)
                    txn.put_meta(TABLES, encoding.pack([gen + 1, names]))  # their entries are stale now
            if chunk_packs:
                self._advance(gen, lambda view: view.tables, dict.fromkeys(map(layout.pack_name, chunk_packs)))
        return orphans

    def _drop_pack(self, txn, key: str) -> set:
        """Forget pack ``key`` (an object pack: also the ids whose entries pointed into it, which
        are returned)."""
        orphans = set()
        if key.startswith(layout.OBJECT_PACKS):
            name = layout.pack_name(key)
            raw = txn.meta("pack:" + key)
            for cid in _listed_ids(raw) if raw else []:
                raw_loc = txn.get(OBJECTS_DB, cid)
                if raw_loc is not None and _LOC.unpack(raw_loc)[0] == name:
                    txn.delete(OBJECTS_DB, cid)
                    orphans.add(cid)
        for prefix in ("pack:", HOME, "stamp:", "sent:", "where:"):
            txn.delete("meta", (prefix + key).encode())
        self._hints.pop(key, None)
        return orphans

    def refresh(self, bucket, trailers: bool = True) -> int:
        """List the remote's packs; read the trailers of new ones, forget vanished ones.

        ``trailers=False`` (a lazy clone): new chunk packs are noted unread instead (object packs
        are always read), and read when a lookup needs them. Returns how many packs were new. A
        pack whose trailer is damaged is left out (``mvc fsck --remote`` names it), also one
        catalogued before whose listing changed since; one noted unread whose listing changed is
        noted damaged if its trailer does not read now. Raises RemoteError.
        """
        stamps = {key: (size, stamp) for folder in (layout.CHUNK_PACKS, layout.OBJECT_PACKS)
                  for key, size, stamp in bucket.list_stamps(folder) if layout.pack_name(key) is not None}
        listed = {key: size for key, (size, _) in stamps.items()}
        with self.index.read() as txn:
            known = {key.decode()[5:] for key in txn.ids("meta", b"pack:")} | \
                {key.decode()[len(HOME):] for key in txn.ids("meta", HOME.encode())}
            # a pack is written whole and never modified: one listed with another size or stamp (time,
            # etag) than when its trailer was read (cut short, emptied, rewritten) is read again, so a
            # damaged pack is dropped here instead of being relied on (fsck --remote names it)
            differ = {key for key in known & stamps.keys() if _stamp(txn, key) != _plain(stamps[key])}
            # an upload of ours listed as sent takes its stamp without its trailer read again: a
            # push re-reading what it just wrote would cost the next one in proportion to this one
            adopt = {key for key in differ if _stamp(txn, key) is None and _shows_upload(txn, key, stamps[key])}
            changed = differ - adopt
        unread, damaged = self.unread(), self._damaged_stamps()
        orphans = self.forget_packs((known - listed.keys()) | changed)
        with self.index.write() as txn:
            for key in adopt:
                txn.put_meta("stamp:" + key, encoding.pack(_plain(stamps[key])))
                txn.delete("meta", ("sent:" + key).encode())
            for key in unread.keys() - listed.keys():
                txn.delete("meta", ("unread:" + key).encode())
            for key in damaged:
                if damaged[key] != _plain(stamps.get(key)):  # gone, or listed anew (a repair's rewrite)
                    txn.delete("meta", ("damaged:" + key).encode())
        recheck = {key for key in unread.keys() & listed.keys() if unread[key] != _plain(stamps[key])}
        new = [key for key in listed if key in changed or key in recheck or
               (key not in known and key not in unread and damaged.get(key) != _plain(stamps[key]))]
        later = {} if trailers else {key: stamps[key] for key in new if key.startswith(layout.CHUNK_PACKS)
                                     and key not in recheck and key not in changed}
        if later:
            with self.index.write() as txn:
                for key, stamp in later.items():
                    txn.put_meta("unread:" + key, encoding.pack(_plain(stamp)))
        self._read_packs(bucket, {key: stamps[key] for key in new if key not in later})
        if trailers:
            self._read_packs(bucket, {key: stamps[key] for key in unread.keys() & listed.keys()
                                      if key not in recheck})
        if orphans:  # chunks located once whose pack went: see lost()
            held = self._find(list(orphans), homed=True)
            still = [cid for cid in orphans if cid not in held]
            with self.index.write() as txn:
                for cid in still:
                    if txn.get(OBJECTS_DB, cid) is None:
                        txn.put_meta(LOST + cid.hex(), b"")
        self._settle()
        return len(new) - len(changed) - len(recheck)

    def lost(self, ids: Iterable[bytes]) -> set:
        """Those of ``ids`` (chunks) that a trailer read here listed once, in a pack since gone or
        found damaged, and that no trailer read since lists: a lazy clone relied on them there."""
        with self.index.read() as txn:
            if not any(True for _ in txn.ids("meta", LOST.encode())):
                return set()
            return {cid for cid in ids if txn.meta(LOST + cid.hex()) is not None}

    def _settle(self) -> None:
        """Forget the lost marks of ids a trailer read since lists again (a repair's new pack)."""
        with self.index.read() as txn:
            marked = [bytes.fromhex(key.decode()[len(LOST):]) for key in txn.ids("meta", LOST.encode())]
        found = self._find(marked, homed=True)
        if found:
            with self.index.write() as txn:
                for cid in found:
                    txn.delete("meta", (LOST + cid.hex()).encode())

    def _damaged_stamps(self) -> dict:
        with self.index.read() as txn:
            return {key.decode()[8:]: encoding.unpack(txn.meta(key.decode()), "catalogue entry")
                    for key in txn.ids("meta", b"damaged:")}

    def touch(self, packs: Iterable[bytes]) -> None:
        """Note that local packs ``packs`` were just read (LRU order for eviction)."""
        now = struct.pack("<d", time.time())
        with self.index.write() as txn:
            for name in packs:
                txn.put_meta("used:" + name.hex(), now)

    def used(self, name: bytes) -> Optional[float]:
        with self.index.read() as txn:
            raw = txn.meta("used:" + name.hex())
        return struct.unpack("<d", raw)[0] if raw and len(raw) == 8 else None

    def close(self) -> None:
        self._view = None
        self.index.close()


def _listing(txn) -> tuple:
    """(generation, table names newest first) of the catalogue's listing of its tables."""
    raw = txn.meta(TABLES)
    if raw is None:
        return 0, []
    gen, names = encoding.unpack(raw, "catalogue entry")
    return gen, list(names)


def _homes(txn) -> dict:
    """{chunk pack name: the name of its home table}."""
    out = {}
    for key in txn.ids("meta", HOME.encode()):
        name = layout.pack_name(key.decode()[len(HOME):])
        if name is not None:
            out[name] = txn.meta(key.decode()).decode()
    return out


def _unread_again(txn, key: str, entry: str) -> None:
    """Note chunk pack ``key`` unread again (its catalogue ``entry`` gone): under the listing
    stamp its trailer was read after, else the size this repository sent (a stamp no listing
    gives, so the next refresh reads it at once), else the least a pack can be."""
    stamp = txn.meta("stamp:" + key)
    if stamp is None:
        sent = txn.meta("sent:" + key)
        size = encoding.unpack(sent, "catalogue entry")[0] if sent else MIN_PACK_BYTES
        stamp = encoding.pack([size, None])
    txn.put_meta("unread:" + key, stamp)
    for prefix in (entry, "stamp:", "sent:"):
        txn.delete("meta", (prefix + key).encode())


def _mark_read(txn, key: str, stamp, sent) -> None:
    """Note pack ``key``'s trailer read (after the listing ``stamp``, or as ``sent`` by this repository)."""
    txn.delete("meta", ("unread:" + key).encode())
    txn.delete("meta", ("damaged:" + key).encode())
    if stamp is not None:
        txn.put_meta("stamp:" + key, encoding.pack(_plain(stamp)))
    elif sent is not None:
        txn.put_meta("sent:" + key, encoding.pack(list(sent)))


def _plain(stamp):
    """``stamp`` as msgpack gives it back (tuples as lists), so a stored one compares equal."""
    return [_plain(v) for v in stamp] if isinstance(stamp, (tuple, list)) else stamp


def _listed_ids(raw: bytes) -> list:
    """The ids a ``pack:KEY`` entry lists: a list of ids, or (``add_table``) one string of them."""
    value = encoding.unpack(raw, "catalogue entry")
    if isinstance(value, bytes):
        return [value[i:i + 32] for i in range(0, len(value), 32)]
    return value


def _when(entry) -> float:
    """The listing time in an unread pack's (size, stamp) entry (a stamp is a time, or [time, etag])."""
    stamp = entry[1] if isinstance(entry, (list, tuple)) and len(entry) == 2 else None
    stamp = stamp[0] if isinstance(stamp, (list, tuple)) and stamp else stamp
    return float(stamp) if isinstance(stamp, (int, float)) else 0.0


def read_order(unread: dict) -> list:
    """The order lookups read unread trailers in: newest pack first. Reads go mostly to recent
    history, whose chunks the latest pushes wrote; a chunk every push shares lies in an old pack
    and is found last (at worst every trailer is read, as a full refresh would)."""
    return sorted(unread, key=lambda key: (-_when(unread[key]), key))


def _shows_upload(txn, key: str, listed: tuple) -> bool:
    """Whether pack ``key`` as listed, (size, stamp), is the one this repository uploaded: the size
    it sent, and the etag the upload answered where the listing's stamp has one (S3's (time,
    etag); a folder's stamp is a time). A pack cut short or rewritten since differs."""
    raw = txn.meta("sent:" + key)
    if not raw:
        return False
    size, etag = encoding.unpack(raw, "catalogue entry")
    stamp = listed[1]
    listed_etag = stamp[1] if isinstance(stamp, (list, tuple)) and len(stamp) == 2 and isinstance(stamp[1], str) else None
    return listed[0] == size and (listed_etag is None or listed_etag == etag)


def _stamp(txn, key: str):
    raw = txn.meta("stamp:" + key)
    return encoding.unpack(raw, "catalogue entry") if raw else None


def read_trailer(bucket, key: str, size: Optional[int] = None) -> list:
    """The entries of remote pack ``key``'s trailer, verified; CorruptObject / RemoteError."""
    body, footer, size = _trailer_bytes(bucket, key)
    return layout.parse_trailer(body, footer, size, key)


def read_trailer_table(bucket, key: str) -> tuple:
    """``read_trailer`` as (ids, offsets, lengths) (``layout.parse_trailer_table``)."""
    body, footer, size = _trailer_bytes(bucket, key)
    return layout.parse_trailer_table(body, footer, size, key)


def _read_table(bucket, key: str) -> tuple:
    """(``read_trailer_table``, the bytes of its trailer and footer)."""
    body, footer, size = _trailer_bytes(bucket, key)
    return layout.parse_trailer_table(body, footer, size, key), len(body) + len(footer)


def _trailer_bytes(bucket, key: str) -> tuple:
    """(trailer, footer, pack size) of remote pack ``key``."""
    tail, size = bucket.get_tail(key, TAIL_BYTES)
    start, stop = layout.trailer_span(tail, size, key)
    if start >= size - len(tail):
        body = tail[start - (size - len(tail)):stop - (size - len(tail))]
    else:
        body = bucket.get_range(key, start, stop)
    return body, tail[-layout.FOOTER.size:], size
