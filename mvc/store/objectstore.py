"""The object store: commits, trees and tensors by id, with one policy.

Objects live in the index (LMDB keeps no checksums of its own), so every
object read is verified: its bytes must hash to the id it was asked for
and decode. The policy, the same for every caller (load, log, show, diff,
bisect, fsck, gc):

- absent: ``ObjectNotFound`` naming the kind and id, ``.id`` set;
- bytes that do not hash to the id, or do not decode: ``CorruptObject``
  naming the kind and id, ``.id`` set;
- a commit whose tensors gc retention deleted, asked for its tree:
  ``CommitPruned`` with the commit's id.

``ObjectStore.check(...)`` gives the same verdict as a value instead of an
exception, for checkers that collect damage.
"""

import time
from itertools import islice
from typing import Callable, Iterable, Iterator, Optional

from ..errors import CommitPruned, CorruptObject, ObjectNotFound
from ..objects import CommitObject, TensorObject, TreeObject, object_id
from .verify import intact

KINDS = {"commits": CommitObject, "trees": TreeObject, "tensors": TensorObject}
MISSING, CORRUPT = "missing", "corrupt"
PREFETCH = 256  # objects a walk announces to ``ObjectStore.prefetch`` at once (``ahead``)


def _noun(kind: str) -> str:
    return kind[:-1]


class ObjectStore:
    """Typed, verified access to the objects of an index transaction."""

    def get(self, txn, kind: str, oid: bytes):
        """The decoded object ``oid`` of ``kind`` ("commits", "trees", "tensors"), verified."""
        verdict, value = self.check(txn, kind, oid)
        if verdict == MISSING:
            raise ObjectNotFound(f"{_noun(kind)} {oid.hex()[:12]} is missing from the index",
                                 id=oid)
        if verdict == CORRUPT:
            raise CorruptObject(f"{_noun(kind)} {oid.hex()[:12]} is corrupt ({value})", id=oid, kind=_noun(kind))
        return value

    def check(self, txn, kind: str, oid: bytes) -> tuple:
        """(None, object) when intact, (MISSING, None), or (CORRUPT, why)."""
        data = txn.get(kind, oid)
        if data is None:
            return MISSING, None
        try:
            obj = KINDS[kind].decode(data)
        except CorruptObject as exc:
            return CORRUPT, f"it does not decode: {exc}"
        if not intact(oid, data):
            return CORRUPT, "its bytes do not hash to its id"
        return None, obj

    def prefetch(self, txn, kind: str, ids) -> None:
        """A hint that the objects ``ids`` of ``kind`` are about to be read, each by itself: a store
        that reads missing objects from elsewhere (a lazy clone's remote) reads them together
        first. Here every object is local: nothing to do."""

    def ahead(self, txn, kind: str, items: Iterable, oid: Callable = lambda item: item) -> Iterator:
        """``items`` (whose object ids of ``kind`` ``oid`` gives, None for an item with none), each
        batch of ``PREFETCH`` announced to ``prefetch`` before it is handed out: a walk that reads
        each item's object costs a lazy clone a few requests a batch instead of one each."""
        items = iter(items)
        while batch := list(islice(items, PREFETCH)):
            self.prefetch(txn, kind, [k for k in map(oid, batch) if k is not None])
            yield from batch

    def commit(self, txn, oid: bytes) -> CommitObject:
        return self.get(txn, "commits", oid)

    def tree(self, txn, oid: bytes) -> TreeObject:
        return self.get(txn, "trees", oid)

    def tensor(self, txn, oid: bytes) -> TensorObject:
        return self.get(txn, "tensors", oid)

    def has(self, txn, kind: str, oid: bytes) -> bool:
        return txn.get(kind, oid) is not None

    def put(self, txn, kind: str, data: bytes) -> bytes:
        """Store encoded object bytes; returns the id (a no-op if present)."""
        oid = object_id(data)
        txn.put(kind, oid, data)
        return oid

    def pruned(self, txn, oid: bytes) -> Optional[dict]:
        """gc retention's note on commit ``oid`` (time, policy), or None if its data is kept."""
        note = txn.pruned(oid)
        if note is None:
            return None
        return note if isinstance(note, dict) else {}

    def commit_tree(self, txn, oid: bytes) -> TreeObject:
        """The tree of commit ``oid``; CommitPruned if retention deleted its tensors."""
        obj = self.commit(txn, oid)
        note = self.pruned(txn, oid)
        if note is not None:
            when = time.strftime("%Y-%m-%d", time.localtime(note.get("time", 0) / 1e6))
            raise CommitPruned(f"commit {oid.hex()[:12]} was pruned by gc ({note.get('policy', 'retention')}) "
                               f"on {when}: its record is kept but its tensors are gone; load a kept commit",
                               id=oid, policy=note.get("policy", "retention"))
        return self.tree(txn, obj.tree)
