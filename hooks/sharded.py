"""The Checkpointer's path for sharded models (FSDP2 ``fully_shard``, tensor parallel).

A model is **sharded** when any of its parameters is a DTensor. Its
checkpoint has the same layout as any other (``checkpointer.py``), but the
model and optimizer entries are DCP state dicts (``get_state_dict``: keys
are parameter FQNs, values DTensors) that every rank saves and loads itself
through ``MvcStorageWriter`` / ``MvcStorageReader``: nothing is gathered
on rank 0, and a resume reshards to any world size. The small parts
(scheduler, scaler, RNG and sampler of every rank, progress, extra) are
rank 0's, gathered and broadcast as for unsharded models. Every rank needs
the repository's filesystem, unless the run saves through a remote its
repository caches: then every rank's path is its own host's clone.

With ``async_save`` a save is ``dcp.async_save``: DCP copies this rank's
shards to CPU memory at the step (its default stager), rank 0's small parts
are deep-copied, and a thread writes the chunks and commits while training
goes on. The thread's collectives run on a process group of their own
(``save_group``), so they never interleave with the training loop's on the
default group.
"""

import copy
from typing import Callable, Optional

import torch.distributed as dist

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

import mvc

from .dcp import MvcStorageReader, MvcStorageWriter
from .state import members, unwrap

SHARDED = ("model", "optimizer")  # the groups DCP saves and loads on every rank


def is_sharded(components) -> bool:
    """Whether the run's model holds DTensor parameters; BadInput if so and
    it is not one model with at most one optimizer."""
    models = [m for _, m in components.each("model")]
    if not any(isinstance(p, DTensor) for m in models for p in unwrap(m).parameters()):
        return False
    optimizers = [o for _, o in components.each("optimizer")]
    if len(models) != 1 or len(optimizers) > 1 or any(k is not None for k, _ in members(
            components.get("model"))) or (optimizers and next(components.each("optimizer"))[0] is not None):
        raise mvc.BadInput("a sharded (DTensor) model is checkpointed as one model= and at most one optimizer=")
    return True


def _parts(components) -> tuple:
    model = unwrap(next(components.each("model"))[1])
    opt = next((o for _, o in components.each("optimizer")), None)
    return model, opt


def dcp_state(components) -> dict:
    """This rank's shards of the model and optimizer state (DTensors, FQN keys)."""
    model, opt = _parts(components)
    msd, osd = get_state_dict(model, [opt] if opt is not None else [])
    return {"model": msd, "optimizer": osd} if opt is not None else {"model": msd}


def save(path, components, small: Optional[dict], branch: str, record: Optional[dict],
         remote: Optional[str] = None) -> Optional[mvc.Commit]:
    """Save on every rank (a collective): rank 0 passes ``small`` (the rest of
    the checkpoint) and ``record``; the commit, on rank 0. ``remote``: save
    through it, each rank from its own clone at ``path`` (MvcStorageWriter)."""
    state, writer = _prepare(path, components, small, branch, record, remote)
    try:
        dcp.save(state, storage_writer=writer)
    finally:
        writer.close()
    return writer.last_commit


def start_save(path, components, small: Optional[dict], branch: str, record: Optional[dict],
               group, remote: Optional[str] = None) -> Callable[[], Optional[mvc.Commit]]:
    """``save`` in the background (a collective on every rank, over ``group``).

    Returns once this rank's shards are copied; the function it returns
    waits for the save and gives the commit (on rank 0) or raises its error.
    """
    if small is not None:  # the training loop goes on changing these
        small = copy.deepcopy({k: v for k, v in small.items() if k not in SHARDED})
    state, writer = _prepare(path, components, small, branch, record, remote)
    try:
        future = dcp.async_save(state, storage_writer=writer, process_group=group)
    except BaseException:
        writer.close()
        raise

    def finish() -> Optional[mvc.Commit]:
        try:
            future.result()
        finally:
            writer.close()
        return writer.last_commit
    return finish


def save_group():
    """A gloo process group for background saves (a collective: every rank creates it)."""
    return dist.new_group(backend="gloo")


def _prepare(path, components, small: Optional[dict], branch: str, record: Optional[dict],
             remote: Optional[str]) -> tuple:
    state = dcp_state(components)
    if small is not None:
        state.update({k: v for k, v in small.items() if k not in SHARDED})
    record = record or {}
    writer = MvcStorageWriter(path, branch=branch, message=record.get("message", ""), step=record.get("step"),
                              metrics=record.get("metrics"), epoch=record.get("epoch"), context=record.get("context"),
                              remote=remote)
    return state, writer


def load(path, components, commit: str, remote: Optional[str] = None) -> None:
    """Load the model and optimizer shards of ``commit`` on every rank (a collective), resharding;
    with ``remote``, each rank fetches first (MvcStorageReader)."""
    model, opt = _parts(components)
    state = dcp_state(components)
    reader = MvcStorageReader(path, rev=commit, remote=remote)
    try:
        dcp.load(state, storage_reader=reader)
    finally:
        reader.close()
    if opt is None:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={})
    else:
        set_state_dict(model, [opt], model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def others(components):
    """The components without the sharded groups, for checks and loads of rank 0's state."""
    return type(components)(**{g: v for g, v in components.groups.items() if g not in SHARDED})
