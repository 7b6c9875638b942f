"""Tensor, tree and commit objects: encodings, ids, and decoders that check what they read."""

import dataclasses
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvc import encoding, hashing, objects
from mvc.encoding import INT_MAX, INT_MIN, Ext
from mvc.errors import CorruptObject
from mvc.objects import (CommitObject, TensorLeaf, TensorObject, TreeObject, decode_tensor_ids, format_path,
                         object_id, walk)

ID_A, ID_B = b"\xaa" * 32, b"\xbb" * 32


def tensor_map(**changes) -> dict:
    m = {"type": "tensor", "dtype": "F32", "shape": [2, 3], "chunk_size": 16, "chunks": [ID_A, ID_B]}
    m.update(changes)
    return m


def commit_map(**changes) -> dict:
    m = {"type": "commit", "tree": ID_A, "parents": [ID_B], "message": "m", "author": "a", "time": 1,
         "step": None, "epoch": 3, "metrics": {"loss": 0.5, "n": 2}, "context": {"lr": 1e-3}}
    m.update(changes)
    return m


# -- tensor ------------------------------------------------------------------


def test_tensor_round_trip_and_id():
    obj = TensorObject("F32", (2, 3), 16, (ID_A, ID_B))
    data = obj.encode()
    assert TensorObject.decode(data) == obj
    assert object_id(data) == hashing.digest(data)
    assert obj.numel == 6 and obj.nbytes == 24


def test_tensor_chunk_spans_cover_the_bytes():
    obj = TensorObject("F32", (2, 3), 16, (ID_A, ID_B))
    assert list(obj.chunk_spans()) == [(ID_A, 0, 16), (ID_B, 16, 8)]


def test_zero_dim_and_empty_tensors():
    scalar = TensorObject("I64", (), 64, (ID_A,))
    assert TensorObject.decode(scalar.encode()) == scalar and scalar.nbytes == 8
    empty = TensorObject("F16", (0, 5), 64, ())
    assert TensorObject.decode(empty.encode()) == empty and list(empty.chunk_spans()) == []


@pytest.mark.parametrize("changes, field", [
    ({"type": "tree"}, "type"),
    ({"dtype": "F99"}, "dtype"),
    ({"dtype": 4}, "dtype"),
    ({"shape": [2, -3]}, "shape"),
    ({"shape": [2.0, 3]}, "shape"),
    ({"shape": "23"}, "shape"),
    ({"shape": [1] * 65, "chunks": [ID_A]}, "shape"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"chunk_size": True}, "chunk_size"),
    ({"chunks": [ID_A]}, "chunks"),
    ({"chunks": [ID_A, b"short"]}, "chunks"),
    ({"chunks": [ID_A, "aa" * 32]}, "chunks"),
    ({"extra": 1}, "fields"),
])
def test_tensor_decode_rejects(changes, field):
    with pytest.raises(CorruptObject) as exc:
        TensorObject.decode(encoding.pack(tensor_map(**changes)))
    assert (exc.value.kind, exc.value.field) == ("tensor", field)


def test_tensor_decode_rejects_missing_field():
    m = tensor_map()
    del m["chunk_size"]
    with pytest.raises(CorruptObject) as exc:
        TensorObject.decode(encoding.pack(m))
    assert (exc.value.kind, exc.value.field) == ("tensor", "fields")


@pytest.mark.parametrize("data", [b"", b"\x90", encoding.pack([1]), encoding.pack("tensor"), b"\xc1"])
def test_tensor_decode_rejects_non_maps(data):
    with pytest.raises(CorruptObject):
        TensorObject.decode(data)


# -- tree --------------------------------------------------------------------


def test_tree_ext_types():
    root = {"t": (1, "x"), "w": TensorLeaf(ID_A), "tied": [TensorLeaf(ID_B, 0), TensorLeaf(ID_B, 0)]}
    raw = encoding.unpack(TreeObject(root).encode())
    assert raw["type"] == "tree"
    assert raw["root"]["t"] == Ext(1, encoding.pack([1, "x"]))
    assert raw["root"]["w"] == Ext(2, ID_A)
    assert raw["root"]["tied"] == [Ext(3, ID_B + struct.pack(">I", 0))] * 2


def test_shared_group_is_big_endian_u32():
    raw = encoding.unpack(TreeObject(TensorLeaf(ID_A, 258)).encode())
    assert raw["root"] == Ext(3, ID_A + b"\x00\x00\x01\x02")


def test_tree_keeps_tuples_lists_int_keys():
    root = {0: (1, [2, (3,)]), "a": [], "b": (), 5: {"x": None}}
    back = TreeObject.decode(TreeObject(root).encode()).root
    assert back == root
    assert type(back[0]) is tuple and type(back[0][1]) is list and type(back[0][1][1]) is tuple
    assert type(back["b"]) is tuple


leaves = st.one_of(
    st.none(), st.booleans(), st.integers(INT_MIN, INT_MAX), st.floats(allow_nan=False), st.text(max_size=6),
    st.binary(max_size=6), st.builds(TensorLeaf, st.binary(min_size=32, max_size=32)),
    st.builds(TensorLeaf, st.binary(min_size=32, max_size=32), st.integers(0, 2**32 - 1)))
nodes = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.one_of(st.integers(-5, 5), st.text(max_size=4)), inner, max_size=3)), max_leaves=10)


@settings(max_examples=50, deadline=None)
@given(nodes)
def test_tree_round_trip(root):
    back = TreeObject.decode(TreeObject(root).encode()).root
    assert typed(back) == typed(root)


def typed(node):
    """A comparable form that tells bool from int and tuple from list."""
    if isinstance(node, dict):
        return ("dict", sorted(((encoding.key_order(k), typed(v)) for k, v in node.items())))
    if isinstance(node, (list, tuple)):
        return (type(node).__name__, [typed(v) for v in node])
    return (type(node).__name__, node)


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.text(max_size=4), leaves, max_size=6), st.randoms(use_true_random=False))
def test_tree_id_independent_of_insertion_order(d, rnd):
    items = list(d.items())
    rnd.shuffle(items)
    assert TreeObject({"m": dict(items)}).encode() == TreeObject({"m": d}).encode()


@pytest.mark.parametrize("root", [
    Ext(9, b""),  # an unknown value
    Ext(2, b"\x00" * 31),  # a tensor leaf with a bad id
    Ext(3, b"\x00" * 32),  # a shared tensor leaf with a bad payload
    Ext(1, encoding.pack({"a": 1})),  # a tuple that is not an array
    Ext(1, b"\xc1"),  # a tuple that does not decode
])
def test_tree_decode_rejects(root):
    data = encoding.pack({"type": "tree", "root": root})
    with pytest.raises(CorruptObject) as exc:
        TreeObject.decode(data)
    assert (exc.value.kind, exc.value.field) == ("tree", "root")


def test_tree_decode_rejects_extra_fields_and_wrong_type():
    with pytest.raises(CorruptObject) as exc:
        TreeObject.decode(encoding.pack({"type": "tree", "root": 1, "x": 2}))
    assert (exc.value.kind, exc.value.field) == ("tree", "fields")
    with pytest.raises(CorruptObject) as exc:
        TreeObject.decode(encoding.pack(commit_map()))
    assert (exc.value.kind, exc.value.field) == ("tree", "type")


VERSION = {"version": 1}


def test_tree_dict_metadata_round_trips_in_key_order():
    root = {"m": {"w": 1}, "l": [{"a": 2}, ({"b": 3},)], 0: {}}
    given = ((("m",), {"": VERSION}), ((), {"": VERSION, "x": {"v": None}}), (("l", 1, 0), {"": VERSION}),
             ((0,), {"": VERSION}), (("l", 0), {"": {"s": "t", "b": b"\x00", "f": 0.5, "t": True}}))
    tree = TreeObject.decode(TreeObject(root, dict_metadata=given).encode())
    assert tree.dict_metadata == tuple(sorted(given, key=lambda i: [encoding.key_order(k) for k in i[0]]))
    assert [p for p, _ in tree.dict_metadata] == [(), (0,), ("l", 0), ("l", 1, 0), ("m",)]


@pytest.mark.parametrize("value", [
    [],  # written only when there is some
    [[["m"], {"": VERSION}], [["m"], {"": VERSION}]],  # a path twice
    [[["n"], {"": VERSION}], [["m"], {"": VERSION}]],  # not in key order
    [[["m", "w"], {"": VERSION}]],  # a path to a leaf, not a map
    [[["x"], {"": VERSION}]],  # a path to nothing
    [[["m"], {"": 1}]],  # metadata that is not prefix -> map
    [[["m"], {"": {"version": [1]}}]],  # a value that is not a scalar
    [[["m"], {1: VERSION}]],  # an int prefix
    [[[1.5], {"": VERSION}]],  # a float in a path
    [["m", {"": VERSION}]],  # a path that is not an array
    {"m": VERSION},  # not an array of pairs
])
def test_tree_decode_rejects_bad_dict_metadata(value):
    data = encoding.pack({"type": "tree", "root": {"m": {"w": 1}}, "dict_metadata": value})
    with pytest.raises(CorruptObject) as exc:
        TreeObject.decode(data)
    assert (exc.value.kind, exc.value.field) == ("tree", "dict_metadata")


def test_deeply_nested_tuples_are_corrupt_not_a_crash():
    payload = encoding.pack([])
    for _ in range(5000):
        payload = encoding.pack([Ext(1, payload)])
    with pytest.raises(CorruptObject):
        TreeObject.decode(encoding.pack({"type": "tree", "root": Ext(1, payload)}))


def test_walk_visits_in_key_order_with_paths():
    root = {"b": [1, TensorLeaf(ID_A)], 2: "x", "a": {"z": None}, 1: (True,)}
    assert list(walk(root)) == [((1, 0), True), ((2,), "x"), (("a", "z"), None), (("b", 0), 1),
                                (("b", 1), TensorLeaf(ID_A))]
    assert format_path(("model", "layers", 0, "weight")) == "model.layers.0.weight"


# -- commit ------------------------------------------------------------------


def test_commit_round_trip_and_hash_chain():
    first = CommitObject(ID_A, (), "first", "me", 1_700_000_000_000_000, 1, None, {"loss": 2.5}, {"lr": 0.1})
    first_id = object_id(first.encode())
    second = CommitObject(ID_B, (first_id,), "second", "me", 1_700_000_000_000_001)
    assert CommitObject.decode(first.encode()) == first
    assert CommitObject.decode(second.encode()).parents == (first_id,)
    altered = CommitObject(ID_A, (), "first", "me", 1_700_000_000_000_000, 1, None, {"loss": 2.25}, {"lr": 0.1})
    child_of_altered = CommitObject(ID_B, (object_id(altered.encode()),), "second", "me", 1_700_000_000_000_001)
    assert object_id(child_of_altered.encode()) != object_id(second.encode())


def test_commit_metadata_order_does_not_change_id():
    a = CommitObject(ID_A, (), "m", "a", 1, metrics={"x": 1, "y": 2.0}, context={"b": [1], "a": {"q": 1, "p": 2}})
    b = CommitObject(ID_A, (), "m", "a", 1, metrics={"y": 2.0, "x": 1}, context={"a": {"p": 2, "q": 1}, "b": [1]})
    assert a.encode() == b.encode()


@pytest.mark.parametrize("changes, field", [
    ({"tree": b"x"}, "tree"),
    ({"parents": [b"x"]}, "parents"),
    ({"parents": ID_A}, "parents"),
    ({"message": b"m"}, "message"),
    ({"author": None}, "author"),
    ({"time": 1.5}, "time"),
    ({"step": "1"}, "step"),
    ({"epoch": 1.0}, "epoch"),
    ({"metrics": {"loss": "low"}}, "metrics"),
    ({"metrics": {"ok": True}}, "metrics"),
    ({"metrics": {1: 1.0}}, "metrics"),
    ({"context": [1]}, "context"),
    ({"type": "tensor"}, "type"),
    ({"extra": 1}, "fields"),
])
def test_commit_decode_rejects(changes, field):
    with pytest.raises(CorruptObject) as exc:
        CommitObject.decode(encoding.pack(commit_map(**changes)))
    assert (exc.value.kind, exc.value.field) == ("commit", field)


# -- tensor chunk ids as one array (decode_tensor_ids: the walks' decoder) ----


def _decoded(decode, data):
    """What ``decode`` makes of ``data``: its value, or the CorruptObject it raises as (kind, field, message)."""
    try:
        return decode(data)
    except CorruptObject as exc:
        return ("raised", exc.kind, exc.field, str(exc))


def _as_ids(data):
    obj = TensorObject.decode(data)
    return dataclasses.replace(obj, chunks=()), b"".join(obj.chunks)


def _ids_of(data):
    tensor, ids = decode_tensor_ids(data)
    assert ids.dtype == np.dtype("S32") and ids.shape == (len(ids),)
    return tensor, ids.tobytes()


def _tensors() -> list:
    """Canonical tensor objects around the array header's forms (fixarray below 16 ids, array 16
    below 65536, array 32 above) and a sharded one."""
    ids = [hashing.digest(i.to_bytes(4, "big")) for i in range(70000)]
    out = [TensorObject("F32", (2, 3), 16, (ID_A, ID_B)), TensorObject("F16", (0, 5), 64, ()),
           TensorObject("I64", (), 64, (ID_A,)),
           TensorObject("U8", (16 * 64,), 64, tuple(ids[:16])), TensorObject("U8", (15 * 64,), 64, tuple(ids[:15])),
           TensorObject("U8", (65536,), 1, tuple(ids[:65536])), TensorObject("U8", (65535,), 1, tuple(ids[:65535])),
           TensorObject("U8", (70000,), 1, tuple(ids)),
           TensorObject("F32", (4, 3), 20, tuple(ids[:4]), (((0, 0), (2, 3)), ((2, 0), (2, 3))))]
    return [t.encode() for t in out]


def test_decode_tensor_ids_takes_the_array_path_for_canonical_tensors():
    for data in _tensors():
        assert objects._spliced_ids(data) is not None
        assert _ids_of(data) == _as_ids(data)


def test_decode_tensor_ids_decides_as_decode_on_every_damaged_byte():
    """Every byte of small tensor objects (the fast path's header, each id's bin 8 header) set to
    every value that matters, and cut short anywhere: the same verdict as ``decode``, the same
    error, the same ids."""
    for data in [t for t in _tensors() if len(t) < 1000]:
        forged = [data[:cut] for cut in range(len(data))] + [data + b"\x00"]
        for at in range(len(data)):
            for value in {0x00, 0x20, 0x90, 0x91, 0x9f, 0xa6, 0xc4, 0xc5, 0xd9, 0xdc, 0xdd, 0xff,
                          data[at] ^ 1, data[at] ^ 0x80}:
                forged.append(data[:at] + bytes([value]) + data[at + 1:])
        for bad in forged:
            assert _decoded(_ids_of, bad) == _decoded(_as_ids, bad)


@pytest.mark.parametrize("value", [
    tensor_map(chunks=[ID_A, "aa" * 32]),  # a str where an id belongs
    tensor_map(chunks=[ID_A, ID_B[:31]]),  # an id one byte short
    tensor_map(chunks=[ID_A, ID_B, ID_A]),  # one id too many
    tensor_map(chunks=[ID_A, [ID_B]]),
    tensor_map(chunks=ID_A + ID_B),  # the ids as one string
])
def test_decode_tensor_ids_refuses_what_decode_refuses(value):
    data = encoding.pack(value)
    assert _decoded(_ids_of, data)[0] == "raised"
    assert _decoded(_ids_of, data) == _decoded(_as_ids, data)


def test_decode_tensor_ids_refuses_non_canonical_array_headers():
    """The ids' array written in a longer form than needed (array 16 for 2 ids, array 32 for 20):
    well formed msgpack, but not the canonical encoding, so not a tensor object."""
    data = TensorObject("F32", (2, 3), 16, (ID_A, ID_B)).encode()
    at = data.index(b"\xa6chunks") + 7
    for header in (b"\xdc\x00\x02", b"\xdd\x00\x00\x00\x02"):
        bad = data[:at] + header + data[at + 1:]
        assert _decoded(_ids_of, bad)[0] == "raised"
        assert _decoded(_ids_of, bad) == _decoded(_as_ids, bad)
    many = TensorObject("U8", (20,), 1, tuple(bytes([i]) * 32 for i in range(20))).encode()
    at = many.index(b"\xa6chunks") + 7
    bad = many[:at] + b"\xdd\x00\x00\x00\x14" + many[at + 3:]
    assert _decoded(_ids_of, bad)[0] == "raised" and _decoded(_ids_of, bad) == _decoded(_as_ids, bad)


def test_decode_tensor_ids_refuses_a_repeated_chunks_key():
    data = TensorObject("F32", (2, 3), 16, (ID_A, ID_B)).encode()
    at = data.index(b"\xa6chunks")
    end = at + 7 + 1 + 2 * 34
    bad = bytes([data[0] + 1]) + data[1:end] + data[at:end] + data[end:]  # one more pair: "chunks" again
    assert _decoded(_ids_of, bad)[0] == "raised"
    assert _decoded(_ids_of, bad) == _decoded(_as_ids, bad)
