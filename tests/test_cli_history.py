"""History views as in Git: log --all/--graph, A..B, reflog and REF@{N}, branch -m, checkout -b, forks."""

import json

import pytest
import torch

import mvc
from conftest import run_cli


@pytest.fixture
def cli(cli, tmp_path):
    """The shared cli fixture, with five small checkpoint files to commit."""
    for i in range(5):
        torch.save({"w": torch.full((4,), float(i))}, tmp_path / f"s{i}.pt")
    return cli


def messages(cli, *args):
    return [c["message"] for c in json.loads(cli("log", "--json", *args).stdout)]


@pytest.fixture
def forked(cli):
    """main: c0 - c1 - c2; exp forks at c1: e1 - e2."""
    cli("commit", "s0.pt", "-m", "c0")
    cli("commit", "s1.pt", "-m", "c1")
    assert "Switched to a new branch 'exp'" in cli("checkout", "-b", "exp").stdout
    cli("commit", "s2.pt", "-m", "e1")
    cli("commit", "s3.pt", "-m", "e2")
    cli("checkout", "main")
    cli("commit", "s4.pt", "-m", "c2")
    return cli


def test_log_all_graph_and_ranges(forked):
    assert messages(forked) == ["c2", "c1", "c0"]
    assert messages(forked, "--all") == ["c2", "e2", "e1", "c1", "c0"]
    lines = forked("log", "--all", "--graph", "--oneline").stdout.splitlines()
    expected = [("* ", "c2"), ("| * ", "e2"), ("| * ", "e1"), ("|/", ""), ("* ", "c1"), ("* ", "c0")]  # as Git
    assert len(lines) == len(expected)
    for line, (graph, message) in zip(lines, expected):
        assert line.startswith(graph) and line.endswith(message), (line, lines)
    full = forked("log", "--all", "--graph").stdout.splitlines()
    assert full[0].startswith("* commit ") and full[1].startswith("| Author:")
    assert messages(forked, "main..exp") == ["e2", "e1"]
    assert messages(forked, "exp..main") == ["c2"]
    assert messages(forked, "exp..") == ["c2"]  # an empty side is HEAD
    assert messages(forked, "main", "exp") == ["c2", "e2", "e1", "c1", "c0"]
    assert messages(forked, "--all", "-n", "2") == ["c2", "e2"]
    assert "1 of 1 tensors changed" in forked("diff", "exp..main", "--stat").stdout  # git diff A..B is A B


@pytest.fixture
def octopus(repo, monkeypatch):
    """main: A - main work - octo, where octo = mvc merge f1 f2 and f1, f2 each fork at A
    with one commit; one second between commits, so the order is fixed."""
    from mvc import commits
    clock = iter(range(10**15, 2 * 10**15, 10**6))
    monkeypatch.setattr(commits, "now_us", lambda: next(clock))
    ids = {"A": repo.commit({"w": torch.zeros(4)}, "A").id}
    ids["f1"] = repo.commit({"w": torch.ones(4)}, "f1 work", branch="f1", start="HEAD").id
    ids["f2"] = repo.commit({"w": torch.full((4,), 2.0)}, "f2 work", branch="f2", start="HEAD").id
    ids["main"] = repo.commit({"w": torch.full((4,), 3.0)}, "main work").id
    result = run_cli(repo, "merge", "f1", "f2", "-m", "octo")
    assert result.exit_code == 0, result.output
    ids["octo"] = repo.resolve("main")
    return repo, {k: v[:12] for k, v in ids.items()}


def test_log_graph_draws_an_octopus_merge_as_git(octopus):
    """What git log --graph --date-order draws for this history: f2's line crosses f1's to
    reach A (it drew "| |/" alone, joining f2 to f1), and a log of main follows every parent
    of the merge to A (without --all its lines ran on past the end)."""
    repo, c = octopus
    expected = [f"*-.   {c['octo']} (HEAD -> main) octo",
                "|\\ \\",
                f"* | | {c['main']} main work",
                f"| | * {c['f2']} (f2) f2 work",
                "| |/",
                "|/|",
                f"| * {c['f1']} (f1) f1 work",
                "|/",
                f"* {c['A']} A"]
    for args in ((), ("--all",), ("main",)):
        assert run_cli(repo, "log", "--graph", "--oneline", *args).stdout.splitlines() == expected, args
    full = run_cli(repo, "log", "--graph").stdout.splitlines()
    assert full[:3] == [f"*-.   commit {repo.resolve('main')} (HEAD -> main)",
                        f"|\\ \\  Merge:  {c['main']} {c['f1']} {c['f2']}",
                        "| | | Author: " + full[2].split("Author: ")[1]]
    at = full.index(next(line for line in full if f"commit {c['f2']}" in line))
    assert [line[:6] for line in full[at:at + 3]] == ["| | * ", "| |/  ", "|/|   "]
    assert full[at + 1][6:].startswith("Author: ") and full[-1] == "      A"
    # a range draws no line to a parent it leaves out
    assert run_cli(repo, "log", "--graph", "--oneline", f"{c['A']}..main").stdout.splitlines() == [
        f"*-.   {c['octo']} (HEAD -> main) octo", "|\\ \\", f"* | | {c['main']} main work",
        " / /", f"| * {c['f2']} (f2) f2 work", f"* {c['f1']} (f1) f1 work"]  # as Git


def test_reflog_and_at_revisions(forked):
    lines = forked("reflog").stdout.splitlines()
    assert lines[0].endswith("HEAD@{0}: commit: c2") and lines[1].endswith("HEAD@{1}: checkout: main")
    assert lines[2].endswith("HEAD@{2}: commit: e2")
    ids = {c["message"]: c["id"] for c in json.loads(forked("log", "--all", "--json").stdout)}
    with mvc.Repository.open(".") as repo:
        assert repo.resolve("HEAD@{0}") == ids["c2"] and repo.resolve("HEAD@{2}") == ids["e2"]
        assert repo.resolve("HEAD@{2}~1") == ids["e1"]
        assert repo.resolve("exp@{1}") == ids["e1"] and repo.resolve("main@{1}") == ids["c1"]
    assert "HEAD@{3}" in forked("reflog", "-n", "4").stdout and "HEAD@{4}" not in forked("reflog", "-n", "4").stdout
    assert forked("reflog", "exp").stdout.splitlines()[0].endswith("exp@{0}: commit: e2")
    err = forked("show", "HEAD@{40}", code=1).stderr
    assert "the reflog of HEAD has only" in err and err.count("\n") == 1
    assert "no branch or tag 'nope'" in forked("show", "nope@{1}", code=1).stderr


def test_branch_rename_keeps_protection_reflog_and_head(forked):
    forked("branch", "--protect", "exp")
    assert "protected" in forked("branch", "-m", "exp", "feature", code=1).stderr
    forked("branch", "-m", "exp", "feature", "--force")
    listing = forked("branch", "--json").stdout
    names = {b["name"]: b for b in json.loads(listing)}
    assert "exp" not in names and names["feature"]["protected"]
    assert forked("reflog", "feature").stdout.splitlines()[0].endswith("renamed exp to feature")
    assert "feature@{1}: commit: e2" in forked("reflog", "feature").stdout  # its history came along
    forked("branch", "-m", "main", "trunk")
    assert json.loads(forked("status", "--json").stdout)["head"]["branch"] == "trunk"
    assert "already exists" in forked("branch", "-m", "trunk", "feature", code=1).stderr
    assert "mvc branch -m OLD NEW" in forked("branch", "-m", "trunk", code=2).stderr


def test_checkout_b_and_commit_branch_fork_from_head(forked):
    err = forked("checkout", "-b", "exp", code=1).stderr
    assert "already exists" in err and "'mvc checkout exp'" in err
    forked("checkout", "-b", "old", "HEAD~2")
    assert messages(forked) == ["c0"]
    forked("checkout", "main")
    out = forked("commit", "s0.pt", "--branch", "tuning", "-m", "t1").stdout
    assert "(root-commit)" not in out
    assert messages(forked, "tuning") == ["t1", "c2", "c1", "c0"]  # forked from HEAD, like git checkout -b
    assert json.loads(forked("status", "--json").stdout)["head"]["branch"] == "main"  # HEAD stays
    out = forked("commit", "s0.pt", "--branch", "fresh", "--orphan", "-m", "r").stdout
    assert "(root-commit)" in out and messages(forked, "fresh") == ["r"]
    assert "--orphan" in forked("commit", "s0.pt", "--orphan", code=2).stderr
    with mvc.Repository.open(".") as repo:  # the API's default is unchanged: a new branch starts a root
        assert repo.commit({"x": torch.ones(1)}, "api", branch="api-run").parents == ()


def test_leaving_a_detached_commit_warns(forked):
    forked("checkout", "HEAD~1")
    forked("commit", "s3.pt", "-m", "lost work")
    out = forked("checkout", "main")
    assert "Warning: you are leaving 1 commit behind" in out.stderr and "lost work" in out.stderr
    assert "mvc branch NEW" in out.stderr
    lost = out.stderr.split("mvc branch NEW ")[1].split()[0]
    assert "lost work" in forked("show", lost).stdout  # the reflog keeps it, so gc does too
    forked("checkout", "HEAD~1")
    assert "Warning" not in forked("checkout", "exp").stderr  # nothing new was left behind
