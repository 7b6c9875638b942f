"""fsck: prove that everything a user can reach is present and intact.

Vocabulary:

- **root**: a commit that a ref (``HEAD``, ``heads/*``, ``tags/*``) names, or
  that a reflog entry names as its old or new id. Roots are labelled with
  the ref's name, reflog roots as ``reflog:<ref>``.
- **reachable**: a root, a parent of a reachable commit, and the tree,
  tensors and chunks of a reachable commit that gc retention has not
  pruned (a pruned commit keeps only its record). fsck checks exactly these.
- **damage**: something reachable that is missing, does not decode, does not
  hash to its id, or whose bytes are not intact inside a sealed pack. Each
  ``Damage`` names the broken thing and what it breaks in user terms: chunk
  ids, tensor key paths, commits and refs.
- **unreferenced**: pack bytes that nothing reachable uses: ``.pack.tmp``
  files a crash left, records of sealed packs that no reachable chunk is
  indexed at, packs the index does not name. Harmless; gc reclaims them.

A full check reads every reachable chunk record (header and data) from its
pack and re-hashes the data with BLAKE3 in parallel threads; ``quick``
checks only the structure (objects, index entries, pack trailers).
"""

import os
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from . import encoding, hashing, locks
from .errors import CorruptObject
from .index import Txn
from .objects import CommitObject, TensorLeaf, TensorObject, TreeObject, format_path, object_id, walk
from .packs import PACK_NAME, RECORD_HEAD, TMP_NAME, Location, PackWriter, pack_filename, read_trailer, salvage_records

REFLOG = "reflog:"
SPAN_BYTES = 1 << 20  # read with one pread: small enough to be hashed while still in the CPU cache
MAX_GAP = 64 << 10  # unreachable bytes between two records worth reading through
TASK_BYTES = 16 << 20  # handed to a thread at a time: amortises the pool's per-task overhead

# Kinds of damage, as they appear in reports.
MISSING_COMMIT, CORRUPT_COMMIT = "missing-commit", "corrupt-commit"
MISSING_TREE, CORRUPT_TREE = "missing-tree", "corrupt-tree"
MISSING_TENSOR, CORRUPT_TENSOR = "missing-tensor", "corrupt-tensor"
MISSING_CHUNK, BAD_INDEX_ENTRY = "missing-chunk", "bad-index-entry"
MISSING_PACK, DAMAGED_PACK = "missing-pack", "damaged-pack"
NOT_IN_PACK, BAD_RECORD, CHECKSUM = "chunk-not-in-pack", "bad-record-header", "checksum-mismatch"
CORRUPT_REF, CORRUPT_REFLOG = "corrupt-ref", "corrupt-reflog"

# Kinds of unreferenced pack bytes.
TMP_PACK, UNUSED_RECORDS, UNUSED_PACK = "tmp-pack", "unused-records", "unused-pack"
UNINDEXED_PACK, UNREACHABLE_DAMAGED_PACK = "unindexed-pack", "damaged-pack"


@dataclass(frozen=True)
class Damage:
    """One broken thing and what it breaks (ids are hex; refs are ref names)."""

    kind: str
    object: str  # what is broken, e.g. "chunk 1a2b3c4d5e6f"
    detail: str  # what is wrong with it
    chunks: tuple = ()
    tensors: tuple = ()  # key paths of the tensors that hold it
    commits: tuple = ()
    refs: tuple = ()


@dataclass(frozen=True)
class Unreferenced:
    """Pack bytes nothing reachable uses; harmless, reclaimable by gc."""

    kind: str
    pack: str  # file name in .mvc/packs
    records: int
    bytes: int


@dataclass(frozen=True)
class FsckReport:
    quick: bool
    commits: int
    trees: int
    tensors: int
    chunks: int
    packs: int
    bytes_verified: int
    seconds: float
    damage: tuple = ()
    unreferenced: tuple = ()

    @property
    def ok(self) -> bool:
        """True when nothing reachable is damaged (unreferenced bytes are fine)."""
        return not self.damage

    @property
    def unreferenced_bytes(self) -> int:
        return sum(u.bytes for u in self.unreferenced)


@dataclass(frozen=True)
class RebuildReport:
    packs: int  # sealed packs whose trailers were read
    chunks: int  # chunk ids now in the index
    duplicates: int  # records skipped because another pack's record of that id was indexed first
    dropped: int  # entries the old chunk index held
    skipped: tuple = ()  # (pack file name, reason) for packs whose trailer is damaged
    salvaged: int = 0  # verified records copied out of damaged packs into a new sealed pack


@dataclass
class _Finding:
    """Damage before its consequences are worked out (binary ids)."""

    kind: str
    object: str
    detail: str
    chunks: set = field(default_factory=set)
    tensors: set = field(default_factory=set)
    trees: set = field(default_factory=set)
    commits: set = field(default_factory=set)
    refs: set = field(default_factory=set)


@dataclass
class _Pack:
    """A file in .mvc/packs: its size and, if sealed and intact, its records by offset."""

    path: Path
    size: int
    records: Optional[dict] = None  # offset -> (chunk id, length)
    error: str = ""


def _short(oid: bytes) -> str:
    return oid.hex()[:12]


def _chunks(n: int) -> str:
    return f"{n} reachable chunk{'' if n == 1 else 's'}"


def scan_packs(directory: Path) -> tuple:
    """({pack name: _Pack} of sealed packs, [(file name, size)] of .tmp leftovers)."""
    packs, tmps = {}, []
    if not Path(directory).is_dir():  # every pack is missing: the findings will say what that breaks
        return packs, tmps
    for path in sorted(Path(directory).iterdir()):
        try:
            size = path.stat().st_size
        except FileNotFoundError:  # a commit renamed its .tmp pack meanwhile: seen under its new name
            continue
        if TMP_NAME.fullmatch(path.name):
            tmps.append((path.name, size))
            continue
        match = PACK_NAME.fullmatch(path.name)
        if not match:
            continue
        pack = _Pack(path, size)
        try:
            pack.records = {off: (cid, n) for cid, off, n in read_trailer(path)}
        except CorruptObject as exc:
            pack.error = str(exc)
        packs[bytes.fromhex(match.group(1))] = pack
    return packs, tmps


class _Checker:
    """The state of one fsck run: what is reachable, where it is used, what is broken."""

    def __init__(self):
        self.findings: list = []
        self.roots = defaultdict(set)  # label -> commit ids
        self.parents: dict = {}  # commit id -> parent ids (present commits only)
        self.tree_commits = defaultdict(set)
        self.tensor_trees = defaultdict(set)
        self.tensor_paths = defaultdict(set)
        self.chunk_tensors = defaultdict(set)
        self.chunk_length: dict = {}
        self.locations: dict = {}  # reachable chunk id -> Location
        self.n_trees = self.n_tensors = 0

    def find(self, kind, what, detail, **where) -> None:
        self.findings.append(_Finding(kind, what, detail, **{k: set(v) for k, v in where.items()}))

    # -- roots -------------------------------------------------------------

    def collect_roots(self, txn: Txn) -> None:
        for key in txn.ids("refs"):
            name = key.decode("utf-8", "replace")
            oid = self._ref_target(txn, name)
            if oid is not None:
                self.roots[name].add(oid)
        for name, _, raw in txn.reflog_raw():
            try:
                entry = encoding.unpack(raw, f"reflog entry of {name}")
                ids = [entry.get(k) for k in ("old", "new")] if type(entry) is dict else [b""]
                if not all(i is None or (type(i) is bytes and len(i) == 32) for i in ids):
                    raise CorruptObject(f"reflog entry of {name} does not name commits")
            except CorruptObject as exc:
                self.find(CORRUPT_REFLOG, f"reflog of {name}", str(exc), refs={REFLOG + name})
                continue
            self.roots[REFLOG + name].update(i for i in ids if i is not None)

    def _ref_target(self, txn: Txn, name: str) -> Optional[bytes]:
        try:
            value = txn.ref(name)
            if value.target is not None:  # symbolic: HEAD on a branch (maybe unborn)
                target = txn.ref(value.target)
                return target.id if target is not None and target.target is None else None
            return value.id
        except CorruptObject as exc:
            self.find(CORRUPT_REF, f"ref {name}", str(exc), refs={name})
            return None

    # -- objects -----------------------------------------------------------

    def _object(self, txn: Txn, kind: str, oid: bytes, cls, missing: str, corrupt: str, **where):
        """The decoded object, or None after recording why it cannot be used."""
        noun = kind[:-1]
        data = txn.get(kind, oid)
        if data is None:
            self.find(missing, f"{noun} {_short(oid)}", f"the {noun} object is missing from the index", **where)
            return None
        try:
            obj = cls.decode(data)
        except CorruptObject as exc:
            self.find(corrupt, f"{noun} {_short(oid)}", str(exc), **where)
            return None
        if object_id(data) != oid:
            self.find(corrupt, f"{noun} {_short(oid)}", f"the {noun} object's bytes do not hash to its id", **where)
            return None
        return obj

    def walk_commits(self, txn: Txn) -> None:
        seen = set().union(*self.roots.values())
        todo = list(seen)
        while todo:
            oid = todo.pop()
            obj = self._object(txn, "commits", oid, CommitObject, MISSING_COMMIT, CORRUPT_COMMIT, commits={oid})
            if obj is None:
                continue
            self.parents[oid] = obj.parents
            if not self._pruned(txn, oid):  # gc retention deleted a pruned commit's tree on purpose
                self.tree_commits[obj.tree].add(oid)
            for parent in obj.parents:
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)

    def _pruned(self, txn: Txn, oid: bytes) -> bool:
        try:
            return txn.pruned(oid) is not None
        except CorruptObject as exc:  # then check the tree as if it were not pruned
            self.find(CORRUPT_COMMIT, f"commit {_short(oid)}", str(exc), commits={oid})
            return False

    def walk_trees(self, txn: Txn) -> None:
        for tid in list(self.tree_commits):
            tree = self._object(txn, "trees", tid, TreeObject, MISSING_TREE, CORRUPT_TREE, trees={tid})
            if tree is None:
                continue
            self.n_trees += 1
            try:
                leaves = [(p, leaf) for p, leaf in walk(tree.root) if isinstance(leaf, TensorLeaf)]
            except RecursionError:
                self.find(CORRUPT_TREE, f"tree {_short(tid)}", "the tree is nested too deeply", trees={tid})
                continue
            for path, leaf in leaves:
                self.tensor_trees[leaf.id].add(tid)
                self.tensor_paths[leaf.id].add(format_path(path) or "<root>")

    def walk_tensors(self, txn: Txn) -> None:
        for tid in list(self.tensor_trees):
            obj = self._object(txn, "tensors", tid, TensorObject, MISSING_TENSOR, CORRUPT_TENSOR, tensors={tid})
            if obj is None:
                continue
            self.n_tensors += 1
            for cid, _, length in obj.chunk_spans():
                self.chunk_tensors[cid].add(tid)
                self.chunk_length.setdefault(cid, length)

    def locate_chunks(self, txn: Txn) -> None:
        for cid, length in self.chunk_length.items():
            what = f"chunk {_short(cid)}"
            try:
                loc = txn.chunk(cid)
            except CorruptObject as exc:
                self.find(BAD_INDEX_ENTRY, what, str(exc), chunks={cid})
                continue
            if loc is None:
                self.find(MISSING_CHUNK, what, "the chunk is missing from the chunk index", chunks={cid})
            elif loc.length != length:
                self.find(BAD_INDEX_ENTRY, what, f"the index gives it {loc.length} bytes, its tensor needs "
                          f"{length}", chunks={cid})
            else:
                self.locations[cid] = loc

    # -- packs -------------------------------------------------------------

    def check_packed(self, packs: dict) -> list:
        """The (chunk id, Location) pairs whose pack lists them; the rest become findings."""
        ok, missing, damaged = [], defaultdict(set), defaultdict(set)
        for cid, loc in self.locations.items():
            pack = packs.get(loc.pack)
            if pack is None:
                missing[loc.pack].add(cid)
            elif pack.records is None:
                damaged[loc.pack].add(cid)
            elif pack.records.get(loc.offset) != (cid, loc.length):
                self.find(NOT_IN_PACK, f"chunk {_short(cid)}", f"sealed pack {pack_filename(loc.pack)} does "
                          f"not list it at offset {loc.offset}", chunks={cid})
            else:
                ok.append((cid, loc))
        for name, cids in missing.items():
            self.find(MISSING_PACK, f"pack {pack_filename(name)}", f"the pack file is missing; it held "
                      f"{_chunks(len(cids))}", chunks=cids)
        for name, cids in damaged.items():
            self.find(DAMAGED_PACK, f"pack {pack_filename(name)}", f"{packs[name].error}; it holds "
                      f"{_chunks(len(cids))}", chunks=cids)
        return ok

    def unreferenced(self, packs: dict, tmps: list, indexed_packs: set) -> list:
        used = {(loc.pack, loc.offset) for loc in self.locations.values()}
        out = [Unreferenced(TMP_PACK, name, 0, size) for name, size in tmps]
        for name, pack in packs.items():
            fname = pack_filename(name)
            if pack.records is None:
                if not any(loc.pack == name for loc in self.locations.values()):
                    out.append(Unreferenced(UNREACHABLE_DAMAGED_PACK, fname, 0, pack.size))
                continue
            if name not in indexed_packs:
                out.append(Unreferenced(UNINDEXED_PACK, fname, len(pack.records), pack.size))
                continue
            unused = [n for off, (_, n) in pack.records.items() if (name, off) not in used]
            if unused and len(unused) == len(pack.records):
                out.append(Unreferenced(UNUSED_PACK, fname, len(unused), pack.size))
            elif unused:
                out.append(Unreferenced(UNUSED_RECORDS, fname, len(unused),
                                        sum(n + RECORD_HEAD.size for n in unused)))
        return out

    # -- consequences ------------------------------------------------------

    def _reach(self) -> dict:
        """{label: set of commit ids reachable from that label's roots}."""
        out = {}
        for label, ids in self.roots.items():
            seen, todo = set(ids), list(ids)
            while todo:
                for parent in self.parents.get(todo.pop(), ()):
                    if parent not in seen:
                        seen.add(parent)
                        todo.append(parent)
            out[label] = seen
        return out

    def damage(self) -> tuple:
        reach = self._reach() if self.findings else {}
        return tuple(self._consequences(f, reach) for f in self.findings)

    def _consequences(self, f: _Finding, reach: dict) -> Damage:
        tensors = set(f.tensors)
        for cid in f.chunks:
            tensors |= self.chunk_tensors.get(cid, set())
        trees = set(f.trees)
        paths = set()
        for tid in tensors:
            trees |= self.tensor_trees.get(tid, set())
            paths |= self.tensor_paths.get(tid, set())
        commits = set(f.commits)
        for tid in trees:
            commits |= self.tree_commits.get(tid, set())
        labels = set(f.refs) | {label for label, ids in reach.items() if ids & commits}
        # a ref's reflog adds nothing when the ref itself reaches the damage
        labels = {x for x in labels if not (x.startswith(REFLOG) and x[len(REFLOG):] in labels)}
        return Damage(f.kind, f.object, f.detail, tuple(sorted(c.hex() for c in f.chunks)),
                      tuple(sorted(paths)), tuple(sorted(c.hex() for c in commits)), tuple(sorted(labels)))


# -- re-hashing ---------------------------------------------------------------

def _spans(jobs: list) -> list:
    """Group (chunk id, Location) pairs into runs read with one pread each.

    A span is (pack name, start, end, jobs); it starts at the first record's
    header so headers are checked too.
    """
    spans, current = [], None
    for cid, loc in sorted(jobs, key=lambda j: (j[1].pack, j[1].offset)):
        head = loc.offset - RECORD_HEAD.size
        end = loc.offset + loc.length
        if (current is None or current[0] != loc.pack or head - current[2] > MAX_GAP
                or end - current[1] > SPAN_BYTES):
            current = [loc.pack, head, end, []]
            spans.append(current)
        current[2] = max(current[2], end)
        current[3].append((cid, loc))
    return spans


def _tasks(spans: list) -> list:
    """Spans grouped into lists of about TASK_BYTES."""
    tasks, current, size = [], [], 0
    for span in spans:
        current.append(span)
        size += span[2] - span[1]
        if size >= TASK_BYTES:
            tasks.append(current)
            current, size = [], 0
    return tasks + [current] if current else tasks


def _verify_spans(directory: Path, spans: list, threads: int, progress) -> tuple:
    """Read and re-hash every span in threads; ([(kind, chunk id, detail)], bytes hashed)."""
    fds = {}
    try:
        for name in {s[0] for s in spans}:
            fds[name] = os.open(directory / pack_filename(name), os.O_RDONLY)
        local = threading.local()  # one read buffer per thread, reused across spans

        def verify(task):
            size = max(span[2] - span[1] for span in task)
            if len(getattr(local, "buf", b"")) < size:
                local.buf = bytearray(max(SPAN_BYTES + MAX_GAP, size))
            buf = memoryview(local.buf)
            return [p for span in task for p in _verify_span(fds[span[0]], span, buf)]

        problems, done = [], 0
        total = sum(loc.length for s in spans for _, loc in s[3])
        tasks = _tasks(spans)
        with ThreadPoolExecutor(threads) as pool:
            for task, found in zip(tasks, pool.map(verify, tasks)):
                problems += found
                done += sum(loc.length for span in task for _, loc in span[3])
                if progress:
                    progress(done, total)
        return problems, done
    finally:
        for fd in fds.values():
            os.close(fd)


def _verify_span(fd: int, span: list, buf: memoryview) -> list:
    name, start, end, jobs = span
    view = buf[:end - start]
    got = os.preadv(fd, [view], start)
    problems = []
    for cid, loc in jobs:
        at = loc.offset - start
        if at + loc.length > got:
            problems.append((DAMAGED_PACK, cid, f"pack {pack_filename(name)} ends before offset {loc.offset}"))
        elif RECORD_HEAD.unpack(view[at - RECORD_HEAD.size:at]) != (cid, loc.length):
            problems.append((BAD_RECORD, cid, f"the record header before offset {loc.offset} in "
                             f"{pack_filename(name)} does not name this chunk and length"))
        elif hashing.digest(view[at:at + loc.length]) != cid:
            problems.append((CHECKSUM, cid, f"its {loc.length} bytes at offset {loc.offset} in "
                             f"{pack_filename(name)} do not hash to its id (BLAKE3 mismatch)"))
    return problems


# -- entry points -------------------------------------------------------------

def fsck(repo, quick: bool = False, threads: Optional[int] = None,
         progress: Optional[Callable[[int, int], None]] = None) -> FsckReport:
    """Check everything reachable from refs and the reflog; never raises on damage.

    ``quick`` skips reading and re-hashing chunk data. ``progress`` is called
    with (bytes verified, bytes to verify). Holds the shared gc lock while it
    runs. Raises LockHeld if gc runs too long, CorruptObject if the index
    itself cannot be read, OSError if the packs directory cannot be read.
    """
    # gc must not delete a pack between reading the index and reading the pack
    with locks.shared_gc_lock(repo.dir / "locks", repo.lock_timeout):
        return _fsck(repo, quick, threads or os.cpu_count() or 1, progress)


def _fsck(repo, quick: bool, threads: int, progress) -> FsckReport:
    start = time.perf_counter()
    checker = _Checker()
    with repo.index.read() as txn:
        checker.collect_roots(txn)
        checker.walk_commits(txn)
        checker.walk_trees(txn)
        checker.walk_tensors(txn)
        checker.locate_chunks(txn)
        # Scanned after the snapshot was taken: every pack it names was sealed before.
        packs, tmps = scan_packs(repo.dir / "packs")
        indexed = _indexed_packs(txn, packs, checker.locations)
    jobs = checker.check_packed(packs)
    verified = 0
    if not quick and jobs:
        problems, verified = _verify_spans(repo.dir / "packs", _spans(jobs), threads, progress)
        for kind, cid, detail in problems:
            checker.find(kind, f"chunk {_short(cid)}", detail, chunks={cid})
    return FsckReport(quick, len(checker.parents), checker.n_trees, checker.n_tensors, len(checker.chunk_length),
                      len(packs), verified, time.perf_counter() - start, checker.damage(),
                      tuple(checker.unreferenced(packs, tmps, indexed)))


def _indexed_packs(txn: Txn, packs: dict, locations: dict) -> set:
    """Names of the sealed packs some chunk index entry points into.

    Packs holding a reachable chunk are indexed by definition; only the
    others are looked up, record by record, until one entry points there.
    """
    names = {loc.pack for loc in locations.values()}
    for name, pack in packs.items():
        if name in names or pack.records is None:
            continue
        for cid, _ in pack.records.values():
            try:
                loc = txn.chunk(cid)
            except CorruptObject:  # damaged entries of reachable chunks are findings already
                continue
            if loc is not None and loc.pack == name:
                names.add(name)
                break
    return names


def rebuild_index(repo) -> RebuildReport:
    """Replace the chunk index by what the sealed packs' trailers list.

    Objects, refs and the reflog are untouched. When several packs hold the
    same chunk id, the first pack in name order wins. Packs whose trailer is
    damaged are skipped and reported. Raises LockHeld if gc runs too long,
    CorruptObject if the index cannot be written.
    """
    with locks.shared_gc_lock(repo.dir / "locks", repo.lock_timeout):
        return _rebuild_index(repo)


def _rebuild_index(repo) -> RebuildReport:
    with repo.index.write() as txn:
        # Listed inside the write transaction: a commit indexes its pack only
        # after sealing it, so every pack a later commit needs is found here
        # or indexed by that commit itself.
        packs, _ = scan_packs(repo.dir / "packs")
        dropped = sum(1 for _ in txn.ids("chunks"))
        txn.drop_chunks()
        chunks = duplicates = 0
        for name, pack in packs.items():
            for offset, (cid, length) in (pack.records or {}).items():
                if txn.put_chunk(cid, Location(name, offset, length)):
                    chunks += 1
                else:
                    duplicates += 1
        salvaged = _salvage(repo, txn, [p for p in packs.values() if p.records is None])
    skipped = tuple((pack.path.name, pack.error) for pack in packs.values() if pack.records is None)
    return RebuildReport(sum(1 for p in packs.values() if p.records is not None), chunks + salvaged,
                         duplicates, dropped, skipped, salvaged)


def _salvage(repo, txn, damaged: list) -> int:
    """Copy the verified records of unsealed packs that no sealed pack holds
    into one new sealed pack, and index them there; the damaged packs become
    unreferenced, for gc to delete. Returns how many records were saved."""
    writer = None
    try:
        for pack in damaged:
            for cid, data in salvage_records(pack.path, repo.chunk_size):
                if txn.chunk(cid) is None:
                    writer = writer or PackWriter(repo.dir / "packs")
                    txn.put_chunk(cid, writer.add(cid, data))
        if writer:
            writer.seal()
    except BaseException:
        if writer:
            writer.abort()
        raise
    return len(writer.entries) if writer else 0
