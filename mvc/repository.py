"""The repository's core: the index, chunk store, object store, refs and locks
of one ``.mvc`` folder, composed, and the entry points of its verbs.

Every verb lives in a module that takes this core as its narrow input
(``mvc.commits``, ``mvc.reader``, ``mvc.live``, ``mvc.diff``, ``mvc.exchange``,
``mvc.fsck``, ``mvc.gc``, ``mvc.repack``, ``mvc.merge``, ``mvc.history``,
``mvc.refverbs``); families of verbs are groups: ``remotes`` and ``cache``
(``mvc.remote.verbs``), ``shards``, ``bisect``, ``trust`` (``mvc.audit``),
``locks`` (``mvc.writelocks``), ``reflog`` (``mvc.refverbs``). The user guide's (docs/guide.md)
"What moved" lists the old method names; ``docs/architecture.md`` the map.
"""

import functools
import itertools
from pathlib import Path
from typing import Callable, Iterator, Optional

from . import commits, diff as diffs, exchange, fsck as checks, gc as collect, reach, reader, refs, refverbs
from . import repack as repacks
from .audit import RefPolicy, Trust
from .bisect import Bisect
from .errors import CorruptObject
from .ondisk import (DEFAULT_CHUNK_SIZE, ENCODED_RECORDS, MVC_DIR, PACK_INDEXES, SEALED_VALUES, SUBDIRS, create,
                     find_root, read_format, require_extension, write_format)
from .objects import TensorLeaf, TensorObject
from .records import Commit, Entry, Export, Head, Ref, Status
from .refverbs import Reflog
from .remote import sync, tiers
from .remote.verbs import Cache, Remotes, setting, settings
from .shards import Shards
from .store import fs
from .store.chunks import PackStore
from .store.index import Index, read_only
from .store.locks import GcLock
from .store.objectstore import ObjectStore
from .traverse import walk
from .writelocks import Locks


class _Group:
    """A verb group, made on each access (a repository that held its groups would
    be a reference cycle, its index and packs freed only by the cyclic gc)."""

    def __init__(self, cls):
        self.cls = cls

    def __get__(self, repo, owner=None):
        return self if repo is None else self.cls(repo)


class Repository:
    """A ``.mvc`` repository. ``Repository.init(path)`` creates one,
    ``Repository.open(path)`` finds one in ``path`` or above.

    Composed of an index (``index``), the chunk store (``chunks``, where
    chunk bytes live), the object store (``objects``), the refs (``refs``)
    and the gc lock (``gc_lock``). Reads (load, entries, diff ...) may run
    from several threads; commits and ref changes come from one thread at
    a time.
    """

    remotes, cache, shards = _Group(Remotes), _Group(Cache), _Group(Shards)
    bisect, trust, locks, reflog = _Group(Bisect), _Group(Trust), _Group(Locks), _Group(Reflog)

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
        self.chunks = PackStore(self.dir / "packs", 2 if ENCODED_RECORDS in extensions else 1, self.index.readonly,
                                functools.partial(require_extension, self.dir, PACK_INDEXES))
        self.refs = refs.Refs(self.objects, commits.now_us, RefPolicy(self.root))  # signing.require, on every move
        self.gc_lock = GcLock(self.dir / "locks")
        self._live = None  # mvc.live.LiveRecords, made on first use
        with self.index.read() as txn:
            raw = txn.meta("chunk_size")
        if raw is None or len(raw) != 8:
            raise CorruptObject(f"the index in {self.dir} has no valid chunk_size setting; it is damaged: "
                                "restore .mvc/index from a backup", kind="index", field="chunk_size")
        self.chunk_size = int.from_bytes(raw, "little")
        if SEALED_VALUES not in extensions and not self.index.readonly:
            # this mvc writes sealed values: say so first, so an older mvc refuses clearly
            write_format(self.dir, extensions | {SEALED_VALUES})
        self.chunks = tiers.chunk_store(self)  # a CacheStore in front of PackStore when a remote is cached
        self.objects = tiers.object_store(self)  # then tensor objects missing here are read from it too

    @property
    def lock_timeout(self) -> float:
        """Seconds a commit or load waits for a running gc (and gc for them)."""
        return self.gc_lock.timeout

    @lock_timeout.setter
    def lock_timeout(self, seconds: float) -> None:
        self.gc_lock.timeout = seconds

    @property
    def live(self):
        """What each live tensor last received from ``load_into`` (``mvc.live.LiveRecords``)."""
        if self._live is None:
            from . import live  # torch (see mvc.commits)
            self._live = live.LiveRecords()
        return self._live

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def init(cls, path=".", chunk_size: int = DEFAULT_CHUNK_SIZE) -> "Repository":
        """Create ``path/.mvc`` and open it; RepositoryExists if it is there."""
        return cls(create(path, chunk_size))

    @classmethod
    def open(cls, path=".") -> "Repository":
        """Open the repository at ``path`` or its nearest parent; NotARepository if none."""
        return cls(find_root(path))

    @classmethod
    def clone(cls, url: str, path, lazy: bool = False, endpoint_url: Optional[str] = None,
              progress=None) -> "Repository":
        """A new repository at ``path`` with the history of the remote at ``url`` (remote ``origin``).

        ``lazy``: metadata only; chunks are read from the remote on demand and
        cached. The clone's fetch report is ``repo.cloned``.
        """
        repo, report = sync.clone(cls, url, path, lazy, endpoint_url, progress=progress)
        repo.cloned = report
        return repo

    def close(self) -> None:
        self.chunks.close()
        self.index.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- history -----------------------------------------------------------

    def resolve(self, rev: str = refs.HEAD) -> str:
        """The full hex id of the commit ``rev`` names; UnknownRevision/AmbiguousRevision."""
        with self.index.read() as txn:
            return self.refs.resolve(txn, rev).hex()

    def get_commit(self, rev: str = refs.HEAD) -> Commit:
        with self.index.read() as txn:
            oid = self.refs.resolve(txn, rev)
            return commits.to_commit(oid, self.objects.commit(txn, oid),
                                     pruned=self.objects.pruned(txn, oid) is not None)

    def log(self, rev: Optional[str] = None, n: Optional[int] = None) -> Iterator[Commit]:
        """Commits from ``rev`` (default HEAD) along first parents, newest first; none on an unborn HEAD."""
        with self.index.read() as txn:
            oid = self.refs.head(txn)[1] if rev is None else self.refs.resolve(txn, rev)
            line = reach.first_parents(lambda c: self.objects.commit(txn, c), oid)
            found = [commits.to_commit(c, obj, pruned=self.objects.pruned(txn, c) is not None)
                     for c, obj in itertools.islice(line, n)]
        return iter(found)

    def tensor_object(self, tensor_id: str) -> TensorObject:
        with self.index.read() as txn:
            return self.objects.tensor(txn, bytes.fromhex(tensor_id))

    def entries(self, rev: str = refs.HEAD) -> list:
        """Every leaf of the tree at ``rev``, in key order, no tensor data read; CommitPruned if gc pruned it."""
        with self.index.read() as txn:
            tree = self.objects.commit_tree(txn, self.refs.resolve(txn, rev))
            out = []
            leaves = self.objects.ahead(txn, "tensors", walk(tree.root),
                                        lambda item: item[1].id if isinstance(item[1], TensorLeaf) else None)
            for path, leaf in leaves:
                if isinstance(leaf, TensorLeaf):
                    obj = self.objects.tensor(txn, leaf.id)
                    out.append(Entry(path, "tensor", obj.dtype, obj.shape, obj.nbytes, leaf.id.hex(), obj.chunks))
                else:
                    out.append(Entry(path, "value", value=leaf))
        return out

    # -- the headline verbs (each module's docstring says more) ---------------

    def commit(self, state, message: str = "", **options) -> Commit:
        """Store ``state`` as a new commit; see ``mvc.commits.commit`` for the options."""
        return commits.commit(self, state, message, **options)

    def load(self, rev: str = refs.HEAD, map_location=None,
             progress: Optional[Callable[[int, int], None]] = None, only: Optional[str] = None):
        """The state committed at ``rev``, verified; see ``mvc.reader.load``."""
        return reader.load(self, rev, map_location, progress, only)

    def load_into(self, targets: dict, rev: str = refs.HEAD, *, check_live: bool = True):
        """Update live tensors in place to commit ``rev``, reading only what differs; see ``mvc.live.load_into``."""
        from . import live  # torch (see mvc.commits)
        return live.load_into(self, targets, rev, check_live)

    def diff(self, a: str, b=None, only=None, read_data: bool = True) -> "diffs.Diff":
        """Compare commit ``a`` with ``b`` (default HEAD); see ``mvc.diff.diff``."""
        return diffs.diff(self, a, b, only, read_data)

    def export(self, rev: str, path, fmt=None, progress=None, **options) -> Export:
        """Write the checkpoint at ``rev`` to ``path`` (.pt, .safetensors or a folder); see ``mvc.exchange.export``."""
        return exchange.export(self, rev, path, fmt, progress, **options)

    def commit_file(self, path, message=None, **options) -> Commit:
        """Commit a checkpoint file or model folder; see ``mvc.exchange.commit_file``."""
        return exchange.commit_file(self, path, message, **options)

    def merge(self, revs, recipe=None, **options):
        """Merge the checkpoints at ``revs`` into a merge commit; see ``mvc.merge.merge``."""
        from . import merge  # torch (see mvc.commits)
        return merge.merge(self, revs, recipe, **options)

    def fsck(self, quick: bool = False, threads=None, progress=None) -> "checks.FsckReport":
        """Check everything reachable; see ``mvc.fsck.fsck``. Damage to a chunk a remote's last
        listing holds is marked with that remote (``Damage.remotes``): not lost."""
        report = checks.fsck(self, quick=quick, threads=threads, progress=progress)
        return checks.mark_restorable(report, self.cache.restorable)

    def gc(self, *, expire_reflog: Optional[float] = None, dry_run: bool = False, **options) -> "collect.GcReport":
        """Prune by retention, delete what nothing reaches, reclaim pack space; see ``mvc.gc.gc``.
        ``expire_reflog``: first delete reflog entries older than this many seconds (0: all)."""
        if expire_reflog is not None and not dry_run:
            self.reflog.expire(older_than=expire_reflog)
        return collect.gc(self, dry_run=dry_run, **options)

    def repack(self, depth: Optional[int] = None, dry_run: bool = False, progress=None) -> "repacks.RepackReport":
        """Re-encode live raw chunks as byte-grouped zstd or deltas where it pays; see ``mvc.repack.repack``."""
        return repacks.repack(self, depth=depth, dry_run=dry_run, progress=progress)

    def reread_format(self) -> None:
        """Take up what another process listed in FORMAT since this one opened the repository:
        a repack there turns on encoded records, and whatever copies records as they are (gc's
        and eviction's compaction) must then write version 2 packs. Called under the exclusive
        gc lock, which that repack held while it changed FORMAT. UnsupportedFormat if FORMAT
        now names what this mvc does not know."""
        if ENCODED_RECORDS in read_format(self.dir)[1]:
            self.chunks.accept_encoded()

    def enable_encoded_records(self) -> None:
        """List the encoded-records extension in FORMAT; new packs are then version 2 packs."""
        if self.index.readonly:  # before FORMAT changes: here nothing may
            raise read_only(self.dir)
        require_extension(self.dir, ENCODED_RECORDS)
        self.chunks.accept_encoded()

    def config(self, key: str, value: Optional[str] = None, unset: bool = False) -> Optional[str]:
        """Read, set or unset a setting; see ``mvc.remote.verbs.setting``."""
        return setting(self, key, value, unset)

    def settings(self) -> dict:
        """{key: value} of every setting that is set; see ``mvc.remote.verbs.settings``."""
        return settings(self)

    def status(self) -> Status:
        with self.index.read() as txn:
            ref, oid = self.refs.head(txn)
            counts = [sum(1 for _ in it) for it in (txn.refs(refs.BRANCHES), txn.refs(refs.TAGS),
                                                    txn.ids("commits"), txn.ids("chunks"))]
        packs = [f for f in self.chunks.pack_files() if f.pack is not None and f.regular]
        head = Head(refs.short_name(ref) if ref else None, oid.hex() if oid else None)
        return Status(str(self.root), head, *counts, len(packs), sum(f.size for f in packs), self.chunk_size)

    # -- refs --------------------------------------------------------------

    def head(self) -> Head:
        with self.index.read() as txn:
            ref, oid = self.refs.head(txn)
        return Head(refs.short_name(ref) if ref else None, oid.hex() if oid else None)

    def listed(self, prefix: str) -> list:
        """The refs under ``prefix`` (``refs.BRANCHES``, ``refs.TAGS``, tracking refs), as Refs."""
        with self.index.read() as txn:
            return [Ref(name, oid.hex(), protected) for name, oid, protected in self.refs.listed(txn, prefix)]

    def branches(self) -> list:
        return self.listed(refs.BRANCHES)

    def tags(self) -> list:
        return self.listed(refs.TAGS)

    def checkout(self, rev: str, new_branch: Optional[str] = None) -> Head:
        """Move HEAD onto a branch, detached at a revision, or (``new_branch``) onto a new branch at ``rev``."""
        return refverbs.checkout(self, rev, new_branch)

    def create_branch(self, name: str, rev: str = refs.HEAD, force: bool = False,
                      protect: Optional[bool] = None) -> Ref:
        """Point branch ``name`` at ``rev``; see ``mvc.refverbs.create_branch``."""
        return refverbs.create_branch(self, name, rev, force, protect)

    def delete_branch(self, name: str, force: bool = False) -> str:
        """Delete branch ``name`` (see ``mvc.refverbs.delete_branch``); the hex id it named."""
        return refverbs.delete_branch(self, name, force)

    def rename_branch(self, old: str, new: str, force: bool = False) -> Ref:
        """Rename branch ``old`` to ``new``, keeping its protection and reflog; HEAD follows."""
        return refverbs.rename_branch(self, old, new, force)

    def create_tag(self, name: str, rev: str = refs.HEAD, protect: Optional[bool] = None,
                   force: bool = False, sign=None, message: str = "") -> Ref:
        """Tag ``rev`` (signed with ``sign``); see ``mvc.refverbs.create_tag``."""
        return refverbs.create_tag(self, name, rev, protect, force, sign, message)

    def delete_tag(self, name: str, force: bool = False) -> None:
        refverbs.delete_tag(self, name, force)

    def set_protected(self, name: str, protected: bool = True, kind: str = "branch") -> Ref:
        """Protect or unprotect a branch or tag (kind "branch" or "tag")."""
        return refverbs.set_protected(self, name, protected, kind)
