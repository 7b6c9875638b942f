"""The loop an ordinary DDP run has: DistributedSampler + set_epoch, no generator, two gloo ranks.

Each rank draws its own dropout masks and loads its own shard with noise
from its own RNG; rank 0 commits, both resume. Stopped after step 12 with
the last commit at step 9 (batch 2 of epoch 2 of each rank's shard), the
resumed run must repeat the uninterrupted run's losses and weights bit for
bit on both ranks, whether the Checkpointer positions the loader or the
loop iterates past the seen batches, with and without worker processes.
"""

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from ranks import rank_process
from mvc_hooks import Checkpointer
from test_hooks_data import BATCH, Noisy
from test_hooks_data import train as train_loop

WORLD, EPOCHS = 2, 4
SHARD_BATCHES = 4  # 64 samples over 2 ranks in batches of 8
TOTAL = EPOCHS * SHARD_BATCHES


def build(rank, workers):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    torch.manual_seed(100 + rank)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.01)
    data = Noisy()
    sampler = DistributedSampler(data, num_replicas=WORLD, rank=rank, seed=3)
    # fork: a rank started by mp.spawn would spawn its workers too, seconds each
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    return ddp, opt, sampler, loader


def train(parts, style, start, stop, ckpt=None):
    ddp, opt, sampler, loader = parts
    return train_loop({"model": ddp, "opt": opt, "sampler": sampler, "loader": loader}, style, start, stop,
                      ckpt, batches=SHARD_BATCHES, epochs=EPOCHS)


def worker(rank, root: Path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root / 'rendezvous'}", rank=rank, world_size=WORLD)
    with rank_process():  # ends the process: see tests/ranks.py
        for style, workers in (("positioned", 0), ("skip-epoch", 0), ("skip-all", 2)):
            straight = build(rank, workers)
            want = train(straight, style, 0, TOTAL)
            path = root / f"repo-{style}-{workers}"
            first = build(rank, workers)
            ckpt_args = dict(branch="run", loop_skips=style != "positioned", every_n_steps=5, async_save=False)
            with Checkpointer(path, model=first[0], optimizer=first[1], loader=first[3], **ckpt_args) as ckpt:
                losses = train(first, style, 0, 13, ckpt)
            second = build(rank, workers)
            with Checkpointer(path, model=second[0], optimizer=second[1], loader=second[3], **ckpt_args) as ckpt:
                start = ckpt.resume()
                assert start == 10
                losses.update(train(second, style, start, TOTAL, ckpt))
            assert losses == want, (style, workers, rank)
            for a, b in zip(second[0].parameters(), straight[0].parameters()):
                assert torch.equal(a, b), (style, workers, rank)


def test_ddp_with_a_distributed_sampler_and_no_generator_resumes_bit_for_bit(tmp_path):
    mp.spawn(worker, args=(tmp_path,), nprocs=WORLD, join=True)
