"""Verify on read: a flipped bit in a pack is never returned as data.

Bits are flipped in the real pack files: inside each record's data ``load``
must raise ChecksumMismatch naming the tensor's key path and the commit;
in the metadata around the data (pack header, record headers, trailer,
footer) ``fsck`` must report damage.
"""

import random

import pytest
import torch

import mvc
from damage import flipped, metadata_ranges, records


def _state(shift=0):
    g = torch.Generator().manual_seed(7)
    return {
        "enc": {"w": torch.randn(6, 8, generator=g) + shift, "b": torch.randn(10, generator=g)},
        "emb": torch.arange(5, dtype=torch.int64) * 1000 + shift,
        "mask": torch.rand(100, generator=g) > 0.5,
        "half": torch.randn(50, generator=g).to(torch.bfloat16),
        "step": 3,
    }


@pytest.fixture
def history(repo):
    """Two commits; the second changes enc.w and emb, so packs hold both."""
    c1 = repo.commit(_state(), "one")
    c2 = repo.commit({**_state(), "enc": {**_state()["enc"], "w": _state()["enc"]["w"] + 1},
                      "emb": _state()["emb"] + 1}, "two")
    users = {}  # chunk id -> [(commit id, key path)]
    for c in (c1, c2):
        for e in repo.entries(c.id):
            for cid in e.chunks:
                users.setdefault(cid, []).append((c.id, e.key))
    return repo, users


def _assert_intact(repo, rev, state):
    loaded = repo.load(rev)
    for path in (("enc", "w"), ("enc", "b"), ("emb",), ("mask",), ("half",)):
        a, b = loaded, state
        for k in path:
            a, b = a[k], b[k]
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _positions(length, rng):
    """Byte offsets and bits to flip in a record: both ends, the middle, and random ones."""
    fixed = [(0, 0), (length - 1, 7), (length // 2, 3)]
    return fixed + [(rng.randrange(length), rng.randrange(8)) for _ in range(4)]


def test_flipped_bit_in_any_record_is_refused_by_load(history):
    repo, users = history
    rng = random.Random(1)
    recs = records(repo)
    assert len(recs) == len(users) >= 10
    for path, cid, offset, length in recs:
        for at, bit in _positions(length, rng):
            with flipped(path, offset + at, bit):
                for commit_id, _ in users[cid]:
                    with pytest.raises(mvc.ChecksumMismatch) as err:
                        repo.load(commit_id)
                    message = str(err.value)
                    assert commit_id[:12] in message and cid.hex()[:12] in message
                    assert any(f"tensor {k!r}" in message for c, k in users[cid] if c == commit_id)
    _assert_intact(repo, "HEAD~1", _state())


def test_every_bit_of_one_record(history):
    repo, users = history
    path, cid, offset, length = next(r for r in records(repo) if r[3] == 64)
    (commit_id, key), *_ = users[cid]
    for at in range(length):
        for bit in range(8):
            with flipped(path, offset + at, bit):
                with pytest.raises(mvc.ChecksumMismatch) as err:
                    repo.load(commit_id)
                assert (err.value.id, err.value.what) == (cid.hex(), f"tensor {key!r} in commit {commit_id[:12]}")


def test_read_chunk_refuses_flipped_bit(history):
    repo, users = history
    path, cid, offset, length = records(repo)[0]
    with flipped(path, offset + 1, 1):
        with pytest.raises(mvc.ChecksumMismatch) as err:
            mvc.reader.read_chunk(repo, cid)
        assert err.value.id == cid.hex()


def test_flipped_bit_around_the_data_is_found_by_fsck(history):
    repo, users = history
    pack = sorted({p for p, *_ in records(repo)}, key=lambda p: p.stat().st_size)[0]
    positions = [at for start, end in metadata_ranges(pack) for at in range(start, end)]
    for i, at in enumerate(positions):
        with flipped(pack, at, i % 8):
            report = repo.fsck(threads=1)
            assert not report.ok, f"flipped bit at byte {at} of {pack.name} went unnoticed"
            assert all(d.commits and d.refs for d in report.damage)
    assert repo.fsck().ok


def test_metadata_flip_never_changes_loaded_data(history):
    repo, users = history
    pack = records(repo)[0][0]
    head = repo.resolve("HEAD")
    expected = repo.load(head)
    rng = random.Random(2)
    ranges = metadata_ranges(pack)
    loads = 0
    for _ in range(40):
        start, end = rng.choice(ranges)
        with flipped(pack, rng.randrange(start, end), rng.randrange(8)):
            try:
                loaded = repo.load(head)
            except mvc.MvcError:
                continue
            loads += 1
            for k in ("emb", "mask", "half"):
                assert torch.equal(loaded[k], expected[k])
    assert loads  # load reads records by their index locations, so it never needs the metadata


def test_one_error_with_its_attributes_for_a_local_record(history):
    repo, users = history
    path, cid, offset, length = records(repo)[0]
    commit_id, key = users[cid][0]
    with flipped(path, offset + length // 2, 5):
        with pytest.raises(mvc.HashMismatch) as err:
            repo.load(commit_id)
    e = err.value
    assert isinstance(e, mvc.ChecksumMismatch) and e.id == cid.hex() and e.base is None
    assert f"tensor {key!r}" in e.what and commit_id[:12] in e.what
    assert e.where == f"offset {offset} in {path.name}"


def test_verified_returns_the_bytes_or_raises():
    from mvc import hashing
    from mvc.store.verify import intact, verified
    data = b"some chunk bytes"
    cid = hashing.digest(data)
    assert verified(cid, data, "w", "here") is data and intact(cid, memoryview(data))
    with pytest.raises(mvc.HashMismatch) as err:
        verified(cid, data[:-1] + b"t", "w", "here")
    assert (err.value.id, err.value.what, err.value.where) == (cid.hex(), "w", "here")
    assert not intact(cid, data[1:])


def test_record_fault_judges_a_records_header_then_its_bytes():
    """The one judgement of a raw record read back, shared by the local and the remote pack check."""
    from mvc import hashing
    from mvc.store.packs import RECORD_HEAD
    from mvc.store.verify import BAD_RECORD, CHECKSUM, record_fault
    data = bytes(range(100))
    cid = hashing.digest(data)
    head = RECORD_HEAD.pack(cid, len(data))
    assert record_fault(cid, len(data), head, data) is None
    assert record_fault(cid, len(data), RECORD_HEAD.pack(cid, len(data) + 1), data) == BAD_RECORD
    assert record_fault(cid, len(data), RECORD_HEAD.pack(bytes(32), len(data)), data) == BAD_RECORD
    flipped = bytearray(data)
    flipped[-1] ^= 1
    assert record_fault(cid, len(data), memoryview(head), memoryview(flipped)) == CHECKSUM
