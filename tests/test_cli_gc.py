"""fsck and gc agree about garbage: each says what gc reclaims, what it keeps and why, and what reclaims the rest."""

import json
import os

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc.cli import main


def cli(repo, *args, code=0):
    out = CliRunner().invoke(main, ["-C", str(repo.root), *args])
    assert out.exit_code == code, (out.output, out.stderr)
    return out


@pytest.fixture
def mostly_live(repo):
    """One pack holding a big frozen tensor and a small one that later commits replace."""
    frozen = torch.randn(256)  # 1 KiB: 16 chunks
    repo.commit({"frozen": frozen, "head": torch.randn(16)}, "c0")
    for i in range(1, 3):
        repo.commit({"frozen": frozen, "head": torch.randn(16)}, f"c{i}")
    repo.gc(keep_last=1)  # c0's head is garbage inside a pack that stays mostly live
    return repo


def test_fsck_says_gc_keeps_a_mostly_live_pack_and_repack_reclaims_it(mostly_live):
    out = cli(mostly_live, "fsck").stdout
    assert "gc keeps it:" in out and "garbage; gc rewrites a pack once over 25%" in out
    assert "'mvc gc' reclaims 0 B" in out and "'mvc gc --repack' rewrites" in out
    gc_out = cli(mostly_live, "gc").stdout
    assert "kept pack-" in gc_out and "'mvc gc --repack'" in gc_out and "0 B reclaimed" in gc_out
    repacked = json.loads(cli(mostly_live, "gc", "--repack", "--json").stdout)
    assert repacked["packs_rewritten"] == 1 and repacked["left"] == []
    after = json.loads(cli(mostly_live, "fsck", "--json").stdout)
    assert after["ok"] and after["unreferenced"] == [] and after["gc_keeps"] == []
    state = mostly_live.load()
    assert state["frozen"].shape == (256,)


def test_a_fresh_tmp_pack_is_kept_for_the_grace_period_and_grace_0_removes_it(repo):
    repo.commit({"w": torch.randn(16)}, "c0")
    tmp = repo.dir / "packs" / ("pack-" + "ab" * 16 + ".pack.tmp")
    tmp.write_bytes(os.urandom(4096))  # what a commit killed mid-write leaves
    out = cli(repo, "fsck").stdout
    assert "tmp-pack" in out and "gc keeps it: younger than the 60 s grace period" in out
    assert "'mvc gc --grace 0'" in out
    kept = cli(repo, "gc").stdout
    assert "kept " + tmp.name in kept and "younger than the 60 s grace period" in kept and tmp.exists()
    assert "'mvc gc --grace 0' also removes" in kept
    report = json.loads(cli(repo, "gc", "--grace", "0", "--json").stdout)
    assert report["tmp_removed"] == 1 and not tmp.exists() and report["left"] == []
    assert json.loads(cli(repo, "fsck", "--json").stdout)["unreferenced"] == []


def test_old_garbage_is_reclaimed_by_a_plain_gc_and_fsck_says_so(repo):
    repo.commit({"w": torch.randn(16)}, "c0")
    repo.create_branch("tmp")
    repo.checkout("tmp")
    repo.commit({"x": torch.randn(64)}, "only on tmp")
    repo.checkout("main")
    repo.delete_branch("tmp", force=True)
    # the reflog of HEAD still reaches it; gc keeps reflog'd commits, so fsck reports nothing unreferenced
    out = cli(repo, "fsck").stdout
    assert "gc keeps it" not in out
    tmp = repo.dir / "packs" / ("pack-" + "cd" * 16 + ".pack.tmp")
    tmp.write_bytes(b"x" * 100)
    os.utime(tmp, (1, 1))  # written long ago: no writer is behind it
    out = cli(repo, "fsck").stdout
    assert "gc reclaims it" in out and "gc keeps it" not in out and "--grace 0" not in out
    assert json.loads(cli(repo, "gc", "--json").stdout)["tmp_removed"] == 1
    with mvc.Repository.open(repo.root) as again:
        assert again.fsck().unreferenced == ()
