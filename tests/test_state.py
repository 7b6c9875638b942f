"""Flattening states: raw bytes of every kind of view, tied weights, and refusals naming the path."""

import collections
import enum

import numpy as np
import pytest
import torch

from mvc.errors import Unstorable
from mvc.objects import TensorLeaf
from mvc.state import TensorSlot, empty_tensor, flatten, rebuild, tensor_bytes, tree_root


def contiguous_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8).numpy())


def test_tensor_bytes_are_little_endian_c_order():
    t = torch.tensor([[1, 2], [3, 258]], dtype=torch.int16)
    assert bytes(tensor_bytes(t)) == bytes.fromhex("0100 0200 0300 0201")


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12.0).reshape(3, 4).t(),
    lambda: torch.arange(24.0).reshape(2, 3, 4)[:, ::2, 1:],
    lambda: torch.arange(10, dtype=torch.int32)[::3],
    lambda: torch.arange(6.0).reshape(2, 3).expand(4, 2, 3),
    lambda: torch.arange(8.0)[5],
    lambda: torch.complex(torch.arange(4.0), torch.ones(4)).conj(),
    lambda: torch.complex(torch.arange(4.0), torch.ones(4)).conj().imag,
    lambda: torch.arange(4.0).requires_grad_(),
])
def test_tensor_bytes_of_views_are_their_values(make):
    t = make()
    raw = bytes(tensor_bytes(t))
    assert raw == contiguous_bytes(t.detach())
    back = torch.frombuffer(bytearray(raw), dtype=t.dtype).reshape(t.shape) if raw else None
    if back is not None:
        assert torch.equal(back, t.detach().resolve_conj().resolve_neg())


def test_flatten_structure_and_slots():
    w = torch.ones(2, 2)
    root, slots = flatten({"b": [w, 1], "a": (None, "x"), 3: {"k": b"v"}})
    assert [s.path for s in slots] == [("b", 0)]
    assert list(root) == [3, "a", "b"]  # canonical key order
    assert root["a"] == (None, "x") and type(root["a"]) is tuple
    assert isinstance(root["b"][0], TensorSlot) and root["b"][0].dtype == "F32" and root["b"][0].shape == (2, 2)


def test_tied_weights_share_one_slot_and_group():
    w = torch.randn(3, 3)
    root, slots = flatten({"embed": w, "head": w, "other": torch.randn(3, 3)})
    assert len(slots) == 2
    assert root["embed"] is root["head"] and root["embed"].group == 0
    assert root["other"].group is None


def test_equal_but_independent_tensors_are_not_tied():
    root, slots = flatten({"a": torch.zeros(4), "b": torch.zeros(4)})
    assert len(slots) == 2 and root["a"].group is None and root["b"].group is None


def test_views_of_one_storage_with_different_shapes_are_not_tied():
    base = torch.arange(6.0)
    root, slots = flatten({"a": base, "b": base.view(2, 3), "c": base[1:]})
    assert len(slots) == 3 and all(s.group is None for s in slots)


def test_conjugate_and_negative_views_are_not_tied_to_their_base():
    """c.conj() reads c's memory with other values (so does c.conj().imag against c.imag): tying
    them stored one slot for both, and one came back with the other's values."""
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    root, slots = flatten({"a": c.conj(), "b": c, "i": c.imag, "j": c.conj().imag})
    assert len(slots) == 4 and all(s.group is None for s in slots)


def test_two_tied_pairs_get_distinct_groups():
    x, y = torch.ones(2), torch.ones(2)
    root, _ = flatten({"a": x, "b": x, "c": y, "d": y})
    assert {root["a"].group, root["c"].group} == {0, 1}
    tree = tree_root(root)
    assert tree["a"] == tree["b"] and tree["a"] != tree["c"]


@pytest.mark.parametrize("state, where", [
    ({"a": {"b": object()}}, "a.b"),
    ({"opt": [1, {"fn": print}]}, "opt.1.fn"),
    ({"x": 1.5j}, "x"),
    ({"arr": np.zeros(3)}, "arr"),
    ({"s": {1, 2}}, "s"),
    (object(), "<root>"),
])
def test_unsupported_objects_name_the_key_path(state, where):
    with pytest.raises(Unstorable) as err:
        flatten(state)
    assert (err.value.key, err.value.reason) == (where, "type") and err.value.type


@pytest.mark.parametrize("key", [1.5, None, (1, 2), b"k", True])
def test_bad_dict_keys_name_the_path(key):
    with pytest.raises(Unstorable) as info:
        flatten({"model": {"layer": {key: torch.ones(1)}}})
    assert (info.value.key, info.value.reason, info.value.type) == ("model.layer", "key-type", type(key).__name__)


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**30])
def test_ints_beyond_64_bits_refused_with_path(value):
    with pytest.raises(Unstorable) as err:
        flatten({"a": [value]})
    assert (err.value.key, err.value.reason) == ("a.0", "int-range")


def test_64_bit_extremes_accepted():
    root, _ = flatten({"max": 2**64 - 1, "min": -(2**63)})
    assert root == {"max": 2**64 - 1, "min": -(2**63)}


def test_sparse_and_meta_tensors_refused():
    with pytest.raises(Unstorable) as err:
        flatten({"s": torch.eye(3).to_sparse()})
    assert (err.value.key, err.value.reason) == ("s", "layout")
    with pytest.raises(Unstorable) as err:
        flatten({"m": torch.empty(2, device="meta")})
    assert (err.value.key, err.value.reason) == ("m", "meta")


class Colour(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


def test_subclasses_of_plain_types_store_as_the_base():
    Point = collections.namedtuple("Point", "x y")
    state = collections.OrderedDict(c=Colour.RED, l=Level.HIGH, f=np.float64(0.25), p=Point(1, 2))
    root, _ = flatten(state)
    assert type(root) is dict and root == {"c": "red", "f": 0.25, "l": 3, "p": (1, 2)}
    assert type(root["c"]) is str and type(root["l"]) is int and type(root["f"]) is float
    assert type(root["p"]) is tuple


def test_rebuild_replaces_leaves():
    root = {"a": (TensorLeaf(b"\x01" * 32), [TensorLeaf(b"\x02" * 32)]), "b": 1}
    out = rebuild(root, lambda leaf: leaf.id[0])
    assert out == {"a": (1, [2]), "b": 1} and type(out["a"]) is tuple


@pytest.mark.parametrize("shape, name, dtype", [((3, 2), "F32", torch.float32), ((5 << 20,), "U8", torch.uint8),
                                               ((1 << 20, 3), "BF16", torch.bfloat16)])
def test_empty_tensor_is_an_ordinary_tensor(shape, name, dtype):
    t, buffer = empty_tensor(shape, name)  # large ones are advised onto huge pages
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
    assert buffer.nbytes == t.numel() * t.element_size()
    buffer[:] = 0  # the buffer is the tensor's own memory
    assert not t.view(torch.uint8).any() if dtype != torch.uint8 else not t.any()
    t.fill_(1)
    assert bool((t == 1).all())
    t.resize_(4)  # still an ordinary, resizable torch allocation


def test_too_deep_or_self_containing_states_are_bad_input():
    deep = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(Unstorable) as err:
        flatten({"x": deep})
    assert err.value.reason == "depth"
    loop = {"a": []}
    loop["a"].append(loop)
    with pytest.raises(Unstorable) as err:
        flatten(loop)
    assert err.value.reason == "depth"


def test_empty_views_with_any_strides_have_no_bytes():
    t = torch.empty(4, 0, dtype=torch.bfloat16).as_strided((4, 0), (2, 2))
    assert tensor_bytes(t).nbytes == 0
