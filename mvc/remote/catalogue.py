"""The catalogue: what one remote holds and where, as this repository last saw it.

Built from the trailers of the remote's packs (each read once: packs are
immutable), kept in an LMDB environment of its own at
``.mvc/remotes/NAME/`` (an ``mvc.store.index.Index``, whose ``chunks``
database maps chunk id -> (remote pack name, data offset, length), whose
``tensors`` database maps object id -> the same for object packs, and whose
``meta`` holds ``pack:KEY`` -> the ids a pack lists and ``used:PACK`` -> when
this repository last read local pack PACK, for LRU eviction).

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
an id is indexed here at the first pack read that lists it. An unread pack listed again with
another size or stamp, or whose trailer does not read when it is needed, is
**damaged**
(``damaged:KEY`` -> its stamp): packs are written whole and never modified.

It is derived data: deleting the folder loses nothing; the next command
that needs it lists the remote and reads the trailers again. ``refresh``
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
from ..store import fs
from ..store.index import Index
from ..store.packs import INDEX_RAW, Location
from . import layout, where
from .bucket import NotFound, RemoteError

TAIL_BYTES = 64 << 10  # read from a pack's end first: footer and (usually) the whole trailer
THREADS = 8
MIN_PACK_BYTES = len(layout.HEADER) + 4 + layout.FOOTER.size  # header, an empty trailer, the footer
_LOC = struct.Struct("<16sQI")
OBJECTS_DB = "tensors"  # this environment's object table: id -> location in an object pack
LOST = "lost:"  # meta key prefix: chunk id (hex) -> b"", see Catalogue.lost
_INDEX_RAW = np.dtype([("pack", "V16"), ("offset", "<u8"), ("length", "<u4")])
assert _INDEX_RAW.itemsize == INDEX_RAW.size


def folder(repo_dir: Path, name: str) -> Path:
    return Path(repo_dir) / "remotes" / name


def forget(repo_dir: Path, name: str) -> None:
    """Delete a remote's catalogue (it is rebuilt on demand)."""
    shutil.rmtree(folder(repo_dir, name), ignore_errors=True)


class Catalogue:
    def __init__(self, repo_dir: Path, name: str):
        path = folder(repo_dir, name)
        fs.ensure_dir(Path(repo_dir) / "remotes")
        fs.ensure_dir(path)
        # opened without create once it exists, so a planted link in place of data.mdb is refused
        self.index = Index(path, create=not os.path.lexists(path / "data.mdb"))
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
        self._hints: dict = {}  # object pack key -> its decoded where hint ({} if none)

    def shun(self, keys) -> None:
        """Treat the packs ``keys`` as absent in every lookup from now on (for this command)."""
        self.avoid = frozenset(name for key in keys if (name := layout.pack_name(key)) is not None)

    # -- lookups ----------------------------------------------------------------

    def chunk(self, cid: bytes, txn=None) -> Optional[Location]:
        """Where the remote holds chunk ``cid`` (None: nowhere); with ``txn``, as far as the
        trailers read so far say (no unread trailer is read)."""
        if txn is None:
            return self.chunks([cid]).get(cid)
        loc = txn.chunk(cid)
        return None if loc is None or loc.pack in self.avoid else loc

    def has_chunk(self, cid: bytes) -> bool:
        return self.chunk(cid) is not None

    def chunks(self, ids: Iterable[bytes], complete: bool = True) -> dict:
        """{id: Location} of the ids the remote holds. ``complete``: an id no trailer read so far
        lists is looked for in the unread ones (read until it is found); False: only those read."""
        ids = list(ids)
        with self.index.read() as txn:
            out = {cid: loc for cid in ids if (loc := self.chunk(cid, txn)) is not None}
        if complete and len(out) < len(ids) and self.source is not None:
            found: dict = {}
            self.read_unread({cid for cid in ids if cid not in out}, found)
            out.update(found)
        return out

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
                listed = self._read_packs(bucket, {key: pending[key] for key in batch})
                self._settle()
                done += len(batch)
                if wanted is not None:
                    hits = [cid for ids in listed for cid in ids if cid in wanted]  # only these can be found now
                    with self.index.read() as txn:
                        for cid in hits:
                            loc = self.chunk(cid, txn)
                            if loc is not None and cid in wanted:
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

    def _read_packs(self, bucket, stamps: dict) -> list:
        """Read the trailers of packs {key: (size, stamp)} and catalogue them; one that does not
        read (damaged, or deleted since it was listed) is noted damaged or forgotten. Returns
        the id lists of those read."""
        def read(key):
            if stamps[key][0] < MIN_PACK_BYTES:  # a zero-byte object, say: no reader can parse it
                return key, CorruptObject
            try:
                return key, _read_table(bucket, key)
            except CorruptObject:
                return key, CorruptObject
            except NotFound:
                return key, NotFound
        listed = []
        with ThreadPoolExecutor(THREADS) as pool:
            for key, entries in pool.map(read, sorted(stamps)):
                self.trailers_read += 1
                if isinstance(entries, tuple):
                    entries, nbytes = entries
                    self.trailer_bytes += nbytes
                    self.add_table(key, *entries, stamps[key])
                    listed.append(entries[0])
                    continue
                with self.index.write() as txn:
                    txn.delete("meta", ("unread:" + key).encode())
                    if entries is CorruptObject and key.startswith(layout.CHUNK_PACKS):
                        txn.put_meta("damaged:" + key, encoding.pack(_plain(stamps[key])))
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
        """{pack key: [ids its trailer lists]} of every catalogued pack."""
        with self.index.read() as txn:
            return {key.decode()[5:]: _listed_ids(txn.meta(key.decode())) for key in txn.ids("meta", b"pack:")}

    def pack_keys(self) -> set:
        """Keys of the packs catalogued (their trailers read) or listed unread."""
        with self.index.read() as txn:
            return {key.decode()[5:] for key in txn.ids("meta", b"pack:")} | \
                {key.decode()[7:] for key in txn.ids("meta", b"unread:")}

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
        with self.index.read() as txn:
            n = total = 0
            for _, loc in txn.chunks():
                n += 1
                total += loc.length
            return n, total

    # -- updates ----------------------------------------------------------------

    def add_pack(self, key: str, entries: list, stamp: Optional[tuple] = None, sent: Optional[tuple] = None) -> None:
        """Record pack ``key`` with its trailer's (id, offset, length) entries; ``stamp``: its
        (size, stamp) in the listing its trailer was read after. ``sent``: (size, etag) of a pack
        this repository just uploaded, whose stamp no listing gave yet: the next refresh takes
        the listed stamp if the listing shows that upload (same size, and same etag where the
        listing has one) and reads the trailer once more otherwise (neither known: always)."""
        name = layout.pack_name(key)
        is_objects = key.startswith(layout.OBJECT_PACKS)
        with self.index.write() as txn:
            for cid, offset, length in entries:
                if is_objects:
                    txn.put(OBJECTS_DB, cid, _LOC.pack(name, offset, length))
                else:
                    txn.put_chunk(cid, Location(name, offset, length))
            txn.put_meta("pack:" + key, encoding.pack([cid for cid, _, _ in entries]))
            txn.delete("meta", ("unread:" + key).encode())
            txn.delete("meta", ("damaged:" + key).encode())
            if stamp is not None:
                txn.put_meta("stamp:" + key, encoding.pack(_plain(stamp)))
            elif sent is not None:
                txn.put_meta("sent:" + key, encoding.pack(list(sent)))

    def add_table(self, key: str, ids: list, offsets, lengths, stamp: Optional[tuple] = None) -> None:
        """``add_pack`` of a trailer as ``read_trailer_table`` gives it: a chunk pack's entries go in
        with one ``putmulti`` (an id some pack catalogued before keeps that entry, as in ``add_pack``)."""
        if key.startswith(layout.OBJECT_PACKS) or len(ids) < 64:
            self.add_pack(key, list(zip(ids, offsets.tolist(), lengths.tolist())), stamp)
            return
        joined = b"".join(ids)
        # in id order: LMDB puts sorted keys 3-4x faster than random ones (this is derived data,
        # so the full pages that leaves, which the repository's own index avoids, do no harm)
        order = np.argsort(np.frombuffer(joined, dtype="S32"), kind="stable")
        values = np.zeros(len(ids), dtype=_INDEX_RAW)  # packs.INDEX_RAW (a raw record) as an array
        values["pack"] = np.void(layout.pack_name(key))
        values["offset"], values["length"] = offsets[order], lengths[order]
        raw = values.tobytes()
        width = _INDEX_RAW.itemsize
        ordered = np.frombuffer(joined, dtype="V32")[order].tobytes()
        with self.index.write() as txn:
            txn.put_new_chunks([ordered[i:i + 32] for i in range(0, len(ordered), 32)],
                               [raw[i:i + width] for i in range(0, len(raw), width)])
            # a list of ids, as add_pack and every earlier mvc write it: one string here would be
            # misread by an mvc from before it that opens the same repository
            txn.put_meta("pack:" + key, encoding.pack(list(ids)))
            txn.delete("meta", ("unread:" + key).encode())
            txn.delete("meta", ("damaged:" + key).encode())
            if stamp is not None:
                txn.put_meta("stamp:" + key, encoding.pack(_plain(stamp)))

    def _drop_pack(self, txn, key: str) -> set:
        """Forget pack ``key``; the ids whose entries pointed into it (now unlisted)."""
        name = layout.pack_name(key)
        raw = txn.meta("pack:" + key)
        ids = _listed_ids(raw) if raw else []
        orphans = set()
        for cid in ids:
            if key.startswith(layout.OBJECT_PACKS):
                raw_loc = txn.get(OBJECTS_DB, cid)
                if raw_loc is not None and _LOC.unpack(raw_loc)[0] == name:
                    txn.delete(OBJECTS_DB, cid)
                    orphans.add(cid)
            else:
                loc = txn.chunk(cid)
                if loc is not None and loc.pack == name:
                    txn.delete_chunk(cid)
                    orphans.add(cid)
        txn.delete("meta", ("pack:" + key).encode())
        txn.delete("meta", ("stamp:" + key).encode())
        txn.delete("meta", ("sent:" + key).encode())
        txn.delete("meta", ("where:" + key).encode())
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
            known = {key.decode()[5:] for key in txn.ids("meta", b"pack:")}
            # a pack is written whole and never modified: one listed with another size or stamp (time,
            # etag) than when its trailer was read (cut short, emptied, rewritten) is read again, so a
            # damaged pack is dropped here instead of being relied on (fsck --remote names it)
            differ = {key for key in known & stamps.keys() if _stamp(txn, key) != _plain(stamps[key])}
            # an upload of ours listed as sent takes its stamp without its trailer read again: a
            # push re-reading what it just wrote would cost the next one in proportion to this one
            adopt = {key for key in differ if _stamp(txn, key) is None and _shows_upload(txn, key, stamps[key])}
            changed = differ - adopt
        unread, damaged = self.unread(), self._damaged_stamps()
        gone = (known - listed.keys()) | changed
        orphans = set()
        with self.index.write() as txn:
            for key in adopt:
                txn.put_meta("stamp:" + key, encoding.pack(_plain(stamps[key])))
                txn.delete("meta", ("sent:" + key).encode())
            for key in gone:
                orphans |= self._drop_pack(txn, key)
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
        self._relist(bucket, stamps, orphans)
        with self.index.write() as txn:  # chunks located once whose pack went: see lost()
            for cid in orphans:
                if txn.chunk(cid) is None and txn.get(OBJECTS_DB, cid) is None:
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
            found = [key for key in txn.ids("meta", LOST.encode())
                     if txn.chunk(bytes.fromhex(key.decode()[len(LOST):])) is not None]
        if found:
            with self.index.write() as txn:
                for key in found:
                    txn.delete("meta", key)

    def _damaged_stamps(self) -> dict:
        with self.index.read() as txn:
            return {key.decode()[8:]: encoding.unpack(txn.meta(key.decode()), "catalogue entry")
                    for key in txn.ids("meta", b"damaged:")}

    def _relist(self, bucket, stamps: dict, orphans: set) -> None:
        """Point ``orphans`` (ids a forgotten pack listed) at another known pack that lists them.

        An id is indexed at the first pack that listed it, so when that pack goes (a remote gc
        or repair rewrote it) while a pack known since holds the id too (the rewrite itself,
        catalogued as it was uploaded), the id would be lost from the catalogue: its holders'
        trailers are read again. Rare, so the scan of every pack's id list is fine."""
        with self.index.read() as txn:
            still = {i for i in orphans if txn.chunk(i) is None and txn.get(OBJECTS_DB, i) is None}
        if not still:
            return
        for key, ids in self.pack_ids().items():
            if key in stamps and still & set(ids):
                try:
                    self.add_pack(key, read_trailer(bucket, key, stamps[key][0]), stamps[key])
                except (CorruptObject, NotFound):
                    continue

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
        self.index.close()


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
