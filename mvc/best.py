"""best: which checkpoint had the best value of a metric, and what changed since.

The question every training run ends with, answered by one verb (``mvc best``)
from what ``log --sort`` and ``diff`` already know.

Vocabulary:

- the **history** looked at: the commits ``log`` lists for the same
  revision (REV's first-parent history; with ``all_refs`` every commit any
  branch, tag, remote-tracking branch or HEAD reaches), so ``best`` names
  the commit ``log --sort METRIC -n 1`` puts first.
- the **candidates**: the commits of that history that record the metric
  and pass every condition (``eval_loss<2.3``).
- **best**: the candidate with the lowest value (``highest``: the highest;
  ``-NAME`` says the same, as in ``log --sort -NAME``); of equal values the
  newest, as ``log --sort`` orders ties.
- **since**: the commits the target (REV, default HEAD) reaches that the best
  one does not (``git rev-list --count BEST..REV``); **apart**: the commits
  the best one reaches that the target does not (0 when the best commit is
  in the target's history).
- **latest**: the newest commit of the target's first-parent history that
  records the metric: its value "now" (the target itself when it records it).
"""

from dataclasses import dataclass
from typing import Iterable, Optional

from . import history
from .diff import Diff
from .errors import MetricNotRecorded, NothingQualifies
from .records import Commit

# Words in a metric's name that say a larger value is better (accuracy, F1, reward …);
# any other name (losses, errors, perplexities) is better smaller. Only a guess, for
# the web view's "best by" links and a note from the CLI; the verb takes the direction it is given.
_HIGHER_IS_BETTER = ("acc", "f1", "bleu", "rouge", "auc", "precision", "recall", "score", "reward",
                     "iou", "return", "win")
_EXACT_HIGHER = ("map", "map50", "map75")  # mean average precision, not mape (an error)


def higher_is_better(name: str) -> bool:
    """Whether a larger ``name`` looks like the better one, judged by the words of its name."""
    words = name.lower().replace("-", "_").replace(".", "_").replace("/", "_").split("_")
    return any(w in _EXACT_HIGHER or w.startswith(_HIGHER_IS_BETTER) for w in words)


@dataclass(frozen=True)
class Best:
    """The answer of ``best``: the best commit, and what changed from it to ``target``."""

    metric: str
    highest: bool  # the highest value is the best one (else the lowest)
    commit: Commit  # the best commit
    value: float
    candidates: int  # commits that record the metric and pass every condition
    target: Optional[Commit]  # REV's commit (HEAD's by default); None on an unborn HEAD
    since: int  # commits the target reaches that the best one does not
    apart: int  # commits the best one reaches that the target does not (0: it is in the target's history)
    latest: Optional[Commit]  # the newest commit of the target's history that records the metric
    latest_value: Optional[float]
    diff: Optional[Diff]  # best -> target; None when they are one commit, or gc pruned either's tensors


def best(repo, metric: str, rev: Optional[str] = None, all_refs: bool = False,
         where: Iterable = (), highest: bool = False, read_data: bool = True) -> Best:
    """The commit with the best value of ``metric`` in ``rev``'s history (default HEAD;
    ``all_refs``: every ref's), and the diff from it to ``rev``.

    ``metric`` is a metric's name (``step`` and ``epoch`` work too); ``-NAME``
    means the highest is best, as does ``highest``. ``where``: conditions
    (``history.Condition`` or text such as ``'eval_loss<2.3'``) every candidate
    must pass. ``read_data`` as for ``diff``: False answers the diff from chunk ids.

    Raises MetricNotRecorded (``metric``, ``recorded``: the metrics there are)
    when no commit of the history records the metric or a condition's metric;
    NothingQualifies (``metric``, ``conditions``, ``recorded``: how many
    record the metric) when some do but none passes ``where``; BadInput for a
    malformed condition; UnknownRevision / AmbiguousRevision for a bad ``rev``.
    """
    name, highest = metric.lstrip("-"), highest or metric.startswith("-")
    conditions = [history.parse_condition(c) if isinstance(c, str) else c for c in where]
    commits = _history(repo, rev, all_refs)
    if not commits:
        raise MetricNotRecorded(f"no commit records metric {name!r}: {rev or 'HEAD'} has no commits",
                                metric=name, recorded=())
    ranked = history.select(commits, conditions, ("-" if highest else "") + name)
    ranked = [c for c in ranked if history.metric_value(c, name) is not None]
    if not ranked:
        recording = sum(1 for c in commits if history.metric_value(c, name) is not None)
        shown = " and ".join(f"{c.metric}{c.op}{c.value:g}" for c in conditions)
        raise NothingQualifies(f"{recording} commit{'' if recording == 1 else 's'} record{'s' if recording == 1 else ''} "
                               f"metric {name!r}, none with {shown}", metric=name,
                               conditions=tuple(f"{c.metric}{c.op}{c.value:g}" for c in conditions),
                               recorded=recording)
    top = ranked[0]
    target = _target(repo, rev)
    since, apart, latest, change = 0, 0, None, None
    if target is not None:
        since, apart = history.ahead_behind(repo, target.id, top.id)
        latest = next((c for c in repo.log(target.id) if history.metric_value(c, name) is not None), None)
        if top.id != target.id and not top.pruned and not target.pruned:
            change = repo.diff(top.id, target.id, read_data=read_data)
    return Best(name, highest, top, history.metric_value(top, name), len(ranked), target, since, apart, latest,
                None if latest is None else history.metric_value(latest, name), change)


def _history(repo, rev: Optional[str], all_refs: bool) -> list:
    """The commits ``log [REV] [--all]`` lists, in its order."""
    if all_refs:
        return history.walk(repo, [rev] if rev else [], all_refs=True)
    return list(repo.log(rev))


def _target(repo, rev: Optional[str]) -> Optional[Commit]:
    """REV's commit, or HEAD's; None when HEAD has no commits yet (only with ``all_refs``)."""
    if rev is None and repo.head().id is None:
        return None
    return repo.get_commit(rev or "HEAD")
