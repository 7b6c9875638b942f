"""Exports stream: tensors are read in groups of STREAM_BYTES while the file is written.

With a tiny group size every path crosses many groups. A safetensors file
must hold what the loaded state holds; a pt file must be byte for byte what
torch.save makes of the loaded state (tied tensors, repeated tensors, empty
ones, plain values). A damaged chunk in a later group fails the export and
leaves no file, and a lazy clone's export fetches (and keeps) only what it
writes.
"""

import io

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
    # a pt export's reader waits for the writer before each group; a repeated
    # tensor is filled with its first and written later, and must not stall it
    monkeypatch.setattr(exchange, "AHEAD_BYTES", 0)


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


def _torch_bytes(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def test_a_streamed_pt_export_is_what_torch_save_writes(tmp_path, small_groups):
    shared = torch.randn(5, 7)
    state = {**_state(), "tied": {"a": shared, "b": shared}, "empty": torch.empty(0, 3),
             "again": [torch.ones(30), torch.ones(30)], "note": ("text", 2.5, None)}
    with mvc.Repository.init(tmp_path / "r", chunk_size=64) as repo:
        c = repo.commit(state, "s")
        repo.export(c.id, tmp_path / "all.pt")
        assert (tmp_path / "all.pt").read_bytes() == _torch_bytes(repo.load(c.id))
        got = torch.load(tmp_path / "all.pt", weights_only=True)
        assert got["tied"]["a"] is got["tied"]["b"] and got["again"][0] is not got["again"][1]
        repo.export(c.id, tmp_path / "m.pt", only="model.l[12].*", strip_prefix="model.")
        assert (tmp_path / "m.pt").read_bytes() == _torch_bytes(
            mvc.files.select(repo.load(c.id), "model.l[12].*", "model."))


def test_a_tensor_repeated_groups_later_does_not_stall_a_pt_export(tmp_path, small_groups):
    """The repeat of the first tensor is filled with it but written groups
    later: the reader, waiting for the writer to catch up, must go on when
    the writer waits for a storage not yet read."""
    import threading
    state = {"a_first": torch.ones(30), **_state(), "z_last": torch.ones(30)}  # far apart, sorted or not
    with mvc.Repository.init(tmp_path / "r", chunk_size=64) as repo:
        c = repo.commit(state, "s")
        export = threading.Thread(target=repo.export, args=(c.id, tmp_path / "all.pt"), daemon=True)
        export.start()
        export.join(60)
        assert not export.is_alive(), "the pt export stalled"
        assert (tmp_path / "all.pt").read_bytes() == _torch_bytes(repo.load(c.id))


def test_without_the_torch_internals_it_knows_a_pt_export_loads_then_saves(tmp_path, small_groups, monkeypatch):
    monkeypatch.setattr(mvc.files, "_torch_internals", lambda: None)
    with mvc.Repository.init(tmp_path / "r", chunk_size=64) as repo:
        c = repo.commit(_state(), "s")
        repo.export(c.id, tmp_path / "all.pt")
        assert (tmp_path / "all.pt").read_bytes() == _torch_bytes(repo.load(c.id))


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_a_damaged_chunk_in_a_later_group_fails_and_writes_nothing(tmp_path, small_groups, suffix):
    with mvc.Repository.init(tmp_path / "r", chunk_size=64) as repo:
        c = repo.commit(_state(), "s")
        pack = next((repo.dir / "packs").glob("pack-*.pack"))
        last = max(read_trailer(pack), key=lambda entry: entry[1])  # the record written last
        flip_bit(pack, last[1] + last[2] - 1)
        with pytest.raises(mvc.ChecksumMismatch):
            repo.export(c.id, tmp_path / f"x{suffix}")
    assert not (tmp_path / f"x{suffix}").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".x")] == []


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_a_lazy_clone_exports_by_fetching_and_keeps_what_it_fetched(tmp_path, small_groups, suffix):
    with mvc.Repository.init(tmp_path / "r", chunk_size=64) as repo:
        repo.remotes.add("origin", str(tmp_path / "remote"))
        c = repo.commit(_state(), "s", branch="main")
        repo.remotes.push("origin", ("main",))
        want = mvc.files.tensors_by_key(repo.load(c.id))
        everything = repo.status().chunks
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        assert lazy.status().chunks == 0
        lazy.export(c.id, tmp_path / f"m{suffix}", only="model.*")
        kept = lazy.status().chunks
        assert 0 < kept < everything and lazy.fsck().ok  # the model's chunks, not the others
    got = load_file(str(tmp_path / "m.safetensors")) if suffix == ".safetensors" else \
        torch.load(tmp_path / "m.pt", weights_only=True)
    assert got.keys() == {k for k in want if k.startswith("model.")}
    assert all(torch.equal(got[k], want[k]) for k in got)


def test_a_pt_export_holds_a_few_groups_in_memory_not_the_model(tmp_path):
    """192 MiB exported in 8 MiB groups: written storages are handed back
    and the reader waits for the writer, so the peak RSS grows by a few
    groups (the whole state would be 192 MiB)."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent(f"""
        import torch, mvc
        from mvc import exchange
        exchange.STREAM_BYTES, exchange.AHEAD_BYTES = 8 << 20, 16 << 20
        repo = mvc.Repository.init({str(tmp_path / "r")!r})
        state = {{f"t{{i}}": torch.randn(2 << 20) for i in range(24)}}  # 24 x 8 MiB
        c = repo.commit(state, "m")
        del state
        def kib(field):
            return int(next(l for l in open("/proc/self/status") if l.startswith(field)).split()[1])
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak RSS starts again from here
        before = kib("VmRSS")
        repo.export(c.id, {str(tmp_path / "m.pt")!r})
        print((kib("VmHWM") - before) // 1024)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) < 96  # MiB
    got = torch.load(tmp_path / "m.pt", weights_only=True)
    assert len(got) == 24 and all(t.shape == (2 << 20,) for t in got.values())


def test_files_larger_than_the_writeback_step_round_trip(tmp_path):
    """Packs and exports start their disk writes every WRITEBACK_BYTES; past
    that size the bytes must still be exactly the ones written."""
    from mvc.store.fs import WRITEBACK_BYTES
    big = {"w": torch.randn(3 * WRITEBACK_BYTES // 4 + 123), "b": torch.arange(1000)}
    with mvc.Repository.init(tmp_path / "r") as repo:
        c = repo.commit(big, "big")
        assert repo.fsck().ok
        got = repo.load(c.id)
        assert torch.equal(got["w"], big["w"]) and torch.equal(got["b"], big["b"])
        repo.export(c.id, tmp_path / "big.pt")
        assert (tmp_path / "big.pt").read_bytes() == _torch_bytes(got)
        repo.export(c.id, tmp_path / "big.safetensors")
        assert torch.equal(load_file(str(tmp_path / "big.safetensors"))["w"], big["w"])
