"""A repository as read-only model folders, served over FUSE: ``mvc mount``.

Vocabulary:

- **revision folder**: the files of one commit. A commit of a Hugging Face
  model folder (mvc.folders) shows that folder's own layout: its
  safetensors shards, ``model.safetensors.index.json``, configs, tokenizer
  files. Any other commit shows ``model.safetensors`` holding its tensors
  (plain values left out, as a safetensors export leaves them out).
- **the tree of names**: ``commits/<full id>/`` is the revision folder of a
  commit; every branch is a symbolic link at the top (``main ->
  commits/<id>``), every tag one under ``tags/``, ``HEAD`` one too, and a
  unique id prefix under ``commits/`` links to the full id. So every file's
  path names one commit: its bytes, size and mtime (the commit's time)
  never change and the kernel may keep them cached; a branch moves by its
  link changing. A branch named ``commits``, ``tags`` or ``HEAD`` is not
  shown (the names are the mount's own). A mount of one revision
  (``rev=``) shows that commit's folder at the top, pinned when it starts.
- **synthesised file**: a safetensors file made as it is read: its header
  comes from the export's header building (``mvc.files.safetensors_header``,
  so a mounted file and an exported one are the same bytes); tensor bytes
  come from the chunks a read touches, read and verified by the reader
  (``mvc.reader.read_runs``) and kept in a small cache of verified chunks.
  Nothing is copied when a file is opened; a loader that touches two
  tensors reads their chunks only, and in a lazy clone only those are
  fetched.
- **damage**: a chunk that does not match its id (or cannot be read) fails
  the read that needs it with EIO, and one line on stderr says what; other
  ranges of the file read as usual. Wrong bytes are never returned.

The mount process holds nothing in the repository between reads but the
index's reader slot (LMDB clears a dead process's) and flocks the kernel
drops when it dies; a mount left behind by a killed process (the kernel's
"transport endpoint is not connected") is cleared by the next mount of the
same folder. libfuse (Debian's ``fuse3``) is reached through ``mfusepy``,
imported only here.
"""

import bisect
import errno
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from . import folders as _folders
from . import files as _files
from . import dtypes, reader
from .errors import AmbiguousRevision, MissingExtra, MountError, MvcError, UnknownRevision
from .exchange import safetensors_metadata
from .objects import TensorLeaf
from .refs import BRANCHES, TAGS
from .store.chunks import Request

SUBTYPE = "mvc"  # the kernel shows the mount as fuse.mvc
CACHE_BYTES = 64 << 20  # verified chunks kept for neighbouring reads (a 128 KiB read inside a 1 MiB chunk)
READAHEAD = 512 << 10  # bytes the kernel may read past what a reader asked for
AHEAD = 4 << 20  # bytes of a tensor read along into the chunk cache when a reader goes through it in order
REVISIONS = 16  # revision folders (header and tensor list) kept built
SINGLE_FILE = "model.safetensors"
RESERVED = ("commits", "tags", "HEAD")
PROBE_WAIT = 5.0  # seconds a mount may take to answer a listing before it counts as stuck (not dead)


@dataclass
class MountStats:
    """What a mount served: ``reads`` file reads answered (``bytes_served`` bytes),
    ``chunks_read`` / ``chunk_bytes_read`` verified chunks read from the store for
    them (from a remote, in a lazy clone), ``errors`` reads that failed with EIO."""

    reads: int = 0
    bytes_served: int = 0
    chunks_read: int = 0
    chunk_bytes_read: int = 0
    errors: int = 0


@dataclass
class Segment:
    """One tensor's bytes in a synthesised file: [start, start + nbytes)."""

    start: int
    nbytes: int
    leaf: TensorLeaf
    obj: object  # TensorObject
    path: tuple  # its key path in the tree, for messages
    spans: Optional[list] = None  # (stream offset, chunk id, length), made on first read
    offsets: Optional[list] = None


@dataclass
class SynthFile:
    """A safetensors file made on read: ``header`` bytes, then the segments in order."""

    header: bytes
    segments: list
    size: int
    starts: list = field(default_factory=list)

    def __post_init__(self):
        self.starts = [s.start for s in self.segments]


@dataclass
class Revision:
    """The revision folder of ``commit``: {relative path: bytes or SynthFile}, its folders, its time."""

    commit: str
    files: dict
    dirs: set
    mtime_ns: int


def synth_safetensors(specs: dict, metadata) -> SynthFile:
    """A SynthFile for {key in file: (TensorObject, TensorLeaf, key path)}; CannotHold as an export."""
    shapes = {k: (o.dtype, tuple(o.shape), dtypes.itemsize(o.dtype), o.nbytes) for k, (o, _, _) in specs.items()}
    order, header = _files.safetensors_header(shapes, metadata)
    segments, at = [], len(header)
    for key in order:
        obj, leaf, path = specs[key]
        segments.append(Segment(at, obj.nbytes, leaf, obj, path))
        at += obj.nbytes
    return SynthFile(header, segments, at)


def build_revision(repo, commit: str) -> Revision:
    """The revision folder of full hex id ``commit`` (see the module doc), no tensor bytes read.
    Raises what reading the commit raises (CommitPruned, CorruptObject), CannotHold for a
    tensor safetensors cannot hold, UnsafeName for a folder layout naming a file outside itself."""
    view = repo.shards.view(commit)
    record = repo.get_commit(commit)
    mtime_ns = int(record.time * 1e9)
    root, objs = view["root"], view["tensors"]
    files = {}
    if _folders.is_folder_state(root):
        blobs, shards = _folders.layout(root)
        files.update(blobs)
        leaves = {p[0]: leaf for p, leaf in _walk_top(root)}
        for name, (keys, metadata) in shards.items():
            prefix = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
            files[name] = synth_safetensors({k[len(prefix):]: (objs[(k,)], leaves[k], (k,)) for k in keys}, metadata)
    else:
        flat = _files.flat_paths({k: v for k, v in root.items() if k != _folders.FOLDER_KEY}
                                 if isinstance(root, dict) else root)
        specs = {k: (objs[p], leaf, p) for k, (p, leaf) in flat.items() if isinstance(leaf, TensorLeaf)}
        files[SINGLE_FILE] = synth_safetensors(specs, safetensors_metadata(record))
    dirs = {""}
    for name in files:
        parts = name.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return Revision(commit, files, dirs, mtime_ns)


def _walk_top(root: dict):
    return (((k,), v) for k, v in root.items() if isinstance(v, TensorLeaf))


class ChunkCache:
    """Verified chunk bytes by id, least recently used dropped past ``limit`` bytes."""

    def __init__(self, limit: int = CACHE_BYTES):
        self.limit, self.held, self.items, self.lock = limit, 0, OrderedDict(), threading.Lock()

    def get(self, cid: bytes):
        with self.lock:
            data = self.items.get(cid)
            if data is not None:
                self.items.move_to_end(cid)
            return data

    def put(self, cid: bytes, data: bytes) -> None:
        with self.lock:
            size = memoryview(data).nbytes
            if cid in self.items or size > self.limit:
                return
            self.items[cid] = data
            self.held += size
            while self.held > self.limit:
                self.held -= memoryview(self.items.popitem(last=False)[1]).nbytes


class RepositoryView:
    """The tree of names over one repository (see the module doc), as plain data: ``node(path)``
    says what a path is, ``read`` serves a file's bytes. Knows nothing of FUSE, so it is tested
    directly. ``rev``: a full commit id shown at the top instead of the tree of names."""

    def __init__(self, repo, rev: Optional[str] = None, cache_bytes: int = CACHE_BYTES):
        self.repo, self.pinned = repo, rev
        self.cache, self.stats = ChunkCache(cache_bytes), MountStats()
        self.revisions, self.lock, self.inflight = OrderedDict(), threading.Lock(), {}
        self.started_ns = time.time_ns()

    # -- names

    def node(self, path: str) -> tuple:
        """("dir", [names], mtime ns) | ("link", target) | ("file", bytes or SynthFile, mtime ns),
        or None for a path that is not there. ``path`` starts with "/"."""
        parts = [p for p in path.split("/") if p]
        if self.pinned is not None:
            return self._in_revision(self.pinned, parts)
        if not parts:
            return ("dir", self._top_names(), self.started_ns)
        if parts[0] == "commits":
            return self._commits(parts[1:])
        if parts[0] == "tags":
            return self._refs(TAGS, parts[1:], depth=1)
        if parts[0] == "HEAD":
            if len(parts) > 1:
                return None
            with self.repo.index.read() as txn:
                oid = self.repo.refs.head(txn)[1]
            return None if oid is None else ("link", f"commits/{oid.hex()}")
        return self._refs(BRANCHES, parts, depth=0)

    def _top_names(self) -> list:
        with self.repo.index.read() as txn:
            heads = self.repo.refs.listed(txn, BRANCHES)
            head = self.repo.refs.head(txn)[1]
        names = {name.split("/")[0] for name, _, _ in heads} - set(RESERVED)
        return ["commits", "tags"] + (["HEAD"] if head is not None else []) + sorted(names)

    def _refs(self, prefix: str, parts: list, depth: int):
        """A branch (or tag) name, or a folder of names that share a first part."""
        with self.repo.index.read() as txn:
            listed = {name: oid for name, oid, _ in self.repo.refs.listed(txn, prefix)}
        if prefix == BRANCHES:
            listed = {n: o for n, o in listed.items() if n.split("/")[0] not in RESERVED}
        here = "/".join(parts)
        if here in listed:
            up = "../" * (depth + len(parts) - 1)
            return ("link", f"{up}commits/{listed[here].hex()}")
        under = sorted({n[len(here) + 1:].split("/")[0] for n in listed if n.startswith(here + "/")} if here
                       else {n.split("/")[0] for n in listed})
        if not under and here:
            return None
        return ("dir", under, self.started_ns)

    def _commits(self, parts: list):
        if not parts:
            with self.repo.index.read() as txn:  # a commit gc retention pruned has no files to show
                return ("dir", [oid.hex() for oid in txn.ids("commits") if self.repo.objects.pruned(txn, oid) is None],
                        self.started_ns)
        name = parts[0].lower()
        if len(name) < 4 or len(name) > 64 or any(c not in "0123456789abcdef" for c in name):
            return None
        try:
            with self.repo.index.read() as txn:
                full = self.repo.refs.resolve(txn, name).hex()
        except (UnknownRevision, AmbiguousRevision):
            return None
        if not full.startswith(name):  # a branch or tag spelled in hex digits: not this folder's business
            return None
        if name != full:
            return ("link", full) if len(parts) == 1 else None
        return self._in_revision(full, parts[1:])

    def _in_revision(self, commit: str, parts: list):
        rev = self.revision(commit)
        rel = "/".join(parts)
        if rel in rev.files:
            return ("file", rev.files[rel], rev.mtime_ns)
        if rel not in rev.dirs:
            return None
        inside = {p[len(rel) + 1 if rel else 0:].split("/")[0]
                  for p in list(rev.files) + [d for d in rev.dirs if d]
                  if (p.startswith(rel + "/") if rel else True)}
        return ("dir", sorted(inside), rev.mtime_ns)

    def revision(self, commit: str) -> Revision:
        with self.lock:
            rev = self.revisions.get(commit)
            if rev is not None:
                self.revisions.move_to_end(commit)
                return rev
        rev = build_revision(self.repo, commit)
        with self.lock:
            self.revisions[commit] = rev
            while len(self.revisions) > REVISIONS:
                self.revisions.popitem(last=False)
        return rev

    # -- bytes

    def read(self, content, offset: int, size: int, commit: str = "", since: Optional[int] = None) -> bytes:
        """Bytes [offset, offset + size) of a file (bytes or SynthFile), every tensor byte verified;
        raises what the reader raises (ChecksumMismatch, ObjectNotFound ...). ``since``: where
        the reader's run of reads in order began; as much of a tensor as the run has read of
        it (up to AHEAD) is read on into the cache in the same call, so a reader going through
        a tensor pays one store call per several chunks, and one that stops at its end, or
        the kernel reading a little past it, never pulls in the next tensor."""
        if isinstance(content, (bytes, bytearray)):
            return bytes(content[offset:offset + size])
        end = min(offset + size, content.size)
        if offset >= end:
            return b""
        parts = [memoryview(content.header)[offset:min(end, len(content.header))]]
        i = max(0, bisect.bisect_right(content.starts, offset) - 1)
        for seg in content.segments[i:]:
            if seg.start >= end:
                break
            lo, hi = max(offset, seg.start) - seg.start, min(end, seg.start + seg.nbytes) - seg.start
            if hi > lo:
                done = lo - max(0, since - seg.start) if since is not None and since <= offset else 0
                parts += self._tensor_parts(seg, lo, hi, commit, min(AHEAD, max(0, done)))
        return b"".join(parts)

    def _tensor_parts(self, seg: Segment, lo: int, hi: int, commit: str, ahead: int) -> list:
        """Memoryviews of bytes [lo, hi) of one tensor, in order."""
        what = f"tensor {'.'.join(map(str, seg.path))!r} in commit {commit[:12]}"
        if not seg.obj.in_c_order:  # shards that are not runs of rows: the tensor whole, once
            return [memoryview(self._scattered(seg, commit))[lo:hi]]
        if seg.spans is None:  # other threads take spans being set as both being set: offsets go first
            spans = [(off, cid, n) for cid, off, n in seg.obj.chunk_spans()]
            seg.offsets = [off for off, _, _ in spans]
            seg.spans = spans
        wanted, extra = self._spans(seg, lo, hi), self._spans(seg, hi, min(seg.nbytes, hi + ahead)) if ahead else []
        got = self._chunks([(cid, n) for _, cid, n in wanted], [(cid, n) for _, cid, n in extra], what)
        return [memoryview(got[cid])[max(lo, off) - off:min(hi, off + n) - off] for off, cid, n in wanted]

    @staticmethod
    def _spans(seg: Segment, lo: int, hi: int) -> list:
        """(offset, chunk id, length) of the chunks holding bytes [lo, hi) of a tensor."""
        out = []
        for span in seg.spans[max(0, bisect.bisect_right(seg.offsets, lo) - 1):]:
            if span[0] >= hi:
                break
            out.append(span)
        return out

    def _chunks(self, wanted: list, extra: list, what: str) -> dict:
        """{chunk id: verified bytes} for (id, length) pairs, from the cache or the store; the
        ``extra`` ones are read along if missing, and left out if any of them fails (so damage
        beyond the range asked for never fails it). The kernel asks for neighbouring ranges
        from several threads at once: a chunk another thread is reading is waited for, not
        read twice."""
        got, mine, more, waits = {}, {}, {}, []
        with self.lock:
            for cid, n in wanted:
                data = self.cache.get(cid)
                if data is not None:
                    got[cid] = data
                elif cid in self.inflight:
                    waits.append((cid, n, self.inflight[cid]))
                elif cid not in mine:
                    mine[cid] = n
            for cid, n in extra if mine else ():
                if cid not in mine and cid not in self.inflight and self.cache.get(cid) is None:
                    more[cid] = n
            for cid in {**mine, **more}:
                self.inflight[cid] = threading.Event()
        try:
            if mine:
                try:
                    got.update(self._read({**mine, **more}, what))
                except MvcError:
                    if not more:
                        raise
                    got.update(self._read(mine, what))
        finally:
            with self.lock:
                for cid in {**mine, **more}:
                    self.inflight.pop(cid).set()
        for cid, n, done in waits:
            done.wait()
            data = self.cache.get(cid)
            got[cid] = data if data is not None else self._read({cid: n}, what)[cid]  # its read failed: ours says why
        return got

    def _read(self, ids: dict, what: str) -> dict:
        """{chunk id: verified bytes} for {chunk id: length}, read in one call into the store."""
        requests = [Request(cid, np.empty(n, dtype=np.uint8), what) for cid, n in ids.items()]  # not zeroed first
        with self.repo.gc_lock.shared(), self.repo.index.read() as txn:
            reader.read_runs(self.repo, txn, requests)
        with self.lock:
            self.stats.chunks_read += len(requests)
            self.stats.chunk_bytes_read += sum(r.buffer.nbytes for r in requests)
        for r in requests:
            self.cache.put(r.id, r.buffer)  # never written again: shared as it is
        return {r.id: r.buffer for r in requests}

    def _scattered(self, seg: Segment, commit: str) -> bytes:
        key = b"whole:" + seg.leaf.id
        data = self.cache.get(key)
        if data is None:
            tensor = reader.read_leaves(self.repo, commit, [(seg.path, seg.leaf)])[seg.leaf.id]
            import torch
            data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            with self.lock:
                self.stats.chunks_read += len(seg.obj.chunks)
                self.stats.chunk_bytes_read += len(data)
            self.cache.put(key, data)
        return data


# -- the mount itself ---------------------------------------------------------------


def _fuse():
    """The mfusepy module; MissingExtra / MountError(no-fuse) when it or libfuse is missing."""
    try:
        import mfusepy
    except ImportError:
        raise MissingExtra("mounting needs the Python package mfusepy", package="mfusepy", extra="mount") from None
    except (OSError, EnvironmentError) as exc:  # it loads libfuse when imported
        raise MountError(f"libfuse is not installed ({exc}); install fuse3 (Debian: apt-get install fuse3)",
                         problem="no-fuse") from None
    return mfusepy


def place(mountpoint) -> str:
    """``mountpoint`` as the kernel lists it: absolute, its parent's links resolved (a folder
    reached through a linked one is listed at the link's target). The mountpoint itself is
    not looked at: that would wait on a mount whose process is stuck."""
    where = os.path.abspath(mountpoint)
    return os.path.join(os.path.realpath(os.path.dirname(where)), os.path.basename(where))


def mounted(mountpoint) -> Optional[str]:
    """The file system type of the mount at ``mountpoint`` ("fuse.mvc" for an mvc mount), or None."""
    target = place(mountpoint)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:  # the last one wins: mounts stack
        left, _, right = line.partition(" - ")
        fields = left.split(" ")
        if len(fields) > 4 and _unescape(fields[4]) == target:
            found = right.split(" ")[0]
    return found


def _unescape(text: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def _fusermount(mountpoint, lazy: bool = False) -> subprocess.CompletedProcess:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        raise MountError("fusermount3 is not installed; install fuse3 (Debian: apt-get install fuse3)",
                         mountpoint=mountpoint, problem="no-fuse")
    return subprocess.run([tool, "-u"] + (["-z"] if lazy else []) + [os.fspath(mountpoint)],
                          capture_output=True, text=True)


def _alive(mountpoint, wait: float = PROBE_WAIT) -> bool:
    """False only for a mount whose process is gone (the kernel answers ENOTCONN). The listing
    is asked for on a thread of its own: a mount whose process is stopped or stuck never
    answers, and is taken as alive after ``wait`` seconds rather than hanging its caller
    (``mvc umount`` of it then unmounts it as any live one)."""
    answer = []

    def probe():
        try:
            os.listdir(mountpoint)  # a stat may be answered from the kernel's cache; a listing never is
            answer.append(True)
        except OSError as exc:
            answer.append(exc.errno != errno.ENOTCONN)
    asking = threading.Thread(target=probe, daemon=True)
    asking.start()
    asking.join(wait)
    return answer[0] if answer else True


def check_mountpoint(repo, mountpoint) -> str:
    """The absolute mountpoint, after clearing a mount a killed mvc left there; MountError
    if it cannot take a mount."""
    where = place(mountpoint)
    kind = mounted(where)
    if kind is not None:
        if kind == f"fuse.{SUBTYPE}" and not _alive(where):  # its process was killed: clear it
            _fusermount(where, lazy=True)
        else:
            raise MountError(f"{where} is already a mount ({kind}); unmount it first", mountpoint=where,
                             problem="already-mounted")
    if not os.path.isdir(where):
        raise MountError(f"cannot mount at {where}: it is not a folder (make it with mkdir)", mountpoint=where,
                         problem="not-a-folder")
    inside = _files.repository_around(where)
    if inside is not None:
        raise MountError(f"cannot mount at {where}: it is inside the repository {inside}", mountpoint=where,
                         problem="inside-repository")
    if os.listdir(where):  # a mount would hide them (libfuse 3 no longer refuses by itself)
        raise MountError(f"cannot mount at {where}: it holds files, which the mount would hide; mount at an "
                         "empty folder", mountpoint=where, problem="not-empty")
    return where


def mount(repo, mountpoint, rev: Optional[str] = None, ready: Optional[Callable[[str], None]] = None,
          report: Optional[Callable[[str], None]] = None) -> MountStats:
    """Serve the repository read-only at ``mountpoint`` until it is unmounted (``umount``,
    SIGINT, SIGTERM); returns what it served. ``rev`` mounts that one commit (resolved now)
    at the top. ``ready(mountpoint)`` is called once the mount is live; ``report(line)``
    gets one line for each failed read (default: stderr). Raises MountError, MissingExtra,
    and what resolving ``rev`` raises."""
    fuse = _fuse()
    pinned = repo.resolve(rev) if rev is not None else None
    where = check_mountpoint(repo, mountpoint)
    view = RepositoryView(repo, pinned)
    ops = _Operations(fuse, view, ready, report or _stderr, where)
    try:
        fuse.FUSE(ops, where, foreground=True, ro=True, nothreads=False, fsname=f"mvc:{repo.root}",
                  subtype=SUBTYPE, default_permissions=True)
    except RuntimeError as exc:  # libfuse said why on stderr
        if ops.started:  # libfuse's loop ends with an "error" when SIGINT or SIGTERM stops it
            return view.stats
        raise MountError(f"libfuse could not mount at {where} ({exc}); is /dev/fuse there and fuse3 installed?",
                         mountpoint=where, problem="failed") from None
    return view.stats


def umount(mountpoint) -> str:
    """Unmount the mvc mount at ``mountpoint`` (one a killed mvc left too); returns its absolute path.
    MountError "not-mounted" if no mvc mount is there, "busy" if files in it are open."""
    where = place(mountpoint)
    kind = mounted(where)
    if kind != f"fuse.{SUBTYPE}":
        raise MountError(f"{where} is not an mvc mount" + (f" (it is {kind})" if kind else ""), mountpoint=where,
                         problem="not-mounted")
    done = _fusermount(where)  # first as is: asking a stuck mount whether it is alive would keep it busy
    if done.returncode != 0 and "busy" in done.stderr and not _alive(where):
        done = _fusermount(where, lazy=True)  # a killed mount whose files a process still holds open
    if done.returncode != 0:
        busy = "busy" in done.stderr
        raise MountError(f"cannot unmount {where}: " + ("files in it are open; close them first" if busy
                                                           else done.stderr.strip().splitlines()[-1:][0]
                                                           if done.stderr.strip() else "fusermount failed"),
                         mountpoint=where, problem="busy" if busy else "failed")
    return where


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Operations:
    """The FUSE callbacks: each asks the view and turns its answer into what libfuse wants.
    mfusepy registers the callbacks an object has; those it lacks answer ENOSYS (writes)."""

    use_ns = True  # times as integer nanoseconds

    def __init__(self, fuse, view: RepositoryView, ready, report, where: str):
        self.fuse, self.view, self.ready, self.report, self.where = fuse, view, ready, report, where
        self.handles, self.next_handle, self.guard = {}, 1, threading.Lock()
        self.uid, self.gid = os.getuid(), os.getgid()
        self.said, self.started, self.sequential = set(), False, {}

    def init_with_config(self, conn, config):
        self.started = True
        if conn is not None:
            # the kernel reads ahead at most this much: a loader that touches a few tensors
            # reads (and, in a lazy clone, fetches) little more than them
            conn.max_readahead = min(conn.max_readahead or READAHEAD, READAHEAD)
        if config is not None:
            # every file's path names one commit, so its bytes never change: let the kernel keep them
            config.kernel_cache = 1
            config.negative_timeout = 0.0  # a new branch or commit shows at once
        if self.ready:
            threading.Thread(target=self.ready, args=(self.where,), daemon=True).start()

    def _node(self, path: str):
        try:
            found = self.view.node(path)
        except MvcError as exc:
            self._fail(path, exc)
        if found is None:
            raise self.fuse.FuseOSError(errno.ENOENT)
        return found

    def _fail(self, path: str, exc: Exception):
        line = f"mvc mount: {path.lstrip('/')}: {exc}; the read failed with EIO"
        with self.guard:
            self.view.stats.errors += 1
            fresh = line not in self.said
            self.said.add(line)
        if fresh:
            self.report(line)
        raise self.fuse.FuseOSError(errno.EIO)

    def getattr(self, path, fh=None):
        found = self._node(path)
        base = {"st_uid": self.uid, "st_gid": self.gid}
        if found[0] == "link":
            now = self.view.started_ns
            return {**base, "st_mode": stat.S_IFLNK | 0o777, "st_nlink": 1, "st_size": len(found[1]),
                    "st_mtime": now, "st_ctime": now, "st_atime": now}
        mtime = found[2]
        times = {"st_mtime": mtime, "st_ctime": mtime, "st_atime": mtime}
        if found[0] == "dir":
            return {**base, **times, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}
        content = found[1]
        size = len(content) if isinstance(content, (bytes, bytearray)) else content.size
        return {**base, **times, "st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": size,
                "st_blocks": (size + 511) // 512}

    def readdir(self, path, fh):
        found = self._node(path)
        if found[0] != "dir":
            raise self.fuse.FuseOSError(errno.ENOTDIR)
        return [".", ".."] + list(found[1])

    def readlink(self, path):
        found = self._node(path)
        if found[0] != "link":
            raise self.fuse.FuseOSError(errno.EINVAL)
        return found[1]

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise self.fuse.FuseOSError(errno.EROFS)
        found = self._node(path)
        if found[0] != "file":
            raise self.fuse.FuseOSError(errno.EISDIR)
        with self.guard:
            handle = self.next_handle
            self.next_handle += 1
            self.handles[handle] = (found[1], self._commit_of(path))
        return handle

    def _commit_of(self, path: str) -> str:
        if self.view.pinned is not None:
            return self.view.pinned
        parts = [p for p in path.split("/") if p]
        return parts[1] if len(parts) > 1 and parts[0] == "commits" else ""

    def read(self, path, size, offset, fh):
        content, commit = self.handles[fh]
        with self.guard:  # where this handle's reads in order began (see RepositoryView.read)
            last_end, since = self.sequential.get(fh, (None, offset))
            since = since if offset == last_end else offset
            self.sequential[fh] = (offset + size, since)
        try:
            data = self.view.read(content, offset, size, commit, since)
        except MvcError as exc:
            self._fail(f"{path} bytes {offset}-{offset + size}", exc)
        except OSError as exc:  # a pack gone or unreadable under a read
            self._fail(f"{path} bytes {offset}-{offset + size}", exc)
        with self.guard:
            self.view.stats.reads += 1
            self.view.stats.bytes_served += len(data)
        return data

    def release(self, path, fh):
        with self.guard:
            self.handles.pop(fh, None)
            self.sequential.pop(fh, None)
        return 0

    def statfs(self, path):
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    def access(self, path, amode):
        self._node(path)
        if amode & os.W_OK:
            raise self.fuse.FuseOSError(errno.EROFS)
        return 0
