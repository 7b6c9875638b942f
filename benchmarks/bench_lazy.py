"""A lazy clone of a large remote, then a load of one tensor: seconds and bytes read, old code and new.

Issue 35 asks that a lazy clone of a remote with 10^7 chunk entries be ready
to load one tensor in at most 5 s, its metadata download independent of the
number of chunks. This builds a folder remote of N chunk entries (64-byte
chunks, as ``bench_scale.py``): 10 commits of 10 uint8 tensors, N/100
chunks each, in 32 MiB chunk packs and object packs written in exactly the
remote format (``docs/format.md`` section 11) by mvc's own encoders. Only
the tensor the benchmark loads (``t0`` of the newest commit) holds real
bytes; the other records hold zeros under random ids, which no lazy clone
reads (the old one reads their trailer entries and the tensor objects that
list them, as it would of real ones). Building it this way takes seconds
where a real commit and push of 10^7 chunks takes most of an hour here.

Each version runs in a fresh process (``--old DIR``: a checkout of the code
before, e.g. ``git worktree add /tmp/old <commit>``; the new one is the
code this script runs from): ``clone --lazy`` (seconds, bytes read from the
remote), then ``load(only="t0")`` of the tip (seconds, bytes read), and the
tensor objects and chunk trailers each holds afterwards.

    python benchmarks/bench_lazy.py --chunks 1e5,1e6,1e7 --old /tmp/old
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHUNK = 64
COMMITS, TENSORS = 10, 10

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import torch  # imported before the clock starts: both versions load into torch tensors
import mvc
from mvc.remote import bucket as buckets
read = {"bytes": 0, "calls": 0}
real = buckets.FolderBucket._read
def counted(self, key, start=0, stop=None):
    data, size = real(self, key, start, stop)
    read["bytes"] += len(data); read["calls"] += 1
    return data, size
buckets.FolderBucket._read = counted
remote, target = sys.argv[2], sys.argv[3]
start = time.perf_counter()
repo = mvc.Repository.clone(remote, target, lazy=True)
out = {"clone_s": time.perf_counter() - start, "clone_bytes": read["bytes"], "clone_reads": read["calls"]}
read["bytes"] = read["calls"] = 0
start = time.perf_counter()
state = repo.load("main", only="t0")
out.update(load_s=time.perf_counter() - start, load_bytes=read["bytes"], load_reads=read["calls"],
           loaded=int(state["t0"].numel()))
with repo.index.read() as txn:
    out["tensor_objects_here"] = sum(1 for _ in txn.ids("tensors"))
repo.close()
print(json.dumps(out))
"""


def build_remote(path: Path, n: int, seed: int = 0) -> dict:
    """A folder remote of ``n`` chunk entries (see the module's docstring); what the loaded tensor is."""
    import mvc  # noqa: F401  (the code this script runs from builds it)
    from mvc import hashing
    from mvc.objects import CommitObject, TensorLeaf, TensorObject, TreeObject, object_id
    from mvc.remote import layout
    from mvc.remote.bucket import FolderBucket
    rng = np.random.default_rng(seed)
    bucket = FolderBucket(path, create=True)
    bucket.put(layout.MARKER, layout.marker(CHUNK))
    per = max(1, n // (COMMITS * TENSORS))
    real = rng.integers(0, 256, per * CHUNK, dtype=np.uint8).tobytes()
    real_ids = [hashing.digest(real[i:i + CHUNK]) for i in range(0, len(real), CHUNK)]
    zeros = bytes(CHUNK)
    records, items = [], []  # object records (id, bytes), newest commit first as a push sends them
    chunk_ids = []  # per tensor, oldest first
    parent = ()
    commits = []
    for c in range(COMMITS):
        tensors = {}
        for k in range(TENSORS):
            tip_t0 = c == COMMITS - 1 and k == 0
            raw = b"" if tip_t0 else rng.bytes(32 * per)
            ids = tuple(real_ids) if tip_t0 else tuple(raw[i:i + 32] for i in range(0, len(raw), 32))
            chunk_ids.append((ids, tip_t0))
            data = TensorObject("U8", (per * CHUNK,), CHUNK, ids).encode()
            tensors[f"t{k}"] = (object_id(data), data)
        tree = TreeObject({key: TensorLeaf(oid) for key, (oid, _) in tensors.items()}).encode()
        commit = CommitObject(object_id(tree), parent, f"c{c}", "bench", 1_700_000_000_000_000 + c).encode()
        parent = (object_id(commit),)
        commits.append([(object_id(commit), commit), (object_id(tree), tree)] + list(tensors.values()))
    for group in reversed(commits):
        records += group
    # chunk packs: every record once, in tensor order, about PACK_BYTES a pack
    pack, size = [], 0

    def flush():
        image = layout.PackImage([(cid, CHUNK) for cid, _ in pack])
        for i, (_, data) in enumerate(pack):
            image.slot(i)[:] = data
        bucket.put(layout.pack_key(layout.CHUNK_PACKS, layout.new_name()), bytes(image.data))
    for ids, is_real in chunk_ids:
        for i, cid in enumerate(ids):
            pack.append((cid, real[i * CHUNK:(i + 1) * CHUNK] if is_real else zeros))
            size += CHUNK + 36
            if size >= layout.PACK_BYTES:
                flush()
                pack, size = [], 0
    if pack:
        flush()
    # object packs
    from mvc.remote.transfer import pack_groups
    data = dict(records)
    for group in pack_groups([(oid, len(raw)) for oid, raw in records]):
        image = layout.PackImage(group)
        for i, (oid, _) in enumerate(group):
            image.slot(i)[:] = data[oid]
        bucket.put(layout.pack_key(layout.OBJECT_PACKS, layout.new_name()), bytes(image.data))
    bucket.put(layout.REFS + "heads/main", layout.encode_ref(parent[0], False))
    bucket.put(layout.HEAD, layout.encode_head("heads/main"))
    bucket.close()
    os.sync()  # the gigabyte just written goes to disk now, not while a version is timed
    return {"chunks": COMMITS * TENSORS * per, "loaded_chunks": per,
            "object_bytes": sum(len(raw) for _, raw in records)}


def run(code: str, remote: Path, target: Path) -> dict:
    shutil.rmtree(target, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", _CHILD, code, str(remote), str(target)], env=env,
                          capture_output=True, text=True)
    shutil.rmtree(target, ignore_errors=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else str(done.returncode)}
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", default="1e5,1e6", help="chunk entries on the remote, comma-separated")
    ap.add_argument("--old", help="a checkout of the old code, run side by side")
    ap.add_argument("--old-max", type=float, default=float("inf"), help="run the old code only up to this size")
    ap.add_argument("--work", help="folder for the remotes (default: a temporary one)")
    args = ap.parse_args()
    new = str(Path(__file__).resolve().parent.parent)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-lazy-"))
    print(f"{'n':>8} {'code':>4} {'clone s':>8} {'clone MB':>9} {'load s':>7} {'load MB':>8} "
          f"{'ready s':>8} {'objects':>8}   (objects: tensor objects held after the load)")
    for n in [int(float(x)) for x in args.chunks.split(",") if x]:
        remote = work / f"remote-{n}"
        start = time.perf_counter()
        built = build_remote(remote, n)
        print(f"# n={n}: built in {time.perf_counter() - start:.1f} s; object records {built['object_bytes'] / 1e6:.1f} MB; "
              f"the loaded tensor has {built['loaded_chunks']} chunks ({built['loaded_chunks'] * CHUNK / 1e6:.1f} MB)",
              flush=True)
        versions = [("new", new)] + ([("old", args.old)] if args.old and n <= args.old_max else [])
        for name, code in versions:
            r = run(code, remote, work / "clone")
            if "error" in r:
                print(f"{n:>8.0e} {name:>4} failed: {r['error']}", flush=True)
                continue
            print(f"{n:>8.0e} {name:>4} {r['clone_s']:>8.2f} {r['clone_bytes'] / 1e6:>9.2f} {r['load_s']:>7.2f} "
                  f"{r['load_bytes'] / 1e6:>8.2f} {r['clone_s'] + r['load_s']:>8.2f} {r['tensor_objects_here']:>8}",
                  flush=True)
            print("measured " + json.dumps(dict(n=n, code=name, **r)), flush=True)
        shutil.rmtree(remote, ignore_errors=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
