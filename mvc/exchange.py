"""Checkpoints in and out of a repository: commit a file or model folder, export one.

Vocabulary: an **input** is a checkpoint file (``.pt``-style or
``.safetensors``, see mvc.files) or a Hugging Face model folder (see
mvc.folders). An **export** writes a commit back as a file (pt or
safetensors, optionally only a subtree as a flat state dict) or, for a
commit of a model folder, as that folder. A safetensors file's
``__metadata__`` is kept in the commit's context under ``safetensors`` and
written back by a safetensors export.
"""

import os
import threading
from collections import deque
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import dtypes, reader
from . import files as _files
from . import folders as _folders
from .errors import BadInput, MvcError
from .objects import TensorLeaf
from .records import Export
from .store.chunks import batches
from .traverse import walk

# Exports read tensors in groups of a quarter of this many bytes, FILLERS at
# once, ahead of the writer: reading (from packs, or fetching from a remote)
# and writing overlap, and memory stays near a few groups, not the whole model.
STREAM_BYTES = 128 << 20
AHEAD_BYTES = 2 * STREAM_BYTES  # a streamed pt export's filled storages not yet written, at most
FILLERS = 3  # a streamed pt export reads groups of STREAM_BYTES / 4 (32 MiB), this many at once

SAFETENSORS_CONTEXT = "safetensors"  # context key of a committed .safetensors file's metadata


def read_input(path, progress=None, skipped=None, hidden=None) -> tuple:
    """(state, context, what) for a checkpoint file or model folder at ``path``:
    a safetensors file's metadata goes into the context under ``safetensors``,
    ``what`` says what was read ("model.pt", "model folder hf/ (...)"); what a
    folder leaves out (``.mvc/``, ...) is appended to ``skipped``, the hidden
    files it reads (``.ssh/...``) to ``hidden``.

    Raises BadInput if it cannot be read.
    """
    path = Path(path)
    if path.is_dir():
        state = _folders.read_folder(path, progress, skipped, hidden)
        shards, files = _folders.folder_summary(state)
        name = Path(os.path.abspath(path)).name
        return state, {}, f"model folder {name}/ ({shards} safetensors, {files} other files)"
    imported = _files.import_checkpoint(path, progress)
    context = {SAFETENSORS_CONTEXT: {"metadata": imported.metadata}} if imported.metadata else {}
    return imported.state, context, path.name


def commit_file(repo, path, message=None, *, context=None, read_progress=None, **kwargs):
    """Commit the checkpoint file or model folder at ``path``.

    With no ``message``, one that names what was committed ("Import a.pt: 3
    tensors"). ``context`` adds to (and overrides) what the file brings; the
    other keywords are ``Repository.commit``'s. Raises BadInput for an
    unreadable input, and what ``commit`` raises.
    """
    skipped: list = []
    hidden: list = []
    state, found, what = read_input(path, read_progress, skipped, hidden)
    if message is None:
        n = _files.count_tensors(state)
        message = f"Import {what}: {n} tensor{'' if n == 1 else 's'}"
    commit = repo.commit(state, message, context={**found, **(context or {})}, **kwargs)
    return replace(commit, left_out=tuple(skipped), hidden=tuple(hidden)) if skipped or hidden else commit


def export(repo, rev: str, path, fmt=None, progress=None, *, force: bool = False, only=None,
           strip_prefix=None, write_progress=None) -> Export:
    """Write the checkpoint at ``rev`` to ``path``; see ``Repository.export``.
    InsideRepository, before anything is read, for a path inside any ``.mvc``."""
    _files.check_not_in_repository(path, repo.dir)
    commit = repo.resolve(rev)
    folder_out = str(path).endswith(("/", os.sep)) or Path(path).is_dir()
    # no suffix and nothing that asks for a file: a folder if the commit is one
    undecided = (not folder_out and not Path(path).suffix and fmt is None and only is None
                 and strip_prefix is None)
    if not folder_out and not undecided:  # refuse a bad target before loading anything
        _files.output_target(path, force)
        if _files.formats_for(path, fmt) == "safetensors":
            return _export_safetensors(repo, commit, path, force, only, strip_prefix, progress, write_progress)
        if _files.can_stream_torch():
            return _export_pt(repo, commit, path, force, only, strip_prefix, progress, write_progress)
    state = repo.load(commit, progress=progress)
    is_folder = _folders.is_folder_state(state)
    if folder_out or (undecided and is_folder):
        return _export_folder(commit, state, path, fmt, force, only, strip_prefix, write_progress)
    fmt = _files.formats_for(path, fmt)
    folder_files = 0
    if is_folder:
        folder_files = _folders.folder_summary(state)[1]
        state = {k: v for k, v in state.items() if k != _folders.FOLDER_KEY}
    if only is not None or strip_prefix is not None:
        state = _files.select(state, only, strip_prefix)
    left_out = _files.plain_values(state) if fmt == "safetensors" else 0
    metadata = safetensors_metadata(repo.get_commit(commit)) if fmt == "safetensors" else None
    written = _files.write_checkpoint(state, path, fmt, force=force, metadata=metadata, progress=write_progress)
    return Export(commit, written, fmt, left_out, folder_files)


def export_signed(repo, rev: str, folder, private_key, progress=None, *, force: bool = False,
                  write_progress=None, password=None) -> tuple:
    """Export ``rev`` as a model folder at ``folder`` and sign it with OMS (``mvc.oms``): a commit
    of a model folder is written as that folder, any other as ``folder/model.safetensors``; then
    ``folder/model.sig`` names every file's SHA-256 and the commit. Returns (Export, oms.Signed).
    The key is checked before anything is written (ModelSignatureError "bad-key")."""
    from . import oms
    if Path(folder).suffix in (".safetensors", *_files.TORCH_SUFFIXES) and not Path(folder).is_dir():
        raise BadInput(f"{folder} names a file; a signed export is a model folder (model.sig beside the "
                       "weights): give a folder name")
    oms.check_private_key(private_key, password)
    commit = repo.resolve(rev)
    if _folders.is_folder_state(repo.shards.view(commit)["root"]):
        written = export(repo, commit, Path(folder), progress=progress, force=force, write_progress=write_progress)
    else:
        _files.check_not_in_repository(folder, repo.dir)
        others = sorted(set(os.listdir(folder)) - {"model.safetensors", oms.SIGNATURE_FILE}) \
            if Path(folder).is_dir() else []
        if others:  # the signature covers every file of the folder
            raise BadInput(f"{folder} holds {others[0]!r} and other files the signature would cover; export "
                           "to a new folder")
        Path(folder).mkdir(exist_ok=True)
        written = export(repo, commit, Path(folder) / "model.safetensors", progress=progress, force=force,
                         write_progress=write_progress)
    return written, oms.sign_folder(folder, private_key, commit, password)


def _export_safetensors(repo, commit: str, path, force: bool, only, strip_prefix, progress,
                        write_progress) -> Export:
    """A commit (or its ``only`` subtree) as one safetensors file, streamed:
    the header comes from the tensor objects, then the tensors are read in
    groups of about STREAM_BYTES / 4, FILLERS at once, each verified, while
    the groups before them are written."""
    view = repo.shards.view(commit)  # the tree and its tensor objects, read once
    root, folder_files = _file_part(view["root"])
    flat = _files.flat_paths(root)
    if only is not None or strip_prefix is not None:
        flat = _files.select_flat(flat, only, strip_prefix)
    tensors = {key: (p, leaf) for key, (p, leaf) in flat.items() if isinstance(leaf, TensorLeaf)}
    objs = {key: view["tensors"][p] for key, (p, _) in tensors.items()}
    specs = {key: (o.dtype, tuple(o.shape), dtypes.itemsize(o.dtype), o.nbytes) for key, o in objs.items()}
    order, header = _files.safetensors_header(specs, safetensors_metadata(repo.get_commit(commit)))
    total = sum(o.nbytes for o in objs.values())
    # groups of a quarter of STREAM_BYTES, FILLERS read at once ahead of the writer (as a pt export's)
    groups = batches(order, lambda key: objs[key].nbytes, max(1, STREAM_BYTES // 4))
    done, guard = [0], threading.Lock()
    if progress:
        progress(0, total)

    def read(group: list) -> list:
        got = reader.read_leaves(repo, commit, [tensors[key] for key in group])
        with guard:
            done[0] += sum(objs[key].nbytes for key in group)
            now = done[0]
        if progress:
            progress(now, total)
        return [got[tensors[key][1].id] for key in group]

    def stream():
        with ThreadPoolExecutor(FILLERS) as pool:
            pending: deque = deque()
            for group in groups:
                pending.append(pool.submit(read, group))
                if len(pending) > FILLERS:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
    written = _files.write_safetensors(path, force, header, stream(), total, write_progress)
    return Export(commit, written, "safetensors", len(flat) - len(tensors), folder_files)


def _file_part(root) -> tuple:
    """(the tree a file export writes, how many files of a model folder it leaves out)."""
    if not _folders.is_folder_state(root):
        return root, 0
    return {k: v for k, v in root.items() if k != _folders.FOLDER_KEY}, _folders.folder_summary(root)[1]


def _export_pt(repo, commit: str, path, force: bool, only, strip_prefix, progress, write_progress) -> Export:
    """A commit (or its ``only`` subtree) as a ``torch.save`` file, streamed:
    the state is built of empty tensors, a reader fills them group by group
    (each verified), and torch.save writes each storage as soon as it is
    filled, so reading and writing overlap (``files.write_torch_streamed``)."""
    import torch

    from . import state as _state
    view = repo.shards.view(commit)
    root, folder_files = _file_part(view["root"])
    objs, path_of = {}, {}
    for p, leaf in walk(root):
        if isinstance(leaf, TensorLeaf) and leaf.id not in objs:
            objs[leaf.id], path_of[leaf.id] = view["tensors"][p], p
    firsts = {tid: _state.empty_tensor(o.shape, o.dtype)[0] for tid, o in objs.items()}  # no memory touched yet
    source = {id(t): tid for tid, t in firsts.items()}  # id(tensor) -> the tensor id its bytes are
    copies: dict = {}  # tensor id -> the tensors of leaves that repeat it (not one group)

    def copy(t):
        c = torch.empty_like(t)
        copies.setdefault(source[id(t)], []).append(c)
        source[id(c)] = source[id(t)]
        return c
    state = _state.materialize(root, firsts, copy=copy)
    if only is not None or strip_prefix is not None:
        state = _files.select(state, only, strip_prefix)  # a flat dict of its own: no module metadata
    else:
        state = _state.with_metadata(state, view["dict_metadata"])
    written = [t for _, t in walk(state) if isinstance(t, torch.Tensor)]
    order = list(dict.fromkeys(source[id(t)] for t in written))  # what to read, as torch.save meets it
    storages = {t.untyped_storage().data_ptr() for t in written if t.nbytes}
    filler = _Filler(repo, commit, [(tid, path_of[tid], objs[tid].nbytes) for tid in order], firsts, copies,
                     storages, progress)
    filler.start()
    try:
        out = _files.write_torch_streamed(path, force, state, filler.wait, len(storages), write_progress,
                                             filler.written)
    finally:
        filler.stop()
    return Export(commit, out, "pt", 0, folder_files)


class _Filler:
    """Reads tensors into the empty ones of a streamed pt export, group by
    group, FILLERS groups at once in threads of its own; ``wait(storage)`` returns once that
    storage holds its verified bytes, and raises the reader's error.
    ``written(storage)`` hands a written storage's memory back, and the
    reader stays at most ``AHEAD_BYTES`` of filled storages ahead of the
    writer, so a pt export holds a few groups in memory, not the model."""

    def __init__(self, repo, commit: str, todo: list, firsts: dict, copies: dict, storages: set, progress):
        import threading
        self.repo, self.commit, self.todo, self.firsts, self.copies = repo, commit, todo, firsts, copies
        self.progress, self.total = progress, sum(n for _, _, n in todo)
        self.ready = {ptr: threading.Event() for ptr in storages}
        self.filled, self.failed = set(), []
        self.pace = threading.Condition()
        self.unwritten, self.writer_waits, self.stopped = 0, False, False  # guarded by pace
        self.thread = threading.Thread(target=self._run, name="mvc-export-read", daemon=True)

    def start(self) -> None:
        if self.progress:
            self.progress(0, self.total)
        self.thread.start()

    def stop(self) -> None:
        """Stop after the group being read (the writer is done or failed), and wait for it."""
        with self.pace:
            self.stopped = True
            self.pace.notify_all()
        self.thread.join()

    def wait(self, storage) -> None:
        ptr = storage.data_ptr()
        event = self.ready.get(ptr)
        if event is not None and not event.is_set():
            # the writer waits for a storage not yet read: the reader must go
            # on whatever is unwritten (a repeated tensor, filled with its first
            # but written later, must never stall the export)
            self._writer_waits(True)
            event.wait()
            self._writer_waits(False)
        if self.failed:
            raise self.failed[0]
        if ptr not in self.filled:  # never write bytes that were not read
            raise MvcError("a streamed pt export met a storage it did not read (a bug; please report it)")

    def written(self, storage) -> None:
        from . import state as _state
        _state.release_pages(storage)  # torch.save is done with these bytes
        with self.pace:
            self.unwritten -= storage.nbytes()
            self.pace.notify_all()

    def _writer_waits(self, flag: bool) -> None:
        with self.pace:
            self.writer_waits = flag
            self.pace.notify_all()

    def _may_read(self) -> bool:
        with self.pace:
            self.pace.wait_for(lambda: self.stopped or self.writer_waits or self.unwritten <= AHEAD_BYTES)
            return not self.stopped

    def _run(self) -> None:
        # Several smaller groups read at once: the writer starts after the first small group
        # instead of a whole STREAM_BYTES one, and the last group it writes once the reads end
        # is small too, while the reads in flight keep the remote (or the disk) busy. Measured
        # on a 256 MiB lazy checkout -o (2 cores): 1.15-1.40 s against 1.32-1.66 s reading one
        # 128 MiB group at a time.
        self._done_bytes = 0
        try:
            with ThreadPoolExecutor(FILLERS, thread_name_prefix="mvc-export-fill") as pool:
                pending: deque = deque()
                for group in batches(self.todo, lambda item: item[2], max(1, STREAM_BYTES // 4)):
                    while len(pending) >= FILLERS:
                        pending.popleft().result()
                    if not self._may_read():
                        break
                    pending.append(pool.submit(self._fill, group))
                while pending:
                    pending.popleft().result()
        except BaseException as exc:  # handed to the writer by wait()
            self.failed.append(exc)
        finally:
            for event in self.ready.values():
                event.set()

    def _fill(self, group: list) -> None:
        tids = [tid for tid, _, _ in group]
        reader.read_leaves(self.repo, self.commit, [(p, TensorLeaf(tid)) for tid, p, _ in group],
                           into={tid: self.firsts[tid] for tid in tids})
        for tid in tids:
            for c in self.copies.get(tid, ()):
                c.copy_(self.firsts[tid])
            for t in (self.firsts[tid], *self.copies.get(tid, ())):
                self._done(t.untyped_storage())
        with self.pace:
            self._done_bytes += sum(n for _, _, n in group)
            done = self._done_bytes
        if self.progress:
            self.progress(done, self.total)

    def _done(self, storage) -> None:
        ptr = storage.data_ptr()
        self.filled.add(ptr)
        if ptr in self.ready:
            with self.pace:
                self.unwritten += storage.nbytes()
            self.ready[ptr].set()


def _export_folder(commit, state, path, fmt, force, only, strip_prefix, write_progress) -> Export:
    if not _folders.is_folder_state(state):
        raise BadInput(f"commit {commit[:12]} was not committed from a model folder; "
                       "give a file name ending in .pt or .safetensors")
    if only is not None or strip_prefix is not None or fmt is not None:
        raise BadInput("only, strip_prefix and fmt select what goes into one file; a model folder is written whole")
    shards, files = _folders.folder_summary(state)
    written = _folders.write_folder(state, path, force=force, progress=write_progress)
    return Export(commit, written, "folder", 0, files, shards)


def safetensors_metadata(commit):
    """The safetensors metadata a commit of a .safetensors file kept, or None."""
    meta = commit.context.get(SAFETENSORS_CONTEXT, {})
    meta = meta.get("metadata") if isinstance(meta, dict) else None
    if isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        return meta
    return None
