"""Safetensors exports stream: read in groups of STREAM_BYTES, one group ahead of the writer.

With a tiny group size every path crosses many groups: the file must equal
what safetensors' own writer makes of the loaded state, a damaged chunk in
a later group fails the export and leaves no file, and a lazy clone's
export fetches (and keeps) only what it writes.
"""

import pytest
import torch
from safetensors.torch import load_file

import mvc
from mvc import exchange
from damage import flip_bit
from mvc.store.packs import read_trailer


def _state():
    g = torch.Generator().manual_seed(3)
    return {"model": {f"l{i}": {"w": torch.randn(16, 9, generator=g), "b": torch.randn(9, generator=g)}
                      for i in range(6)},
            "half": torch.randn(40, generator=g).to(torch.bfloat16), "ids": torch.arange(33, dtype=torch.int64),
            "mask": torch.rand(17, generator=g) > 0.5, "step": 7}


@pytest.fixture
def small_groups(monkeypatch):
    monkeypatch.setattr(exchange, "STREAM_BYTES", 700)  # a few tensors per group


def test_a_streamed_export_holds_every_tensor_bit_for_bit(tmp_path, small_groups):
    with mvc.Repository.init(tmp_path / "r", chunk_size=64) as repo:
        c = repo.commit(_state(), "s")
        out = repo.export(c.id, tmp_path / "all.safetensors")
        assert out.left_out == 1  # the step
        got = load_file(str(tmp_path / "all.safetensors"))
        want = mvc.files.tensors_by_key(repo.load(c.id))
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
        repo.export(c.id, tmp_path / "m.safetensors", only="model.l[12].*", strip_prefix="model.")
        assert set(load_file(str(tmp_path / "m.safetensors"))) == {"l1.w", "l1.b", "l2.w", "l2.b"}


def test_a_damaged_chunk_in_a_later_group_fails_and_writes_nothing(tmp_path, small_groups):
    with mvc.Repository.init(tmp_path / "r", chunk_size=64) as repo:
        c = repo.commit(_state(), "s")
        pack = next((repo.dir / "packs").glob("pack-*.pack"))
        last = max(read_trailer(pack), key=lambda entry: entry[1])  # the record written last
        flip_bit(pack, last[1] + last[2] - 1)
        with pytest.raises(mvc.ChecksumMismatch):
            repo.export(c.id, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".x")] == []


def test_a_lazy_clone_exports_by_fetching_and_keeps_what_it_fetched(tmp_path, small_groups):
    with mvc.Repository.init(tmp_path / "r", chunk_size=64) as repo:
        repo.remote_add("origin", str(tmp_path / "remote"))
        c = repo.commit(_state(), "s", branch="main")
        repo.push("origin", ("main",))
        want = mvc.files.tensors_by_key(repo.load(c.id))
        everything = repo.status().chunks
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        assert lazy.status().chunks == 0
        lazy.export(c.id, tmp_path / "m.safetensors", only="model.*")
        kept = lazy.status().chunks
        assert 0 < kept < everything and lazy.fsck().ok  # the model's chunks, not the others
    got = load_file(str(tmp_path / "m.safetensors"))
    assert got.keys() == {k for k in want if k.startswith("model.")}
    assert all(torch.equal(got[k], want[k]) for k in got)
