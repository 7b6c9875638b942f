"""The sharded-save verbs of a repository, grouped as ``repo.shards``.

The vocabulary (piece, description, unindexed pack, dcp metadata) and the
call order are in ``mvc.sharded``, which this module builds on: ``begin``
(coordinator), ``write`` (every rank), ``commit`` (coordinator), and
``view``, what a sharded load plans with. ``mvc.reader.read_pieces`` reads
the byte ranges a load plans; ``hooks/dcp.py`` is the DCP plugin.
"""

from dataclasses import replace
from typing import Callable, Optional

from . import commits, ondisk, refs
from .errors import BadInput
from .objects import TensorLeaf, TreeObject, object_id
from .records import Commit, CommitStats
from .sharded import EXTENSION, ShardedTensor, check_dcp, nest, tensor_object
from .store import locks as locking
from .store.locks import default_author
from .traverse import format_path, walk


class Shards:
    """The sharded-save verbs of ``repo`` (``repo.shards``), in their call
    order: ``begin`` (coordinator), ``write`` (every rank), ``commit``
    (coordinator); ``view`` is what a sharded load plans with, and
    ``mvc.reader.read_pieces`` reads the byte ranges it plans."""

    def __init__(self, repo):
        self.repo = repo

    def begin(self, branch: Optional[str] = None, author: Optional[str] = None) -> dict:
        """Where a sharded save will commit, as plain data for ``commit``:
        {"ref": the branch ref (None when HEAD is detached), "parent": its tip}.

        Raises ProtectedRef / LockHeld now, before any rank writes a chunk.
        """
        me = locking.this_process(author or default_author())
        with self.repo.index.read() as txn:
            ref = commits.target_ref(self.repo, txn, branch)
            parent = self.repo.refs.tip(txn, ref)
            self.repo.refs.check_commit(txn, ref, me)
        return {"ref": ref, "parent": parent}

    def write(self, tensors: list, progress: Optional[Callable[[int, int], None]] = None) -> dict:
        """A rank's part of a sharded save: hash ``tensors`` (CPU or device
        tensors, each one piece) and write the chunks the repository lacks to
        this process's own new pack, sealed. Never takes the index write lock.

        Returns plain data for the coordinator: {"chunk_size", "tensors":
        [{"dtype", "shape", "chunks"}, ...] in the order given, "locations":
        {chunk id: [pack name, offset, length]} of the chunks written,
        "chunks_new", "bytes_new"}. Raises BadInput for a tensor mvc cannot store.
        """
        from . import state  # torch: see mvc.commits
        slots = [state.TensorSlot((i,), state._check_tensor(t, (i,)), tuple(t.shape), t)
                 for i, t in enumerate(tensors)]
        with self.repo.gc_lock.shared():
            batch, stats = commits.write_chunks(self.repo, slots, progress)
        return {"chunk_size": self.repo.chunk_size,
                "tensors": [{"dtype": s.dtype, "shape": list(s.shape), "chunks": list(s.chunks)} for s in slots],
                "locations": {cid: [loc.pack, loc.offset, loc.length] for cid, loc in batch.locations.items()},
                "chunks_new": stats.chunks_new, "bytes_new": stats.bytes_new}

    def commit(self, start: dict, leaves: dict, locations: dict, dcp: Optional[dict] = None,
               message: str = "", *, step: Optional[int] = None, epoch: Optional[int] = None,
               metrics: Optional[dict] = None, context: Optional[dict] = None,
               author: Optional[str] = None, stats: Optional[CommitStats] = None) -> Commit:
        """The coordinator's part of a sharded save: one commit of every rank's shards.

        ``start`` is what ``begin`` returned; ``leaves`` maps key
        paths to ``mvc.ShardedTensor`` or plain values; ``locations`` merges
        the ranks' locations; ``dcp`` is the DCP metadata (see
        ``mvc.sharded.check_dcp``). Checks every named pack is sealed and
        lists each chunk where claimed, then in one index write transaction
        indexes them, checks every chunk of every tensor is indexed with its
        length, stores the objects and moves the branch by compare-and-swap
        against ``start["parent"]`` (RefConflict if it moved). BadInput
        (nothing committed) for anything that does not add up.
        """
        if type(start) is not dict or set(start) != {"ref", "parent"}:
            raise BadInput("start must be what shards.begin returned")
        record = commits.record(message, step, epoch, metrics, context, author or default_author())
        me = locking.this_process(record.author)
        if dcp is not None:
            check_dcp(dcp)
        objs, tree_leaves = {}, {}
        for path, leaf in leaves.items():
            if isinstance(leaf, ShardedTensor):
                obj = tensor_object(leaf, self.repo.chunk_size, f"tensor {format_path(path)!r}")
                data = obj.encode()
                objs[object_id(data)] = (obj, data)
                tree_leaves[path] = TensorLeaf(object_id(data))
            else:  # plain values as they are (tuples stay tuples); encoding refuses anything else
                tree_leaves[path] = leaf
        tree_data = TreeObject(nest(tree_leaves), dcp).encode()
        with self.repo.gc_lock.shared():
            batch = self.repo.chunks.adopt(locations)
            ondisk.require_extension(self.repo.dir, EXTENSION)

            def publish(txn):
                batch.publish(txn)
                spans = [(cid, n) for obj, _ in objs.values() for cid, _, n in obj.chunk_spans()]
                sizes, elsewhere = {}, []
                for cid, _ in spans:
                    loc = txn.chunk(cid)
                    if loc is not None:
                        sizes[cid] = loc.size  # decoded (a repacked record may be encoded)
                    else:  # written by a rank on another host: it must be on the cached remote
                        elsewhere.append(cid)
                sizes.update(self.repo.chunks.lengths(elsewhere, txn))  # asked together: one remote lookup
                for cid, n in spans:
                    if sizes.get(cid) != n:
                        raise BadInput(f"chunk {cid.hex()[:12]} of a sharded save is neither written by a "
                                       "rank nor in the repository (gc ran meanwhile?); nothing was "
                                       "committed, save again")
            with self.repo.index.write() as txn:
                oid, obj = commits.land(self.repo, txn, start["ref"], start["parent"], False, me, record, publish,
                                        {tid: data for tid, (_, data) in objs.items()}, tree_data)
        ref = start["ref"]
        return replace(commits.to_commit(oid, obj, stats), branch=refs.short_name(ref) if ref else None)

    def view(self, rev: str = refs.HEAD) -> dict:
        """What a sharded load plans with, read once: {"commit": full hex id,
        "dcp": the DCP metadata (None for a commit of ``commit``), "tensors":
        {key path: TensorObject}, "values": {key path: plain leaf}, "root":
        the tree (tensors as TensorLeaf), to find values that are containers,
        "dict_metadata": the tree's (see ``TreeObject``)}."""
        with self.repo.index.read() as txn:
            oid = self.repo.refs.resolve(txn, rev)
            tree = self.repo.objects.commit_tree(txn, oid)
            tensors, values = {}, {}
            for path, leaf in walk(tree.root):
                if isinstance(leaf, TensorLeaf):
                    tensors[path] = self.repo.objects.tensor(txn, leaf.id)
                else:
                    values[path] = leaf
        return {"commit": oid.hex(), "dcp": tree.dcp, "tensors": tensors, "values": values, "root": tree.root,
                "dict_metadata": tree.dict_metadata}
