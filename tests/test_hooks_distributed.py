"""Two real ranks (gloo on CPU, DDP): rank 0 commits, a resumed run continues bit for bit.

Each rank shuffles its own shard and draws its own dropout masks, so the
per-rank RNG and sampler states must come back to the right rank. Rank 1 is
given a repository path that does not exist: it must never need it. Any
error on one rank is raised on every rank, so none waits forever.
"""

import time
from datetime import timedelta
from pathlib import Path

import pytest

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import mvc
from ranks import rank_process
from mvc_hooks import Checkpointer, ResumableSampler

WORLD, N = 2, 6  # 2N steps in all; each rank's shard is 4 batches, so epochs roll over


def build(rank):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    torch.manual_seed(100 + rank)  # each rank its own dropout stream
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    sampler = ResumableSampler(data, seed=3, num_replicas=WORLD, rank=rank)
    loader = DataLoader(data, batch_size=8, sampler=sampler, generator=torch.Generator())
    return ddp, opt, sched, sampler, loader


def run(parts, ckpt, start, stop):
    ddp, opt, sched, sampler, loader = parts
    losses, step = {}, start
    while step < stop:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses[step] = loss.item()
            if ckpt is not None:
                ckpt.step(step, loss=loss.item(), epoch=sampler.epoch)
            step += 1
            if step >= stop:
                break
    return losses


def checkpointer(parts, path):
    ddp, opt, sched, sampler, _ = parts
    # every_n_seconds makes the policy time-based, so rank 0's decision is broadcast
    return Checkpointer(path, model=ddp, optimizer=opt, scheduler=sched, sampler=sampler, branch="run",
                        every_n_steps=N, every_n_seconds=3600)


def worker(rank, root):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank, world_size=WORLD)
    with rank_process():  # ends the process: see tests/ranks.py
        straight_parts = build(rank)
        straight = run(straight_parts, None, 0, 2 * N)

        path = root / "repo" if rank == 0 else root / f"not-shared-{rank}"
        first = build(rank)
        with checkpointer(first, path) as ckpt:
            assert ckpt.resume() == 0
            losses = run(first, ckpt, 0, N)
            ckpt.step(N, loss=0.0)  # a step that is not committed: the resume goes back to N

        second = build(rank)
        with checkpointer(second, path) as ckpt:
            assert ckpt.resume() == N
            assert second[3].state_dict()["rank"] == rank
            losses.update(run(second, ckpt, N, 2 * N))

        assert losses == straight
        for a, b in zip(second[0].parameters(), straight_parts[0].parameters()):
            assert torch.equal(a, b)
        assert torch.equal(second[1].state_dict()["state"][0]["exp_avg"],
                           straight_parts[1].state_dict()["state"][0]["exp_avg"])
        if rank != 0:
            assert not path.exists()


def test_two_rank_ddp_run_resumes_with_the_same_losses(tmp_path):
    mp.spawn(worker, args=(tmp_path,), nprocs=WORLD, join=True)
    with mvc.Repository.open(tmp_path / "repo") as repo:
        log = list(repo.log("run"))
        assert [c.step for c in log] == [2 * N - 1, N - 1]
        state = repo.load("run")
        context = log[0].context
    assert not any(key.startswith("module.") for key in state["model"])
    assert state["world_size"] == WORLD and len(state["ranks"]) == WORLD
    rank0, rank1 = state["ranks"]
    assert (rank0["sampler"]["rank"], rank1["sampler"]["rank"]) == (0, 1)
    assert not torch.equal(rank0["rng"]["torch"], rank1["rng"]["torch"])
    assert context["distributed"]["world_size"] == WORLD and context["distributed"]["backend"] == "gloo"
    assert context["distributed"]["ranks_per_node"] == WORLD
    assert not Path(tmp_path / "not-shared-1").exists()


class RankSampler:
    """A sampler whose loader refuses every saved state on the rank told to."""

    def __init__(self, refuse: bool):
        self.refuse, self.position = refuse, 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        if self.refuse:
            raise ValueError("this rank refuses the saved sampler state")
        self.position = state["position"]


def failing_worker(rank, root):
    torch.set_num_threads(1)
    # a lost rank fails its collective after a minute instead of hanging the test for half an hour
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    with rank_process():  # ends the process: see tests/ranks.py
        path = root / "repo" if rank == 0 else root / f"not-shared-{rank}"
        model = torch.nn.Linear(2, 2)
        patch = pytest.MonkeyPatch()

        def broken(*args, **kwargs):
            raise OSError(5, "Input/output error (injected)")
        if rank == 0:
            patch.setattr(mvc.Repository, "open", broken)
        with pytest.raises(OSError if rank == 0 else mvc.MvcError, match="Input/output error") as info:
            Checkpointer(path, model=model, branch="run")
        assert rank == 0 or "on rank 0" in str(info.value)
        patch.undo()

        sampler = RankSampler(refuse=False)
        with Checkpointer(path, model=model, sampler=sampler, branch="run", async_save=False) as ckpt:
            sampler.position = 5 + rank
            ckpt.save(step=0)

        if rank == 0:
            patch.setattr(mvc.Repository, "load", broken)
        with Checkpointer(path, model=model, sampler=RankSampler(refuse=False), branch="run") as ckpt:
            with pytest.raises(OSError if rank == 0 else mvc.MvcError, match="Input/output error"):
                ckpt.resume()
        patch.undo()

        # rank 1's sampler refuses after rank 0's loaded: rank 0's is put back as it was
        sampler = RankSampler(refuse=rank == 1)
        with torch.no_grad():
            model.weight.add_(1.0)
        weights = [p.detach().clone() for p in model.parameters()]
        with Checkpointer(path, model=model, sampler=sampler, branch="run") as ckpt:
            with pytest.raises(mvc.BadInput, match="refuses the saved sampler state"):
                ckpt.resume()
            assert sampler.position == 0
            assert all(torch.equal(a, b) for a, b in zip(model.parameters(), weights))
            assert ckpt.resumed_from is None
        dist.barrier()  # every rank is still in step


def test_an_error_on_one_rank_is_raised_on_every_rank(tmp_path):
    context = mp.spawn(failing_worker, args=(tmp_path,), nprocs=WORLD, join=False)
    deadline = time.monotonic() + 300  # only a hung rank gets near this
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("a rank still waits in a collective: an error was not raised on every rank")
