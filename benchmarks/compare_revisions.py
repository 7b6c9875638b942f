"""Run one benchmark against two revisions of mvc, side by side, in one run.

Run ``python benchmarks/compare_revisions.py --old REV [--new REV] [--rounds 3]
bench_core.py --size-mb 256 --repeat 1``. Each revision is exported from git
into a scratch folder (``git archive``; nothing in the work tree changes) and
the benchmark script *of that revision* runs against *that revision's* code,
so a script that calls a renamed API still measures what it measured then;
a revision with a ``setup.py`` gets its compiled part built in place first.
Rounds alternate old, new, old, new, ... so both see the same background load
on a shared machine, and the best round of each counts.

Every benchmark prints each measurement with mvc's time and the time of the
tool a user would otherwise use, measured in the same process; this script
compares those *ratios* (mvc / baseline), which stay comparable across runs
where raw seconds drift with the machine's load. It prints, per measurement,
the best ratio of each revision and new/old.

Use the Python of an environment that has mvc's dependencies; the exported
tree comes first on ``PYTHONPATH``, ahead of any installed mvc.
"""

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# bench_core:   "<label>   0.148s torch.save + fsync   0.159s   0.928  <= 1.0 ok"
CORE = re.compile(r"^(?P<label>\S.*?)\s+(?P<mine>[\d.]+)(?:s|MiB)\s+.+?\s+[\d.]+(?:s|MiB)\s+(?P<ratio>[\d.]+)\s+<=")
# bench_remote: "<label>   mvc   1.23 s   boto3   1.40 s   ratio  0.88 ..."
REMOTE = re.compile(r"^(?P<label>\S.*?)\s+mvc\s+(?P<mine>[\d.]+) s\s+\S+\s+[\d.]+ s\s+ratio\s+(?P<ratio>[\d.]+)")
# bench_storage: "dense    warm  2.60x (0.130 s vs 0.050 s)  cold  2.14x (...)": two measurements a line
STORAGE = re.compile(r"^(?P<run>\w+)\s+warm\s+(?P<warm>[\d.]+)x .*?\s+cold\s+(?P<cold>[\d.]+)x")


def ratios(output: str) -> dict:
    """The measurements a benchmark printed: label -> ratio (mvc / baseline)."""
    found = {}
    for line in output.splitlines():
        match = CORE.match(line) or REMOTE.match(line)
        if match:
            found[match["label"].strip()] = float(match["ratio"])
        match = STORAGE.match(line)
        if match:
            found[f"{match['run']} load after repack, warm"] = float(match["warm"])
            found[f"{match['run']} load after repack, cold"] = float(match["cold"])
    return found


def export(repo: Path, rev: str, into: Path) -> Path:
    """The tree of ``rev`` as plain files under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev], check=True, capture_output=True).stdout
    tar = into / "tree.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    tar.unlink()
    if (into / "setup.py").exists():  # its compiled part, as pip would build it
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=into, check=True,
                       capture_output=True)
    return into


def run(tree: Path, script: str, args: list) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(tree / "benchmarks" / script), *args],
                          env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{script} at {tree.name} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the earlier revision (any git revision)")
    p.add_argument("--new", default="HEAD", help="the later revision (default HEAD)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per revision, alternating (default 3)")
    p.add_argument("script", help="a script in benchmarks/, e.g. bench_core.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    args = p.parse_args()
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="mvc-compare-") as scratch:
        trees = {name: export(repo, rev, Path(scratch) / name) for name, rev in (("old", args.old), ("new", args.new))}
        best = {"old": {}, "new": {}}
        for i in range(args.rounds):
            for name, tree in trees.items():
                got = ratios(run(tree, args.script, args.args))
                print(f"round {i + 1} {name}: " + "  ".join(f"{k[:28]}={v:.3f}" for k, v in got.items()), flush=True)
                for k, v in got.items():
                    best[name][k] = min(v, best[name].get(k, v))
    print(f"\n{args.script} {' '.join(args.args)}; old = {args.old}, new = {args.new}; best of {args.rounds} rounds each")
    print(f"{'measurement':58} {'old':>7} {'new':>7} {'new/old':>8}")
    for k in best["new"]:
        old, new = best["old"].get(k), best["new"][k]
        if old is None:
            print(f"{k:58} {'-':>7} {new:7.3f}")
        else:
            print(f"{k:58} {old:7.3f} {new:7.3f} {new / old:8.3f}")


if __name__ == "__main__":
    main()
