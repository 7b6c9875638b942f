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


def holding(tmp_path, ids) -> set:
    """Keys of the remote's chunk packs whose trailers list some of ``ids``."""
    remote = FolderBucket(tmp_path / "remote")
    return {key for key, _ in remote.list("packs/") if set(ids) & {cid for cid, _, _ in read_trailer(remote, key)}}


def remote_keys(tmp_path) -> set:
    return {p.relative_to(tmp_path / "remote").as_posix() for p in chunk_packs(tmp_path)}


def chunks_of(repo, key: str, rev: str = "main") -> tuple:
    with repo.index.read() as txn:
        return repo.objects.tensor(txn, leaf(repo, key, rev)).chunks


def test_a_load_of_one_key_reads_its_tensor_object_and_only_the_trailers_its_hint_names(origin, tmp_path):
    """Key "a" of main~1: its chunks lie in the oldest packs, which a search newest first would
    read last. The push's where hint names them: they are the only trailers read."""
    wanted = holding(tmp_path, chunks_of(origin, "a", "main~1"))
    assert len(chunk_packs(tmp_path)) > 2 * len(wanted)
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        got = lazy.load("main~1", only="a")
        assert same(got, {"a": origin.load("main~1")["a"]})
        assert tensor_ids(lazy) == {leaf(lazy, "a", "main~1")}  # kept here, verified
        assert set(unread(lazy)) == remote_keys(tmp_path) - wanted
        catalogue = lazy.chunks.conn.catalogue
        assert catalogue.trailers_read == catalogue.trailers_hinted == len(wanted)
    with mvc.Repository.open(tmp_path / "lz") as lazy:  # the next process finds them here
        assert same(lazy.load("main"), origin.load("main")) and len(tensor_ids(lazy)) == len(KEYS) + 1
        assert lazy.fsck().ok and len(tensor_ids(lazy)) == 2 * len(KEYS)  # its walk read main~1's too


def _hint_of(tmp_path, lazy, tid: bytes) -> tuple:
    """(where hint key, its decoded content) of the object pack the lazy clone's catalogue lists ``tid`` in."""
    from mvc.remote import where
    catalogue = Catalogue(lazy.dir, "origin")
    try:
        key = "where/" + layout.pack_name(catalogue.object_locations([tid])[tid][0]).hex()
    finally:
        catalogue.close()
    return key, where.decode((tmp_path / "remote" / key).read_bytes())


@pytest.mark.parametrize("stale", ["pack deleted, repaired elsewhere", "pack that lists none of them", "damaged"])
def test_a_stale_where_hint_still_loads_bit_for_bit(origin, tmp_path, stale):
    """The hint names a pack a repair replaced (gone from the listing), or one that does not hold
    the chunks (a repack moved them), or it does not decode: the search goes on newest first."""
    from mvc.remote import where
    mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "probe", lazy=True).close()
    with mvc.Repository.open(tmp_path / "probe") as probe:
        tid = leaf(probe, "a", "main~1")
        key, hints = _hint_of(tmp_path, probe, tid)
    named = {layout.pack_key(layout.CHUNK_PACKS, n) for n in hints[tid][1]}
    assert named == holding(tmp_path, chunks_of(origin, "a", "main~1"))
    if stale.startswith("pack deleted"):
        for pack in named:
            (tmp_path / "remote" / pack).unlink()
        origin.remotes.repair()  # the lost chunks go up again, in new packs
        assert not named & remote_keys(tmp_path)
    elif stale == "damaged":
        data = bytearray((tmp_path / "remote" / key).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (tmp_path / "remote" / key).write_bytes(bytes(data[:-3]))
    else:
        other = sorted(remote_keys(tmp_path) - named)[0]
        hints[tid] = (hints[tid][0][:1], [layout.pack_name(other)])
        runs = {t: list(zip(starts.tolist(), names)) for t, (starts, names) in hints.items()}
        (tmp_path / "remote" / key).write_bytes(where.encode(runs))
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        assert same(lazy.load("main~1", only="a"), {"a": origin.load("main~1")["a"]})
        catalogue = lazy.chunks.conn.catalogue
        assert catalogue.trailers_hinted == (1 if stale.startswith("pack that") else 0)
        assert catalogue.trailers_read > catalogue.trailers_hinted  # then newest first
        assert same(lazy.load("main"), origin.load("main")) and lazy.fsck().ok


def test_a_remote_without_where_hints_still_loads(origin, tmp_path):
    """As an older mvc pushed it: no ``where/`` keys. Lookups search newest first, as before."""
    import shutil
    hints = tmp_path / "remote" / "where"
    assert hints.is_dir() and len(list(hints.iterdir())) == len(list((tmp_path / "remote" / "objects").iterdir()))
    shutil.rmtree(hints)
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        assert same(lazy.load("main~1", only="a"), {"a": origin.load("main~1")["a"]})
        catalogue = lazy.chunks.conn.catalogue
        assert catalogue.trailers_hinted == 0 and catalogue.trailers_read > 0
        assert same(lazy.load("main"), origin.load("main")) and lazy.fsck().ok


def sharded_state(seed: int) -> tuple:
    """(world, rows, names, full, step) of the sharded tests: 4 ranks, each saving its 16 rows of
    three (64, 32) tensors; rank 1 also a one-chunk ``step`` every rank loads."""
    world, rows, names = 4, 16, ("w", "m", "v")
    g = torch.Generator().manual_seed(seed)
    return world, rows, names, {n: torch.randn(world * rows, 32, generator=g) for n in names}, torch.tensor(7.0)


def sharded_leaves(descs: list, full: dict, rows: int) -> dict:
    """The tree of a sharded commit of the ranks' ``shards.write`` results: rank r's ``rows`` rows
    of each tensor of ``full``, in order, then the one-chunk ``step`` rank 1 saved after them."""
    last = len(full)
    leaves = {(n,): mvc.ShardedTensor(descs[0]["tensors"][i]["dtype"], tuple(t.shape),
                                      [((r * rows, 0), (rows, t.shape[1]), descs[r]["tensors"][i]["chunks"])
                                       for r in range(len(descs))]) for i, (n, t) in enumerate(full.items())}
    leaves[("step",)] = mvc.ShardedTensor(descs[1]["tensors"][last]["dtype"], (),
                                          [((), (), descs[1]["tensors"][last]["chunks"])])
    return leaves


def seed_remote(tmp_path) -> None:
    """A folder remote at ``tmp_path/remote`` holding one small commit on main."""
    with mvc.Repository.init(tmp_path / "seed", chunk_size=SMALL) as seed:
        seed.commit({"seed": torch.zeros(4)}, "seed")
        seed.remotes.add("origin", str(tmp_path / "remote"))
        seed.remotes.push()


def test_one_rank_of_a_sharded_load_reads_only_its_own_packs_trailers(tmp_path, monkeypatch):
    """A 4-rank sharded save (``repo.shards``, the DCP writer's path: each rank writes its own pack;
    rank 1 also a value every rank loads, as DCP saves an optimizer's replicated ``step``), pushed;
    then each rank, on a lazy clone of its own, reads its own pieces and the value (``read_pieces``,
    the DCP reader's path): it reads the trailers of its own packs, a quarter of the trailer bytes."""
    monkeypatch.setattr(layout, "PACK_BYTES", 4096)
    world, rows, names, full, step = sharded_state(3)
    with mvc.Repository.init(tmp_path / "a", chunk_size=SMALL) as repo:
        start, locations, descs = repo.shards.begin("main"), {}, []
        for rank in range(world):
            parts = [full[n][rank * rows:(rank + 1) * rows].contiguous() for n in names]
            descs.append(repo.shards.write(parts + ([step] if rank == 1 else [])))
            locations.update(descs[-1]["locations"])
        leaves = sharded_leaves(descs, full, rows)
        repo.shards.commit(start, leaves, locations, None, "sharded")
        repo.remotes.add("origin", str(tmp_path / "remote"))
        repo.remotes.push()
    assert len(trailer_sizes(tmp_path)) > world
    each_rank_loads_its_rows_reading_its_own_trailers(tmp_path, world, rows, names, full, step)


def trailer_sizes(tmp_path) -> dict:
    """{chunk pack key: the bytes of its trailer and footer} of the folder remote."""
    from mvc.remote import catalogue as catalogues
    remote, sizes = FolderBucket(tmp_path / "remote"), {}
    for key, _ in remote.list("packs/"):
        body, footer, _ = catalogues._trailer_bytes(remote, key)
        sizes[key] = len(body) + len(footer)
    return sizes


def each_rank_loads_its_rows_reading_its_own_trailers(tmp_path, world, rows, names, full, step) -> None:
    """Each rank, on a lazy clone of its own of the folder remote, reads its rows of ``names`` (and
    the one-chunk ``step``) bit for bit, reading at most 30% of the remote's chunk trailer bytes."""
    sizes = trailer_sizes(tmp_path)
    total = sum(sizes.values())
    for rank in range(world):
        with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / f"host{rank}", lazy=True) as host:
            view = host.shards.view("main")
            objs = [view["tensors"][(n,)] for n in names + ("step",)]
            got = mvc.reader.read_pieces(host, [(obj, rank, 0, obj.pieces()[rank][3]) for obj in objs[:-1]] +
                                         [(objs[-1], 0, 0, 4)])
            for n, data in zip(names, got):
                assert data.tobytes() == full[n][rank * rows:(rank + 1) * rows].contiguous().numpy().tobytes()
            assert got[-1].tobytes() == step.numpy().tobytes()
            read = sum(sizes[key] for key in sizes.keys() - unread(host).keys())  # the trailers it read
            assert read <= 0.30 * total, (rank, read, total)
            assert host.chunks.conn.catalogue.trailer_bytes == read


def test_ranks_saving_across_hosts_load_reading_only_their_own_packs_trailers(tmp_path, monkeypatch):
    """The DCP writer's path across hosts: each rank, on a lazy clone of its own, writes its shards
    and uploads them (``upload_shards``); rank 1 alone also saves a value every rank loads (as DCP
    saves an optimizer's ``step``, replicated, on one rank). The coordinator commits and pushes.
    Each rank, on a fresh clone, reads its own pieces and the value: at most 30% of the trailer bytes."""
    monkeypatch.setattr(layout, "PACK_BYTES", 4096)
    world, rows, names, full, step = sharded_state(4)
    seed_remote(tmp_path)
    save_across_hosts(tmp_path, "saver", full, step, world, rows)
    each_rank_loads_its_rows_reading_its_own_trailers(tmp_path, world, rows, names, full, step)


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
        name = catalogue.chunk(first).pack
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


def test_remote_gc_deletes_the_hints_of_the_object_packs_it_deletes_and_loads_stay_exact(origin, tmp_path):
    """Retention prunes main~1's data: its packs go, with their hints, and a hint whose object pack
    is gone (a killed push's) goes too. main~1's state committed again reuses tensor objects whose
    hints may name packs gone now: a lazy clone loads it bit for bit all the same."""
    remote = tmp_path / "remote"
    before = {p.name for p in (remote / "where").iterdir()}
    lone = remote / "where" / ("ab" * 16)
    lone.write_bytes(b"from a push killed before its object pack went up")
    report = origin.remotes.gc(grace=0, keep_last=1)
    gone = {layout.pack_name(key).hex() for key in report.packs_deleted if key.startswith(layout.OBJECT_PACKS)}
    assert gone & before  # object packs with hints were deleted
    hints = {p.name for p in (remote / "where").iterdir()}
    assert hints <= {p.stem for p in (remote / "objects").glob("*.pack")} and not hints & gone
    assert not lone.exists() and report.hints_deleted == 1
    origin.commit(state(0), "again")
    origin.remotes.push()
    with mvc.Repository.clone(str(remote), tmp_path / "lz", lazy=True) as lazy:
        assert same(lazy.load("main"), state(0)) and lazy.fsck().ok


# -- saving from a lazy clone: reads in proportion to what it saves ----------------------------

def listings(tmp_path) -> dict:
    """{chunk id: how many of the remote's chunk packs list it}."""
    remote, out = FolderBucket(tmp_path / "remote"), {}
    for key, _ in remote.list("packs/"):
        for cid, _, _ in read_trailer(remote, key):
            out[cid] = out.get(cid, 0) + 1
    return out


def all_chunks(repo, rev: str) -> set:
    return {cid for key in KEYS for cid in chunks_of(repo, key, rev)}


def test_read_named_reads_the_unread_trailers_named_and_hinted_packs_names_a_tensors_packs(origin, tmp_path):
    """The catalogue's two steps of a lazy push: ``hinted_packs`` of main's tensors names the packs
    that hold main's chunks; ``read_named`` reads those of them still unread, once, in one batch."""
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        catalogue = Catalogue(lazy.dir, "origin")
        try:
            catalogue.source = lambda: FolderBucket(tmp_path / "remote")
            tids = {leaf(lazy, key) for key in KEYS}
            named = catalogue.hinted_packs(tids)
            assert named == holding(tmp_path, all_chunks(origin, "main"))
            before = set(catalogue.unread())
            assert catalogue.read_named(named | {"packs/" + "ab" * 16 + ".pack"}) == len(named)
            assert catalogue.trailers_read == catalogue.trailers_hinted == len(named)
            assert set(catalogue.unread()) == before - named
            assert catalogue.read_named(named) == 0 and catalogue.trailers_read == len(named)
            assert set(catalogue.chunks(all_chunks(origin, "main"), complete=False)) == all_chunks(origin, "main")
        finally:
            catalogue.close()


def test_a_lazy_clones_push_of_a_new_commit_reads_only_the_trailers_its_hints_name(origin, tmp_path):
    """A lazy clone commits main's state with "a" changed and pushes. It reads the trailers the
    where hints name of main's tensors it keeps and of main's "a" (the new "a"'s predecessor), not
    those of main~1's packs, and sends the new "a"'s chunks only. A fresh clone loads it all bit for bit."""
    hinted = holding(tmp_path, all_chunks(origin, "main"))
    older = holding(tmp_path, all_chunks(origin, "main~1")) - hinted
    assert older
    new = state(1) | {"a": torch.randn(500, generator=torch.Generator().manual_seed(9))}
    listed = remote_keys(tmp_path)
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        lazy.commit(new, "third")
        report = lazy.remotes.push()
        read = listed - set(unread(lazy))
        assert read <= hinted and not read & older, (len(read), len(hinted))
        assert report.chunks == len(set(chunks_of(lazy, "a")))  # nothing main holds is sent again
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "full") as full:
        assert same(full.load("main"), new) and same(full.load("main~1"), state(1))
        assert same(full.load("main~2"), state(0)) and full.fsck().ok
    assert max(listings(tmp_path).values()) == 1


def test_a_chunk_a_lazy_push_sends_again_survives_remote_gc(origin, tmp_path):
    """A new key "z" holds main~1's "a" but for its last value: no hint leads a lazy clone's push to
    the packs of main~1 (no tensor at "z" before, a tensor object of its own), so it sends those
    chunks again; the remote then lists them twice. Retention keeping two commits drops main~1's
    data; every kept commit loads bit for bit from a fresh clone, and fsck --remote is clean."""
    z = state(0)["a"].clone()
    z[-1] = 0.5
    new = state(1) | {"z": z}
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True) as lazy:
        lazy.commit(new, "third")
        lazy.remotes.push()
        twice = {cid for cid, n in listings(tmp_path).items() if n > 1}
        assert twice and twice <= set(chunks_of(lazy, "z"))  # sent again: a duplicate, not a loss
    report = origin.remotes.gc(grace=0, keep_last=2)
    assert report.pruned
    check = origin.remotes.fsck()
    assert check.ok, check
    for lazy in (False, True):
        with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / f"after{lazy}", lazy=lazy) as fresh:
            assert same(fresh.load("main"), new) and same(fresh.load("main~1"), state(1))
            with pytest.raises(mvc.CommitPruned):
                fresh.load("main~2")


def test_a_full_clones_push_still_sends_no_chunk_the_remote_holds(origin, tmp_path):
    """The same new key "z" pushed from a full clone (every trailer read): nothing is sent twice."""
    z = state(0)["a"].clone()
    z[-1] = 0.5
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "full") as full:
        full.commit(state(1) | {"z": z}, "third")
        report = full.remotes.push()
        assert report.chunks == 1  # the last chunk of "z", the one that changed
    assert max(listings(tmp_path).values()) == 1


def save_across_hosts(tmp_path, tag: str, full: dict, step, world: int = 4, rows: int = 16) -> tuple:
    """One sharded save across ``world`` fresh lazy clones (the DCP writer's path), committed and pushed by rank 0's host. Returns per rank
    (the chunk pack keys whose trailers its ``upload_shards`` read, (packs, bytes) it sent)."""
    names = tuple(full)
    hosts = [mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / f"{tag}{r}", lazy=True) for r in range(world)]
    read, sent = [], []
    try:
        start, descs = hosts[0].shards.begin("main"), []
        for rank, host in enumerate(hosts):
            parts = [full[n][rank * rows:(rank + 1) * rows].contiguous() for n in names]
            descs.append(host.shards.write(parts + ([step] if rank == 1 else [])))
            before = set(unread(host))
            sent.append(host.remotes.upload_shards("origin", descs[-1]["locations"],
                                                   [cid for t in descs[-1]["tensors"] for cid in t["chunks"]]))
            read.append(before - set(unread(host)))
        leaves = sharded_leaves(descs, full, rows)
        hosts[0].remotes.refresh("origin")
        hosts[0].shards.commit(start, leaves, {}, None, tag)
        hosts[0].remotes.push("origin", ("main",))
    finally:
        for host in hosts:
            host.close()
    return read, sent


def test_a_rank_on_a_fresh_host_reads_only_its_own_packs_trailers_to_upload_its_shards(tmp_path, monkeypatch):
    """Checkpoint 1 is saved across 4 hosts. For checkpoint 2 ("w" unchanged, "m" and "v" new) each
    rank, on a fresh lazy clone, uploads its shards: it reads the trailers the where hints of
    checkpoint 1's tensors name for its chunks, its own rank's packs (at most 30% of the trailer
    bytes), and sends none of "w"'s chunks again. A fresh clone reads every rank's pieces bit for bit."""
    monkeypatch.setattr(layout, "PACK_BYTES", 4096)
    world, rows = 4, 16
    g = torch.Generator().manual_seed(5)
    first = {n: torch.randn(world * rows, 32, generator=g) for n in ("w", "m", "v")}
    second = {"w": first["w"], "m": torch.randn(world * rows, 32, generator=g),
              "v": torch.randn(world * rows, 32, generator=g)}
    step = torch.tensor(7.0)
    seed_remote(tmp_path)
    save_across_hosts(tmp_path, "one", first, step)
    sizes = trailer_sizes(tmp_path)
    total = sum(sizes.values())
    read, _ = save_across_hosts(tmp_path, "two", second, step)
    for rank in range(world):
        assert read[rank] and sum(sizes[key] for key in read[rank]) <= 0.30 * total, (rank, read[rank], total)
    counts = listings(tmp_path)
    with mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "after", lazy=True) as host:
        view = host.shards.view("main")
        objs = {n: view["tensors"][(n,)] for n in second}
        assert all(counts[cid] == 1 for cid in objs["w"].chunks)  # none of "w"'s sent again
        for rank in range(world):
            got = mvc.reader.read_pieces(host, [(objs[n], rank, 0, objs[n].pieces()[rank][3]) for n in second])
            for n, data in zip(second, got):
                assert data.tobytes() == second[n][rank * rows:(rank + 1) * rows].contiguous().numpy().tobytes()
