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
tensor objects and chunk trailers each holds afterwards. The remote has
where hints (``docs/format.md`` 11.8) as a push writes them; a last run
("no-hints") reads it with them deleted, as an older mvc wrote it.
``--oldest`` loads ``t0`` of the oldest commit instead, whose chunks lie in
the oldest packs: read last when trailers are searched newest first.

    python benchmarks/bench_lazy.py --chunks 1e5,1e6,1e7 --old /tmp/old

``--sharded`` measures the other figure of issue 35: one rank of a 4-rank
sharded load reads at most 30% of the remote's index bytes (the trailers
of its chunk packs, which list each pack's chunk ids and locations). A
real 4-rank save (gloo on CPU, FSDP2, AdamW state, 64-byte chunks) through
``MvcStorageWriter`` into one repository, ``--saves`` commits with a
training step between them, pushed to a folder remote in small packs
(``--sharded-pack-bytes``, so each rank's shards span several); then 4
ranks, each on "its own host" (its own lazy clone, its own catalogue),
load the last commit through ``MvcStorageReader`` at the same world size,
each reading only its own shards, checked bit for bit against what that
rank saved. Printed per rank: the chunk-pack trailer bytes it read and
their share of all on the remote. With ``--old``, the old code saves,
pushes and loads a remote of its own, side by side.

    python benchmarks/bench_lazy.py --chunks "" --sharded --saves 1,3 --old /tmp/old

``--hosts`` measures the save side too: the last of ``--saves`` goes
through fresh lazy clones (a rank on a host that has not read the remote),
and each rank prints the chunk trailer bytes its save read (the DCP
writer's listing, its ``upload_shards``; rank 0 also commits and pushes)
and their share of the remote's before that save; then the chunk entries
the remote lists twice (sent again because no trailer read proved them
there) and their bytes. ``--frozen``: the first layer does not train, so
every save repeats its chunks (a rank then finds them through the hints).

``--push N`` (comma-separated): a lazy clone of the remote of N chunk
entries (as above) commits the next checkpoint (``t0`` of the tip with one
chunk changed, ``t1``..``t9`` new) and pushes it: the push's planning
seconds (listing and the walk that decides what the remote lacks), the
chunk trailers it read and their share, the chunks sent and how many of
them the remote held already (duplicates).

    python benchmarks/bench_lazy.py --chunks "" --push 1e6 --old /tmp/old

``--whole N``: the catalogue a host builds of the whole remote of N chunk entries (every
trailer read, as a full clone or a pusher of everything holds it): seconds, bytes per entry, µs
per lookup and peak memory, new and old side by side (``bench_scale._catalogue_costs``).

    python benchmarks/bench_lazy.py --chunks "" --whole 1e7 --old /tmp/old

``--gc N``: ``gc --remote --dry-run`` of a lazy clone of the remote of N chunk entries (every
record needed: it plans, deletes nothing): seconds and the process's peak resident memory, each
in a fresh process, new and old side by side.

    python benchmarks/bench_lazy.py --chunks "" --gc 1e5,1e6 --old /tmp/old
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

# chunk-pack trailers a child reads (counted where they are read: the old code has no counters)
_COUNT_TRAILERS = r"""
from mvc.remote import catalogue
trailers = {"n": 0, "bytes": 0}
real_trailer = catalogue._trailer_bytes
def trailer(bucket, key):
    body, footer, size = real_trailer(bucket, key)
    if key.startswith("packs/"):
        trailers["n"] += 1; trailers["bytes"] += len(body) + len(footer)
    return body, footer, size
catalogue._trailer_bytes = trailer
"""

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
""" + _COUNT_TRAILERS + r"""
remote, target, rev = sys.argv[2], sys.argv[3], sys.argv[4]
start = time.perf_counter()
repo = mvc.Repository.clone(remote, target, lazy=True)
out = {"clone_s": time.perf_counter() - start, "clone_bytes": read["bytes"], "clone_reads": read["calls"]}
read["bytes"] = read["calls"] = 0
start = time.perf_counter()
state = repo.load(rev, only="t0")
out.update(load_s=time.perf_counter() - start, load_bytes=read["bytes"], load_reads=read["calls"],
           loaded=int(state["t0"].numel()), chunk_trailers=trailers["n"], chunk_trailer_bytes=trailers["bytes"])
with repo.index.read() as txn:
    out["tensor_objects_here"] = sum(1 for _ in txn.ids("tensors"))
repo.close()
print(json.dumps(out))
"""


def build_remote(path: Path, n: int, seed: int = 0, hints: bool = True, oldest: bool = False) -> dict:
    """A folder remote of ``n`` chunk entries (see the module's docstring); what the loaded tensor is.
    ``hints``: with where hints, as mvc's push writes them (False: as an older mvc's). ``oldest``:
    the loaded tensor is ``t0`` of the oldest commit (its chunks in the oldest packs), not the tip's."""
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
    tensor_ids = []  # their tensor object ids
    parent = ()
    commits = []
    for c in range(COMMITS):
        tensors = {}
        for k in range(TENSORS):
            tip_t0 = c == (0 if oldest else COMMITS - 1) and k == 0
            raw = b"" if tip_t0 else rng.bytes(32 * per)
            ids = tuple(real_ids) if tip_t0 else tuple(raw[i:i + 32] for i in range(0, len(raw), 32))
            chunk_ids.append((ids, tip_t0))
            data = TensorObject("U8", (per * CHUNK,), CHUNK, ids).encode()
            tensors[f"t{k}"] = (object_id(data), data)
            tensor_ids.append(object_id(data))
        tree = TreeObject({key: TensorLeaf(oid) for key, (oid, _) in tensors.items()}).encode()
        commit = CommitObject(object_id(tree), parent, f"c{c}", "bench", 1_700_000_000_000_000 + c).encode()
        parent = (object_id(commit),)
        commits.append([(object_id(commit), commit), (object_id(tree), tree)] + list(tensors.values()))
    for group in reversed(commits):
        records += group
    # chunk packs: every record once, in tensor order, about PACK_BYTES a pack; and each tensor's
    # runs (first chunk index, pack name), as a push's where hint gives them (docs/format.md 11.8)
    pack, size, name = [], 0, layout.new_name()
    runs = {}

    def flush():
        image = layout.PackImage([(cid, CHUNK) for cid, _ in pack])
        for i, (_, data) in enumerate(pack):
            image.slot(i)[:] = data
        bucket.put(layout.pack_key(layout.CHUNK_PACKS, name), bytes(image.data))
    for (ids, is_real), tid in zip(chunk_ids, tensor_ids):
        runs[tid] = []
        for i, cid in enumerate(ids):
            if not runs[tid] or runs[tid][-1][1] != name:
                runs[tid].append((i, name))
            pack.append((cid, real[i * CHUNK:(i + 1) * CHUNK] if is_real else zeros))
            size += CHUNK + 36
            if size >= layout.PACK_BYTES:
                flush()
                pack, size, name = [], 0, layout.new_name()
    if pack:
        flush()
    # object packs, each with its where hint first (as a push writes them)
    from mvc.remote import where
    from mvc.remote.transfer import pack_groups
    data = dict(records)
    for group in pack_groups([(oid, len(raw)) for oid, raw in records]):
        image = layout.PackImage(group)
        for i, (oid, _) in enumerate(group):
            image.slot(i)[:] = data[oid]
        key = layout.pack_key(layout.OBJECT_PACKS, layout.new_name())
        hinted = {oid: runs[oid] for oid, _ in group if oid in runs}
        if hinted and hints:
            bucket.put(layout.where_key(key), where.encode(hinted))
        bucket.put(key, bytes(image.data))
    bucket.put(layout.REFS + "heads/main", layout.encode_ref(parent[0], False))
    bucket.put(layout.HEAD, layout.encode_head("heads/main"))
    bucket.close()
    os.sync()  # the gigabyte just written goes to disk now, not while a version is timed
    return {"chunks": COMMITS * TENSORS * per, "loaded_chunks": per,
            "object_bytes": sum(len(raw) for _, raw in records)}


def run(code: str, remote: Path, target: Path, rev: str = "main") -> dict:
    shutil.rmtree(target, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", _CHILD, code, str(remote), str(target), rev], env=env,
                          capture_output=True, text=True)
    shutil.rmtree(target, ignore_errors=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else str(done.returncode)}
    return json.loads(done.stdout)


_RANK = r"""
import json, os, sys, time, warnings
from datetime import timedelta
from pathlib import Path
code, scenario, rank, world, root = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
saves = int(sys.argv[6])
sys.path[:0] = [code, os.path.join(code, ".pp")]
warnings.simplefilter("ignore")
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import mvc
import mvc.remote.bucket
from mvc.remote import catalogue
from mvc_hooks.dcp import MvcStorageReader, MvcStorageWriter

read = {"packs/": 0, "objects/": 0, "trailers": 0}
real = catalogue._trailer_bytes
def counted(bucket, key):
    body, footer, size = real(bucket, key)
    read[key.partition("/")[0] + "/"] += len(body) + len(footer)
    read["trailers"] += key.startswith("packs/")
    return body, footer, size
catalogue._trailer_bytes = counted

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)], torch.nn.Linear(256, 64))
    if os.environ.get("BENCH_LAZY_FROZEN"):  # --frozen: the first layer does not train (its chunks repeat)
        model[0].requires_grad_(False)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)

def step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    model(torch.randn(8, 256, generator=g)).square().mean().backward()
    opt.step()
    opt.zero_grad()

def local(state):
    out = {}
    def visit(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                visit(prefix + (str(k),), v)
        elif isinstance(value, torch.Tensor):
            out[".".join(prefix)] = (value.to_local() if hasattr(value, "to_local") else value).detach().clone()
    visit((), state)
    return out

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{root / ('rdv-' + scenario)}", rank=rank, world_size=world,
                        timeout=timedelta(seconds=300))
try:
    model, opt = build()
    if scenario in ("save", "save-hosts"):
        if scenario == "save-hosts":  # every rank saves through a lazy clone of its own ("its own host")
            mvc.Repository.clone(str(root / "remote"), root / f"saver{rank}", lazy=True).close()
        for n in range(saves):
            step(model, opt, n)
            msd, osd = get_state_dict(model, opt)
            fresh = scenario == "save-hosts" and n == saves - 1 and n > 0
            if fresh:  # the last save through a fresh lazy clone: a host that read nothing of the remote yet
                dist.barrier()
                path = root / f"fresh{rank}"
                mvc.Repository.clone(str(root / "remote"), path, lazy=True).close()
                bucket = mvc.remote.bucket.FolderBucket(root / "remote")
                total = sum(len(b) + len(f) for key, _ in bucket.list("packs/") for b, f, _ in [real(bucket, key)])
                before, start = dict(read), time.perf_counter()
            writer = MvcStorageWriter(root / "repo", branch="main", message=f"save {n}", step=n, chunk_size=64) \
                if scenario == "save" else MvcStorageWriter(path if fresh else root / f"saver{rank}", branch="main",
                                                            message=f"save {n}", step=n, remote="origin")
            dcp.save({"model": msd, "optim": osd}, storage_writer=writer)
            writer.close()
            if fresh:
                print("measured " + json.dumps({"rank": rank, "save_s": time.perf_counter() - start, "total": total,
                                                "chunk_trailer_bytes": read["packs/"] - before["packs/"],
                                                "chunk_trailers": read["trailers"] - before["trailers"]}), flush=True)
        torch.save(local({"model": msd, "optim": osd}), root / f"saved-{rank}.pt")
    else:
        step(model, opt, 99)  # other weights, and optimizer state to load into
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        host = root / f"host{rank}"
        start = time.perf_counter()
        mvc.Repository.clone(str(root / "remote"), host, lazy=True).close()
        clone_s, cloned = time.perf_counter() - start, dict(read)
        start = time.perf_counter()
        dcp.load(state, storage_reader=MvcStorageReader(host, rev="origin/main", remote="origin"))
        load_s = time.perf_counter() - start
        want, got = torch.load(root / f"saved-{rank}.pt", weights_only=True), local(state)
        same = want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        print("measured " + json.dumps({"rank": rank, "same": same, "clone_s": clone_s, "load_s": load_s,
                                        "chunk_trailer_bytes": read["packs/"] - cloned["packs/"],
                                        "chunk_trailers": read["trailers"] - cloned["trailers"],
                                        "object_trailer_bytes": read["objects/"]}), flush=True)
    dist.barrier()
finally:
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
"""

_SEED = r"""
import os, sys
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], ".pp")]
import torch, mvc
with mvc.Repository.init(sys.argv[2], chunk_size=64) as repo:
    repo.commit({"seed": torch.zeros(4)}, "seed")
    repo.remotes.add("origin", sys.argv[3])
    repo.remotes.push("origin", ("main",))
"""

_PUSH = r"""
import os, sys
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], ".pp")]
import mvc
with mvc.Repository.open(sys.argv[2]) as repo:
    repo.remotes.add("origin", sys.argv[3])
    report = repo.remotes.push("origin", ("main",))
    print(report.packs)
"""


def _ranks(code: str, scenario: str, root: Path, saves: int, env: dict, world: int = 4) -> list:
    """Run ``world`` ranks of ``_RANK``; the JSON each printed after ``measured``."""
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, code, scenario, str(r), str(world), str(root), str(saves)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=1800)
        lines = [json.loads(line[9:]) for line in text.splitlines() if line.startswith("measured ")]
        if scenario == "load" and not lines:
            raise SystemExit(f"a rank of the {scenario} failed:\n{text[-3000:]}")
        out += lines
    return sorted(out, key=lambda r: r["rank"])


def remote_trailer_bytes(remote: Path) -> tuple:
    """(chunk packs, the bytes of all their trailers and footers) of a folder remote."""
    from mvc.remote import catalogue
    from mvc.remote.bucket import FolderBucket
    bucket = FolderBucket(remote)
    keys = [key for key, _ in bucket.list("packs/") if key.endswith(".pack")]
    total = 0
    for key in keys:
        body, footer, _ = catalogue._trailer_bytes(bucket, key)
        total += len(body) + len(footer)
    return len(keys), total


def duplicates(remote: Path) -> tuple:
    """(chunk entries a folder remote lists beyond the first of their id, their data bytes)."""
    from mvc.remote.bucket import FolderBucket
    from mvc.remote.catalogue import read_trailer
    bucket, seen, twice, extra = FolderBucket(remote), set(), 0, 0
    for key, _ in bucket.list("packs/"):
        if key.endswith(".pack"):
            for cid, _, length in read_trailer(bucket, key):
                if cid in seen:
                    twice, extra = twice + 1, extra + length
                seen.add(cid)
    return twice, extra


_PUSH_NEXT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import torch
import mvc
from mvc.remote import catalogue, sync
remote, target, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
""" + _COUNT_TRAILERS + r"""
planning = {"s": 0.0}
def timed(f):
    def wrapper(*a, **k):
        start = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            planning["s"] += time.perf_counter() - start
    return wrapper
sync._outgoing = timed(sync._outgoing)
refresh = catalogue.Catalogue.refresh
catalogue.Catalogue.refresh = timed(refresh)
repo = mvc.Repository.clone(remote, target, lazy=True)
per = max(1, n // 100)  # as build_remote: t0 of the tip holds its first draw
t0 = np.random.default_rng(0).integers(0, 256, per * 64, dtype=np.uint8)
t0[:64] ^= 1  # its first chunk changed
g = np.random.default_rng(1)
state = {"t0": torch.from_numpy(t0)} | {f"t{k}": torch.from_numpy(g.integers(0, 256, per * 64, dtype=np.uint8))
                                        for k in range(1, 10)}
repo.commit(state, "next")
planning["s"], trailers["n"], trailers["bytes"] = 0.0, 0, 0
start = time.perf_counter()
report = repo.remotes.push()
out = {"push_s": time.perf_counter() - start, "planning_s": planning["s"], "chunk_trailers": trailers["n"],
       "chunk_trailer_bytes": trailers["bytes"], "chunks_sent": report.chunks, "new_chunks": 9 * per + 1}
repo.close()
print(json.dumps(out))
"""


def push_next(name: str, code: str, work: Path, n: int) -> None:
    """``--push``: see the module's docstring."""
    remote = work / f"remote-push-{n}"
    build_remote(remote, n)
    chunks, total = remote_trailer_bytes(remote)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    target = work / "push-clone"
    shutil.rmtree(target, ignore_errors=True)
    done = subprocess.run([sys.executable, "-c", _PUSH_NEXT, code, str(remote), str(target), str(n)], env=env,
                          capture_output=True, text=True)
    shutil.rmtree(target, ignore_errors=True)
    twice, extra = duplicates(remote)
    shutil.rmtree(remote, ignore_errors=True)
    if done.returncode != 0:
        print(f"{n:>8.0e} {name:>8} push failed: {done.stderr.strip()[-2000:]}", flush=True)
        return
    r = json.loads(done.stdout)
    print(f"{n:>8.0e} {name:>8} push of the next commit from a lazy clone: planning {r['planning_s']:.2f} s "
          f"(push {r['push_s']:.2f} s); read {r['chunk_trailers']} of {chunks} chunk trailers, "
          f"{r['chunk_trailer_bytes'] / 1e6:.2f} of {total / 1e6:.2f} MB = {100 * r['chunk_trailer_bytes'] / total:.1f}%; "
          f"sent {r['chunks_sent']} chunks ({r['new_chunks']} new); remote lists {twice} entries twice "
          f"({extra / 1e3:.1f} kB)", flush=True)
    print("measured " + json.dumps(dict(case="push", n=n, code=name, packs=chunks, total=total, twice=twice,
                                        extra=extra, **r)), flush=True)


def sharded(name: str, code: str, work: Path, saves: int, pack_bytes: int, hosts: bool = False,
            frozen: bool = False) -> None:
    """``hosts``: the ranks save across hosts (``MvcStorageWriter(remote=...)``, each through a lazy
    clone of a remote holding one small seed commit, each uploading its own packs; the coordinator
    pushes the commit), not into one repository pushed after."""
    root = work / f"sharded-{name}-{saves}{'-hosts' if hosts else ''}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MVC_REMOTE_PACK_BYTES=str(pack_bytes), PYTHONWARNINGS="ignore")
    if frozen:
        env.update(BENCH_LAZY_FROZEN="1")
    start = time.perf_counter()
    if hosts:
        seeded = subprocess.run([sys.executable, "-c", _SEED, code, str(root / "seed"), str(root / "remote")], env=env,
                                capture_output=True, text=True)
        if seeded.returncode != 0:
            raise SystemExit(seeded.stderr[-3000:])
        for r in _ranks(code, "save-hosts", root, saves, env):
            print(f"{'save':>8} {name:>4} saves={saves} rank {r['rank']} (fresh host): read {r['chunk_trailers']:>3} chunk "
                  f"trailers, {r['chunk_trailer_bytes'] / 1e3:8.1f} of {r['total'] / 1e3:.1f} kB = "
                  f"{100 * r['chunk_trailer_bytes'] / r['total']:5.1f}%; save {r['save_s']:.2f} s", flush=True)
            print("measured " + json.dumps(dict(case="save-hosts", code=name, saves=saves, **r)), flush=True)
        twice, extra = duplicates(root / "remote")
        print(f"# save-hosts {name}: {twice} chunk entries listed more than once on the remote, {extra / 1e3:.1f} kB",
              flush=True)
    else:
        _ranks(code, "save", root, saves, env)
        pushed = subprocess.run([sys.executable, "-c", _PUSH, code, str(root / "repo"), str(root / "remote")],
                                env=env, capture_output=True, text=True)
        if pushed.returncode != 0:
            raise SystemExit(pushed.stderr[-3000:])
    packs, total = remote_trailer_bytes(root / "remote")
    how = "saved across hosts" if hosts else "pushed"
    print(f"# sharded {name}: {saves} save(s) of 4 ranks {how} in {time.perf_counter() - start:.0f} s: "
          f"{packs} chunk packs, {total / 1e3:.1f} kB of trailers", flush=True)
    for r in _ranks(code, "load", root, saves, env):
        print(f"{'hosts' if hosts else 'sharded':>8} {name:>4} saves={saves} rank {r['rank']}: read {r['chunk_trailers']:>3} of {packs} "
              f"chunk trailers, {r['chunk_trailer_bytes'] / 1e3:8.1f} of {total / 1e3:.1f} kB = "
              f"{100 * r['chunk_trailer_bytes'] / total:5.1f}%; load {r['load_s']:.2f} s; bit for bit: {r['same']}",
              flush=True)
        print("measured " + json.dumps(dict(case="sharded-hosts" if hosts else "sharded", code=name, saves=saves, packs=packs, total=total, **r)),
              flush=True)
    shutil.rmtree(root, ignore_errors=True)


def whole(work: Path, n: int, repeat: int, old: str) -> None:
    """The catalogue of a whole remote of ``n`` chunk entries (``bench_scale._catalogue_costs``,
    the new code and ``old``), built by a host holding a lazy clone of it."""
    import bench_scale
    import mvc
    remote, clone = work / f"remote-{n}", work / "whole"
    build_remote(remote, n)
    shutil.rmtree(clone, ignore_errors=True)
    mvc.Repository.clone(str(remote), clone, lazy=True).close()
    out = {"n": n}
    bench_scale._catalogue_costs(clone, repeat, old, out)
    print("whole catalogue " + " ".join(f"{k}={v:.4g}" for k, v in out.items()), flush=True)
    shutil.rmtree(clone, ignore_errors=True)
    shutil.rmtree(remote, ignore_errors=True)


_GC = r"""
import json, resource, sys, time
import mvc
repo = mvc.Repository.open(sys.argv[1])
start = time.perf_counter()
report = repo.remotes.gc("origin", grace=0, dry_run=True)
try:  # this process image's own peak: ru_maxrss keeps a forking parent's across the exec
    peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
except (OSError, StopIteration):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"mvc": mvc.__file__, "s": time.perf_counter() - start, "peak_rss": peak,
                  "deleted": len(report.packs_deleted), "mixed": report.mixed, "reclaimed": report.bytes_reclaimed}))
repo.close()
"""


def gc_costs(work: Path, n: int, repeat: int, old: str) -> None:
    """``gc --remote --dry-run`` of a lazy clone of a remote of ``n`` chunk entries, in a fresh process
    each, this code's and (``old``) the older code's alternating, best of ``repeat``. A first
    untimed run reads every trailer into the clone's catalogue, so neither version pays that."""
    import mvc
    remote, clone = work / f"remote-{n}", work / "gc"
    start = time.perf_counter()
    build_remote(remote, n)
    print(f"# n={n}: built in {time.perf_counter() - start:.1f} s", flush=True)
    shutil.rmtree(clone, ignore_errors=True)
    mvc.Repository.clone(str(remote), clone, lazy=True).close()
    runs = {"new": [], "old": []}
    new = str(Path(__file__).resolve().parent.parent)
    for i in range(repeat + 1):
        for name, code in (("old", old), ("new", new)) if old else (("new", new),):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([code] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
            got = subprocess.run([sys.executable, "-c", _GC, str(clone)], capture_output=True, text=True, env=env,
                                 cwd=clone)
            if got.returncode:
                raise RuntimeError(f"the gc run of {name} failed: {got.stderr[-2000:]}")
            if i:  # the first round warms the catalogue
                runs[name].append(json.loads(got.stdout))
    for name, got in runs.items():
        if got:
            best = min(got, key=lambda r: r["s"])
            print(f"gc n={n:.0e} {name:>4} s={best['s']:.2f} peak_rss_MB={min(r['peak_rss'] for r in got) / 1e6:.0f} "
                  f"deleted={best['deleted']} mixed={best['mixed']} reclaimed={best['reclaimed']}", flush=True)
            print("measured " + json.dumps(dict(case="gc", n=n, code=name, **best)), flush=True)
    shutil.rmtree(clone, ignore_errors=True)
    shutil.rmtree(remote, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", default="1e5,1e6", help="chunk entries on the remote, comma-separated")
    ap.add_argument("--old", help="a checkout of the old code, run side by side")
    ap.add_argument("--old-max", type=float, default=float("inf"), help="run the old code only up to this size")
    ap.add_argument("--work", help="folder for the remotes (default: a temporary one)")
    ap.add_argument("--repeat", type=int, default=1, help="run the versions this many times, in turn (a busy machine)")
    ap.add_argument("--oldest", action="store_true",
                    help="load t0 of the oldest commit (its chunks in the oldest packs) instead of the tip's")
    ap.add_argument("--sharded", action="store_true", help="also measure one rank of a 4-rank sharded load")
    ap.add_argument("--saves", default="1,3", help="sharded: commits on the remote (the last is loaded)")
    ap.add_argument("--hosts", action="store_true", help="sharded: the ranks save across hosts (remote=)")
    ap.add_argument("--push", default="", help="chunk entries on the remote a lazy clone pushes the next commit to")
    ap.add_argument("--frozen", action="store_true",
                    help="sharded: the first layer does not train, so each save repeats its chunks")
    ap.add_argument("--sharded-pack-bytes", type=int, default=128 << 10, help="sharded: the remote's pack size")
    ap.add_argument("--whole", default="", help="chunk entries on a remote whose whole catalogue a host builds, "
                    "as a full clone or a pusher of everything holds it (bench_scale's catalogue figures)")
    ap.add_argument("--gc", default="", help="chunk entries on a remote a lazy clone runs gc --remote --dry-run on")
    args = ap.parse_args()
    new = str(Path(__file__).resolve().parent.parent)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-lazy-"))
    print(f"{'n':>8} {'code':>8} {'clone s':>8} {'clone MB':>9} {'load s':>7} {'load MB':>8} "
          f"{'ready s':>8} {'objects':>8} {'trailers':>8} {'trl MB':>7}   (objects: tensor objects held after the "
          "load; trailers: chunk pack trailers read, and their MB)")
    for n in [int(float(x)) for x in args.chunks.split(",") if x]:
        remote = work / f"remote-{n}"
        start = time.perf_counter()
        built = build_remote(remote, n, oldest=args.oldest)
        print(f"# n={n}: built in {time.perf_counter() - start:.1f} s; object records {built['object_bytes'] / 1e6:.1f} MB; "
              f"the loaded tensor has {built['loaded_chunks']} chunks ({built['loaded_chunks'] * CHUNK / 1e6:.1f} MB)",
              flush=True)
        versions = ([("new", new)] + ([("old", args.old)] if args.old and n <= args.old_max else [])) * args.repeat + \
            [("no-hints", new)] * args.repeat  # last: the new code on the remote as an older mvc wrote it (no where/)
        for name, code in versions:
            if name == "no-hints":
                shutil.rmtree(remote / "where", ignore_errors=True)
            r = run(code, remote, work / "clone", f"main~{COMMITS - 1}" if args.oldest else "main")
            if "error" in r:
                print(f"{n:>8.0e} {name:>8} failed: {r['error']}", flush=True)
                continue
            print(f"{n:>8.0e} {name:>8} {r['clone_s']:>8.2f} {r['clone_bytes'] / 1e6:>9.2f} {r['load_s']:>7.2f} "
                  f"{r['load_bytes'] / 1e6:>8.2f} {r['clone_s'] + r['load_s']:>8.2f} {r['tensor_objects_here']:>8} "
                  f"{r['chunk_trailers']:>8} {r['chunk_trailer_bytes'] / 1e6:>7.2f}", flush=True)
            print("measured " + json.dumps(dict(n=n, code=name, oldest=args.oldest, **r)), flush=True)
        shutil.rmtree(remote, ignore_errors=True)
    for n in [int(float(x)) for x in args.whole.split(",") if x]:
        whole(work, n, args.repeat, args.old or "")
    for n in [int(float(x)) for x in args.gc.split(",") if x]:
        gc_costs(work, n, args.repeat, args.old or "")
    for n in [int(float(x)) for x in args.push.split(",") if x]:
        for name, code in [("new", new)] + ([("old", args.old)] if args.old else []):
            push_next(name, code, work, n)
    if args.sharded:
        for saves in [int(x) for x in args.saves.split(",") if x]:
            for name, code in [("new", new)] + ([("old", args.old)] if args.old else []):
                sharded(name, code, work, saves, args.sharded_pack_bytes, args.hosts, args.frozen)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
