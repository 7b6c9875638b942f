"""Remotes users can live with for years: the last good copy is never dropped, fsck says what it
verified, a damaged remote is healed, no server is trusted blindly.

Damage is real: flipped bytes written to the S3 server (``s3`` fixture,
tests/s3server.py), deleted and zero-byte objects. Small states and a
1 KiB chunk size keep each test to a few seconds.
"""

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc.cli import main
from mvc.remote import config, layout

CHUNK = 1024


def state(seed: int, n: int = 16 * 1024) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g), "b": torch.arange(256, dtype=torch.int64), "step": seed}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


def cli(repo_dir, *args):
    return CliRunner().invoke(main, ["-C", str(repo_dir), *map(str, args)])


@pytest.fixture
def pushed(tmp_path, s3):
    """(repository with two commits on main pushed to S3 remote origin, its URL)."""
    url = s3.url()
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=CHUNK)
    repo.commit(state(0), "first")
    repo.commit(state(1), "second")
    repo.remote_add("origin", url, s3.endpoint)
    repo.push()
    yield repo, url
    repo.close()


def chunk_packs(s3, url) -> list:
    return [key for key, _ in s3.keys(url, layout.CHUNK_PACKS)]


def records(s3, url, key) -> list:
    """(id, offset, length) of remote pack ``key``'s records, from its trailer."""
    data = s3.get(url, key)
    start, stop = layout.trailer_span(data[-layout.FOOTER.size:], len(data), key)
    return layout.parse_trailer(data[start:stop], data[-layout.FOOTER.size:], len(data), key)


def flip_chunk(s3, url, cid: bytes) -> str:
    """Flip a bit inside chunk ``cid``'s record on the remote; the pack's key."""
    for key in chunk_packs(s3, url):
        for rid, offset, length in records(s3, url, key):
            if rid == cid:
                s3.flip(url, key, offset + length // 2)
                return key
    raise AssertionError("no remote pack holds that chunk")


def only_in(repo, rev: str, other: str) -> list:
    """Chunk ids ``rev`` uses that ``other`` does not."""
    return sorted(_chunks(repo, rev) - _chunks(repo, other))


def _chunks(repo, rev) -> set:
    from mvc.remote.tiers import commit_chunks
    with repo.index.read() as txn:
        return commit_chunks(repo, txn, {bytes.fromhex(repo.resolve(rev))})


# -- 1. verify before you drop ---------------------------------------------------------

def test_evict_keeps_the_local_copy_when_the_remote_copy_is_damaged(pushed, tmp_path, s3):
    repo, url = pushed
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=s3.endpoint)
    try:
        assert same(lazy.load("main~1"), state(0)) and same(lazy.load("main"), state(1))  # now local
        lazy.checkout("main~1")  # HEAD pins main~1; main's chunks are evictable
        key = flip_chunk(s3, url, only_in(lazy, "main", "main~1")[0])
        report = lazy.evict(0)
        assert report.kept_unverified >= 1
        assert all(k == key for _, k, _ in report.unverified) and "BLAKE3" in report.unverified[0][2]
        assert same(lazy.load("main"), state(1))  # the local record was kept: the last good copy
        result = cli(tmp_path / "lz", "cache", "evict", "--max-bytes", "0")
        assert result.exit_code == 0 and "not intact" in result.output and key in result.output
    finally:
        lazy.close()


def test_fsck_of_a_lazy_clone_says_what_it_did_not_verify(pushed, tmp_path, s3):
    repo, url = pushed
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=s3.endpoint)
    report = lazy.fsck()
    assert report.ok and not report.verified and report.unverified == report.chunks
    assert report.unverified_remote == "origin"
    with lazy.index.write() as txn:  # the server goes away: a port nobody listens on
        info = config.get(txn, "origin")
        config.put(txn, config.RemoteInfo("origin", info.url, "http://127.0.0.1:9", True))
    lazy.close()
    result = cli(tmp_path / "lz", "fsck")
    assert result.exit_code == 1 and "ok:" not in result.output
    assert "not verified here" in result.output and "fsck --remote origin" in result.output
    result = cli(tmp_path / "lz", "fsck", "--fetch")
    assert result.exit_code == 1 and "ok:" not in result.output and "cannot reach" in result.output
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        with lazy.index.write() as txn:
            config.put(txn, config.RemoteInfo("origin", info.url, s3.endpoint, True))
    result = cli(tmp_path / "lz", "fsck", "--fetch")
    assert result.exit_code == 0 and "ok: no damage found" in result.output, result.output
    s3.flip(url, chunk_packs(s3, url)[0], len(b"MVCPACK\x01") + 36 + 5)
    result = cli(tmp_path / "lz", "fsck", "--fetch")
    assert result.exit_code == 1 and "checksum-mismatch" in result.output


# -- 2. a damaged remote can be healed -------------------------------------------------

def test_repair_heals_a_deleted_and_a_zero_byte_pack(pushed, tmp_path, s3):
    repo, url = pushed
    biggest = max(s3.keys(url, layout.CHUNK_PACKS), key=lambda k: k[1])[0]
    s3.delete(url, biggest)
    zero = layout.pack_key(layout.CHUNK_PACKS, layout.new_name())
    s3.put(url, zero, b"")
    assert not repo.fsck_remote().ok
    fresh = mvc.Repository.init(tmp_path / "f", chunk_size=CHUNK)
    fresh.remote_add("origin", url, s3.endpoint)
    with pytest.raises(mvc.CorruptObject):
        fresh.fetch()
    assert repo.push().chunks == 0  # a push alone does not see the damage
    result = cli(tmp_path / "a", "remote", "repair", "origin")
    assert result.exit_code == 0, result.output
    assert zero in result.output and "ok:" in result.output
    assert zero not in [k for k, _ in s3.keys(url, layout.CHUNK_PACKS)]
    report = repo.fsck_remote()
    assert report.ok, report.problems
    fresh.fetch()
    assert same(fresh.load("origin/main"), state(1)) and fresh.fsck().verified
    fresh.close()
    again = repo.remote_repair()
    assert again.chunks_uploaded == 0 and again.packs_removed == () and again.ok


def test_repair_moves_intact_records_out_of_a_damaged_pack(pushed, tmp_path, s3):
    repo, url = pushed
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=s3.endpoint)
    cid = only_in(repo, "main", "main~1")[0]
    key = flip_chunk(s3, url, cid)
    report = lazy.remote_repair()  # holds no chunk: moves the intact records, cannot heal the flipped one
    assert report.unrepaired == (cid.hex(),) and report.packs_removed == () and not report.ok
    report = repo.remote_repair()
    assert report.ok and report.packs_removed == (key,) and report.chunks_uploaded >= 1
    assert repo.fsck_remote().ok
    lazy.fetch()  # learns that the damaged pack is gone and where its records went
    assert same(lazy.load("main"), state(1))
    lazy.close()


def test_fetch_in_a_lazy_clone_notices_a_deleted_remote_pack(pushed, tmp_path, s3):
    repo, url = pushed
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=s3.endpoint)
    lazy.close()
    for key, _ in s3.keys(url, layout.CHUNK_PACKS):
        s3.delete(url, key)
    result = cli(tmp_path / "lz", "fetch")
    assert result.exit_code == 1 and "missing on remote 'origin'" in result.output
    assert "mvc remote repair origin" in result.output
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        with pytest.raises(mvc.errors.RemoteDamaged) as caught:
            lazy.fetch()
        assert caught.value.remote == "origin" and len(caught.value.ids) == len(_chunks(repo, "main") | _chunks(repo, "main~1"))
    repo.remote_repair()
    assert cli(tmp_path / "lz", "fetch").exit_code == 0
