"""What a new user trips on in the first hour (issue 36): Git's habits where a Git user expects them."""

import json

import pytest
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
    assert repo.gc().commits_removed == 0  # the deleted tip stays
    cli(repo, "branch", "exp", tip)  # recovered as it was
    assert [c.message for c in repo.log("exp")][:2] == ["exp 7", "exp 6"]
    cli(repo, "branch", "-D", "exp")
    assert "expired 11 reflog entries" in cli(repo, "reflog", "expire", "exp").stdout  # 8 commits, -D, branch, -D
    assert repo.gc(grace=0).commits_removed == 8  # then gc reclaims it


def test_a_deleted_branch_comes_back_by_its_reflog_name(repo):
    repo.commit({"w": torch.zeros(4)}, "base")
    tips = [repo.commit({"w": torch.full((4,), float(i))}, f"exp {i}", branch="exp").id for i in range(3)]
    cli(repo, "branch", "-D", "exp")
    assert cli(repo, "reflog", "exp").stdout.splitlines()[:2] == ["(deleted)    exp@{0}: deleted",
                                                                  f"{tips[2][:12]} exp@{{1}}: commit: exp 2"]
    err = cli(repo, "show", "exp@{0}", code=1).stderr
    assert err == "mvc: error: exp@{0}: exp was deleted there; exp@{1} is its tip before that\n"
    assert repo.resolve("exp@{2}") == tips[1]
    assert cli(repo, "branch", "exp", "exp@{1}").stdout == f"Branch exp at {tips[2][:12]}\n"
    assert [c.id for c in repo.log("exp")][:3] == tips[::-1]
    assert "no branch or tag 'nothing'" in cli(repo, "show", "nothing@{1}", code=1).stderr


def test_a_deleted_ref_s_reflog_expires_after_30_days_not_gc_s_grace(repo):
    from mvc import refs
    repo.commit({"w": torch.zeros(4)}, "base")
    repo.commit({"w": torch.ones(4)}, "exp", branch="exp")
    day = 86400 * 10 ** 6
    with repo.index.read() as txn:
        live = refs.deleted_entry_expired(txn, "heads/exp", {"time": 0}, 40 * day)
    cli(repo, "branch", "-D", "exp")
    with repo.index.read() as txn:
        expired = [refs.deleted_entry_expired(txn, ref, {"time": 0}, now) for ref, now in
                   (("heads/exp", 29 * day), ("heads/exp", 31 * day), ("HEAD", 31 * day))]
    assert (live, expired) == (False, [False, True, False])  # HEAD's and a live branch's: never so
    assert refs.DELETED_REFLOG_S == 30 * 86400


def test_branch_d_deletes_a_merged_branch(repo):
    first = repo.commit({"w": torch.zeros(4)}, "base").id
    repo.create_branch("old")
    repo.commit({"w": torch.ones(4)}, "next")
    assert cli(repo, "branch", "-d", "old").stdout == f"Deleted branch old (was {first[:12]})\n"


def test_a_checkpointer_run_in_a_new_repository_takes_head_to_its_branch(tmp_path):
    import mvc
    from mvc_hooks import Checkpointer
    model = torch.nn.Linear(4, 1)
    ckpt = Checkpointer(tmp_path / "runs", model=model, branch="run-1", every_n_steps=1)
    for step in range(2):
        ckpt.step(step, loss=1.0 / (step + 1))
    ckpt.close()
    with mvc.Repository.open(tmp_path / "runs") as repo:
        assert repo.head().branch == "run-1" and [c.step for c in repo.log()] == [1, 0]
        assert "On branch run-1" in cli(repo, "status").stdout
        repo.commit({"w": torch.ones(4)}, "elsewhere", branch="other")  # the library's own commits: HEAD stays
        assert repo.head().branch == "run-1"
        assert len(cli(repo, "log", "--oneline").stdout.splitlines()) == 2


def test_log_shows_a_lightning_run_in_a_new_repository(tmp_path):
    pl = __import__("pytest").importorskip("lightning.pytorch")
    import warnings
    from torch.utils.data import DataLoader, TensorDataset
    from mvc_hooks.lightning import MvcCheckpoint

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[MvcCheckpoint(tmp_path / "repo", chunk_size=64)],
                         default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Net(), DataLoader(data, batch_size=8))
    import mvc
    with mvc.Repository.open(tmp_path / "repo") as repo:
        log = cli(repo, "log", "--oneline").stdout.splitlines()
        assert len(log) == 2 and all("step" in line for line in log)
        assert "On branch lightning" in cli(repo, "status").stdout


class Terminal:
    """A stream that says it is a terminal, and keeps what was written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_a_bar_shows_bytes_rate_and_time_left_on_a_terminal_only():
    from mvc.cli.base import Progress, clock
    shown = Terminal()
    with Progress("writing", stream=shown) as bar:
        for done in range(0, 2049, 256):
            bar(done, 2048)
    assert "of 2.0 KiB" in shown.text and "/s" in shown.text and "ETA " in shown.text
    assert (clock(7), clock(750), clock(3 * 3600 + 300)) == ("0:07", "12:30", "3:05:00")
    piped = Terminal()
    piped.isatty = lambda: False
    with Progress("writing", stream=piped) as bar:
        bar(2048, 2048)
    assert piped.text == ""


def test_repack_counts_bytes_not_chunks(repo):
    repo.commit({"w": torch.arange(96.0), "b": torch.arange(40.0) + 1000}, "one")  # 384 + 160 bytes, no repeats
    calls = []
    repo.repack(progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (544, 544)


def test_push_fetch_and_clone_show_bytes_and_rate_on_a_terminal(repo, tmp_path, monkeypatch):
    from mvc.cli import base
    monkeypatch.setattr(base.Progress, "_on_terminal", lambda self: True)
    monkeypatch.setattr(base.Transfer, "REDRAW_S", 0.0)
    repo.commit({"w": torch.arange(256, dtype=torch.float32)}, "one")
    cli(repo, "remote", "add", "origin", tmp_path / "remote")
    out = cli(repo, "push")
    assert "sending" in out.stderr and "KiB" in out.stderr and "/s" in out.stderr
    assert "of 1.0 KiB" in out.stderr  # the chunks' total, said before they go: the time left too
    cloned = CliRunner().invoke(main, ["clone", str(tmp_path / "remote"), str(tmp_path / "copy")])
    assert cloned.exit_code == 0 and "receiving" in cloned.stderr and "KiB" in cloned.stderr
    assert "of 1.0 KiB" in cloned.stderr
    line = base.Transfer("sending")
    line.expect(1000)
    line.done = 250
    assert line.line(1.0) == "sending   250 B of 1000 B  250 B/s  ETA 0:03"
    monkeypatch.setattr(base.Progress, "_on_terminal", lambda self: False)
    assert "sending" not in cli(repo, "push").stderr  # piped: no bar


def _run_with_metrics(repo):
    losses = [3.1, 2.6, 2.2, 2.4, 2.25]
    return [repo.commit({"w": torch.full((4,), float(i))}, f"step {i}", step=100 * i,
                        metrics={"eval_loss": loss, **({"acc": 0.5 + i / 10} if i % 2 else {})}).id
            for i, loss in enumerate(losses)]


def test_log_where_and_sort_answer_which_checkpoint_was_best(repo):
    ids = _run_with_metrics(repo)
    best = json.loads(cli(repo, "log", "--sort", "eval_loss", "-n", "1", "--json").stdout)
    assert [c["id"] for c in best] == [ids[2]]
    kept = json.loads(cli(repo, "log", "--where", "eval_loss<2.3", "--sort", "eval_loss", "--json").stdout)
    assert [c["id"] for c in kept] == [ids[2], ids[4]]
    both = json.loads(cli(repo, "log", "--where", "eval_loss<3", "--where", "step>=300", "--json").stdout)
    assert [c["id"] for c in both] == [ids[4], ids[3]]  # history order when not sorted
    highest = cli(repo, "log", "--sort", "-acc", "--oneline").stdout.splitlines()
    assert [line.split()[0] for line in highest] == [ids[3][:12], ids[1][:12], ids[4][:12], ids[2][:12], ids[0][:12]]
    err = cli(repo, "log", "--where", "eval_los<2", code=1).stderr
    assert "no commit here records metric 'eval_los'" in err and "eval_loss" in err
    assert "is not METRIC OP NUMBER" in cli(repo, "log", "--where", "eval_loss<<2", code=1).stderr
    assert "--graph" in cli(repo, "log", "--graph", "--sort", "eval_loss", code=2).stderr


def _lightning_like(i: int) -> dict:
    """A Lightning checkpoint's layout: 'optimizer_states' sorts before 'state_dict'."""
    w = torch.arange(64, dtype=torch.float32) * (1 + i / 100)
    return {"state_dict": {f"layers.{n}.weight": w + n for n in (2, 10)},
            "optimizer_states": [{"state": {0: {"step": torch.tensor(float(i)), "exp_avg": w * i}}}],
            "rng_state": torch.arange(16, dtype=torch.uint8) + i}


def test_diff_lists_model_tensors_first_and_stat_summarises_optimizer_and_rng(repo):
    from mvc.diff import section_of
    assert [section_of(k) for k in ("state_dict.layers.2.weight", "optimizer_states.0.state.0.step", "rng_state",
                                    "ranks.0.loader.start.rng", "generator.conv.weight")] == \
        ["model", "optimizer", "rng", "data", "model"]
    repo.commit(_lightning_like(1), "one")
    repo.commit(_lightning_like(2), "two")
    keys = [t.key for t in repo.diff("HEAD~1", "HEAD").tensors]
    assert keys[:2] == ["state_dict.layers.2.weight", "state_dict.layers.10.weight"]
    assert keys[-1] == "rng_state"
    lines = cli(repo, "diff", "HEAD~1", "HEAD", "--stat").stdout.splitlines()
    assert lines[0].startswith(" state_dict.layers.2.weight") and lines[1].startswith(" state_dict.layers.10.weight")
    assert lines[2].startswith(" optimizer state: 2 tensors changed") and lines[3].startswith(" RNG state: 1 tensor ")
    assert not any("exp_avg" in line for line in lines)


def test_bisect_names_the_weights_that_moved_before_optimizer_noise(repo):
    repo.commit(_lightning_like(1), "good")
    repo.commit(_lightning_like(2), "bad")
    cli(repo, "bisect", "start", "HEAD", "HEAD~1")
    out = cli(repo, "bisect", "log").stdout
    at = out.index("against its parent")
    tail = out[at:].splitlines()
    assert "state_dict.layers" in tail[1] and "state_dict.layers" in tail[2]
    assert any(line.strip().startswith("optimizer state: 2 tensors changed") for line in tail)
    assert not any("exp_avg" in line for line in tail)


def test_status_says_ahead_and_behind_the_remote_tracking_branch(repo, tmp_path):
    repo.commit({"w": torch.zeros(4)}, "one")
    assert "Your branch" not in cli(repo, "status").stdout  # no remote: nothing to say
    cli(repo, "remote", "add", "origin", tmp_path / "remote")
    assert "to origin: 1 commit, " in cli(repo, "push").stdout  # not "1 commits"
    assert "Your branch is up to date with 'origin/main'" in cli(repo, "status").stdout
    repo.commit({"w": torch.ones(4)}, "two")
    repo.commit({"w": torch.ones(4) * 2}, "three")
    assert "Your branch is ahead of 'origin/main' by 2 commits" in cli(repo, "status").stdout
    upstream = json.loads(cli(repo, "status", "--json").stdout)["upstream"]
    assert upstream == {"ref": "origin/main", "ahead": 2, "behind": 0}
    cli(repo, "push")
    cli(repo, "branch", "-f", "main", "HEAD~2")
    assert "Your branch is behind 'origin/main' by 2 commits" in cli(repo, "status").stdout
    repo.commit({"w": torch.ones(4) * 3}, "elsewhere")
    assert "have diverged, and have 1 and 2 different commits" in cli(repo, "status").stdout


def test_counts_of_one_are_singular(repo):
    repo.commit({"w": torch.zeros(4)}, "one")  # 16 bytes: one chunk, one tensor, one pack
    assert "checked 1 commit, 1 tree, 1 tensor, 1 chunk in 1 pack;" in cli(repo, "fsck").stdout


def test_merge_of_one_rev_merges_it_into_the_current_branch(repo):
    repo.commit({"model": {"w": torch.zeros(4)}}, "base")
    side = repo.commit({"model": {"w": torch.full((4,), 2.0)}}, "side", branch="side").id
    tip = repo.commit({"model": {"w": torch.full((4,), 4.0)}}, "main").id
    out = json.loads(cli(repo, "merge", "side", "--json").stdout)
    assert out["commit"]["parents"] == [tip, side] and len(out["report"]["inputs"]) == 2
    assert torch.equal(repo.load("HEAD")["model"]["w"], torch.full((4,), 3.0))  # (4 + 2) / 2: both went in


def test_help_groups_the_commands_and_says_whole_sentences():
    from mvc.cli.base import COMMAND_GROUPS
    out = CliRunner().invoke(main, ["--help"], terminal_width=100).stdout
    titles = [line[:-1] for line in out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles[1:] == [t[0].upper() + t[1:] for t, _ in COMMAND_GROUPS]  # after "Options", and no leftovers
    commands = out[out.index("Start a repository:"):]
    assert "..." not in commands.replace("REV...", "").replace("NAME...", "")  # none cut mid-sentence
    assert "main~4..main) or" in " ".join(out.split())
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("   ")}
    assert {name for _, names in COMMAND_GROUPS for name in names} <= listed


def test_log_and_status_say_where_the_commits_are_when_head_s_branch_has_none(repo):
    repo.commit({"w": torch.ones(4)}, "from a script", branch="run")  # the library's commit: HEAD stays on main
    out = cli(repo, "log")
    assert out.stdout == "" and "branch 'main' has no commits yet; the commits are on run: 'mvc log run'" in out.stderr
    assert "the commits are on run" in cli(repo, "status").stdout


def test_gc_keeps_a_deleted_branch_for_days_not_its_grace(repo):
    repo.commit({"w": torch.zeros(4)}, "base")
    tip = [repo.commit({"w": torch.full((4,), float(i))}, f"exp {i}", branch="exp").id for i in range(3)][-1]
    cli(repo, "branch", "-D", "exp")
    assert repo.gc(grace=0).commits_removed == 0  # no pack grace decides: the reflog keeps it 30 days
    assert repo.load(tip)["w"].tolist() == [2.0] * 4
    cli(repo, "reflog", "expire", "exp")  # the way to let it go now, as git reflog expire --expire=now
    assert repo.gc(grace=0).commits_removed == 3
