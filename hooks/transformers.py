"""Hugging Face transformers: Trainer checkpoints as mvc commits (``pip install 'mvc-checkpoints[transformers]'``).

``MvcCallback`` is a ``TrainerCallback``: at every save step of the
Trainer (``save_strategy``, ``save_steps``) it commits the model, the
optimizer, the LR scheduler, the RNG state of every process and the
trainer state (``TrainerState``: step, epoch, log history, best metric) to
a branch of an mvc repository, with the step, the epoch and the last
logged metrics as the commit's record, and the model's config. With
``keep_files=False`` (the default) the ``checkpoint-N`` directories the
Trainer wrote are removed once their commits are durable, except the
newest and the best one (``state.best_global_step``), as the Trainer's
own ``save_total_limit=1`` keeps them: so ``resume_from_checkpoint=True``,
``load_best_model_at_end=True`` and ``from_pretrained("…/checkpoint-N")``
work as without the callback, while the repository holds every save.

To resume from any commit, ``checkout(rev)`` writes it back as a
checkpoint directory in the Trainer's own layout (``model.safetensors``
with each tied tensor once, as ``save_pretrained`` writes it,
``config.json``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``,
``trainer_state.json``) at ``OUTPUT_DIR/checkpoint-N`` (the Trainer's
``output_dir`` this callback was added to; or ``directory``), whole or not
at all, and returns its path for ``trainer.train(resume_from_checkpoint=...)``,
so the Trainer's own resume logic runs: it skips the batches already seen
and restores the RNG, and the run continues bit for bit where the Trainer
supports that.

``remote="origin"`` pushes the branch to that remote of the repository
after each commit, in the background as ``Checkpointer(remote=...)`` does
(``pusher.py``): training never waits for the network, a failed push warns
once (``push_error`` says why) and is retried, and the end of training
waits for the last push.
"""

import dataclasses
import json
import os
import re
import shutil
import tempfile
from typing import Optional

import torch
from transformers import TrainerCallback

import mvc

from . import distributed, rng
from .checkpointer import close_run, follow_first_commit, open_run
from .pusher import Pusher
from .state import unwrap

LAYOUT = 1


def _metrics(state) -> dict:
    """The numbers of the last log entries since the previous save."""
    out = {}
    for entry in state.log_history[-4:]:
        for key, value in entry.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "epoch"):
                out[key] = float(value)
    return out


class MvcCallback(TrainerCallback):
    """Commits the Trainer's state at its save steps to ``branch`` of the repository at ``repo``.

    The repository is opened at ``repo`` or above it, or created there.
    The main process holds the branch's write lock while training.
    ``remote`` names a remote of the repository to push the branch to after
    each commit (in the background). ``sign`` signs every commit (a key, a
    key file path, or True for setting ``signing.key``).
    """

    def __init__(self, repo=".", branch: str = "hf", keep_files: bool = False, chunk_size: Optional[int] = None,
                 remote: Optional[str] = None, sign=None):
        self.repo_path = repo
        self.branch = branch
        self.keep_files = keep_files
        self.chunk_size = chunk_size
        self.remote = remote
        self.sign = sign  # signs every commit: a key, a key file path, or True for signing.key
        self._signer = None
        self.repo: Optional[mvc.Repository] = None
        self.last_commit: Optional[mvc.Commit] = None
        self.output_dir: Optional[str] = None  # the Trainer's, once it told us (checkout's default parent)
        self._pusher: Optional[Pusher] = None
        self._committed: set = set()  # steps whose checkpoint-N folder this callback committed
        self._resumed: Optional[tuple] = None  # (step, commit or None) of a resume from behind the tip

    def on_init_end(self, args, state, control, **kwargs):
        self.output_dir = args.output_dir

    def on_train_begin(self, args, state, control, **kwargs):
        self.output_dir = args.output_dir
        if state.is_world_process_zero and self.repo is None:
            self.repo, self._pusher = open_run(self.repo_path, self.chunk_size, self.branch, self.remote)
            self._signer = self.repo.trust.signer(self.sign)
            self._committed |= _committed_folders(self.repo, self.branch, args.output_dir)
            self._resumed = _resumed_behind(self.repo, self.branch, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self.repo is not None:
            repo, self.repo = self.repo, None
            close_run(repo, self.branch, self._pusher)

    def on_step_end(self, args, state, control, **kwargs):
        if self._pusher is not None:
            self._pusher.poll()  # collects a finished push, retries a failed one; never waits

    @property
    def push_error(self) -> Optional[str]:
        """Why the last background push to ``remote`` failed; None when it succeeded (or none ran)."""
        return None if self._pusher is None else self._pusher.error

    def on_save(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        # The RNG is as the Trainer saved it: nothing drew since. Every process calls this.
        ranks = distributed.all_gather(rng.capture())
        if not state.is_world_process_zero:
            return
        checkpoint = {"mvc_hf": LAYOUT, "model": unwrap(model).state_dict(), "rng": ranks,
                      "trainer_state": json.loads(json.dumps(dataclasses.asdict(state)))}  # as its json
        config = getattr(unwrap(model), "config", None)
        if hasattr(config, "to_json_string"):  # for config.json: from_pretrained on a checkout
            checkpoint["config"] = json.loads(config.to_json_string(use_diff=False))
        if optimizer is not None:
            checkpoint["optimizer"] = optimizer.state_dict()
        if lr_scheduler is not None:
            checkpoint["scheduler"] = lr_scheduler.state_dict()
        message, about = f"hf checkpoint-{state.global_step}", {}
        if self._resumed is not None:  # said once, on the first commit after the resume
            step, commit = self._resumed
            message += f" (resumed from checkpoint-{step}" + (f", {commit.short_id})" if commit else ")")
            about = {"resumed_from": {"step": step, "commit": commit.id if commit else None}}
            self._resumed = None
        self.last_commit = self.repo.commit(
            checkpoint, message=message, step=state.global_step,
            epoch=int(state.epoch or 0), metrics=_metrics(state), branch=self.branch, rebase=False,
            sign=self._signer,
            context={"transformers": {"epoch": state.epoch, "max_steps": state.max_steps,
                                      "train_batch_size": state.train_batch_size,
                                      "learning_rate": args.learning_rate, "seed": args.seed,
                                      "world_size": args.world_size, **about}})
        follow_first_commit(self.repo, self.branch)
        if self._pusher is not None:
            self._pusher.request()
        self._committed.add(state.global_step)
        if not self.keep_files:
            self._remove_folders(args.output_dir, {state.global_step, getattr(state, "best_global_step", None)})

    def _remove_folders(self, output_dir, keep: set) -> None:
        """Remove the checkpoint-N folders this callback committed, but those of the steps in ``keep``."""
        for step in sorted(self._committed - keep):
            folder = os.path.join(output_dir, f"checkpoint-{step}")
            if os.path.isdir(folder) and not os.path.islink(folder):
                shutil.rmtree(folder)
            self._committed.discard(step)

    def checkout(self, rev: Optional[str] = None, directory=None) -> str:
        """Write commit ``rev`` (default: the branch's tip) as a Trainer checkpoint directory; its path.

        ``directory`` defaults to ``checkpoint-STEP`` in the output_dir of
        the Trainer this callback was added to. The directory is written
        beside and swapped in whole (one that was there is replaced).
        Raises mvc.BadInput if the commit was not made by this callback, or
        if there is no ``directory`` and no Trainer told its output_dir.
        """
        repo = self.repo or mvc.Repository.open(self.repo_path)
        try:
            rev = rev or self.branch
            state = repo.load(rev)
            commit = repo.get_commit(rev)
        finally:
            if repo is not self.repo:
                repo.close()
        if not isinstance(state, dict) or state.get("mvc_hf") != LAYOUT:
            raise mvc.BadInput(f"commit {commit.short_id} was not made by mvc_hooks.transformers.MvcCallback")
        if directory is None:
            if self.output_dir is None:
                raise mvc.BadInput("checkout needs directory= when the callback was not added to a Trainer "
                                   "(whose output_dir it would use)")
            directory = os.path.join(self.output_dir, f"checkpoint-{commit.step}")
        out = os.path.abspath(os.fspath(directory))
        parent = os.path.dirname(out)
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.mvc-", dir=parent)
        try:
            _write_checkpoint(state, staging)
            _swap_in(staging, out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return out


def _resumed_behind(repo, branch: str, step: int) -> Optional[tuple]:
    """(step, the branch's commit of that step or None) when a run resumes at ``step`` while the
    branch's tip is another step: its next commit follows the tip, so its message and context say
    where the run really resumed from. None for a fresh run or a resume from the tip."""
    if not step or branch not in {b.name for b in repo.branches()}:
        return None
    commits = iter(repo.log(branch))
    tip = next(commits, None)
    if tip is None or tip.step == step:
        return None
    same = next((c for c in commits if c.step == step and c.message.startswith("hf checkpoint-")), None)
    return step, same


def _committed_folders(repo, branch: str, output_dir) -> set:
    """Steps of the checkpoint-N folders in ``output_dir`` that ``branch`` holds as this callback's
    commits: an earlier process of the run (killed, or resumed from) wrote and committed them, so
    they are removed as this process's own are, not left behind for good."""
    try:
        names = os.listdir(output_dir)
    except OSError:
        return set()
    steps = {int(m.group(1)) for name in names if (m := re.fullmatch(r"checkpoint-(\d+)", name))}
    if not steps or branch not in {b.name for b in repo.branches()}:
        return set()
    return {c.step for c in repo.log(branch) if c.step in steps and c.message == f"hf checkpoint-{c.step}"}


def _swap_in(staging: str, out: str) -> None:
    """Put folder ``staging`` at ``out``; a folder already there is removed only once the new one is in place."""
    old = None
    if os.path.lexists(out):
        if not os.path.isdir(out) or os.path.islink(out):
            raise mvc.BadInput(f"{out} exists and is not a folder; checkout writes a checkpoint folder there")
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rename(out, os.path.join(old, "previous"))
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old)


def _write_checkpoint(state: dict, out) -> None:
    """The Trainer's checkpoint layout (the names its resume looks for)."""
    from safetensors.torch import save_file
    save_file(_untied(state["model"]), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    if "config" in state:
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(state["config"], f, indent=2, sort_keys=True)
    if "optimizer" in state:
        torch.save(state["optimizer"], os.path.join(out, "optimizer.pt"))
    if "scheduler" in state:
        torch.save(state["scheduler"], os.path.join(out, "scheduler.pt"))
    ranks = state["rng"]
    for index, saved in enumerate(ranks):
        name = "rng_state.pth" if len(ranks) == 1 else f"rng_state_{index}.pth"
        torch.save(_trainer_rng(saved, None if len(ranks) == 1 else index), os.path.join(out, name))
    with open(os.path.join(out, "trainer_state.json"), "w") as f:
        json.dump(state["trainer_state"], f, indent=2, sort_keys=True)


def _untied(model: dict) -> dict:
    """The model state with each tied tensor (loaded as one object for several
    keys, as GPT-2's lm_head and wte) under one key only, as save_pretrained
    writes it; loading it ties the others again (load_state_dict, from_pretrained)."""
    seen, out = set(), {}
    for key, tensor in model.items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[key] = tensor
    return out


def _trainer_rng(saved: dict, process: Optional[int]) -> dict:
    """An RNG state of rng.capture() in the Trainer's rng_state.pth form.

    A distributed run's file holds the process's own CUDA device state (one
    device a process, the Trainer's layout), the others all devices'.
    """
    py, npy = saved["python"], saved["numpy"]
    import numpy as np
    state = {"python": (py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]),
             "numpy": (npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                       npy["gauss"]),
             "cpu": saved["torch"]}
    if saved["cuda"]:
        cuda = saved["cuda"]
        state["cuda"] = cuda if process is None else cuda[process % len(cuda)]
    return state
