"""One rank of a real sharded job (gloo on CPU, FSDP2), started as its own process by tests/test_dcp_fsdp.py.

    python dcp_worker.py SCENARIO RANK WORLD ROOT [REV]

Scenarios:
- ``save``: train one step of an FSDP2 model with AdamW, save model and
  optimizer state (DTensors), a plain tensor and plain values through
  MvcStorageWriter; rank 0 writes the full (gathered) state to ROOT/ref-N.pt
  and the commit's stats to ROOT/commit-N.json.
- ``load``: build the model on this world size, load REV through
  MvcStorageReader and set_state_dict; rank 0 writes ROOT/loaded-WORLD.pt
  with the full state it gathered.
- ``kill``: like ``save``, but rank 1 SIGKILLs itself once a pack is being written.
- ``remote``: like ``save``, but no rank shares a repository: rank N saves
  through its own clone ROOT/hostN of remote "origin" (``remote="origin"``);
  rank 0 writes ROOT/remote-ref-N.pt and ROOT/remote-N.json; then every rank
  loads ``origin/REV`` into another model through its own clone
  (``MvcStorageReader(remote="origin")``), rank 0 writes ROOT/remote-loaded.pt.
- ``remote-kill``: like ``remote``, but rank 1 SIGKILLs itself as it starts
  uploading its pack.
- ``ckpt``: a Checkpointer commits step 0 of the FSDP2 model (branch REV) in
  the background while the next step trains; rank 0 writes ROOT/ckpt-ref.pt
  (the full state and this rank's RNG state at step 0).
- ``ckpt-remote``: like ``ckpt`` with no shared repository: rank N's
  Checkpointer path is its own clone ROOT/hostN of remote "origin"; then a
  new run resumes it on the same hosts. Rank 0 writes
  ROOT/ckpt-remote-ref.pt and ROOT/ckpt-remote-resumed.pt.
- ``resume``: a new run resumes branch REV (reshard=True when WORLD differs
  from 2); rank 0 writes ROOT/resumed-WORLD.pt.
- ``ids``: the per-step checkpoint_id pattern, once through DCP's
  FileSystemWriter (ROOT/ids-fs/step_N) and once through mvc (ids under
  the repository ROOT/ids-mvc): two training steps, each saved with a
  BytesIO train state; rank 0 writes ROOT/ids-ref-N.pt (the full state at
  step N). Then ``ids-load`` runs too.
- ``ids-load``: loads step_1 from both into another model at this world
  size (resharding when it is not 2) and tries step_9, never saved; rank 0
  writes ROOT/ids-KIND-WORLD.pt (the full state, the train state's bytes,
  and whether step_9 raised DCP's CheckpointException).
"""

import copy
import io
import json
import os
import signal
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from mvc_hooks import Checkpointer
from ranks import rank_process
from mvc_hooks.dcp import MvcStorageReader, MvcStorageWriter

warnings.simplefilter("ignore")


def build(world: int, seed: int):
    torch.manual_seed(seed)
    # 13 and 5 rows split unevenly over 2 and 4 ranks; the last layer is frozen
    model = torch.nn.Sequential(torch.nn.Linear(6, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5),
                                torch.nn.Linear(5, 3))
    for p in model[3].parameters():
        p.requires_grad_(False)
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
    return model, opt


def train_step(model, opt, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(4, 6, generator=g)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def state_of(model, opt) -> dict:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "plain": torch.arange(10, dtype=torch.int16),
            "meta": {"epoch": 2, "tag": "fsdp", "pair": (1, 2.5)}}


def full_state(model, opt) -> dict:
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": msd, "optim": osd}


def kill_when_writing(root: Path) -> None:
    packs = root / "repo" / ".mvc" / "packs"

    def watch():
        while not any(p.name.endswith(".tmp") for p in packs.iterdir()):
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True).start()


def checkpoint_and_train_on(path, world: int, rank: int, rev: str, out: Path, **kwargs) -> None:
    """A Checkpointer commits step 0 in the background while the next step trains; rank 0
    writes ``out``: the full state and its RNG state at step 0, and the commit's id."""
    model, opt = build(world, seed=0)
    train_step(model, opt, seed=1)
    torch.manual_seed(50 + rank)
    with Checkpointer(path, model=model, optimizer=opt, branch=rev, every_n_steps=1, **kwargs) as ckpt:
        assert ckpt.sharded and ckpt.async_save
        # A collective: every rank takes part. Copied: a full state dict may
        # share tensors with the optimizer (its "step"), which trains on.
        full = copy.deepcopy(full_state(model, opt))
        full["rng"] = torch.get_rng_state()
        ckpt.step(0, loss=1.0)  # returns once the shards are copied; the commit lands later
        # Training goes on while the save runs (its collectives on a group of
        # their own) and moves every trainable weight: the commit must not see it.
        train_step(model, opt, seed=2)
        commit = ckpt.wait()
        if rank == 0:
            full["commit"] = commit.id
            torch.save(full, out)


def resume(path, world: int, rank: int, rev: str, out: Path, reshard: bool, **kwargs) -> None:
    """A new run (other weights) resumes branch ``rev``; rank 0 writes ``out``: its full state and RNG state."""
    model, opt = build(world, seed=9)
    train_step(model, opt, seed=4)
    with Checkpointer(path, model=model, optimizer=opt, branch=rev, every_n_steps=1, **kwargs) as ckpt:
        assert ckpt.resume(reshard=reshard) == 1
        full = full_state(model, opt)
        if rank == 0:
            full["rng"] = torch.get_rng_state()
            torch.save(full, out)


def train_bytes(step: int) -> io.BytesIO:
    """A torchtitan-like train state: the loss history as torch.save bytes in a BytesIO."""
    out = io.BytesIO()
    torch.save([0.5 * n for n in range(step + 1)], out)
    return out


def save_per_step(root: Path, world: int, rank: int) -> None:
    for kind in ("fs", "mvc"):
        base = root / f"ids-{kind}"
        model, opt = build(world, seed=0)
        for step in (1, 2):
            train_step(model, opt, seed=step)
            state = state_of(model, opt)
            state["train"] = train_bytes(step)
            writer = MvcStorageWriter(base, message=f"step {step}", step=step) if kind == "mvc" else None
            dcp.save(state, checkpoint_id=base / f"step_{step}", storage_writer=writer)
            if writer is not None:
                writer.close()
            full = full_state(model, opt)
            if rank == 0 and kind == "fs":
                torch.save(full, root / f"ids-ref-{step}.pt")


def load_per_step(root: Path, world: int, rank: int) -> None:
    from torch.distributed.checkpoint import CheckpointException
    for kind in ("fs", "mvc"):
        base = root / f"ids-{kind}"
        model, opt = build(world, seed=7)
        train_step(model, opt, seed=3)
        state = state_of(model, opt)
        state.update(plain=torch.zeros(10, dtype=torch.int16), meta={}, train=io.BytesIO())
        reader = MvcStorageReader(base) if kind == "mvc" else None
        dcp.load(state, checkpoint_id=base / "step_1", storage_reader=reader)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        full = full_state(model, opt)
        full.update(plain=state["plain"], meta=state["meta"], train=state["train"].getvalue())
        try:
            dcp.load(state_of(model, opt), checkpoint_id=base / "step_9",
                     storage_reader=MvcStorageReader(base) if kind == "mvc" else None)
            full["missing"] = "loaded"
        except CheckpointException:
            full["missing"] = "CheckpointException"
        if rank == 0:
            torch.save(full, root / f"ids-{kind}-{world}.pt")


def main(scenario: str, rank: int, world: int, root: Path, rev: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root / f'rendezvous-{scenario}-{world}'}",
                            rank=rank, world_size=world, timeout=timedelta(seconds=60))
    with rank_process():  # ends the process, its objects still alive: see tests/ranks.py
        repo = root / "repo"
        if scenario in ("save", "kill"):
            model, opt = build(world, seed=0)
            train_step(model, opt, seed=1)
            state = state_of(model, opt)
            if scenario == "kill" and rank == 1:
                kill_when_writing(root)
            for n in (1, 2):  # the second save of the unchanged state must write nothing new
                writer = MvcStorageWriter(repo, branch=rev, message=f"save {n}", step=n, metrics={"loss": 0.5})
                dcp.save(state, storage_writer=writer)
                full = full_state(model, opt)
                if rank == 0:
                    torch.save(full, root / f"ref-{n}.pt")
                    s = writer.last_commit.stats
                    (root / f"commit-{n}.json").write_text(json.dumps(
                        {"id": writer.last_commit.id, "chunks_new": s.chunks_new, "bytes_new": s.bytes_new,
                         "tensors": s.tensors}))
                writer.close()
        elif scenario in ("remote", "remote-kill"):
            model, opt = build(world, seed=0)
            train_step(model, opt, seed=1)
            state = state_of(model, opt)
            if scenario == "remote-kill" and rank == 1:
                from mvc.remote import transfer
                transfer.Uploader._send = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
            for n in (1, 2):  # the second save of the unchanged state must send nothing new
                writer = MvcStorageWriter(root / f"host{rank}", branch=rev, message=f"remote {n}", step=n,
                                          remote="origin")
                dcp.save(state, storage_writer=writer)
                full = full_state(model, opt)
                if rank == 0:
                    torch.save(full, root / f"remote-ref-{n}.pt")
                    s = writer.last_commit.stats
                    (root / f"remote-{n}.json").write_text(json.dumps(
                        {"id": writer.last_commit.id, "chunks_new": s.chunks_new, "tensors": s.tensors}))
                writer.close()
            # Every host loads what rank 0 committed and pushed, fetching it first.
            other, other_opt = build(world, seed=7)
            train_step(other, other_opt, seed=3)
            loaded = state_of(other, other_opt)
            dcp.load(loaded, storage_reader=MvcStorageReader(root / f"host{rank}", rev="origin/" + rev,
                                                             remote="origin"))
            set_state_dict(other, other_opt, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
            back = full_state(other, other_opt)
            if rank == 0:
                torch.save(back, root / "remote-loaded.pt")
        elif scenario == "load":
            model, opt = build(world, seed=7)  # other weights: the load must replace every one
            train_step(model, opt, seed=3)  # the optimizer must have state to load into
            state = state_of(model, opt)
            state["plain"] = torch.zeros(10, dtype=torch.int16)
            state["meta"] = {"epoch": 0, "tag": "", "pair": None}
            dcp.load(state, storage_reader=MvcStorageReader(repo, rev=rev))
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            full = full_state(model, opt)
            if rank == 0:
                full["plain"], full["meta"] = state["plain"], state["meta"]
                torch.save(full, root / f"loaded-{world}.pt")
        elif scenario == "ckpt":
            checkpoint_and_train_on(repo, world, rank, rev, root / "ckpt-ref.pt")
        elif scenario == "ckpt-remote":  # no shared repository: each rank's Checkpointer path is its own clone
            host = root / f"host{rank}"
            checkpoint_and_train_on(host, world, rank, rev, root / "ckpt-remote-ref.pt", remote="origin")
            resume(host, world, rank, rev, root / "ckpt-remote-resumed.pt", reshard=False, remote="origin")
        elif scenario == "resume":
            resume(repo, world, rank, rev, root / f"resumed-{world}.pt", reshard=world != 2)
        elif scenario == "ids":
            save_per_step(root, world, rank)
            load_per_step(root, world, rank)
        elif scenario == "ids-load":
            load_per_step(root, world, rank)
        dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "main")
