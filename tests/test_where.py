"""Where hints (``mvc.remote.where``, docs/format.md 11.8): their bytes, and finding the tensors
that hold the ids a lookup wants. Their use by a lazy load is in tests/test_lazy.py."""

import os

import numpy as np
import pytest

from mvc.errors import CorruptObject
from mvc.remote import layout, where


def test_a_hint_decodes_to_the_runs_it_was_made_of():
    a, b = os.urandom(16), os.urandom(16)
    ids = [os.urandom(32) for _ in range(2)]
    runs = {ids[0]: [(0, a), (5, b), (9, None)], ids[1]: [(0, b)]}
    decoded = where.decode(where.encode(runs))
    assert decoded.keys() == set(ids)
    for tid, expected in runs.items():
        starts, names = decoded[tid]
        assert list(zip(starts.tolist(), names)) == expected
    chunks = [os.urandom(32) for _ in range(12)]
    assert where.runs(chunks, lambda cid: a if chunks.index(cid) < 5 else b) == [(0, a), (5, b)]


@pytest.mark.parametrize("bad", [b"", b"\x93\x01\x02\x03", {"version": 2}, {"runs": "not starting at 0"},
                                 {"runs": "a pack index out of range"}])
def test_a_hint_that_is_not_one_this_mvc_writes_is_refused(bad):
    from mvc import encoding
    tid, name = os.urandom(32), os.urandom(16)
    if isinstance(bad, dict) and "version" in bad:
        bad = encoding.pack({"version": 2, "packs": [], "tensors": []})
    elif isinstance(bad, dict):
        table = np.zeros(1, dtype=[("start", "<u8"), ("pack", "<u4")])
        table[0] = (3, 0) if bad["runs"].startswith("not") else (0, 7)
        bad = encoding.pack({"version": 1, "packs": [name], "tensors": [[tid, table.tobytes()]]})
    with pytest.raises(CorruptObject):
        where.decode(bad)


def test_the_noted_tensors_holding_ids_and_the_packs_their_hints_name():
    noted = where.Noted()
    t1, t2 = [os.urandom(32) for _ in range(10)], [os.urandom(32) for _ in range(4)]
    noted.note(b"1" * 32, t1)
    noted.note(b"2" * 32, t2)
    found = noted.holders([t1[7], t2[0], os.urandom(32)])
    assert {k: v.tolist() for k, v in found.items()} == {b"1" * 32: [7], b"2" * 32: [0]}
    a, b = os.urandom(16), os.urandom(16)
    hints = {b"1" * 32: (np.array([0, 5], dtype=np.uint64), [a, b]), b"2" * 32: None}
    assert where.packs_for(found, hints.get) == {layout.pack_key(layout.CHUNK_PACKS, b)}


def test_noted_tensors_are_bounded_by_their_chunks(monkeypatch):
    monkeypatch.setattr(where.Noted, "LIMIT", 10)
    noted = where.Noted()
    first, second = [os.urandom(32) for _ in range(6)], [os.urandom(32) for _ in range(6)]
    noted.note(b"1" * 32, first)
    noted.note(b"2" * 32, second)  # 12 chunks: the first tensor is let go
    assert set(noted.holders(first + second)) == {b"2" * 32}
