"""gc: delete what nothing reaches and reclaim its space; retention prunes old commits.

Vocabulary:

- **root**: a commit a ref names (``HEAD``, branches, tags) or a reflog
  entry names (old or new id). The reflog of a deleted branch or tag is
  kept (it ends in the deletion) so its tip can be recovered; gc expires its
  entries once they are older than ``refs.DELETED_REFLOG_S`` (30 days, as
  Git's gc.reflogExpireUnreachable), not the grace period packs get
  (``mvc reflog expire NAME`` drops them at once).
- **live**: a root; a parent of a live commit; the tree of a live commit that
  is not pruned, that tree's tensors and their chunks. Everything else in
  the index is **garbage**, and so is every pack record no live chunk's
  index entry points at.
- **pruned commit**: retention keeps its record (message, metrics, parents,
  so history and every commit id stay as they were) but no longer counts its
  tree as live, so gc deletes its tensor data. Loading it says so. This is
  what ``git lfs prune`` does to old file contents.
- **retention policy**: per branch in scope, keep the last N commits of its
  first-parent chain and/or the best K by a metric; prune the rest. Branch
  tips, tagged commits, what HEAD names, and commits on the first-parent
  chain of any branch outside the scope are always kept; a protected branch
  is only pruned with ``force``.

The steps are ordered so that a crash at any moment is harmless:

1. one write transaction: prune marks, reflog expiry, deletion of garbage
   objects and chunk index entries (all of it or none of it);
2. the live records of packs that are over a quarter garbage are copied
   into a new pack, which is sealed and fsynced;
3. one write transaction points their index entries at the new pack;
4. the old packs, packs that no longer hold anything live, and stale
   ``.pack.tmp`` files are deleted.

A crash between steps leaves only unreferenced packs that the next gc
deletes. gc holds the exclusive gc lock throughout, so no commit runs
meanwhile (a commit's new chunks are not indexed until its last step).
"""

import errno
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from . import reach, refs, scratch, sliced
from .errors import BadInput, CorruptObject, MetricNotRecorded, MvcError, ProtectedRef, UnknownRevision, WalkDamaged
from .store import idarray
from .store.locks import GcLock
from .store.index import location_row, reflog_entry
from .store.chunks import RECORD_OVERHEAD, pack_named

# Rewrite a pack when less than this share of its record bytes is live. A pack
# is rewritten once: its live records land in a new pack that is all live, so a
# frozen backbone saved with the first checkpoint is copied once, not every gc.
REWRITE_BELOW = 0.75
GRACE_S = 60.0
# With repack, all-live packs under this size are merged: a run that commits
# every few steps leaves one small pack per commit, and each costs a
# descriptor and a seek on every load that spans them.
SMALL_PACK = 32 << 20  # leave packs no index entry ever named, and .tmp files, alone while younger


@dataclass(frozen=True)
class Retention:
    """Which old commits to prune; inactive when neither keep_last nor keep_best is set."""

    keep_last: Optional[int] = None
    branch: Optional[str] = None
    keep_best: Optional[str] = None
    mode: str = "min"
    top: int = 1

    @property
    def active(self) -> bool:
        return self.keep_last is not None or self.keep_best is not None

    def check(self) -> None:
        """BadInput for a policy that makes no sense."""
        for name, n in (("keep-last", self.keep_last), ("top", self.top)):
            if n is not None and (type(n) is not int or n < 1):
                raise BadInput(f"{name} must be a whole number of at least 1, not {n!r}")
        if self.mode not in ("min", "max"):
            raise BadInput(f"the keep-best mode must be 'min' or 'max', not {self.mode!r}")
        if self.branch is not None and not self.active:
            raise BadInput("a branch only selects what keep-last / keep-best prune; give one of them")

    def describe(self) -> str:
        parts = []
        if self.keep_last is not None:
            parts.append(f"keep-last {self.keep_last}")
        if self.keep_best is not None:
            parts.append(f"keep-best {self.keep_best} {self.mode} top {self.top}")
        where = f"branch {self.branch}" if self.branch else "every branch"
        return f"{', '.join(parts)} on {where}"


YOUNG, MOSTLY_LIVE = "young", "mostly-live"


@dataclass(frozen=True)
class LeftAlone:
    """Unreferenced bytes a gc keeps on purpose: ``young`` (a file younger than
    the grace period, which a running writer may still be about to index;
    ``gc --grace 0`` takes it when no writer runs) or ``mostly-live`` (a pack
    under the rewrite threshold; ``gc --repack`` rewrites it)."""

    kind: str
    pack: str  # file name in .mvc/packs
    bytes: int  # the garbage bytes it holds
    why: str


@dataclass(frozen=True)
class GcReport:
    """What gc removed (or, with ``dry_run``, would remove). Ids are hex."""

    dry_run: bool
    bytes_before: int  # everything under .mvc, as allocated on disk
    bytes_after: int  # with dry_run: an estimate
    pack_bytes_before: int
    pack_bytes_after: int
    pruned: tuple = ()  # commits retention pruned in this run
    skipped_branches: tuple = ()  # protected branches retention left alone
    reflog_expired: int = 0
    commits_removed: int = 0
    trees_removed: int = 0
    tensors_removed: int = 0
    chunks_removed: int = 0  # chunk index entries
    packs_deleted: int = 0  # packs that held nothing live
    packs_rewritten: int = 0  # packs over a quarter garbage, whose live records moved to a new pack
    records_moved: int = 0  # live records copied out of rewritten packs
    tmp_removed: int = 0
    notes: tuple = field(default=())  # packs left alone and why
    left: tuple = field(default=())  # LeftAlone: garbage this gc kept on purpose, and what reclaims it
    scratch_removed: tuple = ()  # scratch entries of killed commands under .mvc/tmp (mvc.scratch)

    @property
    def bytes_reclaimed(self) -> int:
        return self.bytes_before - self.bytes_after


def gc(repo, keep_last: Optional[int] = None, branch: Optional[str] = None, keep_best: Optional[str] = None,
       mode: str = "min", top: int = 1, force: bool = False, dry_run: bool = False,
       grace: float = GRACE_S, repack: bool = False, wait: Optional[float] = None,
       budget: Optional[int] = None) -> GcReport:
    """Prune by the retention policy (if any), then delete garbage and reclaim pack space.

    ``grace``: seconds a ``.tmp`` file or a pack no index entry names is left
    alone (a running writer may be about to index it). ``repack``: rewrite
    every pack that holds any garbage, not only those over a quarter garbage.
    ``wait``: seconds to wait for the gc lock (None: the repository's
    ``lock_timeout``; 0: do not wait, as an estimate asked for on a page).
    The report's ``left`` says what was kept on purpose and why. ``budget``: live
    records held in memory at once (``mvc.sliced``; default ``MVC_WALK_BUDGET``
    or 2**20); beyond it they go to a scratch folder, a slice of the id space
    at a time.

    Raises BadInput for a bad policy, UnknownRevision for an unknown
    ``branch``, ProtectedRef for a protected ``branch`` without ``force``,
    CorruptObject (deleting nothing) if something live is missing or
    damaged, and LockHeld if commits keep running or another gc runs.
    """
    policy = Retention(keep_last, branch, keep_best, mode, top)
    policy.check()
    budget = sliced.budget(budget)
    # a dry run changes nothing: the shared lock keeps packs in place while it looks, and
    # it neither waits for running commits nor writes the exclusive lock's holder note
    lock = repo.gc_lock if wait is None else GcLock(repo.gc_lock.dir, wait)
    with (lock.shared() if dry_run else lock.exclusive()), sliced.Scratch(repo.dir) as where:
        repo.reread_format()  # a repack elsewhere may have turned on encoded records since open
        before, packs_before = disk_usage(repo.dir), _packs_usage(repo.chunks)
        # what needs no index write goes first: on a full disk it is the room the rest needs
        gone = () if dry_run else tuple(p.relative_to(repo.dir).as_posix()
                                        for p in scratch.remove_leftovers(repo.dir))
        try:
            with (repo.index.read() if dry_run else repo.index.write()) as txn:
                sweep = _sweep(txn, repo.objects, policy, force, dry_run, repo.chunks,
                               where=where, budget=budget)
        except OSError as exc:
            if dry_run or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            sweep = _sweep_on_a_full_disk(repo, policy, force, grace, where, budget)
        plan = plan_packs(repo.chunks.pack_files(), sweep.live, sweep.indexed_packs, grace, repack, store=repo.chunks)
        where.close()  # the plan holds what it needs; the spills go before the bytes on disk are counted
        if dry_run:
            saved = plan.reclaimable()
            return sweep.report(True, before, before - saved, packs_before, packs_before - saved, plan)
        moved = compact(repo, plan)  # dead packs go before the rewrite needs room for a new one
        return replace(sweep.report(False, before, disk_usage(repo.dir), packs_before,
                                    _packs_usage(repo.chunks), plan, moved), scratch_removed=gone)


def disk_usage(path: Path) -> int:
    """Bytes allocated on disk for the files under ``path`` (what du counts)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _packs_usage(chunks) -> int:
    """Bytes the chunk store's pack files take on disk."""
    return sum(f.allocated for f in chunks.pack_files())


# -- step 1: retention, marking and sweeping, in one transaction ---------------

class _History:
    """First-parent chains, each commit read (and verified) once however many branches share it."""

    def __init__(self, txn, objects):
        self.txn, self.objects, self._memo = txn, objects, {}

    def commit(self, oid: bytes):
        obj = self._memo.get(oid)
        if obj is None:
            try:
                obj = self._memo[oid] = self.objects.commit(self.txn, oid)
            except MvcError as exc:
                raise CorruptObject(f"gc stopped, nothing was deleted: {exc}", id=oid) from None
        return obj

    def chain(self, oid: bytes, stop=frozenset()) -> list:
        """(id, commit object) along first parents from ``oid``, newest first, ending before ``stop``."""
        return list(reach.first_parents(self.commit, oid, stop))


def _best(chain: list, metric: str, mode: str, top: int, pruned) -> set:
    """Ids of the ``top`` best commits by ``metric`` among those that still have data."""
    scored = [(obj.metrics[metric], i, oid) for i, (oid, obj) in enumerate(chain)
              if metric in obj.metrics and not math.isnan(obj.metrics[metric]) and not pruned(oid)]
    scored.sort(key=lambda s: (s[0] if mode == "min" else -s[0], s[1]))  # ties: the newer one
    return {oid for _, _, oid in scored[:top]}


def _retention(txn, objects, policy: Retention, force: bool) -> tuple:
    """(ids to prune now, protected branches skipped)."""
    tips = {name[len(refs.BRANCHES):]: v for name, v in txn.refs(refs.BRANCHES) if v.id is not None}
    if policy.branch is not None:
        if policy.branch not in tips:
            raise UnknownRevision(f"branch {policy.branch!r} does not exist", rev=policy.branch, reason="unknown")
        if tips[policy.branch].protected and not force:
            raise ProtectedRef(f"branch {policy.branch!r} is protected", ref=refs.BRANCHES + policy.branch,
                               action="prune", forced="prune its history")
        scope = [policy.branch]
    else:
        scope = [b for b, v in tips.items() if force or not v.protected]
    skipped = tuple(sorted(b for b in tips if b not in scope and policy.branch is None))
    kept = {v.id for _, v in txn.refs() if v.id is not None}  # every branch tip, tag and detached HEAD
    history, candidates, outside = _History(txn, objects), set(), set()

    def pruned(oid: bytes) -> bool:
        return txn.pruned(oid) is not None
    for name, value in tips.items():  # history outside the scope is kept: each commit walked once
        if name not in scope:
            outside |= {oid for oid, _ in history.chain(value.id, outside)}
    kept |= outside
    lacking = {}  # branch in scope whose history never records the metric -> metrics it does record
    for name in scope:
        if policy.keep_best is None:  # only the newest N matter per branch; shared history is walked once
            head = history.chain(tips[name].id)[:policy.keep_last] if policy.keep_last else []
            kept |= {oid for oid, _ in head}
            candidates |= {oid for oid, _ in history.chain(tips[name].id, candidates)}
            continue
        chain = history.chain(tips[name].id)
        recorded = {m for _, obj in chain for m in obj.metrics}
        if policy.keep_best not in recorded:
            lacking[name] = recorded
        if policy.keep_last is not None:
            kept |= {oid for oid, _ in chain[:policy.keep_last]}
        kept |= _best(chain, policy.keep_best, policy.mode, policy.top, pruned)
        candidates |= {oid for oid, _ in chain}
    if lacking:
        # a mistyped metric, or a branch that never records it, must not turn
        # "keep the best" into "keep none" there
        known = ", ".join(sorted(set().union(*lacking.values()))) or "none"
        raise MetricNotRecorded(f"no commit on branch {', '.join(map(repr, sorted(lacking)))} records metric "
                                f"{policy.keep_best!r} (recorded: {known}); nothing was pruned: pick the "
                                "branches that record it", metric=policy.keep_best,
                                recorded=sorted(set().union(*lacking.values())), branches=sorted(lacking))
    return {oid for oid in candidates - kept if not pruned(oid)}, skipped


@dataclass
class _Sweep:
    pruned: set
    skipped: tuple
    reflog_expired: int = 0
    removed: dict = field(default_factory=dict)  # kind -> count
    live: Optional["SlicedRecords"] = None  # where the live chunks lie
    indexed_packs: set = field(default_factory=set)  # pack names any chunk entry named before the sweep
    writes: list = field(default_factory=list)  # (Txn method or function of txn, args): the index writes, in order

    def report(self, dry_run, before, after, packs_before, packs_after, plan, moved: int = 0) -> GcReport:
        return GcReport(dry_run, before, after, packs_before, packs_after, tuple(sorted(o.hex() for o in self.pruned)),
                        self.skipped, self.reflog_expired, self.removed.get("commits", 0),
                        self.removed.get("trees", 0), self.removed.get("tensors", 0), self.removed.get("chunks", 0),
                        len(plan.delete), len(plan.rewrite),
                        moved if not dry_run else sum(len(live) for _, live in plan.rewrite),
                        len(plan.tmp), tuple(plan.notes), tuple(plan.left))


def _sweep(txn, objects, policy: Retention, force: bool, dry_run: bool, chunks=None, apply: bool = True,
           where: Optional[sliced.Scratch] = None, budget: Optional[int] = None) -> _Sweep:
    """Retention, marking and sweeping in ``txn``; the writes are made there
    unless ``dry_run`` or not ``apply`` (then ``_Sweep.writes`` lists them).
    ``where``: the scratch folder of the live records (kept for ``plan_packs``)."""
    prune, skipped = _retention(txn, objects, policy, force) if policy.active else (set(), ())
    sweep = _Sweep(prune, skipped)
    expired = []  # entries whose new commit is (being) pruned: they would keep its data alive
    now = time.time_ns() // 1000
    for ref, seq, raw in txn.reflog_raw():
        entry = reflog_entry(raw)
        new = entry.get("new") if entry is not None else None
        if new is not None and (new in prune or txn.pruned(new) is not None):
            expired.append((ref, seq))
        elif refs.deleted_entry_expired(txn, ref, entry, now):
            expired.append((ref, seq))
    sweep.reflog_expired = len(expired)
    # The one walk fsck makes too; damage stops gc before anything is deleted.
    where = where if where is not None else sliced.Scratch()
    spill = sliced.Spill(sliced.RECORD, sliced.budget(budget), where)
    live, _ = reach.walk_spilled(txn, objects, spill, reach.RAISE, prune=prune, skip_reflog=expired)
    writes = sweep.writes  # retention's notes first: a sweep cut short leaves pruned commits, never lost ones
    note = {"time": time.time_ns() // 1000, "policy": policy.describe()}
    writes += [("put_pruned", (oid, note)) for oid in prune] + [(refs.forget, ([e],)) for e in expired]
    for kind, dead in dead_objects(txn, live).items():
        sweep.removed[kind] = len(dead)
        writes += [("delete", (kind, oid)) for oid in dead]
    dead = _sweep_chunks(sweep, txn, spill, chunks, dry_run, where)
    if not dry_run:
        # a registered pack no live chunk lies in leaves the index whole, one write, before the
        # chunk entries go: its dead chunks then need no tombstone each (pages a full disk may
        # not have), and no commit can deduplicate against it once this commits
        unused = [name for _, name, _ in txn.registered_packs() if name not in sweep.live]
        writes += [("unregister_packs", (unused,))] if unused else []
        writes += [(_delete_chunks, (dead,))] if apply else [("delete_chunk", (cid,)) for cid in dead()]
    writes += [("delete_pruned", (oid,)) for oid in txn.ids("pruned") if oid not in live.commits]
    if apply and not dry_run:
        _write(txn, writes)
    return sweep


def _sweep_chunks(sweep: _Sweep, txn, spill: sliced.Spill, chunks, dry_run: bool, where: sliced.Scratch):
    """The chunk part of the sweep, a step of the id space at a time (``sliced.LivePass``):
    where each live chunk lies, which packs the index names, which entries are garbage.
    Returns a function that yields the garbage entries' ids (none with ``dry_run``)."""
    budget = spill.budget
    records = SlicedRecords(budget, where)
    dead = sliced.Spill(sliced.ID_ONLY, budget, where)
    revived = sliced.Spill(sliced.ID_ONLY, budget, where)
    missing, example, count = 0, None, 0
    for step in sliced.LivePass(txn, spill, where).steps():
        for cid, why in step.bad.items():
            raise WalkDamaged(f"gc stopped, nothing was deleted: chunk {cid.hex()[:12]}: {why}",
                              kind="bad-chunk-entry", what=f"chunk {cid.hex()[:12]}", id=cid)
        sweep.indexed_packs |= step.packs
        lost = idarray.ids(step.ids[~step.located])
        away = chunks.remote_only(lost, txn) if chunks is not None and lost else set()
        for cid in lost:
            if cid not in away:  # not even a remote holds it
                missing, example = missing + 1, example or cid
        records.add(step, np.flatnonzero(step.located))
        ids = step.ids[step.located] if step.late else step.dead
        (revived if step.late else dead).add(_id_records(ids) if not dry_run else _id_records(ids[:0]))
        count += -len(ids) if step.late else len(ids)
        del step, ids  # not held while the next step is made
    if missing:
        raise CorruptObject(f"gc stopped, nothing was deleted: {missing} live chunks (e.g. {example.hex()[:12]}) "
                            "are not in the chunk index", id=example)
    sweep.live = records
    sweep.removed["chunks"] = count

    def dead_ids() -> Iterator[bytes]:
        b = 0
        while b < sliced.SLICES:
            e = dead.end(b, revived.counts)
            gone = dead.take(b, e)["id"]
            if len(gone):
                back = revived.take(b, e)["id"]
                yield from idarray.ids(gone[~np.isin(gone, back)] if len(back) else gone)
            b = e
    return dead_ids


def _id_records(ids: np.ndarray) -> np.ndarray:
    out = np.zeros(len(ids), dtype=sliced.ID_ONLY)
    out["id"] = ids
    return out


def _delete_chunks(txn, dead) -> None:
    for cid in dead():
        txn.delete_chunk(cid)


def dead_chunks(live: reach.Reach) -> list:
    """Ids of the chunk index entries nothing live uses, from a ``walk(locate=True)``; an entry
    whose value does not decode is left for fsck to name (it cannot say which pack it names)."""
    return [cid for d in live.dead for cid in idarray.ids(d) if cid not in live.bad_entries]


def dead_objects(txn, live: reach.Reach) -> dict:
    """{kind: ids} of the commits, trees and tensors the walk ``live`` did not reach."""
    keep = {"commits": live.commits.keys(), "trees": live.tree_commits.keys(), "tensors": live.tensor_trees.keys()}
    return {kind: [oid for oid in txn.ids(kind) if oid not in ids] for kind, ids in keep.items()}


def drop_dead(txn, live: reach.Reach) -> int:
    """Delete, in write transaction ``txn``, the objects and chunk entries nothing live uses
    (``dead_objects``, ``dead_chunks``); how many chunk entries.

    Whatever deletes packs does this first, in a transaction that commits before the first
    unlink: an entry left naming a deleted pack is a chunk a later commit would not write, and
    a tensor object left whose chunks went is one a fetch takes as held and fetches nothing of."""
    for kind, dead in dead_objects(txn, live).items():
        for oid in dead:
            txn.delete(kind, oid)
    dead = dead_chunks(live)
    for cid in dead:
        txn.delete_chunk(cid)
    return len(dead)


def _write(txn, writes: list) -> None:
    for method, args in writes:
        if callable(method):  # a write another module owns (the reflog's: refs.forget)
            method(txn, *args)
        else:
            getattr(txn, method)(*args)


STEP = 256  # index writes per transaction when the disk is full


def _sweep_on_a_full_disk(repo, policy: Retention, force: bool, grace: float = GRACE_S,
                          where: Optional[sliced.Scratch] = None, budget: Optional[int] = None) -> _Sweep:
    """The sweep in small transactions, for a disk too full for it in one.

    LMDB reuses the pages each small transaction frees for the next, so
    this needs no room on the disk; gc holds the exclusive gc lock, so no
    commit can take up what is being deleted in between. Only garbage is
    deleted (retention's notes go first), so stopping halfway leaves less
    garbage, never a lost commit; the packs are deleted after."""
    with repo.index.read() as txn:
        sweep = _sweep(txn, repo.objects, policy, force, False, repo.chunks, apply=False,
                       where=where, budget=budget)
    start, step = 0, STEP
    while start < len(sweep.writes):
        try:
            with repo.index.write() as txn:
                _write(txn, sweep.writes[start:start + step])
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or step == 1:
                raise
            step //= 2  # fewer pages than a step frees: smaller steps, until the freed pages suffice
            continue
        start += step
    return sweep


# -- steps 2-4: packs -----------------------------------------------------------

@dataclass
class _PackPlan:
    delete: list = field(default_factory=list)  # paths of sealed packs holding nothing live
    rewrite: list = field(default_factory=list)  # (path, [(chunk id, Location)]) over a quarter garbage
    tmp: list = field(default_factory=list)  # stale .pack.tmp paths
    notes: list = field(default_factory=list)
    left: list = field(default_factory=list)  # LeftAlone

    def reclaimable(self) -> int:
        gone = self.delete + self.tmp + [path for path, _ in self.rewrite]
        kept = sum(loc.length for _, live in self.rewrite for _, loc in live)
        return max(0, sum(_file_usage(p) for p in gone) - kept)


def _file_usage(path: Path) -> int:
    try:
        return os.lstat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def _age(path: Path) -> float:
    try:
        return time.time() - os.lstat(path).st_mtime
    except FileNotFoundError:
        return 0.0


def _young(path: Path, grace: float) -> LeftAlone:
    return LeftAlone(YOUNG, path.name, _file_usage(path),
                     f"younger than the {grace:g} s grace period: a commit may still be writing it")


def should_rewrite(live_bytes: int, total_bytes: int, repack: bool = False) -> bool:
    """Whether gc rewrites a pack holding ``live_bytes`` of ``total_bytes`` record data."""
    return live_bytes < total_bytes if repack else live_bytes < total_bytes * REWRITE_BELOW


def _mostly_live(path: Path, garbage: int, total: int) -> LeftAlone:
    return LeftAlone(MOSTLY_LIVE, path.name, garbage,
                     f"{100 * garbage / total:.0f}% garbage; gc rewrites a pack once over "
                     f"{100 * (1 - REWRITE_BELOW):.0f}%, so that live data is not copied on every run")


class LiveRecords:
    """Where the live chunks lie, kept as the walk's arrays (``locate=True``) rather than an
    object per chunk: gc plans with each pack's live bytes and makes Locations only for the
    records of the packs it rewrites (a Location and a dict entry per live chunk were most of
    gc planning's memory, about 300 bytes a chunk; docs/scale.md)."""

    def __init__(self, live: reach.Reach):
        self._ids, self._locs, self._deltas = live.chunk_length.ids, live.locations, live.deltas
        rows = np.flatnonzero(live.located)
        names, which = np.unique(self._locs["pack"][rows], return_inverse=True)
        self._packs = {names[k:k + 1].tobytes(): k for k in range(len(names))}
        self._bytes = np.bincount(which, weights=self._locs["length"][rows], minlength=len(names))
        order = np.argsort(which, kind="stable")
        self._rows = rows[order]  # grouped by pack
        self._cuts = np.searchsorted(which[order], np.arange(len(names) + 1))

    def __contains__(self, pack: bytes) -> bool:
        """Whether ``pack`` (a 16-byte name) holds a live record."""
        return pack in self._packs

    def live_bytes(self, pack: bytes) -> int:
        """Stored bytes of the live records in ``pack`` (a 16-byte name); 0 if none."""
        k = self._packs.get(pack)
        return 0 if k is None else int(self._bytes[k])

    def records(self, pack: bytes) -> list:
        """(chunk id, Location) of the live records in ``pack``, by offset."""
        k = self._packs.get(pack)
        if k is None:
            return []
        rows = self._rows[self._cuts[k]:self._cuts[k + 1]]
        rows = rows[np.argsort(self._locs["offset"][rows], kind="stable")]
        out = []
        for i in rows.tolist():
            cid = idarray.one(self._ids, i)
            out.append((cid, location_row(self._locs, i, self._deltas.get(cid))))
        return out


class SlicedRecords:
    """Where the live chunks lie, as a sliced sweep found them: each pack's live bytes, and
    the live records (``sliced.PackRows``) read back only for the packs gc rewrites."""

    def __init__(self, budget: int, where: sliced.Scratch):
        self._rows = sliced.PackRows(budget, where)
        self._bytes: dict = {}

    def add(self, step: sliced.Step, rows: np.ndarray) -> None:
        """The located ``rows`` of ``step``."""
        names, which = self._rows.add(step, rows)
        total = np.bincount(which, weights=step.locations["length"][rows], minlength=len(names))
        for k, name in enumerate(names):
            self._bytes[name] = self._bytes.get(name, 0) + int(total[k])

    def __contains__(self, pack: bytes) -> bool:
        """Whether ``pack`` (a 16-byte name) holds a live record."""
        return pack in self._bytes

    def live_bytes(self, pack: bytes) -> int:
        """Stored bytes of the live records in ``pack`` (a 16-byte name); 0 if none."""
        return self._bytes.get(pack, 0)

    def records(self, pack: bytes) -> list:
        """(chunk id, Location) of the live records in ``pack``, by offset."""
        rows = self._rows.rows(pack)
        rows = rows[np.argsort(rows["id"], kind="stable")]
        rows = rows[np.argsort(rows["offset"], kind="stable")]
        return [(idarray.one(rows["id"], i), sliced.location(rows, i)) for i in range(len(rows))]


def plan_packs(files: list, live: LiveRecords, indexed: set, grace: float, repack: bool = False, *,
               store) -> _PackPlan:
    """What gc does with each of ``files``, chunk store ``store``'s PackFiles (``ChunkStore.pack_files``)."""
    plan, small = _PackPlan(), []
    now = time.time()
    for f in files:
        path = f.path
        if not f.regular:
            plan.notes.append(f"{f.name} left alone: it is not a regular file (remove it by hand)")
            continue
        if f.pack is None:  # a .tmp pack
            if now - f.mtime > grace:
                plan.tmp.append(path)
            else:
                plan.left.append(_young(path, grace))
            continue
        if f.pack not in live:
            # a pack no entry ever named may be a writer's that is about to index it
            if f.pack in indexed or now - f.mtime > grace:
                plan.delete.append(path)
            else:
                plan.left.append(_young(path, grace))
            continue
        try:
            total = int(store.pack_records(f.pack)["length"].sum(dtype=np.int64))
        except (CorruptObject, OSError) as exc:
            plan.notes.append(f"{path.name} left alone: {exc}")
            continue
        live_bytes = live.live_bytes(f.pack)
        if should_rewrite(live_bytes, total, repack):
            plan.rewrite.append((path, live.records(f.pack)))
        elif live_bytes < total:
            plan.left.append(_mostly_live(path, total - live_bytes, total))
        elif repack and total < SMALL_PACK:
            small.append((path, live.records(f.pack)))
    if len(small) > 1:  # many small all-live packs (one per commit): merged into one
        plan.rewrite += small
    return plan


def unreferenced_fate(directory: Path, kind: str, pack: str, records: int, garbage: int,
                      grace: float = GRACE_S, *, store) -> Optional[LeftAlone]:
    """What a plain ``mvc gc`` does with unreferenced bytes fsck reported
    (kinds from mvc.fsck): None if it reclaims them, else why it keeps them.

    ``garbage`` is fsck's count, record headers included.
    """
    path = directory / pack
    if kind in ("tmp-pack", "unindexed-pack", "damaged-pack"):
        return _young(path, grace) if _age(path) <= grace else None
    if kind != "unused-records":
        return None
    name = pack_named(pack)
    try:
        total = int(store.pack_records(name)["length"].sum(dtype=np.int64)) if name is not None else None
    except (CorruptObject, OSError):
        return None
    if total is None:
        return None
    data = garbage - records * RECORD_OVERHEAD
    return None if should_rewrite(total - data, total) else _mostly_live(path, data, total)


def compact(repo, plan: _PackPlan) -> int:
    """Steps 2-4 through the chunk store's one compaction (``mvc/store/compact.py``): the
    live records of the packs to rewrite move, as they are, to a new pack and are indexed
    there; then those packs, packs holding nothing live and stale ``.tmp`` files are
    deleted. A pack with a live record that cannot be read verified is left whole (noted).
    Returns the number of records moved."""
    names = {pack_named(path.name): (path, live) for path, live in plan.rewrite}
    done = repo.chunks.compact(repo.index, [(name, live) for name, (_, live) in names.items()],
                               remove=[path.name for path in plan.delete + plan.tmp])
    plan.notes += list(done.notes)
    plan.rewrite = [names[name] for name in done.rewritten]
    return done.moved
