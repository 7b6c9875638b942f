"""Pack indexes (the prototype of issue 35's chunk index): exact bytes, lookups proven against
the packs' trailers, merges in slices equal to a whole write, damage detected."""

import os
import struct

import numpy as np
import pytest
import torch

import mvc
from mvc import hashing
from mvc.errors import CorruptObject
from mvc.store import idarray, packindex
from mvc.store.packs import PACK_NAME, read_trailer_table


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


class _CountedNames(list):
    """A view's pack names that count how often they are read through."""

    reads = 0

    def __iter__(self):
        type(self).reads += 1
        return super().__iter__()


def test_a_commit_reads_the_last_views_pack_names_a_few_times_not_once_per_pack(tmp_path):
    # each commit builds the new registered set from the last one; reading the last one's names
    # once per pack made a commit cost the square of the packs (10^4 commits: 40 ms each)
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
        ids.append(repo.commit({"w": torch.randn(40, generator=g)}, "one more").id)
        assert packindex._VIEWS[key] is not last  # the new pack made a new view, from the last one
        assert 1 <= _CountedNames.reads <= 3
        for cid, state in zip(ids, states):
            assert torch.equal(repo.load(cid)["w"], state["w"])
    finally:
        repo.close()
