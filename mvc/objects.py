"""The objects mvc stores, and their canonical encodings.

- **tensor**: dtype, shape, the chunk size it was split with, and the ids of
  its chunks (runs of at most ``chunk_size`` bytes of its raw little-endian
  data, starting at its first byte).
- **shard** (of a sharded tensor): a box of a tensor (per-dimension offsets
  and sizes) whose elements, in C order, one rank saved. A sharded tensor
  lists its shards, sorted by offsets; its chunks are each shard's chunks in
  turn, every shard chunked from its own first byte. Its **stream** is the
  shards' bytes one after the other; ``in_c_order`` when that is the
  tensor's own C-order bytes (every shard a contiguous run of rows).
- **tree**: the structure of a state, and for a sharded (DCP) save its
  ``dcp`` metadata as plain values (``mvc/sharded.py``). Dicts (str or int keys), lists,
  tuples and plain values (None, bool, int, float, str, bytes) are kept as
  they are; each tensor is a ``TensorLeaf`` naming a tensor object. Dicts
  that carried torch's ``_metadata`` attribute (a ``Module.state_dict()``)
  have it in ``dict_metadata``, by key path, as plain values.
- **commit**: tree id, parent ids, message, author, time and the training
  record (step, epoch, metrics, context); optionally a signature over the
  rest (its **payload**).
- **tag** (signed tags only): name, target commit, tagger, time, message,
  signature.

Each object encodes itself as a canonical msgpack map with a ``type`` field
(see ``docs/format.md``); its id is the BLAKE3 digest of those bytes. Each
``decode`` checks what it reads and raises only ``CorruptObject``, also for
bytes that are not the canonical encoding of what they decode to (one object,
one id: a re-encoded signed commit is not a second commit); each
``encode`` runs its own ``decode`` on what it made, so an object no read
accepts is a ``BadInput`` before it is written, never a commit that cannot
be read.
"""

import math
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import msgpack
import numpy as np

from . import dtypes, encoding, hashing
from .encoding import Ext
from .errors import CorruptObject, Unreadable
from .traverse import format_path, node_at, walk  # noqa: F401  (re-exported: trees are walked with these)

ID_SIZE = hashing.DIGEST_SIZE
EXT_TUPLE = 1
EXT_TENSOR = 2
EXT_SHARED_TENSOR = 3
MAX_DIMS = 64
MAX_READ_CHUNK = 2**32 - 1  # what a reader accepts: a pack record's length is a u32
MAX_EXTENT = 2**63 - 1  # torch sizes and strides tensors with int64


def object_id(data: bytes) -> bytes:
    return hashing.digest(data)


def shape_problem(dtype: str, shape) -> str:
    """Why a tensor of ``dtype`` and ``shape`` cannot be read back ("" if it can):
    the limits ``TensorObject.decode`` applies, checked before anything is written."""
    if len(shape) > MAX_DIMS:
        return f"it has {len(shape)} dimensions, more than {MAX_DIMS}"
    # counting empty dimensions as 1 bounds the strides too, which torch computes even for no elements
    if math.prod(max(d, 1) for d in shape) * dtypes.itemsize(dtype) > MAX_EXTENT:
        return "its shape is too large for int64 sizes and strides"
    return ""


def _readable(data: bytes, decode, kind: str, check: bool = True) -> bytes:
    """``data`` if ``decode`` accepts it: what no read could decode is never written."""
    if not check:
        return data
    try:
        decode(data)
    except CorruptObject as exc:
        raise Unreadable(f"this {kind} could not be read back once stored ({exc}); nothing was written",
                         kind=kind, reason=str(exc), field=exc.field) from None
    return data


def _check(cond: bool, what: str, kind=None, field=None) -> None:
    if not cond:
        raise CorruptObject(what, kind=kind, field=field)


def _is_id(value) -> bool:
    return type(value) is bytes and len(value) == ID_SIZE


def _decode_map(data: bytes, kind: str) -> dict:
    value = encoding.unpack(data, f"{kind} object", kind, canonical=True)
    _check(type(value) is dict, f"{kind} object is not a map", kind)
    _check(value.get("type") == kind, f"object is not a {kind} (type {value.get('type')!r})", kind, "type")
    return value


def _fields(value: dict, kind: str, names: set) -> None:
    _check(set(value) == names, f"{kind} object has fields {sorted(map(str, value))}, expected {sorted(names)}", kind, "fields")


@dataclass(frozen=True)
class TensorObject:
    dtype: str
    shape: tuple
    chunk_size: int
    chunks: tuple
    shards: tuple = ()  # ((offsets, sizes), ...) sorted by offsets; () for a tensor stored whole

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * dtypes.itemsize(self.dtype)

    def pieces(self) -> list:
        """(offsets, sizes, stream start, nbytes, first chunk index) of each shard;
        one piece covering the tensor when it is stored whole."""
        boxes = self.shards or ((tuple(0 for _ in self.shape), tuple(self.shape)),)
        item, out, start, first = dtypes.itemsize(self.dtype), [], 0, 0
        for offsets, sizes in boxes:
            n = math.prod(sizes) * item
            out.append((offsets, sizes, start, n, first))
            start += n
            first += -(-n // self.chunk_size)
        return out

    def chunk_spans(self) -> Iterator[tuple]:
        """(chunk id, byte offset in the stream, length) for each chunk.

        The stream is the tensor's raw bytes unless it is sharded and not
        ``in_c_order``; then it is its shards' bytes one after the other.
        """
        for _, _, start, n, first in self.pieces():
            for i, off in enumerate(range(0, n, self.chunk_size)):
                yield self.chunks[first + i], start + off, min(self.chunk_size, n - off)

    @property
    def in_c_order(self) -> bool:
        """Whether the stream is the tensor's C-order bytes (no shard needs scattering)."""
        return all(_contiguous(offsets, sizes, self.shape) for offsets, sizes in self.shards)

    def encode(self, check: bool = True) -> bytes:
        """The canonical bytes; Unreadable if the decoder would refuse them (``check``
        False skips that: only for tests that forge damage)."""
        fields = {"type": "tensor", "dtype": self.dtype, "shape": list(self.shape),
                  "chunk_size": self.chunk_size, "chunks": list(self.chunks)}
        if self.shards:  # absent for a whole tensor: its bytes stay what format 1 wrote
            fields["shards"] = [[list(o), list(z)] for o, z in self.shards]
        return _readable(encoding.pack(fields), TensorObject.decode, "tensor", check)

    @classmethod
    def decode(cls, data: bytes) -> "TensorObject":
        return cls._checked(_decode_map(data, "tensor"))

    @classmethod
    def _checked(cls, v: dict, count=None) -> "TensorObject":
        """The tensor the decoded map ``v`` holds, checked. ``count``: how many chunk ids were
        taken out of ``v`` and checked apart (``decode_tensor_ids``; ``v``'s own list is then
        empty), None when ``v`` holds them."""
        base = {"type", "dtype", "shape", "chunk_size", "chunks"}
        _fields(v, "tensor", base | {"shards"} if "shards" in v else base)
        dtype, shape, size, chunks = v["dtype"], v["shape"], v["chunk_size"], v["chunks"]
        dtypes.check_name(dtype)
        _check(type(shape) is list and len(shape) <= MAX_DIMS, "tensor shape is not a list of dims", "tensor", "shape")
        _check(all(type(d) is int and d >= 0 for d in shape), "tensor shape has a bad dimension", "tensor", "shape")
        _check(type(size) is int and 0 < size <= MAX_READ_CHUNK, "tensor chunk_size is not between 1 and 2**32-1",
               "tensor", "chunk_size")
        problem = shape_problem(dtype, shape)
        _check(not problem, f"tensor shape is not readable: {problem}", "tensor", "shape")
        _check(type(chunks) is list and all(_is_id(c) for c in chunks), "tensor chunks are not ids", "tensor", "chunks")
        shards = _decode_shards(v["shards"], tuple(shape)) if "shards" in v else ()
        obj = cls(dtype, tuple(shape), size, tuple(chunks), shards)
        expected = sum(-(-n // size) for _, _, _, n, _ in obj.pieces())
        _check((len(chunks) if count is None else count) == expected, "tensor chunk count does not match its size",
               "tensor", "chunks")
        return obj


ID_ARRAY = np.dtype(f"S{ID_SIZE}")  # as mvc.store.idarray holds ids
_ID_ITEM = 2 + ID_SIZE  # a chunk id in a tensor object: bin 8 (0xc4), length 32, the id


def decode_tensor_ids(data: bytes) -> tuple:
    """(the tensor, its chunk ids as one numpy array of ``S32``): what ``TensorObject.decode``
    gives, for walks over millions of chunks. The tensor's ``chunks`` is () (its ids are the
    array's). CorruptObject exactly where ``decode`` raises one.

    A tensor object's list of ids is most of its bytes, and decoding it makes a Python bytes
    object per chunk. Here the list is checked as the bytes it must be (the canonical array
    header, then per id the bin 8 header of a 32-byte string: its canonical encoding) and
    copied out in one go; the rest of the object, with an empty list in its place, goes through
    ``decode``'s own checks (a canonical list of ids spliced out of a canonical encoding leaves
    one). Anything else takes ``decode`` itself, so its error is the one decode raises."""
    found = _spliced_ids(data)
    if found is not None:
        spliced, count, ids = found
        try:
            v = _decode_map(spliced, "tensor")
            if type(v.get("chunks")) is list and not v["chunks"]:
                return TensorObject._checked(v, count), ids
        except CorruptObject:
            pass  # decode says why
    obj = TensorObject.decode(data)
    return replace(obj, chunks=()), np.frombuffer(b"".join(obj.chunks), dtype=ID_ARRAY)


def _spliced_ids(data: bytes):
    """(``data`` with its map's "chunks" array emptied, how many ids it held, the ids) when that
    array is a canonical array of 32-byte strings; else None."""
    try:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=encoding.Ext)
        unpacker.feed(data[:256])  # a canonical tensor's chunks come second, after its chunk size
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() != "chunks":
                unpacker.skip()
                continue
            at = unpacker.tell()
            count = unpacker.read_array_header()
            start = unpacker.tell()
            break
        else:
            return None
    except Exception:  # malformed, or not in the first bytes: decode says why
        return None
    if start - at != (1 if count < 16 else 3 if count < 1 << 16 else 5):  # canonical: the shortest form
        return None
    end = start + count * _ID_ITEM
    if end > len(data):
        return None
    items = np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start).reshape(count, _ID_ITEM)
    if not ((items[:, 0] == 0xc4) & (items[:, 1] == ID_SIZE)).all():
        return None
    ids = np.ascontiguousarray(items[:, 2:]).view(ID_ARRAY).reshape(count)
    return b"".join((data[:at], b"\x90", data[end:])), count, ids


def _contiguous(offsets: tuple, sizes: tuple, shape: tuple) -> bool:
    """Whether a box's elements are one run of the tensor's C-order elements:
    whole in every dimension after the first one it cuts, one wide before it."""
    cut = next((d for d in range(len(shape)) if sizes[d] != shape[d]), len(shape))
    return all(sizes[d] == 1 for d in range(cut)) and all(sizes[d] == shape[d] for d in range(cut + 1, len(shape)))


def _decode_shards(value, shape: tuple) -> tuple:
    """Shards as ((offsets, sizes), ...), checked to tile the tensor exactly."""
    _check(type(value) is list and len(value) >= 2, "tensor shards are not a list of at least two boxes", "tensor", "shards")
    boxes = []
    for box in value:
        _check(type(box) is list and len(box) == 2 and all(type(p) is list and len(p) == len(shape) for p in box),
               "a tensor shard is not [offsets, sizes] with one entry per dimension", "tensor", "shards")
        offsets, sizes = box
        _check(all(type(x) is int for x in offsets + sizes), "a tensor shard has a non-integer bound", "tensor", "shards")
        _check(all(o >= 0 and z >= 1 and o + z <= d for o, z, d in zip(offsets, sizes, shape)),
               "a tensor shard is empty or lies outside the tensor", "tensor", "shards")
        boxes.append((tuple(offsets), tuple(sizes)))
    _check(boxes == sorted(boxes), "tensor shards are not sorted by offsets", "tensor", "shards")
    _check(sum(math.prod(z) for _, z in boxes) == math.prod(shape), "tensor shards do not add up to the tensor", "tensor", "shards")
    _check(not _overlap(boxes, shape), "tensor shards overlap", "tensor", "shards")
    return tuple(boxes)


def _overlap(boxes: list, shape: tuple) -> bool:
    """Whether any two boxes share an element (they add up to the tensor, so
    disjoint means they tile it)."""
    if all(_contiguous(o, z, shape) for o, z in boxes):  # runs of C order: sorted, so neighbours suffice
        runs = [(_linear(o, shape), math.prod(z)) for o, z in boxes]
        return any(a + n > b for (a, n), (b, _) in zip(runs, runs[1:]))
    for i, (oi, zi) in enumerate(boxes):
        for oj, zj in boxes[i + 1:]:
            if all(a < b + m and b < a + n for a, n, b, m in zip(oi, zi, oj, zj)):
                return True
    return False


def _linear(offsets: tuple, shape: tuple) -> int:
    index = 0
    for o, d in zip(offsets, shape):
        index = index * d + o
    return index


@dataclass(frozen=True)
class TensorLeaf:
    """A tensor in a tree. Leaves with the same ``group`` share storage."""

    id: bytes
    group: Any = None


def _encode_node(node) -> Any:
    if isinstance(node, TensorLeaf):
        if node.group is None:
            return Ext(EXT_TENSOR, node.id)
        return Ext(EXT_SHARED_TENSOR, node.id + struct.pack(">I", node.group))
    if type(node) is tuple:
        return Ext(EXT_TUPLE, encoding.pack([_encode_node(v) for v in node]))
    if type(node) is list:
        return [_encode_node(v) for v in node]
    if type(node) is dict:
        return {k: _encode_node(v) for k, v in node.items()}
    return node


_PLAIN = (type(None), bool, int, float, str, bytes)


def _decode_node(node) -> Any:
    t = type(node)
    if t in _PLAIN:
        return node
    if t is list:
        return [_decode_node(v) for v in node]
    if t is dict:
        _check(all(type(k) in (int, str) for k in node), "tree has a map key that is not str or int", "tree", "root")
        return {k: _decode_node(v) for k, v in node.items()}
    if t is Ext:
        if node.code == EXT_TUPLE:
            inner = encoding.unpack(node.data, "tuple in tree", "tree", "root", canonical=True)
            _check(type(inner) is list, "tuple in tree is not an array", "tree", "root")
            return tuple(_decode_node(v) for v in inner)
        if node.code == EXT_TENSOR:
            _check(len(node.data) == ID_SIZE, "tensor leaf has a bad id", "tree", "root")
            return TensorLeaf(node.data)
        if node.code == EXT_SHARED_TENSOR:
            _check(len(node.data) == ID_SIZE + 4, "shared tensor leaf has a bad payload", "tree", "root")
            return TensorLeaf(node.data[:ID_SIZE], struct.unpack(">I", node.data[ID_SIZE:])[0])
    raise CorruptObject(f"tree holds an unknown value ({t.__name__})", kind="tree", field="root")


@dataclass(frozen=True)
class TreeObject:
    root: Any
    dcp: Any = None  # a sharded save's DCP metadata (plain values, see mvc/sharded.py); None otherwise
    # ((key path of a dict in root, its torch ``_metadata``), ...) in key order; see mvc/state.py
    dict_metadata: tuple = ()

    def encode(self, check: bool = True) -> bytes:
        """The canonical bytes; Unreadable if the decoder would refuse them (``check``
        False skips that: only for tests that forge damage)."""
        fields = {"type": "tree", "root": _encode_node(self.root)}
        if self.dcp is not None:
            fields["dcp"] = self.dcp
        if self.dict_metadata:  # absent when there is none: those trees keep the bytes of format 1
            fields["dict_metadata"] = [[list(p), m] for p, m in sorted(self.dict_metadata, key=_path_order)]
        return _readable(encoding.pack(fields), TreeObject.decode, "tree", check)

    @classmethod
    def decode(cls, data: bytes) -> "TreeObject":
        v = _decode_map(data, "tree")
        _fields(v, "tree", {"type", "root"} | ({"dcp"} & v.keys()) | ({"dict_metadata"} & v.keys()))
        _check("dcp" not in v or type(v["dcp"]) is dict, "tree dcp metadata is not a map", "tree", "dcp")
        try:
            root = _decode_node(v["root"])
        except RecursionError:
            raise CorruptObject("tree object is nested too deeply", kind="tree", field="root") from None
        return cls(root, v.get("dcp"), _decode_dict_metadata(v["dict_metadata"], root) if "dict_metadata" in v else ())


_SCALARS = (type(None), bool, int, float, str, bytes)


def _path_order(item) -> tuple:
    return tuple(encoding.key_order(k) for k in item[0])


def is_dict_metadata(value) -> bool:
    """Whether ``value`` has the shape of torch's ``_metadata``: str -> {str: scalar}."""
    return type(value) is dict and all(
        type(k) is str and type(m) is dict and all(type(n) is str and type(x) in _SCALARS for n, x in m.items())
        for k, m in value.items())


def _decode_dict_metadata(value, root) -> tuple:
    _check(type(value) is list and len(value) > 0 and all(type(i) is list and len(i) == 2 for i in value),
           "tree dict_metadata is not a non-empty array of [path, metadata] pairs", "tree", "dict_metadata")
    pairs = [(i[0], i[1]) for i in value]
    for path, meta in pairs:
        _check(type(path) is list and all(type(k) in (int, str) for k in path) and is_dict_metadata(meta),
               "tree dict_metadata holds a bad path or metadata", "tree", "dict_metadata")
        _check(type(node_at(root, path)) is dict, f"tree dict_metadata names {format_path(tuple(path))!r}, "
               "which is not a map of the tree", "tree", "dict_metadata")
    order = [_path_order(p) for p in pairs]
    _check(all(a < b for a, b in zip(order, order[1:])), "tree dict_metadata paths are not in key order, or repeat",
           "tree", "dict_metadata")
    return tuple((tuple(path), meta) for path, meta in pairs)


_COMMIT_FIELDS = {"type", "tree", "parents", "message", "author", "time",
                  "step", "epoch", "metrics", "context"}


@dataclass(frozen=True)
class CommitObject:
    tree: bytes
    parents: tuple
    message: str
    author: str
    time: int  # microseconds since the Unix epoch, UTC
    step: Any = None
    epoch: Any = None
    metrics: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)
    signature: bytes = b""  # an SSHSIG over payload() (extension signatures); b"": unsigned

    def _fields(self) -> dict:
        return {
            "type": "commit", "tree": self.tree, "parents": list(self.parents),
            "message": self.message, "author": self.author, "time": self.time,
            "step": self.step, "epoch": self.epoch, "metrics": self.metrics,
            "context": self.context,
        }

    def payload(self) -> bytes:
        """What a signature covers: the encoding without ``signature`` (an unsigned commit's bytes)."""
        return encoding.pack(self._fields())

    def encode(self, check: bool = True) -> bytes:
        """The canonical bytes; Unreadable if the decoder would refuse them (``check``
        False skips that: only for tests that forge damage)."""
        fields = self._fields()
        if self.signature:  # absent when unsigned: those bytes stay what format 1 wrote
            fields["signature"] = self.signature
        return _readable(encoding.pack(fields), CommitObject.decode, "commit", check)

    @classmethod
    def decode(cls, data: bytes) -> "CommitObject":
        v = _decode_map(data, "commit")
        _fields(v, "commit", _COMMIT_FIELDS | {"signature"} if "signature" in v else _COMMIT_FIELDS)
        _check("signature" not in v or _is_signature(v["signature"]), "commit signature is not a signature blob", "commit", "signature")
        _check(_is_id(v["tree"]), "commit tree is not an id", "commit", "tree")
        _check(type(v["parents"]) is list and all(_is_id(p) for p in v["parents"]), "commit parents are not ids", "commit", "parents")
        _check(type(v["message"]) is str and type(v["author"]) is str, "commit message or author is not text", "commit",
               "message" if type(v["message"]) is not str else "author")
        _check(type(v["time"]) is int, "commit time is not an int", "commit", "time")
        for name in ("step", "epoch"):
            _check(v[name] is None or type(v[name]) is int, f"commit {name} is not an int", "commit", name)
        metrics = v["metrics"]
        _check(type(metrics) is dict and all(type(k) is str and type(x) in (int, float) for k, x in metrics.items()),
               "commit metrics are not a map of numbers", "commit", "metrics")
        _check(type(v["context"]) is dict, "commit context is not a map", "commit", "context")
        return cls(v["tree"], tuple(v["parents"]), v["message"], v["author"], v["time"],
                   v["step"], v["epoch"], metrics, v["context"], v.get("signature", b""))


MAX_SIGNATURE = 8 << 10


def _is_signature(value) -> bool:
    return type(value) is bytes and 0 < len(value) <= MAX_SIGNATURE


_TAG_FIELDS = {"type", "name", "target", "tagger", "time", "message"}


@dataclass(frozen=True)
class TagObject:
    """A signed tag: the tag's name, the commit it names, who tagged it and when,
    a message, and a signature over ``payload()``. Kept beside the tag's ref
    (``docs/format.md`` 7.4); a tag without one is a plain ref."""

    name: str
    target: bytes
    tagger: str
    time: int  # microseconds since the Unix epoch, UTC
    message: str = ""
    signature: bytes = b""

    def _fields(self) -> dict:
        return {"type": "tag", "name": self.name, "target": self.target, "tagger": self.tagger,
                "time": self.time, "message": self.message}

    def payload(self) -> bytes:
        return encoding.pack(self._fields())

    def encode(self) -> bytes:
        fields = self._fields()
        if self.signature:
            fields["signature"] = self.signature
        return encoding.pack(fields)

    @classmethod
    def decode(cls, data: bytes) -> "TagObject":
        v = _decode_map(data, "tag")
        _fields(v, "tag", _TAG_FIELDS | {"signature"} if "signature" in v else _TAG_FIELDS)
        _check(type(v["name"]) is str and type(v["tagger"]) is str and type(v["message"]) is str,
               "tag name, tagger or message is not text", "tag")
        _check(_is_id(v["target"]), "tag target is not an id", "tag", "target")
        _check(type(v["time"]) is int, "tag time is not an int", "tag", "time")
        _check("signature" not in v or _is_signature(v["signature"]), "tag signature is not a signature blob", "tag", "signature")
        return cls(v["name"], v["target"], v["tagger"], v["time"], v["message"], v.get("signature", b""))
