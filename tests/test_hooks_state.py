"""Pieces of a checkpoint: RNG states, the resumable sampler, components, snapshots."""

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import mvc
from mvc_hooks import ResumableSampler, unwrap
from mvc_hooks import rng
from mvc_hooks.state import Components, Snapshot


def draws():
    return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.randn(),
            torch.rand(4).tolist(), torch.randn(2).tolist())


def test_rng_capture_and_restore_replays_every_generator(repo):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    np.random.randn()
    state = rng.capture()
    expected = draws()
    repo.commit({"rng": state}, message="rng")
    assert draws() != expected
    rng.restore(repo.load()["rng"])  # through the repository: tensors and plain values only
    assert draws() == expected


def test_rng_restore_rejects_something_else():
    with pytest.raises(mvc.BadInput):
        rng.restore({"python": {}})


def consume(loader):
    return [i for batch in loader for i in batch.tolist()]


def test_sampler_resumes_mid_epoch_with_the_same_order():
    full = ResumableSampler(10, seed=7)
    first_epoch = list(full)
    second_epoch = list(full)
    assert sorted(first_epoch) == list(range(10)) and first_epoch != second_epoch
    part = ResumableSampler(10, seed=7)
    it = iter(part)
    taken = [next(it) for _ in range(4)]
    state = part.state_dict()
    assert state["epoch"] == 0 and state["position"] == 4
    again = ResumableSampler(10, seed=7)
    again.load_state_dict(state)
    assert taken + list(again) == first_epoch
    assert list(again) == second_epoch  # moved on to epoch 1 by itself


def test_sampler_with_a_dataloader_and_set_epoch():
    sampler = ResumableSampler(20, seed=0)
    loader = DataLoader(list(range(20)), batch_size=3, sampler=sampler)
    it = iter(loader)
    seen = [next(it).tolist() for _ in range(2)]
    state = sampler.state_dict()
    assert state["position"] == 6  # with num_workers=0 the position is what the loop received
    resumed = ResumableSampler(20, seed=0)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # a resumed epoch keeps its position
    rest = consume(DataLoader(list(range(20)), batch_size=3, sampler=resumed))
    assert [i for b in seen for i in b] + rest == ResumableSampler(20, seed=0).indices(0)
    resumed.set_epoch(5)
    assert resumed.position == 0 and list(resumed) == ResumableSampler(20, seed=0).indices(5)


def test_sampler_at_the_end_of_an_epoch_resumes_into_the_next():
    sampler = ResumableSampler(6, seed=1)
    it = iter(sampler)
    order = [next(it) for _ in range(6)]
    state = sampler.state_dict()  # all handed out, the generator not yet exhausted
    resumed = ResumableSampler(6, seed=1)
    resumed.load_state_dict(state)
    assert list(resumed) == []  # the rest of epoch 0 is nothing
    assert list(resumed) == sampler.indices(1) and order == sampler.indices(0)


def test_sampler_shards_like_distributed_sampler():
    shards = [ResumableSampler(11, seed=3, num_replicas=3, rank=r) for r in range(3)]
    parts = [list(s) for s in shards]
    assert all(len(p) == 4 for p in parts)
    assert set().union(*parts) == set(range(11))
    reference = torch.utils.data.DistributedSampler(list(range(11)), num_replicas=3, rank=1, shuffle=False)
    assert list(ResumableSampler(11, shuffle=False, num_replicas=3, rank=1)) == list(reference)


def test_sampler_refuses_the_state_of_another_order():
    state = ResumableSampler(10, seed=1).state_dict()
    for other in (ResumableSampler(10, seed=2), ResumableSampler(11, seed=1),
                  ResumableSampler(10, seed=1, shuffle=False), ResumableSampler(10, seed=1, num_replicas=2)):
        with pytest.raises(mvc.BadInput, match="another data order"):
            other.load_state_dict(state)
    with pytest.raises(mvc.BadInput):
        ResumableSampler(10, num_replicas=2, rank=2)



def test_components_check_asks_the_sampler_before_anything_is_loaded():
    sampler = ResumableSampler(10, seed=1)
    saved = {"sampler": ResumableSampler(10, seed=0).state_dict()}
    with pytest.raises(mvc.BadInput, match=r"sampler does not match: .*another data order: seed 0 \(here 1\)"):
        Components(sampler=sampler).check(saved, "commit x")
    with pytest.raises(mvc.BadInput, match="not a ResumableSampler state"):
        Components(sampler=sampler).check({"sampler": {"epoch": "0"}}, "commit x")
    assert (sampler.epoch, sampler.position) == (0, 0)
    Components(sampler=sampler).check({"sampler": sampler.state_dict()}, "commit x")

def test_unwrap_strips_data_parallel_and_compile_wrappers():
    model = torch.nn.Linear(2, 2)
    wrapped = torch.nn.DataParallel(model)
    assert next(iter(wrapped.state_dict())).startswith("module.")
    assert unwrap(wrapped) is model
    state = Components(model=wrapped).state()
    assert set(state["model"]) == {"weight", "bias"}


def test_components_keep_the_shape_of_their_group():
    models = {"gen": torch.nn.Linear(2, 3), "disc": torch.nn.Linear(3, 1)}
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models.values()]
    gen = torch.Generator().manual_seed(5)
    parts = Components(model=models, optimizer=opts, stateful={"gen": gen}, scheduler=None)
    state = parts.state()
    assert set(state) == {"model", "optimizer", "stateful"}
    assert set(state["model"]) == {"gen", "disc"} and len(state["optimizer"]) == 2
    expected = torch.rand(3, generator=gen)
    parts.load(state)
    assert torch.equal(torch.rand(3, generator=gen), expected)


def test_components_check_names_what_does_not_match():
    model, other = torch.nn.Linear(2, 3), torch.nn.Linear(2, 4)
    saved = Components(model=model, optimizer=torch.optim.Adam(model.parameters())).state()
    with pytest.raises(mvc.BadInput, match=r"weight has shape \(3, 2\) in the checkpoint but \(4, 2\)"):
        Components(model=other).check(saved, "here", strict=False)
    with pytest.raises(mvc.BadInput, match="also holds optimizer"):
        Components(model=model).check(saved, "here")
    Components(model=model).check(saved, "here", strict=False)
    with pytest.raises(mvc.BadInput, match="no scheduler state"):
        opt = torch.optim.Adam(model.parameters())
        Components(model=model, scheduler=torch.optim.lr_scheduler.StepLR(opt, 2)).check(saved, "here", False)
    with pytest.raises(mvc.BadInput, match="holds one model"):
        Components(model=[model, model]).check(saved, "here", strict=False)
    two_groups = torch.optim.Adam([{"params": [model.weight]}, {"params": [model.bias]}])
    with pytest.raises(mvc.BadInput, match="1 parameter groups in the checkpoint, 2 here"):
        Components(model=model, optimizer=two_groups).check(saved, "here")


def test_optimizer_state_shapes_are_checked():
    model = torch.nn.Linear(2, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    saved = Components(model=model, optimizer=opt).state()
    saved["optimizer"]["state"][0]["exp_avg"] = torch.zeros(5, 2)
    with pytest.raises(mvc.BadInput, match="'exp_avg' of parameter 0 has shape"):
        Components(model=model, optimizer=torch.optim.Adam(model.parameters())).check(saved, "here")


def test_component_without_state_dict_is_refused():
    with pytest.raises(mvc.BadInput, match="no state_dict"):
        Components(stateful={"x": object()})


def test_snapshot_copies_are_unaffected_by_training_and_reuse_buffers():
    model = torch.nn.Linear(3, 3)
    tied = {"a": model.weight, "b": model.weight, "n": [1, (2, "x")]}
    snap = Snapshot()
    copy = snap.take(tied)
    snap.wait()
    before = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1)
    assert torch.equal(copy["a"], before) and copy["a"] is copy["b"]
    assert copy["n"] == [1, (2, "x")]
    again = snap.take(tied)
    assert again["a"].data_ptr() == copy["a"].data_ptr()  # the same buffer, refilled
    assert torch.equal(again["a"], model.weight.detach())


def test_a_deferred_snapshot_copies_later_and_refuses_a_torn_copy():
    from mvc_hooks.state import Snapshot, TornSnapshot
    weight, buffer = torch.arange(6.0), torch.ones(2)
    snap = Snapshot()
    copy = snap.take({"w": weight, "b": buffer}, defer=lambda t: t is weight or t.data_ptr() == weight.data_ptr())
    buffer.add_(1)  # copied at take: the change does not reach the copy
    assert torch.equal(copy["b"], torch.ones(2))
    snap.fill()  # the save thread's copy of the deferred tensor
    snap.filled()
    assert torch.equal(copy["w"], torch.arange(6.0))
    copy = snap.take({"w": weight, "b": buffer}, defer=lambda t: t.data_ptr() == weight.data_ptr())
    with torch.no_grad():
        weight.mul_(2)  # changed in place before the copy was made
    with pytest.raises(TornSnapshot, match="w changed in place before its checkpoint copy was taken"):
        snap.fill()
    snap.filled()  # never left waiting after a failure
