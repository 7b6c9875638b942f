"""reach's commit walks on a small hand-made graph (no repository needed): what push, audit,
the cache and repack now rely on instead of walks of their own."""

from types import SimpleNamespace

import pytest

from mvc import reach
from mvc.errors import CorruptObject

#   d -> c -> b -> a ; d -> x (a merge); x's parent m is held nowhere
GRAPH = {b"a": (), b"b": (b"a",), b"c": (b"b",), b"x": (b"m",), b"d": (b"c", b"x")}


def commit(oid):
    return SimpleNamespace(parents=GRAPH[oid]) if oid in GRAPH else None


def test_ancestors_reads_each_once_and_a_missing_commit_ends_its_line():
    read = []

    def counted(oid):
        read.append(oid)
        return commit(oid)
    found = [oid for oid, _ in reach.ancestors(counted, [b"d", b"c"])]
    assert sorted(found) == [b"a", b"b", b"c", b"d", b"x"]
    assert sorted(read) == [b"a", b"b", b"c", b"d", b"m", b"x"]  # m asked for once, then its line ends


def test_ancestors_stops_at_what_is_known_and_at_the_caller():
    assert set(reach.ancestry(commit, [b"d"], stop={b"b"})) == {b"d", b"c", b"x"}  # push: the remote has b
    walk = reach.ancestors(commit, [b"d"])
    assert next(walk)[0] == b"d"  # lazy: nothing past d is read yet


def test_reached_names_parents_held_nowhere():
    assert reach.reached(commit, [b"x"]) == {b"x", b"m"}
    assert reach.reached(commit, []) == set()


def test_damage_policy():
    def broken(oid):
        if oid == b"b":
            raise CorruptObject("commit b is damaged")
        return commit(oid)
    with pytest.raises(CorruptObject):
        reach.ancestry(broken, [b"d"])
    damaged = []
    assert set(reach.ancestry(broken, [b"d"], reach.COLLECT, damaged)) == {b"d", b"c", b"x"}
    assert [oid for oid, _ in damaged] == [b"b"]


def test_parents_first_puts_every_commit_after_its_parents():
    order = reach.parents_first(GRAPH, [b"d"])
    assert sorted(order) == [b"a", b"b", b"c", b"d", b"x"]  # m has no entry: left out
    for oid in order:
        assert all(order.index(p) < order.index(oid) for p in GRAPH[oid] if p in GRAPH)
