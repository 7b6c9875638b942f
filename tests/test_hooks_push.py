"""Checkpointer(remote=...): every commit is pushed in the background by a real
``mvc push`` child process, to a folder remote and to a real SeaweedFS server.
A remote that cannot be reached warns once and training goes on; once it is
back, the run catches up."""

import time
import warnings

import pytest
import torch

import mvc
from mvc_hooks import Checkpointer


def train(ckpt, model, opt, start: int, stop: int) -> None:
    g = torch.Generator().manual_seed(start)
    for step in range(start, stop):
        loss = model(torch.randn(4, 3, generator=g)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ckpt.step(step, loss=loss.item())


def parts():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def until(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting for {what}")
        time.sleep(0.05)


def test_each_commit_reaches_a_folder_remote_and_a_clone_resumes_from_it(tmp_path):
    with mvc.Repository.init(tmp_path / "run", chunk_size=64) as repo:
        repo.remotes.add("origin", str(tmp_path / "remote"))
    model, opt = parts()
    with Checkpointer(tmp_path / "run", model=model, optimizer=opt, branch="run", every_n_steps=2,
                      remote="origin") as ckpt:
        train(ckpt, model, opt, 0, 6)
    assert ckpt.push_error is None
    with mvc.Repository.open(tmp_path / "run") as repo:
        tip = repo.resolve("run")
        assert [c.step for c in repo.log("run")] == [5, 3, 1]
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "eval")
    with clone:
        assert clone.resolve("origin/run") == tip
        assert clone.fsck().ok
        assert torch.equal(clone.load("origin/run")["model"]["weight"], model.weight.detach())


def test_an_unreachable_remote_warns_once_training_goes_on_and_the_run_catches_up(tmp_path):
    down = tmp_path / "down"
    down.write_text("not a folder: the remote below cannot be created")
    with mvc.Repository.init(tmp_path / "run", chunk_size=64) as repo:
        repo.remotes.add("origin", str(down / "remote"))
    model, opt = parts()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ckpt = Checkpointer(tmp_path / "run", model=model, optimizer=opt, branch="run", every_n_steps=2,
                            remote="origin", async_save=False)
        train(ckpt, model, opt, 0, 4)  # two commits while the remote is down
        until(lambda: ckpt.wait() and ckpt.push_error is not None, "the failed push to be reported")
        train(ckpt, model, opt, 4, 6)
    failures = [w for w in seen if issubclass(w.category, RuntimeWarning) and "pushing branch" in str(w.message)]
    assert len(failures) == 1 and "training goes on" in str(failures[0].message)
    assert ckpt.last_commit.step == 5  # every step ran and committed
    down.unlink()
    down.mkdir()  # the store is back
    ckpt.save(6)
    ckpt.close()
    assert ckpt.push_error is None
    with mvc.Repository.open(tmp_path / "run") as repo:
        tip = repo.resolve("run")
        steps = [c.step for c in repo.log("run")]
    with mvc.Repository.clone(str(down / "remote"), tmp_path / "eval") as clone:
        assert clone.resolve("origin/run") == tip  # every commit, those made while down too
        assert [c.step for c in clone.log("origin/run")] == steps == [6, 5, 3, 1]


def test_a_remote_that_is_not_configured_is_bad_input(tmp_path):
    model, _ = parts()
    with pytest.raises(mvc.BadInput, match="no remote 'origin'.*mvc remote add origin URL"):
        Checkpointer(tmp_path / "run", model=model, branch="run", remote="origin")
    Checkpointer(tmp_path / "run", model=model, branch="run").close()  # the branch was released


def test_commits_reach_a_real_s3_server(tmp_path, s3_server, s3_url):
    url = s3_url("hook")
    with mvc.Repository.init(tmp_path / "run", chunk_size=64) as repo:
        repo.remotes.add("origin", url, s3_server.endpoint)
    model, opt = parts()
    with Checkpointer(tmp_path / "run", model=model, optimizer=opt, branch="run", every_n_steps=3,
                      remote="origin") as ckpt:
        train(ckpt, model, opt, 0, 6)
    assert ckpt.push_error is None
    with mvc.Repository.clone(url, tmp_path / "eval", lazy=True, endpoint_url=s3_server.endpoint) as clone:
        assert [c.step for c in clone.log("origin/run")] == [5, 2]
        state = clone.load("origin/run")
    assert torch.equal(state["model"]["weight"], model.weight.detach())
    assert torch.equal(state["model"]["bias"], model.bias.detach())
