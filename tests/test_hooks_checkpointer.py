"""The Checkpointer in one process: what a commit holds, validation, context, async errors, locks."""

import os
import shutil
import subprocess
import sys
import types

import pytest
import torch

import mvc
from mvc_hooks import Checkpointer, ResumableSampler

SMALL_CHUNK = 64


def parts(seed=0, width=4):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Dropout(0.1), torch.nn.Linear(width, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def train(model, opt, sched, ckpt, start, stop):
    for step in range(start, stop):
        loss = model(torch.randn(5, 3)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        ckpt.step(step, loss=loss.item(), metrics={"acc": step / 10})


def params(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("async_save", [False, True])
def test_the_models_module_metadata_is_committed_sync_or_async(tmp_path, async_save):
    """state_dict()._metadata (module versions) is in the commit whether the
    save copies the state first (async) or commits it as it is."""
    model, opt, sched = parts()
    with Checkpointer(tmp_path, model=model, optimizer=opt, every_n_steps=1, chunk_size=SMALL_CHUNK,
                      async_save=async_save) as ckpt:
        ckpt.save(0)
        ckpt.wait()
        assert ckpt.repo.load()["model"]._metadata == model.state_dict()._metadata


def test_commits_hold_the_complete_state_and_resume_restores_it(tmp_path):
    path = tmp_path / "fresh" / "dir"  # no repository there yet: created
    model, opt, sched = parts()
    scaler = torch.amp.GradScaler("cpu")
    sampler = ResumableSampler(10, seed=1)
    extra = {"best": 1.5, "seen": [1, 2]}
    with Checkpointer(path, model=model, optimizer=opt, scheduler=sched, scaler=scaler, sampler=sampler,
                      extra=extra, every_n_steps=4, chunk_size=SMALL_CHUNK, async_save=False) as ckpt:
        assert ckpt.resume() == 0
        next(iter(sampler)), next(iter(sampler))
        train(model, opt, sched, ckpt, 0, 10)
        extra["best"] = 0.5
        ckpt.save(message="end")
        ckpt.save()  # the same step again: nothing new
        repo = ckpt.repo
        log = list(repo.log())
        assert [c.step for c in log] == [9, 7, 3]
        assert log[0].message == "end" and log[1].message == "step 7"
        assert set(log[1].metrics) == {"loss", "acc"} and log[1].metrics["acc"] == 0.7
        state = repo.load()
        assert repo.chunk_size == SMALL_CHUNK
    assert set(state) == {"model", "optimizer", "scheduler", "scaler", "extra", "ranks", "progress",
                          "world_size", "mvc_hooks", "types"}
    assert state["types"] == {"optimizer": "AdamW", "scheduler": "StepLR", "scaler": "GradScaler"}
    assert state["progress"] == {"step": 9, "epoch": None, "batch": None}
    assert state["extra"] == {"best": 0.5, "seen": [1, 2]}
    assert set(state["ranks"][0]) == {"rng", "sampler"} and state["ranks"][0]["sampler"]["position"] == 2
    assert state["scaler"]["scale"] == scaler.get_scale()
    expected = params(model)

    model2, opt2, sched2 = parts(seed=9)
    sampler2, extra2, scaler2 = ResumableSampler(10, seed=1), {}, torch.amp.GradScaler("cpu", init_scale=8.0)
    with Checkpointer(path, model=model2, optimizer=opt2, scheduler=sched2, scaler=scaler2, sampler=sampler2,
                      extra=extra2, every_n_steps=4) as ckpt:
        assert ckpt.resume() == 10
        assert ckpt.resumed_from.id == log[0].id
    assert all(torch.equal(a, b) for a, b in zip(params(model2), expected))
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert sched2.state_dict() == sched.state_dict()
    assert scaler2.get_scale() == scaler.get_scale()
    assert sampler2.position == 2 and extra2 == {"best": 0.5, "seen": [1, 2]}


def test_a_mismatch_is_an_error_and_restores_nothing(tmp_path):
    model, opt, sched = parts()
    with Checkpointer(tmp_path, model=model, scheduler=sched, every_n_steps=2) as ckpt:
        train(model, opt, sched, ckpt, 0, 2)
    fresh, fresh_opt, fresh_sched = parts(seed=3)
    before = params(fresh)
    with Checkpointer(tmp_path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched) as ckpt:
        with pytest.raises(mvc.BadInput, match=r"commit \w+ \(step 1\) has no optimizer state"):
            ckpt.resume()
    assert all(torch.equal(a, b) for a, b in zip(params(fresh), before))
    wide, _, _ = parts(width=5)
    with Checkpointer(tmp_path, model=wide, scheduler=sched) as ckpt:
        with pytest.raises(mvc.BadInput, match=r"model does not match: 0.weight has shape \(4, 3\)"):
            ckpt.resume()
    with Checkpointer(tmp_path, model=fresh) as ckpt:
        with pytest.raises(mvc.BadInput, match="also holds scheduler"):
            ckpt.resume()
        assert all(torch.equal(a, b) for a, b in zip(params(fresh), before))
        assert ckpt.resume(strict=False) == 2  # leaving the scheduler out, on purpose



class PickySampler:
    """A sampler with no check of its own: its loader alone refuses another order."""

    def __init__(self, seed):
        self.seed, self.position = seed, 0

    def state_dict(self):
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state):
        if state["seed"] != self.seed:
            raise ValueError(f"seed {state['seed']} is not {self.seed}")
        self.position = state["position"]


def sampled_run(tmp_path, sampler):
    model, opt, sched = parts()
    with Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                      every_n_steps=3, async_save=False) as ckpt:
        train(model, opt, sched, ckpt, 0, 3)


@pytest.mark.parametrize("saved, given, error", [
    (ResumableSampler(10, seed=0), ResumableSampler(10, seed=1), "another data order: seed 0 .here 1."),
    (ResumableSampler(10, seed=0), ResumableSampler(11, seed=0), "another data order: size 10 .here 11."),
    (PickySampler(0), PickySampler(1), "restoring sampler failed: seed 0 is not 1"),
])
def test_a_sampler_mismatch_restores_nothing(tmp_path, saved, given, error):
    sampled_run(tmp_path, saved)
    fresh, fresh_opt, fresh_sched = parts(seed=3)
    before, sampler_before = params(fresh), given.state_dict()
    with Checkpointer(tmp_path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched, sampler=given) as ckpt:
        with pytest.raises(mvc.BadInput, match=error):
            ckpt.resume()
        assert ckpt.resumed_from is None
    assert all(torch.equal(a, b) for a, b in zip(params(fresh), before))
    assert fresh_opt.state_dict()["state"] == {} and fresh_sched.last_epoch == 0
    assert given.state_dict() == sampler_before

def test_data_parallel_weights_load_into_a_bare_model(tmp_path):
    model, _, _ = parts()
    with Checkpointer(tmp_path, model=torch.nn.DataParallel(model), every_n_steps=1) as ckpt:
        ckpt.step(0)
        ckpt.wait()
    with mvc.Repository.open(tmp_path) as repo:
        weights = repo.load()["model"]
    bare, _, _ = parts(seed=4)
    bare.load_state_dict(weights)
    assert all(torch.equal(a, b) for a, b in zip(params(bare), params(model)))


def count_fields(node) -> int:
    if isinstance(node, dict):
        return sum(count_fields(v) for v in node.values())
    return 0 if node is None or node == "" or node == [] else 1


def test_the_training_context_has_over_forty_fields(tmp_path):
    model, opt, sched = parts()
    scaler = torch.amp.GradScaler("cpu")
    with Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                      sampler=ResumableSampler(8), every_n_steps=5,
                      context={"batch_size": 5, "grad_accumulation": 2}) as ckpt:
        train(model, opt, sched, ckpt, 0, 10)
        ckpt.wait()
        context = ckpt.repo.get_commit().context
    assert count_fields(context) >= 40
    for section in ("hardware", "software", "distributed", "code", "model", "optimizer", "scheduler", "amp",
                    "data", "seed", "timing", "loss"):
        assert count_fields(context[section]) >= 1, section
    assert context["batch_size"] == 5 and context["grad_accumulation"] == 2
    assert context["software"]["torch"] == torch.__version__ and context["software"]["mvc"] == mvc.__version__
    assert context["hardware"]["cpu_count"] == os.cpu_count()
    assert context["distributed"]["world_size"] == 1
    assert context["optimizer"]["main"]["class"] == "AdamW"
    group = context["optimizer"]["main"]["param_groups"][0]
    assert group["lr"] == opt.param_groups[0]["lr"] and group["betas"] == [0.9, 0.999]
    assert context["scheduler"]["main"]["last_lr"] == sched.get_last_lr()
    assert context["amp"]["scaler"]["enabled"] is True
    assert context["seed"]["torch_initial_seed"] == torch.initial_seed()
    assert context["loss"]["count"] == 5  # the losses since the previous commit (steps 5..9)
    assert context["timing"]["steps_since_commit"] == 5 and context["timing"]["steps_per_s"] > 0
    assert context["code"]["argv"] == sys.argv


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_code_context_names_the_git_commit_and_dirty_flag(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    script = code / "train.py"
    script.write_text("print('hi')\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "train.py"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", *args], cwd=code, env=env, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=code, capture_output=True, text=True).stdout.strip()
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=str(script)))
    from mvc_hooks import context
    clean = context.code()["code"]
    script.write_text("print('changed')\n")
    dirty = context.code()["code"]
    assert clean["git_commit"] == head and clean["git_dirty"] is False
    assert dirty["git_commit"] == head and dirty["git_dirty"] is True
    assert clean["entry_script"] == str(script)


def test_a_background_save_error_surfaces_at_the_next_step(tmp_path):
    model, opt, sched = parts()
    extra = {"fine": 1}
    ckpt = Checkpointer(tmp_path, model=model, extra=extra, every_n_steps=2, async_save=True)
    ckpt.step(0)
    ckpt.step(1)  # commits in the background
    first = ckpt.wait()
    extra["bad"] = {1, 2}  # a set cannot be stored
    ckpt.step(2)
    ckpt.step(3)
    ckpt._pending.thread.join()
    with pytest.raises(mvc.BadInput, match="extra"):
        ckpt.step(4)
    ckpt.step(5)  # reported once; the run may go on
    with pytest.raises(mvc.BadInput, match="extra"):
        ckpt.close()  # the save at step 5 failed too: close says so, and still releases the branch
    with Checkpointer(tmp_path, model=model, extra=extra, every_n_steps=2) as again:
        assert again.repo.resolve("HEAD") == first.id


def test_a_second_checkpointer_on_the_branch_is_refused(tmp_path):
    model, _, _ = parts()
    first = Checkpointer(tmp_path, model=model, branch="run")
    assert first.repo.locks.get("run").pid == os.getpid()
    with pytest.raises(mvc.LockHeld, match="another Checkpointer in this process"):
        Checkpointer(tmp_path, model=model, branch="run")
    Checkpointer(tmp_path, model=model, branch="other").close()
    first.close()
    with mvc.Repository.open(tmp_path) as repo:
        assert repo.locks.get("run") is None
    Checkpointer(tmp_path, model=model, branch="run").close()


HOLD = """
import sys, torch
from mvc_hooks import Checkpointer
ckpt = Checkpointer(sys.argv[1], model=torch.nn.Linear(1, 1), branch="run")
print("READY", flush=True)
sys.stdin.readline()
"""  # exits without close(): atexit must release the lock


def test_another_process_holding_the_branch_is_named_and_exit_releases_it(tmp_path):
    mvc.Repository.init(tmp_path).close()
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "READY"
        with pytest.raises(mvc.LockHeld, match=f"locked by pid {child.pid} "):
            Checkpointer(tmp_path, model=torch.nn.Linear(1, 1), branch="run")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
    with mvc.Repository.open(tmp_path) as repo:
        assert repo.locks.get("run") is None
    Checkpointer(tmp_path, model=torch.nn.Linear(1, 1), branch="run").close()


def test_resume_from_another_commit_forks_a_new_branch(tmp_path):
    model, opt, sched = parts()
    with Checkpointer(tmp_path, model=model, every_n_steps=2, async_save=False) as ckpt:
        train(model, opt, sched, ckpt, 0, 6)
        middle = list(ckpt.repo.log())[1]
    with Checkpointer(tmp_path, model=model, branch="fork") as ckpt:
        assert ckpt.resume(rev=middle.id) == middle.step + 1
        ckpt.step(middle.step + 1)
        ckpt.save()
        ckpt.wait()
        assert ckpt.repo.get_commit("fork").parents == (middle.id,)
    with Checkpointer(tmp_path, model=model) as ckpt:
        with pytest.raises(mvc.BadInput, match="fork the run"):
            ckpt.resume(rev=middle.id)


def test_a_failed_resume_from_another_commit_leaves_no_branch(tmp_path):
    """resume(rev) of a commit it cannot resume from (pruned here) made the new branch first, at
    that commit: every later resume of the branch failed, and another rev was refused."""
    model, opt, sched = parts()
    with Checkpointer(tmp_path, model=model, every_n_steps=1, async_save=False) as ckpt:
        train(model, opt, sched, ckpt, 0, 6)
        ckpt.repo.gc(keep_last=2)
    with Checkpointer(tmp_path, model=model, branch="fork") as ckpt:
        with pytest.raises(mvc.CommitPruned):
            ckpt.resume(rev="main~4")
        assert "fork" not in [b.name for b in ckpt.repo.branches()]
        assert ckpt.resume(rev="main~1") == ckpt.repo.get_commit("main~1").step + 1
        assert ckpt.repo.resolve("fork") == ckpt.repo.resolve("main~1")
