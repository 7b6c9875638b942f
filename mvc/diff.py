"""Comparing two commits: what changed in the tensors, the plain values and the record.

Vocabulary:

- **status** of a tensor key: ``added`` (only in B), ``removed`` (only in A),
  ``unchanged`` (same tensor id, or every byte equal), ``changed`` (same
  dtype and shape, some bytes differ) or ``reshaped`` (shape or dtype
  differs, so no element-wise numbers exist).
- **chunk fraction**: the share of B's chunks whose ids differ from A's at
  the same position; what a commit of B on top of A would have to write.
- **relative change**: ‖B−A‖ / ‖A‖ (L2 over all elements), next to
  max |B−A| and the cosine similarity of A and B. Computed in float64,
  with sums of squares scaled by powers of two where they would leave its
  range (elements past about 1e154 or below 1e-154).
- **elements changed**: elements whose bytes differ (bit-exact, so a NaN
  that stays NaN is unchanged and 0.0 → -0.0 is a change).
- **section** of a key: ``model`` (the weights, and anything not named
  below), ``optimizer`` (optimizer, LR-scheduler and grad-scaler state:
  Adam's moments and step counters), ``rng`` (random-generator states) or
  ``data`` (loader and sampler positions), told from the key's parts.
  Tensors are listed model first, then in that order, each in model order.

Unchanged tensors are recognised from their ids without reading data.
Changed tensors are streamed window by window (a window is a whole number
of chunks and of elements): for each window only A's bytes are read where
the chunk ids agree, both sides where they differ. At most one window pair
per worker thread is in memory, never a whole state.
"""

import bisect
import fnmatch
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import dtypes, reader
from .errors import BadInput
from .encoding import key_order
from .records import Commit, Entry
from .store.chunks import THREADS, Request
from .objects import TensorLeaf
from .traverse import children, format_path, is_container, walk
from .traverse import format_path as _key

ADDED, REMOVED, UNCHANGED, CHANGED, RESHAPED = "added", "removed", "unchanged", "changed", "reshaped"
UNCHANGED_NUMBERS = {"relative_change": 0.0, "max_abs_diff": 0.0}  # known without reading data
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class TensorDiff:
    """One tensor key compared. Numbers are None where they do not apply
    (added, removed, reshaped) or the dtype has no numeric conversion."""

    key: str
    path: tuple
    status: str
    dtype_a: Optional[str]
    dtype_b: Optional[str]
    shape_a: Optional[tuple]
    shape_b: Optional[tuple]
    numel: int  # elements of B (of A when removed)
    nbytes: int  # bytes of B (of A when removed)
    chunks: int  # chunks of B (of A when removed)
    chunks_changed: int
    chunk_fraction: float
    bytes_changed: int  # bytes of B's chunks that differ (all of B when added/reshaped)
    elements_changed: Optional[int]  # None when answered from chunk ids (read_data=False)
    norm_a: Optional[float] = None
    norm_b: Optional[float] = None
    norm_diff: Optional[float] = None  # ‖B−A‖
    relative_change: Optional[float] = None  # ‖B−A‖ / ‖A‖ (inf when A is zero and B is not)
    max_abs_diff: Optional[float] = None
    cosine: Optional[float] = None  # None when A or B is all zeros


@dataclass(frozen=True)
class ValueDiff:
    """A plain value of the tree that is added, removed or changed."""

    key: str
    path: tuple
    status: str
    a: Any
    b: Any


@dataclass(frozen=True)
class FieldChange:
    """A field of the commit record that differs: message, step, epoch,
    ``metrics.NAME`` or ``context.DOTTED.KEY``."""

    name: str
    a: Any
    b: Any


@dataclass(frozen=True)
class DiffSummary:
    tensors: int  # tensor keys compared (both sides, after --only)
    tensors_changed: int  # every status but unchanged
    tensors_added: int
    tensors_removed: int
    bytes_total: int  # bytes of every tensor compared: B's, or A's for a removed one
    bytes_changed: int  # bytes of changed chunks of B, and all bytes of removed tensors
    elements_total: int  # elements of B's tensors
    elements_changed: int
    parameters_changed: float  # elements_changed / elements_total (0 when B has none)
    values_changed: int
    bytes_removed: int = 0  # bytes of A's tensors that B no longer has (part of bytes_changed)


@dataclass(frozen=True)
class Diff:
    a: Commit
    b: Commit
    only: Optional[str]
    tensors: tuple  # TensorDiff for every tensor key: by section, each in model order (see tensor_order)
    values: tuple  # ValueDiff for plain values that differ
    commit: tuple  # FieldChange for record fields that differ
    summary: DiffSummary

    def changed(self) -> list:
        """The TensorDiffs whose status is not unchanged."""
        return [t for t in self.tensors if t.status != UNCHANGED]


def diff(repo, a: str, b: Optional[str] = None, only: Optional[str] = None, read_data: bool = True) -> Diff:
    """Compare commit ``a`` with ``b`` (default HEAD, the working branch tip).

    ``only`` is a glob (fnmatch, case-sensitive) on dotted keys such as
    ``'model.layers.*'``; it limits tensors and plain values, not the record.
    ``read_data=False`` answers from chunk ids alone wherever they decide
    (a changed tensor gets its chunk figures, and None for the element
    counts and numbers, as does the summary); tensors whose two sides are
    chunked differently are still read.
    Raises BadInput when ``only`` matches no key of either commit,
    UnknownRevision / AmbiguousRevision for bad revisions, and
    ObjectNotFound / ChecksumMismatch when stored data is missing or corrupt.
    """
    # the shared gc lock: gc must not move a pack between a chunk's lookup and its read
    with repo.gc_lock.shared():
        commit_a = repo.get_commit(a)
        commit_b = repo.get_commit("HEAD" if b is None else b)
        all_a, all_b = repo.entries(commit_a.id), repo.entries(commit_b.id)
        entries_a, entries_b = _select(all_a, only), _select(all_b, only)
        if only is not None and not entries_a and not entries_b:
            examples = ", ".join(repr(e.key) for e in (all_b or all_a)[:3]) or "none: both are empty"
            raise BadInput(f"no key of {commit_a.short_id} or {commit_b.short_id} matches only={only!r} "
                           f"(keys look like {examples}); the glob matches whole dotted keys, e.g. 'model.*'")
        tensors_a = {e.path: e for e in entries_a if e.kind == "tensor"}
        tensors_b = {e.path: e for e in entries_b if e.kind == "tensor"}
        tensors = _tensor_diffs(repo, tensors_a, tensors_b, read_data)
        shapes = _container_diffs(_containers(repo, commit_a.id, only), _containers(repo, commit_b.id, only))
    values = _value_diffs({e.path: e for e in entries_a if e.kind == "value"},
                          {e.path: e for e in entries_b if e.kind == "value"})
    values = sorted(values + shapes, key=lambda v: (natural_key(v.key), _path_order(v.path)))
    fields = record_changes(commit_a, commit_b)
    return Diff(commit_a, commit_b, only, tuple(tensors), tuple(values), tuple(fields),
                _summary(tensors, values))


def _select(entries: list, only: Optional[str]) -> list:
    if only is None:
        return entries
    return [e for e in entries if fnmatch.fnmatchcase(e.key, only)]


def _path_order(path: tuple) -> tuple:
    return tuple(key_order(k) for k in path)


SECTIONS = ("model", "data", "optimizer", "rng")
_OPTIMIZER_PARTS = {"optimizer", "optimizers", "optimizer_states", "optimizer_state", "optim", "opt_state",
                    "scheduler", "schedulers", "lr_scheduler", "lr_schedulers", "scaler", "grad_scaler"}
_RNG_PARTS = {"rng", "rngs", "rng_state", "rng_states", "rng_tracker", "random"}  # not "generator": a GAN's weights
_DATA_PARTS = {"loader", "loaders", "dataloader", "sampler", "data_state"}


def section_of(key: str) -> str:
    """The section of dotted key ``key`` (see the module doc): the first telling part decides."""
    for part in key.split("."):
        low = part.lower()
        if low in _RNG_PARTS or low.endswith(("_rng_state", "_rng")):
            return "rng"
        if low in _OPTIMIZER_PARTS:
            return "optimizer"
        if low in _DATA_PARTS:
            return "data"
    return "model"


def tensor_order(key: str) -> tuple:
    """Model tensors first, then data, optimizer and RNG state; model order within each."""
    return SECTIONS.index(section_of(key)), natural_key(key)


def natural_key(key: str) -> tuple:
    """Sort key for model order: runs of digits compare as numbers, so
    ``layers.2`` comes before ``layers.10``. A state's own order is not
    stored (trees keep canonical key order); this is how a ``layers.N``
    model reads top to bottom."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", key) if part)


# -- tensors ---------------------------------------------------------------

def _tensor_diffs(repo, side_a: dict, side_b: dict, read_data: bool = True) -> list:
    paths = sorted(side_a.keys() | side_b.keys(), key=lambda p: (tensor_order(_key(p)), _path_order(p)))
    streamed = [p for p in paths if p in side_a and p in side_b and _comparable(side_a[p], side_b[p])]
    found = {}
    if not read_data:
        found = {p: d for p in streamed if (d := _from_ids(repo, side_a[p], side_b[p])) is not None}
        streamed = [p for p in streamed if p not in found]
    with ThreadPoolExecutor(THREADS) as pool:
        found.update(zip(streamed, pool.map(lambda p: _stream(repo, side_a[p], side_b[p]), streamed)))
    return [found[p] if p in found else _unstreamed(side_a.get(p), side_b.get(p)) for p in paths]


def _from_ids(repo, ea: Entry, eb: Entry) -> Optional[TensorDiff]:
    """A changed tensor's chunk figures from its ids alone, or None when the
    two sides are chunked differently (then only the bytes can tell)."""
    obj_a, obj_b = repo.tensor_object(ea.tensor_id), repo.tensor_object(eb.tensor_id)
    if obj_a.chunk_size != obj_b.chunk_size or obj_a.shards != obj_b.shards:
        return None
    chunks = _changed_chunks(obj_a, obj_b)  # ids differ, layouts agree: some chunk differs
    return TensorDiff(eb.key, eb.path, CHANGED, ea.dtype, eb.dtype, tuple(ea.shape), tuple(eb.shape),
                      math.prod(eb.shape), eb.nbytes, len(eb.chunks), len(chunks), len(chunks) / len(eb.chunks),
                      sum(n for _, n in chunks), None)


def _comparable(ea: Entry, eb: Entry) -> bool:
    """Same dtype and shape but different ids: worth reading."""
    return ea.tensor_id != eb.tensor_id and ea.dtype == eb.dtype and ea.shape == eb.shape


def _unstreamed(ea: Optional[Entry], eb: Optional[Entry]) -> TensorDiff:
    """Added, removed, reshaped or (equal ids) unchanged: no data is read."""
    e = eb or ea
    if ea is not None and eb is not None and ea.tensor_id == eb.tensor_id:
        status, changed = UNCHANGED, False
    else:
        status, changed = (ADDED if ea is None else REMOVED if eb is None else RESHAPED), True
    numel = math.prod(e.shape)
    return TensorDiff(e.key, e.path, status, ea and ea.dtype, eb and eb.dtype,
                      ea and tuple(ea.shape), eb and tuple(eb.shape), numel, e.nbytes,
                      len(e.chunks), len(e.chunks) if changed else 0, 1.0 if changed and e.chunks else 0.0,
                      e.nbytes if changed else 0, numel if changed else 0,
                      **({} if changed else UNCHANGED_NUMBERS))


class _Reader:
    """Byte ranges of one stored tensor's stream, read one verified chunk at a
    time through the chunk store, in the caller's index transaction. (The
    stream is the tensor's C-order bytes unless its shards need scattering;
    ``_stream`` compares such a tensor through ``_Loaded`` when the two
    sides are not sharded alike.)"""

    def __init__(self, repo, txn, obj, key: str):
        self.repo, self.txn, self.obj = repo, txn, obj
        self.spans = list(obj.chunk_spans())  # sharded tensors restart chunking at every shard
        self.starts = [off for _, off, _ in self.spans]
        self.what = f"tensor {key!r}"
        self._index, self._data = -1, memoryview(b"")

    def _at(self, pos: int) -> int:
        return bisect.bisect_right(self.starts, pos) - 1

    def ids(self, start: int, stop: int) -> tuple:
        return tuple(cid for cid, _, _ in self.spans[self._at(start):self._at(stop - 1) + 1])

    def read(self, start: int, stop: int):
        """The bytes [start, stop) as a bytes-like object."""
        parts, pos = [], start
        while pos < stop:
            i = self._at(pos)
            data = self._chunk(i)
            at = pos - self.starts[i]
            take = min(stop - pos, len(data) - at)
            parts.append(data[at:at + take])
            pos += take
        return parts[0] if len(parts) == 1 else b"".join(parts)  # one part: no copy

    def _chunk(self, i: int) -> memoryview:
        if i != self._index:  # windows move forward, so one cached chunk suffices
            cid, _, n = self.spans[i]
            buffer = bytearray(n)
            reader.read_runs(self.repo, self.txn, [Request(cid, buffer, self.what)], threads=1)
            self._data, self._index = memoryview(buffer), i
        return self._data


class _Loaded:
    """A tensor read whole into memory, in C order: for sharded tensors whose
    streams are not comparable byte for byte (shards cut by columns, and
    the two sides cut differently)."""

    def __init__(self, repo, txn, oid: bytes, obj, key: str):
        import torch
        from .objects import TensorLeaf
        tensor = reader.read_tensors(repo, txn, [((key,), TensorLeaf(oid))], b"")[oid]
        self.obj, self.data = obj, memoryview(tensor.reshape(-1).view(torch.uint8).numpy())

    def ids(self, start: int, stop: int) -> tuple:
        return ()

    def read(self, start: int, stop: int):
        return self.data[start:stop]


class _Sums:
    """Accumulators for ‖A‖², ‖B‖², ‖B−A‖² (each a ``_Squares``) and max |B−A|.

    Elements are read in their own numpy dtype and widened to float64
    inside the loops (einsum and subtract with ``dtype``), so no float64
    copy of a window is made unless its squares leave float64's range.
    A·B follows as (‖A‖² + ‖B‖² − ‖B−A‖²) / 2, one pass fewer. numpy's
    loops are single-threaded, so they stay predictable on a busy machine
    (a threaded BLAS dot was up to 50 times slower there).
    """

    def __init__(self):
        self.aa, self.bb, self.dd = _Squares(), _Squares(), _Squares()
        self.max = 0.0
        self.numeric = True

    def same(self, a: Optional[np.ndarray]) -> None:
        if a is None:
            self.numeric = False
            return
        s, e = _squares(a)
        self.aa.add(s, e)
        self.bb.add(s, e)

    def differ(self, a, b, changed: np.ndarray) -> None:
        if a is None or b is None:
            self.numeric = False
            return
        with np.errstate(all="ignore"):  # inf - inf and overflows are results here, not warnings
            self._differ(a, b, changed)

    def _differ(self, a, b, changed: np.ndarray) -> None:
        self.aa.add(*_squares(a))
        self.bb.add(*_squares(b))
        d = _unchanged_to_zero(np.subtract(b, a, dtype=np.float64), changed)
        self.dd.add(*_difference_squares(a, b, d, changed))
        top = _max_abs(d)
        if top != top or top > self.max:  # a NaN, once seen, stays
            self.max = top

    def norms(self) -> dict:
        return dict(norm_a=self.aa.root(), norm_b=self.bb.root(), norm_diff=self.dd.root(),
                    relative_change=_relative(self.dd, self.aa), cosine=_cosine(self.aa, self.bb, self.dd))


class _Squares:
    """A sum of squares held as ``s · 4**e``, ``s`` in [0.5, 2) (or 0, inf,
    NaN), so it reaches past float64's range (‖x‖² of 1e200 is 1e400) with
    a float's precision: the scaling of BLAS nrm2 and LAPACK dlassq, by
    powers of two, so a sum in range has the very bits a plain one has."""

    def __init__(self):
        self.s, self.e = 0.0, 0

    def add(self, s: float, e: int) -> None:
        if s == 0:
            return
        if self.s == 0:
            self.s, self.e = s, e
        else:
            top = max(self.e, e)
            self.s, self.e = self.at(top) + math.ldexp(s, 2 * (e - top)), top
        if math.isfinite(self.s):
            half = math.frexp(self.s)[1] // 2
            self.s, self.e = math.ldexp(self.s, -2 * half), self.e + half

    def at(self, e: int) -> float:
        """The sum over ``4**e``, for an ``e`` no lower than this sum's own."""
        return math.ldexp(self.s, 2 * (self.e - e)) if self.s else 0.0

    def root(self) -> float:
        return _ldexp(math.sqrt(self.s), self.e)


_TINY = 2.0 ** -960  # a sum of squares below this may have lost elements to underflow


def _squares(x: np.ndarray) -> tuple:
    """‖x‖² as (s, e), meaning ``s · 4**e``: the plain float64 sum where it
    is in range, else the sum of x scaled by a power of two near max |x|."""
    s = _dot(x, x)
    if _TINY <= s < math.inf or s != s:
        return s, 0
    if s == 0 and not x.any():  # all zeros (one pass, no copy): nothing was lost
        return s, 0
    top = _max_abs(x)
    if not math.isfinite(top):  # an inf or NaN that the sum rightly shows
        return s, 0
    e = math.frexp(top)[1]
    y = np.ldexp(x.astype(np.float64), -e)
    return _dot(y, y), e


def _difference_squares(a, b, d: np.ndarray, changed: np.ndarray) -> tuple:
    """‖d‖² for d = B − A, recomputed from scaled A and B where d overflowed."""
    s, e = _squares(d)
    if s != math.inf:
        return s, e
    top = max(_max_abs(a), _max_abs(b))
    if not math.isfinite(top):  # A or B holds inf or NaN: the inf is theirs
        return s, e
    k = math.frexp(top)[1]
    d = np.subtract(np.ldexp(b.astype(np.float64), -k), np.ldexp(a.astype(np.float64), -k))
    s, e = _squares(_unchanged_to_zero(d, changed))
    return s, e + k


def _unchanged_to_zero(d: np.ndarray, changed: np.ndarray) -> np.ndarray:
    """d with bit-equal elements set to 0, even NaN or inf ones."""
    if not changed.all():
        # complex elements are real pairs: each element's flag covers its values
        pairs = d.size // changed.size
        d[~(changed if pairs == 1 else np.repeat(changed, pairs))] = 0.0
    return d


def _max_abs(x: np.ndarray) -> float:
    return max(float(x.max()), -float(x.min()))  # NaN when x holds one: both are NaN then


def _relative(dd: _Squares, aa: _Squares) -> float:
    """‖B−A‖ / ‖A‖: 0 when nothing moved in value (0.0 became -0.0), inf when A is zero and B is not."""
    if dd.s == 0:
        return 0.0
    if aa.s == 0:
        return math.inf
    return _ldexp(math.sqrt(dd.s) / math.sqrt(aa.s), dd.e - aa.e)


def _cosine(aa: _Squares, bb: _Squares, dd: _Squares) -> Optional[float]:
    """A·B / (‖A‖ ‖B‖), with 2·A·B = ‖A‖² + ‖B‖² − ‖B−A‖²; None when A or B is all zeros."""
    if aa.s == 0 or bb.s == 0:
        return None
    e = max(aa.e, bb.e, dd.e if dd.s else aa.e)
    twice = aa.at(e) + bb.at(e) - dd.at(e)  # 2·A·B over 4**e
    # sqrt of the product, not a product of roots: A == B gives exactly 1.0
    return _clamp(_ldexp(twice / (2 * math.sqrt(aa.s * bb.s)), 2 * e - aa.e - bb.e))


def _ldexp(x: float, n: int) -> float:
    """x · 2**n; inf past float64's range, where math.ldexp raises."""
    try:
        return math.ldexp(x, n)
    except OverflowError:
        return math.copysign(math.inf, x)


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    with np.errstate(all="ignore"):  # a sum past float64's range is inf; _squares then scales
        return float(np.einsum("i,i->", x, y, dtype=np.float64))


# numpy reads these directly; complex numbers as pairs of their real type
_NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32,
          "I64": np.int64, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64, "F16": np.float16,
          "F32": np.float32, "F64": np.float64, "C32": np.float16, "C64": np.float32, "C128": np.float64}


def _elements(raw, dtype: str) -> Optional[np.ndarray]:
    """The elements as a flat numpy array that widens to float64 exactly
    (complex as real pairs); None if there is no numeric view (packed fp4)."""
    if dtype in _NUMPY:
        return np.frombuffer(raw, _NUMPY[dtype])
    if dtype == "BF16":  # the high half of a float32: exact by shifting the bits
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    import torch  # only the fp8 kinds need it; diffs of other dtypes run without torch
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtypes.torch_dtype(dtype))
    try:
        return t.to(torch.float32).numpy()  # the fp8 kinds: exact in float32
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _changed_elements(raw_a, raw_b, itemsize: int) -> np.ndarray:
    """Per element, whether its bytes differ (compared as whole machine words)."""
    word = _WORDS.get(itemsize)
    if word is not None:
        return np.frombuffer(raw_a, word) != np.frombuffer(raw_b, word)
    words = np.frombuffer(raw_a, np.uint64) != np.frombuffer(raw_b, np.uint64)  # 16-byte complex
    return words.reshape(-1, itemsize // 8).any(axis=1)


def _stream(repo, ea: Entry, eb: Entry) -> TensorDiff:
    """Compare two stored tensors of one dtype and shape, window by window."""
    with repo.index.read() as txn:
        ids = bytes.fromhex(ea.tensor_id), bytes.fromhex(eb.tensor_id)
        obj_a, obj_b = (repo.objects.tensor(txn, oid) for oid in ids)
        if obj_a.shards != obj_b.shards and not (obj_a.in_c_order and obj_b.in_c_order):
            return _compare(_Loaded(repo, txn, ids[0], obj_a, ea.key), _Loaded(repo, txn, ids[1], obj_b, eb.key),
                            ea, eb)
        return _compare(_Reader(repo, txn, obj_a, ea.key), _Reader(repo, txn, obj_b, eb.key), ea, eb)


def _compare(ra: _Reader, rb: _Reader, ea: Entry, eb: Entry) -> TensorDiff:
    obj_a, obj_b = ra.obj, rb.obj
    itemsize = dtypes.itemsize(ea.dtype)
    aligned = obj_a.chunk_size == obj_b.chunk_size and obj_a.shards == obj_b.shards
    window = math.lcm(obj_a.chunk_size, itemsize)
    sums, elements = _Sums(), 0
    for start in range(0, ea.nbytes, window):
        stop = min(start + window, ea.nbytes)
        raw_a = ra.read(start, stop)
        if aligned and ra.ids(start, stop) == rb.ids(start, stop):
            sums.same(_elements(raw_a, ea.dtype))
            continue
        raw_b = rb.read(start, stop)
        changed = _changed_elements(raw_a, raw_b, itemsize)
        elements += int(changed.sum())
        sums.differ(_elements(raw_a, ea.dtype), _elements(raw_b, eb.dtype), changed)
    return _streamed_diff(ea, eb, obj_a, obj_b, sums, elements)


def _clamp(cosine: float) -> float:
    if cosine != cosine:  # NaN in A or B: min/max would turn it into -1.0
        return cosine
    return min(1.0, max(-1.0, cosine))  # rounding can step just past ±1


def _changed_chunks(obj_a, obj_b) -> list:
    """(index, length) of B's chunks that differ from A's."""
    spans = list(obj_b.chunk_spans())
    if obj_a.chunk_size == obj_b.chunk_size and obj_a.shards == obj_b.shards:
        return [(i, n) for i, (cid, _, n) in enumerate(spans) if cid != obj_a.chunks[i]]
    known = set(obj_a.chunks)  # different boundaries: a chunk "differs" if A has no such chunk
    return [(i, n) for i, (cid, _, n) in enumerate(spans) if cid not in known]


def _streamed_diff(ea, eb, obj_a, obj_b, sums: _Sums, elements: int) -> TensorDiff:
    numel = math.prod(eb.shape)
    if elements == 0:  # equal bytes under different ids (other chunk size): unchanged
        return TensorDiff(eb.key, eb.path, UNCHANGED, ea.dtype, eb.dtype, tuple(ea.shape), tuple(eb.shape),
                          numel, eb.nbytes, len(eb.chunks), 0, 0.0, 0, 0, **UNCHANGED_NUMBERS)
    chunks = _changed_chunks(obj_a, obj_b)
    numbers = {}
    if sums.numeric:
        numbers = dict(sums.norms(), max_abs_diff=sums.max)
    return TensorDiff(eb.key, eb.path, CHANGED, ea.dtype, eb.dtype, tuple(ea.shape), tuple(eb.shape),
                      numel, eb.nbytes, len(eb.chunks), len(chunks), len(chunks) / len(eb.chunks),
                      sum(n for _, n in chunks), elements, **numbers)


# -- plain values and the record ---------------------------------------------

def _value_diffs(side_a: dict, side_b: dict) -> list:
    out = []
    for path in sorted(side_a.keys() | side_b.keys(), key=lambda p: (natural_key(_key(p)), _path_order(p))):
        ea, eb = side_a.get(path), side_b.get(path)
        if ea is None:
            out.append(ValueDiff(eb.key, path, ADDED, None, eb.value))
        elif eb is None:
            out.append(ValueDiff(ea.key, path, REMOVED, ea.value, None))
        elif not _same_value(ea.value, eb.value):
            out.append(ValueDiff(ea.key, path, CHANGED, ea.value, eb.value))
    return out


def _containers(repo, commit_id: str, only: Optional[str]) -> dict:
    """{path: container} for every dict, list and tuple of a commit's tree (``only`` filters by key)."""
    with repo.index.read() as txn:
        root = repo.objects.commit_tree(txn, bytes.fromhex(commit_id)).root
    out, todo = {}, [((), root)]
    while todo:
        path, node = todo.pop()
        if is_container(node):
            if only is None or fnmatch.fnmatchcase(format_path(path), only):
                out[path] = node
            todo.extend((path + (k,), child) for k, child in children(node))
    return out


def _container_diffs(side_a: dict, side_b: dict) -> list:
    """ValueDiffs for containers whose kind changed (a list that became a tuple:
    the same leaves, another structure) and for empty ones added or removed
    (they have no leaves to show them)."""
    out = []
    for path in side_a.keys() | side_b.keys():
        a, b = side_a.get(path), side_b.get(path)
        if a is not None and b is not None:
            if type(a) is not type(b):
                out.append(ValueDiff(format_path(path), path, CHANGED, _shown(a), _shown(b)))
        elif a is None and not b:  # an empty container is its own leaf
            out.append(ValueDiff(format_path(path), path, ADDED, None, b))
        elif b is None and not a:
            out.append(ValueDiff(format_path(path), path, REMOVED, a, None))
    return out


class Shape(str):
    """A container shown by its kind and size when it holds tensors (``<list of 3>``)."""

    def __repr__(self) -> str:
        return str(self)


def _shown(node):
    """A container as a value diff shows it: itself when it holds only plain values."""
    if any(isinstance(leaf, TensorLeaf) for _, leaf in walk(node)):
        return Shape(f"<{type(node).__name__} of {len(node)}>")
    return node


def _same_value(x, y) -> bool:
    # 1 == 1.0 == True in Python; a change of type is a change of value here
    return type(x) is type(y) and (x == y or (x != x and y != y))


def flatten_record(value, prefix: str) -> dict:
    """Nested dicts as {dotted key: leaf}; lists stay whole values."""
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    out = {}
    for k in sorted(value, key=key_order):
        out.update(flatten_record(value[k], f"{prefix}.{k}"))
    return out


def record_changes(a: Commit, b: Commit) -> list:
    """FieldChanges between two commits' records (message, step, epoch, metrics, context)."""
    fields_a = {"message": a.message, "step": a.step, "epoch": a.epoch}
    fields_b = {"message": b.message, "step": b.step, "epoch": b.epoch}
    for name in ("metrics", "context"):
        fields_a.update(_children(flatten_record(getattr(a, name), name)))
        fields_b.update(_children(flatten_record(getattr(b, name), name)))
    names = list(fields_a) + [n for n in fields_b if n not in fields_a]
    return [FieldChange(n, fields_a.get(n), fields_b.get(n)) for n in names
            if n not in fields_a or n not in fields_b or not _same_value(fields_a[n], fields_b[n])]


def _children(flat: dict) -> dict:
    # an empty metrics/context map contributes no field of its own
    return {k: v for k, v in flat.items() if k not in ("metrics", "context")}


def _summary(tensors: list, values: list) -> DiffSummary:
    in_b = [t for t in tensors if t.status != REMOVED]
    elements_total = sum(t.numel for t in in_b)
    counted = all(t.elements_changed is not None for t in in_b)  # not when answered from chunk ids
    elements_changed = sum(t.elements_changed for t in in_b) if counted else None
    removed = sum(t.nbytes for t in tensors if t.status == REMOVED)
    return DiffSummary(
        tensors=len(tensors),
        tensors_changed=sum(t.status != UNCHANGED for t in tensors),
        tensors_added=sum(t.status == ADDED for t in tensors),
        tensors_removed=sum(t.status == REMOVED for t in tensors),
        bytes_total=sum(t.nbytes for t in tensors),
        bytes_changed=sum(t.bytes_changed for t in in_b) + removed,
        bytes_removed=removed,
        elements_total=elements_total,
        elements_changed=elements_changed,
        parameters_changed=(None if elements_changed is None else
                            elements_changed / elements_total if elements_total else 0.0),
        values_changed=len(values),
    )
