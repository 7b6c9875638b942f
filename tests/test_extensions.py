"""Every writer of an extension's objects names the extension in FORMAT first (docs/format.md 2).

For each verb that can write objects only an mvc with an extension reads (a
signed commit or merge, a sharded save, a tree with module metadata), a
fresh repository is written by it, every stored object is scanned for what
it needs (this file's own oracle, from the format's field tables), and that
must be listed in FORMAT, so an older mvc (one that lacks the extension)
refuses the repository instead of reading the objects as damage, which its
fsck could prune.
"""

import pytest
import torch

import mvc
from mvc import ShardedTensor, dtypes, ondisk, signing
from mvc.errors import UnsupportedFormat
from mvc.objects import CommitObject, TensorObject, TreeObject

KEY = signing.key_from_seed(bytes(range(32, 64)))


def needed(repo) -> set:
    """The extensions the objects stored in ``repo`` need, read off their fields."""
    out = set()
    with repo.index.read() as txn:
        for kind, cls in (("commits", CommitObject), ("trees", TreeObject), ("tensors", TensorObject)):
            for oid in txn.ids(kind):
                obj = cls.decode(txn.get(kind, oid))
                if kind == "commits" and obj.signature:
                    out.add(ondisk.SIGNATURES)
                if kind == "trees" and obj.dcp is not None or kind == "tensors" and obj.shards:
                    out.add(ondisk.SHARDED)
                if kind == "trees" and obj.dict_metadata:
                    out.add(ondisk.DICT_METADATA)
        for name, _ in txn.refs("tags/"):  # signed tags: a tag object beside the ref (format.md 7.4)
            if txn.meta(signing.TAG_PREFIX + name[len("tags/"):]) is not None:
                out.add(ondisk.SIGNATURES)
    return out


def _two_branches(repo):
    repo.commit({"w": torch.zeros(8)}, "base")
    repo.commit({"w": torch.ones(8)}, "a", branch="a", start="main")
    repo.commit({"w": torch.full((8,), 3.0)}, "b", branch="b", start="main")


def signed_commit(repo):
    repo.commit({"w": torch.arange(8.0)}, "signed", sign=KEY)


def signed_merge(repo):
    _two_branches(repo)
    repo.merge(["a", "b"], sign=KEY)


def signed_average(repo):
    _two_branches(repo)
    repo.merge(["a", "b"], strategy="linear", sign=KEY)


def signed_tag(repo):
    repo.commit({"w": torch.arange(8.0)}, "plain")
    repo.create_tag("v1", sign=KEY, message="signed")


def sharded_save(repo):
    w = torch.arange(16.0).reshape(4, 4)
    start = repo.shards.begin("main")
    pieces, locations = [], {}
    for lo in (0, 2):
        desc = repo.shards.write([w.narrow(0, lo, 2)])
        pieces.append(((lo, 0), (2, 4), desc["tensors"][0]["chunks"]))
        locations.update(desc["locations"])
    repo.shards.commit(start, {("w",): ShardedTensor(dtypes.name_of(w.dtype), (4, 4), pieces)}, locations, None,
                       "sharded")


def module_state(repo):
    repo.commit({"model": torch.nn.Linear(2, 2).state_dict()}, "a module's state_dict")


WRITERS = [signed_commit, signed_merge, signed_average, signed_tag, sharded_save, module_state]


@pytest.mark.parametrize("write", WRITERS, ids=[w.__name__ for w in WRITERS])
def test_every_extension_written_is_declared_and_an_older_mvc_refuses(write, tmp_path, monkeypatch):
    repo = mvc.Repository.init(tmp_path, chunk_size=64)
    try:
        before = ondisk.read_format(repo.dir)[1]
        write(repo)
        need = needed(repo)
    finally:
        repo.close()
    assert need and not need & before  # the writer did write an extension's objects, into a repository without it
    declared = ondisk.read_format(repo.dir)[1]
    assert need <= declared, f"{write.__name__} wrote objects needing {sorted(need - declared)} without naming them"
    for name in need:  # an mvc that lacks the extension refuses the repository, naming it
        monkeypatch.setattr(ondisk, "KNOWN_EXTENSIONS", ondisk.KNOWN_EXTENSIONS - {name})
        with pytest.raises(UnsupportedFormat) as exc:
            mvc.Repository.open(tmp_path)
        assert name in exc.value.extensions
        monkeypatch.undo()
