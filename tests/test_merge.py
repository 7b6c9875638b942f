"""mvc merge: every strategy bit for bit against a plain torch reference
written here, compatibility errors, determinism, rules and recipes, a lazy
clone, and the CLI (merge, average, show, log --graph, diff per parent)."""

import json
import math
import shutil
import subprocess

import blake3
import pytest
import torch

import mvc
from mvc import merge as merging
from conftest import SMALL_CHUNK, run_cli


# -- plain torch references (mergekit's definitions, float32 arithmetic) --------

def up(t):
    return t.to(torch.float64 if t.dtype == torch.float64 else torch.float32)


def total(items):
    acc = items[0]
    for item in items[1:]:
        acc = acc + item
    return acc


def ref_linear(xs, w, normalize=True):
    acc = xs[0] * w[0]
    for x, wi in zip(xs[1:], w[1:]):
        acc = acc + x * wi
    if not normalize:
        return acc
    acc = acc / math.fsum(w)
    same = torch.ones_like(acc, dtype=torch.bool)
    for x in xs[1:]:
        same = same & (x == xs[0])
    return torch.where(same, xs[0], acc)


def ref_slerp(a, b, t, threshold=0.9995, eps=1e-8):
    if bytes(a.numpy().tobytes()) == bytes(b.numpy().tobytes()):
        return a
    na = torch.linalg.vector_norm(a, dtype=torch.float64).item()
    nb = torch.linalg.vector_norm(b, dtype=torch.float64).item()
    dot = torch.dot(a.reshape(-1).double(), b.reshape(-1).double()).item()
    dot /= (na if na > eps else 1.0) * (nb if nb > eps else 1.0)
    if abs(dot) > threshold:
        return a * (1 - t) + b * t
    theta = math.acos(dot)
    return a * (math.sin(theta - theta * t) / math.sin(theta)) + b * (math.sin(theta * t) / math.sin(theta))


def ref_trim(d, density):
    if density >= 1:
        return d
    keep = torch.zeros(d.numel(), dtype=d.dtype)
    keep[torch.sort(d.abs().reshape(-1), descending=True, stable=True).indices[:int(density * d.numel())]] = 1
    return d * keep.reshape(d.shape)


def ref_keep(seed, key, i, numel, density, block):
    """DARE's mask as the README defines it: one generator per block of elements."""
    parts = []
    for b in range(-(-numel // block)):
        s = int.from_bytes(blake3.blake3(f"mvc-dare {seed} {key} {i} {b}".encode()).digest()[:8], "little") >> 1
        parts.append(torch.rand(min(block, numel - b * block), generator=torch.Generator().manual_seed(s)))
    return (torch.cat(parts) < density).to(torch.float32)


def ref_task(xs, base, w, kind, p, key=None):
    deltas = [x - base for x in xs]
    if kind == "ties":
        deltas = [ref_trim(d, p["density"]) for d in deltas]
    if kind == "dare" and p["density"] < 1:
        deltas = [d * ref_keep(p["seed"], key, i, d.numel(), p["density"], p["block"]).reshape(d.shape).to(d.dtype)
                  for i, d in enumerate(deltas)]
        if p.get("rescale", True):
            deltas = [d / p["density"] for d in deltas]
    wd = [d * wi for d, wi in zip(deltas, w)]
    consensus = p.get("consensus", "sum" if kind == "ties" else "none")
    if consensus != "none":
        votes = total(wd) if consensus == "sum" else total([torch.sign(d) for d in wd])
        major = torch.where(votes >= 0, 1.0, -1.0).to(base.dtype)
        agree = [(torch.sign(d) == major).to(base.dtype) for d in wd]
        mixed = total([d * a for d, a in zip(wd, agree)])
        div = total([a * wi for a, wi in zip(agree, w)])
        div = torch.where(div == 0, 1.0, div).to(base.dtype)
    else:
        mixed = total(wd)
        div = math.fsum(w) if abs(math.fsum(w)) >= 1e-8 else 1.0
    if p.get("normalize", kind == "ties"):
        mixed = mixed / div
    return torch.where(mixed == 0, base, base + mixed)


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


# -- fixtures ------------------------------------------------------------------------

def model(seed, base=None):
    g = torch.Generator().manual_seed(seed)
    if base is None:
        w = torch.randn(33, 17, generator=g)
        w[20, 3] = -0.0  # kept as -0.0 where every input keeps it (base + 0.0 would be +0.0)
        return {"w": w, "h": torch.randn(40, generator=g).to(torch.bfloat16),
                "e": torch.randn(12, 5, generator=g).to(torch.float16), "d": torch.randn(9, generator=g).double(),
                "frozen": torch.randn(64, generator=g), "count": torch.tensor(seed), "on": torch.tensor([True, False])}
    out = {}
    for k, v in base.items():
        if k in ("frozen", "on"):
            out[k] = v.clone()
        elif k == "count":
            out[k] = torch.tensor(seed)
        else:
            out[k] = (up(v) + 0.05 * torch.randn(v.shape, generator=g, dtype=up(v).dtype)).to(v.dtype)
    out["w"][:10] = base["w"][:10]  # whole chunks equal to the base: reused unread
    out["w"][20, 3] = base["w"][20, 3]
    return out


@pytest.fixture
def three(repo):
    """A base commit and three fine-tunes of it, on branches a, b, c."""
    base = model(0)
    cb = repo.commit({"model": base, "step": 0, "name": "base"}, "base")
    ids = {"base": cb.id}
    for n, name in enumerate("abc", 1):
        ids[name] = repo.commit({"model": model(n, base), "step": n, "name": name}, name, branch=name, start="main").id
    return ids


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(merging, "SLICE_ELEMENTS", 48)  # several slices per tensor
    monkeypatch.setattr(merging, "MASK_BLOCK", 50)  # DARE masks span several blocks and slices


def expected(repo, revs, base_rev, fn):
    states = [repo.load(r) for r in revs]
    base = repo.load(base_rev)["model"] if base_rev else None
    out = {}
    for k, v in states[0]["model"].items():
        if not v.is_floating_point():
            out[k] = v
            continue
        xs = [up(s["model"][k]) for s in states]
        out[k] = fn(k, xs, up(base[k]) if base is not None else None).to(v.dtype)
    return out


def check(repo, commit_id, want):
    got = repo.load(commit_id)
    assert got["step"] == 1 and got["name"] == "a"  # values from the first input
    assert got["model"].keys() == want.keys()
    for k in want:
        assert same_bits(got["model"][k], want[k]), k


# -- every strategy, bit for bit -------------------------------------------------------

CASES = [
    ("average", None, {}, lambda k, xs, b: ref_linear(xs, [1.0, 1.0, 1.0])),
    ("linear", [0.2, 0.5, 0.3], {}, lambda k, xs, b: ref_linear(xs, [0.2, 0.5, 0.3])),
    ("linear", [1.0, 2.0, -0.5], {"normalize": False}, lambda k, xs, b: ref_linear(xs, [1.0, 2.0, -0.5], False)),
    ("task-arithmetic", [0.7, 0.4, 0.3], {}, lambda k, xs, b: ref_task(xs, b, [0.7, 0.4, 0.3], "ta", {})),
    ("task-arithmetic", [0.7, 0.4, 0.3], {"normalize": True},
     lambda k, xs, b: ref_task(xs, b, [0.7, 0.4, 0.3], "ta", {"normalize": True})),
    ("ties", [1.0, 0.5, 0.8], {"density": 0.4},
     lambda k, xs, b: ref_task(xs, b, [1.0, 0.5, 0.8], "ties", {"density": 0.4})),
    ("ties", [1.0, 0.5, 0.8], {"density": 0.7, "consensus": "count", "normalize": False},
     lambda k, xs, b: ref_task(xs, b, [1.0, 0.5, 0.8], "ties",
                               {"density": 0.7, "consensus": "count", "normalize": False})),
    ("dare", [0.6, 0.3, 0.5], {"density": 0.5, "seed": 11},
     lambda k, xs, b: ref_task(xs, b, [0.6, 0.3, 0.5], "dare", {"density": 0.5, "seed": 11, "block": 50},
                               key=f"model.{k}")),
    ("dare", [0.6, 0.3, 0.5], {"density": 0.3, "seed": 5, "consensus": "sum", "rescale": False},
     lambda k, xs, b: ref_task(xs, b, [0.6, 0.3, 0.5], "dare",
                               {"density": 0.3, "seed": 5, "block": 50, "consensus": "sum", "rescale": False},
                               key=f"model.{k}")),
]


@pytest.mark.parametrize("strategy,weights,params,reference", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_strategy_matches_its_reference_bit_for_bit(repo, three, small_slices, strategy, weights, params, reference):
    base = three["base"] if strategy in merging.WITH_BASE else None
    commit, report = repo.merge(["a", "b", "c"], strategy=strategy, weights=weights, params=params, base=base,
                                branch="merged")
    check(repo, commit.id, expected(repo, ["a", "b", "c"], base, reference))
    assert commit.parents == (three["a"], three["b"], three["c"])  # a new branch: the inputs
    assert report.tensors_taken == 2  # count and on (not float) come from the first input
    if params.get("normalize", True) or strategy in merging.WITH_BASE:
        assert report.tensors_reused == 1  # frozen: the same in every input, kept unread
    if strategy in ("task-arithmetic", "dare"):  # rows 0-9 of w equal the base in every input: not read
        assert report.chunks_reused >= 10 * 17 * 4 // SMALL_CHUNK
    assert 0 < report.bytes_read < report.bytes_total * 4


def test_slerp_matches_its_reference(repo, three, small_slices):
    commit, _ = repo.merge(["a", "b"], strategy="slerp", params={"t": 0.3}, branch="s")
    check(repo, commit.id, expected(repo, ["a", "b"], None, lambda k, xs, b: ref_slerp(xs[0], xs[1], 0.3)))


def test_slerp_of_colinear_tensors_falls_back_to_lerp(repo):
    a = torch.randn(40)
    c1 = repo.commit({"w": a}, "a", branch="a")
    for other, t in ((a * 2, 0.25), (-a, 0.5)):  # |cos| = 1 > 0.9995
        c2 = repo.commit({"w": other}, "b", branch="b")
        c, _ = repo.merge([c1.id, c2.id], strategy="slerp", params={"t": t}, branch="m")
        assert same_bits(repo.load(c.id)["w"], a * (1 - t) + other * t)


def test_slerp_of_orthogonal_tensors_is_spherical(repo):
    a = repo.commit({"w": torch.tensor([1.0, 0.0])}, "a", branch="a")
    b = repo.commit({"w": torch.tensor([0.0, 2.0])}, "b", branch="b")
    c, _ = repo.merge([a.id, b.id], strategy="slerp", params={"t": 0.5}, branch="m")
    got = repo.load(c.id)["w"]
    assert same_bits(got, ref_slerp(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0]), 0.5))
    assert torch.allclose(got, torch.tensor([math.sqrt(0.5), 2 * math.sqrt(0.5)]))  # not the lerp (0.5, 1.0)


def test_a_merge_keeps_the_module_metadata_of_its_first_input(repo):
    """A merged state_dict keeps the module versions load_state_dict needs."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    sd = model.state_dict()
    a = repo.commit({"model": sd}, "a", branch="a")
    b = repo.commit({"model": {k: v + 1 if v.is_floating_point() else v for k, v in sd.items()}}, "b", branch="b")
    c, _ = repo.merge([a.id, b.id], strategy="linear", branch="m")
    assert repo.load(c.id)["model"]._metadata == sd._metadata


# -- determinism -----------------------------------------------------------------------

def test_the_same_inputs_and_recipe_give_the_same_tree(repo, three):
    runs = [repo.merge(["a", "b", "c"], strategy="dare", base="main", params={"density": 0.5, "seed": 3},
                       branch=f"run{i}")[0] for i in range(2)]
    assert runs[0].tree == runs[1].tree and runs[0].id != runs[1].id  # same tree; times differ
    other = repo.merge(["a", "b", "c"], strategy="dare", base="main", params={"density": 0.5, "seed": 4},
                       branch="run3")[0]
    assert other.tree != runs[0].tree  # the seed is what decides the masks
    ties = [repo.merge(["a", "b"], strategy="ties", base="main", params={"density": 0.5},
                       branch=f"t{i}")[0].tree for i in range(2)]
    assert ties[0] == ties[1]


def test_the_record_holds_strategy_parameters_inputs_and_base(repo, three):
    commit, _ = repo.merge(["a", "b"], strategy="ties", base="main", params={"density": 0.5}, weights="1,0.5",
                           message="soup")
    record = repo.get_commit(commit.id).context["merge"]
    assert record["strategy"] == "ties" and record["params"] == {"density": 0.5, "normalize": True,
                                                                  "consensus": "sum"}
    assert record["inputs"] == [three["a"], three["b"]] and record["base"] == three["base"]
    assert record["weights"] == [1.0, 0.5] and record["revs"] == ["a", "b"]
    # on main (the base's branch): first parent is main's tip; the inputs follow
    assert commit.parents == (three["base"], three["a"], three["b"]) and commit.branch == "main"
    assert repo.get_commit("main").message == "soup"


# -- compatibility checks, before any work --------------------------------------------------

def _untouched(repo):
    return ([(b.name, b.id) for b in repo.branches()], repo.status().packs, repo.status().chunks)


def test_a_shape_dtype_or_key_mismatch_names_the_keys_and_changes_nothing(repo):
    a = repo.commit({"w": torch.zeros(4, 4), "v": torch.zeros(3), "x": torch.zeros(2), "n": 1}, "a", branch="a")
    b = repo.commit({"w": torch.zeros(4, 5), "v": torch.zeros(3, dtype=torch.float16), "y": torch.zeros(2),
                     "n": torch.ones(1)}, "b", branch="b")
    before = _untouched(repo)
    with pytest.raises(mvc.MergeMismatch) as err:
        repo.merge([a.id, b.id])
    assert err.value.keys == ("n", "v", "w", "x", "y")
    assert "F16" in err.value.problems["v"] and "missing" in err.value.problems["x"]
    assert err.value.inputs == (a.id, b.id)
    assert _untouched(repo) == before


def test_a_base_that_lacks_a_key_is_a_mismatch(repo):
    base = repo.commit({"w": torch.zeros(4)}, "base")
    a = repo.commit({"w": torch.ones(4), "extra": torch.ones(2)}, "a", branch="a")
    b = repo.commit({"w": torch.ones(4), "extra": torch.ones(2)}, "b", branch="b")
    with pytest.raises(mvc.MergeMismatch) as err:
        repo.merge([a.id, b.id], strategy="task-arithmetic", base=base.id)
    assert err.value.keys == ("extra",)


def test_optimizer_state_is_refused_unless_left_out_or_taken(repo):
    state = {"model": {"w": torch.ones(4)}, "optimizer": {"state": {0: {"exp_avg": torch.ones(4), "step": torch.tensor(3)}}}}
    a = repo.commit(state, "a", branch="a")
    b = repo.commit(state, "b", branch="b")
    before = _untouched(repo)
    with pytest.raises(mvc.MergeRefused) as err:
        repo.merge([a.id, b.id])
    assert err.value.keys == ("optimizer.state.0.exp_avg",) and _untouched(repo) == before
    c, _ = repo.merge([a.id, b.id], only="model.*", branch="m1")
    assert set(repo.load(c.id)) == {"model"}
    c, report = repo.merge([a.id, b.id], rules=[{"keys": "optimizer.*", "take": 1}], branch="m2")
    assert repo.entries(c.id) and report.tensors_taken == 2


@pytest.mark.parametrize("options,field", [
    ({"strategy": "slerp"}, "t"),
    ({"strategy": "slerp", "params": {"t": 0.5}, "extra": True}, "strategy"),
    ({"strategy": "ties"}, "base"),
    ({"strategy": "linear", "params": {"density": 0.5}}, "density"),
    ({"strategy": "dare", "base": "main", "params": {"density": 1.5}}, "density"),
    ({"weights": [1.0]}, "weights"),
    ({"strategy": "nope"}, "strategy"),
    ({"rules": [{"keys": "w", "take": 7}]}, "rules[0]"),
    ({"rules": [{"keys": "w", "take": 1}, {"keys": "model.*", "take": 0}]}, "rules[1]"),  # matches no key
    ({"params": {"normalize": "yes"}}, "normalize"),
])
def test_bad_recipes_are_refused_before_any_work(repo, options, field):
    a = repo.commit({"w": torch.ones(4)}, "a")
    b = repo.commit({"w": torch.zeros(4)}, "b", branch="b")
    c = repo.commit({"w": torch.zeros(4)}, "c", branch="c")
    revs = [a.id, b.id, c.id] if options.pop("extra", False) else [a.id, b.id]
    before = _untouched(repo)
    with pytest.raises(mvc.BadRecipe) as err:
        repo.merge(revs, **options)
    assert err.value.field == field and isinstance(err.value, mvc.BadInput)
    assert _untouched(repo) == before


# -- rules, recipes, ranges ---------------------------------------------------------------------

def test_a_toml_recipe_takes_keys_from_one_input_and_merges_others_its_own_way(repo, three, tmp_path):
    (tmp_path / "r.toml").write_text(
        'strategy = "task-arithmetic"\nbase = "main"\nweights = [0.5, 0.5]\nonly = "model.*"\n'
        '[[rules]]\nkeys = "model.h"\ntake = 1\n'
        '[[rules]]\nkeys = "model.e"\nstrategy = "linear"\n')
    commit, report = repo.merge(["a", "b"], tmp_path / "r.toml", branch="r")
    got, a, b = repo.load(commit.id), repo.load("a")["model"], repo.load("b")["model"]
    assert set(got) == {"model"}  # only model.* (values left out)
    assert same_bits(got["model"]["h"], b["h"])
    assert same_bits(got["model"]["e"], ref_linear([up(a["e"]), up(b["e"])], [0.5, 0.5]).to(torch.float16))
    base = repo.load("main")["model"]
    assert same_bits(got["model"]["w"], ref_task([a["w"], b["w"]], base["w"], [0.5, 0.5], "ta", {}))
    rules = repo.get_commit(commit.id).context["merge"]["rules"]
    assert rules[0] == {"keys": "model.h", "take": 1} and rules[1]["strategy"] == "linear"
    # a flag wins over the file
    assert repo.merge(["a", "b"], tmp_path / "r.toml", weights=[1, 1], branch="r2")[0].tree != commit.tree


def test_a_json_recipe_and_an_unreadable_one(repo, three, tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"strategy": "linear", "weights": [3, 1]}))
    commit, _ = repo.merge(["a", "b"], str(tmp_path / "r.json"), branch="j")
    assert repo.get_commit(commit.id).context["merge"]["weights"] == [3.0, 1.0]
    for bad in ("{", "[1, 2]", '{"strategy": "ties", "colour": 1}', '{"rules": [{"take": 0}]}'):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(mvc.BadRecipe):
            repo.merge(["a", "b"], tmp_path / "bad.json")


def test_average_of_a_range_is_a_one_parent_commit_recording_every_input(repo):
    ids = [repo.commit({"w": torch.full((5,), float(i))}, f"step {i}", step=i).id for i in range(5)]
    commit, report = repo.merge(["main~4..main"])
    assert repo.load(commit.id)["w"].tolist() == [2.5] * 5  # steps 1-4
    assert commit.parents == (ids[-1],)  # the other inputs are already its ancestors
    assert repo.get_commit(commit.id).context["merge"]["inputs"] == ids[1:]
    assert report.tensors_merged == 1


def test_an_only_glob_that_matches_nothing_is_an_error(repo, three):
    with pytest.raises(mvc.BadRecipe) as err:
        repo.merge(["a", "b"], only="modle.*")
    assert err.value.field == "only"


def test_tied_tensors_stay_tied(repo):
    w = torch.ones(3, 3)
    a = repo.commit({"emb": w, "head": w}, "a", branch="a")
    w2 = torch.zeros(3, 3)
    b = repo.commit({"emb": w2, "head": w2}, "b", branch="b")
    c, report = repo.merge([a.id, b.id], branch="m")
    got = repo.load(c.id)
    assert got["emb"].data_ptr() == got["head"].data_ptr() and report.tensors_merged == 1
    # tied in the first input only: each key merged from its own inputs, and untied
    d = repo.commit({"emb": torch.full((3, 3), 4.0), "head": torch.full((3, 3), 8.0)}, "d", branch="d")
    c, report = repo.merge([a.id, d.id], branch="m2")
    got = repo.load(c.id)
    assert got["emb"].tolist() == [[2.5] * 3] * 3 and got["head"].tolist() == [[4.5] * 3] * 3
    assert report.tensors_merged == 2


# -- a lazy clone reads only what it merges -----------------------------------------------------

@pytest.mark.parametrize("kind", ["folder", "s3"])
def test_a_lazy_clone_merges_by_fetching_only_what_differs(tmp_path, request, kind):
    if kind == "s3":  # the session's real SeaweedFS server
        server, url = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_url")()
        endpoint = server.endpoint
    else:
        url, endpoint = str(tmp_path / "remote"), None
    with mvc.Repository.init(tmp_path / "r", chunk_size=SMALL_CHUNK) as repo:
        repo.remotes.add("origin", url, endpoint)
        base = model(0)
        repo.commit({"model": base, "step": 0, "name": "base"}, "base")
        for n, name in enumerate("ab", 1):
            repo.commit({"model": model(n, base), "step": n, "name": name}, name, branch=name, start="main")
        repo.remotes.push("origin", ("main", "a", "b"))
        here = repo.merge(["a", "b"], strategy="task-arithmetic", base="main", branch="m")[0]
        everything = repo.status().chunks
    with mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=endpoint) as lazy:
        commit, report = lazy.merge(["origin/a", "origin/b"], strategy="task-arithmetic", base="origin/main",
                                    branch="m")
        assert commit.tree == here.tree  # the same tree in another repository
        fetched = lazy.status().chunks
        assert 0 < fetched < everything and report.chunks_reused > 0
        assert lazy.fsck().ok
        # what it took unread from the inputs is held here too: until the merge is pushed, a remote gc
        # that prunes the inputs must not take the merge's data with them
        from mvc.remote.tiers import commit_chunks
        with lazy.index.read() as txn:
            mine = commit_chunks(lazy, txn, {bytes.fromhex(commit.id)})
            assert mine and lazy.chunks.remote_only(mine, txn) == set()


# -- the command line ------------------------------------------------------------------------------

def test_cli_merge_show_log_graph_and_diff_against_each_parent(repo, three):
    r = run_cli(repo, "merge", "a", "b", "--strategy", "ties", "--base", "main", "--param", "density=0.5",
                "--weights", "1,1")
    assert r.exit_code == 0, r.output
    assert "2 inputs, ties" in r.stdout
    show = run_cli(repo, "show").stdout
    assert "Merge:  " in show and "Recipe:" in show and "strategy: ties (consensus=sum, density=0.5" in show
    assert f"base:    {three['base'][:12]}" in show and f"input 1: {three['b'][:12]}" in show
    graph = run_cli(repo, "log", "--graph", "--oneline", "--all").stdout.splitlines()
    assert graph[0].startswith("*-.   ") and graph[1].startswith("|\\ \\")  # three parents: Git's octopus
    for parent in ("HEAD^1", "HEAD^2", "HEAD^3"):
        d = run_cli(repo, "diff", parent, "HEAD", "--stat")
        assert d.exit_code == 0 and "tensors changed" in d.stdout
    js = json.loads(run_cli(repo, "merge", "a", "c", "-b", "soup", "--json").stdout)
    assert js["report"]["inputs"] == [three["a"], three["c"]] and js["commit"]["branch"] == "soup"


def test_a_mismatch_outside_the_model_suggests_only_model(repo):
    """The README's 'mvc average main~4..main' on the training hook's commits stopped at a loader's
    RNG (a tensor in one, a value in another) with no way on: the CLI suggests --only 'model.*'."""
    for i, rng in enumerate([torch.zeros(2), None]):
        repo.commit({"model": {"w": torch.full((4,), float(i))}, "ranks": {"0": {"loader": {"rng": rng}}}}, f"c{i}")
    refused = run_cli(repo, "average", "main~1..main", "main~1")
    assert refused.exit_code == 1 and "ranks.0.loader.rng" in refused.stderr
    assert refused.stderr.rstrip().endswith("merge only the model's tensors with --only 'model.*' (a training run's "
                                            "commits also hold optimizer, RNG and data-loader state)")
    assert run_cli(repo, "average", "main~1..main", "main~1", "--only", "model.*").exit_code == 0
    repo.commit({"model": {"w": torch.zeros(3)}}, "another shape")
    inside = run_cli(repo, "average", "main~1", "main", "--only", "model.*")
    assert inside.exit_code == 1 and "--only" not in inside.stderr  # the model itself differs: no such advice


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_a_merge_to_a_branch_that_requires_signatures_is_signed(repo, three, tmp_path):
    """A branch under signing.require took no merge: merge and average had no way to sign."""
    from mvc import signing
    from mvc.errors import SignatureRequired
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    key = signing.load_key(tmp_path / "k")
    (tmp_path / "allowed").write_text(f"me@example.com {key.public_line()}\n")
    repo.config(signing.ALLOWED, str(tmp_path / "allowed"))
    for name in "abc":  # signed fine-tunes: a merge brings its inputs onto main, whose new history must be good
        state = repo.load(name)
        repo.create_branch(name, "main", force=True)
        repo.commit(state, f"{name}, signed", branch=name, sign=key)
    repo.config(signing.REQUIRE, "main")
    tip = repo.resolve("main")
    with pytest.raises(SignatureRequired):
        repo.merge(["a", "b"])
    assert repo.resolve("main") == tip  # refused before anything was written
    merged = repo.merge(["a", "b"], sign=key).commit
    assert repo.trust.verify_commit(merged.id).good
    r = run_cli(repo, "average", "b", "c")
    assert r.exit_code == 1 and "requires signed commits" in r.stderr
    r = run_cli(repo, "average", "b", "c", "--signing-key", tmp_path / "k")
    assert r.exit_code == 0, r.output
    assert repo.trust.verify_commit("main").good and repo.get_commit("main").parents[0] == merged.id
    repo.config(signing.KEY, str(tmp_path / "k"))
    r = run_cli(repo, "merge", "a", "c", "-S", "--json")
    assert r.exit_code == 0 and repo.trust.verify_commit("main").good
    assert run_cli(repo, "audit", "main").exit_code == 1  # the unsigned base and fine-tunes below it


def test_cli_average_and_its_errors(repo, three):
    r = run_cli(repo, "average", "a", "b", "c", "-b", "avg")
    assert r.exit_code == 0 and "average" in r.stdout
    bad = repo.commit({"model": {"w": torch.zeros(2)}}, "other", branch="other")
    r = run_cli(repo, "merge", "a", bad.id)
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "do not match" in r.stderr
    r = run_cli(repo, "merge", "a", "b", "--strategy", "nope")
    assert r.exit_code == 2
    r = run_cli(repo, "merge", "a", "b", "--strategy", "slerp")
    assert r.exit_code == 1 and "needs the parameter t" in r.stderr


# -- weights of any size, values every input agrees on, results out of range (issue 39, item 9) ----------

def pair(repo, a, b, base=None):
    """Commits of {"w": a} and {"w": b} (and of the base) on branches a, b (and base)."""
    ids = [repo.commit({"w": a}, "a", branch="a").id, repo.commit({"w": b}, "b", branch="b").id]
    if base is not None:
        ids.append(repo.commit({"w": base}, "base", branch="base").id)
    return ids


@pytest.mark.parametrize("weights", [(1e-50, 1e-50), (3e38, 3e38), (1e308, 1e308), (1e-320, 1e-320),
                                     (2e307, 6e307)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_linear_weights_of_any_finite_size_merge_as_their_ratios(repo, weights, dtype):
    """1e-50 or 3e38 each committed NaN with exit 0, 1e308 crashed (OverflowError in fsum): the
    weights are scaled by one power of two (exact), so the merge is the one of their ratios."""
    a, b = torch.randn(40).to(dtype), torch.randn(40).to(dtype)
    ia, ib = pair(repo, a, b)
    c, _ = repo.merge([ia, ib], strategy="linear", weights=list(weights), branch="m")
    top = math.frexp(max(weights))[1]
    small = [math.ldexp(w, -top) for w in weights]  # scaled by the power of two that brings the largest into [0.5, 1)
    assert same_bits(repo.load(c.id)["w"], ref_linear([up(a), up(b)], small).to(dtype))
    r = run_cli(repo, "merge", "a", "b", "--strategy", "linear", "--weights", ",".join(map(repr, weights)),
                "-b", "cli")
    assert r.exit_code == 0, r.output
    assert same_bits(repo.load("cli")["w"], repo.load(c.id)["w"])


def test_a_result_out_of_range_is_refused_naming_the_key_and_nothing_is_committed(repo):
    a, b, base = torch.full((40,), 3.0), torch.full((40,), 2.0), torch.ones(40)
    pair(repo, a, b, base)
    tip = repo.commit({"w": base}, "main's tip").id
    cases = [dict(strategy="linear", weights=[3e38, 3e38], params={"normalize": False}),  # 3e38 * 3 is inf
             dict(strategy="task-arithmetic", weights=[1e308, 1.0], base="base"),  # a weight no float32 holds
             dict(strategy="ties", weights=[3e38, 3e38], base="base"),
             dict(strategy="dare", weights=[3e38, 1.0], base="base", params={"density": 0.5})]
    for case in cases:
        with pytest.raises(merging.MergeNotFinite) as caught:
            repo.merge(["a", "b"], **case)
        assert (caught.value.key, caught.value.dtype) == ("w", "F32") and caught.value.count > 0, case
    assert repo.resolve("main") == tip
    r = run_cli(repo, "merge", "a", "b", "--strategy", "linear", "--weights", "3e38,3e38", "--param",
                "normalize=false")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "merging w gives 40 values" in r.stderr
    assert "take w from one input" in r.stderr and repo.resolve("main") == tip


def test_a_cast_back_that_overflows_the_tensors_dtype_is_refused(repo):
    """float32 arithmetic held the result, float16 cannot (65504 is its largest value)."""
    pair(repo, torch.full((8,), 60000.0).half(), torch.full((8,), 60000.0).half(), torch.zeros(8).half())
    with pytest.raises(merging.MergeNotFinite) as caught:
        repo.merge(["a", "b"], strategy="task-arithmetic", base="base", weights=[1.0, 1.0])
    assert caught.value.dtype == "F16" and caught.value.count == 8
    sums = pair(repo, torch.full((8,), 30000.0).half(), torch.full((8,), 30000.0).half(), torch.zeros(8).half())
    c, _ = repo.merge(sums[:2], strategy="task-arithmetic", base=sums[2], weights=[1.0, 1.0], branch="m")
    assert same_bits(repo.load(c.id)["w"], torch.full((8,), 60000.0).half())  # in range: merged


NAN_BITS = 0x7FC01234  # a NaN with a payload (float32)


def special(n):
    """n float32 values with +inf, -inf and a NaN of a payload at 1, 2, 3 (all within the first 64-byte chunk)."""
    t = torch.randn(n)
    t[1], t[2] = math.inf, -math.inf
    t.view(torch.int32)[3] = NAN_BITS
    return t


@pytest.mark.parametrize("strategy,params", [("average", {}), ("linear", {}), ("task-arithmetic", {}),
                                             ("ties", {"density": 0.5}), ("dare", {"density": 0.5})])
def test_values_every_input_and_the_base_hold_are_kept_bit_for_bit(repo, strategy, params):
    """inf equal in the base and every input became NaN (inf - inf) once a neighbour in its chunk
    changed; a NaN's payload was lost. The README promises the value stays."""
    base = special(40)
    a, b = base.clone(), base.clone()
    a[0], b[0], b[30] = 5.0, -7.0, 9.0  # neighbours in the same chunk and another one change
    ids = pair(repo, a, b, base)
    with_base = strategy in merging.WITH_BASE
    weights = [0.7, 0.3] if strategy != "average" else None
    c, _ = repo.merge(ids[:2], strategy=strategy, weights=weights, params=params,
                      base=ids[2] if with_base else None, branch="m")
    got = repo.load(c.id)["w"]
    assert torch.equal(got.view(torch.int32)[1:4], base.view(torch.int32)[1:4])
    assert torch.isfinite(got[torch.arange(40) >= 4]).all()
    if strategy in ("average", "linear"):  # the changed neighbours are merged as before
        assert same_bits(got[[0, 30]], ref_linear([a[[0, 30]], b[[0, 30]]], weights or [1.0, 1.0]))


def test_a_nan_payload_in_bfloat16_held_by_every_input_is_kept(repo):
    a = torch.randn(40).bfloat16()
    a.view(torch.int16)[5] = 0x7F81  # a signalling-looking NaN: float32 and back gives 0xFFFF
    b = a.clone()
    b[0] = 3.0
    ia, ib = pair(repo, a, b)
    c, _ = repo.merge([ia, ib], branch="m")
    assert int(repo.load(c.id)["w"].view(torch.int16)[5]) == 0x7F81


def test_a_non_finite_input_value_where_inputs_differ_is_not_an_error(repo):
    """inf in one input only: the arithmetic's answer (inf), as mergekit's; only values the arithmetic
    made up from finite inputs are refused."""
    a, b = torch.ones(8), torch.ones(8)
    a[2] = math.inf
    b[0] = 3.0
    ia, ib = pair(repo, a, b)
    c, _ = repo.merge([ia, ib], branch="m")
    assert repo.load(c.id)["w"].tolist() == [2.0, 1.0, math.inf, 1.0, 1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("other", [2.0, -1.0, -0.5])
def test_slerp_of_parallel_tensors_at_dot_threshold_1_is_the_lerp(repo, other):
    """dot_threshold=1 on parallel tensors divided by sin 0 (ZeroDivisionError, exit 70)."""
    a = torch.zeros(40)
    a[7] = 1.5  # cos θ is exactly +-1
    ia, ib = pair(repo, a, a * other)
    c, _ = repo.merge([ia, ib], strategy="slerp", params={"t": 0.25, "dot_threshold": 1}, branch="m")
    assert same_bits(repo.load(c.id)["w"], a * 0.75 + (a * other) * 0.25)
    r = run_cli(repo, "merge", "a", "b", "--strategy", "slerp", "--param", "t=0.25", "--param", "dot_threshold=1")
    assert r.exit_code == 0, r.output


def test_slerp_of_nearly_parallel_tensors_at_dot_threshold_1_is_finite(repo):
    """cos θ rounded past 1 is outside acos's domain; just under 1 the slerp is all but the lerp."""
    a = torch.randn(40, generator=torch.Generator().manual_seed(3))
    for other in (a * 2, a * 3.000001, a + 1e-7):
        ia, ib = pair(repo, a, other)
        c, _ = repo.merge([ia, ib], strategy="slerp", params={"t": 0.25, "dot_threshold": 1}, branch="m")
        assert torch.allclose(repo.load(c.id)["w"], a * 0.75 + other * 0.25, rtol=1e-5, atol=1e-6)


def test_slerp_of_a_tensor_holding_inf_is_refused(repo):
    a = torch.randn(8)
    a[3] = math.inf
    ia, ib = pair(repo, a, torch.randn(8))
    with pytest.raises(merging.MergeNotFinite) as caught:
        repo.merge([ia, ib], strategy="slerp", params={"t": 0.5})
    assert caught.value.key == "w" and caught.value.count == 7  # every finite element became NaN


@pytest.mark.parametrize("dtype,name", [(torch.complex64, "C64"), (torch.complex128, "C128"),
                                        (torch.float8_e8m0fnu, "F8_E8M0")])
def test_tensors_no_strategy_can_merge_are_refused_where_they_differ(repo, dtype, name):
    """complex and float8_e8m0 tensors were silently taken from input 0."""
    x = torch.randn(6, dtype=torch.complex64).to(dtype) if dtype.is_complex else torch.rand(6).to(dtype)
    y = (x * 2) if dtype.is_complex else torch.full((6,), 4.0).to(dtype)
    same = torch.randn(3, dtype=torch.complex64)
    ia = repo.commit({"w": torch.ones(4), "z": x, "s": same}, "a", branch="a").id
    ib = repo.commit({"w": torch.zeros(4), "z": y, "s": same}, "b", branch="b").id
    tip = repo.commit({"w": torch.ones(4)}, "main's tip").id
    with pytest.raises(merging.MergeDtypeRefused) as caught:
        repo.merge([ia, ib])
    assert caught.value.keys == ("z",) and caught.value.dtypes == (name,)  # s is the same in both: no problem
    assert repo.resolve("main") == tip
    r = run_cli(repo, "merge", ia, ib)
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and f"z ({name})" in r.stderr and "take = 0" in r.stderr
    c, report = repo.merge([ia, ib], rules=[{"keys": "z", "take": 1}], branch="m")  # taken on purpose: fine
    assert same_bits(repo.load(c.id)["z"], y) and report.not_merged == ()


def test_non_float_tensors_that_differ_are_named_as_not_merged(repo, three):
    _, report = repo.merge(["a", "b"], branch="m")
    assert report.not_merged == ("model.count",)  # model.on is the same in every input
    r = run_cli(repo, "merge", "a", "b", "-b", "m2")
    assert r.exit_code == 0 and "not merged (not float; they differ, input 0's taken): model.count" in r.stdout
    assert json.loads(run_cli(repo, "merge", "a", "c", "-b", "m3", "--json").stdout)["report"]["not_merged"] == \
        ["model.count"]


def test_a_recipe_of_another_shape_is_a_bad_recipe_not_a_crash(repo, three, tmp_path):
    """rules that are no list (5, true) and JSON nested past the recursion limit were internal
    errors (TypeError, RecursionError) instead of BadRecipe."""
    for bad, field in (('{"rules": 5}', "rules"), ('{"rules": true}', "rules"), ("[" * 100_000, "recipe")):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(mvc.BadRecipe) as err:
            repo.merge(["a", "b"], tmp_path / "bad.json")
        assert err.value.field == field
