"""Remotes in a folder on this machine: push, fetch, pull, clone, tiers, damage, repair.

The same code paths as S3 (tests/test_remote_s3.py runs the S3 ones
against a real SeaweedFS); folders make these fast. Tensors are tiny and
the chunk size is 64 bytes, so every state spans many chunks.
"""

import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import mvc
from mvc.cli import main
from mvc.remote import layout
from mvc.errors import (BranchLocked, CorruptObject, Diverged, RefRejected, RemoteCorrupt, RemoteDamaged,
                        UntrustedAnswer)
from mvc.remote.bucket import FolderBucket, PreconditionFailed

SMALL = 64


def state(seed: int = 0, n: int = 2000) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(n, generator=g), "frozen": torch.arange(n, dtype=torch.float32)},
            "step": seed, "opt": [torch.ones(7, dtype=torch.bfloat16) * seed]}


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture
def origin(tmp_path):
    """A repository with two commits on main and a folder remote 'origin' it has pushed to."""
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=SMALL)
    repo.commit(state(0), "first")
    s = state(0)
    s["model"]["w"][:16] = 1.0  # one chunk changes
    repo.commit(s, "second")
    repo.remotes.add("origin", str(tmp_path / "remote"))
    repo.remotes.push()
    yield repo
    repo.close()


def remote_packs(tmp_path) -> list:
    return sorted((tmp_path / "remote" / "packs").glob("*.pack"))


def test_clone_round_trip_bit_exact_and_fsck_clean(origin, tmp_path):
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    try:
        assert clone.head().branch == "main" and clone.resolve("main") == origin.resolve("main")
        for rev in ("main", "main~1"):
            assert same(clone.load(rev), origin.load(rev))
        assert clone.fsck().ok and origin.fsck().ok
        assert clone.remotes.fsck().ok
        assert [c.id for c in clone.log()] == [c.id for c in origin.log()]
    finally:
        clone.close()


def test_push_sends_only_what_the_remote_lacks(origin, tmp_path):
    again = origin.remotes.push()
    assert (again.chunks, again.objects, again.refs[0].status) == (0, 0, "up to date")
    s = origin.load()
    s["model"]["w"][96:112] = 3.0  # bytes 384-447: exactly one chunk
    origin.commit(s, "third")
    report = origin.remotes.push()
    assert report.chunks == 1 and report.chunk_bytes == SMALL
    assert report.commits == 1 and report.objects == 3  # commit, tree, the changed tensor
    assert origin.resolve("origin/main") == origin.resolve("main")


def test_push_keeps_each_tensors_chunks_together_in_the_remote_packs(origin, tmp_path):
    """Chunks go up in the order they lie in local packs, so reading a few
    tensors from the remote takes a few long ranged reads, not one per chunk."""
    from mvc.remote.catalogue import Catalogue
    catalogue = Catalogue(origin.dir, "origin")
    try:
        tensors = {e.path: e.chunks for e in origin.entries("main~1") if e.kind == "tensor" and len(e.chunks) > 1}
        assert len(tensors) >= 2
        places = {}
        for key, chunks in tensors.items():
            locs = [catalogue.chunk(bytes.fromhex(c) if isinstance(c, str) else c) for c in dict.fromkeys(chunks)]
            assert len({loc.pack for loc in locs}) == 1, key
            offsets = [loc.offset for loc in locs]
            assert offsets == sorted(offsets), key  # in the tensor's order
            places[key] = (locs[0].pack, offsets[0], offsets[-1])
        for key, (pack, lo, hi) in places.items():  # and no other tensor's chunk in between
            assert not any(p == pack and lo < o < hi for k, (p, o, _) in places.items() if k != key), key
    finally:
        catalogue.close()


def test_fetch_moves_only_missing_and_tracking_refs(origin, tmp_path):
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    s = origin.load()
    s["model"]["w"][-16:] = 7.0
    c = origin.commit(s, "third")
    origin.remotes.push()
    report = clone.remotes.fetch()
    assert report.chunks == 1 and report.objects == 3
    assert clone.resolve("origin/main") == c.id and clone.resolve("main") != c.id
    assert same(clone.load("origin/main"), s)
    assert clone.remotes.fetch().chunks == 0
    pulled = clone.remotes.pull()
    assert pulled.status == "fast-forward" and clone.resolve("main") == c.id
    assert clone.fsck().ok
    clone.close()


def test_two_pushers_one_wins_the_other_is_rejected(origin, tmp_path):
    other = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    s = origin.load()
    s["step"] = 100
    origin.commit(s, "mine")
    s["step"] = 200
    theirs = other.commit(s, "theirs")
    other.remotes.push()
    with pytest.raises(RefRejected) as err:
        origin.remotes.push()
    assert (err.value.remote, err.value.refs) == ("origin", ("heads/main",))
    assert other.remotes.fetch().refs[0].status == "up to date"
    origin.remotes.fetch()
    assert origin.resolve("origin/main") == theirs.id  # their update is not lost
    other.close()


def test_conditional_put_races_lose_cleanly(tmp_path):
    bucket = FolderBucket(tmp_path / "r", create=True)
    etag = bucket.put("refs/heads/x", b"1", if_absent=True)
    with pytest.raises(PreconditionFailed):
        bucket.put("refs/heads/x", b"2", if_absent=True)
    bucket.put("refs/heads/x", b"3", if_match=etag)
    with pytest.raises(PreconditionFailed):
        bucket.put("refs/heads/x", b"4", if_match=etag)  # stale etag
    assert bucket.get("refs/heads/x") == b"3"
    bucket.check_conditional()


class IgnoresConditions(FolderBucket):
    """A store that accepts every conditional write (as some S3 clones do)."""

    def put(self, key, data, if_match=None, if_absent=False):
        return super().put(key, data)


def test_a_store_without_conditional_writes_is_refused(tmp_path):
    bucket = IgnoresConditions(tmp_path / "r", create=True)
    with pytest.raises(UntrustedAnswer) as err:
        bucket.check_conditional()
    assert err.value.url == bucket.url and err.value.key.startswith("tmp/probe-")
    assert bucket.list("tmp/") == []  # the probe is removed


def test_lazy_clone_reads_on_demand_verified_and_keeps_them(origin, tmp_path):
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        assert lazy.status().chunks == 0 and lazy.fsck().ok
        assert same(lazy.load("main~1"), origin.load("main~1"))
        got = lazy.status().chunks
        assert got > 0 and lazy.cache.status().only_remote == 1  # only main's one changed chunk is away
        assert same(lazy.load("main"), origin.load("main"))
        assert lazy.fsck().ok and lazy.status().chunks == got + 1
        assert lazy.gc().chunks_removed == 0 and same(lazy.load("main"), origin.load("main"))
    finally:
        lazy.close()


def test_a_cache_write_that_fails_fails_the_read_and_keeps_nothing(origin, tmp_path, monkeypatch):
    from mvc.store.chunks import PackBatch
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        real, calls = PackBatch.add, []

        def full_disk(self, cid, data):  # the cache writer's second chunk meets a full disk
            calls.append(cid)
            if len(calls) == 2:
                raise OSError(28, "No space left on device (injected)")
            return real(self, cid, data)
        monkeypatch.setattr(PackBatch, "add", full_disk)
        with pytest.raises(OSError) as err:
            lazy.load("main")
        assert err.value.errno == 28
        assert lazy.status().chunks == 0 and lazy.fsck().ok
        assert not list((tmp_path / "lz" / ".mvc" / "packs").glob("*.tmp"))
        monkeypatch.setattr(PackBatch, "add", real)
        assert same(lazy.load("main"), origin.load("main")) and lazy.status().chunks > 0
    finally:
        lazy.close()


def test_lazy_clone_commits_and_pushes(origin, tmp_path):
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    s = origin.load()
    s["model"]["w"][:16] = 9.0
    c = lazy.commit(s, "from the lazy clone")
    # held here whole, not deduplicated against the remote's listing: until it is pushed, a remote
    # gc may delete what only the remote's old commits used, and this is the last good copy
    assert c.stats.chunks_new == c.stats.chunks and lazy.status().chunks == c.stats.chunks
    report = lazy.remotes.push()
    assert report.chunks == 1  # the push still sends only what the remote lacks
    origin.remotes.pull()
    assert same(origin.load(), s)
    lazy.close()


def test_eviction_under_a_budget_keeps_unpushed_and_pinned(origin, tmp_path):
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        lazy.load("main")
        lazy.load("main~1")
        lazy.create_branch("old", "main~1")
        lazy.checkout("old")
        lazy.cache.pin("old")
        s = lazy.load("old")
        s["model"]["w"][:16] = 5.0
        lazy.commit(s, "not pushed", branch="side")  # only here: never evicted
        before = lazy.status().chunks
        lazy.config("cache.max-bytes", "0")
        report = lazy.cache.evict()
        assert report.kept_local >= 1 and report.kept_pinned > 0
        assert 0 < lazy.status().chunks < before
        lazy.cache.pin("old", False)
        lazy.checkout("main")
        report = lazy.cache.evict(0)
        with lazy.index.read() as txn:
            assert txn.chunk(lazy.entries("side")[1].chunks[0]) is not None  # the unpushed chunk stayed
        assert lazy.fsck().ok
        for rev, theirs in (("main", "main"), ("old", "main~1")):
            assert same(lazy.load(rev), origin.load(theirs))  # evicted ones come back, verified
        assert same(lazy.load("side"), s)
    finally:
        lazy.close()


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["zero-byte", "truncated", "flipped-trailer"])
def test_fetch_in_a_lazy_clone_notices_a_damaged_pack_it_relies_on(origin, tmp_path, damage):
    """A lazy clone catalogued the remote's packs when they were whole; then one was emptied, cut
    short or had its trailer flipped. fetch said "up to date" (exit 0) while fsck --remote found
    the damage: a pack listed with another size or time is read again, and what it held is missing."""
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    lazy.close()
    pack = max(remote_packs(tmp_path), key=lambda p: p.stat().st_size)
    data = pack.read_bytes()
    if damage == "zero-byte":
        pack.write_bytes(b"")
    elif damage == "truncated":
        pack.write_bytes(data[:len(data) // 2])
    else:
        _flip_byte(pack, len(data) - 40)  # inside the trailer (its footer's hash no longer matches)
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "lz"), "fetch"])
    assert result.exit_code == 1, result.output
    assert "up to date" not in result.output and "fsck --remote" in result.output, result.output


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:45001:99", "http://127.0.0.1:99999", "http://:80",
                                      "ftp://127.0.0.1:80"])
def test_remote_add_refuses_a_malformed_endpoint_at_once(tmp_path, endpoint):
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=SMALL)
    repo.close()
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "a"), "remote", "add", "origin", "s3://bucket/x",
                                       "--endpoint-url", endpoint])
    assert result.exit_code != 0 and "endpoint URL" in result.output and "Traceback" not in result.output, \
        result.output
    with mvc.Repository.open(tmp_path / "a") as again:
        assert again.remotes.list() == []


def test_flipped_byte_on_the_remote_is_found_and_refused(origin, tmp_path):
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    full = mvc.Repository.init(tmp_path / "full", chunk_size=SMALL)
    full.remotes.add("origin", str(tmp_path / "remote"))
    biggest = max(remote_packs(tmp_path), key=lambda p: p.stat().st_size)
    _flip_byte(biggest, 200)
    report = origin.remotes.fsck()
    assert not report.ok and any(biggest.name in p.object for p in report.problems)
    with pytest.raises(RemoteCorrupt) as err:
        full.remotes.fetch()
    assert err.value.key == f"packs/{biggest.name}" and err.value.id is not None
    from mvc.cli.base import advice
    assert advice(err.value).endswith("run 'mvc fsck --remote'")  # the CLI, not the library, names the command
    assert full.remotes.branches() == [] and full.status().chunks == 0  # nothing indexed, no ref moved
    with pytest.raises(mvc.ChecksumMismatch):
        lazy.load("main")
    assert lazy.fsck().ok
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "a"), "fsck", "--remote", "origin"])
    assert result.exit_code == 1 and "checksum-mismatch" in result.output
    lazy.close()
    full.close()


def test_deleted_remote_pack_is_named(origin, tmp_path):
    pack = max(remote_packs(tmp_path), key=lambda p: p.stat().st_size)
    pack.unlink()
    report = origin.remotes.fsck()
    assert not report.ok and any(p.kind == "missing-chunk" and "heads/main" in p.refs[0] for p in report.problems)
    fresh = mvc.Repository.init(tmp_path / "fresh", chunk_size=SMALL)
    fresh.remotes.add("origin", str(tmp_path / "remote"))
    with pytest.raises(RemoteDamaged) as err:
        fresh.remotes.fetch()
    assert err.value.remote == "origin" and err.value.ids
    fresh.close()


def test_log_all_takes_in_and_names_remote_tracking_branches(origin, tmp_path):
    """As git log --all: a commit only origin/main reaches after a fetch is listed, and
    log decorates it with origin/main (it was left out, and never named)."""
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    third = origin.commit(state(3), "third")
    origin.remotes.push()
    clone.remotes.fetch()
    clone.close()
    runner = CliRunner()
    lines = runner.invoke(main, ["-C", str(tmp_path / "b"), "log", "--all", "--oneline"]).stdout.splitlines()
    assert lines[0] == f"{third.short_id} (origin/main) third" and len(lines) == 3, lines
    assert "(HEAD -> main)" in lines[1]
    graph = runner.invoke(main, ["-C", str(tmp_path / "b"), "log", "--graph", "--oneline", "origin/main"])
    assert graph.stdout.splitlines()[0] == f"* {third.short_id} (origin/main) third"
    with mvc.Repository.open(tmp_path / "b") as again:
        assert [c.message for c in mvc.history.walk(again, all_refs=True)] == ["third", "second", "first"]


def test_repair_refetches_damaged_local_chunks(origin, tmp_path):
    packs = sorted((tmp_path / "a" / ".mvc" / "packs").glob("*.pack"), key=lambda p: p.stat().st_size)
    _flip_byte(packs[-1], 8 + 36 + 3)  # inside the first record's data
    assert not origin.fsck().ok
    report = origin.cache.repair()
    assert report.chunks_repaired >= 1 and report.after.ok
    assert same(origin.load("main~1"), state(0))


def test_fsck_repair_goes_on_to_the_next_remote_when_one_fails(origin, tmp_path):
    """fsck --repair stopped at the first remote that failed: here one pushed to and then gone
    (its folder removed), and one added but never pushed to, both sorting before origin."""
    import shutil
    origin.remotes.add("a-gone", str(tmp_path / "gone"))
    origin.remotes.push("a-gone")
    shutil.rmtree(tmp_path / "gone")
    origin.remotes.add("b-never-pushed", str(tmp_path / "nowhere"))
    packs = sorted((tmp_path / "a" / ".mvc" / "packs").glob("*.pack"), key=lambda p: p.stat().st_size)
    _flip_byte(packs[-1], 8 + 36 + 3)  # inside the first record's data
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "a"), "fsck", "--repair"])
    assert result.exit_code == 0, result.output
    assert "could not repair from remote a-gone" in result.output and "ok: no damage found" in result.output
    assert "b-never-pushed" not in result.output  # fsck named origin as holding a copy: asked before it
    assert same(origin.load("main~1"), state(0))


def test_protected_and_locked_remote_refs(origin, tmp_path):
    other = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    origin.remotes.lock("main", owner="alice")
    s = other.load()
    s["step"] = 5
    other.commit(s, "bob's", author="bob")
    os.environ["MVC_AUTHOR"] = "bob"
    try:
        with pytest.raises(BranchLocked) as err:
            other.remotes.push()
        assert (err.value.branch, err.value.owner, err.value.remote) == ("main", "alice", "origin")
    finally:
        del os.environ["MVC_AUTHOR"]
    assert origin.remotes.unlock("main", owner="alice")
    origin.create_tag("v1", "main", protect=True)
    origin.remotes.push(refs=("v1",))
    origin.create_tag("v1", "main~1", force=True, protect=True)
    with pytest.raises(mvc.ProtectedRef):
        origin.remotes.push(refs=("v1",))
    other.close()


def test_pull_refuses_diverged_history(origin, tmp_path):
    other = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    s = origin.load()
    s["step"] = 1
    origin.commit(s, "a")
    origin.remotes.push()
    s["step"] = 2
    other.commit(s, "b")
    with pytest.raises(Diverged) as err:
        other.remotes.pull()
    assert (err.value.branch, err.value.remote) == ("main", "origin")
    other.close()
    # the advice names mvc merge (it said "mvc does not merge checkpoints"), and the merge it names works
    pulled = CliRunner().invoke(main, ["-C", str(tmp_path / "b"), "pull"])
    assert pulled.exit_code == 1 and "does not merge" not in pulled.stderr
    assert "'mvc merge main origin/main -b main'" in pulled.stderr and "'mvc branch NAME main'" in pulled.stderr
    merged = CliRunner().invoke(main, ["-C", str(tmp_path / "b"), "merge", "main", "origin/main", "-b", "main"])
    assert merged.exit_code == 0, merged.output
    with mvc.Repository.open(tmp_path / "b") as again:
        assert again.resolve("origin/main") in again.get_commit("main").parents


def test_layout_marker_and_refs_on_the_remote(origin, tmp_path):
    root = tmp_path / "remote"
    assert layout.parse_marker((root / "MVCREMOTE").read_bytes(), "x") == SMALL
    oid, protected = layout.decode_ref((root / "refs/heads/main").read_bytes(), "main")
    assert oid.hex() == origin.resolve("main") and not protected
    assert layout.decode_head((root / "HEAD").read_bytes()) == "heads/main"
    assert all(p.read_bytes()[:8] == b"MVCPACK1" for p in remote_packs(tmp_path))


def test_cli_remote_commands(tmp_path):
    runner = CliRunner()

    def run(*args, code=0):
        result = runner.invoke(main, ["-C", str(tmp_path / "a"), *args])
        assert result.exit_code == code, result.output
        return result.output
    mvc.Repository.init(tmp_path / "a", chunk_size=SMALL).close()
    torch.save(state(1), tmp_path / "s.pt")
    run("commit", str(tmp_path / "s.pt"), "-m", "one")
    run("remote", "add", "origin", str(tmp_path / "remote"))
    assert "origin" in run("remote", "list")
    assert '"url"' in run("remote", "list", "--json")
    assert "(new)" in run("push")
    assert "origin/main" in run("branch", "-r")
    assert "one" in run("log", "--oneline", "origin/main")
    assert "remote origin" in run("status")
    out = runner.invoke(main, ["clone", "--lazy", str(tmp_path / "remote"), str(tmp_path / "c")])
    assert out.exit_code == 0 and "lazy" in out.output
    assert "ok" in run("fsck", "--remote", "origin")
    err = runner.invoke(main, ["-C", str(tmp_path / "a"), "remote", "add", "x", "ftp://nope"])
    assert err.exit_code == 1 and "not supported" in err.output and "Traceback" not in err.output
    err = runner.invoke(main, ["-C", str(tmp_path / "a"), "push", "nosuch"])
    assert err.exit_code == 1 and "no remote named 'nosuch'" in err.output
    run("config", "cache.max-bytes", "1G")
    assert run("config", "cache.max-bytes").strip() == str(1 << 30)
    run("remote", "remove", "origin")
    assert run("branch", "-r").strip() == ""


def test_config_names_every_setting_and_lists_those_set(origin):
    """config's help and its error for an unknown key named only the cache settings, and
    'mvc config' with no KEY was a usage error: it lists the settings, as git config --list."""
    from mvc.remote.verbs import SETTINGS
    runner = CliRunner()

    def run(*args):
        return runner.invoke(main, ["-C", str(origin.root), *args])
    keys = ["cache.remote", "cache.max-bytes", "signing.key", "signing.allowed-signers", "signing.require",
            "signing.fetch"]
    assert list(SETTINGS) == keys
    assert all(key in run("config", "--help").stdout for key in keys)
    assert "refuse" in SETTINGS["signing.fetch"] and "off" in SETTINGS["signing.fetch"]
    unknown = run("config", "nope")
    assert unknown.exit_code == 1 and unknown.stderr.endswith(f"known: {', '.join(keys)}\n")
    empty = run("config")
    assert empty.exit_code == 0 and empty.stdout == ""
    assert run("config", "signing.fetch", "off").exit_code == 0
    run("config", "cache.max-bytes", "1K")
    listed = run("config")
    assert listed.exit_code == 0
    assert listed.stdout.splitlines() == ["cache.remote=origin", "cache.max-bytes=1024", "signing.fetch=off"]
    assert origin.settings() == {"cache.remote": "origin", "cache.max-bytes": "1024", "signing.fetch": "off"}
    assert run("config", "--unset").exit_code == 2


def test_evict_keeps_a_branch_the_remote_deleted_after_the_last_fetch(origin, tmp_path):
    """The tracking ref of a branch deleted on the remote lingers until a fetch --prune: eviction
    must ask the remote what its refs reach now, or a remote gc takes the last copy."""
    s = state(5)
    origin.commit(s, "an experiment", branch="exp")
    origin.remotes.push(refs=("exp",))
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        lazy.create_branch("exp", "origin/exp")
        assert same(lazy.load("exp"), s)  # cached here
        origin.remotes.push(delete=("exp",))
        lazy.remotes.fetch()  # no --prune: origin/exp stays
        assert lazy.resolve("origin/exp") == lazy.resolve("exp")
        report = lazy.cache.evict(0)  # exp's chunks stay: the remote's refs no longer reach them
        assert report.chunks_evicted == 0 and report.kept_pinned > 0
        origin.remotes.gc(grace=0)  # the remote drops what only exp needed
        assert same(lazy.load("exp"), s) and lazy.fsck().ok
    finally:
        lazy.close()


def test_a_lazy_clone_learns_what_the_remotes_retention_pruned(origin, tmp_path):
    """After a remote gc with retention, the clone's fetch used to fail ("the remote is damaged")
    and loads named missing chunks. Now a commit the remote pruned is pruned here too when its data
    is gone: some chunk neither here nor on the remote. One held whole here, or whose chunks the
    remote still holds (in a pack it kept whole), keeps its data."""
    from mvc.errors import CommitPruned
    third, fourth = state(3), state(4)
    for s, message in ((third, "third"), (fourth, "fourth")):  # each in packs of its own
        origin.commit(s, message)
        origin.remotes.push()
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        first, second, gone = lazy.resolve("main~3"), lazy.resolve("main~2"), lazy.resolve("main~1")
        held = lazy.load("main~2")  # held whole here
        report = origin.remotes.gc(keep_last=1, grace=0)
        assert set(report.pruned) == {first, second, gone} and report.packs_deleted  # third's own pack
        fetched = lazy.remotes.fetch()
        assert fetched.pruned == (gone,)
        with pytest.raises(CommitPruned) as err:
            lazy.load("main~1")
        assert err.value.policy.startswith("keep-last 1") and "1970" not in str(err.value)
        assert same(lazy.load("main~2"), held) and same(lazy.load("main"), fourth)
        assert same(lazy.load("main~3"), state(0))  # its chunks are still there (a pack kept whole)
        assert lazy.fsck().ok and lazy.remotes.fetch().pruned == ()
        result = CliRunner().invoke(main, ["-C", str(tmp_path / "lz"), "cache", "status"])
        assert result.exit_code == 0 and "neither here nor there" not in result.output
    finally:
        lazy.close()


def test_a_push_never_points_a_remote_ref_at_a_commit_its_retention_pruned(origin, tmp_path):
    """The push walk stops at commits the remote holds: a branch at one the remote pruned would
    send no data and leave a remote ref naming a commit without data. It is refused."""
    from mvc.errors import PrunedOnRemote
    origin.commit(state(3), "third")
    origin.remotes.push()
    second = origin.resolve("main~1")
    assert second in origin.remotes.gc(keep_last=1, grace=0).pruned
    origin.create_branch("keep", "main~1")
    with pytest.raises(PrunedOnRemote) as err:
        origin.remotes.push(refs=("keep",))
    assert (err.value.remote, err.value.ref, err.value.id) == ("origin", "heads/keep", second)
    assert err.value.policy.startswith("keep-last 1")
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "a"), "push", "origin", "keep"])
    assert result.exit_code == 1 and "pruned on remote 'origin'" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "c")
    try:
        with pytest.raises(mvc.UnknownRevision):
            clone.resolve("origin/keep")  # the remote has no such ref
        assert same(clone.load("main"), state(3)) and clone.fsck().ok
    finally:
        clone.close()
    assert origin.remotes.push().chunks == 0  # main, already there, still pushes


def test_a_lazy_fetch_says_when_refs_here_need_chunks_the_remote_no_longer_has(origin, tmp_path):
    """A branch deleted on the remote and collected there, that this clone never read: fetch
    succeeds (the remote is not damaged), and says how many chunks refs here lost."""
    s = state(6)
    origin.commit(s, "an experiment", branch="exp")
    origin.remotes.push(refs=("exp",))
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        lazy.create_branch("exp", "origin/exp")  # never read here
        assert lazy.remotes.fetch().lost == 0
        origin.remotes.push(delete=("exp",))
        origin.remotes.gc(grace=0)
        report = lazy.remotes.fetch()
        assert report.lost > 0 and report.pruned == ()
        assert lazy.cache.status().lost == report.lost  # not counted as held by the remote
        damage = lazy.fsck().damage
        assert damage and all("heads/exp" in d.refs and "heads/main" not in d.refs for d in damage)
    finally:
        lazy.close()
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "lz"), "fetch"])
    assert result.exit_code == 0 and "that refs here need are neither here nor on origin" in result.output


def test_a_push_never_makes_a_remote_again_where_one_it_used_has_gone(origin, tmp_path):
    """The remote's folder moved away (or its disk is not mounted, leaving an empty mount point):
    a push made a fresh empty remote there, took the pushes, and a cache budget evicted against it."""
    from mvc.errors import RemoteVanished
    remote = tmp_path / "remote"
    remote.rename(tmp_path / "elsewhere")
    origin.commit(state(7), "third")
    with pytest.raises(mvc.errors.RemoteError):
        origin.remotes.push()
    assert not remote.exists()  # nothing was made there
    remote.mkdir()  # the mount point, without its disk
    with pytest.raises(RemoteVanished) as err:
        origin.remotes.push()
    assert err.value.remote == "origin" and list(remote.iterdir()) == []
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "a"), "push"])
    assert result.exit_code == 1 and "used it before" in result.output and "Traceback" not in result.output
    remote.rmdir()
    (tmp_path / "elsewhere").rename(remote)  # back in place: the push goes through
    assert origin.remotes.push().commits == 1
    origin.remotes.add("fresh", str(tmp_path / "fresh"))
    assert origin.remotes.push("fresh").commits == 3  # a remote never used is still made by the first push


def test_a_state_the_remote_pruned_is_stored_again_by_a_commit_and_a_push(origin, tmp_path):
    """After a remote gc pruned commit P (its chunks deleted, its tree and tensor objects kept in a
    pack kept whole), committing P's state again wrote nothing in a lazy clone (the stale listing
    still showed the chunks) and a push sent no chunk (the remote had the tree): both named data
    nobody held."""
    second, third = state(0), state(0)
    second["model"]["w"][:16] = 3.0
    third["model"]["w"][:16] = 2.0
    for s, message in ((second, "second"), (third, "third")):  # each changed chunk in a pack of its own
        origin.commit(s, message)
        origin.remotes.push()
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        assert origin.remotes.gc(keep_last=1, grace=0).packs_deleted  # second's own pack goes
        again = lazy.commit(second, "second again", branch="again", start="main")
        assert again.stats.bytes_new > 0  # written here: the listing is no proof the remote holds it
        assert same(lazy.load("again"), second)
        assert lazy.remotes.push(refs=("again",)).chunks > 0  # the remote holds its tree, not its chunk
        mine = origin.commit(second, "second once more", branch="more", start="main")
        assert mine.stats.bytes_new == 0  # the full repository holds every chunk itself
        assert origin.remotes.push(refs=("more",)).chunks == 0  # the lazy clone's push sent it
        assert origin.remotes.fsck().ok
    finally:
        lazy.close()
    fresh = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "fresh")
    try:
        assert same(fresh.load("origin/again"), second) and same(fresh.load("origin/more"), second)
        assert fresh.fsck().verified
    finally:
        fresh.close()


def test_evict_says_when_the_remote_moved_past_this_clone(origin, tmp_path):
    """Eviction reads the remote's refs; a tip pushed since this clone's last fetch is not held
    here, so what it reaches cannot be told: nothing is evicted on its strength, and it says so."""
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        lazy.load("main")
        lazy.load("main~1")
        lazy.checkout("main~1")
        origin.commit(state(8), "pushed past the clone")
        origin.remotes.push()
        report = lazy.cache.evict(0)
        assert report.remote_ahead == ("heads/main",) and report.chunks_evicted == 0
        lazy.remotes.fetch()
        report = lazy.cache.evict(0)
        assert report.remote_ahead == () and report.chunks_evicted > 0
        assert same(lazy.load("origin/main"), state(8))
    finally:
        lazy.close()


def test_a_tag_kept_local_survives_eviction_and_loads_with_the_remote_gone(origin, tmp_path):
    runner = CliRunner()

    def run(*args, code=0):
        result = runner.invoke(main, ["-C", str(tmp_path / "lz"), *args])
        assert result.exit_code == code, result.output
        return result.output
    mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True).close()
    assert "Keeping tag v1's chunks" in run("tag", "v1", "main~1", "--keep-local")
    run("checkout", "v1", "-o", str(tmp_path / "v1.pt"))  # reads v1's chunks into the cache
    run("checkout", "main", "-o", str(tmp_path / "main.pt"))
    run("checkout", "v1")  # HEAD's chunks are never evicted: HEAD leaves main
    run("config", "cache.max-bytes", "0")
    run("cache", "evict")
    (tmp_path / "remote").rename(tmp_path / "gone")
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        assert same(lazy.load("v1"), origin.load("main~1"))  # every chunk still here
        with pytest.raises(mvc.MvcError):
            lazy.load("main")  # its changed chunk was evicted and the remote is gone
    (tmp_path / "gone").rename(tmp_path / "remote")
    assert "No longer keeping" in run("tag", "v1", "--no-keep-local")
    run("checkout", "main")
    run("cache", "evict")
    with mvc.Repository.open(tmp_path / "lz") as lazy:
        only_v1 = {c for e in lazy.entries("v1") for c in e.chunks} - {c for e in lazy.entries("main") for c in e.chunks}
        with lazy.index.read() as txn:
            assert only_v1 and all(txn.chunk(c) is None for c in only_v1)  # unpinned: evicted
    assert "--keep-local takes a tag NAME" in run("tag", "--keep-local", code=2)


def test_evict_keeps_what_an_unpushed_commit_shares_with_the_remote(origin, tmp_path):
    """A remote keeps only what its refs need (a remote gc deletes the rest): a chunk a local-only
    commit uses stays local even while the remote's packs happen to hold it."""
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        s = lazy.load("main")  # main's chunks are local now
        s["step"] = 99  # same tensors: the new commit shares every chunk with main
        lazy.commit(s, "only here", branch="mine")
        lazy.checkout("main~1")  # HEAD pins main~1 only
        from mvc.remote.tiers import commit_chunks
        with lazy.index.read() as txn:
            main, older = (bytes.fromhex(lazy.resolve(r)) for r in ("main", "main~1"))
            ids = commit_chunks(lazy, txn, {main}) - commit_chunks(lazy, txn, {older})
        assert ids
        lazy.cache.evict(0)
        with lazy.index.read() as txn:
            assert all(txn.chunk(c) is not None for c in ids)  # kept: "mine" is not on the remote
        lazy.remotes.push(refs=("mine",))
        lazy.cache.evict(0)
        with lazy.index.read() as txn:
            assert all(txn.chunk(c) is None for c in ids)  # now origin/mine reaches them there
        assert same(lazy.load("mine"), s)
    finally:
        lazy.close()


def test_a_process_opened_before_a_repack_elsewhere_evicts_the_encoded_records(tmp_path):
    """Another process repacked the lazy clone after this one opened it: eviction (and a push,
    which keeps the cache budget through it) rewrites packs holding encoded records, so it must
    take up the FORMAT that repack changed, as gc does, not write them into a version 1 pack."""
    import subprocess
    import sys
    src = mvc.Repository.init(tmp_path / "a", chunk_size=4096)
    w, ids = torch.randn(4096), []
    for k in range(3):
        w[k] += 1
        ids.append((src.commit({"w": w.clone()}, f"c{k}").id, w.clone()))
    src.remotes.add("origin", str(tmp_path / "remote"))
    src.remotes.push()
    src.close()
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        for cid, _ in ids:
            lazy.load(cid)  # every chunk local now
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        done = subprocess.run([sys.executable, "-m", "mvc", "repack"], cwd=tmp_path / "lz", env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0 and "deltas" in done.stdout, done.stdout + done.stderr
        report = lazy.cache.evict(0)
        assert report.chunks_evicted > 0 and report.packs_rewritten == 1  # the pinned head's records moved
        with lazy.index.read() as txn:
            assert any(loc.coded for _, loc in txn.chunks())
        for cid, want in ids:
            assert torch.equal(lazy.load(cid)["w"], want)
        assert lazy.fsck().ok
    finally:
        lazy.close()


def test_packs_built_in_the_memory_of_sent_ones_are_whole_and_exact(tmp_path, monkeypatch):
    """A push reuses the buffers of pack images already sent (issue 24): packs of
    different sizes built in them hold exactly their own records and trailer
    (no bytes of an earlier, larger pack), and a clone loads bit for bit."""
    from mvc.remote import transfer
    monkeypatch.setattr(layout, "PACK_BYTES", 900)  # many packs of a few chunks each
    made = []
    real = transfer.Uploader.reserve

    def reserve(self, size):
        buf = real(self, size)
        made.append(id(buf))
        return buf
    monkeypatch.setattr(transfer.Uploader, "reserve", reserve)
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=SMALL)
    s = state(3, n=3000)
    s["model"]["odd"] = torch.arange(37, dtype=torch.int8)  # a short chunk: packs of different sizes
    repo.commit(s, "v1")
    repo.remotes.add("origin", str(tmp_path / "remote"))
    report = repo.remotes.push()
    assert report.packs > 8 and len(set(made)) < len(made)  # buffers came back and were used again
    for pack in remote_packs(tmp_path):
        data = pack.read_bytes()
        entries = layout.parse_trailer(data[layout.trailer_span(data[-layout.FOOTER.size:], len(data), pack.name)[0]:
                                            len(data) - layout.FOOTER.size], data[-layout.FOOTER.size:], len(data),
                                       pack.name)
        from mvc import hashing
        assert entries and all(hashing.digest(data[off:off + n]) == cid for cid, off, n in entries)
        assert data.startswith(layout.HEADER) and len(data) == layout.PackImage.size([(c, n) for c, _, n in entries])
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    assert same(clone.load(), s) and clone.fsck().ok
    clone.close()
    repo.close()


def test_fetch_does_not_make_a_tag_named_like_a_local_branch(origin, tmp_path):
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    try:
        clone.create_branch("v1", "main~1")
        origin.create_tag("v1", "main")
        origin.create_tag("v2", "main~1")
        origin.remotes.push(refs=("tags/v1", "tags/v2"))
        report = clone.remotes.fetch()
        status = {u.ref: u.status for u in report.refs}
        assert status["tags/v2"] == "new" and status["tags/v1"].startswith("not fetched")
        assert clone.resolve("v1") == origin.resolve("main~1") and clone.resolve("v2") == origin.resolve("main~1")
        assert [r.name for r in clone.tags()] == ["v2"]
        # the clone's first entry names the url, in the branch's reflog and in HEAD's, as git clone writes
        assert [e["message"] for _, e in clone.reflog.entries("main")] == [f"clone: {tmp_path / 'remote'}"]
        assert clone.reflog.entries("HEAD")[-1][1]["message"] == f"clone: {tmp_path / 'remote'}"
    finally:
        clone.close()


def test_removing_a_remote_drops_its_tracking_refs_and_their_reflogs(origin, tmp_path):
    clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "b")
    clone.remotes.fetch()
    assert [r.name for r in clone.remotes.branches()] == ["origin/main"]
    with clone.index.read() as txn:
        assert list(txn.reflog_raw("remotes/origin/main"))  # the clone's fetch logged the tracking ref
    clone.remotes.remove("origin")
    assert clone.remotes.list() == [] and clone.remotes.branches() == []
    with clone.index.read() as txn:
        assert list(txn.reflog_raw("remotes/origin/main")) == []
    assert clone.load() is not None and clone.fsck().ok  # the local branch and its data stay
    clone.close()


def test_a_clone_names_the_extensions_its_history_needs(tmp_path):
    """A clone of signed history, or of a model's state_dict (module metadata), lists the FORMAT
    extensions its origin does, so an mvc that would read those objects as damaged refuses it."""
    from mvc import ondisk, signing
    src = mvc.Repository.init(tmp_path / "a", chunk_size=SMALL)
    src.commit(torch.nn.Linear(3, 2).state_dict(), "a module's state_dict")
    src.commit(state(1), "signed", sign=signing.key_from_seed(bytes(range(32))))
    src.remotes.add("origin", str(tmp_path / "remote"))
    src.remotes.push()
    want = ondisk.read_format(src.dir)[1]
    src.close()
    assert {ondisk.DICT_METADATA, ondisk.SIGNATURES} <= want
    for lazy in (False, True):
        clone = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / f"b{lazy}", lazy=lazy)
        assert {ondisk.DICT_METADATA, ondisk.SIGNATURES} <= ondisk.read_format(clone.dir)[1]
        assert clone.fsck().ok
        clone.close()


def test_a_lazy_clone_writes_a_chunk_again_whose_cached_pack_is_gone(origin, tmp_path):
    # the cache's index may name a pack that is gone (removed by hand, or by an mvc whose repack
    # left entries behind): that is no copy here, so a commit of the same bytes must write them
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        state = lazy.load("main")
        for pack in (tmp_path / "lz" / ".mvc" / "packs").glob("pack-*.pack"):
            pack.unlink()
        state["model"]["w"][:16] = 7.0  # a new commit: one new chunk, the rest the cached ones
        c = lazy.commit(state, "after the cache lost its packs")
        assert c.stats.chunks_new == c.stats.chunks and same(lazy.load(c.id), state)
    finally:
        lazy.close()


# -- the layout number (docs/format.md 11.1) ---------------------------------------

OLD = "2e33347"  # the last mvc that reads only remote layout 1 (refs without a fence)


def old_layout():
    """mvc/remote/layout.py as mvc at ``OLD`` had it, loaded from this checkout's git history:
    the decoder of an mvc that reads only layout 1."""
    import subprocess
    import types
    try:
        source = subprocess.run(["git", "show", f"{OLD}:mvc/remote/layout.py"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs mvc's git history (commit {OLD})")
    module = types.ModuleType("mvc.remote.layout_at_" + OLD)
    module.__package__ = "mvc.remote"  # its relative imports are today's modules: only layout.py is old
    exec(compile(source, f"{OLD}:mvc/remote/layout.py", "exec"), module.__dict__)
    return module


def as_layout_1(read, write, keys) -> None:
    """Rewrite a remote as mvc at ``OLD`` wrote it: MVCREMOTE names layout 1, refs and tombstones
    carry no fence. ``read(key)`` / ``write(key, bytes)`` reach the remote's objects."""
    from mvc import encoding
    size = layout.parse_marker(read("MVCREMOTE"), "remote")
    write("MVCREMOTE", f"mvc-remote 1\nchunk-size {size}\n".encode())
    for key in keys:
        value = encoding.unpack(read(key), key)
        value.pop("fence")
        write(key, encoding.pack(value))


def folder_as_layout_1(root) -> None:
    refs = [str(p.relative_to(root)) for p in (root / "refs").rglob("*") if p.is_file()]
    as_layout_1(lambda key: (root / key).read_bytes(), lambda key, data: (root / key).write_bytes(data), refs)


def test_a_new_remote_is_layout_2_and_an_mvc_of_layout_1_refuses_it(origin, tmp_path):
    marker = (tmp_path / "remote" / "MVCREMOTE").read_bytes()
    assert marker == f"mvc-remote 2\nchunk-size {SMALL}\n".encode()
    assert layout.read_marker(marker, "x") == (2, SMALL)
    old = old_layout()
    with pytest.raises(CorruptObject) as err:
        old.parse_marker(marker, "REMOTE")
    assert str(err.value) == "REMOTE uses remote layout 2; this mvc reads layout 1: upgrade mvc"
    with pytest.raises(CorruptObject, match="remote ref main is damaged"):  # what it said without the marker
        old.decode_ref((tmp_path / "remote/refs/heads/main").read_bytes(), "main")
    with pytest.raises(CorruptObject, match="uses remote layout 3; this mvc reads layouts 1, 2: upgrade mvc"):
        layout.parse_marker(b"mvc-remote 3\nchunk-size 64\n", "x")


def test_a_layout_1_remote_reads_and_is_upgraded_at_the_first_fenced_write(origin, tmp_path):
    root = tmp_path / "remote"
    origin.commit(state(5), "tagged")
    origin.create_tag("v1")
    origin.remotes.push(refs=("main", "v1"))
    folder_as_layout_1(root)
    old = old_layout()
    v1 = (root / "refs/tags/v1").read_bytes()
    assert old.parse_marker((root / "MVCREMOTE").read_bytes(), "x") == SMALL  # as the old mvc wrote it
    assert old.decode_ref(v1, "v1")[0].hex() == origin.resolve("v1")
    # readers and a push that writes nothing leave it at layout 1: an old mvc reads it still
    clone = mvc.Repository.clone(str(root), tmp_path / "b")
    clone.close()
    assert origin.remotes.push().refs[0].status == "up to date"
    assert (root / "MVCREMOTE").read_bytes() == f"mvc-remote 1\nchunk-size {SMALL}\n".encode()
    # the first fenced write upgrades it first; the chunk size stays, the refs written before read on
    s = origin.load("main")
    s["step"] = 99
    origin.commit(s, "third")
    assert origin.remotes.push().refs[0].status == "updated"
    marker = (root / "MVCREMOTE").read_bytes()
    assert marker == f"mvc-remote 2\nchunk-size {SMALL}\n".encode()
    with pytest.raises(CorruptObject, match="uses remote layout 2; this mvc reads layout 1: upgrade mvc"):
        old.parse_marker(marker, "x")
    assert (root / "refs/tags/v1").read_bytes() == v1  # unfenced, as written before the upgrade
    with mvc.Repository.clone(str(root), tmp_path / "c") as clone:
        assert clone.resolve("v1") == origin.resolve("v1") and clone.resolve("main") == origin.resolve("main")
        assert same(clone.load("v1"), origin.load("v1")) and clone.remotes.fsck().ok


def test_a_remote_gc_that_deletes_upgrades_a_layout_1_remote(origin, tmp_path):
    root = tmp_path / "remote"
    origin.commit(state(7), "exp", branch="exp")
    origin.remotes.push(refs=("exp",))
    origin.remotes.push(refs=(":exp",))  # a tombstone: exp's packs are garbage now
    folder_as_layout_1(root)
    assert origin.remotes.gc(grace=0, dry_run=True).packs_deleted  # deletes nothing: no upgrade
    assert (root / "MVCREMOTE").read_bytes().startswith(b"mvc-remote 1\n")
    assert origin.remotes.gc(grace=0).packs_deleted
    assert (root / "MVCREMOTE").read_bytes() == f"mvc-remote 2\nchunk-size {SMALL}\n".encode()
    with mvc.Repository.clone(str(root), tmp_path / "b") as clone:
        assert same(clone.load("main"), origin.load("main")) and clone.remotes.fsck().ok


def test_an_upgrade_that_loses_the_race_reads_again(origin, tmp_path):
    from mvc.remote.connection import Connection
    root = tmp_path / "remote"
    folder_as_layout_1(root)

    class Raced(FolderBucket):  # another writer upgrades between this one's read and its put
        puts = 0

        def put(self, key, data, **kw):
            if key == layout.MARKER and not self.puts:
                other = Connection(origin, "origin")
                other.upgrade()
                other.close()
            self.puts += key == layout.MARKER
            return super().put(key, data, **kw)

    conn = Connection(origin, "origin")
    conn._bucket = Raced(root)
    try:
        conn.upgrade()
        assert conn.layout == 2 and conn.bucket.puts == 1  # its put failed; it read the other's layout 2
    finally:
        conn.close()
    assert (root / "MVCREMOTE").read_bytes() == f"mvc-remote 2\nchunk-size {SMALL}\n".encode()


def test_every_command_refuses_a_layout_it_does_not_read_and_changes_nothing(origin, tmp_path):
    root = tmp_path / "remote"
    (root / "MVCREMOTE").write_bytes(f"mvc-remote 3\nchunk-size {SMALL}\n".encode())
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and ".tmp" not in p.parts}
    origin.commit(state(9), "third")
    for command in (origin.remotes.push, origin.remotes.fetch, lambda: origin.remotes.gc(grace=0),
                    origin.remotes.fsck, origin.remotes.repair,
                    lambda: mvc.Repository.clone(str(root), tmp_path / "b")):
        with pytest.raises(CorruptObject, match="uses remote layout 3; this mvc reads layouts 1, 2: upgrade mvc"):
            command()
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and ".tmp" not in p.parts}
    assert {p: d for p, d in after.items() if not p.relative_to(root).parts[0] == "tmp"} == before
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "a"), "gc", "--remote", "origin"])
    assert result.exit_code != 0 and "uses remote layout 3" in result.stderr and "Traceback" not in result.output


def old_mvc(tmp_path):
    """A command line running mvc as of ``OLD`` (its tree from this checkout's git history)."""
    import subprocess
    import sys
    tree = tmp_path / f"mvc-{OLD}"
    tree.mkdir()
    try:
        archive = subprocess.run(["git", "archive", OLD, "mvc"], cwd=Path(__file__).parent.parent, capture_output=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs mvc's git history (commit {OLD})")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return lambda *args: subprocess.run([sys.executable, "-m", "mvc", *map(str, args)], capture_output=True,
                                        text=True, env=env, cwd=tmp_path)


def test_an_older_mvc_reads_a_layout_1_remote_and_refuses_it_once_upgraded(origin, tmp_path):
    root, old = tmp_path / "remote", old_mvc(tmp_path)
    folder_as_layout_1(root)
    cloned = old("clone", root, tmp_path / "b")
    assert cloned.returncode == 0, cloned.stderr
    origin.commit(state(3), "third")
    origin.remotes.push()
    fetched = old("-C", tmp_path / "b", "fetch")
    assert fetched.returncode == 1
    assert fetched.stderr.strip() == f"mvc: error: {root} uses remote layout 2; this mvc reads layout 1: upgrade mvc"


def test_evict_keeps_what_the_cached_remote_holds_only_as_garbage(origin, tmp_path):
    """A rejected push leaves its packs on the cached remote, which its refs do not need: a remote gc
    deletes them. Eviction dropped the local copies of chunks in them that another remote's tracking
    ref needs, and the gc then took the last copy here. Only what the remote's refs reach counts."""
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        lazy.remotes.add("backup", str(tmp_path / "backup"))
        s = lazy.load("main")
        s["model"]["w"][:64] = 7.0  # new chunks, only here
        mine = lazy.commit(s, "only on backup").id
        origin.commit(state(3), "third")
        origin.remotes.push()  # origin's main moved on: the lazy clone's push is refused...
        with pytest.raises(RefRejected):
            lazy.remotes.push()  # ...after it uploaded its packs: garbage on origin
        lazy.remotes.push("backup")
        lazy.create_branch("main", "origin/main", force=True)  # only backup/main reaches `mine` now
        assert lazy.resolve("backup/main") == mine
        report = lazy.cache.evict(0)
        assert report.kept_garbage > 0
        origin.remotes.gc(grace=0)  # deletes the rejected push's packs
        assert same(lazy.load("backup/main"), s)  # bit for bit, from the local copies
        assert lazy.fsck().ok
        for rev in ("main", "main~1"):
            assert same(lazy.load(rev), origin.load(rev + "~1"))
    finally:
        lazy.close()


@pytest.mark.parametrize("name", ["heads", "tags", "remotes", "refs", "HEAD"])
def test_a_remote_named_like_a_ref_namespace_is_refused(tmp_path, name):
    """A remote named 'tags' made tags/v1 mean the tag v1 or the tracking ref of its branch v1."""
    repo = mvc.Repository.init(tmp_path / "a", chunk_size=SMALL)
    try:
        with pytest.raises(mvc.errors.InvalidRemoteName) as info:
            repo.remotes.add(name, str(tmp_path / "remote"))
        assert (info.value.name, info.value.problem) == (name, "reserved")
        assert repo.remotes.list() == []
        repo.remotes.add(name + "2", str(tmp_path / "remote"))  # only the exact names
    finally:
        repo.close()
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "a"), "remote", "add", name, str(tmp_path / "r")])
    assert result.exit_code == 1 and "reserved" in result.output and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_evict_keeps_what_the_cached_remotes_retention_pruned_since_the_last_fetch(origin, tmp_path):
    """A remote gc with retention pruned history this clone holds whole (its packs stay while young):
    eviction took the remote's copy for one that stays, and the next remote gc took it."""
    lazy = mvc.Repository.clone(str(tmp_path / "remote"), tmp_path / "lz", lazy=True)
    try:
        first = lazy.load("main~1")  # every chunk of both commits is here now
        lazy.load("main")
        origin.commit({"other": torch.randn(500, generator=torch.Generator().manual_seed(9))}, "third")
        origin.remotes.push()
        lazy.remotes.fetch()
        report = origin.remotes.gc(keep_last=1)  # prunes second and first; their packs are young: kept
        assert len(report.pruned) == 2 and report.packs_deleted == ()
        lazy.cache.evict(0)  # HEAD (second) stays pinned; first is the remote's garbage now
        origin.remotes.gc(grace=0)
        assert same(lazy.load("main~1"), first)  # bit for bit, from the local copies
        assert lazy.fsck().ok
    finally:
        lazy.close()
