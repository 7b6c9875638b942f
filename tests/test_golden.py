"""Golden bytes: the exact encodings docs/format.md specifies, pinned.

Each hex string below was computed once and checked by hand against
docs/format.md. If one of these tests fails, the on-disk format changed:
that needs a new format version (or an extension), not a new golden value.
The last test reads a repository with lmdb, msgpack and blake3 directly,
following only docs/format.md, as another program would.
"""

import random
import struct
from pathlib import Path

import blake3
import lmdb
import msgpack
import numpy as np
import pytest
import torch

import mvc
from mvc import hashing
from mvc.objects import CommitObject, TensorLeaf, TensorObject, TreeObject, object_id
from mvc.store.packs import PackWriter
from mvc.state import tensor_bytes

F32_123 = bytes.fromhex("0000803f0000004000004040")  # float32 [1.0, 2.0, 3.0], little-endian
CHUNK_0 = bytes.fromhex("83376e7b4f6f582dcb75e173caef357ad07daba8f7d086eb4ee23fb8d699f138")
CHUNK_1 = bytes.fromhex("4017d0cfdb21d1c14a1036bf7b98b790006cf7d32ab7102c03118df13c92fe09")
TENSOR_HEX = (
    "85"
    "aa6368756e6b5f73697a65" "08"
    "a66368756e6b73" "92" "c420" + CHUNK_0.hex() + "c420" + CHUNK_1.hex() +
    "a56474797065" "a3463332"
    "a57368617065" "9103"
    "a474797065" "a674656e736f72"
)
TENSOR_ID = "867ad8e6358cf185697f07401c13957a286b538ed039a9338c8936860938fc9f"


def test_chunks_of_a_known_tensor():
    assert bytes(tensor_bytes(torch.tensor([1.0, 2.0, 3.0]))) == F32_123
    assert hashing.digest(F32_123[:8]) == CHUNK_0 and hashing.digest(F32_123[8:]) == CHUNK_1
    assert hashing.digest(b"").hex() == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"


def test_tensor_object_bytes_and_id():
    data = TensorObject("F32", (3,), 8, (CHUNK_0, CHUNK_1)).encode()
    assert data.hex() == TENSOR_HEX
    assert object_id(data).hex() == TENSOR_ID


def test_tree_object_bytes_and_id():
    tid = bytes.fromhex(TENSOR_ID)
    shared = "c72403" + TENSOR_ID + "00000000"
    expect = (
        "82"
        "a4726f6f74" "86"
        "07" "c0"                                    # 7: None (int keys first)
        "a162" "c40101"                              # "b": b"\x01"
        "a26c72" "cb3fe0000000000000"                # "lr": 0.5
        "a173" "92c3ff"                              # "s": [True, -1]
        "a474696564" "c74f01" "92" + shared + shared +  # "tied": ext 1 (tuple) of two ext 3, group 0
        "a177" "c72002" + TENSOR_ID +                # "w": ext 2 (tensor)
        "a474797065" "a474726565"
    )
    root = {"w": TensorLeaf(tid), "tied": (TensorLeaf(tid, 0), TensorLeaf(tid, 0)), 7: None, "lr": 0.5,
            "b": b"\x01", "s": [True, -1]}
    data = TreeObject(root).encode()
    assert data.hex() == expect
    assert object_id(data).hex() == "d14359c5568a0ac0a142944b4f89c8f29a460a7f30f65ea37f9936b6e2660806"


def test_tree_with_dict_metadata_bytes_and_id():
    """format.md 7.2.2: torch's _metadata of the dict at key path ["model"]."""
    expect = (
        "83"
        "ad" + b"dict_metadata".hex() + "91" "92"      # dict_metadata: [[path, metadata]]
        "91a56d6f64656c"                               #   path ["model"]
        "82" "a0" "81a776657273696f6e01"               #   "": {"version": 1}
        "a130" "81a776657273696f6e01"                  #   "0": {"version": 1}
        "a4726f6f74" "82"                              # root:
        "a56d6f64656c" "81" "a8302e776569676874"       #   "model": {"0.weight":
        "c72002" + TENSOR_ID +                         #     ext 2 (tensor)}
        "a473746570" "03"                              #   "step": 3
        "a474797065" "a474726565"
    )
    root = {"model": {"0.weight": TensorLeaf(bytes.fromhex(TENSOR_ID))}, "step": 3}
    data = TreeObject(root, dict_metadata=((("model",), {"0": {"version": 1}, "": {"version": 1}}),)).encode()
    assert data.hex() == expect
    assert object_id(data).hex() == "7900e9edfce3fa5825e8acb1d3580af99ae6d1adbecbf68ac6eb6bc7f92ca7c6"


COMMIT_HEX = (
    "8a"
    "a6617574686f72" "a861646140686f7374"                       # author: "ada@host"
    "a7636f6e74657874" "83" "a26c72" "cb3f33a92a30553261"       # context: lr 0.0003,
    "a473656564" "00" "a474616773" "91a161"                     #   seed 0, tags ["a"]
    "a565706f6368" "02"                                         # epoch: 2
    "a76d657373616765" "a4696e6974"                             # message: "init"
    "a76d657472696373" "82" "a46c6f7373" "cb3fd0000000000000"   # metrics: loss 0.25,
    "a6746f6b656e73" "cd1000"                                   #   tokens 4096
    "a7706172656e7473" "91c420" + "ff" * 32 +                   # parents: [ff..ff]
    "a473746570" "64"                                           # step: 100
    "a474696d65" "cf00060a2418202240"                           # time: 1700000000123456 us
    "a474726565" "c420" + bytes(range(32)).hex() +              # tree: 00 01 .. 1f
    "a474797065" "a6636f6d6d6974"                               # type: "commit"
)


def commit_object(metrics=None, context=None):
    return CommitObject(bytes(range(32)), (b"\xff" * 32,), "init", "ada@host", 1_700_000_000_123_456, 100, 2,
                        metrics or {"loss": 0.25, "tokens": 4096}, context or {"lr": 0.0003, "seed": 0, "tags": ["a"]})


def test_commit_object_bytes_and_id():
    data = commit_object().encode()
    assert data.hex() == COMMIT_HEX
    assert object_id(data).hex() == "ae3c46566da1845b6237cd89881f5ebbe4a54255ebacd3b01d650b0d69463031"


def test_dict_order_does_not_change_commit_bytes():
    shuffled = commit_object(metrics={"tokens": 4096, "loss": 0.25}, context={"tags": ["a"], "seed": 0, "lr": 0.0003})
    assert shuffled.encode().hex() == COMMIT_HEX


def test_state_order_does_not_change_tree_ids(repo):
    keys = [f"layer{i}.weight" for i in range(12)] + list(range(5))
    values = {k: torch.full((3,), float(i)) for i, k in enumerate(keys)}
    trees = set()
    for seed in range(3):
        order = keys[:]
        random.Random(seed).shuffle(order)
        state = {"model": {k: values[k] for k in order}, "meta": {"b": 1, "a": 2} if seed % 2 else {"a": 2, "b": 1}}
        trees.add(repo.commit(state, context=dict(reversed(list({"x": 1, "y": 2}.items())))).tree)
    assert len(trees) == 1


PACK_HEX = (
    "4d56435041434b31"                                                           # MVCPACK1
    "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85" "03000000" "616263"  # b"abc" @44
    "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262" "00000000"             # b"" @83
    "7b7015bb92cf0b318037702a6cdd81dee41224f734684c2c122cd6359cb1ee63" "02000000" "0001"     # 00 01 @119
    "03000000"                                                                   # trailer @121: count 3
    "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85" "2c00000000000000" "03000000"
    "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262" "5300000000000000" "00000000"
    "7b7015bb92cf0b318037702a6cdd81dee41224f734684c2c122cd6359cb1ee63" "7700000000000000" "02000000"
    "ea2f638e4b058e7b15aaadda05422730dc3518010ee8e2759e5253f2998f1a77"           # BLAKE3(trailer)
    "7900000000000000"                                                           # trailer offset 121
    "4d56435345414c31"                                                           # MVCSEAL1
)


def test_pack_file_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr("mvc.store.packs.secrets.token_bytes", lambda n: bytes(range(n)))
    writer = PackWriter(tmp_path)
    for chunk in (b"abc", b"", b"\x00\x01"):
        writer.add(hashing.digest(chunk), chunk)
    path = writer.seal()
    assert path.name == "pack-000102030405060708090a0b0c0d0e0f.pack"
    assert path.read_bytes().hex() == PACK_HEX


def test_repository_uses_the_spec_example(tmp_path):
    with mvc.Repository.init(tmp_path, chunk_size=8) as repo:
        c = repo.commit({"w": torch.tensor([1.0, 2.0, 3.0]), "step": 3, "opt": (0.9, 0.99)}, "x")
        (w,) = [e for e in repo.entries(c.id) if e.kind == "tensor"]
        assert w.tensor_id == TENSOR_ID and w.chunks == (CHUNK_0, CHUNK_1)
        assert c.tree == "9105c7f11658601edc4bd1653483839432cf81d742774fbe568b9770d64df15c"


# -- an independent reader, written from docs/format.md alone ------------------

DTYPE_NP = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8,
            "F16": np.float16, "BOOL": np.bool_}


def test_sealed_value_golden_bytes():
    from mvc.store.index import seal
    assert seal("refs", b"heads/main", b"\x00" + bytes(32) + b"\x00").hex() == (
        "c1" + blake3.blake3(b"refs\x00heads/main\x00" + bytes(34)).digest()[:8].hex() + "00" * 34)


def spec_pack_indexes(env, mvc_dir: Path) -> list:
    """(pack name, its index's bytes, its trailer's bytes) of the registered packs, newest first (section 5.9)."""
    db = env.open_db(b"packidx", create=False)
    with env.begin() as txn:
        packs = sorted(((struct.unpack("<QQ", v)[0], k) for k, v in txn.cursor(db=db) if len(k) == 16), reverse=True)
    out = []
    for _, name in packs:
        pidx = (mvc_dir / "packs" / f"pack-{name.hex()}.pidx").read_bytes()
        pack = (mvc_dir / "packs" / f"pack-{name.hex()}.pack").read_bytes()
        start = struct.unpack("<Q", pack[-16:-8])[0]
        out.append((name, pidx, pack[start:-48]))
    return out


def spec_locate(registered: list, cid: bytes) -> tuple:
    """(pack, offset, length) of ``cid`` from the newest registered pack index that lists it."""
    for name, pidx, trailer in registered:
        magic, npacks, n, width = struct.unpack("<8sIQB", pidx[:21])
        assert magic == b"MVCPIDX1" and npacks == 1 and width == 16 and pidx[24:40] == name
        at = 40 + 256 * 8
        heads = [pidx[at + 8 * i:at + 8 * i + 8] for i in range(n)]
        tails = [pidx[at + 8 * n + 8 * i:at + 8 * n + 8 * i + 8] for i in range(n)]
        rows = struct.unpack(f"<{n}I", pidx[at + 20 * n:at + 24 * n])
        for i in range(n):  # u64 LE numbers whose values are the id's bytes read big-endian
            if heads[i][::-1] + tails[i][::-1] == cid[:16]:
                entry = trailer[4 + 44 * rows[i]:4 + 44 * (rows[i] + 1)]
                if entry[:32] == cid:
                    return (name,) + struct.unpack("<QI", entry[32:])
    raise KeyError(cid.hex())


def spec_read(root: Path, rev_ref: str = "HEAD"):
    """Load the state HEAD names, using only lmdb, msgpack and blake3 (docs/format.md)."""
    mvc_dir = root / ".mvc"
    fields = dict(line.split(" ", 1) if " " in line else (line, "")
                  for line in (mvc_dir / "FORMAT").read_text("utf-8").splitlines() if line)
    assert fields["mvc-format"] == "1" and set(fields["extensions"].split()) <= {"sealed-values", "pack-indexes"}
    env = lmdb.open(str(mvc_dir / "index"), subdir=True, readonly=True, lock=False, max_dbs=16)
    db = {name: env.open_db(name.encode(), create=False)
          for name in ("chunks", "tensors", "trees", "commits", "refs", "meta")}
    registered = spec_pack_indexes(env, mvc_dir) if "pack-indexes" in fields["extensions"].split() else []
    with env.begin() as txn:
        assert struct.unpack("<Q", txn.get(b"chunk_size", db=db["meta"]))[0] > 0
        def ref_value(name: bytes) -> bytes:  # a sealed value: 0xC1, 8-byte check, inner value
            raw = txn.get(name, db=db["refs"])
            assert raw[0] == 0xC1 and raw[1:9] == blake3.blake3(b"refs\x00" + name + b"\x00" + raw[9:]).digest()[:8]
            return raw[9:]
        ref = ref_value(rev_ref.encode())
        while ref[0] == 1:  # symbolic
            ref = ref_value(ref[1:])
        assert ref[0] == 0 and len(ref) == 34
        commit_id = ref[1:33]
        commit_bytes = txn.get(commit_id, db=db["commits"])
        assert blake3.blake3(commit_bytes).digest() == commit_id
        commit = msgpack.unpackb(commit_bytes, raw=False, strict_map_key=False)
        tree_bytes = txn.get(commit["tree"], db=db["trees"])
        assert blake3.blake3(tree_bytes).digest() == commit["tree"]
        tree = msgpack.unpackb(tree_bytes, raw=False, strict_map_key=False)
        groups = {}

        def tensor(tid):
            obj = msgpack.unpackb(txn.get(tid, db=db["tensors"]), raw=False)
            data = b""
            for cid in obj["chunks"]:
                raw = txn.get(cid, db=db["chunks"])
                pack, offset, length = struct.unpack("<16sQI", raw) if raw else spec_locate(registered, cid)
                with open(mvc_dir / "packs" / f"pack-{pack.hex()}.pack", "rb") as f:
                    f.seek(offset - 36)
                    head_id, head_len = struct.unpack("<32sI", f.read(36))
                    chunk = f.read(length)
                assert head_id == cid and head_len == length and blake3.blake3(chunk).digest() == cid
                data += chunk
            return np.frombuffer(data, dtype=np.dtype(DTYPE_NP[obj["dtype"]]).newbyteorder("<")).reshape(obj["shape"])

        def node(value):
            if isinstance(value, msgpack.ExtType):
                if value.code == 1:
                    return tuple(node(v) for v in msgpack.unpackb(value.data, raw=False, strict_map_key=False))
                if value.code == 2:
                    return tensor(value.data)
                if value.code == 3:
                    key = (value.data[:32], struct.unpack(">I", value.data[32:])[0])
                    if key not in groups:
                        groups[key] = tensor(value.data[:32])
                    return groups[key]
                raise ValueError(value.code)
            if isinstance(value, list):
                return [node(v) for v in value]
            if isinstance(value, dict):
                return {k: node(v) for k, v in value.items()}
            return value
        state = node(tree["root"])
    env.close()
    return commit, state


def test_an_independent_reader_following_the_spec(tmp_path):
    w = torch.randn(5, 7)
    state = {"model": {"w": w, "tied": w, "b": torch.arange(10, dtype=torch.int64)},
             "opt": {0: {"step": 3, "betas": (0.9, 0.999)}}, "mask": torch.tensor([True, False]),
             "half": torch.randn(6).half(), "x": None}
    with mvc.Repository.init(tmp_path, chunk_size=16) as repo:
        repo.commit(state, "golden", step=7, metrics={"loss": 1.5})
    commit, back = spec_read(tmp_path)
    assert commit["type"] == "commit" and commit["step"] == 7 and commit["metrics"] == {"loss": 1.5}
    assert commit["parents"] == [] and commit["message"] == "golden"
    assert np.array_equal(back["model"]["w"], w.numpy()) and back["model"]["tied"] is back["model"]["w"]
    assert np.array_equal(back["model"]["b"], np.arange(10)) and back["opt"] == {0: {"step": 3, "betas": (0.9, 0.999)}}
    assert back["mask"].tolist() == [True, False] and back["half"].tobytes() == state["half"].numpy().tobytes()
    assert back["x"] is None


@pytest.mark.parametrize("name, np_name", [("F32", "float32"), ("I64", "int64"), ("F16", "float16")])
def test_dtype_names_are_the_spec_vocabulary(repo, name, np_name):
    t = torch.from_numpy(np.arange(3).astype(np_name))
    assert repo.entries(repo.commit({"t": t}).id)[0].dtype == name
