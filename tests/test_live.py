"""The live version switch (repo.load_into) and partial loads (repo.load(only=))."""

import pytest
import torch

import mvc
from damage import flip_bit, records


def _state(seed: int, head_seed: int = None):
    g = torch.Generator().manual_seed(seed)
    h = torch.Generator().manual_seed(1000 + (seed if head_seed is None else head_seed))
    return {"model": {"backbone.weight": torch.randn(8, 16, generator=g),
                      "head.weight": torch.randn(4, 8, generator=h),
                      "count": torch.arange(5)},
            "step": seed}


def _commit_two(repo):
    a = repo.commit(_state(1), "a").id
    b = repo.commit(_state(1, head_seed=2), "b").id  # only the head differs
    return a, b


def _live():
    s = _state(99)
    return {k: v.clone() for k, v in s["model"].items()}


def _equal(live: dict, saved: dict) -> bool:
    return all(torch.equal(live[k], saved[k]) for k in saved)


def test_load_into_updates_in_place_and_reads_only_what_differs(repo):
    a, b = _commit_two(repo)
    live = _live()
    ptrs = {k: v.data_ptr() for k, v in live.items()}
    first = repo.load_into({"model": live}, a)
    assert _equal(live, repo.load(a)["model"])
    assert first.tensors_updated == 3 and first.bytes_skipped == 0
    switch = repo.load_into({"model": live}, b)
    assert _equal(live, repo.load(b)["model"])
    assert {k: v.data_ptr() for k, v in live.items()} == ptrs  # the same memory, updated in place
    assert switch.tensors_updated == 1
    assert switch.bytes_read == 4 * 8 * 4
    back = repo.load_into({"model": live}, a)
    assert back.bytes_read == 4 * 8 * 4 and _equal(live, repo.load(a)["model"])
    again = repo.load_into({"model": live}, a)
    assert again.bytes_read == 0 and again.tensors_updated == 0


def _loaded_then_written(repo, how: str) -> tuple:
    """(commit a, live tensors): a loaded into them, then the backbone written to ``how``."""
    a, _ = _commit_two(repo)
    live = _live()
    repo.load_into({"model": live}, a)
    w = live["backbone.weight"]
    if how == "data":
        w.data.add_(1.0)  # .data does not move w._version
    elif how == "numpy":
        w.numpy()[3, 4] = 7.0
    elif how == "inplace":
        w.mul_(2.0)
    elif how == "optimizer":
        p = torch.nn.Parameter(w)  # shares w's memory and version counter
        p.grad = torch.ones_like(p)
        torch.optim.SGD([p], lr=0.5).step()
    else:
        torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(w))[0, 0] = -1.0
    return a, live


@pytest.mark.parametrize("how", ["data", "numpy", "inplace", "optimizer", "dlpack"])
def test_a_write_of_any_kind_is_never_skipped(repo, how):
    a, live = _loaded_then_written(repo, how)
    switch = repo.load_into({"model": live}, a)
    assert switch.tensors_updated == 1 and switch.bytes_read > 0
    assert _equal(live, repo.load(a)["model"])


def _tensors_of(node) -> list:
    if isinstance(node, torch.Tensor):
        return [node]
    items = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else ()
    return [t for v in items for t in _tensors_of(v)]


def test_a_module_and_an_optimizer_are_loaded(repo):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    c1 = repo.commit({"model": model.state_dict(), "optimizer": opt.state_dict()}, "one").id
    saved = repo.load(c1)
    fresh = torch.nn.Linear(4, 3)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=5.0)  # no state yet, another lr
    weight = fresh.weight
    switch = repo.load_into({"model": fresh, "optimizer": fresh_opt}, c1)
    assert fresh.weight is weight and torch.equal(fresh.weight, saved["model"]["weight"])
    # the moments the fresh optimizer lacked were read whole: they count as read
    every = [t for part in ("model", "optimizer") for t in _tensors_of(saved[part])]
    assert switch.bytes_read == sum(t.nbytes for t in every) and switch.bytes_skipped == 0
    got = fresh_opt.state_dict()
    assert got["param_groups"][0]["lr"] == 1e-3
    for pid, per in saved["optimizer"]["state"].items():
        for name, value in per.items():
            assert torch.equal(got["state"][pid][name], value)


def test_shape_or_dtype_mismatch_changes_nothing(repo):
    a, _ = _commit_two(repo)
    live = _live()
    live["head.weight"] = torch.zeros(4, 9)
    before = {k: v.clone() for k, v in live.items()}
    with pytest.raises(mvc.errors.TargetMismatch) as err:
        repo.load_into({"model": live}, a)
    assert (err.value.key, err.value.problem, err.value.id) == ("model.head.weight", "dtype-shape", a)
    assert (err.value.here, err.value.committed) == (("F32", (4, 9)), ("F32", (4, 8)))
    assert _equal(live, before)
    live["head.weight"] = before["head.weight"] = torch.zeros(4, 8, dtype=torch.float64)
    with pytest.raises(mvc.errors.TargetMismatch) as err:
        repo.load_into({"model": live}, a)
    assert (err.value.key, err.value.here, err.value.committed) == ("model.head.weight", ("F64", (4, 8)), ("F32", (4, 8)))
    assert _equal(live, before)
    live["head.weight"] = before["head.weight"] = torch.zeros(4, 8)
    with pytest.raises(mvc.errors.TargetMismatch) as err:
        repo.load_into({"model": {**live, "nope": torch.zeros(1)}}, a)
    assert (err.value.key, err.value.problem) == ("model.nope", "no-key")
    assert _equal(live, before)


def test_corrupt_chunk_changes_nothing(repo):
    a, _ = _commit_two(repo)
    live = _live()
    before = {k: v.clone() for k, v in live.items()}
    target = next(e for e in repo.entries(a) if e.key == "model.head.weight").chunks[0]
    path, _, off, _ = next(r for r in records(repo) if r[1] == target)
    flip_bit(path, off)
    with pytest.raises(mvc.ChecksumMismatch):
        repo.load_into({"model": live}, a)
    assert _equal(live, before)


def test_strided_live_tensor_and_plain_values(repo):
    a, _ = _commit_two(repo)
    base = torch.zeros(16, 8)
    live = _live()
    live["backbone.weight"] = base.t()  # a transposed view: not contiguous
    target = {"model": live, "step": 0}
    repo.load_into(target, a)
    assert torch.equal(base.t(), repo.load(a)["model"]["backbone.weight"])
    assert target["step"] == 1
    base.t()[0, 0] += 1  # a write through another view of the same memory
    switch = repo.load_into(target, a)
    assert switch.tensors_updated == 1 and torch.equal(base.t(), repo.load(a)["model"]["backbone.weight"])


def test_only_given_keys_are_touched(repo):
    a, _ = _commit_two(repo)
    live = {"head.weight": torch.zeros(4, 8)}
    switch = repo.load_into({"model": live}, a)
    assert switch.tensors == 1 and torch.equal(live["head.weight"], repo.load(a)["model"]["head.weight"])


def test_load_only_reads_and_verifies_just_the_matching_tensors(repo):
    a, _ = _commit_two(repo)
    full = repo.load(a)
    head = repo.load(a, only="model.head.*")
    assert list(head) == ["model"] and list(head["model"]) == ["head.weight"]
    assert torch.equal(head["model"]["head.weight"], full["model"]["head.weight"])
    assert repo.load(a, only="step") == {"step": 1}
    with pytest.raises(mvc.errors.NoMatch):  # a pattern that matches nothing is an error, not {}
        repo.load(a, only="nothing*")
    # damage a backbone chunk: loading the head alone still works, the backbone is refused
    backbone = repo.entries(a)[0]
    assert backbone.key == "model.backbone.weight"
    target = backbone.chunks[0]
    path, _, off, _ = next(r for r in records(repo) if r[1] == target)
    flip_bit(path, off)
    assert torch.equal(repo.load(a, only="model.head.weight")["model"]["head.weight"], full["model"]["head.weight"])
    with pytest.raises(mvc.ChecksumMismatch) as err:
        repo.load(a, only="model.backbone.*")
    assert (err.value.id, err.value.what) == (target.hex(), f"tensor 'model.backbone.weight' in commit {a[:12]}")


def test_only_keeps_list_positions(repo):
    c = repo.commit({"layers": [torch.ones(2), torch.zeros(3)], "t": (1, torch.ones(1))}).id
    got = repo.load(c, only="layers.1")
    assert got["layers"][0] is None and torch.equal(got["layers"][1], torch.zeros(3))
    assert "t" not in got


# -- commits reuse the ids of unchanged chunks, never of changed ones ---------------

@pytest.mark.parametrize("how", ["data", "numpy", "dlpack", "inplace", "none"])
def test_every_write_is_committed(repo, how):
    model = torch.nn.Linear(16, 8)
    first = repo.commit({"model": model.state_dict()}, "one")
    w = model.weight
    version = w._version
    if how == "data":
        w.data.add_(1.0)
    elif how == "numpy":
        w.detach().numpy()[2, 3] = 42.0
    elif how == "dlpack":
        torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(w.detach()))[0, 0] = -7.0
    elif how == "inplace":
        with torch.no_grad():
            w.mul_(3.0)
    if how in ("data", "numpy", "dlpack"):
        assert w._version == version  # the counter misses these writes: mvc must not rely on it
    second = repo.commit({"model": model.state_dict()}, "two")
    assert torch.equal(repo.load(second.id)["model"]["weight"], model.weight.detach())
    assert torch.equal(repo.load(second.id)["model"]["bias"], model.bias.detach())
    changed = 0 if how == "none" else 1
    assert (first.tree == second.tree) == (changed == 0)


def test_a_chunk_the_store_lost_is_written_again(repo):
    t = torch.randn(100)
    first = repo.commit({"t": t}, "one")
    lost = repo.entries(first.id)[0].chunks[0]
    with repo.index.write() as txn:  # as if gc had deleted it (nothing named it any more)
        txn.delete_chunk(lost)
    c = repo.commit({"t": t}, "again")
    assert c.stats.chunks_new == 1
    assert torch.equal(repo.load(c.id)["t"], t)


def _fingerprinted(monkeypatch) -> list:
    """Bytes fingerprinted per call, as the calls come: a load's first call is
    its check of the live bytes, later ones take prints of bytes just read."""
    from mvc import fingerprint
    seen, real = [], fingerprint.many

    def many(pieces, threads=2):
        seen.append(sum(memoryview(p).nbytes for p in pieces))
        return real(pieces, threads)
    monkeypatch.setattr(fingerprint, "many", many)
    return seen


def test_on_the_callers_promise_a_switch_reads_no_live_byte(repo, monkeypatch):
    a, b = _commit_two(repo)
    live = _live()
    repo.load_into({"model": live}, a)
    seen = _fingerprinted(monkeypatch)
    switch = repo.load_into({"model": live}, b, check_live=False)
    assert seen[0] == 0 and switch.bytes_read == 4 * 8 * 4  # no live byte checked; the head alone read
    assert _equal(live, repo.load(b)["model"])
    seen.clear()
    back = repo.load_into({"model": live}, a, check_live=False)
    assert seen[0] == 0 and back.bytes_read == 4 * 8 * 4 and _equal(live, repo.load(a)["model"])
    seen.clear()
    repo.load_into({"model": live}, b)  # the default still fingerprints every chunk it skips
    assert seen[0] == 8 * 16 * 4 + 5 * 8 and _equal(live, repo.load(b)["model"])


@pytest.mark.parametrize("how", ["inplace", "optimizer"])
def test_on_the_promise_a_counted_write_is_still_caught(repo, how):
    a, live = _loaded_then_written(repo, how)
    switch = repo.load_into({"model": live}, a, check_live=False)
    assert switch.tensors_updated == 1 and switch.bytes_read == 8 * 16 * 4
    assert _equal(live, repo.load(a)["model"])


def test_the_promise_does_not_cover_what_a_commit_last_saw(repo, monkeypatch):
    live = _live()
    a = repo.commit({"model": live, "step": 0}, "a").id
    live["backbone.weight"].numpy()[0, 0] = 5.0  # after the commit, past the version counter
    seen = _fingerprinted(monkeypatch)
    switch = repo.load_into({"model": live}, a, check_live=False)
    assert seen and seen[0] > 0  # checked by fingerprint: the commit's record carries no version
    assert switch.tensors_updated == 1 and _equal(live, repo.load(a)["model"])


def test_the_promise_does_not_cover_a_new_tensor_at_a_freed_one_s_address(repo):
    """A record is of a storage, not of an address: a tensor made later over the same memory (a new
    model each evaluation round, where malloc hands back the freed block) was never loaded by mvc."""
    import numpy as np
    a = repo.commit({"w": torch.arange(4096, dtype=torch.float32)}, "a").id
    buf = np.zeros(4096, dtype=np.float32)
    first = torch.from_numpy(buf)
    repo.load_into({"w": first}, a, check_live=False)
    del first  # its storage goes; the memory stays (numpy's)
    buf[:] = 7.0  # what a new model's init would leave there
    second = torch.from_numpy(buf)  # same address, shape, dtype and version counter as the record's
    switch = repo.load_into({"w": second}, a, check_live=False)
    assert switch.bytes_read == 4096 * 4 and torch.equal(second, torch.arange(4096, dtype=torch.float32))


def test_the_promise_does_not_pair_a_sharded_commit_s_chunks_with_other_offsets(tmp_path):
    """Pieces of a sharded commit restart their chunking: its chunk i is not at offset i * chunk_size,
    so after loading it only fingerprints may say a chunk of a plain commit is already there."""
    from mvc.sharded import ShardedTensor
    repo = mvc.Repository.init(tmp_path, chunk_size=1024)
    sharded = torch.zeros(1000)
    sharded[506:] = 1.0
    start = repo.shards.begin()
    one, two = repo.shards.write([sharded[:250].contiguous()]), repo.shards.write([sharded[250:].contiguous()])
    leaf = ShardedTensor("F32", (1000,), [([0], [250], one["tensors"][0]["chunks"]),
                                          ([250], [750], two["tensors"][0]["chunks"])])
    s = repo.shards.commit(start, {("w",): leaf}, {**one["locations"], **two["locations"]}, message="rows").id
    plain = repo.commit({"w": torch.zeros(1000)}).id  # its chunk 1: 1024 zero bytes, as the shards' chunk 1
    live = {"w": torch.full((1000,), 5.0)}
    repo.load_into(live, s, check_live=False)
    assert torch.equal(live["w"], sharded)
    repo.load_into(live, plain, check_live=False)
    assert torch.equal(live["w"], torch.zeros(1000))
    repo.close()


def test_inference_tensors_have_no_counter_and_are_checked(repo):
    a, _ = _commit_two(repo)
    with torch.inference_mode():
        live = _live()
    repo.load_into({"model": live}, a)
    live["backbone.weight"].numpy()[1, 1] = 3.0
    switch = repo.load_into({"model": live}, a, check_live=False)
    assert switch.tensors_updated == 1 and _equal(live, repo.load(a)["model"])
