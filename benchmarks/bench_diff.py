"""Diff benchmark: ``repo.diff`` of two checkpoints against ``torch.load`` of one.

Run ``python benchmarks/bench_diff.py [--size-mb 1024] [--repeat 3]``. It
commits two states of about ``--size-mb`` MiB each (float32 blocks of a
transformer-like model) where every tenth tensor changed in every element,
as a training step changes it, and prints:

- the time of ``repo.diff(A, B)``, which reads only the changed tensors
  (both sides, verified) and recognises the rest from their ids;
- the time of ``torch.load(weights_only=True)`` of one of the states from a
  ``torch.save`` file, and the ratio diff / torch.load.

Both read from a warm page cache. Times are the best of ``--repeat`` runs
(the machines are noisy; the best run is the least disturbed one).
"""

import argparse
import gc
import shutil
import tempfile
import time
from pathlib import Path

import torch

import mvc

MiB = 1 << 20
CHANGED_EVERY = 10  # one tensor in ten changes


def make_states(size_mb: int, seed: int = 0) -> tuple:
    """(A, B, changed keys): B is A with every tenth tensor perturbed."""
    g = torch.Generator().manual_seed(seed)
    # a block is 8 * width**2 float32 values; keep at least 10 blocks (40 tensors)
    width = next(w for w in (1024, 512, 256, 128, 64) if 10 * 32 * w * w <= size_mb * MiB or w == 64)
    n_blocks = max(10, size_mb * MiB // (32 * width * width))
    a = {}
    for i in range(n_blocks):
        p = f"blocks.{i}."
        a[p + "attn.qkv.weight"] = torch.randn(3 * width, width, generator=g)
        a[p + "attn.out.weight"] = torch.randn(width, width, generator=g)
        a[p + "mlp.up.weight"] = torch.randn(2 * width, width, generator=g)
        a[p + "mlp.down.weight"] = torch.randn(width, 2 * width, generator=g)
    keys = list(a)
    changed = keys[::CHANGED_EVERY]
    b = dict(a)
    for k in changed:
        b[k] = a[k] + 1e-3 * torch.randn(a[k].shape, generator=g)
    return a, b, changed


def best(fn, repeat: int) -> tuple:
    """(best seconds, last result) of ``repeat`` calls."""
    times, result = [], None
    for _ in range(repeat):
        result = None  # free the last result before the next run
        gc.collect()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB per state (default 1024)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best counts")
    parser.add_argument("--dir", default=None, help="where to put the repository and the .pt file")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mvc-bench-diff-", dir=args.dir))
    try:
        a, b, changed = make_states(args.size_mb)
        nbytes = sum(t.nbytes for t in a.values())
        changed_bytes = sum(a[k].nbytes for k in changed)
        print(f"state: {len(a)} tensors, {nbytes / MiB:.0f} MiB; {len(changed)} tensors changed "
              f"({changed_bytes / MiB:.0f} MiB, {100 * changed_bytes / nbytes:.0f}% of the bytes)")
        repo = mvc.Repository.init(work / "repo")
        repo.commit(a, "A")
        repo.commit(b, "B")
        torch.save(a, work / "a.pt")
        del b
        gc.collect()

        t_diff, d = best(lambda: repo.diff("HEAD~1", "HEAD"), args.repeat)
        s = d.summary
        assert s.tensors_changed == len(changed), (s.tensors_changed, len(changed))
        t_load, _ = best(lambda: torch.load(work / "a.pt", weights_only=True), args.repeat)
        repo.close()

        print(f"diff:       {t_diff:8.3f} s  ({s.tensors_changed} of {s.tensors} tensors changed, "
              f"{100 * s.parameters_changed:.1f}% of parameters)")
        print(f"torch.load: {t_load:8.3f} s")
        print(f"ratio diff / torch.load: {t_diff / t_load:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
