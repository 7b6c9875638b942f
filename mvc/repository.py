"""The repository: the store, the objects and the refs composed, and every verb.

Write order makes crashes harmless: chunks go to a new pack through the
chunk store, the pack is sealed and fsynced, and only then does one index
write transaction publish the chunks, store the tensor, tree and commit
objects, and move the branch by compare-and-swap against the parent the
commit was built on. A crash before that transaction leaves only
unreferenced pack bytes. Every object and chunk read back is verified
against its id.

The higher verbs (fsck, gc, diff, bisect, export) live in their own modules
and take the repository; the methods here are their one public surface.
"""

import errno
import itertools
import os
import secrets
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Optional

from . import audit as _audit
from . import bisect as _bisect
from . import diff as _diff
from . import exchange as _exchange
from . import history as _history
from . import reach as _reach
from . import fsck as _fsck
from . import gc as _gc
from . import repack as _repack
from . import hashing, refs
from . import sharded as _sharded
from .errors import BadInput, CorruptObject, MvcError, NotARepository, RepositoryExists, UnknownRevision, UnsupportedFormat
from .objects import ID_SIZE, CommitObject, TensorLeaf, TensorObject, TreeObject, object_id
from .records import Commit, CommitStats, Entry, Export, Head, Ref, Status
from .store import fs, locks as locking
from .store.chunks import THREADS, PackStore, Request, batches
from .store.index import Index, RefValue, read_only
from .store.locks import BranchLock, GcLock, default_author
from .store.objectstore import ObjectStore
from .store.packs import PACK_NAME
from .traverse import format_path, walk

MVC_DIR = ".mvc"
FORMAT_VERSION = 1
SEALED_VALUES = "sealed-values"  # refs, reflog, locks and pruned notes carry checksums (format.md 5.8)
# encoded-records: packs of version 2, whose records may be byte-grouped zstd
# or deltas (docs/format.md 4.2); written to FORMAT before the first such pack
# is indexed, so an mvc that cannot decode them refuses the repository.
ENCODED_RECORDS = "encoded-records"
SIGNATURES = "signatures"  # commit objects may carry a signature field (format.md 7.3.1)
KNOWN_EXTENSIONS: frozenset = frozenset({SEALED_VALUES, ENCODED_RECORDS, _sharded.EXTENSION, SIGNATURES})
# 256 KiB, from benchmarks/bench_core.py --chunk-sizes (1 GiB state): commits
# and loads are as fast as with 1-4 MiB chunks (per-chunk costs show only at
# 128 KiB and below), while a few touched embedding rows rewrite a quarter
# as many bytes as with 1 MiB (storage 1.012x vs 1.042x the changed bytes).
DEFAULT_CHUNK_SIZE = 256 << 10
MAX_WRITE_CHUNK = 1 << 30  # the writer's limit: one read of a chunk must stay under Linux's 2 GiB per call
HASH_BYTES = 8 << 20  # hashed by one thread at a time: amortises task overhead
SUBDIRS = ("packs", "tmp", "locks", "index")


def find_root(path) -> Path:
    """The directory holding ``.mvc``: ``path`` or the nearest parent that has one."""
    start = Path(path).resolve()
    for candidate in (start, *start.parents):
        if (candidate / MVC_DIR).is_dir():  # .mvc itself may be a link (to another disk); nothing inside may
            return candidate
    raise NotARepository(f"not an mvc repository (nor is any parent): {start}; run 'mvc init' first")


def read_format(mvc_dir: Path) -> tuple:
    """(format version, set of extensions) in ``FORMAT``; UnsupportedFormat if this mvc cannot read it."""
    try:
        lines = fs.read_small(mvc_dir / "FORMAT", 1 << 16).decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError, CorruptObject):
        raise NotARepository(f"{mvc_dir} has no readable FORMAT file; it is not an mvc repository") from None
    pairs = [line.partition(" ")[::2] for line in lines if line.strip()]
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise UnsupportedFormat(f"{mvc_dir}/FORMAT is damaged: a key appears twice")
    version = fields.get("mvc-format", "")
    if not (version.isascii() and version.isdigit()) or int(version) < 1:
        raise UnsupportedFormat(f"{mvc_dir}/FORMAT is damaged: no 'mvc-format N' line")
    if int(version) > FORMAT_VERSION:
        raise UnsupportedFormat(f"repository format {version} is newer than this mvc reads "
                                f"({FORMAT_VERSION}); upgrade mvc")
    extensions = set(fields.get("extensions", "").split())
    unknown = extensions - KNOWN_EXTENSIONS
    if unknown:
        raise UnsupportedFormat(f"repository uses extensions this mvc does not know: {sorted(unknown)}")
    return int(version), extensions


def write_format(mvc_dir: Path, extensions) -> None:
    """Write ``FORMAT`` atomically (temporary file, fsync, rename)."""
    fs.atomic_write(mvc_dir / "FORMAT", f"mvc-format {FORMAT_VERSION}\nextensions {' '.join(sorted(extensions))}\n"
                    .replace("extensions \n", "extensions\n").encode())


def add_extension(mvc_dir: Path, name: str) -> None:
    """List extension ``name`` in ``FORMAT`` (atomically, ``write_format``). Called
    before the first data that needs it is indexed; a crash after it leaves a
    flag nothing needs yet, which is harmless."""
    _, extensions = read_format(mvc_dir)
    if name not in extensions:
        write_format(mvc_dir, extensions | {name})


def _now_us() -> int:
    return time.time_ns() // 1000


def _tiers():
    from .remote import tiers  # the remote layer, imported when a repository opens (no boto3 unless S3 is used)
    return tiers


def _remote(module: str):
    import importlib
    return importlib.import_module(f".remote.{module}", __package__)


def _state_module():
    # Imported on first use: it brings torch, which commands that only read
    # metadata (log, show, status, fsck ...) do not need.
    from . import state
    return state


def _live_module():
    from . import live  # brings torch, like state
    return live


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


def _record(message, step, epoch, metrics, context, author: str) -> CommitObject:
    """The commit's record, validated and known to encode, before anything is written.

    Its tree and parents are placeholders until the index transaction.
    """
    for name, value in (("step", step), ("epoch", epoch)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise BadInput(f"{name} must be an int, not {value!r}")
    if not isinstance(message, str):
        raise BadInput("commit message must be text")
    record = CommitObject(bytes(ID_SIZE), (), message, author, _now_us(), step, epoch,
                          _metrics(metrics), _plain(context or {}, "context"))
    record.encode()  # BadInput now (an int over 64 bits, undecodable text), not after the pack
    return record


def _remove_killed_inits(root: Path) -> None:
    """Remove the staging folders of inits in ``root`` that were killed (their process is gone)."""
    from . import scratch
    for path in root.glob(".mvc-init-*-*"):
        pid = path.name[len(".mvc-init-"):].split("-", 1)[0]
        if pid.isdigit() and scratch.gone(int(pid)) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _populate(mvc_dir: Path, chunk_size: int) -> None:
    """Lay out an empty repository in ``mvc_dir``: folders, index, FORMAT."""
    for sub in ("packs", "tmp", "locks"):
        (mvc_dir / sub).mkdir()
    index = Index(mvc_dir / "index", create=True)
    try:
        with index.write() as txn:
            txn.put_meta("chunk_size", chunk_size.to_bytes(8, "little"))
            txn.set_ref(refs.HEAD, RefValue(target=refs.BRANCHES + "main"))
    finally:
        index.close()
    write_format(mvc_dir, {SEALED_VALUES})


def _encode_tensors(slots: list, chunk_size: int) -> dict:
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


class Repository:
    """A ``.mvc`` repository. ``Repository.init(path)`` creates one,
    ``Repository.open(path)`` finds one in ``path`` or above.

    Composed of an index (``index``), the chunk store (``chunks``, where
    chunk bytes live), the object store (``objects``), the refs (``refs``)
    and the gc lock (``gc_lock``). Reads (load, entries, diff ...) may run
    from several threads; commits and ref changes come from one thread at
    a time.
    """

    def __init__(self, root):
        self.root = Path(root)
        self.dir = self.root / MVC_DIR
        _, extensions = read_format(self.dir)
        for sub in SUBDIRS:
            try:
                fs.check_dir(self.dir / sub)
            except FileNotFoundError:  # damage the first read reports, naming what it breaks
                pass
        self.index = Index(self.dir / "index")
        self.objects = ObjectStore()
        self.chunks = PackStore(self.dir / "packs", 2 if ENCODED_RECORDS in extensions else 1, self.index.readonly)
        self.refs = refs.Refs(self.objects, _now_us)
        self.gc_lock = GcLock(self.dir / "locks")
        self._live = None  # mvc.live.LiveRecords, made on first use
        with self.index.read() as txn:
            raw = txn.meta("chunk_size")
        if raw is None or len(raw) != 8:
            raise CorruptObject(f"the index in {self.dir} has no valid chunk_size setting; it is damaged: "
                                "restore .mvc/index from a backup")
        self.chunk_size = int.from_bytes(raw, "little")
        if SEALED_VALUES not in extensions and not self.index.readonly:
            # this mvc writes sealed values: say so first, so an older mvc refuses clearly
            write_format(self.dir, extensions | {SEALED_VALUES})
        self.chunks = _tiers().chunk_store(self)  # a CacheStore in front of PackStore when a remote is cached

    @property
    def lock_timeout(self) -> float:
        """Seconds a commit or load waits for a running gc (and gc for them)."""
        return self.gc_lock.timeout

    @lock_timeout.setter
    def lock_timeout(self, seconds: float) -> None:
        self.gc_lock.timeout = seconds

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def init(cls, path=".", chunk_size: int = DEFAULT_CHUNK_SIZE) -> "Repository":
        """Create ``path/.mvc`` and open it; RepositoryExists if it is there."""
        if not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_WRITE_CHUNK:
            raise BadInput(f"chunk size must be between 1 byte and 1 GiB, not {chunk_size}")
        root = Path(path)
        mvc_dir = root / MVC_DIR
        if os.path.lexists(mvc_dir):
            raise RepositoryExists(f"{mvc_dir} already exists")
        # Built under a temporary name and renamed into place, so an
        # interrupted init never leaves a half-made .mvc behind.
        root.mkdir(parents=True, exist_ok=True)
        _remove_killed_inits(root)
        staging = root / f".mvc-init-{os.getpid()}-{secrets.token_hex(8)}"
        staging.mkdir()  # not mkdtemp: that would make .mvc 0700 whatever the umask says
        try:
            _populate(staging, chunk_size)
            try:
                os.rename(staging, mvc_dir)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another init won the race
                    raise RepositoryExists(f"{mvc_dir} already exists") from None
                raise
            fs.fsync_dir(root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return cls(root)

    @classmethod
    def open(cls, path=".") -> "Repository":
        """Open the repository at ``path`` or its nearest parent; NotARepository if none."""
        return cls(find_root(path))

    def close(self) -> None:
        self.chunks.close()
        self.index.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- history -----------------------------------------------------------

    @staticmethod
    def _to_commit(oid: bytes, obj: CommitObject, stats=None, pruned: bool = False) -> Commit:
        return Commit(oid.hex(), obj.tree.hex(), tuple(p.hex() for p in obj.parents), obj.message,
                      obj.author, obj.time / 1e6, obj.step, obj.epoch, dict(obj.metrics),
                      dict(obj.context), stats, pruned)

    def resolve(self, rev: str = refs.HEAD) -> str:
        """The full hex id of the commit ``rev`` names; UnknownRevision/AmbiguousRevision."""
        with self.index.read() as txn:
            return self.refs.resolve(txn, rev).hex()

    def get_commit(self, rev: str = refs.HEAD) -> Commit:
        with self.index.read() as txn:
            oid = self.refs.resolve(txn, rev)
            return self._to_commit(oid, self.objects.commit(txn, oid), pruned=self.objects.pruned(txn, oid) is not None)

    def log(self, rev: Optional[str] = None, n: Optional[int] = None) -> Iterator[Commit]:
        """Commits from ``rev`` (default HEAD) along first parents, newest first.

        An unborn HEAD (no commits yet) gives an empty log.
        """
        with self.index.read() as txn:
            oid = self.refs.head(txn)[1] if rev is None else self.refs.resolve(txn, rev)
            line = _reach.first_parents(lambda c: self.objects.commit(txn, c), oid)
            commits = [self._to_commit(c, obj, pruned=self.objects.pruned(txn, c) is not None)
                       for c, obj in itertools.islice(line, n)]
        return iter(commits)

    def tensor_object(self, tensor_id: str) -> TensorObject:
        with self.index.read() as txn:
            return self.objects.tensor(txn, bytes.fromhex(tensor_id))

    def entries(self, rev: str = refs.HEAD) -> list:
        """Every leaf of the tree at ``rev``, in key order (no tensor data is read).

        CommitPruned if gc retention deleted its tensors.
        """
        with self.index.read() as txn:
            tree = self.objects.commit_tree(txn, self.refs.resolve(txn, rev))
            out = []
            for path, leaf in walk(tree.root):
                if isinstance(leaf, TensorLeaf):
                    obj = self.objects.tensor(txn, leaf.id)
                    out.append(Entry(path, "tensor", obj.dtype, obj.shape, obj.nbytes, leaf.id.hex(), obj.chunks))
                else:
                    out.append(Entry(path, "value", value=leaf))
        return out

    # -- commit ------------------------------------------------------------

    def _target_ref(self, txn, branch: Optional[str]) -> Optional[str]:
        """The branch ref a commit moves: ``branch`` or HEAD's; None when detached."""
        if branch is not None:
            return refs.BRANCHES + refs.check_name(branch, "branch")
        return self.refs.head(txn)[0]

    def commit(self, state, message: str = "", *, step: Optional[int] = None,
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
        record = _record(message, step, epoch, metrics, context, author or default_author())
        signer = _audit.signer(self, sign)
        me = locking.this_process(record.author)
        # The shared gc lock covers the first dedup lookup through the index
        # transaction: gc must not delete a chunk this commit chose not to write.
        with self.gc_lock.shared():
            with self.index.read() as txn:
                ref = self._target_ref(txn, branch)
                parent = self.refs.tip(txn, ref)
                fork = self.refs.resolve(txn, start) if parent is None and ref and start else None
                self.refs.check_commit(txn, ref, me)  # before writing chunks, and again below
                _audit.check_commit_policy(txn, ref, signer)
            if signer is not None:
                self._require_extension(SIGNATURES)
            root, slots = _state_module().flatten(state)
            batch, stats = self._write_chunks(slots, progress)
            # a failure from here on leaves a sealed, unpublished pack: garbage gc reclaims
            tensors = _encode_tensors(slots, self.chunk_size)
            tree_data = TreeObject(_state_module().tree_root(root)).encode()
            with self.index.write() as txn:
                oid, obj = self._land(txn, ref, parent, rebase, me, record, batch.publish, tensors, tree_data, fork,
                                      signer=signer)
        return replace(self._to_commit(oid, obj, stats), branch=refs.short_name(ref) if ref else None)

    def _land(self, txn, ref, parent, rebase: bool, me, record: CommitObject, publish: Callable,
              tensors: dict, tree_data: bytes, fork: Optional[bytes] = None, merged: tuple = (), signer=None) -> tuple:
        """A commit's one index write transaction: compare-and-swap against
        ``parent`` (or onto the tip with ``rebase``), ``publish(txn)`` its
        chunks, store its objects, move ``ref``. A new branch's first commit
        has ``fork`` (its start point), if any, as parent; a merge commit has
        the ``merged`` commits as further parents. Returns (id, CommitObject)."""
        tip = self.refs.tip(txn, ref) if rebase else self.refs.expect(txn, ref, parent)
        self.refs.check_commit(txn, ref, me)
        _audit.check_commit_policy(txn, ref, signer)  # again here: sharded saves land through this too
        publish(txn)
        for data in tensors.values():
            self.objects.put(txn, "tensors", data)
        tree_id = self.objects.put(txn, "trees", tree_data)
        base = tip or fork  # a new branch forks from its start point
        parents = ((base,) if base else ()) + tuple(dict.fromkeys(p for p in merged if p != base))
        obj = replace(record, tree=tree_id, parents=parents, time=_now_us())
        if signer is not None:  # signed last: the time and parents are final only here
            obj = _audit.sign_commit(obj, signer)
        oid = self.objects.put(txn, "commits", obj.encode())
        title = record.message.splitlines()[0] if record.message else ""
        self.refs.set_if_equals(txn, ref, tip, oid, f"commit: {title}")
        return oid, obj

    def _write_chunks(self, slots: list, progress) -> tuple:
        """Hash every chunk (in threads) and write the ones the store lacks as one sealed batch.

        Sets ``slot.chunks``; returns (the sealed batch, CommitStats).
        """
        size = self.chunk_size
        spans = [(slot, off, min(size, slot.nbytes - off)) for slot in slots for off in range(0, slot.nbytes, size)]
        for slot in slots:
            slot.chunks = []

        # Chunks whose bytes still fingerprint as when they were last committed
        # or loaded keep their id without BLAKE3 (mvc/live.py: identify).
        live, known, prints = _live_module(), {}, {}
        for slot in slots:
            known[id(slot)], prints[id(slot)] = self.live.get(slot.tensor), []

        def hash_batch(batch):
            return [live.identify(known[id(slot)], slot.bytes(), off, n, size) for slot, off, n in batch]

        batch, bytes_new, done = self.chunks.writer(), 0, 0
        total = sum(s.nbytes for s in slots)
        if progress:
            progress(0, total)  # a bar can show at once, not after the first batch
        try:
            with ThreadPoolExecutor(THREADS) as pool, self.index.read() as txn:
                work = batches(spans, lambda s: s[2], HASH_BYTES)
                for piece, digests in zip(work, _ahead(pool, hash_batch, work, 2 * THREADS)):
                    for (slot, off, n), (cid, fp, reused) in zip(piece, digests):
                        present = self.chunks.has(cid, txn)
                        if reused and not present:  # gc took it: the bytes must be written, under their own id
                            cid = hashing.digest(slot.bytes()[off:off + n])
                            present = self.chunks.has(cid, txn)
                        slot.chunks.append(cid)
                        prints[id(slot)].append(fp)
                        if not present and batch.add(cid, slot.bytes()[off:off + n]):
                            bytes_new += n
                        if off + n == slot.nbytes:
                            slot.release()  # its last chunk: drop a contiguous copy now, not at the end
                    done += sum(s[2] for s in piece)
                    if progress:
                        progress(done, total)
            batch.seal()
            live.remember(self.live, slots, prints, size)
        except BaseException as exc:
            batch.abort()
            if isinstance(exc, OSError):  # a full disk, above all: say what failed and that nothing changed
                raise OSError(exc.errno, f"{exc.strerror or exc} while writing a pack in {self.dir / 'packs'}; "
                                         "nothing was committed") from exc
            raise
        return batch, CommitStats(len(slots), len(spans), batch.count, total, bytes_new)

    # -- load --------------------------------------------------------------

    def load(self, rev: str = refs.HEAD, map_location=None,
             progress: Optional[Callable[[int, int], None]] = None, only: Optional[str] = None):
        """The state committed at ``rev``: the same nested structure, CPU tensors.

        ``map_location`` (a device or device string) moves tensors after loading.
        ``only`` (a glob on dotted keys, as ``diff --only``) reads and verifies
        only the matching leaves; see ``mvc.live.select`` for the shape of
        what comes back. Every object and chunk is verified against its id;
        ChecksumMismatch names the tensor's key path and the commit.
        CommitPruned if gc retention deleted its tensors. ``progress(done,
        total)`` is called with the bytes read so far.
        """
        # gc must not move or delete a pack between reading a location and reading the pack
        with self.gc_lock.shared(), self.index.read() as txn:
            oid = self.refs.resolve(txn, rev)
            root = self.objects.commit_tree(txn, oid).root
            if only is not None:
                root = _live_module().select(root, only)
            leaves = [(p, leaf) for p, leaf in walk(root) if isinstance(leaf, TensorLeaf)]
            tensors = self.read_tensors(txn, leaves, oid, progress)
        return _state_module().materialize(root, tensors, map_location)

    # -- live version switch (mvc/live.py) ---------------------------------

    @property
    def live(self):
        """What each live tensor last received from ``load_into`` (``mvc.live.LiveRecords``)."""
        if self._live is None:
            self._live = _live_module().LiveRecords()
        return self._live

    def load_into(self, targets: dict, rev: str = refs.HEAD, *, check_live: bool = True):
        """Update live tensors in place to commit ``rev``, reading only what differs.

        ``targets`` is shaped like part of the committed state: its leaves
        are live tensors, or objects with state_dict/load_state_dict (a
        module, an optimizer). Only the keys given are touched; a chunk is
        skipped only when its bytes provably still hold what the commit
        needs (``mvc.live``). ``check_live=False`` is the caller's promise
        that no write bypassed torch's version counter (``.data``, numpy,
        DLPack) since mvc last loaded these tensors: then their
        unchanged chunks are skipped without reading a live byte.
        Raises BadInput on a missing key, dtype or shape mismatch,
        ChecksumMismatch on a corrupt chunk: before any live tensor
        changes. Returns a ``mvc.live.Switch``.
        """
        return _live_module().load_into(self, targets, rev, check_live)

    def read_leaves(self, rev: str, leaves: list, progress=None, into: Optional[dict] = None) -> dict:
        """{tensor id: CPU tensor} for (key path, TensorLeaf) pairs of commit
        ``rev``, read and verified in a transaction of their own; see ``read_tensors``."""
        with self.gc_lock.shared(), self.index.read() as txn:
            return self.read_tensors(txn, leaves, self.refs.resolve(txn, rev), progress, into)

    def read_tensors(self, txn, leaves: list, commit_id: bytes, progress=None, into: Optional[dict] = None) -> dict:
        """{tensor id: CPU tensor} for (key path, TensorLeaf) pairs, read in threads and verified.

        ``into`` {tensor id: contiguous CPU tensor of the object's dtype and
        shape} receives those tensors' bytes instead of new tensors. The
        caller holds ``gc_lock.shared()`` and the index transaction ``txn``.
        """
        requests, out, scattered = [], {}, []
        for path, leaf in leaves:
            if leaf.id in out:
                continue
            obj = self.objects.tensor(txn, leaf.id)
            given = (into or {}).get(leaf.id)
            if given is not None:
                out[leaf.id], buffer = given, _state_module().buffer_of(given, obj.dtype, obj.shape, format_path(path))
            else:
                out[leaf.id], buffer = _state_module().empty_tensor(obj.shape, obj.dtype)
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
        self.chunks.read(requests, txn, step if progress else None)
        for tensor, obj, what in scattered:  # one shard at a time: a shard's worth of memory on top
            self._read_scattered(txn, tensor, obj, what, step if progress else None)
        return out

    def read_chunk(self, chunk_id: bytes, what: str = "") -> bytes:
        """One chunk's verified bytes; ObjectNotFound / ChecksumMismatch.

        A caller reading many chunks holds ``gc_lock.shared()`` around them,
        so gc in another process cannot move a pack meanwhile.
        """
        with self.index.read() as txn:
            return self.chunks.read_one(chunk_id, txn, what.removeprefix(" of "))

    # -- refs --------------------------------------------------------------

    def head(self) -> Head:
        with self.index.read() as txn:
            ref, oid = self.refs.head(txn)
        return Head(refs.short_name(ref) if ref else None, oid.hex() if oid else None)

    def _listed(self, prefix: str) -> list:
        with self.index.read() as txn:
            return [Ref(name, oid.hex(), protected) for name, oid, protected in self.refs.listed(txn, prefix)]

    def branches(self) -> list:
        return self._listed(refs.BRANCHES)

    def tags(self) -> list:
        return self._listed(refs.TAGS)

    def _set_ref(self, ref: str, rev: str, force: bool, protect: Optional[bool], why: str) -> Ref:
        with self.index.write() as txn:
            oid, protected = self.refs.set(txn, ref, rev, force, protect, why, locking.this_process(default_author()))
        return Ref(refs.short_name(ref), oid.hex(), protected)

    def _delete_ref(self, ref: str, force: bool) -> None:
        with self.index.write() as txn:
            self.refs.delete(txn, ref, force, locking.this_process(default_author()))

    def create_branch(self, name: str, rev: str = refs.HEAD, force: bool = False,
                      protect: Optional[bool] = None) -> Ref:
        """Point branch ``name`` at ``rev``; RefConflict if it exists elsewhere (unless force).

        ``protect`` True/False sets its protection in the same transaction.
        """
        ref = refs.BRANCHES + refs.check_name(name, "branch")
        return self._set_ref(ref, rev, force, protect, f"branch: {rev}")

    def delete_branch(self, name: str, force: bool = False) -> None:
        self._delete_ref(refs.BRANCHES + refs.check_name(name, "branch", existing=True), force)

    def create_tag(self, name: str, rev: str = refs.HEAD, protect: Optional[bool] = None,
                   force: bool = False, sign=None, message: str = "") -> Ref:
        """Tag ``rev``; a protected tag is not moved or deleted without ``force``.

        ``sign`` (a key, a key path, or True for ``signing.key``) makes it a
        signed tag: a tag object over its name, target, tagger, time and
        ``message`` is stored with the ref (``docs/format.md`` 7.4).
        """
        ref = refs.TAGS + refs.check_name(name, "tag")
        signer = _audit.signer(self, sign)
        with self.index.write() as txn:
            me = locking.this_process(default_author())
            oid, protected = self.refs.set(txn, ref, rev, force, protect, f"tag: {rev}", me)
            _audit.put_tag(txn, name, oid, signer, message, default_author(), _now_us())
        return Ref(name, oid.hex(), protected)

    def delete_tag(self, name: str, force: bool = False) -> None:
        with self.index.write() as txn:
            self.refs.delete(txn, refs.TAGS + refs.check_name(name, "tag", existing=True), force,
                             locking.this_process(default_author()))
            _audit.put_tag(txn, name, None, None)

    # -- signatures and audit (mvc/audit.py) ----------------------------------

    def signer(self, sign=True, passphrase=None):
        """The ``mvc.signing.SigningKey`` that ``sign`` names (a key, a key file path, True for
        setting ``signing.key``; None/False: None), loaded once for many commits. SigningKeyError."""
        return _audit.signer(self, sign, passphrase)

    def verify_commit(self, rev: str = refs.HEAD) -> "_audit.CommitVerification":
        """The signature verdict of the commit ``rev`` names, against ``signing.allowed-signers``."""
        return _audit.verify_commit(self, rev)

    def verify_tag(self, name: str) -> "_audit.TagVerification":
        """The signature verdict of tag ``name`` (unsigned for a plain tag)."""
        return _audit.verify_tag(self, name)

    def audit(self, rev: str = refs.HEAD, objects: bool = False) -> "_audit.AuditReport":
        """The history from ``rev`` back to its roots, each commit verified; see ``mvc.audit.audit``."""
        return _audit.audit(self, rev, objects)

    def scan(self, budget="10%", progress=None) -> "_audit.ScanReport":
        """One run of the rotating integrity scan; see ``mvc.audit.scan``."""
        return _audit.scan(self, budget, progress)

    def set_protected(self, name: str, protected: bool = True, kind: str = "branch") -> Ref:
        """Protect or unprotect a branch or tag (kind "branch" or "tag")."""
        ref = (refs.BRANCHES if kind == "branch" else refs.TAGS) + refs.check_name(name, kind, existing=True)
        with self.index.write() as txn:
            oid = self.refs.protect(txn, ref, protected)
        return Ref(name, oid.hex(), protected)

    def expire_reflog(self, ref: Optional[str] = None, older_than: Optional[float] = None,
                      damaged: bool = False) -> int:
        """Delete reflog entries, as ``git reflog expire`` does; returns how many.

        ``ref``: a branch, tag or ``HEAD`` (default: every ref). ``older_than``:
        seconds; only entries older than that go (default: all of them, as
        ``--expire=now``). ``damaged=True`` deletes only entries that cannot be
        read (what fsck reports as corrupt-reflog), leaving the rest.
        """
        before = None if older_than is None else _now_us() - int(older_than * 1e6)
        with self.index.write() as txn:
            name = None if ref is None else (refs.HEAD if ref in (refs.HEAD, "@")
                                             else self.refs.branch_ref(txn, ref) or self._tag_ref(txn, ref))
            return self.refs.expire_reflog(txn, name, before, damaged)

    def _tag_ref(self, txn, name: str) -> str:
        ref = name if name.startswith(refs.TAGS) else refs.TAGS + name
        if txn.ref(ref) is None:
            raise UnknownRevision(f"no branch or tag named {name!r}")
        return ref

    def prune_lost(self) -> tuple:
        """Mark every commit whose data fsck finds lost (missing or corrupt
        trees, tensors or chunks) as pruned, as retention would: its record
        stays in history, loading it says so, and gc may run again. Returns
        the ids of the commits marked. Damage to commit records, refs or the
        reflog cannot be pruned: move or delete those refs, or expire the
        reflog (``expire_reflog``)."""
        return _fsck.prune_lost(self)

    def checkout(self, rev: str, new_branch: Optional[str] = None) -> Head:
        """Move HEAD: onto a branch (by name) or detached at any other revision;
        with ``new_branch``, onto that new branch created at ``rev`` (``checkout -b``)."""
        with self.index.write() as txn:
            if new_branch is None:
                self.refs.checkout(txn, rev)
            else:
                ref = refs.BRANCHES + refs.check_name(new_branch, "branch")
                self.refs.checkout_new(txn, ref, rev, locking.this_process(default_author()))
        return self.head()

    def rename_branch(self, old: str, new: str, force: bool = False) -> Ref:
        """Rename branch ``old`` to ``new``, keeping its protection and reflog; HEAD follows."""
        old_ref = refs.BRANCHES + refs.check_name(old, "branch", existing=True)
        new_ref = refs.BRANCHES + refs.check_name(new, "branch")
        with self.index.write() as txn:
            oid, protected = self.refs.rename(txn, old_ref, new_ref, force, locking.this_process(default_author()))
        return Ref(new, oid.hex(), protected)

    def reflog(self, name: str = refs.HEAD) -> list:
        """(sequence, entry) of a ref's reflog, newest first: ``name`` is HEAD, a
        branch or a tag; an entry is {"old", "new" (hex or None), "time" (s), "message"}."""
        with self.index.read() as txn:
            ref = refs.HEAD if name in (refs.HEAD, "@") else (
                self.refs.branch_ref(txn, name) or (refs.TAGS + name if txn.ref(refs.TAGS + name) else None))
            if ref is None:
                raise UnknownRevision(f"no branch or tag {name!r}")
            return [(seq, {"old": e.get("old").hex() if isinstance(e.get("old"), bytes) else None,
                           "new": e.get("new").hex() if isinstance(e.get("new"), bytes) else None,
                           "time": e.get("time", 0) / 1e6, "message": e.get("message", "")})
                    for seq, e in self.refs.reflog(txn, ref)]

    def history(self, include=(), exclude=(), all_refs: bool = False, n: Optional[int] = None,
                known=()) -> list:
        """Commits in the ancestry of ``include`` but not ``exclude``; see ``mvc.history.walk``."""
        return _history.walk(self, include, exclude, all_refs, n, known)

    def left_behind(self, commit_id: str) -> list:
        """Commits of ``commit_id``'s ancestry no branch or tag reaches; see ``mvc.history``."""
        return _history.left_behind(self, commit_id)

    # -- branch locks (mvc/store/locks.py) ---------------------------------

    def lock_branch(self, branch: str, named: bool = False, owner: Optional[str] = None) -> BranchLock:
        """Lock ``branch`` for writing; commits by anyone else raise LockHeld.

        By default the lock belongs to this process and lapses when it exits
        (a dead owner's lock on the same host is taken over). ``named=True``
        makes it belong to ``owner`` (default: the commit author) until
        unlocked. Locking again as the owner is a no-op. Raises LockHeld
        naming the holder if another live owner holds it.
        """
        name = refs.check_name(branch, "branch")
        me = locking.this_process(owner or default_author())
        with self.index.write() as txn:
            return locking.acquire(txn, name, me, named)

    def unlock_branch(self, branch: str, force: bool = False, owner: Optional[str] = None) -> None:
        """Release ``branch``'s lock (a no-op if unlocked).

        Raises LockHeld if another live owner holds it, unless ``force``.
        """
        name = refs.check_name(branch, "branch")
        me = locking.this_process(owner or default_author())
        with self.index.write() as txn:
            locking.release(txn, name, me, force)

    def branch_lock(self, branch: str) -> Optional[BranchLock]:
        """Who holds ``branch``'s write lock, or None."""
        with self.index.read() as txn:
            return locking.get(txn, refs.check_name(branch, "branch"))

    def locks(self) -> list:
        """Every branch lock, stale ones (dead owner on this host) included."""
        with self.index.read() as txn:
            return locking.all_locks(txn)

    def status(self) -> Status:
        with self.index.read() as txn:
            ref, oid = self.refs.head(txn)
            n_branches = sum(1 for _ in txn.refs(refs.BRANCHES))
            n_tags = sum(1 for _ in txn.refs(refs.TAGS))
            n_commits = sum(1 for _ in txn.ids("commits"))
            n_chunks = sum(1 for _ in txn.ids("chunks"))
        packs = [self.dir / "packs" / name for name, regular in fs.entries(self.dir / "packs")
                 if regular and PACK_NAME.fullmatch(name)]
        head = Head(refs.short_name(ref) if ref else None, oid.hex() if oid else None)
        return Status(str(self.root), head, n_branches, n_tags, n_commits, n_chunks, len(packs),
                      sum(p.stat().st_size for p in packs), self.chunk_size)

    # -- the higher verbs ----------------------------------------------------

    # -- denser records (mvc/repack.py, mvc/store/codec.py) -------------------

    def enable_encoded_records(self) -> None:
        """Turn on the encoded-records extension: FORMAT lists it, and new packs
        are version 2 packs, which may hold compressed and delta records."""
        if self.index.readonly:  # before FORMAT changes: here nothing may
            raise read_only(self.dir)
        add_extension(self.dir, ENCODED_RECORDS)
        self.chunks.accept_encoded()

    def repack(self, depth: Optional[int] = None, dry_run: bool = False, progress=None) -> "_repack.RepackReport":
        """Re-encode live raw chunks as byte-grouped zstd or deltas where it pays;
        see ``mvc.repack.repack``."""
        return _repack.repack(self, depth=depth, dry_run=dry_run, progress=progress)

    def fsck(self, quick: bool = False, threads=None, progress=None) -> "_fsck.FsckReport":
        """Check everything reachable; see ``mvc.fsck.fsck``."""
        return _fsck.fsck(self, quick=quick, threads=threads, progress=progress)

    def rebuild_index(self) -> "_fsck.RebuildReport":
        """Rebuild the chunk index from the packs' trailers; see ``mvc.fsck.rebuild_index``."""
        return _fsck.rebuild_index(self)

    def gc(self, keep_last=None, branch=None, keep_best=None, mode: str = "min", top: int = 1,
           force: bool = False, dry_run: bool = False, grace: float = _gc.GRACE_S,
           expire_reflog: Optional[float] = None, repack: bool = False) -> "_gc.GcReport":
        """Prune by retention, delete what nothing reaches, reclaim pack space; see ``mvc.gc.gc``.

        ``grace``: seconds a pack no index entry names, or a ``.pack.tmp``,
        is left alone (it may be a running commit's); 0 when no writer runs.
        ``expire_reflog``: first delete reflog entries older than this many
        seconds (0: all), as ``git gc`` expires the reflog.
        ``repack``: rewrite every pack holding garbage, not only those over a quarter.
        """
        if expire_reflog is not None and not dry_run:
            self.expire_reflog(older_than=expire_reflog)
        if ENCODED_RECORDS in read_format(self.dir)[1]:  # a repack elsewhere may have turned it on since open
            self.chunks.accept_encoded()
        return _gc.gc(self, keep_last=keep_last, branch=branch, keep_best=keep_best, mode=mode, top=top,
                      force=force, dry_run=dry_run, grace=grace, repack=repack)

    def merge(self, revs, recipe=None, **options):
        """Merge the checkpoints at ``revs`` into a merge commit; returns
        (Commit, MergeReport). See ``mvc.merge.merge`` for the options."""
        from . import merge as _merge  # brings torch
        return _merge.merge(self, revs, recipe, **options)

    def diff(self, a: str, b=None, only=None, read_data: bool = True) -> "_diff.Diff":
        """Compare commit ``a`` with ``b`` (default HEAD); see ``mvc.diff.diff``."""
        return _diff.diff(self, a, b, only, read_data)

    def bisect(self, good: str, bad: str, is_good, branch=None, progress=None) -> "_bisect.BisectStatus":
        """Find the first commit after ``good`` for which ``is_good(state)`` is
        False; see ``mvc.bisect.bisect``."""
        return _bisect.bisect(self, good, bad, is_good, branch=branch, progress=progress)

    def bisect_start(self, bad: str, good: str, branch: Optional[str] = None) -> "_bisect.BisectStatus":
        """Start a bisect session kept in ``.mvc/BISECT`` (as ``git bisect start BAD GOOD``)."""
        return _bisect.start(self, bad, good, branch)

    def bisect_mark(self, verdict: str, rev: Optional[str] = None) -> "_bisect.BisectStatus":
        """Judge ``rev`` (default: the current candidate) "good", "bad" or "skip"."""
        return _bisect.mark(self, verdict, rev)

    def bisect_in_progress(self) -> bool:
        return _bisect.in_progress(self)

    def bisect_status(self) -> "_bisect.BisectStatus":
        return _bisect.status(self)

    def bisect_log(self, changes: bool = True) -> "_bisect.BisectLog":
        return _bisect.log(self, changes)

    def bisect_reset(self) -> "Optional[_bisect.BisectStatus]":
        """End the session; its last status, or None if none was running."""
        return _bisect.reset(self)

    def bisect_run(self, cmd_args, fmt: str = "pt", progress=None,
                   check_ends: bool = True, timeout=None, timeout_verdict: str = "skip") -> "_bisect.BisectStatus":
        """Judge candidates by running a command on each (Git's exit-code rules),
        after checking that the good and the bad end come out so (``check_ends``);
        an evaluation past ``timeout`` seconds is killed and judged ``timeout_verdict``."""
        return _bisect.run(self, cmd_args, fmt, progress, check_ends, timeout, timeout_verdict)

    def bisect_run_metric(self, metric: str, threshold: float, higher_is_worse: bool = False,
                          progress=None) -> "_bisect.BisectStatus":
        """Judge candidates by a recorded metric against ``threshold``."""
        return _bisect.run_metric(self, metric, threshold, higher_is_worse, progress)

    def export(self, rev: str, path, fmt=None, progress=None, *, force: bool = False, only=None,
               strip_prefix=None, write_progress=None) -> Export:
        """Write the checkpoint at ``rev`` to ``path`` as "pt" or "safetensors"
        (default: from the suffix, else pt), or a commit of a model folder back
        to a folder (``path`` a folder, or with no suffix); see ``mvc.exchange``.

        ``only`` (a glob on dotted keys) and ``strip_prefix`` write a flat state
        dict of the matching keys, e.g. ``only="model.*", strip_prefix="model."``.
        ``progress`` / ``write_progress`` get (done, total) bytes read / written.
        Raises BadInput for an existing target without ``force``, a format that
        contradicts the suffix, and what ``mvc.files.write_checkpoint`` refuses.
        """
        return _exchange.export(self, rev, path, fmt, progress, force=force, only=only,
                                strip_prefix=strip_prefix, write_progress=write_progress)

    def commit_file(self, path, message=None, **kwargs) -> Commit:
        """Commit a checkpoint file or model folder; see ``mvc.exchange.commit_file``."""
        return _exchange.commit_file(self, path, message, **kwargs)

    def unreferenced_fate(self, report) -> list:
        """For each unreferenced item of a fsck report: (item, None if a plain
        gc reclaims it, else a ``mvc.gc.LeftAlone`` saying why not)."""
        return [(u, _gc.unreferenced_fate(self.dir / "packs", u.kind, u.pack, u.records, u.bytes))
                for u in report.unreferenced]

    # -- remotes and tiers (mvc/remote/) ---------------------------------------

    def remote_add(self, name: str, url: str, endpoint_url: Optional[str] = None):
        """Add remote ``name`` at ``url`` (s3://BUCKET/PREFIX, file:///PATH or a path); a RemoteInfo."""
        with self.index.write() as txn:
            return _remote("config").add(txn, name, url, endpoint_url)

    def remotes(self) -> list:
        """Every configured remote (RemoteInfo), by name."""
        config = _remote("config")
        with self.index.read() as txn:
            return [config.get(txn, name) for name in config.names(txn)]

    def remote_remove(self, name: str) -> None:
        """Forget remote ``name``, its tracking refs and its catalogue (the remote itself is untouched)."""
        config, sync = _remote("config"), _remote("sync")
        with self.index.write() as txn:
            config.remove(txn, name)
            prefix = f"{sync.REMOTES}{name}/"
            for ref, _ in list(txn.refs(prefix)):
                txn.delete_ref(ref)
                for _, seq, _ in list(txn.reflog_raw(ref)):
                    txn.delete_reflog(ref, seq)
        _remote("catalogue").forget(self.dir, name)

    def remote_branches(self) -> list:
        """Tracking refs (``NAME/BRANCH``), as Refs."""
        return self._listed(_remote("sync").REMOTES)

    def push(self, remote: Optional[str] = None, refs: tuple = (), force: bool = False, progress=None,
             delete: tuple = ()):
        """Send what the remote lacks of ``refs`` (default: HEAD's branch) and move its refs, and delete
        the remote branches or tags in ``delete`` (or given as ``:NAME``); see ``mvc.remote.sync.push``.
        Then keeps the local cache to its budget, if one is set."""
        report = _remote("sync").push(self, remote, tuple(refs), force, progress, tuple(delete))
        self._keep_budget()
        return report

    def fetch(self, remote: Optional[str] = None, progress=None, prune: bool = False):
        """Bring the remote's branches as tracking refs with what they need (``prune``: and drop the
        tracking refs of branches it no longer has); see ``mvc.remote.sync.fetch``."""
        return _remote("sync").fetch(self, remote, progress, prune)

    def pull(self, remote: Optional[str] = None, branch: Optional[str] = None, progress=None):
        """fetch, then fast-forward ``branch`` (default HEAD's); see ``mvc.remote.sync.pull``."""
        return _remote("sync").pull(self, remote, branch, progress)

    @classmethod
    def clone(cls, url: str, path, lazy: bool = False, endpoint_url: Optional[str] = None,
              progress=None) -> "Repository":
        """A new repository at ``path`` with the history of the remote at ``url`` (remote ``origin``).

        ``lazy``: metadata only; chunks are read from the remote on demand and
        cached. The clone's fetch report is ``repo.cloned``.
        """
        repo, report = _remote("sync").clone(cls, url, path, lazy, endpoint_url, progress=progress)
        repo.cloned = report
        return repo

    def remote_lock(self, branch: str, remote: Optional[str] = None, owner: Optional[str] = None) -> str:
        """Lock ``branch`` on the remote: pushes to it by anyone but ``owner`` are refused."""
        return _remote("sync").lock(self, remote, branch, owner)

    def remote_unlock(self, branch: str, remote: Optional[str] = None, force: bool = False,
                      owner: Optional[str] = None) -> bool:
        return _remote("sync").unlock(self, remote, branch, force, owner)

    def config(self, key: str, value: Optional[str] = None, unset: bool = False) -> Optional[str]:
        """Read a setting (``cache.remote``, ``cache.max-bytes``), or set it / unset it.

        Setting ``cache.remote`` takes effect when the repository is next opened.
        """
        if key.startswith("signing."):
            return _audit.config(self, key, value, unset)
        config = _remote("config")
        if value is None and not unset:
            with self.index.read() as txn:
                return config.get_value(txn, key)
        with self.index.write() as txn:
            if key == config.CACHE_MAX and value is not None and config.cache_remote(txn) is None:
                name = config.default(txn, None)
                config.set_value(txn, config.CACHE_REMOTE, name)  # a budget needs a remote to evict to
            return config.set_value(txn, key, None if unset else value)

    def pin(self, name: str, pinned: bool = True) -> str:
        """Keep the chunks of branch or tag ``name`` local whatever the cache budget (or stop)."""
        config = _remote("config")
        with self.index.write() as txn:
            ref = self.refs.branch_ref(txn, name) or (refs.TAGS + name if txn.ref(refs.TAGS + name) else None)
            if ref is None:
                raise BadInput(f"no branch or tag named {name!r}")
            if pinned:
                txn.put_meta(config.PIN + ref, b"")
            else:
                txn.delete("meta", (config.PIN + ref).encode())
        return ref

    def evict(self, max_bytes=None):
        """Evict chunks safely on the cached remote until local packs fit ``max_bytes``
        (default ``cache.max-bytes``); see ``mvc.remote.tiers.evict``."""
        budget = None if max_bytes is None else _remote("config").parse_size(max_bytes)
        return _tiers().evict(self, budget)

    def _keep_budget(self) -> None:
        config = _remote("config")
        with self.index.read() as txn:
            budget, cached = config.cache_max(txn), config.cache_remote(txn)
        if budget is not None and cached is not None and _tiers().local_bytes(self) > budget:
            try:
                _tiers().evict(self, budget)
            except MvcError:  # the budget is a goal, not a promise: the push itself succeeded
                pass

    def cache_status(self):
        """Local vs remote bytes (CacheStatus)."""
        return _tiers().status(self)

    def refresh_remote(self, remote: str) -> int:
        """Learn the packs remote ``remote`` gained since it was last listed; how many were new."""
        return _remote("sync").refresh(self, remote)

    def upload_shards(self, remote: str, locations: dict, ids) -> tuple:
        """A rank's part of a sharded save across hosts: index the chunks ``write_shards``
        just wrote, and upload those of ``ids`` that ``remote`` lacks; see ``mvc.remote.sync.upload_shards``."""
        return _remote("sync").upload_shards(self, remote, locations, ids)

    def caches(self) -> Optional[str]:
        """The remote this repository caches (``cache.remote``), or None."""
        with self.index.read() as txn:
            return _remote("config").cache_remote(txn)

    def fsck_remote(self, remote: Optional[str] = None, read_subset: Optional[str] = None):
        """Verify every pack (or the ``read_subset`` "N/T" of chunk packs) and ref of a remote;
        see ``mvc.remote.check.fsck_remote``."""
        return _remote("check").fsck_remote(self, remote, read_subset)

    def gc_remote(self, remote: Optional[str] = None, keep_last=None, branch=None, keep_best=None,
                  mode: str = "min", top: int = 1, force: bool = False, grace: Optional[float] = None,
                  dry_run: bool = False):
        """Retention and garbage collection on a remote, safe against concurrent pushes; see
        ``mvc.remote.collect.gc_remote``."""
        collect = _remote("collect")
        return collect.gc_remote(self, remote, keep_last, branch, keep_best, mode, top, force,
                                 collect.GRACE_S if grace is None else grace, dry_run)

    def remote_repair(self, remote: Optional[str] = None):
        """Heal a damaged remote from this repository's intact copies; see ``mvc.remote.check.repair_remote``."""
        return _remote("check").repair_remote(self, remote)

    def fsck_fetch(self, report):
        """Complete a fsck report by reading back the chunks only the cached remote holds;
        see ``mvc.remote.check.fsck_fetch``."""
        return _remote("check").fsck_fetch(self, report)

    def repair(self):
        """Refetch damaged or missing local chunks and objects from remotes; see ``mvc.remote.check.repair``."""
        return _remote("check").repair(self)

    # -- sharded saves ---------------------------------------------------------
    # Every rank writes its own shards, one coordinator commits (mvc/sharded.py
    # gives the vocabulary and the call order; hooks/dcp.py is the DCP plugin).

    def begin_sharded(self, branch: Optional[str] = None, author: Optional[str] = None) -> dict:
        """Where a sharded save will commit, as plain data for ``commit_shards``:
        {"ref": the branch ref (None when HEAD is detached), "parent": its tip}.

        Raises ProtectedRef / LockHeld now, before any rank writes a chunk.
        """
        me = locking.this_process(author or default_author())
        with self.index.read() as txn:
            ref = self._target_ref(txn, branch)
            parent = self.refs.tip(txn, ref)
            self.refs.check_commit(txn, ref, me)
        return {"ref": ref, "parent": parent}

    def write_shards(self, tensors: list, progress: Optional[Callable[[int, int], None]] = None) -> dict:
        """A rank's part of a sharded save: hash ``tensors`` (CPU or device
        tensors, each one piece) and write the chunks the repository lacks to
        this process's own new pack, sealed. Never takes the index write lock.

        Returns plain data for the coordinator: {"chunk_size", "tensors":
        [{"dtype", "shape", "chunks"}, ...] in the order given, "locations":
        {chunk id: [pack name, offset, length]} of the chunks written,
        "chunks_new", "bytes_new"}. Raises BadInput for a tensor mvc cannot store.
        """
        state = _state_module()
        slots = [state.TensorSlot((i,), state._check_tensor(t, (i,)), tuple(t.shape), t)
                 for i, t in enumerate(tensors)]
        with self.gc_lock.shared():
            batch, stats = self._write_chunks(slots, progress)
        return {"chunk_size": self.chunk_size,
                "tensors": [{"dtype": s.dtype, "shape": list(s.shape), "chunks": list(s.chunks)} for s in slots],
                "locations": {cid: [loc.pack, loc.offset, loc.length] for cid, loc in batch.locations.items()},
                "chunks_new": stats.chunks_new, "bytes_new": stats.bytes_new}

    def commit_shards(self, start: dict, leaves: dict, locations: dict, dcp: Optional[dict] = None,
                      message: str = "", *, step: Optional[int] = None, epoch: Optional[int] = None,
                      metrics: Optional[dict] = None, context: Optional[dict] = None,
                      author: Optional[str] = None, stats: Optional[CommitStats] = None) -> Commit:
        """The coordinator's part of a sharded save: one commit of every rank's shards.

        ``start`` is what ``begin_sharded`` returned; ``leaves`` maps key
        paths to ``mvc.ShardedTensor`` or plain values; ``locations`` merges
        the ranks' locations; ``dcp`` is the DCP metadata (see
        ``mvc.sharded.check_dcp``). Checks every named pack is sealed and
        lists each chunk where claimed, then in one index write transaction
        indexes them, checks every chunk of every tensor is indexed with its
        length, stores the objects and moves the branch by compare-and-swap
        against ``start["parent"]`` (RefConflict if it moved). BadInput
        (nothing committed) for anything that does not add up.
        """
        if type(start) is not dict or set(start) != {"ref", "parent"}:
            raise BadInput("start must be what begin_sharded returned")
        record = _record(message, step, epoch, metrics, context, author or default_author())
        me = locking.this_process(record.author)
        if dcp is not None:
            _sharded.check_dcp(dcp)
        objs, tree_leaves = {}, {}
        for path, leaf in leaves.items():
            if isinstance(leaf, _sharded.ShardedTensor):
                obj = _sharded.tensor_object(leaf, self.chunk_size, f"tensor {format_path(path)!r}")
                data = obj.encode()
                objs[object_id(data)] = (obj, data)
                tree_leaves[path] = TensorLeaf(object_id(data))
            else:  # plain values as they are (tuples stay tuples); encoding refuses anything else
                tree_leaves[path] = leaf
        tree_data = TreeObject(_sharded.nest(tree_leaves), dcp).encode()
        with self.gc_lock.shared():
            batch = self.chunks.adopt(locations)
            self._require_extension(_sharded.EXTENSION)

            def publish(txn):
                batch.publish(txn)
                for obj, _ in objs.values():
                    for cid, _, n in obj.chunk_spans():
                        loc = txn.chunk(cid)
                        if loc is not None:
                            size = loc.size  # decoded (a repacked record may be encoded)
                        else:  # written by a rank on another host: it must be on the cached remote
                            size = self.chunks.length(cid, txn) if self.chunks.has(cid, txn) else None
                        if size != n:
                            raise BadInput(f"chunk {cid.hex()[:12]} of a sharded save is neither written by a "
                                           "rank nor in the repository (gc ran meanwhile?); nothing was "
                                           "committed, save again")
            with self.index.write() as txn:
                oid, obj = self._land(txn, start["ref"], start["parent"], False, me, record, publish,
                                      {tid: data for tid, (_, data) in objs.items()}, tree_data)
        ref = start["ref"]
        return replace(self._to_commit(oid, obj, stats), branch=refs.short_name(ref) if ref else None)

    def _require_extension(self, name: str) -> None:
        """Name ``name`` in FORMAT, so an mvc that lacks it refuses this
        repository instead of misreading it."""
        _, extensions = read_format(self.dir)
        if name not in extensions:
            write_format(self.dir, extensions | {name})

    def sharded_view(self, rev: str = refs.HEAD) -> dict:
        """What a sharded load plans with, read once: {"commit": full hex id,
        "dcp": the DCP metadata (None for a commit of ``commit``), "tensors":
        {key path: TensorObject}, "values": {key path: plain leaf}, "root":
        the tree (tensors as TensorLeaf), to find values that are containers}."""
        with self.index.read() as txn:
            oid = self.refs.resolve(txn, rev)
            tree = self.objects.commit_tree(txn, oid)
            tensors, values = {}, {}
            for path, leaf in walk(tree.root):
                if isinstance(leaf, TensorLeaf):
                    tensors[path] = self.objects.tensor(txn, leaf.id)
                else:
                    values[path] = leaf
        return {"commit": oid.hex(), "dcp": tree.dcp, "tensors": tensors, "values": values, "root": tree.root}

    def read_pieces(self, ranges: list, what: str = "") -> list:
        """Verified bytes of pieces: for each (TensorObject, piece index, start,
        stop) the bytes [start, stop) of that piece's C-order stream, as a
        uint8 numpy array. Only the chunks holding them are read."""
        import numpy as np
        requests, out = [], []
        for obj, piece, lo, hi in ranges:
            _, base, spans = _sharded.chunk_window(obj, piece, lo, hi)
            buffer = np.empty(sum(n for _, _, n in spans), dtype=np.uint8)
            requests += [Request(cid, buffer[off:off + n], what) for cid, off, n in spans]
            out.append(buffer[lo - base:hi - base])
        with self.gc_lock.shared(), self.index.read() as txn:
            self.chunks.read(requests, txn)
        return out

    def _read_scattered(self, txn, tensor, obj: TensorObject, what: str, progress) -> None:
        """Read a sharded tensor whose shards are not runs of rows: each shard
        into a buffer of its own, then copied into its box."""
        import numpy as np
        for i, (offsets, sizes, _, nbytes, _) in enumerate(obj.pieces()):
            _, _, spans = _sharded.chunk_window(obj, i, 0, nbytes)
            buffer = np.empty(nbytes, dtype=np.uint8)
            self.chunks.read([Request(cid, buffer[off:off + n], what) for cid, off, n in spans], txn, progress)
            _sharded.scatter(tensor, offsets, sizes, buffer)

    def load_keys(self, rev: str, keys) -> dict:
        """{key: repo.load(rev)[key]} for top-level ``keys`` of a commit whose
        state is a dict, reading only their tensors (a resume reads the small
        parts this way and the sharded model through DCP). Keys the commit
        lacks are left out."""
        with self.gc_lock.shared(), self.index.read() as txn:
            oid = self.refs.resolve(txn, rev)
            root = self.objects.commit_tree(txn, oid).root
            if type(root) is not dict:
                raise BadInput(f"commit {oid.hex()[:12]} holds a {type(root).__name__}, not a dict of keys")
            part = {k: root[k] for k in keys if k in root}
            leaves = [(p, leaf) for p, leaf in walk(part) if isinstance(leaf, TensorLeaf)]
            tensors = self.read_tensors(txn, leaves, oid)
        return _state_module().materialize(part, tensors)
