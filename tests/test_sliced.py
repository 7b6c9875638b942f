"""Sliced walks: fsck and gc a slice of the id space at a time give what one step gives.

Every test runs the same fsck or gc with budgets that force many steps (a step of one
record, of a few) and with one step for everything, on repositories with damage, garbage,
delta chains and a lazy clone's remote-only chunks, and compares the results field by field.
"""

import dataclasses
import errno
import os
import random
import shutil

import numpy as np
import pytest
import torch

import mvc
from mvc import fsck as F
from mvc import sliced
from mvc.errors import MvcError
from mvc.store import codec, idarray
from mvc.store.packs import Location, PackWriter, pack_filename

from damage import flip_bit

WHOLE = 1 << 40  # one step for everything
BUDGETS = (1, 3, 17)


def _fsck(repo, budget, quick):
    return dataclasses.replace(F.fsck(repo, quick=quick, budget=budget), seconds=0.0)


def assert_fsck_sliced_alike(repo) -> F.FsckReport:
    """fsck (quick and full) with every budget equals fsck in one step; that report."""
    for quick in (True, False):
        want = _fsck(repo, WHOLE, quick)
        for budget in BUDGETS:
            assert _fsck(repo, budget, quick) == want, (quick, budget)
    return want  # the full one


def _outcome(fn, **options):
    """What ``fn(**options)`` returns, or the type and message of the MvcError it raises."""
    try:
        return fn(**options)
    except MvcError as exc:
        return type(exc).__name__, str(exc)


def _gc(path, copy, budget, **options):
    """gc of a copy of the repository at ``path``: (report or error, chunk index entries after,
    every commit's state after, as bytes)."""
    shutil.copytree(path, copy)
    repo = mvc.Repository.open(copy)
    try:
        outcome = _outcome(repo.gc, budget=budget, grace=0, **options)
        with repo.index.read() as txn:
            entries = [(cid, _where(txn, cid)) for cid in txn.ids("chunks")]
        loaded = {}
        for c in _commits(repo):
            try:
                loaded[c] = _canon(repo.load(c))
            except MvcError as exc:
                loaded[c] = type(exc).__name__
        return outcome, entries, loaded
    finally:
        repo.close()


def _canon(value):
    """A state as comparable plain values (tensors as their bytes)."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), value.numpy().tobytes())
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_canon(v) for v in value)
    return value


def _where(txn, cid: bytes):
    """A chunk's location but for the name of its pack (gc names the packs it writes at random);
    the raw value of an entry that does not decode."""
    try:
        loc = txn.chunk(cid)
    except MvcError:
        return txn.get("chunks", cid)
    return None if loc is None else (loc.offset, loc.length, loc.kind, loc.size, loc.depth, loc.base)


def _commits(repo) -> list:
    with repo.index.read() as txn:
        return sorted(oid.hex() for oid in txn.ids("commits"))


def assert_gc_sliced_alike(repo, tmp_path, **options):
    """gc (dry run on the repository, real on copies) with every budget equals gc in one step."""
    want = _outcome(repo.gc, dry_run=True, budget=WHOLE, grace=0, **options)
    for budget in BUDGETS:
        assert _outcome(repo.gc, dry_run=True, budget=budget, grace=0, **options) == want, budget
    path = repo.dir.parent
    real = _gc(path, tmp_path / "gc-whole", WHOLE, **options)
    for budget in BUDGETS:
        assert _gc(path, tmp_path / f"gc-{budget}", budget, **options) == real, budget
    return want, real


def _state(seed: int, n: int = 3, size: int = 96) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.randn(size + 7 * i, generator=g) for i in range(n)}


# -- damage, garbage ------------------------------------------------------------------------

def _drop_a_branch(repo, seed: int) -> None:
    """A commit on a branch that is then deleted, its reflog with it: garbage for gc."""
    repo.create_branch("side")
    repo.checkout("side")
    repo.commit(_state(seed), "side")
    repo.checkout("main")
    repo.delete_branch("side", force=True)
    repo.reflog.expire("side")


@pytest.fixture
def damaged(repo):
    """main: three commits; a dropped branch (garbage), an unindexed pack, a chunk missing from
    the index, a flipped data bit, a chunk the index gives the wrong length."""
    s = _state(0)
    for i in range(3):
        s = {k: v + (i == 0 or k == "t1") for k, v in s.items()}
        repo.commit(s, f"c{i}")
    _drop_a_branch(repo, 9)
    writer = PackWriter(repo.dir / "packs")
    writer.add(bytes(range(32)), b"orphan record")
    writer.seal()
    entries = {e.key: e for e in repo.entries("main")}
    with repo.index.write() as txn:
        gone = entries["t0"].chunks[1]
        txn.delete_chunk(gone)
        cid = entries["t2"].chunks[0]
        loc = txn.chunk(cid)
        txn.put_chunk(cid, Location(loc.pack, loc.offset, loc.length + 1), overwrite=True)
        loc = txn.chunk(entries["t1"].chunks[2])
    flip_bit(repo.dir / "packs" / pack_filename(loc.pack), loc.offset + 3)
    return repo


def test_fsck_of_damage_and_garbage_is_the_same_in_any_number_of_steps(damaged):
    report = assert_fsck_sliced_alike(damaged)
    kinds = sorted(d.kind for d in report.damage)
    assert kinds == sorted([F.MISSING_CHUNK, F.BAD_INDEX_ENTRY, F.CHECKSUM]), report.damage
    assert all(d.tensors and d.commits for d in report.damage)
    assert {u.kind for u in report.unreferenced} >= {F.UNUSED_RECORDS}


def test_gc_refusing_damage_is_the_same_in_any_number_of_steps(damaged, tmp_path):
    want, (outcome, _, _) = assert_gc_sliced_alike(damaged, tmp_path)
    assert outcome[0] == "CorruptObject" and "not in the chunk index" in outcome[1]


def test_gc_of_garbage_is_the_same_in_any_number_of_steps(repo, tmp_path):
    s = _state(1, n=4)
    for i in range(4):
        s = {k: v + (k == f"t{i}") for k, v in s.items()}
        repo.commit(s, f"c{i}")
    _drop_a_branch(repo, 5)
    want, (outcome, entries, loaded) = assert_gc_sliced_alike(repo, tmp_path, keep_last=2, expire_reflog=0)
    assert want.chunks_removed > 0 and want.pruned
    assert outcome.chunks_removed > 0 and len(entries) > 0


def test_a_bad_index_entry_stops_gc_alike_in_any_number_of_steps(repo, tmp_path):
    for i in range(3):
        repo.commit(_state(i), f"c{i}")
    cid = next(e for e in repo.entries("main") if e.key == "t2").chunks[1]
    with repo.index.write() as txn:  # the chunks table's entry shadows the pack index's
        txn._txn.put(cid, b"not a location", db=txn._dbs["chunks"])
    assert_fsck_sliced_alike(repo)
    _, (outcome, _, _) = assert_gc_sliced_alike(repo, tmp_path)
    assert outcome[0] == "WalkDamaged" and cid.hex()[:12] in outcome[1]


# -- delta chains ---------------------------------------------------------------------------

def _deltas(repo, steps: int = 5) -> list:
    """Commits of a state whose few changed bytes a repack stores as delta chains; ids."""
    g = torch.Generator().manual_seed(3)
    state = {f"w{i}": torch.randn(1024, generator=g) for i in range(3)}
    ids = []
    for step in range(steps):
        state = {k: v.clone() for k, v in state.items()}
        for v in state.values():
            v[step * 37 % 1024] += 1.0
        ids.append(repo.commit(state, f"step {step}").id)
    report = repo.repack()
    assert report.deltas > 0
    return ids


@pytest.fixture
def chains(tmp_path):
    r = mvc.Repository.init(tmp_path / "r", chunk_size=1024)
    yield r
    r.close()


def test_fsck_and_gc_of_delta_chains_are_the_same_in_any_number_of_steps(chains, tmp_path):
    ids = _deltas(chains)
    chains.create_tag("v0", ids[0])  # kept: its deltas decode through chunks only pruned commits hold
    assert assert_fsck_sliced_alike(chains).ok
    want, (outcome, _, loaded) = assert_gc_sliced_alike(chains, tmp_path, keep_last=1)
    assert want.pruned and outcome.pruned
    assert all(isinstance(loaded[c], dict) for c in (ids[0], ids[-1]))


def test_damage_to_a_delta_base_is_named_alike_in_any_number_of_steps(chains):
    _deltas(chains)
    with chains.index.read() as txn:
        delta = next(loc for _, loc in txn.chunks() if loc.kind == codec.DELTA)
        base = txn.chunk(delta.base)
    flip_bit(chains.dir / "packs" / pack_filename(base.pack), base.offset + base.length // 2)
    report = assert_fsck_sliced_alike(chains)
    broken = [d for d in report.damage if d.kind == F.BROKEN_BASE]
    assert broken and all(d.tensors and d.commits for d in broken)
    with chains.index.write() as txn:
        txn.delete_chunk(delta.base)
    report = assert_fsck_sliced_alike(chains)
    missing = [d for d in report.damage if d.kind == F.MISSING_CHUNK]
    assert missing and missing[0].chunks == (delta.base.hex(),) and missing[0].tensors


def test_delta_bases_only_pruned_commits_held_are_kept_alike(chains, tmp_path):
    ids = _deltas(chains, steps=6)
    chains.create_tag("v0", ids[0])
    chains.create_tag("v2", ids[2])
    chains.gc(keep_last=1, grace=0)  # now the tags' deltas decode through bases no tensor lists
    assert assert_fsck_sliced_alike(chains).ok
    want, (outcome, _, loaded) = assert_gc_sliced_alike(chains, tmp_path, repack=True)
    fresh = chains.fsck()
    assert fresh.ok and outcome.chunks_removed == want.chunks_removed


# -- a lazy clone ---------------------------------------------------------------------------

def test_a_lazy_clones_remote_only_chunks_are_counted_alike(tmp_path):
    origin = mvc.Repository.init(tmp_path / "a", chunk_size=64)
    try:
        for i in range(3):
            origin.commit(_state(i), f"c{i}")
        origin.remotes.add("origin", str(tmp_path / "remote"))
        origin.remotes.push()
    finally:
        origin.close()
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        lazy.load("main~1")
        report = assert_fsck_sliced_alike(lazy)
        assert report.ok and report.unverified > 0 and report.chunks > report.unverified
        want, (outcome, _, _) = assert_gc_sliced_alike(lazy, tmp_path)
        assert want.chunks_removed == 0
    finally:
        lazy.close()


# -- random repositories --------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_random_repositories_with_random_damage(tmp_path, seed):
    rnd = random.Random(seed)
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=64)
    try:
        s = _state(seed, n=rnd.randint(1, 4), size=rnd.randint(8, 80))
        for i in range(rnd.randint(1, 5)):
            s = {k: (v + 1 if rnd.random() < 0.5 else v) for k, v in s.items()}
            repo.commit(s, f"c{i}")
        if rnd.random() < 0.5:
            repo.create_branch("b")
            repo.checkout("b")
            repo.commit(_state(seed + 100), "b")
            repo.checkout("main")
            repo.delete_branch("b", force=True)
        chunks = [(e.key, cid) for c in range(1) for e in repo.entries("main") for cid in e.chunks]
        for _ in range(rnd.randint(0, 3)):
            key, cid = rnd.choice(chunks)
            with repo.index.write() as txn:
                loc = txn.chunk(cid)
                if loc is None:
                    continue
                how = rnd.choice(["drop", "junk", "flip"])
                if how == "drop":
                    txn.delete_chunk(cid)
                elif how == "junk":  # an entry of the chunks table shadows the pack index's
                    txn._txn.put(cid, b"junk", db=txn._dbs["chunks"])
            if how == "flip":
                flip_bit(repo.dir / "packs" / pack_filename(loc.pack), loc.offset)
        assert_fsck_sliced_alike(repo)
        assert_gc_sliced_alike(repo, tmp_path, keep_last=rnd.choice([None, 1, 2]))
    finally:
        repo.close()


# -- the steps and the spills ---------------------------------------------------------------

def test_a_small_budget_takes_many_steps_of_at_most_a_slice_over_it(repo, monkeypatch):
    for i in range(3):
        repo.commit(_state(i, n=4, size=200), f"c{i}")
    seen = []
    real = sliced.LivePass._step

    def step(self, b, e):
        out = real(self, b, e)
        seen.append((e - b, len(out.ids)))
        return out
    monkeypatch.setattr(sliced.LivePass, "_step", step)
    F.fsck(repo, quick=True, budget=4)
    assert len(seen) > 20
    assert all(n <= 4 or width == 1 for width, n in seen)  # a slice (two id bytes) over the budget goes alone
    seen.clear()
    F.fsck(repo, quick=True, budget=WHOLE)
    assert len(seen) == 1


def _records(ids: list) -> np.ndarray:
    out = np.zeros(len(ids), dtype=sliced.RECORD)
    out["id"] = idarray.pack(ids)
    out["length"] = np.arange(len(ids))
    return out


def test_a_spill_gives_records_back_by_slice_in_the_order_added(tmp_path):
    # slices are the ids' first two bytes; files the first byte
    ids = [bytes(p) + os.urandom(30) for p in ((5, 1), (200, 0), (5, 2), (7, 0), (200, 0), (0, 9), (5, 0))]
    with sliced.Scratch(tmp_path) as where:
        spill = sliced.Spill(sliced.RECORD, 2, where)
        for k in range(0, len(ids), 2):
            spill.add(_records(ids[k:k + 2]))
        assert where.path is not None and where.path.parent == tmp_path / "tmp"  # it went to disk
        assert idarray.ids(spill.take(0x0501, 0x0503)["id"]) == [ids[0], ids[2]]  # part of a file, as added
        assert idarray.ids(spill.take(0x0500, 0x0600)["id"]) == [ids[0], ids[2], ids[6]]  # disk, then memory
        assert sorted(idarray.ids(spill.take(0, sliced.SLICES)["id"])) == sorted(ids)
        assert spill.counts[0xC800] == 2 and spill.total == len(ids)
        assert [spill.end(x) for x in (0, 0x0501, 0x0700, 0xC800)] == [0x0501, 0x0700, 0xC800, sliced.SLICES]
        blocks = list(spill.scan(5))
        assert all(len(b) <= 2 for b in blocks) and sum(map(len, blocks)) == 3
    assert not (tmp_path / "tmp").exists() or not any((tmp_path / "tmp").iterdir())


def test_a_spill_on_a_full_disk_keeps_its_records_in_memory(tmp_path, monkeypatch):
    calls = []

    class Full:
        def __init__(self, path, mode):
            self.f = open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            calls.append(len(data))
            if len(calls) > 1:
                self.f.write(data[:7])
                raise OSError(errno.ENOSPC, "No space left on device")
            self.f.write(data)
    monkeypatch.setattr(sliced, "open", Full, raising=False)
    ids = [bytes([b]) + os.urandom(31) for b in (1, 2, 3)]
    with sliced.Scratch(tmp_path) as where:
        spill = sliced.Spill(sliced.RECORD, 1, where)
        spill.add(_records(ids[:1] + ids[1:2]))  # the second file's write fails half way
        assert where.full
        assert [p.stat().st_size for p in where.path.rglob("*") if p.is_file()] == [0, 0]  # cut back
        spill.add(_records(ids[2:]))
        assert [idarray.ids(spill.take(b << 8, (b + 1) << 8)["id"]) for b in (1, 2, 3)] == [[ids[0]], [ids[1]], [ids[2]]]


def test_a_bad_budget_is_refused_clearly(repo, monkeypatch):
    monkeypatch.setenv(sliced.BUDGET_ENV, "lots")
    with pytest.raises(mvc.BadInput) as err:
        repo.fsck()
    assert sliced.BUDGET_ENV in str(err.value) and "'lots'" in str(err.value)
    monkeypatch.setenv(sliced.BUDGET_ENV, "64")
    assert repo.fsck().ok
    for bad in (0, -3, 2.5):
        with pytest.raises(mvc.BadInput):
            repo.gc(dry_run=True, budget=bad)


def test_a_killed_walks_spill_is_a_leftover_that_gc_removes(repo):
    from mvc.store.processes import place
    repo.commit(_state(0), "c")
    dead = repo.dir / "tmp" / f"walk-{2 ** 22 + 12345}-{place()}-abc123"  # no such pid
    (dead / "1").mkdir(parents=True)
    (dead / "1" / "00").write_bytes(bytes(44))
    assert repo.fsck().leftovers == (f"tmp/{dead.name}",)
    assert repo.gc(budget=1).scratch_removed == (f"tmp/{dead.name}",) and not dead.exists()
    assert not any((repo.dir / "tmp").iterdir())  # gc's own spills are gone too


# -- the vectorised parts, against the plain computation they replace -----------------------

def _ids_sharing_heads(n: int, seed: int, share: bool = True) -> np.ndarray:
    """``n`` ids drawn (with repeats) from a few; with ``share``, some of those share their first
    8 or 16 bytes."""
    rng = np.random.default_rng(seed)
    pool = np.frombuffer(rng.bytes(32 * 12), dtype=idarray.ID).copy()
    raw = pool.view(np.uint8).reshape(12, 32)
    if share:
        raw[:6, :8] = 7  # six share their heads
        raw[:3, :16] = 9  # three of them their first 16 bytes
    return pool[rng.integers(0, 12, n)]


@pytest.mark.parametrize("share", [False, True])
def test_unique_keeps_each_ids_first_occurrence_where_heads_tie(share):
    for seed in range(20):
        ids = _ids_sharing_heads(2000, seed, share)
        got, want = sliced.unique(ids), idarray.unique(ids)
        assert got[0].tobytes() == want[0].tobytes() and got[1].tolist() == want[1].tolist()


def test_factorize_groups_pack_names_that_share_their_first_bytes():
    names = _ids_sharing_heads(300, 1).view(np.uint8).reshape(300, 32)[:, :16].copy().view("V16").ravel()
    distinct, which = sliced.factorize(names)
    assert len(set(distinct)) == len(distinct) == len(np.unique(names))
    assert b"".join(distinct[k] for k in which.tolist()) == names.tobytes()


def _trailer(offsets: list) -> np.ndarray:
    table = np.zeros(len(offsets), dtype=[("id", idarray.ID), ("offset", "<u8"), ("length", "<u4")])
    table["id"] = idarray.pack([bytes([k]) * 32 for k in range(len(offsets))])
    table["offset"], table["length"] = offsets, 10
    return table


def _naive(table: np.ndarray, rows: np.ndarray) -> tuple:
    """(listed, used) as fsck computed them before: a search per row, np.isin for the used records."""
    at = np.minimum(np.searchsorted(table["offset"], rows["offset"]), len(table) - 1)
    listed = (table["offset"][at] == rows["offset"]) & (table["id"][at] == rows["id"]) \
        & (table["length"][at] == rows["length"])
    return listed.tolist(), np.isin(table["offset"], rows["offset"]).tolist()


@pytest.mark.parametrize("offsets", [[8, 30, 52, 74, 96], [8, 30, 30, 74, 96]])  # the second lists 30 twice
def test_a_trailer_listing_matches_rows_as_a_search_per_row_did(offsets):
    table = _trailer(offsets)
    rows = np.zeros(7, dtype=sliced.PLAIN)
    rows["id"] = [table["id"][3], table["id"][0], table["id"][1], table["id"][4], b"x" * 32, table["id"][2],
                  table["id"][3]]
    rows["offset"] = [74, 8, 30, 97, 52, 30, 74]  # one offset no record has; a wrong id; the last a repeat
    rows["length"] = [10, 10, 11, 10, 10, 10, 10]  # a wrong length
    listing = sliced.Listing(table)
    listed = [listing.match(rows[:4]).tolist(), listing.match(rows[4:]).tolist()]  # two blocks
    want_listed, want_used = _naive(table, rows)
    assert listed[0] + listed[1] == want_listed
    assert listing.used.tolist() == want_used


def _located_step(n: int, deltas: int, seed: int) -> sliced.Step:
    """A step of ``n`` located ids in three packs, the first ``deltas`` of them delta records."""
    rng = np.random.default_rng(seed)
    ids = np.sort(np.frombuffer(rng.bytes(32 * n), dtype=idarray.ID))
    locs = np.zeros(n, dtype=sliced.LOCATIONS)
    locs["pack"] = np.frombuffer(b"".join(bytes([k]) * 16 for k in (1, 2, 3)), dtype="V16")[rng.integers(0, 3, n)]
    locs["offset"], locs["length"] = rng.permutation(n) * 100 + 8, rng.integers(1, 64, n)
    locs["size"], locs["kind"] = locs["length"], 0
    step = sliced.Step(ids, locs["length"].astype(np.int64), np.ones(n, dtype=bool), locs)
    for i in range(deltas):
        locs["kind"][i] = codec.DELTA
        step.deltas[step.cid(i)] = (bytes([i]) * 32, 1 + i)
    return step


def test_pack_rows_give_back_the_rows_of_each_pack_in_bounded_blocks(tmp_path):
    steps = [_located_step(40, 5, seed) for seed in (1, 2)]
    with sliced.Scratch(tmp_path) as where:
        rows = sliced.PackRows(7, where)
        for step in steps:
            names, which = rows.add(step, np.arange(len(step.ids)))
            assert b"".join(names[k] for k in which.tolist()) == step.locations["pack"].tobytes()
        assert where.path is not None  # over the budget: on disk
        for k in (1, 2, 3):
            pack = bytes([k]) * 16
            want = np.concatenate([step.rows(np.flatnonzero(step.locations["pack"] == np.frombuffer(pack, "V16")[0]))
                                   for step in steps])
            got = rows.rows(pack)
            assert got.dtype == sliced.ROW
            assert sorted(got.tolist()) == sorted(want.tolist())
            blocks = list(rows.blocks(pack, plain=True))
            assert all(len(b) <= 7 for b in blocks)
            assert {b.dtype for b in blocks} <= {sliced.PLAIN, sliced.ROW}
            plain = np.concatenate([b for b in blocks if b.dtype == sliced.PLAIN])
            assert not plain["kind"].any()  # the delta records come as ROW, with their bases
            assert sorted(idarray.ids(np.concatenate([b["id"] for b in blocks]))) == sorted(idarray.ids(want["id"]))
