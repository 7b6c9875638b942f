"""Canonical msgpack: one encoding per value, strict types, hostile bytes refused."""

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvc import encoding
from mvc.encoding import INT_MAX, INT_MIN, Ext
from mvc.errors import BadInput, CorruptObject, Unstorable

ints = st.integers(min_value=INT_MIN, max_value=INT_MAX)
keys = st.one_of(ints, st.text(max_size=8))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True), st.text(max_size=12),
                    st.binary(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)), max_leaves=12)


def same(a, b) -> bool:
    """Equality that compares floats bitwise (nan, -0.0) and keeps types strict."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def canonical(value):
    """What decoding gives back: maps in canonical key order, tuples as lists."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value, key=encoding.key_order)}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


@settings(max_examples=50, deadline=None)
@given(values)
def test_round_trip_keeps_values_and_types(value):
    assert same(encoding.unpack(encoding.pack(value)), canonical(value))


@settings(max_examples=50, deadline=None)
@given(values)
def test_encoding_is_a_fixed_point(value):
    data = encoding.pack(value)
    assert encoding.pack(encoding.unpack(data)) == data


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(keys, scalars, max_size=8), st.randoms(use_true_random=False))
def test_dict_insertion_order_does_not_change_bytes(d, rnd):
    items = list(d.items())
    rnd.shuffle(items)
    assert encoding.pack(dict(items)) == encoding.pack(d)
    assert encoding.pack({"outer": dict(items)}) == encoding.pack({"outer": d})


def test_map_keys_sorted_ints_first_then_utf8_bytes():
    data = encoding.pack({"b": 1, "a": 2, 10: 3, -1: 4, "é": 5, "Z": 6})
    assert list(encoding.unpack(data)) == [-1, 10, "Z", "a", "b", "é"]
    # "chunk_size" before "chunks": '_' (0x5f) < 's' (0x73)
    assert list(encoding.unpack(encoding.pack({"chunks": 0, "chunk_size": 0}))) == ["chunk_size", "chunks"]


@pytest.mark.parametrize("value, hexbytes", [
    (None, "c0"), (False, "c2"), (True, "c3"),
    (0, "00"), (127, "7f"), (128, "cc80"), (200, "ccc8"), (256, "cd0100"), (2**32, "cf0000000100000000"),
    (INT_MAX, "cfffffffffffffffff"), (-1, "ff"), (-32, "e0"), (-33, "d0df"), (-100, "d09c"),
    (INT_MIN, "d38000000000000000"),
    (1.5, "cb3ff8000000000000"), (-0.0, "cb8000000000000000"), (math.inf, "cb7ff0000000000000"),
    ("", "a0"), ("a" * 40, "d928" + "61" * 40), (b"", "c400"), (b"\x01", "c40101"),
    ([], "90"), ((1, 2), "920102"), ({}, "80"),
    (Ext(1, b"\x90"), "d40190"), (Ext(2, b"\x00" * 32), "c72002" + "00" * 32),
])
def test_exact_bytes(value, hexbytes):
    assert encoding.pack(value).hex() == hexbytes


def test_floats_are_always_float64_and_nan_bits_kept():
    nan = struct.unpack("<d", bytes.fromhex("0100000000f8ff7f"))[0]  # a NaN with a payload
    data = encoding.pack(nan)
    assert data[0] == 0xcb and len(data) == 9
    assert struct.pack("<d", encoding.unpack(data)) == struct.pack("<d", nan)


@pytest.mark.parametrize("value", [INT_MAX + 1, INT_MIN - 1, 2**100])
def test_ints_beyond_64_bits_refused(value):
    with pytest.raises(Unstorable) as exc:
        encoding.pack(value)
    assert exc.value.reason == "int-range"


@pytest.mark.parametrize("value", [1.5j, object(), {1.5: 1}, {(1,): 1}, {b"k": 1}, bytearray(b"x"), {None: 1}])
def test_other_types_refused(value):
    with pytest.raises(BadInput):
        encoding.pack(value)


def test_tuples_encode_as_arrays():
    assert encoding.pack((1, "a")) == encoding.pack([1, "a"])
    assert encoding.unpack(encoding.pack((1, "a"))) == [1, "a"]


def test_ext_round_trips():
    assert encoding.unpack(encoding.pack([Ext(3, b"abc")])) == [Ext(3, b"abc")]


@pytest.mark.parametrize("data", [
    b"", b"\xc1", b"\x92\x01", b"\xa3ab", b"\xa2\xff\xfe", b"\x01\x02", b"\xdd\xff\xff\xff\xff",
    b"\xc4\x05ab", b"\xde\x00\x01\x01",
])
def test_malformed_bytes_raise_corrupt_object(data):
    with pytest.raises(CorruptObject):
        encoding.unpack(data)


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=64))
def test_unpack_raises_only_corrupt_object(data):
    try:
        encoding.unpack(data)
    except CorruptObject:
        pass


@pytest.mark.parametrize("data", [
    "cc05",                  # 5 as uint 8 (positive fixint is shorter)
    "d005", "d10005",        # 5 as int 8 / int 16
    "d1ff80",                # -128 as int 16 (int 8 is shorter)
    "ca3fc00000",            # 1.5 as float 32
    "d90161",                # "a" as str 8
    "c5000161",              # b"a" as bin 16
    "dc000101",              # [1] as array 16
    "de0001a16101",          # {"a": 1} as map 16
    "82a16202a16101",        # {"b": 2, "a": 1}: keys out of order
    "82a161010102",          # {"a": 1, 1: 2}: a str key before an int key
    "82a16101a16102",        # "a" twice
    "c7010190",              # ext 8 where fixext 1 fits
])
def test_non_canonical_encodings_are_refused_when_asked(data):
    raw = bytes.fromhex(data)
    encoding.unpack(raw)  # well formed: the plain decoder reads it
    with pytest.raises(CorruptObject) as exc:
        encoding.unpack(raw, "thing", kind="commit", canonical=True)
    assert (exc.value.kind, exc.value.field) == ("commit", "encoding")
    assert "canonical" in str(exc.value)


@settings(max_examples=100, deadline=None)
@given(values)
def test_canonical_bytes_pass_the_canonical_check(value):
    assert same(encoding.unpack(encoding.pack(value), canonical=True), canonical(value))


def test_msgpack_timestamps_are_not_canonical():
    with pytest.raises(CorruptObject):
        encoding.unpack(bytes.fromhex("d6ff00000001"), canonical=True)
