"""Lazy clones that read only what they need (issue 35): refs, commits and trees at clone and fetch;
a tensor object, and the trailers of the chunk packs, only when a read or a walk needs them.

Folder remotes (fast) with 64-byte chunks and small remote packs, so one state spans many packs;
one test runs on the session's SeaweedFS.
"""

import pytest
import torch

import mvc
from mvc.errors import CorruptObject, RemoteDamaged
from mvc.remote import layout
from mvc.remote.bucket import FolderBucket
from mvc.remote.catalogue import Catalogue, read_trailer

SMALL = 64
KEYS = ("a", "b", "c", "d", "e", "f")


def state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {key: torch.randn(500, generator=g) for key in KEYS} | {"step": seed}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


@pytest.fixture
def origin(tmp_path, monkeypatch):
    """Two commits pushed to a folder remote in packs of about 2 KiB (about 30 chunks each)."""
    monkeypatch.setattr(layout, "PACK_BYTES", 2048)
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=SMALL)
    repo.commit(state(0), "first")
    repo.commit(state(1), "second")
    repo.remotes.add("origin", str(tmp_path / "remote"))
    repo.remotes.push()
    yield repo
    repo.close()


def leaf(repo, key: str, rev: str = "main") -> bytes:
    """The tensor id of ``key`` at ``rev``, from the tree alone (``entries`` reads the tensor objects)."""
    from mvc.objects import TensorLeaf
    from mvc.traverse import walk
    with repo.index.read() as txn:
        tree = repo.objects.commit_tree(txn, repo.refs.resolve(txn, rev))
        return next(value.id for path, value in walk(tree.root) if path == (key,) and isinstance(value, TensorLeaf))


def tensor_ids(repo) -> set:
    with repo.index.read() as txn:
        return set(txn.ids("tensors"))


def unread(repo) -> dict:
    catalogue = Catalogue(repo.dir, "origin")
    try:
        return catalogue.unread()
    finally:
        catalogue.close()


def chunk_packs(tmp_path) -> list:
    return sorted((tmp_path / "remote" / "packs").glob("*.pack"))


def test_a_lazy_clone_holds_no_tensor_object_and_reads_no_chunk_trailer(origin, tmp_path):
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        assert tensor_ids(lazy) == set()  # commits and trees only
        assert len(list(lazy.log())) == 2 and leaf(lazy, "a") != leaf(lazy, "a", "main~1")
        assert len(unread(lazy)) == len(chunk_packs(tmp_path)) > 8  # listed, no trailer read


def test_a_load_of_one_key_reads_its_tensor_object_and_only_the_trailers_it_needs(origin, tmp_path, monkeypatch):
    from mvc.remote import catalogue
    monkeypatch.setattr(catalogue, "THREADS", 2)  # trailers are read one, one, then two at a time
    # they are read newest first until the packs holding the key's chunks are found: how many that is
    remote = FolderBucket(tmp_path / "remote")
    order = catalogue.read_order({key: [size, stamp] for key, size, stamp in remote.list_stamps("packs/")})
    listed = [{cid for cid, _, _ in read_trailer(remote, key)} for key in order]

    def reads(key: str) -> int:
        with origin.index.read() as txn:
            wanted = set(origin.objects.tensor(txn, leaf(origin, key)).chunks)
        last, read = max(i for i, ids in enumerate(listed) if wanted & ids), 0
        while read <= last:
            read += min(2, max(1, read))  # batches of 1, 1, 2, 2 ...
        return min(read, len(order))
    key = min(KEYS, key=reads)
    assert reads(key) < len(order)
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        got = lazy.load("main", only=key)
        assert same(got, {key: origin.load("main")[key]})
        assert tensor_ids(lazy) == {leaf(lazy, key)}  # kept here, verified
        assert len(order) - len(unread(lazy)) == reads(key)
    with mvc.Repository.open(tmp_path / "lz") as lazy:  # the next process finds them here
        assert same(lazy.load("main"), origin.load("main")) and len(tensor_ids(lazy)) == len(KEYS)
        assert lazy.fsck().ok and len(tensor_ids(lazy)) == 2 * len(KEYS)  # its walk read main~1's too


def test_fetch_into_a_lazy_clone_reads_no_tensor_object_nor_new_chunk_trailer(origin, tmp_path):
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        lazy.load("main", only="a")
        before = set(unread(lazy))
        origin.commit(state(2), "third")
        origin.remotes.push()
        report = lazy.remotes.fetch()
        assert report.objects == 2  # the commit and its tree
        assert len(tensor_ids(lazy)) == 1
        new = set(unread(lazy)) - before
        assert new and {p.name for p in chunk_packs(tmp_path)} >= {k.rpartition("/")[2] for k in new}
        assert same(lazy.load("origin/main"), state(2))


@pytest.mark.parametrize("walk", ["fsck", "gc", "diff"])
def test_a_walk_in_a_lazy_clone_reads_the_tensor_objects_it_needs(origin, tmp_path, walk):
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        if walk == "fsck":
            assert lazy.fsck().ok
        elif walk == "gc":
            assert lazy.gc().chunks_removed == 0
        else:
            assert len(lazy.diff("main~1", "main", read_data=False).changed()) == len(KEYS)
        assert len(tensor_ids(lazy)) == 2 * len(KEYS)
        assert lazy.fsck().ok and same(lazy.load("main"), origin.load("main"))


def test_a_tensor_object_damaged_on_the_remote_is_refused_and_not_kept(origin, tmp_path):
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        a = leaf(lazy, "a")
        catalogue = Catalogue(lazy.dir, "origin")
        try:
            key, offset, length = catalogue.object_locations([a])[a]
        finally:
            catalogue.close()
    path = tmp_path / "remote" / key
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        with pytest.raises(CorruptObject) as err:
            lazy.load("main", only="a")
        assert err.value.id == a.hex() and "remote 'origin'" in str(err.value)
        assert tensor_ids(lazy) == set()  # nothing kept
        assert same(lazy.load("main", only="b"), {"b": origin.load("main")["b"]})


def _delete_remote_pack_of(lazy, remote, key: str) -> bytes:
    """Delete from folder remote ``remote`` the chunk pack that holds the first chunk of tensor
    ``key`` of the lazy clone's main, as its catalogue says; that chunk's id."""
    with lazy.index.read() as txn:
        first = lazy.objects.tensor(txn, leaf(lazy, key)).chunks[0]
    catalogue = Catalogue(lazy.dir, "origin")
    try:
        with catalogue.index.read() as txn:
            name = catalogue.chunk(first, txn).pack
    finally:
        catalogue.close()
    (remote / layout.pack_key(layout.CHUNK_PACKS, name)).unlink()
    return first


def test_fetch_notices_a_chunk_pack_gone_that_an_evicted_read_relies_on(origin, tmp_path):
    """Loaded, then evicted: the chunks live only on the remote. A pack holding some of them is
    deleted there (not by gc: its refs still need it): the next fetch says the remote is damaged."""
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        lazy.load("main", only="a")
        lazy.checkout("main~1")  # HEAD pins main~1, which shares nothing with main
        assert lazy.cache.evict(0).chunks_evicted > 0
        first = _delete_remote_pack_of(lazy, tmp_path / "remote", "a")
        with pytest.raises(RemoteDamaged) as err:
            lazy.remotes.fetch()
        assert err.value.remote == "origin" and err.value.ids


def test_a_lazy_clone_of_seaweedfs_reads_one_tensor_on_demand(tmp_path, seaweedfs, monkeypatch):
    monkeypatch.setattr(layout, "PACK_BYTES", 2048)
    url = seaweedfs.url()
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=SMALL)
    repo.commit(state(0), "first")
    repo.remotes.add("origin", url, seaweedfs.endpoint)
    repo.remotes.push()
    try:
        with mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint) as lazy:
            assert tensor_ids(lazy) == set() and len(unread(lazy)) >= 4
            assert same(lazy.load("main", only="c"), {"c": state(0)["c"]})
            assert len(tensor_ids(lazy)) == 1
            assert same(lazy.load("main"), state(0)) and lazy.fsck().ok
    finally:
        repo.close()


def test_a_lazy_clone_that_read_nothing_finds_lost_packs_at_its_first_read(origin, tmp_path):
    """What a lazy clone never read it cannot check cheaply (every tensor object and trailer): its
    fetch passes, and the first read of the lost data fails clearly; fsck (a walk) names it."""
    mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True).close()
    for pack in chunk_packs(tmp_path):
        pack.unlink()
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        assert lazy.remotes.fetch().lost == 0
        with pytest.raises(mvc.errors.ObjectNotFound) as err:
            lazy.load("main", only="a")
        assert "neither here nor on remote 'origin'" in str(err.value)
        assert not lazy.fsck().ok
        with pytest.raises(RemoteDamaged):  # now it read them, it relies on them
            lazy.remotes.fetch()


def test_a_trailer_read_as_arrays_is_the_trailer_read_entry_by_entry():
    """``parse_trailer_table`` (numpy, for the 3·10⁵-record trailers of 64-byte chunks) lists what
    ``parse_trailer`` does, ids ending in zero bytes included, and refuses the same damage."""
    import os
    items = [(os.urandom(30) + b"\0\0", 64), (bytes(32), 10), (os.urandom(32), 100)] * 30
    image = layout.PackImage(items)
    data = bytes(image.data)
    footer = data[-layout.FOOTER.size:]
    start, stop = layout.trailer_span(footer, len(data), "k")
    ids, offsets, lengths = layout.parse_trailer_table(data[start:stop], footer, len(data), "k")
    assert list(zip(ids, offsets.tolist(), lengths.tolist())) == layout.parse_trailer(data[start:stop], footer,
                                                                                      len(data), "k")
    assert ids[0].endswith(b"\0\0") and ids[1] == bytes(32)
    flipped = bytearray(data[start:stop])
    flipped[10] ^= 1
    with pytest.raises(CorruptObject):
        layout.parse_trailer_table(bytes(flipped), footer, len(data), "k")
    short = data[:start - 1] + data[start:]  # every offset now points one byte past the data it names
    with pytest.raises(CorruptObject):
        layout.parse_trailer_table(data[start:stop], footer[:-16] + (start - 1).to_bytes(8, "little") +
                                   footer[-8:], len(short), "k")


def test_reading_tensor_metadata_makes_no_fetch_read_every_trailer(origin, tmp_path):
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        assert len(lazy.entries("main")) == len(KEYS) + 1  # reads main's tensor objects, no chunk
        before = unread(lazy)
        assert lazy.remotes.fetch().lost == 0
        assert unread(lazy) == before


def test_a_lost_pack_a_lazy_clone_relied_on_is_named_at_every_fetch_until_repaired(origin, tmp_path):
    """Relied on: main's chunks, loaded then evicted (read there when next needed). Packs pushed
    since are listed, not read; the lost pack is still noticed, at every fetch, not only the first."""
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        lazy.load("main")
        lazy.checkout("main~1")
        assert lazy.cache.evict(0).chunks_evicted > 0
        origin.commit(state(5), "third")
        origin.remotes.push()
        assert lazy.remotes.fetch().objects == 2 and unread(lazy)
        first = _delete_remote_pack_of(lazy, tmp_path / "remote", "a")
        for seed in (6, 7):  # a push between the two: packs listed and not read at each fetch
            origin.commit(state(seed), "more")
            origin.remotes.push()
            with pytest.raises(RemoteDamaged) as err:
                lazy.remotes.fetch()
            assert first in err.value.ids
        origin.remotes.repair()
        assert lazy.remotes.fetch().lost == 0 and same(lazy.load("main"), state(1))


def test_a_catalogued_trailer_lists_its_ids_as_every_mvc_reads_them(tmp_path):
    """add_table (a trailer read as arrays) stores a pack's ids as a msgpack list of ids, as
    add_pack and every earlier mvc do: an older mvc opening the same repository reads it."""
    import numpy as np
    from mvc import encoding
    (tmp_path / ".mvc").mkdir()
    catalogue = Catalogue(tmp_path / ".mvc", "origin")
    try:
        ids = [bytes([i]) * 32 for i in range(100)]
        key = layout.pack_key(layout.CHUNK_PACKS, bytes(16))
        catalogue.add_table(key, ids, np.arange(100, dtype=np.uint64) * 64, np.full(100, 64, dtype=np.uint32))
        with catalogue.index.read() as txn:
            assert encoding.unpack(txn.meta("pack:" + key), "entry") == ids
        assert catalogue.chunks(ids[:3]) == {cid: catalogue.chunk(cid) for cid in ids[:3]}
    finally:
        catalogue.close()
