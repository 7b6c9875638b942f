"""Pack files: layout, sealing, the .tmp rule, reading back, and damaged packs detected."""

import struct

import pytest

from mvc import hashing
from mvc.errors import PackDamaged, PackMissing, UnsupportedFormat
from mvc.store.packs import (ENTRY, FOOTER, HEADER, RECORD_HEAD, SEAL, Location, PackReader, PackWriter,
                       pack_filename, read_trailer)

CHUNKS = [b"hello", b"", b"x" * 100]


def write_pack(directory, chunks=CHUNKS):
    writer = PackWriter(directory)
    locs = [writer.add(hashing.digest(c), c) for c in chunks]
    return writer, locs, writer.seal()


def test_layout_byte_by_byte(tmp_path):
    writer, locs, path = write_pack(tmp_path)
    data = path.read_bytes()
    assert data[:8] == HEADER == b"MVCPACK1"
    offset, entries = 8, []
    for chunk, loc in zip(CHUNKS, locs):
        cid, length = struct.unpack_from("<32sI", data, offset)
        assert cid == hashing.digest(chunk) and length == len(chunk)
        assert loc == Location(writer.name, offset + 36, len(chunk))
        assert data[offset + 36:offset + 36 + length] == chunk
        entries.append((cid, offset + 36, length))
        offset += 36 + length
    trailer = struct.pack("<I", 3) + b"".join(struct.pack("<32sQI", *e) for e in entries)
    assert data[offset:offset + len(trailer)] == trailer
    assert data[offset + len(trailer):] == hashing.digest(trailer) + struct.pack("<Q", offset) + b"MVCSEAL1"
    assert RECORD_HEAD.size == 36 and ENTRY.size == 44 and FOOTER.size == 48 and SEAL == b"MVCSEAL1"


def test_name_and_rename_on_seal(tmp_path):
    writer = PackWriter(tmp_path)
    writer.add(hashing.digest(b"a"), b"a")
    tmp_name = pack_filename(writer.name) + ".tmp"
    assert [p.name for p in tmp_path.iterdir()] == [tmp_name]  # nothing under a .pack name yet
    path = writer.seal()
    assert path.name == f"pack-{writer.name.hex()}.pack" and len(writer.name) == 16
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_abort_leaves_nothing(tmp_path):
    writer = PackWriter(tmp_path)
    writer.add(hashing.digest(b"a"), b"a")
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_read_trailer_lists_records(tmp_path):
    _, locs, path = write_pack(tmp_path)
    assert read_trailer(path) == [(hashing.digest(c), loc.offset, loc.length) for c, loc in zip(CHUNKS, locs)]


def test_empty_pack_is_valid(tmp_path):
    _, _, path = write_pack(tmp_path, [])
    assert path.stat().st_size == 60 and read_trailer(path) == []


def test_reader_reads_back(tmp_path):
    _, locs, _ = write_pack(tmp_path)
    reader = PackReader(tmp_path)
    try:
        assert [reader.read(loc) for loc in locs] == CHUNKS
        buffer = bytearray(5)
        reader.read_run([locs[0]], [buffer])
        assert bytes(buffer) == b"hello"
    finally:
        reader.close()


def test_reader_errors(tmp_path):
    _, locs, path = write_pack(tmp_path)
    reader = PackReader(tmp_path)
    try:
        with pytest.raises(PackDamaged) as err:
            reader.read(Location(locs[0].pack, path.stat().st_size - 2, 10))
        assert (err.value.pack, err.value.problem) == (path.name, "truncated")
        with pytest.raises(PackMissing) as err:
            reader.read(Location(b"\x00" * 16, 44, 1))
        assert err.value.pack == pack_filename(b"\x00" * 16)
    finally:
        reader.close()


def damage(path, at, new_bytes=None, truncate=None):
    data = bytearray(path.read_bytes())
    if truncate is not None:
        data = data[:truncate]
    else:
        data[at:at + len(new_bytes)] = new_bytes
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how, problem", [
    (lambda p, n: damage(p, 0, b"X"), "header"),
    (lambda p, n: damage(p, None, truncate=n - 1), "unsealed"),
    (lambda p, n: damage(p, None, truncate=30), "header"),  # shorter than the smallest pack
    (lambda p, n: damage(p, n - 8, b"MVCSEAL2"), "unsealed"),
    (lambda p, n: damage(p, n - 48 - 10, bytes([0xff])), "trailer-checksum"),  # a bit in the trailer's entries
    (lambda p, n: damage(p, n - 48, bytes([0x00])), "trailer-checksum"),  # the footer's digest itself
    (lambda p, n: damage(p, n - 16, struct.pack("<Q", n)), "unsealed"),  # trailer offset past the end
    (lambda p, n: damage(p, n - 16, struct.pack("<Q", 2)), "unsealed"),  # trailer offset inside header
])
def test_damaged_packs_are_detected(tmp_path, how, problem):
    _, _, path = write_pack(tmp_path)
    how(path, path.stat().st_size)
    with pytest.raises(PackDamaged) as err:
        read_trailer(path)
    assert (err.value.pack, err.value.problem) == (path.name, problem)


def forge_trailer(path, entries, count=None):
    """Rewrite a pack's trailer (with a valid checksum) to list ``entries``."""
    data = path.read_bytes()
    trailer_offset = struct.unpack_from("<Q", data, len(data) - 16)[0]
    body = struct.pack("<I", len(entries) if count is None else count)
    body += b"".join(ENTRY.pack(*e) for e in entries)
    path.write_bytes(data[:trailer_offset] + body + FOOTER.pack(hashing.digest(body), trailer_offset, SEAL))


def test_trailer_count_must_match_length(tmp_path):
    _, _, path = write_pack(tmp_path)
    entries = read_trailer(path)
    forge_trailer(path, entries, count=5)
    with pytest.raises(PackDamaged) as err:
        read_trailer(path)
    assert err.value.problem == "trailer-count"


@pytest.mark.parametrize("offset, length", [(43, 1), (44, 10**6), (2**63, 1)])
def test_trailer_entries_must_lie_inside_the_records(tmp_path, offset, length):
    _, _, path = write_pack(tmp_path)
    forge_trailer(path, [(b"\x01" * 32, offset, length)])
    with pytest.raises(PackDamaged) as err:
        read_trailer(path)
    assert err.value.problem == "outside"


def test_read_run_reads_back_to_back_records_in_one_call(tmp_path):
    writer = PackWriter(tmp_path)
    chunks = [bytes([i]) * (10 + i) for i in range(3)]
    locs = [writer.add(hashing.digest(c), c) for c in chunks]
    writer.seal()
    reader = PackReader(tmp_path)
    buffers = [bytearray(len(c)) for c in chunks]
    reader.prefetch([locs])
    reader.read_run(locs, buffers)
    assert [bytes(b) for b in buffers] == chunks
    with pytest.raises(PackDamaged) as err:  # a run that claims more than the pack holds
        reader.read_run([Location(locs[0].pack, locs[2].offset, 10**6)], [bytearray(10**6)])
    assert err.value.problem == "truncated"
    reader.close()


def test_runs_group_adjacent_records_only():
    from mvc.store.chunks import MAX_RUN, runs as _runs
    a, b = b"a" * 16, b"b" * 16
    step = 8 + RECORD_HEAD.size
    jobs = [(Location(a, 100 + i * step, 8),) for i in range(3)]
    jobs += [(Location(b, 100, 8),), (Location(a, 5000, 8),)]
    assert [len(r) for r in _runs(jobs)] == [3, 1, 1]
    many = [(Location(a, 100 + i * step, 8),) for i in range(MAX_RUN + 1)]
    assert [len(r) for r in _runs(many)] == [MAX_RUN, 1]


def test_salvage_skips_a_record_that_does_not_verify_and_keeps_going(tmp_path):
    from mvc.store.packs import salvage_records
    writer = PackWriter(tmp_path)
    chunks = [bytes([i]) * 20 for i in range(4)]
    locs = [writer.add(hashing.digest(c), c) for c in chunks]
    path = writer.seal()
    data = bytearray(path.read_bytes())
    data[locs[1].offset] ^= 1  # record 1's data is damaged, its header is intact
    path.write_bytes(bytes(data[:-10]))  # and the trailer is lost
    assert [d for _, d in salvage_records(path)] == [chunks[0], chunks[2], chunks[3]]


def test_an_encoded_record_in_a_version_1_pack_is_an_error_of_mvc(tmp_path):
    """A process whose view of FORMAT is stale must fail with an MvcError, not a bare ValueError."""
    w = PackWriter(tmp_path, version=1)
    with pytest.raises(UnsupportedFormat) as err:
        w.add(b"\1" * 32, b"payload", kind=1, size=64)
    assert err.value.problem == "stale" and err.value.version == 1
    w.abort()


def test_small_records_are_written_a_buffer_at_a_time_with_the_same_bytes(tmp_path, monkeypatch):
    import os
    import numpy as np
    calls = []
    real = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, bufs: calls.append(len(bufs)) or real(fd, bufs))
    data = np.random.default_rng(3).integers(0, 256, 64 * 2000 + 17, dtype=np.uint8)
    pieces = [bytes(data[i:i + 64]) for i in range(0, len(data), 64)]
    ids = [hashing.digest(p) for p in pieces]
    w = PackWriter(tmp_path)
    w.append_rows(ids[:1000], data, 64, list(range(1000)))  # one array, then one by one, then rows again
    for cid, piece in zip(ids[1000:1500], pieces[1000:1500]):
        w.add(cid, piece)
    w.append_rows(ids[1500:], data, 64, list(range(1500, len(pieces))))  # ends with the short last chunk
    path = w.seal()
    assert len(calls) <= 4  # the header, the records, the trailer: not a call per record (2002 on the old code)
    body = path.read_bytes()
    expected = HEADER + b"".join(RECORD_HEAD.pack(cid, len(p)) + p for cid, p in zip(ids, pieces))
    assert body[:len(expected)] == expected
    at = len(HEADER)
    listed = []
    for cid, p in zip(ids, pieces):
        listed.append((cid, at + RECORD_HEAD.size, len(p)))
        at += RECORD_HEAD.size + len(p)
    assert read_trailer(path) == listed
    reader = PackReader(tmp_path)
    assert [reader.read(loc) for _, loc in w.entries] == pieces
    reader.close()
