"""Bit-exact resume for the data loops people write: straight run vs stopped-and-resumed, bit for bit.

Each case trains a small MLP with dropout for three epochs of eight
batches from a dataset that adds noise as it loads (so the loading
process's RNG matters too: the main process with num_workers=0, each
worker otherwise), stops after step STOP with its last commit at step
LAST, and resumes in fresh objects, as a new process would build them. The
losses of every step and the final parameters must equal those of a run
that was never stopped and had no Checkpointer at all.

Loops: ``positioned`` trusts resume() to continue the epoch; ``skip-epoch``
starts at the checkpoint's epoch and iterates past the batches it has seen;
``skip-all`` starts at epoch 0 and iterates past everything it has seen.
"""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import mvc
from mvc_hooks import Checkpointer, ResumableSampler

EPOCHS, BATCHES, BATCH = 3, 8, 8
TOTAL = EPOCHS * BATCHES


class Noisy(Dataset):
    """64 samples; each load adds noise from the loading process's global torch RNG."""

    def __init__(self, size=BATCHES * BATCH):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(size, 4, generator=g), torch.randn(size, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.rand(4), self.y[i]


def build(kind, workers, size=BATCHES * BATCH):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    data = Noisy(size)
    sampler = None
    if kind == "plain":
        loader = DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=workers)
    elif kind == "distributed":
        sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=3)
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=workers)
    elif kind == "resumable":
        sampler = ResumableSampler(data, seed=3)
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=workers)
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader
        loader = StatefulDataLoader(data, batch_size=BATCH, shuffle=True, num_workers=workers)
    return {"model": model, "opt": opt, "sampler": sampler, "loader": loader}


def train(parts, style, start, stop, ckpt=None, batches=BATCHES, epochs=EPOCHS):
    """Train steps start..stop-1 as the loop ``style`` does; {step: loss}.

    ``batches`` per epoch (of this rank's shard), ``epochs`` in all."""
    model, opt, sampler, loader = parts["model"], parts["opt"], parts["sampler"], parts["loader"]
    losses = {}
    if style == "readme":  # the README's loop: epochs from ckpt.epoch, the loader positioned by resume()
        first, step = (ckpt.epoch or 0) if ckpt is not None else 0, start
    else:
        first = 0 if style == "skip-all" else start // batches
        step = first * batches if style != "positioned" else start
    for epoch in range(first, epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for x, y in loader:
            if step < start:  # a loop that iterates past what it has seen
                step += 1
                continue
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[step] = loss.item()
            if ckpt is not None:
                ckpt.step(step, loss=loss.item(), epoch=epoch)
            step += 1
            if step >= stop:
                return losses
    return losses


def checkpointer(path, parts, style, every):
    sampler = parts["sampler"] if isinstance(parts["sampler"], ResumableSampler) else None
    return Checkpointer(path, model=parts["model"], optimizer=parts["opt"], sampler=sampler,
                        loader=parts["loader"], loop_skips=style not in ("positioned", "readme"), every_n_steps=every,
                        async_save=False)


STRAIGHT: dict = {}


def straight(kind, workers, style):
    key = (kind, workers, style)
    if key not in STRAIGHT:
        parts = build(kind, workers)
        STRAIGHT[key] = train(parts, style, 0, TOTAL), [p.detach().clone() for p in parts["model"].parameters()]
    return STRAIGHT[key]


def stop_and_resume(path, kind, workers, style, every, stop):
    parts = build(kind, workers)
    with checkpointer(path, parts, style, every) as ckpt:
        assert ckpt.resume() == 0
        losses = train(parts, style, 0, stop, ckpt)
    resumed = build(kind, workers)  # fresh objects and a freshly seeded RNG, as a new process has
    with checkpointer(path, resumed, style, every) as ckpt:
        start = ckpt.resume()
        assert start == (stop // every) * every
        losses.update(train(resumed, style, start, TOTAL, ckpt))
    assert type(resumed["loader"]) is type(parts["loader"])  # close() gave the loader its class back
    return losses, [p.detach() for p in resumed["model"].parameters()]


CASES = [(kind, style) for kind in ("plain", "distributed") for style in ("positioned", "skip-epoch", "skip-all")]
CASES += [("resumable", "positioned"), ("resumable", "skip-epoch"), ("stateful", "positioned")]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind, style", CASES)
def test_a_resume_mid_epoch_continues_bit_for_bit(tmp_path, kind, style, workers):
    if kind == "stateful":
        pytest.importorskip("torchdata.stateful_dataloader")
    want_losses, want_params = straight(kind, workers, style)
    # commits at steps 4 and 9; stopped after step 12: resumes at step 10, batch 2 of epoch 1
    losses, params = stop_and_resume(tmp_path, kind, workers, style, every=5, stop=13)
    assert sorted(losses) == list(range(TOTAL))
    assert losses == want_losses
    assert all(torch.equal(a, b) for a, b in zip(params, want_params))


@pytest.mark.parametrize("kind, style", [("plain", "positioned"), ("plain", "skip-all"),
                                         ("distributed", "skip-epoch"), ("stateful", "positioned")])
def test_a_resume_at_an_epoch_boundary_continues_bit_for_bit(tmp_path, kind, style):
    if kind == "stateful":
        pytest.importorskip("torchdata.stateful_dataloader")
    want_losses, want_params = straight(kind, 0, style)
    losses, params = stop_and_resume(tmp_path, kind, 0, style, every=8, stop=13)  # resumes at step 8
    assert losses == want_losses
    assert all(torch.equal(a, b) for a, b in zip(params, want_params))


@pytest.mark.parametrize("kind", ["plain", "distributed", "resumable"])
@pytest.mark.parametrize("every, stop", [(8, 13), (5, 13)], ids=["epoch-end", "mid-epoch"])
def test_the_readme_loop_resumes_bit_for_bit(tmp_path, kind, every, stop):
    """``for epoch in range(ckpt.epoch or 0, epochs)``: a checkpoint at an epoch's last batch
    (step 7 of 8) made ckpt.epoch that finished epoch, so the loop ran it again (with set_epoch,
    reshuffled as that epoch); it is the next epoch now, the loader's fresh pass."""
    want_losses, want_params = straight(kind, 0, "readme")
    losses, params = stop_and_resume(tmp_path, kind, 0, "readme", every=every, stop=stop)
    assert sorted(losses) == list(range(TOTAL))
    assert losses == want_losses
    assert all(torch.equal(a, b) for a, b in zip(params, want_params))


def first_half(path, kind="plain", style="positioned", **kwargs):
    parts = build(kind, 0)
    with checkpointer(path, parts, style, 5) as ckpt:
        ckpt.resume()
        train(parts, style, 0, 13, ckpt)


def test_a_loader_the_checkpointer_was_not_given_is_named_and_nothing_is_restored(tmp_path):
    parts = build("plain", 0)
    with Checkpointer(tmp_path, model=parts["model"], optimizer=parts["opt"], every_n_steps=5,
                      async_save=False) as ckpt:
        train(parts, "positioned", 0, 13, ckpt)
    fresh = build("plain", 0)
    before = [p.detach().clone() for p in fresh["model"].parameters()]
    with Checkpointer(tmp_path, model=fresh["model"], optimizer=fresh["opt"]) as ckpt:
        with pytest.raises(mvc.BadInput, match=r"middle of a pass of a DataLoader the Checkpointer was not "
                           r"given \(DataLoader over Noisy of 64 samples, RandomSampler, no generator, "
                           r"num_workers=0, at batch 2 of 8\).*Checkpointer\(loader=\.\.\.\)"):
            ckpt.resume()
        assert all(torch.equal(a, b) for a, b in zip(fresh["model"].parameters(), before))
        assert ckpt.resume(strict=False) == 10  # on purpose: not bit for bit


def test_a_loader_whose_dataset_changed_is_refused(tmp_path):
    first_half(tmp_path)
    fresh = build("plain", 0, size=72)
    with checkpointer(tmp_path, fresh, "positioned", 5) as ckpt:
        with pytest.raises(mvc.BadInput, match=r"loader does not match: the loader has 72 samples in its "
                           r"dataset, the checkpoint's had 64"):
            ckpt.resume()


def test_a_loop_that_skips_what_the_checkpointer_skipped_is_stopped(tmp_path):
    first_half(tmp_path)
    fresh = build("plain", 0)
    with Checkpointer(tmp_path, model=fresh["model"], optimizer=fresh["opt"], loader=fresh["loader"]) as ckpt:
        start = ckpt.resume()
        with pytest.raises(mvc.BadInput, match=r"took 5 batches of the loader's pass before its first step, "
                           r"the checkpointed run 3 \(2 seen, 1 per step\): the Checkpointer already "
                           "positioned the loader"):
            train(fresh, "skip-epoch", start, TOTAL, ckpt)


def test_a_loop_skips_run_whose_loop_does_not_skip_is_stopped(tmp_path):
    first_half(tmp_path, style="skip-epoch")
    fresh = build("plain", 0)
    with checkpointer(tmp_path, fresh, "skip-epoch", 5) as ckpt:
        start = ckpt.resume()
        assert ckpt.batches_seen == 2
        with pytest.raises(mvc.BadInput, match="must iterate past the first 2 batches"):
            train(fresh, "positioned", start, TOTAL, ckpt)


def test_a_loop_that_restarts_its_step_count_is_stopped(tmp_path):
    first_half(tmp_path)
    fresh = build("plain", 0)
    with checkpointer(tmp_path, fresh, "positioned", 5) as ckpt:
        ckpt.resume()
        with pytest.raises(mvc.BadInput, match="first step reported after resume.. is 0, but resume.. "
                           "returned 10"):
            train(fresh, "positioned", 0, TOTAL, ckpt)


def test_a_positioned_loop_in_another_epoch_is_stopped(tmp_path):
    first_half(tmp_path, kind="distributed")
    fresh = build("distributed", 0)
    with checkpointer(tmp_path, fresh, "positioned", 5) as ckpt:
        ckpt.resume()
        fresh["sampler"].set_epoch(0)
        with pytest.raises(mvc.BadInput, match="the loop starts epoch 0 of the loader, but the checkpoint is "
                           "in epoch 1 at batch 2"):
            iter(fresh["loader"])


def test_persistent_workers_are_refused_up_front(tmp_path):
    loader = DataLoader(Noisy(), batch_size=BATCH, num_workers=1, persistent_workers=True)
    with pytest.raises(mvc.BadInput, match="persistent_workers=True"):
        Checkpointer(tmp_path, model=torch.nn.Linear(1, 1), loader=loader)
    assert type(loader) is DataLoader
