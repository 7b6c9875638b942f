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
