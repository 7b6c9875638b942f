"""fsck: prove that everything a user can reach is present and intact.

Vocabulary:

- **root**: a commit that a ref (``HEAD``, ``heads/*``, ``tags/*``) names, or
  that a reflog entry names as its old or new id. Roots are labelled with
  the ref's name, reflog roots as ``reflog:<ref>``.
- **reachable**: a root, a parent of a reachable commit, and the tree,
  tensors and chunks of a reachable commit that gc retention has not
  pruned (a pruned commit keeps only its record). fsck checks exactly these.
- **damage**: something reachable that is missing, does not decode, does not
  hash to its id, or whose bytes are not intact inside a sealed pack. Each
  ``Damage`` names the broken thing and what it breaks in user terms: chunk
  ids, tensor key paths, commits and refs.
- **unreferenced**: pack bytes that nothing reachable uses: ``.pack.tmp``
  files a crash left, records of sealed packs that no reachable chunk is
  indexed at, packs the index does not name. Harmless; gc reclaims them.

A full check reads every reachable chunk record (header and data) from its
pack and re-hashes the data with BLAKE3 in parallel threads; ``quick``
checks only the structure (objects, index entries, pack trailers).
"""

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from . import reach, scratch
from .errors import CorruptObject
from .reach import (CORRUPT_COMMIT, CORRUPT_REF, CORRUPT_REFLOG, CORRUPT_TENSOR, CORRUPT_TREE,  # noqa: F401
                    MISSING_COMMIT, MISSING_TENSOR, MISSING_TREE, REFLOG, Finding)
from .store import chunks as chunkstore
from .store import idarray
from .store.index import location_row
from .store.packs import (NAME_BYTES, RECORD_HEAD, pack_filename, read_locations,
                          read_trailer_table, salvage_records)

# Kinds of damage, as they appear in reports (the walk's own kinds are in mvc.reach).
MISSING_CHUNK, BAD_INDEX_ENTRY = "missing-chunk", "bad-index-entry"
MISSING_PACK, DAMAGED_PACK = "missing-pack", "damaged-pack"
NOT_IN_PACK, BAD_RECORD, CHECKSUM = "chunk-not-in-pack", chunkstore.BAD_RECORD, chunkstore.CHECKSUM
BAD_ENCODING, BROKEN_BASE = chunkstore.BAD_ENCODING, chunkstore.BROKEN_BASE
NOT_REGULAR = "not-a-regular-file"

# Kinds of unreferenced pack bytes.
TMP_PACK, UNUSED_RECORDS, UNUSED_PACK = "tmp-pack", "unused-records", "unused-pack"
UNINDEXED_PACK, UNREACHABLE_DAMAGED_PACK = "unindexed-pack", "damaged-pack"


@dataclass(frozen=True)
class Damage:
    """One broken thing and what it breaks (ids are hex; refs are ref names)."""

    kind: str
    object: str  # what is broken, e.g. "chunk 1a2b3c4d5e6f"
    detail: str  # what is wrong with it
    chunks: tuple = ()
    tensors: tuple = ()  # key paths of the tensors that hold it
    commits: tuple = ()
    refs: tuple = ()
    # remotes whose last listing holds every chunk named here: the local copy is damaged, the
    # data is not lost ('mvc fsck --repair' reads it again); those copies are not verified here
    remotes: tuple = ()
    # for a delta base: ((chunk, commits), ...) of the live chunks whose records decode through a
    # chunk named here, each with the commits that hold it and none of the chunks named here
    through: tuple = ()
    # commits of ``through`` that a remote can restore: it lists every chunk of theirs in
    # ``through`` ('mvc fsck --repair' fetches those whole, not as deltas on the damaged base)
    spared: tuple = ()

    @property
    def lost_commits(self) -> tuple:
        """The commits whose data this damage loses: none when a remote lists every chunk named
        here, else all but the ``spared``."""
        return () if self.remotes else tuple(c for c in self.commits if c not in self.spared)


@dataclass(frozen=True)
class Unreferenced:
    """Pack bytes nothing reachable uses; harmless, reclaimable by gc."""

    kind: str
    pack: str  # file name in .mvc/packs
    records: int
    bytes: int


@dataclass(frozen=True)
class FsckReport:
    quick: bool
    commits: int
    trees: int
    tensors: int
    chunks: int
    packs: int
    bytes_verified: int
    seconds: float
    damage: tuple = ()
    unreferenced: tuple = ()
    leftovers: tuple = ()  # scratch files of killed commands under .mvc/tmp (harmless; gc removes them)
    # reachable chunks held only by a remote (a lazy clone, an evicted cache):
    # taken on the remote's listing, not read here ("not verified here")
    unverified: int = 0
    unverified_bytes: int = 0
    unverified_remote: Optional[str] = None

    @property
    def ok(self) -> bool:
        """True when nothing that was checked is damaged (unreferenced bytes are fine)."""
        return not self.damage

    @property
    def lost(self) -> tuple:
        """The damage no remote holds a copy of: what cannot be loaded intact."""
        return tuple(d for d in self.damage if not d.remotes and (d.lost_commits or not d.commits))

    @property
    def verified(self) -> bool:
        """True when every reachable chunk was checked here and nothing is damaged."""
        return self.ok and not self.unverified

    @property
    def unreferenced_bytes(self) -> int:
        return sum(u.bytes for u in self.unreferenced)


@dataclass(frozen=True)
class RebuildReport:
    packs: int  # sealed packs whose trailers were read
    chunks: int  # chunk ids now in the index
    duplicates: int  # records skipped because another pack's record of that id was indexed first
    dropped: int  # entries the old chunk index held
    skipped: tuple = ()  # (pack file name, reason) for packs whose trailer is damaged
    salvaged: int = 0  # verified records copied out of damaged packs into a new sealed pack


@dataclass
class _Pack:
    """A file in .mvc/packs: its size and, if sealed and intact, its records sorted by offset."""

    path: Path
    size: int
    records: Optional[np.ndarray] = None  # packs.TRAILER: id, offset, length
    error: str = ""


def _short(oid: bytes) -> str:
    return oid.hex()[:12]


def _chunks(n: int) -> str:
    return f"{n} reachable chunk{'' if n == 1 else 's'}"


def scan_packs(repo) -> tuple:
    """({pack name: _Pack} of sealed packs, [(file name, size)] of .tmp leftovers, [names not regular files]),
    from the store's own listing of its pack files.

    A symlink, FIFO or device under a pack's name is never opened: it is
    listed as damage instead.
    """
    packs, tmps, odd = {}, [], []
    try:
        files = repo.chunks.pack_files()
    except FileNotFoundError:  # every pack is missing: the findings will say what that breaks
        return packs, tmps, odd
    for f in files:
        if not f.regular:
            odd.append(f.path.name)
        elif f.pack is None:
            tmps.append((f.path.name, f.size))
        else:
            pack = _Pack(f.path, f.size)
            try:
                table = read_trailer_table(f.path)
                pack.records = table[np.argsort(table["offset"], kind="stable")]
            except (CorruptObject, FileNotFoundError) as exc:
                pack.error = str(exc)
            packs[f.pack] = pack
    return packs, tmps, odd


def _by_pack(names: np.ndarray, rows: np.ndarray) -> Iterator[tuple]:
    """(pack name, the ``rows`` whose pack it is), grouping ``rows`` by ``names`` (V16 pack names)."""
    if not len(rows):
        return
    unique, which = np.unique(names, return_inverse=True)
    order = np.argsort(which, kind="stable")
    cuts = np.cumsum(np.bincount(which, minlength=len(unique)))[:-1]
    raw = unique.tobytes()
    for k, group in enumerate(np.split(rows[order], cuts)):
        yield raw[k * NAME_BYTES:(k + 1) * NAME_BYTES], group


def _rows_lost(checker, rows: np.ndarray, lost) -> list:
    """(row, V16 pack name) of ``rows`` whose chunk ``lost`` places in a pack that cannot say where."""
    if not len(rows):
        return []
    where = lost([checker.cid(i) for i in rows.tolist()])
    return [(i, np.frombuffer(where[c], dtype="V16")[0]) for i in rows.tolist() if (c := checker.cid(i)) in where]


class _Checker:
    """One fsck run: the walk's Reach, where reachable chunks are, what is broken.

    Reachable chunks are rows of the walk's sorted id array; ``ok`` marks the
    rows whose index entry was found and agrees with the tensor's length."""

    def __init__(self, found: reach.Reach):
        self.reach = found
        self.ok = np.zeros(len(found.chunk_length), dtype=bool)
        self.used: dict = {}  # pack name -> sorted offsets of the located chunks' records there
        self._users: Optional[dict] = None  # base id -> ids of the live chunks that are deltas on it

    def find(self, kind, what, detail, **where) -> None:
        self.reach.find(kind, what, detail, **where)

    def cid(self, row: int) -> bytes:
        return idarray.one(self.reach.chunk_length.ids, row)

    def locate_chunks(self, elsewhere: Callable[[list], set], lost: Callable[[list], dict] = lambda ids: {}) -> set:
        """Check every reachable chunk's index entry (from the walk's pass over the index);
        returns the ids not indexed here that ``elsewhere`` (a remote) holds. ``lost``: {id:
        pack} of ids a pack index lists in a pack that cannot say where (gone, cut short):
        located there, at offset 0, so that the pack's damage names them."""
        r = self.reach
        locs, lengths = r.locations, r.chunk_length.lengths
        unplaced = np.flatnonzero(~r.located)
        for i, pack in _rows_lost(self, unplaced, lost):
            r.located[i] = True
            locs["pack"][i], locs["offset"][i], locs["length"][i], locs["size"][i] = pack, 0, lengths[i], lengths[i]
        bad = r.located & locs["bad"]
        wrong = r.located & ~locs["bad"] & (locs["size"] != lengths)
        self.ok = r.located & ~bad & ~wrong
        missing = [self.cid(i) for i in np.flatnonzero(~r.located).tolist()]
        away = elsewhere(missing) if missing else set()  # evicted or never fetched: read from a remote
        for cid in missing:
            if cid not in away:
                self.find(MISSING_CHUNK, f"chunk {_short(cid)}", "the chunk is missing from the chunk index",
                          chunks={cid})
        for i in np.flatnonzero(bad).tolist():
            cid = self.cid(i)
            self.find(BAD_INDEX_ENTRY, f"chunk {_short(cid)}", r.bad_entries.get(cid, "damaged"), chunks={cid})
        for i in np.flatnonzero(wrong).tolist():
            cid = self.cid(i)
            self.find(BAD_INDEX_ENTRY, f"chunk {_short(cid)}", f"the index gives it {int(locs['size'][i])} bytes, "
                      f"its tensor needs {int(lengths[i])}", chunks={cid})
        rows = np.flatnonzero(self.ok)
        for name, group in _by_pack(locs["pack"][rows], rows):
            self.used[name] = np.sort(locs["offset"][group])
        return away

    # -- packs -------------------------------------------------------------

    def check_packed(self, packs: dict) -> np.ndarray:
        """Rows of the located chunks whose pack lists them; the rest become findings."""
        r, locs = self.reach, self.reach.locations
        good = np.zeros(len(self.ok), dtype=bool)
        rows = np.flatnonzero(self.ok)
        for name, group in _by_pack(locs["pack"][rows], rows):
            pack = packs.get(name)
            if pack is None or pack.records is None:
                kind, detail = (MISSING_PACK, "the pack file is missing; it held") if pack is None else \
                    (DAMAGED_PACK, f"{pack.error}; it holds")
                cids = {self.cid(i) for i in group.tolist()}
                self.find(kind, f"pack {pack_filename(name)}", f"{detail} {_chunks(len(cids))}", chunks=cids)
                continue
            table = pack.records
            at = np.minimum(np.searchsorted(table["offset"], locs["offset"][group]), max(len(table) - 1, 0))
            listed = np.zeros(len(group), dtype=bool)
            if len(table):
                listed = (table["offset"][at] == locs["offset"][group]) & (table["id"][at] == r.chunk_length.ids[group]) \
                    & (table["length"][at] == locs["length"][group])
            good[group[listed]] = True
            for i in group[~listed].tolist():
                self.find(NOT_IN_PACK, f"chunk {_short(self.cid(i))}", f"sealed pack {pack_filename(name)} does "
                          f"not list it at offset {int(locs['offset'][i])}", chunks={self.cid(i)})
        return good

    def jobs(self, good: np.ndarray) -> dict:
        """{chunk id: Location} of the ``good`` rows, for reading and re-hashing their data."""
        r, out = self.reach, {}
        for i in np.flatnonzero(good).tolist():
            cid = self.cid(i)
            out[cid] = location_row(r.locations, i, r.deltas.get(cid))
        return out

    def unreferenced(self, packs: dict, tmps: list, indexed_packs: set) -> list:
        out = [Unreferenced(TMP_PACK, name, 0, size) for name, size in tmps]
        for name, pack in packs.items():
            fname = pack_filename(name)
            used = self.used.get(name)
            if pack.records is None:
                if used is None:
                    out.append(Unreferenced(UNREACHABLE_DAMAGED_PACK, fname, 0, pack.size))
                continue
            if name not in indexed_packs and used is None:
                out.append(Unreferenced(UNINDEXED_PACK, fname, len(pack.records), pack.size))
                continue
            offsets = pack.records["offset"]
            unused = pack.records["length"][~np.isin(offsets, used)] if used is not None else pack.records["length"]
            if len(unused) and len(unused) == len(pack.records):
                out.append(Unreferenced(UNUSED_PACK, fname, len(unused), pack.size))
            elif len(unused):
                out.append(Unreferenced(UNUSED_RECORDS, fname, len(unused),
                                        int(unused.sum(dtype=np.int64)) + len(unused) * RECORD_HEAD.size))
        return out

    # -- consequences ------------------------------------------------------

    def damage(self) -> tuple:
        r = self.reach
        paths = reach.reachable_from(r.parents, r.roots) if r.findings else {}
        return tuple(self._consequences(f, paths) for f in r.findings)

    def _consequences(self, f: Finding, reachable: dict) -> Damage:
        r = self.reach
        tensors = set(f.tensors)
        for cid in f.chunks:
            tensors |= r.chunk_tensors.get(cid, set())
        paths = {p for tid in tensors for p in r.tensor_paths.get(tid, ())}
        commits = self._commits(tensors, f.trees, f.commits)
        held = self._commits({t for cid in f.chunks for t in r.chunk_tensors.holders(cid)}, f.trees, f.commits)
        labels = set(f.refs) | {label for label, ids in reachable.items() if ids & commits}
        # a ref's reflog adds nothing when the ref itself reaches the damage
        labels = {x for x in labels if not (x.startswith(REFLOG) and x[len(REFLOG):] in labels)}
        return Damage(f.kind, f.object, f.detail, tuple(sorted(c.hex() for c in f.chunks)),
                      tuple(sorted(paths)), tuple(sorted(c.hex() for c in commits)), tuple(sorted(labels)),
                      through=self._through(f.chunks, held))

    def _commits(self, tensors: set, trees=(), commits=()) -> set:
        """``commits`` and the live commits whose trees (``trees`` among them) hold ``tensors``."""
        r = self.reach
        trees = set(trees).union(*(r.tensor_trees.get(tid, set()) for tid in tensors))
        return set(commits).union(*(r.tree_commits.get(tid, set()) for tid in trees))

    def _through(self, chunks: set, held: set) -> tuple:
        """((chunk, commits), ...) hex, of the live chunks that are deltas on ``chunks`` at any
        depth, each with the commits that hold it and are not in ``held``: such a commit loses
        nothing of its own when a remote lists its chunk whole (see ``mark_restorable``)."""
        if self._users is None:
            self._users = {}
            for cid, (base, _) in self.reach.deltas.items():
                self._users.setdefault(base, []).append(cid)
        out, seen, todo = [], set(chunks), list(chunks)
        while todo:
            for cid in self._users.get(todo.pop(), ()):
                if cid not in seen:
                    seen.add(cid)
                    todo.append(cid)
                    commits = self._commits(self.reach.chunk_tensors.holders(cid)) - held
                    if commits:
                        out.append((cid.hex(), tuple(sorted(c.hex() for c in commits))))
        return tuple(sorted(out))


# -- entry points -------------------------------------------------------------

def fsck(repo, quick: bool = False, threads: Optional[int] = None,
         progress: Optional[Callable[[int, int], None]] = None) -> FsckReport:
    """Check everything reachable from refs and the reflog; never raises on damage.

    ``quick`` skips reading and re-hashing chunk data. ``progress`` is called
    with (bytes verified, bytes to verify). Holds the shared gc lock while it
    runs. Raises LockHeld if gc runs too long, CorruptObject if the index
    itself cannot be read, OSError if the packs directory cannot be read.
    """
    # gc must not delete a pack between reading the index and reading the pack
    with repo.gc_lock.shared():
        return _fsck(repo, quick, threads or os.cpu_count() or 1, progress)


def _fsck(repo, quick: bool, threads: int, progress) -> FsckReport:
    start = time.perf_counter()
    with repo.index.read() as txn:
        checker = _Checker(reach.walk(txn, repo.objects, reach.COLLECT, locate=True))
        unverified = checker.locate_chunks(lambda ids: repo.chunks.remote_only(ids, txn),
                                           lambda ids: repo.chunks.lost(ids, txn))
        # Scanned after the snapshot was taken: every pack it names was sealed before.
        packs, tmps, odd = scan_packs(repo)
    for name in odd:
        checker.find(NOT_REGULAR, f"packs/{name}", "it is not a regular file (a symlink, FIFO or device); "
                     "mvc never reads it: remove it")
    good = checker.check_packed(packs)
    verified = 0
    if not quick and good.any():
        jobs = checker.jobs(good)
        total, done = sum(loc.length for loc in jobs.values()), 0

        def step(n):
            nonlocal done
            done += n
            progress(done, total)
        for p in repo.chunks.verify(jobs, threads=threads, progress=step if progress else None):
            checker.find(p.kind, f"chunk {_short(p.id)}", p.detail, chunks={p.id})
        verified = total
    r = checker.reach
    return FsckReport(quick, len(r.parents), r.trees, r.tensors, len(r.chunk_length),
                      len(packs), verified, time.perf_counter() - start, checker.damage(),
                      tuple(checker.unreferenced(packs, tmps, r.indexed_packs)),
                      unverified=len(unverified), unverified_bytes=sum(r.chunk_length[cid] for cid in unverified),
                      unverified_remote=getattr(repo.chunks, "name", None) if unverified else None,
                      leftovers=tuple(p.relative_to(repo.dir).as_posix() for p in scratch.leftovers(repo.dir)))


def mark_restorable(report: FsckReport, copies: Callable[[set], dict]) -> FsckReport:
    """``report`` with each chunk damage whose every chunk ``copies`` finds on a remote marked
    with those remotes (``Damage.remotes``), and else the commits it spares (``Damage.spared``):
    those that hold only deltas on a damaged base, every one of which a remote lists whole.
    ``copies`` maps chunk ids to a remote's name (``Repository.fsck`` passes the remotes'
    listings, ``repo.cache.restorable``)."""
    ids = {bytes.fromhex(c) for d in report.damage if not d.remotes
           for c in d.chunks + tuple(x for x, _ in d.through)}
    found = copies(ids) if ids else {}
    if not found:
        return report

    def mark(d: Damage) -> Damage:
        where = {found.get(bytes.fromhex(c)) for c in d.chunks}
        if d.remotes or not d.chunks:
            return d
        if None not in where:
            return dataclasses.replace(d, remotes=tuple(sorted(where)))
        return dataclasses.replace(d, spared=_spared(d.through, found))
    return dataclasses.replace(report, damage=tuple(mark(d) for d in report.damage))


def _spared(through: tuple, found: dict) -> tuple:
    """The commits of ``through`` none of whose chunks there is missing from ``found``."""
    lost = {c for x, commits in through if bytes.fromhex(x) not in found for c in commits}
    return tuple(sorted({c for _, commits in through for c in commits} - lost))


def rebuild_index(repo) -> RebuildReport:
    """Replace the chunk index by what the sealed packs' trailers list.

    Objects, refs and the reflog are untouched. When several packs hold the
    same chunk id, the first pack in name order wins. Packs whose trailer is
    damaged are skipped and reported. Raises LockHeld if gc runs too long,
    CorruptObject if the index cannot be written.
    """
    with repo.gc_lock.shared():
        return _rebuild_index(repo)


def _rebuild_index(repo) -> RebuildReport:
    with repo.index.write() as txn:
        # Listed inside the write transaction: a commit indexes its pack only
        # after sealing it, so every pack a later commit needs is found here
        # or indexed by that commit itself.
        packs, _, _ = scan_packs(repo)
        dropped = sum(1 for _ in txn.ids("chunks"))
        txn.drop_chunks()
        chunks = duplicates = 0
        done = repo.chunks.reindex(txn, [(name, p.path) for name, p in packs.items() if p.records is not None])
        for name, pack in packs.items() if done is None else ():  # a store with an entry per chunk
            if pack.records is None:
                continue
            for cid, loc in read_locations(pack.path, name):
                if txn.put_chunk(cid, loc):
                    chunks += 1
                else:
                    duplicates += 1
        chunks, duplicates = done or (chunks, duplicates)
        salvaged = _salvage(repo, txn, [p for p in packs.values() if p.records is None])
    skipped = tuple((pack.path.name, pack.error) for pack in packs.values() if pack.records is None)
    return RebuildReport(sum(1 for p in packs.values() if p.records is not None), chunks + salvaged,
                         duplicates, dropped, skipped, salvaged)


def _salvage(repo, txn, damaged: list) -> int:
    """Copy the verified records of unsealed packs that no sealed pack holds
    into one new sealed pack, and index them there; the damaged packs become
    unreferenced, for gc to delete. Returns how many records were saved."""
    batch = repo.chunks.writer()
    try:
        for pack in damaged:
            for cid, data in salvage_records(pack.path, repo.chunk_size):
                if txn.chunk(cid) is None:
                    batch.add(cid, data)
        batch.seal()
    except BaseException:
        batch.abort()
        raise
    batch.publish(txn)
    return batch.count


# Damage that loses a commit's data. An encoded record that does not decode, or a delta whose
# base is damaged, loses its chunk as surely as a checksum mismatch does.
PRUNABLE = {MISSING_TREE, CORRUPT_TREE, MISSING_TENSOR, CORRUPT_TENSOR, MISSING_CHUNK, BAD_INDEX_ENTRY,
            MISSING_PACK, DAMAGED_PACK, NOT_IN_PACK, BAD_RECORD, CHECKSUM, BAD_ENCODING, BROKEN_BASE,
            NOT_REGULAR}


def prune_lost(repo) -> tuple:
    """Mark the commits fsck finds with lost data as pruned (their records stay, gc can run
    again); their hex ids.

    Damage a remote can restore is not lost (``repo.fsck`` marks the chunks a remote's
    listing holds): it spares its commits, and 'mvc fsck --repair' restores them. So does a
    damaged delta base the remote lacks, for the commits whose own chunks it lists whole.
    """
    report = repo.fsck()
    lost = {c for d in report.lost if d.kind in PRUNABLE for c in d.lost_commits}
    note = {"time": time.time_ns() // 1000, "policy": "data lost (fsck found it missing or corrupt)"}
    with repo.index.write() as txn:
        for cid in lost:
            oid = bytes.fromhex(cid)
            if repo.objects.check(txn, "commits", oid)[0] is None and txn.pruned(oid) is None:
                txn.put_pruned(oid, note)
    return tuple(sorted(lost))
