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
