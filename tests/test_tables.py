"""The catalogue's chunk tables (mvc/remote/tables.py): the file format byte for byte, lookups,
merges and damage. The catalogue's own behaviour over them is in tests/test_catalogue.py."""

import struct

import blake3
import numpy as np
import pytest

from mvc.errors import CorruptObject
from mvc.remote import tables


def ids_of(*firsts) -> np.ndarray:
    return np.frombuffer(b"".join(bytes([f]) + bytes(range(1, 32)) for f in firsts), dtype="S32")


def test_a_table_is_written_as_docs_format_says(tmp_path):
    """docs/format.md 11.5, built here independently of the writer: header, names, fan-out, the
    five columns in id order, and the checksum (BLAKE3 of the BLAKE3 of each 1 MiB block)."""
    a, b = b"A" * 16, b"B" * 16
    table = tables.write(tmp_path, [(b, ids_of(9, 2), [100, 200], [10, 20]), (a, ids_of(2), [300], [30])])
    rest = bytes(range(8, 32))
    head = lambda first: int.from_bytes(bytes([first]) + bytes(range(1, 8)), "big")
    # entries by id, then pack number: id 02.. in pack 0 (b, row 1) and pack 1 (a), then 09..
    entries = [(head(2), 0, 200, 20), (head(2), 1, 300, 30), (head(9), 0, 100, 10)]
    fanout = [0] * 2 + [2] * 7 + [3] * 247
    body = b"MVCCTAB1" + struct.pack("<IQ", 2, 3) + b + a + struct.pack("<256Q", *fanout)
    body += b"".join(struct.pack("<Q", h) for h, _, _, _ in entries) + rest * 3
    body += b"".join(struct.pack("<I", p) for _, p, _, _ in entries)
    body += b"".join(struct.pack("<Q", o) for _, _, o, _ in entries)
    body += b"".join(struct.pack("<I", n) for _, _, _, n in entries)
    digest = blake3.blake3(blake3.blake3(body).digest()).digest()
    assert table.path.read_bytes() == body + digest
    table.verify()


def test_lookups_find_every_id_in_the_newest_table_with_a_live_pack(tmp_path):
    old = tables.write(tmp_path, [(b"O" * 16, ids_of(1, 2, 3), [0, 64, 128], [64] * 3)])
    new = tables.write(tmp_path, [(b"N" * 16, ids_of(2), [512], [64])])
    at, entry = tables.locate([new, old], [np.array([True]), np.array([True])], ids_of(3, 2, 7))
    assert at.tolist() == [1, 0, -1]
    assert old.offsets[entry[0]] == 128 and new.offsets[entry[1]] == 512
    at, _ = tables.locate([new, old], [np.array([False]), np.array([True])], ids_of(2))
    assert at.tolist() == [1]  # the newer pack is no longer this table's: the older entry counts


def test_a_merge_keeps_the_live_entries_only_in_bounded_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "MERGE_BUDGET", 2)  # a first-byte slice or two at a time
    one = tables.write(tmp_path, [(b"1" * 16, ids_of(5, 1, 200), [0, 1, 2], [1, 1, 1]),
                                  (b"2" * 16, ids_of(7), [3], [1])])
    two = tables.write(tmp_path, [(b"3" * 16, ids_of(100, 3), [4, 5], [1, 1])])
    merged = tables.merge(tmp_path, [one, two], [np.array([True, False]), np.array([True])])
    assert merged.names == [b"1" * 16, b"3" * 16]
    got = tables.joined(merged.heads, merged.rests)
    assert got.tolist() == ids_of(1, 3, 5, 100, 200).tolist()
    assert merged.offsets.tolist() == [1, 5, 0, 4, 2]
    assert tables.distinct([merged], [np.array([True, True])]) == (5, 5)
    merged.verify()


def test_a_flipped_bit_fails_the_checksum_and_a_cut_table_does_not_open(tmp_path):
    table = tables.write(tmp_path, [(b"P" * 16, ids_of(1, 2), [0, 64], [64, 64])])
    raw = bytearray(table.path.read_bytes())
    raw[-40] ^= 0x10
    flipped = tmp_path / ("f" * 32 + ".ctab")
    flipped.write_bytes(bytes(raw))
    with pytest.raises(CorruptObject) as err:
        tables.Table(flipped).verify()
    assert err.value.kind == "catalogue-table"
    cut = tmp_path / ("c" * 32 + ".ctab")
    cut.write_bytes(bytes(raw[:-1]))
    with pytest.raises(CorruptObject):
        tables.Table(cut)


def test_the_merge_policy_leaves_at_most_max_tables():
    assert tables.group([1] * tables.MAX_TABLES) == 0
    for sizes in ([1] * 30, [1, 2, 4, 8, 16, 32, 64, 128, 256], [5] + [1000] * 8, list(range(40, 0, -1))):
        k = tables.group(sizes)
        assert k >= 2 and len(sizes) - k + 1 <= tables.MAX_TABLES


def test_ids_that_share_their_first_eight_bytes_are_kept_in_byte_order(tmp_path):
    same = bytes(8)
    ids = np.frombuffer(same + b"\x02" * 24 + same + b"\x01" * 24 + b"\x01" * 32, dtype="S32")
    table = tables.write(tmp_path, [(b"P" * 16, ids, [0, 1, 2], [1, 1, 1]), (b"Q" * 16, ids[:1], [9], [1])])
    got = tables.joined(table.heads, table.rests)
    assert [bytes(x) for x in got.view("V32")] == sorted([bytes(x) for x in ids.view("V32")] + [bytes(ids[:1].view("V32")[0])])
    assert table.offsets.tolist() == [1, 0, 9, 2]  # the shared id: pack 0's entry, then pack 1's
    table.verify()
