"""PyTorch Lightning: checkpoints as mvc commits (``pip install 'mvc-checkpoints[lightning]'``).

``MvcCheckpoint`` is Lightning's own ``ModelCheckpoint`` (the same
``monitor``, ``mode``, ``save_top_k``, ``save_last``, ``every_n_train_steps``,
``every_n_epochs``, ``filename`` ...) with the files replaced by commits:
each checkpoint Lightning saves is its own checkpoint dict, committed to a
branch of an mvc repository and tagged ``BRANCH/NAME``, and the
**checkpoint path** Lightning keeps for it (``DIRPATH/NAME.ckpt`` in
``best_model_path``, ``last_model_path``, the top-k dict) is a real file:
a **pointer**, a few hundred bytes of ``torch.save`` of
``{"mvc_checkpoint": {"repository", "commit", "tag"}, "pytorch-lightning_version":
NOT_A_CHECKPOINT}`` (the repository's
absolute path, so a pointer reads the same from any folder), written after
the commit. Lightning finds and resumes them as its own files
(``ckpt_path="last"``, ``"best"``, or any of these paths); for anything
outside Lightning's Trainer, ``open_checkpoint(path)`` gives the whole
checkpoint as a file object (``Model.load_from_checkpoint(open_checkpoint(path))``,
``torch.load(open_checkpoint(path))``); ``torch.load(path)`` itself gives the pointer,
and ``Model.load_from_checkpoint(path)`` stops with an error that says to use ``open_checkpoint``.
The repository is at ``repo``, else at ``dirpath``, else in the current
folder; ``dirpath`` (default: the repository) is where the pointers go.
Where ModelCheckpoint deletes a file (a checkpoint that left the top k, an
older "last"), the pointer and the tag are deleted and mvc's retention
prunes the commit: gc keeps the branch tip, the ``keep_last`` newest
commits and every tagged one. The commits' history, metrics and context stay.

Resume with ``trainer.fit(model, ckpt_path="last")`` (or ``"best"``: a new
callback finds the best pointer of its ``dirpath`` by the commits' metrics),
with a path the callback handed out, or with ``ckpt_path="mvc:REV"`` (a
branch, tag, id or ``REV~N``; only kept commits load: a save_last=True save
is two commits, so ``REV~N`` counts commits, and the ones retention pruned
raise CommitPruned). The checkpoint also holds the
RNG state of every rank (Lightning saves none), put back when training
starts, so a run resumed from an epoch-end checkpoint continues bit for
bit (Lightning restarts the data of an epoch it was stopped in).

``remote="origin"`` pushes the branch to that remote of the repository
after each commit, in the background as ``Checkpointer(remote=...)`` does
(``pusher.py``): training never waits for the network, a failed push warns
once (``push_error`` says why) and is retried, and ``teardown`` waits for
the last push. Only the branch is pushed; the tags stay local.
"""

import io
import os
import tempfile
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

import mvc

from . import distributed, rng
from .checkpointer import close_run, open_run
from .pusher import Pusher

PREFIX = "mvc:"
POINTER = "mvc_checkpoint"  # the key of a pointer file's dict that holds the pointer
# A pointer also holds Lightning's version key, with a value that is no
# version: Lightning's own loaders (Model.load_from_checkpoint(path), a
# Trainer without MvcCheckpoint given the path) read that key first and stop
# with this text in their error, instead of KeyError: 'pytorch-lightning_version'.
LIGHTNING_VERSION = "pytorch-lightning_version"
NOT_A_CHECKPOINT = ("this file is an mvc pointer, not the checkpoint: load it with "
                    "Model.load_from_checkpoint(mvc_hooks.lightning.open_checkpoint(path))")
POINTER_MAX = 1 << 16  # bytes: a file larger than this is not a pointer
REPOSITORY_DIR = ".mvc"  # what a folder holding a repository has in it


def read_pointer(path) -> Optional[dict]:
    """The pointer a checkpoint path holds ({"repository", "commit", "tag"}, the repository an absolute
    path); None if it is not one."""
    try:
        if os.path.getsize(path) > POINTER_MAX:
            return None
        with open(path, "rb") as f:
            data = torch.load(f, map_location="cpu", weights_only=True)
    except Exception:  # not a file, not torch.save bytes, or holding more than plain values: not a pointer
        return None
    if isinstance(data, dict) and set(data) in ({POINTER}, {POINTER, LIGHTNING_VERSION}) \
            and isinstance(data[POINTER], dict):
        pointer = data[POINTER]
        if isinstance(pointer.get("repository"), str) and not os.path.isabs(pointer["repository"]):
            pointer = {**pointer, "repository": _written_from(path, pointer["repository"])}
        return pointer
    return None


def _written_from(path, repository: str) -> str:
    """The repository a pointer written with a relative path names (older versions wrote the path
    the run was given). It was relative to the run's folder, which held the pointer's folder
    (``dirpath``) or was it: the nearest of those folders with the repository in it; else the
    current folder's, as before."""
    folder = os.path.dirname(os.path.abspath(path))
    while True:
        candidate = os.path.join(folder, repository)
        if os.path.isdir(os.path.join(candidate, REPOSITORY_DIR)):
            return os.path.realpath(candidate)
        parent = os.path.dirname(folder)
        if parent == folder:
            return repository
        folder = parent


def _write_pointer(path: str, pointer: dict) -> None:
    """Write the pointer file at ``path`` whole: beside it first, then renamed over it."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=".mvc-pointer-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({POINTER: pointer, LIGHTNING_VERSION: NOT_A_CHECKPOINT}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
    except BaseException:
        if os.path.exists(staging):
            os.unlink(staging)
        raise


def load_checkpoint(path, map_location=None) -> dict:
    """The whole checkpoint dict a pointer file (a path MvcCheckpoint reported) names, loaded from its repository."""
    pointer = read_pointer(path)
    if pointer is None:
        raise mvc.BadInput(f"{path} is not a checkpoint pointer written by MvcCheckpoint")
    with mvc.Repository.open(pointer["repository"]) as repo:
        return repo.load(pointer["commit"], map_location=map_location)


def open_checkpoint(path) -> io.BytesIO:
    """The checkpoint a pointer file names as torch.save bytes in memory, for what wants a file:
    ``Model.load_from_checkpoint(open_checkpoint(path))``, ``torch.load(open_checkpoint(path))``."""
    out = io.BytesIO()
    torch.save(load_checkpoint(path), out)
    out.seek(0)
    return out


def _plain(node):
    """Lightning's checkpoint dict as mvc stores it: dict subclasses as dicts, paths as str."""
    return mvc.traverse.map_leaves(node, lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v)


RETAIN_WAIT_S = 1.0  # how long retention waits for the gc lock before leaving it to the next checkpoint


class _MvcCheckpointIO(CheckpointIO):
    """Lightning's checkpoint IO for the callback's paths; any other path goes to the IO it replaced."""

    def __init__(self, callback: "MvcCheckpoint", fallback: Optional[CheckpointIO]):
        self.callback = callback
        self.fallback = fallback

    def save_checkpoint(self, checkpoint: dict, path, storage_options: Optional[Any] = None) -> None:
        self.callback._commit(checkpoint, os.fspath(path))

    def load_checkpoint(self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None) -> dict:
        pointer = read_pointer(path)
        if pointer is not None:  # the commit itself (the tag may have moved on), in the repository it names
            return self.callback._load(pointer["commit"], map_location, pointer["repository"])
        rev = self.callback._rev_of(os.fspath(path))
        if rev is None:
            if self.fallback is None:
                raise mvc.BadInput(f"{path} is neither an mvc revision ({PREFIX}REV) nor a checkpoint of this "
                                   "callback")
            return self.fallback.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        return self.callback._load(rev, map_location)

    def remove_checkpoint(self, path) -> None:
        self.callback._forget(os.fspath(path))

    def teardown(self) -> None:
        if self.fallback is not None:
            self.fallback.teardown()


class MvcCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that commits to the mvc repository at ``repo`` (created if missing).

    ``branch`` (default "lightning") is where the run commits; rank 0 holds
    its write lock while fitting. ``keep_last`` is how many of the newest
    commits retention keeps besides the tagged ones (default 1: the tip,
    as ModelCheckpoint keeps only the files it lists). ``remote`` names a
    remote of the repository to push the branch to after each commit (in
    the background). ``sign`` signs every commit (a key, a key file path,
    or True for setting ``signing.key``). Every other keyword is
    ModelCheckpoint's.
    """

    def __init__(self, repo=None, branch: str = "lightning", keep_last: int = 1,
                 chunk_size: Optional[int] = None, remote: Optional[str] = None, sign=None, **kwargs):
        if repo is None:
            repo = kwargs.get("dirpath") or "."
        if kwargs.get("dirpath") is None:
            kwargs["dirpath"] = os.fspath(repo)  # the pointers go beside the repository
        super().__init__(**kwargs)
        if not isinstance(keep_last, int) or keep_last < 1:
            raise mvc.BadInput(f"keep_last must be a positive int, not {keep_last!r}")
        self.repo_path = repo
        self.branch = branch
        self.keep_last = keep_last
        self.chunk_size = chunk_size
        self.remote = remote
        self.sign = sign  # signs every commit: a key, a key file path, or True for signing.key
        self._signer = None
        self.repo: Optional[mvc.Repository] = None
        self.last_commit: Optional[mvc.Commit] = None
        self._pusher: Optional[Pusher] = None
        self._metrics: dict = {}
        self._resume_rng: Optional[dict] = None
        self._fit_started = False
        if not self.best_model_path:
            self.best_model_path = self._best_pointer()

    def _best_pointer(self) -> str:
        """The pointer in ``dirpath`` whose commit has the best ``monitor`` value
        (for ``ckpt_path="best"`` in a new process); "" if none."""
        if self.monitor is None or not os.path.isdir(self.dirpath):
            return ""
        found = []
        for name in sorted(os.listdir(self.dirpath)):
            path = os.path.join(self.dirpath, name)
            pointer = read_pointer(path) if name.endswith(self.FILE_EXTENSION) else None
            if pointer is None or os.path.basename(path).startswith(self.CHECKPOINT_NAME_LAST):
                continue
            try:
                with mvc.Repository.open(pointer["repository"]) as repo:
                    score = repo.get_commit(pointer["commit"]).metrics.get(self.monitor)
            except mvc.MvcError:
                continue
            if score is not None:
                found.append((score if self.mode == "min" else -score, path))
        return min(found)[1] if found else ""

    # -- Lightning's hooks ---------------------------------------------------

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, _MvcCheckpointIO):
            trainer.strategy.checkpoint_io = _MvcCheckpointIO(self, io)
        if trainer.is_global_zero and stage == "fit" and self.repo is None:
            self.repo, self._pusher = open_run(self.repo_path, self.chunk_size, self.branch, self.remote)
            self._signer = self.repo.trust.signer(self.sign)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._fit_started = False
        if self.repo is not None:
            repo, self.repo = self.repo, None
            close_run(repo, self.branch, self._pusher)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._pusher is not None:
            self._pusher.poll()  # collects a finished push, retries a failed one; never waits

    @property
    def push_error(self) -> Optional[str]:
        """Why the last background push to ``remote`` failed; None when it succeeded (or none ran)."""
        return None if self._pusher is None else self._pusher.error

    def on_fit_start(self, trainer, pl_module) -> None:
        super().on_fit_start(trainer, pl_module)
        self._fit_started = True
        self._restore_rng()

    def _restore_rng(self) -> None:
        # The last hook before the fit loop starts the data: on a restart Lightning
        # iterates the train loader while setting up, before on_train_start.
        if self._resume_rng is not None and self._fit_started:
            rng.restore(self._resume_rng)
            self._resume_rng = None

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["rng"] = distributed.all_gather(rng.capture())  # every rank's, in rank order
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        ranks = state.pop("rng", None)
        super().load_state_dict(state)
        if ranks is not None:
            if len(ranks) != distributed.world_size():
                raise mvc.BadInput(f"the checkpoint was made by {len(ranks)} ranks, this run has "
                                   f"{distributed.world_size()}; resume with the same number of devices")
            self._resume_rng = ranks[distributed.rank()]
            self._restore_rng()  # strategies that restore after setup do it after on_fit_start

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        self._metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                         if isinstance(v, (int, float)) or (isinstance(v, torch.Tensor) and v.numel() == 1)}
        super()._save_checkpoint(trainer, filepath)

    def _link_checkpoint(self, trainer, filepath: str, linkpath: str) -> None:
        """save_last="link": the "last" tag points at the commit just made, no copy."""
        if trainer.is_global_zero and self.repo is not None:
            self.repo.create_tag(self._tag(linkpath), self._tag(filepath), force=True)
            pointer = read_pointer(filepath)
            if pointer is not None:
                _write_pointer(linkpath, {**pointer, "tag": self._tag(linkpath)})
        trainer.strategy.barrier()

    def file_exists(self, filepath, trainer) -> bool:
        exists = self.repo is not None and any(t.name == self._tag(os.fspath(filepath)) for t in self.repo.tags())
        return trainer.strategy.broadcast(exists)

    # -- commits, tags, retention ----------------------------------------------

    def _tag(self, path: str) -> str:
        """The tag of a checkpoint path: ``BRANCH/NAME`` for ``.../NAME.ckpt``."""
        name = os.path.basename(path)
        if name.endswith(self.FILE_EXTENSION):
            name = name[:-len(self.FILE_EXTENSION)]
        return f"{self.branch}/{name}"

    def _rev_of(self, path: str) -> Optional[str]:
        if path.startswith(PREFIX):
            return path[len(PREFIX):]
        if os.path.exists(path):
            return None
        tag = self._tag(path)
        repo = self.repo or mvc.Repository.open(self.repo_path)
        try:
            return tag if any(t.name == tag for t in repo.tags()) else None
        finally:
            if repo is not self.repo:
                repo.close()

    def _commit(self, checkpoint: dict, path: str) -> None:
        if self.repo is None:
            raise mvc.BadInput("MvcCheckpoint saves only while fitting (its repository opens in setup)")
        step, epoch = checkpoint.get("global_step"), checkpoint.get("epoch")
        commit = self.repo.commit(_plain(checkpoint), message=f"lightning {os.path.basename(path)}",
                                  step=step, epoch=epoch, metrics=self._metrics, branch=self.branch,
                                  sign=self._signer, context={"lightning": {"path": path, "monitor": self.monitor,
                                                         "mode": self.mode, "save_top_k": self.save_top_k}})
        tag = self._tag(path)
        moved = any(t.name == tag for t in self.repo.tags())  # "last", saved under one name each time
        self.repo.create_tag(tag, commit.id, force=True)
        if self.repo.cache.remote() is not None:
            # tags stay local, so no remote ref keeps these: evicted, then pruned by the remote's
            # retention, a top-k checkpoint would be lost. Kept here whatever the cache budget
            self.repo.cache.pin(tag)
        # the repository's absolute, resolved path: a pointer is read from any folder
        _write_pointer(path, {"repository": os.path.realpath(self.repo.root), "commit": commit.id, "tag": tag})
        self.last_commit = commit
        if moved:
            self._retain()
        if self._pusher is not None:
            self._pusher.request()

    def _retain(self) -> None:
        """Retention after a tag moved or went: a goal, never a wait in the training step. gc needs
        the exclusive gc lock, which a background push holds (shared) for its whole upload: rather
        than stall the step (and fail the fit after a minute), retention waits for the next
        checkpoint; what it would prune is only kept a little longer."""
        old, self.repo.lock_timeout = self.repo.lock_timeout, RETAIN_WAIT_S
        try:
            self.repo.gc(keep_last=self.keep_last, branch=self.branch)
        except mvc.LockHeld:
            pass
        finally:
            self.repo.lock_timeout = old

    def _forget(self, path: str) -> None:
        """Where ModelCheckpoint deletes a file: drop its tag and let retention prune the commit."""
        if self.repo is None:
            return
        tag = self._tag(path)
        if read_pointer(path) is not None:
            os.unlink(path)
        if any(t.name == tag for t in self.repo.tags()):
            if self.repo.cache.remote() is not None:
                self.repo.cache.pin(tag, False)
            self.repo.delete_tag(tag, force=True)
        self._retain()

    def _load(self, rev: str, map_location, root=None) -> dict:
        mine = self.repo is not None and (root is None or os.path.samefile(root, self.repo.root))
        repo = self.repo if mine else mvc.Repository.open(root or self.repo_path)
        try:
            return repo.load(rev, map_location=map_location if isinstance(map_location, (str, torch.device))
                             else None)
        finally:
            if repo is not self.repo:
                repo.close()
