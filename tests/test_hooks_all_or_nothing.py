"""resume() is all or nothing: a checkpoint that does not fit the live objects changes none of them.

Each case saves one run's checkpoint and resumes it into objects that differ
in one way (optimizer class, scheduler class, dtype); the error must name
what differs, and every live object must be exactly as it was.
"""

import copy

import pytest
import torch

import mvc
from mvc_hooks import Checkpointer


def model_of(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(dtype)


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def step_lr(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2)


def cosine(opt):
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)


def exponential(opt):
    return torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)


def save_run(path, dtype=torch.float32, make_opt=sgd, make_sched=step_lr):
    model = model_of(dtype)
    opt = make_opt(model)
    sched = make_sched(opt)
    with Checkpointer(path, model=model, optimizer=opt, scheduler=sched, every_n_steps=2,
                      async_save=False) as ckpt:
        for step in range(2):
            loss = model(torch.randn(5, 3, dtype=dtype)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            ckpt.step(step, loss=loss.item())


def live_state(model, opt, sched):
    return copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                          "rng": torch.get_rng_state()})


def assert_unchanged(before, after):
    assert before.keys() == after.keys()
    for key in before:
        a, b = before[key], after[key]
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), key
        elif key == "model":
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
        else:
            assert repr(a) == repr(b), key


@pytest.mark.parametrize("saved_opt, given_opt, saved_sched, given_sched, dtype, error", [
    (sgd, adam, step_lr, step_lr, torch.float32, r"optimizer does not match: .*SGD in the checkpoint, Adam here"),
    (adam, sgd, step_lr, step_lr, torch.float32, r"optimizer does not match: .*Adam in the checkpoint, SGD here"),
    (sgd, sgd, step_lr, cosine, torch.float32,
     r"scheduler does not match: .*StepLR in the checkpoint, CosineAnnealingLR here"),
    (sgd, sgd, exponential, step_lr, torch.float32,
     r"scheduler does not match: .*ExponentialLR in the checkpoint, StepLR here"),
    (sgd, sgd, step_lr, step_lr, torch.float64,
     r"model does not match: 0.weight is float64 in the checkpoint but float32 in the model"),
])
def test_a_checkpoint_that_does_not_fit_changes_nothing(tmp_path, saved_opt, given_opt, saved_sched,
                                                        given_sched, dtype, error):
    save_run(tmp_path, dtype, saved_opt, saved_sched)
    model = model_of(seed=7)
    opt = given_opt(model)
    sched = given_sched(opt)
    before = live_state(model, opt, sched)
    with Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched) as ckpt:
        with pytest.raises(mvc.BadInput, match=error):
            ckpt.resume()
        assert ckpt.resumed_from is None
    assert_unchanged(before, live_state(model, opt, sched))


def test_param_group_keys_are_checked_without_the_class_record(tmp_path):
    """A checkpoint from before class names were recorded is still refused by its param-group keys."""
    save_run(tmp_path, make_opt=adam)
    with mvc.Repository.open(tmp_path) as repo:
        state = repo.load()
        state.pop("types", None)
        repo.commit(state, message="without types", step=1, branch="old", rebase=False)
    model = model_of(seed=7)
    opt = sgd(model)
    sched = step_lr(opt)
    before = live_state(model, opt, sched)
    with Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched, branch="old") as ckpt:
        with pytest.raises(mvc.BadInput, match=r"parameter group 0 has amsgrad, betas, .* in the checkpoint, which SGD lacks"):
            ckpt.resume()
    assert_unchanged(before, live_state(model, opt, sched))


class FailingLoad:
    """A component whose loader fails after every check passed (the last resort: roll back)."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        raise RuntimeError("this component cannot be restored")


def test_a_loader_that_fails_late_rolls_back_what_was_loaded(tmp_path):
    model = model_of()
    opt = adam(model)
    sched = step_lr(opt)
    with Checkpointer(tmp_path, model=model, optimizer=opt, scheduler=sched, stateful=FailingLoad(),
                      every_n_steps=1, async_save=False) as ckpt:
        loss = model(torch.randn(5, 3)).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        ckpt.step(0)
    fresh = model_of(seed=7)
    fresh_opt = adam(fresh)
    fresh_sched = step_lr(fresh_opt)
    before = live_state(fresh, fresh_opt, fresh_sched)
    with Checkpointer(tmp_path, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched,
                      stateful=FailingLoad()) as ckpt:
        with pytest.raises(mvc.BadInput, match="restoring stateful failed: this component cannot be restored"):
            ckpt.resume()
    assert_unchanged(before, live_state(fresh, fresh_opt, fresh_sched))
