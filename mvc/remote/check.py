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
from .. import reach
from ..errors import CorruptObject, MvcError
from ..objects import object_id
from ..store.chunks import Request
from ..store.packs import HEADER, RECORD_HEAD
from ..store import verify
from ..store.verify import intact as hashes_to
from . import config, layout, transfer
from .bucket import NotFound, RemoteError
from .catalogue import folder as catalogue_folder, read_trailer
from . import lease
from .connection import Connection, classify

MISSING_PACK, DAMAGED_PACK, BAD_RECORD, CHECKSUM = "missing-pack", "damaged-pack", verify.BAD_RECORD, verify.CHECKSUM
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
    unreferenced: tuple = ()  # (pack key, bytes) of intact packs no ref needs: harmless, 'gc --remote' reclaims them
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
    broken: dict = field(default_factory=dict)  # key of a pack with any problem -> {id: bytes} of its intact records
    listed: dict = field(default_factory=dict)  # key of such a pack -> the ids its trailer lists (None: unreadable)
    contents: dict = field(default_factory=dict)  # key of every readable pack -> (size, ids its trailer lists)
    needed: set = field(default_factory=set)  # ids the refs' closures use


def _salvage(data: bytes):
    """(id, bytes) of the records of a pack with a damaged trailer that hash to their id, read in
    order from the header until one is cut short."""
    view, at = memoryview(data), len(HEADER)
    if bytes(view[:at]) != HEADER:
        return
    while at + RECORD_HEAD.size <= len(view):
        cid, length = RECORD_HEAD.unpack(view[at:at + RECORD_HEAD.size])
        at += RECORD_HEAD.size
        if at + length > len(view):
            return
        if hashes_to(cid, view[at:at + length]):
            yield cid, view[at:at + length]
        at += length


def _check_pack(bucket, key: str, seen: _Seen, lock) -> None:
    try:
        data = bucket.get(key)
    except NotFound:
        with lock:
            seen.problems.append(RemoteProblem(MISSING_PACK, key, "it was listed but cannot be read"))
        return
    size = len(data)
    problems, good, intact = [], [], {}
    try:
        if data[:len(HEADER)] != HEADER:
            raise CorruptObject(f"remote pack {key} has no valid header")
        start, stop = layout.trailer_span(data[-layout.FOOTER.size:], size, key)
        entries = layout.parse_trailer(data[start:stop], data[-layout.FOOTER.size:], size, key)
    except CorruptObject as exc:
        problems.append(RemoteProblem(DAMAGED_PACK, key, str(exc)))
        entries = []
        for cid, piece in _salvage(data):  # records that prove themselves, for a repair to move
            intact[cid] = piece
    view = memoryview(data)
    for cid, offset, length in entries:  # judged as the local pack check judges a record (verify.record_fault)
        piece = view[offset:offset + length]
        fault = verify.record_fault(cid, length, view[offset - RECORD_HEAD.size:offset], piece)
        if fault == BAD_RECORD:
            problems.append(RemoteProblem(BAD_RECORD, f"record {cid.hex()[:12]} of {key}",
                                          f"the record header at offset {offset} does not name this id and length"))
        elif fault == CHECKSUM:
            problems.append(RemoteProblem(CHECKSUM, f"record {cid.hex()[:12]} of {key}",
                                          f"its {length} bytes at offset {offset} do not hash to its id "
                                          "(BLAKE3 mismatch)"))
        else:
            good.append((cid, bytes(piece) if key.startswith(layout.OBJECT_PACKS) else None))
            intact[cid] = piece
    with lock:
        if problems:
            seen.broken[key] = {cid: bytes(piece) for cid, piece in intact.items()}
            seen.listed[key] = {cid for cid, _, _ in entries} if entries else None
        seen.problems += problems
        if entries:
            seen.contents[key] = (size, {cid for cid, _, _ in entries})
        seen.bytes += size
        seen.packs += 1
        for cid, raw in good:
            if raw is None:
                seen.chunks.add(cid)
            else:
                seen.objects[cid] = raw


def _scan(bucket, group=None) -> tuple:
    """(_Seen, {ref key: tip}, protected ref keys, trusted pack keys) of the remote: every pack
    read whole and verified, except the chunk packs outside the read subset ``group`` (their
    trailers only: those are the trusted ones)."""
    from concurrent.futures import ThreadPoolExecutor
    keys = [key for folder in (layout.CHUNK_PACKS, layout.OBJECT_PACKS)
            for key, _ in bucket.list(folder) if layout.pack_name(key) is not None]
    trusted = [key for key in keys if group is not None and key.startswith(layout.CHUNK_PACKS)
               and not _audit.in_subset(layout.pack_name(key), group)]
    skip = set(trusted)
    seen, lock = _Seen(), threading.Lock()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda key: _check_pack(bucket, key, seen, lock), [k for k in keys if k not in skip]))
        list(pool.map(lambda key: _list_pack(bucket, key, seen, lock), trusted))
    refs, protected = {}, set()
    for key, _ in bucket.list(layout.REFS):
        raw = bucket.get_versioned(key)
        try:
            if raw is not None and not layout.is_tombstone(raw[0]):
                refs[key], flag = layout.decode_ref(raw[0], key)
                if flag:
                    protected.add(key)
        except CorruptObject as exc:
            seen.problems.append(RemoteProblem(BAD_REF, key, str(exc), (key,)))
    return seen, refs, protected, trusted


def fsck_remote(repo, name: Optional[str] = None, subset: Optional[str] = None) -> RemoteFsckReport:
    """Verify every pack and ref of a remote; never changes it. Raises RemoteError if it cannot be read
    or holds no mvc remote (RemoteVanished if this repository used it before).

    ``subset`` "N/T" (restic's --read-data-subset): re-hash only the chunk packs of group N
    of T (a pack's group is its name's first byte mod T, plus 1); the other chunk packs'
    trailers are read and verified and their chunks counted as present. Object packs
    are always read whole (the ref walk needs them). BadInput for a malformed subset.
    """
    group = _audit.parse_subset(subset) if subset is not None else None
    conn = Connection(repo, name)
    try:
        bucket = conn.bucket
        if conn.marker(create=False) is None:  # nothing there to verify: never "ok"
            if conn.known():
                raise conn.vanished()
            raise RemoteError(f"{bucket.url} holds no mvc remote (no {layout.MARKER}): nothing to check; push to "
                              "it first, or check the URL")
        seen, refs, protected, trusted = _scan(bucket, group)
        decoded, pruned = _decode(seen.objects)  # once, for every ref's walk
        for key, tip in sorted(refs.items()):
            _walk_ref(key, tip, seen, decoded, pruned)
        for kind, key, detail in _audit.remote_findings(repo, conn.name, refs, seen.objects, protected):
            seen.problems.append(RemoteProblem(kind, key, detail, (key,)))
        decoded_chunks = len(seen.chunks)
        seen.needed |= {oid for oid, raw in seen.objects.items()  # a needed commit's pruned note
                        if _is_note(raw, oid) and classify(raw, oid)[1]["commit"] in seen.needed}
        unreferenced = tuple((key, size) for key, (size, ids) in sorted(seen.contents.items())
                             if key not in seen.broken and not ids & seen.needed)
        return RemoteFsckReport(conn.name, bucket.url, seen.packs, decoded_chunks, len(seen.objects), len(refs),
                                seen.bytes, tuple(_merge(seen.problems)), unreferenced, subset or "", len(trusted))
    finally:
        conn.close()


def _is_note(raw: bytes, oid: bytes) -> bool:
    try:
        return classify(raw, oid)[0] == "pruned"
    except CorruptObject:
        return False


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


def _decode(objects: dict) -> tuple:
    """({id: (kind, object)}, {commit ids with a pruned note}) of ``objects`` {id: raw}; records
    that do not decode are left out (the pack check reported them)."""
    decoded, pruned = {}, set()
    for oid, raw in objects.items():
        try:
            kind, obj = classify(raw, oid)
        except CorruptObject:
            continue
        if kind == "pruned":
            pruned.add(obj["commit"])
        else:
            decoded[oid] = (kind, obj)
    return decoded, pruned


def _walk_ref(key: str, tip: bytes, seen: _Seen, decoded: dict, pruned: set) -> None:
    def need(kind: str, oid: bytes):
        seen.needed.add(oid)
        entry = decoded.get(oid)
        if entry is None or entry[0] != kind:
            seen.problems.append(RemoteProblem(MISSING_OBJECT, f"{kind[:-1]} {oid.hex()[:12]}",
                                               "no intact object pack holds it", (key,)))
            return None
        return entry[1]
    for cid, _ in reach.closure(need, [tip], pruned.__contains__):
        seen.needed.add(cid)
        if cid not in seen.chunks:
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


def fsck_fetch(repo, report):
    """``report`` (a local FsckReport) completed: the reachable chunks held only by the cached
    remote are read back and re-hashed; intact ones count as verified, the others become damage
    ("missing-chunk" / "checksum-mismatch" naming the remote pack). Raises RemoteError if the
    remote cannot be read (then nothing more was verified)."""
    import dataclasses
    from .. import fsck as local
    conn = Connection(repo, report.unverified_remote)
    try:
        conn.catalogue.refresh(conn.bucket)
        with repo.gc_lock.shared(), repo.index.read() as txn:
            ids = repo.chunks.remote_only(reach.walk(txn, repo.objects).chunk_length, txn)
        located = conn.catalogue.chunks(ids)
        bad = transfer.verify_chunks(conn.bucket, located)
    finally:
        conn.close()
    damage = [local.Damage(local.MISSING_CHUNK, f"chunk {cid.hex()[:12]}",
                           f"no listed pack of remote {conn.name!r} holds it", (cid.hex(),))
              for cid in sorted(ids - located.keys())]
    damage += [local.Damage(local.CHECKSUM, f"chunk {cid.hex()[:12]}", f"remote {conn.name!r}: {key}: {why}",
                            (cid.hex(),)) for cid, (key, why) in sorted(bad.items())]
    checked = sum(loc.length for cid, loc in located.items() if cid not in bad)
    return dataclasses.replace(report, damage=report.damage + tuple(damage), unverified=0, unverified_bytes=0,
                               unverified_remote=None, bytes_verified=report.bytes_verified + checked)


# -- repair ------------------------------------------------------------------------

@dataclass(frozen=True)
class RepairReport:
    chunks_repaired: int
    objects_repaired: int
    unrepaired: tuple  # hex ids nobody could supply
    remotes: tuple  # remotes asked
    after: object = None  # the fsck report after the repair
    failed: tuple = ()  # (remote, why) of each remote asked that could not be read: the next was tried


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


def restorable(repo, ids) -> dict:
    """{chunk id: remote name} of the ``ids`` some remote's last listing holds (the cached
    remote first), from the local catalogues: nothing is read from the remotes."""
    with repo.index.read() as txn:
        names, cached = config.names(txn), config.cache_remote(txn)
    found, wanted = {}, set(ids)
    for name in sorted(names, key=lambda n: n != cached):
        if not catalogue_folder(repo.dir, name).is_dir():
            continue  # never listed: nothing known of it (and a check must not make its folder)
        conn = Connection(repo, name)
        try:
            found.update(dict.fromkeys(conn.catalogue.chunks(wanted - found.keys()), name))
        finally:
            conn.close()
    return found


def _listed_counts(repo, names, ids: set) -> dict:
    """{remote: how many of ``ids`` its last listing holds}, from the local catalogues only."""
    out = {}
    for name in names:
        if not catalogue_folder(repo.dir, name).is_dir():
            continue
        conn = Connection(repo, name)
        try:
            out[name] = len(conn.catalogue.chunks(ids))
        finally:
            conn.close()
    return out


def repair(repo) -> RepairReport:
    """Refetch damaged or missing local chunks and objects from the remotes that hold them: the
    cached remote first, then those whose last listing holds the most of them (fsck names these), then
    the rest. A remote that cannot be read (never pushed to, away, damaged) is noted in
    ``failed`` and the next one is tried."""
    chunks, objects = _damaged(repo)
    with repo.index.read() as txn:
        names = config.names(txn)
        cached = config.cache_remote(txn)
    listed = _listed_counts(repo, names, chunks)
    names = sorted(names, key=lambda n: (n != cached, -listed.get(n, 0), n))
    fixed_chunks, fixed_objects, asked, failed = set(), set(), [], []
    for name in names:
        if not (chunks - fixed_chunks) and not (objects.keys() - fixed_objects):
            break
        asked.append(name)
        conn = Connection(repo, name)
        try:
            conn.catalogue.refresh(conn.bucket)
            fixed_chunks |= _repair_chunks(repo, conn, chunks - fixed_chunks)
            fixed_objects |= _repair_objects(repo, conn, {o: k for o, k in objects.items() if o not in fixed_objects})
        except MvcError as exc:  # this remote cannot help: another may
            failed.append((name, str(exc)))
        finally:
            conn.close()
    left = sorted(c.hex() for c in (chunks - fixed_chunks) | (objects.keys() - fixed_objects))
    return RepairReport(len(fixed_chunks), len(fixed_objects), tuple(left), tuple(asked), repo.fsck(), tuple(failed))


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


# -- remote repair -----------------------------------------------------------------

@dataclass(frozen=True)
class RemoteRepairReport:
    remote: str
    packs_checked: int
    chunks_uploaded: int  # from this repository's intact copies, or moved out of a damaged pack
    objects_uploaded: int
    packs_uploaded: int
    packs_removed: tuple  # keys of damaged or unreadable packs removed once their intact records were moved
    unrepaired: tuple  # hex ids the remote's refs need that neither side holds intact
    problems_before: int  # damaged packs and records, and needed ids no intact pack held
    packs_kept: tuple = ()  # keys of damaged packs left in place: they hold the only copy of something needed

    @property
    def ok(self) -> bool:
        return not self.unrepaired


def _needs(repo, txn, tips: list, remote_objects: dict) -> tuple:
    """({object id: kind}, {chunk id: length}, [ids found nowhere]) of the closures of ``tips``,
    reading each object from the remote's intact copy or, failing that, this repository's."""
    decoded, pruned = _decode(remote_objects)
    objects, lost = {}, []

    def get(kind: str, oid: bytes):
        objects[oid] = kind
        if oid in decoded and decoded[oid][0] == kind:
            return decoded[oid][1]
        try:
            return getattr(repo.objects, kind[:-1])(txn, oid)
        except MvcError:
            lost.append(oid)
            return None
    # only the remote's own pruned notes end a walk: a commit this repository's retention pruned
    # (record kept, data gone here) still needs its data on the remote, and a repair that skipped
    # it would call the remote healed while fsck --remote finds its data missing
    chunks = dict(reach.closure(get, tips, pruned.__contains__))
    return objects, chunks, lost


def _local_chunks(repo, wanted: dict) -> dict:
    """{id: bytes} of the chunks among ``wanted`` {id: length} this repository holds intact."""
    store = getattr(repo.chunks, "local", repo.chunks)
    out = {}
    with repo.index.read() as txn:
        for cid, n in wanted.items():
            if txn.chunk(cid) is None:
                continue
            buffer = bytearray(n)
            try:
                store.read([Request(cid, buffer, "a chunk to repair the remote with")], txn)
            except MvcError:  # damaged here too: not a copy to heal with
                continue
            out[cid] = bytes(buffer)
    return out


def repair_remote(repo, name: Optional[str] = None) -> RemoteRepairReport:
    """Heal remote ``name`` from this repository: read every remote pack; upload again (in new packs)
    every chunk and object its refs need that no intact pack holds and this repository holds
    intact; remove each damaged pack whose damaged records are healed that way (or needed by
    nothing), after moving its intact records to a new pack, and each pack no reader can parse
    (a zero-byte ``packs/….pack``). New packs are durable before anything is removed; a damaged
    pack that still holds the only copy of something needed is kept, its intact records usable.

    Holds the remote's gc lease (``RemoteBusy`` while a gc or push holds one). Raises RemoteError.
    """
    conn = Connection(repo, name)
    try:
        if conn.marker(create=False) is None:  # and a layout this mvc does not read is refused here
            raise conn.vanished() if conn.known() else \
                RemoteError(f"{conn.info.url} holds no mvc remote (no {layout.MARKER}); nothing was changed")
        with lease.held(conn, lease.GC) as lease_:
            seen, refs, _, _ = _scan(conn.bucket)
            salvaged = {i: raw for key, records in seen.broken.items() if seen.listed.get(key) is None
                        for i, raw in records.items()}  # from packs no reader can parse: usable only if moved
            with repo.gc_lock.shared(), repo.index.read() as txn:
                objects, chunks, lost = _needs(repo, txn, list(refs.values()), {**seen.objects, **salvaged})
                local_objects = {oid: bytes(txn.get(kind, oid)) for oid, kind in objects.items()
                                 if oid not in seen.objects and oid not in salvaged
                                 and txn.get(kind, oid) is not None and object_id(txn.get(kind, oid)) == oid}
            lacking = {cid: n for cid, n in chunks.items() if cid not in seen.chunks and cid not in salvaged}
            supplied = _local_chunks(repo, lacking)
            healed, needed = supplied.keys() | local_objects.keys(), chunks.keys() | objects.keys()
            # a damaged record is healed by this run's upload, or by an intact copy in another pack (a
            # repair killed after its upload and before the delete left one): either way the pack can go
            elsewhere = seen.chunks | seen.objects.keys()
            doomed = [key for key in seen.broken
                      if seen.listed.get(key) is None
                      or all(i in healed or i in elsewhere or i not in needed
                             for i in seen.listed[key] - seen.broken[key].keys())]
            def moved(folder: str) -> dict:  # the intact records of the doomed packs, to new packs of their kind
                return {i: raw for key in doomed if key.startswith(folder) for i, raw in seen.broken[key].items()}
            upload = {**moved(layout.CHUNK_PACKS), **supplied}
            rescued = {**moved(layout.OBJECT_PACKS), **local_objects}  # pruned notes included
            packs = 0
            with repo.gc_lock.shared():
                if upload:
                    packs += transfer.upload_records(conn.bucket, conn.catalogue, layout.CHUNK_PACKS,
                                                     list(upload.items()))[0]
                if rescued:
                    packs += transfer.upload_records(conn.bucket, conn.catalogue, layout.OBJECT_PACKS,
                                                     list(rescued.items()))[0]
            removed = _remove_broken(conn, doomed, lease_)
            conn.catalogue.refresh(conn.bucket)
        left = [cid.hex() for cid in lacking if cid not in supplied]
        left += [oid.hex() for oid in objects if oid not in seen.objects and oid not in salvaged
                 and oid not in local_objects]
        left += [oid.hex() for oid in lost]
        missing = len(lacking) + sum(1 for oid in objects if oid not in seen.objects)
        return RemoteRepairReport(conn.name, seen.packs, len(upload), len(rescued), packs, tuple(removed),
                                  tuple(sorted(set(left))), len(seen.problems) + missing,
                                  tuple(sorted(set(seen.broken) - set(removed))))
    finally:
        conn.close()


def _remove_broken(conn, doomed: list, lease_) -> list:
    """Delete the damaged packs in ``doomed`` once a second read shows the same damage (a bad read
    in transit must not cost a pack); the keys removed. Their intact records are durable
    elsewhere by now."""
    removed = []
    for key in sorted(doomed):
        again = _Seen()
        _check_pack(conn.bucket, key, again, threading.Lock())
        if key not in again.broken:
            continue
        lease_.check()
        conn.bucket.delete(key)
        removed.append(key)
    return removed
