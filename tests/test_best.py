"""mvc.best: which checkpoint had the best metric, and what changed since (issue 36)."""

import pytest
import torch

from mvc import history
from mvc.best import best, higher_is_better
from mvc.errors import MetricNotRecorded, NothingQualifies

LOSSES = [3.1, 2.6, 2.2, 2.4, 2.25]


def _state(i: int) -> dict:
    return {"model": {"w": torch.arange(32, dtype=torch.float32) * (1 + i), "frozen": torch.ones(16)},
            "optimizer": {"state": {0: {"step": torch.tensor(float(i))}}}}


def _run(repo, losses=LOSSES, branch=None, start=None) -> list:
    return [repo.commit(_state(i), f"step {100 * i}", step=100 * i, branch=branch, start=start,
                        metrics={"eval_loss": loss, **({"acc": 0.5 + i / 10} if i % 2 else {})}).id
            for i, loss in enumerate(losses)]


def test_the_best_commit_is_the_one_log_sort_puts_first_and_the_diff_runs_to_head(repo):
    ids = _run(repo)
    b = best(repo, "eval_loss")
    assert b.commit.id == ids[2] == history.select(list(repo.log()), sort="eval_loss")[0].id
    assert (b.metric, b.value, b.highest, b.candidates) == ("eval_loss", 2.2, False, 5)
    assert (b.target.id, b.since, b.apart) == (ids[4], 2, 0)
    assert (b.latest.id, b.latest_value) == (ids[4], 2.25)  # HEAD records it: its value is "now"
    assert (b.diff.a.id, b.diff.b.id) == (ids[2], ids[4])
    assert [t.key for t in b.diff.changed()] == ["model.w", "optimizer.state.0.step"]  # model first


def test_highest_is_best_with_a_minus_as_in_log_sort_or_highest(repo):
    ids = _run(repo)
    assert best(repo, "-acc").commit.id == best(repo, "acc", highest=True).commit.id == ids[3]
    assert best(repo, "-acc").highest and best(repo, "acc").commit.id == ids[1]
    assert best(repo, "-acc").candidates == 2  # only the commits that record it


def test_where_picks_the_candidates_and_rev_the_history(repo):
    ids = _run(repo)
    assert best(repo, "eval_loss", where=["step>=300"]).commit.id == ids[4]
    assert best(repo, "eval_loss", where=[history.parse_condition("eval_loss>2.3")]).commit.id == ids[3]
    old = best(repo, "eval_loss", "HEAD~3")  # HEAD~3's history: the first two commits
    assert (old.commit.id, old.target.id, old.since) == (ids[1], ids[1], 0)
    assert old.diff is None  # the best commit is REV itself: nothing changed since


def test_a_metric_no_commit_records_names_those_recorded(repo):
    _run(repo)
    with pytest.raises(MetricNotRecorded) as e:
        best(repo, "eval_los")
    assert (e.value.metric, e.value.recorded) == ("eval_los", ("acc", "eval_loss"))
    with pytest.raises(MetricNotRecorded) as e:  # a condition's metric too
        best(repo, "eval_loss", where=["accuracy>0.5"])
    assert e.value.metric == "accuracy"


def test_conditions_that_leave_no_commit_say_how_many_record_the_metric(repo):
    _run(repo)
    with pytest.raises(NothingQualifies) as e:
        best(repo, "eval_loss", where=["eval_loss<2", "step>=100"])
    assert (e.value.metric, e.value.conditions, e.value.recorded) == ("eval_loss", ("eval_loss<2", "step>=100"), 5)


def test_an_empty_history_is_metric_not_recorded(repo):
    with pytest.raises(MetricNotRecorded) as e:
        best(repo, "eval_loss")
    assert (e.value.metric, e.value.recorded) == ("eval_loss", ())


def test_now_is_the_newest_commit_that_records_the_metric(repo):
    ids = _run(repo)
    head = repo.commit(_state(9), "no eval this time", step=900, metrics={"loss": 1.0}).id
    b = best(repo, "eval_loss")
    assert (b.target.id, b.latest.id, b.latest_value, b.since) == (head, ids[4], 2.25, 3)


def test_all_refs_finds_a_better_commit_on_another_branch(repo):
    ids = _run(repo)
    side = _run(repo, [1.5], branch="side", start=ids[1])[0]
    assert best(repo, "eval_loss").commit.id == ids[2]  # HEAD's history alone
    b = best(repo, "eval_loss", all_refs=True)
    assert (b.commit.id, b.target.id, b.since, b.apart) == (side, ids[4], 3, 1)
    assert (b.diff.a.id, b.diff.b.id) == (side, ids[4])


def test_a_pruned_best_commit_is_named_without_a_diff(repo):
    ids = _run(repo)
    repo.gc(keep_last=1)  # prunes every commit but the tip: their tensors go
    b = best(repo, "eval_loss")
    assert b.commit.id == ids[2] and b.commit.pruned and b.diff is None


@pytest.mark.parametrize("name,higher", [("acc", True), ("val/f1", True), ("mAP50", True), ("reward", True),
                                         ("eval_loss", False), ("mape", False), ("perplexity", False)])
def test_which_way_a_metric_name_looks_better(name, higher):
    assert higher_is_better(name) is higher


def test_among_equal_values_the_commit_that_reached_it_first_is_best(repo):
    """Lightning's save_last copy of a top-k save records the same metrics one commit later."""
    ids = _run(repo, losses=[3.0, 2.0, 2.0, 2.5])
    assert best(repo, "eval_loss").commit.id == ids[1]
    assert [c.id for c in history.select(list(repo.log()), sort="eval_loss")] == [ids[1], ids[2], ids[3], ids[0]]
    assert [c.id for c in history.select(list(repo.log()), sort="-eval_loss")] == [ids[0], ids[3], ids[1], ids[2]]
