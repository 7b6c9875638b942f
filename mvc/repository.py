"""The repository: packs, index and refs tied together by transactions.

Write order makes crashes harmless: chunks go to a new pack, the pack is
sealed and fsynced, and only then does one LMDB write transaction index the
chunks, store the tensor, tree and commit objects, and move the branch by
compare-and-swap against the parent the commit was built on. A crash before
that transaction leaves only unreferenced pack bytes. Every chunk read back
is re-hashed and compared with its id.
"""

import errno
import getpass
import os
import secrets
import shutil
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from . import hashing, locks as locking, refs
from .errors import (AmbiguousRevision, BadInput, ChecksumMismatch, CorruptObject, NotARepository,
                     ObjectNotFound, ProtectedRef, RefConflict, RepositoryExists, UnknownRevision,
                     UnsupportedFormat)
from .index import Index, RefValue, Txn
from .locks import BranchLock
from .objects import ID_SIZE, CommitObject, TensorLeaf, TensorObject, TreeObject, format_path, object_id, walk
from .packs import PACK_NAME, RECORD_HEAD, PackReader, PackWriter, fsync_dir

MVC_DIR = ".mvc"
FORMAT_VERSION = 1
KNOWN_EXTENSIONS: frozenset = frozenset()
# 256 KiB, from benchmarks/bench_core.py --chunk-sizes (1 GiB state): commits
# and loads are as fast as with 1-4 MiB chunks (per-chunk costs show only at
# 128 KiB and below), while a few touched embedding rows rewrite a quarter
# as many bytes as with 1 MiB (storage 1.012x vs 1.042x the changed bytes).
DEFAULT_CHUNK_SIZE = 256 << 10
MAX_CHUNK_SIZE = 1 << 30  # one read of a chunk must stay under Linux's 2 GiB per call
BATCH_BYTES = 8 << 20  # work handed to one thread at a time: amortises task overhead
THREADS = max(1, min(8, os.cpu_count() or 1))


@dataclass(frozen=True)
class CommitStats:
    """What a commit wrote: ``bytes_new`` went to a pack, the rest was reused."""

    tensors: int
    chunks: int
    chunks_new: int
    bytes_total: int
    bytes_new: int

    @property
    def bytes_reused(self) -> int:
        return self.bytes_total - self.bytes_new


@dataclass(frozen=True)
class Commit:
    id: str
    tree: str
    parents: tuple
    message: str
    author: str
    time: float  # seconds since the Unix epoch
    step: Optional[int] = None
    epoch: Optional[int] = None
    metrics: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)
    stats: Optional[CommitStats] = None  # what a new commit wrote (None when read back)
    pruned: bool = False  # retention deleted its tensors; its record stays in history
    branch: Optional[str] = None  # the branch a new commit moved (None when detached or read back)

    @property
    def short_id(self) -> str:
        return self.id[:12]


@dataclass(frozen=True)
class Ref:
    name: str
    id: str
    protected: bool = False


@dataclass(frozen=True)
class Head:
    branch: Optional[str]  # None when HEAD is detached
    id: Optional[str]  # None on a branch with no commits yet


@dataclass(frozen=True)
class Entry:
    """One leaf of a commit's tree: a tensor or a plain value."""

    path: tuple
    kind: str  # "tensor" or "value"
    dtype: Optional[str] = None
    shape: Optional[tuple] = None
    nbytes: int = 0
    tensor_id: Optional[str] = None
    chunks: tuple = ()
    value: Any = None

    @property
    def key(self) -> str:
        return format_path(self.path)


@dataclass(frozen=True)
class Status:
    path: str
    head: Head
    branches: int
    tags: int
    commits: int
    chunks: int
    packs: int
    pack_bytes: int
    chunk_size: int


def find_root(path) -> Path:
    """The directory holding ``.mvc``: ``path`` or the nearest parent that has one."""
    start = Path(path).resolve()
    for candidate in (start, *start.parents):
        if (candidate / MVC_DIR).is_dir():
            return candidate
    raise NotARepository(f"not an mvc repository (nor is any parent): {start}; run 'mvc init' first")


def read_format(mvc_dir: Path) -> int:
    """The format version in ``FORMAT``; UnsupportedFormat if this mvc cannot read it."""
    try:
        lines = (mvc_dir / "FORMAT").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
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
    unknown = set(fields.get("extensions", "").split()) - KNOWN_EXTENSIONS
    if unknown:
        raise UnsupportedFormat(f"repository uses extensions this mvc does not know: {sorted(unknown)}")
    return int(version)


def _now_us() -> int:
    return time.time_ns() // 1000


def default_author() -> str:
    author = os.environ.get("MVC_AUTHOR")
    if author:
        return author
    try:
        user = getpass.getuser()
    except Exception:  # no user database entry (containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _state_module():
    # Imported on first use: it brings torch, which commands that only read
    # metadata (log, show, status, fsck ...) do not need.
    from . import state
    return state


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


MAX_RUN = 500  # chunks in one read: each takes two of the kernel's 1024 iovec slots


def _runs(jobs: list) -> list:
    """Read jobs split into runs whose records lie back to back in one pack.

    A run holds at most MAX_RUN chunks and about BATCH_BYTES, so it is
    hashed while its bytes are still fresh and threads share the work.
    """
    runs, size = [], 0
    for job in jobs:
        loc = job[0]
        if runs and len(runs[-1]) < MAX_RUN and size < BATCH_BYTES:
            last = runs[-1][-1][0]
            if last.pack == loc.pack and loc.offset == last.offset + last.length + RECORD_HEAD.size:
                runs[-1].append(job)
                size += loc.length
                continue
        runs.append([job])
        size = loc.length
    return runs


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
    with open(mvc_dir / "FORMAT", "w", encoding="utf-8") as f:
        f.write(f"mvc-format {FORMAT_VERSION}\nextensions\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(mvc_dir)


def _encode_tensors(slots: list, chunk_size: int) -> dict:
    """{tensor id: encoded tensor object} for hashed slots; sets each slot's id."""
    out = {}
    for slot in slots:
        data = TensorObject(slot.dtype, slot.shape, chunk_size, tuple(slot.chunks)).encode()
        slot.id = object_id(data)
        out[slot.id] = data
    return out


def _batches(spans: list, size_of: Callable) -> list:
    batches, current, total = [], [], 0
    for span in spans:
        current.append(span)
        total += size_of(span)
        if total >= BATCH_BYTES:
            batches.append(current)
            current, total = [], 0
    if current:
        batches.append(current)
    return batches


class BaseRepository:
    """A ``.mvc`` repository: commit, load, history and refs.

    ``mvc.Repository`` adds the higher verbs (fsck, gc, diff, bisect) on top.
    Reads (load, read_chunk, entries ...) may run from several threads; commits
    and ref changes come from one thread at a time.
    """

    lock_timeout = 60.0  # seconds a commit or load waits for a running gc (and gc for them)

    def __init__(self, root):
        self.root = Path(root)
        self.dir = self.root / MVC_DIR
        read_format(self.dir)
        self.index = Index(self.dir / "index")
        self.packs = PackReader(self.dir / "packs")
        with self.index.read() as txn:
            raw = txn.meta("chunk_size")
        if raw is None or len(raw) != 8:
            raise CorruptObject(f"the index in {self.dir} has no valid chunk_size setting; it is damaged: "
                                "restore .mvc/index from a backup")
        self.chunk_size = int.from_bytes(raw, "little")

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def init(cls, path=".", chunk_size: int = DEFAULT_CHUNK_SIZE):
        """Create ``path/.mvc`` and open it; RepositoryExists if it is there."""
        if not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_CHUNK_SIZE:
            raise BadInput(f"chunk size must be between 1 byte and 1 GiB, not {chunk_size}")
        root = Path(path)
        mvc_dir = root / MVC_DIR
        if mvc_dir.exists():
            raise RepositoryExists(f"{mvc_dir} already exists")
        # Built under a temporary name and renamed into place, so an
        # interrupted init never leaves a half-made .mvc behind.
        root.mkdir(parents=True, exist_ok=True)
        staging = root / f".mvc-init-{secrets.token_hex(8)}"
        staging.mkdir()  # not mkdtemp: that would make .mvc 0700 whatever the umask says
        try:
            _populate(staging, chunk_size)
            try:
                os.rename(staging, mvc_dir)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another init won the race
                    raise RepositoryExists(f"{mvc_dir} already exists") from None
                raise
            fsync_dir(root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return cls(root)

    @classmethod
    def open(cls, path="."):
        """Open the repository at ``path`` or its nearest parent; NotARepository if none."""
        return cls(find_root(path))

    def close(self) -> None:
        self.packs.close()
        self.index.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- objects -----------------------------------------------------------

    def _object(self, txn: Txn, kind: str, oid: bytes, what: str) -> bytes:
        data = txn.get(kind, oid)
        if data is None:
            raise ObjectNotFound(f"{what} {oid.hex()[:12]} is missing from the index; run 'mvc fsck'")
        return data

    def _commit_object(self, txn: Txn, oid: bytes) -> CommitObject:
        return CommitObject.decode(self._object(txn, "commits", oid, "commit"))

    def _tree_object(self, txn: Txn, oid: bytes) -> TreeObject:
        return TreeObject.decode(self._object(txn, "trees", oid, "tree"))

    def _tensor_object(self, txn: Txn, oid: bytes) -> TensorObject:
        return TensorObject.decode(self._object(txn, "tensors", oid, "tensor"))

    @staticmethod
    def _to_commit(oid: bytes, obj: CommitObject, stats=None, pruned: bool = False) -> Commit:
        return Commit(oid.hex(), obj.tree.hex(), tuple(p.hex() for p in obj.parents), obj.message,
                      obj.author, obj.time / 1e6, obj.step, obj.epoch, dict(obj.metrics),
                      dict(obj.context), stats, pruned)

    def _commit_tree(self, txn: Txn, oid: bytes) -> TreeObject:
        """The tree of commit ``oid``; ObjectNotFound saying so if retention pruned it."""
        obj = self._commit_object(txn, oid)
        note = txn.pruned(oid)
        if note is not None:
            note = note if isinstance(note, dict) else {}
            when = time.strftime("%Y-%m-%d", time.localtime(note.get("time", 0) / 1e6))
            raise ObjectNotFound(f"commit {oid.hex()[:12]} was pruned by gc ({note.get('policy', 'retention')}) "
                                 f"on {when}: its record is kept but its tensors are gone; load a kept commit")
        return self._tree_object(txn, obj.tree)

    # -- revisions ---------------------------------------------------------

    def _head(self, txn: Txn) -> tuple:
        """(branch ref name or None, commit id or None) that HEAD names."""
        head = txn.ref(refs.HEAD)
        if head is None:
            raise CorruptObject("HEAD is missing from the index; run 'mvc checkout BRANCH' to set it again")
        if head.target is None:
            return None, head.id
        ref = txn.ref(head.target)
        return head.target, (ref.id if ref else None)

    def _resolve_base(self, txn: Txn, base: str) -> bytes:
        if base in (refs.HEAD, "@"):
            branch, oid = self._head(txn)
            if oid is None:
                raise UnknownRevision(f"HEAD: branch {branch[len(refs.BRANCHES):]!r} has no commits yet")
            return oid
        lower = base.lower()
        if len(base) == 64 and all(c in "0123456789abcdef" for c in lower):
            oid = bytes.fromhex(lower)
            if txn.get("commits", oid) is not None:
                return oid
        for name in (base, refs.BRANCHES + base, refs.TAGS + base):
            if name.startswith((refs.BRANCHES, refs.TAGS)):
                ref = txn.ref(name)
                if ref is not None and ref.id is not None:
                    return ref.id
        if len(base) >= refs.MIN_PREFIX and all(c in "0123456789abcdef" for c in lower):
            matches = self._prefix_matches(txn, lower)
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                shown = ", ".join(m.hex()[:12] for m in matches[:5])
                raise AmbiguousRevision(f"id prefix {base!r} matches {len(matches)} commits ({shown}); "
                                        "give more digits")
        raise UnknownRevision(f"unknown revision {base!r}: no commit, branch or tag by that name")

    def _prefix_matches(self, txn: Txn, prefix: str) -> list:
        floor = bytes.fromhex(prefix[: len(prefix) // 2 * 2])
        return [oid for oid in txn.ids("commits", floor) if oid.hex().startswith(prefix)]

    def _resolve(self, txn: Txn, rev: str) -> bytes:
        base, ops = refs.split_revision(rev)
        oid = self._resolve_base(txn, base)
        for op, n in ops:
            if op == "~":
                for _ in range(n):
                    oid = self._parent(txn, oid, 1, rev)
            elif n:
                oid = self._parent(txn, oid, n, rev)
        return oid

    def _parent(self, txn: Txn, oid: bytes, nth: int, rev: str) -> bytes:
        parents = self._commit_object(txn, oid).parents
        if len(parents) < nth:
            raise UnknownRevision(f"{rev}: commit {oid.hex()[:12]} has no parent number {nth}")
        return parents[nth - 1]

    def resolve(self, rev: str = refs.HEAD) -> str:
        """The full hex id of the commit ``rev`` names; UnknownRevision/AmbiguousRevision."""
        with self.index.read() as txn:
            return self._resolve(txn, rev).hex()

    def get_commit(self, rev: str = refs.HEAD) -> Commit:
        with self.index.read() as txn:
            oid = self._resolve(txn, rev)
            return self._to_commit(oid, self._commit_object(txn, oid), pruned=txn.pruned(oid) is not None)

    def log(self, rev: Optional[str] = None, n: Optional[int] = None) -> Iterator[Commit]:
        """Commits from ``rev`` (default HEAD) along first parents, newest first.

        An unborn HEAD (no commits yet) gives an empty log.
        """
        with self.index.read() as txn:
            if rev is None:
                oid = self._head(txn)[1]
            else:
                oid = self._resolve(txn, rev)
            commits = []
            while oid is not None and (n is None or len(commits) < n):
                obj = self._commit_object(txn, oid)
                commits.append(self._to_commit(oid, obj, pruned=txn.pruned(oid) is not None))
                oid = obj.parents[0] if obj.parents else None
        return iter(commits)

    # -- commit ------------------------------------------------------------

    def _target_ref(self, txn: Txn, branch: Optional[str]) -> Optional[str]:
        """The branch ref a commit moves: ``branch`` or HEAD's; None when detached."""
        if branch is not None:
            return refs.BRANCHES + refs.check_name(branch, "branch")
        return self._head(txn)[0]

    def _tip(self, txn: Txn, ref: Optional[str]) -> Optional[bytes]:
        if ref is None:
            return self._head(txn)[1]
        value = txn.ref(ref)
        return value.id if value else None

    def commit(self, state, message: str = "", *, step: Optional[int] = None,
               epoch: Optional[int] = None, metrics: Optional[dict] = None,
               context: Optional[dict] = None, branch: Optional[str] = None,
               author: Optional[str] = None, rebase: bool = False,
               progress: Optional[Callable[[int, int], None]] = None) -> Commit:
        """Store ``state`` as a new commit on ``branch`` (default: HEAD's branch).

        The branch moves by compare-and-swap from the tip it had when the
        commit started; if another commit landed meanwhile this raises
        RefConflict, or with ``rebase=True`` commits onto the new tip.
        ``progress(done, total)`` is called with the bytes hashed so far.
        Raises BadInput for a state or metadata that cannot be stored,
        ProtectedRef / LockHeld if the branch may not move; in every case
        before any chunk is written.
        """
        record = _record(message, step, epoch, metrics, context, author or default_author())
        me = locking.this_process(record.author)
        # The shared gc lock covers the first dedup lookup through the index
        # transaction: gc must not delete a chunk this commit chose not to write.
        with locking.shared_gc_lock(self.dir / "locks", self.lock_timeout):
            with self.index.read() as txn:
                ref = self._target_ref(txn, branch)
                parent = self._tip(txn, ref)
                self._check_target(txn, ref, me)  # before writing chunks, and again below
            root, slots = _state_module().flatten(state)
            new_chunks, stats = self._write_chunks(slots, progress)
            tensors = _encode_tensors(slots, self.chunk_size)
            tree_data = TreeObject(_state_module().tree_root(root)).encode()
            with self.index.write() as txn:
                tip = self._tip(txn, ref)
                if tip != parent and not rebase:
                    raise RefConflict(self._conflict_message(ref, parent, tip))
                self._check_target(txn, ref, me)
                for cid, loc in new_chunks.items():
                    txn.put_chunk(cid, loc)
                for tid, data in tensors.items():
                    txn.put("tensors", tid, data)
                tree_id = object_id(tree_data)
                txn.put("trees", tree_id, tree_data)
                obj = replace(record, tree=tree_id, parents=(tip,) if tip else (), time=_now_us())
                oid = object_id(data := obj.encode())
                txn.put("commits", oid, data)
                title = message.splitlines()[0] if message else ""
                self._move_ref(txn, ref or refs.HEAD, tip, oid, f"commit: {title}")
        return replace(self._to_commit(oid, obj, stats),
                       branch=ref[len(refs.BRANCHES):] if ref else None)

    def _check_target(self, txn: Txn, ref: Optional[str], me: locking.Holder) -> None:
        """ProtectedRef / LockHeld if a commit may not move ``ref``."""
        self._check_can_move(txn, ref)
        self._check_writer(txn, ref, me)

    @staticmethod
    def _conflict_message(ref, old, new) -> str:
        name = ref[len(refs.BRANCHES):] if ref else "HEAD"
        was = old.hex()[:12] if old else "nothing"
        now = new.hex()[:12] if new else "nothing"
        return (f"branch {name!r} moved from {was} to {now} while this commit was written; "
                "nothing was committed: commit again on top of the new tip")

    def _check_can_move(self, txn: Txn, ref: Optional[str]) -> None:
        """Refuse to move a protected ref (commits included)."""
        if ref is None:
            return
        value = txn.ref(ref)
        if value is not None and value.protected:
            raise ProtectedRef(f"{_human(ref)} is protected; nothing was committed: unprotect it "
                               "first (mvc branch --unprotect NAME)")

    @staticmethod
    def _check_writer(txn: Txn, ref: Optional[str], me: locking.Holder) -> None:
        """LockHeld if another live owner holds the write lock of branch ``ref``."""
        if ref is not None and ref.startswith(refs.BRANCHES):
            locking.check_writer(txn, ref[len(refs.BRANCHES):], me)

    def _move_ref(self, txn: Txn, ref: str, old: Optional[bytes], new: Optional[bytes], why: str,
                  protected: Optional[bool] = None) -> None:
        current = txn.ref(ref)
        if ref == refs.HEAD and (current is None or current.target is None):
            txn.set_ref(ref, RefValue(id=new))
        elif new is None:
            txn.delete_ref(ref)
        else:
            keep = current.protected if current is not None and current.id is not None else False
            txn.set_ref(ref, RefValue(id=new, protected=keep if protected is None else protected))
        txn.append_reflog(ref, {"old": old, "new": new, "time": _now_us(), "message": why})

    def _write_chunks(self, slots: list, progress) -> tuple:
        """Hash every chunk (in threads) and append the new ones to one new pack.

        Sets ``slot.chunks``; returns ({chunk id: Location}, CommitStats).
        """
        size = self.chunk_size
        spans = [(slot, off, min(size, slot.data.nbytes - off))
                 for slot in slots for off in range(0, slot.data.nbytes, size)]
        for slot in slots:
            slot.chunks = []

        def hash_batch(batch):
            return [hashing.digest(slot.data[off:off + n]) for slot, off, n in batch]

        new, writer, bytes_new, done = {}, None, 0, 0
        total = sum(s.data.nbytes for s in slots)
        try:
            with ThreadPoolExecutor(THREADS) as pool, self.index.read() as txn:
                batches = _batches(spans, lambda s: s[2])
                for batch, digests in zip(batches, pool.map(hash_batch, batches)):
                    for (slot, off, n), cid in zip(batch, digests):
                        slot.chunks.append(cid)
                        if cid not in new and txn.chunk(cid) is None:
                            writer = writer or PackWriter(self.dir / "packs")
                            new[cid] = writer.add(cid, slot.data[off:off + n])
                            bytes_new += n
                    done += sum(s[2] for s in batch)
                    if progress:
                        progress(done, total)
            if writer:
                writer.seal()
        except BaseException as exc:
            if writer:
                writer.abort()
            if isinstance(exc, OSError):  # a full disk, above all: say what failed and that nothing changed
                raise OSError(exc.errno, f"{exc.strerror or exc} while writing a pack in {self.dir / 'packs'}; "
                                         "nothing was committed") from exc
            raise
        return new, CommitStats(len(slots), len(spans), len(new), total, bytes_new)

    # -- load --------------------------------------------------------------

    def load(self, rev: str = refs.HEAD, map_location=None,
             progress: Optional[Callable[[int, int], None]] = None):
        """The state committed at ``rev``: the same nested structure, CPU tensors.

        ``map_location`` (a device or device string) moves tensors after loading.
        Every chunk is verified against its id; ChecksumMismatch names the
        tensor's key path and the commit. ``progress(done, total)`` is called
        with the bytes read so far.
        """
        # gc must not move or delete a pack between reading a location and reading the pack
        with locking.shared_gc_lock(self.dir / "locks", self.lock_timeout), self.index.read() as txn:
            oid = self._resolve(txn, rev)
            tree = self._commit_tree(txn, oid)
            leaves = [(p, leaf) for p, leaf in walk(tree.root) if isinstance(leaf, TensorLeaf)]
            tensors = self._read_tensors(txn, leaves, oid, progress)
        return _state_module().materialize(tree.root, tensors, map_location)

    def _read_tensors(self, txn: Txn, leaves: list, commit_id: bytes, progress=None) -> dict:
        """{tensor id: CPU tensor} for the leaves, read in threads and verified."""
        jobs, out = [], {}
        for path, leaf in leaves:
            if leaf.id in out:
                continue
            obj = self._tensor_object(txn, leaf.id)
            out[leaf.id], buffer = _state_module().empty_tensor(obj.shape, obj.dtype)
            for cid, off, n in obj.chunk_spans():
                jobs.append((self._location(txn, cid, path, commit_id), buffer[off:off + n], cid, path))
        self._run_reads(jobs, commit_id, progress)
        return out

    def _location(self, txn: Txn, cid: bytes, path: tuple, commit_id: bytes):
        loc = txn.chunk(cid)
        if loc is None:
            raise ObjectNotFound(f"chunk {cid.hex()[:12]} of tensor {format_path(path)!r} in commit "
                                 f"{commit_id.hex()[:12]} is missing from the index; run 'mvc fsck'")
        return loc

    def _run_reads(self, jobs: list, commit_id: bytes, progress=None) -> None:
        def read_batch(batch):
            for run in batch:
                for loc, buffer, cid, path in run:
                    if loc.length != buffer.nbytes:
                        raise CorruptObject(f"chunk {cid.hex()[:12]} of tensor {format_path(path)!r} has "
                                            "the wrong length in the index; run 'mvc fsck'")
                self.packs.read_run([job[0] for job in run], [job[1] for job in run])
                for loc, buffer, cid, path in run:
                    if hashing.digest(buffer) != cid:
                        raise ChecksumMismatch(
                            f"chunk {cid.hex()[:12]} of tensor {format_path(path)!r} in commit "
                            f"{commit_id.hex()[:12]} is corrupt (BLAKE3 mismatch); run 'mvc fsck'")
            return sum(job[1].nbytes for run in batch for job in run)
        runs = _runs(jobs)
        total, done = sum(job[1].nbytes for job in jobs), 0
        # Cold packs: start the kernel reading every run now, so the reads
        # below find it in the cache instead of waiting for the disk in turn.
        self.packs.prefetch([[job[0] for job in run] for run in runs])
        with ThreadPoolExecutor(THREADS) as pool:
            for n in pool.map(read_batch, _batches(runs, lambda run: sum(j[1].nbytes for j in run))):
                done += n
                if progress:
                    progress(done, total)

    def read_chunk(self, chunk_id: bytes, what: str = "") -> bytes:
        """One chunk's verified bytes; ObjectNotFound / ChecksumMismatch.

        A caller reading many chunks holds ``locks.shared_gc_lock`` around
        them, so gc in another process cannot move a pack meanwhile.
        """
        with self.index.read() as txn:
            loc = txn.chunk(chunk_id)
        if loc is None:
            raise ObjectNotFound(f"chunk {chunk_id.hex()[:12]}{what} is missing from the index")
        data = self.packs.read(loc)
        if hashing.digest(data) != chunk_id:
            raise ChecksumMismatch(f"chunk {chunk_id.hex()[:12]}{what} is corrupt (BLAKE3 mismatch)")
        return data

    def tensor_object(self, tensor_id: str) -> TensorObject:
        with self.index.read() as txn:
            return self._tensor_object(txn, bytes.fromhex(tensor_id))

    def entries(self, rev: str = refs.HEAD) -> list:
        """Every leaf of the tree at ``rev``, in key order (no tensor data is read)."""
        with self.index.read() as txn:
            oid = self._resolve(txn, rev)
            tree = self._commit_tree(txn, oid)
            out = []
            for path, leaf in walk(tree.root):
                if isinstance(leaf, TensorLeaf):
                    obj = self._tensor_object(txn, leaf.id)
                    out.append(Entry(path, "tensor", obj.dtype, obj.shape, obj.nbytes, leaf.id.hex(), obj.chunks))
                else:
                    out.append(Entry(path, "value", value=leaf))
        return out

    # -- refs --------------------------------------------------------------

    def head(self) -> Head:
        with self.index.read() as txn:
            ref, oid = self._head(txn)
        return Head(ref[len(refs.BRANCHES):] if ref else None, oid.hex() if oid else None)

    def _refs(self, prefix: str) -> list:
        with self.index.read() as txn:
            return [Ref(name[len(prefix):], v.id.hex(), v.protected)
                    for name, v in txn.refs(prefix) if v.id is not None]

    def branches(self) -> list:
        return self._refs(refs.BRANCHES)

    def tags(self) -> list:
        return self._refs(refs.TAGS)

    def _set_ref(self, ref: str, rev: str, force: bool, protect: Optional[bool], why: str) -> Ref:
        with self.index.write() as txn:
            oid = self._resolve(txn, rev)
            current = txn.ref(ref)
            self._check_writer(txn, ref, locking.this_process(default_author()))
            if current is not None and not force:
                if current.protected and current.id != oid:
                    raise ProtectedRef(f"{_human(ref)} is protected; pass --force to move it")
                if current.id != oid:
                    raise RefConflict(f"{_human(ref)} already exists at {current.id.hex()[:12]}; "
                                      "pass --force to move it")
            self._move_ref(txn, ref, current.id if current else None, oid, why, protect)
            value = txn.ref(ref)
        return Ref(ref.split("/", 1)[1], oid.hex(), value.protected)

    def _delete_ref(self, ref: str, force: bool) -> None:
        with self.index.write() as txn:
            current = txn.ref(ref)
            if current is None:
                raise UnknownRevision(f"{_human(ref)} does not exist")
            if current.protected and not force:
                raise ProtectedRef(f"{_human(ref)} is protected; pass --force to delete it")
            self._check_writer(txn, ref, locking.this_process(default_author()))
            if self._head(txn)[0] == ref:
                raise RefConflict(f"{_human(ref)} is checked out; check out another branch first")
            txn.delete_ref(ref)
            # Like Git, a deleted ref's reflog goes with it, so gc can reclaim its history.
            for _, seq, _ in list(txn.reflog_raw(ref)):  # raw: a damaged entry must not block this
                txn.delete_reflog(ref, seq)

    def create_branch(self, name: str, rev: str = refs.HEAD, force: bool = False,
                      protect: Optional[bool] = None) -> Ref:
        """Point branch ``name`` at ``rev``; RefConflict if it exists elsewhere (unless force).

        ``protect`` True/False sets its protection in the same transaction.
        """
        ref = refs.BRANCHES + refs.check_name(name, "branch")
        return self._set_ref(ref, rev, force, protect, f"branch: {rev}")

    def delete_branch(self, name: str, force: bool = False) -> None:
        self._delete_ref(refs.BRANCHES + refs.check_name(name, "branch"), force)

    def create_tag(self, name: str, rev: str = refs.HEAD, protect: Optional[bool] = None,
                   force: bool = False) -> Ref:
        """Tag ``rev``; a protected tag is not moved or deleted without ``force``."""
        ref = refs.TAGS + refs.check_name(name, "tag")
        return self._set_ref(ref, rev, force, protect, f"tag: {rev}")

    def delete_tag(self, name: str, force: bool = False) -> None:
        self._delete_ref(refs.TAGS + refs.check_name(name, "tag"), force)

    def set_protected(self, name: str, protected: bool = True, kind: str = "branch") -> Ref:
        """Protect or unprotect a branch or tag (kind "branch" or "tag")."""
        ref = (refs.BRANCHES if kind == "branch" else refs.TAGS) + refs.check_name(name, kind)
        with self.index.write() as txn:
            current = txn.ref(ref)
            if current is None:
                raise UnknownRevision(f"{_human(ref)} does not exist")
            txn.set_ref(ref, RefValue(id=current.id, protected=protected))
        return Ref(name, current.id.hex(), protected)

    # -- branch locks (mvc/locks.py) --------------------------------------

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

    def checkout(self, rev: str) -> Head:
        """Move HEAD: onto a branch (by name) or detached at any other revision."""
        with self.index.write() as txn:
            ref = refs.BRANCHES + rev
            value = txn.ref(ref) if refs.is_valid_name(rev) else None
            head = txn.ref(refs.HEAD)
            old = None if head is None else self._head(txn)[1]  # checkout repairs a lost HEAD
            if value is not None:
                txn.set_ref(refs.HEAD, RefValue(target=ref))
                new = value.id
            else:
                new = self._resolve(txn, rev)
                txn.set_ref(refs.HEAD, RefValue(id=new))
            txn.append_reflog(refs.HEAD, {"old": old, "new": new, "time": _now_us(),
                                          "message": f"checkout: {rev}"})
        return self.head()

    def status(self) -> Status:
        with self.index.read() as txn:
            ref, oid = self._head(txn)
            n_branches = sum(1 for _ in txn.refs(refs.BRANCHES))
            n_tags = sum(1 for _ in txn.refs(refs.TAGS))
            n_commits = sum(1 for _ in txn.ids("commits"))
            n_chunks = sum(1 for _ in txn.ids("chunks"))
        packs = [p for p in (self.dir / "packs").iterdir() if PACK_NAME.fullmatch(p.name)]
        head = Head(ref[len(refs.BRANCHES):] if ref else None, oid.hex() if oid else None)
        return Status(str(self.root), head, n_branches, n_tags, n_commits, n_chunks, len(packs),
                      sum(p.stat().st_size for p in packs), self.chunk_size)


def _human(ref: str) -> str:
    kind, _, name = ref.partition("/")
    return f"{'branch' if kind == 'heads' else 'tag'} {name!r}"
