"""Tiers: the local packs as a bounded cache in front of a remote.

Vocabulary:

- **cached remote**: the remote named by the ``cache.remote`` setting. A
  repository that has one reads chunks through ``CacheStore``: local packs
  first, then ranged reads of the remote's packs for what is not here,
  verified on arrival and kept in a new local pack.
- **evictable chunk**: one the catalogue shows in a pack on the cached
  remote (after a fresh listing), whose bytes there read back and hash to
  its id at eviction time, that a commit the remote's refs reach (as they
  are now) uses, and that no pinned commit uses nor any commit the
  remote's branches do not reach (a remote gc may delete what they do not
  need). Chunks only here (not yet pushed), whose remote copy is damaged,
  or that the remote lists only in packs its refs do not need (garbage: a
  killed push's, a deleted branch's), are never evicted.
- **pinned commits**: what HEAD names, the tips of branches with a live
  write lock (a run is training there), and refs pinned with ``mvc cache
  pin REF`` (``keep-local``).
- **budget**: ``cache.max-bytes``; eviction drops the least recently read
  local packs first until the packs fit (a pack that also holds chunks it
  must keep is rewritten with only those, through the store's compaction).
  A chunk that a local delta record which stays decodes through is kept.

- **healed chunk**: one held here whose local copy fails to read (a missing
  or short pack, bytes that do not hash to its id) while the remote's
  catalogue lists it: it is read again from the remote, verified, kept in a
  new pack whose index entry replaces the damaged one, and counted in
  ``CacheStore.healed``. A chunk the remote does not hold (an unpushed
  commit's) is never healed: its error stands.

Fetched chunks are copies of what the remote holds, so their packs are
written without fsync (``writer(durable=False)``): a power loss before the
kernel wrote them back may leave such a pack missing, short or zeroed,
while the index (which is fsynced) still names it. Every read verifies,
so such damage is found, and healed from the remote. Packs written by
commit (the last good copy of unpushed chunks) are fsynced as before.

A lazy clone holds refs, commits, trees and the small objects (``sync``);
a tensor object missing here is read when a read or a walk asks for it
(``LazyObjects``): from the object pack the remote's catalogue names for it
(the object packs' trailers), verified against its id and decoded, kept
here, then served, as a chunk is. A walk or a read that will need many
(fsck, gc, eviction, a load, a diff) announces them a batch at a time
(``ObjectStore.ahead``), and those missing here are read together: a ranged
read per run of nearby records in an object pack instead of a request each
(``LazyObjects.prefetch``). Chunk pack trailers are read on demand too,
when a lookup needs them (``catalogue``): first those the where hints
of the tensor objects read here name for the chunks looked for
(``CacheStore.noted``, ``where``), so a load reads the trailers of the
packs its tensors' chunks lie in.

Eviction holds the exclusive gc lock, so no load reads a pack it deletes;
it drops index entries in one transaction and deletes pack files after,
so a crash in between leaves only unreferenced packs that gc reclaims.
"""

import os
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable, Optional

from .. import reach, refs as refnames
from ..errors import (CorruptObject, LockHeld, MvcError, NotConfigured, NotFound, ObjectNotFound, RemoteCorrupt,
                      RemoteDamaged)
from ..objects import TensorLeaf, TensorObject
from ..store import fs
from ..store.chunks import THREADS, ChunkStore, Forwarding
from ..store.objectstore import CORRUPT, MISSING, ObjectStore
from ..traverse import walk as walk_tree
from . import config, transfer, where
from .connection import Connection, classify


@dataclass(frozen=True)
class EvictReport:
    budget: Optional[int]
    bytes_before: int
    bytes_after: int
    packs_evicted: int = 0
    packs_rewritten: int = 0
    chunks_evicted: int = 0
    kept_base: int = 0  # chunks kept because a local delta record that stays decodes through them
    kept_pinned: int = 0  # chunks the remote holds, kept because a pinned commit uses them
    kept_local: int = 0  # chunks kept because the remote does not hold them
    kept_unverified: int = 0  # chunks kept because their remote copy did not read back intact
    # chunks the remote lists only in packs its refs do not need (a killed push's, a deleted
    # branch's): a remote gc deletes those, so they are no copy to drop the local one for
    kept_garbage: int = 0
    unverified: tuple = ()  # (chunk hex, remote pack key, why) of those, the first few
    # remote refs at commits this clone does not hold (pushed since its last fetch): what they reach
    # cannot be told here, so every commit here counts as not on the remote until a fetch
    remote_ahead: tuple = ()


@dataclass(frozen=True)
class CacheStatus:
    remote: Optional[str]
    budget: Optional[int]
    local_bytes: int  # bytes of local pack files
    local_chunks: int
    remote_chunks: int  # chunks the cached remote holds (as last listed)
    remote_bytes: int
    only_remote: int  # reachable chunks held only on the remote
    only_local: int  # reachable chunks not yet on the remote (never evicted)
    lost: int = 0  # reachable chunks neither here nor on the remote (as last listed): fsck names them


def chunk_store(repo) -> ChunkStore:
    """The chunk store for ``repo``: a CacheStore over its PackStore when it caches a remote, else the PackStore."""
    with repo.index.read() as txn:
        name = config.cache_remote(txn)
    if name is None:
        return repo.chunks
    return CacheStore(repo.chunks, repo.index, name, lambda: Connection(repo, name),
                      on_close=lambda: _evict_quietly(repo))


def object_store(repo) -> ObjectStore:
    """The object store for ``repo``: ``LazyObjects`` when its chunk store caches a remote, else ``repo.objects``."""
    return LazyObjects(repo.index, repo.chunks) if isinstance(repo.chunks, CacheStore) else repo.objects


class LazyObjects(ObjectStore):
    """The object store of a repository that caches a remote: a tensor object missing here is read
    from the remote (``_remote``), verified, kept here (unless the index is read-only), and served.

    Only tensor objects: a lazy clone holds every commit and tree its refs reach (a fetch stores
    them), so a missing commit or tree is damage here, reported as before. A tensor object neither
    here nor on the remote stays MISSING. A copy on the remote whose bytes do not hash to its id,
    or do not decode, is CORRUPT (nothing is kept). Objects just kept are served from a small
    memo too: the caller's read transaction, older than the write, cannot see them.
    """

    MEMO = 32
    PREFETCH_BYTES = 64 << 20  # tensor object bytes one prefetch reads and holds at most

    def __init__(self, index, cache: "CacheStore"):
        self.index, self.cache = index, cache
        self._memo: OrderedDict = OrderedDict()
        self._room = self.MEMO  # objects the memo holds: a prefetched batch stays whole until the next
        self._lock = threading.Lock()
        self._listed = False  # the catalogue was refreshed once for an object it lacked
        self.fetched = 0  # tensor objects read from the remote
        self.fetched_bytes = 0
        self.requests = 0  # ranged reads of the remote's object packs made for them

    def check(self, txn, kind: str, oid: bytes) -> tuple:
        verdict, value = super().check(txn, kind, oid)
        if verdict != MISSING or kind != "tensors":
            if verdict is None and kind == "tensors":
                self.cache.noted.note(oid, value.chunks)  # its chunks may be read next: see where.Noted
            return verdict, value
        try:
            data = self._remote(txn, oid)
        except (RemoteCorrupt, NotFound) as exc:  # a damaged copy there (a pack cut short: NotFound)
            return CORRUPT, f"its copy on remote {self.cache.name!r} is damaged: {exc}"
        if data is None:
            return MISSING, None
        obj = TensorObject.decode(data)  # decoded once already, before it was kept
        self.cache.noted.note(oid, obj.chunks)
        return None, obj

    def raw(self, txn, kind: str, oid: bytes):
        """The stored bytes of object ``oid`` (unchecked here, as ``txn.get`` gives them), or of a
        tensor object this store read from the remote (verified); None if neither."""
        data = txn.get(kind, oid)
        if data is None and kind == "tensors":
            data = self._remote(txn, oid)
        return data

    def prefetch(self, txn, kind: str, ids) -> None:
        """Read the tensor objects of ``ids`` missing here from the remote together: a ranged read
        per run of nearby records in an object pack (``transfer.read_records``) instead of one per
        object. Each is verified against its id and decoded, then kept here in one write and held
        in the memo, so the ``check`` or ``raw`` of it that follows (in ``txn``, which cannot see
        that write) is served without a request. One whose copy there does not read back intact
        or decode, or that the catalogue does not list, is left alone: its own ``check`` reads it
        again by itself and gives its verdict, as without a prefetch."""
        if kind != "tensors":
            return
        with self._lock:
            want = [oid for oid in dict.fromkeys(ids) if oid not in self._memo]
        want = [oid for oid in want if txn.get(kind, oid) is None]
        if len(want) < 2:  # one alone: its check reads it as it would anyway
            return
        conn = self.cache.conn
        located = conn.catalogue.object_locations(want)
        if len(located) < len(want) and not self._listed:  # as ``_remote`` would for the first it lacks
            self._listed = True
            conn.catalogue.refresh(conn.bucket, trailers=False)
            located = conn.catalogue.object_locations(want)
        located = _within(located, self.PREFETCH_BYTES)  # the rest: one by one
        if not located:
            return
        got, failed = self._read_many(conn, located)
        gone = [oid for oid, exc in failed.items() if isinstance(exc, NotFound)]
        if gone:  # a pack went (a remote repair or gc rewrote it): list once, read those where they are now
            conn.catalogue.refresh(conn.bucket, trailers=False)
            more, failed = self._read_many(conn, conn.catalogue.object_locations(gone))
            got.update(more)
        found = {}
        for oid, data in got.items():
            try:
                TensorObject.decode(data)
            except CorruptObject:  # its check reads it again and says so (RemoteCorrupt)
                continue
            found[oid] = data
        with self._lock:  # never less: another thread's batch may not have been served yet
            self._room = max(self._room, self.MEMO + len(found))
        self._keep(txn, found)

    def _remote(self, txn, oid: bytes):
        """The verified bytes of tensor object ``oid`` from the remote (kept here), or None if it holds none."""
        with self._lock:
            if oid in self._memo:
                self._memo.move_to_end(oid)
                return self._memo[oid]
        conn = self.cache.conn
        located = conn.catalogue.object_locations([oid])
        if not located and not self._listed:  # the catalogue was deleted, or is older than this commit
            self._listed = True
            conn.catalogue.refresh(conn.bucket, trailers=False)
            located = conn.catalogue.object_locations([oid])
        if not located:
            return None
        try:
            data = self._read_one(conn, located)[oid]
        except NotFound:  # its pack went (a remote repair or gc rewrote it): list once, read it where it is now
            conn.catalogue.refresh(conn.bucket, trailers=False)
            located = conn.catalogue.object_locations([oid])
            if not located:
                return None
            data = self._read_one(conn, located)[oid]
        try:
            TensorObject.decode(data)
        except CorruptObject as exc:  # bytes that hash to the id yet do not decode: a hostile remote
            raise RemoteCorrupt(f"tensor object {oid.hex()[:12]} on remote {self.cache.name!r} does not decode "
                                f"({exc}); nothing was kept", key=located[oid][0], id=oid) from None
        self._keep(txn, {oid: data})
        return data

    def _read_many(self, conn: Connection, located: dict) -> tuple:
        """({id: verified bytes}, {id: error}) of the records ``located``: a record that does not read
        back intact fails only itself (its check reads it alone again and gives its verdict)."""
        failed: dict = {}
        got = transfer.read_records(conn.bucket, located, failed=failed)
        with self._lock:
            self.requests += transfer.record_reads(located)
        return got, failed

    def _read_one(self, conn: Connection, located: dict) -> dict:
        with self._lock:
            self.requests += 1
        return transfer.read_records(conn.bucket, located)

    def _keep(self, txn, found: dict) -> None:
        """Keep verified tensor objects ``found`` ({id: bytes}) here, in one write, and in the memo."""
        if not found:
            return
        if self.index.writing_here():
            # asked inside this thread's write transaction (``txn`` is it: one writer a thread): kept
            # with it, as a new write transaction here would wait on its own lock
            for oid, data in found.items():
                txn.put("tensors", oid, data)
        elif not self.index.readonly:
            with self.index.write() as w:
                for oid, data in found.items():
                    w.put("tensors", oid, data)
        with self._lock:
            self.fetched += len(found)
            self.fetched_bytes += sum(len(data) for data in found.values())
            for oid, data in found.items():
                self._memo[oid] = data
                self._memo.move_to_end(oid)
            while len(self._memo) > self._room:
                self._memo.popitem(last=False)


def _within(located: dict, budget: int) -> dict:
    """The first entries of ``located`` ({id: (key, offset, length)}) whose lengths fit ``budget`` (at least one)."""
    out, total = {}, 0
    for oid, loc in located.items():
        if out and total + loc[2] > budget:
            break
        out[oid] = loc
        total += loc[2]
    return out


class CacheStore(Forwarding):
    """A chunk store (``inner``, the local packs) in front of remote ``name``'s packs.

    What ``inner`` lacks is read from the remote (``connect()`` makes the
    connection on first use), verified on arrival, and kept in a new batch
    of ``inner``, published in ``index`` (unless it is read-only). Every
    other call is ``inner``'s. ``on_close`` runs at close when chunks came
    in (the repository keeps its cache budget there).
    """

    def __init__(self, inner: ChunkStore, index, name: str, connect: Callable[[], Connection],
                 on_close: Optional[Callable[[], None]] = None):
        super().__init__(inner)
        self.index, self.name, self._connect, self._on_close = index, name, connect, on_close
        self._conn: Optional[Connection] = None
        self._lock = threading.Lock()
        self._used: set = set()
        self.fetched = 0  # chunk bytes fetched from the remote by this store
        self.healed = 0  # chunks whose local copy failed to read, read again from the remote
        self.noted = where.Noted()  # the tensor objects read here: their where hints guide lookups

    @property
    def conn(self) -> Connection:
        with self._lock:
            if self._conn is None:
                self._conn = self._connect()
                catalogue = self._conn.catalogue
                # the chunk packs the where hints of the noted tensors holding some ids name for them
                catalogue.near = lambda ids: where.packs_for(self.noted.holders(ids), catalogue.hint)
            return self._conn

    # -- the seam ------------------------------------------------------------------

    def has(self, cid: bytes, txn) -> bool:
        return self.inner.has(cid, txn) or self.conn.catalogue.has_chunk(cid)

    def missing(self, ids, txn) -> set:
        absent = self.inner.missing(ids, txn)
        return absent - set(self.conn.catalogue.chunks(absent)) if absent else set()

    def lengths(self, ids, txn) -> dict:
        ids = list(ids)
        absent = self.inner.missing(ids, txn)
        out = self.inner.lengths([cid for cid in ids if cid not in absent], txn)
        # remote records are raw: stored and decoded lengths agree
        out.update((cid, loc.length) for cid, loc in self.conn.catalogue.chunks(absent).items())
        return out

    def remote_only(self, ids, txn) -> set:
        absent = set()
        for cid in ids:
            try:
                if not self.inner.has(cid, txn):
                    absent.add(cid)
            except CorruptObject:  # a damaged entry: the checker reports it
                pass
        return set(self.conn.catalogue.chunks(absent)) if absent else set()

    def keeps(self, cid: bytes, txn) -> bool:
        return self.inner.keeps(cid, txn)

    def locate(self, cid: bytes, txn, what: str = ""):
        if self.inner.has(cid, txn):
            return self.inner.locate(cid, txn, what)
        loc = self.conn.catalogue.chunk(cid)  # remote records are raw: stored and decoded lengths agree
        if loc is None:
            raise self._absent(cid, what)
        return loc

    def _absent(self, cid: bytes, what: str) -> MvcError:
        """The error for chunk ``cid`` found neither here nor in any intact pack the remote lists:
        RemoteCorrupt naming a pack found damaged there (it may have held it), else ObjectNotFound."""
        damaged = self.conn.catalogue.damaged()
        named = f"chunk {cid.hex()[:12]}{' of ' + what if what else ''}"
        if damaged:
            return RemoteCorrupt(f"{named} is neither here nor in an intact pack on remote {self.name!r}; remote "
                                 f"pack {damaged[0]} is damaged (cut short, emptied, or its trailer does not read) "
                                 "and may have held it", key=damaged[0], id=cid, what=what)
        return ObjectNotFound(f"{named} is neither here nor on remote {self.name!r}", id=cid)

    def read(self, requests: list, txn, progress=None, threads: int = THREADS) -> None:
        here, away = [], []
        for req in requests:
            if self.inner.has(req.id, txn):
                here.append(req)
                self._used.add(self.inner.locate(req.id, txn).pack)
            else:
                away.append(req)
        if here:
            self._read_here(here, txn, progress, threads)
        if away:
            self._fetch(away, progress)

    def _read_here(self, requests: list, txn, progress, threads: int) -> None:
        """``inner.read`` of chunks held here; those whose local copy fails and that the remote
        holds are healed (read again from the remote, verified, kept anew)."""
        try:
            self.inner.read(requests, txn, progress, threads)
            return
        except CorruptObject:
            pass
        failed = self._failing(requests, txn, threads)  # {request index: its error}, each read again
        if not failed:
            return  # every one read intact this time: all buffers hold verified bytes
        # (a local delta record whose base is a damaged cached chunk would need its base healed;
        # repack makes older versions deltas against newer ones, so a chunk only here never has
        # a base only the remote holds, and that case is not handled)
        by_id: dict = {}
        for i, exc in failed.items():
            by_id.setdefault(requests[i].id, []).append(requests[i])
        located = self.conn.catalogue.chunks(by_id)
        if len(located) < len(by_id):
            self.conn.catalogue.refresh(self.conn.bucket, trailers=False)  # pushed from elsewhere since it was listed?
            located = self.conn.catalogue.chunks(by_id)
        for i, exc in failed.items():
            if requests[i].id not in located:
                raise exc  # held only here (unpushed): its last copy is damaged, nothing can heal it
        try:
            self._fetch_located(by_id, located, None, heal=True)
        except NotFound:
            # a pack the catalogue names is gone (the remote was repaired or gc'd since it was
            # listed): list it once and read from the packs that hold the records now
            self.conn.catalogue.refresh(self.conn.bucket, trailers=False)
            self._fetch_located(by_id, self.conn.catalogue.chunks(by_id), None, heal=True)
        self.healed += len(by_id)

    def _failing(self, requests: list, txn, threads: int) -> dict:
        """{index: error} of the requests that fail to read from the local packs, found after a
        read of them all failed: each pack's requests are read together again, and those of a
        pack that fails one by one (only after damage, so the slow way is fine)."""
        by_pack: dict = {}
        for i, req in enumerate(requests):
            try:
                by_pack.setdefault(self.inner.locate(req.id, txn, req.what).pack, []).append(i)
            except CorruptObject:
                by_pack.setdefault(None, []).append(i)
        failed = {}
        for indices in by_pack.values():
            try:
                self.inner.read([requests[i] for i in indices], txn, None, threads)
                continue
            except CorruptObject:
                pass
            for i in indices:
                try:
                    self.inner.read([requests[i]], txn, None, 1)
                except CorruptObject as exc:
                    failed[i] = exc
        return failed

    def _fetch(self, requests: list, progress) -> None:
        by_id: dict = {}
        for req in requests:
            by_id.setdefault(req.id, []).append(req)
        located = self.conn.catalogue.chunks(by_id)
        listed = len(located) < len(by_id)
        if listed:
            # the catalogue may be stale (a push from elsewhere): list the remote once, then decide
            self.conn.catalogue.refresh(self.conn.bucket, trailers=False)
            located = self.conn.catalogue.chunks(by_id)
        try:
            self._fetch_located(by_id, located, progress)
        except NotFound:
            if listed:
                raise
            # a pack the catalogue names is gone: the remote was repaired or gc'd since it was
            # listed, and its records live in other packs now; list it once and read from those
            self.conn.catalogue.refresh(self.conn.bucket, trailers=False)
            self._fetch_located(by_id, self.conn.catalogue.chunks(by_id), progress)

    def _fetch_located(self, by_id: dict, located: dict, progress, heal: bool = False) -> None:
        """Read ``by_id``'s chunks (id -> Requests) from their remote Locations, verified, into
        the requests' buffers, keeping them in a new batch of ``inner`` (unless read-only).
        The batch is not fsynced: the remote holds every byte of it (see the module's
        docstring). ``heal``: their index entries (damaged copies) are replaced."""
        for cid, reqs in by_id.items():
            loc = located.get(cid)
            if loc is None:
                raise self._absent(cid, reqs[0].what or "a tensor")
            if any(memoryview(r.buffer).nbytes != loc.length for r in reqs):
                raise RemoteDamaged(f"chunk {cid.hex()[:12]} of {reqs[0].what} has another length on remote "
                                    f"{self.name!r}", remote=self.name, ids=(cid,))
        batch = None if self.index.readonly else self.inner.writer(durable=False)  # read-only: verified, not kept
        keep = None if batch is None else _Keeper(batch)

        def done(cid):  # the first request's buffer holds the verified bytes
            first, *rest = by_id[cid]
            for req in rest:
                memoryview(req.buffer).cast("B")[:] = memoryview(first.buffer).cast("B")
            if keep is not None:
                keep.put(cid, first.buffer)
        try:
            transfer.fetch_into(self.conn.bucket, located, {cid: reqs[0].buffer for cid, reqs in by_id.items()},
                                done, lambda cid: by_id[cid][0].what, progress)
            with self._lock:
                self.fetched += sum(loc.length for loc in located.values())
            if keep is None:
                return
            keep.finish()
            batch.seal()
        except BaseException:
            if keep is not None:
                keep.stop()
                batch.abort()
            raise
        with self.index.write() as txn:  # kept: the next read of these finds them here
            if heal:
                for cid, loc in batch.locations.items():
                    txn.put_chunk(cid, loc, overwrite=True)
            else:
                batch.publish(txn)
        self._used.update(loc.pack for loc in batch.locations.values())

    def close(self) -> None:
        try:
            if self._conn is not None:
                if self._used and not self.index.readonly:
                    self._conn.catalogue.touch(self._used)
                if self.fetched and self._on_close is not None:
                    self._on_close()
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self.inner.close()


def _evict_quietly(repo) -> None:
    """Keep to the budget after reads brought chunks in; skipped while gc or a load holds the lock."""
    with repo.index.read() as txn:
        budget = config.cache_max(txn)
    if budget is None or local_bytes(repo) <= budget:
        return
    old = repo.gc_lock.timeout
    repo.gc_lock.timeout = 0.5
    try:
        evict(repo, budget)
    except LockHeld:
        pass
    finally:
        repo.gc_lock.timeout = old


# -- eviction ---------------------------------------------------------------------

def local_packs(repo) -> dict:
    """{pack name: (path, size)} of the sealed local packs, as the chunk store lists them."""
    return {f.pack: (f.path, f.size) for f in repo.chunks.pack_files() if f.regular and f.pack is not None}


class _Keeper:
    """Writes fetched chunks into the cache's pack in a thread of its own.

    The fetching threads hand over each verified chunk and go on reading
    the network; one writer appends to the pack, so writes (paced by the
    disk once the page cache fills) never hold up the reads. It writes from
    the caller's buffers, which hold the verified bytes until the read
    returns: no copy is kept here.
    """

    def __init__(self, batch):
        self.batch, self.error = batch, None
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="mvc-cache-write", daemon=True)
        self.thread.start()

    def put(self, cid: bytes, buffer) -> None:
        self.queue.put((cid, buffer))

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.batch.add(*item)
                except BaseException as exc:  # a full disk, say: raised by finish()
                    self.error = exc

    def finish(self) -> None:
        """Wait until every chunk handed over is written; raise the writer's error."""
        self.stop()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join()


def local_bytes(repo) -> int:
    return sum(size for _, size in local_packs(repo).values())


def pinned_commits(repo, txn) -> set:
    out = set()
    head = repo.refs.head(txn)[1]
    if head is not None:
        out.add(head)
    from ..store import locks as locking
    for lock in locking.all_locks(txn):
        if not lock.stale:
            tip = repo.refs.tip(txn, refnames.BRANCHES + lock.branch)
            if tip is not None:
                out.add(tip)
    for ref in config.pins(txn):
        value = txn.ref(ref)
        if value is not None and value.id is not None:
            out.add(value.id)
    return out


def _history(repo, txn, tips, stop=frozenset()) -> set:
    """The commits held here that ``tips`` reach (a commit not held here ends its line)."""
    def commit(oid):
        return repo.objects.commit(txn, oid) if txn.get("commits", oid) is not None else None
    return set(reach.ancestry(commit, tips, stop=stop))


def _unpushed(repo, txn, remote_tips: list) -> set:
    """Commits local branches and tags reach that no ref of the remote reaches (``remote_tips``:
    its refs as it holds them now, not the tracking refs: a branch deleted there since the last
    fetch keeps its tracking ref here). The remote keeps only what its refs need (a remote gc deletes
    the rest), so a chunk such a commit shares with the remote's packs today is not safe there
    tomorrow: it stays local."""
    tracked = _history(repo, txn, remote_tips)
    mine = [v.id for name, v in txn.refs() if v.id is not None and name.startswith((refnames.BRANCHES, refnames.TAGS))]
    return _history(repo, txn, mine, tracked)


def _kept_by_remote(repo, txn, remote_tips: list, pruned_there: set) -> set:
    """The chunks the remote's refs need (``remote_tips``: as it holds them now), as far as the
    commits held here tell, less those of commits its retention pruned (``pruned_there``): the
    only remote copies a remote gc keeps. A chunk its packs list that they do not need (a killed
    or rejected push's, a deleted branch's, a pruned commit's) is garbage there, however many
    local or other remotes' refs need it: no copy to drop the local one for."""
    return commit_chunks(repo, txn, _history(repo, txn, remote_tips) - pruned_there)


def _pruned_there(repo, conn: Connection) -> set:
    """The commits the remote's retention pruned: its ``pruned`` notes, read (verified) from the
    small records of its object packs not indexed here (notes never are, and are small; fetch
    reads the same). A retention run since the last fetch is seen here, before its young packs
    are deleted."""
    with repo.index.read() as txn:
        lacking = [oid for ids in conn.catalogue.object_packs().values() for oid in ids
                   if all(txn.get(kind, oid) is None for kind in ("commits", "trees", "tensors"))]
    located = conn.catalogue.object_locations(lacking)
    out = set()
    small = {oid: loc for oid, loc in located.items() if loc[2] <= transfer.SMALL_RECORD}
    for oid, data in transfer.read_records(conn.bucket, small).items():
        kind, obj = classify(data, oid)
        if kind == "pruned":
            out.add(obj["commit"])
    return out


def commit_chunks(repo, txn, commits: set) -> set:
    """The chunk ids the trees of ``commits`` use (pruned commits use none)."""
    out, seen = set(), set()
    for oid in commits:
        if repo.objects.pruned(txn, oid) is not None:
            continue
        tree = repo.objects.commit_tree(txn, oid)
        leaves = repo.objects.ahead(txn, "tensors", (leaf for _, leaf in walk_tree(tree.root)
                                                     if isinstance(leaf, TensorLeaf) and leaf.id not in seen),
                                    lambda leaf: leaf.id)
        for leaf in leaves:
            if leaf.id not in seen:  # commits share most tensors
                seen.add(leaf.id)
                out.update(repo.objects.tensor(txn, leaf.id).chunks)
    return out


def evict(repo, budget: Optional[int] = None) -> EvictReport:
    """Drop local copies of chunks safely on the cached remote until the packs fit ``budget``
    (default: ``cache.max-bytes``; 0 evicts everything evictable).

    Raises BadInput if no remote is cached, LockHeld if gc or loads keep the
    lock, RemoteError if the remote cannot be listed (nothing is evicted
    on the strength of an old listing).
    """
    with repo.index.read() as txn:
        name = config.cache_remote(txn)
        budget = config.cache_max(txn) if budget is None else budget
    if name is None:
        raise NotConfigured("no remote is cached (setting cache.remote)", setting=config.CACHE_REMOTE)
    if budget is None:
        raise NotConfigured("no cache budget (setting cache.max-bytes) and none given", setting=config.CACHE_MAX)
    conn = Connection(repo, name)
    try:
        conn.catalogue.refresh(conn.bucket)
        refs = conn.remote_refs()
        tips = [oid for oid, _, _ in refs.values()]  # its branches and tags keep their data there
        with repo.index.read() as txn:
            ahead = tuple(sorted(ref for ref, (oid, _, _) in refs.items() if txn.get("commits", oid) is None))
        pruned_there = _pruned_there(repo, conn) if local_bytes(repo) > budget else set()
        with repo.gc_lock.exclusive():
            repo.reread_format()  # the packs it rewrites may hold records a repack elsewhere encoded
            return replace(_evict(repo, conn, budget, tips, pruned_there), remote_ahead=ahead)
    finally:
        conn.close()


def _evict(repo, conn: Connection, budget: int, remote_tips: list, pruned_there: set) -> EvictReport:
    catalogue = conn.catalogue
    packs = local_packs(repo)
    before = total = sum(size for _, size in packs.values())
    report = dict(packs_evicted=0, packs_rewritten=0, chunks_evicted=0, kept_pinned=0, kept_local=0, kept_base=0,
                  kept_unverified=0, kept_garbage=0)
    unverified = []
    if total <= budget:
        return EvictReport(budget, before, total)
    with repo.index.read() as txn:
        by_pack: dict = {}
        for cid, loc in repo.chunks.records(txn):
            by_pack.setdefault(loc.pack, []).append((cid, loc))
        pinned = commit_chunks(repo, txn, pinned_commits(repo, txn) | _unpushed(repo, txn, remote_tips))
        kept_there = _kept_by_remote(repo, txn, remote_tips, pruned_there)
    users: dict = {}  # delta base -> the local records that decode through it
    for items in by_pack.values():
        for cid, loc in items:
            if loc.base is not None:
                users.setdefault(loc.base, set()).add(cid)
    gone: set = set()  # evicted so far
    order = sorted((n for n in packs if n in by_pack),
                   key=lambda n: catalogue.used(n) or os.lstat(packs[n][0]).st_mtime)
    for name in order:
        if total <= budget:
            break
        items = by_pack[name]
        remote = catalogue.chunks([cid for cid, _ in items])
        drop = {cid for cid, _ in items if cid in remote and cid in kept_there and cid not in pinned}
        # the last good copy is sacred: drop only what the remote's bytes prove it holds
        bad = transfer.verify_chunks(conn.bucket, {cid: remote[cid] for cid in drop})
        report["kept_unverified"] += len(bad)
        unverified += [(cid.hex(), key, why) for cid, (key, why) in bad.items()][:max(0, 20 - len(unverified))]
        dropped = _bases_kept(drop - set(bad), users, gone)
        drop = [(cid, loc) for cid, loc in items if cid in dropped]
        keep = [(cid, loc) for cid, loc in items if cid not in dropped]
        report["kept_pinned"] += sum(1 for cid, _ in keep if cid in pinned and cid in remote)
        report["kept_local"] += sum(1 for cid, _ in keep if cid not in remote)
        report["kept_garbage"] += sum(1 for cid, _ in keep if cid in remote and cid not in kept_there
                                      and cid not in pinned)
        report["kept_base"] += sum(1 for cid, _ in keep if cid in remote and cid in kept_there and cid not in pinned
                                   and cid not in bad)
        gone |= dropped
        if not drop:
            continue
        # the kept records move as they are (a repacked one stays encoded); the dropped
        # entries go in the same transaction; then the pack is deleted
        repo.chunks.compact(repo.index, [(name, keep)], drop=drop)
        report["chunks_evicted"] += len(drop)
        report["packs_rewritten" if keep else "packs_evicted"] += 1
        total = local_bytes(repo)
    fs.fsync_dir(repo.dir / "packs")
    return EvictReport(budget, before, total, unverified=tuple(unverified), **report)


def _bases_kept(drop: set, users: dict, gone: set) -> set:
    """``drop`` less every chunk a local record that stays decodes through (a delta's base, at any depth):
    a chunk goes only once every record using it as a base is gone or goes with it."""
    while True:
        stay = {cid for cid in drop if not users.get(cid, set()) <= gone | drop}
        if not stay:
            return drop
        drop = drop - stay


def status(repo) -> CacheStatus:
    """Local vs remote bytes of the cached remote (or of the default remote when none is cached)."""
    from .. import reach
    with repo.index.read() as txn:
        name = config.cache_remote(txn)
        budget = config.cache_max(txn)
        if name is None:
            known = config.names(txn)
            name = "origin" if "origin" in known else (known[0] if len(known) == 1 else None)
        local_chunks = sum(1 for _ in txn.ids("chunks"))
        walked = reach.walk(txn, repo.objects) if name else None
        live = walked.chunk_length if name else {}
        here = {cid for cid in live if txn.chunk(cid) is not None}
        # tensor objects neither here nor on the remote (a lazy clone reads them from there)
        gone = {t for f in walked.findings if f.kind == reach.MISSING_TENSOR for t in f.tensors} if name else set()
    remote_chunks = remote_bytes = only_remote = only_local = lost = 0
    if name is not None and os.path.isdir(repo.dir / "remotes" / name):  # never listed: nothing known yet
        conn = Connection(repo, name)  # a lookup may read trailers a lazy clone has not read yet
        try:
            catalogue = conn.catalogue
            remote_chunks, remote_bytes = catalogue.remote_bytes()
            on_remote = set(catalogue.chunks(live))
            away = set(live) - here
            only_remote = len(away & on_remote)
            lost = len(away - on_remote) + len(gone)
            only_local = len(here - on_remote)
        finally:
            conn.close()
    return CacheStatus(name, budget, local_bytes(repo), local_chunks, remote_chunks, remote_bytes,
                       only_remote, only_local, lost)

