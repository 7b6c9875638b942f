"""mvc best: "which checkpoint had the best eval loss, and what changed since?" in one command."""

import json

import torch
from click.testing import CliRunner

from mvc.cli import main
from test_best import _run


def cli(repo, *args, code=0):
    out = CliRunner().invoke(main, ["-C", str(repo.root), *[str(a) for a in args]])
    assert out.exit_code == code, (out.output, out.stderr)
    return out


def test_one_command_names_the_best_commit_and_what_changed_since(repo):
    ids = _run(repo)
    lines = cli(repo, "best", "eval_loss").stdout.splitlines()
    assert lines[0] == "best eval_loss: 2.2 (lowest of 5 commits recording it)"
    assert lines[1].split()[:3] == [ids[2][:12], "eval_loss=2.2", "step"]
    assert lines[2] == f"since then: 2 commits to HEAD ({ids[4][:12]})"
    assert lines[3] == "  eval_loss now 2.25 (+0.05 from the best)"
    assert lines[4] == f"diff {ids[2][:12]} -> {ids[4][:12]} (HEAD):"
    assert lines[5].startswith(" model.w |")  # the model first, as 'mvc diff --stat' shows it
    assert lines[6].startswith(" optimizer state: 1 tensor changed")
    assert lines[-1].startswith(" 2 of 3 tensors changed")


def test_it_is_what_log_sort_and_diff_say_together(repo):
    _run(repo)
    first = json.loads(cli(repo, "log", "--sort", "eval_loss", "-n", "1", "--json").stdout)[0]
    answer = json.loads(cli(repo, "best", "eval_loss", "--json").stdout)
    diff = json.loads(cli(repo, "diff", first["id"], "--json").stdout)
    assert answer["commit"]["id"] == first["id"]
    assert answer["diff"]["tensors"] == diff["tensors"] and answer["diff"]["summary"] == diff["summary"]
    assert (answer["since"], answer["apart"], answer["value"], answer["latest_value"]) == (2, 0, 2.2, 2.25)


def test_max_where_rev_and_all(repo):
    ids = _run(repo)
    assert cli(repo, "best", "--max", "acc").stdout.splitlines()[1].split()[0] == ids[3][:12]
    assert cli(repo, "best", "--", "-acc").stdout.splitlines()[1].split()[0] == ids[3][:12]  # as log --sort -acc
    out = cli(repo, "best", "eval_loss", "--where", "step>=300")
    assert out.stdout.splitlines()[2] == f"since then: nothing: HEAD ({ids[4][:12]}) is the best commit"
    assert "diff" not in out.stdout
    assert cli(repo, "best", "eval_loss", "HEAD~3").stdout.splitlines()[1].split()[0] == ids[1][:12]
    side = _run(repo, [1.5], branch="side", start=ids[1])[0]
    out = cli(repo, "best", "eval_loss", "--all").stdout.splitlines()
    assert out[1].split()[0] == side[:12]
    assert out[2] == (f"since then: HEAD ({ids[4][:12]}) is on another line of history: it has 3 commits "
                      "the best lacks, the best has 1 commit it lacks")


def test_lowest_of_a_metric_that_looks_higher_is_better_says_so(repo):
    _run(repo)
    assert "--max takes the highest" in cli(repo, "best", "acc").stderr
    assert cli(repo, "best", "--max", "acc").stderr == ""


def test_errors_are_one_line_and_name_what_exists(repo):
    _run(repo)
    err = cli(repo, "best", "eval_los", code=1).stderr
    assert err == "mvc: error: no commit here records metric 'eval_los'; recorded: acc, eval_loss\n"
    err = cli(repo, "best", "eval_loss", "--where", "eval_loss<1", code=1).stderr
    assert err == "mvc: error: 5 commits record metric 'eval_loss', none with eval_loss<1\n"
    assert "unknown revision 'nope'" in cli(repo, "best", "eval_loss", "nope", code=1).stderr
    assert "Missing argument" in cli(repo, "best", code=2).stderr


def test_help_lists_best_beside_log_and_diff(repo):
    out = cli(repo, "--help").stdout
    group = out.split("Record checkpoints and look at them:")[1].split("\n\n")[0]
    names = [line.split()[0] for line in group.splitlines() if line[2:3].isalpha()]  # not the wrapped lines
    assert names[names.index("diff") + 1] == "best"
    assert "  best      Which checkpoint had the best METRIC, and what changed since.\n" in group


def test_a_repository_without_commits(repo):
    err = cli(repo, "best", "eval_loss", code=1).stderr
    assert "HEAD has no commits" in err
    repo.commit({"w": torch.ones(2)}, "one", metrics={"eval_loss": 1.0}, branch="other")
    out = cli(repo, "best", "eval_loss", "--all").stdout
    assert "since then: HEAD has no commits yet" in out
