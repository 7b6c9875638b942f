"""mvc.diff: statuses, streamed numbers against torch, what is read, values, record, CLI."""

import json
import math

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc.cli import main
from mvc.diff import natural_key
from mvc.store.packs import pack_filename
from conftest import run_cli as cli


def numbers(a: torch.Tensor, b: torch.Tensor) -> dict:
    """What diff should report, computed from the full tensors in float64."""
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    return {"relative_change": float((b - a).norm() / a.norm()), "max_abs_diff": float((b - a).abs().max()),
            "cosine": float(a @ b / (a.norm() * b.norm()))}


def assert_numbers(t, a, b):
    for name, want in numbers(a, b).items():
        assert getattr(t, name) == pytest.approx(want, rel=1e-9, abs=1e-12), name


def by_key(d) -> dict:
    return {t.key: t for t in d.tensors}


def changed_copy(state: dict) -> dict:
    return {k: v.clone() for k, v in state.items()}


@pytest.fixture
def two(repo):
    """Two commits: one element of ``w`` changed, ``u`` untouched."""
    torch.manual_seed(0)
    a = {"w": torch.randn(100), "u": torch.randn(10, 10)}
    b = changed_copy(a)
    b["w"][70] += 0.5
    repo.commit(a, "a", step=1)
    repo.commit(b, "b", step=2)
    return repo, a, b


def test_changed_tensor_numbers_match_torch(two):
    repo, a, b = two
    d = repo.diff("HEAD~1", "HEAD")
    w, u = by_key(d)["w"], by_key(d)["u"]
    assert (w.status, u.status) == ("changed", "unchanged")
    assert_numbers(w, a["w"], b["w"])
    # 400 bytes in 64-byte chunks: 7 chunks, element 70 sits in chunk 4
    assert (w.chunks, w.chunks_changed, w.elements_changed, w.bytes_changed) == (7, 1, 1, 64)
    assert w.chunk_fraction == pytest.approx(1 / 7)
    assert w.norm_a == pytest.approx(float(a["w"].double().norm()))
    assert (u.relative_change, u.max_abs_diff, u.elements_changed) == (0.0, 0.0, 0)


def test_unchanged_tensors_are_not_read_and_only_differing_b_chunks_are(two, monkeypatch):
    repo, a, b = two
    entries = {e.key: e for e in repo.entries("HEAD")}
    old = {e.key: e for e in repo.entries("HEAD~1")}
    reads = []
    real = repo.chunks.read

    def counted(requests, *args, **kwargs):
        reads.extend(r.id for r in requests)
        return real(requests, *args, **kwargs)
    monkeypatch.setattr(repo.chunks, "read", counted)
    monkeypatch.setattr(repo, "load", lambda *a, **k: pytest.fail("diff must not load whole states"))
    repo.diff("HEAD~1")
    assert not set(reads) & set(entries["u"].chunks)
    differing = [c for c, o in zip(entries["w"].chunks, old["w"].chunks) if c != o]
    # every chunk of A once (norms need it), and B's chunks only where the ids differ
    assert sorted(reads) == sorted(list(old["w"].chunks) + differing)


def test_statuses(repo):
    a = {"same": torch.ones(3), "gone": torch.ones(2), "shape": torch.ones(4), "dtype": torch.ones(4)}
    b = {"same": torch.ones(3), "new": torch.zeros(5), "shape": torch.ones(2, 2),
         "dtype": torch.ones(4, dtype=torch.float64)}
    repo.commit(a)
    repo.commit(b)
    d = repo.diff("HEAD~1")
    got = {t.key: t.status for t in d.tensors}
    assert got == {"same": "unchanged", "gone": "removed", "new": "added", "shape": "reshaped", "dtype": "reshaped"}
    t = by_key(d)
    assert (t["shape"].shape_a, t["shape"].shape_b) == ((4,), (2, 2))
    assert (t["dtype"].dtype_a, t["dtype"].dtype_b) == ("F32", "F64")
    assert t["new"].relative_change is None and t["new"].elements_changed == 5
    s = d.summary
    assert (s.tensors, s.tensors_changed, s.tensors_added, s.tensors_removed) == (5, 4, 1, 1)
    assert s.elements_total == 3 + 5 + 4 + 4
    assert s.elements_changed == 5 + 4 + 4
    assert s.parameters_changed == pytest.approx(13 / 16)
    # the removed tensor's 8 bytes count on both sides of 'X of Y bytes changed'
    assert s.bytes_total == 12 + 20 + 16 + 32 + 8 and s.bytes_changed == 20 + 16 + 32 + 8 and s.bytes_removed == 8


def test_summary_counts_changed_chunks_and_elements(repo):
    torch.manual_seed(1)
    a = {f"layers.{i}.w": torch.randn(64) for i in range(10)}  # 256 bytes: 4 chunks each
    b = changed_copy(a)
    b["layers.3.w"][:20] = 0  # chunks 0 and 1
    repo.commit(a)
    repo.commit(b)
    s = repo.diff("HEAD~1").summary
    assert (s.tensors, s.tensors_changed, s.bytes_changed, s.elements_changed) == (10, 1, 128, 20)
    assert s.parameters_changed == pytest.approx(20 / 640)


def sample(dtype) -> tuple:
    """Two tensors of ``dtype`` that differ in elements 7 and 45."""
    torch.manual_seed(2)
    if dtype == torch.bool:
        a = torch.randn(50) > 0
        b = a.clone()
        b[[7, 45]] = ~b[[7, 45]]
        return a, b
    a = torch.randn(50, dtype=torch.complex128 if dtype.is_complex else torch.float64) * 10
    if not dtype.is_complex:
        a = a.abs()  # unsigned integers too
    b = a.clone()
    b[7] += 30
    b[45] += 20
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int64,
                                   torch.uint8, torch.bool, torch.complex64, torch.complex128, torch.float64])
def test_dtypes(repo, dtype):
    a, b = sample(dtype)
    repo.commit({"t": a})
    repo.commit({"t": b})
    t = by_key(repo.diff("HEAD~1"))["t"]
    assert t.status == "changed" and t.elements_changed == 2
    if dtype.is_complex:
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    assert_numbers(t, a.to(torch.float64), b.to(torch.float64))


def test_chunk_size_not_a_multiple_of_the_element_size(tmp_path):
    repo = mvc.Repository.init(tmp_path, chunk_size=3)  # float32 elements straddle chunks
    torch.manual_seed(3)
    a = torch.randn(33)
    b = a.clone()
    b[10] = 100.0
    repo.commit({"t": a})
    repo.commit({"t": b})
    t = by_key(repo.diff("HEAD~1"))["t"]
    assert t.elements_changed == 1 and t.chunks == 44
    assert_numbers(t, a, b)
    repo.close()


def test_identical_nan_is_unchanged_and_zero_norm_a_gives_inf(repo):
    a = torch.tensor([float("nan"), 1.0, 2.0, 3.0])
    b = a.clone()
    b[3] = 4.0
    repo.commit({"t": a, "z": torch.zeros(4)})
    repo.commit({"t": b, "z": torch.tensor([0.0, 0.0, 1.0, 0.0])})
    t, z = by_key(repo.diff("HEAD~1"))["t"], by_key(repo.diff("HEAD~1"))["z"]
    assert t.elements_changed == 1 and t.max_abs_diff == 1.0 and t.norm_diff == 1.0
    assert z.relative_change == math.inf and z.cosine is None


@pytest.mark.parametrize("scale", [2.0 ** 600, 2.0 ** -600], ids=["huge", "tiny"])
def test_numbers_past_the_range_of_float64_squares(repo, scale):
    """Squares of these elements overflow (or underflow) float64; the sums are
    scaled by powers of two, as BLAS nrm2 scales them, so every number is
    what the unscaled vectors [3, 4, 0] and [3, 4, 12] give, times ``scale``.
    The 3 sits in a 64-byte chunk of its own that stays, so the sums of two
    windows, one read on one side only, are put together."""
    a = torch.zeros(16, dtype=torch.float64)
    a[0], a[8] = 3 * scale, 4 * scale
    b = a.clone()
    b[9] = 12 * scale
    same = torch.tensor([1e200, 1e-200, 0.0], dtype=torch.float64)  # equal values under other bytes:
    repo.commit({"t": a, "same": same})
    repo.commit({"t": b, "same": torch.tensor([1e200, 1e-200, -0.0], dtype=torch.float64)})  # 0.0 -> -0.0
    t, s = by_key(repo.diff("HEAD~1"))["t"], by_key(repo.diff("HEAD~1"))["same"]
    assert (t.norm_a, t.norm_b, t.norm_diff, t.max_abs_diff) == (5 * scale, 13 * scale, 12 * scale, 12 * scale)
    assert (t.relative_change, t.cosine) == (12 / 5, 25 / 65)
    assert (s.status, s.elements_changed) == ("changed", 1)
    assert (s.norm_a, s.norm_b, s.cosine, s.relative_change, s.max_abs_diff) == (1e200, 1e200, 1.0, 0.0, 0.0)


def test_a_difference_past_float64s_range(repo):
    """B - A overflows (2**1024) while A and B do not: max |B-A| and ‖B-A‖ are
    inf, their true value rounded, and the ratios stay finite."""
    a = torch.tensor([2.0 ** 1023, 2.0 ** 1023], dtype=torch.float64)
    repo.commit({"t": a})
    repo.commit({"t": a * torch.tensor([-1.0, 1.0], dtype=torch.float64)})
    t = by_key(repo.diff("HEAD~1"))["t"]
    assert (t.norm_a, t.norm_b) == (2.0 ** 1023 * math.sqrt(2), 2.0 ** 1023 * math.sqrt(2))
    assert (t.max_abs_diff, t.norm_diff, t.cosine) == (math.inf, math.inf, 0.0)
    assert t.relative_change == pytest.approx(math.sqrt(2), rel=1e-15)


def test_plain_values_and_commit_record(repo):
    opt = {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}], "state": {}}
    repo.commit({"w": torch.ones(2), "opt": opt, "flag": 1}, "first", step=10, epoch=1,
                metrics={"loss": 2.5, "acc": 0.1}, context={"lr": 0.1, "code": {"git": "abc", "dirty": False}})
    opt2 = {"param_groups": [{"lr": 0.01, "betas": (0.9, 0.99)}], "state": {}}
    repo.commit({"w": torch.ones(2), "opt": opt2, "flag": 1.0, "extra": "x"}, "second", step=20, epoch=1,
                metrics={"loss": 1.5, "ppl": 4.0}, context={"lr": 0.1, "code": {"git": "def", "dirty": False}})
    d = repo.diff("HEAD~1")
    values = {v.key: (v.status, v.a, v.b) for v in d.values}
    assert values == {"opt.param_groups.0.lr": ("changed", 0.1, 0.01), "flag": ("changed", 1, 1.0),
                      "extra": ("added", None, "x")}
    fields = {f.name: (f.a, f.b) for f in d.commit}
    assert fields == {"message": ("first", "second"), "step": (10, 20), "metrics.loss": (2.5, 1.5),
                      "metrics.acc": (0.1, None), "metrics.ppl": (None, 4.0),
                      "context.code.git": ("abc", "def")}
    assert d.summary.values_changed == 3 and d.summary.tensors_changed == 0


def test_only_glob_and_model_order(repo):
    names = ["model.layers.10.w", "model.layers.2.w", "model.embed.w", "head.w"]
    repo.commit({n: torch.zeros(4) for n in names} | {"opt.lr": 0.1})
    repo.commit({n: torch.ones(4) for n in names} | {"opt.lr": 0.2})
    d = repo.diff("HEAD~1", only="model.layers.*")
    assert [t.key for t in d.tensors] == ["model.layers.2.w", "model.layers.10.w"]
    assert d.values == () and d.summary.tensors == 2
    full = repo.diff("HEAD~1")
    assert [t.key for t in full.tensors] == ["head.w", "model.embed.w", "model.layers.2.w", "model.layers.10.w"]


def test_natural_key():
    keys = ["layers.10.b", "layers.2.a", "layers.2.b", "layers.1.a", "embed", "layers.1"]
    assert sorted(keys, key=natural_key) == ["embed", "layers.1", "layers.1.a", "layers.2.a", "layers.2.b",
                                             "layers.10.b"]


def test_b_defaults_to_head_and_revisions_are_checked(two):
    repo, _, _ = two
    assert repo.diff("HEAD~1").b.id == repo.resolve("HEAD")
    assert repo.diff("HEAD~1").a.step == 1
    with pytest.raises(mvc.UnknownRevision):
        repo.diff("no-such-rev")


def test_corrupt_chunk_is_reported_with_its_tensor(two):
    repo, _, _ = two
    entry = {e.key: e for e in repo.entries("HEAD")}["w"]
    old = {e.key: e for e in repo.entries("HEAD~1")}["w"]
    cid = next(c for c, o in zip(entry.chunks, old.chunks) if c != o)
    with repo.index.read() as txn:
        loc = txn.chunk(cid)
    pack = repo.dir / "packs" / pack_filename(loc.pack)
    data = bytearray(pack.read_bytes())
    data[loc.offset + 5] ^= 0x10
    pack.write_bytes(bytes(data))
    repo.close()
    repo = mvc.Repository.open(repo.root)
    with pytest.raises(mvc.ChecksumMismatch) as err:
        repo.diff("HEAD~1")
    assert (err.value.id, err.value.what) == (cid.hex(), "tensor 'w'")
    repo.close()


# -- CLI ---------------------------------------------------------------------------



def test_cli_text_stat_json(two):
    repo, a, b = two
    out = cli(repo, "diff", "HEAD~1")
    assert out.exit_code == 0, out.output
    assert "step: 1 -> 2" in out.output
    assert "changed   w" in out.output and "chunks 1/7" in out.output
    assert "1 of 2 tensors changed" in out.output
    assert " u " not in out.output  # unchanged tensors are not listed
    stat = cli(repo, "diff", "HEAD~1", "HEAD", "--stat")
    assert stat.exit_code == 0
    assert stat.output.splitlines()[0].startswith(" w |") and len(stat.output.splitlines()) == 2
    js = cli(repo, "diff", "HEAD~1", "--json", "--only", "w")
    data = json.loads(js.output)
    assert [t["key"] for t in data["tensors"]] == ["w"]
    assert data["tensors"][0]["relative_change"] == pytest.approx(numbers(a["w"], b["w"])["relative_change"])
    assert data["summary"]["tensors_changed"] == 1


def test_cli_unknown_revision_is_one_line(two):
    repo, _, _ = two
    out = cli(repo, "diff", "nope")
    assert out.exit_code == 1
    assert out.output.strip().count("\n") == 0 and "unknown revision 'nope'" in out.output
