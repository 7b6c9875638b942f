"""A shuffling sampler that can stop in the middle of an epoch and go on.

The order of epoch ``e`` is a permutation drawn from a generator seeded with
``seed + e``, so it depends on nothing but the seed, the epoch and the
dataset size, never on the global RNG. The **position** is how many indices
of the current epoch this replica has handed out. ``state_dict()`` is
(epoch, position); after ``load_state_dict`` the next iteration hands out
the rest of that epoch. When an epoch's indices run out the sampler moves
to the next epoch by itself, so both loop styles work:

    for epoch in range(ckpt.epoch or 0, epochs):   # with set_epoch
        sampler.set_epoch(epoch)                    # keeps a resumed position
        for batch in loader: ...

    while True:                                     # or without
        for batch in loader: ...

The position counts what the DataLoader took from the sampler. With
``num_workers=0`` that is exactly the batches the loop received. Workers
prefetch ``num_workers * prefetch_factor`` batches, which a resume skips;
use torchdata's ``StatefulDataLoader`` as the ``sampler`` component of the
Checkpointer when that matters.

Give the DataLoader a generator of its own (``generator=torch.Generator()``):
without one it draws a seed from the global torch RNG each time an
iteration starts, so a run resumed mid-epoch would draw once more than an
uninterrupted one and take other dropout masks from there on.

With ``num_replicas`` > 1 each replica gets every ``num_replicas``-th index
of the (padded) permutation, as ``DistributedSampler`` does.
"""

import math
from typing import Optional

import torch
from torch.utils.data import Sampler

import mvc


class ResumableSampler(Sampler):
    """Shuffled (or sequential) indices of ``data`` (a sized dataset or a length)."""

    def __init__(self, data, shuffle: bool = True, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0, drop_last: bool = False):
        size = data if isinstance(data, int) else len(data)
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise mvc.BadInput(f"rank {rank} is not in range for {num_replicas} replicas")
        self.size = size
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        if drop_last:
            self.num_samples = size // num_replicas
        else:
            self.num_samples = math.ceil(size / num_replicas)
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning, unless it is the epoch in progress."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def indices(self, epoch: int) -> list:
        """This replica's indices of ``epoch``, in order."""
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + epoch)
            order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        total = self.num_samples * self.num_replicas
        if total > len(order):  # pad by repeating, so every replica gets as many
            order += (order * math.ceil(total / max(1, len(order))))[:total - len(order)]
        return order[:total][self.rank::self.num_replicas]

    def __iter__(self):
        for index in self.indices(self.epoch)[self.position:]:
            self.position += 1
            yield index
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "size": self.size, "shuffle": self.shuffle, "num_replicas": self.num_replicas,
                "rank": self.rank, "num_samples": self.num_samples}

    def state_problem(self, state) -> Optional[str]:
        """What makes ``state`` unfit for this sampler, or None: another order
        (seed, dataset size, shuffling or sharding differ) would make its
        position point at other samples."""
        if not (isinstance(state, dict) and isinstance(state.get("epoch"), int)
                and isinstance(state.get("position"), int)):
            return "the saved state is not a ResumableSampler state"
        mine = self.state_dict()
        differ = [k for k in ("seed", "size", "shuffle", "num_replicas", "rank", "num_samples")
                  if state.get(k) != mine[k]]
        if not differ:
            return None
        shown = ", ".join(f"{k} {state.get(k)!r} (here {mine[k]!r})" for k in differ)
        return (f"the sampler state is for another data order: {shown}; "
                "use the dataset and sampler settings of the checkpointed run")

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` was taken.

        Raises mvc.BadInput when ``state_problem`` finds one.
        """
        problem = self.state_problem(state)
        if problem:
            raise mvc.BadInput(problem)
        self.epoch = state["epoch"]
        self.position = state["position"]
