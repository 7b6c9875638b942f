"""When to commit: small pure policies over an observation of the run.

An **observation** is what a policy may look at after a training step: the
step, the time since the run started and since the last commit, a summary
of the losses since the last commit, the step's metrics with the best
values seen before it, and the time the run has spent blocked on
checkpoints. A **policy** is a callable ``policy(obs) -> bool`` that
decides from that alone, so the same observations always give the same
answers. ``Tracker`` turns the stream of steps into observations; it is the
only thing here with state.

``step_only`` marks a policy whose answer depends on the step number alone.
Every rank of a distributed run then reaches the same answer by itself, and
the Checkpointer skips broadcasting rank 0's decision.
"""

import math
from dataclasses import dataclass, field
from typing import Optional

import mvc


@dataclass(frozen=True)
class LossSummary:
    """Losses of the steps since the last commit."""

    count: int = 0
    first: Optional[float] = None
    last: Optional[float] = None
    min: Optional[float] = None
    max: Optional[float] = None
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations (Welford), for the variance
    curve: tuple = ()  # every ``stride``-th loss, at most CURVE_POINTS of them
    stride: int = 1

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 0.0

    @property
    def relative_std(self) -> float:
        """Spread of the losses relative to their size: 0 on a flat curve."""
        return self.std / abs(self.mean) if self.mean else (math.inf if self.std else 0.0)

    def add(self, loss: float) -> "LossSummary":
        count = self.count + 1
        delta = loss - self.mean
        mean = self.mean + delta / count
        curve, stride = self.curve, self.stride
        if self.count % stride == 0:
            curve += (loss,)
            if len(curve) > CURVE_POINTS:  # halve the resolution, keep the span
                curve, stride = curve[::2], stride * 2
        return LossSummary(count, loss if self.first is None else self.first, loss,
                           loss if self.min is None else min(self.min, loss),
                           loss if self.max is None else max(self.max, loss),
                           mean, self.m2 + delta * (loss - mean), curve, stride)

    def as_context(self) -> dict:
        if not self.count:
            return {}
        return {"count": self.count, "first": self.first, "last": self.last, "min": self.min,
                "max": self.max, "mean": self.mean, "std": self.std, "curve": list(self.curve),
                "curve_stride": self.stride}


CURVE_POINTS = 32


@dataclass(frozen=True)
class Observation:
    step: int
    elapsed: float  # seconds since the run (or its resume) started
    steps_since_commit: int
    seconds_since_commit: float
    losses: LossSummary = LossSummary()
    metrics: dict = field(default_factory=dict)
    best_min: dict = field(default_factory=dict)  # lowest value of each metric before this step
    best_max: dict = field(default_factory=dict)
    blocked: float = 0.0  # seconds training waited on checkpoints so far
    save_cost: Optional[float] = None  # seconds the last commit blocked training


class Tracker:
    """Builds observations from steps and commits (times are given, not read)."""

    def __init__(self, start: float, step: int = -1):
        self.start = start
        self.commit_step = step
        self.commit_time = start
        self.losses = LossSummary()
        self.best_min: dict = {}
        self.best_max: dict = {}
        self.blocked = 0.0
        self.save_cost: Optional[float] = None

    def observe(self, step: int, now: float, loss: Optional[float] = None,
                metrics: Optional[dict] = None) -> Observation:
        """Record a finished step and return what a policy sees after it."""
        if loss is not None and math.isfinite(loss):
            self.losses = self.losses.add(float(loss))
        metrics = dict(metrics or {})
        obs = Observation(step, now - self.start, step - self.commit_step, now - self.commit_time,
                          self.losses, metrics, dict(self.best_min), dict(self.best_max),
                          self.blocked, self.save_cost)
        for name, value in metrics.items():
            self.best_min[name] = min(value, self.best_min.get(name, value))
            self.best_max[name] = max(value, self.best_max.get(name, value))
        return obs

    def committed(self, step: int, now: float, blocked: float) -> None:
        """A commit of ``step`` cost ``blocked`` seconds of training time."""
        self.commit_step = step
        self.commit_time = now
        self.losses = LossSummary()
        self.blocked += blocked
        self.save_cost = blocked


class Policy:
    step_only = False

    def __call__(self, obs: Observation) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class EveryNSteps(Policy):
    """After every ``n``-th step (steps n-1, 2n-1, ...: aligned across resumes)."""

    n: int
    step_only = True

    def __post_init__(self):
        _positive("every_n_steps", self.n)

    def __call__(self, obs: Observation) -> bool:
        return (obs.step + 1) % self.n == 0


@dataclass(frozen=True)
class EveryNSeconds(Policy):
    """When ``seconds`` have passed since the last commit (or the start)."""

    seconds: float

    def __post_init__(self):
        _positive("every_n_seconds", self.seconds)

    def __call__(self, obs: Observation) -> bool:
        return obs.seconds_since_commit >= self.seconds


@dataclass(frozen=True)
class OnBestMetric(Policy):
    """When ``metric`` beats every earlier value ("min": lower is better, "max")."""

    metric: str
    mode: str = "min"

    def __post_init__(self):
        if self.mode not in ("min", "max"):
            raise mvc.BadInput(f"on_best mode must be 'min' or 'max', not {self.mode!r}")

    def __call__(self, obs: Observation) -> bool:
        value = obs.metrics.get(self.metric)
        if value is None:
            return False
        best = (obs.best_min if self.mode == "min" else obs.best_max).get(self.metric)
        if best is None:
            return True
        return value < best if self.mode == "min" else value > best


@dataclass(frozen=True)
class Adaptive(Policy):
    """Short intervals while the loss moves, long ones while it is flat.

    The interval falls from ``max_steps`` (relative spread of the losses
    since the last commit at or below ``flat``) to ``min_steps`` (at or above
    ``volatile``), geometrically in between.
    """

    min_steps: int
    max_steps: int
    flat: float = 0.01
    volatile: float = 0.1

    def __post_init__(self):
        _positive("adaptive min_steps", self.min_steps)
        if self.max_steps < self.min_steps or not 0 <= self.flat < self.volatile:
            raise mvc.BadInput("adaptive needs min_steps <= max_steps and 0 <= flat < volatile")

    def interval(self, relative_std: float) -> int:
        if relative_std <= self.flat:
            return self.max_steps
        if relative_std >= self.volatile:
            return self.min_steps
        share = math.log(relative_std / self.flat) / math.log(self.volatile / self.flat) if self.flat else 1.0
        return round(self.max_steps * (self.min_steps / self.max_steps) ** share)

    def __call__(self, obs: Observation) -> bool:
        if obs.steps_since_commit < self.min_steps:
            return False
        return obs.steps_since_commit >= self.interval(obs.losses.relative_std)


@dataclass(frozen=True)
class OverheadBudget(Policy):
    """Keep the time blocked on checkpoints within ``fraction`` of the run.

    Alone, it commits whenever the next commit (costed like the last one)
    still fits the budget; with ``policy`` it only lets that policy's
    commits through when they fit. Before the first commit the cost is
    unknown, so the first one is allowed.
    """

    fraction: float
    policy: Optional[Policy] = None

    def __post_init__(self):
        if not 0 < self.fraction < 1:
            raise mvc.BadInput(f"overhead budget must be a fraction between 0 and 1, not {self.fraction!r}")

    def fits(self, obs: Observation) -> bool:
        if obs.save_cost is None:
            return True
        return obs.blocked + obs.save_cost <= self.fraction * (obs.elapsed + obs.save_cost)

    def __call__(self, obs: Observation) -> bool:
        return (self.policy is None or self.policy(obs)) and self.fits(obs)


@dataclass(frozen=True)
class AnyOf(Policy):
    """Commit when any of ``policies`` says so."""

    policies: tuple

    @property
    def step_only(self) -> bool:
        return all(p.step_only for p in self.policies)

    def __call__(self, obs: Observation) -> bool:
        return any(p(obs) for p in self.policies)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise mvc.BadInput(f"{name} must be a positive number, not {value!r}")


DEFAULT_SECONDS = 1800.0


def build(every_n_steps=None, every_n_seconds=None, on_best=None, adaptive=None,
          overhead_budget=None, policy: Optional[Policy] = None) -> Policy:
    """One policy from the Checkpointer's keywords.

    ``on_best`` is a metric name (lower is better) or (name, "min"/"max");
    ``adaptive`` is (min_steps, max_steps). The triggers given are combined
    with AnyOf and the budget gates them. With none at all, every 30 minutes.
    Raises mvc.BadInput on a malformed setting.
    """
    triggers = [policy] if policy is not None else []
    if every_n_steps is not None:
        triggers.append(EveryNSteps(every_n_steps))
    if every_n_seconds is not None:
        triggers.append(EveryNSeconds(every_n_seconds))
    if on_best is not None:
        name, mode = (on_best, "min") if isinstance(on_best, str) else on_best
        triggers.append(OnBestMetric(name, mode))
    if adaptive is not None:
        triggers.append(adaptive if isinstance(adaptive, Adaptive) else Adaptive(*adaptive))
    combined = triggers[0] if len(triggers) == 1 else AnyOf(tuple(triggers)) if triggers else None
    if overhead_budget is not None:
        return OverheadBudget(overhead_budget, combined)
    return combined or EveryNSeconds(DEFAULT_SECONDS)
