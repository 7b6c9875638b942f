"""torch.distributed.checkpoint storage backed by an mvc repository.

``MvcStorageWriter`` and ``MvcStorageReader`` implement DCP's
``StorageWriter`` and ``StorageReader``, so ``dcp.save``, ``dcp.async_save``
and ``dcp.load`` read and write mvc commits::

    writer = MvcStorageWriter("ckpts", branch="run-7", message="step 100", step=100)
    dcp.save(state, storage_writer=writer)      # writer.last_commit on rank 0
    dcp.load(state, storage_reader=MvcStorageReader("ckpts", rev="run-7"))

**Checkpoint ids.** ``path`` is the repository (found at ``path`` or
above; the writer creates it at ``path``). DCP's ``checkpoint_id`` names
one checkpoint, as a folder does for ``FileSystemWriter``: an id inside a
repository (``ckpts/step_100`` under the repository ``ckpts``) is the tag
``dcp/step_100`` (``ID_TAGS`` + the id's path from the root), which the
writer moves to its commit on ``branch`` once the commit landed; the reader
loads what that tag names, and an id with no tag is ``CheckpointNotFound``
(a FileNotFoundError; DCP reports it in its CheckpointException, as it
does FileSystemReader's). An id that is a repository's root is that
repository with ``branch`` / ``rev``. A reader with no ``rev`` loads HEAD;
the first save into a repository whose HEAD's branch has no commits puts
HEAD on the branch it committed to.

Call order and roles (DCP's, see ``torch/distributed/checkpoint/storage.py``):
every rank opens the repository in ``set_up_storage_writer`` (the
coordinator also checks the branch may move and reads its tip, the parent
the commit compares and swaps against); in ``write_data`` every rank hashes
its own write items and writes the chunks the repository lacks to its own
pack (``repo.shards.write``); DCP gathers each rank's plain
``WriteResult.storage_data`` to the coordinator, whose ``finish`` commits
everything in one transaction (``repo.shards.commit``). "Finished"
means that transaction committed: a crash of any rank before it leaves the
branch where it was. Every rank needs the repository's filesystem, unless
the save goes through a remote.

**Across hosts** (``remote="origin"``): each rank's ``path`` is a repository
on its own host that caches that remote (a clone of it). Every rank lists
the remote's packs first, so it writes only chunks neither it nor the
remote holds; after writing them to its own pack it indexes them locally
and uploads those the remote lacks (``Repository.upload_shards``), so its
chunks are durable on the remote before DCP reports its items to the
coordinator. The coordinator lists the remote again, commits the tree in
its own repository (every chunk must be local or on the remote) and pushes
the branch, which moves the remote branch by conditional write as every
push does.

No pickle is stored: tensors are raw chunks, DCP's metadata is kept as
plain values in the tree, an ``io.BytesIO`` value is kept as the bytes it
holds (kind ``bytes-io``, taken from the planner's state, never unpickled)
and loads as a BytesIO of them, and other ``BYTE_IO`` items (DCP's
``torch.save`` of non-tensor values) must load with
``torch.load(weights_only=True)`` or the save is refused. Values that
are plain (numbers, text, lists, tuples, dicts) are stored as such; others
(holding tensors, ``torch.Size`` ...) are kept as their bytes and loaded
again with ``weights_only=True`` only.
"""

import dataclasses
import io
import math
import os
import re
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Optional

import torch
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, SavePlan, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

import mvc

DCP_VERSION = "1.0.0"  # the metadata version of DCP's own FileSystemWriter in torch 2.13
READ_BATCH = 64 << 20  # bytes of chunks one read_data batch holds besides the target tensors
_PLAIN = (type(None), bool, int, float, str, bytes)
ID_TAGS = "dcp/"  # a checkpoint id inside a repository is the tag dcp/<its path from the root>


def open_repository(path, chunk_size: Optional[int] = None) -> mvc.Repository:
    """The repository at ``path`` (or above it), created at ``path`` if there is none.

    Every rank may call it at once: init is atomic, the losers open the winner's.
    """
    try:
        return mvc.Repository.open(path)
    except mvc.NotARepository:
        Path(path).mkdir(parents=True, exist_ok=True)
        try:
            if chunk_size is None:
                return mvc.Repository.init(path)
            return mvc.Repository.init(path, chunk_size=chunk_size)
        except mvc.RepositoryExists:
            return mvc.Repository.open(path)


def _exactly_plain(value, depth: int = 0) -> bool:
    """Whether ``value`` is made only of types an mvc tree keeps exactly
    (no subclasses: an OrderedDict or an enum would come back as its base)."""
    if depth > mvc.traverse.MAX_DEPTH:
        return False
    t = type(value)
    if t in _PLAIN:
        return t is not int or -(2**63) <= value < 2**64
    if t in (list, tuple):
        return all(_exactly_plain(v, depth + 1) for v in value)
    if t is dict:
        return all(type(k) in (str, int) and _exactly_plain(v, depth + 1) for k, v in value.items())
    return False


def _weights_only(raw: bytes, what: str):
    """``torch.load(weights_only=True)`` of ``raw``; BadInput if it refuses.

    An ``io.BytesIO`` is allowed too: rebuilding one only sets its buffer
    (DCP's planner torch.saves a BytesIO value as the object itself).
    """
    try:
        with torch.serialization.safe_globals([io.BytesIO]):
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # hostile or damaged bytes can make the unpickler raise anything
        found = re.search(r"(?i)unsupported global:? (?:GLOBAL )?([\w.]+)", str(exc))
        holds = f" ({found.group(1)})" if found else ""
        raise mvc.BadInput(f"{what} holds an object that weights-only loading refuses{holds}; mvc never "
                           "unpickles arbitrary objects: store plain values or tensors there") from None


def _fresh_bytes(value) -> io.BytesIO:
    """torch.save bytes of a value that is known safe, for a planner that unpickles."""
    out = io.BytesIO()
    torch.save(value, out)
    out.seek(0)
    return out


def _done(value=None) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


def _locate(checkpoint_id) -> tuple:
    """(repository, tag) of a DCP checkpoint id: the open repository holding
    it, and None when the id is the repository's root, else the tag
    ``dcp/`` + the id's path relative to the root. NotARepository if no
    repository holds it; InvalidRefName if the path makes no tag name."""
    path = Path(checkpoint_id).resolve()
    repo = mvc.Repository.open(path)
    if path == repo.root:
        return repo, None
    tag = ID_TAGS + "/".join(path.relative_to(repo.root).parts)
    try:
        mvc.check_ref_name(tag, "tag")
    except BaseException:
        repo.close()
        raise
    return repo, tag


def _an_id(checkpoint_id) -> bool:
    """Whether DCP's ``checkpoint_id`` is a local path (not a URL, not None)."""
    return isinstance(checkpoint_id, (str, os.PathLike)) and bool(os.fspath(checkpoint_id)) \
        and "://" not in os.fspath(checkpoint_id)


def _tag_of(repo: mvc.Repository, name: str) -> Optional[mvc.Ref]:
    return next((t for t in repo.tags() if t.name == name), None)


class MvcStorageWriter(StorageWriter):
    """Saves a DCP checkpoint as one mvc commit on ``branch`` (None: HEAD's branch).

    ``message``, ``step``, ``epoch``, ``metrics`` and ``context`` make the
    commit's record. ``path`` is the repository (at ``path`` or above it),
    created at ``path`` if there is none. A DCP ``checkpoint_id`` inside a
    repository (``dcp.save(..., checkpoint_id="ckpts/step_100")``) names one
    checkpoint: the commit also gets the tag ``dcp/step_100`` (see the
    module doc); one that is a repository's root is that repository.
    ``remote``: ranks on hosts without a shared filesystem, each with a
    repository at ``path`` that caches this remote (see the module doc).
    After a save, ``last_commit`` on the coordinator is the ``mvc.Commit``.

    DCP's ``FileSystemWriter`` keywords are taken, so code written for it
    runs unchanged: ``overwrite=False`` refuses a save to an id that already
    names a checkpoint (its tag exists; for the repository's root, ``branch``
    has a commit) with ``CheckpointExists``, before any rank writes a chunk.
    ``sync_files``, ``single_file_per_rank``, ``thread_count``,
    ``per_thread_copy_ahead``, ``cache_staged_state_dict`` and
    ``serialization_format`` change nothing (every save is fsynced, chunks
    are hashed in mvc's own threads, stored in mvc's own format);
    ``_extensions`` (stream transforms of the stored bytes) are refused.
    """

    def __init__(self, path, branch: Optional[str] = "main", message: str = "", step: Optional[int] = None,
                 metrics: Optional[dict] = None, *, epoch: Optional[int] = None,
                 context: Optional[dict] = None, chunk_size: Optional[int] = None, remote: Optional[str] = None,
                 overwrite: bool = True, single_file_per_rank: bool = True, sync_files: bool = True,
                 thread_count: int = 1, per_thread_copy_ahead: int = 10_000_000,
                 cache_staged_state_dict: bool = False, _extensions=None, serialization_format=None):
        self._hold = ExitStack()  # first: __del__ needs it even when a check below refuses
        super().__init__()
        if type(overwrite) is not bool:
            raise mvc.BadInput(f"overwrite must be True or False, not {overwrite!r}")
        if branch is not None and not isinstance(branch, str):  # FileSystemWriter(path, True) passed positionally
            raise mvc.BadInput(f"branch must be a branch name, not {branch!r}; MvcStorageWriter takes "
                               "FileSystemWriter's options as keywords only")
        if _extensions:
            raise mvc.BadInput("MvcStorageWriter takes no _extensions: mvc stores chunks in its own format "
                               "(compressed by the repository's own encodings, verified on every read)")
        self.overwrite = overwrite
        # accepted as FileSystemWriter's, with no effect here (see the class doc)
        self.single_file_per_rank, self.sync_files, self.thread_count = single_file_per_rank, sync_files, thread_count
        self.per_thread_copy_ahead, self.cache_staged_state_dict = per_thread_copy_ahead, cache_staged_state_dict
        self.serialization_format = serialization_format
        self.path = Path(path)
        self.remote = remote
        self.branch, self.message, self.step, self.epoch = branch, message, step, epoch
        self.metrics, self.context, self.chunk_size = metrics, context, chunk_size
        self.repo: Optional[mvc.Repository] = None
        self.is_coordinator = False
        self.last_commit: Optional[mvc.Commit] = None
        self.save_id = uuid.uuid4().hex
        self.id: Optional[Path] = None  # DCP's checkpoint_id, once given
        self.tag: Optional[str] = None  # the tag that id maps to, once set up
        self._start: Optional[dict] = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Whether a save to ``checkpoint_id`` can work: a path inside (or the root
        of) a repository that maps to a valid tag, or a folder where one can be created."""
        if not _an_id(checkpoint_id):
            return False
        try:
            _locate(checkpoint_id)[0].close()
            return True
        except mvc.NotARepository:
            path = Path(checkpoint_id).resolve()
            existing = next(p for p in (path, *path.parents) if p.exists())
            return existing.is_dir() and os.access(existing, os.W_OK)
        except (mvc.MvcError, OSError):
            return False

    @property
    def checkpoint_id(self) -> str:
        return str(self.id or self.path)

    # -- DCP's calls, in order ---------------------------------------------------

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            if not _an_id(checkpoint_id):
                raise mvc.BadInput(f"checkpoint_id {checkpoint_id!r} is not a local path; MvcStorageWriter "
                                   "saves to a folder (a repository, or a path inside one)")
            self.id = Path(checkpoint_id)
        self._release()
        self.save_id = uuid.uuid4().hex

    def storage_meta(self) -> StorageMeta:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._release()
        self.is_coordinator = is_coordinator
        if self.repo is not None:
            self.repo.close()
        self.repo, self.tag = self._open()
        if self.tag is not None and self.remote is not None:
            raise mvc.BadInput(f"checkpoint_id {self.checkpoint_id} names the tag {self.tag!r}, which a remote "
                               "does not carry; with remote=, save to the repository's root and load by commit or "
                               "branch")
        if self.remote is not None:
            if self.repo.cache.remote() != self.remote:
                raise mvc.BadInput(f"the repository at {self.repo.root} does not cache remote {self.remote!r}: "
                                   f"clone it from the remote on every host ('mvc clone --lazy URL DIR')")
            self.repo.remotes.refresh(self.remote)  # chunks other ranks already sent are not written again
        if is_coordinator:
            # Held until finish: gc cannot run meanwhile, so neither the ranks'
            # unindexed packs nor chunks they found in the repository go away.
            found = _tag_of(self.repo, self.tag) if self.tag else None
            if found is not None and found.protected:  # refused before any rank writes a chunk
                raise mvc.ProtectedRef(f"tag {self.tag!r} of checkpoint_id {self.checkpoint_id} is protected; "
                                       "save to another checkpoint_id")
            self._hold.enter_context(self.repo.gc_lock.shared())
            self._start = self.repo.shards.begin(self.branch)
            if not self.overwrite:
                self._refuse_existing(found)

    def _refuse_existing(self, tag: Optional[mvc.Ref]) -> None:
        """CheckpointExists if this save's id already names a checkpoint (overwrite=False)."""
        if self.tag is not None:
            ref, commit = self.tag, tag.id if tag is not None else None
        else:
            ref, commit = self._start["ref"], self._start["parent"]
            ref = ref.split("/", 1)[-1] if ref else None  # "heads/main": the branch's name
            commit = commit.hex() if isinstance(commit, bytes) else commit
        if commit is None:
            return
        if self.tag is not None:
            where = f"tag {ref!r}"
        else:
            where = f"branch {ref!r}" if ref else "HEAD"
        raise mvc.errors.CheckpointExists(
            f"Checkpoint already exists at {self.checkpoint_id} ({where} names commit {commit[:12]}) and "
            "overwrite=False; save to another checkpoint_id, or with overwrite=True (the older save stays "
            "in the history)", checkpoint_id=self.checkpoint_id, ref=ref, commit=commit)

    def _open(self) -> tuple:
        """(repository, tag or None) this save goes to: the repository holding
        the checkpoint id, else one created at ``path`` when the id is inside
        ``path`` (so per-step ids share one repository), else at the id."""
        if self.id is None:
            return open_repository(self.path, self.chunk_size), None
        try:
            return _locate(self.id)
        except mvc.NotARepository:
            target, base = self.id.resolve(), self.path.resolve()
            open_repository(base if base in target.parents else target, self.chunk_size).close()
            return _locate(self.id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list) -> list:
        return plans

    def write_data(self, plan: SavePlan, planner) -> Future:
        """Hash this rank's items and write the chunks the repository lacks to its own pack."""
        tensors, written, results = [], [], []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO and _bytes_io(planner, item) is not None:
                raw = _bytes_io(planner, item).getvalue()  # its bytes, with no pickle made or read
                tensors.append(torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw
                               else torch.empty(0, dtype=torch.uint8))
                written.append((item, "bytes-io", len(raw)))
                continue
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue()
                value = _weights_only(raw, f"DCP item {item.index.fqn!r}")
                if _exactly_plain(value):
                    results.append(WriteResult(item.index, len(raw), {"kind": "value", "value": value}))
                    continue
                kind = "torch-save"
                if type(value) is io.BytesIO:  # kept as the bytes it holds: loaded with no unpickling
                    raw, kind = value.getvalue(), "bytes-io"
                tensors.append(torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw
                               else torch.empty(0, dtype=torch.uint8))
                written.append((item, kind, len(raw)))
            else:
                sizes = tuple(item.tensor_data.chunk.sizes)
                if tuple(data.shape) != sizes:
                    raise mvc.BadInput(f"DCP item {item.index.fqn!r} resolved to shape {tuple(data.shape)}, "
                                       f"its plan says {sizes}")
                tensors.append(data.detach())
                written.append((item, "tensor", data.numel() * data.element_size()))
        desc = self.repo.shards.write(tensors) if tensors else {"tensors": [], "locations": {}}
        if self.remote is not None:
            # Every chunk of this rank durable on the remote before the coordinator
            # hears of it (also those a failed save left only here); indexed here,
            # so the coordinator has nothing of this host's disk to adopt.
            ids = [cid for t in desc["tensors"] for cid in t["chunks"]]
            self.repo.remotes.upload_shards(self.remote, desc["locations"], ids)
            desc["locations"] = {}
        for i, ((item, kind, nbytes), t) in enumerate(zip(written, desc["tensors"])):
            data = {"kind": kind, **t}
            if i == 0:  # the rank's batch travels once, with its first item
                data.update(locations=desc["locations"], chunks_new=desc["chunks_new"],
                            bytes_new=desc["bytes_new"])
            results.append(WriteResult(item.index, nbytes, data))
        return _done(results)

    def finish(self, metadata: Metadata, results: list) -> None:
        """Commit every rank's items, the DCP metadata and the record in one transaction."""
        try:
            leaves, locations, items, stats = _assemble(metadata, results)
            dcp = {"items": items, "planner_data": _plain_planner_data(metadata.planner_data),
                   "storage_meta": {"checkpoint_id": self.checkpoint_id, "save_id": self.save_id,
                                    "modules": list(getattr(metadata.storage_meta, "modules", None) or [])},
                   "version": metadata.version or DCP_VERSION}
            if self.remote is not None:
                self.repo.remotes.refresh(self.remote)  # the packs the other ranks uploaded
            self.last_commit = self.repo.shards.commit(
                self._start, leaves, locations, dcp, self.message, step=self.step, epoch=self.epoch,
                metrics=self.metrics, context=self.context, stats=stats)
            if self.remote is not None and self.last_commit.branch:
                self.repo.remotes.push(self.remote, (self.last_commit.branch,))
            if self.tag is not None:  # the id now names this commit, as a folder would hold this save
                found = _tag_of(self.repo, self.tag)
                if found is not None and found.protected:
                    raise mvc.ProtectedRef(f"tag {self.tag!r} of checkpoint_id {self.checkpoint_id} was protected "
                                           f"during the save; commit {self.last_commit.short_id} is on the branch")
                self.repo.create_tag(self.tag, self.last_commit.id, force=self.overwrite)
            head = self.repo.head()
            if head.id is None and self.last_commit.branch and head.branch != self.last_commit.branch:
                # HEAD's branch has no commits: put HEAD on this one, as Git's first commit
                # would, so a reader with its default rev loads what was saved here.
                self.repo.checkout(self.last_commit.branch)
        finally:
            self._release()

    def _release(self) -> None:
        self._hold.close()
        self._start = None

    def close(self) -> None:
        """Release the repository (and, after a save that failed before ``finish``, the gc lock)."""
        self._release()
        if self.repo is not None:
            self.repo.close()
            self.repo = None

    def __del__(self):
        hold = getattr(self, "_hold", None)  # None: __init__ refused its arguments before making it
        if hold is not None:
            hold.close()  # a save that failed mid-way must not keep gc out for the process's life


def _bytes_io(planner, item) -> Optional[io.BytesIO]:
    """The io.BytesIO value of a BYTE_IO item, when the planner saves the value
    as it is (DefaultSavePlanner's transform: torch.save of the object)."""
    if type(planner).transform_object is not DefaultSavePlanner.transform_object:
        return None
    value = planner.lookup_object(item.index)
    return value if type(value) is io.BytesIO else None


def _plain_planner_data(data):
    """The planner's data as plain values (DefaultSavePlanner's: {fqn: key path})."""
    if data is None or _exactly_plain(data):
        return data
    raise mvc.BadInput(f"the save planner's data is a {type(data).__name__} that is not plain values; "
                       "mvc stores no pickle: use a planner whose planner_data is plain")


def _assemble(metadata: Metadata, results: list) -> tuple:
    """(leaves {key path: ShardedTensor or value}, locations, dcp items, CommitStats) from DCP's global
    metadata and every rank's WriteResults."""
    by_index, locations, chunks_new, bytes_new = {}, {}, 0, 0
    for rank_results in results:
        for r in rank_results:
            by_index[r.index] = r.storage_data
            locations.update(r.storage_data.get("locations", {}))
            chunks_new += r.storage_data.get("chunks_new", 0)
            bytes_new += r.storage_data.get("bytes_new", 0)
    mapping = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    leaves, items, n_chunks, n_bytes = {}, {}, 0, 0
    for fqn, md in metadata.state_dict_metadata.items():
        path = tuple(mapping.get(fqn, (fqn,)))
        if isinstance(md, TensorStorageMetadata):
            pieces, dtype = [], None
            for chunk in md.chunks:
                data = _result(by_index, MetadataIndex(fqn, chunk.offsets), fqn)
                dtype = data["dtype"]
                pieces.append((list(chunk.offsets), list(chunk.sizes), data["chunks"]))
                n_chunks += len(data["chunks"])
            dtype = dtype or mvc.dtypes.name_of(md.properties.dtype, fqn)
            leaves[path] = mvc.ShardedTensor(dtype, tuple(md.size), pieces)
            n_bytes += md.size.numel() * md.properties.dtype.itemsize
            kind = "tensor"
        else:
            data = _result(by_index, MetadataIndex(fqn), fqn)
            kind = data["kind"]
            if kind == "value":
                leaves[path] = data["value"]
            else:
                n = data["shape"][0]
                leaves[path] = mvc.ShardedTensor("U8", (n,), [([0], [n], data["chunks"])])
                n_chunks, n_bytes = n_chunks + len(data["chunks"]), n_bytes + n
        items[fqn] = {"path": list(path), "kind": kind}
    stats = mvc.CommitStats(len(leaves), n_chunks, chunks_new, n_bytes, bytes_new)
    return leaves, locations, items, stats


def _result(by_index: dict, index: MetadataIndex, fqn: str) -> dict:
    data = by_index.get(index)
    if not isinstance(data, dict):
        raise mvc.BadInput(f"no rank wrote DCP item {fqn!r} at offsets {list(index.offset or [])}; "
                           "nothing was committed")
    return data


class MvcStorageReader(StorageReader):
    """Loads the commit ``rev`` names (default HEAD) through DCP, resharding to this world.

    ``path`` is the repository (at ``path`` or above it). A DCP
    ``checkpoint_id`` inside a repository loads the commit its tag
    ``dcp/...`` names (``rev`` must then be left out); an id never saved is
    ``mvc.errors.CheckpointNotFound`` (a FileNotFoundError), which DCP
    raises inside its CheckpointException as it does for FileSystemReader.

    Any commit loads: one made by ``MvcStorageWriter`` at any world size,
    or a plain ``Repository.commit`` (its keys joined with dots are the FQNs).
    Every rank reads only the chunks its own shards need, verified.
    ``remote``: each rank fetches from this remote first (ranks on hosts
    without a shared filesystem, each with a clone at ``path``), so ``rev``
    may be a commit another host made; chunks come from the remote as needed.
    """

    def __init__(self, path, rev: Optional[str] = None, remote: Optional[str] = None):
        super().__init__()
        self.path = Path(path)
        self.rev = rev
        self.remote = remote
        self.id: Optional[Path] = None  # DCP's checkpoint_id, once given
        self.repo: Optional[mvc.Repository] = None
        self.view: Optional[dict] = None
        self.load_id = uuid.uuid4().hex
        self._where: dict = {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        """Whether ``checkpoint_id`` names a checkpoint this reader can load: a
        repository root with commits, or a path inside one whose tag exists."""
        if not _an_id(checkpoint_id):
            return False
        try:
            repo, tag = _locate(checkpoint_id)
        except (mvc.MvcError, OSError):
            return False
        try:
            _resolve(repo, tag, None, checkpoint_id)
            return True
        except mvc.MvcError:
            return False
        finally:
            repo.close()

    @property
    def checkpoint_id(self) -> str:
        return str(self.id or self.path)

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            if not _an_id(checkpoint_id):
                raise mvc.BadInput(f"checkpoint_id {checkpoint_id!r} is not a local path; MvcStorageReader "
                                   "loads from a folder (a repository, or a path inside one)")
            self.id = Path(checkpoint_id)
            self.close()  # the id may be in another repository
        self.view, self._where = None, {}
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # DCP calls this again (with rank=) after a failure: every call resolves the same id afresh.
        self.close()
        if self.id is None:
            self.repo, tag = mvc.Repository.open(self.path), None
        else:
            try:
                self.repo, tag = _locate(self.id)
            except mvc.NotARepository:
                raise mvc.errors.CheckpointNotFound(f"no checkpoint at {self.id}: no mvc repository holds it",
                                                    checkpoint_id=str(self.id)) from None
            if tag is not None and self.remote is not None:
                raise mvc.BadInput(f"checkpoint_id {self.id} names the tag {tag!r}, which a remote does not "
                                   "carry; load by commit or branch (rev=)")
        if self.remote is not None:
            self.repo.remotes.fetch(self.remote)
        self.view = self.repo.shards.view(_resolve(self.repo, tag, self.rev, self.checkpoint_id))
        md, storage, self._where = _metadata(self.view)
        meta = self.view["dcp"] or {}
        saved = meta.get("storage_meta") or {}
        storage_meta = StorageMeta(checkpoint_id=saved.get("checkpoint_id", self.checkpoint_id),
                                   save_id=saved.get("save_id"), load_id=self.load_id,
                                   modules=list(saved.get("modules") or []))
        return Metadata(md, _planner_data(meta, self._where), storage, storage_meta,
                        meta.get("version", DCP_VERSION))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return dataclasses.replace(plan, storage_data=self.view["commit"])

    def prepare_global_plan(self, plans: list) -> list:
        commits = {p.storage_data for p in plans}
        if len(commits) > 1:  # they would load different states
            # each rank resolves the name in its own repository: it moved meanwhile, or the ranks'
            # repositories differ (clones whose local branch lags their remote's, say)
            raise mvc.RefConflict(f"{self.rev!r} names {len(commits)} different commits on the ranks (it moved "
                                  "while they resolved it, or their repositories differ, such as clones whose "
                                  "own branch lags their remote's); load a commit id, or REMOTE/BRANCH after a "
                                  "fetch on every rank")
        return plans

    def read_data(self, plan: LoadPlan, planner) -> Future:
        tensors = [r for r in plan.items if r.type != LoadItemType.BYTE_IO]
        for r in plan.items:
            if r.type == LoadItemType.BYTE_IO:
                planner.load_bytes(r, self._bytes_item(r))
        for batch in mvc.batches(tensors, self._slab_bytes, READ_BATCH):
            ranges = [self._slab(r) for r in batch]
            datas = mvc.reader.read_pieces(self.repo, [rng[:4] for rng in ranges], f"commit {self.view['commit'][:12]}")
            for r, rng, data in zip(batch, ranges, datas):
                self._copy(r, rng, data, planner)
        return _done()

    # -- helpers -----------------------------------------------------------------

    def _bytes_item(self, r) -> io.BytesIO:
        path, kind = self._where[r.storage_index.fqn]
        if kind == "value":
            node = self.view["root"]
            for key in path:  # a value may be a container: the tree keeps it whole under its path
                node = node[key]
            return _fresh_bytes(node)
        obj = self.view["tensors"][path]
        raw = mvc.reader.read_pieces(self.repo, [(obj, 0, 0, obj.nbytes)], f"DCP item {r.storage_index.fqn!r}")[0]
        if kind == "bytes-io":  # at position 0 (a saved one may have been read to its end)
            return _fresh_bytes(io.BytesIO(raw.tobytes()))
        # fresh bytes of what weights-only loading accepted: the planner's own torch.load unpickles only those
        return _fresh_bytes(_weights_only(raw.tobytes(), f"DCP item {r.storage_index.fqn!r}"))

    def _slab(self, r) -> tuple:
        """(TensorObject, piece index, byte start, byte stop, rows, piece sizes) of the rows of a
        stored piece that read item ``r`` needs."""
        path, piece = self._where[(r.storage_index.fqn, tuple(r.storage_index.offset))]
        obj = self.view["tensors"][path]
        sizes = obj.pieces()[piece][1]
        item = mvc.dtypes.itemsize(obj.dtype)
        if not sizes:  # a 0-dim tensor: one element
            return obj, piece, 0, obj.nbytes, 1, sizes
        row = item * math.prod(sizes[1:])
        first, rows = r.storage_offsets[0], r.lengths[0]
        return obj, piece, first * row, (first + rows) * row, rows, sizes

    def _slab_bytes(self, r) -> int:
        obj, piece, lo, hi, _, _ = self._slab(r)
        return hi - lo

    def _copy(self, r, rng: tuple, data, planner) -> None:
        obj, _, _, _, rows, sizes = rng
        target = planner.resolve_tensor(r).detach()
        if data.size:
            src = torch.frombuffer(data, dtype=torch.uint8).view(mvc.dtypes.torch_dtype(obj.dtype))
            src = src.reshape((rows,) + tuple(sizes[1:])) if sizes else src.reshape(())
            for dim in range(1, len(sizes)):
                src = src.narrow(dim, r.storage_offsets[dim], r.lengths[dim])
            if tuple(src.shape) != tuple(target.shape):
                raise mvc.CorruptObject(f"DCP item {r.storage_index.fqn!r}: stored {tuple(src.shape)}, "
                                        f"planned {tuple(target.shape)}")
            target.copy_(src)
        planner.commit_tensor(r, target)

    def close(self) -> None:
        if self.repo is not None:
            self.repo.close()
            self.repo = None


def _resolve(repo: mvc.Repository, tag: Optional[str], rev: Optional[str], checkpoint_id) -> str:
    """The commit id a reader loads: the tag of a checkpoint id inside the
    repository, else ``rev``, else HEAD. CheckpointNotFound if nothing was saved there."""
    if tag is not None:
        if rev is not None:
            raise mvc.BadInput(f"checkpoint_id {checkpoint_id} names the tag {tag!r}; rev={rev!r} says otherwise: "
                               "pass one of them")
        found = _tag_of(repo, tag)
        if found is None:
            raise mvc.errors.CheckpointNotFound(f"no checkpoint was saved at {checkpoint_id} (no tag {tag!r} in "
                                                f"{repo.root})", checkpoint_id=str(checkpoint_id), ref=tag)
        return found.id
    if rev is not None:
        return repo.resolve(rev)
    head = repo.head()
    if head.id is None:
        branches = sorted(b.name for b in repo.branches())
        if branches:
            raise mvc.errors.CheckpointNotFound(
                f"HEAD's branch {head.branch!r} of {repo.root} has no commits; pass rev= one of: "
                f"{', '.join(branches)}", checkpoint_id=str(checkpoint_id), ref=head.branch)
        raise mvc.errors.CheckpointNotFound(f"no checkpoint was saved in {repo.root} yet",
                                            checkpoint_id=str(checkpoint_id), ref=head.branch)
    return head.id


def _metadata(view: dict) -> tuple:
    """(state_dict_metadata, storage_data, where) of a commit: where maps
    (fqn, offsets) of each stored piece to (key path, piece index) and an
    fqn of a bytes item to (key path, kind)."""
    md, storage, where = {}, {}, {}
    meta = view["dcp"]
    if meta is None:  # a commit of Repository.commit: its leaves, keys joined with dots
        items = {mvc.traverse.format_path(p): {"path": p, "kind": "tensor"} for p in view["tensors"]}
        items.update({mvc.traverse.format_path(p): {"path": p, "kind": "value"} for p in view["values"]})
    else:
        items = meta["items"]
    for fqn, item in items.items():
        path = tuple(item["path"])
        if item["kind"] != "tensor":
            md[fqn] = BytesStorageMetadata()
            storage[MetadataIndex(fqn)] = fqn
            where[fqn] = (path, item["kind"])
            continue
        obj = view["tensors"].get(path)
        if obj is None:
            raise mvc.CorruptObject(f"DCP item {fqn!r} names key {mvc.traverse.format_path(path)!r}, which holds no "
                                    "tensor in the commit")
        chunks = []
        for i, (offsets, sizes, _, _, _) in enumerate(obj.pieces()):
            chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
            storage[MetadataIndex(fqn, offsets)] = fqn
            where[(fqn, tuple(offsets))] = (path, i)
        md[fqn] = TensorStorageMetadata(TensorProperties(dtype=mvc.dtypes.torch_dtype(obj.dtype)),
                                        torch.Size(obj.shape), chunks)
    return md, storage, where


def _planner_data(meta: dict, where: dict):
    """The planner data saved, key paths as tuples again (plain encoding keeps them as arrays)."""
    data = meta.get("planner_data") if meta else None
    if data is None:
        fqns = {k if isinstance(k, str) else k[0] for k in where}
        paths = {}
        for key, (path, _) in where.items():
            paths[key if isinstance(key, str) else key[0]] = path
        return {fqn: tuple(paths[fqn]) for fqn in fqns}
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
        return {k: tuple(v) for k, v in data.items()}
    return data
