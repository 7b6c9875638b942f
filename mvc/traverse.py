"""Traversal of nested states and trees: the one home for walking them.

A **node** is a dict (str or int keys), list or tuple of nodes, or a leaf
(a tensor, a tree's TensorLeaf, or a plain value). A **key path** is the
tuple of keys and indices from the root to a node; users see it joined
with dots (``format_path``). Dicts are visited in canonical key order
(int keys ascending, then str keys), the order tree ids are computed in.

``MAX_DEPTH`` bounds how deep a state may nest: checked at commit, so every
state mvc stores can also be read back, checked and exported.
"""

import fnmatch
import sys
from typing import Any, Callable, Iterator

from .encoding import key_order

MAX_DEPTH = 256


ROOT_KEY = "<root>"  # how the empty path (a state that is one bare tensor) is shown


def format_path(path: tuple) -> str:
    """A key path as users see it: keys joined with dots; ``<root>`` for the empty path."""
    return ".".join(str(k) for k in path) if path else ROOT_KEY


def is_container(node) -> bool:
    """Dicts, subclasses too (an ``OrderedDict`` state_dict, as torch.load
    returns one), lists and tuples."""
    return isinstance(node, dict) or type(node) in (list, tuple)


def children(node) -> list:
    """(key, child) pairs of a container, dict keys in canonical order."""
    if isinstance(node, dict):
        return [(k, node[k]) for k in sorted(node, key=key_order)]
    return list(enumerate(node))


def node_at(root, path) -> Any:
    """The node at key path ``path`` under ``root``; None where no node is there."""
    node = root
    for key in path:
        if type(node) is dict and key in node:
            node = node[key]
        elif type(node) in (list, tuple) and type(key) is int and 0 <= key < len(node):
            node = node[key]
        else:
            return None
    return node


def walk(node, path: tuple = ()) -> Iterator[tuple]:
    """(key path, leaf) for every leaf under ``node``, in key order."""
    if is_container(node):
        for k, v in children(node):
            yield from walk(v, path + (k,))
    else:
        yield path, node


def rebuild(node, leaf_fn: Callable, leaf_type=None, path: tuple = ()) -> Any:
    """A copy of ``node`` with each leaf of ``leaf_type`` (every non-container
    when None) replaced by ``leaf_fn(leaf)``; other leaves are kept as they are.
    Containers keep their kind (tuples stay tuples)."""
    if leaf_type is not None and isinstance(node, leaf_type):
        return leaf_fn(node)
    t = type(node)
    if t is dict:
        return {k: rebuild(v, leaf_fn, leaf_type) for k, v in node.items()}
    if t is list:
        return [rebuild(v, leaf_fn, leaf_type) for v in node]
    if t is tuple:
        return tuple(rebuild(v, leaf_fn, leaf_type) for v in node)
    return leaf_fn(node) if leaf_type is None else node


def map_leaves(node, fn: Callable) -> Any:
    """A copy of ``node`` with every leaf replaced by ``fn(leaf)``. Unlike
    ``rebuild`` it accepts what users hand in: dict subclasses (an
    ``OrderedDict`` state_dict) come back as dicts, list and tuple subclasses
    as lists and tuples."""
    if isinstance(node, dict):
        return {k: map_leaves(v, fn) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = [map_leaves(v, fn) for v in node]
        return tuple(items) if isinstance(node, tuple) else items
    return fn(node)


def depth(node, limit: int = MAX_DEPTH) -> int:
    """How deep containers nest under ``node`` (a leaf is 0), counting only up to ``limit + 1``."""
    best, todo = 0, [(node, 0)]
    while todo:
        current, level = todo.pop()
        if level > limit:
            return level
        best = max(best, level)
        if isinstance(current, (dict, list, tuple)):
            todo.extend((v, level + 1) for v in (current.values() if isinstance(current, dict) else current))
    return best


def storage_key(t) -> Any:
    """What two tensors share exactly when they are the same view of the same
    storage (tied weights); None for tensors that cannot be tied."""
    if t.is_nested or t.numel() == 0 or t.layout != sys.modules["torch"].strided:  # a tensor exists: torch is loaded
        return None
    # a conjugate or negative view reads the same memory as other values: not the same tensor
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype,
            t.is_conj(), t.is_neg())


def select(root, only: str):
    """The tree ``root`` cut to the leaves whose dotted key matches the glob ``only``.

    Dicts keep only keys that lead to a match; a list or tuple that leads to
    one keeps its length, with None for items that lead to none. The root
    itself is always kept (empty when nothing matches).
    """
    def cut(node, path):
        if not is_container(node):
            return node if fnmatch.fnmatchcase(format_path(path), only) else _NONE
        if type(node) is dict:
            kept = {k: cut(v, path + (k,)) for k, v in node.items()}
            kept = {k: v for k, v in kept.items() if v is not _NONE}
            return kept if kept or not path else _NONE
        items = [cut(v, path + (i,)) for i, v in enumerate(node)]
        if all(v is _NONE for v in items) and path:
            return _NONE
        items = [None if v is _NONE else v for v in items]
        return tuple(items) if type(node) is tuple else items
    out = cut(root, ())
    return out if out is not _NONE else None


_NONE = object()
