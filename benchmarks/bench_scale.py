"""Cost at scale: how metadata work grows with chunks, commits and tensors, fitted and projected.

Run ``python benchmarks/bench_scale.py [--chunks 1e5,1e6] [--commits 1e3,1e4] [--tensors 1e4,1e5]``.
It builds real repositories with a tiny chunk size (64 bytes), so that millions of chunk
entries take megabytes of tensor data and minutes, not terabytes and days:

- **chunk series**: N chunk entries over 10 commits of 10 tensors each (random bytes: every
  chunk distinct). Measured: index bytes per chunk (``data.mdb`` over N; and the pages of the
  chunk table and of the tensor objects, which list every chunk id), ``fsck --quick`` (the
  metadata part: the reachability walk, every chunk located in the index, the packs listed),
  ``gc`` planning (``--dry-run``: the live set, the sweep, the pack plan), the peak memory
  each of those two adds to a fresh process (per chunk), push planning
  against a folder remote (what the remote lacks: everything, then one new commit), a lazy
  clone (metadata only) and opening it.
- **commit series**: C commits of a small state (one 256-byte tensor that changes, metrics).
  Measured: ``log`` of all, ``fsck --quick``, ``gc`` planning, push planning of all.
- **tensor series**: one state of T tensors of 16 floats. Measured: its first commit, the same
  state again (every chunk known), and its load.

Each measurement is fitted to ``t = a * n^b`` over the sizes run; ``b`` near 1 is linear, and
anything above 1.15 is printed as SUPERLINEAR. The last table projects every measurement to a
1 TB model with 100 checkpoints (4e6 chunks of 256 KiB per checkpoint; 4e8 chunk entries when
every chunk changes each time, as in dense pre-training; 1e4 tensors per checkpoint).
``docs/scale.md`` holds a run's output and what it means.

``--bookkeeping N`` measures only a commit's per-new-chunk cost: one state of N new 64-byte
chunks committed into an empty repository, against hashing the same chunks as the commit does
(fingerprint, BLAKE3, fingerprint again: ``live.identify``, one thread) and writing their
records (one write of N record heads and bytes, fsynced), each timed separately in the same
run. It prints µs per new chunk: the commit, hashing, writing, and the rest (bookkeeping), in
wall time and in CPU time of the process (all threads; on a shared machine the steadier one).
``--profile FILE`` also writes a cProfile of one commit there.

``--views P`` measures only the view of the registered packs: a pack registered (``Txn.register_pack``,
which builds the view a commit then reads) in a repository of P registered packs, whose
multi-pack indexes are those a process registering them one at a time would have written;
milliseconds per registration, wall and CPU, in fresh processes (with ``--old``, that code's
too, alternating).

``--old DIR`` (a folder holding an export of older mvc code, e.g. ``git archive REV mvc | tar -x
-C DIR``) also runs ``fsck --quick`` and ``gc --dry-run`` of the chunk series with that code, each
in a fresh process alternating with this code's, and prints their times and peak memory side
by side: all of it (``VmHWM``, which counts the index's memory-mapped pages that the walk reads)
and the anonymous part (``RssAnon``, sampled every 5 ms: what the process itself holds). ``--budget N`` sets ``MVC_WALK_BUDGET`` (live records fsck and gc hold in memory at once).

Times are best of ``--repeat`` on a shared machine; the fit uses the best. fsck and gc planning
also give the CPU seconds of the process (``_cpu``; the steadier figure where others share the
cores) and both as µs per chunk entry. ``--no-remote``
leaves out push and lazy clone (for the largest sizes); ``--rows FILE`` prints the tables of
earlier runs' ``measured`` lines together, measuring nothing.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import mvc
from mvc.remote import sync

CHUNK = 64
PER_COMMIT_TENSORS = 10


def _best(fn, repeat: int, clock=time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def _best_both(fn, repeat: int) -> tuple:
    """(wall seconds, CPU seconds of this process) of the run of ``fn`` with the least wall time."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def _plan_push(repo, remote: str) -> int:
    """What a push of HEAD's branch would send (objects and chunks the remote lacks), without sending."""
    conn = sync.Connection(repo, remote, create=True)
    try:
        conn.marker(create=True)  # as a push makes it: an empty folder is no remote yet
        conn.catalogue.refresh(conn.bucket)
        with repo.index.read() as txn:
            targets = sync._targets(repo, txn, ())
        read = sync._read_targets(conn, targets)  # the remote's refs: the walk stops at what they reach
        behind = sync._behind(repo, conn, [oid for oid, _, _ in read[0].values()])
        with repo.index.read() as txn:
            out = sync._outgoing(txn, repo.objects, [oid for oid, _ in targets.values()], conn, behind)
        return len(out.records) + len(out.chunks)
    finally:
        conn.close()


_PEAK = """
import json, sys, threading, time
import mvc

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

anon, done = [0], threading.Event()

def sample():  # the kernel keeps no peak of anonymous memory alone: sampled every 5 ms
    while not done.wait(0.005):
        anon[0] = max(anon[0], status("RssAnon"))

repo = mvc.Repository.open(sys.argv[1])
repo.resolve("HEAD")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # Linux: the peak resident size starts again from the current one
before, anon_before = status("VmRSS"), status("RssAnon")
watch = threading.Thread(target=sample, daemon=True)
watch.start()
start, cpu = time.perf_counter(), time.process_time()
repo.fsck(quick=True) if sys.argv[2] == "fsck" else repo.gc(dry_run=True)
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu  # the sampler's few reads included
done.set()
watch.join()
print(json.dumps([status("VmHWM") - before, seconds, max(anon[0], status("RssAnon")) - anon_before, cpu]))
"""


def _fresh(path: Path, op: str, code: str = "") -> tuple:
    """(how far ``op`` ("fsck" or "gc", planning only) raises a fresh process's peak resident
    memory, its seconds there, how far it raises the anonymous part of the resident memory,
    sampled: the peak without the index's memory-mapped pages, which the kernel may drop; its CPU
    seconds, all threads: on a shared machine the steadier figure), with
    the mvc at ``code`` first on the path if given (an export of older code, to compare with in
    the same run)."""
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = os.pathsep.join([code] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = subprocess.run([sys.executable, "-c", _PEAK, str(path), op], check=True, capture_output=True, text=True,
                         env=env, cwd=path)
    return tuple(json.loads(out.stdout))


def _peak_bytes(path: Path, op: str) -> int:
    """How far ``op`` ("fsck" or "gc", planning only) raises a fresh process's peak resident memory."""
    return _fresh(path, op)[0]


def _index_bytes(repo) -> int:
    """``data.mdb`` and the pack index files (``pack-<name>.pidx``): all the chunk index takes."""
    return (repo.dir / "index" / "data.mdb").stat().st_size + _pidx_bytes(repo)


def _pidx_bytes(repo) -> int:
    return sum(p.stat().st_size for p in (repo.dir / "packs").glob("*.pidx"))


def _db_bytes(index_dir: Path, name: str) -> int:
    """Bytes of the pages LMDB database ``name`` uses (the file also holds free pages)."""
    import lmdb
    env = lmdb.open(str(index_dir), readonly=True, lock=False, max_dbs=32)
    try:
        with env.begin() as txn:
            st = txn.stat(env.open_db(name.encode(), txn=txn, create=False))
        return (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
    finally:
        env.close()


def chunk_series(n: int, work: Path, repeat: int, remote_too: bool = True, old: str = "") -> dict:
    """Measurements of a repository with ``n`` chunk entries in 10 commits (push and
    lazy clone only with ``remote_too``; with ``old``, an export of older mvc code, fsck and
    gc planning of that code too, each in fresh processes, alternating with this code's)."""
    repo = mvc.Repository.init(work / f"chunks-{n}", chunk_size=CHUNK)
    g = torch.Generator().manual_seed(n)
    per_tensor = n // 10 // PER_COMMIT_TENSORS * CHUNK
    start = time.perf_counter()
    for i in range(10):
        state = {f"t{k}": torch.randint(0, 256, (per_tensor,), dtype=torch.uint8, generator=g)
                 for k in range(PER_COMMIT_TENSORS)}
        repo.commit(state, f"c{i}")
    build = time.perf_counter() - start
    chunks = repo.status().chunks
    out = dict(n=n, build=build, index_bytes_per_chunk=_index_bytes(repo) / n)
    out["fsck_quick"], out["fsck_quick_cpu"] = _best_both(lambda: repo.fsck(quick=True), repeat)
    out["gc_plan"], out["gc_plan_cpu"] = _best_both(lambda: repo.gc(dry_run=True), repeat)
    for key in ("fsck_quick", "fsck_quick_cpu", "gc_plan", "gc_plan_cpu"):
        out[f"{key}_us_per_chunk"] = out[key] / n * 1e6
    if old:
        _old_and_new(repo.dir.parent, n, repeat, old, out)
    else:
        out["fsck_mem_per_chunk"] = _peak_bytes(repo.dir.parent, "fsck") / n
        out["gc_mem_per_chunk"] = _peak_bytes(repo.dir.parent, "gc") / n
    remote = work / f"remote-{n}"
    if remote_too:
        _remote_part(repo, remote, work / f"clone-{n}", g, repeat, out, old)
    repo.close()
    out["chunk_db_per_chunk"] = (_db_bytes(repo.dir / "index", "chunks") + _pidx_bytes(repo)) / n
    out["tensor_db_per_chunk"] = _db_bytes(repo.dir / "index", "tensors") / n
    assert chunks >= n * 0.99
    shutil.rmtree(work / f"chunks-{n}", ignore_errors=True)
    shutil.rmtree(remote, ignore_errors=True)
    shutil.rmtree(work / f"clone-{n}", ignore_errors=True)
    return out


INDEX_PACKS = 10  # the index series' entries come in this many packs, as 10 commits write them
LOOKUPS = 100_000  # ids looked up at random in the index series


def _old_and_new(path: Path, n: int, repeat: int, old: str, out: dict) -> None:
    """fsck --quick and gc --dry-run of this code and of the code at ``old``, each run in a fresh
    process, the two alternating ``repeat`` times: best seconds and peak memory per chunk
    (``old_`` columns for the old code; ``fsck_fresh`` and ``gc_fresh`` for this one's times)."""
    for op, name in (("fsck", "fsck"), ("gc", "gc")):
        runs = {"": [], "old_": []}
        for _ in range(repeat):
            for tag, code in (("old_", old), ("", "")):
                runs[tag].append(_fresh(path, op, code))
        for tag, got in runs.items():
            out[f"{tag}{name}_mem_per_chunk"] = min(m for m, _, _, _ in got) / n
            out[f"{tag}{name}_anon_per_chunk"] = min(a for _, _, a, _ in got) / n
            out[f"{tag}{name}_fresh"] = min(t for _, t, _, _ in got)
            out[f"{tag}{name}_fresh_cpu"] = min(c for _, _, _, c in got)
            for key in (f"{tag}{name}_fresh", f"{tag}{name}_fresh_cpu"):
                out[f"{key}_us_per_chunk"] = out[key] / n * 1e6


def index_series(n: int, work: Path, repeat: int) -> dict:
    """The chunk index alone, old and new side by side, at ``n`` entries in INDEX_PACKS packs of
    random ids: the LMDB chunk table as commits fill it (one write transaction per pack,
    ``Txn.put_chunk`` per entry) against pack indexes (``mvc/store/packindex.py``: one file
    per pack as it is sealed, then merged into one multi-pack index, in slices)."""
    import numpy as np
    from mvc.store import idarray, packindex
    from mvc.store.index import Index
    from mvc.store.packs import Location
    rng = np.random.default_rng(n)
    per = n // INDEX_PACKS
    by_pack = [np.frombuffer(rng.bytes(32 * per), dtype=idarray.ID) for _ in range(INDEX_PACKS)]
    names = [bytes([k + 1]) * 16 for k in range(INDEX_PACKS)]
    picks = [(int(k), int(r)) for k, r in zip(rng.integers(0, INDEX_PACKS, LOOKUPS), rng.integers(0, per, LOOKUPS))]
    needles = idarray.pack([by_pack[k][r:r + 1].tobytes() for k, r in picks])
    out = dict(n=n)
    # old: the LMDB chunk table
    folder = work / f"lmdb-{n}"
    index = Index(folder, create=True)
    start = time.perf_counter()
    for k, ids in enumerate(by_pack):
        with index.write() as txn:
            for r, cid in enumerate(idarray.ids(ids)):
                txn.put_chunk(cid, Location(names[k], 8 + 100 * r, 64))
    out["old_build_us"] = (time.perf_counter() - start) / n * 1e6
    out["old_bytes_per_entry"] = (folder / "data.mdb").stat().st_size / n
    with index.env.begin() as txn:
        st = txn.stat(index.dbs["chunks"])
    out["old_table_bytes_per_entry"] = (st["branch_pages"] + st["leaf_pages"]) * st["psize"] / n

    def old_lookup():
        with index.read() as txn:
            for cid in idarray.ids(needles):
                assert txn.chunk(cid) is not None
    out["old_lookup_us"] = _best(old_lookup, repeat) / LOOKUPS * 1e6

    def old_scan():
        with index.read() as txn:
            assert sum(len(b.ids) for b in txn.chunk_batches()) == per * INDEX_PACKS
    out["old_scan_us"] = _best(old_scan, repeat) / n * 1e6
    index.close()
    shutil.rmtree(folder, ignore_errors=True)
    # new: one pack index per pack, merged
    folder = work / f"pidx-{n}"
    folder.mkdir()
    start = time.perf_counter()
    for k, ids in enumerate(by_pack):
        packindex.write(folder / f"{k}.pidx", [names[k]], [ids])
    out["new_build_us"] = (time.perf_counter() - start) / n * 1e6
    parts = [packindex.PackIndex(folder / f"{k}.pidx") for k in range(INDEX_PACKS)]
    start = time.perf_counter()
    packindex.merge(folder / "multi.pidx", parts)
    out["new_merge_us"] = (time.perf_counter() - start) / n * 1e6
    out["new_merge_peak_mb"] = _merge_peak(folder) / 2**20
    for p in parts:
        p.close()
    out["new_bytes_per_entry"] = (folder / "multi.pidx").stat().st_size / n
    multi = packindex.PackIndex(folder / "multi.pidx")

    def new_lookup():
        pack, row = packindex.index_lookup(multi, needles, lambda k, rows: by_pack[k][rows])
        assert (pack >= 0).all()
    out["new_lookup_us"] = _best(new_lookup, repeat) / LOOKUPS * 1e6

    def new_scan():  # each slice's columns read into memory, as a planner merging it with live ids would
        total = 0
        for _, _, start, stop in multi.slices(1 << 20):
            columns = [np.array(c[start:stop]) for c in (multi.heads, multi.tails, multi.packs, multi.rows)]
            total += len(columns[0])
        assert total == per * INDEX_PACKS
    out["new_scan_us"] = _best(new_scan, repeat) / n * 1e6
    multi.close()
    for k, ids in enumerate(by_pack):
        np.save(folder / f"{k}.npy", ids)
    plan = json.loads(subprocess.run([sys.executable, "-c", _PLAN, str(folder), str(INDEX_PACKS)], check=True,
                                     capture_output=True, text=True).stdout)
    out["new_plan_us"] = plan["seconds"] / n * 1e6
    out["new_plan_peak_mb"] = plan["peak"] / 2**20
    shutil.rmtree(folder, ignore_errors=True)
    return out


_PLAN = """
import json, sys, time, tracemalloc
from pathlib import Path
import numpy as np
from mvc.store import packindex
folder, count = Path(sys.argv[1]), int(sys.argv[2])
by_pack = [np.load(folder / f"{k}.npy", mmap_mode="r") for k in range(count)]  # mapped, as pack trailers
multi = packindex.PackIndex(folder / "multi.pidx")
tracemalloc.start()
start = time.perf_counter()
spill = packindex.IdSpill(folder / "spill")
for ids in by_pack:  # the walk: every id live, met tensor by tensor (10 000 ids a tensor)
    for at in range(0, len(ids), 10_000):
        spill.add(np.array(ids[at:at + 10_000]))
live = dead = 0
for ids, pack, row, garbage in packindex.classify(multi, spill, lambda k, rows: by_pack[k][rows]):
    live += int((pack >= 0).sum())
    dead += len(garbage)
seconds = time.perf_counter() - start
assert live == sum(map(len, by_pack)) and dead == 0
print(json.dumps(dict(seconds=seconds, peak=tracemalloc.get_traced_memory()[1])))
"""


_MERGE_PEAK = """
import sys, tracemalloc
from pathlib import Path
from mvc.store import packindex
folder = Path(sys.argv[1])
parts = [packindex.PackIndex(p) for p in sorted(folder.glob("[0-9]*.pidx"))]
tracemalloc.start()
packindex.merge(folder / "again.pidx", parts)
print(tracemalloc.get_traced_memory()[1])
"""


def _merge_peak(folder: Path) -> int:
    """Peak bytes a merge of ``folder``'s pack indexes allocates (tracemalloc sees numpy's)."""
    out = subprocess.run([sys.executable, "-c", _MERGE_PEAK, str(folder)], check=True, capture_output=True, text=True)
    (folder / "again.pidx").unlink()
    return int(out.stdout)


_CATALOGUE = """
import json, os, random, sys, time
import mvc
from mvc.remote import catalogue, layout
from mvc.remote.connection import Connection
repo = mvc.Repository.open(sys.argv[1])
catalogue.forget(repo.dir, "origin")
conn = Connection(repo, "origin")
start = time.perf_counter()
conn.catalogue.refresh(conn.bucket)
refresh = time.perf_counter() - start
# the refresh's peak, before the walk below; VmHWM, not ru_maxrss, which keeps the forking parent's
peak = int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")).split()[1]) * 1024
ids = [cid for key, listed in conn.catalogue.pack_ids().items() if key.startswith(layout.CHUNK_PACKS) for cid in listed]
sample = random.Random(0).sample(ids, min(len(ids), 100000))
start = time.perf_counter()
found = conn.catalogue.chunks(sample, complete=False)
lookup = (time.perf_counter() - start) / len(sample)
assert len(found) == len(sample)
conn.close()
folder = catalogue.folder(repo.dir, "origin")
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs if not f.endswith(".lock"))
print(json.dumps([refresh, lookup * 1e6, size, len(ids), peak]))
"""


def _catalogue_costs(clone: Path, repeat: int, old: str, out: dict) -> None:
    """A host's catalogue of the whole remote, as a full clone or a pusher of everything holds it
    (every trailer read): seconds to build it from the remote, µs per chunk of a lookup of 10⁵ of
    them, bytes per remote chunk entry, the process's peak resident bytes; each in a fresh process,
    this code's and (``old``) the older code's alternating, best of ``repeat``."""
    runs = {"": [], "old_": []}
    for _ in range(repeat):
        for tag, code in (("old_", old), ("", "")) if old else (("", ""),):
            env = dict(os.environ)
            if code:
                env["PYTHONPATH"] = os.pathsep.join([code] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
            got = subprocess.run([sys.executable, "-c", _CATALOGUE, str(clone)], capture_output=True, text=True,
                                 env=env, cwd=clone)
            if got.returncode:
                raise RuntimeError(f"the catalogue run of {code or 'this code'} failed: {got.stderr[-2000:]}")
            runs[tag].append(json.loads(got.stdout))
    for tag, got in runs.items():
        if got:
            out[f"{tag}catalogue_refresh"] = min(r[0] for r in got)
            out[f"{tag}catalogue_lookup_us"] = min(r[1] for r in got)
            out[f"{tag}catalogue_bytes_per_chunk"] = min(r[2] / r[3] for r in got)
            out[f"{tag}catalogue_peak_rss"] = min(r[4] for r in got)


def _remote_part(repo, remote: Path, clone: Path, g, repeat: int, out: dict, old: str = "") -> None:
    """Push planning, the push, planning one more commit, a lazy clone and opening it."""
    repo.remotes.add("origin", str(remote))
    out["push_plan_all"] = _best(lambda: _plan_push(repo, "origin"), repeat)
    start = time.perf_counter()
    repo.remotes.push("origin")
    out["push_s"] = time.perf_counter() - start
    repo.commit({"new": torch.randint(0, 256, (CHUNK * 10,), dtype=torch.uint8, generator=g)}, "one more")
    out["push_plan_one"] = _best(lambda: _plan_push(repo, "origin"), repeat)
    repo.remotes.push("origin")
    start = time.perf_counter()
    cloned = mvc.Repository.clone(str(remote), clone, lazy=True)
    out["lazy_clone"] = time.perf_counter() - start
    cloned.close()

    def open_clone():
        r = mvc.Repository.open(clone)
        r.resolve("HEAD")
        r.close()
    out["lazy_open"] = _best(open_clone, repeat)
    _catalogue_costs(clone, repeat, old, out)


_VIEW = """
import json, os, sys, time
from pathlib import Path
import numpy as np
import mvc
from mvc.store import idarray, index, packindex

path, n, k, entries = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
repo = mvc.Repository.init(path, chunk_size=64)
folder = repo.dir / "packs"
rng = np.random.default_rng(n)
names = [rng.bytes(16) for _ in range(n + k)]  # oldest first


class Size:  # a tier of this many packs, for the merge policy
    def __init__(self, packs):
        self.packs = packs

    def __len__(self):
        return self.packs * entries


tiers = []  # the tiers of a process that registered the n packs one at a time, newest first
for _ in range(n):
    tiers = packindex._fewer([Size(1)] + tiers, lambda group: Size(sum(t.packs for t in group)))
fsync, os.fsync = os.fsync, lambda fd: None  # the setup's files: their durability is not measured
newest_first, at = names[:n][::-1], 0
for tier in tiers:  # each tier's file as that process left it, found on disk by the first view
    group = newest_first[at:at + tier.packs]
    at += tier.packs
    where = packindex.pidx_path(folder, group[0]) if len(group) == 1 else packindex.midx_path(folder, group)
    packindex.write(where, group, [np.frombuffer(rng.bytes(32 * entries), dtype=idarray.ID) for _ in group])
for name in names[n:]:
    packindex.write(packindex.pidx_path(folder, name), [name], [np.frombuffer(rng.bytes(32 * entries), dtype=idarray.ID)])
with repo.index.write() as txn:
    db = txn._packidx_db()
    for seq, name in enumerate(names[:n]):
        txn._txn.put(name, index.REGISTRATION.pack(seq, entries), db=db)
    txn._txn.put(index.NEXT_SEQ, index._SEQ.pack(n), db=db)
    txn._txn.put(index.VERSION, os.urandom(8), db=db)
with repo.index.read() as txn:
    view = txn._view()
    assert len(view.names) == n and len(view.tiers) == len(tiers) and not view.broken
os.fsync = fsync
wall, cpu = time.perf_counter(), time.process_time()
for name in names[n:]:  # as k commits register their packs, each in a write transaction of its own
    with repo.index.write() as txn:
        txn.register_pack(name, entries)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
with repo.index.read() as txn:
    assert len(txn._view().names) == n + k
repo.close()
print(json.dumps([wall / k, cpu / k]))
"""
VIEW_REGISTRATIONS = 50  # registrations timed per run of the view series
VIEW_ENTRIES = 4  # chunk entries per pack there (the commit series' packs hold a few)


def view_series(n: int, work: Path, repeat: int, old: str = "") -> dict:
    """The registered-pack view alone: a pack registered (``Txn.register_pack``, its view built)
    in a repository of ``n`` registered packs, whose multi-pack indexes are those a process that
    registered them one at a time would have written; in a fresh process, this code and the code
    at ``old`` alternating ``repeat`` times (milliseconds per registration, wall and CPU)."""
    runs = {"": [], "old_": []}
    for _ in range(repeat):
        for tag, code in (("old_", old), ("", "")) if old else (("", ""),):
            env = dict(os.environ)
            if code:
                env["PYTHONPATH"] = os.pathsep.join([code] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                              if p])
            path = work / f"views-{n}"
            shutil.rmtree(path, ignore_errors=True)
            done = subprocess.run([sys.executable, "-c", _VIEW, str(path), str(n), str(VIEW_REGISTRATIONS),
                                   str(VIEW_ENTRIES)], check=True, capture_output=True, text=True, env=env, cwd=work)
            runs[tag].append(json.loads(done.stdout))
            shutil.rmtree(path, ignore_errors=True)
    out = dict(n=n)
    for tag, got in runs.items():
        if got:
            out[f"{tag}register_ms"] = min(w for w, _ in got) * 1e3
            out[f"{tag}register_cpu_ms"] = min(c for _, c in got) * 1e3
    return out


def commit_series(c: int, work: Path, repeat: int) -> dict:
    """Measurements of a repository with ``c`` commits of a small changing state."""
    repo = mvc.Repository.init(work / f"commits-{c}", chunk_size=CHUNK)
    w = torch.zeros(64)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(c):
        w[i % 64] += 1.0
        repo.commit({"w": w, "step": i}, f"step {i}", step=i, metrics={"loss": 1.0 / (i + 1)})
    out = dict(n=c, build=time.perf_counter() - start, build_cpu=time.process_time() - cpu)
    out["log_all"] = _best(lambda: sum(1 for _ in repo.log()), repeat)
    out["fsck_quick"], out["fsck_quick_cpu"] = _best_both(lambda: repo.fsck(quick=True), repeat)
    out["gc_plan"], out["gc_plan_cpu"] = _best_both(lambda: repo.gc(dry_run=True), repeat)
    repo.remotes.add("origin", str(work / f"remote-c{c}"))
    out["push_plan_all"] = _best(lambda: _plan_push(repo, "origin"), repeat)
    repo.close()
    shutil.rmtree(work / f"commits-{c}", ignore_errors=True)
    shutil.rmtree(work / f"remote-c{c}", ignore_errors=True)
    return out


def tensor_series(t: int, work: Path, repeat: int) -> dict:
    """A state of ``t`` small tensors: commit, commit again unchanged, load."""
    repo = mvc.Repository.init(work / f"tensors-{t}", chunk_size=CHUNK)
    g = torch.Generator().manual_seed(t)
    state = {f"layer{i // 100}.w{i % 100}": torch.randn(16, generator=g) for i in range(t)}
    start = time.perf_counter()
    cid = repo.commit(state, "first").id
    out = dict(n=t, commit=time.perf_counter() - start)
    out["commit_again"] = _best(lambda: repo.commit(state, "again"), repeat)
    out["load"] = _best(lambda: repo.load(cid), repeat)
    repo.close()
    shutil.rmtree(work / f"tensors-{t}", ignore_errors=True)
    return out


def fit(rows: list, key: str) -> tuple:
    """(a, b) of t = a * n^b, least squares in log-log over the rows (b = 1.0 for one row)."""
    rows = [r for r in rows if key in r]
    if not rows:
        return float("nan"), float("nan")
    pts = [(math.log(r["n"]), math.log(max(r[key], 1e-6))) for r in rows]
    if len(pts) < 2:  # one size: assume linear (a per-chunk figure: constant)
        return (rows[0][key], 0.0) if key.endswith("per_chunk") else (rows[0][key] / rows[0]["n"], 1.0)
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return math.exp(my - b * mx), b


def _sizes(text: str) -> list:
    return [int(float(x)) for x in text.split(",") if x]


def _human(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def table(title: str, rows: list, keys: list) -> list:
    lines = [title, f"{'n':>10} " + " ".join(f"{k:>14}" for k in keys)]
    for r in rows:
        lines.append(f"{r['n']:>10.0e} " + " ".join(f"{r.get(k, float('nan')):>14.4g}" for k in keys))
    fits = [fit(rows, k) for k in keys]
    lines.append(f"{'growth b':>10} " + " ".join(f"{b:>14.2f}" for _, b in fits))
    flagged = [k for k, (_, b) in zip(keys, fits) if b > 1.15 and sum(k in r for r in rows) > 1]
    if flagged:
        lines.append("SUPERLINEAR: " + ", ".join(flagged))
    return lines


# 1 TB model, 100 checkpoints of 4e6 chunks at 256 KiB
PROJECT = dict(chunks=100 * 4_000_000, commits=100, tensors=10_000)


def projection(chunks: list, commits: list, tensors: list) -> list:
    lines = [f"projection: 1 TB model, {PROJECT['commits']} checkpoints, {PROJECT['chunks']:.0e} chunk entries "
             f"(every chunk new each checkpoint), {PROJECT['tensors']:.0e} tensors per checkpoint "
             "(fit t = a*n^b from the runs above; the chunk series' fits carry the chunk count)"]
    for name, rows, n, keys in (("chunks", chunks, PROJECT["chunks"],
                                 ["index_bytes_per_chunk", "fsck_quick", "gc_plan", "fsck_mem_per_chunk",
                                  "gc_mem_per_chunk", "push_plan_all",
                                  "push_plan_one", "lazy_clone", "lazy_open", "catalogue_refresh",
                                  "catalogue_bytes_per_chunk"]),
                                ("commits", commits, PROJECT["commits"], ["log_all", "fsck_quick", "gc_plan"]),
                                ("tensors", tensors, PROJECT["tensors"], ["commit", "commit_again", "load"])):
        if not rows:
            continue
        for key in keys:
            a, b = fit(rows, key)
            if math.isnan(b):
                continue
            last = max((r for r in rows if key in r), key=lambda r: r["n"])
            lines.append(f"  {name:8} {key:22} b={b:5.2f}  -> {_projected(key, a * n ** b, n)}"
                         f"   (linear from n={last['n']:.0e}: {_projected(key, _linear(key, last, n), n)})")
    return lines


def _linear(key: str, row: dict, n: int) -> float:
    """``row[key]`` carried to ``n`` in proportion (per-chunk figures stay as they are)."""
    return row[key] if key.endswith("per_chunk") else row[key] * n / row["n"]


def _projected(key: str, value: float, n: int) -> str:
    if key == "index_bytes_per_chunk":
        return f"{value:.0f} B per chunk, {value * n / 1e9:.0f} GB of index"
    if key.endswith("_mem_per_chunk") or key == "catalogue_bytes_per_chunk":
        return f"{value:.0f} B per chunk, {value * n / 1e9:.0f} GB"
    return _human(value)


def _shown(row: dict) -> dict:
    """``row``, printed as soon as it is measured (a long run that is stopped still shows its rows)."""
    print("measured " + " ".join(f"{k}={v:.4g}" for k, v in row.items()), flush=True)
    return row


def report(chunks: list, commits: list, tensors: list) -> list:
    lines = table("chunk series (seconds; index bytes per chunk; build = 10 commits writing them)", chunks,
                  ["build", "index_bytes_per_chunk", "chunk_db_per_chunk", "tensor_db_per_chunk", "fsck_quick",
                   "fsck_quick_cpu", "gc_plan", "gc_plan_cpu",
                   "fsck_mem_per_chunk", "gc_mem_per_chunk", "push_plan_all", "push_s",
                   "push_plan_one", "lazy_clone", "lazy_open"]) if chunks else []
    lines += table("fsck --quick and gc --dry-run, µs per chunk entry (wall; CPU of the process)", chunks,
                   ["fsck_quick_us_per_chunk", "fsck_quick_cpu_us_per_chunk", "gc_plan_us_per_chunk",
                    "gc_plan_cpu_us_per_chunk"]) if chunks else []
    if chunks and any("old_fsck_fresh" in r for r in chunks):
        lines += table("the same in fresh processes, this code and the --old code (µs per chunk entry)", chunks,
                       [f"{old}{op}_fresh{cpu}_us_per_chunk" for op in ("fsck", "gc") for cpu in ("", "_cpu")
                        for old in ("", "old_")])
    if chunks and any("old_fsck_fresh" in r for r in chunks):
        lines += table("fsck --quick and gc --dry-run in fresh processes, this code and the --old code "
                       "(seconds; peak bytes per chunk)", chunks,
                       ["fsck_fresh", "old_fsck_fresh", "gc_fresh", "old_gc_fresh", "fsck_fresh_cpu",
                        "old_fsck_fresh_cpu", "gc_fresh_cpu", "old_gc_fresh_cpu", "fsck_mem_per_chunk",
                        "old_fsck_mem_per_chunk", "gc_mem_per_chunk", "old_gc_mem_per_chunk",
                        "fsck_anon_per_chunk", "old_fsck_anon_per_chunk", "gc_anon_per_chunk",
                        "old_gc_anon_per_chunk"])
    if chunks and any("catalogue_refresh" in r for r in chunks):
        lines += table("a host's catalogue of the whole remote (every trailer read; fresh processes): seconds to "
                       "build, µs per chunk looked up, bytes per remote chunk entry; old_: the --old code", chunks,
                       [f"{old}catalogue_{what}" for what in ("refresh", "lookup_us", "bytes_per_chunk")
                        for old in ("", "old_") if any(f"{old}catalogue_refresh" in r for r in chunks)])
    lines += table("commit series (seconds)", commits, ["build", "build_cpu", "log_all", "fsck_quick", "gc_plan",
                                                        "push_plan_all"]) if commits else []
    lines += table("tensor series (seconds)", tensors, ["commit", "commit_again", "load"]) if tensors else []
    lines += projection(chunks, commits, tensors)
    return lines


def _read_rows(path: Path) -> tuple:
    """(chunk, commit, tensor series rows) of the 'measured' lines in ``path``, told apart by their keys."""
    series = ([], [], [])
    for line in path.read_text().splitlines():
        if line.startswith("measured "):
            row = {k: float(v) for k, v in (item.split("=") for item in line.split()[1:])}
            series[0 if "gc_plan" in row and "log_all" not in row else 1 if "log_all" in row else 2].append(row)
    return tuple(sorted(rows, key=lambda r: r["n"]) for rows in series)


def bookkeeping(n: int, work: Path, repeat: int, profile: str = "") -> dict:
    """µs per new chunk of one commit of ``n`` new 64-byte chunks, and of its hashing and writing alone."""
    from mvc import live
    from mvc.store import packformat
    g = torch.Generator().manual_seed(n)
    tensor = torch.randint(0, 256, (n * CHUNK,), dtype=torch.uint8, generator=g)
    data = tensor.numpy()
    spans = range(0, n * CHUNK, CHUNK)

    def hash_all():
        for off in spans:
            live.identify(None, data, off, CHUNK, CHUNK)

    def write_all():
        head = packformat.RECORD_HEAD.pack(bytes(32), CHUNK)
        blob = (head + bytes(CHUNK)) * n
        with open(work / "records", "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.unlink(work / "records")
    count = [0]

    def commit_once():
        count[0] += 1
        repo = mvc.Repository.init(work / f"bookkeeping-{n}-{count[0]}", chunk_size=CHUNK)
        try:
            if profile and count[0] == 1:
                import cProfile
                cProfile.runctx("repo.commit({'t': tensor}, 'c')", globals(), locals(), profile)
            else:
                repo.commit({"t": tensor}, "c")
            assert repo.status().chunks == n
        finally:
            repo.close()
            shutil.rmtree(work / f"bookkeeping-{n}-{count[0]}", ignore_errors=True)
    if profile:
        commit_once()
    out = dict(n=n)
    for clock, tag in ((time.perf_counter, ""), (time.process_time, "_cpu")):
        total = _best(commit_once, repeat, clock) / n * 1e6
        hashing = _best(hash_all, repeat, clock) / n * 1e6
        writing = _best(write_all, repeat, clock) / n * 1e6
        out.update({f"commit_us{tag}": total, f"hashing_us{tag}": hashing, f"writing_us{tag}": writing,
                    f"bookkeeping_us{tag}": total - hashing - writing})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", default="1e5,3e5,1e6", help="chunk entries of the chunk series (comma separated)")
    ap.add_argument("--commits", default="1e3,3e3,1e4", help="commits of the commit series")
    ap.add_argument("--tensors", default="1e4,3e4,1e5", help="tensors of the tensor series")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-remote", action="store_true", help="chunk series without push and lazy clone")
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--rows", default=None, help="print the tables of the 'measured' lines of earlier runs' "
                    "output (a file), measuring nothing")
    ap.add_argument("--index", default="", help="entries of the index series: the LMDB chunk table and pack "
                    "indexes side by side (comma separated; run alone with --chunks '' --commits '' --tensors '')")
    ap.add_argument("--views", default="", help="registered packs of the view series: a pack registered (its view "
                    "built) at that many, this code and --old side by side (comma separated; run alone with "
                    "--chunks '' --commits '' --tensors '')")
    ap.add_argument("--bookkeeping", type=float, default=0, help="only a commit of this many new 64-byte chunks: "
                    "µs per new chunk, beyond hashing and writing")
    ap.add_argument("--profile", default="", help="with --bookkeeping: write a cProfile of one commit to this file")
    ap.add_argument("--old", default="", help="a folder holding an export of older mvc code (its 'mvc' package): "
                    "the chunk series also runs fsck and gc planning with it, in fresh processes alternating "
                    "with this code's, for old and new side by side")
    ap.add_argument("--budget", type=float, default=0, help="MVC_WALK_BUDGET for fsck and gc (live records "
                    "held in memory at once; default: mvc's own)")
    args = ap.parse_args()
    if args.budget:
        os.environ["MVC_WALK_BUDGET"] = str(int(args.budget))
    if args.bookkeeping:
        work = Path(args.dir or tempfile.mkdtemp(prefix="mvc-bench-scale-"))
        work.mkdir(parents=True, exist_ok=True)
        try:
            row = bookkeeping(int(args.bookkeeping), work, args.repeat, args.profile)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print("measured " + " ".join(f"{k}={v:.6g}" for k, v in row.items()))
        for tag, clock in (("", "wall"), ("_cpu", "CPU")):
            print(f"{row['n']} new chunks, {clock} time: commit {row['commit_us' + tag]:.1f} µs/chunk = hashing "
                  f"{row['hashing_us' + tag]:.1f} + writing {row['writing_us' + tag]:.1f} + bookkeeping "
                  f"{row['bookkeeping_us' + tag]:.1f}")
        return
    if args.rows:
        print("\n".join(report(*_read_rows(Path(args.rows)))))
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="mvc-bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = [index_series(n, work, args.repeat) for n in _sizes(args.index)]
        if rows:
            print("\n".join(table("index series (microseconds per entry or lookup; bytes per entry; "
                                   "old = LMDB chunk table, new = pack indexes)", rows, list(rows[0])[1:])))
        old = str(Path(args.old).resolve()) if args.old else ""
        rows = [view_series(n, work, args.repeat, old) for n in _sizes(args.views)]
        for row in rows:
            print("measured " + " ".join(f"{k}={v:.6g}" for k, v in row.items()))
        if rows:
            print("\n".join(table("view series (milliseconds per pack registered, its view built, at n registered "
                                   "packs; old_: the --old code)", rows, list(rows[0])[1:])))
        chunks = [_shown(chunk_series(n, work, args.repeat, not args.no_remote, old)) for n in _sizes(args.chunks)]
        commits = [_shown(commit_series(c, work, args.repeat)) for c in _sizes(args.commits)]
        tensors = [_shown(tensor_series(t, work, args.repeat)) for t in _sizes(args.tensors)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(report(chunks, commits, tensors)))


if __name__ == "__main__":
    os.environ.setdefault("MVC_AUTHOR", "bench")
    main()
