"""Merging checkpoints into one: the strategies, the plan, and the streamed merge.

Vocabulary:

- **input**: a commit whose tensors are merged. Inputs keep the order given;
  weights and ``take`` rules name them by position, from 0.
- **base**: the commit that task vectors are taken against
  (``task-arithmetic``, ``ties``, ``dare``); a **delta** is input - base.
- **strategy**: how the inputs' tensors of one key become one tensor. The
  definitions are mergekit's (docs/guide.md, "Merge checkpoints"): ``linear``
  (``average`` is linear with equal weights), ``slerp``,
  ``task-arithmetic``, ``ties``, ``dare``.
- **recipe**: the strategy, its parameters, the weights, the base, an
  ``only`` glob and per-key rules. The merge commit records it, with the
  inputs' full ids, in its context under ``"merge"``.
- **rule**: for keys matching a glob, ``take`` one input's tensor as it is,
  or merge them with another strategy or parameters. The first rule whose
  glob matches a key decides it.
- **slice**: a run of whole chunks of a tensor that an element-wise
  strategy merges at once, so memory holds a few slices, not tensors.

Arithmetic (what makes a merge reproducible bit for bit): float64 tensors
are merged in float64, every other float dtype in float32, and the result
is cast back to the tensor's dtype (round to nearest even). Sums run over
the inputs in their order, a multiply and an add per input (never a fused
multiply-add), so element-wise strategies give the same bits on any machine.
Where every input holds the same value as the base (or, for ``linear``, as
each other), the output is exactly that value, so chunks whose ids are equal
across all inputs are reused without being read. DARE's masks come from
torch.Generator seeded per block of ``MASK_BLOCK`` elements from the recorded
seed, the key and the input (``dare_seed``).

Non-float tensors (step counters, int buffers) and plain values come from
the first input (the report names those that differ: ``not_merged``);
complex, F8_E8M0 and F4 tensors that differ between the inputs are refused
(``UNMERGEABLE``). Where every input holds the same bits (inf and NaN too),
the output holds them; a result that is not finite or does not fit its
dtype where every input is finite is refused (``combine``). Float tensors
of optimizer state (a key with a component named in ``OPTIMIZER_KEYS``) are
refused unless ``only`` leaves them out or a ``take`` rule covers them:
averaging Adam's moments is not a meaningful optimizer state.
"""

import fnmatch
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import torch

from . import audit, commits, dtypes, hashing, history, reader
from .errors import BadInput, BadRecipe, MergeDtypeRefused, MergeMismatch, MergeNotFinite, MergeRefused
from .objects import TensorLeaf, TensorObject, object_id
from .store.chunks import Request, batches
from .store.locks import default_author, this_process
from .traverse import format_path, node_at, walk

STRATEGIES = ("average", "linear", "slerp", "task-arithmetic", "ties", "dare")
WITH_BASE = ("task-arithmetic", "ties", "dare")
ELEMENTWISE = ("average", "linear", "task-arithmetic", "dare")  # ties trims per tensor, slerp's angle is per tensor
# parameters each strategy takes, with mergekit's defaults (None: required)
PARAMS = {
    "average": {"normalize": True},
    "linear": {"normalize": True},
    "slerp": {"t": None, "dot_threshold": 0.9995, "eps": 1e-8},
    "task-arithmetic": {"normalize": False},
    "ties": {"density": 1.0, "normalize": True, "consensus": "sum"},
    "dare": {"density": 1.0, "rescale": True, "normalize": False, "consensus": "none", "seed": 0},
}
CONSENSUS = ("none", "sum", "count")
FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"})
# numbers that no strategy here has arithmetic for (complex values; F8_E8M0 holds
# only powers of two, block scales; F4_E2M1_X2 packs two values a byte): where
# the inputs differ, taking input 0's would drop the others silently, so it is refused
UNMERGEABLE = frozenset({"C32", "C64", "C128", "F8_E8M0", "F4_E2M1_X2"})
OPTIMIZER_KEYS = frozenset({"optimizer", "optimizers", "optimizer_states", "optim"})
SLICE_ELEMENTS = 1 << 20  # 4 MiB per input in float32: memory stays at a few slices
MASK_BLOCK = 1 << 20  # DARE draws each block's mask from a generator of its own
RECORD_VERSION = 1
# ONE_THREAD: the arithmetic runs on one torch thread (restored afterwards).
# A slice's operations are memory-bound and short, and torch's intra-op
# threads must all be scheduled for each one: on a shared 2-core machine a
# 128 MiB average took 29.7 s with 2 threads and 4.0 s with one. Reading and
# hashing keep their own thread pool.


@dataclass(frozen=True)
class Rule:
    """Keys matching ``keys`` (a glob on dotted keys) are taken from input
    ``take``, or merged with ``strategy`` / ``params`` / ``weights``."""

    keys: str
    take: Optional[int] = None
    strategy: Optional[str] = None
    params: dict = field(default_factory=dict)
    weights: Optional[tuple] = None


@dataclass(frozen=True)
class Recipe:
    strategy: str = "average"
    weights: Optional[tuple] = None
    base: Optional[str] = None  # a revision
    params: dict = field(default_factory=dict)
    only: Optional[str] = None
    rules: tuple = ()


@dataclass(frozen=True)
class Spec:
    """One way of merging: a strategy with every parameter filled in."""

    strategy: str
    params: tuple  # sorted (name, value) pairs, so a Spec can key a dict
    weights: tuple

    def get(self, name: str):
        return dict(self.params)[name]


@dataclass(frozen=True)
class MergeReport:
    """What a merge did. ``tensors_reused``: every input (and the base) held
    the same tensor, kept without reading; ``tensors_taken``: from one input
    by a rule or as a non-float tensor; ``chunks_reused``: chunks of merged
    tensors kept without reading, the same in every input; ``not_merged``:
    the keys of non-float tensors (counters, int buffers, bools) that differ
    between the inputs and were taken from input 0 unmerged, sorted."""

    inputs: tuple
    base: Optional[str]
    strategy: str
    tensors_merged: int
    tensors_reused: int
    tensors_taken: int
    values: int
    chunks_reused: int
    bytes_read: int
    bytes_written: int
    bytes_total: int
    tree: str
    not_merged: tuple = ()


class Merged(NamedTuple):
    commit: object  # mvc.records.Commit
    report: MergeReport


# -- recipes ----------------------------------------------------------------

def load_recipe(path) -> dict:
    """A recipe file (``.json``, or ``.toml`` read with tomllib) as a dict; BadRecipe if unreadable."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadRecipe(f"cannot read recipe {path}: {exc.strerror}", field="recipe") from None
    try:
        if path.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python < 3.11
                raise BadRecipe(f"reading {path} needs Python 3.11 or newer (tomllib); write the recipe "
                                "as JSON instead", field="recipe") from None
            return tomllib.loads(raw.decode("utf-8"))
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise BadRecipe(f"recipe {path} is not valid {path.suffix.lstrip('.') or 'json'}: {exc}",
                        field="recipe") from None


def make_recipe(fields: Optional[dict] = None, **options) -> Recipe:
    """A Recipe from a recipe file's fields, with ``options`` (not None) taking precedence."""
    if fields is not None and not isinstance(fields, dict):
        raise BadRecipe("a recipe is a table of fields (strategy, weights, base, params, only, rules)",
                        field="recipe")
    merged = dict(fields or {})
    merged.update({k: v for k, v in options.items() if v is not None})
    known = {"strategy", "weights", "base", "params", "only", "rules"}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise BadRecipe(f"unknown recipe field {unknown[0]!r}; known: {sorted(known)}", field=unknown[0])
    params = merged.get("params") or {}
    if not isinstance(params, dict):
        raise BadRecipe("recipe params must be a table of name = value", field="params")
    rules = merged.get("rules") or ()
    if not isinstance(rules, (list, tuple)):
        raise BadRecipe("recipe rules must be a list of tables", field="rules")
    rules = tuple(_rule(r, i) for i, r in enumerate(rules))
    only = merged.get("only")
    if only is not None and not isinstance(only, str):
        raise BadRecipe("recipe 'only' must be one glob", field="only")
    base = merged.get("base")
    if base is not None and not isinstance(base, str):
        raise BadRecipe("recipe 'base' must be a revision", field="base")
    return Recipe(_strategy(merged.get("strategy", "average"), "strategy"), _weights(merged.get("weights")),
                  base, dict(params), only, rules)


def _rule(value, i: int) -> Rule:
    where = f"rules[{i}]"
    if not isinstance(value, dict) or not isinstance(value.get("keys"), str):
        raise BadRecipe(f"{where} must be a table with a 'keys' glob", field=where)
    unknown = sorted(set(value) - {"keys", "take", "strategy", "params", "weights"})
    if unknown:
        raise BadRecipe(f"{where} has an unknown field {unknown[0]!r}", field=where)
    take = value.get("take")
    if take is not None and (type(take) is not int or take < 0):
        raise BadRecipe(f"{where}.take must be an input's position (0, 1, ...)", field=where)
    if take is not None and len(value) > 2:
        raise BadRecipe(f"{where} takes an input or merges, not both", field=where)
    strategy = _strategy(value["strategy"], where) if "strategy" in value else None
    params = value.get("params") or {}
    if not isinstance(params, dict):
        raise BadRecipe(f"{where}.params must be a table", field=where)
    return Rule(value["keys"], take, strategy, dict(params), _weights(value.get("weights")))


def _strategy(name, where: str) -> str:
    if name not in STRATEGIES:
        raise BadRecipe(f"unknown merge strategy {name!r}; one of {', '.join(STRATEGIES)}", field=where)
    return name


def _weights(value) -> Optional[tuple]:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    try:
        out = tuple(float(w) for w in value)
    except (TypeError, ValueError):
        raise BadRecipe(f"weights must be numbers, not {value!r}", field="weights") from None
    if not out or not all(math.isfinite(w) for w in out):
        raise BadRecipe("weights must be finite numbers", field="weights")
    return out


def _spec(strategy: str, params: dict, weights: Optional[tuple], n: int, where: str) -> Spec:
    """Every parameter of ``strategy`` filled in and checked; BadRecipe names the first problem."""
    allowed = PARAMS[strategy]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BadRecipe(f"{strategy} takes no parameter {unknown[0]!r} ({where}); it takes "
                        f"{', '.join(allowed) or 'none'}", field=unknown[0])
    filled = {k: params.get(k, default) for k, default in allowed.items()}
    missing = [k for k, v in filled.items() if v is None]
    if missing:
        raise BadRecipe(f"{strategy} needs the parameter {missing[0]} ({where}), e.g. {missing[0]}=0.5",
                        field=missing[0])
    for name in ("normalize", "rescale"):
        if name in filled and type(filled[name]) is not bool:
            raise BadRecipe(f"{name} must be true or false ({where})", field=name)
    for name in ("t", "density", "dot_threshold", "eps"):
        if name in filled and (type(filled[name]) not in (int, float) or not math.isfinite(filled[name])):
            raise BadRecipe(f"{name} must be a number ({where})", field=name)
        if name in filled:
            filled[name] = float(filled[name])
    if "density" in filled and not 0 < filled["density"] <= 1:
        raise BadRecipe(f"density must be in (0, 1] ({where})", field="density")
    if "consensus" in filled and filled["consensus"] not in CONSENSUS + (None,):
        raise BadRecipe(f"consensus must be one of {', '.join(CONSENSUS)} ({where})", field="consensus")
    if "seed" in filled and type(filled["seed"]) is not int:
        raise BadRecipe(f"seed must be an integer ({where})", field="seed")
    if strategy == "slerp" and n != 2:
        raise BadRecipe(f"slerp merges exactly two inputs, not {n}", field="strategy")
    if strategy == "average" and weights is not None and len(set(weights)) > 1:
        raise BadRecipe("average takes equal weights; use the linear strategy for others", field="weights")
    weights = weights or (1.0,) * n
    if len(weights) != n:
        raise BadRecipe(f"{len(weights)} weights for {n} inputs ({where})", field="weights")
    if strategy in ("average", "linear") and filled["normalize"] and math.fsum(scaled(weights)) == 0:
        raise BadRecipe("linear weights that sum to 0 cannot be normalized", field="weights")
    return Spec(strategy, tuple(sorted(filled.items())), tuple(weights))


# -- the strategies, on whole tensors or slices (float32/float64, upcast) ----

def work_dtype(name: str):
    return torch.float64 if name == "F64" else torch.float32


class Scratch:
    """Buffers reused slice after slice. Fresh memory costs a page fault per
    page on first touch, and a merge would otherwise allocate several new
    slices for every slice it merges (measured here: a weighted sum of two
    4 MiB slices took 62 ms allocating its results, 17 ms into reused ones)."""

    def __init__(self):
        self.buffers: dict = {}

    def get(self, name: str, n: int, dtype) -> torch.Tensor:
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            buf = self.buffers[name] = torch.empty(n, dtype=dtype)
        return buf[:n]


# The strategies below take the upcast inputs ``xs`` (flat, owned by the
# caller: they are overwritten) and return the merged tensor. Each does the
# same IEEE operations, in the same order, as its out-of-place formula in the
# docstring; doing them in place only saves memory.

def linear(xs: list, spec: Spec, s: Scratch) -> torch.Tensor:
    """mergekit's linear: (x0 w0 + x1 w1 + ...) / (w0 + w1 + ...), not divided
    when ``normalize`` is false. Normalized, the weights are first scaled by
    one power of two (exact: ``scaled``), so weights of any finite size
    (1e-50 or 1e308 each) neither vanish nor overflow in the work dtype and
    weights in the usual range give the same bits as unscaled ones. Where every
    input holds the same value the result is that value (``combine``)."""
    w, n = spec.weights, xs[0].numel()
    if spec.get("normalize"):
        w = scaled(w)
    acc = torch.mul(xs[0], w[0], out=s.get("acc", n, xs[0].dtype))
    for x, wi in zip(xs[1:], w[1:]):
        acc.add_(x.mul_(wi))
    if spec.get("normalize"):
        acc.div_(math.fsum(w))
    return acc


def scaled(weights: tuple) -> tuple:
    """The weights times the one power of two that brings the largest into
    [0.5, 1): the ratios, and so a normalized merge, stay exactly the same."""
    top = max((math.frexp(abs(w))[1] for w in weights if w), default=0)
    return tuple(math.ldexp(w, -top) for w in weights)


def weight_sum(weights) -> float:
    """math.fsum of the weights, +-inf where it would overflow (fsum raises
    OverflowError): products that large overflow too, and ``combine`` refuses them."""
    try:
        return math.fsum(weights)
    except OverflowError:
        return math.copysign(math.inf, math.fsum(scaled(tuple(weights))))


def slerp(a: torch.Tensor, b: torch.Tensor, spec: Spec) -> torch.Tensor:
    """mergekit's slerp from ``a`` (t=0) to ``b`` (t=1) of the flattened
    tensors: a sin((1-t)θ)/sin θ + b sin(tθ)/sin θ, θ the angle between them,
    and the lerp a (1-t) + b t when they are nearly colinear (|cos θ| >
    dot_threshold). Norms and the dot product are float64 sums."""
    t, eps = spec.get("t"), spec.get("eps")
    na = torch.linalg.vector_norm(a, dtype=torch.float64).item()
    nb = torch.linalg.vector_norm(b, dtype=torch.float64).item()
    dot = torch.dot(a.reshape(-1).double(), b.reshape(-1).double()).item()
    dot /= (na if na > eps else 1.0) * (nb if nb > eps else 1.0)
    if math.isfinite(dot):
        dot = min(1.0, max(-1.0, dot))  # rounding can step past 1, outside acos's domain
    # |cos θ| = 1 (sin θ = 0: the spherical weights divide by zero) is a lerp at any dot_threshold
    if abs(dot) > spec.get("dot_threshold") or abs(dot) == 1.0:
        s0, s1 = 1 - t, t
    else:
        theta = math.acos(dot)
        s0 = math.sin(theta - theta * t) / math.sin(theta)
        s1 = math.sin(theta * t) / math.sin(theta)
    return a.mul_(s0).add_(b.mul_(s1))


def trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """TIES' trim: keep the int(density * n) deltas largest in magnitude (ties
    broken by position, first kept), zero the rest."""
    if density >= 1:
        return delta
    k = int(density * delta.numel())
    keep = torch.zeros(delta.numel(), dtype=delta.dtype)
    if k > 0:
        order = torch.sort(delta.abs().reshape(-1), descending=True, stable=True).indices[:k]
        keep[order] = 1
    return delta.mul_(keep.reshape(delta.shape))


def dare_seed(seed: int, key: str, i: int, block: int) -> int:
    """The torch.Generator seed of DARE's mask for elements [block * MASK_BLOCK,
    (block + 1) * MASK_BLOCK) of input ``i``'s delta at ``key``."""
    return int.from_bytes(hashing.digest(f"mvc-dare {seed} {key} {i} {block}".encode())[:8], "little") >> 1


def dare_keep(seed: int, key: str, i: int, start: int, stop: int, numel: int, density: float) -> torch.Tensor:
    """DARE's mask (1.0 kept, 0.0 dropped) for elements [start, stop) of a
    tensor of ``numel`` elements: a float32 uniform draw below ``density`` is kept."""
    parts = []
    for block in range(start // MASK_BLOCK, -(-stop // MASK_BLOCK)):
        lo, hi = block * MASK_BLOCK, min((block + 1) * MASK_BLOCK, numel)
        g = torch.Generator().manual_seed(dare_seed(seed, key, i, block))
        u = torch.rand(hi - lo, generator=g, dtype=torch.float32)
        parts.append(u[max(start, lo) - lo:min(stop, hi) - lo])
    return (torch.cat(parts) < density).to(torch.float32)


def _masks(spec: Spec, key: str, start: int, stop: int, numel: int) -> Optional[Callable]:
    """keep(i): input i's DARE mask for elements [start, stop) of ``key``; None for other strategies."""
    if spec.strategy != "dare":
        return None
    return lambda i: dare_keep(spec.get("seed"), key, i, start, stop, numel, spec.get("density"))


def task_vectors(xs: list, base: torch.Tensor, spec: Spec, s: Scratch, keep: Optional[Callable] = None):
    """mergekit's generalized task arithmetic. Deltas d_i = x_i - base,
    sparsified (ties: ``trim``; dare: d_i * mask_i, then / density when
    ``rescale``), weighted (wd_i = d_i * w_i) and mixed:

    - no consensus: mixed = wd_0 + wd_1 + ..., divisor = sum of the weights
      (1 when its magnitude is under 1e-8);
    - consensus ``sum`` (``count``): the majority sign is +1 where wd_0 + wd_1
      + ... (sign(wd_0) + sign(wd_1) + ...) >= 0, else -1; a_i = 1.0 where
      sign(wd_i) is the majority sign, else 0.0; mixed = wd_0 a_0 + wd_1 a_1
      + ..., divisor = a_0 w_0 + a_1 w_1 + ... (1 where 0).

    mixed / divisor when ``normalize``; the result is base + mixed, and
    exactly the base where mixed is zero.
    """
    w, n, density = spec.weights, base.numel(), dict(spec.params).get("density", 1.0)
    for i, x in enumerate(xs):
        x.sub_(base)
        if spec.strategy == "ties":
            trim(x, density)
        elif spec.strategy == "dare" and density < 1:
            x.mul_(keep(i))
            if spec.get("rescale"):
                x.div_(density)
        x.mul_(w[i])
    consensus = dict(spec.params).get("consensus", "none")
    flags = s.get("flags", n, torch.bool)
    if consensus in ("sum", "count"):
        votes, tmp = s.get("votes", n, base.dtype), s.get("tmp", n, base.dtype)
        if consensus == "sum":
            votes.copy_(xs[0])
            for x in xs[1:]:
                votes.add_(x)
        else:
            torch.sign(xs[0], out=votes)
            for x in xs[1:]:
                votes.add_(torch.sign(x, out=tmp))
        torch.ge(votes, 0, out=flags)
        majority = votes.fill_(-1.0).masked_fill_(flags, 1.0)
        mixed, divisor = s.get("mixed", n, base.dtype), s.get("divisor", n, base.dtype)
        for i, x in enumerate(xs):
            agree = tmp.copy_(torch.eq(torch.sign(x, out=tmp), majority, out=flags))
            x.mul_(agree)
            agree.mul_(w[i])
            if i == 0:
                mixed.copy_(x)
                divisor.copy_(agree)
            else:
                mixed.add_(x)
                divisor.add_(agree)
        divisor.masked_fill_(torch.eq(divisor, 0, out=flags), 1.0)
    else:
        mixed = xs[0]
        for x in xs[1:]:
            mixed.add_(x)
        divisor = weight_sum(w)
        divisor = 1.0 if abs(divisor) < 1e-8 else divisor
    if spec.get("normalize"):
        mixed.div_(divisor)
    zero = torch.eq(mixed, 0, out=flags)
    mixed.add_(base)
    return torch.where(zero, base, mixed, out=mixed)


def apply(spec: Spec, xs: list, base: Optional[torch.Tensor], s: Scratch, keep: Optional[Callable] = None):
    """The merged tensor (in the work dtype) of upcast, flat inputs ``xs`` (overwritten)."""
    if spec.strategy in ("average", "linear"):
        return linear(xs, spec, s)
    if spec.strategy == "slerp":
        if torch.equal(xs[0].view(_bits(xs[0])), xs[1].view(_bits(xs[1]))):
            return xs[0]  # the same bits: exactly them (slerp of a vector with itself)
        return slerp(xs[0], xs[1], spec)
    return task_vectors(xs, base, spec, s, keep)


def combine(spec: Spec, xs: list, base: Optional[torch.Tensor], bits: list, dtype: str, s: Scratch,
            keep: Optional[Callable] = None, key: str = "", start: int = 0) -> torch.Tensor:
    """``apply`` as a merge commits it: the merged tensor in the storage
    ``dtype``. ``bits``: the inputs' (then the base's) stored elements viewed
    as integers of their size. Where every input (and for task vectors the
    base) holds the same bits, the output holds exactly them (inf, and a NaN
    with its payload, too: ``_agreement``). Anywhere else, a result that is
    not finite or does not fit ``dtype`` where every input is finite raises
    MergeNotFinite: nothing is committed with values the arithmetic made up
    (``start``: the first element's index, for its message).

    The agreed bits are read after ``apply``: it never writes input 0
    (``linear``) or the base (task vectors), whose bits are kept."""
    inputs = xs + ([base] if base is not None and spec.strategy in WITH_BASE else [])
    finite = None if all(_within(x, math.inf) for x in inputs) else _all_finite(inputs, s)
    agree = None
    if spec.strategy in ("average", "linear") or finite is not None:  # task vectors keep finite agreed values
        agree = _agreement(spec, bits, s)
        if agree is not None and not bool(agree.any()):
            agree = None
    merged = apply(spec, xs, base, s, keep)
    if not _within(merged, fits(dtype)):
        _check_range(merged, finite, agree, dtype, key, start, s)
    out = merged.to(dtypes.torch_dtype(dtype))
    if agree is not None:
        kept = bits[-1] if spec.strategy in WITH_BASE else bits[0]
        view = out.view(kept.dtype)
        torch.where(agree, kept, view, out=view)
    return out


def _within(x: torch.Tensor, limit: float) -> bool:
    """Every value of ``x`` lies strictly within +-limit (NaN does not): one pass, nothing allocated."""
    if x.numel() == 0:
        return True
    low, high = torch.aminmax(x)
    return bool(high < limit) and bool(low > -limit)


def _agreement(spec: Spec, bits: list, s: Scratch) -> Optional[torch.Tensor]:
    """Where every input (and the base, last in ``bits``, for task vectors)
    holds the same bits; None for strategies that do not keep agreed values
    (slerp's weights need not sum to 1; linear unnormalized is a plain sum)."""
    if spec.strategy == "slerp" or spec.strategy in ("average", "linear") and not spec.get("normalize"):
        return None
    if len(bits) < 2:
        return None
    n = bits[0].numel()
    same = torch.eq(bits[1], bits[0], out=s.get("agree", n, torch.bool))
    for b in bits[2:]:
        same.logical_and_(torch.eq(b, bits[0], out=s.get("agree-tmp", n, torch.bool)))
    return same


def _all_finite(xs: list, s: Scratch) -> torch.Tensor:
    finite = s.get("finite", xs[0].numel(), torch.bool).copy_(torch.isfinite(xs[0]))
    for x in xs[1:]:
        finite.logical_and_(torch.isfinite(x))
    return finite


def fits(dtype: str) -> float:
    """The smallest magnitude that does not round to a finite value of
    ``dtype`` (its largest value plus half an ulp there; inf for the work
    dtypes themselves)."""
    if dtype in ("F32", "F64"):
        return math.inf
    info = torch.finfo(dtypes.torch_dtype(dtype))
    ulp = math.ldexp(info.eps, math.frexp(info.max)[1] - 1)
    return info.max + ulp / 2


def _check_range(merged: torch.Tensor, finite: Optional[torch.Tensor], agree: Optional[torch.Tensor], dtype: str,
                 key: str, start: int, s: Scratch) -> None:
    """MergeNotFinite if ``merged`` holds a value out of ``dtype``'s range
    where every input is finite (``finite``; None: everywhere) and the inputs
    do not agree (``agree``: their bits are kept there)."""
    limit = fits(dtype)
    bad = torch.isfinite(merged) if limit == math.inf else torch.lt(merged.abs(), limit)
    bad.logical_not_()
    if finite is not None:
        bad.logical_and_(finite)
    if agree is not None:
        bad.masked_fill_(agree, False)
    count = int(bad.sum())
    if count:
        first = int(bad.nonzero()[0, 0])
        raise MergeNotFinite(f"merging {key} gives {count} values that are not finite or do not fit {dtype} where "
                             f"every input is finite (the first at element {start + first}: "
                             f"{merged[first].item()!r}); the weights or parameters take the result out of range; "
                             "nothing was merged", key=key, dtype=dtype, count=count, element=start + first)


def _bits(t: torch.Tensor):
    return torch.int64 if t.dtype == torch.float64 else torch.int32


def _int_of(itemsize: int):
    """The integer dtype whose elements are ``itemsize`` bytes: a tensor's stored bits."""
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]


# -- planning: every check before any work ------------------------------------

@dataclass
class _Input:
    rev: str
    id: bytes
    root: object
    leaves: dict  # {path: leaf}
    objs: dict  # {path: TensorObject} for tensor leaves
    dict_metadata: tuple = ()  # the tree's torch _metadata of its dicts (TreeObject)


def _read_input(repo, txn, rev: str, only: Optional[str]) -> _Input:
    from .traverse import select  # the same glob rules as load(only=) and diff --only
    oid = repo.refs.resolve(txn, rev)
    tree = repo.objects.commit_tree(txn, oid)
    root = tree.root if only is None else select(tree.root, only)
    leaves = dict(walk(root))
    objs = {p: repo.objects.tensor(txn, leaf.id) for p, leaf in leaves.items() if isinstance(leaf, TensorLeaf)}
    return _Input(rev, oid, root, leaves, objs, tree.dict_metadata)


def _check_compatible(inputs: list, base: Optional[_Input]) -> None:
    """MergeMismatch naming every key whose presence, kind, dtype or shape differs."""
    everyone = inputs + ([base] if base else [])
    first, problems = inputs[0], {}
    for n, other in enumerate(everyone[1:], 1):
        who = f"input {n}" if n < len(inputs) else "the base"
        for path in first.leaves.keys() - other.leaves.keys():
            problems.setdefault(format_path(path), f"missing from {who} ({other.rev})")
        for path in other.leaves.keys() - first.leaves.keys():
            if other is not base:  # the base may hold more than the inputs
                problems.setdefault(format_path(path), f"in {who} ({other.rev}) but not in input 0")
        for path, obj in first.objs.items():
            theirs = other.objs.get(path)
            if path not in other.leaves:
                continue
            if theirs is None:
                problems.setdefault(format_path(path), f"a tensor in input 0 but a value in {who}")
            elif (theirs.dtype, theirs.shape) != (obj.dtype, obj.shape):
                problems.setdefault(format_path(path), f"{obj.dtype} {list(obj.shape)} in input 0, "
                                                       f"{theirs.dtype} {list(theirs.shape)} in {who}")
        for path in other.objs.keys() & first.leaves.keys() - first.objs.keys():
            problems.setdefault(format_path(path), f"a value in input 0 but a tensor in {who}")
    if problems:
        keys = sorted(problems)
        shown = "; ".join(f"{k}: {problems[k]}" for k in keys[:5])
        shown += f"; and {len(keys) - 5} more" if len(keys) > 5 else ""
        raise MergeMismatch(f"the checkpoints do not match, nothing was merged: {shown}", keys=keys,
                            problems=problems, inputs=[x.id.hex() for x in everyone])


@dataclass
class _Plan:
    """For each tensor path of input 0: ("take", input index) or ("merge", Spec);
    ``not_merged``: the keys of non-float tensors that differ between the
    inputs, taken from input 0."""

    actions: dict
    not_merged: tuple = ()


def _every_rule_matches(rules: tuple, keys: list) -> None:
    """BadRecipe naming the first rule whose glob matches none of ``keys``: a misspelt rule
    would otherwise leave its tensors to the default strategy without a word (as ``only``
    that matches nothing is refused)."""
    for i, rule in enumerate(rules):
        if not any(fnmatch.fnmatchcase(key, rule.keys) for key in keys):
            raise BadRecipe(f"rules[{i}] (keys {rule.keys!r}) matches no tensor of the inputs", field=f"rules[{i}]")


def _plan(recipe: Recipe, inputs: list, base: Optional[_Input]) -> _Plan:
    n = len(inputs)
    default = _spec(recipe.strategy, recipe.params, recipe.weights, n, "recipe")
    specs = {}
    for i, rule in enumerate(recipe.rules):
        if rule.take is not None:
            if rule.take >= n:
                raise BadRecipe(f"rules[{i}] takes input {rule.take}, but there are {n} inputs", field=f"rules[{i}]")
            continue
        strategy = rule.strategy or recipe.strategy
        params = rule.params if rule.strategy else {**recipe.params, **rule.params}
        specs[i] = _spec(strategy, params, rule.weights or recipe.weights, n, f"rules[{i}]")
    _every_rule_matches(recipe.rules, [format_path(path) for path in inputs[0].objs])
    actions, refused, unmergeable, not_merged = {}, [], {}, []
    for path, obj in inputs[0].objs.items():
        key = format_path(path)
        rule = next((i for i, r in enumerate(recipe.rules) if fnmatch.fnmatchcase(key, r.keys)), None)
        if rule is not None and recipe.rules[rule].take is not None:
            actions[path] = ("take", recipe.rules[rule].take)
        elif obj.dtype not in FLOAT_DTYPES:
            if len({x.leaves[path].id for x in inputs}) > 1:
                if obj.dtype in UNMERGEABLE:
                    unmergeable[key] = obj.dtype
                else:
                    not_merged.append(key)
            actions[path] = ("take", 0)
        elif OPTIMIZER_KEYS & {str(k) for k in path}:
            refused.append(key)
        else:
            actions[path] = ("merge", specs.get(rule, default))
    if refused:
        raise MergeRefused(f"{len(refused)} float tensors are optimizer state ({refused[0]} ...), which "
                           "averaging would not make a valid optimizer state; nothing was merged", keys=refused)
    if unmergeable:
        keys = sorted(unmergeable)
        shown = ", ".join(f"{k} ({unmergeable[k]})" for k in keys[:5]) + (" ..." if len(keys) > 5 else "")
        raise MergeDtypeRefused(f"{len(keys)} tensors differ between the inputs but have a dtype no merge strategy "
                                f"has arithmetic for: {shown}; nothing was merged", keys=keys,
                                dtypes=[unmergeable[k] for k in keys])
    if base is None and any(a[0] == "merge" and a[1].strategy in WITH_BASE for a in actions.values()):
        raise BadRecipe("task-arithmetic, ties and dare need a base (the commit the inputs were "
                        "fine-tuned from)", field="base")
    return _Plan(actions, tuple(sorted(not_merged)))


# -- the streamed merge ----------------------------------------------------------

class _Merger:
    """Merges one tensor at a time, writing the output's new chunks to one batch."""

    def __init__(self, repo, txn, inputs: list, base: Optional[_Input], batch, progress):
        self.repo, self.txn, self.inputs, self.base, self.batch = repo, txn, inputs, base, batch
        self.size = repo.chunk_size
        self.progress, self.done, self.total = progress, 0, 0
        self.counts = dict(merged=0, reused=0, taken=0, chunks_reused=0, read=0, written=0)
        self.tensors: dict = {}  # {tensor id: encoded TensorObject} made here
        self.scratch = Scratch()

    def tensor(self, path: tuple, spec: Spec) -> bytes:
        """The id of the merged tensor at ``path``."""
        sources = [x.objs[path] for x in self.inputs]
        base = self.base.objs[path] if spec.strategy in WITH_BASE else None
        ids = [x.leaves[path].id for x in self.inputs]
        same = ([self.base.leaves[path].id] if base is not None else []) + ids
        obj = sources[0]
        if obj.numel == 0 or len(set(same)) == 1 and (spec.strategy not in ("average", "linear")
                                                      or spec.get("normalize")):
            self.counts["reused"] += 1
            self._advance(obj.nbytes)
            return same[0]
        self.counts["merged"] += 1
        key = format_path(path)
        if spec.strategy in ELEMENTWISE and self._sliceable(sources + ([base] if base else [])):
            chunks = self._sliced(key, spec, sources, base)
        else:
            chunks = self._whole(path, key, spec, sources, base)
        data = TensorObject(obj.dtype, obj.shape, self.size, tuple(chunks)).encode()
        oid = object_id(data)
        self.tensors[oid] = data
        return oid

    def _sliceable(self, objs: list) -> bool:
        item = dtypes.itemsize(objs[0].dtype)
        return self.size % item == 0 and all(not o.shards and o.chunk_size == self.size for o in objs)

    def _sliced(self, key: str, spec: Spec, sources: list, base) -> list:
        """Element-wise merge, a slice of whole chunks at a time; chunks equal
        in every input (and the base) are reused without reading."""
        obj, item = sources[0], dtypes.itemsize(sources[0].dtype)
        per_chunk = self.size // item
        step = max(1, SLICE_ELEMENTS // per_chunk)
        n_chunks = len(obj.chunks)
        objs = ([base] if base is not None else []) + sources
        reusable = spec.strategy not in ("average", "linear") or spec.get("normalize")
        out = []
        for c0 in range(0, n_chunks, step):
            c1 = min(n_chunks, c0 + step)
            equal = [reusable and len({o.chunks[j] for o in objs}) == 1 for j in range(c0, c1)]
            if all(equal):
                out += [objs[0].chunks[j] for j in range(c0, c1)]
                self.counts["chunks_reused"] += c1 - c0
                self._advance(min(c1 * self.size, obj.nbytes) - c0 * self.size)
                continue
            lo, hi = c0 * self.size, min(c1 * self.size, obj.nbytes)
            wanted = [j for j in range(c0, c1) if not equal[j - c0]]
            xs, bits = [], []
            for i, o in enumerate(sources):
                self._read_slice(o, lo, hi, wanted, f"{key!r} of input {i}", f"x{i}", xs, bits)
            b = None
            if base is not None:
                b = self._read_slice(base, lo, hi, wanted, f"{key!r} of the base", "base", [], bits)
            keep = _masks(spec, key, lo // item, hi // item, obj.numel)
            merged = combine(spec, xs, b, bits, obj.dtype, self.scratch, keep, key, lo // item)
            out += self._write(merged, lo, [(j, objs[0].chunks[j] if equal[j - c0] else None)
                                            for j in range(c0, c1)])
        return out

    def _read_slice(self, obj: TensorObject, lo: int, hi: int, wanted: list, what: str, name: str,
                    upcast: list, bits: list):
        """Bytes [lo, hi) of a whole tensor, in buffers reused slice after
        slice: appends them upcast to ``upcast`` and as integers to ``bits``,
        and returns the upcast. Only chunks ``wanted`` are read; the others
        are zeros (their output is reused, not computed, and zeros can
        neither overflow nor fail the range check)."""
        raw = self.scratch.get("raw-" + name, hi - lo, torch.uint8)
        buffer = raw.numpy()
        requests = []
        wanted_set = set(wanted)
        for j in range(lo // self.size, -(-hi // self.size)):
            start = j * self.size
            n = min(self.size, obj.nbytes - start)
            if j not in wanted_set:
                buffer[start - lo:start - lo + n] = 0
                continue
            requests.append(Request(obj.chunks[j], buffer[start - lo:start - lo + n], f"tensor {what}"))
        if requests:
            reader.read_runs(self.repo, self.txn, requests)
        self.counts["read"] += sum(r.buffer.nbytes for r in requests)
        flat = raw.view(dtypes.torch_dtype(obj.dtype))
        bits.append(raw.view(_int_of(dtypes.itemsize(obj.dtype))))
        work = work_dtype(obj.dtype)
        up = flat if flat.dtype == work else self.scratch.get("up-" + name, flat.numel(), work).copy_(flat)
        upcast.append(up)
        return up

    def _whole(self, path: tuple, key: str, spec: Spec, sources: list, base) -> list:
        """Merge of whole tensors (slerp, ties, and tensors not chunked as this repository chunks)."""
        bits = []

        def read(x: _Input, what: str) -> torch.Tensor:
            leaf = x.leaves[path]
            t = reader.read_tensors(self.repo, self.txn, [(path, leaf)], x.id)[leaf.id].reshape(-1)
            self.counts["read"] += x.objs[path].nbytes
            bits.append(t.view(_int_of(dtypes.itemsize(x.objs[path].dtype))))
            return t.to(work_dtype(x.objs[path].dtype), copy=True)
        xs = [read(x, f"input {i}") for i, x in enumerate(self.inputs)]
        b = read(self.base, "the base") if base is not None else None
        obj = sources[0]
        merged = combine(spec, xs, b, bits, obj.dtype, Scratch(), _masks(spec, key, 0, obj.numel, obj.numel), key)
        del xs, b, bits
        n_chunks = -(-obj.nbytes // self.size)
        return self._write(merged, 0, [(j, None) for j in range(n_chunks)])

    def _write(self, merged: torch.Tensor, lo: int, chunks: list) -> list:
        """The chunk ids of ``merged`` (in its storage dtype) starting at byte
        ``lo`` of the tensor; (j, id) pairs with an id are reused as they are."""
        from .state import tensor_bytes
        data = tensor_bytes(merged)
        out = []
        for j, reused in chunks:
            if reused is not None:
                out.append(reused)
                self.counts["chunks_reused"] += 1
                continue
            start = j * self.size - lo
            piece = data[start:start + self.size]
            cid = hashing.digest(piece)
            if not self.repo.chunks.keeps(cid, self.txn) and self.batch.add(cid, piece):
                self.counts["written"] += len(piece)
            out.append(cid)
        self._advance(len(data))
        return out

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress:
            self.progress(self.done, self.total)


def _inputs_of(repo, revs) -> list:
    """Revisions as given; a range ``A..B`` stands for its commits, oldest first."""
    from . import refs
    out = []
    for rev in revs:
        span = refs.split_range(rev)
        if span:
            found = history.walk(repo, [span[1]], [span[0]])
            if not found:
                raise BadInput(f"range {rev} holds no commits")
            out += [c.id for c in reversed(found)]
        else:
            out.append(rev)
    return out


def _hold_here(repo, root, new_tensors: dict) -> None:
    """In a lazy clone, read (and so keep here) the chunks the merge commit takes unread from its
    inputs that only the remote holds: until the merge is pushed, it must not depend on the remote
    keeping its inputs' data (a remote gc with retention may prune them)."""
    with repo.index.read() as txn:
        sizes = {}
        for _, leaf in walk(root):
            if isinstance(leaf, TensorLeaf):
                obj = TensorObject.decode(new_tensors[leaf.id]) if leaf.id in new_tensors \
                    else repo.objects.tensor(txn, leaf.id)
                sizes.update((cid, n) for cid, _, n in obj.chunk_spans())
        away = sorted(repo.chunks.remote_only(sizes, txn))
        for piece in batches(away, sizes.__getitem__, 64 << 20):
            repo.chunks.read([Request(cid, bytearray(sizes[cid]), "a chunk the merge takes from an input")
                              for cid in piece], txn)


def merge(repo, revs, recipe=None, *, strategy: Optional[str] = None, weights=None, base: Optional[str] = None,
          params: Optional[dict] = None, only: Optional[str] = None, rules=None, branch: Optional[str] = None,
          message: Optional[str] = None, author: Optional[str] = None,
          progress: Optional[Callable[[int, int], None]] = None, sign=None) -> Merged:
    """Merge the checkpoints at ``revs`` (revisions or ``A..B`` ranges) into one
    merge commit on ``branch`` (default HEAD's). Its parents are the branch's
    tip (if any), then the inputs that it and the other inputs do not already
    reach (``_joined``); its context's ``"merge"`` holds the recipe with every input.

    ``recipe``: a dict of recipe fields (as in a recipe file), or a path to a JSON/TOML
    recipe file; the keyword options (when not None) take precedence over it.
    Raises, before any chunk is read or written: BadRecipe (strategy,
    parameters, weights, rules), MergeMismatch (keys, dtypes or shapes differ),
    MergeRefused (optimizer state), UnknownRevision, ProtectedRef / LockHeld,
    SigningKeyError / SignatureRequired (as ``commit``'s ``sign``: a SigningKey, a key
    file path, or True for setting ``signing.key``).
    ChecksumMismatch if a chunk read is corrupt (nothing is committed then).
    """
    signer = audit.signer(repo, sign)
    if isinstance(recipe, (str, Path)):
        recipe = load_recipe(recipe)
    recipe = make_recipe(recipe, strategy=strategy, weights=weights, base=base, params=params, only=only,
                         rules=rules)
    revs = list(revs) if not isinstance(revs, str) else [revs]
    if not revs:
        raise BadRecipe("give the commits to merge", field="inputs")
    revs = _inputs_of(repo, revs)
    me = this_process(author or default_author())
    record_author = author or default_author()
    with repo.gc_lock.shared():
        with repo.index.read() as txn:
            ref = commits.target_ref(repo, txn, branch)
            tip = repo.refs.tip(txn, ref)
            repo.refs.check_commit(txn, ref, me)
            audit.check_commit_policy(txn, ref, signer)  # before any chunk is read
            if signer is not None:  # FORMAT names the extension before a signed commit exists
                from .ondisk import SIGNATURES, require_extension
                require_extension(repo.dir, SIGNATURES)
            inputs = [_read_input(repo, txn, rev, recipe.only) for rev in revs]
            base_in = _read_input(repo, txn, recipe.base, recipe.only) if recipe.base is not None else None
            if not inputs[0].leaves:
                raise BadRecipe(f"only={recipe.only!r} matches no key of {revs[0]}", field="only")
            _check_compatible(inputs, base_in)
            plan = _plan(recipe, inputs, base_in)
            batch = repo.chunks.writer()
            threads = torch.get_num_threads()
            try:
                torch.set_num_threads(1)  # see ONE_THREAD
                merger = _Merger(repo, txn, inputs, base_in, batch, progress)
                merger.total = sum(inputs[0].objs[p].nbytes for p, a in plan.actions.items() if a[0] == "merge")
                root = _merged_root(merger, plan, inputs, base_in)
                batch.seal()
            except BaseException:
                batch.abort()
                raise
            finally:
                torch.set_num_threads(threads)
        # input 0's structure, so its dicts' module metadata too
        metadata = tuple((p, m) for p, m in inputs[0].dict_metadata if type(node_at(root, p)) is dict)
        tree_data = commits.encode_tree(repo, root, metadata)
        _hold_here(repo, root, merger.tensors)
        record = _record(recipe, plan, inputs, base_in, revs, message, record_author)
        with repo.index.read() as txn:
            joined = _joined(repo, txn, tip, [x.id for x in inputs])
        with repo.index.write() as wtxn:
            oid, obj = commits.land(repo, wtxn, ref, tip, False, me, record, batch.publish, merger.tensors, tree_data,
                                   merged=joined, signer=signer)
    from .refs import short_name
    commit = replace(commits.to_commit(oid, obj), branch=short_name(ref) if ref else None)
    c = merger.counts
    report = MergeReport(tuple(x.id.hex() for x in inputs), base_in.id.hex() if base_in else None, recipe.strategy,
                         c["merged"], c["reused"], c["taken"], sum(1 for _, leaf in walk(root)
                                                                   if not isinstance(leaf, TensorLeaf)),
                         c["chunks_reused"], c["read"], c["written"], merger.total, obj.tree.hex(), plan.not_merged)
    return Merged(commit, report)


def _joined(repo, txn, tip: Optional[bytes], ids: list) -> tuple:
    """The inputs that become parents after the branch's tip: as Git joins
    heads, an input the tip or another input already reaches adds no edge
    (``average main~4..main`` on main is a one-parent commit; the record still
    names every input)."""
    from .history import _ancestry
    heads = list(dict.fromkeys(([tip] if tip else []) + ids))
    below = _ancestry(repo, txn, [p for h in heads for p in repo.objects.commit(txn, h).parents])
    return tuple(h for h in heads if h not in below and h != tip)


def _merged_root(merger: _Merger, plan: _Plan, inputs: list, base: Optional[_Input]):
    """Input 0's tree with each tensor leaf replaced by its merged tensor.
    Leaves tied in input 0 (one storage group) whose inputs are the same
    tensors are merged once and stay tied; a group whose members' merges
    differ (tied in input 0 only) is untied."""
    done: dict = {}
    out: dict = {}
    for path, (kind, how) in plan.actions.items():
        leaf = inputs[0].leaves[path]
        sources = tuple(x.leaves[path].id for x in inputs) + ((base.leaves[path].id,) if base else ())
        memo = (leaf.group, kind, how, sources) if leaf.group is not None else None
        if memo is not None and memo in done:
            out[path] = done[memo]
            continue
        if kind == "take":
            oid = inputs[how].leaves[path].id
            merger.counts["taken"] += 1
        else:
            oid = merger.tensor(path, how)
        if memo is not None:
            done[memo] = oid
        out[path] = oid
    members: dict = {}
    for path, oid in out.items():
        group = inputs[0].leaves[path].group
        if group is not None:
            members.setdefault(group, set()).add(oid)
    return _replace_leaves(inputs[0].root, {
        path: TensorLeaf(oid, group if group is not None and len(members[group]) == 1 else None)
        for path, oid in out.items() for group in (inputs[0].leaves[path].group,)})


def _replace_leaves(node, by_path: dict, path: tuple = ()):
    if isinstance(node, TensorLeaf):
        return by_path[path]
    if type(node) is dict:
        return {k: _replace_leaves(v, by_path, path + (k,)) for k, v in node.items()}
    if type(node) in (list, tuple):
        items = [_replace_leaves(v, by_path, path + (i,)) for i, v in enumerate(node)]
        return tuple(items) if type(node) is tuple else items
    return node


def _record(recipe: Recipe, plan: _Plan, inputs: list, base: Optional[_Input], revs: list,
            message: Optional[str], author: str):
    """The merge commit's record: the recipe, every parameter filled in, in its context."""
    default = _spec(recipe.strategy, recipe.params, recipe.weights, len(inputs), "recipe")
    rules = []
    for r in recipe.rules:
        entry = {"keys": r.keys}
        if r.take is not None:
            entry["take"] = r.take
        else:
            spec = _spec(r.strategy or recipe.strategy,
                         r.params if r.strategy else {**recipe.params, **r.params},
                         r.weights or recipe.weights, len(inputs), "rule")
            entry.update(strategy=spec.strategy, params=dict(spec.params), weights=list(spec.weights))
        rules.append(entry)
    merge_record = {
        "version": RECORD_VERSION, "strategy": recipe.strategy, "params": dict(default.params),
        "weights": list(default.weights), "inputs": [x.id.hex() for x in inputs], "revs": list(revs),
        "base": base.id.hex() if base else None, "only": recipe.only, "rules": rules,
        "arithmetic": "float32 (float64 for F64 tensors), cast back to each tensor's dtype",
    }
    if message is None:
        message = f"Merge {len(inputs)} checkpoints ({recipe.strategy})"
    return commits.record(message, None, None, None, {"merge": merge_record}, author)


__all__ = ["merge", "Merged", "MergeReport", "Recipe", "Rule", "load_recipe", "make_recipe", "dare_seed",
           "dare_keep", "STRATEGIES"]
