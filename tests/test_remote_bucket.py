"""The Bucket contract (``mvc.remote.backend.Bucket``): one suite, run on every implementation
(a folder, SeaweedFS, moto), so mvc's remote code rests on what the interface says and no
store's quirks. Conditional puts are raced by real threads: exactly one creator wins, and no
read-modify-write by If-Match is lost.
"""

import threading

import pytest

from mvc.errors import BadInput, NotFound, PreconditionFailed, RemoteCorrupt
from mvc.remote.backend import Bucket
from mvc.remote.bucket import open_bucket


@pytest.fixture(params=["folder", "seaweedfs", "moto"])
def bucket(request, tmp_path):
    if request.param == "folder":
        b = open_bucket(str(tmp_path / "remote"), create=True)
    else:
        server = request.getfixturevalue(request.param)
        b = open_bucket(server.url("contract"), server.endpoint)
    assert isinstance(b, Bucket)
    yield b
    b.close()


def test_the_interface_is_abstract():
    with pytest.raises(TypeError):
        Bucket()


def test_whole_objects_round_trip_with_etags(bucket):
    assert bucket.get_versioned("a/b") is None
    with pytest.raises(NotFound) as caught:
        bucket.get("a/b")
    assert caught.value.key == "a/b"
    data = bytes(range(256)) * 5
    etag = bucket.put("a/b", data)
    assert bucket.get("a/b") == data
    assert bucket.get_versioned("a/b") == (data, etag)
    other = bucket.put("a/b", data[::-1])  # other bytes: another etag
    assert other != etag and bucket.get_versioned("a/b") == (data[::-1], other)
    assert bucket.put("empty", b"") and bucket.get("empty") == b""


def test_ranges_tails_and_a_short_object(bucket):
    data = bytes(range(200))
    bucket.put("packs/p", data)
    assert bucket.get_range("packs/p", 10, 20) == data[10:20]
    assert bucket.get_range("packs/p", 5, 5) == b""
    sinks = [memoryview(bytearray(3)), memoryview(bytearray(7))]
    bucket.get_range_into("packs/p", 100, 110, sinks)
    assert b"".join(bytes(s) for s in sinks) == data[100:110]
    assert bucket.get_tail("packs/p", 16) == (data[-16:], 200)
    assert bucket.get_tail("packs/p", 1000) == (data, 200)
    bucket.put("packs/empty", b"")
    assert bucket.get_tail("packs/empty", 16) == (b"", 0)
    for start, stop in ((150, 260), (0, 1)):
        key = "packs/p" if start else "packs/empty"
        with pytest.raises(RemoteCorrupt) as caught:  # past the end: cut short, named
            bucket.get_range(key, start, stop)
        assert caught.value.key == key
    with pytest.raises(NotFound):
        bucket.get_range("packs/none", 0, 4)


def test_listings_deletes_and_keys(bucket):
    for key, n in (("packs/b", 2), ("packs/a", 1), ("objects/c", 3), ("packsx", 4)):
        bucket.put(key, b"x" * n)
    assert bucket.list("packs/") == [("packs/a", 1), ("packs/b", 2)]
    times = bucket.list_times("packs/")
    assert [(k, n) for k, n, _ in times] == [("packs/a", 1), ("packs/b", 2)]
    assert all(isinstance(when, float) for _, _, when in times)
    stamp = dict((k, st) for k, _, st in bucket.list_stamps("packs/"))["packs/b"]
    bucket.put("packs/b", b"yy")  # the same size, at once: the stamp still changes
    assert dict((k, st) for k, _, st in bucket.list_stamps("packs/"))["packs/b"] != stamp
    bucket.delete("packs/a")
    bucket.delete("packs/a")  # absent: a no-op
    assert bucket.list("packs/") == [("packs/b", 2)]
    for bad in ("../escape", "/abs", "a//b", "sp ace"):
        with pytest.raises(BadInput):
            bucket.put(bad, b"x")


def test_conditional_puts(bucket):
    bucket.check_conditional()
    etag = bucket.put("refs/heads/main", b"1", if_absent=True)
    with pytest.raises(PreconditionFailed):
        bucket.put("refs/heads/main", b"2", if_absent=True)
    with pytest.raises(PreconditionFailed):
        bucket.put("refs/heads/main", b"2", if_match='"0123456789abcdef0123456789abcdef"')
    moved = bucket.put("refs/heads/main", b"2", if_match=etag)
    with pytest.raises(PreconditionFailed):  # the old etag no longer matches
        bucket.put("refs/heads/main", b"3", if_match=etag)
    assert bucket.get_versioned("refs/heads/main") == (b"2", moved)
    with pytest.raises((PreconditionFailed, NotFound)):  # If-Match on an absent key
        bucket.put("refs/heads/none", b"1", if_match=etag)
    assert bucket.get_versioned("refs/heads/none") is None


def _race(n: int, work) -> list:
    results, barrier = [None] * n, threading.Barrier(n)

    def run(i):
        barrier.wait()
        results[i] = work(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_racing_creators_one_wins(bucket):
    def create(i):
        try:
            bucket.put("refs/heads/race", str(i).encode(), if_absent=True)
            return i
        except PreconditionFailed:
            return None
    winners = [r for r in _race(8, create) if r is not None]
    assert len(winners) == 1
    assert bucket.get("refs/heads/race") == str(winners[0]).encode()


def test_racing_if_match_writers_lose_no_update(bucket):
    """Each thread adds its own mark to a list by read, then If-Match write, retrying when it
    loses: every mark ends up there (a store that let two writes against one etag both land
    would drop one)."""
    bucket.put("refs/heads/list", b"", if_absent=True)

    def append(i):
        for _ in range(50):
            data, etag = bucket.get_versioned("refs/heads/list")
            try:
                bucket.put("refs/heads/list", data + bytes([65 + i]), if_match=etag)
                return True
            except PreconditionFailed:
                continue
        return False
    assert all(_race(6, append))
    assert sorted(bucket.get("refs/heads/list")) == [65 + i for i in range(6)]
