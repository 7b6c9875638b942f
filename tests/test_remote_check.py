"""The remote check (mvc/remote/check.py) judges each record of a remote pack as the local
pack checker does (``verify.record_fault``): real flipped bits in a folder remote's pack."""

import torch

import mvc
from damage import flip_bit
from mvc.remote import check
from mvc.store import chunks as cs
from mvc.store.packs import read_trailer


def test_a_remote_check_names_a_flipped_data_bit_and_a_flipped_header_bit_as_the_local_check_does(tmp_path):
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=64)
    repo.commit({"w": torch.arange(64, dtype=torch.float32)}, "first")
    repo.remotes.add("origin", str(tmp_path / "remote"))
    repo.remotes.push()
    try:
        pack = max((tmp_path / "remote" / "packs").glob("*.pack"), key=lambda p: p.stat().st_size)
        (data_id, data_at, n), (head_id, head_at, _) = read_trailer(pack)[:2]
        flip_bit(pack, data_at + n - 1, 3)  # the first record's last data byte
        flip_bit(pack, head_at - cs.RECORD_OVERHEAD + 5)  # a bit of the id in the second record's header
        report = repo.remotes.fsck()
        key = f"packs/{pack.name}"
        found = {(p.kind, p.object): p.detail for p in report.problems
                 if p.kind in (check.CHECKSUM, check.BAD_RECORD)}
        assert set(found) == {(cs.CHECKSUM, f"record {data_id.hex()[:12]} of {key}"),
                              (cs.BAD_RECORD, f"record {head_id.hex()[:12]} of {key}")}
        assert f"offset {data_at}" in found[(cs.CHECKSUM, f"record {data_id.hex()[:12]} of {key}")]
        assert f"offset {head_at}" in found[(cs.BAD_RECORD, f"record {head_id.hex()[:12]} of {key}")]
        assert not report.ok
    finally:
        repo.close()
