"""Storage benchmark: three real small trainings, bytes on disk and time, against torch.save / torch.load.

Run ``python benchmarks/bench_storage.py [--scale 1.0] [--hook-mib 1024]``. Each run trains a
small model and checkpoints it (model and optimizer state) with ``torch.save`` + fsync to files
and with ``mvc commit`` to a repository, side by side:

- **frozen**: a frozen backbone with a trained head (AdamW on the head only);
- **dense**: pre-training where every weight moves (fp32, AdamW);
- **sparse**: a recommendation-style embedding (``sparse=True``, SparseAdam): a few rows per step.

For each it prints the bytes of all checkpoints: the torch.save files, mvc's packs as
committed, and after ``mvc repack`` (byte-grouped zstd, deltas against the parent commit's
chunk); the **lower bound** (the distinct 4 KiB blocks of all checkpoints' raw tensor bytes,
what perfect block dedup would store); and ratios of commit time to torch.save, load time
(after repack) to torch.load, and switching a live model between two adjacent checkpoints
(``repo.load_into``, checking the live bytes, and on the caller's promise ``check_live=False``)
to one torch.load. ``bf16`` repeats the dense run's last weights in
bfloat16 to measure compression there. ``--codec-mib`` compares, on the same chunks, mvc's
dense records with python-blosc2 and zipnn where they are installed (``bench_codec.py``).
``--hook-mib`` measures a commit through the training
hook after 10% of a state of that size changed, against torch.save of it (0 skips it).

Loads are timed in ``ROUNDS`` interleaved rounds (torch.load, mvc load, warm; then both cold) and
the best of each kept. Cold: the files' pages are dropped from the page cache first with
``posix_fadvise(DONTNEED)`` on the ``.pt`` file, and on the packs and index files, which needs no
root and leaves other processes' cache alone (dropping the whole cache would need root and would
disturb everyone else on a shared machine). ``verified decode`` is the store's read of every chunk
of the last checkpoint (decoded, BLAKE3-checked) into one warm buffer with the store's threads.
``floor`` is the least a verified load can cost on this machine's cores (``_floor``): torch.load's
time plus decoding and BLAKE3 of every chunk, timed on one thread and divided by the cores.
Times come from a shared machine: compare ratios, not seconds.
"""

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

import mvc
from mvc.store import codec
from mvc.store.chunks import THREADS

MiB = 1 << 20
ROUNDS = 5  # interleaved rounds of torch.load and mvc load, warm then cold; the best of each is kept


def _fsync_save(obj, path: Path) -> float:
    start = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - start


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _tensors(node, out):
    if isinstance(node, torch.Tensor):
        out.append(node)
    elif isinstance(node, dict):
        for v in node.values():
            _tensors(v, out)
    elif isinstance(node, (list, tuple)):
        for v in node:
            _tensors(v, out)
    return out


def _flat(node, path=(), out=None) -> dict:
    out = {} if out is None else out
    if isinstance(node, torch.Tensor):
        out[path] = node
    elif isinstance(node, dict):
        for k, v in node.items():
            _flat(v, path + (k,), out)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _flat(v, path + (i,), out)
    return out


def _blocks(states: list) -> int:
    """Bytes of the distinct 4 KiB blocks (aligned per tensor) over all states."""
    seen = set()
    total = 0
    for state in states:
        for t in _tensors(state, []):
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            for off in range(0, len(raw), 4096):
                block = raw[off:off + 4096]
                key = hashlib.blake2b(block, digest_size=16).digest()
                if key not in seen:
                    seen.add(key)
                    total += len(block)
    return total


def _copy(state):
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {k: _copy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_copy(v) for v in state)
    return state


def _packs(repo) -> int:
    return sum(p.stat().st_size for p in (repo.dir / "packs").glob("pack-*.pack"))


# -- the three trainings -----------------------------------------------------------

def frozen_run(scale: float, ckpts: int):
    torch.manual_seed(0)
    width = int(1024 * scale ** 0.5)
    backbone = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                         torch.nn.Linear(4 * width, width)) for _ in range(3)])
    model = torch.nn.Sequential(backbone, torch.nn.Linear(width, 10))
    for p in backbone.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(model[1].parameters(), lr=1e-3)
    x, y = torch.randn(64, width), torch.randint(0, 10, (64,))

    def train():
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return model, opt, train, ckpts


def dense_run(scale: float, ckpts: int):
    torch.manual_seed(1)
    width = int(768 * scale ** 0.5)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width),
                                torch.nn.GELU(), torch.nn.Linear(width, width))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(128, width)

    def train():
        for _ in range(2):
            opt.zero_grad()
            (model(x) - x).pow(2).mean().backward()
            opt.step()
    return model, opt, train, ckpts


def sparse_run(scale: float, ckpts: int):
    torch.manual_seed(2)
    rows = int(200_000 * scale)

    class Rec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(rows, 64, sparse=True)
            self.out = torch.nn.Linear(64, 1)

    model = Rec()
    opt = torch.optim.SparseAdam(list(model.emb.parameters()), lr=1e-2)
    dense = torch.optim.AdamW(model.out.parameters(), lr=1e-3)

    def train():
        ids = torch.randint(0, rows, (256,))
        opt.zero_grad()
        dense.zero_grad()
        model.out(model.emb(ids)).pow(2).mean().backward()
        opt.step()
        dense.step()

    class Both:  # one optimizer state for the checkpoint
        def state_dict(self):
            return {"sparse": opt.state_dict(), "dense": dense.state_dict()}
    return model, Both(), train, ckpts


def measure(name: str, build, scale: float, ckpts: int, work: Path) -> dict:
    model, opt, train, n = build(scale, ckpts)
    repo = mvc.Repository.init(work / f"{name}-repo")
    files, states, ids = [], [], []
    save_s, commit_s = [], []
    for i in range(n):
        train()
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        path = work / f"{name}-{i}.pt"
        save_s.append(_fsync_save(state, path))
        t, c = _timed(lambda: repo.commit(state, f"{name} {i}", step=i))
        commit_s.append(t)
        files.append(path)
        states.append(_copy(state))
        ids.append(c.id)
    raw_packs = _packs(repo)
    load_raw = load_torch0 = float("inf")
    for _ in range(3):
        load_torch0 = min(load_torch0, _timed(lambda: torch.load(files[-1], weights_only=True))[0])
        load_raw = min(load_raw, _timed(lambda: repo.load(ids[-1]))[0])
    repack_s, report = _timed(lambda: repo.repack())
    dense_packs = _packs(repo)
    bound = _blocks(states)
    torch_bytes = sum(p.stat().st_size for p in files)
    load_torch = load_mvc = cpu_torch = cpu_mvc = cold_torch = cold_mvc = float("inf")
    packs = sorted((repo.dir / "packs").glob("pack-*.pack")) + sorted((repo.dir / "index").glob("*.mdb"))
    for _ in range(ROUNDS):  # side by side, so both see the same background load and allocator state
        cpu = time.process_time()
        load_torch = min(load_torch, _timed(lambda: torch.load(files[-1], weights_only=True))[0])
        cpu_torch, cpu = min(cpu_torch, time.process_time() - cpu), time.process_time()
        load_mvc = min(load_mvc, _timed(lambda: repo.load(ids[-1]))[0])
        cpu_mvc = min(cpu_mvc, time.process_time() - cpu)
        _evict([files[-1]])
        cold_torch = min(cold_torch, _timed(lambda: torch.load(files[-1], weights_only=True))[0])
        _evict(packs)
        cold_mvc = min(cold_mvc, _timed(lambda: repo.load(ids[-1]))[0])
    decode = _decode_speed(repo, ids[-1])
    floor = _floor(repo, ids[-1], load_torch)
    live = {"model": model.state_dict()}
    repo.load_into(live, ids[-2])
    switch = min(_timed(lambda k=k: repo.load_into(live, ids[-1 - k % 2]))[0] for k in range(4))
    # on the caller's promise that nothing wrote past the version counter (an evaluation loop)
    promised = min(_timed(lambda k=k: repo.load_into(live, ids[-1 - k % 2], check_live=False))[0] for k in range(4))
    assert repo.fsck().ok
    for cid, state in zip(ids, states):  # bit for bit, after the repack
        got, want = _flat(repo.load(cid)), _flat(state)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    repo.close()
    # What compressing at commit time would cost: encode every chunk of the last checkpoint.
    tensors = _tensors(states[-1], [])
    encode_s = _encode_time(tensors)
    entropy = _plane_entropy(tensors)
    return dict(name=name, torch=torch_bytes, raw=raw_packs, dense=dense_packs, bound=bound,
                commit=sum(commit_s[1:]) / sum(save_s[1:]), first_commit=commit_s[0] / save_s[0],
                encode_at_commit=(commit_s[-1] + encode_s) / save_s[-1], repack_s=repack_s,
                load=load_mvc / load_torch, load_raw=load_raw / load_torch0, switch=switch / load_torch,
                cold=cold_mvc / cold_torch, cold_s=(cold_mvc, cold_torch), warm_s=(load_mvc, load_torch),
                decode=decode, floor=floor,
                load_cpu=cpu_mvc / cpu_torch,
                promised=promised / load_torch,
                deltas=report.deltas, grouped=report.grouped, entropy=entropy)


def _evict(paths: list) -> None:
    """Drop these files' pages from the page cache (posix_fadvise DONTNEED: no root needed, and
    other processes' cached files stay; the files are fsynced, so their pages are clean)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _decode_speed(repo, commit_id: str, rounds: int = 5) -> float:
    """GB/s of verified reads of every chunk of ``commit_id`` (decoded where encoded, each
    BLAKE3-checked) into one warm buffer with the store's threads: decode alone, without
    allocating tensors. Best of ``rounds``."""
    import numpy as np
    from mvc.store.chunks import Request
    chunk_ids = dict.fromkeys(cid for e in repo.entries(commit_id) if e.kind == "tensor" for cid in e.chunks)
    with repo.index.read() as txn:
        sizes = {cid: repo.chunks.length(cid, txn) for cid in chunk_ids}
        buffer = np.zeros(sum(sizes.values()), np.uint8)
        requests, at = [], 0
        for cid, n in sizes.items():
            requests.append(Request(cid, buffer[at:at + n], "bench"))
            at += n
        best = min(_timed(lambda: repo.chunks.read(requests, txn, threads=THREADS))[0] for _ in range(rounds))
    return at / best / 1e9


def _floor(repo, commit_id: str, load_torch: float) -> float:
    """The least a verified load of ``commit_id`` can cost here, as a multiple of ``load_torch``
    (torch.load's warm time): torch.load's own work (reading the file into fresh tensors, which
    mvc's load does as well) plus the work only mvc does, decoding each record that decodes
    alone and BLAKE3 of every chunk, timed on one thread with the records already in memory
    (best of 3) and spread perfectly over THREADS cores. A lower bound: no bookkeeping, no
    reads, no delta chains, perfect scaling."""
    import numpy as np
    from mvc import hashing
    chunk_ids = dict.fromkeys(cid for e in repo.entries(commit_id) if e.kind == "tensor" for cid in e.chunks)
    with repo.index.read() as txn:
        stored = [repo.chunks.read_stored(cid, txn) for cid in chunk_ids]
    outs = [np.empty(loc.size, np.uint8) for loc, _ in stored]
    for (loc, payload), out in zip(stored, outs):
        out[:] = 0  # warm: the load's fresh pages are torch.load's cost too

    def work():
        for (loc, payload), out in zip(stored, outs):
            if loc.coded and loc.base is None:
                codec.decode(loc.kind, payload, loc.size, out)
            hashing.digest(out)
    only_mvc = min(_timed(work)[0] for _ in range(3))
    return (load_torch + only_mvc / THREADS) / load_torch


def _plane_entropy(tensors: list) -> float:
    """The order-0 entropy of the byte planes of ``tensors`` (each dtype split by its width),
    as a share of their size: what byte-grouped coding without deltas can reach at best."""
    import numpy as np
    from mvc.store.codec import _entropy
    bits = size = 0
    for t in tensors:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        w = t.element_size()
        if len(raw) < w:
            continue
        planes = raw[:len(raw) // w * w].reshape(-1, w)
        for j in range(w):
            bits += _entropy(np.ascontiguousarray(planes[:, j])) * len(planes)
        size += len(raw)
    return bits / 8 / size if size else 1.0


def _encode_time(tensors: list, chunk: int = 256 << 10) -> float:
    from concurrent.futures import ThreadPoolExecutor
    jobs = []
    for t in tensors:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        jobs += [(raw[o:o + chunk], t.element_size()) for o in range(0, len(raw), chunk)]
    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda j: codec.encode(j[0], j[1]), jobs))
    return time.perf_counter() - start


def bf16(work: Path, scale: float) -> float:
    model, _, train, _ = dense_run(scale, 1)
    train()
    state = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    repo = mvc.Repository.init(work / "bf16-repo")
    repo.commit(state)
    raw = sum(t.nbytes for t in state.values())
    repo.repack()
    ratio = _packs(repo) / raw
    repo.close()
    return ratio


def hook_commit(work: Path, mib: int) -> dict:
    """A commit through the Checkpointer after 10% of the bytes changed, against torch.save."""
    from mvc_hooks import Checkpointer
    n = 64
    params = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(mib * MiB // n // 4)) for _ in range(n)])
    model = torch.nn.Module()
    model.params = params
    ckpt = Checkpointer(work / "hook-repo", model=model, every_n_steps=1, async_save=False)
    ckpt.save(0)
    with torch.no_grad():
        for p in list(params)[: n // 10]:
            p.add_(1.0)
    t_hook, _ = _timed(lambda: ckpt.save(1))
    ckpt.close()
    t_save = _fsync_save(model.state_dict(), work / "hook.pt")
    return dict(hook=t_hook / t_save, save_s=t_save, hook_s=t_hook)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="model sizes relative to the defaults (~100 MiB)")
    ap.add_argument("--hook-mib", type=int, default=1024)
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--codec-mib", type=int, default=32, help="MiB of weights for the codec comparison "
                    "(benchmarks/bench_codec.py; 0 skips it)")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="mvc-bench-storage-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = [measure("frozen", frozen_run, args.scale, 5, work), measure("dense", dense_run, args.scale, 5, work),
                measure("sparse", sparse_run, args.scale, 6, work)]
        ratio16 = bf16(work, args.scale)
        hook = hook_commit(work, args.hook_mib) if args.hook_mib else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'run':8} {'torch.save':>11} {'mvc':>9} {'repacked':>9} {'bound':>9} | {'mvc/bound':>9} "
          f"{'pack/bnd':>8} {'pack/raw':>8} | {'commit':>6} {'1st':>5} {'enc@c':>6} {'load0':>6} {'load':>5} {'switch':>6} {'switch*':>7}")
    for r in rows:
        print(f"{r['name']} records after repack: {r['grouped']} byte-grouped, {r['deltas']} deltas; "
              f"repack took {r['repack_s']:.1f} s; byte-plane entropy of its last checkpoint "
              f"{r['entropy']:.3f}x raw (the floor of grouping without deltas)")
    for r in rows:
        print(f"{r['name']:8} {r['torch'] / MiB:9.1f}Mi {r['raw'] / MiB:7.1f}Mi {r['dense'] / MiB:7.1f}Mi "
              f"{r['bound'] / MiB:7.1f}Mi | {r['raw'] / r['bound']:8.2f}x {r['dense'] / r['bound']:7.2f}x "
              f"{r['dense'] / r['raw']:7.3f}x | {r['commit']:5.2f}x {r['first_commit']:4.2f}x "
              f"{r['encode_at_commit']:5.2f}x {r['load_raw']:5.2f}x {r['load']:4.2f}x {r['switch']:5.3f}x {r['promised']:6.3f}x")
    print(f"load of the last checkpoint after repack / torch.load of its file, best of {ROUNDS} interleaved rounds; "
          "cold = both files' pages dropped first (posix_fadvise DONTNEED on the .pt, the packs and the index)")
    for r in rows:
        (mw, tw), (mc, tc) = r["warm_s"], r["cold_s"]
        print(f"{r['name']:8} warm {r['load']:5.2f}x ({mw:.3f} s vs {tw:.3f} s)  cold {r['cold']:5.2f}x "
              f"({mc:.3f} s vs {tc:.3f} s)  CPU (all threads) warm {r['load_cpu']:.2f}x  "
              f"verified decode {r['decode']:.2f} GB/s ({THREADS} threads, into a warm buffer)  "
              f"floor {r['floor']:.2f}x")
    print(f"floor = the least a verified load can cost on {THREADS} cores: torch.load's time plus decoding and "
          "BLAKE3 of every chunk on one thread, divided by the cores, over torch.load's time")
    print(f"bf16 weights after repack: {ratio16:.3f}x raw")
    if args.codec_mib:
        import bench_codec  # this folder is on sys.path when run as a script
        print("\n".join(bench_codec.report(args.codec_mib)))
    if hook:
        print(f"10%-changed {args.hook_mib} MiB commit through the hook: {hook['hook']:.3f}x torch.save "
              f"({hook['hook_s']:.2f} s vs {hook['save_s']:.2f} s)")
    print("columns: commit = mvc commit / torch.save (checkpoints 2..n); 1st = the first checkpoint; enc@c = "
          "the last commit plus byte-grouped zstd of all its chunks, / torch.save (what compressing at commit "
          "would cost); load0 / load = mvc load of the last checkpoint before / after repack / torch.load; switch = load_into "
          "between two adjacent checkpoints / torch.load of one; switch* = the same with check_live=False (the "
          "caller's promise that nothing wrote past torch's version counter: no live byte is read)")


if __name__ == "__main__":
    main()
