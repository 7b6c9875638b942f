"""Merge benchmark: ``mvc merge`` of two checkpoints against torch.load both +
average + torch.save, in one run.

Run ``python benchmarks/bench_merge.py [--size-mb 1024] [--repeat 2]``. It
commits two transformer-like states of about ``--size-mb`` MiB each (the
state of bench_core.py, float32 and bfloat16 blocks; every weight differs
between the two, only the norms are equal) and writes the same two states
with torch.save. Each round then runs, each in a fresh process, side by side:

- mvc: ``repo.merge([a, b], strategy="linear", weights=[1, 1 + round/1024])``
  (round 0 is the plain average; later rounds nudge a weight, so every
  round computes and writes new chunks instead of finding the last round's
  tree already stored): a merge commit, streamed a slice at a time, its pack
  fsynced;
- torch: ``torch.load`` both files (weights_only=True), ``(a + b) / 2`` per
  tensor in float32 cast back, ``torch.save`` the result and fsync it.

It prints each one's time (best of the rounds) and peak RSS over the
process's resident size just before the work (VmHWM after resetting it
through /proc/self/clear_refs), the ratio of the times, and the peak RSS as
a share of one checkpoint (target: under 20%).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

import mvc

sys.path.insert(0, str(Path(__file__).parent))
from bench_core import make_state, state_bytes  # noqa: E402

MiB = 1 << 20
TARGET_RSS = 0.20

PRELUDE = """
import os, time, torch, mvc
def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
"""

MVC_RUN = PRELUDE + """
import mvc.merge  # imported before the measurement, as torch is
repo = mvc.Repository.open({root!r})
reset_peak(); start = kib("VmRSS:"); t0 = time.perf_counter()
commit, report = repo.merge(["a", "b"], strategy="linear", weights=[1.0, 1.0 + {round} / 1024], branch="m{round}")
took = time.perf_counter() - t0
print(took, kib("VmHWM:") - start, report.bytes_read, report.bytes_written)
"""

TORCH_RUN = PRELUDE + """
reset_peak(); start = kib("VmRSS:"); t0 = time.perf_counter()
a = torch.load({a!r}, weights_only=True)
b = torch.load({b!r}, weights_only=True)
out = {{k: ((a[k].float() + b[k].float()) / 2).to(a[k].dtype) for k in a}}
del a, b
with open({out!r}, "wb") as f:
    torch.save(out, f)
    f.flush()
    os.fsync(f.fileno())
took = time.perf_counter() - t0
print(took, kib("VmHWM:") - start, 0, 0)
"""


def run(code: str) -> list:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"benchmark step failed:\n{done.stderr}")
    took, peak, read, written = done.stdout.split()
    return [float(took), int(peak), int(read), int(written)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", default=None, help="Where to work (default: a temporary folder).")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-merge-", dir=args.dir))
    try:
        a = make_state(args.size_mb, seed=0)
        size = state_bytes(a)
        with mvc.Repository.init(work / "repo") as repo:
            repo.commit(a, "a", branch="a")
            torch.save(a, work / "a.pt")
            del a
            b = make_state(args.size_mb, seed=1)
            repo.commit(b, "b", branch="b")
            torch.save(b, work / "b.pt")
            del b
        print(f"two checkpoints of {size / MiB:.0f} MiB each; {args.repeat} rounds, mvc and torch side by side")
        best = {"mvc": None, "torch": None}
        for r in range(args.repeat):
            os.sync()
            got = {"mvc": run(MVC_RUN.format(root=str(work / "repo"), round=r))}
            os.sync()
            got["torch"] = run(TORCH_RUN.format(a=str(work / "a.pt"), b=str(work / "b.pt"),
                                                out=str(work / f"avg{r}.pt")))
            (work / f"avg{r}.pt").unlink()
            for name, row in got.items():
                print(f"  round {r}: {name:<5} {row[0]:6.2f} s  peak RSS +{row[1] / MiB:6.0f} MiB")
                if best[name] is None or row[0] < best[name][0]:
                    best[name] = row[:1] + [min(row[1], best[name][1]) if best[name] else row[1]] + row[2:]
                elif row[1] < best[name][1]:
                    best[name][1] = row[1]
        m, t = best["mvc"], best["torch"]
        print(f"mvc merge (linear)         {m[0]:6.2f} s  peak RSS +{m[1] / MiB:5.0f} MiB "
              f"({m[1] / size:.1%} of one checkpoint; target < {TARGET_RSS:.0%})  "
              f"read {m[2] / MiB:.0f} MiB, wrote {m[3] / MiB:.0f} MiB")
        print(f"torch load+average+save    {t[0]:6.2f} s  peak RSS +{t[1] / MiB:5.0f} MiB "
              f"({t[1] / size:.1%} of one checkpoint)")
        print(f"time ratio mvc / torch: {m[0] / t[0]:.2f}x   peak RSS ratio: {m[1] / t[1]:.3f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
