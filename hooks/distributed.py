"""What the Checkpointer needs from torch.distributed, and nothing when it is off.

Rank 0 is the **root**: it alone opens the repository. Commits gather what
differs per rank (RNG and sampler states) at the root; resumes broadcast the
root's loaded state to every rank, so no other rank needs the repository's
filesystem. Plain structure travels with torch.distributed's object
collectives (its own transport between the ranks of one job); tensor data
travels as raw bytes in a few large broadcasts, so every dtype arrives
bit for bit. With the NCCL backend the buffers live on the current CUDA
device, as NCCL requires: call ``torch.cuda.set_device(local_rank)`` before
creating the Checkpointer.
"""

import socket
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

import mvc

BUCKET_BYTES = 64 << 20


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def describe() -> dict:
    """The distributed setup, for the training context (a collective when active)."""
    if not active():
        return {"enabled": False, "world_size": 1, "rank": 0, "nodes": 1, "ranks_per_node": 1}
    hosts = all_gather(socket.gethostname())
    per_node = Counter(hosts)
    return {"enabled": True, "world_size": dist.get_world_size(), "rank": dist.get_rank(),
            "backend": str(dist.get_backend()), "nodes": len(per_node),
            "ranks_per_node": max(per_node.values()), "hosts": sorted(per_node)}


def agree(decision: bool) -> bool:
    """The root's decision, on every rank."""
    if not active():
        return decision
    flag = torch.tensor([1 if decision else 0], dtype=torch.uint8, device=_device())
    dist.broadcast(flag, 0)
    return bool(flag.item())


def share(value: Any) -> Any:
    """The root's ``value`` (plain data), on every rank."""
    if not active():
        return value
    box = [value]
    dist.broadcast_object_list(box, 0)
    return box[0]


def all_gather(value: Any) -> list:
    """Every rank's ``value`` (plain data), in rank order, on every rank."""
    if not active():
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def gather(value: Any) -> Optional[list]:
    """Every rank's ``value``, in rank order, at the root (None elsewhere)."""
    if not active():
        return [value]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(value, out, dst=0)
    return out


@dataclass(frozen=True)
class _Slot:
    """Where a tensor was in the structure: its bytes are in the buckets."""

    index: int
    dtype: torch.dtype
    shape: tuple


def _strip(node, tensors: list):
    def leaf(value):
        if not isinstance(value, torch.Tensor):
            return value
        tensors.append(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8))
        return _Slot(len(tensors) - 1, value.dtype, tuple(value.shape))
    return mvc.traverse.map_leaves(node, leaf)


def _fill(node, received: list):
    def leaf(value):
        if not isinstance(value, _Slot):
            return value
        # clone: a slice of a bucket need not be aligned for the dtype
        return received[value.index].clone().view(value.dtype).reshape(value.shape)
    return mvc.traverse.map_leaves(node, leaf)


def _buckets(sizes: list) -> list:
    """Groups of consecutive tensor indices of at most BUCKET_BYTES (or one tensor)."""
    buckets, current, total = [], [], 0
    for i, n in enumerate(sizes):
        if current and total + n > BUCKET_BYTES:
            buckets.append(current)
            current, total = [], 0
        current.append(i)
        total += n
    if current:
        buckets.append(current)
    return buckets


def broadcast_state(state: Any) -> Any:
    """The root's ``state`` (nested containers of tensors and plain values), on every rank.

    Tensors arrive on the CPU with their exact dtype, shape and bytes.
    """
    if not active():
        return state
    root = dist.get_rank() == 0
    tensors: list = []
    skeleton = _strip(state, tensors) if root else None
    sizes = [t.numel() for t in tensors] if root else None
    skeleton, sizes = share((skeleton, sizes))
    received = []
    device = _device()
    for bucket in _buckets(sizes):
        if root:
            buffer = torch.cat([tensors[i] for i in bucket]).to(device)
        else:
            buffer = torch.empty(sum(sizes[i] for i in bucket), dtype=torch.uint8, device=device)
        dist.broadcast(buffer, 0)
        buffer = buffer.cpu()
        offset = 0
        for i in bucket:
            received.append(buffer[offset:offset + sizes[i]])
            offset += sizes[i]
    return _fill(skeleton, received)
