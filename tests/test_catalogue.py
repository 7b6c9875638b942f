"""The catalogue of a remote: what a refresh reads again after this repository's own push."""

from contextlib import closing

import pytest
import torch

from conftest import pushed_repo
from mvc.remote import layout
from mvc.remote.connection import Connection

CHUNK = 1024


def state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(8 * 1024, generator=g), "step": seed}


@pytest.fixture(params=["folder", "seaweedfs", "moto"])
def remote(request, tmp_path):
    """(URL, endpoint, put(key, bytes)) of an empty remote of each kind."""
    if request.param == "folder":
        url = str(tmp_path / "remote")
        return url, None, lambda key, data: (tmp_path / "remote" / key).write_bytes(data)
    s3 = request.getfixturevalue(request.param)
    url = s3.url()
    return url, s3.endpoint, lambda key, data: s3.put(url, key, data)


def refresh(repo) -> tuple:
    """(new packs, trailers read) of a refresh of origin's catalogue."""
    with closing(Connection(repo, "origin")) as conn:
        new = conn.catalogue.refresh(conn.bucket)
        return new, conn.catalogue.trailers_read


def test_a_refresh_after_a_push_reads_none_of_the_trailers_the_push_wrote(remote, tmp_path):
    url, endpoint, _ = remote
    repo = pushed_repo(tmp_path / "a", url, endpoint, [(state(0), "first"), (state(1), "second")], CHUNK)
    try:
        assert refresh(repo) == (0, 0)  # the listing shows the uploads as sent: their stamps taken
        repo.commit(state(2), "third")
        repo.remotes.push()
        assert refresh(repo) == (0, 0)
        assert repo.load("HEAD~2")["step"] == 0
    finally:
        repo.close()


def test_a_pack_changed_after_its_upload_is_read_again_and_left_out(remote, tmp_path):
    url, endpoint, put = remote
    repo = pushed_repo(tmp_path / "a", url, endpoint, [(state(0), "first")], CHUNK)
    try:
        with closing(Connection(repo, "origin")) as conn:
            key, size = next((k, n) for k, n, _ in conn.bucket.list_stamps(layout.CHUNK_PACKS))
            data = conn.bucket.get(key)
            ids = conn.catalogue.pack_ids()[key]
        put(key, data[:size // 2])  # cut short before any listing was read: not the pack sent
        assert refresh(repo)[1] == 1
        with closing(Connection(repo, "origin")) as conn:
            assert key not in conn.catalogue.pack_ids()  # its damaged trailer: not relied on
            assert not conn.catalogue.chunks(ids, complete=False)
    finally:
        repo.close()


# -- the chunk tables (mvc.remote.tables) behind the catalogue's lookups ---------------------

import multiprocessing
import os
import time

import numpy as np
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mvc.remote import tables
from mvc.remote.catalogue import Catalogue, FORMAT
from mvc.store.index import Index
from mvc.store.packs import Location


def chunk_key(n: int) -> str:
    return layout.pack_key(layout.CHUNK_PACKS, n.to_bytes(16, "big"))


def fresh(tmp_path) -> Catalogue:
    (tmp_path / ".mvc").mkdir(exist_ok=True)
    return Catalogue(tmp_path / ".mvc", "origin")


def add(catalogue, key: str, ids: list, base: int) -> dict:
    """Catalogue pack ``key`` listing ``ids`` at offsets base, base+64, ...; {id: Location}."""
    offsets = np.arange(len(ids), dtype=np.uint64) * 64 + base
    catalogue.add_table(key, ids, offsets, np.full(len(ids), 64, dtype=np.uint64))
    name = layout.pack_name(key)
    return {cid: Location(name, base + 64 * i, 64) for i, cid in enumerate(ids)}


class CatalogueMachine(RuleBasedStateMachine):
    """Packs added (ids shared between packs, as a lazy clone's pushes send some again), read
    again with other offsets, forgotten, and the catalogue reopened, against an oracle of which
    packs list which ids where: a lookup must name one of the live packs listing an id, and
    only such a pack; ``pack_ids`` and ``remote_bytes`` must match the oracle."""

    @initialize()
    def start(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="mvc-catalogue-")
        os.mkdir(os.path.join(self.dir, ".mvc"))
        self.catalogue = Catalogue(self.dir + "/.mvc", "origin")
        self.packs: dict = {}  # key -> {id: Location}
        self.pool = [bytes([i]) * 31 + bytes([i % 3]) for i in range(40)]
        self.n = 0

    @rule(picks=st.lists(st.integers(0, 39), min_size=0, max_size=12, unique=True), base=st.integers(0, 1 << 30))
    def add_pack(self, picks, base):
        self.n += 1
        key = chunk_key(self.n)
        self.packs[key] = add(self.catalogue, key, [self.pool[i] for i in picks], base)

    @rule(which=st.integers(0, 1 << 20), base=st.integers(0, 1 << 30))
    def read_again(self, which, base):
        if self.packs:
            key = sorted(self.packs)[which % len(self.packs)]
            self.packs[key] = add(self.catalogue, key, list(self.packs[key]), base)

    @rule(which=st.integers(0, 1 << 20))
    def forget(self, which):
        if self.packs:
            key = sorted(self.packs)[which % len(self.packs)]
            self.catalogue.forget_packs([key])
            del self.packs[key]

    @rule()
    def reopen(self):
        self.catalogue.close()
        self.catalogue = Catalogue(self.dir + "/.mvc", "origin")

    @invariant()
    def lookups_name_a_live_pack_that_lists_the_id(self):
        got = self.catalogue.chunks(self.pool, complete=False)
        for cid in self.pool:
            holders = {locs[cid] for locs in self.packs.values() if cid in locs}
            assert (got.get(cid) in holders) if holders else cid not in got

    @invariant()
    def walks_agree(self):
        ids = self.catalogue.pack_ids()
        assert {key: set(v) for key, v in ids.items()} == {key: set(v) for key, v in self.packs.items()}
        distinct = {cid for locs in self.packs.values() for cid in locs}
        assert self.catalogue.remote_bytes() == (len(distinct), 64 * len(distinct))
        assert len(os.listdir(self.catalogue.tables_dir)) <= tables.MAX_TABLES + 1
        needed = set(self.pool[::3])
        wanted = np.sort(np.frombuffer(b"".join(needed), dtype="S32"))
        assert self.catalogue.held([(0, 20, wanted), (20, 256, wanted)], set()) == \
            {key: (len(needed & locs.keys()), len(locs)) for key, locs in self.packs.items()}

    def teardown(self):
        import shutil
        if hasattr(self, "catalogue"):
            self.catalogue.close()
            shutil.rmtree(self.dir, ignore_errors=True)


CatalogueMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
test_catalogue_lookups_match_an_oracle = CatalogueMachine.TestCase


def test_an_entry_costs_its_id_and_location_and_tables_stay_few(tmp_path):
    catalogue = fresh(tmp_path)
    try:
        rng = np.random.default_rng(0)
        for n in range(40):
            ids = [bytes(row) for row in rng.integers(0, 256, size=(500, 32), dtype=np.uint8)]
            add(catalogue, chunk_key(n), ids, 0)
        files = list(catalogue.tables_dir.iterdir())
        entries = 40 * 500
        assert len(files) <= tables.MAX_TABLES
        assert sum(f.stat().st_size for f in files) < entries * tables.ENTRY_BYTES * 1.1
        assert tables.ENTRY_BYTES == 48
    finally:
        catalogue.close()


def _add_many(repo_dir: str, first: int, count: int) -> None:
    catalogue = Catalogue(repo_dir, "origin")
    try:
        for n in range(first, first + count):
            add(catalogue, chunk_key(n), [n.to_bytes(32, "big")], 64 * n)
    finally:
        catalogue.close()


def test_two_processes_adding_packs_at_once_lose_none(tmp_path):
    """Each adds and merges tables while the other does: every pack stays found where it is."""
    fresh(tmp_path).close()
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_add_many, args=(str(tmp_path / ".mvc"), first, 40)) for first in (0, 1000)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    catalogue = fresh(tmp_path)
    try:
        numbers = list(range(40)) + list(range(1000, 1040))
        got = catalogue.chunks([n.to_bytes(32, "big") for n in numbers], complete=False)
        assert {cid: (loc.pack, loc.offset) for cid, loc in got.items()} == \
            {n.to_bytes(32, "big"): (layout.pack_name(chunk_key(n)), 64 * n) for n in numbers}
        assert len(list(catalogue.tables_dir.iterdir())) <= tables.MAX_TABLES + 2
    finally:
        catalogue.close()


def test_a_table_file_no_listing_names_is_swept_once_old(tmp_path):
    catalogue = fresh(tmp_path)
    try:
        stray = tables.write(catalogue.tables_dir, [(bytes(16), np.zeros(0, dtype="S32"), [], [])])
        assert tables.sweep(catalogue.tables_dir, set()) == []  # young: maybe a write in progress
        old = time.time() - tables.GRACE_S - 10
        os.utime(stray.path, (old, old))
        assert tables.sweep(catalogue.tables_dir, set()) == [stray.path]
    finally:
        catalogue.close()


def test_a_damaged_table_makes_its_packs_unread_and_lookups_read_them_again(remote, tmp_path):
    url, endpoint, _ = remote
    repo = pushed_repo(tmp_path / "a", url, endpoint, [(state(0), "first"), (state(1), "second")], CHUNK)
    try:
        with closing(Connection(repo, "origin")) as conn:
            ids = {k: v for k, v in conn.catalogue.pack_ids().items() if k.startswith(layout.CHUNK_PACKS)}
            files = sorted(conn.catalogue.tables_dir.iterdir())
        with open(files[0], "r+b") as f:  # cut short
            f.truncate(f.seek(0, 2) - 7)
        with closing(Connection(repo, "origin")) as conn:
            want = [cid for v in ids.values() for cid in v]
            assert set(conn.catalogue.chunks(want, complete=False)) < set(want)
            assert conn.catalogue.unread()
            assert set(conn.catalogue.chunks(want)) == set(want)  # read again from the remote
            assert conn.catalogue.trailers_read >= 1
            assert not files[0].exists()
        assert repo.load("HEAD~1")["step"] == 0
    finally:
        repo.close()


def test_a_catalogue_from_before_the_tables_is_converted_and_read_again(remote, tmp_path):
    """Golden: the LMDB layout of earlier mvc (chunk entries, ``pack:KEY`` id lists, ``stamp:KEY``)."""
    from mvc import encoding
    from mvc.remote.catalogue import folder, forget, read_trailer
    url, endpoint, _ = remote
    repo = pushed_repo(tmp_path / "a", url, endpoint, [(state(0), "first")], CHUNK)
    try:
        with closing(Connection(repo, "origin")) as conn:
            listed = [(k, n, s) for k, n, s in conn.bucket.list_stamps(layout.CHUNK_PACKS)]
            old = {k: read_trailer(conn.bucket, k) for k, _, _ in listed}
        forget(repo.dir, "origin")
        folder(repo.dir, "origin").mkdir(parents=True)
        index = Index(folder(repo.dir, "origin"), create=True)
        with index.write() as txn:
            for key, size, stamp in listed:
                for cid, offset, length in old[key]:
                    txn.put_chunk(cid, Location(layout.pack_name(key), offset, length))
                txn.put_meta("pack:" + key, encoding.pack([cid for cid, _, _ in old[key]]))
                txn.put_meta("stamp:" + key, encoding.pack([size, stamp]))
        index.close()
        with closing(Connection(repo, "origin")) as conn:
            assert set(conn.catalogue.unread()) == {k for k, _, _ in listed}
            with conn.catalogue.index.read() as txn:
                assert txn.meta(FORMAT) == b"2" and not list(txn.ids("chunks"))
            want = [cid for entries in old.values() for cid, _, _ in entries]
            got = conn.catalogue.chunks(want)
            assert {cid: (loc.offset, loc.length) for cid, loc in got.items()} == \
                {cid: (o, n) for entries in old.values() for cid, o, n in entries}
    finally:
        repo.close()


def test_a_refresh_of_many_trailers_merges_its_tables_once(tmp_path, monkeypatch):
    """A bulk read writes a table per FLUSH entries and merges them at its end, not as it goes
    (so each entry is rewritten once, not once per level of merges)."""
    from mvc.remote import catalogue as module
    remote = tmp_path / "remote"
    repo = pushed_repo(tmp_path / "a", str(remote), None, [(state(0), "c0")], CHUNK)
    try:
        for i in (1, 2):  # a pack a push
            repo.commit(state(i), f"c{i}")
            repo.remotes.push()
        with closing(Connection(repo, "origin")) as conn:
            packs = [k for k, _, _ in conn.bucket.list_stamps(layout.CHUNK_PACKS)]
        assert len(packs) == 3
        monkeypatch.setattr(module, "FLUSH", 1)  # a table per trailer
        monkeypatch.setattr(tables, "MAX_TABLES", 1)
        merges = []
        real = tables.merge
        monkeypatch.setattr(tables, "merge", lambda folder, inputs, live: merges.append(len(inputs)) or
                            real(folder, inputs, live))
        module.forget(repo.dir, "origin")
        with closing(Connection(repo, "origin")) as conn:
            conn.catalogue.refresh(conn.bucket)
            assert merges == [len(packs)]
            assert len(list(conn.catalogue.tables_dir.iterdir())) == 1
        assert repo.load("HEAD~2")["step"] == 0
    finally:
        repo.close()


def test_a_table_with_a_flipped_bit_is_never_counted_by_a_sweep(tmp_path):
    """``held`` (what remote gc deletes by) checks each table's checksum first: the packs of a
    damaged one are left out (a gc keeps a pack it cannot count) and noted unread."""
    remote = tmp_path / "remote"
    repo = pushed_repo(tmp_path / "a", str(remote), None, [(state(0), "c0")], CHUNK)
    try:
        repo.commit(state(1), "c1")
        repo.remotes.push()  # a second pack, a second table
        with closing(Connection(repo, "origin")) as conn:
            files = sorted(conn.catalogue.tables_dir.iterdir(), key=lambda p: p.stat().st_mtime)
            assert len(files) == 2
            whole = conn.catalogue.held([], set())
        raw = bytearray(files[0].read_bytes())
        raw[len(raw) - 40] ^= 0x01  # a length of the last entry: lookups would not notice
        files[0].write_bytes(bytes(raw))
        with closing(Connection(repo, "origin")) as conn:
            got = conn.catalogue.held([], set())
            gone = {key for key in whole if key.startswith(layout.CHUNK_PACKS)} - set(got)
            assert len(gone) == 1 and set(conn.catalogue.unread()) == gone
    finally:
        repo.close()
