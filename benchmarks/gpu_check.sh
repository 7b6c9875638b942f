#!/usr/bin/env bash
# The GPU path of mvc_hooks, on a CUDA machine, in a few minutes:
#   1. commit/load of CUDA tensors (every dtype, map_location back to the GPU), bit for bit
#   2. the async save's pinned-memory snapshot of CUDA tensors (pinned, non-blocking, exact)
#   3. per-device CUDA RNG capture/restore (every visible device)
#   4. bit-exact resume of a small CUDA AMP run (autocast fp16, GradScaler("cuda"), dropout,
#      DataLoader(shuffle=True) with no generator): straight vs stopped-and-resumed
#   5. dense (repacked) records of CUDA tensors: byte-grouped and delta records decoded in
#      parallel runs straight into the tensors, then map_location to the GPU, bit for bit
#   6. the blocked-time benchmark on the GPU (benchmarks/bench_hooks.py --device cuda)
# Prints one summary line last: "gpu_check: PASS ..." or "gpu_check: FAIL ...".
#
#   bash benchmarks/gpu_check.sh            # after: pip install -e '.[test]' (torch with CUDA)
#   MVC_GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh   # the same checks on the CPU (a dry run)
set -uo pipefail
cd "$(dirname "$0")/.."
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS: two runs of the same steps agree bit for bit
DEVICE="${MVC_GPU_CHECK_DEVICE:-cuda}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

python - "$DEVICE" "$WORK" <<'EOF' 2>&1 | tee "$WORK/checks.log"
import sys, time, traceback
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import mvc
from mvc_hooks import Checkpointer, rng
from mvc_hooks.state import Snapshot

device, work = sys.argv[1], Path(sys.argv[2])
if device == "cuda" and not torch.cuda.is_available():
    print("CHECKS FAIL no CUDA device visible to torch", torch.__version__)
    sys.exit(1)
torch.use_deterministic_algorithms(True)
results = {}


def check(name):
    def wrap(fn):
        started = time.perf_counter()
        try:
            fn()
            results[name] = "ok"
        except Exception as exc:
            traceback.print_exc()
            results[name] = f"FAIL({type(exc).__name__}: {exc})"
        print(f"{name}: {results[name]} ({time.perf_counter() - started:.1f} s)", flush=True)
    return wrap


@check("map_location")
def _():
    state = {"f32": torch.randn(1000, 37, device=device), "bf16": torch.randn(333, device=device).bfloat16(),
             "f16": torch.randn(64, 64, device=device).half(), "i64": torch.arange(99, device=device),
             "bool": torch.rand(50, device=device) > 0.5, "view": torch.randn(40, 30, device=device).t()}
    with mvc.Repository.init(work / "tensors", chunk_size=4096) as repo:
        repo.commit(state, message="cuda tensors")
        back = repo.load("HEAD", map_location=device)
        cpu = repo.load("HEAD")
    for key, tensor in state.items():
        assert back[key].device.type == torch.device(device).type, key
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
        assert cpu[key].device.type == "cpu" and torch.equal(cpu[key], tensor.cpu()), key


@check("repacked_map_location")
def _():
    g = torch.Generator().manual_seed(3)
    first = {"f32": torch.randn(300_001, generator=g) * 0.02, "bf16": (torch.randn(70_003, generator=g) * 0.1).bfloat16(),
             "f64": torch.randn(9_999, generator=g, dtype=torch.float64), "i32": torch.randint(0, 9, (5_001,), generator=g,
                                                                                          dtype=torch.int32)}
    second = {k: v.clone() for k, v in first.items()}
    second["f32"][1000:1064] += 1.0  # a few rows: a delta record against the first commit's chunk
    with mvc.Repository.init(work / "dense", chunk_size=1 << 16) as repo:
        ids = [repo.commit({k: v.to(device) for k, v in s.items()}, message=m).id
               for s, m in ((first, "first"), (second, "second"))]
        report = repo.repack()
        assert report.grouped and report.deltas, report
        for cid, state in zip(ids, (first, second)):
            back = repo.load(cid, map_location=device)
            for key, tensor in state.items():
                assert back[key].device.type == torch.device(device).type, key
                assert back[key].dtype == tensor.dtype and torch.equal(back[key].cpu(), tensor), key
        assert repo.fsck().ok


@check("pinned_snapshot")
def _():
    weights = {"a": torch.randn(4096, 1024, device=device), "b": torch.randn(3, device=device)}
    weights["tied"] = weights["a"]
    snap = Snapshot()
    copy = snap.take(weights)
    expected = {k: v.cpu().clone() for k, v in weights.items()}
    weights["a"].mul_(3)  # queued after the copies on the same stream: must not reach them
    snap.wait()
    for key in ("a", "b"):
        assert torch.equal(copy[key], expected[key]), key
        assert copy[key].device.type == "cpu"
        assert copy[key].is_pinned() == (device == "cuda"), key
    assert copy["tied"] is copy["a"]
    again = snap.take(weights)
    snap.wait()
    assert again["a"].data_ptr() == copy["a"].data_ptr() and torch.equal(again["a"], weights["a"].cpu())


@check("rng_per_device")
def _():
    devices = range(torch.cuda.device_count()) if device == "cuda" else []
    for d in devices:
        torch.randn(3, device=f"cuda:{d}")  # initialize every device's generator
    saved = rng.capture()
    assert len(saved["cuda"]) == len(devices)
    first = [torch.rand(5, device=f"cuda:{d}") for d in devices] + [torch.rand(5)]
    rng.restore(saved)
    second = [torch.rand(5, device=f"cuda:{d}") for d in devices] + [torch.rand(5)]
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(256, 4)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 14)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 32, generator=g)
    loader = DataLoader(TensorDataset(x, (x @ torch.randn(32, 4, generator=g)).argmax(1)), batch_size=32,
                        shuffle=True)
    return model, opt, sched, scaler, loader


def train(parts, start, stop, ckpt=None):
    model, opt, sched, scaler, loader = parts
    losses, step = {}, start
    while step < stop:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            sched.step()
            losses[step] = loss.item()
            if ckpt is not None:
                ckpt.step(step, loss=losses[step], epoch=step // len(loader))
            step += 1
            if step >= stop:
                break
    return losses


@check("amp_resume_bit_exact")
def _():
    straight = build()
    want = train(straight, 0, 40)
    path = work / "amp"
    parts = build()
    names = dict(model=parts[0], optimizer=parts[1], scheduler=parts[2], scaler=parts[3], loader=parts[4])
    with Checkpointer(path, every_n_steps=9, **names) as ckpt:
        assert ckpt.resume() == 0
        losses = train(parts, 0, 22, ckpt)  # commits at 8 and 17 (mid-epoch); steps 18..21 are lost
    parts = build()
    names = dict(model=parts[0], optimizer=parts[1], scheduler=parts[2], scaler=parts[3], loader=parts[4])
    with Checkpointer(path, every_n_steps=9, **names) as ckpt:
        start = ckpt.resume()
        assert start == 18, start
        losses.update(train(parts, start, 40, ckpt))
    assert losses == want, [s for s in want if losses.get(s) != want[s]][:5]
    for a, b in zip(parts[0].parameters(), straight[0].parameters()):
        assert torch.equal(a, b)
    assert parts[3].get_scale() == straight[3].get_scale()


print("CHECKS " + " ".join(f"{k}={v.split('(')[0]}" for k, v in results.items()))
sys.exit(0 if all(v == "ok" for v in results.values()) else 1)
EOF
checks=$?

bench_line="bench=skipped"
if [ "$DEVICE" = "cuda" ]; then
  python benchmarks/bench_hooks.py --device cuda --size-mb 256 --steps 40 --every 10 --repeat 2 --dir "$WORK" \
    2>&1 | tee "$WORK/bench.log"
  ratio="$(grep -o 'ratio [0-9.]*' "$WORK/bench.log" | tail -1 | cut -d' ' -f2)"
  blocked="$(grep -o 'blocked time per checkpoint [0-9.]*' "$WORK/bench.log" | tail -1 | awk '{print $NF}')"
  bench_line="blocked_vs_d2h=${ratio:-?} (target <=1.1) blocked_vs_torch_save=${blocked:-?} (target <=0.2)"
fi

summary="$(grep '^CHECKS' "$WORK/checks.log" | tail -1 | cut -d' ' -f2-)"
if [ "$checks" -eq 0 ]; then verdict=PASS; else verdict=FAIL; fi
echo "gpu_check: $verdict device=$DEVICE torch=$(python -c 'import torch; print(torch.__version__)') ${summary:-no checks ran} $bench_line"
exit "$checks"
