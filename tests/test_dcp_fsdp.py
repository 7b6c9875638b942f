"""Real sharded jobs: FSDP2 over a CPU mesh on gloo, every rank its own process (tests/dcp_worker.py).

A state saved by 2 ranks (DTensor model and AdamW state, a plain tensor,
plain values) loads bit for bit at world 1, 2 and 4; a state saved by 4
loads at 2. A second save of the unchanged state writes no chunk. Rank 1
killed with SIGKILL while packs are being written leaves the branch where it
was and fsck clean, and the next save works. Ranks that share no
filesystem save through a real SeaweedFS remote, each from its own clone.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mvc

WORKER = Path(__file__).with_name("dcp_worker.py")


def launch(scenario: str, world: int, root: Path, rev: str = "main", timeout: float = 120) -> list:
    """Run WORLD ranks of the worker; their exit codes (negative: killed by that signal)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, str(WORKER), scenario, str(rank), str(world), str(root), rev],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for rank in range(world)]
    codes = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        codes.append(p.returncode)
        if p.returncode not in (0, -9) and scenario != "kill":
            print(out.decode(errors="replace")[-4000:])
    return codes


def same(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (where, sorted(a), sorted(b))
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b and type(a) is type(b), (where, a, b)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    mvc.Repository.init(root / "repo", chunk_size=64).close()
    assert launch("save", 2, root) == [0, 0]
    return root


def _check_load(root: Path, world: int, ref: str = "ref-2.pt") -> None:
    assert launch("load", world, root) == [0] * world
    want = torch.load(root / ref, weights_only=True)
    got = torch.load(root / f"loaded-{world}.pt", weights_only=True)
    same(want["model"], got["model"], "model")
    same(want["optim"], got["optim"], "optim")
    same(got["plain"], torch.arange(10, dtype=torch.int16), "plain")
    assert got["meta"] == {"epoch": 2, "tag": "fsdp", "pair": (1, 2.5)}


def test_second_save_of_an_unchanged_state_writes_no_chunk(saved):
    first = json.loads((saved / "commit-1.json").read_text())
    second = json.loads((saved / "commit-2.json").read_text())
    assert first["chunks_new"] > 0
    assert second["chunks_new"] == 0 and second["bytes_new"] == 0
    with mvc.Repository.open(saved / "repo") as repo:
        log = list(repo.log("main"))
        assert [c.id for c in log] == [second["id"], first["id"]]
        assert log[0].step == 2 and log[0].metrics == {"loss": 0.5}
        assert repo.fsck().ok


def test_repository_load_gives_full_tensors(saved):
    want = torch.load(saved / "ref-2.pt", weights_only=True)
    with mvc.Repository.open(saved / "repo") as repo:
        state = repo.load("main")
        entries = {e.key: e for e in repo.entries("main")}
    same(want["model"], state["model"], "model")
    assert state["meta"] == {"epoch": 2, "tag": "fsdp", "pair": (1, 2.5)}
    # one key per tensor, whatever its shards: 13 rows were split 7 + 6
    assert entries["model.0.weight"].shape == (13, 6)
    assert "model.0.weight" in entries and not any(k.startswith("model.0.weight.") for k in entries)


@pytest.mark.parametrize("world", [1, 2])
def test_fsdp2_saved_at_2_loads_at(saved, world):
    _check_load(saved, world)


@pytest.mark.slow
def test_fsdp2_saved_at_2_loads_at_4(saved):
    _check_load(saved, 4)


@pytest.mark.slow
def test_fsdp2_saved_at_4_loads_at_2(tmp_path):
    mvc.Repository.init(tmp_path / "repo", chunk_size=64).close()
    assert launch("save", 4, tmp_path) == [0] * 4
    _check_load(tmp_path, 2)


def test_sigkill_of_rank_1_mid_save_leaves_the_branch_and_fsck_clean(tmp_path):
    with mvc.Repository.init(tmp_path / "repo", chunk_size=64) as repo:
        before = repo.commit({"x": torch.ones(3)}, "before")
    codes = launch("kill", 2, tmp_path, timeout=180)
    assert codes[1] == -9 and codes[0] != 0  # rank 0 learns that its peer died and fails
    with mvc.Repository.open(tmp_path / "repo") as repo:
        assert repo.resolve("main") == before.id
        report = repo.fsck()
        assert report.ok, report.damage
        # the next save (here from one process, without FSDP) works
        from mvc_hooks.dcp import MvcStorageWriter
        import torch.distributed.checkpoint as dcp
        writer = MvcStorageWriter(tmp_path / "repo", message="after")
        dcp.save({"w": torch.arange(6.0)}, storage_writer=writer, no_dist=True)
        assert [c.message for c in repo.log("main")] == ["after", "before"]
        assert torch.equal(repo.load("main")["w"], torch.arange(6.0))
        assert repo.fsck().ok


@pytest.mark.slow
def test_checkpointer_saves_sharded_and_resumes_at_2_and_at_1(tmp_path):
    mvc.Repository.init(tmp_path / "repo", chunk_size=64).close()
    assert launch("ckpt", 2, tmp_path, rev="run") == [0, 0]
    want = torch.load(tmp_path / "ckpt-ref.pt", weights_only=True)
    with mvc.Repository.open(tmp_path / "repo") as repo:
        keys = {e.key.split(".")[0] for e in repo.entries("run")}
        assert {"model", "optimizer", "ranks", "progress", "world_size"} <= keys
        assert repo.resolve("run") == want["commit"]
    for world in (2, 1):
        assert launch("resume", world, tmp_path, rev="run") == [0] * world
        got = torch.load(tmp_path / f"resumed-{world}.pt", weights_only=True)
        same(want["model"], got["model"], "model")
        same(want["optim"], got["optim"], "optim")
        if world == 2:  # the same world: rank 0 has its own RNG back
            assert torch.equal(want["rng"], got["rng"])


def _hosts(tmp_path, s3_server, url: str) -> None:
    """A remote with one commit, and one lazy clone of it per rank (one host each: no chunk of their own)."""
    with mvc.Repository.init(tmp_path / "seed", chunk_size=64) as seed:
        seed.remotes.add("origin", url, s3_server.endpoint)
        seed.commit({"w": torch.zeros(3)}, "seed", branch="main")
        seed.remotes.push("origin", ("main",))
    for rank in (0, 1):
        mvc.Repository.clone(url, tmp_path / f"host{rank}", lazy=True, endpoint_url=s3_server.endpoint).close()


def test_ranks_without_a_shared_repository_save_through_the_remote(tmp_path, s3_server, s3_url):
    url = s3_url("shards")
    _hosts(tmp_path, s3_server, url)
    assert launch("remote", 2, tmp_path, rev="run") == [0, 0]
    first, second = (json.loads((tmp_path / f"remote-{n}.json").read_text()) for n in (1, 2))
    assert first["chunks_new"] > 0 and second["chunks_new"] == 0
    with mvc.Repository.open(tmp_path / "host1") as host1:  # rank 1 committed nothing of its own
        assert "run" not in {b.name for b in host1.branches()}
    with mvc.Repository.clone(url, tmp_path / "eval", endpoint_url=s3_server.endpoint) as clone:
        assert clone.resolve("origin/run") == second["id"]
        assert [c.message for c in clone.log("origin/run")][:2] == ["remote 2", "remote 1"]
        assert clone.fsck().ok and clone.remotes.fsck("origin").ok
        got = clone.load("origin/run")
    want = torch.load(tmp_path / "remote-ref-2.pt", weights_only=True)
    same(want["model"], got["model"], "model")
    same(want["optim"]["state"], got["optim"]["state"], "optim.state")
    back = torch.load(tmp_path / "remote-loaded.pt", weights_only=True)  # loaded on both hosts through DCP
    same(want["model"], back["model"], "model")
    same(want["optim"], back["optim"], "optim")


def test_a_checkpointer_on_hosts_sharing_no_repository_saves_and_resumes_through_the_remote(tmp_path, s3_server,
                                                                                          s3_url):
    url = s3_url("ckpt")
    _hosts(tmp_path, s3_server, url)
    assert launch("ckpt-remote", 2, tmp_path, rev="run") == [0, 0]
    want = torch.load(tmp_path / "ckpt-remote-ref.pt", weights_only=True)
    got = torch.load(tmp_path / "ckpt-remote-resumed.pt", weights_only=True)
    same(want["model"], got["model"], "model")
    same(want["optim"], got["optim"], "optim")
    with mvc.Repository.clone(url, tmp_path / "eval", lazy=True, endpoint_url=s3_server.endpoint) as clone:
        assert clone.resolve("origin/run") == want["commit"]
        assert clone.fsck().ok


@pytest.mark.slow
def test_sigkill_of_rank_1_mid_upload_moves_no_branch_and_the_next_save_works(tmp_path, s3_server, s3_url):
    url = s3_url("shards-kill")
    _hosts(tmp_path, s3_server, url)
    codes = launch("remote-kill", 2, tmp_path, rev="run", timeout=180)
    assert codes[1] == -9 and codes[0] != 0  # rank 0 learns that its peer died and fails
    for rank in (0, 1):
        with mvc.Repository.open(tmp_path / f"host{rank}") as host:
            assert "run" not in {b.name for b in host.branches()}
            report = host.fsck()
            assert report.ok, report.damage
    with mvc.Repository.clone(url, tmp_path / "look", lazy=True, endpoint_url=s3_server.endpoint) as look:
        assert "origin/run" not in {b.name for b in look.remotes.branches()}
        assert look.remotes.fsck("origin").ok
    assert launch("remote", 2, tmp_path, rev="run") == [0, 0]  # the next save works
    with mvc.Repository.clone(url, tmp_path / "eval", endpoint_url=s3_server.endpoint) as clone:
        got = clone.load("origin/run")
    same(torch.load(tmp_path / "remote-ref-2.pt", weights_only=True)["model"], got["model"], "model")


def test_a_repository_that_does_not_cache_the_remote_is_refused(tmp_path):
    from mvc_hooks.dcp import MvcStorageWriter
    with mvc.Repository.init(tmp_path / "repo") as repo:
        repo.remotes.add("origin", str(tmp_path / "remote"))
    writer = MvcStorageWriter(tmp_path / "repo", remote="origin")
    with pytest.raises(mvc.BadInput, match="does not cache remote 'origin'"):
        writer.set_up_storage_writer(True)
    writer.close()
