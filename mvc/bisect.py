"""Finding the first bad commit: Git's bisect, for checkpoints.

Vocabulary:

- **path**: the commits after GOOD up to and including BAD along first
  parents, oldest first. Bisect assumes every commit on it is good up to
  some point and bad from there on; the **first bad commit** is that point.
- **verdict**: ``good``, ``bad`` or ``skip`` (cannot be judged), given to
  one commit. The newest good and the oldest bad commit bound the search.
- **candidate**: the next commit to judge: the unjudged, unskipped commit
  nearest the middle between the newest good and the oldest bad one, so
  each verdict halves what is left.
- **suspects**: when only skipped commits are left between the bounds, the
  first bad commit is one of them or the oldest bad one; bisect says which.
- **pruned commit**: one whose tensors gc retention deleted (its record and
  metrics stay). Its state cannot be loaded, so bisect skips it by itself
  wherever it would load the state (candidates offered, ``run``, the
  callable ``bisect``); ``log`` lists it as such. ``run_metric`` needs only
  the record and judges it like any other. A verdict given by hand stands.

A bisect started with ``start`` lives in ``.mvc/BISECT`` (canonical
msgpack, replaced atomically by write-and-rename), so each ``mvc bisect``
command can be a separate process; the file is rewritten after every
verdict, so an interrupted ``run`` leaves every verdict so far in place.
``bisect`` (the Python API with a callable) keeps its state in memory.

Evaluation commands (``run``) follow Git's exit codes: 0 good, 125 skip,
1-127 otherwise bad, 128 and above or death by a signal stop the bisect.
"""

import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from typing import Callable, Optional

from . import encoding, scratch
from .store import fs
from .diff import Diff, diff
from .errors import (BadInput, BadRange, BadVerdict, BisectEndMisjudged, BisectFinished, BisectInProgress,
                     BisectStateDamaged, BisectStopped, CommitPruned, CorruptObject, MetricNotRecorded, MvcError,
                     NoBisect, VerdictContradicts)
from .files import FORMATS, write_checkpoint
from .objects import ID_SIZE
from .records import Commit

STATE_FILE = "BISECT"
STATE_VERSION = 1
VERDICTS = ("good", "bad", "skip")
EXIT_SKIP = 125


@dataclass(frozen=True)
class BisectStatus:
    """Where a bisect stands. ``candidate`` is None once it is done."""

    branch: Optional[str]
    good: str  # newest commit known good
    bad: str  # oldest commit known bad
    candidate: Optional[Commit]  # the commit to judge next
    remaining: int  # commits left to judge between good and bad (skipped ones not counted)
    steps: int  # about how many verdicts are still needed
    skipped: tuple  # ids of skipped commits between good and bad
    first_bad: Optional[Commit] = None
    suspects: tuple = ()  # ids that may be the first bad one, when skips leave it open
    changes: Optional[Diff] = None  # first_bad against its parent
    changes_note: str = ""  # why changes is None for a known first_bad (e.g. gc pruned one of them)
    evaluations: int = 0  # verdicts this call reached (run, run_metric, bisect)

    @property
    def done(self) -> bool:
        return self.candidate is None


@dataclass(frozen=True)
class LogEntry:
    verdict: str
    commit: str
    step: Optional[int]
    message: str
    note: str = ""  # set when bisect gave the verdict itself (a pruned commit), and why


@dataclass(frozen=True)
class BisectLog:
    entries: tuple  # LogEntry per verdict, in the order given (start's bad and good first), then pruned skips
    status: BisectStatus


# -- state -------------------------------------------------------------------

def _state_path(repo):
    return repo.dir / STATE_FILE


def in_progress(repo) -> bool:
    return _state_path(repo).exists()


def _new_state(repo, bad: str, good: str, branch: Optional[str]) -> dict:
    bad_id, good_id = repo.resolve(bad), repo.resolve(good)
    if bad_id == good_id:
        raise BadRange(f"BAD {bad} and GOOD {good} are the same commit {bad_id[:12]}; "
                       "give a good commit older than the bad one", bad=bad_id, good=good_id, branch=branch,
                       problem="same")
    history = list(repo.log(branch if branch is not None else bad_id))
    ids = [c.id for c in history]
    if bad_id not in ids:
        raise BadRange(f"BAD {bad} ({bad_id[:12]}) is not on the first-parent history of {branch!r}",
                       bad=bad_id, good=good_id, branch=branch, problem="not-on-branch")
    ids = ids[ids.index(bad_id):]
    if good_id not in ids:
        raise BadRange(_not_descendant(repo, bad, bad_id, good, good_id), bad=bad_id, good=good_id, branch=branch,
                       problem="not-descendant")
    path = ids[:ids.index(good_id)][::-1]
    return {"version": STATE_VERSION, "branch": branch, "good": bytes.fromhex(good_id),
            "path": [bytes.fromhex(c) for c in path],
            "marks": [["bad", bytes.fromhex(bad_id)], ["good", bytes.fromhex(good_id)]]}


def _not_descendant(repo, bad, bad_id, good, good_id) -> str:
    message = (f"BAD {bad} ({bad_id[:12]}) is not a descendant of GOOD {good} ({good_id[:12]}) "
               "along first parents")
    if any(c.id == bad_id for c in repo.log(good_id)):
        return message + "; they look swapped: BAD comes first, then GOOD"
    return message + "; give a GOOD commit from BAD's own history"


def _read_state(repo) -> dict:
    try:
        data = _state_path(repo).read_bytes()
    except FileNotFoundError:
        raise NoBisect("no bisect in progress") from None
    try:
        state = encoding.unpack(data, "the bisect state")
        problem = _state_problem(state)
    except CorruptObject as exc:
        problem = str(exc)
    if problem:
        raise BisectStateDamaged(f"the bisect state .mvc/{STATE_FILE} is damaged ({problem})",
                                 path=str(_state_path(repo)), problem=problem)
    return state


def _state_problem(state) -> str:
    def is_id(x):
        return type(x) is bytes and len(x) == ID_SIZE
    if type(state) is not dict or state.get("version") != STATE_VERSION:
        return "not a version 1 bisect state"
    if not (type(state.get("path")) is list and state["path"] and all(map(is_id, state["path"]))):
        return "bad path"
    if not is_id(state.get("good")) or not (state.get("branch") is None or type(state["branch"]) is str):
        return "bad good commit or branch"
    known = set(state["path"]) | {state["good"]}
    marks = state.get("marks")
    if type(marks) is not list or not all(type(m) is list and len(m) == 2 and m[0] in VERDICTS
                                          and is_id(m[1]) and m[1] in known for m in marks):
        return "bad verdicts"
    return "" if _bounds(state) is not None else "contradictory verdicts"


def _write_state(repo, state: dict) -> None:
    """Replace the state file atomically: a reader sees the old or the new one."""
    fs.atomic_write(_state_path(repo), encoding.pack(state), tmp_dir=fs.ensure_dir(repo.dir / "tmp"))


# -- the search ----------------------------------------------------------------

def _bounds(state: dict):
    """(newest good index, oldest bad index, skipped indexes between), or None
    when the verdicts contradict each other. The start GOOD has index -1."""
    index = {cid: i for i, cid in enumerate(state["path"])}
    index[state["good"]] = -1
    verdicts = {}
    for verdict, cid in state["marks"]:
        verdicts[index[cid]] = verdict  # a later verdict on the same commit wins
    goods = [i for i, v in verdicts.items() if v == "good"]
    bads = [i for i, v in verdicts.items() if v == "bad"]
    if not goods or not bads or max(goods) >= min(bads):
        return None
    lo, hi = max(goods), min(bads)
    return lo, hi, sorted(i for i, v in verdicts.items() if v == "skip" and lo < i < hi)


def _next_index(lo: int, hi: int, skipped: list) -> Optional[int]:
    middle, skipped = (lo + hi) / 2, set(skipped)
    options = [i for i in range(lo + 1, hi) if i not in skipped]
    return min(options, key=lambda i: (abs(i - middle), i)) if options else None


def _pruned_on_path(repo, state: dict) -> frozenset:
    """Ids on the path whose tensors gc retention deleted (asked anew each
    time: a gc may run between two verdicts)."""
    path = state["path"]
    return frozenset(bytes.fromhex(c.id) for c in repo.log(path[-1].hex(), n=len(path)) if c.pruned)


def _status(repo, state: dict, changes: bool = True, skip_pruned: bool = True) -> BisectStatus:
    """Where ``state`` stands; with ``skip_pruned``, pruned commits between the
    bounds count as skipped (between the bounds every commit is unjudged or skipped)."""
    lo, hi, skipped = _bounds(state)
    path = state["path"]
    if skip_pruned:
        pruned = _pruned_on_path(repo, state)
        skipped = sorted(set(skipped) | {i for i in range(lo + 1, hi) if path[i] in pruned})
    good = state["good"] if lo < 0 else path[lo]
    left = hi - lo - 1 - len(skipped)
    candidate = _next_index(lo, hi, skipped)
    status = BisectStatus(state["branch"], good.hex(), path[hi].hex(),
                          repo.get_commit(path[candidate].hex()) if candidate is not None else None,
                          left, math.ceil(math.log2(left + 1)) if left else 0,
                          tuple(path[i].hex() for i in skipped))
    if candidate is not None:
        return status
    if skipped:
        return replace(status, suspects=status.skipped + (path[hi].hex(),))
    status = replace(status, first_bad=repo.get_commit(path[hi].hex()))
    return _with_changes(repo, status) if changes else status


def _with_changes(repo, status: BisectStatus) -> BisectStatus:
    """``status`` with its first bad commit's diff against the parent, or a note why there is none."""
    first_bad = status.first_bad
    try:
        return replace(status, changes=diff(repo, first_bad.parents[0], first_bad.id))
    except CommitPruned as exc:  # gc pruned it or its parent: the verdict stands, the tensors are gone
        return replace(status, changes_note=f"no diff against the parent: {exc}")


def _with_verdict(state: dict, verdict: str, cid: bytes) -> dict:
    if verdict not in VERDICTS:
        raise BadVerdict(f"verdict {verdict!r} is not one of {', '.join(VERDICTS)}", verdict=verdict, id=cid)
    if cid not in state["path"] and cid != state["good"]:
        raise BadInput(f"commit {cid.hex()[:12]} is not between the good {state['good'].hex()[:12]} and "
                       f"the bad {state['path'][-1].hex()[:12]} commit being bisected")
    new = dict(state, marks=state["marks"] + [[verdict, cid]])
    if _bounds(new) is None:
        raise VerdictContradicts(f"commit {cid.hex()[:12]} cannot be {verdict}: {_contradiction(state, verdict)}; "
                                 "bisect assumes good commits come before bad ones", id=cid, verdict=verdict)
    return new


def _contradiction(state: dict, verdict: str) -> str:
    lo, hi, _ = _bounds(state)
    good = (state["good"] if lo < 0 else state["path"][lo]).hex()[:12]
    bad = state["path"][hi].hex()[:12]
    if verdict == "bad":
        return f"it is not newer than {good}, which is good"
    if verdict == "good":
        return f"it is not older than {bad}, which is bad"
    return f"it is the only good ({good}) or bad ({bad}) commit known"


# -- verbs -----------------------------------------------------------------------

def start(repo, bad: str, good: str, branch: Optional[str] = None) -> BisectStatus:
    """Start bisecting the first-parent history from GOOD (exclusive) to BAD.

    ``branch`` names the history to follow (default: BAD's own first parents).
    Raises MvcError if a bisect is already in progress, UnknownRevision for
    bad revisions, BadInput if BAD is not a first-parent descendant of GOOD.
    """
    if in_progress(repo):
        state = _read_state(repo)
        raise BisectInProgress(f"a bisect is already in progress (bad {state['path'][-1].hex()[:12]}, good "
                               f"{state['good'].hex()[:12]})", good=state["good"].hex(), bad=state["path"][-1].hex())
    state = _new_state(repo, bad, good, branch)
    _write_state(repo, state)
    return _status(repo, state)


def mark(repo, verdict: str, rev: Optional[str] = None) -> BisectStatus:
    """Judge ``rev`` (default: the current candidate) good, bad or skip.

    Raises MvcError without a bisect in progress or when it is done and no
    ``rev`` is given; BadInput for a commit outside the bisected range or a
    verdict that contradicts earlier ones (the state is then unchanged).
    """
    state = _read_state(repo)
    if rev is None:
        status = _status(repo, state, changes=False)
        if status.candidate is None:
            raise BisectFinished("the bisect is finished: there is no candidate left to judge")
        rev = status.candidate.id
    state = _with_verdict(state, verdict, bytes.fromhex(repo.resolve(rev)))
    _write_state(repo, state)
    return _status(repo, state)


def status(repo) -> BisectStatus:
    """The bisect in progress; MvcError if there is none."""
    return _status(repo, _read_state(repo))


def log(repo, changes: bool = True) -> BisectLog:
    """Every verdict so far, then a skip for each unjudged pruned commit on
    the path, and where the bisect stands; MvcError if none is in progress.
    ``changes=False``: a found first bad commit comes without its diff
    (no tensor is read)."""
    state = _read_state(repo)
    entries = [_entry(repo, verdict, cid) for verdict, cid in state["marks"]]
    judged = {cid for _, cid in state["marks"]}
    pruned = _pruned_on_path(repo, state)
    entries += [_entry(repo, "skip", cid, "pruned by gc: its tensors are gone")
                for cid in state["path"] if cid in pruned and cid not in judged]
    return BisectLog(tuple(entries), _status(repo, state, changes))


def _entry(repo, verdict: str, cid: bytes, note: str = "") -> LogEntry:
    c = repo.get_commit(cid.hex())
    return LogEntry(verdict, c.id, c.step, c.message, note)


def reset(repo) -> Optional[BisectStatus]:
    """End the bisect: remove its state. Returns where it stood, or None if
    no bisect was in progress or its state could not be read (it is removed
    all the same)."""
    if not in_progress(repo):
        return None
    try:
        where = _status(repo, _read_state(repo), changes=False)
    except MvcError:  # damaged state, or its commits are gone: reset anyway
        where = None
    _state_path(repo).unlink(missing_ok=True)
    return where


def _drive(repo, state: dict, decide: Callable, persist: bool, progress,
           skip_pruned: bool = True) -> BisectStatus:
    """Judge candidates with ``decide(commit) -> verdict`` until the bisect is done;
    ``skip_pruned`` False offers pruned commits too (``decide`` needs no tensors)."""
    evaluations = 0
    while True:
        candidate = _status(repo, state, changes=False, skip_pruned=skip_pruned).candidate
        if candidate is None:
            return replace(_status(repo, state, skip_pruned=skip_pruned), evaluations=evaluations)
        verdict = decide(candidate)
        evaluations += 1
        state = _with_verdict(state, verdict, bytes.fromhex(candidate.id))
        if persist:
            _write_state(repo, state)
        if progress:
            progress(candidate, verdict)


def verdict_of(code: int) -> Optional[str]:
    """Git's bisect-run exit codes: the verdict, or None to stop."""
    if code == 0:
        return "good"
    if code == EXIT_SKIP:
        return "skip"
    return "bad" if 0 < code < 128 else None


def _evaluation_output():
    """Where an evaluation command's stdout goes: our stderr, so that mvc's own
    stdout (``--json`` above all) carries only mvc's result."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr is not a file (captured in tests)
        return None


def run(repo, cmd_args, fmt: str = "pt", progress: Optional[Callable] = None,
        check_ends: bool = True, timeout: Optional[float] = None, timeout_verdict: str = "skip") -> BisectStatus:
    """Judge each candidate by running ``cmd_args`` on its checkpoint.

    With ``timeout`` (seconds), an evaluation still running then is killed
    (with every process it started: it runs in a session of its own) and
    judged ``timeout_verdict`` ("skip", or "bad" where a hang is the
    regression).

    The checkpoint is written to a temporary file (``fmt`` "pt": torch.save of
    the state; "safetensors": its tensors under dotted keys) whose path is in
    the environment as ``MVC_CHECKPOINT`` (the commit id in ``MVC_COMMIT``)
    and replaces ``{}`` in the arguments. ``progress(commit, verdict)`` is
    called after each verdict. Pruned commits are skipped without running
    anything. With ``check_ends`` the command first runs on the newest good
    and the oldest bad commit, which must come out good and bad (see
    ``_check_ends``). Raises BadInput for an unknown format or a
    command that cannot be run, BisectEndMisjudged when an end comes out
    wrong, MvcError when a command exits with 128 or more or is killed by a
    signal (every verdict before it is kept).
    """
    if fmt not in FORMATS:
        raise BadInput(f"checkpoint format {fmt!r} is not one of {', '.join(FORMATS)}")
    if not cmd_args:
        raise BadInput("give the evaluation command to run")
    if timeout is not None and not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
        raise BadInput(f"the evaluation timeout must be a positive number of seconds, not {timeout!r}")
    if timeout_verdict not in ("skip", "bad"):
        raise BadInput(f"a timed-out evaluation is judged 'skip' or 'bad', not {timeout_verdict!r}")
    state = _read_state(repo)
    _check_runnable(cmd_args[0])
    scratch.remove_leftovers(repo.dir)  # what killed runs left
    judge = _Judge(repo, cmd_args, fmt, timeout, timeout_verdict)
    with tempfile.TemporaryDirectory(prefix=f"bisect-{scratch.tag()}-", dir=repo.dir / "tmp") as tmp:
        judge.tmp = tmp
        if check_ends:
            _check_ends(repo, state, judge.code, progress, timeout_verdict)
        return _drive(repo, state, judge.verdict, True, progress)


def _ends(repo, state: dict) -> tuple:
    """((newest good commit, "good"), (oldest bad commit, "bad")): what ``run`` and
    ``run_metric`` check before judging anything between them."""
    lo, hi, _ = _bounds(state)
    return ((repo.get_commit((state["good"] if lo < 0 else state["path"][lo]).hex()), "good"),
            (repo.get_commit(state["path"][hi].hex()), "bad"))


def _check_ends(repo, state: dict, run_on: Callable, progress, timeout_verdict: str = "skip") -> None:
    """Run the command on the newest good and the oldest bad commit first.

    A command that calls the good end bad (an ImportError, a wrong path)
    would call every candidate bad and name a wrong first bad commit; one
    that calls the bad end good cannot see the regression. Either is
    BisectEndMisjudged before any verdict is recorded. Pruned ends cannot
    be loaded and are not checked.
    """
    for commit, expected in _ends(repo, state):
        if commit.pruned:
            continue
        code = run_on(commit)
        verdict = timeout_verdict if code is None else verdict_of(code)
        if progress:
            progress(commit, f"{verdict or 'stop'} (the {expected} end, checked first)")
        if verdict != expected:
            raise BisectEndMisjudged(_end_problem(commit, expected, code, verdict), id=commit.id,
                                     expected=expected, verdict=verdict, code=code)


def _end_problem(commit: Commit, expected: str, code: Optional[int], verdict: Optional[str]) -> str:
    if code is None:
        got = f"timed out ({verdict})"
    else:
        got = f"{_how(code)}" if verdict is None else f"exited with {code} ({verdict})"
    why = ("so it would call every commit bad and name a wrong first bad commit (check that the command "
           "runs: its output is above)" if expected == "good" else
           "so it cannot tell this regression from a good commit: check what it tests")
    return (f"the {expected} end {commit.short_id} {got} under the evaluation command, {why}; "
            "no verdict was recorded")


def _check_runnable(program: str) -> None:
    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.isfile(program):
            raise BadInput(f"evaluation command {program!r} does not exist")
        if not os.access(program, os.X_OK):
            raise BadInput(f"evaluation command {program!r} is not executable; chmod +x it "
                           "or run it through its interpreter")
    elif shutil.which(program) is None:
        raise BadInput(f"evaluation command {program!r} was not found on PATH")


class _Judge:
    """Runs the evaluation command on one commit's checkpoint at a time."""

    def __init__(self, repo, cmd_args, fmt: str, timeout: Optional[float], timeout_verdict: str):
        self.repo, self.cmd_args, self.fmt = repo, cmd_args, fmt
        self.timeout, self.timeout_verdict, self.tmp = timeout, timeout_verdict, None

    def code(self, commit: Commit) -> Optional[int]:
        """The command's exit code on ``commit``'s checkpoint; None if it timed out (and was killed)."""
        path = os.path.join(self.tmp, f"{commit.short_id}.{self.fmt}")
        write_checkpoint(self.repo.load(commit.id), path, self.fmt, scratch=True)  # the repository's own tmp
        args = [a.replace("{}", path) for a in self.cmd_args]
        env = dict(os.environ, MVC_CHECKPOINT=path, MVC_COMMIT=commit.id)
        try:
            try:
                child = subprocess.Popen(args, env=env, stdout=_evaluation_output(),
                                         start_new_session=self.timeout is not None)
            except OSError as exc:
                raise BadInput(f"evaluation command {self.cmd_args[0]!r} cannot be run: "
                               f"{exc.strerror or exc}") from None
            try:
                return child.wait(self.timeout)
            except subprocess.TimeoutExpired:
                _kill(child)
                return None
            except BaseException:  # interrupted: the evaluation must not outlive the bisect
                _kill(child)
                raise
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:  # the evaluation removed or moved it: its exit code still stands
                pass

    def verdict(self, commit: Commit) -> str:
        code = self.code(commit)
        if code is None:
            return self.timeout_verdict
        verdict = verdict_of(code)
        if verdict is None:
            raise BisectStopped(f"evaluation of {commit.short_id} (step {commit.step}) {_how(code)}; bisect stopped "
                                "with every earlier verdict kept", id=commit.id, code=code)
        return verdict


def _kill(child) -> None:
    """SIGKILL ``child`` and, when it leads a session of its own, everything it started; reap it."""
    try:
        if os.getsid(child.pid) == child.pid:
            os.killpg(child.pid, signal.SIGKILL)
        else:
            child.kill()
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code} (128 or more stops a bisect)"


def run_metric(repo, metric: str, threshold: float, higher_is_worse: bool = False,
               progress: Optional[Callable] = None) -> BisectStatus:
    """Judge candidates by a metric recorded in their commits; nothing is run.

    A commit is bad when its metric is below ``threshold`` (above it with
    ``higher_is_worse``, e.g. a loss) or NaN, and skipped when it does not
    record the metric. Pruned commits are judged too: their metrics are kept.
    The newest good and the oldest bad commit are judged first (see
    ``_check_metric_ends``). Raises BadInput if no commit in the range
    records it, BisectEndMisjudged when an end comes out wrong.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise BadInput(f"threshold must be a finite number, not {threshold!r}")
    state = _read_state(repo)
    lo, hi, _ = _bounds(state)
    commits = [repo.get_commit(cid.hex()) for cid in state["path"][lo + 1:hi]]
    if commits and not any(metric in c.metrics for c in commits):
        known = sorted({name for c in commits for name in c.metrics})
        raise MetricNotRecorded(f"no commit left to judge records metric {metric!r}; recorded: "
                                f"{', '.join(known) if known else 'none'}", metric=metric, recorded=known)
    judge = functools.partial(_judge_metric, metric=metric, threshold=threshold, higher_is_worse=higher_is_worse)
    _check_metric_ends(repo, state, judge, metric, f"{metric} {'above' if higher_is_worse else 'below'} "
                       f"{threshold:g} is bad", progress)
    return _drive(repo, state, judge, True, progress, skip_pruned=False)


def _check_metric_ends(repo, state: dict, judge: Callable, metric: str, rule: str, progress) -> None:
    """Judge the newest good and the oldest bad commit by the rule first, as ``run`` runs its
    command on them: a good end the rule calls bad (a threshold or direction that does not fit
    this metric) makes every candidate look good or bad alike and names a wrong first bad
    commit. BisectEndMisjudged before any verdict is recorded. An end that does not record the
    metric cannot be checked."""
    for commit, expected in _ends(repo, state):
        verdict = judge(commit)
        if verdict == "skip":
            continue
        if progress:
            progress(commit, f"{verdict} (the {expected} end, checked first)")
        if verdict != expected:
            value = commit.metrics[metric]
            why = ("so the rule would name a wrong first bad commit" if expected == "good" else
                   "so the rule cannot see this regression")
            raise BisectEndMisjudged(f"the {expected} end {commit.short_id} records {metric} {value:.4g}, "
                                     f"{verdict} by the rule '{rule}', {why}; no verdict was recorded",
                                     id=commit.id, expected=expected, verdict=verdict, metric=metric, value=value)


def _judge_metric(commit: Commit, metric: str, threshold: float, higher_is_worse: bool) -> str:
    value = commit.metrics.get(metric)
    if value is None:
        return "skip"
    if value != value:  # NaN is never good
        return "bad"
    worse = value > threshold if higher_is_worse else value < threshold
    return "bad" if worse else "good"


def bisect(repo, good: str, bad: str, is_good: Callable, branch: Optional[str] = None,
           progress: Optional[Callable] = None) -> BisectStatus:
    """Find the first bad commit between ``good`` and ``bad`` in one call.

    ``is_good(state)`` gets each candidate's loaded state and returns True
    (good), False (bad) or None (skip); pruned commits are skipped without
    calling it. Nothing is written to the repository,
    so this does not disturb a bisect started with ``start``. Raises what
    ``start`` raises, BadInput for another return value, and whatever
    ``is_good`` raises.
    """
    def decide(commit: Commit) -> str:
        answer = is_good(repo.load(commit.id))
        import torch  # loading the state above imported it already
        if isinstance(answer, torch.Tensor) and answer.dtype == torch.bool and answer.numel() == 1:
            answer = bool(answer)  # e.g. ``return loss < 0.5``
        if answer is None:
            return "skip"
        if isinstance(answer, bool):
            return "good" if answer else "bad"
        raise BadVerdict(f"is_good returned {answer!r} for {commit.short_id}; return True, False or None",
                         verdict=answer, id=commit.id)
    return _drive(repo, _new_state(repo, bad, good, branch), decide, False, progress)


class Bisect:
    """The bisect verbs of a repository (``repo.bisect``): ``find`` searches
    with a Python predicate in one call; a session kept in ``.mvc/BISECT``
    (``start``, ``mark``, ``status``, ``log``, ``reset``, ``in_progress``)
    is driven by hand or by ``run`` (a command) or ``run_metric`` (a
    recorded metric), as ``git bisect``."""

    def __init__(self, repo):
        self.repo = repo

    def find(self, good: str, bad: str, is_good, branch=None, progress=None) -> BisectStatus:
        """The first commit after ``good`` for which ``is_good(state)`` is False; see ``bisect``."""
        return bisect(self.repo, good, bad, is_good, branch=branch, progress=progress)

    def start(self, bad: str, good: str, branch: Optional[str] = None) -> BisectStatus:
        """Start a session (as ``git bisect start BAD GOOD``)."""
        return start(self.repo, bad, good, branch)

    def mark(self, verdict: str, rev: Optional[str] = None) -> BisectStatus:
        """Judge ``rev`` (default: the current candidate) "good", "bad" or "skip"."""
        return mark(self.repo, verdict, rev)

    def in_progress(self) -> bool:
        return in_progress(self.repo)

    def status(self) -> BisectStatus:
        return status(self.repo)

    def log(self, changes: bool = True) -> BisectLog:
        return log(self.repo, changes)

    def reset(self) -> Optional[BisectStatus]:
        """End the session; its last status, or None if none was running."""
        return reset(self.repo)

    def run(self, cmd_args, fmt: str = "pt", progress=None, check_ends: bool = True, timeout=None,
            timeout_verdict: str = "skip") -> BisectStatus:
        """Judge candidates by running a command on each (Git's exit-code rules),
        after checking that the good and the bad end come out so (``check_ends``);
        an evaluation past ``timeout`` seconds is killed and judged ``timeout_verdict``."""
        return run(self.repo, cmd_args, fmt, progress, check_ends, timeout, timeout_verdict)

    def run_metric(self, metric: str, threshold: float, higher_is_worse: bool = False,
                   progress=None) -> BisectStatus:
        """Judge candidates by a recorded metric against ``threshold``."""
        return run_metric(self.repo, metric, threshold, higher_is_worse, progress)
