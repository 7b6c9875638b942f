"""History beyond one first-parent line: ranges, every ref at once, commits left behind.

Vocabulary:

- **ancestry** of a commit: the commit and every commit reachable through
  any of its parents.
- a **walk** lists the ancestry of some ``include`` revisions minus the
  ancestry of some ``exclude`` ones (``A..B`` is include B, exclude A),
  newest first and every commit before its parents (Git's
  ``--topo-order``), so a graph can be drawn from it top to bottom.
- a commit is **left behind** when no branch or tag reaches it: once HEAD
  moves off it, only the reflog remembers it (and gc keeps it only while
  the reflog does).
- a **condition** (``eval_loss<2.3``) keeps the commits whose training record
  holds that metric (or ``step``/``epoch``) with a value that passes; a
  **sort key** (``eval_loss``, or ``-accuracy`` for highest first) orders
  commits by one metric: "which checkpoint was best".
"""

import heapq
import math
import operator
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from . import reach, refs
from .errors import BadInput, MetricNotRecorded
from .hashing import digest
from .commits import to_commit


def _ancestry(repo, txn, starts: Iterable[bytes], stop=frozenset()) -> dict:
    """{id: commit object} of the ancestry of ``starts``, not going into ``stop``."""
    return reach.ancestry(lambda oid: repo.objects.commit(txn, oid), starts, stop=stop)


def _ref_tips(repo, txn, remotes: bool = False) -> list:
    kinds = (refs.BRANCHES, refs.TAGS) + ((refs.REMOTES,) if remotes else ())
    tips = [oid for prefix in kinds for _, oid, _ in repo.refs.listed(txn, prefix)]
    head = repo.refs.head(txn)[1]
    return tips + ([head] if head else [])


def decorations(repo) -> dict:
    """{commit id: [(kind, name)]} of every ref that names a commit, as ``git log``
    decorates it: kind "HEAD" (a detached HEAD, first), "current" (HEAD's branch),
    "branch", "tag" and "remote" (a remote-tracking branch such as origin/main)."""
    with repo.index.read() as txn:
        head_branch, head_id = repo.refs.head(txn)
        out: dict = {}
        if head_branch is None and head_id:
            out[head_id.hex()] = [("HEAD", "HEAD")]
        for prefix, kind in ((refs.BRANCHES, "branch"), (refs.TAGS, "tag"), (refs.REMOTES, "remote")):
            for name, oid, _ in repo.refs.listed(txn, prefix):
                current = kind == "branch" and prefix + name == head_branch
                out.setdefault(oid.hex(), []).append(("current" if current else kind, name))
    return out


def walk(repo, include: Iterable[str] = (), exclude: Iterable[str] = (), all_refs: bool = False,
         n: Optional[int] = None, known: Iterable[str] = ()) -> list:
    """Commits (``mvc.records.Commit``) in the ancestry of ``include`` (and of
    every branch, tag, remote-tracking branch and HEAD with ``all_refs``, as
    ``git log --all``) but not of ``exclude``, in
    topological order, newest first; at most ``n``.

    ``known``: ids of commits the caller already holds with their whole
    ancestry (an earlier walk); they are left out like ``exclude``, without
    walking their ancestry again, so a history that grew costs what is new.

    Raises UnknownRevision / AmbiguousRevision for bad revisions.
    """
    with repo.index.read() as txn:
        starts = [repo.refs.resolve(txn, rev) for rev in include]
        if all_refs:
            starts += _ref_tips(repo, txn, remotes=True)
        hidden = _ancestry(repo, txn, [repo.refs.resolve(txn, rev) for rev in exclude])
        stop = frozenset(bytes.fromhex(cid) for cid in known)
        found = {oid: obj for oid, obj in _ancestry(repo, txn, starts, stop).items() if oid not in hidden}
        order = _topo_order(found)[:n]
        return [to_commit(oid, found[oid], pruned=txn.pruned(oid) is not None) for oid in order]


def pruned_digest(repo) -> bytes:
    """A digest of the set of commits gc retention pruned. gc prunes without moving a
    ref, so whoever keeps a walk keyed by the refs keys it by this too (a walk marks
    each commit pruned or not)."""
    with repo.index.read() as txn:
        return digest(b"".join(txn.ids("pruned")))


def _topo_order(found: dict) -> list:
    """Children before parents; among commits that are ready, the newest first."""
    waiting = {oid: 0 for oid in found}
    for obj in found.values():
        for p in obj.parents:
            if p in waiting:
                waiting[p] += 1
    ready = [(-found[oid].time, oid) for oid, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, oid = heapq.heappop(ready)
        out.append(oid)
        for p in found[oid].parents:
            if p in waiting:
                waiting[p] -= 1
                if waiting[p] == 0:
                    heapq.heappush(ready, (-found[p].time, p))
    return out


def left_behind(repo, commit_id: str) -> list:
    """The commits of ``commit_id``'s ancestry that no branch, tag or HEAD
    reaches, newest first: what a checkout away from a detached HEAD leaves
    only the reflog to remember."""
    with repo.index.read() as txn:
        kept = _ancestry(repo, txn, _ref_tips(repo, txn))
        found = {oid: obj for oid, obj in _ancestry(repo, txn, [bytes.fromhex(commit_id)]).items()
                 if oid not in kept}
        return [to_commit(oid, found[oid]) for oid in _topo_order(found)]


_OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
        ">": operator.gt, "=": operator.eq}
_CONDITION = re.compile(r"^\s*([A-Za-z_][\w./-]*)\s*(<=|>=|==|!=|<|>|=)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Condition:
    """``metric op value``: what ``log --where`` keeps."""
    metric: str
    op: str
    value: float

    def holds(self, c) -> bool:
        v = metric_value(c, self.metric)
        return v is not None and _OPS[self.op](v, self.value)


def parse_condition(text: str) -> Condition:
    """``eval_loss<2.3`` as a Condition; BadInput naming the text if it is not one."""
    m = _CONDITION.match(text)
    try:
        value = float(m.group(3)) if m else None
    except ValueError:
        value = None
    if value is None or math.isnan(value):
        raise BadInput(f"condition {text!r} is not METRIC OP NUMBER (OP one of < <= > >= == !=), "
                       "as in 'eval_loss<2.3'")
    return Condition(m.group(1), m.group(2), value)


def metric_value(c, name: str) -> Optional[float]:
    """Commit ``c``'s value of metric ``name`` (or its step or epoch); None if it has none."""
    v = (c.metrics or {}).get(name)
    if v is None and name in ("step", "epoch"):
        v = getattr(c, name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return None
    return v


def select(commits: list, where: Iterable[Condition] = (), sort: Optional[str] = None) -> list:
    """The commits that meet every condition of ``where``, ordered by metric ``sort``
    (lowest first; ``-NAME``: highest first; among equal values the one given last, the
    oldest in history order, first: the commit that reached the value, not a later copy of
    it such as Lightning's "last" save of the same step; commits without it last, in their order).

    Raises MetricNotRecorded if no commit given records a metric named here (a typo
    must not read as "no commit qualifies")."""
    where = tuple(where)
    names = [cond.metric for cond in where] + ([sort.lstrip("-")] if sort else [])
    for name in dict.fromkeys(names):
        if commits and all(metric_value(c, name) is None for c in commits):
            recorded = sorted({k for c in commits for k in (c.metrics or {})})
            raise MetricNotRecorded(f"no commit here records metric {name!r}; recorded: "
                                    f"{', '.join(recorded) or 'none'}", metric=name, recorded=recorded)
    out = [c for c in commits if all(cond.holds(c) for cond in where)]
    if sort:
        name, sign = sort.lstrip("-"), (-1 if sort.startswith("-") else 1)
        have = [(sign * metric_value(c, name), -i, c) for i, c in enumerate(out) if metric_value(c, name) is not None]
        have.sort(key=lambda row: row[:2])
        out = [c for _, _, c in have] + [c for c in out if metric_value(c, name) is None]
    return out


def upstream(repo, branch: str) -> Optional[str]:
    """The remote-tracking branch ``branch`` follows, as Git's default push and pull do:
    ``origin/BRANCH`` if there is one, else the first other remote's; None if none."""
    names = {r.name for r in repo.remotes.branches()}
    remotes = sorted({n.split("/", 1)[0] for n in names}, key=lambda r: (r != "origin", r))
    return next((f"{r}/{branch}" for r in remotes if f"{r}/{branch}" in names), None)


def ahead_behind(repo, rev: str, other: str) -> tuple:
    """(commits ``rev`` reaches and ``other`` does not, and the other way round): what
    ``git status`` counts as ahead of and behind the upstream."""
    return len(walk(repo, [rev], [other])), len(walk(repo, [other], [rev]))
