"""The LMDB index: exact key and value bytes of every database, transactions, damaged values."""

import os
import struct

import numpy as np
import pytest

import torch

import mvc
from mvc import hashing
from mvc import encoding
from mvc.errors import CorruptObject
from mvc.store import idarray
from mvc.store.index import DB_NAMES, Index, RefValue, _id_order
from mvc.store.packs import Location

CID = bytes(range(32))
PACK = b"\x11" * 16


@pytest.fixture
def index(tmp_path):
    idx = Index(tmp_path / "index", create=True)
    yield idx
    idx.close()


def raw(txn, db: str, key: bytes):
    """The stored value as another program sees it, its seal checked and removed (format.md 5.8)."""
    value = txn._txn.get(key, db=txn._dbs[db])
    if db in ("refs", "reflog", "locks", "pruned"):
        assert value[0] == 0xC1 and value[1:9] == hashing.digest(db.encode() + b"\x00" + key + b"\x00" + value[9:])[:8]
        return value[9:]
    return value


def test_database_names():
    assert DB_NAMES == ("chunks", "tensors", "trees", "commits", "refs", "reflog", "locks", "meta", "pruned", "packidx")


def test_chunk_location_bytes(index):
    loc = Location(PACK, 44, 1 << 20)
    with index.write() as txn:
        assert txn.put_chunk(CID, loc)
        assert not txn.put_chunk(CID, Location(b"\x22" * 16, 99, 1))  # never overwritten by default
    with index.read() as txn:
        assert raw(txn, "chunks", CID) == PACK + struct.pack("<Q", 44) + struct.pack("<I", 1 << 20)
        assert len(raw(txn, "chunks", CID)) == 28
        assert txn.chunk(CID) == loc
        assert txn.chunk(b"\x00" * 32) is None
        assert list(txn.chunks()) == [(CID, loc)]


def test_damaged_chunk_location(index):
    with index.write() as txn:
        txn._txn.put(CID, b"short", db=txn._dbs["chunks"])
    with index.read() as txn, pytest.raises(CorruptObject) as exc:
        txn.chunk(CID)
    assert (exc.value.kind, exc.value.field) == ("index", "location")


def test_objects_are_never_overwritten_and_prefix_scan(index):
    ids = [bytes([0xab, i]) + b"\x00" * 30 for i in range(3)] + [b"\xac" + b"\x00" * 31]
    with index.write() as txn:
        for oid in ids:
            assert txn.put("commits", oid, b"data")
        assert not txn.put("commits", ids[0], b"other")
    with index.read() as txn:
        assert txn.get("commits", ids[0]) == b"data"
        assert list(txn.ids("commits", b"\xab")) == ids[:3]
        assert list(txn.ids("commits", b"\xff")) == []
        assert txn.get("trees", ids[0]) is None  # each kind is its own database


def test_ref_bytes(index):
    tip = b"\x42" * 32
    with index.write() as txn:
        txn.set_ref("heads/main", RefValue(id=tip))
        txn.set_ref("tags/v1", RefValue(id=tip, protected=True))
        txn.set_ref("HEAD", RefValue(target="heads/main"))
    with index.read() as txn:
        assert raw(txn, "refs", b"heads/main") == b"\x00" + tip + b"\x00"
        assert raw(txn, "refs", b"tags/v1") == b"\x00" + tip + b"\x01"
        assert raw(txn, "refs", b"HEAD") == b"\x01heads/main"
        assert txn.ref("tags/v1") == RefValue(id=tip, protected=True)
        assert txn.ref("HEAD") == RefValue(target="heads/main")
        assert [n for n, _ in txn.refs("heads/")] == ["heads/main"]


def test_unknown_flag_bits_are_ignored(index):
    with index.write() as txn:
        txn._txn.put(b"heads/x", b"\x00" + CID + b"\xfe", db=txn._dbs["refs"])
    with index.read() as txn:
        assert txn.ref("heads/x") == RefValue(id=CID, protected=False)


@pytest.mark.parametrize("value", [b"", b"\x00" + CID, b"\x00" + CID + b"\x00\x00", b"\x02abc"])
def test_damaged_ref_values(index, value):
    with index.write() as txn:
        txn._txn.put(b"heads/x", value, db=txn._dbs["refs"])
    with index.read() as txn, pytest.raises(CorruptObject) as exc:
        txn.ref("heads/x")
    assert (exc.value.kind, exc.value.name) == ("ref", "heads/x")


def test_reflog_keys_and_entries(index):
    entry = {"old": None, "new": CID, "time": 5, "message": "commit: x"}
    with index.write() as txn:
        for i in range(258):
            txn.append_reflog("heads/a", dict(entry, time=i))
        txn.append_reflog("heads/a/b", entry)
        txn.append_reflog("heads/a.x", entry)
        txn.append_reflog("HEAD", entry)
    with index.read() as txn:
        assert raw(txn, "reflog", b"heads/a\x00" + struct.pack(">Q", 0)) == encoding.pack(dict(entry, time=0))
        assert raw(txn, "reflog", b"heads/a\x00" + b"\x00" * 6 + b"\x01\x01") is not None  # seq 257
        log = list(txn.reflog("heads/a"))
        assert [seq for _, seq, _ in log] == list(range(258))
        assert all(name == "heads/a" for name, _, _ in log) and log[7][2]["time"] == 7
        assert list(txn.reflog("heads/a/b")) == [("heads/a/b", 0, entry)]
        everything = {(name, seq) for name, seq, _ in txn.reflog()}
        assert ("HEAD", 0) in everything and ("heads/a.x", 0) in everything and ("heads/a", 257) in everything
        assert len(everything) == 261


def test_reflog_sequence_continues_after_other_refs(index):
    with index.write() as txn:
        txn.append_reflog("heads/b", {"message": "1"})
        txn.append_reflog("heads/a", {"message": "1"})
        txn.append_reflog("heads/b", {"message": "2"})
        txn.append_reflog("heads/c", {"message": "1"})
        txn.append_reflog("heads/b", {"message": "3"})
    with index.read() as txn:
        assert [(s, e["message"]) for _, s, e in txn.reflog("heads/b")] == [(0, "1"), (1, "2"), (2, "3")]


def test_locks_and_meta(index):
    holder = {"host": "h", "pid": 1, "since": 1.5, "owner": "me", "started": None, "named": True}
    with index.write() as txn:
        txn.put_lock("main", holder)
        txn.put_meta("chunk_size", (1 << 20).to_bytes(8, "little"))
    with index.read() as txn:
        assert raw(txn, "locks", b"main") == encoding.pack(holder)
        assert txn.lock("main") == holder and list(txn.locks()) == [("main", holder)]
        assert raw(txn, "meta", b"chunk_size") == b"\x00\x00\x10\x00\x00\x00\x00\x00"
    with index.write() as txn:
        txn.delete_lock("main")
    with index.read() as txn:
        assert txn.lock("main") is None


def test_failed_write_transaction_is_aborted(index):
    with pytest.raises(RuntimeError):
        with index.write() as txn:
            txn.put("commits", CID, b"x")
            raise RuntimeError("boom")
    with index.read() as txn:
        assert txn.get("commits", CID) is None


def test_second_index_on_same_path_shares_the_environment(tmp_path, index):
    other = Index(tmp_path / "index")
    try:
        with other.write() as txn:
            txn.put("trees", CID, b"t")
        with index.read() as txn:
            assert txn.get("trees", CID) == b"t"
    finally:
        other.close()
    with index.read() as txn:  # closing one user keeps the environment open for the other
        assert txn.get("trees", CID) == b"t"


def test_missing_index_is_a_clear_error(tmp_path):
    with pytest.raises(CorruptObject) as exc:
        Index(tmp_path / "nowhere")
    assert exc.value.kind == "index"


def test_forked_child_gets_a_clear_error_not_the_parents_environment(tmp_path):
    import os
    repo = mvc.Repository.init(tmp_path, chunk_size=64)
    repo.commit({"a": torch.ones(3)}, "x")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: must refuse, not reuse the parent's LMDB environment
        try:
            mvc.Repository.open(tmp_path)
            os.write(write, b"opened")
        except mvc.MvcError as exc:
            os.write(write, str(exc).encode()[:200])
        os._exit(0)
    os.waitpid(pid, 0)
    assert b"forked" in os.read(read, 200)
    assert [c.message for c in repo.log()] == ["x"]
    repo.close()


TXNID_AT = 48  # lock.mdb: where LMDB publishes the last committed transaction id (64-bit Linux)
KILLED_WRITER = r"""
import sys, time, torch, mvc
repo = mvc.Repository.open(sys.argv[1])
print(repo.commit({"w": torch.ones(40)}, "two").id, flush=True)
with repo.index.write():  # the writer's lock held, as a commit inside LMDB's commit holds it
    print("holding", flush=True)
    time.sleep(60)
"""
REWIND = r"""
import struct, sys
with open(sys.argv[1], "r+b") as f:  # its own descriptor: closing it must not drop another process's locks
    f.seek(int(sys.argv[2]))
    n = struct.unpack("<Q", f.read(8))[0]
    f.seek(int(sys.argv[2]))
    f.write(struct.pack("<Q", n - 1))
"""


def test_a_process_that_had_the_index_open_sees_a_commit_whose_writer_was_killed_at_its_end(tmp_path):
    """Issue 39.3. LMDB writes a commit's meta page (synchronously), then publishes its id in
    lock.mdb; a writer SIGKILLed during that write dies between the two. Its commit is durable
    and every process that opens the index later sees it, but a process that had the index open
    kept its readers on the older snapshot. Made here with a real writer killed while it holds
    the writer's lock, after its commit's id was taken back in lock.mdb as the kill leaves it."""
    import signal
    import subprocess
    import sys
    repo = mvc.Repository.init(tmp_path, chunk_size=64)
    try:
        repo.commit({"w": torch.zeros(40)}, "one")
        lock = repo.dir / "index" / "lock.mdb"
        with open(lock, "rb") as f:  # read only: this process's own lock on the file stays
            published = struct.unpack("<Q", f.read(TXNID_AT + 8)[TXNID_AT:])[0]
        if published != repo.index.env.info()["last_txnid"]:
            pytest.skip("lock.mdb has another layout here")
        child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                                 text=True)
        try:
            two = child.stdout.readline().strip()
            assert child.stdout.readline().strip() == "holding"
            subprocess.run([sys.executable, "-c", REWIND, str(lock), str(TXNID_AT)], check=True)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        assert repo.head().id == two  # as a process that opens the repository now sees it
        assert torch.equal(repo.load()["w"], torch.ones(40))
        fresh = subprocess.run([sys.executable, "-m", "mvc", "-C", str(tmp_path), "log", "--oneline"],
                               capture_output=True, text=True)
        assert fresh.stdout.split()[:1] == [two[:12]], fresh.stdout + fresh.stderr
    finally:
        repo.close()


def test_put_new_chunks_puts_only_absent_ids_and_names_the_others(index):
    from mvc.store.packs import encode_location
    ids = [hashing.digest(i.to_bytes(2, "little")) for i in range(300)]
    with index.write() as txn:
        for j, cid in enumerate(ids[::3]):
            txn.put_chunk(cid, Location(b"o" * 16, 40 + j, 7))
    values = [encode_location(Location(b"n" * 16, 40 + 10 * i, 9)) for i in range(len(ids))]
    with index.write() as txn:
        assert sorted(txn.put_new_chunks(ids, values)) == list(range(0, 300, 3))
        assert txn.put_new_chunks([], []) == []
    with index.read() as txn:
        for i, cid in enumerate(ids):
            want = Location(b"o" * 16, 40 + i // 3, 7) if i % 3 == 0 else Location(b"n" * 16, 40 + 10 * i, 9)
            assert txn.chunk(cid) == want


def test_id_order_sorts_by_id_then_rank_where_ids_share_their_heads():
    """_id_order's one sort of heads, with runs of equal heads ordered apart, gives the order a
    stable sort by (id, rank) gives: copies of one id newest pack first, ids that share 8 or 16
    bytes by the rest."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        pool = np.frombuffer(rng.bytes(32 * 30), dtype=idarray.ID).copy()
        raw = pool.view(np.uint8).reshape(30, 32)
        if trial % 2:
            raw[:12, :8] = 5  # twelve share their heads
        if trial % 3 == 0:
            raw[:6, :16] = 9  # six their first 16 bytes
        ids = pool[rng.integers(0, 30, 3000)]
        rank = rng.integers(0, 5, len(ids))
        order = np.argsort(rank, kind="stable")
        want = order[np.argsort(ids[order], kind="stable")]
        assert _id_order(ids, rank).tolist() == want.tolist()
