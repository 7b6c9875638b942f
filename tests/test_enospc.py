"""A full disk mid-commit (and mid-gc): a clear error, and the repository as it was."""

import errno
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc.cli import main
from mvc import commits
from mvc.store import packs

from faults import on_small_tmpfs

from faults import failing, short_writes


def state(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    return {"w": torch.randn(200, generator=g), "b": torch.arange(30, dtype=torch.int16) * i, "step": i}


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in ("w", "b")) and a["step"] == b["step"]


@pytest.fixture
def one(repo):
    first = repo.commit(state(0), "before the disk filled up")
    return repo, first


def assert_as_before(repo, first):
    assert repo.resolve("main") == first.id and [c.id for c in repo.log()] == [first.id]
    assert not list((repo.dir / "packs").glob("*.tmp"))
    report = repo.fsck()
    assert report.ok, report.damage
    assert same(repo.load("main"), state(0))
    again = repo.commit(state(1), "space was freed")  # and the next commit works
    assert same(repo.load(again.id), state(1))
    return report


@pytest.mark.parametrize("after", [0, 1, 5], ids=["pack-header", "first-record", "mid-pack"])
def test_writes_failing(one, after, monkeypatch):
    repo, first = one
    monkeypatch.setattr(packs, "BUFFER_BYTES", 1)  # a write per record: the 6th lands mid-pack
    monkeypatch.setattr(commits, "HASH_BYTES", 1)  # (records are added a segment of a tensor at a time)
    with failing(os, "writev", after=after), pytest.raises(OSError) as err:
        repo.commit(state(1), "disk full")
    assert err.value.errno == errno.ENOSPC
    assert "No space left on device while writing a pack" in str(err.value)
    assert "nothing was committed" in str(err.value)
    assert assert_as_before(repo, first).unreferenced == ()


def test_short_write_then_full(one):
    repo, first = one
    with short_writes(), failing(os, "write"), pytest.raises(OSError) as err:
        repo.commit(state(1), "disk full")
    assert err.value.errno == errno.ENOSPC
    assert assert_as_before(repo, first).unreferenced == ()


def test_fsync_of_the_pack_failing(one):
    repo, first = one
    with failing(os, "fsync"), pytest.raises(OSError, match="nothing was committed"):
        repo.commit(state(1), "fsync fails")
    assert assert_as_before(repo, first).unreferenced == ()


def test_fsync_of_the_folder_failing_after_the_pack_is_in_place(one):
    repo, first = one
    with failing(os, "fsync", after=1, err=errno.EIO), pytest.raises(OSError) as err:
        repo.commit(state(1), "the folder fsync fails")
    assert err.value.errno == errno.EIO
    leftovers = assert_as_before(repo, first).unreferenced
    assert len(leftovers) == 1  # a sealed pack nothing indexes: harmless, and gc reclaims it
    assert repo.gc(grace=0).packs_deleted == 1 and repo.fsck().unreferenced == ()


def test_cli_commit_prints_one_line_and_exits_1(one, tmp_path):
    repo, first = one
    checkpoint = tmp_path / "ckpt.pt"
    torch.save(state(1), checkpoint)
    with failing(os, "writev"):
        result = CliRunner().invoke(main, ["-C", str(repo.root), "commit", str(checkpoint), "-m", "full"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mvc: error: No space left on device while writing a pack")
    assert "Traceback" not in result.output
    assert_as_before(repo, first)


def test_gc_rewrite_failing_leaves_everything_loadable(repo):
    shared = torch.arange(20, dtype=torch.float32)
    repo.commit({"big": torch.arange(2000.0), "shared": shared}, "one")
    kept = repo.commit({"big": torch.arange(2000.0) + 1, "shared": shared}, "two")
    with failing(os, "writev", after=1), pytest.raises(OSError) as err:
        repo.gc(keep_last=1)  # the sweep is done; copying the live records out of the old pack fails
    assert err.value.errno == errno.ENOSPC
    assert not list((repo.dir / "packs").glob("*.tmp"))
    assert repo.fsck().ok and repo.resolve("main") == kept.id
    assert torch.equal(repo.load("main")["shared"], shared)
    assert repo.gc(keep_last=1).packs_rewritten == 1 and repo.fsck().unreferenced == ()


# The index transaction itself failing to write: a real kernel write error inside
# LMDB, from a file-size limit the child sets on itself before committing.
LIMITED = r"""
import os, resource, signal, sys, torch, mvc
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write(2) instead of dying
repo = mvc.Repository.open(sys.argv[1])
size = os.path.getsize(repo.dir / "index" / "data.mdb")
resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
many = {f"t{i}": torch.full((16,), float(i)) for i in range(400)}  # 400 new index entries, small packs
try:
    repo.commit(many, "does not fit")
except mvc.MvcError as exc:
    print(type(exc).__name__, exc)
"""


def test_index_transaction_failing_to_write(one):
    repo, first = one
    out = subprocess.run([sys.executable, "-c", LIMITED, str(repo.root)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("CorruptObject the index failed: mdb_txn_commit: File too large")
    leftovers = assert_as_before(repo, first).unreferenced
    assert len(leftovers) == 1  # the sealed pack of the failed commit, which nothing indexes


# A real full disk: a 4 MiB tmpfs in a private mount namespace (where the
# system allows one), committing until it is full.
ON_TMPFS = r"""
import errno, json, os, sys, torch, mvc
root = sys.argv[1]
repo = mvc.Repository.init(root, chunk_size=4096)
landed, error = [], None
for i in range(1000):
    state = {"w": torch.randn(64 * 1024, generator=torch.Generator().manual_seed(i))}
    try:
        landed.append(repo.commit(state, f"#{i}", step=i).id)
    except (OSError, mvc.MvcError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        break
tip, report = repo.resolve("main"), repo.fsck()
intact = torch.equal(repo.load("main")["w"], torch.randn(64 * 1024, generator=torch.Generator().manual_seed(len(landed) - 1)))
tmp = [p.name for p in (repo.dir / "packs").glob("*.tmp")]
repo.gc(grace=0)  # reclaims the failed commit's bytes, if any reached a sealed pack
after = repo.fsck()
print(json.dumps({"landed": landed, "error": error, "tip": tip, "ok": report.ok, "intact": intact, "tmp": tmp,
                  "clean_after_gc": after.ok and not after.unreferenced}))
"""


def test_real_full_filesystem(tmp_path):
    result = on_small_tmpfs(tmp_path, ON_TMPFS)
    assert result["error"] is not None and "No space left on device" in result["error"], result["error"]
    assert result["landed"] and result["tip"] == result["landed"][-1]
    assert result["ok"] and result["intact"] and result["tmp"] == [] and result["clean_after_gc"]
