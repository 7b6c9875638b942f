"""Commits: a state (or a sharded save's tree) becomes a commit.

Write order makes crashes harmless: ``write_chunks`` hashes every chunk in
threads and writes those the chunk store lacks to a new pack, sealed and
fsynced; only then does ``land``, one index write transaction, publish the
chunks, store the tensor, tree and commit objects, and move the branch by
compare-and-swap against the parent the commit was built on. A crash
before that transaction leaves only unreferenced pack bytes.

Vocabulary:

- **record**: the commit's metadata (message, author, step, epoch,
  metrics, context) as plain values, checked before anything is written.
- **slot**: one tensor of the state being committed (``mvc.state``); its
  ``chunks`` are filled in as it is hashed.

``mvc.state`` and ``mvc.live`` bring torch (about 3.4 s of import on the
machines measured, against 1.1 s for the rest of ``import mvc``), which
commands that only read metadata (log, show, status, fsck ...) do not
need: they are imported inside the verbs that flatten or hash tensors.
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Optional

from . import audit, hashing, ondisk, refs
from .errors import BadInput
from .objects import ID_SIZE, CommitObject, TensorObject, TreeObject, object_id
from .records import Commit, CommitStats
from .store import locks as locking
from .store.chunks import THREADS, batches
from .store.locks import default_author

HASH_BYTES = 8 << 20  # hashed by one thread at a time: amortises task overhead


def now_us() -> int:
    return time.time_ns() // 1000


def to_commit(oid: bytes, obj: CommitObject, stats=None, pruned: bool = False) -> Commit:
    return Commit(oid.hex(), obj.tree.hex(), tuple(p.hex() for p in obj.parents), obj.message,
                  obj.author, obj.time / 1e6, obj.step, obj.epoch, dict(obj.metrics),
                  dict(obj.context), stats, pruned)


def _foreign_types() -> tuple:
    """(0-dim scalar types, types shown as text) of numpy and torch, if loaded.

    Only already-imported modules are asked: a value of a library that is not
    loaded cannot exist.
    """
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    scalars = ((np.generic,) if np else ()) + ((torch.Tensor,) if torch else ())
    text = (Path,) + ((torch.dtype, torch.device) if torch else ())
    return scalars, text


def _plain(value, where: str):
    """Metadata as plain encodable values; numpy/torch scalars become numbers."""
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    scalars, text = _foreign_types()
    if isinstance(value, scalars) and getattr(value, "ndim", 0) == 0:
        return value.item()
    for base in (int, float, str):  # subclasses such as enums store as their base
        if isinstance(value, base):  # str() of a str enum is "Class.NAME", not its value
            return str.__str__(value) if base is str else base(value)
    if isinstance(value, text):
        return str(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if type(k) not in (str, int):
                raise BadInput(f"{where} key {k!r} is not a str or int")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise BadInput(f"{where} holds a {type(value).__name__}; metadata must be plain values")


def _metrics(metrics) -> dict:
    out = {}
    for k, v in (metrics or {}).items():
        v = _plain(v, f"metric {k!r}")
        if type(k) is not str or type(v) not in (int, float):
            raise BadInput(f"metric {k!r} must map a name to a number, not {type(v).__name__}")
        out[k] = v
    return out


def record(message, step, epoch, metrics, context, author: str) -> CommitObject:
    """The commit's record, validated and known to encode, before anything is written.

    Its tree and parents are placeholders until the index transaction.
    """
    for name, value in (("step", step), ("epoch", epoch)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadInput(f"{name} must be an int, not {value!r}")
    if not isinstance(message, str):
        raise BadInput("commit message must be text")
    record = CommitObject(bytes(ID_SIZE), (), message, author, now_us(), step, epoch,
                          _metrics(metrics), _plain(context or {}, "context"))
    record.encode()  # BadInput now (an int over 64 bits, undecodable text), not after the pack
    return record


def encode_tensors(slots: list, chunk_size: int) -> dict:
    """{tensor id: encoded tensor object} for hashed slots; sets each slot's id."""
    out = {}
    for slot in slots:
        data = TensorObject(slot.dtype, slot.shape, chunk_size, tuple(slot.chunks)).encode()
        slot.id = object_id(data)
        out[slot.id] = data
    return out


def _ahead(pool, fn, items: list, window: int) -> Iterator:
    """``pool.map(fn, items)`` keeping at most ``window`` calls in flight, so
    work that allocates (contiguous copies of strided tensors) stays bounded."""
    pending = []
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            yield pending.pop(0).result()
    for future in pending:
        yield future.result()


def target_ref(repo, txn, branch: Optional[str]) -> Optional[str]:
    """The branch ref a commit moves: ``branch`` or HEAD's; None when detached."""
    if branch is not None:
        return refs.BRANCHES + refs.check_name(branch, "branch")
    return repo.refs.head(txn)[0]


def commit(repo, state, message: str = "", *, step: Optional[int] = None,
           epoch: Optional[int] = None, metrics: Optional[dict] = None,
           context: Optional[dict] = None, branch: Optional[str] = None,
           author: Optional[str] = None, rebase: bool = False, start: Optional[str] = None,
           progress: Optional[Callable[[int, int], None]] = None, sign=None) -> Commit:
    """Store ``state`` as a new commit on ``branch`` (default: HEAD's branch).

    A ``branch`` that does not exist yet starts at ``start`` (a revision,
    e.g. "HEAD"), or with a root commit when ``start`` is None.

    The branch moves by compare-and-swap from the tip it had when the
    commit started; if another commit landed meanwhile this raises
    RefConflict, or with ``rebase=True`` commits onto the new tip.
    ``progress(done, total)`` is called with the bytes hashed so far.
    ``sign``: sign the commit (``docs/format.md`` 7.3.1) with a
    ``mvc.signing.SigningKey``, the path of an OpenSSH Ed25519 key file,
    or True for the key in setting ``signing.key``.
    Raises BadInput for a state or metadata that cannot be stored,
    ProtectedRef / LockHeld if the branch may not move, SigningKeyError
    for a key that cannot be used, SignatureRequired for an unsigned
    commit to a branch whose policy requires signatures; in every case
    before any chunk is written.
    """
    from . import state as states  # torch: see the module docstring
    rec = record(message, step, epoch, metrics, context, author or default_author())
    signer = audit.signer(repo, sign)
    me = locking.this_process(rec.author)
    # The shared gc lock covers the first dedup lookup through the index
    # transaction: gc must not delete a chunk this commit chose not to write.
    with repo.gc_lock.shared():
        with repo.index.read() as txn:
            ref = target_ref(repo, txn, branch)
            parent = repo.refs.tip(txn, ref)
            fork = repo.refs.resolve(txn, start) if parent is None and ref and start else None
            repo.refs.check_commit(txn, ref, me)  # before writing chunks, and again below
            audit.check_commit_policy(txn, ref, signer)
        if signer is not None:
            ondisk.require_extension(repo.dir, ondisk.SIGNATURES)
        root, slots = states.flatten(state)
        metadata = states.dict_metadata(state)
        batch, stats = write_chunks(repo, slots, progress)
        # a failure from here on leaves a sealed, unpublished pack: garbage gc reclaims
        tensors = encode_tensors(slots, repo.chunk_size)
        tree_data = encode_tree(repo, states.tree_root(root), metadata)
        with repo.index.write() as txn:
            oid, obj = land(repo, txn, ref, parent, rebase, me, rec, batch.publish, tensors, tree_data, fork,
                         signer=signer)
    return replace(to_commit(oid, obj, stats), branch=refs.short_name(ref) if ref else None)


def encode_tree(repo, root, dict_metadata: tuple = ()) -> bytes:
    """The tree object's bytes. A tree that carries dict metadata names its
    extension in FORMAT first, so an mvc that would drop it refuses the repository."""
    data = TreeObject(root, dict_metadata=dict_metadata).encode()
    if dict_metadata:
        ondisk.require_extension(repo.dir, ondisk.DICT_METADATA)
    return data


def land(repo, txn, ref, parent, rebase: bool, me, record: CommitObject, publish: Callable,
         tensors: dict, tree_data: bytes, fork: Optional[bytes] = None, merged: tuple = (), signer=None) -> tuple:
    """A commit's one index write transaction: compare-and-swap against
    ``parent`` (or onto the tip with ``rebase``), ``publish(txn)`` its
    chunks, store its objects, move ``ref``. A new branch's first commit
    has ``fork`` (its start point), if any, as parent; a merge commit has
    the ``merged`` commits as further parents. Returns (id, CommitObject)."""
    tip = repo.refs.tip(txn, ref) if rebase else repo.refs.expect(txn, ref, parent)
    repo.refs.check_commit(txn, ref, me)
    audit.check_commit_policy(txn, ref, signer)  # again here: sharded saves land through this too
    publish(txn)
    for data in tensors.values():
        repo.objects.put(txn, "tensors", data)
    tree_id = repo.objects.put(txn, "trees", tree_data)
    base = tip or fork  # a new branch forks from its start point
    parents = ((base,) if base else ()) + tuple(dict.fromkeys(p for p in merged if p != base))
    obj = replace(record, tree=tree_id, parents=parents, time=now_us())
    if signer is not None:  # signed last: the time and parents are final only here
        obj = audit.sign_commit(obj, signer)
    oid = repo.objects.put(txn, "commits", obj.encode())
    title = record.message.splitlines()[0] if record.message else ""
    repo.refs.set_if_equals(txn, ref, tip, oid, f"commit: {title}")
    return oid, obj


def write_chunks(repo, slots: list, progress) -> tuple:
    """Hash every chunk (in threads) and write the ones the store lacks as one sealed batch.

    Sets ``slot.chunks``; returns (the sealed batch, CommitStats).

    The work goes in **segments**, (slot, start, end): runs of chunks of one tensor of at most
    HASH_BYTES, several small tensors' segments to a task. A task's ids are looked up with one
    call, a segment's new chunks added and its lists extended with one call each, not one per
    chunk: a commit of millions of small chunks spends its time hashing and writing.
    """
    size = repo.chunk_size
    step = max(size, HASH_BYTES // size * size)
    segments = [(slot, start, min(nbytes, start + step)) for slot, nbytes in ((s, s.nbytes) for s in slots)
                for start in range(0, nbytes, step)]
    for slot in slots:
        slot.chunks = []

    # Chunks whose bytes still fingerprint as when they were last committed
    # or loaded keep their id without BLAKE3 (mvc/live.py: identify).
    from . import live  # torch: see the module docstring
    known, prints = {}, {}
    for slot in slots:
        known[id(slot)], prints[id(slot)] = repo.live.get(slot.tensor), []

    def hash_task(task):
        out = []
        for slot, start, end in task:
            data, rec = slot.bytes(), known[id(slot)]
            out.append([live.identify(rec, data, off, min(size, end - off), size)
                        for off in range(start, end, size)])
        return out

    batch, bytes_new, done = repo.chunks.writer(), 0, 0
    total = sum(s.nbytes for s in slots)
    if progress:
        progress(0, total)  # a bar can show at once, not after the first batch
    try:
        with ThreadPoolExecutor(THREADS) as pool, repo.index.read() as txn:
            work = batches(segments, lambda s: s[2] - s[1], HASH_BYTES)
            for task, results in zip(work, _ahead(pool, hash_task, work, 2 * THREADS)):
                # kept here, not merely listed on a cached remote: a remote gc since its listing
                # may have taken it, and the commit would name a chunk nobody holds
                kept = repo.chunks.kept([r[0] for found in results for r in found], txn)
                for (slot, start, end), found in zip(task, results):
                    view = memoryview(slot.bytes()).cast("B")[start:end]
                    ids = [r[0] for r in found]
                    for i in [i for i, r in enumerate(found) if r[2] and r[0] not in kept]:
                        # gc took a reused id's chunk: the bytes must be written, under their own id
                        ids[i] = hashing.digest(view[i * size:(i + 1) * size])
                        if repo.chunks.keeps(ids[i], txn):
                            kept.add(ids[i])
                    new = [i for i, cid in enumerate(ids) if cid not in kept]
                    slot.chunks += ids
                    prints[id(slot)] += [r[1] for r in found]
                    bytes_new += batch.add_many([ids[i] for i in new], view, size, new)
                    if end == slot.nbytes:
                        slot.release()  # its last chunk: drop a contiguous copy now, not at the end
                    done += end - start
                if progress:
                    progress(done, total)
        batch.seal()
        live.remember(repo.live, slots, prints, size)
    except BaseException as exc:
        batch.abort()
        if isinstance(exc, OSError):  # a full disk, above all: say what failed and that nothing changed
            raise OSError(exc.errno, f"{exc.strerror or exc} while writing a pack in {repo.dir / 'packs'}; "
                                     "nothing was committed") from exc
        raise
    return batch, CommitStats(len(slots), sum(len(s.chunks) for s in slots), batch.count, total, bytes_new)
