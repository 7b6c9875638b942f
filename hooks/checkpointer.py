"""The Checkpointer: complete-state commits from a training loop, and resume.

A **checkpoint** is one mvc commit whose state is the whole run:

    model, optimizer, scheduler, scaler, stateful   the components (see state.py)
    extra        the user's plain extra state
    ranks        one entry per rank: {"rng": RNG state, "sampler": ...}
    progress     {"step", "epoch", "batch"}: the step just finished
    world_size   how many ranks made it
    mvc_hooks    the layout version

The commit's ``step`` is the step just finished, so a resume returns
``step + 1``; its context is the training context (context.py), its metrics
the loss and the metrics given to ``step()``.

Rank 0 (the root) owns the repository and holds the branch's write lock
for the life of the run. Every rank calls the same methods; collectives
keep them in step. With ``async_save`` the state is copied to CPU memory at
the step and a background thread commits it while training goes on (for
sharded models through ``dcp.async_save``, sharded.py): at most one save
is in flight, the next one waits for it, and its error is
raised by the next ``step()``, ``save()``, ``wait()`` or ``close()``.

Commits use ``rebase=False``: the run holds the branch's lock, so the tip
can only have moved if someone forced the lock away, and then stacking
this run's commits on theirs would be wrong; the commit fails with
RefConflict instead.
"""

import atexit
import copy
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import torch

import mvc

from . import context as contexts
from . import data, distributed, policy as policies, rng, sharded
from .pusher import Pusher
from .state import Components, Snapshot

LAYOUT = 1
_log = logging.getLogger("mvc_hooks")
PUSH_CLOSE_S = 600.0  # close() waits at most this long for the last background push

# Branches this process's Checkpointers are using: the branch lock belongs to
# the process, so it does not stop a second Checkpointer in the same one.
_IN_USE: set = set()
_IN_USE_LOCK = threading.Lock()


def _open_or_init(path, chunk_size: Optional[int]) -> mvc.Repository:
    try:
        return mvc.Repository.open(path)
    except mvc.NotARepository:
        Path(path).mkdir(parents=True, exist_ok=True)
        if chunk_size is None:
            return mvc.Repository.init(path)
        return mvc.Repository.init(path, chunk_size=chunk_size)


def open_run(path, chunk_size: Optional[int], branch: str, remote: Optional[str]) -> tuple:
    """(repository, Pusher or None) for a training callback's run: the
    repository opened or created, ``remote`` checked, ``branch`` locked.
    Nothing stays open if any of it fails."""
    repo = _open_or_init(path, chunk_size)
    try:
        pusher = None if remote is None else Pusher.of(repo, remote, branch)
        repo.locks.lock(branch)
    except BaseException:
        repo.close()
        raise
    return repo, pusher


def follow_first_commit(repo: mvc.Repository, branch: str) -> None:
    """Put HEAD on ``branch`` when HEAD's branch has no commits (a new repository): a run's
    first commit then reads as Git's first commit on an unborn branch, and ``mvc log``,
    ``show`` and ``status`` show the run (as the DCP writer does)."""
    head = repo.head()
    if head.id is None and head.branch != branch:
        repo.checkout(branch)


def close_run(repo: mvc.Repository, branch: str, pusher: Optional[Pusher]) -> None:
    """Wait for the last push (at most PUSH_CLOSE_S), unlock ``branch`` and close ``repo``."""
    try:
        if pusher is not None:
            pusher.close(PUSH_CLOSE_S)
    finally:
        try:
            repo.locks.unlock(branch)
        finally:
            repo.close()


def _raise_together(error: Optional[BaseException]) -> None:
    """Raise an error of any rank on every rank (collective), so none waits forever.

    A rank that failed raises its own exception; the others raise the first
    failing rank's mvc error class (MvcError for any other exception), naming
    that rank.
    """
    mine = None if error is None else (type(error).__name__, str(error))
    for where, found in enumerate(distributed.all_gather(mine)):
        if found is not None:
            if error is not None:
                raise error
            cls = getattr(mvc, found[0], None)
            if isinstance(cls, type) and issubclass(cls, mvc.MvcError):
                raise cls(f"on rank {where}: {found[1]}")
            raise mvc.MvcError(f"on rank {where}: {found[0]}: {found[1]}")


class _Save:
    """One commit running in a background thread."""

    def __init__(self, commit: Callable, wait: Callable):
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(commit, wait), name="mvc-save")
        self.thread.start()

    def _run(self, commit: Callable, wait: Callable) -> None:
        try:
            wait()
            commit()
        except BaseException as exc:  # handed to the training thread, never lost
            self.error = exc

    def done(self) -> bool:
        return not self.thread.is_alive()


class Checkpointer:
    """Commits a training run's complete state to ``path`` and resumes it.

    Components: ``model``, ``optimizer``, ``scheduler``, ``scaler`` and
    ``stateful`` each take one object, a list or a dict of them; ``sampler``
    is this rank's data order (ResumableSampler, a StatefulDataLoader, or
    anything with state_dict/load_state_dict); ``extra`` is a dict of plain
    values the run mutates and gets back on resume.

    Data: ``loader`` is the DataLoader (or StatefulDataLoader) the loop
    trains from; the Checkpointer tracks its passes so that a resume in the
    middle of an epoch continues it bit for bit (data.py): the loader's
    next pass yields the rest of the checkpoint's epoch, or, with
    ``loop_skips=True``, the loop iterates past the seen batches itself
    (``batches_seen`` says how many). A checkpoint taken while a loader it
    was not given is mid-epoch is refused by ``resume()``.

    When: ``every_n_steps``, ``every_n_seconds``, ``on_best`` (a metric name
    or (name, "min"/"max")), ``adaptive`` ((min_steps, max_steps)), a custom
    ``policy``, gated by ``overhead_budget`` (a fraction of training time);
    see policy.py. With none given, every 30 minutes.

    The repository is opened at ``path`` or above it, or created at ``path``
    (with ``chunk_size`` when given). ``branch`` defaults to HEAD's branch.
    ``on_commit(commit)`` is called after each commit, in the thread that
    made it. Raises LockHeld if another run holds the branch.

    ``remote`` names a remote of the repository (``mvc remote add``): each
    commit is then pushed to it in the background (pusher.py), never
    blocking ``step()``; a failed push warns once, is retried and sets
    ``push_error``, and training goes on. ``close()`` waits for the last
    push (at most PUSH_CLOSE_S seconds). A sharded (FSDP2) run whose
    repository caches ``remote`` (a clone of it) saves through the remote
    instead: every rank's ``path`` is its own host's clone, each rank
    uploads its shards and rank 0 commits and pushes (sharded.py), so the
    hosts share no filesystem.

    ``sign`` signs every commit (a ``mvc.signing.SigningKey``, a key file
    path, or True for setting ``signing.key``; not for sharded saves).
    ``scan`` (a budget such as "10%") runs the repository's rotating
    integrity scan (``mvc fsck --budget``) in a background thread after each
    commit: with "P%", every ceil(100/P) commits cover every pack. Damage it
    finds is logged and raised as ScanFoundDamage by the next ``step()``.
    """

    def __init__(self, path=".", *, model=None, optimizer=None, scheduler=None, scaler=None,
                 sampler=None, stateful=None, extra: Optional[dict] = None, branch: Optional[str] = None,
                 loader=None, loop_skips: bool = False,
                 every_n_steps=None, every_n_seconds=None, on_best=None, adaptive=None,
                 overhead_budget=None, policy=None, async_save: bool = True,
                 context: Optional[dict] = None, chunk_size: Optional[int] = None,
                 on_commit: Optional[Callable] = None, remote: Optional[str] = None, sign=None,
                 scan=None):
        self.components = Components(model=model, optimizer=optimizer, scheduler=scheduler,
                                     scaler=scaler, stateful=stateful)
        data.watch()
        self.samplers = [obj for _, obj in Components(sampler=sampler).each("sampler")]
        self.loader = None if loader is None else data.LoaderTracker(loader, self.samplers, loop_skips)
        self.per_rank = Components(sampler=sampler, loader=self.loader)
        # DTensor (FSDP2) models: every rank saves and loads its own shards (sharded.py)
        self.sharded = sharded.is_sharded(self.components)
        self._path = path
        self._reshard = False
        self._resumed_step: Optional[int] = None
        if extra is not None and not isinstance(extra, dict):
            raise mvc.BadInput(f"extra must be a dict of plain values, not a {type(extra).__name__}")
        self.extra = extra
        self.policy = policies.build(every_n_steps, every_n_seconds, on_best, adaptive,
                                     overhead_budget, policy)
        self.async_save = async_save
        self.user_context = dict(context or {})
        self.on_commit = on_commit
        self._sign, self._signer = sign, None
        self._scan = _Scans(scan) if scan is not None else None
        self.rank = distributed.rank()
        self.world_size = distributed.world_size()
        self.root = self.rank == 0
        self.repo: Optional[mvc.Repository] = None
        self.branch: Optional[str] = None
        self.last_commit: Optional[mvc.Commit] = None
        self.resumed_from: Optional[mvc.Commit] = None
        self.epoch: Optional[int] = None
        self.batch: Optional[int] = None
        self._key = None
        self._locked = False
        self._closed = False
        self._pending: Optional[_Save] = None
        self._pusher: Optional[Pusher] = None
        self._snapshot = Snapshot()
        # Background sharded saves run DCP's collectives on a group of their own.
        self._save_group = sharded.save_group() if self.sharded and async_save else None
        self._step_hooks: dict = {}  # id(optimizer) -> hook handle: steps wait for the snapshot copy
        if async_save:
            for _, opt in self.components.each("optimizer"):
                if isinstance(opt, torch.optim.Optimizer) and id(opt) not in self._step_hooks:
                    self._step_hooks[id(opt)] = opt.register_step_pre_hook(self._before_optimizer_step)
        self._committed_step: Optional[int] = None
        self._last_step: Optional[int] = None
        self._last_values: dict = {}
        self._distributed = distributed.describe()
        error = None
        if self.root:
            try:
                self._open(path, branch, chunk_size, remote)
            except Exception as exc:  # any error, not only mvc's: the other ranks wait to hear of it
                error = exc
                try:
                    self._release()
                except Exception as cleanup:  # the open's error is the one to raise
                    if hasattr(error, "add_note"):  # Python 3.11+
                        error.add_note(f"releasing the repository failed too: {cleanup!r}")
        try:
            _raise_together(error)
        except BaseException:
            self._drop_save_group()
            for handle in self._step_hooks.values():
                handle.remove()
            if self.loader is not None:
                self.loader.close()  # the loader goes back as it was
            raise
        self.branch = distributed.share(self.branch)
        # Sharded saves across hosts go through the remote the repository caches (rank 0 decides).
        self._via = distributed.share(self._via_remote(remote) if self.root else None)
        self._static = {**contexts.machine(), **contexts.code()} if self.root else {}
        self._started = time.time()
        self.tracker = policies.Tracker(time.monotonic())
        atexit.register(self.close)

    # -- lifecycle ---------------------------------------------------------

    def _open(self, path, branch: Optional[str], chunk_size: Optional[int], remote: Optional[str]) -> None:
        self.repo = _open_or_init(path, chunk_size)
        if branch is None:
            branch = self.repo.head().branch
            if branch is None:
                raise mvc.BadInput("HEAD is detached: pass branch= to say where the run commits")
        key = (os.path.realpath(self.repo.root), branch)
        with _IN_USE_LOCK:
            if key in _IN_USE:
                raise mvc.LockHeld(f"branch {branch!r} is already used by another Checkpointer in this "
                                   f"process (pid {os.getpid()}); close it first or use another branch")
            _IN_USE.add(key)
        self._key = key
        self.branch = branch
        self.repo.locks.lock(branch)
        self._locked = True
        self._signer = self.repo.trust.signer(self._sign)
        if remote is not None and not self._via_remote(remote):
            self._pusher = Pusher.of(self.repo, remote, branch)

    def _via_remote(self, remote: Optional[str]) -> Optional[str]:
        """``remote`` when this sharded run saves through it (its repository caches it), else None."""
        return remote if self.sharded and remote is not None and self.repo.cache.remote() == remote else None

    def _release(self) -> None:
        try:
            if self._locked:
                self._locked = False
                self.repo.locks.unlock(self.branch)
        finally:
            if self._key is not None:
                with _IN_USE_LOCK:
                    _IN_USE.discard(self._key)
                self._key = None
            if self.repo is not None:
                self.repo.close()
                self.repo = None

    def close(self) -> None:
        """Wait for the save in flight, then release the branch lock (idempotent).

        Raises the save's error, if it failed, after releasing.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self.wait()
        finally:
            if self._scan is not None:
                self._scan.join()
            self._drop_save_group()
            if self._pusher is not None:
                self._pusher.close(PUSH_CLOSE_S)
            for handle in self._step_hooks.values():
                handle.remove()
            self._step_hooks.clear()
            if self.loader is not None:
                self.loader.close()
            if self.root:
                self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- saving ------------------------------------------------------------

    @property
    def batches_seen(self) -> int:
        """After resume(): the batches of the checkpoint's pass the loop trained on (0 without loader=)."""
        return 0 if self.loader is None else self.loader.batches_seen

    def wait(self) -> Optional[mvc.Commit]:
        """Wait for the save in flight; raise its error. The last commit, or None.

        Also collects a finished background push (``push_error``) without waiting for it.
        """
        if self._pusher is not None:
            self._pusher.poll()
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.thread.join()
            if pending.error is not None:
                raise pending.error
        return self.last_commit

    def step(self, step: int, loss: Optional[float] = None, metrics: Optional[dict] = None,
             epoch: Optional[int] = None, batch: Optional[int] = None) -> None:
        """Report a finished step (and the epoch and batch within it); commits when the policy says.

        Call it on every rank. Raises the error of a background save that failed.
        """
        self._check_open()
        self._snapshot.filled()  # the loop may change anything from here on
        if self._pusher is not None:
            self._pusher.poll()
        if self._pending is not None and self._pending.done():
            self.wait()
        if self._scan is not None:
            self._scan.raise_found()
        if self.loader is not None:
            expected, self._resumed_step = self._resumed_step, None
            self.loader.on_step(step, expected)
        if epoch is not None:
            self.epoch = epoch
        if batch is not None:
            self.batch = batch
        self._last_step = step
        values = self._last_values = _numbers(loss, metrics)
        obs = self.tracker.observe(step, time.monotonic(), values.get("loss"), values)
        decision = self.policy(obs) if self.root or self.policy.step_only else False
        if not self.policy.step_only:
            decision = distributed.agree(decision)
        if decision:
            self._save(step, obs, values, "")

    def save(self, step: Optional[int] = None, message: str = "", metrics: Optional[dict] = None) -> None:
        """Commit now (every rank calls it), unless ``step`` is already committed.

        ``step`` defaults to the last one reported, whose loss and metrics
        the commit records too.
        """
        self._check_open()
        step = self._last_step if step is None else step
        if step is None:
            raise mvc.BadInput("save() needs a step: no step() was reported yet")
        if step == self._committed_step:
            return
        values = {**(self._last_values if step == self._last_step else {}), **_numbers(None, metrics)}
        obs = self.tracker.observe(step, time.monotonic(), None, values)
        self._save(step, obs, values, message)

    def _check_open(self) -> None:
        if self._closed:
            raise mvc.BadInput("this Checkpointer is closed")

    def _save(self, step: int, obs, metrics: dict, message: str) -> None:
        started = time.monotonic()
        self.wait()  # the snapshot buffers are free again once the last save is done
        mine = {"rng": rng.capture(), **self.per_rank.state()}
        loose = data.untracked(self.samplers)
        if loose:
            mine["untracked"] = loose
        # The gather is the barrier: rank 0 commits once every rank has finished the step.
        ranks = distributed.gather(mine)
        if self.sharded:
            self._save_sharded(step, obs, metrics, message, ranks)
        elif self.root:
            progress = {"step": step, "epoch": self.epoch, "batch": self.batch}
            state = self._state(progress, ranks)
            record = {"message": message or f"step {step}", "step": step, "epoch": self.epoch,
                      "metrics": metrics, "context": self._context(progress, obs)}
            if self.async_save:
                copy = self._snapshot.take(state, defer=self._deferrable())
                self._pending = _Save(lambda: self._commit(copy, record), self._snapshot.fill)
            else:
                self._commit(state, record)
        self._committed_step = step
        now = time.monotonic()
        self.tracker.committed(step, now, now - started)

    def _deferrable(self) -> Callable:
        """Which tensors the save thread may copy while training goes on: the
        optimizers' parameters and state, which only an optimizer step changes
        (and every step waits for the copy); everything else is copied now."""
        storages = set()
        for _, opt in self.components.each("optimizer"):
            if isinstance(opt, torch.optim.Optimizer) and id(opt) in self._step_hooks:
                for group in opt.param_groups:
                    storages.update(_storage(p) for p in group["params"])
                for per_param in opt.state.values():
                    storages.update(_storage(v) for v in per_param.values() if isinstance(v, torch.Tensor))
        return lambda tensor: _storage(tensor) in storages

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        self._snapshot.filled()

    def _save_sharded(self, step: int, obs, metrics: dict, message: str, ranks) -> None:
        """Every rank saves its shards; rank 0 adds the rest and commits (in the background with async_save)."""
        small = record = None
        if self.root:
            progress = {"step": step, "epoch": self.epoch, "batch": self.batch}
            small = self._state(progress, ranks)
            record = {"message": message or f"step {step}", "step": step, "epoch": self.epoch,
                      "metrics": metrics, "context": self._context(progress, obs)}
        path = self.repo.root if self.root else self._path
        if self._save_group is None:
            self._sharded_landed(sharded.save(path, self.components, small, self.branch, record, self._via))
            return
        finish = sharded.start_save(path, self.components, small, self.branch, record, self._save_group,
                                    self._via)
        self._pending = _Save(lambda: self._sharded_landed(finish()), lambda: None)

    def _sharded_landed(self, commit: Optional[mvc.Commit]) -> None:
        if self.root:
            self._landed(commit)

    def _drop_save_group(self) -> None:
        group, self._save_group = self._save_group, None
        if group is not None and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group(group)

    def _state(self, progress: dict, ranks: list) -> dict:
        state = self.components.state()
        state.update({"mvc_hooks": LAYOUT, "world_size": self.world_size, "ranks": ranks,
                      "progress": progress, "types": self.components.types()})
        if self.extra is not None:
            state["extra"] = dict(self.extra)
        return state

    def _context(self, progress: dict, obs) -> dict:
        return contexts.commit_context(self._static, self.components, self.per_rank.get("sampler"), progress,
                                       obs, self._started, self._distributed, self.user_context)

    def _commit(self, state: dict, record: dict) -> mvc.Commit:
        commit = self.repo.commit(state, branch=self.branch, rebase=False, sign=self._signer, **record)
        self._landed(commit)
        return commit

    def _landed(self, commit: mvc.Commit) -> None:
        self.last_commit = commit
        if commit.branch:
            follow_first_commit(self.repo, commit.branch)
        if self._scan is not None:
            self._scan.start(self.repo)
        if self._pusher is not None:
            self._pusher.request()
        if self.on_commit is not None:
            self.on_commit(commit)

    @property
    def push_error(self) -> Optional[str]:
        """Why the last background push to ``remote`` failed; None when it succeeded (or none ran)."""
        return None if self._pusher is None else self._pusher.error

    # -- resume ------------------------------------------------------------

    def resume(self, rev: Optional[str] = None, strict: bool = True, reshard: bool = False) -> int:
        """Restore the run from its branch's last commit; the step to run next.

        0 when the branch has no commits. ``rev`` resumes from another
        commit: allowed when the branch is new (it then starts at ``rev``)
        or already points there. Every rank calls it; rank 0 reads the
        commit and sends the state to the others. Everything is checked
        before anything is loaded: a missing component, a shape mismatch, a
        sampler of another data order, another world size raise BadInput and
        leave the objects untouched. An error on one rank is raised on all.
        ``strict=False`` allows a checkpoint holding groups not given here.
        A sharded (DTensor) model loads its own shards on every rank; with
        ``reshard=True`` it may resume at another world size, and then each
        rank's RNG and sampler are not restored (they were another rank's).
        """
        self._check_open()
        self.wait()
        self._reshard = reshard
        error, payload = None, None
        if self.root:
            try:
                payload = self._read(rev)
            except Exception as exc:  # any error, not only mvc's: the other ranks wait to hear of it
                error = exc
        _raise_together(error)
        payload = distributed.broadcast_state(payload)
        if payload is None:
            return 0
        commit, state, fork = payload["commit"], payload["state"], payload.get("fork")
        before = self._check_and_load_per_rank(state, f"commit {commit.short_id} (step {commit.step})", strict)
        try:
            self._restore(state, commit.id)
            if fork is not None:  # resume(rev) on a new branch: made only once the resume succeeded
                self._make_branch(fork)
        except BaseException:
            self.per_rank.load(before)  # all or nothing: the data position goes back too
            raise
        self.resumed_from = self.last_commit = commit
        self._committed_step = state["progress"]["step"]
        self._resumed_step = self._committed_step + 1
        self.tracker = policies.Tracker(time.monotonic(), self._committed_step)
        return self._committed_step + 1

    def _make_branch(self, at: str) -> None:
        """Create the run's branch at ``at`` (rank 0; an error is raised on every rank)."""
        error = None
        if self.root:
            try:
                self.repo.create_branch(self.branch, at)
            except Exception as exc:
                error = exc
        _raise_together(error)

    def _read(self, rev: Optional[str]) -> Optional[dict]:
        tip = next((b.id for b in self.repo.branches() if b.name == self.branch), None)
        fork = None
        if rev is not None:
            target = self.repo.resolve(rev)
            if tip is None:
                # the branch is made after the commit loads and checks: a failed resume leaves none
                # behind at a commit it could not resume from (which would block every later resume)
                tip = fork = target
            elif tip != target:
                raise mvc.BadInput(f"branch {self.branch!r} is at {tip[:12]}, not {rev!r}: resume {rev!r} "
                                   "on a new branch (branch=...) to fork the run from it")
        if tip is None:
            return None
        if self.sharded:  # the model and optimizer come through DCP on every rank, in _restore
            keys = ("mvc_hooks", "world_size", "ranks", "progress", "extra", "scheduler", "scaler", "stateful")
            return {"commit": self.repo.get_commit(tip), "state": mvc.reader.load_keys(self.repo, tip, keys),
                    "fork": fork}
        return {"commit": self.repo.get_commit(tip), "state": self.repo.load(tip), "fork": fork}

    def _check(self, state: dict, where: str, strict: bool) -> None:
        if not isinstance(state, dict) or state.get("mvc_hooks") != LAYOUT:
            raise mvc.BadInput(f"{where} was not made by an mvc_hooks Checkpointer (layout {LAYOUT}); "
                               "load it with Repository.load instead")
        if state["world_size"] != self.world_size and not (self.sharded and self._reshard):
            raise mvc.BadInput(f"{where} was made by {state['world_size']} ranks, this run has "
                               f"{self.world_size}; resume with the same world size"
                               + (" or pass reshard=True" if self.sharded else ""))
        (sharded.others(self.components) if self.sharded else self.components).check(state, where, strict)
        if self._same_world(state):
            self.per_rank.check(state["ranks"][self.rank], f"{where} rank {self.rank}", strict)
        loose = state["ranks"][self.rank].get("untracked") if self._same_world(state) else None
        if strict and loose:
            raise mvc.BadInput(
                f"{where} was taken in the middle of a pass of a DataLoader the Checkpointer was not given "
                f"({'; '.join(loose)}): a resume would start that pass again with other random numbers and "
                "other batches. Pass it as Checkpointer(loader=...) to resume bit for bit (see docs/guide.md), "
                "or resume(strict=False) to go on anyway, not bit for bit")
        if self.extra is not None and "extra" not in state:
            raise mvc.BadInput(f"{where} has no extra state, but extra= was given")
        if strict and self.extra is None and "extra" in state:
            raise mvc.BadInput(f"{where} holds extra state and no extra= dict was given to receive it; "
                               "pass one, or strict=False to leave it out")

    def _check_and_load_per_rank(self, state: dict, where: str, strict: bool) -> dict:
        """Check ``state`` on every rank, then load this rank's own components.

        A sampler without a check of its own is checked only by its loader,
        so they are loaded before anything else; if any rank fails, every
        rank raises and puts its per-rank components back as they were.
        Returns their previous state, to put back if a later load fails.
        """
        error, before = None, None
        try:
            self._check(state, where, strict)
            before = copy.deepcopy(self.per_rank.state())  # a state_dict may share the live object's data
            if self._same_world(state):
                self.per_rank.load(state["ranks"][self.rank])
        except Exception as exc:  # any error, not only mvc's: the other ranks wait to hear of it
            error = exc
        try:
            _raise_together(error)
        except Exception:
            if before is not None:
                self.per_rank.load(before)
            raise
        return before

    def _restore(self, state: dict, commit_id: str) -> None:
        """Load everything but the per-rank components (loaded already)."""
        if self.sharded:  # a collective: every rank reads its own shards, resharding
            sharded.load(self.repo.root if self.root else self._path, self.components, commit_id, self._via)
            sharded.others(self.components).load(state)
        else:
            self.components.load(state)
        if self.extra is not None:
            self.extra.clear()
            self.extra.update(state["extra"])
        progress = state["progress"]
        self.epoch, self.batch = progress["epoch"], progress["batch"]
        if self.epoch is not None and self._pass_ended(state):
            # the checkpoint closed its epoch and the loader starts a fresh pass: a loop that
            # starts at ckpt.epoch must not run (or, with set_epoch, reshuffle) that epoch again
            self.epoch += 1
        if self._same_world(state):
            rng.restore(state["ranks"][self.rank]["rng"])  # last: loading must not draw from the restored generators

    def _pass_ended(self, state: dict) -> bool:
        """Whether the checkpoint's step was the last batch of its loader's pass (``loader=``)."""
        if self.loader is None:
            return False
        ranks = state.get("ranks") or [{}]
        saved = ranks[self.rank if self._same_world(state) else 0].get("loader")
        return isinstance(saved, dict) and saved.get("ended") is True

    def _same_world(self, state: dict) -> bool:
        return state["world_size"] == self.world_size


class _Scans:
    """The background integrity scans of a run: one at a time, started after a
    commit lands; damage found is kept for the next ``step()`` to raise."""

    def __init__(self, budget):
        mvc.audit.parse_budget(budget)  # a bad budget fails when the Checkpointer is made
        self.budget, self.thread, self.found, self.reports = budget, None, None, []

    def start(self, repo: mvc.Repository) -> None:
        if self.thread is not None and self.thread.is_alive():
            return  # the last scan is still running: this commit's turn is skipped, not queued
        self.thread = threading.Thread(target=self._run, args=(repo,), name="mvc-scan", daemon=True)
        self.thread.start()

    def _run(self, repo: mvc.Repository) -> None:
        try:
            report = repo.trust.scan(self.budget)
        except mvc.MvcError as exc:  # e.g. gc held the lock too long: try again after the next commit
            _log.warning("mvc integrity scan did not run: %s", exc)
            return
        self.reports.append(report)
        if not report.ok:
            _log.error("mvc integrity scan found damage: %s", "; ".join(
                f"{p.pack} {p.kind} {p.detail}" for p in report.problems))
            self.found = report

    def raise_found(self) -> None:
        found, self.found = self.found, None
        if found is not None:
            mvc.audit.raise_for(found)

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()


def _storage(tensor: torch.Tensor) -> tuple:
    return (tensor.device, tensor.untyped_storage().data_ptr())


def _numbers(loss, metrics: Optional[dict]) -> dict:
    """The step's loss and metrics as floats (the commit's metrics)."""
    values = {} if loss is None else {"loss": loss}
    values.update(metrics or {})
    out = {}
    for name, value in values.items():
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise mvc.BadInput(f"metric {name!r} must be a number, not {value!r}") from None
    return out
