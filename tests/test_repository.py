"""The repository: exact commit/load round trips, dedup, stats, metadata, and compare-and-swap."""

import math
import os
import struct
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mvc
from mvc import dtypes
from mvc.encoding import INT_MAX, INT_MIN
from mvc.errors import BadInput, NotARepository, RefConflict, RepositoryExists, UnsupportedFormat, Unstorable
from mvc.store.packs import read_trailer

CHUNK = 64


# -- comparing states exactly -----------------------------------------------


def raw(t: torch.Tensor) -> torch.Tensor:
    if t.numel() == 0:  # an empty view may have strides that view(uint8) refuses
        return torch.empty(0, dtype=torch.uint8)
    flat = t.detach().resolve_conj().resolve_neg().reshape(-1).clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)  # clone: one element may be "contiguous" with a stride view() refuses


def assert_same(got, want, path="<root>"):
    """Same structure, same types, bitwise-equal floats and tensors."""
    if isinstance(want, torch.Tensor):
        assert type(got) is torch.Tensor, path
        assert got.dtype == want.dtype and got.shape == want.shape and got.device.type == "cpu", path
        assert torch.equal(raw(got), raw(want.cpu())), path
        return
    assert type(got) is type(want), (path, type(got), type(want))
    if type(want) is dict:
        assert set(got) == set(want) and {type(k) for k in got} == {type(k) for k in want}, path
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}")
    elif type(want) in (list, tuple):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{path}.{i}")
    elif type(want) is float:
        assert struct.pack("<d", got) == struct.pack("<d", want), path
    else:
        assert got == want, path


def packs(repo) -> list:
    return sorted((repo.dir / "packs").glob("pack-*.pack"))


# -- hypothesis: random nested states ---------------------------------------

DTYPES = sorted(dtypes.TO_TORCH)


@st.composite
def tensors(draw):
    name = draw(st.sampled_from(DTYPES))
    dtype = dtypes.TO_TORCH[name]
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    n = math.prod(shape) * dtype.itemsize
    if dtype == torch.bool:
        data = bytes(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    else:
        data = draw(st.binary(min_size=n, max_size=n))
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape) if n else \
        torch.empty(shape, dtype=dtype)
    view = draw(st.sampled_from(["same", "transposed", "strided"]))
    if view == "transposed" and t.dim() >= 2:
        t = t.transpose(0, 1)
    elif view == "strided" and t.dim() >= 1:
        t = t[::2]
    return t


plain = st.one_of(st.none(), st.booleans(), st.integers(INT_MIN, INT_MAX),
                  st.sampled_from([INT_MIN, INT_MAX, 0, -1]),
                  st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.inf, -math.inf, -0.0, math.nan]),
                  st.text(max_size=5), st.binary(max_size=5))
states = st.recursive(st.one_of(plain, tensors()), lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.one_of(st.integers(-3, 3), st.text(max_size=3)), inner, max_size=3)), max_leaves=8)


@pytest.fixture(scope="module")
def shared_repo(tmp_path_factory):
    r = mvc.Repository.init(tmp_path_factory.mktemp("shared"), chunk_size=CHUNK)
    yield r
    r.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states)
def test_commit_load_round_trip(shared_repo, state):
    commit = shared_repo.commit(state, "prop")
    assert_same(shared_repo.load(commit.id), state)


# -- every dtype, every kind of view ---------------------------------------


def sample(dtype: torch.dtype, n: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    data = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        data = data % 2
    return data.view(dtype)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips(repo, name):
    dtype = dtypes.TO_TORCH[name]
    state = {"t": sample(dtype).reshape(5, -1), "scalar": sample(dtype, 1).reshape(()), "empty": torch.empty(0, 3, dtype=dtype)}
    back = repo.load(repo.commit(state).id)
    assert_same(back, state)
    assert repo.entries()[-1].dtype == name


def test_special_float_values_bitwise(repo):
    odd_nan = torch.tensor([0x7FC00001, 0xFFF00000 | 1], dtype=torch.int64)
    state = {"f32": torch.tensor([math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-45]),
             "f64_payload_nans": (odd_nan << 32).view(torch.float64),
             "bf16": torch.tensor([math.nan, -0.0, math.inf], dtype=torch.bfloat16)}
    assert_same(repo.load(repo.commit(state).id), state)


@pytest.mark.parametrize("make", [
    lambda: torch.arange(64.0).reshape(8, 8).t(),
    lambda: torch.arange(120.0).reshape(4, 5, 6).permute(2, 0, 1)[1:, :, ::2],
    lambda: torch.arange(100, dtype=torch.int16)[3::7],
    lambda: torch.arange(6.0).reshape(2, 3).expand(5, 2, 3),
    lambda: torch.complex(torch.arange(30.0), -torch.arange(30.0)).conj(),
    lambda: torch.complex(torch.arange(30.0), torch.ones(30)).conj().imag,
    lambda: torch.nn.Parameter(torch.randn(7, 3)),
    lambda: torch.randn(4, 4, requires_grad=True) * 2,
    lambda: torch.arange(12.0).reshape(3, 4).as_strided((2, 2), (1, 3)),
])
def test_views_round_trip_as_their_values(repo, make):
    t = make()
    back = repo.load(repo.commit({"t": t}).id)["t"]
    assert type(back) is torch.Tensor and back.is_contiguous() and not back.requires_grad
    assert back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(back, t.detach().resolve_conj().resolve_neg())


def test_structure_and_types_are_kept(repo):
    state = {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}, "groups": [{"lr": 0.1, "params": (0, 1)}],
             "none": None, "flag": False, "big": INT_MAX, "small": INT_MIN, "blob": b"\x00\xff", "name": "é",
             "nested": ((), [], {}, ((1,),))}
    assert_same(repo.load(repo.commit(state).id), state)


def test_a_tensor_alone_is_a_state(repo):
    t = torch.arange(5)
    assert_same(repo.load(repo.commit(t).id), t)


def test_large_tensors_round_trip(tmp_path):
    """Tensors of several MiB take the huge-page allocation path on load."""
    state = {"big": torch.randn(3 << 20), "odd": torch.randint(0, 9, (4097, 1031), dtype=torch.int16)}
    with mvc.Repository.init(tmp_path, chunk_size=1 << 20) as r:
        assert_same(r.load(r.commit(state).id), state)


def test_loaded_tensors_are_independent_of_the_repository(repo):
    c = repo.commit({"w": torch.zeros(100)})
    first = repo.load(c.id)
    first["w"] += 1
    assert torch.equal(repo.load(c.id)["w"], torch.zeros(100))


# -- shared storage ----------------------------------------------------------


def test_tied_weights_load_as_one_tensor(repo):
    w = torch.randn(10, 4)
    state = {"embed.weight": w, "lm_head.weight": w, "copy": w.clone(), "twin": torch.randn(10, 4)}
    back = repo.load(repo.commit(state).id)
    assert back["embed.weight"] is back["lm_head.weight"]
    assert back["copy"] is not back["embed.weight"]
    assert back["copy"].data_ptr() != back["embed.weight"].data_ptr()  # equal values, not aliased
    assert_same(back, state)


def test_independent_equal_tensors_are_not_aliased(repo):
    state = {"a": torch.zeros(8), "b": torch.zeros(8), "c": [torch.zeros(8)]}
    back = repo.load(repo.commit(state).id)
    ptrs = {back["a"].data_ptr(), back["b"].data_ptr(), back["c"][0].data_ptr()}
    assert len(ptrs) == 3
    back["a"][0] = 1
    assert back["b"][0] == 0


def test_two_tied_pairs_with_equal_values_stay_two_pairs(repo):
    x, y = torch.ones(4), torch.ones(4)
    back = repo.load(repo.commit({"a": x, "b": x, "c": y, "d": y}).id)
    assert back["a"] is back["b"] and back["c"] is back["d"] and back["a"] is not back["c"]


def test_module_with_tied_embedding(repo):
    model = torch.nn.Sequential(torch.nn.Embedding(6, 3), torch.nn.Linear(3, 6, bias=False))
    model[1].weight = model[0].weight
    sd = model.state_dict()
    back = repo.load(repo.commit({"model": sd}).id)["model"]
    assert back["0.weight"] is back["1.weight"]
    fresh = torch.nn.Sequential(torch.nn.Embedding(6, 3), torch.nn.Linear(3, 6, bias=False))
    fresh.load_state_dict(back)
    assert torch.equal(fresh[1].weight, model[1].weight)


def test_optimizer_state_dict_round_trips(repo):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    back = repo.load(repo.commit({"opt": sd}).id)["opt"]
    assert_same(back, sd)
    assert type(back["param_groups"][0]["betas"]) is tuple and type(next(iter(back["state"]))) is int
    torch.optim.AdamW(model.parameters()).load_state_dict(back)


# -- refusals ------------------------------------------------------------------


class Exploit:
    calls = []

    def __reduce__(self):
        Exploit.calls.append("pickled")
        return (print, ("pwned",))


def test_arbitrary_objects_refused_and_never_pickled(repo):
    with pytest.raises(Unstorable) as err:
        repo.commit({"optimizer": {"state": {0: {"hook": Exploit()}}}})
    assert (err.value.key, err.value.reason) == ("optimizer.state.0.hook", "type")
    assert Exploit.calls == [] and packs(repo) == [] and list(repo.log()) == []


@pytest.mark.parametrize("state, key, reason", [
    ({"a": {2.5: 1}}, "a", "key-type"),
    ({"a": [2**64]}, "a.0", "int-range"),
    ({"a": -(2**63) - 1}, "a", "int-range"),
    ({"f": lambda: 0}, "f", "type"),
    ({"sparse": torch.eye(3).to_sparse()}, "sparse", "layout"),
])
def test_bad_states_refused(repo, state, key, reason):
    with pytest.raises(Unstorable) as err:
        repo.commit(state)
    assert (err.value.key, err.value.reason) == (key, reason)
    assert packs(repo) == []


@pytest.mark.parametrize("kwargs", [
    {"step": 1.5}, {"step": True}, {"epoch": "1"}, {"metrics": {"loss": "low"}}, {"metrics": {"ok": True}},
    {"metrics": {1: 0.5}}, {"context": {"obj": object()}}, {"context": {1.5: 1}}, {"message": b"bytes"},
])
def test_bad_metadata_refused(repo, kwargs):
    with pytest.raises(BadInput):
        repo.commit({"w": torch.ones(1)}, **kwargs)


# -- torch's module metadata (state_dict._metadata) ---------------------------


class Versioned(torch.nn.Linear):
    """A module at version 7 that notes the version load_state_dict hands it."""

    _version = 7

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
        self.loaded_version = local_metadata.get("version")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


def test_a_state_dicts_module_metadata_round_trips(repo):
    from collections import OrderedDict
    model = torch.nn.Sequential(Versioned(2, 3), torch.nn.BatchNorm1d(3))
    sd = model.state_dict()
    assert sd._metadata == {"": {"version": 1}, "0": {"version": 7}, "1": {"version": 2}}
    repo.commit({"model": sd, "step": 1}, "nested")
    repo.commit(sd, "bare")
    nested, bare = repo.load("HEAD~1"), repo.load("HEAD")
    assert type(nested) is dict  # a dict that had none stays a dict
    for back in (nested["model"], bare):
        assert type(back) is OrderedDict and back._metadata == sd._metadata
        assert_same(dict(back), dict(sd))
    fresh = torch.nn.Sequential(Versioned(2, 3), torch.nn.BatchNorm1d(3))
    fresh.load_state_dict(nested["model"])
    assert fresh[0].loaded_version == 7
    assert mvc.reader.load_keys(repo, "HEAD~1", ["model"])["model"]._metadata == sd._metadata
    assert (repo.dir / "FORMAT").read_bytes() == b"mvc-format 1\nextensions dict-metadata pack-indexes sealed-values\n"


@pytest.mark.parametrize("metadata", [{"": {"version": Exploit()}}, {"": {"version": 2**64}}, {"": 1}, [1]])
def test_module_metadata_that_is_not_plain_is_refused(repo, metadata):
    sd = torch.nn.Linear(2, 2).state_dict()
    sd._metadata = metadata
    with pytest.raises(Unstorable) as err:
        repo.commit({"model": sd})
    assert (err.value.key, err.value.reason) == ("model._metadata", "metadata")
    assert Exploit.calls == [] and packs(repo) == []


def test_a_state_without_module_metadata_leaves_the_format_as_it_was(repo):
    from collections import OrderedDict
    repo.commit({"model": OrderedDict(w=torch.ones(2))})
    assert type(repo.load()["model"]) is dict
    assert (repo.dir / "FORMAT").read_bytes() == b"mvc-format 1\nextensions pack-indexes sealed-values\n"


# -- metadata and history ----------------------------------------------------


def test_commit_record_round_trips(repo, monkeypatch):
    monkeypatch.setenv("MVC_AUTHOR", "tester")
    c = repo.commit({"w": torch.ones(2)}, "first line\nmore", step=1200, epoch=3,
                    metrics={"loss": 2.31, "acc": np.float32(0.5), "n": torch.tensor(7)},
                    context={"lr": 3e-4, "dtype": torch.bfloat16, "betas": (0.9, 0.95), "nested": {1: "x"}})
    got = repo.get_commit(c.id)
    assert got.message == "first line\nmore" and got.step == 1200 and got.epoch == 3 and got.author == "tester"
    assert got.metrics == {"loss": 2.31, "acc": 0.5, "n": 7}
    assert got.context == {"lr": 3e-4, "dtype": "torch.bfloat16", "betas": [0.9, 0.95], "nested": {1: "x"}}
    assert got.parents == () and len(got.id) == 64 and c.short_id == c.id[:12]
    assert abs(got.time - time.time()) < 3600


def test_log_follows_first_parents(repo):
    ids = [repo.commit({"i": i}, f"m{i}", step=i).id for i in range(5)]
    assert [c.id for c in repo.log()] == ids[::-1]
    assert [c.step for c in repo.log(ids[2])] == [2, 1, 0]
    assert [c.id for c in repo.log("HEAD", n=2)] == [ids[4], ids[3]]


def test_entries_list_leaves_without_reading_data(repo):
    c = repo.commit({"b": torch.zeros(3, 2, dtype=torch.float16), "a": 7})
    entries = repo.entries(c.id)
    assert [(e.key, e.kind) for e in entries] == [("a", "value"), ("b", "tensor")]
    assert entries[1].dtype == "F16" and entries[1].shape == (3, 2) and entries[1].nbytes == 12
    assert entries[0].value == 7


# -- dedup and stats -----------------------------------------------------------


def test_stats_of_a_first_commit(repo):
    state = {"a": torch.arange(40, dtype=torch.float32), "b": torch.arange(4, dtype=torch.int8)}
    stats = repo.commit(state).stats
    assert stats.tensors == 2 and stats.bytes_total == 164 and stats.chunks == 4  # 160 B = 3 chunks, + 1
    assert stats.chunks_new == 4 and stats.bytes_new == 164 and stats.bytes_reused == 0
    (pack,) = packs(repo)
    assert len(read_trailer(pack)) == 4


def test_identical_commit_writes_nothing(repo):
    state = {"w": torch.randn(50), "v": torch.randn(3, 7)}
    repo.commit(state)
    before = packs(repo)
    again = repo.commit({k: v.clone() for k, v in state.items()})
    assert again.stats.bytes_new == 0 and again.stats.chunks_new == 0 and again.stats.bytes_reused == 284
    assert packs(repo) == before


def test_one_changed_element_writes_one_chunk(repo):
    w = torch.randn(64)  # 256 bytes: 4 chunks of 64
    repo.commit({"w": w})
    w2 = w.clone()
    w2[20] += 1  # bytes 80..83: the second chunk
    stats = repo.commit({"w": w2}).stats
    assert stats.chunks == 4 and stats.chunks_new == 1 and stats.bytes_new == CHUNK
    new_pack = packs(repo)
    assert len(new_pack) == 2 and sum(len(read_trailer(p)) for p in new_pack) == 5


def test_equal_chunks_within_a_commit_are_written_once(repo):
    stats = repo.commit({"a": torch.zeros(64), "b": [torch.zeros(32, dtype=torch.int64)]}).stats
    assert stats.chunks == 8 and stats.chunks_new == 1 and stats.bytes_new == CHUNK


def test_chunks_are_shared_across_tensors_and_dtypes(repo):
    data = torch.randint(0, 256, (128,), dtype=torch.uint8)
    repo.commit({"u8": data})
    stats = repo.commit({"as_f32": data.view(torch.float32), "as_i16": data.view(torch.int16)}).stats
    assert stats.bytes_new == 0


def test_a_chunk_in_the_repository_is_never_written_again(repo):
    a, b = torch.randn(32), torch.randn(32)
    repo.commit({"a": a})
    repo.commit({"b": b})
    repo.commit({"a": a, "b": b, "both": torch.cat([a, b])})
    ids = [cid for p in packs(repo) for cid, _, _ in read_trailer(p)]
    assert len(ids) == len(set(ids)) == 4


def test_last_chunk_is_short_and_chunks_start_at_the_first_byte(repo):
    t = torch.arange(20, dtype=torch.float32)  # 80 bytes: 64 + 16
    c = repo.commit({"t": t})
    (entry,) = repo.entries(c.id)
    assert [len(mvc.reader.read_chunk(repo, cid)) for cid in entry.chunks] == [64, 16]
    assert mvc.reader.read_chunk(repo, entry.chunks[0]) == bytes(raw(t)[:64].numpy())


# -- layout, format and opening ---------------------------------------------


def test_init_layout(tmp_path):
    r = mvc.Repository.init(tmp_path, chunk_size=4096)
    try:
        assert (tmp_path / ".mvc" / "FORMAT").read_bytes() == b"mvc-format 1\nextensions sealed-values\n"
        assert {p.name for p in (tmp_path / ".mvc").iterdir()} >= {"FORMAT", "index", "packs", "tmp", "locks"}
        assert r.chunk_size == 4096 and r.head() == mvc.Head("main", None)
    finally:
        r.close()
    with pytest.raises(RepositoryExists):
        mvc.Repository.init(tmp_path)


def test_open_finds_the_repository_above(repo, tmp_path):
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    with mvc.Repository.open(deep) as r:
        assert r.root == tmp_path and r.chunk_size == CHUNK


def test_open_outside_a_repository(tmp_path):
    with pytest.raises(NotARepository) as err:
        mvc.Repository.open(tmp_path)
    assert err.value.path == str(tmp_path.resolve())


@pytest.mark.parametrize("text, problem, version, extensions", [
    ("mvc-format 2\nextensions\n", "newer", 2, ()),
    ("mvc-format 0\nextensions\n", "damaged", None, ()),
    ("mvc-format x\n", "damaged", None, ()),
    ("mvc-format ²\n", "damaged", None, ()),
    ("extensions\n", "damaged", None, ()),
    ("mvc-format 1\nmvc-format 1\n", "damaged", None, ()),
    ("mvc-format 1\nextensions sparse-packs\n", "extensions", None, ("sparse-packs",)),
])
def test_unknown_formats_are_refused(repo, tmp_path, text, problem, version, extensions):
    (tmp_path / ".mvc" / "FORMAT").write_text(text, encoding="utf-8")
    with pytest.raises(UnsupportedFormat) as exc:
        mvc.Repository.open(tmp_path)
    assert (exc.value.problem, exc.value.version, exc.value.extensions) == (problem, version, extensions)


@pytest.mark.parametrize("size", [0, -1, 2**32, 1.5, "64"])
def test_bad_chunk_sizes_refused(tmp_path, size):
    with pytest.raises(BadInput):
        mvc.Repository.init(tmp_path, chunk_size=size)
    assert not (tmp_path / ".mvc").exists()


def test_status_counts(repo):
    repo.commit({"w": torch.randn(40)})
    s = repo.status()
    assert (s.commits, s.branches, s.tags, s.packs, s.chunk_size) == (1, 1, 0, 1, CHUNK)
    assert s.chunks == 3 and s.pack_bytes == os.path.getsize(packs(repo)[0])


# -- devices -------------------------------------------------------------------


def test_map_location_cpu(repo):
    c = repo.commit({"w": torch.randn(5), "t": (torch.ones(2),)})
    back = repo.load(c.id, map_location="cpu")
    assert back["w"].device.type == "cpu" and type(back["t"]) is tuple


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_load_to_cpu_or_map_location(repo):
    w = torch.randn(100, device="cuda")
    tied = torch.randn(3, device="cuda")
    c = repo.commit({"w": w, "x": tied, "y": tied, "h": w.half()})
    back = repo.load(c.id)
    assert back["w"].device.type == "cpu" and torch.equal(back["w"], w.cpu())
    on_gpu = repo.load(c.id, map_location="cuda")
    assert on_gpu["w"].is_cuda and torch.equal(on_gpu["w"], w)
    assert on_gpu["x"] is on_gpu["y"]
    cpu_commit = repo.commit({"w": w.cpu(), "x": tied.cpu(), "y": tied.cpu(), "h": back["h"]})
    assert cpu_commit.stats.bytes_new == 0  # the same bytes, whatever device they came from


# -- compare-and-swap -----------------------------------------------------------


def race(monkeypatch, repo, other_commit):
    """Make ``repo``'s next commit find its branch moved by ``other_commit`` mid-way."""
    original = mvc.commits.write_chunks

    def write_chunks_then_race(target, slots, progress):
        result = original(target, slots, progress)
        if target is repo:
            other_commit()
        return result
    monkeypatch.setattr(mvc.commits, "write_chunks", write_chunks_then_race)


def test_concurrent_commit_is_a_conflict_not_a_lost_update(repo, tmp_path, monkeypatch):
    base = repo.commit({"w": torch.zeros(4)}, "base")
    with mvc.Repository.open(tmp_path) as other:
        landed = []
        race(monkeypatch, repo, lambda: landed.append(other.commit({"w": torch.ones(4)}, "theirs")))
        with pytest.raises(RefConflict) as err:
            repo.commit({"w": torch.full((4,), 2.0)}, "mine")
        assert (err.value.ref, err.value.expected, err.value.found) == ("heads/main", base.id, landed[0].id)
    assert [c.message for c in repo.log()] == ["theirs", "base"]
    assert repo.resolve("main") == landed[0].id and landed[0].parents == (base.id,)
    assert torch.equal(repo.load()["w"], torch.ones(4))


def test_rebase_lands_on_the_new_tip(repo, tmp_path, monkeypatch):
    repo.commit({"w": torch.zeros(4)}, "base")
    with mvc.Repository.open(tmp_path) as other:
        landed = []
        race(monkeypatch, repo, lambda: landed.append(other.commit({"w": torch.ones(4)}, "theirs")))
        mine = repo.commit({"w": torch.full((4,), 2.0)}, "mine", rebase=True)
    assert mine.parents == (landed[0].id,)
    assert [c.message for c in repo.log()] == ["mine", "theirs", "base"]
    assert torch.equal(repo.load("HEAD~1")["w"], torch.ones(4))


def test_first_commit_race_on_a_new_branch(repo, tmp_path, monkeypatch):
    with mvc.Repository.open(tmp_path) as other:
        race(monkeypatch, repo, lambda: other.commit({"w": torch.ones(1)}, "theirs", branch="new"))
        with pytest.raises(RefConflict) as err:
            repo.commit({"w": torch.zeros(1)}, "mine", branch="new")
        assert (err.value.ref, err.value.expected) == ("heads/new", None) and err.value.found is not None
    assert [c.message for c in repo.log("new")] == ["theirs"]


def test_interrupted_init_leaves_nothing_behind(tmp_path, monkeypatch):
    import mvc.repository as R

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(R.fs, "fsync_dir", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mvc.Repository.init(tmp_path / "run")
    assert list((tmp_path / "run").iterdir()) == []
    monkeypatch.undo()
    mvc.Repository.init(tmp_path / "run").close()  # and a second try works
    assert [p.name for p in (tmp_path / "run").iterdir()] == [".mvc"]


def test_init_follows_the_umask(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        mvc.Repository.init(tmp_path / "r").close()
    finally:
        os.umask(old)
    assert (tmp_path / "r" / ".mvc").stat().st_mode & 0o777 == 0o755
