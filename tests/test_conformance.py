"""Every verb on every kind of repository, and the chunk-store seam under faults.

A **kind** of repository is a composition of chunk stores and what was done
to it: plain local packs; repacked (grouped and delta records); a lazy clone
with nothing cached; a clone whose cache is partly evicted; repacked then
evicted; one holding sharded commits; one opened read-only. Each cell of
the matrix runs one verb on one kind, checks what it returns bit for bit
against the truth (the states that were committed), and ends with fsck
clean. Remotes are folders here (the same code paths as S3); the S3 kind
runs against the session's SeaweedFS.

The chunk size is small enough that tiny tensors span many chunks and
large enough that byte grouping and deltas pay (so repacked kinds really
hold encoded records).
"""

from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import mvc

CHUNK = 1024  # byte grouping works on planes of at least 64 values: deltas pay from about here


def state(seed: int) -> dict:
    """A small training state: ``w`` moves a little every step, ``frozen`` never, ``emb`` in a few rows."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2000, generator=g)
    w[seed * 300:seed * 300 + 3] += seed  # a few values: one chunk differs from the step before, by a delta
    emb = torch.zeros(64, 16)
    emb[seed % 64] = float(seed)
    return {"model": {"w": w, "frozen": torch.arange(600, dtype=torch.float32), "emb": emb},
            "opt": [torch.ones(9, dtype=torch.bfloat16) * seed], "step": seed}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def origin_with_remote(tmp_path: Path, commits: int = 3) -> tuple:
    """A repository with ``commits`` commits on main pushed to folder remote 'origin'; (repo, truth)."""
    repo = mvc.Repository.init(tmp_path / "origin", chunk_size=CHUNK)
    truth = {}
    for i in range(commits):
        truth[repo.commit(state(i), f"step {i}", step=i).id] = state(i)
    repo.remotes.add("origin", str(tmp_path / "remote"))
    repo.remotes.push()
    return repo, truth


@contextmanager
def lazy_clone(tmp_path: Path, commits: int = 3):
    """(a lazy clone of origin_with_remote's remote, the truth by commit id); both closed after."""
    origin, truth = origin_with_remote(tmp_path, commits)
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lazy", lazy=True)
    try:
        yield lazy, truth
    finally:
        lazy.close()
        origin.close()


# -- the three crashes of issue 20 ----------------------------------------------------

def test_gc_in_a_repository_that_caches_a_remote_rewrites_its_packs(tmp_path):
    """gc rewrote packs through PackStore-only calls: AttributeError after the sweep had committed."""
    with lazy_clone(tmp_path, 2) as (lazy, truth):
        lazy.load("main~1")  # one cached pack: frozen (live) and main~1's w (pruned below)
        report = lazy.gc(keep_last=1, grace=0, repack=True)
        assert report.packs_rewritten == 1 and report.records_moved > 0
        assert lazy.fsck().ok
        for oid, st in truth.items():
            if oid not in report.pruned:
                assert same(lazy.load(oid), st)


def test_first_repack_in_a_repository_that_caches_a_remote(tmp_path):
    """The first repack wrote encoded records into a version 1 pack: ValueError until reopened."""
    with lazy_clone(tmp_path) as (lazy, truth):
        for oid in truth:
            lazy.load(oid)
        report = lazy.repack()
        assert report.grouped + report.deltas > 0
        assert lazy.fsck().ok
        for oid, st in truth.items():
            assert same(lazy.load(oid), st)


def test_evict_after_repack_in_a_repository_that_caches_a_remote(tmp_path):
    """Eviction copied kept records into buffers of their stored length: CorruptObject on encoded ones."""
    with lazy_clone(tmp_path) as (lazy, truth):
        for oid in truth:
            lazy.load(oid)
        assert lazy.repack().grouped > 0
        report = lazy.cache.evict(0)
        assert report.chunks_evicted > 0 and report.kept_pinned > 0  # HEAD's chunks stay, rewritten
        assert lazy.fsck().ok
        for oid, st in truth.items():
            assert same(lazy.load(oid), st)


# -- the kinds of repository ---------------------------------------------------------
#
# Each kind is built once per session into a template folder (``repo`` and,
# for clones, the folder remote ``remote`` it caches); every cell works on a
# copy of it, so cells never see each other's changes.

import os
import shutil

from mvc import ShardedTensor, dtypes
from mvc.errors import BadInput, CommitPruned, MvcError
from mvc.remote import config as remote_config
from mvc.traverse import format_path, walk

METRICS = [4.0, 1.0, 3.0, 2.0]  # loss of the commits on main, oldest first
KINDS = ["plain", "repacked", "lazy", "evicted", "repacked-evicted", "sharded", "read-only"]
CLONES = {"lazy", "evicted", "repacked-evicted"}
CACHED = CLONES | {"s3-lazy"}  # kinds that cache a remote


def _tensors(st) -> dict:
    return {format_path(p): v for p, v in walk(st) if isinstance(v, torch.Tensor)}


def _shard_commit(repo, st, i):
    """Commit ``st`` as a sharded save: every tensor in two pieces, each written as its own rank would."""
    start = repo.shards.begin("main")
    leaves, locations = {}, {}
    for path, value in walk(st):
        if not isinstance(value, torch.Tensor):
            leaves[path] = value
            continue
        rows = value.shape[0]
        pieces = []
        for lo, hi in ((0, rows // 2), (rows // 2, rows)):
            offsets = (lo,) + (0,) * (value.dim() - 1)
            sizes = (hi - lo,) + tuple(value.shape[1:])
            desc = repo.shards.write([value.narrow(0, lo, hi - lo)])
            pieces.append((offsets, sizes, desc["tensors"][0]["chunks"]))
            locations.update(desc["locations"])
        leaves[path] = ShardedTensor(dtypes.name_of(value.dtype), tuple(value.shape), pieces)
    return repo.shards.commit(start, leaves, locations, None, f"step {i}", step=i, metrics={"loss": METRICS[i]})


def _history(repo, sharded: bool = False) -> dict:
    """Four commits on main (the last two sharded if asked), tag v1 at the second, branch side at the third."""
    truth = {}
    for i in range(4):
        if sharded and i >= 2:
            c = _shard_commit(repo, state(i), i)
        else:
            c = repo.commit(state(i), f"step {i}", step=i, metrics={"loss": METRICS[i]})
        truth[c.id] = state(i)
    repo.create_tag("v1", "main~2")
    repo.create_branch("side", "main~1")
    return truth


class Kind:
    """One cell's repository: ``repo``, ``truth`` {commit id: state}, ``main`` [ids oldest first], ``tmp``."""

    def __init__(self, name, repo, truth, tmp):
        self.name, self.repo, self.truth, self.tmp = name, repo, truth, tmp
        self.main = list(truth)

    @property
    def writable(self) -> bool:
        return self.name != "read-only"

    def check_all(self, pruned=()) -> None:
        """Every commit loads bit for bit (or says it was pruned), and fsck is clean."""
        for oid, st in self.truth.items():
            if oid in pruned:
                with pytest.raises(CommitPruned):
                    self.repo.load(oid)
            else:
                assert same(self.repo.load(oid), st), (self.name, oid)
        report = self.repo.fsck()
        assert report.ok, (self.name, report)


def _build(name: str, root: Path) -> dict:
    if name in CLONES:
        origin = mvc.Repository.init(root / "origin", chunk_size=CHUNK)
        truth = _history(origin)
        origin.remotes.add("origin", str(root / "remote"))
        origin.remotes.push(refs=("main", "side", "v1"))
        origin.close()
        repo = mvc.Repository.clone(str(root / "remote"), root / "repo", lazy=True)
        if name != "lazy":
            for oid in truth:
                repo.load(oid)
            if name == "repacked-evicted":
                assert repo.repack().grouped > 0
            budget = 0 if name == "repacked-evicted" else repo.cache.status().local_bytes // 2
            assert repo.cache.evict(budget).chunks_evicted > 0
    else:
        repo = mvc.Repository.init(root / "repo", chunk_size=CHUNK)
        truth = _history(repo, sharded=name == "sharded")
        if name == "repacked":
            report = repo.repack()
            assert report.grouped > 0 and report.deltas > 0
    repo.close()
    return truth


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    built = {}

    def get(name):
        if name not in built:
            root = tmp_path_factory.mktemp(name.replace("-", "_"))
            built[name] = (root, _build("plain" if name == "read-only" else name, root))
        return built[name]
    return get


def _read_only(monkeypatch, index_dir: Path) -> None:
    """Open the index as a user without write permission would (tests run as root, where chmod does not stop writes)."""
    real = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path) == index_dir and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)
    monkeypatch.setattr(os, "access", access)


@pytest.fixture
def kind(request, templates, tmp_path, monkeypatch):
    name = request.param
    root, truth = templates(name)
    for part in ("repo", "remote"):
        if (root / part).exists():
            shutil.copytree(root / part, tmp_path / part)
    if name in CLONES:  # the copy caches the copy of the remote
        repo = mvc.Repository.open(tmp_path / "repo")
        with repo.index.write() as txn:
            info = remote_config.get(txn, "origin")
            remote_config.put(txn, remote_config.RemoteInfo("origin", str(tmp_path / "remote"), None,
                                                            info.conditional))
        repo.close()
    if name == "read-only":
        _read_only(monkeypatch, (tmp_path / "repo" / ".mvc" / "index").resolve())
    repo = mvc.Repository.open(tmp_path / "repo")
    if name == "read-only":
        assert repo.index.readonly
    k = Kind(name, repo, dict(truth), tmp_path)
    yield k
    repo.close()


def _refuses_when_read_only(k: Kind, verb) -> bool:
    """On the read-only kind: ``verb()`` raises one MvcError and changes nothing (True); else False."""
    if k.writable:
        return False
    from mvc.errors import ReadOnlyRepository
    refs_before = [(r.name, r.id) for r in k.repo.branches() + k.repo.tags()]
    files_before = sorted(p.name for p in k.repo.dir.rglob("*"))
    fmt = (k.repo.dir / "FORMAT").read_bytes()
    with pytest.raises(ReadOnlyRepository) as err:
        verb()
    assert err.value.path == str(k.repo.dir)
    assert [(r.name, r.id) for r in k.repo.branches() + k.repo.tags()] == refs_before
    assert sorted(p.name for p in k.repo.dir.rglob("*")) == files_before  # no pack, no temporary file
    assert (k.repo.dir / "FORMAT").read_bytes() == fmt
    k.check_all()
    return True


# -- the verbs --------------------------------------------------------------------------

def v_commit(k):
    new = state(7)
    if _refuses_when_read_only(k, lambda: k.repo.commit(new, "more")):
        return
    c = k.repo.commit(new, "more", step=7)
    k.truth[c.id] = new
    assert k.repo.resolve("main") == c.id
    k.check_all()


def v_commit_sharded(k):
    """A sharded save on top: on a clone, the pieces it shares with the remote are not written again."""
    new = state(3)
    new["model"]["emb"][5] = 7.0
    if _refuses_when_read_only(k, lambda: _shard_commit(k.repo, new, 3)):
        return
    c = _shard_commit(k.repo, new, 3)
    k.truth[c.id] = new
    assert k.repo.resolve("main") == c.id
    k.check_all()


def v_load(k):
    k.check_all()
    side = "origin/side" if k.name in CACHED else "side"  # a clone tracks the remote's other branches
    assert same(k.repo.load("v1"), k.truth[k.main[1]]) and same(k.repo.load(side), k.truth[k.main[2]])


def v_load_only(k):
    for oid, st in k.truth.items():
        got = k.repo.load(oid, only="model.w")
        assert same(got, {"model": {"w": st["model"]["w"]}})
    with pytest.raises(mvc.errors.NoMatch) as caught:  # a typo is an error, not an empty state
        k.repo.load(k.main[-1], only="model.head.*")
    assert (caught.value.pattern, caught.value.commit) == ("model.head.*", k.main[-1])
    k.check_all()


def v_load_into(k):
    live = state(0)
    for oid in reversed(k.main):  # newest to oldest and back: each switch reads only what differs
        k.repo.load_into(live, oid)
        assert same(live, k.truth[oid])
    k.repo.load_into(live, k.main[-1])
    assert same(live, k.truth[k.main[-1]])
    k.check_all()


def v_diff(k):
    for a, b in zip(k.main, k.main[1:]):
        d = k.repo.diff(a, b)
        ta, tb = _tensors(k.truth[a]), _tensors(k.truth[b])
        for t in d.tensors:
            assert (t.status == "unchanged") == same(ta[t.key], tb[t.key]), (k.name, t.key)
            if t.max_abs_diff is not None:
                want = (tb[t.key].double() - ta[t.key].double()).abs().max().item()
                assert t.max_abs_diff == pytest.approx(want)
    k.check_all()


def v_show(k):
    for i, oid in enumerate(k.main):
        c = k.repo.get_commit(oid)
        assert (c.message, c.step, c.metrics) == (f"step {i}", i, {"loss": METRICS[i]})
        entries = {e.key: e for e in k.repo.entries(oid) if getattr(e, "dtype", None)}
        for key, t in _tensors(k.truth[oid]).items():
            assert tuple(entries[key].shape) == tuple(t.shape)
    k.check_all()


def v_export_pt(k):
    for oid, st in k.truth.items():
        out = k.tmp / f"{oid[:8]}.pt"
        k.repo.export(oid, out)
        assert same(torch.load(out, weights_only=True), st)
    k.check_all()


def v_export_safetensors(k):
    from safetensors.torch import load_file
    for oid, st in k.truth.items():
        out = k.tmp / f"{oid[:8]}.safetensors"
        k.repo.export(oid, out)
        got = load_file(out)
        assert got.keys() == _tensors(st).keys() and all(same(got[key], t) for key, t in _tensors(st).items())
    k.check_all()


def v_fsck(k):
    report = k.repo.fsck()
    assert report.ok
    k.check_all()


def v_fsck_damaged_copy(k):
    """A flipped bit in a chunk held here: fsck names it. Where the cached remote lists a copy it
    is not lost (--prune-lost keeps every commit, a read heals it); elsewhere it is lost."""
    from mvc.remote.tiers import commit_chunks
    from mvc.store.packs import pack_filename
    k.repo.load(k.main[-1])  # a lazy clone holds it here now
    with k.repo.index.read() as txn:
        held = sorted(c for c in commit_chunks(k.repo, txn, {bytes.fromhex(k.main[-1])}) if txn.chunk(c) is not None)
        loc = txn.chunk(held[0])
    path = k.repo.dir / "packs" / pack_filename(loc.pack)
    original = path.read_bytes()
    flipped = bytearray(original)
    flipped[loc.offset + loc.length - 1] ^= 0x10  # the record's last data byte
    path.write_bytes(bytes(flipped))
    report = k.repo.fsck()
    assert held[0].hex() in {c for d in report.damage for c in d.chunks}, (k.name, report.damage)
    if k.name in CACHED:
        assert not report.lost and {d.remotes for d in report.damage} == {("origin",)}
        assert mvc.fsck.prune_lost(k.repo) == ()
        k.check_all()  # every read of it heals it from the remote, and fsck is clean after
    else:
        assert report.lost and not any(d.remotes for d in report.damage)
        path.write_bytes(original)
        k.check_all()


def v_check_packs(k):
    """The one pack checker (``ChunkStore.check_packs``) on every kind, and through a decorator:
    clean packs pass; real flipped bits in a record's data and in its header, a pack cut short,
    a damaged trailer and a pack gone are each named per pack, with chunk id and offset."""
    from faulty import Faulty
    from damage import flip_bit, flipped
    from mvc.store import chunks as cs
    if not any(f.pack for f in k.repo.chunks.pack_files()):
        k.repo.load(k.main[-1])  # a lazy clone holds nothing here yet: now a pack of its cache
    packs = sorted(f.pack for f in k.repo.chunks.pack_files() if f.regular and f.pack is not None)
    assert packs, k.name
    with k.repo.index.read() as txn:  # a delta's base in another pack: the index says where
        checks = list(k.repo.chunks.check_packs([(name, None) for name in packs], txn))
        assert [c.name for c in checks] == packs and all(c.ok for c in checks), (k.name, checks)
        assert [c.records for c in checks] == [len(k.repo.chunks.pack_records(name)) for name in packs]
        assert checks == list(Faulty(k.repo.chunks).check_packs([(name, None) for name in packs], txn))
    name = max(packs, key=lambda n: len(k.repo.chunks.pack_records(n)))
    path = k.repo.dir / "packs" / cs.pack_filename(name)
    located = k.repo.chunks.pack_locations(name)
    cid, loc = next(((c, x) for c, x in located if not x.coded), located[0])

    def check(records=None, repo=k.repo):
        with repo.index.read() as txn:
            (found,) = repo.chunks.check_packs([(name, records)], txn)
        assert (found.name, found.pack) == (name, path.name)
        return found
    with flipped(path, loc.offset + loc.length - 1, 4):  # the record's last data byte
        found = check()
        assert found.error == "" and found.records == len(located)
        assert [(p.id, p.offset) for p in found.problems] == [(cid, loc.offset)], (k.name, found)
        assert found.problems[0].kind in ({cs.CHECKSUM} if not loc.coded else {cs.CHECKSUM, cs.BAD_ENCODING})
    with flipped(path, loc.offset - cs.RECORD_OVERHEAD + 3):  # a bit of the id in its record header
        assert [(p.kind, p.id, p.offset) for p in check().problems] == [(cs.BAD_RECORD, cid, loc.offset)]
    with flipped(path, path.stat().st_size - 50):  # the trailer's checksum no longer matches
        found = check()
        assert (found.kind, found.records, found.problems) == (cs.SHORT_PACK, 0, ()) and "trailer" in found.error
        assert check(dict(located)).ok  # its records, located, are intact
    original = path.read_bytes()
    try:
        last_id, last = located[-1]
        path.write_bytes(original[:last.offset + last.length // 2])  # cut short inside its last record
        found = check()
        assert found.kind == cs.SHORT_PACK and found.error and found.records == 0
        found = check(dict(located))
        assert [(p.kind, p.id, p.offset) for p in found.problems] == [(cs.SHORT_PACK, last_id, last.offset)]
    finally:
        path.write_bytes(original)
    aside = path.with_name("gone")
    path.rename(aside)
    fresh = mvc.Repository.open(k.repo.root)  # this process's reader still holds the file it opened
    try:
        found = check(repo=fresh)
        assert (found.kind, found.records) == (cs.UNREADABLE, 0) and "missing" in found.error
        found = check(dict(located), fresh)
        assert {p.kind for p in found.problems} == {cs.UNREADABLE}
        assert sorted((p.id, p.offset) for p in found.problems) == sorted((c, x.offset) for c, x in located)
    finally:
        fresh.close()
        aside.rename(path)
    assert check().ok
    k.check_all()


def v_lengths(k):
    """``ChunkStore.lengths`` of every chunk of the history at once (a lazy clone's looked up in its
    remote's catalogue together): each one's length as its tensor's chunk spans say, an id no
    store holds left out; the same as ``length`` one id at a time."""
    spans = {}
    for oid in k.truth:
        for entry in k.repo.entries(oid):
            if entry.kind == "tensor":
                with k.repo.index.read() as txn:
                    obj = k.repo.objects.tensor(txn, bytes.fromhex(entry.tensor_id))
                spans.update((cid, n) for cid, _, n in obj.chunk_spans())
    assert spans, k.name
    nowhere = b"\xee" * 32
    with k.repo.index.read() as txn:
        got = k.repo.chunks.lengths(list(spans) + [nowhere], txn)
        assert got == spans, k.name
        assert {cid: k.repo.chunks.length(cid, txn) for cid in spans} == spans


def _gc(k, **kwargs):
    if _refuses_when_read_only(k, lambda: k.repo.gc(grace=0, **kwargs)):
        return
    report = k.repo.gc(grace=0, **kwargs)
    pruned = set(report.pruned)
    assert pruned <= set(k.main[:-1]), "a branch tip was pruned"
    k.check_all(pruned)
    return pruned


def v_gc(k):
    assert _gc(k) in (None, set())


def v_gc_keep_last(k):
    pruned = _gc(k, keep_last=1)
    if pruned is not None:  # main~3 is on no ref's first-parent chain other than main's
        assert k.main[0] in pruned


def v_gc_keep_best(k):
    pruned = _gc(k, keep_best="loss", mode="min")
    if pruned is not None:
        assert k.main[1] not in pruned and k.main[0] in pruned  # loss 1.0 is the best


def v_gc_repack(k):
    _gc(k, repack=True)


def v_repack(k):
    if _refuses_when_read_only(k, lambda: k.repo.repack()):
        return
    k.repo.repack()
    k.check_all()
    k.repo.repack()  # again: what is encoded stays as it is
    k.check_all()


def v_evict(k):
    if k.name not in CACHED:
        with pytest.raises(BadInput):  # nothing to evict to
            k.repo.cache.evict(0)
    else:
        before = k.repo.cache.status()
        report = k.repo.cache.evict(0)
        after = k.repo.cache.status()
        assert after.local_bytes <= before.local_bytes and after.only_remote >= before.only_remote
        assert report.kept_local == 0  # everything here is on the remote: only pinned chunks (HEAD's) stay
    k.check_all()


def v_bisect(k):
    status = k.repo.bisect.find(k.main[0], k.main[-1], lambda st: st["step"] < 2)
    assert status.first_bad.id == k.main[2]
    k.check_all()


def v_refs(k):
    def moves():
        k.repo.create_tag("t", k.main[0])
        k.repo.create_branch("b", "v1")
        k.repo.create_branch("side", "main", force=True)
        k.repo.checkout("b")
    if _refuses_when_read_only(k, moves):
        return
    moves()
    assert k.repo.head().branch == "b" and k.repo.resolve("HEAD") == k.main[1]
    assert same(k.repo.load("t"), k.truth[k.main[0]]) and same(k.repo.load("side"), k.truth[k.main[-1]])
    k.repo.delete_tag("t")
    k.repo.checkout("main")
    k.repo.delete_branch("b")
    k.check_all()


def v_push_clone(k):
    """Push main and its history to a new folder remote; a full clone of it holds the truth bit for bit."""
    if _refuses_when_read_only(k, lambda: k.repo.remotes.add("mirror", str(k.tmp / "mirror"))):
        return
    k.repo.remotes.add("mirror", str(k.tmp / "mirror"))
    k.repo.remotes.push("mirror", ("main",))
    clone = mvc.Repository.clone(str(k.tmp / "mirror"), k.tmp / "full")
    try:
        for oid in k.main:
            assert same(clone.load(oid), k.truth[oid])
        assert clone.fsck().ok
        # the extensions its history needs (sharded trees, say) are named in the clone too;
        # encoded records and lock records are this repository's own (a remote holds records raw)
        from mvc import ondisk
        assert ondisk.read_format(k.repo.dir)[1] - {ondisk.ENCODED_RECORDS, ondisk.LOCK_HOLDERS} <= ondisk.read_format(clone.dir)[1]
    finally:
        clone.close()
    if k.name in CACHED:  # and a commit made here goes back to its own remote, and comes back by fetch
        new = state(9)
        c = k.repo.commit(new, "from the clone")
        k.truth[c.id] = new
        k.repo.remotes.push()
        k.repo.remotes.fetch()
        assert k.repo.resolve("origin/main") == c.id
    k.check_all()


VERBS = {name[2:]: fn for name, fn in list(globals().items()) if name.startswith("v_") and callable(fn)}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("kind", KINDS, indirect=True)
def test_every_verb_on_every_kind(kind, verb):
    VERBS[verb](kind)


# -- the seam under faults ------------------------------------------------------------------
#
# ``faulty.Faulty`` wraps the repository's chunk store and fails a read or a
# write, or flips a stored bit for the length of one read, at a chosen call.
# Every verb either succeeds (and what it returned is right) or raises one
# clear error: an MvcError, or the injected OSError itself. Afterwards, with
# the fault gone, fsck is clean and every earlier commit loads bit for bit.

import errno

from faulty import Faulty
from mvc.store.packs import pack_filename

FAULTS = {"read-fails": dict(fail_read=1), "write-fails": dict(fail_write=1), "bit-flipped": dict(flip_read=1),
          "second-read-flipped": dict(flip_read=2)}


def _where(k: Kind, store):
    """Where chunk ``cid``'s record lies: (file, offset of its first data byte), here or on the folder remote."""
    def where(cid, txn):
        loc = txn.chunk(cid)
        if loc is not None:
            return k.repo.dir / "packs" / pack_filename(loc.pack), loc.offset
        loc = store.conn.catalogue.chunk(cid) if hasattr(store, "conn") else None
        return (k.tmp / "remote" / "packs" / f"{loc.pack.hex()}.pack", loc.offset) if loc else None
    return where


def f_commit(k):
    c = k.repo.commit(state(8), "under a fault")
    k.truth[c.id] = state(8)


def f_load(k):
    for oid, st in k.truth.items():
        assert same(k.repo.load(oid), st)


def f_load_into(k):
    live = state(0)
    k.repo.load_into(live, k.main[-1])
    assert same(live, k.truth[k.main[-1]])


def f_diff(k):
    d = k.repo.diff(k.main[0], k.main[-1])
    ta, tb = _tensors(k.truth[k.main[0]]), _tensors(k.truth[k.main[-1]])
    assert all((t.status == "unchanged") == same(ta[t.key], tb[t.key]) for t in d.tensors)


def f_export(k):
    k.repo.export(k.main[-1], k.tmp / "out.pt")
    assert same(torch.load(k.tmp / "out.pt", weights_only=True), k.truth[k.main[-1]])


def f_repack(k):
    k.repo.repack()


def f_gc(k):
    k.repo.gc(grace=0, repack=True)


def f_evict(k):
    k.repo.cache.evict(0)


def f_push(k):
    k.repo.remotes.add("mirror", str(k.tmp / "mirror"))
    k.repo.remotes.push("mirror", ("main",))


def f_bisect(k):
    assert k.repo.bisect.find(k.main[0], k.main[-1], lambda st: st["step"] < 2).first_bad.id == k.main[2]


WRITERS = {"commit", "gc", "evict", "repack"}  # verbs that write through the store (push writes to the remote);
# every verb but commit reads through it
FAULT_VERBS = {name[2:]: fn for name, fn in list(globals().items()) if name.startswith("f_") and callable(fn)}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("verb", sorted(FAULT_VERBS))
@pytest.mark.parametrize("kind", ["repacked", "evicted"], indirect=True)
def test_every_verb_under_a_fault_fails_cleanly_or_succeeds(kind, verb, fault):
    if verb == "evict" and kind.name not in CLONES:
        pytest.skip("evict needs a cached remote (the matrix checks the refusal)")
    if (verb not in WRITERS) if "fail_write" in FAULTS[fault] else verb == "commit":
        pytest.skip("this verb makes no call of the kind this fault breaks")
    faulty = Faulty(kind.repo.chunks, where=_where(kind, kind.repo.chunks), **FAULTS[fault])
    kind.repo.chunks = faulty
    try:
        FAULT_VERBS[verb](kind)
    except OSError as exc:
        assert faulty.fired and exc.errno in (errno.EIO, errno.ENOSPC), repr(exc)
    except MvcError:
        assert faulty.fired
    finally:
        kind.repo.chunks = faulty.inner
    kind.check_all()


# -- the same verbs on a lazy clone of an S3 remote (the session's SeaweedFS) -----------------

S3_VERBS = ["load", "push_clone", "evict", "gc_keep_last", "repack", "fsck", "fsck_damaged_copy"]


@pytest.mark.parametrize("verb", S3_VERBS)
def test_verbs_on_a_lazy_clone_of_an_s3_remote(verb, templates, tmp_path, s3_server, s3_url):
    root, truth = templates("plain")
    shutil.copytree(root / "repo", tmp_path / "origin")
    origin = mvc.Repository.open(tmp_path / "origin")
    url = s3_url("conformance")
    origin.remotes.add("origin", url, s3_server.endpoint)
    origin.remotes.push(refs=("main", "side", "v1"))
    origin.close()
    repo = mvc.Repository.clone(url, tmp_path / "repo", lazy=True, endpoint_url=s3_server.endpoint)
    try:
        VERBS[verb](Kind("s3-lazy", repo, dict(truth), tmp_path))
    finally:
        repo.close()


# -- errors as data: a damaged pack is named by type and attribute ---------------------------

def test_a_damaged_pack_is_a_pack_damaged_error_naming_the_pack(tmp_path):
    from mvc.errors import PackDamaged, PackMissing
    from mvc.store import packformat
    from mvc.store.packs import read_locations
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=CHUNK)
    repo.commit(state(0), "one")
    pack = next((tmp_path / "r" / ".mvc" / "packs").glob("*.pack"))
    data = pack.read_bytes()
    assert [cid for cid, _ in packformat.parse(data, f"pack {pack.name}")] == \
        [cid for cid, _ in read_locations(pack)]  # bytes and file agree
    pack.write_bytes(data[:-1])  # the seal cut off
    with pytest.raises(PackDamaged) as err:
        read_locations(pack)
    assert err.value.pack == pack.name
    with pytest.raises(PackDamaged) as err:
        packformat.parse(data[:-1], "remote pack packs/x.pack")
    assert err.value.pack == "packs/x.pack"
    pack.unlink()
    repo.close()
    repo = mvc.Repository.open(tmp_path / "r")
    with pytest.raises(PackMissing) as err:
        repo.load()
    assert err.value.pack == pack.name
    repo.close()


def test_atomic_write_leaves_the_old_bytes_or_the_new(tmp_path, monkeypatch):
    from mvc.store import fs
    target = tmp_path / "FORMAT"
    fs.atomic_write(target, b"old")
    real = os.fsync

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "injected")
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        fs.atomic_write(target, b"new bytes")
    monkeypatch.setattr(os, "fsync", real)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["FORMAT"]
    fs.atomic_write(target, b"new bytes")
    assert target.read_bytes() == b"new bytes" and [p.name for p in tmp_path.iterdir()] == ["FORMAT"]


def test_every_atomic_write_is_durable_in_its_folder(tmp_path, monkeypatch):
    """Bisect's state, an export and a folder remote's objects (and the FORMAT file) go
    through the one atomic write: fsynced, renamed, and their folder fsynced."""
    from mvc.store import fs
    synced = []
    real = fs.fsync_dir
    monkeypatch.setattr(fs, "fsync_dir", lambda path: (synced.append(Path(path).resolve()), real(path)))
    repo = mvc.Repository.init(tmp_path / "r", chunk_size=CHUNK)
    for i in range(3):
        repo.commit({"w": torch.full((8,), float(i))}, f"c{i}")
    synced.clear()
    repo.bisect.start("HEAD", "HEAD~2")
    assert synced == [(repo.dir / "tmp").resolve().parent]  # the state file's folder, .mvc
    assert [p.name for p in (repo.dir / "tmp").iterdir()] == []  # no temporary file left
    synced.clear()
    repo.export("HEAD", tmp_path / "out.safetensors")
    assert synced == [tmp_path.resolve()]
    synced.clear()
    repo.remotes.add("origin", str(tmp_path / "remote"))
    repo.remotes.push()
    assert (tmp_path / "remote" / "packs").resolve() in synced and (tmp_path / "remote").resolve() in synced
    repo.close()
