"""The reader: every read of tensor bytes goes through here.

``read_tensors`` turns tensor objects into CPU tensors (allocated once, or
given by the caller), each chunk copied into place and verified against
its id by the chunk store; ``read_runs`` is the one call into the store for
tensor bytes, used also by readers that want only some chunks (diff's
windows, a live switch's changed chunks, merge's slices). Built on them:
``load`` (a whole state or the keys ``only`` selects), ``load_keys`` (top
level keys of a dict state), ``read_leaves`` (given tree leaves, in a
transaction of its own: export), ``read_pieces`` (byte ranges of shards:
the DCP reader), ``read_chunk`` (one chunk); ``mvc.live`` (a live switch, ``load_into``) reads
through ``read_tensors`` and ``read_runs``.

Readers hold ``gc_lock.shared()`` and one index read transaction, so gc in
another process cannot move a pack between reading a location and reading
the pack. ``mvc.state`` and ``mvc.live`` bring torch and are imported inside
the functions that build tensors; see ``mvc.commits`` for the measurement.
"""

from typing import Callable, Optional

import numpy as np

from . import refs, sharded
from .errors import BadInput, NoMatch
from .objects import TensorLeaf, TensorObject
from .store.chunks import THREADS, Request
from .traverse import format_path, select, walk


def read_runs(repo, txn, requests: list, progress=None, threads: int = THREADS) -> None:
    """Read each ``Request`` (chunk id, writable buffer, what it is for) verified into its buffer."""
    repo.chunks.read(requests, txn, progress, threads=threads)


def load(repo, rev: str = refs.HEAD, map_location=None,
         progress: Optional[Callable[[int, int], None]] = None, only: Optional[str] = None):
    """The state committed at ``rev``: the same nested structure, CPU tensors.

    ``map_location`` (a device or device string) moves tensors after loading.
    ``only`` (a glob on dotted keys, as ``diff --only``) reads and verifies
    only the matching leaves; see ``mvc.traverse.select`` for the shape of
    what comes back. Every object and chunk is verified against its id;
    ChecksumMismatch names the tensor's key path and the commit.
    CommitPruned if gc retention deleted its tensors. ``progress(done,
    total)`` is called with the bytes read so far.
    """
    from . import state as states  # torch
    # gc must not move or delete a pack between reading a location and reading the pack
    with repo.gc_lock.shared(), repo.index.read() as txn:
        oid = repo.refs.resolve(txn, rev)
        tree = repo.objects.commit_tree(txn, oid)
        root = tree.root if only is None else select(tree.root, only)
        picked = list(walk(root))
        if only is not None and not picked:  # a typo must not load as an empty state
            raise NoMatch(f"no key of commit {oid.hex()[:12]} matches {only!r}", pattern=only, commit=oid.hex())
        leaves = [(p, leaf) for p, leaf in picked if isinstance(leaf, TensorLeaf)]
        tensors = read_tensors(repo, txn, leaves, oid, progress)
    return states.with_metadata(states.materialize(root, tensors, map_location), tree.dict_metadata)


def read_leaves(repo, rev: str, leaves: list, progress=None, into: Optional[dict] = None) -> dict:
    """{tensor id: CPU tensor} for (key path, TensorLeaf) pairs of commit
    ``rev``, read and verified in a transaction of their own; see ``read_tensors``."""
    with repo.gc_lock.shared(), repo.index.read() as txn:
        return read_tensors(repo, txn, leaves, repo.refs.resolve(txn, rev), progress, into)


def read_tensors(repo, txn, leaves: list, commit_id: bytes, progress=None, into: Optional[dict] = None) -> dict:
    """{tensor id: CPU tensor} for (key path, TensorLeaf) pairs, read in threads and verified.

    ``into`` {tensor id: contiguous CPU tensor of the object's dtype and
    shape} receives those tensors' bytes instead of new tensors. The
    caller holds ``gc_lock.shared()`` and the index transaction ``txn``.
    """
    from . import state as states  # torch
    requests, out, scattered = [], {}, []
    for path, leaf in repo.objects.ahead(txn, "tensors", leaves, lambda item: item[1].id):
        if leaf.id in out:
            continue
        obj = repo.objects.tensor(txn, leaf.id)
        given = (into or {}).get(leaf.id)
        if given is not None:
            out[leaf.id], buffer = given, states.buffer_of(given, obj.dtype, obj.shape, format_path(path))
        else:
            out[leaf.id], buffer = states.empty_tensor(obj.shape, obj.dtype)
        what = f"tensor {format_path(path)!r} in commit {commit_id.hex()[:12]}"
        if obj.in_c_order:  # whole, or shards that are runs of rows: read straight into place
            requests += [Request(cid, buffer[off:off + n], what) for cid, off, n in obj.chunk_spans()]
        else:
            scattered.append((out[leaf.id], obj, what))
    total = sum(r.buffer.nbytes for r in requests) + sum(obj.nbytes for _, obj, _ in scattered)
    done = 0
    if progress:
        progress(0, total)

    def step(n):
        nonlocal done
        done += n
        progress(done, total)
    read_runs(repo, txn, requests, step if progress else None)
    for tensor, obj, what in scattered:  # one shard at a time: a shard's worth of memory on top
        read_scattered(repo, txn, tensor, obj, what, step if progress else None)
    return out


def read_chunk(repo, chunk_id: bytes, what: str = "") -> bytes:
    """One chunk's verified bytes; ObjectNotFound / ChecksumMismatch.

    A caller reading many chunks holds ``gc_lock.shared()`` around them,
    so gc in another process cannot move a pack meanwhile.
    """
    with repo.index.read() as txn:
        return repo.chunks.read_one(chunk_id, txn, what)


def read_pieces(repo, ranges: list, what: str = "") -> list:
    """Verified bytes of pieces: for each (TensorObject, piece index, start,
    stop) the bytes [start, stop) of that piece's C-order stream, as a
    uint8 numpy array. Only the chunks holding them are read."""
    requests, out = [], []
    for obj, piece, lo, hi in ranges:
        _, base, spans = sharded.chunk_window(obj, piece, lo, hi)
        buffer = np.empty(sum(n for _, _, n in spans), dtype=np.uint8)
        requests += [Request(cid, buffer[off:off + n], what) for cid, off, n in spans]
        out.append(buffer[lo - base:hi - base])
    with repo.gc_lock.shared(), repo.index.read() as txn:
        read_runs(repo, txn, requests)
    return out


def read_scattered(repo, txn, tensor, obj: TensorObject, what: str, progress) -> None:
    """Read a sharded tensor whose shards are not runs of rows: each shard
    into a buffer of its own, then copied into its box."""
    for i, (offsets, sizes, _, nbytes, _) in enumerate(obj.pieces()):
        _, _, spans = sharded.chunk_window(obj, i, 0, nbytes)
        buffer = np.empty(nbytes, dtype=np.uint8)
        read_runs(repo, txn, [Request(cid, buffer[off:off + n], what) for cid, off, n in spans], progress)
        sharded.scatter(tensor, offsets, sizes, buffer)


def load_keys(repo, rev: str, keys) -> dict:
    """{key: repo.load(rev)[key]} for top-level ``keys`` of a commit whose
    state is a dict, reading only their tensors (a resume reads the small
    parts this way and the sharded model through DCP). Keys the commit
    lacks are left out."""
    from . import state as states  # torch
    with repo.gc_lock.shared(), repo.index.read() as txn:
        oid = repo.refs.resolve(txn, rev)
        tree = repo.objects.commit_tree(txn, oid)
        root = tree.root
        if type(root) is not dict:
            raise BadInput(f"commit {oid.hex()[:12]} holds a {type(root).__name__}, not a dict of keys")
        part = {k: root[k] for k in keys if k in root}
        leaves = [(p, leaf) for p, leaf in walk(part) if isinstance(leaf, TensorLeaf)]
        tensors = read_tensors(repo, txn, leaves, oid)
    inside = tuple((p, m) for p, m in tree.dict_metadata if p)  # the root's own is not part of a part
    return states.with_metadata(states.materialize(part, tensors), inside)
