"""Walks over all history in a lazy clone read the tensor objects they need in batches (issue 35).

``fsck`` and gc planning walk every live tensor object; a lazy clone reads those from the remote's
object packs. They are read a batch at a time (``LazyObjects.prefetch``): a ranged read per run of
nearby records in an object pack, not one request per object, with the verdicts a read of each by
itself gives, a damaged remote copy included. Folder remotes with 64-byte chunks; one test on the
session's SeaweedFS.
"""

import pytest
import torch

import mvc
from mvc import reach
from mvc.remote import layout, tiers
from mvc.remote.catalogue import Catalogue
from mvc.store.objectstore import CORRUPT, ObjectStore

SMALL = 64
COMMITS, TENSORS = 4, 8


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {f"t{i}": torch.randn(10, generator=g) for i in range(TENSORS)} | {"step": seed}


def history(path, url: str, endpoint=None) -> None:
    """COMMITS commits of TENSORS new tensors each, each pushed by itself (an object pack per push)."""
    repo = mvc.Repository.init(path, chunk_size=SMALL)
    try:
        repo.remotes.add("origin", url, endpoint) if endpoint else repo.remotes.add("origin", url)
        for seed in range(COMMITS):
            repo.commit(state(seed), f"commit {seed}")
            repo.remotes.push()
    finally:
        repo.close()


@pytest.fixture
def remote(tmp_path, monkeypatch):
    monkeypatch.setattr(layout, "PACK_BYTES", 2048)
    history(tmp_path / "a", str(tmp_path / "remote"))
    return tmp_path / "remote"


def one_by_one(monkeypatch) -> None:
    """The walk as it was: every tensor object read from the remote by itself."""
    monkeypatch.setattr(tiers.LazyObjects, "prefetch", ObjectStore.prefetch)


def tensor_ids(repo) -> set:
    with repo.index.read() as txn:
        return set(txn.ids("tensors"))


def locations(repo) -> dict:
    """{tensor id: (object pack key, offset, length)} of every tensor of history, as the catalogue lists them."""
    with repo.index.read() as txn:
        ids = set(reach.walk(txn, ObjectStore()).tensor_trees)  # trees only: no tensor object read here
    catalogue = Catalogue(repo.dir, "origin")
    try:
        return catalogue.object_locations(ids)
    finally:
        catalogue.close()


def plan(report) -> tuple:
    """What a gc report says it would do (not the bytes on disk: the two clones' index files differ)."""
    return (report.pruned, report.commits_removed, report.trees_removed, report.tensors_removed,
            report.chunks_removed, report.packs_deleted, report.packs_rewritten, report.records_moved, report.notes,
            report.left)


def flip(remote, loc: tuple) -> None:
    """Flip a bit in the middle of the record at ``loc`` in the remote's object pack."""
    key, offset, length = loc
    path = remote / key
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_lazy_fsck_reads_the_tensor_objects_of_history_in_a_request_per_object_pack(remote, tmp_path):
    with mvc.Repository.clone(str(remote), tmp_path / "lz", lazy=True) as lazy:
        where = locations(lazy)
        assert len(where) == COMMITS * TENSORS and tensor_ids(lazy) == set()
        packs = {key for key, _, _ in where.values()}
        assert len(packs) == COMMITS
        report = lazy.fsck()
        assert report.ok and report.damage == ()
        assert lazy.objects.fetched == COMMITS * TENSORS and tensor_ids(lazy) == set(where)  # each kept here
        assert lazy.objects.requests <= len(packs)  # one batch: a ranged read per object pack
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        assert lazy.fsck().ok and lazy.objects.requests == 0  # the next process finds them here


def test_one_by_one_a_lazy_fsck_makes_a_request_per_tensor_object(remote, tmp_path, monkeypatch):
    """What the batches save: read by itself, each tensor object costs a request."""
    one_by_one(monkeypatch)
    with mvc.Repository.clone(str(remote), tmp_path / "lz", lazy=True) as lazy:
        assert lazy.fsck().ok
        assert lazy.objects.requests == lazy.objects.fetched == COMMITS * TENSORS


@pytest.mark.parametrize("walk", ["fsck", "gc"])
def test_a_damaged_remote_copy_gets_its_own_verdict_and_fails_no_other(remote, tmp_path, monkeypatch, walk):
    """A bit flipped in one tensor object's record on the remote: fsck names that tensor exactly as
    a one-by-one walk does, every other tensor object is read in the batch and kept, and gc planning
    stops on it as before."""
    for how in ("batched", "one-by-one"):  # cloned before the damage: a clone reads small objects to classify them
        with mvc.Repository.clone(str(remote), tmp_path / how, lazy=True) as lazy:
            where = locations(lazy)
    bad = sorted(where)[len(where) // 2]
    flip(remote, where[bad])
    results, kept, requests = {}, {}, {}
    for how in ("batched", "one-by-one"):
        if how == "one-by-one":
            one_by_one(monkeypatch)
        with mvc.Repository.open(tmp_path / how) as lazy:
            if walk == "fsck":
                report = lazy.fsck()
                results[how] = report.damage
            else:
                with pytest.raises(mvc.errors.WalkDamaged) as err:
                    lazy.gc(dry_run=True)
                results[how] = err.value.kind, err.value.what, str(err.value)
            kept[how] = tensor_ids(lazy)
            requests[how] = lazy.objects.requests
    assert results["batched"] == results["one-by-one"]
    # the damaged copy is never kept; the batch kept every other (gc stops at the damage, so read
    # one by one it kept only those it met before)
    assert kept["batched"] == set(where) - {bad} and kept["one-by-one"] <= kept["batched"]
    if walk == "fsck":
        assert kept["one-by-one"] == kept["batched"]
        [damage] = results["batched"]
        assert (damage.kind, damage.object) == (reach.CORRUPT_TENSOR, f"tensor {bad.hex()[:12]}")
        assert "remote 'origin'" in damage.detail and damage.commits
        assert requests["one-by-one"] == len(where)
    else:
        assert results["batched"][:2] == (reach.CORRUPT_TENSOR, f"tensor {bad.hex()[:12]}")
    assert requests["batched"] <= COMMITS + 1  # a ranged read per object pack, then the damaged one alone


def test_a_prefetch_keeps_the_intact_and_leaves_a_damaged_copy_to_its_own_check(remote, tmp_path):
    with mvc.Repository.clone(str(remote), tmp_path / "lz", lazy=True) as lazy:
        where = locations(lazy)
    bad = sorted(where)[0]
    flip(remote, where[bad])
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        objects = lazy.objects
        with lazy.index.read() as txn:
            objects.prefetch(txn, "tensors", list(where))
            assert objects.fetched == len(where) - 1 and objects.requests <= COMMITS
            before = objects.requests
            for oid in where:  # served from the memo: this transaction cannot see the write
                if oid != bad:
                    verdict, obj = objects.check(txn, "tensors", oid)
                    assert verdict is None and obj.chunks
            assert objects.requests == before
            verdict, why = objects.check(txn, "tensors", bad)  # read by itself: its own verdict
            assert verdict == CORRUPT and "remote 'origin'" in why and "BLAKE3" in why
            assert objects.requests == before + 1
        assert tensor_ids(lazy) == set(where) - {bad}


def test_a_lazy_gc_plan_is_the_one_a_one_by_one_walk_makes_in_few_requests(remote, tmp_path, monkeypatch):
    plans = {}
    for how in ("batched", "one-by-one"):
        if how == "one-by-one":
            one_by_one(monkeypatch)
        with mvc.Repository.clone(str(remote), tmp_path / how, lazy=True) as lazy:
            plans[how] = plan(lazy.gc(keep_last=2, dry_run=True))
            requests = lazy.objects.requests
            if how == "batched":
                assert requests <= 2 * COMMITS  # two walks, a ranged read per object pack each at most
    assert plans["batched"] == plans["one-by-one"]
    assert requests >= (COMMITS - 2) * TENSORS  # one by one: a request for each live tensor object


def test_a_lazy_fsck_of_seaweedfs_reads_tensor_objects_in_a_request_per_object_pack(tmp_path, seaweedfs,
                                                                                     monkeypatch):
    monkeypatch.setattr(layout, "PACK_BYTES", 2048)
    url = seaweedfs.url()
    history(tmp_path / "a", url, seaweedfs.endpoint)
    with mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint) as lazy:
        report = lazy.fsck()
        assert report.ok and lazy.objects.fetched == COMMITS * TENSORS
        assert lazy.objects.requests <= COMMITS
        assert len(tensor_ids(lazy)) == COMMITS * TENSORS


def test_a_lazy_load_of_a_whole_commit_reads_its_tensor_objects_in_one_request(remote, tmp_path):
    with mvc.Repository.clone(str(remote), tmp_path / "lz", lazy=True) as lazy:
        got = lazy.load("main")
        want = state(COMMITS - 1)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want if k != "step")
        assert got["step"] == want["step"]
        assert lazy.objects.fetched == TENSORS and lazy.objects.requests == 1  # the last push's object pack


def test_a_lazy_diff_reads_the_tensor_objects_of_both_trees_in_a_request_each(remote, tmp_path):
    with mvc.Repository.clone(str(remote), tmp_path / "lz", lazy=True) as lazy:
        assert len(lazy.diff("main~1", "main", read_data=False).changed()) == TENSORS
        assert lazy.objects.fetched == 2 * TENSORS and lazy.objects.requests == 2  # an object pack each


def test_a_lazy_eviction_reads_the_tensor_objects_of_history_in_a_request_per_object_pack(remote, tmp_path):
    """Eviction works out which chunks the remote's refs need: every tensor object of history."""
    with mvc.Repository.clone(str(remote), tmp_path / "lz", lazy=True) as lazy:
        assert torch.equal(lazy.load("main", only="t0")["t0"], state(COMMITS - 1)["t0"])
        lazy.checkout("main~1")  # HEAD pins main~1, which shares nothing with main
        before = lazy.objects.requests
        assert lazy.cache.evict(0).chunks_evicted > 0
        assert lazy.objects.fetched == COMMITS * TENSORS
        assert lazy.objects.requests - before <= 2 * COMMITS  # two walks: the pinned, and what the remote needs
        assert torch.equal(lazy.load("main", only="t0")["t0"], state(COMMITS - 1)["t0"])


def test_an_object_pack_moved_on_the_remote_is_read_where_it_is_now_in_one_more_request(remote, tmp_path):
    """An object pack the catalogue names is gone (a remote gc or repair rewrote it: here, renamed):
    the batch lists the remote once and reads those objects again where they are now, together."""
    with mvc.Repository.clone(str(remote), tmp_path / "lz", lazy=True) as lazy:
        where = locations(lazy)
    key = sorted({key for key, _, _ in where.values()})[0]
    (remote / key).rename(remote / key.replace(key.rpartition("/")[2][:4], "ffff", 1))
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        assert lazy.fsck().ok and tensor_ids(lazy) == set(where)
        assert lazy.objects.requests <= COMMITS + 1
