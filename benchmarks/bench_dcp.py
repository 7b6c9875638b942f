"""Sharded saves: mvc's DCP plugin against dcp.save with FileSystemWriter, 2 ranks on gloo (CPU).

    python benchmarks/bench_dcp.py [--size-mb 1024] [--saves 5] [--frozen 0.5] [--chunk-kb 256] [--rounds 5]

An MLP of about ``--size-mb`` MiB of float32 weights, sharded with FSDP2
``fully_shard`` over a CPU mesh of 2 ranks; its first ``--frozen`` share
of layers is frozen (no grad, not in the optimizer), the rest trains with
AdamW, so a checkpoint holds the weights plus two moments of the trained
layers (2x ``--size-mb`` with half frozen, of which 3/4 change every step). In the same run, each save goes both ways, both fsynced:

- **dcp**: ``dcp.save`` with ``FileSystemWriter`` into a new folder per save
  (DCP keeps one folder per checkpoint);
- **mvc**: ``dcp.save`` with ``MvcStorageWriter`` into one repository.

Printed: ``--rounds`` first saves into fresh repositories next to dcp.save (every round's
ratio, and how many are within 0.95), the first save of the run (mvc / dcp), the next saves with the frozen half
unchanged (mvc / dcp, median), storage after ``--saves`` saves against the
bytes that really differ (the first state plus every later save's trained
tensors), the peak resident memory of each rank during an mvc save over its
resident memory just before it (the buffer on top of its shard), and
resharding: the last commit loaded at world 1, saved there, and that commit
loaded at world 2 again, each compared bit for bit with the full state.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import mvc
from mvc_hooks.dcp import MvcStorageReader, MvcStorageWriter

WIDTH = 2048
PAGE = os.sysconf("SC_PAGE_SIZE")


def build(size_mb: int, world: int, seed: int, frozen: float):
    torch.manual_seed(seed)
    depth = max(2, round(size_mb * (1 << 20) / (WIDTH * WIDTH * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(depth)])
    for layer in model:  # unit gain per layer, so every trained layer gets a real gradient
        torch.nn.init.normal_(layer.weight, std=WIDTH ** -0.5)
    for layer in list(model)[:round(depth * frozen)]:
        layer.requires_grad_(False)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return model, opt


def train(model, opt, seed: int) -> None:
    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(seed))
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()


def digests(state: dict) -> dict:
    """{key: (BLAKE2 of this rank's shard bytes, their length)} of every tensor in a DCP state dict."""
    out = {}

    def visit(node, key):
        if isinstance(node, torch.Tensor):
            local = node.to_local() if hasattr(node, "to_local") else node
            raw = local.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            out[key] = (hashlib.blake2b(raw, digest_size=16).digest(), raw.nbytes)
        elif isinstance(node, dict):
            for k, v in node.items():
                visit(v, f"{key}.{k}")
    visit(state, "")
    return out


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRss:
    """The peak resident memory while the block runs, sampled every millisecond."""

    def __enter__(self):
        self.base = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def du(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def full(model, opt) -> dict:
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": msd, "optim": osd}


def equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


def init(rank: int, world: int, work: Path, phase: str) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{work / f'rdzv-{phase}'}", rank=rank, world_size=world,
                            timeout=timedelta(minutes=30))


def phase_saves(rank: int, world: int, work: Path, args) -> None:
    """Both writers, ``--saves`` times; rank 0 writes the numbers and the last full state."""
    init(rank, world, work, "saves")
    model, opt = build(args.size_mb, world, seed=0, frozen=args.frozen)
    train(model, opt, 0)
    repo = work / "repo"
    out = {"dcp": [], "mvc": [], "changed": [], "rss": [], "first": first_saves(rank, model, opt, work, args)}
    seen: dict = {}
    for n in range(args.saves):
        if n:
            train(model, opt, n)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        out["dcp"].append(timed(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(work / f"dcp-{n}"))))
        writer = MvcStorageWriter(repo, message=f"save {n}", step=n)
        with PeakRss() as peak:
            out["mvc"].append(timed(lambda: dcp.save(state, storage_writer=writer)))
        writer.close()
        shard = sum(t.to_local().numel() * t.to_local().element_size()
                    for t in list(msd.values()) + [v for s in osd["state"].values() for v in s.values()]
                    if hasattr(t, "to_local"))
        out["rss"].append([peak.peak - peak.base, shard])
        # the bytes that really differ: every tensor shard whose bytes are not those of the last save
        now = digests(state)
        changed = torch.tensor([sum(n for k, (d, n) in now.items() if seen.get(k, (None,))[0] != d)])
        dist.all_reduce(changed)
        out["changed"].append(int(changed))
        seen = now
    rss_all = [None] * world
    dist.all_gather_object(rss_all, out["rss"])
    ref = full(model, opt)
    if rank == 0:
        out["rss"] = rss_all
        out["storage_mvc"] = du(repo / ".mvc" / "packs")
        out["storage_dcp"] = sum(du(work / f"dcp-{n}") for n in range(args.saves))
        out["commit"] = writer.last_commit.id
        (work / "saves.json").write_text(json.dumps(out))
        torch.save(ref, work / "ref.pt")
    dist.barrier()
    dist.destroy_process_group()


def first_saves(rank: int, model, opt, work: Path, args) -> list:
    """[(dcp s, mvc s)] of ``--rounds`` first saves of the same state, each into a new folder and a
    new repository; which of the two goes first alternates, so neither always finds the page
    cache and the disk's writeback in the state the other left."""
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    out = []
    for r in range(args.rounds):
        if rank == 0:
            mvc.Repository.init(work / f"first-{r}", chunk_size=args.chunk_kb << 10).close()
        dist.barrier()
        writer = MvcStorageWriter(work / f"first-{r}", message="first save")
        steps = {"dcp": lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(work / f"first-dcp-{r}")),
                 "mvc": lambda: dcp.save(state, storage_writer=writer)}
        got = {}
        for name in (("dcp", "mvc") if r % 2 == 0 else ("mvc", "dcp")):
            os.sync()
            got[name] = timed(steps[name])
        writer.close()
        out.append((got["dcp"], got["mvc"]))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(work / f"first-{r}", ignore_errors=True)
            shutil.rmtree(work / f"first-dcp-{r}", ignore_errors=True)
    return out


def phase_reshard(rank: int, world: int, work: Path, args, rev: str, tag: str) -> None:
    """Load ``rev`` at this world size, compare with ref.pt; world 1 also saves it again."""
    init(rank, world, work, tag)
    model, opt = build(args.size_mb, world, seed=123, frozen=args.frozen)
    train(model, opt, 99)  # optimizer state to load into
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=MvcStorageReader(work / "repo", rev=rev))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    got = full(model, opt)
    result = {}
    if world == 1:
        writer = MvcStorageWriter(work / "repo", branch="world-1", message="saved at world 1")
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, storage_writer=writer)
        result["commit"] = writer.last_commit.id
        writer.close()
    if rank == 0:
        result["equal"] = equal(torch.load(work / "ref.pt", weights_only=True), got)
        (work / f"{tag}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--frozen", type=float, default=0.5, help="share of layers frozen")
    parser.add_argument("--chunk-kb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5, help="first saves of a fresh repository, each next to dcp")
    parser.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed after)")
    args = parser.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-dcp-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        mvc.Repository.init(work / "repo", chunk_size=args.chunk_kb << 10).close()
        mp.spawn(phase_saves, args=(2, work, args), nprocs=2)
        saves = json.loads((work / "saves.json").read_text())
        mp.spawn(phase_reshard, args=(1, work, args, saves["commit"], "to-1"), nprocs=1)
        to1 = json.loads((work / "to-1.json").read_text())
        mp.spawn(phase_reshard, args=(2, work, args, to1["commit"], "to-2"), nprocs=2)
        to2 = json.loads((work / "to-2.json").read_text())
        report(args, saves, to1, to2)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def report(args, s: dict, to1: dict, to2: dict) -> None:
    mib = 1 << 20
    state = s["changed"][0]
    print(f"FSDP2 MLP of {args.size_mb} MiB ({args.frozen:.0%} of layers frozen) + AdamW: a checkpoint of "
          f"{state / mib:.0f} MiB, of which {s['changed'][1] / state:.0%} changes each step; 2 ranks on gloo, "
          f"chunk size {args.chunk_kb} KiB, {args.saves} saves")
    print(f"first save      dcp {s['dcp'][0]:7.2f} s   mvc {s['mvc'][0]:7.2f} s   "
          f"ratio mvc/dcp {s['mvc'][0] / s['dcp'][0]:.2f}  (target <= 1.0)")
    firsts = [m / d for d, m in s["first"]]
    within = sum(r <= 0.95 for r in firsts)
    print(f"first saves, {len(firsts)} interleaved rounds, mvc/dcp: {' '.join(f'{r:.2f}' for r in firsts)}  "
          f"within 0.95 in {within} of {len(firsts)} (steady target: 4 of 5)")
    later = [m / d for m, d in zip(s["mvc"][1:], s["dcp"][1:])]
    print(f"next saves      dcp {statistics.median(s['dcp'][1:]):7.2f} s   mvc {statistics.median(s['mvc'][1:]):7.2f} s"
          f"   ratio mvc/dcp {statistics.median(later):.2f} (median; each: {', '.join(f'{r:.2f}' for r in later)})"
          "  (target <= 0.4)")
    differ = sum(s["changed"])
    print(f"storage         dcp {s['storage_dcp'] / mib:7.0f} MiB   mvc {s['storage_mvc'] / mib:7.0f} MiB   "
          f"bytes that differ {differ / mib:.0f} MiB   mvc/differ {s['storage_mvc'] / differ:.3f} (target <= 1.05)"
          f"   dcp/differ {s['storage_dcp'] / differ:.2f}")
    for rank, rows in enumerate(s["rss"]):
        extra = max(r[0] for r in rows)
        print(f"rank {rank} save    peak RSS over its resident state: {extra / mib:.0f} MiB "
              f"(its shard of the checkpoint: {rows[0][1] / mib:.0f} MiB)")
    print(f"reshard 2 -> 1  bit-equal: {to1['equal']}")
    print(f"reshard 1 -> 2  bit-equal: {to2['equal']}")


if __name__ == "__main__":
    sys.exit(main())
