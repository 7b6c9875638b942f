"""Sharded saves: every rank writes its own shards, one coordinator commits.

Vocabulary:

- **piece**: one box of one tensor that one rank holds: per-dimension
  ``offsets`` and ``sizes``, and the ids of the chunks of its C-order bytes,
  chunked from the piece's own first byte. A tensor's pieces tile it.
- **description**: what ``repo.shards.write`` returns on a rank, plain
  data that travels to the coordinator (DCP carries it in
  ``WriteResult.storage_data``): per tensor its dtype, shape and chunk ids,
  and ``locations``, {chunk id: [pack name, offset, length]} of the chunks
  that rank wrote to its own pack.
- **unindexed pack**: a pack a rank sealed whose chunks no index entry names
  yet. It becomes part of the repository when the coordinator's commit
  indexes it; until then gc leaves it alone for its grace period
  (``mvc.gc.GRACE_S``) and fsck lists it as harmless unreferenced bytes.
- **dcp metadata**: what ``torch.distributed.checkpoint`` needs to plan a
  load, kept in the tree object's ``dcp`` field as plain values (no pickle;
  ``docs/format.md`` section 7.2.1): ``items`` {fqn: {"path", "kind"}},
  ``planner_data``, ``storage_meta``, ``version``.

Call order (what "finished" means):

1. coordinator: ``start = repo.shards.begin(branch)`` checks the branch may
   move (lock, protection) and reads its tip, the parent the commit will
   compare-and-swap against; nothing is written.
2. every rank: ``repo.shards.write(tensors)`` hashes, writes only the chunks
   the repository lacks to its own new pack and seals it (fsync). Ranks
   never take the index write lock, so no rank waits on another's I/O.
3. coordinator: ``repo.shards.commit(start, leaves, locations, dcp, ...)``
   checks every named pack is there and sealed and lists each chunk where
   its rank said, then in one index write transaction indexes them, checks
   that every chunk of every tensor is indexed, stores the tensor, tree and
   commit objects and moves the branch by compare-and-swap. That
   transaction is the moment the checkpoint exists; a crash of any rank
   before it leaves the branch where it was and only unindexed packs.
"""

import math
from dataclasses import dataclass
from typing import Any

from . import dtypes, ondisk
from .errors import BadInput, CorruptObject, PiecesDoNotTile, Unreadable
from .objects import ID_SIZE, TensorObject

EXTENSION = ondisk.SHARDED  # the FORMAT extension a repository with sharded commits names
KINDS = ("tensor", "value", "torch-save", "bytes-io")  # what a dcp item is: see docs/format.md 7.2.1


@dataclass(frozen=True)
class ShardedTensor:
    """A tensor of a sharded save, as the coordinator assembles it: dtype,
    shape and its pieces [(offsets, sizes, chunk ids), ...]."""

    dtype: str
    shape: tuple
    pieces: list


def _is_id(value) -> bool:
    return type(value) is bytes and len(value) == ID_SIZE


def _ints(value, n: int) -> bool:
    return type(value) in (list, tuple) and len(value) == n and all(type(x) is int and x >= 0 for x in value)


def tensor_object(t: ShardedTensor, chunk_size: int, where: str) -> TensorObject:
    """The tensor object of ``t``: stored whole when one piece covers it,
    else sharded with its non-empty pieces sorted by offsets.

    BadInput naming ``where`` if the pieces do not tile the tensor or a
    piece's chunk list does not fit its size.
    """
    if not (_ints(t.shape, len(t.shape)) and len(t.shape) <= 64):
        raise BadInput(f"{where}: bad shape {t.shape!r}")
    try:
        item = dtypes.itemsize(dtypes.check_name(t.dtype))
    except CorruptObject:
        raise BadInput(f"{where}: unknown dtype {t.dtype!r}") from None
    shape, pieces = tuple(t.shape), []
    for offsets, sizes, chunks in t.pieces:
        if not (_ints(offsets, len(shape)) and _ints(sizes, len(shape))):
            raise BadInput(f"{where}: a piece has bounds {offsets!r}/{sizes!r} for a tensor of shape {shape}")
        nbytes = math.prod(sizes) * item
        if type(chunks) not in (list, tuple) or not all(_is_id(c) for c in chunks) \
                or len(chunks) != -(-nbytes // chunk_size):
            raise BadInput(f"{where}: a piece of {nbytes} bytes does not have ceil({nbytes}/{chunk_size}) chunk ids")
        if nbytes:  # an empty piece (a rank with no rows of it) holds nothing
            pieces.append((tuple(offsets), tuple(sizes), tuple(chunks)))
    pieces.sort()
    if len(pieces) == 1 and pieces[0][1] == shape:
        obj = TensorObject(t.dtype, shape, chunk_size, pieces[0][2])
    elif not pieces and math.prod(shape) == 0:
        obj = TensorObject(t.dtype, shape, chunk_size, ())
    else:
        obj = TensorObject(t.dtype, shape, chunk_size, tuple(c for _, _, cs in pieces for c in cs),
                           tuple((o, z) for o, z, _ in pieces))
    try:
        return TensorObject.decode(obj.encode())  # the decoder's checks: the pieces tile the tensor
    except (CorruptObject, Unreadable) as exc:  # encode() runs the decoder's checks too
        raise PiecesDoNotTile(f"{where}: the ranks' pieces do not make a tensor of shape {shape}: "
                              f"{getattr(exc, 'reason', exc)}", where=where, shape=shape, field=exc.field) from None


def nest(leaves: dict) -> Any:
    """{key path: leaf} as nested containers: str keys make dicts, int keys lists.

    The state DCP flattened comes back in the shape it had (as far as its
    key paths say; DCP turns every dict key into a str). Paths that do not
    make one structure (a list with holes, a key both a leaf and a parent)
    give a flat dict {dotted key: leaf} instead.
    """
    root: dict = {}
    try:
        for path, leaf in leaves.items():
            _put(root, tuple(path), leaf)
        return _lists(root)
    except (_Clash, TypeError):
        return {".".join(str(k) for k in path): leaf for path, leaf in leaves.items()}


class _Clash(Exception):
    pass


def _put(node: dict, path: tuple, leaf) -> None:
    if not path or type(path[0]) not in (str, int):
        raise _Clash
    for key in path[:-1]:
        child = node.setdefault(key, {})
        if type(child) is not dict or isinstance(child, _Leaf):
            raise _Clash
        node = child
    if path[-1] in node:
        raise _Clash
    node[path[-1]] = _Leaf(leaf)


class _Leaf:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _lists(node):
    """Replace the wrappers by their leaves and int-keyed dicts by lists."""
    if isinstance(node, _Leaf):
        return node.value
    keys = list(node)
    if keys and all(type(k) is int for k in keys):
        if sorted(keys) != list(range(len(keys))):
            raise _Clash
        return [_lists(node[i]) for i in range(len(keys))]
    if any(type(k) is int for k in keys):
        raise _Clash
    return {k: _lists(v) for k, v in node.items()}


def check_dcp(meta) -> dict:
    """The dcp metadata, checked to be what docs/format.md 7.2.1 says; BadInput if not."""
    if type(meta) is not dict or set(meta) != {"items", "planner_data", "storage_meta", "version"}:
        raise BadInput("dcp metadata must be a map of items, planner_data, storage_meta and version")
    if type(meta["items"]) is not dict or not all(type(k) is str for k in meta["items"]):
        raise BadInput("dcp metadata items must map fully qualified names to entries")
    for fqn, item in meta["items"].items():
        if type(item) is not dict or set(item) != {"path", "kind"} or item["kind"] not in KINDS \
                or type(item["path"]) is not list or not item["path"] \
                or not all(type(k) in (str, int) for k in item["path"]):
            raise BadInput(f"dcp metadata item {fqn!r} must be {{path: [keys], kind: {'|'.join(KINDS)}}}")
    if meta["version"] is not None and type(meta["version"]) is not str:
        raise BadInput("dcp metadata version must be text or nil")
    if meta["storage_meta"] is not None and type(meta["storage_meta"]) is not dict:
        raise BadInput("dcp metadata storage_meta must be a map or nil")
    return meta


def chunk_window(obj: TensorObject, piece: int, start: int, stop: int) -> tuple:
    """(first chunk index, its byte offset in the piece, chunk spans) of the
    chunks holding bytes [start, stop) of piece ``piece``'s stream."""
    offsets, sizes, _, nbytes, first = obj.pieces()[piece]
    if not 0 <= start <= stop <= nbytes:
        raise BadInput(f"bytes {start}..{stop} are outside a piece of {nbytes} bytes")
    size = obj.chunk_size
    lo, hi = start // size, -(-stop // size) if stop > start else start // size
    spans = [(obj.chunks[first + i], i * size - lo * size, min(size, nbytes - i * size)) for i in range(lo, hi)]
    return first + lo, lo * size, spans


def scatter(full, offsets: tuple, sizes: tuple, data) -> None:
    """Copy a piece's C-order bytes ``data`` (uint8) into its box of tensor ``full``."""
    import torch
    piece = torch.frombuffer(data, dtype=torch.uint8).view(full.dtype).reshape(sizes) if len(data) else None
    if piece is None:
        return
    box = full
    for dim, (o, z) in enumerate(zip(offsets, sizes)):
        box = box.narrow(dim, o, z)
    box.copy_(piece)
