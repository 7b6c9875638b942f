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
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from . import reach, scratch, sliced
from .errors import CorruptObject
from .reach import (CORRUPT_COMMIT, CORRUPT_REF, CORRUPT_REFLOG, CORRUPT_TENSOR, CORRUPT_TREE,  # noqa: F401
                    MISSING_COMMIT, MISSING_TENSOR, MISSING_TREE, REFLOG, Finding)
from .store import chunks as chunkstore
from .store import idarray
from .store.chunks import RECORD_OVERHEAD, pack_filename

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
                pack.records = repo.chunks.pack_records(f.pack)
            except (CorruptObject, FileNotFoundError) as exc:
                pack.error = str(exc)
            packs[f.pack] = pack
    return packs, tmps, odd


class _Checker:
    """One fsck run, a step of the id space at a time (``mvc.sliced``): the walk's Reach, what
    is broken, and where the reachable chunks whose index entries are sound lie (``rows``, by
    pack). Findings after the walk's carry a sort key, so that the report lists them in the
    same order whatever the steps: located chunks by id, then packs by name, then records."""

    def __init__(self, found: reach.Reach, live: sliced.Spill, held: list, where: sliced.Scratch):
        self.reach, self.live, self.held = found, live, held
        self.rows = sliced.PackRows(live.budget, where)
        self.edges: Optional[sliced.Spill] = None
        self.later: list = []  # (sort key, Finding)
        self.chunks = 0  # reachable chunks, delta bases included
        self.away, self.away_bytes = 0, 0  # reachable chunks only a remote holds
        self.indexed_packs: set = set()
        self.not_good: set = set()  # reachable ids whose entry is sound but whose record is not where it says
        self._names: Optional[tuple] = None

    def find(self, key: tuple, kind, what, detail, **where) -> None:
        self.later.append((key, Finding(kind, what, detail, **{k: set(v) for k, v in where.items()})))

    def locate(self, step: sliced.Step, elsewhere: Callable[[list], set],
               lost: Callable[[list], dict] = lambda ids: {}) -> None:
        """Check each of the step's reachable chunks' index entry; those not indexed here that
        ``elsewhere`` (a remote) holds are counted as held there. ``lost``: {id: pack} of ids a
        pack index lists in a pack that cannot say where (gone, cut short): located there, at
        offset 0, so that the pack's damage names them."""
        locs, lengths = step.locations, step.lengths
        unplaced = np.flatnonzero(~step.located)
        where = lost(idarray.ids(step.ids[unplaced])) if len(unplaced) else {}
        for i in unplaced.tolist() if where else ():
            pack = where.get(step.cid(i))
            if pack is not None:
                step.located[i] = True
                locs["pack"][i] = np.frombuffer(pack, dtype="V16")[0]
                locs["offset"][i], locs["length"][i], locs["size"][i] = 0, lengths[i], lengths[i]
        bad = step.located & locs["bad"]
        wrong = step.located & ~locs["bad"] & (locs["size"] != lengths)
        ok = step.located & ~bad & ~wrong
        self.chunks += len(step.ids)
        self.indexed_packs |= step.packs
        lost = np.flatnonzero(~step.located)
        missing = idarray.ids(step.ids[lost])
        away = elsewhere(missing) if missing else set()  # evicted or never fetched: read from a remote
        for i, cid in zip(lost.tolist(), missing):
            if cid in away:
                self.away += 1
                self.away_bytes += int(lengths[i])
            else:
                self.find((1, 0, b"", cid), MISSING_CHUNK, f"chunk {_short(cid)}",
                          "the chunk is missing from the chunk index", chunks={cid})
        for i in np.flatnonzero(bad).tolist():
            cid = step.cid(i)
            self.find((1, 1, b"", cid), BAD_INDEX_ENTRY, f"chunk {_short(cid)}", step.bad.get(cid, "damaged"),
                      chunks={cid})
        for i in np.flatnonzero(wrong).tolist():
            cid = step.cid(i)
            self.not_good.add(cid)
            self.find((1, 2, b"", cid), BAD_INDEX_ENTRY, f"chunk {_short(cid)}", f"the index gives it "
                      f"{int(locs['size'][i])} bytes, its tensor needs {int(lengths[i])}", chunks={cid})
        self.rows.add(step, np.flatnonzero(ok))

    # -- packs -------------------------------------------------------------

    def match_trailers(self, chunks, listing: list) -> tuple:
        """Check the located chunks' records against their packs' trailers, a pack at a time
        (its rows a budget at a time), and count what no reachable chunk uses: (the
        Unreferenced of the sealed packs, in ``listing``'s order; {pack name: path} of the
        packs with records to verify; the bytes those hold)."""
        out, good, total = [], {}, 0
        sealed = {f.pack: f for f in listing if f.regular and f.pack is not None}
        for name in sorted(self.rows.packs() - set(sealed)):
            self._whole_pack(name, MISSING_PACK, "the pack file is missing; it held")
        for name, f in sealed.items():
            table, error = _trailer(chunks, name)
            if table is None:
                if name in self.rows.packs():
                    self._whole_pack(name, DAMAGED_PACK, f"{error}; it holds")
                else:
                    out.append(Unreferenced(UNREACHABLE_DAMAGED_PACK, f.path.name, 0, f.size))
                continue
            listing, any_rows = sliced.Listing(table), False
            for rows in self.rows.blocks(name, plain=True):
                any_rows = any_rows or bool(len(rows))
                listed = listing.match(rows)
                for i in np.flatnonzero(~listed).tolist():
                    cid = idarray.one(rows["id"], i)
                    self.not_good.add(cid)
                    self.find((3, 0, name, cid), NOT_IN_PACK, f"chunk {_short(cid)}", f"sealed pack "
                              f"{pack_filename(name)} does not list it at offset {int(rows['offset'][i])}",
                              chunks={cid})
                if listed.any():
                    good[name] = f.path
                    total += int(rows["length"][listed].sum(dtype=np.int64))
            unused = _unused(f, table, listing.used, any_rows, name in self.indexed_packs)
            if unused is not None:
                out.append(unused)
        return out, good, total

    def _whole_pack(self, name: bytes, kind: str, detail: str) -> None:
        """Damage to a pack as a whole: every located chunk in it."""
        cids = {cid for rows in self.rows.blocks(name, plain=True) for cid in idarray.ids(rows["id"])}
        self.not_good |= cids
        self.find((3, 0, name, b""), kind, f"pack {pack_filename(name)}", f"{detail} {_chunks(len(cids))}",
                  chunks=cids)

    def verify(self, chunks, txn, packs: dict, threads: int, step) -> None:
        """Re-read and re-hash the records of ``packs`` (``match_trailers``'s) through the store's
        pack checker, a budget of them at a time; a delta's base elsewhere is located through
        ``txn`` unless its record is damaged."""
        # each block made when the checker takes it, and read here beside its PackCheck (tee holds one)
        mine, checked = itertools.tee(self._blocks(chunks, txn, packs))
        for (_, jobs), check in zip(mine, chunks.check_packs(checked, threads=threads, progress=step)):
            for seq, p in enumerate(check.problems):
                loc = dict.get(jobs, p.id)
                key = (4, int(loc.coded), loc.pack, b"", loc.offset, seq) if loc else (4, 2, b"", b"", 0, seq)
                self.find(key, p.kind, f"chunk {_short(p.id)}", p.detail, chunks={p.id})

    def _blocks(self, chunks, txn, packs: dict):
        """(pack name, _Jobs) of the trailer-listed located records of ``packs``, a budget of
        them at a time."""
        for name in sorted(packs):
            table, _ = _trailer(chunks, name)
            for rows in self.rows.blocks(name):
                rows = rows[_listed(table, rows)] if table is not None else rows[:0]
                jobs = _Jobs(txn, self.not_good)
                for i in range(len(rows)):
                    jobs[idarray.one(rows["id"], i)] = sliced.location(rows, i)
                if jobs:
                    yield name, jobs

    # -- consequences ------------------------------------------------------

    def damage(self) -> tuple:
        r = self.reach
        r.findings += [f for _, f in sorted(self.later, key=lambda kf: kf[0])]
        self.later = []
        if not r.findings:
            return ()
        paths = reach.reachable_from(r.parents, r.roots)
        named = set().union(*(f.chunks for f in r.findings))
        users = sliced.users(self.edges, named) if self.edges is not None else {}
        holders = sliced.holders(self.live, named | {u for us in users.values() for u in us})
        self._names = users, {cid: {self.held[k] for k in owners} for cid, owners in holders.items()}
        return tuple(self._consequences(f, paths) for f in r.findings)

    def _holders(self, cid: bytes) -> set:
        return self._names[1].get(cid, set())

    def _tensors(self, cid: bytes) -> set:
        """The tensors that hold ``cid`` or a chunk that is a delta on it, at any depth."""
        users, out, seen, todo = self._names[0], set(), {cid}, [cid]
        while todo:
            at = todo.pop()
            out |= self._holders(at)
            for user in users.get(at, ()):
                if user not in seen:
                    seen.add(user)
                    todo.append(user)
        return out

    def _consequences(self, f: Finding, reachable: dict) -> Damage:
        r = self.reach
        tensors = set(f.tensors)
        for cid in f.chunks:
            tensors |= self._tensors(cid)
        paths = {p for tid in tensors for p in r.tensor_paths.get(tid, ())}
        commits = self._commits(tensors, f.trees, f.commits)
        held = self._commits({t for cid in f.chunks for t in self._holders(cid)}, f.trees, f.commits)
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
        users = self._names[0]
        out, seen, todo = [], set(chunks), list(chunks)
        while todo:
            for cid in users.get(todo.pop(), ()):
                if cid not in seen:
                    seen.add(cid)
                    todo.append(cid)
                    commits = self._commits(self._holders(cid)) - held
                    if commits:
                        out.append((cid.hex(), tuple(sorted(c.hex() for c in commits))))
        return tuple(sorted(out))


class _Jobs(dict):
    """{chunk id: Location} of one pack's records to verify; a delta base among them or, unless
    its record is damaged (``not_good``), located in the index."""

    def __init__(self, txn, not_good: set):
        super().__init__()
        self.txn, self.not_good = txn, not_good

    def get(self, cid, default=None):
        loc = dict.get(self, cid)
        if loc is None and cid not in self.not_good:
            try:
                loc = self.txn.chunk(cid)
            except CorruptObject:
                loc = None
        return default if loc is None else loc


def _trailer(chunks, name: bytes) -> tuple:
    """(the records sealed pack ``name``'s trailer lists, sorted by offset, "") or (None, why it
    cannot be read)."""
    try:
        return chunks.pack_records(name), ""
    except (CorruptObject, FileNotFoundError) as exc:
        return None, str(exc)


def _listed(table: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Whether the trailer (sorted by offset) lists each of ``rows`` (sliced.ROW) where it says."""
    return sliced.Listing(table).match(rows)


def _unused(f, table: np.ndarray, used: np.ndarray, any_rows: bool, indexed: bool) -> Optional[Unreferenced]:
    """The records of a sealed pack that no located reachable chunk is at (``used``: the
    trailer's records some located chunk's offset names; ``any_rows``: whether any does)."""
    if not indexed and not any_rows:
        return Unreferenced(UNINDEXED_PACK, f.path.name, len(table), f.size)
    unused = table["length"][~used]
    if len(unused) and len(unused) == len(table):
        return Unreferenced(UNUSED_PACK, f.path.name, len(unused), f.size)
    if len(unused):
        return Unreferenced(UNUSED_RECORDS, f.path.name, len(unused),
                            int(unused.sum(dtype=np.int64)) + len(unused) * RECORD_OVERHEAD)
    return None


# -- entry points -------------------------------------------------------------

def fsck(repo, quick: bool = False, threads: Optional[int] = None,
         progress: Optional[Callable[[int, int], None]] = None, budget: Optional[int] = None) -> FsckReport:
    """Check everything reachable from refs and the reflog; never raises on damage.

    ``quick`` skips reading and re-hashing chunk data. ``progress`` is called
    with (bytes verified, bytes to verify). ``budget``: live records held in
    memory at once (``mvc.sliced``; default ``MVC_WALK_BUDGET`` or 2**20);
    beyond it they go to a scratch folder, a slice of the id space at a time.
    Holds the shared gc lock while it runs. Raises LockHeld if gc runs too
    long, CorruptObject if the index itself cannot be read, OSError if the
    packs directory cannot be read.
    """
    # gc must not delete a pack between reading the index and reading the pack
    with repo.gc_lock.shared():
        return _fsck(repo, quick, threads or os.cpu_count() or 1, progress, sliced.budget(budget))


def _fsck(repo, quick: bool, threads: int, progress, budget: int) -> FsckReport:
    start = time.perf_counter()
    with sliced.Scratch(repo.dir) as where, repo.index.read() as txn:
        live = sliced.Spill(sliced.RECORD, budget, where)
        found, held = reach.walk_spilled(txn, repo.objects, live, reach.COLLECT)
        checker = _Checker(found, live, held, where)
        walk = sliced.LivePass(txn, live, where)
        for step in walk.steps():
            checker.locate(step, lambda ids: repo.chunks.remote_only(ids, txn), lambda ids: repo.chunks.lost(ids, txn))
            del step  # not held while the next one is made
        checker.edges = walk.edges
        # Listed after the snapshot was taken: every pack it names was sealed before.
        try:
            listing = repo.chunks.pack_files()
        except FileNotFoundError:  # every pack is missing: the findings will say what that breaks
            listing = []
        for seq, f in enumerate(x for x in listing if not x.regular):
            checker.find((2, 0, b"", b"", seq), NOT_REGULAR, f"packs/{f.path.name}", "it is not a regular file "
                         "(a symlink, FIFO or device); mvc never reads it: remove it")
        unreferenced, good, total = checker.match_trailers(repo.chunks, listing)
        tmps = [Unreferenced(TMP_PACK, f.path.name, 0, f.size) for f in listing if f.regular and f.pack is None]
        verified = 0
        if not quick and good:
            done = 0

            def step(n):
                nonlocal done
                done += n
                progress(done, total)
            checker.verify(repo.chunks, txn, good, threads, step if progress else None)
            verified = total
        damage = checker.damage()
    r = checker.reach
    return FsckReport(quick, len(r.parents), r.trees, r.tensors, checker.chunks,
                      sum(1 for f in listing if f.regular and f.pack is not None), verified,
                      time.perf_counter() - start, damage, tuple(tmps + unreferenced),
                      unverified=checker.away, unverified_bytes=checker.away_bytes,
                      unverified_remote=getattr(repo.chunks, "name", None) if checker.away else None,
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
            for cid, loc in repo.chunks.pack_locations(name):
                if txn.put_chunk(cid, loc):
                    chunks += 1
                else:
                    duplicates += 1
        chunks, duplicates = done or (chunks, duplicates)
        salvaged = _salvage(repo, txn, [(name, p) for name, p in packs.items() if p.records is None])
    skipped = tuple((pack.path.name, pack.error) for pack in packs.values() if pack.records is None)
    return RebuildReport(sum(1 for p in packs.values() if p.records is not None), chunks + salvaged,
                         duplicates, dropped, skipped, salvaged)


def _salvage(repo, txn, damaged: list) -> int:
    """Copy the verified records of unsealed packs that no sealed pack holds
    into one new sealed pack, and index them there; the damaged packs become
    unreferenced, for gc to delete. Returns how many records were saved."""
    batch = repo.chunks.writer()
    try:
        for name, pack in damaged:
            for cid, data in repo.chunks.salvage(name, repo.chunk_size):
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
