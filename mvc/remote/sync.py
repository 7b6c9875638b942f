"""push, fetch, pull and clone: only what the other side lacks moves, verified, in a crash-safe order.

Vocabulary:

- **tracking ref**: ``remotes/NAME/BRANCH`` in the local index, the commit
  branch BRANCH of remote NAME named when this repository last talked to
  it. A root for gc like any ref; revisions accept ``NAME/BRANCH``.
- **closure** of a commit: it, its ancestors, their trees, tensors and
  chunks. No remote ref names a commit whose closure is not durable there,
  because a push uploads chunk packs, then object packs, then moves refs
  (and a remote gc keeps what refs need); so "the remote's refs reach C"
  means "and all it needs", and a push walks history only until it meets
  such a commit. A commit merely held there is no such proof: the object
  pack of a killed push can outlive its chunk packs.

Push order (each step durable before the next): chunk packs; object packs;
each ref by a conditional put against the etag it was read with. A killed
push leaves packs no ref names (harmless); its rerun finds them in the
listing and sends only the rest. Fetch order: chunks into local packs,
each published on its own (harmless until referenced); then one index
transaction stores the objects and moves the tracking refs.
"""

import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import audit as _audit
from .. import ondisk
from .. import reach
from .. import refs as refnames
from ..errors import (BadInput, BranchLocked, CorruptObject, Diverged, LockHeld, MvcError, ProtectedRef,  # noqa: F401
                      HistoryRewritten, ObjectNotFound,
                      PrunedOnRemote, RefRejected, RemoteBusy, RemoteDamaged, UntrustedAnswer)  # RefRejected re-exported
from ..objects import TensorLeaf, TensorObject, object_id
from ..store import locks as locking
from ..traverse import walk as walk_tree
from . import config, layout, lease, transfer, where
from .bucket import NotFound, PreconditionFailed, RemoteError, open_bucket
from .catalogue import read_trailer
from .connection import Connection, classify, is_ref  # noqa: F401  (Connection, is_ref re-exported)

REMOTES = refnames.REMOTES
REJECTED = "rejected: remote has commits you lack; fetch first"


@dataclass(frozen=True)
class RefUpdate:
    ref: str  # heads/X or tags/X
    old: Optional[str]  # hex ids
    new: Optional[str]
    status: str  # "new", "updated", "up to date", "forced", CLASHES, REFUSED


CLASHES = "not fetched: a local branch has this name"  # a fetched tag that would hide or be hidden by a branch
# a fetched tag signing.require refuses (signing.fetch flag or off: the rest of the fetch is taken)
REFUSED = "not fetched: its policy requires good signatures"


@dataclass(frozen=True)
class Flagged:
    """A remote ref whose move breaks the signing policy, fetched anyway (``signing.fetch flag``):
    a branch's tracking ref moved; a tag is not made here (its RefUpdate says REFUSED)."""
    ref: str  # heads/X or tags/X
    id: Optional[str]  # hex: the commit whose signature is not good, or the tip a rewrite moved to
    status: str  # that commit's verdict (unsigned, unknown, bad), or "rewritten"
    message: str


@dataclass(frozen=True)
class PushReport:
    remote: str
    refs: tuple
    commits: int = 0
    objects: int = 0
    chunks: int = 0
    chunk_bytes: int = 0  # chunk data sent
    packs: int = 0
    bytes_sent: int = 0  # every pack byte sent


@dataclass(frozen=True)
class FetchReport:
    remote: str
    refs: tuple  # RefUpdate of tracking refs (ref is remotes/NAME/BRANCH)
    objects: int = 0
    chunks: int = 0
    bytes_received: int = 0
    lazy: bool = False  # chunks were left on the remote (a cache / --lazy clone)
    damaged_refs: tuple = ()  # remote refs whose object does not decode (left out)
    # commits held here whose data the cached remote's retention pruned and that are not whole here:
    # marked pruned here too (hex ids)
    pruned: tuple = ()
    # chunks refs here need (beyond the remote's refs) that are neither here nor on the cached remote
    lost: int = 0
    flagged: tuple = ()  # Flagged: the policy's findings that signing.fetch flag let through


@dataclass(frozen=True)
class PullReport:
    fetch: FetchReport
    branch: str
    old: Optional[str]
    new: Optional[str]
    status: str  # "fast-forward", "up to date", "new"


def _hex(oid: Optional[bytes]) -> Optional[str]:
    return oid.hex() if oid else None


# -- push ---------------------------------------------------------------------------

@dataclass
class _Outgoing:
    records: list = field(default_factory=list)  # (id, bytes) of objects to send
    chunks: dict = field(default_factory=dict)  # id -> length
    commits: int = 0
    tensors: set = field(default_factory=set)  # ids of the tensor objects among ``records``
    lone: set = field(default_factory=set)  # ids of ``chunks`` that are a whole tensor's only chunk


def _outgoing(txn, objects, tips: list, conn: Connection, behind) -> _Outgoing:
    """What the remote lacks of the closures of ``tips``: walks until it meets a commit ``behind``
    the remote's refs. A commit the remote merely holds is no stop: a pack of a killed push, or the
    objects of a deleted branch in a pack a gc keeps whole, can hold a commit whose chunks are gone."""
    out, seen = _Outgoing(), set()
    has = conn.catalogue.has_objects
    lazy = conn.catalogue.lazy()
    for oid, commit in reach.ancestors(lambda c: objects.commit(txn, c), tips, stop=behind):  # verified
        if not has([oid]):
            out.records.append((oid, txn.get("commits", oid)))
            out.commits += 1
        note = objects.pruned(txn, oid)
        if note is not None:
            data = layout.encode_pruned(oid, note)
            out.records.append((object_id(data), data))
        else:
            before = _parent_leaves(txn, objects, commit) if lazy else None
            _outgoing_tree(txn, objects, commit.tree, out, seen, has, conn, before)
    return out


def _parent_leaves(txn, objects, commit) -> dict:
    """{path: {tensor ids}} of the tensors of ``commit``'s parents' trees (those held here): a lazy
    push reads the trailers their where hints name, where the unchanged chunks of a new state lie."""
    out: dict = {}
    for parent in commit.parents:
        if txn.get("commits", parent) is None:
            continue
        try:
            tree = objects.commit_tree(txn, parent)
        except (CorruptObject, ObjectNotFound):
            continue  # a parent this repository cannot read only gives no hint
        for path, leaf in walk_tree(tree.root):
            if isinstance(leaf, TensorLeaf):
                out.setdefault(path, set()).add(leaf.id)
    return out


def _held(conn: Connection, txn, ids, lazy: bool) -> dict:
    """{id: Location} of the chunks ``ids`` the remote holds, as far as a push must know to send the rest.

    A full catalogue read every trailer: the lookup is complete. A lazy one (unread trailers)
    answers from the trailers read so far (the caller read first those the where hints of what
    it sends and of their predecessors name): proving a chunk absent would read every trailer,
    in proportion to the remote, not to what is sent. An id none lists is sent again: a
    duplicate on the remote, content-addressed, costs bytes, never data (a remote gc keeps every
    pack that lists an id it needs). An id not held here (a lazy clone left it on the remote)
    cannot be sent, so it alone is looked for in every unread trailer, as before."""
    if not lazy:
        return conn.catalogue.chunks(ids)
    known = conn.catalogue.chunks(ids, complete=False)
    away = [cid for cid in ids if cid not in known and txn.chunk(cid) is None]
    if away:
        known.update(conn.catalogue.chunks(away))
    return known


def _behind(repo, conn: Connection, tips: list) -> set:
    """The commits the remote's ``tips`` reach: their closures are on the remote while its refs name
    them (a gc keeps what refs need). Commits only, no trees: cheap. A tip this repository lacks
    (someone else pushed) is walked through the remote's object packs, so a stale clone's push
    still stops where the remote's history begins."""
    with repo.index.read() as txn:
        stale = any(txn.get("commits", tip) is None for tip in tips)
    fetched = _incoming_lazy(repo, conn, tips) if stale else {}  # their commits (and trees), not tensor objects
    with repo.index.read() as txn:
        def commit(oid):
            if txn.get("commits", oid) is not None:
                return repo.objects.commit(txn, oid)
            try:
                kind, obj = classify(fetched[oid], oid) if oid in fetched else (None, None)
            except CorruptObject:
                return None  # fsck --remote's to report; here the walk only ends
            return obj if kind == "commits" else None
        return {oid for oid, _ in reach.ancestors(commit, tips)}


def _read_targets(conn: Connection, targets: dict) -> tuple:
    """The remote's refs, read before the listing a push plans by (``remote_refs``), with a
    tombstone written first for each target it lacks: every ref move is then an If-Match on an
    etag read here, which a remote gc's fence changes (docs/format.md 11.6). Returns
    (refs as ``remote_refs`` gives them, {deleted ref: etag}, {damaged ref: etag})."""
    current = conn.remote_refs()
    absent = [ref for ref in targets if ref not in current and ref not in conn.deleted and ref not in conn.damaged]
    if absent:
        conn.upgrade()  # a tombstone is fenced: layout 2 first (docs/format.md 11.1.1)
    for ref in absent:
        try:
            conn.bucket.put(layout.ref_key(ref), layout.encode_tombstone(time.time()), if_absent=True)
        except PreconditionFailed:
            pass  # someone wrote it meanwhile: read below
    if absent:
        current = conn.remote_refs()
    return current, dict(conn.deleted), dict(conn.damaged)  # later reads replace conn's


def _outgoing_tree(txn, objects, tree_id: bytes, out: _Outgoing, seen: set, has, conn,
                   before: Optional[dict] = None) -> None:
    """The records and chunks of tree ``tree_id`` the remote lacks. A tree or tensor object the remote
    holds is no proof that it holds the chunks: a remote gc keeps the objects of a commit its
    retention pruned (in packs it keeps whole) and deletes their chunks, so a new commit of the same
    state would otherwise send none. Every chunk is asked of the listing (taken under the lease).

    ``before`` ({path: tensor ids} of the parents' trees) is given on a lazy catalogue: the
    trailers the where hints of this tree's tensors and of the parents' tensors at the same paths
    name are read first, in one batch, and chunks are looked up as ``_held`` says."""
    if tree_id in seen:
        return
    seen.add(tree_id)
    tree = objects.tree(txn, tree_id)
    if not has([tree_id]):
        out.records.append((tree_id, txn.get("trees", tree_id)))
    named = [(path, leaf.id) for path, leaf in walk_tree(tree.root) if isinstance(leaf, TensorLeaf)]
    leaves = [tid for tid in dict.fromkeys(tid for _, tid in named) if tid not in seen]
    present = has(leaves)
    lazy, hinted = before is not None, before is None
    for tid in leaves:  # in tree order, so chunks keep their neighbours
        seen.add(tid)
        tensor = objects.tensor(txn, tid)
        if tid not in present:  # a lazy clone's object store may have read it from its remote just now
            out.records.append((tid, getattr(objects, "raw", lambda t, k, o: t.get(k, o))(txn, "tensors", tid)))
            out.tensors.add(tid)
        spans = {cid: n for cid, _, n in tensor.chunk_spans() if cid not in out.chunks}
        if not hinted and len(conn.catalogue.chunks(spans, complete=False)) < len(spans):
            # a chunk no trailer read lists: the trailers the hints name for the whole tree, in one batch
            # (none when every chunk is known already: a coordinator's commit read its ranks' packs)
            hinted, fresh = True, set(leaves)
            like = set(present) | {old for path, t in named if t in fresh for old in before.get(path, ())}
            conn.catalogue.read_named(conn.catalogue.hinted_packs(like))
        known = _held(conn, txn, spans, lazy)
        out.chunks.update({cid: n for cid, n in spans.items() if cid not in known})
        if len(tensor.chunks) == 1 and tensor.chunks[0] in out.chunks:
            out.lone.add(tensor.chunks[0])


def _targets(repo, txn, names: tuple) -> dict:
    """{local ref: (id, protected)} that a push of ``names`` sends (default: HEAD's branch)."""
    if not names:
        branch, oid = repo.refs.head(txn)
        if branch is None:
            raise BadInput("HEAD is detached: name the branch or tag to push")
        names = (refnames.short_name(branch),)
    out = {}
    for name in names:
        for ref in (name if name.startswith((refnames.BRANCHES, refnames.TAGS)) else None,
                    refnames.BRANCHES + name, refnames.TAGS + name):
            value = txn.ref(ref) if ref else None
            if value is not None and value.id is not None:
                out[ref] = (value.id, value.protected)
                break
        else:
            raise BadInput(f"nothing to push by the name {name!r}: no such branch or tag")
    return out


def _is_ancestor(txn, objects, old: bytes, new: bytes) -> bool:
    """Whether commit ``old`` is ``new`` or one of its ancestors (both local)."""
    def commit(oid):
        return objects.commit(txn, oid) if txn.get("commits", oid) is not None else None
    return old == new or any(old in obj.parents for _, obj in reach.ancestors(commit, [new]))


def push(repo, name: Optional[str] = None, names: tuple = (), force: bool = False, progress=None,
         delete: tuple = ()) -> PushReport:
    """Send the closures of the named refs that the remote lacks, then move its refs; delete the
    remote branches or tags named in ``delete`` (or as ``:NAME`` in ``names``).

    Holds a push lease on the remote from before it decides what the remote
    has until its refs moved (``lease``), so a remote gc never deletes a
    pack this push counts on. Raises RefRejected ('rejected: remote has
    commits you lack; fetch first') when a remote branch moved to commits
    this repository lacks or that its tip does not descend from (unless
    ``force``), ProtectedRef / LockHeld when the remote ref is protected or
    locked by someone else, RemoteBusy while a remote gc runs, BadInput
    for a ``delete`` the remote has no ref by, RemoteError for the store's failures.
    """
    delete = tuple(delete) + tuple(n[1:] for n in names if n.startswith(":"))
    names = tuple(n for n in names if not n.startswith(":"))
    conn = Connection(repo, name)
    try:
        # a remote used before is never made again where it was: an empty folder there (an
        # unmounted disk) would take the pushes, and the cache would evict against it
        known = conn.known()
        conn.create = first = (not delete or bool(names)) and not known
        if known and conn.marker(create=False) is None:
            raise conn.vanished()
        conn.ensure_conditional()  # first: a refused store is left as it was (no MVCREMOTE)
        conn.marker(create=first)
        with lease.held(conn, lease.PUSH) as held:
            if delete and not names:
                return PushReport(conn.name, tuple(_delete_refs(repo, conn, delete, force, held)))
            with repo.gc_lock.shared():
                with repo.index.read() as txn:
                    targets = _targets(repo, txn, names)
                # the refs first, then what gcs condemned, then the packs: a gc that condemns a pack
                # after this push read a ref has fenced that ref by then, so the move below fails
                # (docs/format.md 11.6); one that did so before is seen here and its packs avoided
                read = _read_targets(conn, targets)
                conn.catalogue.shun(lease.condemned(conn.bucket))
                # a lazy clone lists the chunk packs without reading their trailers: _outgoing reads
                # those the where hints of what it sends name (``_held``)
                conn.catalogue.refresh(conn.bucket, trailers=not lazy_for(repo, conn.name))
                behind = _behind(repo, conn, [oid for oid, _, _ in read[0].values()])
                with repo.index.read() as txn:
                    out = _outgoing(txn, repo.objects, [oid for oid, _ in targets.values()], conn, behind)
                _refuse_pruned_tips(repo, conn, targets)
                _audit.check_push_targets(repo, conn.remote_refs, targets, conn.name)  # before any upload
                chunks, cuts, hard = _in_pack_order(repo, out.chunks, out.lone)
                packs, sent = transfer.upload_chunks(repo, conn.bucket, conn.catalogue, chunks, progress, cuts, hard)
                opacks, osent = transfer.upload_objects(conn.bucket, conn.catalogue, out.records,
                                                        _where_hints(conn, out))
                held.check()
                updates = _move_refs(repo, conn, targets, force, *read)
            if delete:
                updates += _delete_refs(repo, conn, delete, force, held)
        return PushReport(conn.name, tuple(updates), out.commits, len(out.records), len(chunks),
                          sum(out.chunks.values()), packs + opacks, sent + osent)
    finally:
        conn.close()


def _where_hints(conn: Connection, out: _Outgoing):
    """``upload_objects``'s ``hints``: for a pack of the records ``ids``, the where hint of the
    tensor objects among them (``mvc.remote.where``), from the catalogue, which after the chunk
    upload locates every chunk they use (None: no tensor object among them). The work is one
    lookup per chunk of the tensor objects pushed, as planning took."""
    data = dict(out.records)

    def hints(ids: list):
        tensors = {}
        for tid in ids:
            if tid in out.tensors:
                chunks = TensorObject.decode(data[tid]).chunks
                located = conn.catalogue.chunks(chunks, complete=False)
                tensors[tid] = where.runs(chunks, lambda cid: loc.pack if (loc := located.get(cid)) else None)
        return where.encode(tensors) if tensors else None
    return hints


def _refuse_pruned_tips(repo, conn: Connection, targets: dict) -> None:
    """PrunedOnRemote if a ref would move to a commit the remote holds but its retention pruned.

    The walk of the push stops at commits the remote holds, so such a commit's data would not be
    sent, and the remote ref would name a commit without data (which its next gc keeps that way).
    Only a tip the remote already holds can be one: its notes are read then, not on every push."""
    held = [(ref, oid) for ref, (oid, _) in targets.items() if conn.catalogue.has_objects([oid])]
    if not held:
        return
    notes = {}
    for oid, data in _incoming_lazy(repo, conn, []).items():  # the notes are among the small records
        kind, obj = classify(data, oid)
        if kind == "pruned":
            notes[obj["commit"]] = obj.get("policy", "retention")
    for ref, oid in held:
        if oid in notes:
            raise PrunedOnRemote(f"commit {oid.hex()[:12]} was pruned on remote {conn.name!r} by its retention "
                                 f"({notes[oid]}): it keeps the record, not the data, so {ref} there would name a "
                                 "commit without data; commit that state again to keep it there",
                                 remote=conn.name, ref=ref, id=oid.hex(), policy=notes[oid])


def _delete_refs(repo, conn: Connection, names: tuple, force: bool, held) -> list:
    """Delete remote refs by name: each becomes a tombstone, by If-Match on the etag it was read with."""
    current = conn.remote_refs()
    me = locking.default_author()
    updates = []
    for name in names:
        refnames.check_name(name.removeprefix(refnames.BRANCHES).removeprefix(refnames.TAGS), "branch or tag")
        ref = next((r for r in (name, refnames.BRANCHES + name, refnames.TAGS + name) if r in current), None)
        if ref is None:
            raise BadInput(f"remote {conn.name!r} has no branch or tag {name!r} to delete")
        old, protected, etag = current[ref]
        if protected and not force:
            raise ProtectedRef(f"{refnames.human(ref)} is protected on remote {conn.name!r}; nothing was deleted",
                               ref=ref, action="delete", forced="delete it")
        _check_remote_lock(conn, ref, me)
        conn.upgrade()  # a tombstone is fenced: layout 2 first (docs/format.md 11.1.1)
        held.check()
        try:
            conn.bucket.put(layout.ref_key(ref), layout.encode_tombstone(time.time()), if_match=etag)
        except (PreconditionFailed, NotFound):
            raise RefRejected(f"{REJECTED}: {refnames.short_name(ref)} moved on {conn.name!r} meanwhile; "
                              "nothing was deleted", remote=conn.name, refs=(ref,)) from None
        _untrack(repo, conn.name, ref)
        updates.append(RefUpdate(ref, _hex(old), None, "deleted"))
    return updates


def _untrack(repo, remote: str, ref: str) -> None:
    """Remove the tracking ref of remote ``remote``'s branch ``ref`` and its reflog (a deleted
    remote branch keeps nothing alive here). A remote tag fetched here stays a local tag, as in git."""
    if ref.startswith(refnames.BRANCHES):
        with repo.index.write() as txn:
            repo.refs.drop(txn, REMOTES + remote + "/" + refnames.short_name(ref))




def _in_pack_order(repo, chunks: dict, lone: set = frozenset()) -> tuple:
    """((id, length) of ``chunks`` in the order their records lie in local packs, the indices
    where a new local pack begins: ``transfer.pack_groups``'s cuts, and its ``hard`` cut: where
    the chunks of ``lone`` begin, put last in packs of their own).

    A commit writes a tensor's chunks one after the other, so this keeps
    them together in the remote's packs too: a later read of some tensors
    (a lazy load of a few keys, a streamed export) then takes a few long
    ranged reads instead of one per chunk. Each rank of a sharded save
    writes a local pack of its own, so the cuts keep one rank's shards in
    remote packs of their own: a rank of a sharded load reads its own.
    The tensors of one chunk go last, in packs of their own: DCP saves a
    replicated value (an optimizer's ``step``) on one rank, and every rank
    reads it; in that rank's pack it would make every rank read that pack's
    trailer too."""
    with repo.index.read() as txn:
        def where(item):
            loc = txn.chunk(item[0])
            return (item[0] in lone,) + ((loc.pack, loc.offset) if loc is not None else (b"", 0))
        placed = sorted((where(item), item) for item in chunks.items())
    cuts = frozenset(i for i in range(1, len(placed)) if placed[i][0][:2] != placed[i - 1][0][:2])
    hard = next((i for i, (at, _) in enumerate(placed) if at[0]), None)
    return [item for _, item in placed], cuts, hard


def refresh(repo, name: str) -> int:
    """Learn the packs remote ``name`` gained since it was last listed (their
    trailers; a lazy clone's remote: only the listing, trailers read when a
    lookup needs them); how many were new. RemoteError if it cannot be read."""
    conn = Connection(repo, name)
    try:
        return conn.catalogue.refresh(conn.bucket, trailers=not lazy_for(repo, conn.name))
    finally:
        conn.close()


def upload_shards(repo, name: str, locations: dict, ids) -> tuple:
    """A rank's part of a sharded save across hosts (``MvcStorageWriter(remote=...)``).

    ``locations`` are the chunks this rank just wrote to its own sealed pack
    ({id: [pack, offset, length]}, as ``write_shards`` returns them): they
    are indexed here. Then every chunk of ``ids`` (all the rank's chunks,
    also those an earlier, failed save left here) that remote ``name``
    lacks is uploaded in packs, read back verified as every push reads.
    Returns (packs, bytes) sent. Once this returns they are durable on the
    remote, so the coordinator may commit a tree that names them.

    On a lazy clone (a fresh host) the remote's chunk pack trailers are not
    all read: those the where hints of the tensors of this repository's
    last checkpoint name for ``ids`` are (``_rank_packs``), and a chunk none
    read lists is uploaded again (``_held``: a duplicate costs bytes, never data).
    """
    conn = Connection(repo, name)
    try:
        with lease.held(conn, lease.PUSH), repo.gc_lock.shared():
            conn.catalogue.shun(lease.condemned(conn.bucket))
            conn.catalogue.refresh(conn.bucket, trailers=not lazy_for(repo, conn.name))
            if locations:
                batch = repo.chunks.adopt(locations)
                with repo.index.write() as txn:
                    batch.publish(txn)
            ids = list(dict.fromkeys(ids))  # in tensor order
            lazy = conn.catalogue.lazy()
            if lazy and len(conn.catalogue.chunks(ids, complete=False)) < len(ids):
                conn.catalogue.read_named(_rank_packs(repo, conn, ids))
            with repo.index.read() as txn:
                held = _held(conn, txn, ids, lazy)
                lacking = [(cid, repo.chunks.length(cid, txn, "a chunk of this rank's shards"))
                           for cid in ids if cid not in held]
            # the short chunks last, in packs of their own (their trailers list a few entries): among
            # them a value DCP saves on one rank only (an optimizer's step), which every rank reads,
            # so no rank reads the trailer of a whole pack of another rank's shards for it
            full = [item for item in lacking if item[1] == repo.chunk_size]
            short = [item for item in lacking if item[1] != repo.chunk_size]
            return transfer.upload_chunks(repo, conn.bucket, conn.catalogue, full + short,
                                          hard=len(full) if full and short else None)
    finally:
        conn.close()


def _rank_packs(repo, conn: Connection, ids: list) -> set:
    """The chunk pack keys where hints name for those of chunks ``ids`` that the last checkpoint
    held: the tensor objects of HEAD's commit and of its branch's tracking ref of this remote
    (a rank's host that resumed from it, or a fresh clone of it), and those this process read
    (a resume load), are looked up by chunk id (``where.Noted``), so a rank reads the trailers
    of its own shards' packs, not every rank's. RemoteError."""
    noted = getattr(repo.chunks, "noted", None) or where.Noted()
    with repo.index.read() as txn:
        try:
            branch, head = repo.refs.head(txn)
        except MvcError:  # no HEAD: no hint
            branch, head = None, None
        tips = {head} if head is not None else set()
        if branch is not None:
            value = txn.ref(REMOTES + conn.name + "/" + refnames.short_name(branch))
            if value is not None and value.id is not None:
                tips.add(value.id)
        tids = set()
        for tip in tips:
            if txn.get("commits", tip) is None:
                continue
            try:
                tree = repo.objects.commit_tree(txn, tip)
            except (CorruptObject, ObjectNotFound):
                continue  # only a speed matter
            tids.update(leaf.id for _, leaf in walk_tree(tree.root) if isinstance(leaf, TensorLeaf))
        for tid in tids:
            try:
                noted.note(tid, repo.objects.tensor(txn, tid).chunks)
            except MvcError:  # not read (damaged, pruned, the remote failing): only a speed matter
                continue
    return where.packs_for(noted.holders(ids), conn.catalogue.hint)


def _move_refs(repo, conn: Connection, targets: dict, force: bool, current: dict, deleted: dict,
               damaged: dict) -> list:
    """Move the remote's refs to ``targets`` by If-Match on the etags in ``current``, ``deleted``
    and ``damaged`` (as ``_read_targets`` gives them), read before the push listed the packs."""
    updates, rejected, fenced = [], [], []
    me = locking.default_author()
    for ref, (tip, protected) in sorted(targets.items()):
        key = layout.ref_key(ref)
        old, old_protected, etag = current.get(ref, (None, False, deleted.get(ref)))
        if ref in damaged:
            if not force:
                rejected.append(ref)
                continue
            etag = damaged[ref]  # --force replaces an object that does not decode
        if old == tip:
            updates.append(RefUpdate(ref, _hex(old), _hex(tip), "up to date"))
            continue
        _audit.check_push(repo, ref, old, tip, conn.name)  # signing policy: force does not bypass it
        if old is not None and old_protected and not force:
            raise ProtectedRef(f"{refnames.human(ref)} is protected on remote {conn.name!r}; nothing was moved",
                               ref=ref, action="move", forced="move it")
        if old is not None and not force:
            with repo.index.read() as txn:
                ok = ref.startswith(refnames.BRANCHES) and _is_ancestor(txn, repo.objects, old, tip)
            if not ok:
                rejected.append(ref)
                continue
        _check_remote_lock(conn, ref, me)
        conn.upgrade()  # a ref is fenced: layout 2 first (docs/format.md 11.1.1)
        body = layout.encode_ref(tip, protected or old_protected)
        try:
            written = conn.bucket.put(key, body, if_absent=True) if etag is None else \
                conn.bucket.put(key, body, if_match=etag)
        except (PreconditionFailed, NotFound):  # NotFound: If-Match on an object deleted meanwhile
            if not _landed(conn, key, body):  # a retried put whose first try had landed is ours
                (fenced if _same_ref(conn, key, old) else rejected).append(ref)
                continue
        else:
            _check_landed(repo, conn, key, body, written, tip)
        updates.append(RefUpdate(ref, _hex(old), _hex(tip), "new" if old is None else ("forced" if force else "updated")))
        _track(repo, conn.name, ref, tip, f"push: {refnames.short_name(ref)}")
    heads = [u.ref for u in updates if u.ref.startswith(refnames.BRANCHES)]
    if heads and conn.bucket.get_versioned(layout.HEAD) is None:
        try:
            conn.bucket.put(layout.HEAD, layout.encode_head(heads[0]), if_absent=True)
        except PreconditionFailed:
            pass
    if fenced and not rejected:
        raise RemoteBusy(f"a remote gc ran on {conn.name!r} while this push was stalled, so "
                         f"{', '.join(refnames.short_name(r) for r in fenced)} was not moved (the packs it counted "
                         "on may be gone)" + (f"; moved: {', '.join(refnames.short_name(u.ref) for u in updates)}"
                                              if updates else "") + ": push again",
                         remote=conn.name, holder="", kind=lease.GC)
    rejected += fenced
    if rejected:
        names = ", ".join(refnames.short_name(r) for r in rejected)
        raise RefRejected(f"{REJECTED}: {names} on {conn.name!r} not moved"
                          + (f"; moved: {', '.join(refnames.short_name(u.ref) for u in updates)}" if updates else ""),
                          remote=conn.name, refs=rejected)
    return updates


def _same_ref(conn: Connection, key: str, old: Optional[bytes]) -> bool:
    """Whether remote ref ``key`` still names ``old`` (None: still deleted), under another etag:
    a remote gc fenced it, nobody moved it."""
    current = conn.bucket.get_versioned(key)
    if current is None or layout.is_tombstone(current[0]):
        return old is None
    try:
        return layout.decode_ref(current[0], key)[0] == old
    except CorruptObject:
        return False


def _landed(conn: Connection, key: str, body: bytes) -> bool:
    current = conn.bucket.get_versioned(key)
    return current is not None and current[0] == body


def _check_landed(repo, conn: Connection, key: str, body: bytes, etag: str, tip: bytes) -> None:
    """Read a ref back after its conditional put: the object must hold what was written, or a
    commit that descends from it (an honest push that came right after, by If-Match on this
    one's etag, builds on it). Anything else means the store let two conditional puts against
    one etag both succeed: it does not honour If-Match (UntrustedAnswer), and this push's commit
    was dropped; it says so instead of exiting 0."""
    current = conn.bucket.get_versioned(key)
    if current is not None and current[0] == body:
        return
    if current is not None and not layout.is_tombstone(current[0]):
        try:
            theirs = layout.decode_ref(current[0], key)[0]
            if _remote_descends(repo, conn, theirs, tip):
                return
        except CorruptObject:
            pass
    raise UntrustedAnswer(f"{key} on remote {conn.name!r} does not hold what this push wrote under the etag "
                          "the store returned: the store did not honour If-Match, and a racing push may have "
                          "replaced this one's commit; fetch to check the remote's branch, and push again "
                          "only to a store that honours conditional writes", url=conn.bucket.url, key=key)


def _remote_descends(repo, conn: Connection, new: bytes, old: bytes) -> bool:
    """Whether commit ``new`` (on the remote, maybe not here) is ``old`` or descends from it."""
    conn.catalogue.refresh(conn.bucket)
    fetched = _incoming_lazy(repo, conn, [new])
    with repo.index.read() as txn:
        def commit(oid):  # here, or among the remote's objects; anything else ends the line
            if txn.get("commits", oid) is not None:
                return repo.objects.commit(txn, oid)
            if oid in fetched:
                kind, obj = classify(fetched[oid], oid)
                return obj if kind == "commits" else None
            return None
        return new == old or any(old in obj.parents for _, obj in reach.ancestors(commit, [new]))


def _check_remote_lock(conn: Connection, ref: str, me: str) -> None:
    if not ref.startswith(refnames.BRANCHES):
        return
    branch = refnames.short_name(ref)
    current = conn.bucket.get_versioned(layout.LOCKS + branch)
    if current is None:
        return
    holder = layout.decode_lock(current[0], layout.LOCKS + branch, conn.name)
    if holder["owner"] != me:
        raise BranchLocked(f"cannot push branch {branch!r}: it is locked on remote {conn.name!r} by {holder['owner']} "
                           f"(from {holder.get('host', '?')})", branch=branch, owner=holder["owner"],
                           host=holder.get("host", "?"), named=True, here=False, remote=conn.name)


def _track(repo, remote: str, ref: str, oid: bytes, why: str) -> None:
    if not ref.startswith(refnames.BRANCHES):
        return
    name = REMOTES + remote + "/" + refnames.short_name(ref)
    with repo.index.write() as txn:
        _set_tracking(repo, txn, name, oid, why)


def _set_tracking(repo, txn, name: str, oid: bytes, why: str) -> Optional[bytes]:
    current = txn.ref(name)
    old = current.id if current is not None else None
    if old != oid:
        repo.refs.set_if_equals(txn, name, old, oid, why)
    return old


def lock(repo, name: Optional[str], branch: str, owner: Optional[str] = None) -> str:
    """Take branch ``branch``'s write lock on the remote (pushes by anyone else are refused)."""
    conn = Connection(repo, name)
    try:
        conn.ensure_conditional()
        me = owner or locking.default_author()
        key = layout.LOCKS + refnames.check_name(branch, "branch")
        current = conn.bucket.get_versioned(key)
        if current is not None:
            holder = layout.decode_lock(current[0], key, conn.name)
            if holder["owner"] != me:
                raise LockHeld(f"branch {branch!r} is already locked on remote {conn.name!r} by {holder['owner']}")
            return me
        try:
            conn.bucket.put(key, layout.encode_lock(me, socket.gethostname(), time.time()), if_absent=True)
        except PreconditionFailed:
            raise LockHeld(f"branch {branch!r} was just locked on remote {conn.name!r} by someone else") from None
        return me
    finally:
        conn.close()


def unlock(repo, name: Optional[str], branch: str, force: bool = False, owner: Optional[str] = None) -> bool:
    """Release the remote lock; False if there was none."""
    conn = Connection(repo, name)
    try:
        key = layout.LOCKS + refnames.check_name(branch, "branch")
        current = conn.bucket.get_versioned(key)
        if current is None:
            return False
        holder = layout.decode_lock(current[0], key, conn.name) if not force else {"owner": None}
        if not force and holder["owner"] != (owner or locking.default_author()):
            raise BranchLocked(f"branch {branch!r} is locked on remote {conn.name!r} by {holder['owner']}",
                               branch=branch, owner=holder["owner"], named=True, remote=conn.name,
                               forced="remove the lock anyway")
        conn.bucket.delete(key)
        return True
    finally:
        conn.close()


# -- fetch --------------------------------------------------------------------------

def lazy_for(repo, remote: str) -> bool:
    """Whether chunks of ``remote`` stay there until read (the repository caches it)."""
    with repo.index.read() as txn:
        return config.cache_remote(txn) == remote


def _incoming_objects(repo, conn: Connection) -> dict:
    """{id: bytes} of every object the remote's object packs hold that the local index lacks, verified."""
    wanted, out = {}, {}
    with repo.index.read() as txn:
        for key, ids in conn.catalogue.object_packs().items():
            lacking = [oid for oid in ids if not any(txn.get(k, oid) is not None
                                                      for k in ("commits", "trees", "tensors"))]
            if lacking:
                wanted[key] = lacking
    for key in wanted:
        out.update(transfer.read_pack_records(conn.bucket, key, read_trailer(conn.bucket, key)))
    return out


@dataclass
class _Incoming:
    objects: list = field(default_factory=list)  # (kind, id, bytes)
    pruned: dict = field(default_factory=dict)  # commit id -> note, to mark pruned here
    chunks: dict = field(default_factory=dict)  # id -> length, reachable and not local
    notes: dict = field(default_factory=dict)  # commit id -> note: every commit the remote pruned
    pruned_here: tuple = ()  # ids of commits held here that inc.pruned marks (see FetchReport.pruned)
    lost: int = 0  # see FetchReport.lost
    extensions: set = field(default_factory=set)  # FORMAT extensions the objects need here


def _extensions_of(kind: str, obj) -> set:
    """The FORMAT extensions an incoming object needs here, as a commit made here names them:
    a clone of signed, sharded or module-metadata history must be refused by an mvc that would
    read those objects as damaged (and let fsck prune them), as its origin is."""
    if kind == "trees":
        return {name for name, used in ((ondisk.SHARDED, obj.dcp is not None),
                                        (ondisk.DICT_METADATA, bool(obj.dict_metadata))) if used}
    if kind == "tensors" and obj.shards:
        return {ondisk.SHARDED}
    if kind == "commits" and obj.signature:
        return {ondisk.SIGNATURES}
    return set()


def _closure(repo, txn, tips: list, fetched: dict, remote: str, lazy=None) -> _Incoming:
    """What the local repository lacks of the closures of ``tips``; RemoteDamaged if remote ``remote`` lacks it too.
    ``lazy``: the catalogue of a cached remote, whose tensor objects stay there (stored here only when
    a read needs them): the walk checks that its object packs list them, and goes no deeper."""
    decoded, pruned_notes = {}, {}
    for oid, data in fetched.items():
        kind, obj = classify(data, oid)
        if kind == "pruned":
            pruned_notes[obj["commit"]] = {"time": obj.get("time", 0), "policy": obj.get("policy", "retention")}
        else:
            decoded[oid] = (kind, obj, data)
    inc = _Incoming()

    def get(kind: str, oid: bytes):  # the walk asks for each object once
        if txn.get(kind, oid) is not None:
            return None  # local: its closure is local too (or readable through the cache)
        if lazy is not None and kind == "tensors" and (oid in decoded or lazy.has_objects([oid])):
            return None  # read from the remote when a read or a walk needs it
        if oid in decoded and decoded[oid][0] == kind:
            _, obj, data = decoded[oid]
            inc.objects.append((kind, oid, data))
            inc.extensions |= _extensions_of(kind, obj)
            return obj
        raise RemoteDamaged(f"{kind[:-1]} {oid.hex()[:12]} is missing on the remote and here; the remote is "
                            "damaged", remote=remote, ids=(oid,))
    for cid, n in reach.closure(get, tips, pruned_notes.__contains__):
        if txn.chunk(cid) is None:
            inc.chunks[cid] = n
    inc.pruned = {oid: pruned_notes[oid] for kind, oid, _ in inc.objects if kind == "commits" and oid in pruned_notes}
    inc.notes = pruned_notes
    return inc


def _pruned_away(repo, txn, notes: dict, catalogue) -> dict:
    """{commit id: note} of the commits held here (not pruned here) that a cached remote pruned and
    whose data is gone: some chunk is neither here nor in the remote's listing (just refreshed).
    They are pruned here too (a load then says so, instead of naming a missing chunk). One whose
    every chunk is still here or there keeps its data: pruning it would drop history still held."""
    out = {}
    for oid, note in notes.items():
        if txn.get("commits", oid) is None or txn.pruned(oid) is not None:
            continue
        tree = repo.objects.tree(txn, repo.objects.commit(txn, oid).tree)
        leaves = (leaf for _, leaf in walk_tree(tree.root) if isinstance(leaf, TensorLeaf))
        try:  # a lazy clone reads the tensor objects from the remote (kept there, with the commit, or not)
            away = {cid for leaf in leaves for cid in repo.objects.tensor(txn, leaf.id).chunks
                    if txn.chunk(cid) is None}
        except ObjectNotFound:  # neither here nor there: its data is gone
            out[oid] = note
            continue
        if away and len(catalogue.chunks(away)) < len(away):
            out[oid] = note
    return out


def fetch(repo, name: Optional[str] = None, progress=None, prune: bool = False) -> FetchReport:
    """Bring the remote's refs as tracking refs, with the objects (and, unless the repository caches this
    remote, the chunks) they need that are missing here, every byte verified first.

    ``prune``: also remove the tracking refs (and their reflogs) of branches
    the remote no longer has, so they keep nothing alive here.

    Raises ChecksumMismatch / CorruptObject (RemoteDamaged) for damaged
    remote data (nothing is indexed then), RemoteError for the store's failures.
    """
    conn = Connection(repo, name)
    try:
        if conn.marker(create=False) is None:
            if conn.known():
                raise conn.vanished()
            raise RemoteError(f"{conn.info.url} holds no mvc remote yet (no {layout.MARKER}); push to it first")
        lazy = lazy_for(repo, conn.name)
        conn.catalogue.refresh(conn.bucket, trailers=not lazy)  # lazy: chunk pack trailers when a read needs them
        remote = conn.remote_refs()
        with repo.gc_lock.shared():
            inc, fetched = _plan_fetch(repo, conn, [oid for oid, _, _ in remote.values()], lazy)
            errors = _audit.check_fetch(repo, conn.name, {ref: oid for ref, (oid, _, _) in remote.items()}, fetched)
            received = 0 if lazy else download(repo, conn, inc.chunks, progress)
            refused: list = []
            updates = _store_fetch(repo, conn, inc, remote, prune, refused)
        flagged = {f.ref: f for f in map(_flagged, errors + refused)}
        return FetchReport(conn.name, tuple(updates), len(inc.objects), 0 if lazy else len(inc.chunks),
                           received, lazy, tuple(sorted(conn.damaged)), inc.pruned_here, inc.lost,
                           tuple(flagged[ref] for ref in sorted(flagged)))
    finally:
        conn.close()


def _flagged(error) -> Flagged:
    if isinstance(error, HistoryRewritten):
        return Flagged(error.ref, error.new, "rewritten", str(error))
    return Flagged(error.ref, error.id.hex() if isinstance(error.id, bytes) else error.id, error.status, str(error))


def _plan_fetch(repo, conn: Connection, tips: list, lazy: bool) -> tuple:
    """(_Incoming, the fetched objects by id): what to fetch for ``tips``, once the remote is seen to hold all of it: the refs were listed
    after the packs, so a push that landed in between names packs not listed yet. Only what is
    still missing after the remote is listed again makes it damaged (RemoteDamaged)."""
    for attempt in (1, 2):
        try:
            fetched = _incoming_lazy(repo, conn, tips) if lazy else _incoming_objects(repo, conn)
            with repo.index.read() as txn:
                inc = _closure(repo, txn, tips, fetched, conn.name, conn.catalogue if lazy else None)
                if lazy:
                    _refuse_damaged_packs(conn)
                    away = _pruned_away(repo, txn, inc.notes, conn.catalogue)
                    inc.pruned.update(away)
                    inc.pruned_here = tuple(sorted(oid.hex() for oid in away))
                seen: set = set()
                absent = _absent_chunks(repo, txn, conn, tips, inc, fetched, seen) if lazy else \
                    _unlisted(conn.catalogue, inc.chunks)
                if lazy and not absent:
                    inc.lost = _lost_here(repo, txn, conn, inc, fetched, seen)
            if absent:
                raise RemoteDamaged(f"chunk {absent[0].hex()[:12]} (and {len(absent) - 1} more) is missing on "
                                    f"remote {conn.name!r}; it is damaged", remote=conn.name, ids=absent)
            return inc, fetched
        except CorruptObject:
            if attempt == 2:
                raise
            conn.catalogue.refresh(conn.bucket, trailers=not lazy)


def _lost_here(repo, txn, conn: Connection, inc: _Incoming, fetched: dict, seen: set) -> int:
    """How many chunks the refs here need (past what the remote's refs need, ``seen``) that are
    neither here nor on the remote: a branch the remote deleted, then collected, say. Not the
    remote's damage; fetch says so, fsck names what they break. Damage here is fsck's to find."""
    mine = [v.id for _, v in txn.refs() if v.id is not None]
    try:
        return len(_absent_chunks(repo, txn, conn, mine, inc, fetched, seen))
    except MvcError:
        return 0


def _unlisted(catalogue, ids) -> list:
    """Those of chunk ids ``ids`` the remote's catalogue does not list, in one batched lookup (a
    lookup an id costs the tables' search overhead each time)."""
    held = catalogue.chunks(ids)
    return [cid for cid in ids if cid not in held]


def _absent_chunks(repo, txn, conn: Connection, tips: list, inc: _Incoming, fetched: dict,
                   seen: Optional[set] = None) -> list:
    """Ids the closures of ``tips`` need that are neither here nor listed on the remote, as far as
    a lazy clone can tell without reading what it never used: the tensor objects that are neither
    here nor in the remote's object packs, and the chunks of the tensor objects held here that it
    relied on the remote for (located there once: ``Catalogue.lost``) and that no pack the remote
    lists holds now (looked for in every trailer, also those not read yet); once every trailer is
    read, every chunk of those tensor objects. A lazy clone reads them from there, so a pack
    deleted there is noticed at the next fetch. ``seen``: as ``reach.closure``'s."""
    decoded = {oid: classify(data, oid) for _, oid, data in inc.objects}
    pruned = set(inc.pruned) | set(inc.notes)  # the remote's retention, not damage
    away: list = []

    def get(kind: str, oid: bytes):
        if oid in decoded and decoded[oid][0] == kind:
            return decoded[oid][1]
        if kind == "tensors" and txn.get(kind, oid) is None:
            away.append(oid)  # on the remote until a read needs it
            return None
        return getattr(repo.objects, kind[:-1])(txn, oid)
    out = [cid for cid, _ in reach.closure(get, tips, lambda oid: oid in pruned or
                                           repo.objects.pruned(txn, oid) is not None, seen)]
    there = conn.catalogue.has_objects(away)
    elsewhere = [cid for cid in out if txn.chunk(cid) is None]
    known = conn.catalogue.chunks(elsewhere, complete=False)
    unknown = [cid for cid in elsewhere if cid not in known]
    if unknown and conn.catalogue.unread():  # a chunk never located may be in a trailer not read yet
        relied = conn.catalogue.lost(unknown)
        unknown = [cid for cid in unknown if cid in relied]
        known = conn.catalogue.chunks(unknown)
    return [oid for oid in away if oid not in there] + [cid for cid in unknown if cid not in known]


def _refuse_damaged_packs(conn: Connection) -> None:
    """RemoteDamaged if the remote lists a chunk pack found damaged (changed since it was listed, or a
    trailer that does not read). A lazy clone cannot tell which of its refs' chunks a pack whose
    trailer it never read held, so any such pack is damage it relies on, until a repair replaces it."""
    damaged = conn.catalogue.damaged()
    if damaged:
        raise RemoteDamaged(f"remote pack {damaged[0]} (and {len(damaged) - 1} more) on {conn.name!r} is damaged "
                            "(changed since it was listed, or its trailer does not read); what it held may be "
                            "gone", remote=conn.name, ids=())


def _incoming_lazy(repo, conn: Connection, tips: list) -> dict:
    """{id: bytes} of the remote's objects a lazy clone's fetch reads, verified: the commits and trees
    the remote's ``tips`` reach that are not here, and every record not here of at most
    ``transfer.SMALL_RECORD`` bytes (pruned notes are found that way: nothing names their ids). Tensor objects
    stay on the remote until a read or a walk needs one (``tiers.LazyObjects``): what this reads
    grows with commits and tensors, never with chunks (a tensor object under ``transfer.SMALL_RECORD`` lists
    at most about 110 chunks). The commits are read a generation at a time, each by ranged reads
    of the object packs (the catalogue's object table, from their trailers)."""
    with repo.index.read() as txn:
        lacking = [oid for ids in conn.catalogue.object_packs().values() for oid in ids
                   if all(txn.get(kind, oid) is None for kind in ("commits", "trees", "tensors"))]
    located = conn.catalogue.object_locations(lacking)
    small = {oid: loc for oid, loc in located.items() if loc[2] <= transfer.SMALL_RECORD}
    out = transfer.read_records(conn.bucket, small)

    def fetch(wave: list) -> None:
        out.update(transfer.read_records(conn.bucket, {oid: located[oid] for oid in wave
                                                       if oid not in out and oid in located}))
    reach.generations(tips, fetch, lambda oid: classify(out[oid], oid) if oid in out else None)
    return out


def _store_fetch(repo, conn: Connection, inc: _Incoming, remote: dict, prune: bool = False,
                 refused: Optional[list] = None) -> list:
    """Index what came, move the tracking refs, make the remote's new tags here; the RefUpdates.
    ``refused`` gets the policy's error of each tag left out."""
    updates = []
    for name in sorted(inc.extensions):  # FORMAT first, then the data that needs it
        ondisk.require_extension(repo.dir, name)
    with repo.index.write() as txn:
        if prune:
            prefix = REMOTES + conn.name + "/"
            for name, value in list(txn.refs(prefix)):
                branch = refnames.BRANCHES + name[len(prefix):]
                if branch not in remote and branch not in conn.damaged:
                    repo.refs.drop(txn, name)
                    updates.append(RefUpdate(name, _hex(value.id), None, "pruned"))
        for kind, oid, data in inc.objects:
            repo.objects.put(txn, kind, data)
        for oid, note in inc.pruned.items():
            txn.put_pruned(oid, note)
        for ref, (oid, _, _) in sorted(remote.items()):
            if ref.startswith(refnames.BRANCHES):
                name = REMOTES + conn.name + "/" + refnames.short_name(ref)
                old = _set_tracking(repo, txn, name, oid, f"fetch: {conn.name}")
                updates.append(RefUpdate(name, _hex(old), oid.hex(),
                                         "up to date" if old == oid else ("new" if old is None else "updated")))
            elif ref.startswith(refnames.TAGS) and txn.ref(ref) is None and refnames.is_valid_name(ref[len(refnames.TAGS):]):
                if txn.ref(refnames.BRANCHES + refnames.short_name(ref)) is not None:
                    updates.append(RefUpdate(ref, None, oid.hex(), CLASHES))  # the name would mean two things
                    continue
                # a local tag is a local ref move: the policy refuses one onto a commit whose signature is
                # not good, whatever signing.fetch says (refuse stopped the fetch before this; flag and off
                # take the rest of the fetch and leave the tag out)
                error = _audit.check_ref_move(repo, txn, ref, None, oid, f"from remote {conn.name!r}")
                if error is not None:
                    updates.append(RefUpdate(ref, None, oid.hex(), REFUSED))
                    if refused is not None:
                        refused.append(error)
                    continue
                repo.refs.set_if_equals(txn, ref, None, oid, f"fetch: {conn.name}")
                updates.append(RefUpdate(ref, None, oid.hex(), "new"))
    return updates


def download(repo, conn: Connection, chunks: dict, progress=None) -> int:
    """Fetch chunks {id: length} from the remote into new local packs, each published once sealed;
    the bytes read from the remote."""
    if not chunks:
        return 0
    located = conn.catalogue.chunks(chunks)
    absent = [cid for cid in chunks if cid not in located]
    if absent:
        raise RemoteDamaged(f"chunk {absent[0].hex()[:12]} (and {len(absent) - 1} more) is missing on remote "
                            f"{conn.name!r}; it is damaged", remote=conn.name, ids=absent)
    transfer.expect(progress, sum(loc.length for loc in located.values()))
    return sum(_download_group(repo, conn, group, progress) for group in _location_groups(located))


def _location_groups(located: dict) -> list:
    items = sorted(located.items(), key=lambda i: (i[1].pack, i[1].offset))
    out, current, size = [], {}, 0
    for cid, loc in items:
        if current and size + loc.length > layout.PACK_BYTES:
            out.append(current)
            current, size = {}, 0
        current[cid] = loc
        size += loc.length
    if current:
        out.append(current)
    return out


def _download_group(repo, conn: Connection, located: dict, progress=None) -> int:
    import threading
    batch, guard = repo.chunks.writer(), threading.Lock()

    def deliver(cid, data):
        with guard:
            batch.add(cid, data)
    try:
        received = transfer.fetch_chunks(conn.bucket, located, deliver, progress=progress)
        batch.seal()
    except BaseException:
        batch.abort()
        raise
    with repo.index.write() as txn:
        batch.publish(txn)
    return received


# -- pull and clone ------------------------------------------------------------------

def pull(repo, name: Optional[str] = None, branch: Optional[str] = None, progress=None) -> PullReport:
    """fetch, then fast-forward local ``branch`` (default HEAD's) to ``NAME/branch``.

    Raises Diverged (a RefConflict) when they have diverged (a pull only
    fast-forwards; ``Repository.merge`` can combine the two), ProtectedRef /
    LockHeld as a commit would.
    """
    report = fetch(repo, name, progress)
    with repo.index.write() as txn:
        if branch is None:
            head = repo.refs.head(txn)[0]
            if head is None:
                raise BadInput("HEAD is detached: name the branch to pull")
            branch = refnames.short_name(head)
        ref = refnames.BRANCHES + refnames.check_name(branch, "branch")
        tracking = txn.ref(REMOTES + report.remote + "/" + branch)
        if tracking is None:
            raise BadInput(f"remote {report.remote!r} has no branch {branch!r}")
        mine = repo.refs.tip(txn, ref)
        new = tracking.id
        if mine == new:
            return PullReport(report, branch, _hex(mine), _hex(new), "up to date")
        if mine is not None and not _is_ancestor(txn, repo.objects, mine, new):
            if _is_ancestor(txn, repo.objects, new, mine):
                return PullReport(report, branch, _hex(mine), _hex(mine), "up to date")
            raise Diverged(f"branch {branch!r} and {report.remote}/{branch} have diverged, and a pull only "
                           "fast-forwards", branch=branch, remote=report.remote)
        repo.refs.check_commit(txn, ref, locking.this_process(locking.default_author()))
        repo.refs.set_if_equals(txn, ref, mine, new, f"pull: {report.remote}/{branch}")
    return PullReport(report, branch, _hex(mine), new.hex(), "new" if mine is None else "fast-forward")


def clone(repo_cls, url: str, path, lazy: bool = False, endpoint_url: Optional[str] = None,
          name: str = "origin", progress=None) -> tuple:
    """(Repository, FetchReport): a new repository at ``path`` holding the remote's history.

    ``lazy``: metadata only; chunks stay on the remote until a version is
    read (the repository caches the remote). Checks out the remote's HEAD
    branch. A failed clone leaves nothing behind. An S3 clone with no
    ``endpoint_url`` keeps the endpoint the environment names
    (``AWS_ENDPOINT_URL``, see ``config.environment_endpoint``), so later
    fetches reach the same store without it.
    """
    if not isinstance(path, (str, Path)) or not str(path).strip():
        raise BadInput("clone needs a directory to clone into (an empty name would mean the current one)")
    if endpoint_url is None and url.startswith("s3://"):
        endpoint_url = config.environment_endpoint()
    if endpoint_url is not None:
        config.check_endpoint(endpoint_url)
    bucket = open_bucket(url, endpoint_url)
    try:
        raw = bucket.get(layout.MARKER)
        head = bucket.get_versioned(layout.HEAD)
    except NotFound:
        raise RemoteError(f"{url} holds no mvc remote (no {layout.MARKER}); push to it first") from None
    finally:
        bucket.close()
    chunk_size = layout.parse_marker(raw, url)
    target = Path(path)
    existed = target.exists()
    repo = repo_cls.init(target, chunk_size=chunk_size)
    try:
        with repo.index.write() as txn:
            config.add(txn, name, url, endpoint_url)
            if lazy:
                txn.put_meta(config.CACHE_REMOTE, name.encode())
        if lazy:  # reopened: the chunk store is chosen when a repository opens
            repo.close()
            repo = repo_cls(target)
        report = fetch(repo, name, progress)
        branch = layout.decode_head(head[0]) if head else None
        branch = refnames.short_name(branch) if branch else None
        with repo.index.write() as txn:
            tracking = txn.ref(REMOTES + name + "/" + branch) if branch else None
            if tracking is None:  # HEAD missing or naming no branch: main, else the first branch
                branches = sorted(ref[len(REMOTES + name) + 1:] for ref, _ in txn.refs(REMOTES + name + "/"))
                branch = "main" if "main" in branches else (branches[0] if branches else None)
                tracking = txn.ref(REMOTES + name + "/" + branch) if branch else None
            if tracking is None and txn.ref(refnames.TAGS) is None and not any(txn.refs(refnames.TAGS)):
                raise BadInput(f"{url} holds no branch or tag: nothing to clone")
            if tracking is not None:  # HEAD first: the branch's first move logs HEAD too, as git clone does
                repo.refs.attach(txn, refnames.BRANCHES + branch)
                repo.refs.set_if_equals(txn, refnames.BRANCHES + branch, None, tracking.id, f"clone: {url}")
        return repo, report
    except BaseException:
        repo.close()
        shutil.rmtree(target / ".mvc", ignore_errors=True)
        if not existed:
            shutil.rmtree(target, ignore_errors=True)
        raise

