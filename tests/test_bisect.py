"""mvc.bisect: finding a planted regression through the API, the CLI, real
evaluation processes and recorded metrics; bad input leaves the state intact."""

import json
import sys

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc import bisect
from mvc.cli import main
from mvc.errors import MetricNotRecorded
from conftest import run_cli as cli

N = 64
REGRESSION = 37  # the first bad step


def weights(step: int, first_bad: int = REGRESSION) -> torch.Tensor:
    base = 1.0 if step < first_bad else 5.0
    return torch.full((8,), base) + step * 1e-3


def make_history(repo, first_bad: int = REGRESSION, branch=None):
    for step in range(N):
        w = weights(step, first_bad)
        loss = float(((w - 1) ** 2).mean())
        repo.commit({"model": {"w": w}, "opt": {"lr": 0.1}}, f"commit {step}", step=step,
                    metrics={"loss": loss, "acc": 1.0 - min(loss, 1.0)}, branch=branch)
    return repo


@pytest.fixture
def history(repo):
    return make_history(repo)


def loss_of(state) -> float:
    return float(((state["model"]["w"] - 1) ** 2).mean())




def state_bytes(repo) -> bytes:
    return (repo.dir / bisect.STATE_FILE).read_bytes()


# -- the Python API ------------------------------------------------------------------

@pytest.mark.parametrize("first_bad", [1, 2, REGRESSION, N - 2, N - 1])
def test_api_finds_planted_regression_in_at_most_7_evaluations(repo, first_bad):
    make_history(repo, first_bad)
    calls = []

    def is_good(state):
        calls.append(1)
        return loss_of(state) < 0.5
    result = repo.bisect.find("HEAD~63", "HEAD", is_good)
    assert result.first_bad.step == first_bad
    assert result.first_bad.message == f"commit {first_bad}"
    assert len(calls) == result.evaluations <= 7
    assert result.changes.a.step == first_bad - 1
    assert result.changes.summary.tensors_changed == 1
    assert not (repo.dir / bisect.STATE_FILE).exists()  # the callable form keeps no state on disk


@pytest.mark.parametrize("skips", [(31,), (31, 47, 39), (30, 31, 32)])
def test_api_with_skips(history, skips):
    calls = []

    def is_good(state):
        step = int(round(float(state["model"]["w"][0] % 1) * 1000))
        calls.append(step)
        if step in skips:  # these commits cannot be judged
            return None
        return torch.tensor(loss_of(state) < 0.5)  # a bool tensor counts as True/False
    result = history.bisect.find("HEAD~63", "HEAD", is_good)
    assert result.first_bad.step == REGRESSION
    assert len(calls) == result.evaluations
    assert len([s for s in calls if s not in skips]) <= 7  # real verdicts
    if len(skips) == 1:
        assert len(calls) <= 7  # one skip costs no extra evaluation here


def test_api_skips_can_leave_suspects(history):
    def is_good(state):
        step = int(round(float(state["model"]["w"][0] % 1) * 1000))
        return None if step == REGRESSION - 1 else loss_of(state) < 0.5
    result = history.bisect.find("HEAD~63", "HEAD", is_good)
    assert result.first_bad is None and result.done
    steps = [history.get_commit(c).step for c in result.suspects]
    assert steps == [REGRESSION - 1, REGRESSION]


def test_api_rejects_other_answers(history):
    with pytest.raises(mvc.errors.BadVerdict) as err:
        history.bisect.find("HEAD~63", "HEAD", lambda state: "yes")
    assert err.value.verdict == "yes" and err.value.id is not None


def test_start_mark_log_reset(history):
    status = bisect.start(history, "HEAD", "HEAD~63")
    assert (status.remaining, status.steps) == (62, 6)
    judged = 0
    while not status.done:
        status = bisect.mark(history, "good" if status.candidate.step < REGRESSION else "bad")
        judged += 1
    assert status.first_bad.step == REGRESSION and judged <= 7
    log = bisect.log(history)
    assert [e.verdict for e in log.entries[:2]] == ["bad", "good"]
    assert [e.step for e in log.entries[:2]] == [N - 1, 0]
    assert len(log.entries) == 2 + judged
    assert bisect.reset(history).first_bad.step == REGRESSION
    assert not bisect.in_progress(history)
    assert bisect.reset(history) is None


def test_branch_option_and_side_branches(history):
    history.create_branch("side", "HEAD~50")  # forks at step 13
    for i in range(3):
        history.commit({"model": {"w": weights(100 + i)}}, f"side {i}", step=100 + i, branch="side")
    status = bisect.start(history, "side", "main~60", branch="side")
    assert status.branch == "side" and status.remaining == 12  # steps 4..13 and side 0..1
    bisect.reset(history)
    with pytest.raises(mvc.errors.BadRange) as err:
        bisect.start(history, "main", "main~60", branch="side")
    assert (err.value.problem, err.value.branch, err.value.bad) == ("not-on-branch", "side", history.resolve("main"))
    with pytest.raises(mvc.errors.BadRange) as err:
        bisect.start(history, "side", "main~10")
    assert (err.value.problem, err.value.good) == ("not-descendant", history.resolve("main~10"))
    assert not bisect.in_progress(history)


# -- the CLI ---------------------------------------------------------------------------

def test_cli_manual_bisect_across_processes(history):
    out = cli(history, "bisect", "start", "HEAD", "HEAD~63", "--json")
    assert out.exit_code == 0, out.output
    status = json.loads(out.stdout)
    judged = 0
    while status["candidate"] is not None:
        verdict = "good" if status["candidate"]["step"] < REGRESSION else "bad"
        out = cli(history, "bisect", verdict, "--json")
        assert out.exit_code == 0, out.output
        status = json.loads(out.stdout)
        judged += 1
    assert status["first_bad"]["step"] == REGRESSION and judged <= 7
    text = cli(history, "bisect", "log")
    assert text.exit_code == 0
    assert text.output.startswith("# bad: ") and f"first bad commit: {status['first_bad']['id']}" in text.output
    assert "metrics.loss" in text.output  # the diff against its parent shows the record change
    assert cli(history, "bisect", "reset").exit_code == 0


EVAL_PT = """
import os, sys, torch
path = os.environ["MVC_CHECKPOINT"]
assert sys.argv[1] == path, (sys.argv, path)
with open(sys.argv[2], "a") as log:
    log.write(os.environ["MVC_COMMIT"] + "\\n")
state = torch.load(path, weights_only=True)
loss = float(((state["model"]["w"] - 1) ** 2).mean())
sys.exit(0 if loss < 0.5 else 1)
"""

EVAL_SAFETENSORS = """
import os, sys
from safetensors.numpy import load_file
w = load_file(os.environ["MVC_CHECKPOINT"])["model.w"]
sys.exit(0 if float(((w - 1) ** 2).mean()) < 0.5 else 3)
"""


def test_cli_run_with_a_real_evaluation_script(history, tmp_path):
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_PT)
    calls = tmp_path / "calls.txt"
    assert cli(history, "bisect", "start", "HEAD", "HEAD~63").exit_code == 0
    out = cli(history, "bisect", "run", sys.executable, str(script), "{}", str(calls))
    assert out.exit_code == 0, out.output
    first_bad = history.resolve(f"HEAD~{N - 1 - REGRESSION}")
    assert f"first bad commit: {first_bad}" in out.output
    assert "step 37" in out.output and "commit 37" in out.output
    assert "1 of 1 tensors changed" in out.output
    evaluated = calls.read_text().split()
    # the good and the bad end are checked first, then at most 7 candidates
    assert evaluated[:2] == [history.resolve("HEAD~63"), history.resolve("HEAD")]
    assert 3 <= len(evaluated) <= 9 and first_bad in evaluated[2:]
    assert not list((history.dir / "tmp").glob("bisect-*"))  # checkpoints are cleaned up


def test_an_evaluation_that_removes_its_checkpoint_keeps_its_verdict(history, tmp_path):
    """The script deleted (or moved) $MVC_CHECKPOINT and exited 0: mvc's own cleanup raised
    FileNotFoundError over the verdict, and the bisect stopped with a misleading error."""
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_PT.replace("sys.exit(", "os.unlink(path)\nsys.exit("))
    calls = tmp_path / "calls.txt"
    cli(history, "bisect", "start", "HEAD", "HEAD~63")
    out = cli(history, "bisect", "run", sys.executable, str(script), "{}", str(calls))
    assert out.exit_code == 0, out.output
    assert f"first bad commit: {history.resolve(f'HEAD~{N - 1 - REGRESSION}')}" in out.output


def test_cli_run_safetensors(history, tmp_path):
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_SAFETENSORS)
    cli(history, "bisect", "start", "HEAD", "HEAD~63")
    out = cli(history, "bisect", "run", "--format", "safetensors", "--json", sys.executable, str(script))
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["first_bad"]["step"] == REGRESSION and result["evaluations"] <= 7


@pytest.mark.parametrize("args", [("--metric", "loss", "--threshold", "0.5", "--higher-is-worse"),
                                   ("--metric", "acc", "--threshold", "0.5")])
def test_cli_run_by_recorded_metric(history, args):
    cli(history, "bisect", "start", "HEAD", "HEAD~63")
    out = cli(history, "bisect", "run", *args, "--json")
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["first_bad"]["step"] == REGRESSION and result["evaluations"] <= 7


LOSSES = (0.81, 0.62, 0.47, 0.36, 0.29, 0.22, 0.18, 0.153)  # a run that learns: every step better


def falling_loss(repo, losses=LOSSES):
    for step, loss in enumerate(losses):
        repo.commit({"w": torch.full((4,), loss)}, f"step {step}", step=step, metrics={"loss": loss})
    return repo


@pytest.mark.parametrize("threshold, end, value", [(0.3, "good", 0.81), (0.9, "bad", 0.153)])
def test_run_by_metric_checks_both_ends_first(repo, threshold, end, value):
    """``bisect start HEAD HEAD~7`` on a falling loss: the metric mode judged only the commits
    between, so a good end the rule calls bad (0.81 > 0.3) or a bad end it calls good (0.153 <
    0.9) still named a "first bad commit", with no warning. Both ends are judged first, as the
    command mode runs its command on them."""
    falling_loss(repo)
    bisect.start(repo, "HEAD", "HEAD~7")
    before = state_bytes(repo)
    with pytest.raises(mvc.errors.BisectEndMisjudged) as err:
        bisect.run_metric(repo, "loss", threshold, higher_is_worse=True)
    e = err.value
    assert (e.expected, e.verdict, e.metric, e.value) == (end, "good" if end == "bad" else "bad", "loss", value)
    assert e.id == repo.resolve("HEAD~7" if end == "good" else "HEAD")
    assert state_bytes(repo) == before  # no verdict recorded
    out = cli(repo, "bisect", "run", "--metric", "loss", "--threshold", threshold, "--higher-is-worse")
    one_line_error(out, f"the {end} end", f"loss {value}", "no verdict was recorded", "--threshold")
    assert "first bad commit:" not in out.output and state_bytes(repo) == before


def test_run_by_metric_with_ends_that_fit_the_rule(repo):
    falling_loss(repo, LOSSES[::-1])  # a loss that rises: the regression at the first step above 0.3
    bisect.start(repo, "HEAD", "HEAD~7")
    assert bisect.run_metric(repo, "loss", 0.3, higher_is_worse=True).first_bad.step == 4


def test_metric_missing_everywhere_is_an_error(history):
    bisect.start(history, "HEAD", "HEAD~63")
    before = state_bytes(history)
    with pytest.raises(MetricNotRecorded) as err:
        bisect.run_metric(history, "bleu", 1.0)
    assert (err.value.metric, err.value.recorded) == ("bleu", ("acc", "loss"))
    assert state_bytes(history) == before


# -- bad input ----------------------------------------------------------------------------

def one_line_error(out, *needles):
    """Exit 1 with one error line last on stderr (progress lines may come before it)."""
    assert out.exit_code == 1, out.output
    lines = out.stderr.splitlines()
    assert lines[-1].startswith("mvc: error: ") and out.stderr.count("mvc: error") == 1, out.output
    assert "Traceback" not in out.output and out.stdout == ""
    for needle in needles:
        assert needle in lines[-1], out.output


def test_commands_without_a_bisect(history):
    for args in (["good"], ["bad", "HEAD"], ["skip"], ["log"], ["run", "true"],
                 ["run", "--metric", "loss", "--threshold", "1"]):
        one_line_error(cli(history, "bisect", *args), "no bisect in progress", "mvc bisect start")
    out = cli(history, "bisect", "reset")
    assert out.exit_code == 0 and "no bisect in progress" in out.output


def test_bad_start_arguments(history):
    one_line_error(cli(history, "bisect", "start", "HEAD", "nope"), "unknown revision 'nope'")
    one_line_error(cli(history, "bisect", "start", "HEAD~63", "HEAD"), "not a descendant", "swapped")
    one_line_error(cli(history, "bisect", "start", "HEAD", "HEAD"), "same commit")
    assert not bisect.in_progress(history)
    assert cli(history, "bisect", "start", "HEAD", "HEAD~63").exit_code == 0
    one_line_error(cli(history, "bisect", "start", "HEAD", "HEAD~63"), "already in progress", "reset")


def test_bad_verdicts_leave_the_state_unchanged(history):
    cli(history, "bisect", "start", "HEAD~10", "HEAD~60")
    cli(history, "bisect", "good", "HEAD~40")
    before = state_bytes(history)
    one_line_error(cli(history, "bisect", "bad", "HEAD~50"), "cannot be bad", "not newer than")
    one_line_error(cli(history, "bisect", "good", "HEAD~5"), "is not between")
    one_line_error(cli(history, "bisect", "good", "HEAD~10"), "cannot be good")
    one_line_error(cli(history, "bisect", "skip", "no-such"), "unknown revision")
    assert state_bytes(history) == before
    assert cli(history, "bisect", "log").exit_code == 0


def test_missing_command_and_aborts_keep_the_state(history, tmp_path):
    cli(history, "bisect", "start", "HEAD", "HEAD~63")
    before = state_bytes(history)
    one_line_error(cli(history, "bisect", "run", "no-such-evaluator-xyz", "{}"), "not found on PATH")
    one_line_error(cli(history, "bisect", "run", str(tmp_path / "missing.sh")), "does not exist")
    assert state_bytes(history) == before
    for code, message in (("130", "exited with 130"), ("os.kill(os.getpid(), 9)", "killed by SIGKILL")):
        script = tmp_path / "abort.py"
        script.write_text(f"import os, sys\nsys.exit({code})\n" if code.isdigit() else f"import os\n{code}\n")
        one_line_error(cli(history, "bisect", "run", sys.executable, str(script)), message,
                       "no verdict was recorded")
        assert state_bytes(history) == before
        one_line_error(cli(history, "bisect", "run", "--no-check-ends", sys.executable, str(script)), message,
                       "bisect stopped")
        assert state_bytes(history) == before


def test_abort_midway_keeps_earlier_verdicts_and_can_resume(history, tmp_path):
    counter = tmp_path / "n"
    script = tmp_path / "flaky.py"
    script.write_text(f"import pathlib, sys\np = pathlib.Path({str(counter)!r})\n"
                      "n = int(p.read_text()) if p.exists() else 0\np.write_text(str(n + 1))\n"
                      "sys.exit(0 if n == 0 else 255)\n")
    cli(history, "bisect", "start", "HEAD", "HEAD~63")
    one_line_error(cli(history, "bisect", "run", "--no-check-ends", sys.executable, str(script)), "exited with 255")
    log = bisect.log(history)
    assert [e.verdict for e in log.entries] == ["bad", "good", "good"]  # the first verdict is kept
    out = cli(history, "bisect", "run", "--metric", "loss", "--threshold", "0.5", "--higher-is-worse", "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["first_bad"]["step"] == REGRESSION


def test_damaged_state_is_reported_and_reset_clears_it(history):
    bisect.start(history, "HEAD", "HEAD~63")
    (history.dir / bisect.STATE_FILE).write_bytes(b"\x93garbage")
    one_line_error(cli(history, "bisect", "log"), "damaged", "mvc bisect reset")
    assert cli(history, "bisect", "reset").exit_code == 0
    assert not bisect.in_progress(history)


def test_run_usage_errors(history):
    cli(history, "bisect", "start", "HEAD", "HEAD~63")
    for args in (["--metric", "loss"], ["--metric", "loss", "--threshold", "1", "true"],
                 ["--threshold", "1", "true"], []):
        assert cli(history, "bisect", "run", *args).exit_code == 2


# -- commits pruned by gc retention -------------------------------------------------------

def pruned_history(repo, n: int, first_bad: int, kept=()):
    """Steps 0..n-1; gc keeps the tip and the steps in ``kept`` (tagged), and prunes the rest."""
    for step in range(n):
        w = weights(step, first_bad)
        repo.commit({"model": {"w": w}}, f"commit {step}", step=step, metrics={"loss": float(((w - 1) ** 2).mean())})
    for step in kept:
        repo.create_tag(f"keep-{step}", f"HEAD~{n - 1 - step}")
    repo.gc(keep_last=1)
    pruned = [c.step for c in repo.log() if c.pruned]
    assert sorted(pruned) == [s for s in range(n - 1) if s not in kept]
    return repo


def step_of(repo, step: int) -> str:
    return next(c.id for c in repo.log() if c.step == step)


def test_cli_pruned_commits_are_never_offered_and_a_pruned_first_bad_has_no_diff(repo):
    pruned_history(repo, 5, first_bad=3)  # steps 0..3 pruned
    out = cli(repo, "bisect", "start", "HEAD", "HEAD~2", "--json")
    assert out.exit_code == 0, out.output
    status = json.loads(out.stdout)
    assert status["candidate"] is None  # step 3, the only commit between, cannot be loaded
    assert status["suspects"] == [step_of(repo, 3), step_of(repo, 4)]
    out = cli(repo, "bisect", "bad", "HEAD~1", "--json")  # judged some other way: a verdict is allowed
    assert out.exit_code == 0, out.output
    status = json.loads(out.stdout)
    assert status["first_bad"]["step"] == 3 and status["changes"] is None
    assert "was pruned by gc" in status["changes_note"]
    out = cli(repo, "bisect", "log")
    assert out.exit_code == 0, out.output
    assert f"first bad commit: {step_of(repo, 3)}" in out.output


def test_run_skips_pruned_commits_and_logs_them(repo, tmp_path):
    pruned_history(repo, 9, first_bad=3, kept=(2, 3, 6))  # steps 0, 1, 4, 5, 7 pruned
    script = tmp_path / "evaluate.py"
    script.write_text(EVAL_PT)
    calls = tmp_path / "calls.txt"
    assert cli(repo, "bisect", "start", "HEAD", "HEAD~8").exit_code == 0
    out = cli(repo, "bisect", "run", sys.executable, str(script), "{}", str(calls))
    assert out.exit_code == 0, out.output
    assert f"first bad commit: {step_of(repo, 3)}" in out.output and "1 of 1 tensors changed" in out.output
    # the bad end (step 8) is checked first; the good end (step 0) is pruned and cannot be
    assert sorted(calls.read_text().split()) == sorted([step_of(repo, 8), step_of(repo, 2), step_of(repo, 3)])
    log = bisect.log(repo)
    auto = [e for e in log.entries if e.note]
    assert [(e.verdict, e.step) for e in auto] == [("skip", 1), ("skip", 4), ("skip", 5), ("skip", 7)]
    assert all("pruned by gc" in e.note for e in auto)
    assert [e.verdict for e in log.entries if not e.note] == ["bad", "good", "bad", "good"]


def test_api_bisect_never_loads_pruned_commits(repo):
    pruned_history(repo, 9, first_bad=3, kept=(2, 3, 6))
    result = repo.bisect.find("HEAD~8", "HEAD", lambda state: loss_of(state) < 0.5)
    assert result.first_bad.step == 3 and result.evaluations == 2
    assert result.changes.a.step == 2


def test_metrics_still_judge_pruned_commits(repo):
    pruned_history(repo, 9, first_bad=5, kept=(2, 3, 6))  # the first bad step 5 and its parent are pruned
    bisect.start(repo, "HEAD", "HEAD~8")
    judged = []
    result = bisect.run_metric(repo, "loss", 0.5, higher_is_worse=True,
                               progress=lambda c, verdict: judged.append((c.step, c.pruned)))
    assert result.first_bad.step == 5 and result.first_bad.pruned
    assert result.changes is None and "was pruned by gc" in result.changes_note
    assert any(pruned for _, pruned in judged)
    assert bisect.status(repo).first_bad.step == 5  # the pruned verdicts stand for later commands


def test_json_output_stays_clean_when_the_evaluation_prints(tmp_path):
    import subprocess
    repo = mvc.Repository.init(tmp_path, chunk_size=64)
    for i in range(4):
        repo.commit({"w": torch.full((4,), float(i))}, f"c{i}", step=i)
    repo.close()
    script = tmp_path / "noisy.py"
    script.write_text("print('evaluating', flush=True)\nraise SystemExit(1)\n")
    mvc_cmd = [sys.executable, "-m", "mvc", "-C", str(tmp_path)]
    subprocess.run(mvc_cmd + ["bisect", "start", "HEAD", "HEAD~3"], check=True, capture_output=True)
    proc = subprocess.run(mvc_cmd + ["bisect", "run", "--json", "--no-check-ends", sys.executable, str(script)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["first_bad"]["message"] == "c1"
    assert "evaluating" in proc.stderr


BROKEN_EVAL = "import no_such_evaluation_module_xyz\n"


def test_run_checks_both_ends_first_and_stops_on_a_broken_command(history, tmp_path):
    cli(history, "bisect", "start", "HEAD", "HEAD~63")
    before = state_bytes(history)
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_EVAL)  # every run raises ImportError: exit 1, "bad"
    out = cli(history, "bisect", "run", sys.executable, str(script))
    one_line_error(out, "the good end", "exited with 1 (bad)")
    assert "no verdict was recorded" in out.stderr and "first bad commit:" not in out.output
    assert state_bytes(history) == before
    always_good = tmp_path / "good.py"
    always_good.write_text("raise SystemExit(0)\n")
    one_line_error(cli(history, "bisect", "run", sys.executable, str(always_good)), "the bad end", "(good)")
    assert state_bytes(history) == before


def test_the_first_bad_commits_record_is_shortened_as_diff_shortens_it(repo):
    """``bisect run`` printed each record field that changed against the parent in full (a loss
    curve of every step, whole optimizer param_groups); it shortens them as ``mvc diff
    --context`` does: long lists by their ends, long values cut."""
    curve = []
    for step, loss in enumerate(LOSSES[::-1]):
        curve += [round(loss + i * 1e-3, 4) for i in range(40)]
        groups = [{"lr": 1e-3 * (step + 1), "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
                   "amsgrad": False, "params": list(range(12))}]
        repo.commit({"w": torch.full((4,), loss)}, f"step {step}", step=step, metrics={"loss": loss},
                    context={"loss": {"curve": list(curve)}, "param_groups": groups})
    cli(repo, "bisect", "start", "HEAD", "HEAD~7")
    out = cli(repo, "bisect", "run", "--metric", "loss", "--threshold", "0.3", "--higher-is-worse")
    assert out.exit_code == 0, out.output
    report = out.stdout[out.stdout.index("against its parent"):].splitlines()
    curve_line = next(line for line in report if "context.loss.curve:" in line)
    assert curve_line.count("(200 items)") == 1 and curve_line.count("(160 items)") == 1
    groups_line = next(line for line in report if "context.param_groups:" in line)
    assert "characters)" in groups_line
    assert max(map(len, report)) < 250, report
