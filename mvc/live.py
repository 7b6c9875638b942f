"""Loading into live tensors in place (the live version switch), and partial loads.

Vocabulary:

- **targets**: a nested dict shaped like part of a committed state, whose
  leaves are the user's live tensors (``{"model": model.state_dict()}``) or
  objects with ``state_dict``/``load_state_dict`` (``{"model": model,
  "optimizer": opt}``). Only the keys given are touched.
- **record**: per repository, for each live tensor (by its storage, offset,
  shape, strides and dtype), the chunk ids it last received from a load and
  a fingerprint (``mvc.fingerprint``) of each chunk's bytes as written.
- A chunk of a live tensor is **known** to hold id X when its record says X
  and its bytes, fingerprinted now, still match the fingerprint taken of
  the verified bytes of X when they were written. Only known chunks whose id
  the target commit also has are skipped; everything else is read from the
  store and verified. A write of any kind since the last load (autograd,
  ``.data``, a numpy view, DLPack, another thread) changes the bytes and so
  the fingerprint: ``_version`` counters are never trusted.
- **the caller's promise** (``check_live=False``): the caller states that no
  write bypassed torch's version counter since mvc last loaded the tensor
  (no ``.data`` writes, numpy views or DLPack; an evaluation loop that only
  reads the weights). Then a chunk is known on its record's id alone when
  the tensor's ``_version`` is the one recorded after that load, and no live
  byte is read. A tensor whose counter moved (any ordinary in-place op, an
  optimizer step), one last seen by a commit rather than a load, and an
  inference tensor (no counter) are checked by fingerprint as above. The
  promise is the caller's: mvc cannot see the writes it excludes.

Every check (keys, dtypes, shapes) runs before the first byte is written,
and every chunk is read and verified before any live tensor changes, so a
mismatch or a corrupt chunk changes nothing.
"""

import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, Optional

import torch

from . import dtypes, fingerprint, hashing, reader, sharded, state as states
from .errors import BadInput, TargetMismatch
from .objects import TensorLeaf
from .store.chunks import THREADS, Request
from .traverse import format_path, is_container, walk


@dataclass(frozen=True)
class Switch:
    """What ``load_into`` did."""

    commit: str  # hex id of the commit loaded
    tensors: int  # live tensors given
    tensors_updated: int  # live tensors whose bytes changed
    chunks_read: int  # chunks read from the store (verified)
    bytes_read: int
    bytes_skipped: int  # bytes already known to hold the commit's chunks
    values: int  # plain values set (in dicts, or through load_state_dict)


@dataclass(frozen=True)
class _Record:
    chunk_size: int
    chunks: tuple  # chunk ids the tensor's chunks last received
    fingerprints: tuple  # fingerprints of those chunks' verified bytes
    version: int = -1  # the tensor's _version then (-1: unknown); trusted only on the caller's promise


def version_of(t: torch.Tensor) -> int:
    """``t._version``, or -1 for a tensor without a version counter (made under inference mode)."""
    try:
        return t._version
    except RuntimeError:
        return -1


class LiveRecords:
    """What each live tensor last received from this repository (see the module doc)."""

    def __init__(self):
        self._records: dict = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(t: torch.Tensor):
        return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype,
                t.is_conj(), t.is_neg())

    def get(self, t: torch.Tensor) -> Optional[_Record]:
        """The record of ``t``: one kept for the storage ``t`` uses now. A tensor made later at the
        freed address of a recorded one (a new model each round) is not that tensor: no record."""
        with self._lock:
            entry = self._records.get(self.key(t))
        if entry is None:
            return None
        storage, record = entry
        return record if storage is not None and storage() is t.untyped_storage() else None

    def put(self, t: torch.Tensor, record: _Record) -> None:
        try:  # torch keeps one Python object per live storage: it dies with the storage
            storage = weakref.ref(t.untyped_storage())
        except TypeError:
            storage = None  # never trusted (get gives None): its chunks are read again
        with self._lock:
            self._records[self.key(t)] = (storage, record)

    def forget(self, t: torch.Tensor) -> None:
        with self._lock:
            self._records.pop(self.key(t), None)


# -- commits: ids of unchanged chunks without BLAKE3 -------------------------------

def identify(record: Optional[_Record], data, off: int, n: int, chunk_size: int) -> tuple:
    """(chunk id, fingerprint, reused) of ``data[off:off + n]``, chunk ``off // chunk_size``.

    The id is the record's when the bytes' fingerprint equals the one taken of
    bytes that hashed to that id (the chunk is unchanged since it was last
    committed or loaded); otherwise BLAKE3 of the bytes. The fingerprint is
    taken again after hashing and dropped (b"") if the bytes moved meanwhile,
    so a record never pairs an id with a fingerprint of other bytes.
    """
    piece = data[off:off + n]
    fp = fingerprint.fingerprint(piece)
    i = off // chunk_size
    if record is not None and record.chunk_size == chunk_size and i < len(record.chunks) \
            and record.fingerprints[i] == fp:
        return record.chunks[i], fp, True
    cid = hashing.digest(piece)
    return cid, fp if fingerprint.fingerprint(piece) == fp else b"", False


def remember(records: "LiveRecords", slots: list, prints: dict, chunk_size: int) -> None:
    """Record, for each slot's tensor, the ids just committed and their fingerprints."""
    for slot in slots:
        fps = prints.get(id(slot))
        if fps is not None and len(fps) == len(slot.chunks):
            # no version: the bytes were fingerprinted before now, and a write in between would be missed
            records.put(slot.tensor, _Record(chunk_size, tuple(slot.chunks), tuple(fps)))


# -- partial loads --------------------------------------------------------------

# -- the live switch --------------------------------------------------------------

@dataclass
class _Target:
    path: tuple
    live: torch.Tensor
    leaf: TensorLeaf
    obj: Any = None  # the TensorObject, once read
    record: Optional[_Record] = None
    need: list = None  # (chunk index, id, offset, length) to read
    bytes: Any = None  # the live tensor's raw bytes (a view when contiguous on the CPU)


@dataclass
class _Owner:
    """An object with state_dict/load_state_dict among the targets."""

    path: tuple
    obj: Any
    live: dict  # its state_dict()


def _is_stateful(node) -> bool:
    return callable(getattr(node, "state_dict", None)) and callable(getattr(node, "load_state_dict", None))


def _expand(node, path: tuple, owner: Optional[_Owner], tensors: list, values: list, owners: list) -> None:
    if isinstance(node, torch.Tensor):
        tensors.append((path, node, owner))
    elif isinstance(node, dict):
        for k, v in node.items():
            if type(k) not in (str, int):
                raise BadInput(f"target key {k!r} at {format_path(path) or '<root>'!r} is not a str or int")
            _expand(v, path + (k,), owner, tensors, values, owners)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _expand(v, path + (i,), owner, tensors, values, owners)
    elif _is_stateful(node) and owner is None:
        live = node.state_dict()
        if not isinstance(live, dict):
            raise BadInput(f"{format_path(path)!r}: state_dict() returned a {type(live).__name__}, not a dict")
        own = _Owner(path, node, live)
        owners.append(own)
        _expand(live, path, own, tensors, values, owners)
    else:
        values.append((path, node, owner))


def _at(root, path: tuple, commit: str):
    node = root
    for i, key in enumerate(path):
        try:
            if type(node) is dict:
                node = node[key]
            elif type(node) in (list, tuple) and type(key) is int and 0 <= key < len(node):
                node = node[key]
            else:
                raise KeyError(key)
        except KeyError:
            raise TargetMismatch(f"commit {commit[:12]} has no key {format_path(path[:i + 1])!r}; "
                                 "nothing was loaded", id=commit, key=format_path(path[:i + 1]),
                                 problem="no-key") from None
    return node


def load_into(repo, targets, rev: str, check_live: bool = True) -> Switch:
    """Update the live tensors in ``targets`` in place to commit ``rev``; see the
    module doc (``check_live=False`` is the caller's promise).

    Raises BadInput (a key the commit lacks, a dtype or shape mismatch, a
    tensor where the commit has a value or the other way round) and
    ObjectNotFound / ChecksumMismatch / CommitPruned, always before any
    live tensor changes.
    """
    if not isinstance(targets, dict):
        raise BadInput(f"targets must be a dict shaped like the committed state, not a {type(targets).__name__}")
    tensors, values, owners = [], [], []
    _expand(targets, (), None, tensors, values, owners)
    with repo.gc_lock.shared(), repo.index.read() as txn:
        oid = repo.refs.resolve(txn, rev)
        commit = oid.hex()
        tree = repo.objects.commit_tree(txn, oid)
        plan, seen = [], set()
        for path, live, _ in tensors:
            leaf = _at(tree.root, path, commit)
            if not isinstance(leaf, TensorLeaf):
                raise TargetMismatch(f"{format_path(path)!r} is a tensor here but a {type(leaf).__name__} in "
                                     f"commit {commit[:12]}; nothing was loaded", id=commit, key=format_path(path),
                                     problem="kind")
            key = LiveRecords.key(live)
            if key in seen:  # tied weights given twice: one storage, loaded once
                continue
            seen.add(key)
            target = _Target(path, live, leaf, repo.objects.tensor(txn, leaf.id))
            _check(target, commit)
            plan.append(target)
        new_values = _values(tree.root, values, commit)
        fresh_reads = [0, 0]
        saved = _owner_states(tree.root, owners, commit, txn, repo, fresh_reads)
        _plan_reads(repo.live, plan, check_live)
        scratch = _read(repo, txn, plan, commit)
    switch = _apply(repo.live, plan, scratch, new_values, saved, targets, owners, commit, len(tensors))
    return replace(switch, chunks_read=switch.chunks_read + fresh_reads[0],
                   bytes_read=switch.bytes_read + fresh_reads[1])


def _check(target: _Target, commit: str) -> None:
    obj, live, where = target.obj, target.live, format_path(target.path)
    if live.layout != torch.strided or live.device.type == "meta":
        raise TargetMismatch(f"{where!r} is not a dense tensor with data; nothing was loaded", id=commit,
                             key=where, problem="not-dense")
    name = dtypes.name_of(live.dtype, where)
    if name != obj.dtype or tuple(live.shape) != tuple(obj.shape):
        raise TargetMismatch(f"{where!r} is {name} {list(live.shape)} here but {obj.dtype} {list(obj.shape)} in "
                             f"commit {commit[:12]}; nothing was loaded", id=commit, key=where, problem="dtype-shape",
                             here=(name, tuple(live.shape)), committed=(obj.dtype, tuple(obj.shape)))


def _values(root, values: list, commit: str) -> list:
    """(path, committed value, owner) for the plain values among the targets."""
    out = []
    for path, _, owner in values:
        saved = _at(root, path, commit)
        if isinstance(saved, TensorLeaf) or is_container(saved):
            raise TargetMismatch(f"{format_path(path)!r} is a plain value here but not in commit {commit[:12]}; "
                                 "nothing was loaded", id=commit, key=format_path(path), problem="kind")
        out.append((path, saved, owner))
    return out


def _owner_states(root, owners: list, commit: str, txn, repo, fresh_reads: list) -> dict:
    """{owner path: (its committed subtree, {tensor id: tensor} for committed
    tensors its live state lacks, e.g. a fresh optimizer's moments)}; adds the
    chunks and bytes those reads took to ``fresh_reads`` ([chunks, bytes])."""
    out = {}
    for owner in owners:
        saved = _at(root, owner.path, commit)
        live_paths = set()
        _collect_paths(owner.live, owner.path, live_paths)
        absent = [(owner.path + p, leaf) for p, leaf in walk(saved)
                  if isinstance(leaf, TensorLeaf) and owner.path + p not in live_paths]
        out[owner.path] = (saved, reader.read_tensors(repo, txn, absent, bytes.fromhex(commit)) if absent else {})
        for _, leaf in absent:  # read whole: counted in the Switch as chunks and bytes read
            obj = repo.objects.tensor(txn, leaf.id)
            fresh_reads[0] += len(obj.chunks)
            fresh_reads[1] += obj.nbytes
    return out


def _collect_paths(node, path: tuple, out: set) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _collect_paths(v, path + (k,), out)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _collect_paths(v, path + (i,), out)
    else:
        out.add(path)


def _plan_reads(records: LiveRecords, plan: list, check_live: bool = True) -> None:
    """Which chunks of each target must be read: all but those known to hold the commit's ids.

    A chunk is known when the id last loaded into it is the commit's and its
    bytes still fingerprint as they did then (the caller may have written to
    the tensor since, by any means), or, on the caller's promise
    (``check_live=False``), when the tensor's version counter has not moved
    since. One fingerprint pass covers all targets."""
    checks = []  # (target, chunk index, the live bytes)
    known: dict = {}  # id(target) -> indexes of the chunks known to hold the commit's ids
    for target in plan:
        spans = list(target.obj.chunk_spans())
        target.need = [(i, cid, off, n) for i, (cid, off, n) in enumerate(spans)]
        record = records.get(target.live)
        if not target.obj.in_c_order:  # shards cut by columns: the stream is not the tensor's byte order, read it all
            continue
        if record is None or record.chunk_size != target.obj.chunk_size or len(record.chunks) != len(spans):
            continue
        target.record = record
        same = [i for i, (cid, _, _) in enumerate(spans) if record.chunks[i] == cid]
        if not check_live and record.version == version_of(target.live) >= 0:
            known[id(target)] = set(same)
            continue
        target.bytes = states.tensor_bytes(target.live)  # a copy unless contiguous on the CPU
        view = memoryview(target.bytes).cast("B")
        for i in same:
            _, off, n = spans[i]
            checks.append((target, i, view[off:off + n]))
    now = fingerprint.many([piece for _, _, piece in checks], THREADS)
    for (target, i, _), fp in zip(checks, now):
        if fp == target.record.fingerprints[i]:
            known.setdefault(id(target), set()).add(i)
    for target in plan:
        skip = known.get(id(target))
        if skip:
            target.need = [item for item in target.need if item[0] not in skip]


def _read(repo, txn, plan: list, commit: str) -> dict:
    """{id(target): (scratch bytes, [(index, id, offset, length, scratch offset)])}, verified."""
    out, requests = {}, []
    for target in plan:
        size = sum(n for _, _, _, n in target.need)
        if not target.need:
            continue
        scratch = states.empty_tensor((size,), "U8")[1]
        at, items = 0, []
        what = f"tensor {format_path(target.path)!r} in commit {commit[:12]}"
        for i, cid, off, n in target.need:
            requests.append(Request(cid, scratch[at:at + n], what))
            items.append((i, cid, off, n, at))
            at += n
        out[id(target)] = (scratch, items)
    reader.read_runs(repo, txn, requests)
    return out


def _apply(records: LiveRecords, plan: list, scratch: dict, new_values: list, saved: dict, targets: dict,
           owners: list, commit: str, given: int) -> Switch:
    updated = chunks_read = bytes_read = skipped = 0
    for target in plan:
        got = scratch.get(id(target))
        prints = list(target.record.fingerprints) if target.record else [b""] * len(target.obj.chunks)
        if got is not None:
            data, items = got
            if target.bytes is None:
                target.bytes = states.tensor_bytes(target.live)
            raw = target.bytes  # a view of the live tensor when it is contiguous on the CPU, else a copy
            if not target.obj.in_c_order:  # the whole stream was read, in order: copy each shard into its box
                whole = torch.from_numpy(raw).view(target.live.dtype).reshape(target.live.shape)
                for offsets, sizes, start, nbytes, _ in target.obj.pieces():
                    sharded.scatter(whole, offsets, sizes, data[start:start + nbytes])
            else:
                for _, _, off, n, at in items:
                    raw[off:off + n] = data[at:at + n]
            if not (target.live.device.type == "cpu" and target.live.is_contiguous()):
                with torch.no_grad():
                    target.live.copy_(torch.from_numpy(raw).view(target.live.dtype).reshape(target.live.shape))
            fps = fingerprint.fingerprints(data, [(at, n) for _, _, _, n, at in items], THREADS)
            for (i, _, _, _, _), fp in zip(items, fps):
                prints[i] = fp
            updated += 1
            chunks_read += len(items)
            bytes_read += sum(n for _, _, _, n, _ in items)
        skipped += target.obj.nbytes - (sum(n for _, _, _, n, _ in got[1]) if got else 0)
        # the version is trusted (check_live=False) only where the commit's chunks lie where a plain
        # commit of this tensor would put them: a sharded commit's pieces restart their chunking, and
        # column shards stream in another order, so chunk i is not at the tensor's i-th chunk offset
        plain = target.obj.in_c_order and all(off == i * target.obj.chunk_size
                                              for i, (_, off, _) in enumerate(target.obj.chunk_spans()))
        record = _Record(target.obj.chunk_size, target.obj.chunks, tuple(prints),
                         version_of(target.live) if plain else -1)
        records.put(target.live, record)
    return Switch(commit, given, updated, chunks_read, bytes_read, skipped,
                  _set_values(new_values, saved, targets, owners))


def _set_values(new_values: list, saved: dict, targets: dict, owners: list) -> int:
    """Plain values go into their dicts and lists; an owner whose committed
    values differ from its live ones, or whose live state lacks committed
    tensors, gets ``load_state_dict`` of its committed state with its live
    tensors (already updated) in place."""
    count, stale = 0, set()
    for path, value, owner in new_values:
        root, rel = (owner.live, path[len(owner.path):]) if owner else (targets, path)
        parent = root
        for key in rel[:-1]:
            parent = parent[key]
        if parent[rel[-1]] == value and type(parent[rel[-1]]) is type(value):
            continue
        if owner is not None:
            stale.add(owner.path)
        elif type(parent) in (dict, list):
            parent[rel[-1]] = value
            count += 1
    for owner in owners:
        subtree, fresh = saved[owner.path]
        if owner.path in stale or fresh:
            owner.obj.load_state_dict(_merged(subtree, owner.live, fresh))
            count += 1
    return count


def _merged(node, live, fresh: dict):
    """The committed subtree ``node`` with the live tensors where the live state has them."""
    if isinstance(node, TensorLeaf):
        return live if isinstance(live, torch.Tensor) else fresh[node.id].clone()
    if type(node) is dict:
        return {k: _merged(v, live.get(k) if isinstance(live, dict) else None, fresh) for k, v in node.items()}
    if type(node) in (list, tuple):
        items = [_merged(v, live[i] if isinstance(live, (list, tuple)) and i < len(live) else None, fresh)
                 for i, v in enumerate(node)]
        return tuple(items) if type(node) is tuple else items
    return node
