"""Dense-record codecs side by side: size and verified decode speed on the same chunks.

Run ``python benchmarks/bench_codec.py [--mib 32]`` (``bench_storage.py`` runs it too). It
trains a small dense model a few steps, cuts its fp32 weights (and the same in bf16) into
256 KiB chunks, and for each codec prints the stored size as a share of the raw bytes and the
decode speed in GB/s of decoded bytes, **verified**: each chunk decoded into its place in one
output buffer and BLAKE3-hashed there, as a load does. ``1 thr`` is one thread; ``2 thr`` is
the same work over a pool of two threads (the machine's cores).

- **mvc**: ``mvc.store.codec`` as it is (byte planes, zstd where it pays, planes put back
  together by the compiled kernel ``mvc/store/_planes.c``: ``codec.interleave``);
- **mvc, numpy**: the same records decoded as where no C compiler built the kernel, one
  strided numpy copy per plane (``codec.interleave_numpy``);
- **blosc2 shuffle+zstd1 / shuffle+lz4**: python-blosc2 (C-Blosc2's SIMD shuffle), one
  thread inside, decompressing straight into the output;
- **zipnn**: zipnn with torch tensors in and out (its ``byte`` input mode does not give the
  bytes back in 0.5.4, so it is not measured that way).

blosc2 and zipnn are optional: a codec whose package is missing is left out of the table.
Every decoded chunk is compared with the original once before timing.
"""

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from mvc import hashing
from mvc.store import codec

CHUNK = 256 << 10


def weights(mib: int) -> torch.Tensor:
    """About ``mib`` MiB of fp32 weights after a few AdamW steps (trained-like exponents)."""
    torch.manual_seed(1)
    width = int((mib * (1 << 20) / 4 / 8) ** 0.5)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, width)
    for _ in range(4):
        opt.zero_grad()
        (model(x) - x).pow(2).mean().backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


class Mvc:
    def __init__(self, width: int, numpy: bool = False):
        self.width, self.numpy = width, numpy

    def encode(self, chunk: np.ndarray):
        kind, payload = codec.encode(chunk, self.width)
        return (kind, payload if kind != codec.RAW else chunk.tobytes())

    def decode(self, record, out: np.ndarray) -> None:
        kind, payload = record
        if self.numpy and kind == codec.GROUPED:
            codec.ungroup(memoryview(payload), len(out), out, codec.interleave_numpy)
        else:
            codec.decode(kind, payload, len(out), out)

    @staticmethod
    def size(record) -> int:
        return len(record[1])


class Blosc2:
    def __init__(self, width: int, lz4: bool = False):
        import blosc2
        self.blosc2, self.width = blosc2, width
        self.codec = blosc2.Codec.LZ4 if lz4 else blosc2.Codec.ZSTD
        self.level = 5 if lz4 else 1

    def encode(self, chunk: np.ndarray):
        b = self.blosc2
        return b.compress2(chunk, typesize=self.width, clevel=self.level, codec=self.codec,
                           filters=[b.Filter.SHUFFLE], nthreads=1)

    def decode(self, record, out: np.ndarray) -> None:
        self.blosc2.decompress2(record, dst=out, nthreads=1)

    @staticmethod
    def size(record) -> int:
        return len(record)


class Zipnn:
    def __init__(self, dtype: torch.dtype):
        import zipnn
        self.z = zipnn.ZipNN(input_format="torch", threads=1)
        self.dtype = dtype

    def encode(self, chunk: np.ndarray):
        return self.z.compress(torch.from_numpy(chunk.copy()).view(self.dtype))

    def decode(self, record, out: np.ndarray) -> None:
        out[:] = self.z.decompress(record).reshape(-1).view(torch.uint8).numpy()

    @staticmethod
    def size(record) -> int:
        return len(record)


def codecs(dtype: torch.dtype) -> list:
    width = torch.empty(0, dtype=dtype).element_size()
    out = [("mvc", Mvc(width)), ("mvc, numpy (no compiler)", Mvc(width, numpy=True))]
    try:
        out += [("blosc2 shuffle+zstd1", Blosc2(width)), ("blosc2 shuffle+lz4", Blosc2(width, lz4=True))]
    except ImportError:
        pass
    try:
        out.append(("zipnn", Zipnn(dtype)))
    except ImportError:
        pass
    return out


def _decode_all(c, records, ids, out, threads: int) -> None:
    def one(i):
        view = out[i * CHUNK:(i + 1) * CHUNK]
        c.decode(records[i], view)
        if hashing.digest(view) != ids[i]:
            raise AssertionError("decoded bytes do not hash to the chunk's id")
    if threads == 1:
        for i in range(len(records)):
            one(i)
        return
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(records)), chunksize=8))


def compare(tensor: torch.Tensor, rounds: int = 5) -> list:
    """[(codec name, stored/raw, GB/s one thread, GB/s two threads)] for ``tensor``'s chunks."""
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    raw = raw[:len(raw) // CHUNK * CHUNK]
    chunks = [raw[o:o + CHUNK] for o in range(0, len(raw), CHUNK)]
    ids = [hashing.digest(c) for c in chunks]
    out = np.empty(len(raw), np.uint8)
    table = []
    for name, c in codecs(tensor.dtype):
        records = [c.encode(ch) for ch in chunks]
        out[:] = 0
        _decode_all(c, records, ids, out, 1)  # checks every chunk once
        assert np.array_equal(out, raw), name
        table.append([name, sum(c.size(r) for r in records) / len(raw), c, records, float("inf"), float("inf")])
    for _ in range(rounds):  # interleaved: every codec sees the same background load
        for row in table:
            for slot, threads in ((4, 1), (5, 2)):
                start = time.perf_counter()
                _decode_all(row[2], row[3], ids, out, threads)
                row[slot] = min(row[slot], time.perf_counter() - start)
    return [(name, ratio, len(raw) / one / 1e9, len(raw) / two / 1e9) for name, ratio, _, _, one, two in table]


def interleave_speed(rounds: int = 15, reps: int = 40) -> list:
    """Lines: the un-grouping alone (planes of one 256 KiB chunk put back together), GB/s on one
    thread, the compiled kernel against the numpy path, interleaved rounds."""
    rng = np.random.default_rng(0)
    lines = []
    for width in (2, 4, 8):
        n = CHUNK // width
        planes = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(width)]
        out = np.empty(CHUNK, np.uint8)
        best = {"kernel": float("inf"), "numpy": float("inf")}
        for _ in range(rounds):
            for name, fn in (("kernel", codec.interleave), ("numpy", codec.interleave_numpy)):
                start = time.perf_counter()
                for _ in range(reps):
                    fn(planes, out)
                best[name] = min(best[name], (time.perf_counter() - start) / reps)
        lines.append(f"un-grouping width {width}: compiled kernel {CHUNK / best['kernel'] / 1e9:.2f} GB/s, "
                     f"numpy strided copy per plane {CHUNK / best['numpy'] / 1e9:.2f} GB/s (one thread)")
    return lines


def report(mib: int = 32) -> list:
    """The printed lines: each codec's ratio and verified decode speed, fp32 and bf16."""
    w = weights(mib)
    lines = [f"codecs on {w.nbytes / (1 << 20):.0f} MiB of trained-like weights in {CHUNK >> 10} KiB chunks "
             "(decode = decode + BLAKE3 of the output, GB/s of decoded bytes; best of 5 interleaved rounds)",
             f"{'codec':24} {'fp32 ratio':>10} {'1 thr':>7} {'2 thr':>7} | {'bf16 ratio':>10} {'1 thr':>7} {'2 thr':>7}"]
    fp32, bf16 = compare(w), compare(w.to(torch.bfloat16))
    for (name, r32, a32, b32), (_, r16, a16, b16) in zip(fp32, bf16):
        lines.append(f"{name:24} {r32:10.3f} {a32:7.2f} {b32:7.2f} | {r16:10.3f} {a16:7.2f} {b16:7.2f}")
    return lines + interleave_speed()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=32, help="MiB of fp32 weights (bf16: half)")
    args = ap.parse_args()
    print("\n".join(report(args.mib)))


if __name__ == "__main__":
    main()
