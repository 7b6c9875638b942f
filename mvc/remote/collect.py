"""Remote gc (``mvc gc --remote NAME``): retention and reclaiming space on a remote, safe against
concurrent pushes.

Vocabulary:

- **needed**: what the remote's refs reach: every commit record of their
  histories, and the tree, tensors and chunks of each commit retention has
  not pruned (a pruned commit keeps its record and a ``pruned`` note).
- **garbage pack**: a pack none of whose records is needed: left by a
  killed or rejected push, by a deleted branch, or by retention.
- **grace**: a garbage pack younger than this (by the store's clock, the
  pack's last-modified time against the gc's own lease's) is left alone, so
  a push that failed at its ref move leaves packs its rerun reuses. Safety
  does not rest on it (nor on the lease): the fence gives that.

The protocol (``docs/format.md`` 11.6): take the gc lease (no push lease
may be live; none can start while it is); list refs, read every object
pack (verified); prune by retention, uploading the
``pruned`` notes before anything is deleted; walk the refs down to tensor
objects and read the needed ones' chunk ids into a scratch folder
(``packindex.IdSpill``), which the sweep reads back a slice of the id space
at a time, so memory is bounded by the objects, not the chunks; then condemn
the garbage packs older than the grace (name them in the lease), fence every ref (rewrite it by
If-Match, so a push that read it earlier cannot move it any more), and delete
them, checking the lease before each. Any damage seen
(a ref or object pack that does not decode, an object the refs need that
no pack holds) stops the gc before it deletes anything. Packs whose
records are partly needed are kept whole (no rewrite: a lazy clone's
catalogue may point into them). An object pack's where hint
(``where/<name>``) is deleted with it, and one whose object pack is not
listed is deleted once older than the grace; a hint naming a chunk pack
this gc deleted is stale, which a reader survives (``mvc.remote.where``).
"""

import time
from dataclasses import dataclass
from typing import Optional

from .. import gc as local_gc
from .. import reach, sliced
from ..errors import CorruptObject, ObjectNotFound, RemoteBusy, RemoteDamaged, RemoteError
from ..objects import decode_tensor_ids, object_id
from ..store.index import RefValue
from ..store.packindex import IdSpill
from . import layout, lease, transfer
from .catalogue import read_trailer
from .bucket import NotFound, PreconditionFailed
from .connection import Connection, classify, is_ref

GRACE_S = 3600.0  # young garbage is kept: a failed push's rerun reuses its packs (safety is the fence's)


@dataclass(frozen=True)
class RemoteGcReport:
    remote: str
    dry_run: bool
    pruned: tuple = ()  # hex ids of commits retention pruned now
    packs_deleted: tuple = ()  # keys
    bytes_reclaimed: int = 0
    young: tuple = ()  # keys of garbage packs left alone: younger than the grace
    young_bytes: int = 0
    mixed: int = 0  # packs kept whole that also hold records nothing needs
    unreadable: tuple = ()  # packs whose trailer cannot be read: left for 'remote repair'
    hints_deleted: int = 0  # where hints found without their object pack, deleted (those of packs deleted go too)


class _View:
    """The remote's refs and objects as mvc.gc's retention reads a repository."""

    def __init__(self, refs: dict, commits: dict, pruned: set):
        self._refs, self._commits, self._pruned = refs, commits, pruned

    def refs(self, prefix: str = ""):
        for ref, (oid, protected, _) in sorted(self._refs.items()):
            if ref.startswith(prefix):
                yield ref, RefValue(id=oid, protected=protected)

    def pruned(self, oid: bytes):
        return {"policy": "retention"} if oid in self._pruned else None

    def commit(self, txn, oid: bytes):
        obj = self._commits.get(oid)
        if obj is None:
            raise ObjectNotFound(f"commit {oid.hex()[:12]} is not on the remote", id=oid)
        return obj


def _read_objects(conn) -> tuple:
    """(commits {id: object}, trees {id: object}, tensors {id: (object pack key, offset, length)},
    {commit id: note id}) of every record of every object pack, verified, a pack at a time. A
    tensor object is checked here like every record (one that does not decode stops the gc), but
    only where it lies is kept: its chunk ids, most of a remote's ids, are read again for the
    needed tensors alone (``_spill_chunks``)."""
    commits, trees, tensors, notes = {}, {}, {}, {}
    for key in sorted(conn.catalogue.object_packs()):
        entries = read_trailer(conn.bucket, key)
        where = {oid: (key, offset, length) for oid, offset, length in entries}
        for oid, data in transfer.read_pack_records(conn.bucket, key, entries).items():
            if _is_tensor(data):
                tensors[oid] = where[oid]
                continue
            kind, obj = classify(data, oid)
            if kind == "pruned":
                notes[obj["commit"]] = oid
            elif kind == "tensors":  # not in the canonical form _is_tensor knows: decoded whole, then dropped
                tensors[oid] = where[oid]
            else:
                (commits if kind == "commits" else trees)[oid] = obj
    return commits, trees, tensors, notes


def _is_tensor(data: bytes) -> bool:
    """Whether a record is a tensor object that decodes, checked without a Python bytes object
    per chunk id (``decode_tensor_ids``). False for any other record, and for a tensor that does not
    decode, which ``classify`` then names. A canonical tensor's first key is its chunk size
    (the keys are sorted): other records skip the try."""
    if data[1:12] != b"\xaachunk_size":
        return False
    try:
        decode_tensor_ids(data)
    except CorruptObject:
        return False
    return True


def _needed(remote: str, tips: list, commits: dict, trees: dict, tensors: dict, pruned: set) -> tuple:
    """(object ids, tensor ids) the histories of ``tips`` need; RemoteDamaged if one is on no pack.
    The walk stops at tensor objects: their chunks are ``_spill_chunks``'s."""
    need_objects, need_tensors, lost = set(), [], []

    def get(kind: str, oid: bytes):
        if kind == "tensors":
            if oid not in tensors:
                lost.append(oid)
            else:
                need_objects.add(oid)
                need_tensors.append(oid)
            return None  # the walk goes no further down: a tensor's chunk ids are read a pack at a time
        obj = (commits if kind == "commits" else trees).get(oid)
        if obj is None:
            lost.append(oid)
            return None
        need_objects.add(oid)
        return obj
    for _ in reach.closure(get, tips, pruned.__contains__):
        pass  # nothing comes out: get gives it no tensor
    if lost:
        raise RemoteDamaged(f"{len(lost)} objects the remote's refs need are on no intact pack (commit, tree or "
                            f"tensor {lost[0].hex()[:12]} ...); remote gc deleted nothing", remote=remote, ids=lost)
    return need_objects, need_tensors


READ_BYTES = 32 << 20  # tensor object records _spill_chunks reads at once


def _spill_chunks(conn, tensors: dict, need: list, spill) -> None:
    """Add the chunk ids of the tensors ``need`` (ids in ``tensors``, as ``_read_objects`` gives
    it) to ``spill``: their records read again (verified), a pack and at most READ_BYTES at a time,
    and decoded one at a time, so that no more than that many of them are in memory at once."""
    by_pack = {}
    for oid in need:
        by_pack.setdefault(tensors[oid][0], []).append(oid)
    for key in sorted(by_pack):
        batch, size = {}, 0
        for oid in sorted(by_pack[key], key=lambda oid: tensors[oid][1]):
            batch[oid] = tensors[oid]
            size += tensors[oid][2]
            if size >= READ_BYTES:
                _spill_records(conn, batch, spill)
                batch, size = {}, 0
        _spill_records(conn, batch, spill)


def _spill_records(conn, located: dict, spill) -> None:
    records = transfer.read_records(conn.bucket, located)
    for oid in located:
        _, ids = decode_tensor_ids(records.pop(oid))
        spill.add(ids)


def gc_remote(repo, name: Optional[str] = None, keep_last: Optional[int] = None, branch: Optional[str] = None,
              keep_best: Optional[str] = None, mode: str = "min", top: int = 1, force: bool = False,
              grace: float = GRACE_S, dry_run: bool = False, budget: Optional[int] = None) -> RemoteGcReport:
    """Prune the remote's history by retention (local gc's rules, on the remote's refs) and delete its
    garbage packs older than ``grace`` seconds.

    Raises RemoteBusy while a push or another gc holds a lease, RemoteDamaged
    (deleting nothing) when the remote's refs need something no intact pack
    holds, BadInput / ProtectedRef / UnknownRevision for a retention policy
    local gc would refuse, RemoteError for the store's failures.

    Memory: the remote's commits, trees and the places of its tensor objects;
    the needed chunk ids go to a scratch folder and the sweep reads them back
    ``budget`` at a time (``mvc.sliced``; default ``MVC_WALK_BUDGET`` or 2**20).
    """
    policy = local_gc.Retention(keep_last, branch, keep_best, mode, top)
    policy.check()
    budget = sliced.budget(budget)
    conn = Connection(repo, name)
    try:
        if conn.marker(create=False) is None:  # and a layout this mvc does not read is refused here
            raise conn.vanished() if conn.known() else \
                RemoteError(f"{conn.info.url} holds no mvc remote (no {layout.MARKER}); nothing was deleted")
        with lease.held(conn, lease.GC) as held:
            now = dict((k, t) for k, _, t in conn.bucket.list_times(held.key)).get(held.key)
            conn.catalogue.refresh(conn.bucket)
            refs = conn.remote_refs()
            fence = _fence_plan(refs, conn.deleted)  # by the etags the walk below plans from
            if conn.damaged:
                raise RemoteDamaged(f"remote ref {sorted(conn.damaged)[0]} does not decode; remote gc deleted "
                                    "nothing", remote=conn.name)
            commits, trees, tensors, notes = _read_objects(conn)
            pruned = set(notes)
            prune = set()
            if policy.active:
                view = _View(refs, commits, pruned)
                prune, _ = local_gc._retention(view, view, policy, force)
            if prune and not dry_run:  # the notes are durable before any data goes
                note = {"time": time.time_ns() // 1000, "policy": policy.describe()}  # as local gc writes it
                records = [(object_id(data), data) for data in
                           (layout.encode_pruned(oid, note) for oid in sorted(prune))]
                transfer.upload_objects(conn.bucket, conn.catalogue, records)
                notes.update({oid: rid for oid, (rid, _) in zip(sorted(prune), records)})
            tips = [oid for oid, _, _ in refs.values()]
            need_objects, need_tensors = _needed(conn.name, tips, commits, trees, tensors, pruned | prune)
            need_objects |= {notes[oid] for oid in need_objects if oid in notes}
            with sliced.Scratch(repo.dir) as where:
                spill = IdSpill(where.folder())
                _spill_chunks(conn, tensors, need_tensors, spill)
                return _sweep(conn, held, need_objects, spill.slices(budget), now, grace, dry_run,
                              tuple(sorted(oid.hex() for oid in prune)), fence)
    finally:
        conn.close()


def _sweep(conn, held, need_objects: set, need_chunks, now: Optional[float], grace: float, dry_run: bool,
           pruned: tuple, fence: dict) -> RemoteGcReport:
    """``need_chunks``: the needed chunk ids, a slice of the id space at a time (``IdSpill.slices``)."""
    counts = conn.catalogue.held(need_chunks, need_objects)
    garbage, young, unreadable, mixed, reclaimed, young_bytes, seen = [], [], [], 0, 0, 0, set()
    for folder in (layout.CHUNK_PACKS, layout.OBJECT_PACKS):
        for key, size, when in conn.bucket.list_times(folder):
            if layout.pack_name(key) is None:
                continue
            seen.add(key)
            if key not in counts:
                unreadable.append(key)  # damaged or written after the listing: never deleted here
                continue
            live, listed = counts[key]
            if live:
                mixed += live < listed
                continue
            if now is None or now - when < grace:
                young.append(key)
                young_bytes += size
                continue
            garbage.append(key)
            reclaimed += size
    if garbage and not dry_run:
        conn.upgrade()  # condemned packs and fenced refs: layout 2 first (docs/format.md 11.1.1)
        held.condemn(garbage)  # named before the fence: a push that reads a ref after it avoids them
        _fence(conn, fence)
        for key in garbage:
            held.check()  # a gc that stalled past its lease deletes nothing more
            conn.bucket.delete(key)
            if key.startswith(layout.OBJECT_PACKS):
                conn.bucket.delete(layout.where_key(key))  # after its pack: no listed pack lacks its hint
        conn.catalogue.refresh(conn.bucket)
    hints = 0
    if not dry_run:
        lease.drop_spent(conn.bucket, seen - set(garbage))
        hints = _drop_lone_hints(conn, held, seen - set(garbage), now, grace)
    return RemoteGcReport(conn.name, dry_run, pruned, tuple(garbage), reclaimed, tuple(young), young_bytes, mixed,
                          tuple(unreadable), hints)


def _drop_lone_hints(conn, held, listed: set, now: Optional[float], grace: float) -> int:
    """Delete the where hints older than ``grace`` whose object pack is not ``listed`` (a push killed
    between the two, a gc killed between them, an older gc that deleted only the pack); how many.
    A hint is only ever a speed matter, so one deleted early costs a reader only time."""
    lone = [key for key, _, when in conn.bucket.list_times(layout.WHERE)
            if (name := _hinted_pack(key)) is not None and layout.pack_key(layout.OBJECT_PACKS, name) not in listed
            and now is not None and now - when >= grace]
    for key in lone:
        held.check()
        conn.bucket.delete(key)
    return len(lone)


def _hinted_pack(key: str) -> Optional[bytes]:
    """The object pack name a where hint's key names, or None if it is no hint's key."""
    return layout.pack_name(layout.OBJECT_PACKS + key[len(layout.WHERE):] + ".pack")


def _fence_plan(refs: dict, deleted: dict) -> dict:
    """{key: (its bytes again with a fresh fence, etag read)} of every ref and tombstone."""
    out = {layout.ref_key(ref): (layout.encode_ref(oid, protected), etag)
           for ref, (oid, protected, etag) in refs.items()}
    out.update({layout.ref_key(ref): (layout.encode_tombstone(time.time()), etag) for ref, etag in deleted.items()})
    return out


def _fence(conn, fence: dict) -> None:
    """Rewrite every ref and tombstone with a fresh fence (``_fence_plan``), by If-Match on the etag
    the gc planned from. A push that read a ref before this cannot move it after (its If-Match
    fails), however long it stalled; a ref that moved or appeared since the gc read the refs means a
    push landed that the gc did not plan for: RemoteBusy, nothing deleted (docs/format.md 11.6)."""
    for key, (body, etag) in sorted(fence.items()):
        try:
            conn.bucket.put(key, body, if_match=etag)
        except (PreconditionFailed, NotFound):
            raise RemoteBusy(f"{key} on remote {conn.name!r} moved while remote gc ran; it deleted nothing: "
                             "run it again", remote=conn.name, kind=lease.PUSH) from None
    new = sorted(key for key, _ in conn.bucket.list(layout.REFS)
                 if key not in fence and is_ref(key[len(layout.REFS):]))
    if new:
        raise RemoteBusy(f"{new[0]} appeared on remote {conn.name!r} while remote gc ran; it deleted nothing: "
                         "run it again", remote=conn.name, kind=lease.PUSH)
