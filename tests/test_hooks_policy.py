"""Commit policies on synthetic loss curves (no training, no clock: times are given)."""

import math
import random
from statistics import median

import numpy as np
import pytest

import mvc
from mvc_hooks import (Adaptive, AnyOf, EveryNSeconds, EveryNSteps, LossSummary, OnBestMetric, OverheadBudget,
                       Tracker)
from mvc_hooks.policy import build


def simulate(policy, losses, step_time=1.0, save_cost=0.0, metrics=None):
    """The steps at which ``policy`` commits; a commit takes ``save_cost`` seconds."""
    tracker = Tracker(start=0.0)
    now, commits = 0.0, []
    for step, loss in enumerate(losses):
        now += step_time
        values = {"loss": loss, **(metrics[step] if metrics else {})}
        if policy(tracker.observe(step, now, loss, values)):
            now += save_cost
            tracker.committed(step, now, save_cost)
            commits.append(step)
    return commits, tracker, now


def noisy(n, level, base=1.0, seed=0):
    rng = random.Random(seed)
    return [base + rng.uniform(-level, level) for _ in range(n)]


def test_every_n_steps_is_aligned_to_step_numbers():
    commits, _, _ = simulate(EveryNSteps(10), [1.0] * 45)
    assert commits == [9, 19, 29, 39]
    assert EveryNSteps(10).step_only


def test_every_n_seconds():
    commits, _, _ = simulate(EveryNSeconds(2.0), [1.0] * 12, step_time=0.5)
    assert commits == [3, 7, 11]
    assert not EveryNSeconds(2.0).step_only


def test_on_best_metric_min_and_max():
    accs = [0.5, 0.4, 0.6, 0.6, 0.7, 0.65]
    metrics = [{"acc": a} for a in accs]
    commits, _, _ = simulate(OnBestMetric("acc", "max"), [1.0] * len(accs), metrics=metrics)
    assert commits == [0, 2, 4]
    losses = [3.0, 2.0, 2.5, 1.0, 1.0, 0.5]
    commits, _, _ = simulate(OnBestMetric("loss"), losses)
    assert commits == [0, 1, 3, 5]


def test_on_best_ignores_steps_without_the_metric():
    commits, _, _ = simulate(OnBestMetric("val_loss"), [1.0] * 5,
                             metrics=[{}, {"val_loss": 2.0}, {}, {"val_loss": 3.0}, {"val_loss": 1.0}])
    assert commits == [1, 4]


def intervals(commits):
    return [b - a for a, b in zip(commits, commits[1:])]


def test_adaptive_long_interval_on_a_flat_curve_short_on_a_volatile_one():
    policy = Adaptive(5, 80, flat=0.01, volatile=0.1)
    flat, _, _ = simulate(policy, noisy(400, 0.001))
    volatile, _, _ = simulate(policy, noisy(400, 0.5))
    assert set(intervals(flat)) == {80}
    # five noisy samples sometimes look calmer than the curve is: a step or two more
    assert median(intervals(volatile)) == 5 and max(intervals(volatile)) <= 8


def test_adaptive_follows_the_phases_of_one_curve():
    policy = Adaptive(4, 64)
    curve = noisy(300, 0.4, seed=1) + noisy(600, 0.0005, base=0.2, seed=2) + noisy(300, 0.4, seed=3)
    commits, _, _ = simulate(policy, curve)
    early = intervals([c for c in commits if c < 300])
    middle = intervals([c for c in commits if 400 <= c < 900])
    late = intervals([c for c in commits if c >= 950])
    assert median(early) == 4 and median(late) == 4
    assert max(early) <= 8 and max(late) <= 8
    assert middle and set(middle) == {64}
    assert all(4 <= i <= 64 for i in intervals(commits))


def test_adaptive_interval_lies_between_the_bounds():
    policy = Adaptive(10, 1000, flat=0.01, volatile=0.1)
    assert policy.interval(0.0) == 1000
    assert policy.interval(0.01) == 1000
    assert policy.interval(0.1) == 10
    assert policy.interval(math.sqrt(0.01 * 0.1)) == 100  # geometric midpoint
    middles = [policy.interval(v) for v in np.linspace(0.011, 0.099, 20)]
    assert middles == sorted(middles, reverse=True)
    assert middles[0] > 500 and middles[-1] < 20
    assert all(10 <= m <= 1000 for m in middles)


def test_overhead_budget_alone_commits_as_often_as_five_percent_allows():
    # step 0.1 s, save 0.2 s: 5% allows one save per 0.2 / 0.05 = 4 s, i.e. ~38 steps
    commits, tracker, now = simulate(OverheadBudget(0.05), [1.0] * 2000, step_time=0.1, save_cost=0.2)
    assert tracker.blocked / now <= 0.05
    assert tracker.blocked / now > 0.045  # it does use the budget
    # the first commit is free (its cost is not known yet), then the budget sets the pace
    assert all(35 <= i <= 41 for i in intervals(commits)[1:])


def test_overhead_budget_thins_out_a_policy_that_would_exceed_it():
    every = EveryNSteps(5)
    plain, _, _ = simulate(every, [1.0] * 1000, step_time=0.1, save_cost=0.2)
    gated, tracker, now = simulate(OverheadBudget(0.05, every), [1.0] * 1000, step_time=0.1, save_cost=0.2)
    assert len(plain) == 200
    assert set(gated) < set(plain)
    assert 20 <= len(gated) <= 30
    assert tracker.blocked / now <= 0.05
    cheap, _, _ = simulate(OverheadBudget(0.05, every), [1.0] * 1000, step_time=0.1, save_cost=0.001)
    assert cheap == plain  # within budget, nothing is dropped


def test_any_of_and_step_only():
    both = AnyOf((EveryNSteps(7), EveryNSteps(10)))
    commits, _, _ = simulate(both, [1.0] * 30)
    assert commits == [6, 9, 13, 19, 20, 27, 29]
    assert both.step_only
    assert not AnyOf((EveryNSteps(7), EveryNSeconds(1))).step_only


def test_loss_summary_matches_numpy_and_keeps_a_bounded_curve():
    losses = noisy(1000, 0.3, seed=5)
    summary = LossSummary()
    for loss in losses:
        summary = summary.add(loss)
    assert summary.count == 1000
    assert summary.first == losses[0] and summary.last == losses[-1]
    assert summary.min == min(losses) and summary.max == max(losses)
    assert summary.mean == pytest.approx(np.mean(losses), rel=1e-12)
    assert summary.std == pytest.approx(np.std(losses), rel=1e-9)
    assert 16 < len(summary.curve) <= 32
    assert list(summary.curve) == losses[::summary.stride][:len(summary.curve)]


def test_tracker_resets_the_window_at_each_commit_and_keeps_best_before_the_step():
    tracker = Tracker(start=10.0, step=99)
    obs = tracker.observe(100, 11.0, 2.0, {"loss": 2.0})
    assert (obs.steps_since_commit, obs.seconds_since_commit, obs.elapsed) == (1, 1.0, 1.0)
    assert obs.best_min == {} and obs.save_cost is None
    obs = tracker.observe(101, 12.0, 3.0, {"loss": 3.0})
    assert obs.best_min == {"loss": 2.0} and obs.losses.count == 2
    tracker.committed(101, 12.5, 0.5)
    obs = tracker.observe(102, 13.0, 1.0, {"loss": 1.0})
    assert obs.losses.count == 1 and obs.steps_since_commit == 1
    assert obs.blocked == 0.5 and obs.save_cost == 0.5
    assert obs.best_max == {"loss": 3.0}


def test_non_finite_losses_do_not_poison_the_summary():
    tracker = Tracker(start=0.0)
    tracker.observe(0, 1.0, 1.0)
    obs = tracker.observe(1, 2.0, float("nan"))
    assert obs.losses.count == 1 and obs.losses.mean == 1.0


def test_build_combines_keywords_and_rejects_bad_settings():
    assert build(every_n_steps=5) == EveryNSteps(5)
    assert build() == EveryNSeconds(1800.0)
    combined = build(every_n_steps=5, on_best=("acc", "max"), overhead_budget=0.1)
    assert combined == OverheadBudget(0.1, AnyOf((EveryNSteps(5), OnBestMetric("acc", "max"))))
    assert build(adaptive=(2, 8)) == Adaptive(2, 8)
    for bad in ({"every_n_steps": 0}, {"every_n_seconds": -1}, {"on_best": ("acc", "up")},
                {"adaptive": (10, 5)}, {"overhead_budget": 1.5}, {"every_n_steps": True}):
        with pytest.raises(mvc.BadInput):
            build(**bad)
