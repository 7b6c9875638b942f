"""What a new user trips on in the first hour (issue 36): Git's habits where a Git user expects them."""

import json

import torch
from click.testing import CliRunner

from mvc.cli import main


def cli(repo, *args, code=0):
    out = CliRunner().invoke(main, ["-C", str(repo.root), *[str(a) for a in args]])
    assert out.exit_code == code, (out.output, out.stderr)
    return out


def test_branch_d_refuses_an_unmerged_branch_and_D_keeps_its_tip_in_the_reflog(repo):
    repo.commit({"w": torch.zeros(4)}, "base")
    for i in range(8):
        tip = repo.commit({"w": torch.full((4,), float(i))}, f"exp {i}", branch="exp").id
    err = cli(repo, "branch", "-d", "exp", code=1).stderr
    assert "not merged into HEAD" in err and tip[:12] in err and "'mvc branch -D exp'" in err
    assert [b.name for b in repo.branches()] == ["exp", "main"]
    assert cli(repo, "branch", "-D", "exp").stdout == f"Deleted branch exp (was {tip[:12]})\n"
    assert [b.name for b in repo.branches()] == ["main"]
    newest = json.loads(cli(repo, "reflog", "exp", "--json").stdout)[0]
    assert (newest["old"], newest["new"], newest["message"]) == (tip, None, "deleted")
    assert repo.gc().commits_removed == 0  # within gc's grace period the deleted tip stays
    cli(repo, "branch", "exp", tip)  # recovered as it was
    assert [c.message for c in repo.log("exp")][:2] == ["exp 7", "exp 6"]
    cli(repo, "branch", "-D", "exp")
    assert repo.gc(grace=0).commits_removed == 8  # past the grace period gc reclaims it


def test_branch_d_deletes_a_merged_branch(repo):
    first = repo.commit({"w": torch.zeros(4)}, "base").id
    repo.create_branch("old")
    repo.commit({"w": torch.ones(4)}, "next")
    assert cli(repo, "branch", "-d", "old").stdout == f"Deleted branch old (was {first[:12]})\n"
