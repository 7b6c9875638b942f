"""Sliced walks: the live chunks a slice of the id space at a time, so that fsck and gc hold a
fixed budget of them in memory whatever the size of the repository (docs/scale.md, "fsck and
gc in bounded memory").

Vocabulary:

- **slice**: the chunk ids whose first two bytes are p, 1/65536 of the id space. BLAKE3 ids
  are uniform, so every slice holds about as many ids. Spills keep a file per first byte
  (256 slices) and read a step's part of one in blocks of the budget.
- **step**: a run of consecutive slices whose records fit the budget (a slice above it
  alone); the step's range of ids is ``lo <= id < hi``.
- **budget**: records a spill holds in memory and a step reads back at once
  (``MVC_WALK_BUDGET``, default 2**20). Tests set it tiny to make many steps of a small
  repository; a repository whose live set fits it never touches the disk.
- **spill**: records set aside by the slice of their id: in memory until they reach the
  budget, then appended to one file per first id byte in a scratch folder
  (``.mvc/tmp/walk-...``, a scratch entry: ``mvc.scratch``).
- **live record**: (chunk id, length, owner) per chunk a live tensor object lists; the owner
  is the tensor's number in the walk, -1 for a delta base made live by a chunk that is a
  delta on it (such a base is not *held* by a tensor, see ``reach``).
- **late base**: a delta base whose slice an earlier step already went through. After the
  last step, each late base that no live record names is **revived**: looked up in the
  index on its own and made live (the walk's one kind of random lookup, as before slicing).

``LivePass.steps`` yields a ``Step`` per step (then per run of revived bases): what the one
pass over that range of the chunk index found for the live ids in it. Every live id is in
exactly one step. What fsck and gc make of a step is theirs.
"""

import errno
import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from . import scratch
from .errors import BadInput, CorruptObject
from .store import idarray
from .store.index import LOCATIONS
from .store.packs import Location

BUDGET_ENV = "MVC_WALK_BUDGET"
BUDGET = 1 << 20
SLICES = 1 << 16  # slices: by the ids' first two bytes
FILES = 256  # spill files: by the ids' first byte

RECORD = np.dtype([("id", idarray.ID), ("length", "<i8"), ("owner", "<i4")])
EDGE = np.dtype([("id", idarray.ID), ("user", idarray.ID)])  # id: the delta base; user: the delta on it
ID_ONLY = np.dtype([("id", idarray.ID)])
# A located chunk, as fsck checks it against its pack and gc moves it: its LOCATIONS fields and delta.
ROW = np.dtype([("id", idarray.ID), ("pack", "V16"), ("offset", "<u8"), ("length", "<u4"), ("size", "<i8"),
                ("kind", "u1"), ("base", idarray.ID), ("depth", "<i4"), ("delta", "?")])
# A located chunk whose record is no delta, as PackRows keeps it in its pack's file.
PLAIN = np.dtype([("id", idarray.ID), ("offset", "<u8"), ("length", "<u4"), ("size", "<i8"), ("kind", "u1")])


def budget(value: Optional[int] = None) -> int:
    """The budget: ``value``, else ``MVC_WALK_BUDGET``, else BUDGET. BadInput unless a whole
    number of at least 1."""
    raw = os.environ.get(BUDGET_ENV, BUDGET) if value is None else value
    try:
        got = int(raw)
    except (TypeError, ValueError):
        got = 0
    if got < 1 or (isinstance(raw, float) and raw != got):
        where = f"{BUDGET_ENV} " if value is None else ""
        raise BadInput(f"the walk budget {where}must be a whole number of records of at least 1, not {raw!r}")
    return got


def heads(ids: np.ndarray) -> np.ndarray:
    """Each id's first 8 bytes as a number that orders as the bytes do."""
    raw = np.ascontiguousarray(ids).view(np.uint8).reshape(len(ids), idarray.WIDTH)[:, :8]
    return np.ascontiguousarray(raw).view(">u8").ravel().astype(np.uint64)


def unique(ids: np.ndarray) -> tuple:
    """``idarray.unique`` (sorted distinct ids, index of each one's first occurrence), sorting
    the ids' first 8 bytes as numbers; ids that share those take the string sort (rare)."""
    h = heads(ids)
    order = np.argsort(h)  # not stable (a far faster sort): runs of equal heads are put in place below
    hs = h[order]
    same = hs[1:] == hs[:-1]
    if same.any():
        run = np.flatnonzero(np.concatenate([[False], same]) | np.concatenate([same, [False]]))
        within = order[run]
        order[run] = within[np.lexsort((within, hs[run]))]  # each run by position: the first occurrence first
    ordered = ids[order]
    if (ordered[1:][same] != ordered[:-1][same]).any():
        return idarray.unique(ids)
    first = np.concatenate([[True], ~same]) if len(ids) else np.zeros(0, dtype=bool)
    return ordered[first], order[first]


def find(sorted_ids: np.ndarray, sorted_heads: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """``idarray.find`` through the ids' heads (``heads`` of ``sorted_ids``, which must be
    distinct: else the string search)."""
    if not len(sorted_ids) or not len(needles):
        return np.full(len(needles), -1, dtype=np.int64)
    pos = np.searchsorted(sorted_heads, heads(needles))
    hit = pos < len(sorted_ids)
    hit[hit] = sorted_ids[pos[hit]] == needles[hit]
    return np.where(hit, pos, -1)


def prefixes(ids: np.ndarray) -> np.ndarray:
    """Each id's slice: its first two bytes as a number."""
    raw = np.ascontiguousarray(ids).view(np.uint8).reshape(len(ids), idarray.WIDTH)
    return (raw[:, 0].astype(np.intp) << 8) | raw[:, 1]


def firsts(ids: np.ndarray) -> np.ndarray:
    """Each id's first byte (its spill file), as uint8."""
    return np.ascontiguousarray(ids).view(np.uint8).reshape(len(ids), idarray.WIDTH)[:, 0]


def factorize(names: np.ndarray) -> tuple:
    """(the distinct 16-byte names of ``names`` (a V16 array) as bytes, which of those each
    element is). Grouped by their first 8 bytes as a number (sorting numbers is far faster than
    sorting V16 elements); names that share those take the whole-name sort."""
    raw = np.ascontiguousarray(names).view("<u8").reshape(len(names), 2)
    heads, which = np.unique(raw[:, 0], return_inverse=True)
    which = which.reshape(len(names))
    rep = np.zeros((len(heads), 2), dtype="<u8")
    rep[which] = raw  # one name per group: every other one in its group must equal it
    if (rep[which] != raw).any():
        distinct, which = np.unique(names, return_inverse=True)
        rep, which = np.ascontiguousarray(distinct).view("<u8").reshape(len(distinct), 2), which.reshape(len(names))
    blob = rep.tobytes()
    return [blob[k * 16:(k + 1) * 16] for k in range(len(rep))], which


def slice_of(cid: bytes) -> int:
    return cid[0] << 8 | cid[1]


class Scratch:
    """The scratch folder of one walk's spills, made on first use (under ``.mvc/tmp`` when it is
    writable, else the system's temporary folder); ``close`` removes it."""

    def __init__(self, mvc_dir: Optional[Path] = None):
        self.mvc_dir, self.path, self._n = mvc_dir, None, 0
        self.full = False  # the disk took no more: spills hold their records in memory

    def folder(self) -> Path:
        if self.path is None:
            made = None
            if self.mvc_dir is not None:
                try:
                    (Path(self.mvc_dir) / "tmp").mkdir(exist_ok=True)
                    made = tempfile.mkdtemp(prefix=f"walk-{scratch.tag()}-", dir=Path(self.mvc_dir) / "tmp")
                except OSError:  # a read-only repository: spill elsewhere
                    made = None
            self.path = Path(made or tempfile.mkdtemp(prefix="mvc-walk-"))
        self._n += 1
        sub = self.path / str(self._n)
        sub.mkdir()
        return sub

    def append(self, folder: Optional[Path], parts: dict) -> Optional[Path]:
        """Append each of ``parts`` ({file name: records or a list of them}) to its file in ``folder`` (made here if
        None); the folder. On a full disk, every file is cut back to what it held, nothing more
        is spilled (``full``: the records stay in memory, as before slicing) and None is returned."""
        if self.full:
            return None
        done = []
        try:
            folder = folder or self.folder()
            for name, recs in parts.items():
                path = folder / name
                done.append((path, path.stat().st_size if path.exists() else 0))
                with open(path, "ab") as f:
                    for part in recs if isinstance(recs, list) else [recs]:
                        f.write(part.data if part.flags.c_contiguous else part.tobytes())
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            for path, size in done:
                try:
                    os.truncate(path, size)
                except OSError:
                    pass
            self.full = True
            return None
        return folder

    def close(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None

    def __enter__(self) -> "Scratch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Spill:
    """Records of ``dtype`` (its first field an id) by the slice of their id: in memory until
    ``budget`` are pending, then appended to a file per first id byte. ``take`` reads a run
    of slices back, each slice's in the order they were added, ``scan`` a file's records."""

    def __init__(self, dtype: np.dtype, budget: int, where: Scratch):
        self.dtype, self.budget, self.where = dtype, budget, where
        self.counts = np.zeros(SLICES, dtype=np.int64)  # records per slice, pending or on disk
        self._disk = np.zeros(FILES, dtype=np.int64)  # records per file
        self._pending, self._size, self._folder = [], 0, None

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def add(self, recs: np.ndarray) -> None:
        if not len(recs):
            return
        self._pending.append(recs)
        self._size += len(recs)
        self.counts += np.bincount(prefixes(recs["id"]), minlength=SLICES)
        if self._size >= self.budget:
            self.flush()

    def flush(self) -> None:
        if not self._pending or self.where.full:
            return
        recs = np.concatenate(self._pending)
        first = firsts(recs["id"])
        order = np.argsort(first, kind="stable")  # one byte a key: a radix sort
        cuts = np.concatenate([[0], np.cumsum(np.bincount(first, minlength=FILES))])
        recs = np.take(recs, order)  # (take copies whole records; indexing copies them a field at a time)
        parts = {f"{b:02x}": recs[cuts[b]:cuts[b + 1]] for b in np.flatnonzero(np.diff(cuts)).tolist()}
        folder = self.where.append(self._folder, parts)
        if folder is not None:
            self._folder = folder
            self._pending, self._size = [], 0
            self._disk += np.diff(cuts)

    def take(self, b: int, e: int) -> np.ndarray:
        """The records of slices b..e-1; each slice's in the order they were added."""
        parts = []
        for f in range(b >> 8, ((e - 1) >> 8) + 1):
            whole = b <= f << 8 and (f + 1) << 8 <= e
            for recs in self.scan(f, pending=False):
                parts.append(recs if whole else _within(recs, b, e))
        parts += [_within(recs, b, e) for recs in self._pending]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    def scan(self, f: int, pending: bool = True) -> Iterator[np.ndarray]:
        """The records of file ``f`` (first id byte f), ``budget`` at a time, in the order they
        were added (and, with ``pending``, those of it still in memory)."""
        if self._disk[f]:
            path, count = self._folder / f"{f:02x}", int(self._disk[f])
            for at in range(0, count, self.budget):
                yield np.fromfile(path, dtype=self.dtype, count=min(self.budget, count - at),
                                  offset=at * self.dtype.itemsize)
        if pending:
            yield from (_within(recs, f << 8, (f + 1) << 8) for recs in self._pending)

    def end(self, b: int, also: Optional[np.ndarray] = None) -> int:
        """The end of the step that starts at slice ``b``: as many slices as fit the budget
        (counting ``also``'s records per slice too), at least one."""
        counts = self.counts[b:] if also is None else self.counts[b:] + also[b:]
        return b + max(1, int(np.searchsorted(np.cumsum(counts), self.budget, "right")))


def _within(recs: np.ndarray, b: int, e: int) -> np.ndarray:
    """The records of slices b..e-1 among ``recs``."""
    p = prefixes(recs["id"])
    return recs[(p >= b) & (p < e)]


def bounds(b: int, e: int) -> tuple:
    """(lo, hi) ids of slices b..e-1 for ``Txn.chunk_batches`` (hi None: to the end)."""
    return bytes([b >> 8, b & 255]), (bytes([e >> 8, e & 255]) if e < SLICES else None)


@dataclass
class Step:
    """What one step found: its live ids (sorted) and, aligned with them, their lengths, whether
    the index has an entry (``located``) and where (LOCATIONS); the delta records among them
    ({id: (base, depth)}); and of the index entries in the step's range, the ones nothing live
    uses (``dead``), those whose value does not decode ({id: why}) and the packs they name.
    A step of revived bases (``late``) holds bases found through lookups alone: ``dead`` is
    empty, and each located one was a dead entry of the earlier step of its slice."""

    ids: np.ndarray
    lengths: np.ndarray
    located: np.ndarray
    locations: np.ndarray
    deltas: dict = field(default_factory=dict)
    dead: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=idarray.ID))
    bad: dict = field(default_factory=dict)
    packs: set = field(default_factory=set)
    late: bool = False

    def cid(self, row: int) -> bytes:
        return idarray.one(self.ids, row)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """ROW records of ``rows`` (located ones)."""
        out = np.zeros(len(rows), dtype=ROW)
        out["id"] = self.ids[rows]
        for name in ("pack", "offset", "length", "size", "kind"):
            out[name] = self.locations[name][rows]
        if self.deltas:
            keys = list(self.deltas)
            slot = np.full(len(self.ids), -1, dtype=np.int64)
            slot[rows] = np.arange(len(rows))
            at = idarray.find(self.ids, idarray.pack(keys))
            k = np.where(at >= 0, slot[at], -1)
            sel = k >= 0
            bases = np.zeros(len(rows), dtype=idarray.ID)
            bases[k[sel]] = idarray.pack([self.deltas[c][0] for c in keys])[sel]
            out["base"] = bases
            out["depth"][k[sel]] = np.array([self.deltas[c][1] for c in keys], dtype=np.int64)[sel]
            out["delta"][k[sel]] = True
        return out


def location(rows: np.ndarray, i: int) -> Location:
    """Row ``i`` of a ROW array as a Location."""
    row = rows[i]
    kind = int(row["kind"])
    base = idarray.one(rows["base"], i) if row["delta"] else None
    return Location(rows["pack"][i:i + 1].tobytes(), int(row["offset"]), int(row["length"]), kind,
                    int(row["size"]) if kind else -1, int(row["depth"]) if base else 0, base)


def _unique(recs: np.ndarray) -> tuple:
    """(sorted distinct ids of ``recs``, the length of each one's first record)."""
    ids, first = unique(recs["id"])
    return ids, recs["length"][first]


class LivePass:
    """The steps over a walk's spilled live records (``live``, RECORD) in index transaction
    ``txn``. ``edges`` collects every live delta record's (base, chunk): what names the tensors
    that damage to a base breaks."""

    def __init__(self, txn, live: Spill, where: Scratch):
        self.txn, self.live, self.budget = txn, live, live.budget
        self.edges = Spill(EDGE, live.budget, where)
        self._where = where
        self._late = Spill(RECORD, live.budget, where)

    def steps(self) -> Iterator[Step]:
        b = 0
        while b < SLICES:
            e = self.live.end(b)
            yield self._step(b, e)  # a range with no live id still has its index entries: garbage
            b = e
        while self._late.total:
            late, self._late = self._late, Spill(RECORD, self.budget, self._where)
            b = 0
            while b < SLICES:
                e = self.live.end(b, late.counts)
                if late.counts[b:e].any():
                    step = self._revive(late.take(b, e), b, e)
                    if len(step.ids):
                        yield step
                b = e

    # -- one step ----------------------------------------------------------------

    def _step(self, b: int, e: int) -> Step:
        ids, lengths = _unique(self.live.take(b, e))
        lo, hi = bounds(b, e)
        step = Step(ids, lengths, np.zeros(len(ids), dtype=bool), np.zeros(len(ids), dtype=LOCATIONS))
        dead, h = [], heads(ids)
        distinct = not len(h) or bool((h[1:] != h[:-1]).all())
        for batch in self.txn.chunk_batches(lo=lo, hi=hi):
            pos = find(ids, h, batch.ids) if distinct else idarray.find(ids, batch.ids)
            hit = pos >= 0
            step.located[pos[hit]] = True
            np.put(step.locations, pos[hit], np.take(batch.locs, np.flatnonzero(hit)))
            for row, why in batch.bad.items():
                step.bad[idarray.one(batch.ids, row)] = why
            for row, delta in batch.bases.items():
                if pos[row] >= 0:
                    step.deltas[idarray.one(batch.ids, row)] = delta
            step.packs.update(factorize(batch.locs["pack"][~batch.locs["bad"]])[0])
            dead.append(batch.ids[~hit])
        step.dead = np.concatenate(dead) if dead else np.zeros(0, dtype=idarray.ID)
        self._bases(step, b, e)
        return step

    def _bases(self, step: Step, b: int, e: int) -> None:
        """Make the delta bases of the step's live chunks live: a base in the step's range here
        (looked up on its own if nothing else holds it, as before slicing), a base in a later
        slice by a record in the spill, a base in an earlier one as a late base."""
        added, found = {}, {}  # base id in range, not live otherwise -> length; -> its Location, if indexed
        todo, sent = list(step.deltas), set()
        while todo:
            cid = todo.pop()
            base = step.deltas[cid][0]
            if base in sent or base in added or len(base) != idarray.WIDTH:
                continue
            here = b <= slice_of(base) < e
            if here and idarray.contains(step.ids, base) >= 0:
                continue
            size = self._size(step, cid, found)
            if not here:
                sent.add(base)
                spill = self.live if slice_of(base) >= e else self._late
                spill.add(_records([base], [size]))
                continue
            added[base] = size
            loc = self._lookup(base)
            if loc is not None:
                found[base] = loc
                if loc.base is not None:
                    step.deltas[base] = (loc.base, loc.depth)
                    todo.append(base)
        if added:
            _add(step, added, found)
        self._edges(step)

    def _edges(self, step: Step) -> None:
        if step.deltas:
            edges = np.zeros(len(step.deltas), dtype=EDGE)
            edges["id"] = idarray.pack([base for base, _ in step.deltas.values()])
            edges["user"] = idarray.pack(list(step.deltas))
            self.edges.add(edges)

    def _size(self, step: Step, cid: bytes, found: dict) -> int:
        """The decoded size of live chunk ``cid``'s record (its base decodes to as many bytes)."""
        if cid in found:
            return found[cid].size
        i = idarray.contains(step.ids, cid)
        if i >= 0 and step.located[i]:
            return int(step.locations["size"][i])
        loc = self._lookup(cid)
        return loc.size if loc is not None else (int(step.lengths[i]) if i >= 0 else 0)

    def _lookup(self, cid: bytes):
        try:
            return self.txn.chunk(cid)
        except CorruptObject:  # a damaged entry: fsck names it when it locates the chunk
            return None

    # -- late bases -----------------------------------------------------------------

    def _revive(self, late: np.ndarray, b: int, e: int) -> Step:
        """The step of the late bases of slices b..e-1 that no live record names."""
        ids, lengths = _unique(late)
        live = unique(self.live.take(b, e)["id"])[0]
        keep = idarray.find(live, ids) < 0
        ids, lengths = ids[keep], lengths[keep]
        step = Step(ids, lengths, np.zeros(len(ids), dtype=bool), np.zeros(len(ids), dtype=LOCATIONS), late=True)
        if not len(ids):
            return step
        self.live.add(_records(idarray.ids(ids), lengths))  # live from now on, for later rounds
        for i, cid in enumerate(idarray.ids(ids)):
            loc = self._lookup(cid)
            if loc is None:
                continue
            step.located[i] = True
            step.locations[i] = (loc.pack, loc.offset, loc.length, loc.size, loc.kind, False)
            if loc.base is not None:
                step.deltas[cid] = (loc.base, loc.depth)
                if len(loc.base) == idarray.WIDTH:
                    self._late.add(_records([loc.base], [loc.size]))
        self._edges(step)
        return step


def _records(ids: list, lengths) -> np.ndarray:
    out = np.zeros(len(ids), dtype=RECORD)
    out["id"] = idarray.pack(list(ids))
    out["length"] = lengths
    out["owner"] = -1
    return out


def _add(step: Step, added: dict, found: dict) -> None:
    """Make the bases in ``added`` live in ``step``: in its ids, and located where the index has them."""
    ids = np.concatenate([step.ids, idarray.pack(list(added))])
    lengths = np.concatenate([step.lengths, np.array(list(added.values()), dtype=np.int64)])
    order = np.argsort(ids, kind="stable")
    where = np.empty(len(ids), dtype=np.int64)
    where[order] = np.arange(len(ids))
    located = np.zeros(len(ids), dtype=bool)
    locations = np.zeros(len(ids), dtype=LOCATIONS)
    n = len(step.ids)
    located[where[:n]], locations[where[:n]] = step.located, step.locations
    for k, cid in enumerate(added):
        loc = found.get(cid)
        if loc is not None:
            located[where[n + k]] = True
            locations[where[n + k]] = (loc.pack, loc.offset, loc.length, loc.size, loc.kind, False)
    step.ids, step.lengths, step.located, step.locations = ids[order], lengths[order], located, locations
    made_live = np.sort(idarray.pack(list(added)))
    step.dead = step.dead[idarray.find(made_live, step.dead) < 0]


class PackRows:
    """The located rows of the walk by pack (16-byte name): in memory until more than ``budget``
    are pending, then appended to files per pack. A row whose record is no delta (nearly all)
    is kept as a PLAIN record, half a ROW (its pack is its file's, it names no base); the others
    as ROW records, in a file of their own. ``blocks(pack)`` reads one pack's back a budget at
    a time, ``rows(pack)`` all of them, as ROW records."""

    DELTAS = "-deltas"  # the suffix of a pack's file of ROW records

    def __init__(self, budget: int, where: Scratch):
        self.budget, self.where = budget, where
        self._pending, self._size, self._folder, self._disk = {}, 0, None, set()  # (name, delta) keys

    def add(self, step: Step, rows: np.ndarray) -> tuple:
        """The rows ``rows`` of ``step`` (located ones); (the 16-byte names of their packs,
        which of those each row's is)."""
        if not len(rows):
            return [], np.zeros(0, dtype=np.intp)
        names, which = factorize(step.locations["pack"][rows])
        delta = np.zeros(len(rows), dtype=bool)
        if step.deltas:
            at = idarray.find(step.ids, idarray.pack(list(step.deltas)))
            marked = np.zeros(len(step.ids), dtype=bool)
            marked[at[at >= 0]] = True
            delta = marked[rows]
        n = len(names)
        key = (which.astype(np.uint16) if n <= 1 << 15 else which) + delta * n  # plain rows by pack, then delta rows
        order = np.argsort(key, kind="stable")
        groups = np.bincount(key, minlength=2 * n)
        ordered, plain = rows[order], int(groups[:n].sum())
        # each kind made once for the step (a ROW looks its delta up among all of the step's)
        for is_delta, made, counts in ((False, _plain(step, ordered[:plain]), groups[:n]),
                                       (True, step.rows(ordered[plain:]), groups[n:])):
            parts = np.split(made, np.cumsum(counts)[:-1])
            for k in np.flatnonzero(counts).tolist():
                self._pending.setdefault((names[k], is_delta), []).append(parts[k])
        self._size += len(rows)
        if self._size >= self.budget:
            self.flush()
        return names, which

    def flush(self) -> None:
        if self.where.full:
            return
        parts = {_file(name, is_delta): p for (name, is_delta), p in self._pending.items()}
        folder = self.where.append(self._folder, parts)
        if folder is not None:
            self._folder = folder
            self._disk |= set(self._pending)
            self._pending, self._size = {}, 0

    def packs(self) -> set:
        return {name for name, _ in self._disk | set(self._pending)}

    def rows(self, pack: bytes) -> np.ndarray:
        """All of one pack's rows, as ROW records."""
        parts = list(self.blocks(pack))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=ROW)

    def blocks(self, pack: bytes, plain: bool = False) -> Iterator[np.ndarray]:
        """One pack's rows, at most ``budget`` at a time: a pack of any size in bounded memory.
        ROW records; with ``plain``, the rows of records that are no delta come as PLAIN ones
        (their id, offset, length, size and kind are all a trailer check reads)."""
        for is_delta, dtype in ((False, PLAIN), (True, ROW)):
            key = (pack, is_delta)
            blocks = []
            if key in self._disk:
                path = self._folder / _file(pack, is_delta)
                count = path.stat().st_size // dtype.itemsize
                blocks = (np.fromfile(path, dtype=dtype, count=min(self.budget, count - at), offset=at * dtype.itemsize)
                          for at in range(0, count, self.budget))
            for got in itertools.chain(blocks, self._pending.get(key, [])):
                yield got if is_delta or plain else _widen(got, pack)


def _file(pack: bytes, is_delta: bool) -> str:
    return pack.hex() + (PackRows.DELTAS if is_delta else "")


def _plain(step: Step, rows: np.ndarray) -> np.ndarray:
    """PLAIN records of ``step``'s located ``rows``."""
    out = np.empty(len(rows), dtype=PLAIN)
    out["id"] = step.ids[rows]
    locations = np.take(step.locations, rows)
    for name in ("offset", "length", "size", "kind"):
        out[name] = locations[name]
    return out


def _widen(plain: np.ndarray, pack: bytes) -> np.ndarray:
    """ROW records of PLAIN ones of ``pack``."""
    out = np.zeros(len(plain), dtype=ROW)
    for name in PLAIN.names:
        out[name] = plain[name]
    out["pack"] = np.frombuffer(pack, dtype="V16")[0]
    return out


class Listing:
    """A sealed pack's trailer records (``table``, sorted by offset) against the located rows
    (ROW) that name the pack: ``match`` says which rows it lists where they say, ``used`` which
    of its records some row's offset names."""

    def __init__(self, table: np.ndarray):
        self.table = table
        self.offsets = np.ascontiguousarray(table["offset"])
        self.distinct = bool((self.offsets[1:] > self.offsets[:-1]).all())
        self.used = np.zeros(len(table), dtype=bool)

    def match(self, rows: np.ndarray) -> np.ndarray:
        """Whether the trailer lists each of ``rows`` at its offset, with its id and length."""
        if not len(self.table) or not len(rows):
            return np.zeros(len(rows), dtype=bool)
        offsets = np.ascontiguousarray(rows["offset"])
        order = np.argsort(offsets)  # searched in offset order: one sweep through the trailer, not a cache miss each
        at = np.empty(len(rows), dtype=np.intp)
        at[order] = np.searchsorted(self.offsets, offsets[order])
        np.minimum(at, len(self.table) - 1, out=at)
        same = self.offsets[at] == offsets
        if self.distinct:  # the record a row's offset names is the one searched out
            self.used[at[same]] = True
        else:  # a damaged trailer that lists an offset twice: every record at it
            self.used |= np.isin(self.offsets, offsets)
        return same & (self.table["id"][at] == rows["id"]) & (self.table["length"][at] == rows["length"])


def holders(live: Spill, cids: set) -> dict:
    """{chunk id: ids (owner numbers) of the tensors that list it} for ``cids``, read from the
    live spill a file and a budget at a time."""
    out = {cid: set() for cid in cids}
    for f, wanted in _by_file(cids):
        for recs in live.scan(f):
            recs = recs[(recs["owner"] >= 0) & np.isin(recs["id"], wanted)]
            for cid, owner in zip(idarray.ids(recs["id"]), recs["owner"].tolist()):
                out[cid].add(owner)
    return out


def users(edges: Spill, cids: set) -> dict:
    """{base: [ids of the live chunks that are deltas on it]} for ``cids`` and, transitively, for
    the chunks that are deltas on them, read from the edges a file and a budget at a time."""
    out, todo = {}, {cid for cid in cids if len(cid) == idarray.WIDTH}
    while todo:
        found = set()
        for f, wanted in _by_file(todo):
            for recs in edges.scan(f):
                recs = recs[np.isin(recs["id"], wanted)]
                for base, user in zip(idarray.ids(recs["id"]), idarray.ids(recs["user"])):
                    out.setdefault(base, []).append(user)
                    found.add(user)
        for cid in todo:
            out.setdefault(cid, [])
        todo = {cid for cid in found if cid not in out}
    return out


def _by_file(cids) -> list:
    """[(first byte, id array of those of ``cids`` that start with it)], by first byte."""
    groups = {}
    for cid in cids:
        if len(cid) == idarray.WIDTH:
            groups.setdefault(cid[0], []).append(cid)
    return [(f, idarray.pack(ids)) for f, ids in sorted(groups.items())]
