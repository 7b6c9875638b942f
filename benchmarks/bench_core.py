"""Core benchmark: mvc commit / load against torch.save / torch.load, in one run.

Run ``python benchmarks/bench_core.py [--size-mb 1024] [--repeat 3]``. It builds
a transformer-like state (an embedding, N blocks of attention and MLP weights
in float32 and bfloat16, an LM head) of about ``--size-mb`` MiB and prints:

- full commit of a new state (into an empty repository) vs ``torch.save`` +
  fsync of the same state (target ratio <= 1.0);
- commit after about 10% of the bytes changed vs ``torch.save`` (<= 0.25);
- ``load`` vs ``torch.load(weights_only=True)`` (<= 1.0), both with a warm
  page cache and with the files dropped from it (posix_fadvise DONTNEED;
  a virtual machine's host may still cache them, so "cold" is an upper bound
  on how cold the reads really are);
- repository size after 10 checkpoints of a fine-tuning run (only the last
  two blocks and a few embedding rows change) vs the bytes that really
  differ: the first checkpoint's bytes plus, for every later one, the bytes
  of the tensor elements that changed since the one before (<= 1.05).

Times are the best of ``--repeat`` rounds; each round runs every mvc and
torch measurement once, side by side, so both see the same background load
(the machines are shared and noisy; the best run is the least disturbed). ``--chunk-sizes`` instead
measures commit time, load time and fine-tuning storage for chunk sizes from
64 KiB to 4 MiB, which is how the default chunk size was chosen.
"""

import argparse
import gc
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

import mvc

MiB = 1 << 20
CHUNK_SIZES = [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20]
TARGETS = {"commit_full": 1.0, "commit_10pct": 0.25, "load_warm": 1.0, "load_cold": 1.0, "storage": 1.05}


# -- the state -----------------------------------------------------------


def make_state(size_mb: int, seed: int = 0) -> dict:
    """A transformer-like state dict of about ``size_mb`` MiB.

    Blocks alternate float32 and bfloat16 so both dtypes are measured; the
    embedding is float32 (the tensor whose rows a fine-tuning run touches).
    """
    g = torch.Generator().manual_seed(seed)
    budget = size_mb * MiB
    width = 1024 if size_mb >= 256 else 256
    vocab = max(1024, min(32000, budget // (8 * width * 4)))

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    state = {"embed.weight": rand(vocab, width)}
    used = state["embed.weight"].nbytes * 2  # the LM head below is as large
    block_bytes = 12 * width * width * 3  # float32 and bfloat16 blocks, on average
    n_blocks = max(2, int((budget - used) // block_bytes))
    for i in range(n_blocks):
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        p = f"blocks.{i}."
        state[p + "attn.qkv.weight"] = rand(3 * width, width, dtype=dtype)
        state[p + "attn.out.weight"] = rand(width, width, dtype=dtype)
        state[p + "mlp.up.weight"] = rand(4 * width, width, dtype=dtype)
        state[p + "mlp.down.weight"] = rand(width, 4 * width, dtype=dtype)
        state[p + "norm1.weight"] = torch.ones(width, dtype=dtype)
        state[p + "norm2.weight"] = torch.ones(width, dtype=dtype)
    state["norm.weight"] = torch.ones(width)
    state["lm_head.weight"] = rand(vocab, width)
    return state


def state_bytes(state: dict) -> int:
    return sum(t.nbytes for t in state.values())


def block_keys(state: dict, block: int) -> list:
    return [k for k in state if k.startswith(f"blocks.{block}.")]


def n_blocks(state: dict) -> int:
    return 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))


def change_tenth(state: dict, step: int) -> dict:
    """A copy of ``state`` in which whole tensors holding ~10% of the bytes
    changed, to values no earlier ``step`` produced."""
    new = dict(state)
    target, changed = state_bytes(state) // 10, 0
    keys = [k for k in state if k.startswith("blocks.")]
    start = (step * 7) % len(keys)
    for k in keys[start:] + keys[:start]:
        if changed >= target:
            break
        new[k] = state[k] + (step + 1)
        changed += state[k].nbytes
    return new


def fine_tune_step(state: dict, step: int, rows: int = 8) -> dict:
    """The next checkpoint of a run with frozen layers: the last two blocks,
    the final norm and ``rows`` embedding rows change (every element of
    them, by 1-2%, which also changes every bfloat16 value)."""
    g = torch.Generator().manual_seed(1000 + step)

    def nudge(t):
        return (t.float() * (1.01 + 0.01 * torch.rand(t.shape, generator=g))).to(t.dtype)

    new = dict(state)
    last = n_blocks(state)
    for k in block_keys(state, last - 1) + block_keys(state, last - 2) + ["norm.weight"]:
        new[k] = nudge(state[k])
    embed = state["embed.weight"].clone()
    picked = torch.randperm(embed.shape[0], generator=g)[:rows]
    embed[picked] = nudge(embed[picked])
    new["embed.weight"] = embed
    return new


def changed_bytes(old: dict, new: dict) -> int:
    """Bytes of the elements that differ bitwise between two states."""
    total = 0
    for k, t in new.items():
        a, b = old[k], t
        if a is b:
            continue
        width = t.element_size()
        as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
        total += int((a.view(as_int) != b.view(as_int)).sum()) * width
    return total


# -- timing helpers --------------------------------------------------------


class Timings:
    """Wall times by measurement name, collected in rounds; the best counts.

    Every round runs each measurement once, mvc and torch side by side, so
    both see the same background load (the machines are shared and noisy).
    """

    def __init__(self):
        self.times = defaultdict(list)

    def time(self, name: str, fn, *args, **kwargs):
        gc.collect()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        self.times[name].append(time.perf_counter() - start)
        return result

    def best(self, name: str) -> float:
        return min(self.times[name])


def torch_save(state: dict, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def torch_load(path: Path):
    return torch.load(path, weights_only=True)


def drop_cache(paths) -> None:
    """Ask the kernel to drop these files' clean pages from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def repo_files(root: Path) -> list:
    return [p for p in (root / ".mvc").rglob("*") if p.is_file()]


def repo_size(root: Path) -> int:
    return sum(p.stat().st_size for p in repo_files(root))


class Scratch:
    """Fresh directories under one temporary folder, removed at the end."""

    def __init__(self, parent):
        self.base = Path(tempfile.mkdtemp(prefix="mvc-bench-", dir=parent))
        self.n = 0

    def new(self) -> Path:
        self.n += 1
        path = self.base / f"d{self.n}"
        path.mkdir()
        return path

    def remove(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


# -- measurements ------------------------------------------------------------


def time_save(t: Timings, state, scratch) -> None:
    path = scratch.new() / "state.pt"
    t.time("torch.save", torch_save, state, path)
    scratch.remove(path.parent)


def time_full_commit(t: Timings, state, scratch, chunk_size) -> None:
    repo = mvc.Repository.init(scratch.new(), chunk_size=chunk_size)
    t.time("commit", repo.commit, state, "full")
    repo.close()
    scratch.remove(repo.root)


def time_loads(t: Timings, repo, commit_id, saved: Path, cold: bool) -> None:
    t.time("torch.load", torch_load, saved)
    t.time("load", repo.load, commit_id)
    if cold:
        drop_cache([saved])
        t.time("torch.load cold", torch_load, saved)
        drop_cache(repo_files(repo.root))
        t.time("load cold", repo.load, commit_id)


def measure_storage(state, scratch, chunk_size, checkpoints=10, rows=8) -> dict:
    """Commit a fine-tuning run; repository size vs the bytes that really differ."""
    root = scratch.new()
    repo = mvc.Repository.init(root, chunk_size=chunk_size)
    current, differ, commit_time = state, state_bytes(state), 0.0
    repo.commit(current, "checkpoint 0", step=0)
    for step in range(1, checkpoints):
        new = fine_tune_step(current, step, rows)
        differ += changed_bytes(current, new)
        start = time.perf_counter()
        repo.commit(new, f"checkpoint {step}", step=step)
        commit_time += time.perf_counter() - start
        current = new
    repo.close()
    size = repo_size(root)
    packs = sum(p.stat().st_size for p in (root / ".mvc" / "packs").glob("*.pack"))
    scratch.remove(root)
    return {"size": size, "packs": packs, "differ": differ, "ratio": size / differ,
            "commit_time": commit_time / max(1, checkpoints - 1)}


# -- reports ---------------------------------------------------------------


def verdict(name: str, ratio: float) -> str:
    return "ok" if ratio <= TARGETS[name] else "MISSED"


def run_main(args, scratch) -> None:
    state = make_state(args.size_mb)
    total = state_bytes(state)
    print(f"state: {len(state)} tensors, {total / MiB:.0f} MiB (float32 + bfloat16), "
          f"chunk size {args.chunk_size // 1024} KiB, best of {args.repeat} interleaved rounds, "
          f"{os.cpu_count()} CPUs", flush=True)
    saved = scratch.new() / "state.pt"
    torch_save(state, saved)
    repo = mvc.Repository.init(scratch.new(), chunk_size=args.chunk_size)
    base = repo.commit(state, "base")
    t, share = Timings(), 0.0
    torch_load(saved), repo.load(base.id)  # warm the code paths
    for i in range(args.repeat):
        time_save(t, state, scratch)
        time_full_commit(t, state, scratch, args.chunk_size)
        changed = change_tenth(state, i)
        c = t.time("commit 10%", repo.commit, changed, "10%")
        share = max(share, c.stats.bytes_new / c.stats.bytes_total)
        del changed
        time_loads(t, repo, base.id, saved, cold=True)
    repo.close()
    storage = measure_storage(state, scratch, args.chunk_size, rows=args.rows)

    rows = [
        ("commit_full", "full commit of a new state", "commit", "torch.save + fsync", "torch.save"),
        ("commit_10pct", f"commit, {share:.0%} of bytes new", "commit 10%", "torch.save + fsync", "torch.save"),
        ("load_warm", "load (warm page cache)", "load", "torch.load", "torch.load"),
        ("load_cold", "load (dropped from cache)", "load cold", "torch.load", "torch.load cold"),
    ]
    print()
    print(f"{'measurement':34} {'mvc':>9} {'baseline':>22} {'ratio':>7} {'target':>7}")
    for name, what, mine_key, base_name, theirs_key in rows:
        mine, theirs = t.best(mine_key), t.best(theirs_key)
        ratio = mine / theirs
        print(f"{what:34} {mine:8.3f}s {base_name:>13} {theirs:7.3f}s {ratio:7.3f} "
              f"{'<= ' + str(TARGETS[name]):>7} {verdict(name, ratio)}")
        print(f"{'':34} {total / mine / 1e9:7.2f}GB/s {'':13} {total / theirs / 1e9:5.2f}GB/s")
    ratio = storage["ratio"]
    print(f"{'storage, 10 fine-tuning ckpts':34} {storage['size'] / MiB:7.1f}MiB {'bytes differing':>13} "
          f"{storage['differ'] / MiB:6.1f}MiB {ratio:7.3f} {'<= 1.05':>7} {verdict('storage', ratio)}")
    print(f"  (packs {storage['packs'] / MiB:.1f} MiB, index and FORMAT "
          f"{(storage['size'] - storage['packs']) / MiB:.1f} MiB; {args.rows} embedding rows + last 2 blocks "
          f"change per checkpoint; mean commit {storage['commit_time']:.3f}s)")


def run_chunk_sizes(args, scratch) -> None:
    state = make_state(args.size_mb)
    total = state_bytes(state)
    print(f"state: {len(state)} tensors, {total / MiB:.0f} MiB, best of {args.repeat} interleaved rounds "
          f"per size, {os.cpu_count()} CPUs; ratios against torch.save + fsync / torch.load of the same rounds")
    saved = scratch.new() / "state.pt"
    torch_save(state, saved)
    print()
    print(f"{'chunk':>8} {'commit':>8} {'ratio':>6} {'load':>7} {'ratio':>6} {'ft commit':>10} "
          f"{'storage':>9} {'ratio':>6} {'index':>7}")
    for size in args.sizes:
        repo = mvc.Repository.init(scratch.new(), chunk_size=size)
        base = repo.commit(state, "base")
        t = Timings()
        for _ in range(args.repeat):
            time_save(t, state, scratch)
            time_full_commit(t, state, scratch, size)
            time_loads(t, repo, base.id, saved, cold=False)
        repo.close()
        scratch.remove(repo.root)
        st = measure_storage(state, scratch, size, rows=args.rows)
        commit, load = t.best("commit"), t.best("load")
        print(f"{size // 1024:>5}KiB {commit:7.3f}s {commit / t.best('torch.save'):6.3f} {load:6.3f}s "
              f"{load / t.best('torch.load'):6.3f} {st['commit_time']:9.3f}s {st['size'] / MiB:8.1f}M "
              f"{st['ratio']:6.3f} {(st['size'] - st['packs']) / MiB:6.1f}M", flush=True)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=1024, help="state size in MiB (default 1024)")
    p.add_argument("--repeat", type=int, default=3, help="runs per timing; the best counts (default 3)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="chunk size in bytes (default: mvc's default chunk size)")
    p.add_argument("--rows", type=int, default=8, help="embedding rows changed per fine-tuning checkpoint")
    p.add_argument("--chunk-sizes", action="store_true",
                   help="compare chunk sizes from 64 KiB to 4 MiB instead of the main report")
    p.add_argument("--sizes", type=lambda s: [int(x) * 1024 for x in s.split(",")], default=CHUNK_SIZES,
                   help="with --chunk-sizes: comma-separated sizes in KiB")
    p.add_argument("--dir", default=None, help="where to put scratch files (default: the system temp dir)")
    args = p.parse_args()
    if args.chunk_size is None:
        from mvc.repository import DEFAULT_CHUNK_SIZE
        args.chunk_size = DEFAULT_CHUNK_SIZE
    return args


def main() -> None:
    args = parse_args()
    scratch = Scratch(args.dir)
    try:
        if args.chunk_sizes:
            run_chunk_sizes(args, scratch)
        else:
            run_main(args, scratch)
    finally:
        scratch.close()


if __name__ == "__main__":
    main()
