"""Record encodings (mvc/store/codec.py): round trips, refusals, golden bytes."""

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mvc.errors import CorruptObject
from mvc.store import codec

WIDTHS = [1, 2, 4, 8, 16]


def _smooth(n: int, width: int, seed: int = 0) -> np.ndarray:
    """Bytes shaped like a float tensor: a repetitive high byte, noisy low bytes."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, n, dtype=np.uint8)
    data[width - 1::width] = rng.choice([0x3c, 0x3d, 0xbc, 0xbd], size=len(data[width - 1::width]))
    return data


def _roundtrip(data: np.ndarray, width: int, base=None):
    base_id = b"\x07" * 32 if base is not None else None
    kind, payload = codec.encode(data, width, base, base_id)
    out = np.empty(len(data), dtype=np.uint8)
    if kind == codec.RAW:
        assert payload is None
        return kind
    codec.decode(kind, payload, len(data), out, base)
    assert out.tobytes() == data.tobytes()
    if kind == codec.DELTA:
        assert codec.delta_base(payload) == base_id
    return kind


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 4095, 4096, 4097])
def test_grouped_and_delta_round_trip(width, n):
    data = _smooth(n, width)
    _roundtrip(data, width)
    base = data.copy()
    if n:
        base[n // 2] ^= 0xff
    _roundtrip(data, width, base)


def test_zeros_compress_and_few_changed_rows_become_a_small_delta():
    base = _smooth(1 << 16, 4)
    assert _roundtrip(np.zeros(1 << 16, np.uint8), 4) == codec.GROUPED
    new = base.copy()
    new[1024:1280] ^= 0x55  # one row of 64 fp32
    kind, payload = codec.encode(new, 4, base, b"\x01" * 32)
    assert kind == codec.DELTA and len(payload) < 600


def test_random_bytes_stay_raw():
    data = np.frombuffer(os.urandom(1 << 18), dtype=np.uint8)
    for width in WIDTHS:
        assert codec.encode(data, width) == (codec.RAW, None)
        assert codec.encode(data, width, np.frombuffer(os.urandom(1 << 18), np.uint8), b"\x02" * 32) == (codec.RAW, None)


def _payload(width=4, size=8, planes=((0, 2), (0, 2), (0, 2), (0, 2)), body=b"\x00" * 8) -> bytes:
    head = struct.pack("<BI", width, size) + b"".join(struct.pack("<BI", m, n) for m, n in planes)
    return head + body


@pytest.mark.parametrize("payload", [
    b"", b"\x04", _payload(width=0), _payload(width=17), _payload(size=9), _payload(body=b"\x00" * 7),
    _payload(body=b"\x00" * 9), _payload(planes=((2, 2), (0, 2), (0, 2), (0, 2))),
    _payload(planes=((1, 2), (0, 2), (0, 2), (0, 2))), _payload(planes=((0, 3), (0, 1), (0, 2), (0, 2))),
])
def test_damaged_payloads_are_refused(payload):
    with pytest.raises(CorruptObject):
        codec.decode(codec.GROUPED, payload, 8, bytearray(8))


def test_a_plane_that_claims_more_than_it_may_is_refused():
    import zstandard
    frame = zstandard.ZstdCompressor().compress(b"\x00" * 1000)
    payload = struct.pack("<BI", 1, 100) + struct.pack("<BI", 1, len(frame)) + frame
    with pytest.raises(CorruptObject):
        codec.decode(codec.GROUPED, payload, 100, bytearray(100))


def test_delta_needs_its_base():
    with pytest.raises(CorruptObject):
        codec.decode(codec.DELTA, b"\x00" * 32 + _payload(), 8, bytearray(8), None)
    with pytest.raises(CorruptObject):
        codec.decode(codec.DELTA, b"\x00" * 32 + _payload(), 8, bytearray(8), b"\x00" * 7)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([codec.GROUPED, codec.DELTA, codec.RAW, 9]),
       st.integers(0, 64))
def test_decoding_any_bytes_raises_only_corrupt_object(payload, kind, size):
    try:
        codec.decode(kind, payload, size, bytearray(size), b"\x00" * size)
    except CorruptObject:
        pass


# -- golden bytes (docs/format.md 4.2) ------------------------------------------

FP32 = struct.pack("<4f", 1.0, 2.0, 3.0, -1.0) + b"\xab"  # 4 elements and a 1-byte tail


def test_golden_grouped_payload():
    payload = codec.group(np.frombuffer(FP32, np.uint8), 4)
    assert payload.hex() == (
        "04" "11000000"                      # width 4, size 17
        "0004000000" "0004000000" "0004000000" "0004000000"  # four raw planes of 4 bytes
        "00000000" "00000000" "80004080" "3f4040bf"          # planes 0..3: byte j of each element
        "ab")                                # the tail
    out = bytearray(17)
    codec.decode(codec.GROUPED, payload, 17, out)
    assert bytes(out) == FP32


def test_golden_delta_payload():
    base = bytes(17)
    new = bytearray(base)
    new[2] = 0x80
    payload = b"\x11" * 32 + codec.group(np.frombuffer(bytes(new), np.uint8) ^ np.frombuffer(base, np.uint8), 4)
    out = bytearray(17)
    codec.decode(codec.DELTA, payload, 17, out, base)
    assert bytes(out) == bytes(new)
    assert payload[32:].hex() == ("04" "11000000" + "0004000000" * 4 + "00000000" "00000000" "80000000" "00000000" "00")


def test_golden_zstd_plane_decodes():
    # A zstd frame (level 3, content size set, no checksum) of 64 bytes of 0x3f, as plane 0 of a width-1 record.
    frame = bytes.fromhex("28b52ffd2040450000103f3f0100930016")
    payload = struct.pack("<BI", 1, 64) + struct.pack("<BI", codec.PLANE_ZSTD, len(frame)) + frame
    out = bytearray(64)
    codec.decode(codec.GROUPED, payload, 64, out)
    assert bytes(out) == b"\x3f" * 64


def test_golden_index_value_and_trailer_entry(tmp_path):
    from mvc.store.packs import ENTRY_V2, Location, decode_location, encode_location, read_locations, PackWriter
    loc = Location(b"\x01" * 16, 44, 100, codec.DELTA, 4096, 1, b"\x02" * 32)
    raw = encode_location(loc)
    assert raw.hex() == "01" * 16 + "2c00000000000000" + "64000000" + "02" + "00100000" + "01" + "02" * 32
    assert decode_location(raw) == loc
    assert encode_location(Location(b"\x01" * 16, 44, 100)) == b"\x01" * 16 + bytes.fromhex("2c00000000000000 64000000")
    for bad in (raw[:-1], raw[:28] + b"\x09" + raw[29:], raw[:33] + b"\x00" + raw[34:], raw[:33] + b"\x09" + raw[34:]):
        with pytest.raises(CorruptObject):
            decode_location(bad)
    w = PackWriter(tmp_path, version=2)
    w.add(b"\x03" * 32, b"x" * 10, codec.GROUPED, 64, 0, None)
    path = w.seal()
    body = path.read_bytes()
    assert body[:8] == b"MVCPACK2" and ENTRY_V2.size == 82
    [(cid, got)] = read_locations(path, b"\x05" * 16)
    assert cid == b"\x03" * 32 and (got.offset, got.length, got.kind, got.size, got.depth, got.base) == \
        (44, 10, codec.GROUPED, 64, 0, None)
    entry = body[54 + 4:54 + 4 + 82]
    assert entry.hex() == "03" * 32 + "2c00000000000000" + "0a000000" + "01" + "40000000" + "00" + "00" * 32


# -- the decoder's un-grouping (interleave) and the chunk store's parallel reads of encoded runs -----


def _strided(planes: list, width: int) -> bytes:
    out = np.empty(len(planes[0]) * width, np.uint8)
    for j, plane in enumerate(planes):
        out[j::width] = plane
    return out.tobytes()


@pytest.mark.parametrize("width", range(1, 17))
@pytest.mark.parametrize("n", [1, 3, 63, 64, 1001])
@pytest.mark.parametrize("offset", [0, 1, 6])
@pytest.mark.parametrize("path", ["kernel", "numpy"])
def test_interleave_is_the_inverse_of_grouping(width, n, offset, path):
    rng = np.random.default_rng(width * 1000 + n)
    planes = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(width)]
    room = np.zeros(n * width + offset + 1, np.uint8)  # unaligned windows too
    out = room[offset:offset + n * width]
    (codec.interleave if path == "kernel" else codec.interleave_numpy)(planes, out)
    assert out.tobytes() == _strided(planes, width)
    assert room[:offset].sum() == 0 and room[-1] == 0  # nothing written outside the window


def test_the_compiled_kernel_is_built_and_checks_its_arguments():
    # pip builds it wherever a C compiler is at hand (setup.py), as on every machine the
    # tests run on: a missing kernel would make every dense read three times slower, silently
    from mvc.store import _planes
    assert codec._planes is _planes
    with pytest.raises(ValueError):
        _planes.interleave([b"ab", b"c"], bytearray(4))  # planes of different lengths
    with pytest.raises(ValueError):
        _planes.interleave([b"ab", b"cd"], bytearray(5))  # out of the wrong size
    with pytest.raises(ValueError):
        _planes.interleave([b"a"] * 17, bytearray(17))  # wider than any record
    with pytest.raises(TypeError):
        _planes.interleave([b"ab", b"cd"], b"read-only")


def _dtype_bytes(name: str, n: int) -> bytes:
    import torch
    from mvc import dtypes
    dtype = dtypes.TO_TORCH[name]
    g = torch.Generator().manual_seed(n)
    data = (torch.randn(n, generator=g) * 0.02).view(torch.uint8) if dtype.itemsize <= 4 else \
        (torch.randn(n, generator=g, dtype=torch.float64) * 0.02).view(torch.uint8)
    need = n * dtype.itemsize
    return (data.numpy().tobytes() * 4)[:need]


@pytest.mark.parametrize("name", sorted(__import__("mvc.dtypes", fromlist=["x"]).VOCABULARY))
@pytest.mark.parametrize("extra", [0, 1, 3])
def test_every_dtype_round_trips_bit_for_bit_aligned_or_not(name, extra):
    from mvc import dtypes
    if name not in dtypes.TO_TORCH:
        pytest.skip(f"this torch has no {name}")
    width = dtypes.VOCABULARY[name][1]
    data = np.frombuffer(_dtype_bytes(name, 4099) + b"\x5a" * extra, np.uint8)  # odd count, odd tail
    for base in (None, data ^ np.uint8(1)):
        kind, payload = codec.encode(data, width, base, b"\x09" * 32 if base is not None else None)
        if kind == codec.RAW:
            continue
        for offset in (0, 1):
            room = np.zeros(len(data) + offset, np.uint8)
            codec.decode(kind, payload, len(data), room[offset:], base)
            assert room[offset:].tobytes() == data.tobytes()


def test_every_flipped_byte_is_refused_or_decodes_to_other_bytes():
    from mvc import hashing
    data = _smooth(1 << 14, 4)
    kind, payload = codec.encode(data, 4)
    assert kind == codec.GROUPED
    modes = [codec.PLANE_HEAD.unpack_from(payload, codec.GROUP_HEAD.size + j * codec.PLANE_HEAD.size)[0]
             for j in range(4)]
    assert codec.PLANE_ZSTD in modes and codec.PLANE_RAW in modes  # both kinds of plane are hit below
    want = hashing.digest(data)
    for at in range(0, len(payload), 7):
        bad = bytearray(payload)
        bad[at] ^= 0x10
        out = bytearray(len(data))
        try:
            codec.decode(kind, bytes(bad), len(data), out)
        except CorruptObject:
            continue
        assert hashing.digest(out) != want, at  # what the chunk store then refuses


@pytest.fixture
def coded(tmp_path, monkeypatch):
    """A repacked repository whose load reads many runs of encoded records in several threads."""
    import torch

    import mvc
    from mvc.store import chunks
    monkeypatch.setattr(chunks, "CODED_TASK_BYTES", 16 << 10)  # many small tasks over the pool
    monkeypatch.setattr(chunks, "RUN_BYTES", 20 << 10)  # and several runs per task
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=4096)
    g = torch.Generator().manual_seed(5)
    state = {"w": torch.randn(40_003, generator=g) * 0.02, "h": (torch.randn(9_001, generator=g) * 0.1).bfloat16(),
             "d": torch.randn(3_001, generator=g, dtype=torch.float64)}
    cid = repo.commit(state).id
    repo.repack()
    yield repo, cid, state
    repo.close()


def test_runs_of_encoded_records_load_bit_for_bit_in_parallel(coded):
    import torch
    repo, cid, state = coded
    with repo.index.read() as txn:
        kinds = [loc.kind for _, loc in txn.chunks()]
    assert kinds.count(codec.GROUPED) > 20
    got = repo.load(cid)
    assert all(torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)) for k, v in state.items())


def test_a_flipped_byte_in_a_run_of_encoded_records_names_its_chunk(coded):
    import mvc
    from damage import flipped
    repo, cid, _ = coded
    with repo.index.read() as txn:
        records = sorted((loc.offset, key, loc) for key, loc in txn.chunks() if loc.kind == codec.GROUPED)
    for _, key, loc in records[len(records) // 2:len(records) // 2 + 3]:  # in the middle of a run
        path = repo.dir / "packs" / f"pack-{loc.pack.hex()}.pack"
        for at in (loc.offset + 1, loc.offset + loc.length - 2):  # the plane table, the last plane
            with flipped(path, at, 4):
                with pytest.raises((mvc.ChecksumMismatch, mvc.CorruptObject)) as info:
                    repo.load(cid)
                assert info.value.id == key.hex()  # the error names the damaged chunk


@pytest.mark.parametrize("width", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("changed", [1, 40, 5000])  # bytes changed per link: a few rows, more, nearly all
def test_a_chain_of_deltas_decodes_in_place_bit_for_bit(width, changed):
    rng = np.random.default_rng(width * 7 + changed)
    versions = [_smooth(8195, width, seed=width)]  # odd length: a tail in every link
    for _ in range(4):
        new = versions[-1].copy()
        at = rng.choice(len(new), size=min(changed, len(new)), replace=False)
        new[at] ^= rng.integers(1, 256, len(at), dtype=np.uint8)
        versions.append(new)
    links = [codec.encode(versions[0], width)]
    for old, new in zip(versions, versions[1:]):
        payload = b"\x01" * 32 + codec.group(np.bitwise_xor(new, old), width)  # a delta whatever it saves
        links.append((codec.DELTA, payload))
    if links[0][0] == codec.RAW:
        links[0] = (codec.RAW, versions[0].tobytes())
    for depth in range(len(links)):
        out = np.zeros(len(versions[0]), np.uint8)
        codec.decode_chain(links[:depth + 1], len(out), out)
        assert out.tobytes() == versions[depth].tobytes()


def test_a_chain_must_start_with_a_record_that_decodes_alone():
    data = _smooth(4096, 4)
    grouped = codec.encode(data, 4)
    delta = (codec.DELTA, b"\x01" * 32 + codec.group(data, 4))
    for links in ([delta, delta], [grouped, grouped]):
        with pytest.raises(CorruptObject):
            codec.decode_chain(links, len(data), bytearray(len(data)))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000), st.integers(1, codec.MAX_WIDTH), st.integers(0, 7), st.booleans())
def test_grouping_round_trips_any_bytes_width_and_alignment(data, width, offset, smooth):
    arr = np.frombuffer(data, np.uint8)
    if smooth:  # few values per plane: zstd planes, not only raw ones
        arr = arr // 64
    payload = codec.group(arr, width)
    room = np.zeros(len(arr) + offset + 1, np.uint8)  # odd offsets: outputs not aligned to the width
    codec.decode(codec.GROUPED, payload, len(arr), room[offset:offset + len(arr)])
    assert room[offset:offset + len(arr)].tobytes() == arr.tobytes()
    assert not room[:offset].any() and room[-1] == 0  # nothing written outside the window


def test_a_chain_starts_from_a_base_the_caller_holds():
    width, rng = 4, np.random.default_rng(3)
    versions = [_smooth(8195, width)]
    for _ in range(3):
        new = versions[-1].copy()
        new[rng.choice(len(new), 30, replace=False)] ^= np.uint8(5)
        versions.append(new)
    deltas = [(codec.DELTA, b"\x01" * 32 + codec.group(np.bitwise_xor(new, old), width))
              for old, new in zip(versions, versions[1:])]
    for depth in range(1, len(versions)):
        out = np.zeros(len(versions[0]), np.uint8)
        codec.decode_chain(deltas[:depth], len(out), out, start=bytearray(versions[0].tobytes()))
        assert out.tobytes() == versions[depth].tobytes()
    with pytest.raises(CorruptObject):  # above a held base every link is a delta
        codec.decode_chain([codec.encode(versions[1], width)], len(out), out, start=versions[0])
    with pytest.raises(CorruptObject):
        codec.decode_chain(deltas[:1], len(out), out, start=versions[0][:-1])
