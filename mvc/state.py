"""Flattening a state into a tree and building it back.

A **state** is what users commit: nested dicts (str or int keys), lists and
tuples whose leaves are tensors or plain values (None, bool, int, float,
str, bytes). ``flatten`` walks it in key order and replaces every tensor by
a ``TensorSlot`` holding its raw bytes; the repository hashes and stores the
slots, then ``tree_root`` turns them into ``TensorLeaf`` references.
Tensors that are the same view of the same storage (tied weights) get one
group number, so they share storage again when loaded. Anything else is a
``BadInput`` naming its key path: nothing is ever pickled.
"""

import ctypes
import mmap
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from . import dtypes, encoding, traverse
from .errors import BadInput, TooLarge, Unstorable
from .objects import TensorLeaf, is_dict_metadata, shape_problem
from .traverse import format_path, storage_key

_PLAIN = (type(None), bool, str, bytes, float)


@dataclass
class TensorSlot:
    """A tensor of a state on its way into the store.

    Its raw bytes are taken only when first asked for (``bytes()``): a
    tensor already contiguous on the CPU is a view, any other (a strided
    view, a CUDA tensor) a copy, which ``release()`` drops once its chunks
    are hashed and written, so a commit never holds every copy at once.
    """

    path: tuple
    dtype: str
    shape: tuple
    tensor: Any
    group: Any = None
    id: bytes = b""
    chunks: list = field(default_factory=list)
    _data: Any = None
    _lock: Any = field(default_factory=threading.Lock)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def bytes(self) -> np.ndarray:
        """The tensor's contiguous little-endian bytes, 1-D uint8."""
        with self._lock:
            if self._data is None:
                self._data = tensor_bytes(self.tensor) if _is_view_ready(self.tensor) else _copy_out(self.tensor)
            return self._data

    @property
    def data(self) -> np.ndarray:
        return self.bytes()

    def release(self) -> None:
        with self._lock:
            self._data = None


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The raw little-endian bytes of a tensor, as a 1-D uint8 array on CPU."""
    t = t.detach()
    if t.numel() == 0:  # an empty view may keep any strides, which view(uint8) refuses
        return np.empty(0, dtype=np.uint8)
    if t.device.type != "cpu":
        t = t.cpu()
    flat = t.resolve_conj().resolve_neg().contiguous().reshape(-1)
    if flat.stride(0) != 1:  # one element may be "contiguous" with any stride, which view(uint8) refuses
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8).numpy()


def _is_view_ready(t: torch.Tensor) -> bool:
    """Whether ``tensor_bytes`` of ``t`` is a view (no copy)."""
    return (t.numel() == 0 or (t.device.type == "cpu" and t.is_contiguous() and not t.is_conj()
                               and not t.is_neg()))


def _copy_out(t: torch.Tensor) -> np.ndarray:
    """The contiguous bytes of ``t`` in an anonymous mapping of their own.

    A mapping goes back to the kernel the moment the slot drops it; a copy
    from malloc would stay in the process's heap (measured here: 16 copies
    of 16 MiB made and freed one at a time grew the peak RSS by 226 MiB).
    """
    nbytes = t.numel() * t.element_size()
    buffer = mmap.mmap(-1, nbytes)
    flat = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes)
    flat.view(t.dtype).view(t.shape).copy_(t.detach().resolve_conj().resolve_neg())
    return flat.numpy()


def buffer_of(t: torch.Tensor, dtype_name: str, shape, where: str):
    """The bytes of ``t`` as a writable 1-D uint8 array, to read a tensor of
    ``dtype_name`` and ``shape`` into; BadInput if ``t`` cannot hold it."""
    if (dtypes.name_of(t.dtype, where), tuple(t.shape)) != (dtype_name, tuple(shape)) or not t.is_contiguous() \
            or t.device.type != "cpu":
        raise BadInput(f"the tensor given for {where!r} is not a contiguous CPU {dtype_name} {list(shape)}")
    return t.reshape(-1).view(torch.uint8).numpy()


def empty_tensor(shape: tuple, dtype_name: str) -> tuple:
    """(tensor, its bytes as a writable 1-D uint8 array): a CPU tensor to load into.

    Loading writes every byte of fresh memory, and with 4 KiB pages the page
    faults cost about as much as copying the data (measured: 0.5 s per GiB
    here). So a large tensor asks the kernel for transparent huge pages
    before its first touch; where the kernel says no it is a plain tensor.
    """
    t = torch.empty(shape, dtype=dtypes.torch_dtype(dtype_name))
    nbytes = t.numel() * t.element_size()
    if _madvise is not None and nbytes >= 2 * _HUGE_PAGE:
        _madvise(*_whole_pages(t.data_ptr(), nbytes, _HUGE_PAGE), mmap.MADV_HUGEPAGE)  # advice: result unused
    return t, t.reshape(-1).view(torch.uint8).numpy()


def release_pages(storage) -> None:
    """Hand the memory of ``storage`` back to the kernel now, keeping the
    mapping: the bytes read as zeros afterwards. For a storage whose bytes
    are written out and never read again (a streamed pt export's), so the
    next tensors' page faults reuse these pages and memory stays bounded.
    Only whole pages inside the storage are released, never a neighbour's;
    a no-op where madvise is missing."""
    nbytes = storage.nbytes()
    if _madvise is None or nbytes < 2 * mmap.PAGESIZE:
        return
    _madvise(*_whole_pages(storage.data_ptr(), nbytes, mmap.PAGESIZE), mmap.MADV_DONTNEED)


def _whole_pages(start: int, nbytes: int, page: int) -> tuple:
    """(address, length) of the whole ``page``-sized pages inside ``nbytes`` at ``start``."""
    lo, hi = -(-start // page) * page, (start + nbytes) // page * page
    return lo, hi - lo


def _find_madvise():
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_HUGE_PAGE = 2 << 20
_madvise = _find_madvise()


def _as_base(base: type, value):
    # str() of a str-mixin enum is "Class.NAME" (Python 3.11+), not its value
    return str.__str__(value) if base is str else base(value)


def _check_tensor(t: torch.Tensor, path: tuple) -> str:
    where = format_path(path) or "<root>"
    if t.is_nested:
        raise Unstorable(f"tensor at {where!r} is a nested tensor; store its components (t.unbind()) instead",
                         key=where, reason="nested-tensor")
    if t.layout != torch.strided:
        raise Unstorable(f"tensor at {where!r} has layout {t.layout}; only dense tensors can be stored", key=where,
                         reason="layout")
    if t.device.type == "meta":
        raise Unstorable(f"tensor at {where!r} is on the meta device and holds no data", key=where, reason="meta")
    name = dtypes.name_of(t.dtype, where)
    problem = shape_problem(name, tuple(t.shape))
    if problem:  # what a read would refuse is refused before any chunk is written
        raise TooLarge(f"tensor at {where!r} (shape {list(t.shape)}) cannot be stored: {problem}",
                       key=where, shape=tuple(t.shape))
    return name


def _items(node, path=()) -> list:
    if not isinstance(node, dict):
        return list(enumerate(node))
    for key in node:
        if type(key) not in (int, str):
            where = f" at {format_path(path)!r}" if path else ""
            raise Unstorable(f"dict key {key!r}{where} is a {type(key).__name__}; keys must be str or int",
                             key=format_path(path) or "<root>", reason="key-type", type=type(key).__name__)
    return [(k, node[k]) for k in sorted(node, key=encoding.key_order)]


def _shared_keys(state) -> set:
    seen, shared = set(), set()

    def visit(node, path):
        if isinstance(node, torch.Tensor):
            key = storage_key(node)
            if key is not None:
                (shared if key in seen else seen).add(key)
        elif isinstance(node, (dict, list, tuple)):
            for k, v in _items(node, path):  # the path names a bad key in the error
                visit(v, path + (k,))
    visit(state, ())
    return shared


def flatten(state) -> tuple:
    """(root, slots): the state's structure with TensorSlots, and the slots.

    Raises BadInput for anything that cannot be stored, including a state
    nested deeper than Python's recursion limit or one that contains itself.
    """
    _check_depth(state)
    try:
        return _flatten(state)
    except RecursionError:
        raise Unstorable("the state is nested too deeply or contains itself; "
                         "a state is a tree of dicts, lists and tuples a few hundred levels deep at most",
                         reason="depth") from None


def _flatten(state) -> tuple:
    if sys.byteorder != "little":
        raise BadInput("mvc stores little-endian bytes and does not run on big-endian hosts yet")
    shared = _shared_keys(state)
    groups: dict = {}
    slots: list = []

    def visit(node, path):
        if isinstance(node, torch.Tensor):
            name = _check_tensor(node, path)
            key = storage_key(node)
            if key in shared and key in groups:  # a tied tensor: one slot, stored once
                return groups[key]
            group = len(groups) if key in shared else None
            slot = TensorSlot(path, name, tuple(node.shape), node, group)
            if group is not None:
                groups[key] = slot
            slots.append(slot)
            return slot
        if isinstance(node, dict):
            return {k: visit(v, path + (k,)) for k, v in _items(node, path)}
        if isinstance(node, (list, tuple)):
            children = [visit(v, path + (i,)) for i, v in enumerate(node)]
            return tuple(children) if isinstance(node, tuple) else children
        if isinstance(node, int) and not isinstance(node, bool):
            node = int(node)
            if not encoding.INT_MIN <= node <= encoding.INT_MAX:
                raise Unstorable(f"integer at {format_path(path)!r} does not fit in 64 bits", key=format_path(path),
                                 reason="int-range")
            return node
        for base in _PLAIN:
            if isinstance(node, base):  # subclasses (numpy floats, str enums) store as the base
                return node if type(node) is base else _as_base(base, node)
        where = format_path(path) or "<root>"
        raise Unstorable(
            f"cannot store {type(node).__module__}.{type(node).__qualname__} at {where!r}: "
            "a state holds only tensors, dicts, lists, tuples, None, bool, int, float, str and bytes",
            key=where, reason="type", type=f"{type(node).__module__}.{type(node).__qualname__}"
        )

    root = visit(state, ())
    return root, slots


def dict_metadata(state) -> tuple:
    """((key path, metadata), ...) for each dict of ``state`` that carries
    torch's ``_metadata`` attribute: what ``Module.state_dict()`` sets (module
    prefix -> {"version": N}) and ``load_state_dict`` hands to each module,
    so that one saved by an older version of it can be migrated. Kept as
    plain values, never pickled; Unstorable if it holds anything else. For
    a state ``flatten`` accepted."""
    out, todo = [], [((), state)]
    while todo:
        path, node = todo.pop()
        if isinstance(node, dict):
            meta = getattr(node, "__dict__", {}).get("_metadata")  # dict itself has no __dict__
            if meta is not None:
                out.append((path, _plain_metadata(meta, path)))
            todo.extend((path + (k,), v) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            todo.extend((path + (i,), v) for i, v in enumerate(node))
    return tuple(out)


def _plain_metadata(meta, path: tuple) -> dict:
    """``meta`` as plain dicts; Unstorable unless it is what torch sets (and encodes)."""
    plain = None
    if isinstance(meta, dict) and all(isinstance(m, dict) for m in meta.values()):
        plain = {k: dict(m) for k, m in meta.items()}
    if plain is None or not is_dict_metadata(plain) or not _encodes(plain):
        where = format_path(path + ("_metadata",))
        raise Unstorable(f"{where!r} is not what torch's state_dict() sets (module prefix -> "
                         "{name: None, bool, int, float, str or bytes}); delete the attribute or make it so",
                         key=where, reason="metadata", type=type(meta).__name__)
    return plain


def _encodes(value) -> bool:
    try:
        encoding.pack(value)
    except BadInput:  # an int past 64 bits, text that is not Unicode
        return False
    return True


def with_metadata(state, metadata: tuple):
    """``state`` with each dict that ``metadata`` names replaced by an
    ``OrderedDict`` of the same items whose ``_metadata`` is restored, as
    ``Module.state_dict()`` returns it. Paths that name no dict of ``state``
    (a load of some keys only) are passed over."""
    for path, meta in sorted(metadata, key=lambda item: -len(item[0])):  # inner dicts first: outer ones copy them
        node = traverse.node_at(state, path)
        if type(node) is dict:
            state = _replace_at(state, path, _ordered(node, meta))
    return state


def _ordered(node: dict, meta: dict) -> OrderedDict:
    out = OrderedDict(node)
    out._metadata = OrderedDict((k, dict(m)) for k, m in meta.items())
    return out


def _replace_at(state, path: tuple, new):
    if not path:
        return new
    parent = traverse.node_at(state, path[:-1])
    if type(parent) is tuple:  # tuples are immutable: rebuild this one, and so on up
        items = list(parent)
        items[path[-1]] = new
        return _replace_at(state, path[:-1], tuple(items))
    parent[path[-1]] = new
    return state


def _check_depth(state) -> None:
    if traverse.depth(state) > traverse.MAX_DEPTH:
        raise Unstorable(f"the state is nested more than {traverse.MAX_DEPTH} levels deep or contains itself; "
                         "a state is a tree of dicts, lists and tuples", reason="depth")


def tree_root(node) -> Any:
    """The flattened structure with each TensorSlot replaced by its TensorLeaf."""
    return rebuild(node, lambda slot: TensorLeaf(slot.id, slot.group), TensorSlot)


def rebuild(node, leaf_fn: Callable, leaf_type=TensorLeaf) -> Any:
    """A copy of ``node`` with every ``leaf_type`` leaf replaced by leaf_fn(leaf)."""
    return traverse.rebuild(node, leaf_fn, leaf_type)


def materialize(root, tensors: dict, map_location=None, copy: Callable = torch.clone):
    """The state from its tree and {tensor id: tensor}.

    Leaves of one shared group get one tensor; other leaves with the same id
    get their own ``copy`` of it, so changing one never changes another.
    """
    used, groups = set(), {}

    def take(tid):
        tensor = copy(tensors[tid]) if tid in used else tensors[tid]
        used.add(tid)
        return tensor if map_location is None else tensor.to(map_location)

    def leaf(node: TensorLeaf):
        if node.group is None:
            return take(node.id)
        key = (node.id, node.group)
        if key not in groups:
            groups[key] = take(node.id)
        return groups[key]
    return rebuild(root, leaf)
