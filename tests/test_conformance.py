"""Every verb on every kind of repository, and the chunk-store seam under faults.

A **kind** of repository is a composition of chunk stores and what was done
to it: plain local packs; repacked (grouped and delta records); a lazy clone
with nothing cached; a clone whose cache is partly evicted; repacked then
evicted; one holding sharded commits; one opened read-only. Each cell of
the matrix runs one verb on one kind, checks what it returns bit for bit
against the truth (the states that were committed), and ends with fsck
clean. Remotes are folders here (the same code paths as S3); the S3 kind
runs against the session's SeaweedFS.

The chunk size is small enough that tiny tensors span many chunks and
large enough that byte grouping and deltas pay (so repacked kinds really
hold encoded records).
"""

from pathlib import Path

import pytest
import torch

import mvc

CHUNK = 256


def state(seed: int) -> dict:
    """A small training state: ``w`` moves a little every step, ``frozen`` never, ``emb`` in a few rows."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(700, generator=g)
    w[seed * 40:seed * 40 + 40] += seed  # a few chunks differ from the step before
    emb = torch.zeros(64, 16)
    emb[seed % 64] = float(seed)
    return {"model": {"w": w, "frozen": torch.arange(600, dtype=torch.float32), "emb": emb},
            "opt": [torch.ones(9, dtype=torch.bfloat16) * seed], "step": seed}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def origin_with_remote(tmp_path: Path, commits: int = 3) -> tuple:
    """A repository with ``commits`` commits on main pushed to folder remote 'origin'; (repo, truth)."""
    repo = mvc.Repository.init(tmp_path / "origin", chunk_size=CHUNK)
    truth = {}
    for i in range(commits):
        truth[repo.commit(state(i), f"step {i}", step=i).id] = state(i)
    repo.remote_add("origin", str(tmp_path / "remote"))
    repo.push()
    return repo, truth


# -- the three crashes of issue 20 ----------------------------------------------------

def test_gc_in_a_repository_that_caches_a_remote_rewrites_its_packs(tmp_path):
    """gc rewrote packs through PackStore-only calls: AttributeError after the sweep had committed."""
    origin, truth = origin_with_remote(tmp_path, 2)
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lazy", lazy=True)
    try:
        lazy.load("main~1")  # one cached pack: frozen (live) and main~1's w (pruned below)
        report = lazy.gc(keep_last=1, grace=0, repack=True)
        assert report.packs_rewritten == 1 and report.records_moved > 0
        assert lazy.fsck().ok
        for oid, st in truth.items():
            if oid not in report.pruned:
                assert same(lazy.load(oid), st)
    finally:
        lazy.close()
        origin.close()


def test_first_repack_in_a_repository_that_caches_a_remote(tmp_path):
    """The first repack wrote encoded records into a version 1 pack: ValueError until reopened."""
    origin, truth = origin_with_remote(tmp_path)
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lazy", lazy=True)
    try:
        for oid in truth:
            lazy.load(oid)
        report = lazy.repack()
        assert report.grouped + report.deltas > 0
        assert lazy.fsck().ok
        for oid, st in truth.items():
            assert same(lazy.load(oid), st)
    finally:
        lazy.close()
        origin.close()


def test_evict_after_repack_in_a_repository_that_caches_a_remote(tmp_path):
    """Eviction copied kept records into buffers of their stored length: CorruptObject on encoded ones."""
    origin, truth = origin_with_remote(tmp_path)
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lazy", lazy=True)
    try:
        for oid in truth:
            lazy.load(oid)
        assert lazy.repack().grouped > 0
        report = lazy.evict(0)
        assert report.chunks_evicted > 0 and report.kept_pinned > 0  # HEAD's chunks stay, rewritten
        assert lazy.fsck().ok
        for oid, st in truth.items():
            assert same(lazy.load(oid), st)
    finally:
        lazy.close()
        origin.close()
