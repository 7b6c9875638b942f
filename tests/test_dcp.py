"""Sharded saves in one process: the DCP plugin (no_dist) and the core calls it uses.

The multi-rank FSDP2 jobs are in test_dcp_fsdp.py; here the core calls
(``repo.shards.write`` / ``repo.shards.commit``) build sharded tensors by hand,
including column shards that need scattering, so every path of load, diff,
export, fsck and gc meets them in milliseconds.
"""

import io
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

import mvc
from mvc_hooks.dcp import MvcStorageReader, MvcStorageWriter

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def model_state():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m(torch.randn(2, 5)).sum().backward()
    opt.step()
    return {"model": m.state_dict(), "optim": opt.state_dict(),
            "extra": {"epoch": 3, "pair": (1, 2.5, "x"), "blob": b"\x00\x01", "none": None}}


def save(repo, state, **kw):
    writer = MvcStorageWriter(repo.root, **kw)
    dcp.save(state, storage_writer=writer, no_dist=True)
    writer.close()
    return writer.last_commit


def test_save_then_load_and_dcp_load_round_trip(repo):
    state = model_state()
    c = save(repo, state, message="one", step=4, metrics={"loss": 1.5})
    assert repo.log().__next__().id == c.id and c.step == 4 and c.metrics == {"loss": 1.5}
    loaded = repo.load(c.id)  # full tensors, in the shape the state had (DCP makes dict keys str)
    for k, v in state["model"].items():
        assert torch.equal(loaded["model"][k], v)
    assert torch.equal(loaded["optim"]["state"]["0"]["exp_avg"], state["optim"]["state"][0]["exp_avg"])
    assert loaded["extra"] == state["extra"]
    target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
              "extra": {"epoch": 0, "pair": None, "blob": None, "none": 1}}
    dcp.load(target, storage_reader=MvcStorageReader(repo.root, rev=c.id), no_dist=True)
    for k, v in state["model"].items():
        assert torch.equal(target["model"][k], v)
    assert target["extra"] == state["extra"] and type(target["extra"]["pair"]) is tuple
    assert "sharded" in (repo.dir / "FORMAT").read_text()


def test_unchanged_save_writes_nothing_and_fsck_is_clean(repo):
    state = model_state()
    first = save(repo, state)
    second = save(repo, state)
    assert first.stats.chunks_new > 0 and second.stats.chunks_new == 0 and second.stats.bytes_new == 0
    assert second.parents == (first.id,)
    assert repo.fsck().ok


def test_a_plain_commit_loads_through_the_reader(repo):
    repo.commit({"w": torch.arange(12.0).reshape(3, 4), "n": 7}, "plain")
    target = {"w": torch.zeros(3, 4), "n": 0}
    dcp.load(target, storage_reader=MvcStorageReader(repo.root), no_dist=True)
    assert torch.equal(target["w"], torch.arange(12.0).reshape(3, 4)) and target["n"] == 7


class Custom:
    """An object only full unpickling could rebuild."""


def test_values_weights_only_loading_refuses_are_refused_and_nothing_is_committed(repo):
    before = repo.commit({"x": torch.ones(2)}, "before")
    with pytest.raises(BaseException, match="weights-only loading refuses"):  # DCP wraps it: CheckpointException
        save(repo, {"w": torch.ones(3), "bad": Custom()})
    assert repo.resolve("main") == before.id


def test_values_that_are_not_plain_are_kept_as_bytes_and_load_weights_only(repo):
    save(repo, {"w": torch.ones(3), "size": torch.Size([2, 3])})  # a tuple subclass: plain would lose it
    target = {"w": torch.zeros(3), "size": None}
    dcp.load(target, storage_reader=MvcStorageReader(repo.root), no_dist=True)
    assert target["size"] == torch.Size([2, 3]) and type(target["size"]) is torch.Size
    raw = repo.load()["size"]  # repo.load gives the stored bytes, as a uint8 tensor
    assert torch.load(io.BytesIO(raw.numpy().tobytes()), weights_only=True) == torch.Size([2, 3])


# -- the core calls, with hand-made shards -----------------------------------------

def shard_commit(repo, full: torch.Tensor, boxes: list, message="sharded", locations_hook=None):
    """Commit ``full`` as pieces ``boxes`` [(offsets, sizes)], each written as its own rank would."""
    start = repo.shards.begin("main")
    pieces, locations = [], {}
    for offsets, sizes in boxes:
        box = full
        for d, (o, z) in enumerate(zip(offsets, sizes)):
            box = box.narrow(d, o, z)
        desc = repo.shards.write([box])  # a strided view: the rank copies it contiguous
        pieces.append((offsets, sizes, desc["tensors"][0]["chunks"]))
        locations.update(desc["locations"])
    if locations_hook:
        locations_hook(locations)
    leaf = mvc.ShardedTensor(mvc.dtypes.name_of(full.dtype), tuple(full.shape), pieces)
    return repo.shards.commit(start, {("w",): leaf, ("step",): 3}, locations, None, message)


ROWS = [((0, 0), (3, 8)), ((3, 0), (5, 8))]
COLUMNS = [((0, 0), (8, 3)), ((0, 3), (8, 5))]
GRID = [((0, 0), (4, 3)), ((0, 3), (4, 5)), ((4, 0), (4, 3)), ((4, 3), (4, 5))]


@pytest.mark.parametrize("boxes", [ROWS, COLUMNS, GRID], ids=["rows", "columns", "grid"])
def test_shards_load_export_and_check_as_one_tensor(repo, tmp_path, boxes):
    full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    c = shard_commit(repo, full, boxes)
    state = repo.load(c.id)
    assert torch.equal(state["w"], full) and state["step"] == 3
    [entry] = [e for e in repo.entries(c.id) if e.kind == "tensor"]
    assert entry.key == "w" and entry.shape == (8, 8)
    obj = repo.tensor_object(entry.tensor_id)
    assert len(obj.shards) == len(boxes) and obj.in_c_order == (boxes is ROWS)
    repo.export(c.id, tmp_path / "w.safetensors")
    assert torch.equal(load_file(str(tmp_path / "w.safetensors"))["w"], full)
    assert repo.fsck().ok


def test_diff_of_sharded_commits_counts_what_changed(repo):
    full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    a = shard_commit(repo, full, COLUMNS)
    changed = full.clone()
    changed[2, 6] = -1.0
    for boxes in (COLUMNS, ROWS, GRID):  # the same cut, and other cuts
        b = shard_commit(repo, changed, boxes)
        [t] = repo.diff(a.id, b.id).tensors
        assert t.key == "w" and t.status == "changed" and t.elements_changed == 1, boxes
        assert t.max_abs_diff == 23.0
    same = shard_commit(repo, full, GRID)
    [t] = repo.diff(a.id, same.id).tensors
    assert t.status == "unchanged"


def test_one_whole_piece_is_a_plain_tensor_object_shared_with_commit(repo):
    full = torch.arange(10.0)
    plain = repo.commit({"w": full, "step": 3}, "plain")
    c = shard_commit(repo, full, [((0,), (10,))])
    assert repo.diff(plain.id, c.id).tensors[0].status == "unchanged"
    assert repo.entries(plain.id)[1].tensor_id == repo.entries(c.id)[1].tensor_id


def test_pieces_that_do_not_tile_the_tensor_are_refused(repo):
    full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    with pytest.raises(mvc.errors.PiecesDoNotTile) as exc:
        shard_commit(repo, full, [((0, 0), (5, 8)), ((4, 0), (4, 8))])  # overlap, and 72 elements
    assert (exc.value.shape, exc.value.field) == ((8, 8), "shards")
    with pytest.raises(mvc.errors.PiecesDoNotTile) as exc:
        shard_commit(repo, full, [((0, 0), (3, 8))])  # rows 3..8 missing
    assert exc.value.shape == (8, 8) and exc.value.field is not None
    assert repo.head().id is None


def test_a_location_no_pack_lists_is_refused(repo):
    full = torch.arange(64, dtype=torch.float32)

    def lie(locations):
        cid = next(iter(locations))
        pack, offset, length = locations[cid]
        locations[cid] = [pack, offset + 1, length]
    with pytest.raises(mvc.errors.BadChunkLocation) as exc:
        shard_commit(repo, full, [((0,), (64,))], locations_hook=lie)
    assert exc.value.problem == "not-listed" and exc.value.id is not None
    assert repo.head().id is None


def test_a_pack_that_is_gone_is_refused_and_nothing_is_committed(repo):
    full = torch.arange(64, dtype=torch.float32)

    def remove(locations):
        for name in {loc[0] for loc in locations.values()}:
            os.unlink(repo.dir / "packs" / f"pack-{name.hex()}.pack")
    with pytest.raises(mvc.errors.BadChunkLocation) as exc:
        shard_commit(repo, full, [((0,), (32,)), ((32,), (32,))], locations_hook=remove)
    assert exc.value.problem == "missing-pack" and exc.value.pack.startswith("pack-")
    assert repo.head().id is None and repo.fsck().ok


def test_gc_leaves_a_young_unindexed_pack_alone(repo):
    full = torch.arange(64, dtype=torch.float32)
    repo.commit({"x": torch.ones(1)}, "base")
    start = repo.shards.begin("main")
    desc = repo.shards.write([full])
    repo.gc()  # the pack is younger than gc's grace period: kept
    leaf = mvc.ShardedTensor("F32", (64,), [((0,), (64,), desc["tensors"][0]["chunks"])])
    c = repo.shards.commit(start, {("w",): leaf}, desc["locations"])
    assert torch.equal(repo.load(c.id)["w"], full) and repo.fsck().ok


def test_a_branch_that_moved_meanwhile_is_a_ref_conflict(repo):
    start = repo.shards.begin("main")
    desc = repo.shards.write([torch.ones(4)])
    repo.commit({"other": torch.zeros(1)}, "landed meanwhile")
    leaf = mvc.ShardedTensor("F32", (4,), [((0,), (4,), desc["tensors"][0]["chunks"])])
    with pytest.raises(mvc.RefConflict):
        repo.shards.commit(start, {("w",): leaf}, desc["locations"])
    assert [c.message for c in repo.log()] == ["landed meanwhile"]


def test_sharded_objects_decode_only_when_they_tile():
    from mvc.objects import TensorObject
    cid = bytes(32)
    ok = TensorObject("F32", (4, 2), 8, (cid,) * 4, (((0, 0), (2, 2)), ((2, 0), (2, 2))))  # 2 chunks a shard
    assert TensorObject.decode(ok.encode()) == ok
    for shards in ((((0, 0), (2, 2)), ((1, 0), (2, 2))),  # overlap
                   (((2, 0), (2, 2)), ((0, 0), (2, 2)))):  # not sorted
        with pytest.raises(mvc.CorruptObject):
            TensorObject.decode(TensorObject("F32", (4, 2), 8, (cid,) * 4, shards).encode(check=False))


# -- async_save and a crash ----------------------------------------------------------

CRASH = textwrap.dedent("""
    import os, signal, sys, threading, time, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed.checkpoint as dcp
    from mvc_hooks.dcp import MvcStorageWriter
    root = sys.argv[1]
    packs = os.path.join(root, ".mvc", "packs")
    def watch():  # die the moment a pack is being written: mid-save, before any commit
        while not any(n.endswith(".tmp") for n in os.listdir(packs)):
            time.sleep(0.0002)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True).start()
    state = {"w%d" % i: torch.randn(256, 1024) for i in range(16)}
    fut = dcp.async_save(state, storage_writer=MvcStorageWriter(root, message="async"), no_dist=True)
    fut.result()
    print("the save finished before the kill", flush=True)
""")


def test_async_save_killed_before_the_commit_leaves_the_previous_commit(tmp_path):
    with mvc.Repository.init(tmp_path, chunk_size=64 << 10) as repo:
        before = repo.commit({"x": torch.ones(3)}, "before")
    proc = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path)], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    with mvc.Repository.open(tmp_path) as repo:
        assert repo.resolve("main") == before.id
        assert repo.fsck().ok
        c = save(repo, {"w": torch.arange(4.0)}, message="after")
        assert c.parents == (before.id,)


@pytest.mark.parametrize("boxes", [ROWS, COLUMNS], ids=["rows", "columns"])
def test_load_into_a_live_tensor_from_a_sharded_commit(repo, boxes):
    full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    a = shard_commit(repo, full, boxes)
    changed = full.clone()
    changed[5, 6] = -7.0
    b = shard_commit(repo, changed, boxes)
    live = {"w": torch.zeros(8, 8)}
    repo.load_into(live, a.id)
    assert torch.equal(live["w"], full)
    repo.load_into(live, b.id)
    assert torch.equal(live["w"], changed)


# -- DCP's own scenarios, run against FileSystemWriter and mvc alike --------------------
# Each runs once with DCP's FileSystemWriter/Reader (folders) and once with
# MvcStorageWriter/Reader over one repository; both runs must give the same results.

from torch.distributed.checkpoint import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: E402
from torch.distributed.checkpoint.stateful import Stateful  # noqa: E402


class Backend:
    """The storage a scenario saves through: DCP's folders ("fs") or one mvc repository ("mvc")."""

    def __init__(self, kind: str, root):
        self.kind, self.root = kind, root

    def writer(self):
        return None if self.kind == "fs" else MvcStorageWriter(self.root)

    def reader(self):
        return None if self.kind == "fs" else MvcStorageReader(self.root)

    def save(self, state, checkpoint_id, **kw):
        writer = self.writer()
        dcp.save(state, checkpoint_id=checkpoint_id, storage_writer=writer, no_dist=True, **kw)
        if writer is not None:
            writer.close()

    def load(self, state, checkpoint_id, **kw):
        reader = self.reader()
        try:
            dcp.load(state, checkpoint_id=checkpoint_id, storage_reader=reader, no_dist=True, **kw)
        finally:
            if reader is not None:
                reader.close()
        return state


@pytest.fixture(params=["fs", "mvc"])
def backend(request, tmp_path):
    return Backend(request.param, tmp_path / "ckpts")


def step_state(step: int) -> dict:
    torch.manual_seed(step)
    return {"model": {"w": torch.randn(6, 4), "b": torch.randn(4)}, "step": step,
            "frozen": torch.arange(32.0)}  # the same at every step: mvc stores it once


def blank() -> dict:
    return {"model": {"w": torch.zeros(6, 4), "b": torch.zeros(4)}, "step": -1, "frozen": torch.zeros(32)}


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b and type(a) is type(b)


def per_step_run(backend) -> dict:
    """The per-step checkpoint_id pattern (torchtitan's): one id per step under one folder."""
    if backend.kind == "mvc":  # the case: the folder is already a repository (an earlier save made it one)
        writer = MvcStorageWriter(backend.root, message="before")
        dcp.save({"model": {"w": torch.ones(6, 4)}}, storage_writer=writer, no_dist=True)
        writer.close()
    for step in (100, 200, 300):
        backend.save(step_state(step), backend.root / f"step_{step}")
    got = {step: backend.load(blank(), backend.root / f"step_{step}") for step in (200, 100, 300)}
    with pytest.raises(CheckpointException):
        backend.load(blank(), backend.root / "step_999")  # never saved
    return got


def test_per_step_checkpoint_ids_give_what_filesystem_writer_gives(tmp_path):
    runs = {kind: per_step_run(Backend(kind, tmp_path / kind)) for kind in ("fs", "mvc")}
    assert same(runs["fs"], runs["mvc"])
    for step, loaded in runs["mvc"].items():  # each id its own checkpoint, an older one too
        assert same(loaded, step_state(step)), step
    with mvc.Repository.open(tmp_path / "mvc") as repo:
        tags = {t.name: t.id for t in repo.tags()}
        assert set(tags) == {"dcp/step_100", "dcp/step_200", "dcp/step_300"}
        log = list(repo.log("main"))  # one branch, one commit a save: history, diff and bisect work
        assert [c.id for c in log[:3]] == [tags["dcp/step_300"], tags["dcp/step_200"], tags["dcp/step_100"]]
        frozen = [e.tensor_id for c in log[:3] for e in repo.entries(c.id) if e.key == "frozen"]
        assert len(set(frozen)) == 1  # the unchanged tensor is one stored object


def test_an_id_saved_again_names_the_newest_save_and_the_old_one_stays_in_history(backend):
    backend.save(step_state(1), backend.root / "latest")
    backend.save(step_state(2), backend.root / "latest")
    assert same(backend.load(blank(), backend.root / "latest"), step_state(2))
    if backend.kind == "mvc":
        with mvc.Repository.open(backend.root) as repo:
            older = repo.load("dcp/latest~1")
            assert torch.equal(older["model"]["w"], step_state(1)["model"]["w"])


def test_checkpoint_ids_are_validated_for_what_the_plugin_can_do(tmp_path):
    root = tmp_path / "ckpts"
    assert MvcStorageWriter.validate_checkpoint_id(root / "step_1")  # a folder it can create a repository in
    assert not MvcStorageReader.validate_checkpoint_id(root / "step_1")  # nothing to load there
    assert not MvcStorageWriter.validate_checkpoint_id("s3://bucket/step_1")
    writer = MvcStorageWriter(root)
    dcp.save(step_state(1), checkpoint_id=root / "step_1", storage_writer=writer, no_dist=True)
    writer.close()
    assert (root / ".mvc").is_dir() and not (root / "step_1").exists()  # per-step ids share the repository
    assert MvcStorageReader.validate_checkpoint_id(root / "step_1")
    assert MvcStorageReader.validate_checkpoint_id(root)  # HEAD is on main, which has the commit
    assert not MvcStorageReader.validate_checkpoint_id(root / "step_2")
    assert MvcStorageWriter.validate_checkpoint_id(root / "step_2")
    assert not MvcStorageWriter.validate_checkpoint_id(root / "bad id")  # no tag can be named so
    reader = MvcStorageReader(root)
    reader.reset(root / "step_2")
    with pytest.raises(mvc.errors.CheckpointNotFound) as caught:
        reader.read_metadata()
    assert caught.value.checkpoint_id == str(root / "step_2") and caught.value.ref == "dcp/step_2"
    assert isinstance(caught.value, FileNotFoundError)
    reader.close()
    with pytest.raises(CheckpointException):  # an id and a rev that disagree: refused, not guessed
        dcp.load(blank(), checkpoint_id=root / "step_1", storage_reader=MvcStorageReader(root, rev="main"),
                 no_dist=True)


def test_a_protected_id_is_refused_before_anything_is_written(tmp_path):
    root = tmp_path / "ckpts"
    writer = MvcStorageWriter(root)
    dcp.save(step_state(1), checkpoint_id=root / "release", storage_writer=writer, no_dist=True)
    with mvc.Repository.open(root) as repo:
        repo.set_protected("dcp/release", kind="tag")
        tip = repo.resolve("main")
    with pytest.raises(CheckpointException):
        dcp.save(step_state(2), checkpoint_id=root / "release", storage_writer=writer, no_dist=True)
    writer.close()
    with mvc.Repository.open(root) as repo:
        assert repo.resolve("main") == tip == repo.resolve("dcp/release")


def test_a_reader_with_its_default_rev_loads_what_a_writer_on_another_branch_saved(tmp_path):
    writer = MvcStorageWriter(tmp_path / "ckpts", branch="run-7")
    dcp.save(step_state(7), storage_writer=writer, no_dist=True)
    writer.close()
    got = blank()
    dcp.load(got, storage_reader=MvcStorageReader(tmp_path / "ckpts"), no_dist=True)
    assert same(got, step_state(7))
    with mvc.Repository.open(tmp_path / "ckpts") as repo:
        assert repo.head().branch == "run-7"  # the first save put HEAD on its branch, as Git's first commit


def test_a_reader_refuses_to_guess_among_branches(tmp_path):
    with mvc.Repository.init(tmp_path) as repo:
        repo.commit({"w": torch.ones(2)}, "a", branch="run-1")
        repo.commit({"w": torch.ones(2)}, "b", branch="run-2")
        assert repo.head() == mvc.Head("main", None)
    reader = MvcStorageReader(tmp_path)
    with pytest.raises(mvc.errors.CheckpointNotFound, match="run-1, run-2"):
        reader.read_metadata()
    reader.close()


class TrainState(Stateful):
    """torchtitan's TrainState: its loss history kept as torch.save bytes in a BytesIO."""

    def __init__(self, step=0, losses=()):
        self.step, self.losses = step, list(losses)

    def state_dict(self):
        buffer = io.BytesIO()
        torch.save(self.losses, buffer)  # left at its end, as torchtitan leaves it
        return {"step": torch.tensor(self.step, dtype=torch.int32), "losses": buffer, "raw": b"\x00\xffbytes"}

    def load_state_dict(self, state_dict):
        self.step = int(state_dict["step"])
        state_dict["losses"].seek(0)
        self.losses = torch.load(state_dict["losses"], weights_only=True)
        self.raw = state_dict["raw"]


def test_a_bytesio_train_state_round_trips_as_bytes(backend):
    saved = TrainState(12, [2.5, 2.25, 2.0])
    backend.save({"train_state": saved, "model": {"w": torch.arange(6.0)}}, backend.root / "step_12")
    loaded = TrainState()
    state = backend.load({"train_state": loaded, "model": {"w": torch.zeros(6)}}, backend.root / "step_12")
    assert loaded.step == 12 and loaded.losses == [2.5, 2.25, 2.0] and loaded.raw == b"\x00\xffbytes"
    assert torch.equal(state["model"]["w"], torch.arange(6.0))
    if backend.kind == "mvc":  # stored as the bytes it holds, not as a pickle
        with mvc.Repository.open(backend.root) as repo:
            view = repo.shards.view("dcp/step_12")
            assert view["dcp"]["items"]["train_state.losses"]["kind"] == "bytes-io"
            stored = repo.load("dcp/step_12")["train_state"]["losses"]
            assert stored.numpy().tobytes() == saved.state_dict()["losses"].getvalue()


def test_a_bytesio_value_loads_as_a_bytesio(backend):
    backend.save({"blob": io.BytesIO(b"\x01\x02\x03"), "empty": io.BytesIO()}, backend.root / "b")
    got = backend.load({"blob": io.BytesIO(), "empty": io.BytesIO(b"x")}, backend.root / "b")
    assert type(got["blob"]) is io.BytesIO and got["blob"].getvalue() == b"\x01\x02\x03"
    assert got["empty"].getvalue() == b""


def test_partial_loads_match(backend):
    backend.save(step_state(5), backend.root / "s")
    only = {"model": {"w": torch.zeros(6, 4)}}  # a subset of the saved keys
    backend.load(only, backend.root / "s")
    assert torch.equal(only["model"]["w"], step_state(5)["model"]["w"])
    extra = {**blank(), "new": torch.zeros(2)}  # a key the checkpoint lacks: refused ...
    with pytest.raises(CheckpointException):
        backend.load(extra, backend.root / "s")
    extra = {**blank(), "new": torch.zeros(2)}  # ... unless the planner allows partial loads
    backend.load(extra, backend.root / "s", planner=DefaultLoadPlanner(allow_partial_load=True))
    assert same({k: v for k, v in extra.items() if k != "new"}, step_state(5))
    assert torch.equal(extra["new"], torch.zeros(2))


def test_async_save_with_a_checkpoint_id_matches(backend):
    state = step_state(8)
    writer = backend.writer()
    future = dcp.async_save(state, checkpoint_id=backend.root / "step_8", storage_writer=writer, no_dist=True)
    future.result()
    if writer is not None:
        writer.close()
    assert same(backend.load(blank(), backend.root / "step_8"), state)


@pytest.mark.slow
def test_per_step_ids_on_two_ranks_and_resharded_to_one_match_filesystem_writer(tmp_path):
    """2 gloo ranks of FSDP2 save per-step ids through both storages; step 1 loads back at
    2 ranks and at 1 (resharding) with the same results, and step 9 fails in both."""
    from test_dcp_fsdp import launch, same as equal
    assert launch("ids", 2, tmp_path) == [0, 0]
    assert launch("ids-load", 1, tmp_path) == [0]
    want = torch.load(tmp_path / "ids-ref-1.pt", weights_only=True)
    for world in (2, 1):
        fs = torch.load(tmp_path / f"ids-fs-{world}.pt", weights_only=True)
        ours = torch.load(tmp_path / f"ids-mvc-{world}.pt", weights_only=True)
        equal(fs, ours, f"world {world}")
        equal(want["model"], ours["model"], "model")
        equal(want["optim"], ours["optim"], "optim")
        assert ours["missing"] == "CheckpointException"
        assert torch.load(io.BytesIO(ours["train"]), weights_only=True) == [0.0, 0.5]
    with mvc.Repository.open(tmp_path / "ids-mvc") as repo:
        assert {t.name for t in repo.tags()} == {"dcp/step_1", "dcp/step_2"}
        assert [c.step for c in repo.log()] == [2, 1]


# -- FileSystemWriter's keywords (issue 39, item 13) ------------------------------------------------

def test_overwrite_false_refuses_a_second_save_to_the_same_id_as_filesystem_writer_does(tmp_path):
    """MvcStorageWriter(path, overwrite=False) was a TypeError; PyTorch's own test_overwrite expects
    a second save to the same id to be refused (CheckpointException), and overwrite=True to replace it."""
    t1, t2 = torch.randn(10), torch.randn(10)
    # the writer's path alone (PyTorch's test), and an id inside the repository (a tag)
    for path, where in ((tmp_path / "root", None), (tmp_path / "ids", tmp_path / "ids" / "step_1")):
        dcp.save({"random": t1}, checkpoint_id=where, storage_writer=MvcStorageWriter(path, overwrite=False),
                 no_dist=True)
        dcp.save({"random": t2}, checkpoint_id=where, storage_writer=MvcStorageWriter(path, overwrite=True),
                 no_dist=True)
        got = {"random": torch.zeros(10)}
        dcp.load(got, checkpoint_id=where, storage_reader=MvcStorageReader(path), no_dist=True)
        assert torch.equal(got["random"], t2)
        with mvc.Repository.open(path) as repo:
            tip = repo.resolve("main")
        with pytest.raises(CheckpointException, match="Checkpoint already exists"):
            dcp.save({"random": t1}, checkpoint_id=where, storage_writer=MvcStorageWriter(path, overwrite=False),
                     no_dist=True)
        with mvc.Repository.open(path) as repo:
            assert repo.resolve("main") == tip  # refused before anything was committed
    writer = MvcStorageWriter(tmp_path / "root", overwrite=False)
    with pytest.raises(mvc.errors.CheckpointExists) as caught:  # the error itself, as DCP's ranks raise it
        writer.set_up_storage_writer(True)
    writer.close()
    with mvc.Repository.open(tmp_path / "root") as repo:
        assert caught.value.commit == repo.resolve("main")
    assert caught.value.ref == "main" and isinstance(caught.value, FileExistsError)


def test_filesystem_writer_keywords_are_taken_and_a_bad_one_is_one_clean_error(tmp_path):
    import inspect
    from torch.distributed.checkpoint import FileSystemWriter
    theirs = set(inspect.signature(FileSystemWriter.__init__).parameters) - {"self", "path", "args", "kwargs"}
    ours = set(inspect.signature(MvcStorageWriter.__init__).parameters)
    assert theirs <= ours
    writer = MvcStorageWriter(tmp_path, sync_files=True, single_file_per_rank=False, thread_count=4,
                              per_thread_copy_ahead=0, cache_staged_state_dict=False)
    dcp.save({"w": torch.ones(3)}, storage_writer=writer, no_dist=True)
    writer.close()
    assert writer.last_commit is not None
    with pytest.raises(mvc.BadInput, match="_extensions"):
        MvcStorageWriter(tmp_path, _extensions=[object()])
    with pytest.raises(mvc.BadInput, match="keywords only"):  # FileSystemWriter(path, single_file_per_rank)
        MvcStorageWriter(tmp_path, True)
    # a keyword neither takes: a TypeError, and no "Exception ignored in __del__" on stderr
    code = ("from mvc_hooks.dcp import MvcStorageWriter\n"
            "try:\n    MvcStorageWriter('.', overwrit=False)\nexcept TypeError as e:\n    print('TypeError', e)\n"
            "import gc; gc.collect()\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "TypeError" in r.stdout and "overwrit" in r.stdout
    assert "Exception ignored" not in r.stderr and "AttributeError" not in r.stderr, r.stderr


def test_a_sharded_save_registers_its_packs_and_puts_no_index_entry_per_chunk(repo):
    """The ranks' packs get pack indexes as a commit's own pack does (docs/format.md 5.9): a save
    of millions of chunks per rank must not put an LMDB entry per chunk."""
    state = model_state()
    c = save(repo, state)
    with repo.index.read() as txn:
        table = list(txn._txn.cursor(db=txn._dbs["chunks"]))
        registered = {name for _, name, _ in txn.registered_packs()}
        assert table == [] and registered
        assert {loc.pack for _, loc in txn.chunks()} <= registered
    assert {p.name for p in (repo.dir / "packs").glob("*.pidx")} == {f"pack-{n.hex()}.pidx" for n in registered}
    loaded = repo.load(c.id)
    for k, v in state["model"].items():
        assert torch.equal(loaded["model"][k], v)
    assert repo.fsck().ok
    assert save(repo, state).stats.chunks_new == 0  # deduplicated against the registered packs
