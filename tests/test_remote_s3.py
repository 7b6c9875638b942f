"""Remotes on real S3 servers (SeaweedFS and moto on loopback, tests/s3server.py): transfers, races, faults.

Each test runs on both servers, except those that kill and restart the
server under a push (moto keeps its objects in memory), and the slow
eviction race and two-process push race (their duplicates on moto cost
20 s and add little: test_remote_trust races pushes on moto), which run on
SeaweedFS only.

Pushes and loads run as real processes (the ``mvc`` CLI, or Python
children) where a test kills them with SIGKILL, kills the server under
them, or races two of them; afterwards fsck is clean on both sides and a
rerun moves only what is still missing.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import mvc

from conftest import pushed_repo, same
from mvc.remote.sync import REJECTED

CHUNK = 1024


def state(seed: int, n: int = 64 * 1024) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g), "b": torch.arange(256, dtype=torch.int64), "step": seed}


def mvc_cli(*args, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "mvc", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})}, **kw)


def _pushed(tmp_path, server):
    url = server.url()
    return pushed_repo(tmp_path / "a", url, server.endpoint, [(state(0), "first")], CHUNK), url


@pytest.fixture
def pushed(tmp_path, s3):
    """(repository with one commit pushed to S3 remote origin, its URL), on each S3 server."""
    repo, url = _pushed(tmp_path, s3)
    yield repo, url
    repo.close()


@pytest.fixture
def pushed_sw(tmp_path, seaweedfs):
    """The same on SeaweedFS only (tests that kill the server, or too slow to run twice)."""
    repo, url = _pushed(tmp_path, seaweedfs)
    yield repo, url
    repo.close()


def count_packs(server, url: str) -> int:
    bucket, _, prefix = url[len("s3://"):].partition("/")
    listing = server.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/packs/")
    return listing.get("KeyCount", 0)


def test_push_clone_lazy_and_dedup_over_s3(pushed, tmp_path, s3):
    repo, url = pushed
    s = state(0)
    s["w"][: len(s["w"]) // 10] += 1  # 10% of the bytes change
    repo.commit(s, "second")
    report = repo.remotes.push()
    total = sum(t.nbytes for t in s.values() if isinstance(t, torch.Tensor))
    assert report.chunk_bytes <= 0.11 * total
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=s3.endpoint)
    try:
        assert lazy.status().chunks == 0
        assert same(lazy.load("main~1"), state(0)) and same(lazy.load(), s)
        assert lazy.fsck().ok and lazy.remotes.fsck().ok and repo.fsck().ok
    finally:
        lazy.close()


def test_a_clone_keeps_the_endpoint_aws_endpoint_url_names(moto, tmp_path, monkeypatch):
    """A clone reached through AWS_ENDPOINT_URL (boto3 reads it) stored no endpoint, so a fetch
    without that variable went to AWS: the clone keeps it as the remote's endpoint."""
    repo, url = _pushed(tmp_path, moto)
    repo.close()
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.endpoint)
    clone = mvc.Repository.clone(url, tmp_path / "b", lazy=True)
    assert [(r.name, r.endpoint_url) for r in clone.remotes.list()] == [("origin", moto.endpoint)]
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert clone.remotes.fetch().chunks == 0 and clone.load()  # the same store, without the variable
    clone.close()
    given = mvc.Repository.clone(url, tmp_path / "c", endpoint_url=moto.endpoint)
    assert given.remotes.list()[0].endpoint_url == moto.endpoint
    given.close()


def _two_clones(tmp_path, url, endpoint):
    a = mvc.Repository.clone(url, tmp_path / "x", endpoint_url=endpoint)
    b = mvc.Repository.clone(url, tmp_path / "y", endpoint_url=endpoint)
    a.commit(state(1), "from x")
    b.commit(state(2), "from y")
    ids = a.resolve("main"), b.resolve("main")
    a.close()
    b.close()
    return ids


def test_two_processes_push_one_branch_at_once(pushed_sw, tmp_path, seaweedfs):
    _, url = pushed_sw
    s3 = seaweedfs  # moto's conditional writes are raced in test_remote_trust (a slow duplicate here)
    ids = _two_clones(tmp_path, url, s3.endpoint)
    procs = [mvc_cli("-C", str(tmp_path / d), "push") for d in ("x", "y")]
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    loser = next(err for code, _, err in results if code == 1)
    assert REJECTED in loser and "Traceback" not in loser
    winner = ids[[code for code, _, _ in results].index(0)]
    check = mvc.Repository.clone(url, tmp_path / "z", endpoint_url=s3.endpoint)
    assert check.resolve("main") == winner and check.fsck().ok and check.remotes.fsck().ok
    check.close()


def _wait_for_packs(s3, url, n: int, proc) -> None:
    deadline = time.monotonic() + 120
    while count_packs(s3, url) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


SMALL_PACKS = {"MVC_REMOTE_PACK_BYTES": str(CHUNK)}  # one chunk per pack: a push of 1 MiB takes 1024 uploads


@pytest.mark.slow
def test_sigkilled_push_leaves_both_sides_clean_and_rerun_sends_the_rest(pushed_sw, tmp_path, seaweedfs):
    repo, url = pushed_sw
    big = state(3, n=256 * 1024)  # 1 MiB of new chunks: 1024 of them
    repo.commit(big, "big")
    before = count_packs(seaweedfs, url)
    proc = mvc_cli("-C", str(tmp_path / "a"), "push", env=SMALL_PACKS)
    _wait_for_packs(seaweedfs, url, before + 30, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    sent = count_packs(seaweedfs, url) - before
    assert repo.fsck().ok and repo.remotes.fsck().ok  # packs nobody names yet are harmless
    assert repo.resolve("origin/main") != repo.resolve("main")
    report = repo.remotes.push()
    assert 0 < report.chunks <= 1024 - sent  # what the killed push had sent is not sent again
    assert report.refs[0].status == "updated"
    clone = mvc.Repository.clone(url, tmp_path / "c", lazy=True, endpoint_url=seaweedfs.endpoint)
    assert same(clone.load(), big) and clone.fsck().ok and repo.remotes.fsck().ok
    clone.close()


@pytest.mark.slow
def test_server_killed_mid_push_then_restarted(pushed_sw, tmp_path, seaweedfs):
    repo, url = pushed_sw
    big = state(4, n=256 * 1024)
    repo.commit(big, "big")
    before = count_packs(seaweedfs, url)
    proc = mvc_cli("-C", str(tmp_path / "a"), "push", env={**SMALL_PACKS, "MVC_REMOTE_ATTEMPTS": "2"})
    _wait_for_packs(seaweedfs, url, before + 30, proc)
    seaweedfs.server.kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.splitlines()[-1].startswith("mvc: error:") and "Traceback" not in err, err
    assert "waiting for server" in err and "retry 2/2" in err  # the retries are shown as they happen
    seaweedfs.server.start()
    sent = count_packs(seaweedfs, url) - before
    assert sent >= 30  # what the server acknowledged survived its death
    assert repo.fsck().ok and repo.remotes.fsck().ok
    report = repo.remotes.push()
    assert 0 < report.chunks <= 1024 - sent  # only what is still missing
    clone = mvc.Repository.clone(url, tmp_path / "c", endpoint_url=seaweedfs.endpoint)
    assert same(clone.load(), big) and clone.fsck().ok
    clone.close()


def _flip_biggest_pack(server, url: str) -> str:
    """Flip a bit inside the first record of the remote's biggest pack; its key."""
    bucket, _, prefix = url[len("s3://"):].partition("/")
    client = server.client()
    key = max(client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/packs/")["Contents"],
              key=lambda o: o["Size"])["Key"]
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[8 + 36 + 10] ^= 0x10
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    return key


def test_flipped_byte_on_s3_is_named_and_refused(pushed, tmp_path, s3):
    repo, url = pushed
    key = _flip_biggest_pack(s3, url)
    report = repo.remotes.fsck()
    assert not report.ok and any(key.rpartition("/")[2] in p.object for p in report.problems)
    fresh = mvc.Repository.init(tmp_path / "f", chunk_size=CHUNK)
    fresh.remotes.add("origin", url, s3.endpoint)
    with pytest.raises(mvc.ChecksumMismatch):
        fresh.remotes.fetch()
    assert fresh.remotes.branches() == [] and fresh.fsck().ok
    fresh.close()


def test_a_lazy_read_of_a_flipped_remote_pack_raises_and_keeps_nothing(pushed, tmp_path, s3):
    repo, url = pushed
    key = _flip_biggest_pack(s3, url)
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=s3.endpoint)
    try:
        with pytest.raises(mvc.ChecksumMismatch) as err:  # received in place, checked there, refused
            lazy.load()
        assert err.value.key == key.partition("/")[2] and err.value.id is not None
        assert lazy.status().chunks == 0 and lazy.chunks.fetched == 0
    finally:
        lazy.close()


# Loads v0, v1, v2 in turn: at least argv[3] loads, then on until the parent
# writes argv[2]/stop (it has seen evictions land between loads), at most
# argv[4] loads so a broken eviction ends in a failed assertion, not a hang.
LOADER = """
import os, sys, mvc, torch
repo = mvc.Repository.open(sys.argv[1])
want = {rev: open(f"{sys.argv[2]}/{rev}.sum").read() for rev in ("v0", "v1", "v2")}
least, most = int(sys.argv[3]), int(sys.argv[4])
for i in range(most):
    rev = ("v0", "v1", "v2")[i % 3]
    s = repo.load(rev)
    got = repr(float(s["w"].double().sum())) + repr(s["b"].tolist()[:3])
    assert got == want[rev], (rev, got, want[rev])
    if i + 1 >= least and os.path.exists(f"{sys.argv[2]}/stop"):
        break
repo.close()
print("ok", i + 1)
"""


def _sum(s) -> str:
    return repr(float(s["w"].double().sum())) + repr(s["b"].tolist()[:3])


@pytest.mark.slow
def test_tiny_cache_budget_evicting_while_a_load_runs(pushed_sw, tmp_path, seaweedfs):
    repo, url = pushed_sw
    for i in (1, 2):
        repo.commit(state(i), f"v{i}")
    for i in range(3):
        repo.create_tag(f"v{i}", f"main~{2 - i}")
        (tmp_path / f"v{i}.sum").write_text(_sum(state(i)))
    repo.remotes.push(refs=("main", "v0", "v1", "v2"))
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint)
    lazy.config("cache.max-bytes", "1")
    lazy.checkout("v0")  # HEAD's version stays; the others come and go
    # The loader runs until this side has evicted between its loads a few
    # times: on a loaded machine it could otherwise finish before any eviction.
    proc = subprocess.Popen([sys.executable, "-c", LOADER, str(tmp_path / "lz"), str(tmp_path), "12", "300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    evictions = 0
    while proc.poll() is None:
        evictions += lazy.cache.evict().chunks_evicted > 0
        if evictions >= 3:
            (tmp_path / "stop").touch()
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0 and out.startswith("ok "), err
    assert evictions >= 3, (evictions, out)  # all while the loader ran: it stops only once told
    assert lazy.fsck().ok
    for i in range(3):
        assert _sum(lazy.load(f"v{i}")) == _sum(state(i))
    lazy.close()


def test_a_large_object_goes_up_in_parts_and_a_pack_in_one_put(s3, monkeypatch):
    """Objects over SINGLE_PUT_BYTES take the multipart path (parts of PART_BYTES,
    in threads); a pack-sized object is one PUT. Both read back byte for byte."""
    from mvc.remote import s3 as s3mod
    from mvc.remote.bucket import open_bucket
    monkeypatch.setattr(s3mod, "PART_BYTES", 5 << 20)  # S3's smallest part
    monkeypatch.setattr(s3mod, "SINGLE_PUT_BYTES", 6 << 20)
    bucket = open_bucket(s3.url("parts"), s3.endpoint)
    calls = []
    real = bucket.client.upload_part

    def upload_part(**kwargs):
        calls.append(kwargs["PartNumber"])
        return real(**kwargs)
    monkeypatch.setattr(bucket.client, "upload_part", upload_part)
    big = os.urandom((5 << 20) * 3 + 12345)  # four parts, the last one short
    bucket.put("big.bin", big)
    assert sorted(calls) == [1, 2, 3, 4]
    assert bucket.get("big.bin") == big
    assert bucket.get_range("big.bin", (5 << 20) - 7, (5 << 20) + 9) == big[(5 << 20) - 7:(5 << 20) + 9]
    calls.clear()
    small = os.urandom(6 << 20)  # at the limit: one PUT
    bucket.put("small.bin", small)
    assert calls == [] and bucket.get("small.bin") == small


def test_a_lazy_clone_reads_on_after_its_remote_was_repaired(pushed_sw, tmp_path, seaweedfs):
    """A repair moves the records of a damaged pack to new packs and removes it: a lazy clone listed
    the remote before, so its catalogue names the removed pack. Its read lists the remote once more
    and reads from the new packs, bit for bit, with no 'mvc fetch' first."""
    repo, url = pushed_sw
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint)
    try:
        key = _flip_biggest_pack(seaweedfs, url)
        report = repo.remotes.repair()
        assert any(key.endswith(removed) or removed.endswith(key.rpartition("/")[2]) for removed in report.packs_removed)
        assert same(lazy.load("main"), repo.load("main"))
        assert lazy.fsck().ok and repo.remotes.fsck().ok
    finally:
        lazy.close()


# -- a lazy clone's cache is a copy: not fsynced, healed from the remote -----------

def _damage(path, how: str) -> None:
    """Damage a cache pack as a power loss before writeback can: a flipped bit, the file cut
    in half, its second half zeroed, or the file gone."""
    size = path.stat().st_size
    if how == "missing":
        path.unlink()
        return
    with open(path, "r+b") as f:
        if how == "flip":
            f.seek(size // 2)
            byte = f.read(1)[0]
            f.seek(size // 2)
            f.write(bytes([byte ^ 0x08]))
        elif how == "short":
            f.truncate(size // 2)
        elif how == "zeros":
            f.seek(size // 2)
            f.write(bytes(size - size // 2))


def _cache_packs(folder) -> list:
    return sorted((folder / ".mvc" / "packs").glob("pack-*.pack"))


@pytest.mark.parametrize("how", ["flip", "short", "zeros", "missing"])
def test_a_torn_cache_pack_is_fetched_again_from_the_remote(pushed_sw, tmp_path, seaweedfs, how):
    repo, url = pushed_sw
    want = repo.load()
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint)
    assert same(lazy.load(), want)
    (pack,) = _cache_packs(tmp_path / "lz")
    lazy.close()
    _damage(pack, how)
    lazy = mvc.Repository.open(tmp_path / "lz")  # a fresh process's view: nothing of the old file held open
    try:
        assert same(lazy.load(), want)  # every byte verified: the damaged ones came from the remote again
        assert lazy.chunks.healed > 0 and lazy.chunks.fetched > 0
        healed = lazy.chunks.healed
        assert same(lazy.load(), want) and lazy.chunks.healed == healed  # kept anew: read here now
        if how in ("short", "zeros"):  # its trailer is gone: fsck names the pack (its first half still serves
            # reads) until fsck --repair refetches what it listed
            assert [d.kind for d in lazy.fsck().damage] == ["damaged-pack"]
            assert lazy.cache.repair().after.ok
        assert lazy.fsck().ok
    finally:
        lazy.close()


def test_a_damaged_chunk_the_remote_lacks_is_not_healed(pushed_sw, tmp_path, seaweedfs):
    repo, url = pushed_sw
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint)
    before = set(_cache_packs(tmp_path / "lz"))
    lazy.commit(state(7), "not pushed")  # its chunks are only here: the commit's pack is their last copy
    (mine,) = set(_cache_packs(tmp_path / "lz")) - before
    lazy.close()
    _damage(mine, "flip")
    lazy = mvc.Repository.open(tmp_path / "lz")
    try:
        with pytest.raises(mvc.ChecksumMismatch) as err:
            lazy.load()
        assert err.value.id is not None and lazy.chunks.healed == 0
    finally:
        lazy.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names an fd's file through /proc (Linux)")
def test_cache_packs_skip_fsync_and_commit_packs_keep_it(pushed_sw, tmp_path, seaweedfs, monkeypatch):
    repo, url = pushed_sw
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint)
    synced, real = [], os.fsync

    def fsync(fd):  # the real fsync, noting which pack files it was asked for
        name = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else ""
        if ".pack" in name:
            synced.append(name)
        return real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    try:
        lazy.load()
        assert _cache_packs(tmp_path / "lz") and synced == []  # fetched: copies of the remote's bytes
        lazy.commit(state(9), "mine")
        assert len(synced) == 1  # committed: the last good copy, fsynced before its index entries
    finally:
        lazy.close()


@pytest.mark.parametrize("damage", ["zero-byte", "truncated"])
def test_a_short_pack_is_named_with_advice(pushed, tmp_path, s3, damage):
    """A lazy clone reads a chunk pack that was emptied or cut short after it catalogued it: the
    error was "InvalidRange" or "shorter than expected", naming neither the pack nor fsck --remote."""
    from click.testing import CliRunner
    from mvc.cli import main
    from mvc.remote import layout
    repo, url = pushed
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=s3.endpoint)
    lazy.close()
    key = max(s3.keys(url, layout.CHUNK_PACKS), key=lambda k: k[1])[0]
    s3.put(url, key, b"" if damage == "zero-byte" else s3.get(url, key)[:5000])
    with mvc.Repository.open(tmp_path / "lz") as again, pytest.raises(mvc.errors.RemoteCorrupt) as caught:
        again.load("main")
    assert caught.value.key == key
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "lz"), "export", "main", "-o", str(tmp_path / "x.st")])
    assert result.exit_code == 1 and key in result.output and "fsck --remote" in result.output, result.output
    assert "Traceback" not in result.output


def test_fsck_remote_of_a_prefix_without_a_remote_is_not_ok(pushed, tmp_path, s3):
    from click.testing import CliRunner
    from mvc.cli import main
    repo, url = pushed
    repo.remotes.add("empty", url + "-nothing-here", s3.endpoint)
    with pytest.raises(mvc.errors.RemoteError):
        repo.remotes.fsck("empty")
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "a"), "fsck", "--remote", "empty"])
    assert result.exit_code == 1 and "holds no mvc remote" in result.output and "ok" not in result.output.split(), \
        result.output


def test_one_deadline_per_command_for_a_server_that_stopped(monkeypatch):
    """Each request waited out its own retry budget, so a push whose server stopped mid-transfer
    failed after 84-98 s (an upload's budget, then the lease's removal's, ...), not within the
    minute the README promises. The budget is the command's: once spent, the next request fails at once."""
    from s3server import CREDENTIALS, free_ports
    from mvc.errors import RemoteUnreachable
    from mvc.remote.s3 import S3Bucket
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MVC_REMOTE_TIMEOUT", "2")
    monkeypatch.setenv("MVC_REMOTE_ATTEMPTS", "20")
    bucket = S3Bucket("mvc-tests", "x", f"http://127.0.0.1:{free_ports(1)[0]}")  # nothing listens there
    try:
        assert not bucket.away
        with pytest.raises(RemoteUnreachable) as first:
            bucket.put("packs/a.pack", b"data")
        assert 1 < first.value.attempts < 20  # retried, until the deadline (not the tries) ended it
        assert bucket.away
        with pytest.raises(RemoteUnreachable) as second:
            bucket.delete("leases/push-ab")
        assert second.value.attempts == 0  # the command's deadline is spent: no try, no waiting again
    finally:
        bucket.close()


@pytest.mark.parametrize("damage", ["zero-byte", "flipped-trailer"])
def test_fetch_in_a_lazy_clone_notices_a_damaged_pack_on_s3(pushed, tmp_path, s3, damage):
    """fetch in an existing lazy clone said "up to date" (exit 0) when a pack it depends on was
    emptied or had its trailer flipped, while fsck --remote found the damage."""
    from click.testing import CliRunner
    from mvc.cli import main
    from mvc.remote import layout
    repo, url = pushed
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=s3.endpoint)
    lazy.close()
    key, size = max(s3.keys(url, layout.CHUNK_PACKS), key=lambda k: k[1])
    if damage == "zero-byte":
        s3.put(url, key, b"")
    else:
        s3.flip(url, key, size - 40)  # same size, maybe the same second: the listing's etag tells
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "lz"), "fetch"])
    assert result.exit_code == 1 and "up to date" not in result.output, result.output
    assert "fsck --remote" in result.output, result.output


def test_a_layout_1_remote_on_s3_is_upgraded_at_the_first_push_and_reads_on(pushed_sw, tmp_path, seaweedfs):
    from test_remote import as_layout_1, old_layout
    from mvc.errors import CorruptObject
    repo, url = pushed_sw
    assert seaweedfs.get(url, "MVCREMOTE") == f"mvc-remote 2\nchunk-size {CHUNK}\n".encode()  # a new remote
    repo.create_tag("v1")
    repo.remotes.push(refs=("v1",))
    as_layout_1(lambda key: seaweedfs.get(url, key), lambda key, data: seaweedfs.put(url, key, data),
                [key for key, _ in seaweedfs.keys(url, "refs/")])
    v1 = seaweedfs.get(url, "refs/tags/v1")
    old = old_layout()
    assert old.parse_marker(seaweedfs.get(url, "MVCREMOTE"), url) == CHUNK
    repo.commit(state(1), "second")
    assert repo.remotes.push().refs[0].status == "updated"
    marker = seaweedfs.get(url, "MVCREMOTE")
    assert marker == f"mvc-remote 2\nchunk-size {CHUNK}\n".encode()
    with pytest.raises(CorruptObject, match="uses remote layout 2; this mvc reads layout 1: upgrade mvc"):
        old.parse_marker(marker, url)
    assert seaweedfs.get(url, "refs/tags/v1") == v1  # written before the upgrade, unfenced
    with mvc.Repository.clone(url, tmp_path / "b", endpoint_url=seaweedfs.endpoint) as clone:
        assert clone.resolve("v1") == repo.resolve("v1") and clone.resolve("main") == repo.resolve("main")
        assert same(clone.load("main"), repo.load("main")) and same(clone.load("v1"), repo.load("v1"))


def test_evict_keeps_chunks_a_sigkilled_push_left_as_garbage_on_the_cached_remote(tmp_path, seaweedfs):
    """A push SIGKILLed mid-transfer leaves packs its ref never named: a remote gc deletes them.
    Eviction dropped the local copies of their chunks that only another remote's tracking ref
    needs; the gc then took the last copy this repository could read."""
    url = seaweedfs.url()
    pushed_repo(tmp_path / "a", url, seaweedfs.endpoint, [(state(0), "first")], CHUNK).close()
    lazy = mvc.Repository.clone(url, tmp_path / "lz", lazy=True, endpoint_url=seaweedfs.endpoint)
    try:
        big = state(3, n=128 * 1024)  # 512 new chunks
        lazy.commit(big, "side work", branch="side")
        lazy.remotes.add("backup", str(tmp_path / "backup"))
        lazy.remotes.push("backup", refs=("side",))
        before = count_packs(seaweedfs, url)
        proc = mvc_cli("-C", str(tmp_path / "lz"), "push", "origin", "side", env=SMALL_PACKS)
        _wait_for_packs(seaweedfs, url, before + 30, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert "origin/side" not in {r.name for r in lazy.remotes.branches()}
        lazy.delete_branch("side", force=True)  # only backup/side needs its commit now
        report = lazy.cache.evict(0)
        assert report.kept_garbage >= 30
        lazy.remotes.gc("origin", grace=0)  # deletes the killed push's packs
        assert same(lazy.load("backup/side"), big)  # bit for bit, from the local copies
        assert same(lazy.load("main"), state(0)) and lazy.fsck().ok
    finally:
        lazy.close()
