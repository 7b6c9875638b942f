"""Overhead of the Checkpointer's scheduled integrity scan on a training run.

    python benchmarks/bench_scan.py [--size-mb 16] [--steps 60] [--every 5] [--budget 10%] [--repeat 3]

Trains an MLP of about ``--size-mb`` MiB of float32 weights with AdamW on the
CPU and commits every ``--every`` steps with ``Checkpointer(async_save=True)``,
two ways in the same run, interleaved ``--repeat`` times (each one's fastest
run is kept):

- no scan:  the Checkpointer as it is;
- scan:     ``Checkpointer(scan=BUDGET)``: after every commit a background
            thread re-verifies the next BUDGET share of the repository's
            pack bytes (``mvc fsck --budget``).

Prints wall time and CPU time (all threads) of each, the ratios scan / no
scan, and what the scans verified (bytes, runs, whether every pack was
covered). The run starts from a repository that already holds a few
checkpoints, so the scans have a realistic amount to cover.
"""

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import torch

import mvc
from mvc_hooks import Checkpointer

WIDTH = 512


def build(size_mb: float, seed: int = 0):
    torch.manual_seed(seed)
    depth = max(2, round(size_mb * (1 << 20) / (WIDTH * WIDTH * 4)))
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(where: Path, args, scan) -> dict:
    model, opt = build(args.size_mb)
    x = torch.randn(64, WIDTH)
    ckpt = Checkpointer(where, model=model, optimizer=opt, branch="main", every_n_steps=args.every,
                        async_save=True, scan=scan)
    wall, cpu = time.perf_counter(), cpu_seconds()
    for step in range(args.steps):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ckpt.step(step, loss=loss.item())
    ckpt.close()  # waits for the last commit and the last scan
    out = {"wall": time.perf_counter() - wall, "cpu": cpu_seconds() - cpu}
    if scan is not None:
        reports = ckpt._scan.reports
        out.update(runs=len(reports), verified=sum(r.bytes_verified for r in reports),
                   scan_s=sum(r.seconds for r in reports),
                   total=reports[-1].bytes_total if reports else 0,
                   passes=sum(r.wrapped for r in reports), damage=sum(len(r.problems) for r in reports))
    return out


def seed_repo(path: Path, args) -> None:
    """A repository with a few earlier checkpoints of another model (so scans have old packs too)."""
    repo = mvc.Repository.init(path)
    for i in range(3):
        model, _ = build(args.size_mb, seed=100 + i)
        repo.commit(model.state_dict(), f"earlier {i}")
    repo.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=16)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--budget", default="10%")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)  # the machine is shared; the scan thread competes with one training thread
    base = Path(tempfile.mkdtemp(prefix="mvc-bench-scan-"))
    best = {}
    try:
        for rnd in range(args.repeat):
            for name, scan in (("no scan", None), ("scan", args.budget)) if rnd % 2 == 0 else \
                    (("scan", args.budget), ("no scan", None)):
                where = base / f"{name.replace(' ', '-')}-{rnd}"
                seed_repo(where, args)
                r = run(where, args, scan)
                shutil.rmtree(where)
                if name not in best or r["wall"] < best[name]["wall"]:
                    best[name] = r
        a, b = best["no scan"], best["scan"]
        print(f"model {args.size_mb} MiB (state ~{3 * args.size_mb:.0f} MiB with AdamW), {args.steps} steps, "
              f"commit every {args.every}, scan budget {args.budget}, best of {args.repeat} (interleaved)")
        print(f"no scan: wall {a['wall']:.2f} s  cpu {a['cpu']:.2f} s")
        print(f"scan:    wall {b['wall']:.2f} s  cpu {b['cpu']:.2f} s  ({b['runs']} scans verified "
              f"{b['verified'] / 2**20:.1f} MiB of a {b['total'] / 2**20:.1f} MiB repository, "
              f"{b['passes']} full passes, {b['damage']} damaged records; the scans ran {b['scan_s']:.2f} s "
              f"in the background, {b['scan_s'] / b['wall']:.0%} of the run)")
        print(f"ratio scan / no scan: wall {b['wall'] / a['wall']:.3f}x  cpu {b['cpu'] / a['cpu']:.3f}x")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
