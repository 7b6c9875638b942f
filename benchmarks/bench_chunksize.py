"""Chunk size for large dense tensors: does a chunk larger than the default pay?

Run ``python benchmarks/bench_chunksize.py [--size-mb 256] [--sizes 256,1024,4096,16384] [--repeat 3]``.
It builds one state of a few big tensors (half float32, half bfloat16; ``--size-mb`` MiB in
all) and, for each chunk size (KiB; the first is mvc's default unless ``--sizes`` says
otherwise), measures in a fresh repository:

- **first commit**: seconds, pack bytes, and index bytes (the pack index files plus what the
  LMDB index grew by: chunk locations and the tensor objects' chunk id lists), per chunk too;
- **small edit**: a few rows of one tensor changed (``--rows``, scattered as a fine-tuning
  run touches embedding rows), committed: seconds and bytes written (whole chunks), and what
  the edit costs once ``repack`` has made the older versions deltas against the newer ones
  (the stored bytes of base + edit after repack, less those of the base alone after repack);
- **dense update**: every value changed (an optimizer step, as in pre-training), committed
  after the edit: seconds and bytes written;
- **load** of the first commit (warm page cache).

``torch.save`` (+ fsync) and ``torch.load(weights_only=True)`` of the same state run in every
round as the baseline; times are the best of ``--repeat`` rounds, each round running every
chunk size and the baseline once, side by side (the machine is shared; the best round is the
least disturbed), and ratios are against the baseline's best. The repack figures come from one
pass per size (they are bytes, not times; repack's seconds are shown for scale).
``torch.set_num_threads(1)``; mvc's hashing and writing threads run as they do by default.
``docs/scale.md`` ("Chunk size") holds a run's output and what it decided.
"""

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

import mvc
from mvc.ondisk import DEFAULT_CHUNK_SIZE

MiB = 1 << 20
KiB = 1 << 10


def make_state(size_mb: int, tensors: int, seed: int = 0) -> dict:
    """``tensors`` big 2-D tensors of about ``size_mb`` MiB together, rows of 4096 values;
    the even ones float32, the odd ones bfloat16 (each dtype about half the bytes)."""
    g = torch.Generator().manual_seed(seed)
    width, per = 4096, size_mb * MiB // tensors
    state = {}
    for i in range(tensors):
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        rows = max(1, per // (width * (4 if dtype == torch.float32 else 2)))
        state[f"w{i}"] = (torch.randn(rows, width, generator=g) * 0.02).to(dtype)
    return state


def state_bytes(state: dict) -> int:
    return sum(t.nbytes for t in state.values())


def small_edit(state: dict, rows: int, seed: int = 1) -> dict:
    """``rows`` scattered rows of the first tensor changed (every value of them)."""
    g = torch.Generator().manual_seed(seed)
    new = dict(state)
    t = state["w0"].clone()
    picked = torch.randperm(t.shape[0], generator=g)[:rows]
    t[picked] += 0.001 * torch.randn(len(picked), t.shape[1], generator=g)
    new["w0"] = t
    return new


def dense_update(state: dict, seed: int = 2) -> dict:
    """Every value moved by about 1% of itself (enough to change every bfloat16 too)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, t in state.items():
        f = t.float()
        f = f + f.abs().clamp_min(1e-6) * (0.01 + 0.01 * torch.rand(f.shape, generator=g))
        out[k] = f.to(t.dtype)
    return out


def changed_share(old: dict, new: dict) -> float:
    same = total = 0
    for k, t in new.items():
        total += t.numel()
        same += int((old[k].view(torch.int16 if t.element_size() == 2 else torch.int32)
                     == t.view(torch.int16 if t.element_size() == 2 else torch.int32)).sum())
    return 1 - same / total


def torch_save(state: dict, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def disk(root: Path) -> dict:
    """Bytes of the repository's packs, pack index files and LMDB index."""
    mvc_dir = root / ".mvc"
    return {"packs": sum(p.stat().st_size for p in (mvc_dir / "packs").glob("*.pack")),
            "pidx": sum(p.stat().st_size for p in (mvc_dir / "packs").glob("*.pidx")),
            "lmdb": (mvc_dir / "index" / "data.mdb").stat().st_size}


class Best:
    def __init__(self):
        self.t = {}

    def time(self, key, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.t[key] = min(self.t.get(key, float("inf")), time.perf_counter() - start)
        return out


def round_for_size(best: Best, size: int, state, edited, dense, work: Path) -> dict:
    """One timed round at chunk size ``size``: commit, edit, dense update, load."""
    root = work / f"r{size}"
    repo = mvc.Repository.init(root, chunk_size=size)
    empty = disk(root)
    c1 = best.time(("commit", size), repo.commit, state, "base")
    first = disk(root)
    c2 = best.time(("edit", size), repo.commit, edited, "edit")
    c3 = best.time(("dense", size), repo.commit, dense, "dense")
    loaded = best.time(("load", size), repo.load, c1.id)
    assert all(torch.equal(loaded[k], state[k]) for k in state), "load differs from the state committed"
    del loaded
    repo.close()
    shutil.rmtree(root)
    return {"chunks": c1.stats.chunks, "packs": first["packs"],
            "index": first["pidx"] + first["lmdb"] - empty["lmdb"],
            "edit_chunks": c2.stats.chunks_new, "edit_bytes": c2.stats.bytes_new,
            "dense_bytes": c3.stats.bytes_new}


def stored_after_repack(size: int, states: list, work: Path) -> tuple:
    """(pack bytes after committing ``states`` in order and one repack, repack seconds)."""
    root = work / f"s{size}"
    repo = mvc.Repository.init(root, chunk_size=size)
    for i, s in enumerate(states):
        repo.commit(s, f"c{i}")
    start = time.perf_counter()
    repo.repack()
    seconds = time.perf_counter() - start
    repo.close()
    out = disk(root)["packs"]
    shutil.rmtree(root)
    return out, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=256, help="state size in MiB")
    ap.add_argument("--tensors", type=int, default=4, help="tensors in the state")
    ap.add_argument("--sizes", default=f"{DEFAULT_CHUNK_SIZE // KiB},1024,4096,16384",
                    help="chunk sizes in KiB, comma separated")
    ap.add_argument("--rows", type=int, default=8, help="rows of w0 the small edit changes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-repack", action="store_true", help="leave out the repack pass")
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MVC_AUTHOR", "bench")
    sizes = [int(x) * KiB for x in args.sizes.split(",") if x]
    state = make_state(args.size_mb, args.tensors)
    edited, total = small_edit(state, args.rows), state_bytes(state)
    dense = dense_update(edited)
    print(f"state: {len(state)} tensors, {total / MiB:.0f} MiB (float32 + bfloat16); small edit: {args.rows} "
          f"rows of w0 ({changed_share(state, edited):.4%} of values); dense update changes "
          f"{changed_share(edited, dense):.2%} of values; best of {args.repeat} rounds; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="mvc-bench-chunksize-", dir=args.dir))
    best, rows = Best(), {}
    try:
        saved = work / "state.pt"
        for r in range(args.repeat):
            best.time("torch.save", torch_save, state, saved)
            best.time("torch.load", lambda: torch.load(saved, weights_only=True))
            for size in sizes:
                rows[size] = round_for_size(best, size, state, edited, dense, work)
            print(f"round {r + 1}: load average {os.getloadavg()[0]:.2f}", flush=True)
        pt_bytes = saved.stat().st_size
        repacked = {}
        if not args.no_repack:
            for size in sizes:
                base, _ = stored_after_repack(size, [state], work)
                both, seconds = stored_after_repack(size, [state, edited], work)
                repacked[size] = (base, both, seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save, load = best.t["torch.save"], best.t["torch.load"]
    print(f"\ntorch.save + fsync {save:.3f} s ({pt_bytes / MiB:.1f} MiB), torch.load {load:.3f} s")
    print(f"{'chunk':>8} {'chunks':>7} {'commit':>8} {'/save':>6} {'packs':>9} {'index':>9} {'idx/chunk':>9} "
          f"{'edit':>7} {'/save':>6} {'edit wrote':>11} {'dense':>7} {'/save':>6} {'dense wrote':>11} "
          f"{'load':>7} {'/load':>6}")
    figures = {size: dict(rows[size], **{op: best.t[(op, size)] for op in ("commit", "edit", "dense", "load")})
               for size in sizes}  # one record per size: the table and the measured lines print the same values
    for size in sizes:
        f = figures[size]
        print(f"{size // KiB:>5}KiB {f['chunks']:>7} {f['commit']:7.3f}s {f['commit'] / save:6.3f} "
              f"{f['packs'] / MiB:8.1f}M {f['index'] / KiB:8.1f}K {f['index'] / f['chunks']:9.0f} "
              f"{f['edit']:6.3f}s {f['edit'] / save:6.3f} {f['edit_bytes'] / MiB:10.2f}M "
              f"{f['dense']:6.3f}s {f['dense'] / save:6.3f} {f['dense_bytes'] / MiB:10.1f}M "
              f"{f['load']:6.3f}s {f['load'] / load:6.3f}")
    if repacked:
        changed = args.rows * state["w0"].shape[1] * state["w0"].element_size()
        print(f"\nthe small edit once repacked (bytes of the {args.rows} rows that changed: {changed / KiB:.0f} KiB)")
        print(f"{'chunk':>8} {'base':>9} {'base+edit':>10} {'edit costs':>11} {'x changed':>10} {'repack':>8}")
        for size in sizes:
            base, both, seconds = repacked[size]
            print(f"{size // KiB:>5}KiB {base / MiB:8.1f}M {both / MiB:9.1f}M {(both - base) / KiB:10.0f}K "
                  f"{(both - base) / changed:10.2f} {seconds:7.2f}s")
    for size in sizes:
        f = dict(figures[size], save=save, torch_load=load)
        print(f"measured chunk={size} " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                                   for k, v in f.items())
              + (f" repacked_base={repacked[size][0]} repacked_edit={repacked[size][1]}" if repacked else ""))


if __name__ == "__main__":
    main()
