"""repack: store live chunks densely, as Git deltifies at gc.

Vocabulary (the record kinds are in ``store/codec.py``):

- **candidate base** of chunk i of the tensor at key path P in commit C: chunk
  i of the tensor at P in C's newest **child** (a commit whose first parent
  is C), when that tensor has the same dtype and chunk size and the chunk the
  same length. Checkpoints of one run differ from their neighbours in the
  bytes that training moved, so XOR against it is mostly zeros where few rows
  changed. Deltas point from old to new, as Git's do: the newest version
  (the one loaded most: resume, evaluation) is stored whole and decodes
  alone, and a version k commits older reads a chain of up to k deltas.
- **depth**: deltas a read must follow; a chunk is only delta-encoded against
  a base of depth < K (``depth``), so no read ever follows more than K.

Every live chunk whose record is raw is encoded (``codec.candidates``,
``codec.choose``): byte grouped by its dtype's width, or as a delta against
its candidate base when that is smaller by enough; it stays raw when neither
saves enough. "Enough" is decided per tensor (``_gains``): a tensor whose
deltas together save TENSOR_SAVING of its bytes (dense weights between
checkpoints) takes every delta that is smaller than its chunk alone; another
only deltas that halve a chunk (a few changed rows). Commits are taken
newest first (children before parents), so a base is always decided before
the chunks that use it, and a chunk is encoded once however many commits
share it (in the newest commit that holds it); a base whose chain of
bases leads back to the chunk is refused, so chains never loop. Each
encoding is decoded again and compared with the chunk's bytes before it is
written.

A raw chunk that deltas of an earlier repack already decode through (its
**height**: the longest chain of them above it) becomes a delta only when
its new depth plus its height stays within K; those records are then
rewritten as they are stored, with their depths raised by its new depth,
in the same pack, so every record's depth stays the length of its chain.

Order of the steps, each harmless to interrupt:

1. ``FORMAT`` gains the ``encoded-records`` extension (before any index
   entry names a version 2 pack);
2. the encoded records go to one new pack, sealed and fsynced;
3. one index write transaction points the chunks at their new records and
   deletes the chunk index entries nothing live uses (as gc's sweep does);
4. gc's pack step deletes the packs that now hold nothing live and rewrites
   those mostly garbage.

It runs under the exclusive gc lock: no commit or load runs meanwhile.
"""

import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import dtypes, gc as _gc, reach
from .errors import BadInput, CorruptObject
from .objects import TensorLeaf
from .store import codec
from .store.chunks import THREADS, Request
from .traverse import format_path, walk

SLICE_BYTES = 64 << 20  # chunks read and encoded at a time: bounds repack's memory
CACHE_BYTES = 512 << 20  # decoded bytes kept for use as bases by the next (older) commit
# A tensor takes a delta for each chunk where one is smaller than the chunk alone when its
# deltas together save this share of its bytes; other tensors keep deltas only where they
# halve a chunk (codec.DELTA_GAIN: sparse changes). Measured by benchmarks/bench_real.py on
# real pre-training (fp32, AdamW, a checkpoint every 25 steps): XOR deltas against the next
# checkpoint save 12% of dense weights and 4% of Adam's moments, and no chunk one half. A delta
# costs a read of an older version one more decode, so a few percent is not worth it.
TENSOR_SAVING = 1 / 16


@dataclass(frozen=True)
class RepackReport:
    dry_run: bool
    chunks: int  # live raw chunks looked at
    grouped: int  # now byte-grouped zstd
    deltas: int  # now deltas against their parent's chunk
    raw: int  # left raw: no encoding paid
    bytes_before: int  # their stored bytes before
    bytes_after: int  # and after
    packs_deleted: int
    packs_rewritten: int
    seconds: float


@dataclass
class _Item:
    cid: bytes
    size: int
    width: int
    what: str
    base: Optional[bytes] = None
    kind: int = codec.RAW
    payload: Optional[bytes] = None  # the record's stored bytes, until written
    stored: int = 0
    depth: int = 0
    above: tuple = ()  # (id, chain length down to this chunk) of the deltas that decode through it

    @property
    def height(self) -> int:
        return max((n for _, n in self.above), default=0)


class _Cache:
    """Decoded chunk bytes by id, the oldest dropped beyond a byte budget."""

    def __init__(self, limit: int = CACHE_BYTES):
        self.limit, self.size, self.items = limit, 0, OrderedDict()

    def get(self, cid: bytes):
        data = self.items.get(cid)
        if data is not None:
            self.items.move_to_end(cid)
        return data

    def put(self, cid: bytes, data) -> None:
        if cid in self.items or len(data) > self.limit:
            return
        self.items[cid] = data
        self.size += len(data)
        while self.size > self.limit:
            _, old = self.items.popitem(last=False)
            self.size -= len(old)


def repack(repo, depth: Optional[int] = None, dry_run: bool = False, progress=None) -> RepackReport:
    """Re-encode live raw chunks where it pays; see the module doc.

    ``depth``: the most deltas a read may follow (1 ..= codec.MAX_DEPTH,
    default the maximum). ``progress(done, total)`` with bytes looked at.
    Raises BadInput for a bad depth, CorruptObject (changing nothing) if
    anything live is missing or damaged, LockHeld if commits keep running.
    """
    depth = codec.MAX_DEPTH if depth is None else depth
    if type(depth) is not int or not 0 <= depth <= codec.MAX_DEPTH:
        raise BadInput(f"delta depth must be between 0 and {codec.MAX_DEPTH}, not {depth!r}")
    start = time.perf_counter()
    with repo.gc_lock.exclusive():
        if not dry_run:
            repo.enable_encoded_records()
        with repo.index.read() as txn:
            items = _plan(txn, repo.objects, repo.chunks)
            total, done = sum(item.size for chunks in items for item in chunks), 0  # bytes, as the bar says
            decided, locs = _Decided(txn, depth), {}
            batch = None if dry_run else repo.chunks.writer()
            cache = _Cache()
            try:
                for commit_items in items:
                    for part in _slices(commit_items):
                        _encode(repo, txn, part, decided, cache)
                        for item in part:
                            # a chunk that stays raw stays where it is: rewriting it would copy and
                            # fsync the same bytes on every repack (gc's pack step still compacts
                            # a pack the encoded chunks left mostly empty)
                            if batch is not None and item.kind != codec.RAW:
                                locs[item.cid] = txn.chunk(item.cid)
                                batch.add_record(item.cid, item.payload, item.kind, item.size, item.depth, item.base)
                            _deepen(repo.chunks, txn, item, batch, locs)
                            item.payload = None  # written: keep only what the report needs
                            decided.done(item)
                        done += sum(item.size for item in part)
                        if progress:
                            progress(done, total)
                if batch is not None:
                    batch.seal()
            except BaseException:
                if batch is not None:
                    batch.abort()
                raise
        kinds = [item for item in decided.items.values()]
        report = dict(chunks=len(kinds), grouped=sum(i.kind == codec.GROUPED for i in kinds),
                      deltas=sum(i.kind == codec.DELTA for i in kinds), raw=sum(i.kind == codec.RAW for i in kinds),
                      bytes_before=sum(i.size for i in kinds),
                      bytes_after=sum(i.stored for i in kinds))
        if dry_run or batch.count == 0:
            return RepackReport(dry_run, **report, packs_deleted=0, packs_rewritten=0,
                                seconds=time.perf_counter() - start)
        plan = _publish(repo, batch, locs)
        return RepackReport(False, **report, packs_deleted=len(plan.delete), packs_rewritten=len(plan.rewrite),
                            seconds=time.perf_counter() - start)


def _plan(txn, objects, chunks) -> list:
    """Per live commit, newest first: the _Items of its local raw chunks not seen in a newer one
    (a chunk read from a remote, ``chunks.remote_only``, has no local record to re-encode)."""
    live = reach.walk(txn, objects, reach.RAISE)
    # parents before children; reversed below: bases are decided before their users
    order = reach.parents_first(live.parents, sorted(live.commits, key=lambda oid: live.commits[oid].time))
    kept = [oid for oid in order if live.commits[oid].tree in live.tree_commits]  # pruned: its tensors are gone
    child = {}  # commit -> its newest kept child on a first-parent line: whose chunks are its bases
    for oid in kept:
        parents = live.commits[oid].parents
        if parents and parents[0] in live.commits:
            known = child.get(parents[0])
            if known is None or live.commits[known].time <= live.commits[oid].time:
                child[parents[0]] = oid
    # A raw record that older deltas already decode through lengthens their chains if made a
    # delta itself: _Decided.usable bounds it by their height, and _deepen rewrites their depths.
    users = _users(chunks, txn)
    out, taken = [], set()
    for oid in reversed(kept):
        obj = live.commits[oid]
        newer = child.get(oid)
        before = _tensors(txn, objects, live.commits[newer].tree) if newer is not None else {}
        items = []
        for path, tensor in _tensors(txn, objects, obj.tree).items():
            old = before.get(path)
            same = old is not None and (old.dtype, old.chunk_size) == (tensor.dtype, tensor.chunk_size)
            width = dtypes.itemsize(tensor.dtype)
            what = f"tensor {path!r} in commit {oid.hex()[:12]}"
            for i, (cid, _, n) in enumerate(tensor.chunk_spans()):
                if cid in taken:
                    continue
                taken.add(cid)
                loc = txn.chunk(cid)
                if loc is None and chunks.remote_only([cid], txn):
                    continue
                if loc is None:
                    raise CorruptObject(f"repack stopped, nothing was changed: chunk {cid.hex()[:12]} of {what} "
                                        "is missing from the chunk index", id=cid)
                above = () if loc.coded else _above(cid, users)
                if loc.coded or above is None:  # encoded by an earlier repack, or a base we cannot deepen: kept
                    continue
                base = None
                if same and i < len(old.chunks) and old.chunks[i] != cid and _length(old, i) == n \
                        and txn.chunk(old.chunks[i]) is not None:  # a base must be local: it is read with the delta
                    base = old.chunks[i]
                items.append(_Item(cid, n, width, what, base, above=above))
        out.append(items)
    return out


def _users(chunks, txn) -> dict:
    """Base id -> [(id, Location)] of the delta records that decode straight from it."""
    out = {}
    for cid, loc in chunks.records(txn):
        if loc.base is not None:
            out.setdefault(loc.base, []).append((cid, loc))
    return out


def _above(cid: bytes, users: dict) -> Optional[tuple]:
    """(id, chain length down to ``cid``) of every record that decodes through raw chunk ``cid``.

    None when one could not be rewritten with a deeper chain, so the chunk must stay as it is:
    a record that is not encoded (only version 2 packs hold encoded ones, and only they carry a
    depth), or whose depth is not its chain's length (an index that fsck would fault)."""
    out, level = [], [cid]
    for n in range(1, codec.MAX_DEPTH + 2):
        level = [(user, loc) for at in level for user, loc in users.get(at, ())]
        if not level:
            return tuple(out)
        if n > codec.MAX_DEPTH or any(not loc.coded or loc.depth != n for _, loc in level):
            return None
        out += [(user, n) for user, _ in level]
        level = [user for user, _ in level]
    return None


def _length(tensor, i: int) -> int:
    return min(tensor.chunk_size, tensor.nbytes - i * tensor.chunk_size)


def _tensors(txn, objects, tree_id) -> dict:
    tree = objects.tree(txn, tree_id)
    return {format_path(p): objects.tensor(txn, leaf.id) for p, leaf in walk(tree.root) if isinstance(leaf, TensorLeaf)}


class _Decided:
    """Depths and bases of chunks: as the index has them, or as this repack decided."""

    def __init__(self, txn, limit: int):
        self.txn, self.limit, self.items = txn, limit, {}
        self.used = set()  # bases of the deltas decided so far

    def done(self, item: _Item) -> None:
        self.items[item.cid] = item
        if item.kind == codec.DELTA:
            self.used.add(item.base)

    def _base(self, cid: bytes) -> Optional[bytes]:
        """The delta base of chunk ``cid`` after this repack (None: it decodes alone). A record
        ``_deepen`` rewrites keeps its base, so the index's answer stands for it."""
        item = self.items.get(cid)
        if item is not None:
            return item.base if item.kind == codec.DELTA else None
        loc = self.txn.chunk(cid)
        if loc is None:
            raise CorruptObject(f"repack stopped, nothing was changed: chunk {cid.hex()[:12]} is missing from "
                                "the chunk index", id=cid)
        return loc.base

    def chain(self, cid: bytes, stop: Optional[bytes] = None) -> Optional[int]:
        """The deltas a read of ``cid`` follows after this repack, counted along its bases: a
        recorded depth is not trusted (an index rebuilt from the packs of interrupted repacks may
        hold one record of a chain from before a repack and its base from after). None if the
        chain meets ``stop`` or runs past MAX_DEPTH (a loop)."""
        n, at = 0, self._base(cid)
        while at is not None:
            if at == stop or n >= codec.MAX_DEPTH:
                return None
            n, at = n + 1, self._base(at)
        return n

    def usable(self, item: _Item) -> bool:
        """Whether ``item.base`` may be its base: shallow enough, and not leading back to it."""
        if item.base is None:
            return False
        depth = self.chain(item.base, stop=item.cid)
        if depth is None or depth + 1 + item.height > self.limit:  # the deltas above it get deeper too
            return False
        # a delta decided already took its depth from this chunk's chain as it was: a new base
        # would make that record's depth a lie (bases are decided before their users)
        return not (item.cid in self.used or any(cid in self.used for cid, _ in item.above))


def _slices(items: list) -> list:
    out, current, size = [], [], 0
    for item in items:
        current.append(item)
        size += item.size
        if size >= SLICE_BYTES:
            out.append(current)
            current, size = [], 0
    return out + ([current] if current else [])


def _encode(repo, txn, items: list, decided: _Decided, cache: _Cache) -> None:
    """Read the items' chunks (and their bases) verified, and encode each where it pays.

    ``items`` hold only raw records (``_plan`` leaves encoded ones as they are)."""
    todo = items
    for item in todo:
        if not decided.usable(item):
            item.base = None
    wanted = {item.cid: item.size for item in todo}
    wanted.update({item.base: item.size for item in todo if item.base is not None})
    data, requests = {}, []
    for cid, size in wanted.items():
        hit = cache.get(cid)
        if hit is not None:
            data[cid] = hit
            continue
        data[cid] = np.empty(size, dtype=np.uint8)
        what = next((i.what for i in todo if i.cid == cid), "a delta base")
        requests.append(Request(cid, data[cid], what))
    repo.chunks.read(requests, txn)

    def candidates(item: _Item) -> tuple:
        base = data[item.base] if item.base is not None else None
        return codec.candidates(data[item.cid], item.width, base, item.base)

    with ThreadPoolExecutor(THREADS) as pool:
        found = list(pool.map(candidates, todo))
    gains = _gains(todo, found)

    def work(arg) -> None:
        item, (grouped, delta) = arg
        base = data[item.base] if item.base is not None else None
        kind, payload = codec.choose(item.size, grouped, delta, gains[item.what])
        if kind != codec.RAW:
            check = np.empty(item.size, dtype=np.uint8)
            codec.decode(kind, payload, item.size, check, base)
            if not np.array_equal(check, data[item.cid]):
                raise CorruptObject(f"repack stopped, nothing was changed: the encoding of chunk "
                                    f"{item.cid.hex()[:12]} does not decode to it (a bug; please report it)")
        item.kind, item.payload = kind, payload if kind != codec.RAW else data[item.cid]
        item.stored = len(item.payload)
        if kind != codec.DELTA:
            item.base = None
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(work, zip(todo, found)))
    for item in todo:  # depths need the index: here, in the transaction's thread
        item.depth = decided.chain(item.base) + 1 if item.kind == codec.DELTA else 0
    for cid in wanted:
        cache.put(cid, data[cid])


def _gains(items: list, found: list) -> dict:
    """Per tensor of ``items`` (its ``what``), the gain a chunk's delta must beat (``codec.choose``):
    1.0 (any delta smaller than the chunk's encoding alone) where the tensor's deltas together
    save at least TENSOR_SAVING of what its chunks take alone, else codec.DELTA_GAIN."""
    alone, best = {}, {}
    for item, (grouped, delta) in zip(items, found):
        one = codec.stored_size(item.size, codec.choose(item.size, grouped, None))
        alone[item.what] = alone.get(item.what, 0) + one
        best[item.what] = best.get(item.what, 0) + codec.stored_size(item.size, codec.choose(item.size, grouped,
                                                                                             delta, 1.0))
    return {what: 1.0 if best[what] <= alone[what] * (1 - TENSOR_SAVING) else codec.DELTA_GAIN for what in alone}


def _deepen(chunks, txn, item: _Item, batch, locs: dict) -> None:
    """Rewrite the records above ``item``, now a delta of depth ``item.depth``, with their depths
    raised by it: their stored bytes unchanged, in the same batch, so the index that points at
    ``item``'s new record also has every chain's real length. (``batch`` None: a dry run.)"""
    if batch is None or item.kind != codec.DELTA:
        return  # a raw or grouped record has depth 0: the chains above it are as long as they were
    for cid, _ in item.above:
        loc = locs[cid] = txn.chunk(cid)
        _, payload = chunks.read_stored(cid, txn, f"a delta decoding through {item.what}")
        batch.add_record(cid, payload, loc.kind, loc.size, loc.depth + item.depth, loc.base)


def _publish(repo, batch, old: dict):
    """Point the chunks at their new records and drop the objects and entries nothing live
    uses, in one transaction; then let gc's pack step reclaim the old packs.

    The dead entries go in that transaction, before any pack is deleted: an entry left
    naming a deleted pack would let a later commit of the same bytes skip writing them
    (it deduplicates against the entry) and so commit a chunk nobody holds. Killed after
    the transaction, the packs are merely unreferenced, and the next gc deletes them."""
    new = batch.locations
    with repo.index.write() as txn:
        before = {loc.pack for _, loc in repo.chunks.records(txn)}
        now = {cid: txn.chunk(cid) for cid in new}
        # the new pack's index, where it has one, locates what moved (no entry per chunk, which
        # at 10^8 chunks would be the B-tree pages the pack indexes replaced); a record whose
        # chunk moved meanwhile keeps the location it had, as compaction does
        registered = batch.register(txn)
        for cid, loc in new.items():
            if now[cid] == old[cid]:
                txn.put_chunk(cid, loc, overwrite=True)
            elif registered:
                txn.set_chunk(cid, now[cid])
        walked = reach.walk(txn, repo.objects, reach.RAISE, locate=True)
        _gc.drop_dead(txn, walked)
        live = _gc.LiveRecords(walked)
    plan = _gc.plan_packs(repo.chunks.pack_files(), live, before, _gc.GRACE_S, repack=True, store=repo.chunks)
    _gc.compact(repo, plan)
    return plan

