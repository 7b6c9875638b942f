"""Fuzzing the decoders of on-disk bytes with hypothesis.

Whatever bytes they get, ``TensorObject/TreeObject/CommitObject.decode``,
``encoding.unpack`` and ``packs.read_trailer`` raise only ``MvcError``
subclasses, and a length field cannot make them allocate more than the
input holds. Inputs are random bytes, valid encodings with mutations
(flipped bits, truncation, insertion, deletion, planted length headers),
and well-formed maps with hostile field values.
"""

import math
import struct
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvc import dtypes, encoding, hashing
from mvc.encoding import Ext
from mvc.errors import MvcError
from mvc.objects import (EXT_SHARED_TENSOR, EXT_TENSOR, EXT_TUPLE, CommitObject, TensorLeaf, TensorObject,
                         TreeObject)
from mvc.store.packs import FOOTER, HEADER, RECORD_HEAD, PackWriter, read_trailer

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DECODERS = [TensorObject.decode, TreeObject.decode, CommitObject.decode, encoding.unpack]

# msgpack headers whose 32-bit length field claims far more than any input holds
BOMBS = [b"\xdd\x7f\xff\xff\xff", b"\xdf\x7f\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
         b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01", b"\xdc\xff\xff", b"\xde\xff\xff"]


def _decode_or_mvc_error(decode, data: bytes):
    """Decode; only an MvcError may come out. Returns the object or None."""
    try:
        return decode(data)
    except MvcError:
        return None


# -- valid objects --------------------------------------------------------------

ids = st.binary(min_size=32, max_size=32)


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(sorted(dtypes.TO_TORCH)))
    shape = tuple(draw(st.lists(st.integers(0, 6), max_size=3)))
    size = draw(st.integers(1, 64))
    nbytes = math.prod(shape) * dtypes.itemsize(dtype)
    return TensorObject(dtype, shape, size, tuple(draw(ids) for _ in range(-(-nbytes // size))))


plain = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
                  st.text(max_size=8), st.binary(max_size=8))
leaves = st.one_of(plain, st.builds(TensorLeaf, ids), st.builds(TensorLeaf, ids, st.integers(0, 2**32 - 1)))
nodes = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(st.one_of(st.text(max_size=6), st.integers(-5, 5)), inner, max_size=4)), max_leaves=12)
trees = st.builds(TreeObject, nodes)
commits = st.builds(
    CommitObject, ids, st.lists(ids, max_size=2).map(tuple), st.text(max_size=20), st.text(max_size=10),
    st.integers(0, 2**62), st.one_of(st.none(), st.integers(0, 10**9)), st.one_of(st.none(), st.integers(0, 99)),
    st.dictionaries(st.text(max_size=6), st.one_of(st.integers(-10, 10), st.floats(allow_nan=False)), max_size=3),
    st.dictionaries(st.text(max_size=6), plain, max_size=3))
objects = st.one_of(tensors(), trees, commits)


@st.composite
def mutated(draw, valid):
    """A valid encoding with a few random edits."""
    data = bytearray(draw(valid).encode())
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "bomb", "byte"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        elif op == "bomb":
            data[at:at] = draw(st.sampled_from(BOMBS))
        elif data:
            data[at] = draw(st.sampled_from([0x00, 0x7f, 0x80, 0x90, 0xc0, 0xc1, 0xc4, 0xd4, 0xdc, 0xff]))
    return bytes(data)


# -- the object decoders ----------------------------------------------------------

@pytest.mark.parametrize("decode", DECODERS, ids=["tensor", "tree", "commit", "unpack"])
@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes(decode, data):
    _decode_or_mvc_error(decode, data)


@FUZZ
@given(obj=objects)
def test_valid_objects_round_trip(obj):
    assert type(obj).decode(obj.encode()) == obj


@pytest.mark.parametrize("decode", DECODERS, ids=["tensor", "tree", "commit", "unpack"])
@FUZZ
@given(data=mutated(objects))
def test_mutated_encodings(decode, data):
    obj = _decode_or_mvc_error(decode, data)
    if obj is not None and decode is not encoding.unpack:
        # what decodes is a sound object, and its bytes were its one canonical encoding (compared
        # as bytes: a NaN in a tree is not equal to itself)
        assert obj.encode() == data


hostile = st.recursive(
    st.one_of(plain, st.integers(-2**63, 2**64 - 1), st.builds(Ext, st.integers(0, 127), st.binary(max_size=40)),
              st.sampled_from(sorted(dtypes.TO_TORCH)), ids),
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-2**63, 2**64 - 1)),
                                            inner, max_size=4)),
    max_leaves=10)
FIELDS = {
    TensorObject.decode: ("tensor", ["dtype", "shape", "chunk_size", "chunks"]),
    TreeObject.decode: ("tree", ["root"]),
    CommitObject.decode: ("commit", ["tree", "parents", "message", "author", "time", "step", "epoch",
                                     "metrics", "context"]),
}


@pytest.mark.parametrize("decode", list(FIELDS), ids=["tensor", "tree", "commit"])
@FUZZ
@given(data=st.data())
def test_well_formed_maps_with_hostile_values(decode, data):
    kind, names = FIELDS[decode]
    value = {"type": kind, **{n: data.draw(hostile, label=n) for n in names}}
    obj = _decode_or_mvc_error(decode, encoding.pack(value))
    if obj is not None:
        assert type(obj).decode(obj.encode()) == obj


def test_hostile_tensor_shapes_are_refused():
    """Shapes torch cannot allocate or stride are corrupt, even when they hold no bytes."""
    for shape, size, n in (([0, 2**40, 2**40], 64, 0), ([0, 2**63], 1, 0), ([0, 2**64 - 1], 1, 0),
                           ([3], 2**32, 1)):
        value = {"type": "tensor", "dtype": "U8", "shape": shape, "chunk_size": size, "chunks": [b"\0" * 32] * n}
        with pytest.raises(MvcError):
            TensorObject.decode(encoding.pack(value))


def test_hostile_tree_nesting_is_refused():
    deep = b"\x91" * 5000 + b"\xc0"
    for data in (encoding.pack({"type": "tree", "root": None})[:-1] + deep, deep):
        with pytest.raises(MvcError):
            TreeObject.decode(data)
    inner = encoding.pack(None)
    for _ in range(3000):  # tuples nest through their own encodings
        inner = encoding.pack(Ext(EXT_TUPLE, inner))
    with pytest.raises(MvcError):
        TreeObject.decode(encoding.pack({"type": "tree", "root": Ext(EXT_TUPLE, inner)}))
    for code, payload in ((EXT_TENSOR, b"\0" * 31), (EXT_SHARED_TENSOR, b"\0" * 35), (99, b"")):
        with pytest.raises(MvcError):
            TreeObject.decode(encoding.pack({"type": "tree", "root": Ext(code, payload)}))


# -- memory: a length field cannot make a decoder allocate ----------------------------

def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    except MvcError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("decode", DECODERS, ids=["tensor", "tree", "commit", "unpack"])
def test_length_bombs_fail_fast(decode):
    prefix = encoding.pack({"type": "tensor"})[:-1]
    for bomb in BOMBS:
        for data in (bomb + b"\0" * 5, b"\x81\xa6chunks" + bomb + b"\0" * 5, prefix + bomb):
            assert _peak(lambda: _decode_or_mvc_error(decode, data)) < 64 * 1024, (bomb, data)


@settings(max_examples=60, deadline=None, database=None)
@given(data=mutated(objects))
def test_memory_stays_proportional_to_input(data):
    for decode in DECODERS:
        assert _peak(lambda: _decode_or_mvc_error(decode, data)) < 64 * 1024 + 200 * len(data)


# -- pack trailers --------------------------------------------------------------------

def _valid_pack(directory: Path, chunks: list) -> bytes:
    writer = PackWriter(directory)
    for i, data in enumerate(chunks):
        writer.add(bytes([i]) * 32, data)
    path = writer.seal()
    data = path.read_bytes()
    path.unlink()
    return data


@pytest.fixture(scope="module")
def pack_dir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _read_trailer_bytes(directory: Path, data: bytes):
    path = directory / "fuzz.pack"
    path.write_bytes(data)
    try:
        entries = read_trailer(path)
    except MvcError:
        return None
    trailer_offset = struct.unpack_from("<Q", data, len(data) - 16)[0]
    for cid, offset, length in entries:  # whatever it accepts lies inside the data area
        assert len(HEADER) + RECORD_HEAD.size <= offset and offset + length <= trailer_offset
    return entries


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(chunks=st.lists(st.binary(max_size=40), max_size=5), edits=st.data())
def test_read_trailer_on_mutated_packs(pack_dir, chunks, edits):
    data = bytearray(_valid_pack(pack_dir, chunks))
    assert _read_trailer_bytes(pack_dir, bytes(data)) == [
        (bytes([i]) * 32, 8 + RECORD_HEAD.size + sum(len(c) + RECORD_HEAD.size for c in chunks[:i]), len(c))
        for i, c in enumerate(chunks)]
    for _ in range(edits.draw(st.integers(1, 3))):
        at = edits.draw(st.integers(0, len(data) - 1))
        op = edits.draw(st.sampled_from(["flip", "truncate", "insert", "byte"]))
        if op == "flip":
            data[at] ^= 1 << edits.draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = edits.draw(st.binary(min_size=1, max_size=8))
        elif data:
            data[at] = edits.draw(st.sampled_from([0x00, 0xff, 0x7f]))
        if not data:
            break
    _read_trailer_bytes(pack_dir, bytes(data))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=st.binary(max_size=200), offset=st.integers(0, 2**64 - 1), digest=st.binary(min_size=32, max_size=32))
def test_read_trailer_on_random_packs(pack_dir, body, offset, digest):
    for data in (body, HEADER + body, HEADER + body + FOOTER.pack(digest, offset, b"MVCSEAL1")):
        _read_trailer_bytes(pack_dir, data)


def test_read_trailer_count_bomb(pack_dir):
    body = struct.pack("<I", 2**31)  # claims 2**31 entries in a trailer of 4 bytes
    data = HEADER + body + FOOTER.pack(hashing.digest(body), len(HEADER), b"MVCSEAL1")
    assert _peak(lambda: _read_trailer_bytes(pack_dir, data)) < 64 * 1024
