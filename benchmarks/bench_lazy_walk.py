"""A walk over all history in a lazy clone: seconds and remote requests, old code and new.

A lazy clone holds commits and trees; ``fsck`` (and gc planning) walk every
tensor object of history, which it reads from the remote's object packs.
This builds a repository of ``--commits`` commits of ``--tensors`` tiny
tensors each (every tensor new in each commit, 64-byte chunks), pushes it to
a folder remote, and for each version of the code (``--old DIR``: a copy of
the code before, e.g. ``git archive main mvc | tar -x -C DIR``; the new one
is the code this script runs from) runs, in a fresh process per run, a lazy
clone and then the walk (``fsck --quick`` by default, ``--walk gc`` for a
dry-run gc), counting the ranged reads (``get_range``) it makes of the
remote's object packs. ``--rtt MS`` adds that much sleep to each ranged read,
as a round trip to a real object store would. Best of ``--runs``.

    python benchmarks/bench_lazy_walk.py --old /tmp/lazywalk-old --rtt 0,10
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import mvc
from mvc.remote import bucket as buckets

remote, clone, walk, rtt = sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]) / 1000
counted = {"objects": 0, "other": 0}
plain = buckets.FolderBucket.get_range

def get_range(self, key, start, stop):
    counted["objects" if key.startswith("objects/") else "other"] += 1
    if rtt:
        time.sleep(rtt)
    return plain(self, key, start, stop)

buckets.FolderBucket.get_range = get_range
with mvc.Repository.clone(remote, clone, lazy=True) as lazy:
    pass
counted.update(objects=0, other=0)  # the walk's reads only
with mvc.Repository.open(clone) as lazy:
    start = time.perf_counter()
    if walk == "fsck":
        report = lazy.fsck(quick=True)
        verdict = report.ok
    else:
        report = lazy.gc(dry_run=True)
        verdict = report.chunks_removed
    seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "object_reads": counted["objects"], "other_reads": counted["other"],
                  "verdict": verdict, "fetched": getattr(lazy.objects, "fetched", None)}))
"""


def build(root: Path, commits: int, tensors: int) -> str:
    sys.path.insert(0, str(HERE))
    import torch
    import mvc
    repo = mvc.Repository.init(root / "origin", chunk_size=64)
    g = torch.Generator().manual_seed(0)
    for c in range(commits):
        repo.commit({f"t{i}": torch.randn(8, generator=g) for i in range(tensors)}, f"commit {c}")
    remote = str(root / "remote")
    repo.remotes.add("origin", remote)
    repo.remotes.push()
    repo.close()
    return remote


def run(code: str, remote: str, root: Path, walk: str, rtt: float, tag: str) -> dict:
    clone = root / f"clone-{tag}"
    env = dict(os.environ, PYTHONPATH=code)
    out = subprocess.run([sys.executable, "-c", CHILD, code, remote, str(clone), walk, str(rtt)],
                         capture_output=True, text=True, env=env, check=True)
    subprocess.run(["rm", "-rf", str(clone)], check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--tensors", type=int, default=200)
    ap.add_argument("--walk", choices=("fsck", "gc"), default="fsck")
    ap.add_argument("--rtt", default="0", help="ms slept per ranged read, comma-separated values")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--old", help="a copy of the old code (a folder holding mvc/)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        remote = build(root, args.commits, args.tensors)
        versions = ([("old", args.old)] if args.old else []) + [("new", str(HERE))]
        print(f"{args.commits} commits x {args.tensors} tensors, walk {args.walk}")
        for rtt in (float(x) for x in args.rtt.split(",")):
            for name, code in versions:
                results = [run(code, remote, root, args.walk, rtt, f"{name}-{i}") for i in range(args.runs)]
                best = min(results, key=lambda r: r["seconds"])
                print(f"rtt {rtt:g} ms  {name}: {best['seconds']:.3f} s (best of {args.runs}), "
                      f"{best['object_reads']} object-pack reads, {best['other_reads']} other ranged reads, "
                      f"{best['fetched']} tensor objects fetched, verdict {best['verdict']}")


if __name__ == "__main__":
    main()
