"""``mvc diff`` as a user reads it: tensors first, the record summarised, totals that add up."""

import math

import pytest
import torch
from click.testing import CliRunner

from mvc.cli import main

CURVE = [round(2.0 - 0.05 * i, 3) for i in range(25)]


@pytest.fixture
def two(repo):
    torch.manual_seed(0)
    a = {"keep": torch.ones(16), "move": torch.randn(16), "gone": torch.randn(32)}
    b = {"keep": torch.ones(16), "move": a["move"] + 1, "new": torch.zeros(8)}
    context = {f"field{i}": i for i in range(28)}
    repo.commit(a, "a", step=1, context={**context, "loss_curve": CURVE})
    repo.commit(b, "b", step=2, context={**{k: v + 1 for k, v in context.items()}, "loss_curve": CURVE[::-1]})
    return repo


def cli(repo, *args, code=0):
    out = CliRunner().invoke(main, ["-C", str(repo.root), *args])
    assert out.exit_code == code, (out.output, out.stderr)
    return out


def test_tensors_come_first_and_the_context_is_summarised(two):
    lines = cli(two, "diff", "HEAD~1").stdout.splitlines()
    assert lines[1] == "tensors:" and lines.index("record:") > lines.index("tensors:")
    record = lines[lines.index("record:") + 1:-1]
    assert record[:2] == ["  message: 'a' -> 'b'", "  step: 1 -> 2"]
    assert record[2].startswith("  context: 29 fields differ (field0, field1,") and "--context shows them" in record[2]
    assert len(record) == 3
    full = cli(two, "diff", "HEAD~1", "--context").stdout.splitlines()
    curve = next(line for line in full if "context.loss_curve" in line)
    assert "(25 items)" in curve and len(curve) < 120  # a long list is shown by its ends
    assert sum("context." in line for line in full) == 29


def test_stat_totals_count_removed_tensors(two):
    last = cli(two, "diff", "HEAD~1", "--stat").stdout.splitlines()[-1]
    # keep 64 B (unchanged), move 64 B (changed), new 32 B (added), gone 128 B (removed)
    assert "3 of 4 tensors differ (1 changed, 1 added, 1 removed)" in last
    assert "224 B of 288 B in changed chunks (128 B of them removed)" in last
    s = two.diff("HEAD~1").summary
    assert (s.bytes_total, s.bytes_changed, s.bytes_removed) == (288, 224, 128)


def test_only_that_matches_nothing_says_so(two):
    out = cli(two, "diff", "HEAD~1", "--only", "model.*", code=1)
    assert "no key of" in out.stderr and "matches only='model.*'" in out.stderr
    assert out.stderr.count("\n") == 1
    assert "1 of 1 tensors changed" in cli(two, "diff", "HEAD~1", "--only", "mo*").stdout


def test_diff_without_arguments_is_one_line(two):
    out = cli(two, "diff", code=2)
    assert out.stderr.startswith("mvc: error: give a revision to compare") and out.stderr.count("\n") == 1
    assert cli(two, "log", "--no-such-flag", code=2).stderr.count("\n") == 1


def test_a_tensor_that_became_nan_has_a_nan_cosine(repo):
    a = torch.randn(16)
    repo.commit({"w": a})
    repo.commit({"w": torch.full((16,), float("nan"))})
    (t,) = repo.diff("HEAD~1").tensors
    assert math.isnan(t.cosine) and math.isnan(t.relative_change)
    assert "cos nan" in cli(repo, "diff", "HEAD~1").stdout


def _merged_like(moved: float, optimizer: bool, extra: int = 0) -> dict:
    """A model of 4 tensors and, when ``optimizer``, Adam-like state of 16 tensors (as a merge's
    second parent has and the model-only merge has not); ``extra`` more moments of one."""
    state = {"model": {f"layer{i}": torch.full((8,), float(i) + moved) for i in range(4)}}
    if optimizer:
        moments = {i: {"exp_avg": torch.full((8,), float(i) + moved), "exp_avg_sq": torch.ones(8),
                       "step": torch.tensor(float(i)), "max": torch.zeros(2)} for i in range(4)}
        for i in range(extra):
            moments[4 + i] = {"exp_avg": torch.ones(8)}
        state["optimizer"] = {"state": moments}
    return state


def test_stat_says_what_happened_to_the_tensors_that_differ(repo):
    repo.commit(_merged_like(0.0, optimizer=True), "the second parent")
    repo.commit(_merged_like(1.0, optimizer=False), "a model-only merge")
    lines = cli(repo, "diff", "HEAD~1", "HEAD", "--stat").stdout.splitlines()
    assert lines[4] == " optimizer state: 16 tensors removed (304 B removed)"  # 4 x (32 + 32 + 4 + 8)
    assert lines[-1].startswith(" 20 of 20 tensors differ (4 changed, 16 removed), ")
    repo.commit(_merged_like(2.0, optimizer=True, extra=2), "the optimizer back, and two more moments")
    lines = cli(repo, "diff", "HEAD~2", "HEAD", "--stat").stdout.splitlines()
    # 4 changed moments of 32 B and 2 added ones
    assert lines[4].startswith(" optimizer state: 4 tensors changed, 2 added (192 B in changed chunks, ")
    assert lines[-1].startswith(" 10 of 22 tensors differ (8 changed, 2 added), ")
