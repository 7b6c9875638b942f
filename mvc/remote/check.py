"""Checking a remote (``mvc fsck --remote NAME``) and repairing local damage from one (``fsck --repair``).

A remote check reads every pack object whole, checks its header, trailer
and record headers, and re-hashes every record against its id; then it
walks every remote ref's closure through the object packs and says which
commit, tree, tensor or chunk a ref needs that no intact pack holds. It
never changes the remote.

A repair runs the local fsck, and for every damaged or missing chunk and
object it finds, reads an intact copy from a remote that holds one
(verified on arrival), writes chunks to a new local pack and points the
index at it, stores objects again; then it checks once more.
"""

import threading
from dataclasses import dataclass, field
from typing import Optional

from .. import audit as _audit
from .. import hashing, reach
from ..errors import CorruptObject
from ..objects import TensorLeaf
from ..store.packs import HEADER, RECORD_HEAD
from ..traverse import walk as walk_tree
from . import config, layout, transfer
from .bucket import NotFound
from .catalogue import read_trailer
from .sync import Connection, _classify

MISSING_PACK, DAMAGED_PACK, BAD_RECORD, CHECKSUM = "missing-pack", "damaged-pack", "bad-record-header", "checksum-mismatch"
MISSING_OBJECT, MISSING_CHUNK, BAD_REF = "missing-object", "missing-chunk", "damaged-ref"


@dataclass(frozen=True)
class RemoteProblem:
    kind: str
    object: str  # what is broken: "packs/1a2b….pack", "chunk 1a2b3c4d5e6f", "refs/heads/main"
    detail: str
    refs: tuple = ()  # remote refs that need it


@dataclass(frozen=True)
class RemoteFsckReport:
    remote: str
    url: str
    packs: int
    chunks: int
    objects: int
    refs: int
    bytes_verified: int
    problems: tuple = ()
    subset: str = ""  # "N/T" of --read-subset: only that group of chunk packs was re-hashed ...
    packs_trusted: int = 0  # ... the others' chunks counted from their (verified) trailers

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class _Seen:
    chunks: set = field(default_factory=set)
    objects: dict = field(default_factory=dict)  # id -> bytes
    problems: list = field(default_factory=list)
    bytes: int = 0
    packs: int = 0


def _check_pack(bucket, key: str, seen: _Seen, lock) -> None:
    try:
        data = bucket.get(key)
    except NotFound:
        with lock:
            seen.problems.append(RemoteProblem(MISSING_PACK, key, "it was listed but cannot be read"))
        return
    size = len(data)
    problems, good = [], []
    try:
        if data[:len(HEADER)] != HEADER:
            raise CorruptObject(f"remote pack {key} has no valid header")
        start, stop = layout.trailer_span(data[-layout.FOOTER.size:], size, key)
        entries = layout.parse_trailer(data[start:stop], data[-layout.FOOTER.size:], size, key)
    except CorruptObject as exc:
        problems.append(RemoteProblem(DAMAGED_PACK, key, str(exc)))
        entries = []
    view = memoryview(data)
    for cid, offset, length in entries:
        head = bytes(view[offset - RECORD_HEAD.size:offset])
        piece = view[offset:offset + length]
        if RECORD_HEAD.unpack(head) != (cid, length):
            problems.append(RemoteProblem(BAD_RECORD, f"record {cid.hex()[:12]} of {key}",
                                          f"the record header at offset {offset} does not name this id and length"))
        elif hashing.digest(piece) != cid:
            problems.append(RemoteProblem(CHECKSUM, f"record {cid.hex()[:12]} of {key}",
                                          f"its {length} bytes at offset {offset} do not hash to its id "
                                          "(BLAKE3 mismatch)"))
        else:
            good.append((cid, bytes(piece) if key.startswith(layout.OBJECT_PACKS) else None))
    with lock:
        seen.problems += problems
        seen.bytes += size
        seen.packs += 1
        for cid, raw in good:
            if raw is None:
                seen.chunks.add(cid)
            else:
                seen.objects[cid] = raw


def fsck_remote(repo, name: Optional[str] = None, subset: Optional[str] = None) -> RemoteFsckReport:
    """Verify every pack and ref of a remote; never changes it. Raises RemoteError if it cannot be read.

    ``subset`` "N/T" (restic's --read-data-subset): re-hash only the chunk packs of group N
    of T (a pack's group is its name's first byte mod T, plus 1); the other chunk packs'
    trailers are read and verified and their chunks counted as present. Object packs
    are always read whole (the ref walk needs them). BadInput for a malformed subset.
    """
    from concurrent.futures import ThreadPoolExecutor
    group = _audit.parse_subset(subset) if subset is not None else None
    conn = Connection(repo, name)
    try:
        bucket = conn.bucket
        keys = [key for folder in (layout.CHUNK_PACKS, layout.OBJECT_PACKS)
                for key, _ in bucket.list(folder) if layout.pack_name(key) is not None]
        seen, lock = _Seen(), threading.Lock()
        trusted = [key for key in keys if group is not None and key.startswith(layout.CHUNK_PACKS)
                   and not _audit.in_subset(layout.pack_name(key), group)]
        skip = set(trusted)
        keys = [key for key in keys if key not in skip]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda key: _check_pack(bucket, key, seen, lock), keys))
            list(pool.map(lambda key: _list_pack(bucket, key, seen, lock), trusted))
        refs, protected = {}, set()
        for key, _ in bucket.list(layout.REFS):
            raw = bucket.get_versioned(key)
            try:
                if raw is not None:
                    refs[key], flag = layout.decode_ref(raw[0], key)
                    if flag:
                        protected.add(key)
            except CorruptObject as exc:
                seen.problems.append(RemoteProblem(BAD_REF, key, str(exc), (key,)))
        for key, tip in sorted(refs.items()):
            _walk_ref(key, tip, seen)
        for kind, key, detail in _audit.remote_findings(repo, conn.name, refs, seen.objects, protected):
            seen.problems.append(RemoteProblem(kind, key, detail, (key,)))
        decoded_chunks = len(seen.chunks)
        return RemoteFsckReport(conn.name, bucket.url, seen.packs, decoded_chunks, len(seen.objects), len(refs),
                                seen.bytes, tuple(_merge(seen.problems)), subset or "", len(trusted))
    finally:
        conn.close()


def _list_pack(bucket, key: str, seen: _Seen, lock) -> None:
    """A chunk pack outside the read subset: its trailer (verified), not its records."""
    try:
        entries = read_trailer(bucket, key)
    except (NotFound, CorruptObject) as exc:
        with lock:
            seen.problems.append(RemoteProblem(DAMAGED_PACK, key, str(exc)))
        return
    with lock:
        seen.chunks.update(cid for cid, _, _ in entries)


def _walk_ref(key: str, tip: bytes, seen: _Seen) -> None:
    pruned = set()
    decoded = {}
    for oid, raw in seen.objects.items():
        try:
            kind, obj = _classify(raw, oid)
        except CorruptObject:
            continue
        if kind == "pruned":
            pruned.add(obj["commit"])
        else:
            decoded[oid] = (kind, obj)

    def need(kind: str, oid: bytes):
        entry = decoded.get(oid)
        if entry is None or entry[0] != kind:
            seen.problems.append(RemoteProblem(MISSING_OBJECT, f"{kind[:-1]} {oid.hex()[:12]}",
                                               "no intact object pack holds it", (key,)))
            return None
        return entry[1]
    todo, visited = [tip], set()
    while todo:
        oid = todo.pop()
        if oid in visited:
            continue
        visited.add(oid)
        commit = need("commits", oid)
        if commit is None:
            continue
        todo += commit.parents
        if oid in pruned or commit.tree in visited:
            continue
        visited.add(commit.tree)
        tree = need("trees", commit.tree)
        if tree is None:
            continue
        for _, leaf in walk_tree(tree.root):
            if isinstance(leaf, TensorLeaf) and leaf.id not in visited:
                visited.add(leaf.id)
                tensor = need("tensors", leaf.id)
                for cid in (tensor.chunks if tensor else ()):
                    if cid not in seen.chunks and cid not in visited:
                        visited.add(cid)
                        seen.problems.append(RemoteProblem(MISSING_CHUNK, f"chunk {cid.hex()[:12]}",
                                                           "no intact chunk pack holds it", (key,)))


def _merge(problems: list) -> list:
    """One problem per broken thing, with every ref that needs it."""
    out: dict = {}
    for p in problems:
        if p.object in out:
            old = out[p.object]
            out[p.object] = RemoteProblem(old.kind, old.object, old.detail, tuple(sorted(set(old.refs) | set(p.refs))))
        else:
            out[p.object] = p
    return list(out.values())


# -- repair ------------------------------------------------------------------------

@dataclass(frozen=True)
class RepairReport:
    chunks_repaired: int
    objects_repaired: int
    unrepaired: tuple  # hex ids nobody could supply
    remotes: tuple  # remotes asked
    after: object = None  # the fsck report after the repair


def _damaged(repo) -> tuple:
    """(chunk ids, {object id: kind}) the local fsck finds damaged or missing."""
    report = repo.fsck()
    chunks = {bytes.fromhex(c) for d in report.damage for c in d.chunks}
    objects = {}
    with repo.gc_lock.shared(), repo.index.read() as txn:
        for finding in reach.walk(txn, repo.objects).findings:
            for kind, ids in (("commits", finding.commits), ("trees", finding.trees), ("tensors", finding.tensors)):
                if finding.kind.endswith(kind[:-1]):
                    objects.update({oid: kind for oid in ids})
    return chunks, objects


def repair(repo) -> RepairReport:
    """Refetch damaged or missing local chunks and objects from the remotes that hold them."""
    chunks, objects = _damaged(repo)
    with repo.index.read() as txn:
        names = config.names(txn)
        cached = config.cache_remote(txn)
    names = sorted(names, key=lambda n: n != cached)
    fixed_chunks, fixed_objects, asked = set(), set(), []
    for name in names:
        if not (chunks - fixed_chunks) and not (objects.keys() - fixed_objects):
            break
        asked.append(name)
        conn = Connection(repo, name)
        try:
            conn.catalogue.refresh(conn.bucket)
            fixed_chunks |= _repair_chunks(repo, conn, chunks - fixed_chunks)
            fixed_objects |= _repair_objects(repo, conn, {o: k for o, k in objects.items() if o not in fixed_objects})
        finally:
            conn.close()
    left = sorted(c.hex() for c in (chunks - fixed_chunks) | (objects.keys() - fixed_objects))
    return RepairReport(len(fixed_chunks), len(fixed_objects), tuple(left), tuple(asked), repo.fsck())


def _repair_chunks(repo, conn: Connection, wanted: set) -> set:
    located = conn.catalogue.chunks(wanted)
    if not located:
        return set()
    store = getattr(repo.chunks, "local", repo.chunks)
    batch, guard = store.writer(), threading.Lock()

    def deliver(cid, data):
        with guard:
            batch.add(cid, data)
    with repo.gc_lock.shared():
        try:
            transfer.fetch_chunks(conn.bucket, located, deliver)
            batch.seal()
        except BaseException:
            batch.abort()
            raise
        with repo.index.write() as txn:
            for cid, loc in batch.locations.items():
                txn.put_chunk(cid, loc, overwrite=True)
    return set(batch.locations)


def _repair_objects(repo, conn: Connection, wanted: dict) -> set:
    if not wanted:
        return set()
    found = {}
    for key, ids in conn.catalogue.object_packs().items():
        if wanted.keys() & set(ids):
            records = transfer.read_pack_records(conn.bucket, key, read_trailer(conn.bucket, key))
            found.update({oid: data for oid, data in records.items() if oid in wanted})
    with repo.index.write() as txn:
        for oid, data in found.items():
            txn.delete(wanted[oid], oid)
            txn.put(wanted[oid], oid, data)
    return set(found)
