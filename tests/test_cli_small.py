"""Small things a new user meets: status during a bisect, one step per log line, whole-word errors."""

import json

import torch
from click.testing import CliRunner

from mvc import bisect
from mvc.cli import main


def cli(repo, *args, code=0):
    out = CliRunner().invoke(main, ["-C", str(repo.root), *args])
    assert out.exit_code == code, (out.output, out.stderr)
    return out


def test_status_says_a_bisect_is_in_progress(repo):
    for i in range(5):
        repo.commit({"w": torch.full((4,), float(i))}, f"step {i}", step=i)
    assert "bisecting" not in cli(repo, "status").stdout
    bisect.start(repo, "HEAD", "HEAD~4")
    out = cli(repo, "status").stdout
    assert "You are bisecting (good" in out and "left to judge" in out and "'mvc bisect reset'" in out
    data = json.loads(cli(repo, "status", "--json").stdout)["bisect"]
    assert data["bad"] == repo.resolve("HEAD") and data["good"] == repo.resolve("HEAD~4") and data["remaining"] == 3
    bisect.reset(repo)
    assert json.loads(cli(repo, "status", "--json").stdout)["bisect"] is None


def test_log_oneline_shows_the_step_once(repo):
    repo.commit({"w": torch.ones(2)}, "step 500", step=500, metrics={"loss": 1.5})  # the Checkpointer's message
    repo.commit({"w": torch.zeros(2)}, "tuned", step=600)
    lines = cli(repo, "log", "--oneline").stdout.splitlines()
    assert lines[1].count("step 500") == 1 and "loss=1.5" in lines[1]
    assert "step 600" in lines[0] and lines[0].endswith("tuned")


def test_unreadable_files_are_described_in_whole_words(repo, tmp_path):
    torch.save({"a": torch.randn(100)}, tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[:len(data) // 2])
    (tmp_path / "empty.pt").write_bytes(b"")
    cut = cli(repo, "commit", str(tmp_path / "cut.pt"), code=1).stderr
    assert cut.rstrip().endswith("failed finding central directory)"), cut
    empty = cli(repo, "commit", str(tmp_path / "empty.pt"), code=1).stderr
    assert "(EOFError: the file ends early)" in empty and "EOFError: )" not in empty


def test_a_metric_that_is_not_a_number_is_bad_usage(repo, tmp_path):
    """--metric loss=abc exited 1 (a library error) while every other bad usage exits 2."""
    torch.save({"w": torch.zeros(2)}, tmp_path / "m.pt")
    out = cli(repo, "commit", str(tmp_path / "m.pt"), "--metric", "loss=abc", code=2)
    assert "--metric" in out.stderr and "loss='abc' is not a number" in out.stderr
    assert repo.head().id is None  # nothing was committed
    cli(repo, "commit", str(tmp_path / "m.pt"), "--metric", "loss=1.5")


def test_sign_without_a_key_names_signing_key(repo):
    """-S with no signing.key ended "... or give one" without saying how."""
    repo.commit({"w": torch.zeros(2)}, "a")
    out = cli(repo, "merge", "HEAD", "HEAD", "-S", code=1)
    assert out.stderr.rstrip().endswith("set one with 'mvc config signing.key KEYFILE', or give one with "
                                        "--signing-key KEYFILE")


def test_an_empty_message_reads_no_message_in_log_oneline_as_in_show(repo):
    repo.commit({"w": torch.zeros(2)}, "")
    assert cli(repo, "log", "--oneline").stdout.rstrip().endswith(" (no message)")
    assert "(no message)" in cli(repo, "show").stdout


def test_a_tree_of_one_tensor_is_one_tensor(repo):
    repo.commit({"w": torch.zeros(2)}, "one")
    assert "Tree: 1 tensor, " in cli(repo, "show", "--tensors").stdout


def test_branch_d_deletes_every_branch_named(repo):
    """mvc branch -d a b deleted a and silently ignored b; as git branch -d, each goes."""
    tip = repo.commit({"w": torch.zeros(2)}, "one").id[:12]
    for name in ("a", "b", "c"):
        repo.create_branch(name)
    assert cli(repo, "branch", "-d", "a", "b").stdout == f"Deleted branch a (was {tip})\nDeleted branch b (was {tip})\n"
    out = cli(repo, "branch", "-d", "nope", "c", code=1)  # one that cannot go is said; the others go
    assert out.stdout == f"Deleted branch c (was {tip})\n" and "branch 'nope' does not exist" in out.stderr
    assert [b.name for b in repo.branches()] == ["main"]
    repo.create_tag("t1")
    repo.create_tag("t2")
    assert cli(repo, "tag", "-d", "t1", "t2").stdout == f"Deleted tag t1 (was {tip})\nDeleted tag t2 (was {tip})\n"
    assert "too many arguments" in cli(repo, "branch", "x", "HEAD", "y", code=2).stderr


def test_strip_prefix_takes_whole_dotted_components(repo, tmp_path):
    """--strip-prefix model (no dot) wrote keys like '.0.bias'."""
    repo.commit({"model": {"0": {"bias": torch.ones(2)}}, "step": 3}, "one")
    cli(repo, "checkout", "HEAD", "-o", str(tmp_path / "a.pt"), "--only", "model.*", "--strip-prefix", "model")
    assert list(torch.load(tmp_path / "a.pt")) == ["0.bias"]


def test_init_names_the_whole_path_and_branch_a_lists_local_and_tracking_branches(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = CliRunner().invoke
    out = run(main, ["init", "here"])
    assert out.exit_code == 0 and out.output.strip() == f"Initialized empty mvc repository in {tmp_path / 'here' / '.mvc'}"
    repo_dir = str(tmp_path / "here")
    torch.save({"w": torch.ones(4)}, tmp_path / "s.pt")
    assert run(main, ["-C", repo_dir, "commit", str(tmp_path / "s.pt"), "-m", "one"]).exit_code == 0
    assert run(main, ["-C", repo_dir, "branch", "side"]).exit_code == 0
    assert run(main, ["-C", repo_dir, "remote", "add", "origin", str(tmp_path / "remote")]).exit_code == 0
    assert run(main, ["-C", repo_dir, "push"]).exit_code == 0
    listed = run(main, ["-C", repo_dir, "branch", "-a"]).output.splitlines()
    assert [line.replace("*", " * ").split()[:-1] for line in listed] == [["*", "main"], ["side"], ["remotes/origin/main"]]
    as_json = json.loads(run(main, ["-C", repo_dir, "branch", "--all", "--json"]).output)
    assert [r["name"] for r in as_json] == ["main", "side", "remotes/origin/main"]
    bad = run(main, ["-C", repo_dir, "branch", "-a", "-d", "side"])
    assert bad.exit_code == 2 and "take no NAME" in bad.output
