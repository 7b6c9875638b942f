"""Storage and speed on real training trajectories: what mvc stores and costs against what users do instead.

Run ``python benchmarks/bench_real.py`` (about 7 minutes on 2 quiet cores, 25 on busy ones) or
``--quick`` (a smaller model and fewer steps, about 2 minutes). Every model here is trained on this machine, on real text no
one here wrote: the bytes of the Python standard library's own ``.py`` files (present on every
machine), read as a byte-level corpus. The trajectories, each a run of full checkpoints (model,
optimizer, LR scheduler, RNG) as a training loop commits them:

- **pretrain**: a decoder-only transformer (about 11 M parameters; fp32 master weights, AdamW,
  warm-up then cosine), a checkpoint every ``--every`` steps;
- **pretrain-bf16**: the same under ``torch.autocast(bfloat16)`` (master weights stay fp32);
- **ft-all**, **ft-frozen**, **ft-lora**: fine-tunes from pretrain's middle checkpoint on another
  part of the corpus: (a) all weights, (b) embeddings and the lower half frozen, (c) rank-8
  LoRA-style adapters beside a frozen base; each trajectory starts with that base checkpoint;
- **soup**: ft-all's and ft-frozen's last checkpoints, and their model soup (``mvc merge``, a
  linear average of the model's weights) as a third commit;
- **sparse**: a large hashed-trigram embedding table (next-byte prediction), trained with
  SparseAdam on batches that touch few rows.

For each, side by side in one run: the bytes and seconds of one ``torch.save`` (fsynced) per
checkpoint; each file compressed alone with zstd level 3 and 19 and with zipnn (where installed);
restic (where installed) backing up the ``.pt`` files one snapshot per checkpoint; mvc's
repository as committed and after ``mvc repack`` (the whole ``.mvc`` folder: packs and index).
Then the load of the last and the middle checkpoint: ``repo.load`` against ``torch.load`` of its
file (warm, best of 3). A breakdown by kind of tensor (model weights, Adam moments, step counters
and the rest) says where mvc's bytes go after repack and how many chunks are deltas, with the
bytes the same chunks would take byte-grouped alone (did deltas help?).

Times come from a shared machine: compare ratios in one run, not seconds across runs. The bytes
are deterministic for a seed and a torch build.
"""

import argparse
import hashlib
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import mvc
from bench_storage import _flat, _fsync_save, _tensors  # this folder is on sys.path when run as a script
from mvc.ondisk import DEFAULT_CHUNK_SIZE
from mvc.store import codec

MiB = 1 << 20


# -- the corpus ---------------------------------------------------------------------------------

def corpus(limit: int) -> np.ndarray:
    """The first ``limit`` bytes of the standard library's ``.py`` files, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        data = path.read_bytes()
        out.append(data)
        total += len(data)
        if total >= limit:
            break
    return np.frombuffer(b"".join(out)[:limit], dtype=np.uint8).copy()


def batches(text: np.ndarray, batch: int, seq: int, seed: int):
    """Endless random windows of ``text``: (inputs, targets) of shape (batch, seq), int64."""
    g = np.random.default_rng(seed)
    while True:
        starts = g.integers(0, len(text) - seq - 1, batch)
        rows = np.stack([text[s:s + seq + 1] for s in starts]).astype(np.int64)
        t = torch.from_numpy(rows)
        yield t[:, :-1], t[:, 1:]


# -- the models ---------------------------------------------------------------------------------

class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update ``B @ A`` (B starts at zero)."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0):
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.o(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Decoder(nn.Module):
    """A byte-level decoder-only transformer."""

    def __init__(self, d: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.embed = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256)

    def forward(self, x):
        h = self.embed(x) + self.pos[:x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))


class Trigrams(nn.Module):
    """Next-byte prediction from a hashed embedding of the previous three bytes: a large table of
    which a batch touches few rows (``sparse=True``, so SparseAdam moves only those)."""

    def __init__(self, rows: int, d: int):
        super().__init__()
        self.rows = rows
        self.table = nn.Embedding(rows, d, sparse=True)
        self.head = nn.Linear(d, 256)

    def forward(self, x):
        key = (x[:, :-2] * 65599 + x[:, 1:-1] * 257 + x[:, 2:]) % self.rows
        return self.head(self.table(key))


# -- one trajectory -----------------------------------------------------------------------------

@dataclass
class Trajectory:
    name: str
    states: list = field(default_factory=list)  # full checkpoints, in commit order (copied)
    parents: list = field(default_factory=list)  # index of each checkpoint's parent in states, or None
    merges: list = field(default_factory=list)  # (a, b): a soup of states[a] and states[b], committed by mvc merge
    train_s: float = 0.0


def _copy(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return type(obj)((k, _copy(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy(v) for v in obj)
    return obj


def _checkpoint(model, opt, sched) -> dict:
    return _copy({"model": model.state_dict(), "optimizer": opt.state_dict(),
                  "scheduler": sched.state_dict() if sched is not None else {},
                  "rng": {"torch": torch.get_rng_state()}})


def _train(model, opt, sched, data, steps: int, every: int, traj: Trajectory, autocast: bool = False,
           parent=None):
    """``steps`` optimizer steps; a checkpoint into ``traj`` after every ``every``."""
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        x, y = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        out = logits.float()
        loss = F.cross_entropy(out.reshape(-1, 256), y[:, -out.shape[1]:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        if step % every == 0:
            traj.states.append(_checkpoint(model, opt, sched))
            traj.parents.append(parent)
            parent = len(traj.states) - 1
    traj.train_s += time.perf_counter() - start
    return float(loss.detach())


def _schedule(opt, warmup: int, total: int):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def trajectories(cfg) -> list:
    text = corpus(cfg.corpus)
    half = len(text) // 2
    pre_text, ft_text = text[:half], text[half:]
    out = []

    def decoder():
        torch.manual_seed(0)
        return Decoder(cfg.d, cfg.layers, cfg.heads, cfg.seq)

    pre = Trajectory("pretrain")
    model = decoder()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
    sched = _schedule(opt, cfg.steps // 10, cfg.steps)
    _train(model, opt, sched, batches(pre_text, cfg.batch, cfg.seq, 1), cfg.steps, cfg.every, pre)
    out.append(pre)

    bf = Trajectory("pretrain-bf16")
    model = decoder()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
    sched = _schedule(opt, cfg.steps // 10, cfg.steps)
    _train(model, opt, sched, batches(pre_text, cfg.batch, cfg.seq, 1), cfg.steps, cfg.every, bf, autocast=True)
    out.append(bf)

    base = pre.states[len(pre.states) // 2]
    fine = {}
    for kind in ("all", "frozen", "lora"):
        traj = Trajectory(f"ft-{kind}", states=[_copy(base)], parents=[None])
        model = decoder()
        model.load_state_dict(base["model"])
        if kind == "frozen":
            frozen = [model.embed, model.pos, *model.blocks[:cfg.layers // 2]]
            for part in frozen:
                for p in (part.parameters() if isinstance(part, nn.Module) else [part]):
                    p.requires_grad_(False)
        if kind == "lora":
            for p in model.parameters():
                p.requires_grad_(False)
            for block in model.blocks:
                for name in ("q", "k", "v", "o"):
                    setattr(block, name, LoRALinear(getattr(block, name)))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.lr / (1 if kind == "lora" else 3), weight_decay=0.0)
        sched = _schedule(opt, 0, cfg.ft_steps)
        _train(model, opt, sched, batches(ft_text, cfg.batch, cfg.seq, 2), cfg.ft_steps, cfg.every, traj, parent=0)
        fine[kind] = traj
        out.append(traj)

    soup = Trajectory("soup", states=[_copy(fine["all"].states[-1]), _copy(fine["frozen"].states[-1])],
                      parents=[None, None], merges=[(0, 1)])
    out.append(soup)

    sparse = Trajectory("sparse")
    torch.manual_seed(0)
    model = Trigrams(cfg.sparse_rows, cfg.sparse_dim)
    opt_table = torch.optim.SparseAdam(list(model.table.parameters()), lr=1e-2)
    opt_head = torch.optim.Adam(model.head.parameters(), lr=1e-3)

    class Both:
        def zero_grad(self, set_to_none=True):
            opt_table.zero_grad(set_to_none=set_to_none)
            opt_head.zero_grad(set_to_none=set_to_none)

        def step(self):
            opt_table.step()
            opt_head.step()

        def state_dict(self):
            return {"table": opt_table.state_dict(), "head": opt_head.state_dict()}
    _train(model, Both(), None, batches(pre_text, cfg.sparse_batch, 16, 3), cfg.sparse_steps, cfg.sparse_every,
           sparse)
    out.append(sparse)
    return out


# -- what users do instead ----------------------------------------------------------------------

def zstd_bytes(files: list, level: int, sample: bool = False) -> tuple:
    """Bytes and seconds of each file compressed alone at ``level`` (2 threads, as ``zstd -T2``).
    ``sample``: compress ``WINDOWS`` windows of ``WINDOW`` bytes spread evenly over the last file,
    each alone, and scale their ratio and time to all files (level 19 runs at about 1 MB/s here:
    every file of a full run would take an hour). A window compressed alone finds no matches in
    the bytes before it, so the estimate may err high, in mvc's favour: on a full run's fine-tune
    checkpoint (115 MiB) it came to 0.915 of the file against 0.913 compressed whole."""
    import zstandard
    c = zstandard.ZstdCompressor(level=level, threads=2)
    if sample:
        data = files[-1].read_bytes()
        step = max(WINDOW, len(data) // WINDOWS)
        windows = [data[at:at + WINDOW] for at in range(0, len(data), step)][:WINDOWS]
        start = time.perf_counter()
        packed = sum(len(c.compress(w)) for w in windows)
        scale = sum(p.stat().st_size for p in files) / sum(len(w) for w in windows)
        return int(packed * scale), (time.perf_counter() - start) * scale
    total, start = 0, time.perf_counter()
    for path in files:
        total += len(c.compress(path.read_bytes()))
    return total, time.perf_counter() - start


WINDOW, WINDOWS = 4 * MiB, 8


def zipnn_bytes(files: list) -> tuple:
    """zipnn over each file's float tensors (each compressed alone), plus the file's other bytes
    (integer tensors such as step counters and RNG states, and the pickle) as they are; None
    where zipnn is not installed."""
    try:
        from zipnn import ZipNN
    except ImportError:
        return None
    coder = ZipNN(input_format="torch", threads=2)
    total, start = 0, time.perf_counter()
    for path in files:
        floats = [t for t in _tensors(torch.load(path, weights_only=True), [])
                  if t.dtype in (torch.float32, torch.bfloat16, torch.float16) and t.numel()]
        total += path.stat().st_size - sum(t.numel() * t.element_size() for t in floats)
        total += sum(len(coder.compress(t.contiguous().reshape(-1))) for t in floats)
    return total, time.perf_counter() - start


def restic_bytes(files: list, work: Path) -> tuple:
    """Bytes and seconds of a restic repository holding one snapshot per file (each file backed up
    alone, in order, as a run of checkpoints would be); None where restic is not installed."""
    if shutil.which("restic") is None:
        return None
    where = work / "restic"
    env = dict(os.environ, RESTIC_PASSWORD="bench", RESTIC_REPOSITORY=str(where))
    run = lambda *a: subprocess.run(["restic", "-q", *a], env=env, check=True, stdout=subprocess.DEVNULL)  # noqa: E731
    run("init")
    start = time.perf_counter()
    for path in files:
        run("backup", str(path))
    seconds = time.perf_counter() - start
    return _du(where), seconds


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- mvc ----------------------------------------------------------------------------------------

def tensor_kind(path: tuple) -> str:
    """weights, moments (Adam's exp_avg, exp_avg_sq), step (optimizer step counters) or other."""
    names = [str(p) for p in path]
    if names and names[0] == "model":
        return "weights"
    if "exp_avg" in names or "exp_avg_sq" in names:
        return "moments"
    if "step" in names:
        return "step"
    return "other"


def breakdown(repo, ids: list) -> dict:
    """By kind of tensor, over every distinct chunk of ``ids`` (each counted once, for the kind of
    the first tensor that holds it): raw bytes, stored bytes, deltas, and what those deltas'
    chunks would take byte-grouped alone (``codec.encode`` without a base)."""
    kinds, seen = {}, set()
    with repo.index.read() as txn:
        for cid in ids:
            for e in repo.entries(cid):
                if e.kind != "tensor":
                    continue
                row = kinds.setdefault(tensor_kind(e.path), dict(raw=0, stored=0, chunks=0, deltas=0,
                                                                 delta_bytes=0, delta_alone=0))
                width = _width(e.dtype)
                for chunk in e.chunks:
                    if chunk in seen:
                        continue
                    seen.add(chunk)
                    loc, _payload = repo.chunks.read_stored(chunk, txn)
                    row["raw"] += loc.size
                    row["stored"] += loc.length
                    row["chunks"] += 1
                    if loc.kind == codec.DELTA:
                        row["deltas"] += 1
                        row["delta_bytes"] += loc.length
                        row["delta_alone"] += _alone(repo, chunk, width)
    return kinds


def potential(states: list, parents: list, chunk_size: int) -> dict:
    """By kind of tensor: what each distinct chunk of ``states`` takes raw, byte-grouped as mvc
    groups it, byte-grouped with every plane compressed that compresses at all, and the least of
    those and of an XOR delta against the chunk at the same place in the next version (the chunk's
    child, as repack's candidate base), without repack's depth limit: an upper bound on what
    per-chunk choices could save on this trajectory."""
    child = {}
    for j, p in enumerate(parents):
        if p is not None:
            child.setdefault(p, j)
    kinds, seen = {}, set()
    for i, state in enumerate(states):
        later = _flat(states[child[i]]) if i in child else {}
        for path, t in _flat(state).items():
            if not isinstance(t, torch.Tensor) or not t.numel():
                continue
            row = kinds.setdefault(tensor_kind(path), dict(raw=0, grouped=0, squeezed=0, best=0))
            data, width = _bytes(t).numpy(), t.element_size()
            other = later.get(path)
            base = _bytes(other).numpy() if isinstance(other, torch.Tensor) and other.dtype == t.dtype \
                and other.shape == t.shape else None
            for at in range(0, len(data), chunk_size):
                piece = data[at:at + chunk_size]
                key = hashlib.blake2b(piece, digest_size=16).digest()
                if key in seen:
                    continue
                seen.add(key)
                n = len(piece)
                grouped = min(n, len(codec.group(piece, width)))
                squeezed = min(grouped, _squeezed(piece, width))
                best = squeezed
                if base is not None and not np.array_equal(base[at:at + chunk_size], piece):
                    best = min(best, 32 + len(codec.group(np.bitwise_xor(piece, base[at:at + chunk_size]), width)))
                for name, v in (("raw", n), ("grouped", grouped), ("squeezed", squeezed), ("best", best)):
                    row[name] += v
    return kinds


def _squeezed(piece: np.ndarray, width: int) -> int:
    """Grouped with every plane compressed that gets any smaller (mvc keeps a plane raw unless
    compressing saves a quarter of it: such planes cost decode time for little)."""
    saving, skip = codec.PLANE_SAVING, codec.ENTROPY_SKIP
    codec.PLANE_SAVING, codec.ENTROPY_SKIP = 0.0, 8.1
    try:
        return len(codec.group(piece, width))
    finally:
        codec.PLANE_SAVING, codec.ENTROPY_SKIP = saving, skip


def _width(dtype: str) -> int:
    from mvc import dtypes
    return dtypes.itemsize(dtype)


def _alone(repo, chunk, width: int) -> int:
    """The bytes chunk ``chunk`` would take encoded without a base (grouped, or raw)."""
    data = _chunk_bytes(repo, chunk)
    kind, payload = codec.encode(data, width)
    return len(data) if kind == codec.RAW else len(payload)


def _chunk_bytes(repo, chunk) -> np.ndarray:
    from mvc.store.chunks import Request
    with repo.index.read() as txn:
        n = repo.chunks.length(chunk, txn)
        out = np.empty(n, np.uint8)
        repo.chunks.read([Request(chunk, out, "bench")], txn)
    return out


def mvc_run(traj: Trajectory, work: Path, chunk_size: int) -> dict:
    repo = mvc.Repository.init(work / "repo", chunk_size=chunk_size)
    ids, commit_s, branch_of = [], 0.0, {}
    for i, (state, parent) in enumerate(zip(traj.states, traj.parents)):
        # a checkpoint continues its parent's branch, or starts a branch of its own (a root)
        branch = branch_of[parent] if parent is not None else f"line{i}"
        start = time.perf_counter()
        c = repo.commit(state, f"{traj.name} {i}", step=i, branch=branch)
        commit_s += time.perf_counter() - start
        ids.append(c.id)
        branch_of[i] = branch
    for a, b in traj.merges:
        start = time.perf_counter()
        merged = repo.merge([ids[a], ids[b]], strategy="linear", only="model.*", branch=f"soup-{a}-{b}")
        commit_s += time.perf_counter() - start
        ids.append(merged.commit.id)
    committed = _du(repo.dir)
    index = _du(repo.dir / "index")
    start = time.perf_counter()
    repo.repack()
    repack_s = time.perf_counter() - start
    repacked = _du(repo.dir)
    kinds = breakdown(repo, ids)
    assert repo.fsck().ok
    loads = {}
    for label, at in (("last", len(traj.states) - 1), ("middle", (len(traj.states) - 1) // 2)):
        want = traj.states[at]
        got = repo.load(ids[at])
        assert _same(got, want), f"{traj.name}: checkpoint {at} did not load bit for bit"
        loads[label] = (ids[at], at)
    return dict(repo=repo, ids=ids, commit_s=commit_s, committed=committed, repacked=repacked, index=index,
                repack_s=repack_s, kinds=kinds, loads=loads)


def _same(a, b) -> bool:
    """Bit for bit: tensors of the same dtype and shape with the same bytes; other values equal."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _best(fn, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(traj: Trajectory, work: Path, chunk_size: int, sample19: bool) -> dict:
    work.mkdir(parents=True)
    m = mvc_run(traj, work, chunk_size)
    repo = m.pop("repo")
    states = traj.states + [repo.load(cid) for cid in m["ids"][len(traj.states):]]  # the soups mvc merged
    files, save_s = [], 0.0
    for i, state in enumerate(states):
        path = work / f"{traj.name}-{i:03d}.pt"
        save_s += _fsync_save(state, path)
        files.append(path)
    torch_bytes = sum(p.stat().st_size for p in files)
    row = dict(name=traj.name, n=len(files), torch=torch_bytes, save_s=save_s, train_s=traj.train_s)
    row["potential"] = potential(states, traj.parents + [None] * len(traj.merges), chunk_size)
    row["zstd3"] = zstd_bytes(files, 3)
    row["zstd19"] = zstd_bytes(files, 19, sample=sample19)
    row["zipnn"] = zipnn_bytes(files)
    row["restic"] = restic_bytes(files, work)
    row.update(m)
    for label, (cid, at) in m["loads"].items():
        t_torch = _best(lambda: torch.load(files[at], weights_only=True))
        t_mvc = _best(lambda: repo.load(cid))
        row[f"load_{label}"] = (t_mvc, t_torch)
    repo.close()
    return row


# -- the report ---------------------------------------------------------------------------------

def _mb(n) -> str:
    return f"{n / MiB:9.1f}"


def report(rows: list, sampled: bool) -> None:
    print("\nStored bytes (MiB) of every checkpoint of each trajectory; ratio = mvc after repack / best per-file "
          "compressor measured (zstd-19, zipnn)")
    if sampled:
        print(f"zstd-19: {WINDOWS} windows of {WINDOW // MiB} MiB spread over each trajectory's last file, each "
              "compressed alone, their ratio applied to all files")
    print(f"{'trajectory':14} {'ckpts':>5} {'torch.save':>10} {'zstd-3':>9} {'zstd-19':>9} {'zipnn':>9} "
          f"{'restic':>9} {'mvc':>9} {'repacked':>9} {'ratio':>6}")
    for r in rows:
        zipnn = r["zipnn"][0] if r["zipnn"] else None
        restic = r["restic"][0] if r["restic"] else None
        best = min(x for x in (r["zstd19"][0], zipnn) if x is not None)
        print(f"{r['name']:14} {r['n']:5d} {_mb(r['torch']):>10} {_mb(r['zstd3'][0])} {_mb(r['zstd19'][0])} "
              f"{_mb(zipnn) if zipnn else '        -'} {_mb(restic) if restic else '        -'} "
              f"{_mb(r['committed'])} {_mb(r['repacked'])} {r['repacked'] / best:6.3f}")
    print("\nmvc's index (MiB, in 'repacked') and what per-chunk choices could store at best ('potential', "
          "MiB, chunks only): byte-grouped as mvc groups ('grouped'), every plane compressed that shrinks "
          "at all ('squeezed'), and the least of those and an XOR delta against the next version ('best')")
    print(f"{'trajectory':14} {'index':>7} {'packs':>9} {'grouped':>9} {'squeezed':>9} {'best':>9}")
    for r in rows:
        pot = {k: sum(v[k] for v in r["potential"].values()) for k in ("grouped", "squeezed", "best")}
        print(f"{r['name']:14} {r['index'] / MiB:7.2f} {_mb(r['repacked'] - r['index'])} {_mb(pot['grouped'])} "
              f"{_mb(pot['squeezed'])} {_mb(pot['best'])}")
    print("\nSeconds for every checkpoint of each trajectory (ratio to one torch.save per checkpoint, fsynced)")
    print(f"{'trajectory':14} {'train':>7} {'torch.save':>10} {'mvc commit':>11} {'zstd-3':>7} {'zstd-19':>8} "
          f"{'zipnn':>7} {'restic':>7} {'repack':>7}")
    for r in rows:
        s = r["save_s"]
        zipnn = f"{r['zipnn'][1] / s:7.2f}" if r["zipnn"] else "      -"
        restic = f"{r['restic'][1] / s:7.2f}" if r["restic"] else "      -"
        print(f"{r['name']:14} {r['train_s']:7.1f} {s:10.2f} {r['commit_s'] / s:11.2f} {r['zstd3'][1] / s:7.2f} "
              f"{r['zstd19'][1] / s:8.2f} {zipnn} {restic} {r['repack_s'] / s:7.2f}")
    print("\nLoad after repack / torch.load of the same checkpoint's file (warm, best of 3; mvc verifies "
          "every byte)")
    for r in rows:
        parts = [f"{label} {r[f'load_{label}'][0] / r[f'load_{label}'][1]:.2f} "
                 f"({r[f'load_{label}'][0]:.3f} s vs {r[f'load_{label}'][1]:.3f} s)" for label in ("last", "middle")]
        print(f"  {r['name']:14} " + "; ".join(parts))
    print("\nWhere mvc's bytes go after repack (MiB; each distinct chunk counted once). 'alone' is what the "
          "delta chunks would take byte-grouped without a base: deltas helped where delta < alone.")
    print(f"{'trajectory':14} {'kind':8} {'raw':>9} {'stored':>9} {'share':>6} {'chunks':>7} {'deltas':>7} "
          f"{'delta':>9} {'alone':>9} {'best':>9}")
    for r in rows:
        for kind, k in sorted(r["kinds"].items()):
            share = k["stored"] / k["raw"] if k["raw"] else 0
            print(f"{r['name']:14} {kind:8} {_mb(k['raw'])} {_mb(k['stored'])} {share:6.3f} {k['chunks']:7d} "
                  f"{k['deltas']:7d} {_mb(k['delta_bytes'])} {_mb(k['delta_alone'])} "
                  f"{_mb(r['potential'].get(kind, {}).get('best', 0))}")


CONFIGS = {
    "full": dict(d=320, layers=8, heads=5, seq=64, batch=8, lr=1e-3, steps=200, every=25, ft_steps=75,
                 corpus=8 << 20, sparse_rows=400_000, sparse_dim=32, sparse_batch=16, sparse_steps=300,
                 sparse_every=50),
    "quick": dict(d=128, layers=2, heads=4, seq=32, batch=8, lr=1e-3, steps=60, every=15, ft_steps=30,
                  corpus=2 << 20, sparse_rows=100_000, sparse_dim=16, sparse_batch=16, sparse_steps=100,
                  sparse_every=25),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small model and few steps (under 3 minutes)")
    parser.add_argument("--only", help="comma-separated trajectory names to measure")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads for training")
    parser.add_argument("--chunk-size", type=int, default=None, help="mvc's chunk size (default: mvc's)")
    args = parser.parse_args()
    cfg = argparse.Namespace(**CONFIGS["quick" if args.quick else "full"])
    # one intra-op thread for training: on a shared machine OpenMP threads spin on busy cores
    # (measured here: 30x slower steps with 2 threads while the other core was busy)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    trajs = trajectories(cfg)
    params = sum(t.numel() for t in trajs[0].states[0]["model"].values())
    print(f"trained {len(trajs)} trajectories in {time.perf_counter() - start:.0f} s; decoder {params / 1e6:.1f} M "
          f"parameters, corpus {cfg.corpus / MiB:.0f} MiB of the standard library's source")
    wanted = set(args.only.split(",")) if args.only else None
    chunk_size = args.chunk_size or DEFAULT_CHUNK_SIZE
    rows = []
    with tempfile.TemporaryDirectory(prefix="mvc-bench-real-") as tmp:
        for traj in trajs:
            if wanted and traj.name not in wanted:
                continue
            rows.append(measure(traj, Path(tmp) / traj.name, chunk_size, sample19=not args.quick))
            shutil.rmtree(Path(tmp) / traj.name)
    report(rows, sampled=not args.quick)
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
