"""Pack indexes as the chunk index (docs/format.md 5.9, extension ``pack-indexes``): the exact
bytes of a pack index, what a commit writes, the chunks table's overrides and tombstones, packs
leaving the index before their files go, and repositories older than the extension."""

import os
import struct

import blake3
import numpy as np
import pytest
import torch

import mvc
from mvc import ondisk
from mvc.errors import UnsupportedFormat
from mvc.fsck import rebuild_index
from mvc.store import idarray, packindex
from mvc.store.index import TOMBSTONE
from mvc.store.packs import PACK_NAME, Location, encode_location, read_locations

CHUNK = 64


def _raw_db(repo, name: str) -> list:
    """(key, value) of LMDB database ``name`` as stored (no mvc decoding)."""
    with repo.index.read() as txn:
        return [(bytes(k), bytes(v)) for k, v in txn._txn.cursor(db=txn._dbs[name])]


def _packs(repo) -> list:
    return sorted(p for p in (repo.dir / "packs").iterdir() if PACK_NAME.fullmatch(p.name))


def _pidx(repo) -> list:
    return sorted((repo.dir / "packs").glob("*.pidx"))


def _state(seed: int, n: int = 8 * CHUNK) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)}


@pytest.fixture
def repo(tmp_path):
    r = mvc.Repository.init(tmp_path / "r", chunk_size=CHUNK)
    yield r
    r.close()


def test_pack_index_golden_bytes(tmp_path):
    path = tmp_path / "p.pidx"
    packindex.write(path, [bytes([7]) * 16], [idarray.pack([bytes(range(32))])])
    body = (b"MVCPIDX1" + bytes.fromhex("01000000") + bytes.fromhex("0100000000000000") + b"\x10" + bytes(3)
            + bytes([7]) * 16 + bytes.fromhex("0100000000000000") * 256
            + bytes.fromhex("0706050403020100") + bytes.fromhex("0f0e0d0c0b0a0908") + bytes(4) + bytes(4))
    assert path.read_bytes() == body + blake3.blake3(blake3.blake3(body).digest()).digest()


def test_a_commit_registers_its_pack_and_puts_no_entry_per_chunk(repo):
    c = repo.commit(_state(1), "one")
    assert "pack-indexes" in (repo.dir / "FORMAT").read_text().split()
    assert _raw_db(repo, "chunks") == []
    (pack,) = _packs(repo)
    name = bytes.fromhex(PACK_NAME.fullmatch(pack.name).group(1))
    regs = [(k, struct.unpack("<QQ", v)) for k, v in _raw_db(repo, "packidx") if len(k) == 16]
    assert regs == [(name, (0, 8))] and [p.name for p in _pidx(repo)] == [f"pack-{name.hex()}.pidx"]
    with repo.index.read() as txn:
        for cid, loc in read_locations(pack, name):  # the index says what the trailer says
            assert txn.chunk(cid) == loc
        assert sorted(cid for cid, _ in txn.chunks()) == sorted(cid for cid, _ in read_locations(pack, name))
    assert torch.equal(repo.load(c.id)["w"], _state(1)["w"])


def test_tombstones_and_overrides_keep_the_chunk_api(repo):
    repo.commit(_state(2), "one")
    with repo.index.read() as txn:
        (cid, loc), (other, other_loc) = list(txn.chunks())[:2]
    with repo.index.write() as txn:
        txn.delete_chunk(cid)
        assert txn.chunk(cid) is None and cid not in {k for k, _ in txn.chunks()}
        assert cid not in txn.chunks_among([cid, other]) and txn.chunks_among([other]) == {other: other_loc}
        assert txn.put_chunk(cid, loc) and txn.chunk(cid) == loc
        assert not txn.put_chunk(cid, other_loc) and txn.chunk(cid) == loc
        moved = Location(other_loc.pack, other_loc.offset, other_loc.length)
        assert txn.put_chunk(cid, moved, overwrite=True) and txn.chunk(cid) == moved
        assert dict(txn.chunks())[cid] == moved
        txn.delete_chunk(other)
    assert _raw_db(repo, "chunks") == [(min(cid, other), encode_location(moved) if cid < other else TOMBSTONE),
                                       (max(cid, other), TOMBSTONE if cid < other else encode_location(moved))]
    with repo.index.write() as txn:
        txn.put_chunk(cid, loc, overwrite=True)  # what the pack index says: no entry needed
        txn.put_chunk(other, other_loc)
    assert _raw_db(repo, "chunks") == []


def test_the_newest_registered_pack_wins_and_slices_add_up(repo):
    repo.commit(_state(3), "one")
    (first,) = _packs(repo)
    with repo.index.read() as txn:
        before = dict(txn.chunks())
    # a second pack holding the same chunks (as two writers that deduplicated independently)
    batch = repo.chunks.writer()
    with repo.index.read() as txn:
        for cid in before:
            batch.add(cid, repo.chunks.read_one(cid, txn))
    batch.seal()
    with repo.index.write() as txn:
        batch.publish(txn)
    with repo.index.read() as txn:
        after = dict(txn.chunks())
        assert after.keys() == before.keys() and all(loc.pack != before[c].pack for c, loc in after.items())
        whole = [idarray.ids(b.ids) for b in txn.chunk_batches()]
        cut = [idarray.ids(b.ids) for lo, hi in ((b"", b"\x40"), (b"\x40", b"\x80\x01"), (b"\x80\x01", None))
               for b in txn.chunk_batches(batch=3, lo=lo, hi=hi)]
    assert sum(cut, []) == sum(whole, []) == sorted(before)
    assert all(torch.equal(repo.load()["w"], _state(3)["w"]) for _ in range(1))
    assert len(_packs(repo)) == 2 and first.exists()


def test_gc_takes_a_pack_out_of_the_index_before_deleting_it(repo):
    repo.commit(_state(5), "two")
    repo.commit(_state(4), "one", branch="gone", start="main")
    repo.delete_branch("gone", force=True)
    repo.reflog.expire("gone")
    report = repo.gc(grace=0)
    assert report.chunks_removed == 8
    assert len(_packs(repo)) == 1 == len(_pidx(repo)) == len([k for k, _ in _raw_db(repo, "packidx") if len(k) == 16])
    assert _raw_db(repo, "chunks") == []  # the tombstones went with the pack
    assert repo.fsck().ok and torch.equal(repo.load()["w"], _state(5)["w"])


def _make_legacy(repo) -> None:
    """Turn ``repo`` into one an mvc older than pack indexes wrote: an entry per chunk, no
    registrations, no pack index files, FORMAT without the extension."""
    with repo.index.write() as txn:
        entries = list(txn.chunks())
        txn.drop_chunks()
        for cid, loc in entries:
            txn._txn.put(cid, encode_location(loc), db=txn._dbs["chunks"])
    for p in _pidx(repo):
        p.unlink()
    _, ext = ondisk.read_format(repo.dir)
    ondisk.write_format(repo.dir, ext - {ondisk.PACK_INDEXES})


def test_a_repository_older_than_pack_indexes_stays_readable_and_writable(tmp_path):
    root = tmp_path / "old"
    with mvc.Repository.init(root, chunk_size=CHUNK) as r:
        old = r.commit(_state(6), "old")
        _make_legacy(r)
    with mvc.Repository.open(root) as r:
        assert "pack-indexes" not in (r.dir / "FORMAT").read_text().split()
        assert torch.equal(r.load(old.id)["w"], _state(6)["w"]) and r.fsck().ok
        state = _state(6)
        state["w"][:CHUNK] += 1  # one new chunk, seven known through the old entries
        new = r.commit(state, "new")
        assert "pack-indexes" in (r.dir / "FORMAT").read_text().split()
        assert len(_raw_db(r, "chunks")) == 8 and len(_pidx(r)) == 1
        assert torch.equal(r.load(new.id)["w"], state["w"]) and r.fsck().ok
        with r.index.read() as txn:
            assert len(list(txn.chunks())) == 9


def test_an_mvc_without_the_extension_refuses_the_repository(repo, monkeypatch):
    repo.commit(_state(7), "one")
    monkeypatch.setattr(ondisk, "KNOWN_EXTENSIONS", ondisk.KNOWN_EXTENSIONS - {ondisk.PACK_INDEXES})
    with pytest.raises(UnsupportedFormat) as err:
        mvc.Repository.open(repo.root)
    assert list(err.value.extensions) == ["pack-indexes"]


def test_a_chunk_whose_entry_is_a_tombstone_is_written_again_and_indexed(repo):
    repo.commit(_state(8), "one")
    with repo.index.read() as txn:
        cid = next(iter(dict(txn.chunks())))
    with repo.index.write() as txn:
        txn.delete_chunk(cid)
    c = repo.commit(_state(8), "again")
    with repo.index.read() as txn:
        loc = txn.chunk(cid)
    assert loc is not None and os.path.exists(repo.dir / "packs" / f"pack-{loc.pack.hex()}.pack")
    assert _raw_db(repo, "chunks") == [] and torch.equal(repo.load(c.id)["w"], _state(8)["w"])


def test_a_damaged_pack_index_makes_chunks_absent_never_wrong(repo):
    c = repo.commit(_state(9), "one")
    (p,) = _pidx(repo)
    data = bytearray(p.read_bytes())
    n = len(data)
    rows_at = n - 32 - 4 * 8  # the rows column: point every entry at row 0
    data[rows_at:n - 32] = bytes(4 * 8)
    p.write_bytes(bytes(data))
    packindex._VIEWS.clear()
    with repo.index.read() as txn:
        found = txn.chunks_among(list(repo.entries(c.id)[0].chunks))
    assert len(found) == 1  # only the chunk that is at row 0 is proven
    assert not repo.fsck().ok


def test_an_index_rebuilt_from_the_packs_equals_the_one_written(repo):
    for k in range(3):
        repo.commit(_state(20 + k), f"c{k}")
    with repo.index.read() as txn:
        written = dict(txn.chunks())
    report = rebuild_index(repo)
    assert report.chunks == len(written) == 24
    with repo.index.read() as txn:
        assert dict(txn.chunks()) == written
    assert _raw_db(repo, "chunks") == [] and len([k for k, _ in _raw_db(repo, "packidx") if len(k) == 16]) == 3
    assert repo.fsck().ok


def test_a_commit_never_deduplicates_against_a_registered_pack_whose_file_is_gone(repo):
    repo.commit(_state(30), "one")
    (gone,) = _packs(repo)
    os.unlink(gone)  # by hand: its registration and index stay
    ids = list(repo.entries()[0].chunks)
    with repo.index.read() as txn:
        assert not repo.chunks.kept(ids, txn) and {loc.offset for loc in txn.chunks_among(ids).values()} == {0}
    c = repo.commit(_state(30), "again")  # writes every chunk again, and they are found there
    assert torch.equal(repo.load(c.id)["w"], _state(30)["w"])
    with repo.index.read() as txn:
        assert {loc.pack.hex() for loc in txn.chunks_among(ids).values()} == {
            PACK_NAME.fullmatch(p.name).group(1) for p in _packs(repo)}


def test_repack_registers_its_pack_and_puts_no_entry_per_chunk(tmp_path):
    """Repack's re-encoded records are located by its pack's index, as a commit's are: an entry
    per chunk would bring back the B-tree pages pack indexes replaced."""
    repo = mvc.Repository.init(tmp_path / "r4k", chunk_size=4096)  # chunks large enough to encode
    g = torch.Generator().manual_seed(3)
    w = torch.randn(8 * 4096 // 4, generator=g) * 1e-2
    states = [{"w": w + i * 1e-4 * torch.randn(w.shape, generator=g)} for i in range(3)]
    for i, state in enumerate(states):
        repo.commit(state, f"v{i}")
    report = repo.repack()
    assert report.grouped + report.deltas > 0
    assert [k for k, v in _raw_db(repo, "chunks")] == []
    registered = {bytes(k) for k, _ in _raw_db(repo, "packidx") if len(k) == 16}
    assert {bytes.fromhex(p.name[len("pack-"):-len(".pidx")]) for p in _pidx(repo)} == registered
    assert {bytes.fromhex(PACK_NAME.fullmatch(p.name).group(1)) for p in _packs(repo)} == registered
    for i, state in enumerate(states):
        assert torch.equal(repo.load(f"HEAD~{2 - i}")["w"], state["w"])
    assert repo.fsck().ok
    repo.close()


def test_a_multi_pack_index_is_named_by_the_blake3_of_its_pack_names_in_order(tmp_path):
    a, b = bytes([7]) * 16, bytes([8]) * 16
    path = packindex.midx_path(tmp_path, [a, b])
    assert path == tmp_path / f"multi-{blake3.blake3(a + b).digest()[:16].hex()}.midx"
    assert path != packindex.midx_path(tmp_path, [b, a]) and packindex.MIDX_NAME.fullmatch(path.name)
    assert not PACK_NAME.fullmatch(path.name)  # no reader takes it for a pack
