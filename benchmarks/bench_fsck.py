"""fsck benchmark: full fsck throughput next to raw BLAKE3 over the same bytes, in one run.

Run ``python benchmarks/bench_fsck.py [--size-mb 1024] [--repeat 3] [--threads N] [--chunk-kib K]``.
It commits about ``--size-mb`` MiB of random tensors into a new repository
(chunks of ``--chunk-kib``, default: mvc's default chunk size), then measures, with a warm page cache
and the same number of threads for both:

- ``fsck``: the full check (refs, commits, trees, tensors, the chunk index,
  every pack trailer, then every reachable record read back, its header
  checked and its data re-hashed);
- raw BLAKE3: the same chunks, found from the packs' trailers, read from
  the pack files with ``pread`` into a reused buffer and hashed, batches of
  about 16 MiB handed to a thread pool: what any verifier must at least do.

It prints MiB/s for both and the ratio fsck / raw (target >= 0.7). Times are
the best of ``--repeat`` runs, alternating the two, because the machines are
noisy.
"""

import argparse
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

import mvc
from mvc import hashing  # hashing.digest is blake3.blake3(data).digest(), nothing more
from mvc.store.packs import read_trailer
from mvc.repository import DEFAULT_CHUNK_SIZE

MiB = 1 << 20
TENSOR_MB = 64
BATCH = 16 * MiB
TARGET = 0.7


def make_state(size_mb: int, seed: int = 0) -> dict:
    """About ``size_mb`` MiB of random float32 tensors of up to 64 MiB each."""
    rng = np.random.default_rng(seed)
    state, left = {}, size_mb * MiB
    while left > 0:
        n = min(TENSOR_MB * MiB, left)
        raw = np.frombuffer(rng.bytes(n), dtype=np.uint8).copy()
        state[f"layers.{len(state)}.weight"] = torch.from_numpy(raw).view(torch.float32).reshape(-1, 256)
        left -= n
    return state


def chunk_batches(pack_dir: Path) -> list:
    """[(pack path, [(offset, length), ...])] of about BATCH bytes each, every record of every pack."""
    batches = []
    for path in sorted(pack_dir.glob("pack-*.pack")):
        current, size = [], 0
        for _, offset, length in sorted(read_trailer(path), key=lambda e: e[1]):
            current.append((offset, length))
            size += length
            if size >= BATCH:
                batches.append((path, current))
                current, size = [], 0
        if current:
            batches.append((path, current))
    return batches


def raw_blake3(batches: list, threads: int) -> int:
    """Read and hash every chunk; returns the bytes hashed."""
    def work(batch):
        path, spans = batch
        buf = memoryview(bytearray(max(n for _, n in spans)))
        fd = os.open(path, os.O_RDONLY)
        try:
            total = 0
            for offset, length in spans:
                view = buf[:length]
                os.preadv(fd, [view], offset)
                hashing.digest(view)
                total += length
            return total
        finally:
            os.close(fd)
    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(work, batches))


def timed(fn) -> tuple:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="MiB of tensors to commit (default 1024)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the best counts")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for both (default: cores)")
    parser.add_argument("--chunk-kib", type=int, default=DEFAULT_CHUNK_SIZE // 1024,
                        help=f"repository chunk size in KiB (default {DEFAULT_CHUNK_SIZE // 1024}, mvc's default)")
    parser.add_argument("--dir", default=None, help="where to build the repository (default: a temporary dir)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mvc-bench-fsck-", dir=args.dir))
    try:
        state = make_state(args.size_mb)
        nbytes = sum(t.nbytes for t in state.values())
        with mvc.Repository.init(work, chunk_size=args.chunk_kib * 1024) as repo:
            start = time.perf_counter()
            repo.commit(state, "bench")
            commit_s = time.perf_counter() - start
            del state
            batches = chunk_batches(repo.dir / "packs")
            chunks = sum(len(spans) for _, spans in batches)
            raw_blake3(batches, args.threads)  # warm the page cache
            fsck_times, raw_times, verified = [], [], 0
            for _ in range(args.repeat):  # alternate, so both see the same machine weather
                t, report = timed(lambda: repo.fsck(threads=args.threads))
                assert report.ok, report.damage
                fsck_times.append(t)
                verified = report.bytes_verified
                t, hashed = timed(lambda: raw_blake3(batches, args.threads))
                raw_times.append(t)
            quick_s = min(timed(lambda: repo.fsck(quick=True))[0] for _ in range(args.repeat))
        assert verified == hashed == nbytes, (verified, hashed, nbytes)
        fsck_s, raw_s = min(fsck_times), min(raw_times)
        fsck_rate, raw_rate = nbytes / MiB / fsck_s, nbytes / MiB / raw_s
        ratio = fsck_rate / raw_rate
        print(f"repository: {nbytes / MiB:.0f} MiB in {chunks} chunks of "
              f"{repo.chunk_size // 1024} KiB; committed in {commit_s:.2f} s; threads {args.threads}, "
              f"best of {args.repeat}")
        print(f"fsck (full)     {fsck_s:8.3f} s  {fsck_rate:9.0f} MiB/s")
        print(f"raw BLAKE3      {raw_s:8.3f} s  {raw_rate:9.0f} MiB/s")
        print(f"fsck --quick    {quick_s:8.3f} s  (structure only, no data read)")
        print(f"ratio fsck/raw  {ratio:8.2f}    target >= {TARGET}: {'met' if ratio >= TARGET else 'NOT met'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
