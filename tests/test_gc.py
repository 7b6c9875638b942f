"""gc and retention: what is kept loads bit-exact, what is pruned is gone from disk."""

import json
import os
import time

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc.cli import main
from mvc.errors import MetricNotRecorded, WalkDamaged
from mvc.store.packs import PackWriter

from damage import flip_bit, pack_files
from conftest import run_cli as cli


def state(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    return {"model": {"w": torch.randn(64, generator=g), "frozen": torch.ones(16)},
            "opt": {"step": i, "lr": 0.1}}


def same(a: dict, b: dict) -> bool:
    return (torch.equal(a["model"]["w"], b["model"]["w"]) and a["model"]["w"].dtype == b["model"]["w"].dtype
            and torch.equal(a["model"]["frozen"], b["model"]["frozen"]) and a["opt"] == b["opt"])


def train(repo, n: int, losses=None, branch=None, seed: int = 0) -> list:
    return [repo.commit(state(seed + i), f"step {i}", step=seed + i, branch=branch,
                        metrics={"loss": losses[i]} if losses else {}) for i in range(n)]


def assert_clean(repo):
    report = repo.fsck()
    assert report.ok, report.damage
    return report


def test_keep_last_prunes_old_data_and_keeps_history(repo):
    commits = train(repo, 8)
    before = repo.status().pack_bytes
    report = repo.gc(keep_last=3)
    assert set(report.pruned) == {c.id for c in commits[:5]}
    assert report.trees_removed == report.tensors_removed == 5 and report.chunks_removed == 5 * 4
    # commit 0's pack also holds "frozen", which every commit shares: it is rewritten, not deleted
    assert report.commits_removed == 0 and report.packs_deleted == 4
    assert report.packs_rewritten == 1 and report.records_moved == 1
    assert repo.status().pack_bytes < before and report.pack_bytes_after < report.pack_bytes_before
    log = list(repo.log())
    assert [c.id for c in log] == [c.id for c in reversed(commits)]  # ids and history unchanged
    assert [c.pruned for c in log] == [False] * 3 + [True] * 5
    for c in commits[5:]:
        assert same(repo.load(c.id), state(c.step))
    with pytest.raises(mvc.CommitPruned) as err:
        repo.load(commits[0].id)
    assert err.value.id == commits[0].id and err.value.policy == "keep-last 3 on every branch"
    assert repo.get_commit(commits[0].id).pruned
    assert assert_clean(repo).unreferenced == ()
    assert repo.gc(keep_last=3).pruned == ()  # nothing more to do


def test_best_checkpoint_survives_rotation(repo):
    losses = [5.0, 3.0, 0.5, 2.0, 4.0, float("nan"), 1.5, 3.5, 2.5, 6.0]
    for i, loss in enumerate(losses):  # rotate after every save, as a training job would
        repo.commit(state(i), f"step {i}", step=i, metrics={"loss": loss, "acc": 1 - loss / 10})
        repo.gc(keep_last=2, keep_best="loss", mode="min", top=1)
    kept = [c.step for c in repo.log() if not c.pruned]
    assert kept == [9, 8, 2]
    best = next(c for c in repo.log() if c.step == 2)
    assert same(repo.load(best.id), state(2))
    repo.gc(keep_last=1, keep_best="acc", mode="max", top=1)  # acc is best where loss is lowest
    assert [c.step for c in repo.log() if not c.pruned] == [9, 2]
    with pytest.raises(MetricNotRecorded) as err:
        repo.gc(keep_last=1, keep_best="lsos")  # a typo must not prune the best checkpoint
    assert (err.value.metric, err.value.recorded, err.value.branches) == ("lsos", ("acc", "loss"), ("main",))
    assert [c.step for c in repo.log() if not c.pruned] == [9, 2]
    assert_clean(repo)


def test_never_prunes_tips_tags_head_or_other_histories(repo):
    commits = train(repo, 6)
    repo.create_tag("v1", commits[1].id)
    repo.create_tag("release", commits[2].id, protect=True)
    repo.create_branch("exp", commits[3].id)
    report = repo.gc(keep_last=1, branch="main")
    # exp's history (0-3) is outside --branch main; tags pin theirs
    assert set(report.pruned) == {commits[4].id}
    repo.checkout(commits[4].id)
    repo.checkout("main")
    report = repo.gc(keep_last=1)
    assert set(report.pruned) == {commits[0].id}  # 1, 2: tagged; 3: tip of exp; 5: tip of main
    for c in commits[1:4] + commits[5:]:
        assert same(repo.load(c.id), state(c.step))
    assert_clean(repo)


def test_protected_branch_history_needs_force(repo):
    commits = train(repo, 4)
    repo.set_protected("main")
    with pytest.raises(mvc.ProtectedRef) as err:
        repo.gc(keep_last=1, branch="main")
    assert (err.value.ref, err.value.action) == ("heads/main", "prune")
    report = repo.gc(keep_last=1)
    assert report.pruned == () and report.skipped_branches == ("main",)
    report = repo.gc(keep_last=1, force=True)
    assert set(report.pruned) == {c.id for c in commits[:3]}
    assert repo.branches()[0].protected and repo.resolve("main") == commits[-1].id
    assert_clean(repo)


def test_retention_expires_reflog_entries_of_pruned_commits(repo):
    commits = train(repo, 5)
    repo.gc(keep_last=2)
    with repo.index.read() as txn:
        news = [e["new"] for _, _, e in txn.reflog("heads/main")]
    assert [n.hex() for n in news] == [c.id for c in commits[3:]]


def test_unreachable_objects_are_removed_once_no_reflog_entry_names_them(repo):
    train(repo, 2)
    side = train(repo, 3, branch="side", seed=100)
    repo.create_branch("keep", side[-1].id)
    repo.delete_branch("keep", force=True)
    assert repo.gc(grace=0).commits_removed == 0  # side's own reflog still remembers side
    repo.delete_branch("side", force=True)
    assert repo.gc(grace=0).commits_removed == 0  # a deleted branch's reflog keeps it (30 days)...
    repo.reflog.expire("keep")
    repo.reflog.expire("side")
    report = repo.gc(grace=0)  # ...until its reflog is expired
    assert report.commits_removed == 3 and report.trees_removed == 3 and report.packs_deleted == 3
    assert report.tensors_removed == 3  # "frozen" is shared with main, so only side's "w"s go
    with pytest.raises(mvc.UnknownRevision):
        repo.resolve(side[0].id)
    assert [c.step for c in repo.log()] == [1, 0]
    assert same(repo.load("main"), state(1))
    assert_clean(repo)


def test_mostly_garbage_pack_is_rewritten(repo):
    big = torch.arange(2000, dtype=torch.float32)
    small = torch.arange(20, dtype=torch.float32)
    first = repo.commit({"big": big, "small": small}, "both in one pack")
    old_pack = {p.name for p in pack_files(repo)}
    repo.commit({"big": big + 1, "small": small}, "new big, same small")
    report = repo.gc(keep_last=1)
    assert report.pruned == (first.id,)
    assert report.packs_rewritten == 1 and report.records_moved == 2  # small's two chunks
    assert not old_pack & {p.name for p in pack_files(repo)}
    loaded = repo.load("main")
    assert torch.equal(loaded["big"], big + 1) and torch.equal(loaded["small"], small)
    assert assert_clean(repo).unreferenced == ()


def test_mostly_live_pack_is_kept_as_it_is(repo):
    big = torch.arange(2000, dtype=torch.float32)
    repo.commit({"big": big, "small": torch.zeros(20)}, "both in one pack")
    packs = {p.name for p in pack_files(repo)}
    repo.commit({"big": big, "small": torch.ones(20)}, "same big, new small")
    report = repo.gc(keep_last=1)
    assert report.packs_rewritten == 0 and packs <= {p.name for p in pack_files(repo)}
    assert [u.records for u in assert_clean(repo).unreferenced] == [2]  # small's old chunks: harmless


def test_pack_with_a_corrupt_live_record_is_left_alone(repo):
    small = torch.arange(20, dtype=torch.float32)
    repo.commit({"big": torch.arange(2000.0), "small": small}, "one")
    repo.commit({"big": torch.arange(2000.0) + 1, "small": small}, "two")
    with repo.index.read() as txn:
        loc = txn.chunk(repo.tensor_object(repo.entries()[1].tensor_id).chunks[0])
    path = repo.dir / "packs" / f"pack-{loc.pack.hex()}.pack"
    flip_bit(path, loc.offset)
    report = repo.gc(keep_last=1)
    assert report.packs_rewritten == 0 and path.exists()
    assert any("not rewritten" in n and "corrupt" in n for n in report.notes)
    assert not repo.fsck().ok  # the damage is still there for fsck to name


def test_stale_tmp_and_orphan_packs_go_fresh_ones_stay(repo):
    train(repo, 1)
    packs = repo.dir / "packs"
    stale_tmp = PackWriter(packs)
    stale_tmp.add(b"\1" * 32, b"crashed writer")
    orphan = PackWriter(packs)
    orphan.add(b"\2" * 32, b"sealed, never indexed")
    orphan_path = orphan.seal()
    fresh_tmp = PackWriter(packs)  # a writer that is still running
    fresh_tmp.add(b"\3" * 32, b"in flight")
    hour_ago = time.time() - 3600
    for path in (stale_tmp.tmp_path, orphan_path):
        os.utime(path, (hour_ago, hour_ago))
    report = repo.gc()
    assert report.tmp_removed == 1 and report.packs_deleted == 1
    assert not stale_tmp.tmp_path.exists() and not orphan_path.exists() and fresh_tmp.tmp_path.exists()
    fresh_tmp.abort()
    assert same(repo.load("main"), state(0))


def test_gc_refuses_to_delete_anything_when_live_data_is_missing(repo):
    train(repo, 3)
    tree = bytes.fromhex(repo.get_commit("main").tree)
    with repo.index.write() as txn:
        txn.delete("trees", tree)
    before = repo.status()
    with pytest.raises(WalkDamaged) as err:
        repo.gc(keep_last=1)
    assert (err.value.kind, err.value.id) == ("missing-tree", tree.hex())
    assert repo.status() == before and not any(c.pruned for c in repo.log())


def test_dry_run_changes_nothing_and_predicts_the_run(repo):
    train(repo, 6)
    files = sorted(p.name for p in pack_files(repo))
    dry = repo.gc(keep_last=2, dry_run=True)
    assert dry.dry_run and len(dry.pruned) == 4
    assert sorted(p.name for p in pack_files(repo)) == files and not any(c.pruned for c in repo.log())
    real = repo.gc(keep_last=2)
    keys = ("pruned", "reflog_expired", "commits_removed", "trees_removed", "tensors_removed",
            "chunks_removed", "packs_deleted", "packs_rewritten", "records_moved")
    assert {k: getattr(dry, k) for k in keys} == {k: getattr(real, k) for k in keys}


def test_bad_policies(repo):
    train(repo, 1)
    with pytest.raises(mvc.BadInput):
        repo.gc(keep_last=0)
    with pytest.raises(mvc.BadInput):
        repo.gc(keep_best="loss", mode="median")
    with pytest.raises(mvc.BadInput):
        repo.gc(branch="main")
    with pytest.raises(mvc.UnknownRevision):
        repo.gc(keep_last=1, branch="nope")




def test_cli_gc(repo):
    train(repo, 5, losses=[3.0, 1.0, 2.0, 4.0, 5.0])
    dry = cli(repo, "gc", "--keep-last", "1", "--keep-best", "loss", "--dry-run")
    assert dry.exit_code == 0 and "would prune 3 commits" in dry.output and "on disk:" in dry.output
    result = cli(repo, "gc", "--keep-last", "1", "--keep-best", "loss", "--json")
    out = json.loads(result.output)
    assert result.exit_code == 0 and len(out["pruned"]) == 3 and out["dry_run"] is False
    assert out["bytes_reclaimed"] == out["bytes_before"] - out["bytes_after"]
    assert "on disk:" in cli(repo, "gc").output
    repo.set_protected("main")
    refused = cli(repo, "gc", "--keep-last", "1", "--branch", "main")
    assert refused.exit_code == 1 and refused.output.startswith("mvc: error: branch 'main' is protected")
    assert cli(repo, "gc", "--keep-last", "0").exit_code == 2
    assert cli(repo, "gc", "--mode", "median", "--keep-best", "loss").exit_code == 2


def test_keep_best_refuses_a_branch_that_never_records_the_metric(repo):
    repo.commit(state(0), "root", step=0)
    for i in range(1, 4):
        repo.commit(state(i), f"main {i}", step=i, metrics={"loss": float(i)})
    repo.create_branch("exp", "HEAD~3")
    for i in range(4, 7):
        repo.commit(state(i), f"exp {i}", step=i, metrics={"acc": 0.5}, branch="exp")
    with pytest.raises(MetricNotRecorded) as err:
        repo.gc(keep_best="loss", top=1)
    assert err.value.branches == ("exp",) and err.value.recorded == ("acc",)
    assert not any(c.pruned for b in ("main", "exp") for c in repo.log(b))
    repo.gc(keep_best="loss", top=1, branch="main")  # naming the branch that records it works
    # newest first: the tip stays, main 2 goes, main 1 (best loss) stays, root is exp's history too
    assert [c.pruned for c in repo.log("main")] == [False, True, False, False]
    assert not any(c.pruned for c in repo.log("exp"))
