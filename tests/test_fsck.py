"""fsck and the chunk index rebuild: every kind of damage, named in user terms."""

import json
import os

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc import fsck as F
from mvc.cli import main
from mvc.objects import CommitObject
from mvc.store.packs import RECORD_HEAD, Location, PackWriter, pack_filename

from damage import flip_bit, flipped, pack_files, truncate


def _state(seed=0, w_shift=0.0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 8, generator=g) + w_shift  # 128 bytes: 2 chunks of 64
    b = torch.randn(8, generator=g)  # 32 bytes: 1 chunk
    return {"model": {"w": w, "b": b}, "step": 1}


@pytest.fixture
def two(repo):
    """main: c1 (tagged v1) <- c2; c2 changes model.w and keeps model.b."""
    c1 = repo.commit(_state(), "one")
    repo.create_tag("v1", c1.id)
    c2 = repo.commit(_state(w_shift=1.0), "two")
    return repo, c1.id, c2.id


def _chunk(repo, rev, key, i=0):
    """(chunk id, pack path, Location) of the i-th chunk of tensor ``key`` at ``rev``."""
    entry = next(e for e in repo.entries(rev) if e.key == key)
    cid = entry.chunks[i]
    with repo.index.read() as txn:
        loc = txn.chunk(cid)
    return cid, repo.dir / "packs" / pack_filename(loc.pack), loc


def _only(report, kind):
    assert not report.ok
    assert [d.kind for d in report.damage] == [kind], report.damage
    return report.damage[0]


def _put_raw(repo, kind, key, data):
    with repo.index.write() as txn:
        txn.delete(kind, key)
        txn.put(kind, key, data)


def test_clean_repository(two):
    repo, c1, c2 = two
    report = repo.fsck()
    assert report.ok and report.damage == () and report.unreferenced == ()
    assert (report.commits, report.trees, report.tensors, report.packs) == (2, 2, 3, 2)
    assert report.chunks == 5  # w twice (2 chunks each) and b once
    assert report.bytes_verified == 2 * 128 + 32
    quick = repo.fsck(quick=True)
    assert quick.ok and quick.quick and quick.bytes_verified == 0 and quick.chunks == 5


def test_flipped_data_bit_names_chunk_tensor_commits_refs(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c2, "model.b")  # shared by both commits
    with flipped(path, loc.offset + 5, 3):
        d = _only(repo.fsck(threads=2), F.CHECKSUM)
        assert d.object == f"chunk {cid.hex()[:12]}" and d.chunks == (cid.hex(),)
        assert d.tensors == ("model.b",)
        assert d.commits == tuple(sorted([c1, c2]))
        assert d.refs == ("HEAD", "heads/main", "tags/v1")
        assert repo.fsck(quick=True).ok  # quick does not read chunk data
    assert repo.fsck().ok


def test_damage_in_old_commit_only_names_it(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c1, "model.w", 1)
    with flipped(path, loc.offset + loc.length - 1, 7):
        d = _only(repo.fsck(), F.CHECKSUM)
        assert d.tensors == ("model.w",) and d.commits == (c1,)
        assert d.refs == ("HEAD", "heads/main", "tags/v1")  # main reaches c1 through its parent


@pytest.mark.parametrize("where", [0, 31, 32, 35])  # id bytes, then length bytes
def test_flipped_record_header(two, where):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c2, "model.w")
    with flipped(path, loc.offset - RECORD_HEAD.size + where):
        d = _only(repo.fsck(), F.BAD_RECORD)
        assert d.chunks == (cid.hex(),) and d.commits == (c2,)
        assert repo.load(c2)["model"]["w"].shape == (4, 8)  # the data itself is intact


def test_damaged_trailer_is_found_even_quick(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c2, "model.w")
    size = path.stat().st_size
    for offset in (size - 1, size - 48, size - 60, 3):  # seal, footer digest, trailer, pack header
        with flipped(path, offset):
            for quick in (False, True):
                d = _only(repo.fsck(quick=quick), F.DAMAGED_PACK)
                assert d.object == f"pack {path.name}" and len(d.chunks) == 2
                assert d.tensors == ("model.w",) and d.commits == (c2,)


def test_truncated_pack(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c1, "model.b")
    truncate(path, loc.offset + 10)
    d = _only(repo.fsck(), F.DAMAGED_PACK)
    assert "truncated" in d.detail or "not sealed" in d.detail
    assert set(d.tensors) == {"model.w", "model.b"} and d.commits == tuple(sorted([c1, c2]))


def test_missing_pack(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c2, "model.w")
    os.unlink(path)
    d = _only(repo.fsck(), F.MISSING_PACK)
    assert path.name in d.object and len(d.chunks) == 2 and d.commits == (c2,)
    assert d.refs == ("HEAD", "heads/main")


def test_chunk_missing_from_index(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c2, "model.w", 1)
    with repo.index.write() as txn:
        txn.delete_chunk(cid)
    report = repo.fsck()
    d = _only(report, F.MISSING_CHUNK)
    assert d.chunks == (cid.hex(),) and d.tensors == ("model.w",) and d.commits == (c2,)
    assert [(u.kind, u.pack, u.records) for u in report.unreferenced] == [(F.UNUSED_RECORDS, path.name, 1)]


def test_index_entry_pointing_elsewhere(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c2, "model.w", 1)
    with repo.index.write() as txn:
        txn.put_chunk(cid, Location(loc.pack, loc.offset - 64 - RECORD_HEAD.size, loc.length), overwrite=True)
    assert _only(repo.fsck(), F.NOT_IN_PACK).chunks == (cid.hex(),)
    with repo.index.write() as txn:
        txn.put_chunk(cid, Location(loc.pack, loc.offset, loc.length + 1), overwrite=True)
    assert "needs 64" in _only(repo.fsck(), F.BAD_INDEX_ENTRY).detail
    _put_raw(repo, "chunks", cid, b"not a location")
    assert _only(repo.fsck(), F.BAD_INDEX_ENTRY).tensors == ("model.w",)


def test_missing_parent_commit(two):
    repo, c1, c2 = two
    with repo.index.write() as txn:
        txn.delete("commits", bytes.fromhex(c1))
    report = repo.fsck()
    d = _only(report, F.MISSING_COMMIT)
    assert d.object == f"commit {c1[:12]}" and d.commits == (c1,)
    assert d.refs == ("HEAD", "heads/main", "tags/v1")
    assert report.commits == 1


@pytest.mark.parametrize("kind, missing, corrupt", [
    ("commits", F.MISSING_COMMIT, F.CORRUPT_COMMIT),
    ("trees", F.MISSING_TREE, F.CORRUPT_TREE),
    ("tensors", F.MISSING_TENSOR, F.CORRUPT_TENSOR),
])
def test_missing_and_corrupt_objects(two, kind, missing, corrupt):
    repo, c1, c2 = two
    commit = repo.get_commit(c2)
    oid = {"commits": bytes.fromhex(c2), "trees": bytes.fromhex(commit.tree),
           "tensors": bytes.fromhex(next(e for e in repo.entries(c2) if e.key == "model.w").tensor_id)}[kind]
    with repo.index.read() as txn:
        good = txn.get(kind, oid)
    _put_raw(repo, kind, oid, b"\xc1 not msgpack")
    d = _only(repo.fsck(), corrupt)
    assert d.object.endswith(oid.hex()[:12]) and "decode" in d.detail and d.commits == (c2,)
    assert d.refs == ("HEAD", "heads/main")
    if kind == "tensors":
        assert d.tensors == ("model.w",)
    # a valid encoding of something else under this id: it no longer hashes to its id
    other = {"commits": CommitObject(bytes.fromhex(commit.tree), (), "forged", "x", 0).encode()}.get(kind)
    with repo.index.read() as txn:
        other = other or txn.get(kind, bytes.fromhex(repo.get_commit(c1).tree) if kind == "trees" else
                                 bytes.fromhex(next(e for e in repo.entries(c1) if e.key == "model.w").tensor_id))
    _put_raw(repo, kind, oid, other)
    assert "hash to its id" in _only(repo.fsck(), corrupt).detail
    with repo.index.write() as txn:
        txn.delete(kind, oid)
    assert _only(repo.fsck(), missing).commits == (c2,)
    _put_raw(repo, kind, oid, good)
    assert repo.fsck().ok


def test_commit_reachable_only_from_reflog(two):
    repo, c1, c2 = two
    repo.create_branch("main", c1, force=True)  # c2 is now only in the reflogs of main and HEAD (which is on main)
    cid, path, loc = _chunk(repo, c2, "model.w")
    with flipped(path, loc.offset):
        report = repo.fsck()
        d = _only(report, F.CHECKSUM)
        assert d.commits == (c2,) and d.refs == ("reflog:HEAD", "reflog:heads/main")
        assert report.commits == 2


def test_damaged_ref_and_reflog_entry(two):
    repo, c1, c2 = two
    with repo.index.write() as txn:
        txn.put("refs", b"heads/broken", b"\x07junk")
        txn.put("reflog", b"heads/main\x00" + (99).to_bytes(8, "big"), b"\xc1")
        txn.put("reflog", b"heads/main\x00" + (100).to_bytes(8, "big"), b"\x81\xa3new\x01")
    report = repo.fsck()
    kinds = sorted(d.kind for d in report.damage)
    assert kinds == [F.CORRUPT_REF, F.CORRUPT_REFLOG, F.CORRUPT_REFLOG]
    ref = next(d for d in report.damage if d.kind == F.CORRUPT_REF)
    assert ref.object == "ref heads/broken" and ref.refs == ("heads/broken",)
    assert report.commits == 2  # the rest was still checked


def _drop_branch(repo, name):
    repo.delete_branch(name, force=True)
    with repo.index.write() as txn:
        for ref, seq, _ in list(txn.reflog("heads/" + name)):
            txn.delete_reflog(ref, seq)


def test_unreferenced_bytes_are_harmless(two):
    repo, c1, c2 = two
    crashed = PackWriter(repo.dir / "packs")  # a writer that died before sealing
    crashed.add(b"\x01" * 32, b"lost bytes")
    os.close(crashed.fd)
    orphan = PackWriter(repo.dir / "packs")  # sealed, but its commit never reached the index
    orphan.add(b"\x02" * 32, b"x" * 100)
    orphan_path = orphan.seal()
    repo.commit(_state(seed=5), "gone", branch="scratch")
    scratch = set(pack_files(repo)) - {orphan_path} - {_chunk(repo, c, "model.w")[1] for c in (c1, c2)}
    _drop_branch(repo, "scratch")
    report = repo.fsck()
    assert report.ok, report.damage
    kinds = {u.kind: u for u in report.unreferenced}
    assert set(kinds) == {F.TMP_PACK, F.UNINDEXED_PACK, F.UNUSED_PACK}
    assert kinds[F.TMP_PACK].bytes == crashed.tmp_path.stat().st_size
    assert kinds[F.UNINDEXED_PACK].pack == orphan_path.name and kinds[F.UNINDEXED_PACK].records == 1
    assert kinds[F.UNUSED_PACK].pack == scratch.pop().name and kinds[F.UNUSED_PACK].records == 3
    assert report.unreferenced_bytes == sum(u.bytes for u in report.unreferenced)
    truncate(orphan_path, 20)  # a damaged pack nothing reachable lives in is harmless too
    report = repo.fsck()
    assert report.ok and F.UNREACHABLE_DAMAGED_PACK in {u.kind for u in report.unreferenced}


def test_unused_records_in_a_used_pack(repo):
    a, b = torch.arange(16.0), torch.arange(32.0) + 100  # 1 and 2 chunks
    repo.commit({"a": a, "b": b}, "both", branch="x")
    c = repo.commit({"a": a}, "only a")  # reuses a's record in x's pack
    _drop_branch(repo, "x")
    report = repo.fsck()
    assert report.ok
    (u,) = report.unreferenced
    assert u.kind == F.UNUSED_RECORDS and u.records == 2 and u.bytes == 2 * (64 + RECORD_HEAD.size)
    assert torch.equal(repo.load(c.id)["a"], a)


# -- rebuild ------------------------------------------------------------------

def _all_states(repo):
    return {c.id: repo.load(c.id) for c in repo.log()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        for key in ("w", "b"):
            x, y = a[k]["model"][key], b[k]["model"][key]
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


def test_rebuild_index_after_dropping_it(two):
    repo, c1, c2 = two
    before = _all_states(repo)
    with repo.index.write() as txn:
        txn.drop_chunks()
    with pytest.raises(mvc.ObjectNotFound) as err:
        repo.load(c2)
    with repo.index.read() as txn:
        assert err.value.id is not None and txn.chunk(bytes.fromhex(err.value.id)) is None  # a chunk the index lost
    dropped = repo.fsck()
    assert {d.kind for d in dropped.damage} == {F.MISSING_CHUNK}
    assert {u.kind for u in dropped.unreferenced} == {F.UNINDEXED_PACK}
    rebuilt = mvc.fsck.rebuild_index(repo)
    assert (rebuilt.packs, rebuilt.chunks, rebuilt.duplicates, rebuilt.dropped, rebuilt.skipped) == (2, 5, 0, 0, ())
    _assert_same(before, _all_states(repo))
    assert repo.fsck().ok and repo.fsck().unreferenced == ()


def test_rebuild_index_repairs_bad_entries_and_counts_duplicates(two):
    repo, c1, c2 = two
    before = _all_states(repo)
    cid, path, loc = _chunk(repo, c2, "model.b")
    copy = PackWriter(repo.dir / "packs")  # a second record of the same chunk
    copy.add(cid, mvc.reader.read_chunk(repo, cid))
    copy.seal()
    _put_raw(repo, "chunks", cid, b"garbage")
    rebuilt = mvc.fsck.rebuild_index(repo)
    assert (rebuilt.packs, rebuilt.chunks, rebuilt.duplicates, rebuilt.dropped) == (3, 5, 1, 5)
    _assert_same(before, _all_states(repo))
    report = repo.fsck()
    # the copy is either unused (the original won) or won, leaving the original record unused
    assert report.ok and [u.kind for u in report.unreferenced] in ([F.UNINDEXED_PACK], [F.UNUSED_RECORDS])


def test_rebuild_index_salvages_verified_records_of_a_pack_with_a_damaged_trailer(two):
    repo, c1, c2 = two
    before = _all_states(repo)
    cid, path, loc = _chunk(repo, c2, "model.w")
    truncate(path, path.stat().st_size - 10)  # the trailer is lost, every record is intact
    assert not repo.fsck().ok
    rebuilt = mvc.fsck.rebuild_index(repo)
    assert [name for name, _ in rebuilt.skipped] == [path.name] and rebuilt.salvaged > 0
    _assert_same(before, _all_states(repo))
    report = repo.fsck()
    assert report.ok  # the damaged pack holds nothing the index names any more
    assert path.name in {u.pack for u in report.unreferenced}


def test_rebuild_index_salvages_only_records_that_verify(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c2, "model.w")
    flip_bit(path, path.stat().st_size - 1)  # the seal is gone
    flip_bit(path, loc.offset)  # and the first record of model.w no longer hashes to its id
    rebuilt = mvc.fsck.rebuild_index(repo)
    assert [name for name, _ in rebuilt.skipped] == [path.name]
    report = repo.fsck()
    assert {d.kind for d in report.damage} == {F.MISSING_CHUNK}
    assert {d.tensors for d in report.damage} == {("model.w",)}
    assert torch.equal(repo.load(c1)["model"]["w"], _state()["model"]["w"])


# -- command line -------------------------------------------------------------

def _cli(repo, *args, code=0):
    result = CliRunner().invoke(main, ["-C", str(repo.root), "fsck", *args], catch_exceptions=False)
    assert result.exit_code == code, (result.output, result.stderr)
    return result


def test_cli_clean_and_quick(two):
    repo, c1, c2 = two
    out = _cli(repo).stdout
    assert "checked 2 commits, 2 trees, 3 tensors, 5 chunks in 2 packs" in out and "ok: no damage" in out
    assert "not re-hashed" in _cli(repo, "--quick").stdout


def test_cli_reports_damage_and_harmless_bytes_separately(two):
    repo, c1, c2 = two
    cid, path, loc = _chunk(repo, c2, "model.b")
    os.close(PackWriter(repo.dir / "packs").fd)  # an empty crash leftover
    flip_bit(path, loc.offset)
    out = _cli(repo, code=1).stdout
    assert f"checksum-mismatch: chunk {cid.hex()[:12]}" in out
    assert "tensors: model.b" in out and c1[:12] in out and c2[:12] in out
    assert "refs: HEAD, heads/main, tags/v1" in out
    assert "unreferenced pack bytes (harmless" in out and "tmp-pack" in out
    assert "fsck found damage" in out
    _cli(repo, "--quick")  # structure is fine: exit 0
    report = json.loads(_cli(repo, "--json", code=1).stdout)
    assert report["ok"] is False and report["damage"][0]["kind"] == "checksum-mismatch"
    assert report["damage"][0]["chunks"] == [cid.hex()] and report["unreferenced"][0]["kind"] == "tmp-pack"


def test_cli_rebuild_index(two):
    repo, c1, c2 = two
    with repo.index.write() as txn:
        txn.drop_chunks()
    assert "missing-chunk" in _cli(repo, code=1).stdout
    out = _cli(repo, "--rebuild-index").stdout
    assert "rebuilt the chunk index from 2 packs: 5 chunks (was 0" in out and "ok: no damage" in out
    assert json.loads(_cli(repo, "--rebuild-index", "--json").stdout)["rebuild"]["chunks"] == 5
    assert torch.equal(repo.load(c2)["model"]["b"], _state()["model"]["b"])


def test_damaged_pruned_note_is_reported(two):
    repo, c1, c2 = two
    with repo.index.write() as txn:
        txn.put("pruned", bytes.fromhex(c1), b"\xc1")
    d = _only(repo.fsck(), F.CORRUPT_COMMIT)
    assert d.object == f"commit {c1[:12]}" and "pruned note" in d.detail
