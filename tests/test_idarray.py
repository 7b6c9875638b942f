"""Id arrays and the id-ordered pass over the chunk index that fsck and gc merge with the live ids."""

import os

import numpy as np
import pytest
import torch

import mvc
from mvc.store import idarray
from mvc.store import index as index_module
from mvc.store.packs import Location, encode_location

# ids that a careless numpy read would cut short or mis-order: NULs at the end, in the middle, all NUL
AWKWARD = [b"\x00" * 32, b"\x00" * 31 + b"\x01", b"\x01" + b"\x00" * 31, b"ab" + b"\x00" * 30,
           b"ab\x00c" + b"\x00" * 28, b"\xff" * 32]


def test_ids_keep_every_byte_and_sort_as_bytes():
    ids = AWKWARD + [os.urandom(32) for _ in range(50)]
    arr = idarray.pack(ids)
    assert idarray.ids(arr) == ids
    assert [idarray.one(arr, i) for i in range(len(ids))] == ids
    unique, first = idarray.unique(idarray.pack(ids + ids[:7]))
    assert idarray.ids(unique) == sorted(set(ids))  # LMDB's key order is bytes order
    assert first.tolist() == [ids.index(c) for c in sorted(set(ids))]  # the first occurrence


def test_find_says_where_or_minus_one():
    live = np.sort(idarray.pack(AWKWARD))
    absent = [b"\x00" * 30 + b"\x00\x02", b"ab" + b"\x00" * 29 + b"\x01", os.urandom(32)]
    pos = idarray.find(live, idarray.pack(AWKWARD + absent))
    assert pos[:len(AWKWARD)].tolist() == [sorted(AWKWARD).index(c) for c in AWKWARD]
    assert pos[len(AWKWARD):].tolist() == [-1, -1, -1]
    assert idarray.find(idarray.pack([]), idarray.pack(AWKWARD)).tolist() == [-1] * len(AWKWARD)
    assert idarray.contains(live, b"short") == -1 and idarray.contains(live, AWKWARD[0]) >= 0
    with pytest.raises(ValueError):
        idarray.pack([b"short"])


def _fill(repo, entries: dict, extra_keys=()):
    with repo.index.write() as txn:
        for cid, raw in entries.items():
            txn._txn.put(cid, raw, db=txn._dbs["chunks"])
        for key in extra_keys:
            txn._txn.put(key, encode_location(Location(b"p" * 16, 40, 64)), db=txn._dbs["chunks"])


@pytest.mark.parametrize("batch", [1, 3, 1000])
def test_chunk_batches_cover_the_table_in_order(repo, batch):
    """Raw, encoded and damaged values and a key that is no id, in one batch or many."""
    raw = {os.urandom(32): encode_location(Location(os.urandom(16), 40 + i, 64)) for i in range(7)}
    base = os.urandom(32)
    delta, damaged = os.urandom(32), AWKWARD[3]
    raw[delta] = encode_location(Location(b"d" * 16, 100, 30, 2, 64, 1, base))
    raw[damaged] = b"\x01\x02"
    _fill(repo, raw, extra_keys=[b"not an id"])
    with repo.index.read() as txn:
        batches = list(txn.chunk_batches(batch))
    ids = [cid for b in batches for cid in idarray.ids(b.ids)]
    assert ids == sorted(raw)
    assert all(len(b.ids) <= batch for b in batches)
    seen = {}
    for b in batches:
        for i, cid in enumerate(idarray.ids(b.ids)):
            seen[cid] = (index_module.location_row(b.locs, i, b.bases.get(i)), b.bad.get(i))
    assert seen[delta][0] == Location(b"d" * 16, 100, 30, 2, 64, 1, base)
    assert seen[damaged][1] and seen[damaged][0].length == 0
    for cid, value in raw.items():
        if cid not in (delta, damaged):
            assert seen[cid] == (index_module.decode_location(value), None)


@pytest.mark.parametrize("lo,hi", [(b"", None), (b"\x40", b"\xc0"), (b"\x80", None), (b"", b"\x10"),
                                   (b"\xff\xff", None)])
def test_chunk_batches_take_a_slice_of_the_id_space(repo, lo, hi):
    entries = {os.urandom(32): encode_location(Location(os.urandom(16), 40, 64)) for _ in range(200)}
    _fill(repo, entries)
    with repo.index.read() as txn:
        ids = [cid for b in txn.chunk_batches(7, lo=lo, hi=hi) for cid in idarray.ids(b.ids)]
    assert ids == sorted(cid for cid in entries if cid >= lo and (hi is None or cid < hi))


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(index_module, "SCAN_BATCH", 2)  # every pass over the index in many batches


def _commits(repo, n=3):
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        repo.commit({"w": torch.randn(40, generator=g), "b": torch.randn(3, generator=g)}, f"c{i}")


def test_fsck_and_gc_see_missing_and_extra_entries_across_batches(repo, small_batches):
    _commits(repo)
    assert repo.fsck(quick=True).ok and repo.fsck().ok
    entry = next(e for e in repo.entries("HEAD") if e.key == "w")
    gone = entry.chunks[2]
    with repo.index.write() as txn:
        loc = txn.chunk(gone)
        txn.delete_chunk(gone)
        extra = [b"\x00" * 32, AWKWARD[3], b"\xff" * 32]  # sort first, inside, last
        for cid in extra:
            txn.put_chunk(cid, loc)
    report = repo.fsck(quick=True)
    assert [(d.kind, d.chunks) for d in report.damage] == [("missing-chunk", (gone.hex(),))]
    assert "w" in report.damage[0].tensors
    with pytest.raises(mvc.CorruptObject) as info:
        repo.gc(dry_run=True)
    assert info.value.id == gone.hex()
    with repo.index.write() as txn:
        txn.put_chunk(gone, loc)
    assert repo.fsck(quick=True).ok  # the extra entries are garbage, not damage
    assert repo.gc(dry_run=True).chunks_removed == 3
    assert repo.gc().chunks_removed == 3
    with repo.index.read() as txn:
        assert all(txn.chunk(cid) is None for cid in extra) and txn.chunk(gone) is not None
    assert repo.fsck().ok and repo.gc(dry_run=True).chunks_removed == 0
    g = torch.Generator().manual_seed(0)  # HEAD holds what _commits drew last, every chunk verified
    want = [(torch.randn(40, generator=g), torch.randn(3, generator=g)) for _ in range(3)][-1][0]
    assert torch.equal(repo.load("HEAD")["w"], want)


def test_fsck_names_wrong_length_and_damaged_entries_across_batches(repo, small_batches):
    _commits(repo, 2)
    chunks = next(e for e in repo.entries("HEAD") if e.key == "w").chunks
    with repo.index.write() as txn:
        loc = txn.chunk(chunks[0])
        txn.put_chunk(chunks[0], Location(loc.pack, loc.offset, loc.length - 1), overwrite=True)
        txn._txn.put(chunks[1], b"\x00" * 5, db=txn._dbs["chunks"])
    report = repo.fsck(quick=True)
    found = sorted((d.kind, d.chunks[0]) for d in report.damage)
    assert found == sorted([("bad-index-entry", chunks[0].hex()), ("bad-index-entry", chunks[1].hex())])
    with pytest.raises(mvc.CorruptObject):
        repo.gc()
