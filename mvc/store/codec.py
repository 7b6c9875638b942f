"""Record encodings: byte-grouped zstd, and XOR deltas against a base chunk.

The only module that imports ``zstandard``. Vocabulary (``docs/format.md``
section 4.2 gives every byte):

- **kind** of a record: ``RAW`` (the chunk's bytes as they are), ``GROUPED``
  (byte-grouped, each plane stored raw or zstd-compressed) or ``DELTA`` (the
  chunk XOR its **base**, another chunk of the same length, then grouped).
- **width**: the element size the bytes are grouped by (the tensor dtype's
  itemsize, 1 to 16). **Plane** j holds byte j of every whole element; the
  ``size % width`` bytes after the last whole element are the **tail**.
- **depth**: 0 for a record that decodes alone, the base's depth + 1 for a
  delta. Readers follow at most ``MAX_DEPTH`` deltas.

Why byte planes: in float tensors the sign and exponent bytes repeat a few
values while mantissa bytes are close to random; grouped, the exponent plane
compresses to about a third and the others are stored raw (so they cost no
decompression). XOR against the previous checkpoint's chunk turns unchanged
rows into zeros, which zstd stores in a few bytes.

``encode`` never returns an encoding that does not pay: random bytes stay
``RAW``. ``decode`` checks every length it reads and raises only
CorruptObject, whatever the payload holds.
"""

import struct

import numpy as np
import zstandard

from ..errors import BadEncoding, CorruptObject

try:
    from . import _planes  # compiled at install where a C compiler is at hand (setup.py)
except ImportError:
    _planes = None

RAW, GROUPED, DELTA = 0, 1, 2
KINDS = (RAW, GROUPED, DELTA)
KIND_NAMES = {RAW: "raw", GROUPED: "grouped", DELTA: "delta"}
PLANE_RAW, PLANE_ZSTD = 0, 1
MAX_WIDTH = 16
MAX_DEPTH = 8  # deltas a read follows at most (K): bounds the work of one read
# How zstd compresses a plane: its fast strategy with a 64-entry match table
# and one probe per position. Byte planes of tensors repeat few values but
# hold few long repeats, so a match usually costs more than the Huffman-coded
# literals it replaces; finding few makes zstd code a plane almost wholly as
# literals, which is smaller, faster to decode and faster to find. Measured
# on exponent planes of the dense fp32 benchmark's 256 KiB chunks (one
# thread, same run), against level 3 with matches of 7 bytes or more (mvc's
# setting before): 0.325 of the plane instead of 0.354, decoding 0.91 GB/s
# instead of 0.56, encoding 283 MB/s instead of 85; bf16 alike (0.327 /
# 0.360). The window holds a whole plane (a smaller one cuts the plane into
# blocks with a Huffman table each: 0.35, and half the decode speed).
ZSTD_PARAMS = dict(strategy=zstandard.STRATEGY_FAST, window_log=17, hash_log=6, chain_log=6, search_log=1,
                   min_match=7, target_length=0)
GROUP_HEAD = struct.Struct("<BI")  # width, size
PLANE_HEAD = struct.Struct("<BI")  # mode, stored length
ID_SIZE = 32
# An encoding is kept only when it saves at least this share of the chunk:
# decoding costs CPU at every read, so a sliver of saving is not worth it.
MIN_SAVING = 1 / 32
# A delta must be at most this share of the chunk's grouped encoding: every
# delta makes a read decode its base too, which pays for sparse changes (a
# few rows: the delta is tiny) but not for dense ones (every weight moved:
# XOR saves a few percent and chains would multiply the decoding work).
DELTA_GAIN = 0.5
# A plane is stored compressed only when that saves at least this share of
# it. zstd decodes these literal-heavy planes at about 0.85 GB/s, a sixth of
# the speed of the rest of a read (hashing, copying, un-grouping), so a plane
# costs the same to decode whatever it saves. Measured on bench_storage.py's
# frozen run: the low mantissa byte of freshly initialised fp32 weights
# compresses to 0.84 and took half of the load's decoding for 4% of the
# chunk; exponent planes compress to 0.23-0.39 and stay compressed.
PLANE_SAVING = 1 / 4
ENTROPY_SKIP = 7.9  # bits per byte above which a plane is not worth trying to compress

_local = None


def _thread() -> object:
    """This thread's cache: its zstd contexts."""
    global _local
    if _local is None:
        import threading
        _local = threading.local()
    return _local


def _zstd():
    # One compressor and decompressor per thread: zstandard's contexts are not thread-safe.
    _thread()
    if not hasattr(_local, "c"):
        params = zstandard.ZstdCompressionParameters(**ZSTD_PARAMS, write_checksum=False, write_content_size=True)
        _local.c = zstandard.ZstdCompressor(compression_params=params)
        _local.d = zstandard.ZstdDecompressor()
    return _local.c, _local.d


def _entropy(plane: np.ndarray) -> float:
    counts = np.bincount(plane, minlength=256)
    p = counts[counts > 0] / len(plane)
    return float(-(p * np.log2(p)).sum())


def group(data: np.ndarray, width: int) -> bytes:
    """The GROUPED payload of ``data`` (1-D uint8): planes compressed where it pays."""
    size = len(data)
    n = size // width
    head = [GROUP_HEAD.pack(width, size)]
    bodies = []
    whole = data[:n * width].reshape(n, width) if n else data[:0].reshape(0, width)
    comp, _ = _zstd()
    for j in range(width):
        plane = np.ascontiguousarray(whole[:, j]) if width > 1 else data[:n]
        body, mode = plane, PLANE_RAW
        if n >= 64 and _entropy(plane) < ENTROPY_SKIP:
            packed = comp.compress(plane)
            if len(packed) <= n - n * PLANE_SAVING:
                body, mode = packed, PLANE_ZSTD
        head.append(PLANE_HEAD.pack(mode, len(body)))
        bodies.append(body)
    return b"".join(head + [bytes(b) if isinstance(b, np.ndarray) else b for b in bodies]
                    + [data[n * width:].tobytes()])


def encode(data, width: int, base=None, base_id: bytes = None, gain: float = DELTA_GAIN) -> tuple:
    """(kind, payload) for chunk bytes ``data``: GROUPED, DELTA against ``base``
    (bytes of the same length, whose id is ``base_id``) when that is under ``gain``
    times the grouped encoding, or (RAW, None) when neither saves at least MIN_SAVING."""
    data = _as_bytes(data)
    grouped, delta = candidates(data, width, base, base_id)
    return choose(len(data), grouped, delta, gain)


def _as_bytes(data) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)


def candidates(data, width: int, base=None, base_id: bytes = None) -> tuple:
    """(grouped, delta): the GROUPED payload of chunk bytes ``data``, and its DELTA payload
    against ``base`` (None without a base, or with one of another length)."""
    data = _as_bytes(data)
    width = width if 1 <= width <= MAX_WIDTH else 1
    grouped, delta = group(data, width), None
    if base is not None:
        other = _as_bytes(base)
        if len(other) == len(data):
            delta = base_id + group(np.bitwise_xor(data, other), width)
    return grouped, delta


def choose(size: int, grouped: bytes, delta, gain: float = DELTA_GAIN) -> tuple:
    """(kind, payload) of a chunk of ``size`` bytes from its candidates: the grouped payload
    where it is smaller than the chunk, the delta where it is under ``gain`` times that (1.0:
    wherever it is smaller), and (RAW, None) when the choice does not save MIN_SAVING."""
    best = (RAW, None, size)
    if len(grouped) < size:
        best = (GROUPED, grouped, len(grouped))
    if delta is not None and len(delta) < best[2] * gain:
        best = (DELTA, delta, len(delta))
    if best[0] == RAW or best[2] > size - max(1, int(size * MIN_SAVING)):
        return RAW, None
    return best[0], best[1]


def stored_size(size: int, choice: tuple) -> int:
    """The bytes a record of ``choose``'s ``choice`` takes for a chunk of ``size`` bytes."""
    return size if choice[0] == RAW else len(choice[1])


def delta_base(payload) -> bytes:
    """The base id a DELTA payload names; CorruptObject if it is too short."""
    if len(payload) < ID_SIZE:
        raise CorruptObject("a delta record is too short to name its base")
    return bytes(payload[:ID_SIZE])


def decode(kind: int, payload, size: int, out, base=None) -> None:
    """Decode a record's payload into ``out`` (a writable buffer of ``size`` bytes).

    ``base`` is the base chunk's bytes for a DELTA. Raises CorruptObject on
    any inconsistency; the caller still hashes ``out`` against the id.
    """
    target = np.frombuffer(out, dtype=np.uint8) if not isinstance(out, np.ndarray) else out
    if len(target) != size:
        raise CorruptObject(f"record decodes to {size} bytes but {len(target)} are asked for")
    if kind == RAW:
        if len(payload) != size:
            raise CorruptObject("a raw record has the wrong length")
        target[:] = np.frombuffer(payload, dtype=np.uint8)
        return
    if kind == DELTA:
        if base is None or len(base) != size:
            raise CorruptObject("a delta record's base is missing or has another length")
        target[:] = np.frombuffer(base, dtype=np.uint8) if not isinstance(base, np.ndarray) else base
        apply_delta(payload, size, target)
        return
    if kind == GROUPED:
        ungroup(memoryview(payload), size, target)
        return
    raise CorruptObject(f"unknown record kind {kind}")


def decode_chain(links: list, size: int, out, start=None) -> None:
    """Decode a chain of records into ``out`` (``size`` bytes): ``links`` is [(kind, payload)],
    the deepest base (which decodes alone) first, each later link a DELTA against the one
    before it, the record wanted last. Every delta is applied in place (``apply_delta``), so
    no link needs a buffer of its own. ``start``: the decoded bytes of the base below the
    first link, when the caller already holds them (then every link is a delta).
    BadEncoding as ``decode`` raises CorruptObject, its ``link`` the index in ``links`` of the
    record that failed (a damaged base must not be blamed on the intact deltas above it).
    """
    target = np.frombuffer(out, dtype=np.uint8) if not isinstance(out, np.ndarray) else out
    if start is not None:
        if len(start) != size or len(target) != size:
            raise CorruptObject("a delta record's base has another length")
        target[:] = np.frombuffer(start, dtype=np.uint8) if not isinstance(start, np.ndarray) else start
    for k, (kind, payload) in enumerate(links):
        try:
            _decode_link(k == 0 and start is None, kind, payload, size, target)
        except CorruptObject as exc:
            raise BadEncoding(str(exc), link=k) from None


def _decode_link(deepest: bool, kind: int, payload, size: int, target: np.ndarray) -> None:
    """One link of ``decode_chain``: the deepest record decodes alone, each one above is a delta."""
    if deepest:
        if kind == DELTA:
            raise CorruptObject("the deepest record of a delta chain is itself a delta")
        decode(kind, payload, size, target)
    elif kind != DELTA:
        raise CorruptObject("a record above the base of a delta chain is not a delta")
    else:
        apply_delta(payload, size, target)


def apply_delta(payload, size: int, out: np.ndarray) -> None:
    """XOR a DELTA record's change into ``out`` (uint8, holding its base's bytes), in place.

    Done in plane space: a plane of the XOR that is all zeros (a byte that
    changed nowhere) costs only its decompression and a scan, and one with
    few non-zero bytes (a few rows changed) costs a scatter of those bytes,
    so a chain of sparse deltas costs about one decode of its deepest base,
    not one full decode per link. CorruptObject as ``decode``.
    """
    width, n, planes, tail = _parts(memoryview(payload)[ID_SIZE:], size)
    whole = out[:n * width].reshape(n, width) if n else None
    for j, plane in enumerate(planes):
        changed = np.flatnonzero(plane != 0)  # through a bool mask: flatnonzero of uint8 itself is ~50x slower
        if len(changed) > n // 8:  # dense: one strided pass beats gathering many scattered bytes
            whole[:, j] ^= plane
        elif len(changed):
            out[changed * width + j] ^= plane[changed]
    out[n * width:] ^= tail


def ungroup(payload: memoryview, size: int, out: np.ndarray, join=None) -> None:
    """Decode a GROUPED payload into ``out``; ``join`` puts the planes together (default
    ``interleave``; ``bench_codec.py`` passes ``interleave_numpy`` to time that path)."""
    width, n, planes, tail = _parts(payload, size)
    if n:
        (join or interleave)(planes, out[:n * width])
    out[n * width:] = tail


def _parts(payload: memoryview, size: int) -> tuple:
    """(width, n, [n-byte plane arrays], tail array) of a GROUPED payload, every length checked."""
    if len(payload) < GROUP_HEAD.size:
        raise CorruptObject("a grouped record is too short")
    width, stated = GROUP_HEAD.unpack_from(payload, 0)
    if not 1 <= width <= MAX_WIDTH or stated != size:
        raise CorruptObject(f"a grouped record has width {width} and size {stated}, expected size {size}")
    n = size // width
    at = GROUP_HEAD.size + width * PLANE_HEAD.size
    if len(payload) < at:
        raise CorruptObject("a grouped record's plane table is cut short")
    table = [PLANE_HEAD.unpack_from(payload, GROUP_HEAD.size + j * PLANE_HEAD.size) for j in range(width)]
    if at + sum(length for _, length in table) + size - n * width != len(payload):
        raise CorruptObject("a grouped record's planes do not add up to its length")
    planes = []
    for mode, length in table:
        planes.append(_plane(payload[at:at + length], mode, n))
        at += length
    return width, n, planes, np.frombuffer(payload[at:], dtype=np.uint8)


def _plane(body: memoryview, mode: int, n: int) -> np.ndarray:
    """One plane's n bytes: a view of a raw body, or a zstd body decompressed."""
    if mode == PLANE_RAW:
        if len(body) != n:
            raise CorruptObject("a raw plane has the wrong length")
        return np.frombuffer(body, dtype=np.uint8)
    if mode != PLANE_ZSTD:
        raise CorruptObject(f"a plane has unknown mode {mode}")
    _, dec = _zstd()
    try:
        if zstandard.frame_content_size(body) != n:  # checked first: never allocate what a frame claims
            raise CorruptObject("a compressed plane states another length")
        plane = np.frombuffer(dec.decompress(body, max_output_size=n), dtype=np.uint8)
    except zstandard.ZstdError as exc:
        raise CorruptObject(f"a compressed plane does not decompress: {exc}") from None
    if len(plane) != n:
        raise CorruptObject("a compressed plane decompresses to the wrong length")
    return plane


def interleave(planes: list, out: np.ndarray) -> None:
    """Write byte j of element i from ``planes[j][i]`` into ``out`` (w planes of n bytes, out of n*w).

    The inverse of grouping: the compiled kernel (``_planes.c``, about 11 GB/s
    per core here, without the GIL) where it was built at install, else
    ``interleave_numpy`` (about 3 GB/s; ``benchmarks/bench_codec.py`` times both).
    """
    if _planes is not None:
        _planes.interleave(planes, out)
    else:
        interleave_numpy(planes, out)


def interleave_numpy(planes: list, out: np.ndarray) -> None:
    """``interleave`` without the compiled kernel: one strided copy per plane."""
    whole = out.reshape(len(planes[0]), len(planes))
    for j, plane in enumerate(planes):
        whole[:, j] = plane
