"""Pack indexes (the prototype of issue 35's chunk index): exact bytes, lookups proven against
the packs' trailers, merges in slices equal to a whole write, damage detected."""

import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import mvc
from mvc import hashing
from mvc.errors import CorruptObject
from mvc.store import idarray, packindex
from mvc.store.packs import PACK_NAME, pack_filename, read_trailer_table


def _ids(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return idarray.pack([rng.bytes(32) for _ in range(n)])


def _name(k: int) -> bytes:
    return bytes([k]) * 16


def _lookup(idx, ids, by_pack):
    return packindex.index_lookup(idx, ids, lambda k, rows: by_pack[k][rows])


@pytest.fixture
def three(tmp_path):
    by_pack = [_ids(n, seed) for seed, n in enumerate((500, 1, 1200))]
    path = tmp_path / "all.pidx"
    packindex.write(path, [_name(k) for k in range(3)], by_pack)
    idx = packindex.PackIndex(path)
    yield idx, by_pack
    idx.close()


def test_every_id_is_found_in_its_pack_and_row_and_no_other_is(three):
    idx, by_pack = three
    idx.verify()
    assert len(idx) == 1701 and idx.names == [_name(k) for k in range(3)]
    for k, ids in enumerate(by_pack):
        pack, row = _lookup(idx, ids, by_pack)
        assert (pack == k).all() and (row == np.arange(len(ids))).all()
    pack, row = _lookup(idx, _ids(300, 99), by_pack)
    assert (pack == -1).all() and (row == -1).all()


def test_ids_that_share_a_prefix_are_told_apart_by_the_trailers(tmp_path):
    a = os.urandom(16)
    ids = [a + os.urandom(16) for _ in range(3)]
    by_pack = [idarray.pack(ids[:2]), idarray.pack(ids[2:])]
    packindex.write(tmp_path / "p", [_name(0), _name(1)], by_pack)
    idx = packindex.PackIndex(tmp_path / "p")
    pack, row = _lookup(idx, idarray.pack(ids + [a + bytes(16)]), by_pack)
    assert pack.tolist() == [0, 0, 1, -1] and row.tolist() == [0, 1, 0, -1]
    idx.close()


def test_exact_bytes(tmp_path):
    ids = [bytes([0x80]) + bytes(31), bytes([0x01]) * 32]
    packindex.write(tmp_path / "p", [_name(7)], [idarray.pack(ids)])
    data = (tmp_path / "p").read_bytes()
    fanout = [0] * 1 + [1] * 0x7F + [2] * 128  # one id under 0x01 .. 0x7f, both from 0x80
    body = (b"MVCPIDX1" + struct.pack("<IQB3x", 1, 2, 16) + _name(7) + struct.pack("<256Q", *fanout)
            + struct.pack("<2Q", int.from_bytes(ids[1][:8], "big"), int.from_bytes(ids[0][:8], "big"))
            + struct.pack("<2Q", int.from_bytes(ids[1][8:16], "big"), int.from_bytes(ids[0][8:16], "big"))
            + struct.pack("<2I", 0, 0) + struct.pack("<2I", 1, 0))
    assert data[:-32] == body
    assert data[-32:] == hashing.digest(hashing.digest(body))  # one block: its digest, hashed


def test_a_merge_in_small_steps_writes_the_bytes_of_one_whole_write(tmp_path, three):
    _, by_pack = three
    parts = []
    for k, ids in enumerate(by_pack):
        packindex.write(tmp_path / f"{k}.pidx", [_name(k)], [ids])
        parts.append(packindex.PackIndex(tmp_path / f"{k}.pidx"))
    parts.append(packindex.PackIndex(tmp_path / "1.pidx"))  # a pack listed twice counts once
    packindex.merge(tmp_path / "merged.pidx", parts, budget=40)
    assert (tmp_path / "merged.pidx").read_bytes() == (tmp_path / "all.pidx").read_bytes()
    for p in parts:
        p.close()


def test_slices_cover_the_id_space_within_the_budget(three):
    idx, _ = three
    cuts = list(idx.slices(100))
    assert cuts[0][0] == 0 and cuts[-1][1] == 256 and cuts[-1][3] == len(idx)
    assert all(a[1] == b[0] and a[3] == b[2] for a, b in zip(cuts, cuts[1:]))
    assert all(stop - start <= 100 or end - first == 1 for first, end, start, stop in cuts)


@pytest.mark.parametrize("where", [30, 5000, -40, -1])
def test_a_flipped_byte_is_caught(three, where):
    idx, by_pack = three
    path = idx.path
    idx.close()
    data = bytearray(path.read_bytes())
    data[where] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObject) as err:
        packindex.PackIndex(path).verify()
    assert err.value.kind == "pack-index"


def test_a_truncated_file_is_refused_at_open(three):
    idx, _ = three
    path = idx.path
    idx.close()
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(CorruptObject):
        packindex.PackIndex(path)


def test_an_index_of_a_repositorys_packs_locates_every_chunk_where_lmdb_does(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=64)
    try:
        for step in range(3):
            repo.commit({"w": torch.randn(300), "b": torch.full((50,), float(step))}, f"s{step}")
        files = [f for f in repo.chunks.pack_files() if f.pack is not None]
        tables = {f.pack: read_trailer_table(f.path) for f in files}
        names = sorted(tables)
        packindex.write(tmp_path / "repo.pidx", names, [tables[n]["id"] for n in names])
        idx = packindex.PackIndex(tmp_path / "repo.pidx")
        with repo.index.read() as txn:
            entries = list(txn.chunks())
        ids = idarray.pack([cid for cid, _ in entries])
        pack, row = packindex.lookup(idx, ids, tables)
        for (cid, loc), k, r in zip(entries, pack.tolist(), row.tolist()):
            assert names[k] == loc.pack and int(tables[loc.pack]["offset"][r]) == loc.offset
        idx.close()
        assert all(PACK_NAME.fullmatch(f.name) for f in files)
    finally:
        repo.close()


def test_a_spilled_walk_classified_slice_by_slice_finds_what_is_live_missing_and_garbage(tmp_path, three):
    idx, by_pack = three
    live = np.concatenate([by_pack[0][:300], by_pack[2][::2], by_pack[0][:50]])  # repeats, as tensors share
    absent = _ids(20, 7)
    spill = packindex.IdSpill(tmp_path / "spill")
    spill.FLUSH = 64  # many flushes
    for part in np.array_split(np.concatenate([live, absent]), 13):
        spill.add(part)
    found, missing, garbage = set(), set(), set()
    for ids, pack, row, dead in packindex.classify(idx, spill, lambda k, rows: by_pack[k][rows], budget=200):
        for cid, k, r in zip(idarray.ids(ids), pack.tolist(), row.tolist()):
            (found if k >= 0 else missing).add(cid)
            if k >= 0:
                assert by_pack[k][r:r + 1].tobytes() == cid
        garbage |= {by_pack[int(idx.packs[j])][int(idx.rows[j]):int(idx.rows[j]) + 1].tobytes() for j in dead}
    every = {cid for ids in by_pack for cid in idarray.ids(ids)}
    assert found == set(idarray.ids(live)) and missing == set(idarray.ids(absent))
    assert garbage == every - found


def test_ids_that_share_only_their_first_eight_bytes_are_searched_apart(tmp_path):
    head = os.urandom(8)
    ids = [head + os.urandom(24) for _ in range(4)]
    by_pack = [idarray.pack(ids[:3])]
    packindex.write(tmp_path / "p", [_name(0)], by_pack)
    idx = packindex.PackIndex(tmp_path / "p")
    pack, row = _lookup(idx, idarray.pack(ids), by_pack)
    assert pack.tolist() == [0, 0, 0, -1] and row.tolist() == [0, 1, 2, -1]
    idx.close()


def test_unique_ids_with_shared_heads_and_repeats_come_out_as_numpys_unique():
    head = os.urandom(8)
    ids = idarray.pack([head + os.urandom(24) for _ in range(3)] + [os.urandom(32) for _ in range(5)])
    many = np.concatenate([ids, ids[::2], ids[:1]])
    np.random.default_rng(3).shuffle(many)
    assert packindex._unique(many).tobytes() == np.unique(many).tobytes()
    plain = np.concatenate([ids[3:], ids[3:5]])
    assert packindex._unique(plain).tobytes() == np.unique(plain).tobytes()


# -- the view: registered pack indexes mapped, merged into multi-pack index files ---------------

def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randint(0, 256, (8 * 64,), dtype=torch.uint8, generator=g)}


def _midx(repo) -> list:
    return sorted(p for p in (repo.dir / "packs").iterdir() if packindex.MIDX_NAME.fullmatch(p.name))


def _pack_names(repo) -> set:
    return {bytes.fromhex(m.group(1)) for m in map(PACK_NAME.fullmatch, os.listdir(repo.dir / "packs")) if m}


def _read(repo) -> tuple:
    """What a new process reads of the chunk index: every location, the batches a walk takes,
    and a lookup of every id (a commit's); and the view it read them through."""
    packindex._VIEWS.clear()  # as a new process finds the folder
    with repo.index.read() as txn:
        located = dict(txn.chunks())
        batches = [(b.ids.tobytes(), b.locs.tobytes(), b.bases, b.bad) for b in txn.chunk_batches(batch=20)]
        found = txn.chunks_among(list(located))
        view = txn._view()
    return located, batches, found, view


@pytest.fixture
def repo(tmp_path):
    r = mvc.Repository.init(tmp_path / "r", chunk_size=64)
    yield r
    r.close()


@pytest.fixture
def twelve(repo):
    """A repository of 12 commits, a pack each: more than MAX_TIERS, so the view merges them."""
    states = [_state(k) for k in range(12)]
    for k, s in enumerate(states):
        repo.commit(s, f"c{k}")
    return repo, states


def test_many_packs_are_searched_through_a_mapped_multi_pack_index_as_the_in_memory_merge_did(twelve):
    repo, _ = twelve
    located, batches, found, view = _read(repo)
    (midx,) = _midx(repo)
    assert len(view.tiers) <= packindex.MAX_TIERS < len(view.names) == 12
    assert all(t.index is not None and not isinstance(t.index._map, bytes) for t in view.tiers)  # mapped
    (tier,) = [t for t in view.tiers if t.derived]
    assert tier.index.path == midx and packindex.midx_path(midx.parent, tier.names) == midx
    at = view.names.index(tier.names[0])
    assert tier.names == view.names[at:at + len(tier.names)]  # a run of the packs, newest first
    stamp = midx.stat().st_mtime_ns
    assert _read(repo)[:3] == (located, batches, found) and midx.stat().st_mtime_ns == stamp  # found, not rewritten
    # where it cannot be written (here a folder stands in its place), the merge of before: in memory
    for _ in range(3):  # each one a new process would write, till none can be
        for p in _midx(repo):
            if p.is_file():
                os.unlink(p)
                os.mkdir(p)
        old_located, old_batches, old_found, old_view = _read(repo)
    assert any(t.index is None for t in old_view.tiers) and not any(p.is_file() for p in _midx(repo))
    assert (old_located, old_batches, old_found) == (located, batches, found)
    assert len(located) == 12 * 8 and repo.fsck().ok


def test_a_read_only_pack_folder_is_read_through_an_in_memory_merge(twelve):
    repo, states = twelve
    if os.geteuid() == 0:
        pytest.skip("root writes to a read-only folder")
    for p in _midx(repo):
        os.unlink(p)
    folder = repo.dir / "packs"
    os.chmod(folder, 0o555)
    try:
        located, _, found, view = _read(repo)
        assert not _midx(repo) and any(t.index is None for t in view.tiers) and found == located
        assert torch.equal(repo.load("HEAD")["w"], states[-1]["w"])
    finally:
        os.chmod(folder, 0o755)


def _damage(path, how: str) -> None:
    """A real flipped bit (or a column zeroed) in a multi-pack index's pack numbers, written as a
    new file in its place."""
    data = bytearray(path.read_bytes())
    n = struct.unpack_from("<Q", data, 12)[0]
    packs_at = len(data) - 32 - 8 * n
    if how == "bit":
        data[packs_at] ^= 1  # the first entry names another pack: that chunk looks absent
    else:
        data[packs_at:packs_at + 4 * n] = bytes(4 * n)  # every entry names the newest pack
    tmp = path.with_name("damaged")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)


@pytest.mark.parametrize("how", ["bit", "column"])
def test_a_damaged_multi_pack_index_never_makes_gc_drop_a_live_chunk_nor_fsck_report_one(twelve, how):
    repo, states = twelve
    located, batches, _, _ = _read(repo)
    (midx,) = _midx(repo)
    written = midx.read_bytes()
    _damage(midx, how)
    packindex._VIEWS.clear()
    report = repo.fsck()
    assert report.ok, report.damage  # the damaged cache was found out and rebuilt
    assert midx.read_bytes() == written
    _damage(midx, how)
    packindex._VIEWS.clear()
    gc = repo.gc()
    assert gc.packs_deleted == gc.packs_rewritten == gc.chunks_removed == 0 and len(_pack_names(repo)) == 12
    assert midx.read_bytes() == written
    assert _read(repo)[:2] == (located, batches)
    for k, s in enumerate(states):
        assert torch.equal(repo.load(f"HEAD~{11 - k}")["w"], s["w"])
    assert repo.fsck().ok


def test_gc_deletes_the_multi_pack_indexes_that_name_a_deleted_pack(twelve):
    repo, states = twelve
    _read(repo)
    (old,) = _midx(repo)
    report = repo.gc(keep_last=3)
    assert report.packs_deleted == 9
    assert not old.exists()
    packs = _pack_names(repo)
    for p in _midx(repo):
        assert set(packindex.PackIndex(p).names) <= packs
    _read(repo)
    for k in range(3):
        assert torch.equal(repo.load(f"HEAD~{k}")["w"], states[11 - k]["w"])
    assert repo.fsck().ok


def test_a_view_of_more_packs_merges_the_newest_into_a_new_multi_pack_index_and_drops_the_old(twelve):
    repo, states = twelve
    _read(repo)
    (first,) = _midx(repo)
    for k in range(12, 20):  # a long-lived process committing: its view grows a tier at a time
        repo.commit(_state(k), f"c{k}")
    with repo.index.read() as txn:
        view = txn._view()
    assert len(view.tiers) <= packindex.MAX_TIERS and len(view.names) == 20
    kept = {t.index.path for t in view.tiers if t.derived}
    assert set(_midx(repo)) >= kept and all(p.is_file() for p in kept)
    located, batches, found, fresh = _read(repo)  # a new process finds the same tiers on disk
    assert [t.names for t in fresh.tiers] == [t.names for t in view.tiers] and found == located
    assert len(located) == 20 * 8


def test_collect_deletes_what_a_killed_multi_pack_index_writer_left_once_it_is_old(tmp_path):
    left = tmp_path / f"multi-{'ab' * 16}.midx.1f-2e-0badcafe.tmp"
    left.write_bytes(b"half")
    assert packindex.collect(tmp_path) == [] and left.exists()  # a write may be in progress
    old = left.stat().st_mtime - packindex.TMP_GRACE_S - 1
    os.utime(left, (old, old))
    assert packindex.collect(tmp_path) == [left] and not left.exists()


def test_processes_that_write_the_same_multi_pack_index_at_once_leave_one_whole_file(twelve):
    repo, _ = twelve
    located, batches, _, _ = _read(repo)
    for p in _midx(repo):
        os.unlink(p)
    read = ("import sys, mvc\nr = mvc.Repository.open(sys.argv[1])\n"
            "with r.index.read() as t:\n    print(len(dict(t.chunks())))\n")
    procs = [subprocess.Popen([sys.executable, "-c", read, str(repo.dir.parent)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    assert [p.communicate()[0].strip() for p in procs] == ["96"] * 4
    (midx,) = _midx(repo)
    packindex.PackIndex(midx).verify()
    assert sorted(os.listdir(repo.dir / "packs")) == sorted(
        [f"pack-{n.hex()}.{ext}" for n in _pack_names(repo) for ext in ("pack", "pidx")] + [midx.name])  # no .tmp
    assert _read(repo)[:2] == (located, batches)


class _CountedNames:
    """A view's pack names that count how often they are gone through (iterated or sliced)."""

    reads = 0

    def __init__(self, names):
        self.names = names

    def __iter__(self):
        type(self).reads += 1
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return name in self.names

    def __getitem__(self, k):
        if isinstance(k, slice):
            type(self).reads += 1
        return self.names[k]


def test_a_commit_builds_its_view_without_going_through_every_registered_pack(tmp_path):
    # each commit builds the new registered set from the last one; going through the last one's
    # names (sets, dicts and number arrays of every pack, rebuilt per commit) cost 1.3 us a pack:
    # 0.13 s a commit at 10^5 packs
    repo = mvc.Repository.init(tmp_path, chunk_size=64)
    try:
        g = torch.Generator().manual_seed(0)
        states = [{"w": torch.randn(40, generator=g)} for _ in range(12)]
        ids = [repo.commit(s, f"s{i}").id for i, s in enumerate(states)]
        key = (os.getpid(), str(tmp_path / ".mvc" / "packs"))
        last = packindex._VIEWS[key]
        assert len(last.names) >= 10
        last.names = _CountedNames(last.names)
        _CountedNames.reads = 0
        states.append({"w": torch.randn(40, generator=g)})
        ids.append(repo.commit(states[-1], "one more").id)
        view = packindex._VIEWS[key]
        assert view is not last and len(view.names) == len(last.names) + 1  # the new pack made a new view
        assert _CountedNames.reads == 0
        assert last._packs is None and view._packs is None  # nor a tuple of every (sequence, name)
        for cid, state in zip(ids, states):
            assert torch.equal(repo.load(cid)["w"], state["w"])
    finally:
        repo.close()


def _fresh_view(txn):
    """The view of the registry ``txn`` reads, as a process with no view before builds it."""
    folder = txn.repo_dir / "packs"
    key = (os.getpid(), str(folder))
    kept = packindex._VIEWS.pop(key, None)
    try:
        packs = tuple((seq, name) for seq, name, _ in txn.registered_packs())
        return packindex.registered(folder, packs, txn.registry_stamp())
    finally:
        if kept is not None:
            packindex._VIEWS[key] = kept


def _as_fresh(repo) -> int:
    """Check that the view this process built a commit at a time numbers its packs and locates
    every id of every registered pack's trailer exactly as a view built from scratch, the newest
    pack that lists an id winning; returns the number of registered packs."""
    with repo.index.read() as txn:
        view = txn._view()
        fresh = _fresh_view(txn)
        registry = [name for _, name, _ in txn.registered_packs()]
        assert view is not fresh and view.names == registry == list(fresh.names) and view.packs == fresh.packs
        assert not view.broken and not fresh.broken
        for v in (view, fresh):
            covered = [n for tier in v.tiers for n in tier.names]
            assert sorted(covered) == sorted(registry)  # every pack in one tier
            for tier, numbers in zip(v.tiers, v.numbers):
                assert [v.names[int(k)] for k in numbers] == tier.names
        expect, tables = {}, []
        for k, name in enumerate(registry):  # newest first: the first pack that lists an id wins
            ids = read_trailer_table(repo.dir / "packs" / pack_filename(name))["id"].astype(idarray.ID)
            tables.append(ids)
            for row, cid in enumerate(idarray.ids(ids)):
                expect.setdefault(cid, (k, row))
        ids = np.concatenate(tables)
        want = np.array([expect[cid] for cid in idarray.ids(ids)], dtype=np.int64).reshape(-1, 2)
        for v in (view, fresh):
            pack, row = v.locate(ids, lambda k, rows, v=v: txn._full_ids(v, k, rows))
            assert (pack == want[:, 0]).all() and (row == want[:, 1]).all()
            every = sorted(zip(*(x.tolist() for x in v.entries(0, packindex.FANOUT))))
            assert every == sorted((k, r) for k, ids in enumerate(tables) for r in range(len(ids)))
        assert dict(txn.chunks()) == {cid: loc for cid, loc in txn.chunks_among(list(expect)).items()}
        return len(registry)


def test_a_view_built_a_commit_at_a_time_locates_what_a_view_built_from_scratch_does(repo):
    states = [_state(k) for k in range(40)]
    for k in range(12):
        repo.commit(states[k], f"a{k}")
    assert _as_fresh(repo) == 12
    # another process's commits (a view of its own, from the files): this one builds on its view
    other = subprocess.run([sys.executable, "-c", "import sys, torch, mvc; r = mvc.Repository.open(sys.argv[1])\n"
                            "for k in range(3): r.commit({'w': torch.full((512,), k, dtype=torch.uint8)}, 'b')",
                            str(repo.root)], capture_output=True, text=True)
    assert other.returncode == 0, other.stderr
    assert _as_fresh(repo) == 15
    for k in range(12, 24):
        repo.commit(states[k], f"a{k}")
    repo.commit(states[3], "again")  # nothing new: no pack
    assert _as_fresh(repo) == 27
    report = repo.gc(keep_last=3)  # packs taken out: a view anew, and the next ones built on it
    assert report.packs_deleted > 0
    assert _as_fresh(repo) == 27 - report.packs_deleted
    for k in range(24, 32):
        repo.commit(states[k], f"a{k}")
    assert _as_fresh(repo) == 35 - report.packs_deleted
    packindex._VIEWS.clear()  # as a new process: its first view from the files, the next ones built on it
    for k in range(32, 40):
        repo.commit(states[k], f"a{k}")
    assert _as_fresh(repo) == 43 - report.packs_deleted
    for k in range(32, 40):
        assert torch.equal(repo.load(f"HEAD~{39 - k}")["w"], states[k]["w"])
    assert repo.fsck().ok


def test_views_built_on_one_view_each_see_only_their_own_new_pack(repo):
    # the list of packs a view shares with the views built from it is appended to: a second view
    # built on the same one (after a transaction that registered a pack aborted) takes a copy
    for k in range(3):
        repo.commit(_state(k), f"a{k}")
    with repo.index.read() as txn:
        base = txn._view()
    before = list(base.names)
    folder = repo.dir / "packs"
    made = {}
    for name in (b"a" * 16, b"b" * 16):
        made[name] = idarray.pack([os.urandom(32) for _ in range(5)])
        packindex.write(packindex.pidx_path(folder, name), [name], [made[name]])
    try:
        seq = base.newest() + 1
        views = {name: packindex.added(folder, base, seq, name) for name in made}
        assert list(base.names) == before and len(base.names) == 3
        for name, view in views.items():
            assert list(view.names) == [name] + before and view.packs[1:] == base.packs
            assert view.packs[0] == (seq, name)
            for other, ids in made.items():
                pack, _ = view.locate(ids, lambda k, rows: None)  # no pack file: the prefix is taken
                assert (pack == (0 if other == name else -1)).all()
            assert all(other not in view.names for other in made if other != name)
        assert all(name not in base.names for name in made) and base.newest() == seq - 1
    finally:
        for name in made:
            os.unlink(packindex.pidx_path(folder, name))
        packindex.forget(folder)


def _registrations_read(repo, monkeypatch) -> list:
    """Count the reads of every registration (``Txn.registered_packs``) into the list returned."""
    from mvc.store import index
    calls, real = [], index.Txn.registered_packs
    monkeypatch.setattr(index.Txn, "registered_packs", lambda txn: calls.append(1) or real(txn))
    return calls


def test_a_transaction_reads_every_registration_only_when_the_registry_changed(repo, monkeypatch):
    # reading and sorting every registration per transaction cost 2 us a pack: 0.2 s a commit
    # and a load at 10^5 packs
    ids = [repo.commit(_state(i), f"s{i}").id for i in range(6)]
    calls = _registrations_read(repo, monkeypatch)
    for _ in range(3):
        assert torch.equal(repo.load(ids[0])["w"], _state(0)["w"])
    assert calls == []
    other = subprocess.run([sys.executable, "-c", "import sys, torch, mvc; r = mvc.Repository.open(sys.argv[1]); "
                            "r.commit({'w': torch.arange(512, dtype=torch.uint8)}, 'elsewhere')", str(repo.root)],
                           capture_output=True, text=True)
    assert other.returncode == 0, other.stderr
    assert torch.equal(repo.load("HEAD")["w"], torch.arange(512, dtype=torch.uint8))  # another process's pack seen
    assert calls == [1]
    with repo.index.read() as txn:
        assert {n for _, n, _ in txn.registered_packs()} == set(txn._view().names) == _pack_names(repo)


@pytest.mark.parametrize("change", ["register", "unregister"])
def test_a_registry_changed_by_an_mvc_that_writes_no_token_is_read_again(repo, change):
    from mvc.store import index
    for i in range(4):
        repo.commit(_state(i), f"s{i}")
    with repo.index.read() as txn:
        before = list(txn._view().names)
    newest = before[0]
    with repo.index.write() as txn:  # as an mvc before the token: the registration alone
        db = txn._dbs["packidx"]
        if change == "unregister":
            txn._txn.delete(newest, db=db)
        else:
            seq, entries = index.REGISTRATION.unpack(txn._txn.get(newest, db=db))
            nxt = index._SEQ.unpack(txn._txn.get(index.NEXT_SEQ, db=db))[0]
            txn._txn.put(newest, index.REGISTRATION.pack(nxt, entries), db=db)  # the newest again, renumbered
            txn._txn.delete(before[-1], db=db)
            txn._txn.put(index.NEXT_SEQ, index._SEQ.pack(nxt + 1), db=db)
    with repo.index.read() as txn:
        expect = [n for _, n, _ in txn.registered_packs()]
        assert txn._view().names == expect != before


def test_a_commit_builds_on_its_view_without_scanning_the_multi_pack_indexes_on_disk(repo, monkeypatch):
    # each scan reads every multi-pack index's names and looks for their packs: per commit, that
    # cost every registered pack (50 ms a commit at 3000 packs)
    for i in range(12):
        repo.commit(_state(i), f"s{i}")
    scans, real = [], packindex._on_disk
    monkeypatch.setattr(packindex, "_on_disk", lambda folder, names: scans.append(len(names)) or real(folder, names))
    ids = [repo.commit(_state(100 + i), f"t{i}").id for i in range(3)]
    assert scans == []
    located, _, _, view = _read(repo)  # a new process's view: from the files on disk
    assert len(scans) == 1 and set(view.names) == _pack_names(repo)
    for i, cid in enumerate(ids):
        assert torch.equal(repo.load(cid)["w"], _state(100 + i)["w"])


def test_the_views_stay_mapped_through_weakrefs_exit_pass(tmp_path):
    # a Checkpointer registers its close at exit; where weakref's own exit pass (which calls every
    # finalizer still pending) runs before it, an unmapping finalizer would leave the close reading
    # freed pages: that pass is run here first, as such an order would, then the index is read
    script = (
        "import sys, weakref, torch, mvc\n"
        "repo = mvc.Repository.init(sys.argv[1], chunk_size=64)\n"
        "for i in range(12):\n"
        "    repo.commit({'w': torch.full((64,), float(i))}, f'c{i}')\n"
        "with repo.index.read() as txn:\n"
        "    before = [b.ids.tobytes() for b in txn.chunk_batches()]\n"
        "weakref.finalize._exitfunc()\n"
        "with repo.index.read() as txn:\n"
        "    after = [b.ids.tobytes() for b in txn.chunk_batches()]\n"
        "print(after == before, flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "r")], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr[-2000:]
