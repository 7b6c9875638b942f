"""Reachability: the walk that says what is live, for fsck and gc alike, and the history walks.

Vocabulary:

- **root**: a commit that a ref (``HEAD``, ``heads/*``, ``tags/*``) names,
  or that a reflog entry names as its old or new id. Roots carry labels:
  the ref's name, or ``reflog:<ref>`` for reflog roots.
- **reachable** (live): a root, a parent of a reachable commit, and the
  tree, tensors and chunks of a reachable commit that gc retention has not
  pruned (a pruned commit keeps only its record).
- **delta base**: a chunk that a live chunk's record is a delta against
  (``store/codec.py``). Bases are live too, however they are used, and a
  base counts as held by the tensors of every chunk that depends on it, so
  damage to a base is named by those tensors and their commits.
- **damage**: something the walk needs that is missing, corrupt (does not
  hash to its id or does not decode), or a ref or reflog entry that cannot
  be read. Each is a ``Finding``.

``walk(txn, objects, policy)`` takes the narrow things it needs (an index
transaction and the object store), as dulwich's ``find_reachable_objects``
and restic's ``FindUsedBlobs`` do. Its ``policy`` says what damage does:
``COLLECT`` (fsck) records every finding and walks on; ``RAISE`` (gc)
stops at the first with ``CorruptObject``, because deleting anything on
the strength of a walk that could not see everything could delete live
data. So fsck and gc always agree: gc refuses to run exactly when fsck
reports damage that the walk meets, including a malformed reflog entry.

Smaller walks over commits serve everything else that follows parents:
``first_parents`` (the first-parent line of a commit: ``~N``, log,
retention), ``ancestors`` (every commit reachable through any parent,
lazily, not into ``stop``, the commits already known: push, audit, the
cache's unpushed commits), with ``ancestry`` (the same as a dict: history,
merge) and ``reached`` (the ids it meets, held or not). They take
``commit(id)``, the caller's way to read one commit (memoised, verifying,
or wrapping its error); None from it means "not here" and ends that line.
And a damage policy: ``RAISE`` lets its error stop the walk, ``COLLECT``
with a ``damaged`` list records the id and error and ends that line there.
``closure`` is the remote code's walk down to chunks (fetch, the remote
check and gc), ``parents_first`` orders a walk's commits (repack).
"""

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from .errors import CorruptObject, MvcError, WalkDamaged
from .objects import TensorLeaf, decode_tensor_ids
from . import sliced
from .store import idarray
from .store.index import LOCATIONS, reflog_entry
from .store.objectstore import CORRUPT, MISSING
from .store.verify import intact
from .traverse import format_path, walk as walk_tree

REFLOG = "reflog:"
COLLECT, RAISE = "collect", "raise"

# Kinds of damage, as reports name them.
MISSING_COMMIT, CORRUPT_COMMIT = "missing-commit", "corrupt-commit"
MISSING_TREE, CORRUPT_TREE = "missing-tree", "corrupt-tree"
MISSING_TENSOR, CORRUPT_TENSOR = "missing-tensor", "corrupt-tensor"
CORRUPT_REF, CORRUPT_REFLOG = "corrupt-ref", "corrupt-reflog"
_KINDS = {("commits", MISSING): MISSING_COMMIT, ("commits", CORRUPT): CORRUPT_COMMIT,
          ("trees", MISSING): MISSING_TREE, ("trees", CORRUPT): CORRUPT_TREE,
          ("tensors", MISSING): MISSING_TENSOR, ("tensors", CORRUPT): CORRUPT_TENSOR}


def _read(commit: Callable, oid: bytes, policy: str, damaged: Optional[list]):
    if policy == RAISE:
        return commit(oid)
    try:
        return commit(oid)
    except MvcError as exc:
        damaged.append((oid, exc))
        return None


def generations(tips: Iterable[bytes], fetch: Callable[[list], None], get: Callable[[bytes], Optional[tuple]]) -> None:
    """Commits from ``tips`` through every parent, a generation at a time, for a reader with a
    round trip per call (a lazy clone reading a remote's object packs): ``fetch(ids)`` makes one
    generation's objects readable, ``get(id)`` then gives (kind, object), or None for one it
    could not read (that line ends there). A commit's tree is fetched with its parents."""
    seen: set = set()
    wave = list(tips)
    while wave:
        wave = [oid for oid in dict.fromkeys(wave) if oid not in seen]
        seen.update(wave)
        fetch(wave)
        nxt = []
        for oid in wave:
            got = get(oid)
            if got is not None and got[0] == "commits":
                nxt += [*got[1].parents, got[1].tree]
        wave = nxt


def first_parents(commit: Callable, start: Optional[bytes], stop=frozenset(), policy: str = RAISE,
                  damaged: Optional[list] = None) -> Iterator[tuple]:
    """(id, commit object) along first parents from ``start``, newest first,
    ending before a commit in ``stop`` or after a root commit."""
    oid = start
    while oid is not None and oid not in stop:
        obj = _read(commit, oid, policy, damaged)
        if obj is None:
            return
        yield oid, obj
        oid = obj.parents[0] if obj.parents else None


def ancestors(commit: Callable, starts: Iterable[bytes], policy: str = RAISE,
              damaged: Optional[list] = None, stop=frozenset()) -> Iterator[tuple]:
    """(id, commit object) of ``starts`` and every commit reachable from them through any parent,
    depth first, each id read once, lazily (a caller may stop at what it looks for). Does not go
    into ``stop`` (commits already known: ``in`` is all it needs). ``commit(id)`` returning None
    means the commit is not here (not damage): that line ends there."""
    seen, todo = set(), list(starts)
    while todo:
        oid = todo.pop()
        if oid in seen or oid in stop:
            continue
        seen.add(oid)
        obj = _read(commit, oid, policy, damaged)
        if obj is None:
            continue
        yield oid, obj
        todo.extend(obj.parents)


def ancestry(commit: Callable, starts: Iterable[bytes], policy: str = RAISE,
             damaged: Optional[list] = None, stop=frozenset()) -> dict:
    """{id: commit object} of ``ancestors``."""
    return dict(ancestors(commit, starts, policy, damaged, stop))


def reached(commit: Callable, starts: Iterable[bytes]) -> set:
    """The ids the walk from ``starts`` reaches: the commits it reads and the parents they name,
    held here or not."""
    out = set(starts)
    for _, obj in ancestors(commit, list(out)):
        out.update(obj.parents)
    return out


def closure(get: Callable, tips: Iterable[bytes], pruned: Callable = lambda oid: False,
            seen: Optional[set] = None) -> Iterator[tuple]:
    """The closures of ``tips`` as the remote code walks them, through ``get(kind, id)`` ("commits",
    "trees", "tensors"), which reads one object and returns None when it is missing (the caller records
    that; the walk goes on without it) or raises to stop. Yields (chunk id, length) once per chunk. A
    commit for which ``pruned(id)`` is true gives only its record and parents. ``seen``: ids an earlier
    walk went through (it is added to), skipped here."""
    seen, todo = set() if seen is None else seen, list(tips)
    while todo:
        oid = todo.pop()
        if oid in seen:
            continue
        seen.add(oid)
        commit = get("commits", oid)
        if commit is None:
            continue
        todo += commit.parents
        if pruned(oid) or commit.tree in seen:
            continue
        seen.add(commit.tree)
        tree = get("trees", commit.tree)
        for _, leaf in (walk_tree(tree.root) if tree is not None else ()):
            if isinstance(leaf, TensorLeaf) and leaf.id not in seen:
                seen.add(leaf.id)
                tensor = get("tensors", leaf.id)
                for cid, _, n in (tensor.chunk_spans() if tensor is not None else ()):
                    if cid not in seen:
                        seen.add(cid)
                        yield cid, n


@dataclass
class Finding:
    """Damage the walk met (binary ids), before its consequences are worked out."""

    kind: str
    object: str
    detail: str
    chunks: set = field(default_factory=set)
    tensors: set = field(default_factory=set)
    trees: set = field(default_factory=set)
    commits: set = field(default_factory=set)
    refs: set = field(default_factory=set)


class ChunkLengths(Mapping):
    """Live chunk id -> length, held as a sorted id array and a length array
    (about 40 bytes per chunk, against some 150 for a dict of bytes)."""

    def __init__(self, ids: Optional[np.ndarray] = None, lengths: Optional[np.ndarray] = None):
        self.ids = idarray.pack([]) if ids is None else ids
        self.lengths = np.zeros(0, dtype=np.int64) if lengths is None else lengths

    def __getitem__(self, cid: bytes) -> int:
        i = idarray.contains(self.ids, cid) if type(cid) is bytes else -1
        if i < 0:
            raise KeyError(cid)
        return int(self.lengths[i])

    def __contains__(self, cid) -> bool:
        return type(cid) is bytes and idarray.contains(self.ids, cid) >= 0

    def __iter__(self) -> Iterator[bytes]:
        return iter(idarray.ids(self.ids))

    def __len__(self) -> int:
        return len(self.ids)

    def items(self):
        return zip(idarray.ids(self.ids), self.lengths.tolist())

    def merged(self, more: dict) -> "ChunkLengths":
        """These and ``more`` ({id: length} of ids not here)."""
        if not more:
            return self
        ids = np.concatenate([self.ids, idarray.pack(list(more))])
        lengths = np.concatenate([self.lengths, np.array(list(more.values()), dtype=np.int64)])
        order = np.argsort(ids, kind="stable")
        return ChunkLengths(ids[order], lengths[order])


class ChunkTensors:
    """Chunk id -> ids of the live tensors that hold it, for naming what damage breaks.

    Every (chunk, tensor) pair as two arrays sorted by chunk id (36 bytes a
    pair); delta bases, held by the tensors of the chunks that depend on
    them, in a dict of their own (``extra``)."""

    def __init__(self, chunks: Optional[np.ndarray] = None, owners: Optional[np.ndarray] = None,
                 tensors: Optional[list] = None):
        self.chunks = idarray.pack([]) if chunks is None else chunks
        self.owners = np.zeros(0, dtype=np.int32) if owners is None else owners
        self.tensors = tensors or []
        self.extra = defaultdict(set)

    def get(self, cid: bytes, default=None) -> set:
        held = self.holders(cid) | self.extra.get(cid, set())
        return held if held else (set() if default is None else default)

    def holders(self, cid: bytes) -> set:
        """The tensors that hold ``cid`` themselves (not through a delta on it)."""
        if type(cid) is not bytes or len(cid) != idarray.WIDTH:
            return set()
        needle = np.frombuffer(cid, dtype=idarray.ID)
        lo, hi = np.searchsorted(self.chunks, needle, "left")[0], np.searchsorted(self.chunks, needle, "right")[0]
        return {self.tensors[k] for k in self.owners[lo:hi].tolist()}

    def __getitem__(self, cid: bytes) -> set:
        return self.get(cid)


@dataclass
class Reach:
    """What a walk found: live ids, where each is used, and the damage met."""

    roots: dict = field(default_factory=lambda: defaultdict(set))  # label -> commit ids
    parents: dict = field(default_factory=dict)  # live commit id -> parent ids (present commits only)
    commits: dict = field(default_factory=dict)  # live commit id -> CommitObject
    tree_commits: dict = field(default_factory=lambda: defaultdict(set))  # live tree id -> commits
    tensor_trees: dict = field(default_factory=lambda: defaultdict(set))
    tensor_paths: dict = field(default_factory=lambda: defaultdict(set))
    chunk_tensors: ChunkTensors = field(default_factory=ChunkTensors)  # filled by COLLECT walks only (fsck)
    chunk_length: ChunkLengths = field(default_factory=ChunkLengths)  # live chunk id -> length
    trees: int = 0  # intact live trees
    tensors: int = 0  # intact live tensors
    findings: list = field(default_factory=list)
    # What the one pass over the chunk index found (``walk(locate=True)``). Aligned with
    # ``chunk_length.ids``: ``located`` (the index has an entry), ``locations`` (LOCATIONS).
    located: Optional[np.ndarray] = None
    locations: Optional[np.ndarray] = None
    deltas: dict = field(default_factory=dict)  # live chunk id -> (base id, depth) of its delta record
    bad_entries: dict = field(default_factory=dict)  # chunk id -> why its index value does not decode (any chunk)
    indexed_packs: set = field(default_factory=set)  # pack names some chunk index entry names
    dead: list = field(default_factory=list)  # id arrays of the chunk index entries nothing live uses

    def find(self, kind: str, what: str, detail: str, **where) -> None:
        self.findings.append(Finding(kind, what, detail, **{k: set(v) for k, v in where.items()}))

    @property
    def live_trees(self) -> set:
        return set(self.tree_commits)

    @property
    def live_tensors(self) -> set:
        return set(self.tensor_trees)


class _Walker:
    def __init__(self, txn, objects, policy: str, prune: set, skip_reflog: set):
        self.txn, self.objects, self.policy = txn, objects, policy
        self.prune, self.skip_reflog = prune, skip_reflog
        self.reach = Reach()

    def damage(self, kind: str, what: str, detail: str, oid=None, **where) -> None:
        if self.policy == RAISE:
            raise WalkDamaged(f"gc stopped, nothing was deleted: {what}: {detail}", kind=kind, what=what, id=oid)
        self.reach.find(kind, what, detail, **where)

    def get(self, kind: str, oid: bytes, **where):
        verdict, value = self.objects.check(self.txn, kind, oid)
        if verdict is None:
            return value
        noun = kind[:-1]
        detail = f"the {noun} object is missing from the index" if verdict == MISSING else value
        if verdict == CORRUPT and value == "its bytes do not hash to its id":
            detail = f"the {noun} object's bytes do not hash to its id"
        self.damage(_KINDS[kind, verdict], f"{noun} {oid.hex()[:12]}", detail, oid=oid, **where)
        return None

    # -- roots -----------------------------------------------------------------

    def roots(self) -> None:
        for key in self.txn.ids("refs"):
            name = key.decode("utf-8", "replace")
            oid = self._ref_target(name)
            if oid is not None:
                self.reach.roots[name].add(oid)
        for name, seq, raw in self.txn.reflog_raw():
            if (name, seq) in self.skip_reflog:
                continue
            ids = reflog_ids(raw, name)
            if ids is None:
                self.damage(CORRUPT_REFLOG, f"reflog of {name}", f"entry {seq} is damaged: it does not decode "
                            "to old and new commit ids", refs={REFLOG + name})
                continue
            self.reach.roots[REFLOG + name].update(ids)

    def _ref_target(self, name: str) -> Optional[bytes]:
        try:
            value = self.txn.ref(name)
            if value.target is not None:  # symbolic: HEAD on a branch (maybe unborn)
                target = self.txn.ref(value.target)
                return target.id if target is not None and target.target is None else None
            return value.id
        except CorruptObject as exc:
            self.damage(CORRUPT_REF, f"ref {name}", str(exc), refs={name})
            return None

    # -- objects ---------------------------------------------------------------

    def commits(self) -> None:
        seen = set().union(*self.reach.roots.values())
        todo = list(seen)
        while todo:
            oid = todo.pop()
            obj = self.get("commits", oid, commits={oid})
            if obj is None:
                continue
            self.reach.commits[oid] = obj
            self.reach.parents[oid] = obj.parents
            if oid not in self.prune and not self._pruned(oid):  # retention deleted its tree on purpose
                self.reach.tree_commits[obj.tree].add(oid)
            for parent in obj.parents:
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)

    def _pruned(self, oid: bytes) -> bool:
        try:
            return self.txn.pruned(oid) is not None
        except CorruptObject as exc:  # then check the tree as if it were not pruned
            self.damage(CORRUPT_COMMIT, f"commit {oid.hex()[:12]}", str(exc), commits={oid})
            return False

    def trees(self) -> None:
        for tid in list(self.reach.tree_commits):
            tree = self.get("trees", tid, trees={tid})
            if tree is None:
                continue
            self.reach.trees += 1
            try:
                leaves = [(p, leaf) for p, leaf in walk_tree(tree.root) if isinstance(leaf, TensorLeaf)]
            except RecursionError:
                self.damage(CORRUPT_TREE, f"tree {tid.hex()[:12]}", "the tree is nested too deeply", trees={tid})
                continue
            for path, leaf in leaves:
                self.reach.tensor_trees[leaf.id].add(tid)
                self.reach.tensor_paths[leaf.id].add(format_path(path) or "<root>")

    def chunk_ids(self, tid: bytes) -> Optional[tuple]:
        """(tensor object ``tid`` without its chunks, its chunk ids as an id array), or None if it is
        damaged (the damage recorded, as ``get`` does). Its bytes are decoded by
        ``decode_tensor_ids``, no bytes object per chunk; whatever that or the hash refuses, and
        an object not in ``txn``, goes to the object store, whose verdict stands (a store that
        reads a tensor from a remote does so there)."""
        data = self.txn.get("tensors", tid)
        if data is not None:
            try:
                tensor, ids = decode_tensor_ids(data)
            except CorruptObject:
                pass
            else:
                if intact(tid, data):
                    return tensor, ids
        obj = self.get("tensors", tid, tensors={tid})
        if obj is None:
            return None
        return replace(obj, chunks=()), np.frombuffer(b"".join(obj.chunks), dtype=idarray.ID)

    def live_tensors(self) -> Iterator[bytes]:
        """The live tensor ids, a batch at a time announced to the object store first
        (``ahead``): a lazy clone reads a batch's tensor objects from its remote in a few
        requests, not one each."""
        return self.objects.ahead(self.txn, "tensors", list(self.reach.tensor_trees))

    def tensors(self) -> None:
        ids, lengths, owners, held = [], [], [], []
        for tid in self.live_tensors():
            got = self.chunk_ids(tid)
            if got is None:
                continue
            self.reach.tensors += 1
            ids.append(got[1])  # one array per tensor, not a bytes object per chunk
            lengths.append(_lengths(*got))
            owners.append(np.full(len(got[1]), len(held), dtype=np.int32))
            held.append(tid)
        every = np.concatenate(ids) if ids else np.zeros(0, dtype=idarray.ID)
        lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        owners = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int32)
        order = np.argsort(every, kind="stable")  # stable: an id's first occurrence gives its length
        ordered = every[order]
        first = np.ones(len(ordered), dtype=bool)
        first[1:] = ordered[1:] != ordered[:-1]
        self.reach.chunk_length = ChunkLengths(ordered[first], lengths[order[first]])
        if self.policy == COLLECT:  # only a report of damage names tensors (RAISE stops instead)
            self.reach.chunk_tensors = ChunkTensors(ordered, owners[order], held)

    def spill_tensors(self, spill) -> list:
        """Set every live tensor's chunks aside in ``spill`` (``sliced.Spill`` of
        ``sliced.RECORD``) instead of holding them; the tensor ids, by owner number."""
        held = []
        for tid in self.live_tensors():
            got = self.chunk_ids(tid)
            if got is None:
                continue
            self.reach.tensors += 1
            recs = np.empty(len(got[1]), dtype=sliced.RECORD)
            recs["id"] = got[1]
            recs["length"] = _lengths(*got)
            recs["owner"] = len(held)
            spill.add(recs)
            held.append(tid)
        return held

    def index(self, locate: bool) -> None:
        """One pass over the chunk index, in id order, merged with the sorted live ids:
        the delta bases of live chunks and, with ``locate``, where each live chunk lies,
        which packs the index names and which entries are garbage."""
        r, live = self.reach, self.reach.chunk_length.ids
        located = np.zeros(len(live), dtype=bool)
        locations = np.zeros(len(live) if locate else 0, dtype=LOCATIONS)
        for batch in self.txn.chunk_batches():
            pos = idarray.find(live, batch.ids)
            hit = pos >= 0
            located[pos[hit]] = True
            for row, why in batch.bad.items():
                r.bad_entries[idarray.one(batch.ids, row)] = why
            for row, delta in batch.bases.items():
                if pos[row] >= 0:
                    r.deltas[idarray.one(batch.ids, row)] = delta
            if locate:
                locations[pos[hit]] = batch.locs[hit]
                packs = np.unique(batch.locs["pack"][~batch.locs["bad"]])
                raw = packs.tobytes()
                r.indexed_packs.update(raw[i:i + 16] for i in range(0, len(raw), 16))
                r.dead.append(batch.ids[~hit])
        if locate:
            r.located, r.locations = located, locations
        self.bases(locate)

    def bases(self, locate: bool) -> None:
        """Add the delta bases of live chunks (and theirs) to the live chunks.

        The pass over the index gave each live delta record's base; a base
        that nothing else holds is looked up on its own (the only random
        lookups left, one per such base)."""
        r = self.reach
        added, found = {}, {}  # base id not live otherwise -> length; -> its Location, if indexed
        todo = list(r.deltas)
        while todo:
            cid = todo.pop()
            base = r.deltas.get(cid, (None,))[0]
            if base is None:
                continue
            users = r.chunk_tensors.get(cid)
            new = base not in added and base not in r.chunk_length
            if new or not users <= r.chunk_tensors.get(base):
                r.chunk_tensors.extra[base] |= users
                if new:
                    added[base] = self._size(cid, found)
                    loc = self._lookup(base)
                    if loc is not None:
                        found[base] = loc
                        if loc.base is not None:
                            r.deltas[base] = (loc.base, loc.depth)
                todo.append(base)
        if added:
            self._add(added, found, locate)

    def _size(self, cid: bytes, found: dict) -> int:
        """The decoded size of live chunk ``cid``'s record (its base decodes to as many bytes)."""
        if cid in found:
            return found[cid].size
        if self.reach.located is not None:
            i = idarray.contains(self.reach.chunk_length.ids, cid)
            if i >= 0 and self.reach.located[i]:
                return int(self.reach.locations["size"][i])
        loc = self._lookup(cid)
        return loc.size if loc is not None else self.reach.chunk_length[cid]

    def _lookup(self, cid: bytes):
        try:
            return self.txn.chunk(cid)
        except CorruptObject:  # a damaged entry: fsck names it when it locates the chunk
            return None

    def _add(self, added: dict, found: dict, locate: bool) -> None:
        """Make the bases in ``added`` live: in the lengths, and located where the index has them."""
        r = self.reach
        old = r.chunk_length.ids
        r.chunk_length = r.chunk_length.merged(added)
        if r.located is None:
            return
        where = idarray.find(r.chunk_length.ids, old)  # old rows' places among the new
        located = np.zeros(len(r.chunk_length), dtype=bool)
        located[where] = r.located
        locations = np.zeros(len(r.chunk_length), dtype=LOCATIONS)
        locations[where] = r.locations
        for cid, loc in found.items():
            i = idarray.contains(r.chunk_length.ids, cid)
            located[i] = True
            locations[i] = (loc.pack, loc.offset, loc.length, loc.size, loc.kind, False)
        r.located, r.locations = located, locations
        made_live = np.sort(idarray.pack(list(added)))
        r.dead = [d[idarray.find(made_live, d) < 0] for d in r.dead]


def _lengths(obj, ids: np.ndarray) -> np.ndarray:
    """The length of each of a tensor object's chunks (``ids``, which the decoder checked to be
    as many as its pieces need): ``chunk_size`` but the last of each piece (a shard's stream
    ends in a short chunk of its own), what is left of the piece."""
    out = np.full(len(ids), obj.chunk_size, dtype=np.int64)
    for _, _, _, n, first in obj.pieces():
        k = -(-n // obj.chunk_size)
        if k:
            out[first + k - 1] = n - obj.chunk_size * (k - 1)
    return out


def reflog_ids(raw: bytes, name: str) -> Optional[list]:
    """The commit ids a raw reflog entry names (old, new; None left out), or None if it is damaged."""
    entry = reflog_entry(raw)
    return None if entry is None else [entry[k] for k in ("old", "new") if entry.get(k) is not None]


def walk(txn, objects, policy: str = COLLECT, prune: Iterable[bytes] = (), skip_reflog: Iterable = (),
         locate: bool = False) -> Reach:
    """Everything reachable from refs and the reflog, in the index transaction ``txn``.

    ``prune``: commits to treat as pruned (gc's retention, before it marks
    them). ``skip_reflog``: (ref, sequence) entries not to count as roots
    (expiring ones). ``locate``: also keep what the pass over the chunk
    index found (Reach's ``located`` ... ``dead``). With ``RAISE``,
    CorruptObject at the first damage.
    """
    walker = _Walker(txn, objects, policy, set(prune), set(skip_reflog))
    walker.roots()
    walker.commits()
    walker.trees()
    walker.tensors()
    walker.index(locate)
    return walker.reach


def walk_spilled(txn, objects, spill, policy: str = COLLECT, prune: Iterable[bytes] = (),
                 skip_reflog: Iterable = ()) -> tuple:
    """``walk`` up to the tensors, whose chunks go to ``spill`` (a ``sliced.Spill`` of
    ``sliced.RECORD``, owner: a number in the list returned) rather than into the Reach:
    (Reach without its chunk fields, the live tensor ids by owner number). fsck and gc go on
    a slice of the id space at a time (``sliced.LivePass``), in bounded memory."""
    walker = _Walker(txn, objects, policy, set(prune), set(skip_reflog))
    walker.roots()
    walker.commits()
    walker.trees()
    held = walker.spill_tensors(spill)
    return walker.reach, held


def parents_first(parents: dict, roots: Iterable[bytes]) -> list:
    """``roots`` and the commits they reach through ``parents`` (id -> parent ids, a walk's
    ``Reach.parents``), each after its parents: depth first from each root in turn. A parent
    with no entry in ``parents`` is left out."""
    order, seen = [], set()
    for root in roots:
        stack = [(root, False)]
        while stack:
            oid, expanded = stack.pop()
            if oid in seen and not expanded:
                continue
            if expanded:
                order.append(oid)
                continue
            seen.add(oid)
            stack.append((oid, True))
            stack += [(p, False) for p in parents.get(oid, ()) if p in parents and p not in seen]
    return order


def reachable_from(parents: dict, roots: dict) -> dict:
    """{label: commit ids reachable from that label's roots} over a parents map."""
    out = {}
    for label, ids in roots.items():
        seen, todo = set(ids), list(ids)
        while todo:
            for parent in parents.get(todo.pop(), ()):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        out[label] = seen
    return out
