"""Pack files: append-only files of chunk records.

A pack is written by one process, then sealed with a trailer that lists its
records, so the index can be rebuilt from packs alone (``docs/format.md``
gives every byte)::

    header   b"MVCPACK1"
    record   id (32) | length (u32 LE) | data (length bytes)   ... repeated
    trailer  count (u32 LE) | count x [id (32) | offset (u64 LE) | length (u32 LE)]
    footer   BLAKE3(trailer) (32) | trailer offset (u64 LE) | b"MVCSEAL1"

A **version 2** pack (header ``b"MVCPACK2"``, written by repositories with the
``encoded-records`` extension) has the same records, but each trailer entry
also gives the record's kind, decoded size, delta depth and base id
(``codec`` defines the kinds), so a record's data may be an encoding of the
chunk rather than its bytes.

A pack is written as ``pack-<name>.pack.tmp`` and renamed to
``pack-<name>.pack`` only once sealed and fsynced: a ``.pack`` file is always
complete, a ``.tmp`` file is a crash leftover that nothing references.

The bytes themselves are parsed and built in ``packformat`` (no I/O there);
this module reads and writes files with them.
"""

import mmap
import os
import re
import secrets
import struct
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from .. import hashing
from ..errors import CorruptObject, PackDamaged, PackMissing, UnsupportedFormat
from . import idarray, packformat
from .verify import intact
from .fs import WRITEBACK_BYTES, entries, fsync_dir, open_file, start_writeback
from .packformat import (ENTRY, ENTRY_V2, FOOTER, HEADER, HEADER_V2, NAME_BYTES, NO_BASE, RECORD_HEAD, SEAL,  # noqa: F401
                         Location, coded_location)

INDEX_RAW = struct.Struct("<16sQI")  # a chunk index value: raw record
INDEX_CODED = struct.Struct("<16sQIBIB32s")  # and an encoded one
PREFETCH_BYTES = 1 << 30  # asked ahead of a load at most: more could evict itself before use
PACK_NAME = re.compile(r"pack-([0-9a-f]{32})\.pack")  # group 1: the pack's name in hex
TMP_NAME = re.compile(r"pack-[0-9a-f]{32}\.pack\.tmp")


@dataclass(frozen=True)
class PackFile:
    """One pack file of a packs folder as listed: a sealed pack (``pack`` is its name)
    or a ``.pack.tmp`` one being written or left by a killed writer (``pack`` None).
    ``regular`` False: a link, FIFO or folder under a pack's name (never followed;
    ``size``, ``allocated`` and ``mtime`` 0 then). ``allocated``: the bytes the
    file takes on disk (what du counts)."""

    path: Path
    pack: Optional[bytes]
    regular: bool
    size: int
    mtime: float
    allocated: int = 0

    @property
    def name(self) -> str:
        return self.path.name


def list_packs(directory: Path) -> list:
    """The PackFiles of folder ``directory``, sorted by file name; other files are left out."""
    out = []
    for fname, regular in entries(directory):
        sealed = PACK_NAME.fullmatch(fname)
        if sealed is None and not TMP_NAME.fullmatch(fname):
            continue
        path = directory / fname
        try:
            st = os.lstat(path) if regular else None
        except FileNotFoundError:  # deleted meanwhile (a gc, an eviction)
            continue
        out.append(PackFile(path, bytes.fromhex(sealed.group(1)) if sealed else None, regular,
                            st.st_size if st else 0, st.st_mtime if st else 0.0, st.st_blocks * 512 if st else 0))
    return out


def encode_location(loc: Location) -> bytes:
    """A chunk index value: 28 bytes for a raw record (as format 1), 66 for an encoded one."""
    if not loc.coded:
        return INDEX_RAW.pack(loc.pack, loc.offset, loc.length)
    return INDEX_CODED.pack(loc.pack, loc.offset, loc.length, loc.kind, loc.size, loc.depth, loc.base or NO_BASE)


def decode_location(raw: bytes) -> Location:
    """The Location a chunk index value holds; CorruptObject if it is damaged."""
    if len(raw) == INDEX_RAW.size:
        return Location(*INDEX_RAW.unpack(raw))
    if len(raw) == INDEX_CODED.size:
        return coded_location(*INDEX_CODED.unpack(raw), what="a chunk location in the index")
    raise CorruptObject("a chunk location in the index is damaged", kind="index", field="location")


def pack_filename(name: bytes) -> str:
    return f"pack-{name.hex()}.pack"


COPY_BELOW = 64 << 10  # records smaller than this are copied into the write buffer, larger ones written at once
BUFFER_BYTES = 1 << 20  # copied records written with one system call once they reach this many bytes
_RAW_ENTRY = np.dtype([("id", "S32"), ("offset", "<u8"), ("length", "<u4")])  # a version 1 trailer entry
assert _RAW_ENTRY.itemsize == ENTRY.size


class PackWriter:
    """Appends chunk records to a new pack; ``seal`` makes it durable.

    Call order: ``add`` (or ``append``) any number of times, then ``seal``
    once (or ``abort``). Nothing is visible under a ``.pack`` name before
    ``seal`` returns; a writer that is never sealed leaves only a ``.tmp`` file.

    Small records are copied into a buffer of about BUFFER_BYTES and written
    with one system call (a commit of millions of small chunks would
    otherwise spend its time in one ``writev`` per record); ``seal`` writes
    what is buffered before the trailer and the fsync. The records are kept
    as columns (``ids``, ``offsets``, ``lengths``; ``coding`` {row: (kind,
    size, depth, base)} for encoded ones), not a Location each.

    ``durable`` False: a pack of copies of bytes that are safe elsewhere
    (a cache of a remote): no early writeback, no fsync of the file or its
    folder at ``seal``. After a power loss such a pack may be missing,
    short or hold zeros; its reader must be able to fetch it again.
    """

    def __init__(self, directory: Path, version: int = 1, durable: bool = True):
        self.directory = Path(directory)
        self.version = version
        self.durable = durable
        self.name = secrets.token_bytes(NAME_BYTES)
        self.tmp_path = self.directory / (pack_filename(self.name) + ".tmp")
        self.fd = open_file(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        self.offset = self._written = self._written_back = 0  # offset: the end, buffered bytes included
        self._buffer = bytearray()
        self.ids: list = []
        self.offsets: list = []
        self.lengths: list = []
        self.coding: dict = {}
        try:
            self._write([packformat.HEADERS[version]])
        except BaseException:  # a full disk already: leave no .tmp behind
            self.abort()
            raise

    def _write(self, buffers: list) -> None:
        """Write the buffered records, then ``buffers``."""
        if self._buffer:
            buffers = [self._buffer] + buffers
        total = sum(len(b) for b in buffers)
        written = os.writev(self.fd, buffers)
        while written < total:  # short write: finish the rest plainly
            rest = b"".join(bytes(b) for b in buffers)[written:]
            written += os.write(self.fd, rest)
        self._buffer = bytearray()
        self._written += total
        self.offset = self._written
        if self.durable and self._written - self._written_back >= WRITEBACK_BYTES:
            start_writeback(self.fd, self._written_back, self._written - self._written_back)
            self._written_back = self._written

    def append(self, chunk_id: bytes, data) -> int:
        """Append one raw chunk record; returns the offset of its data."""
        mv = memoryview(data).cast("B")
        n = len(mv)
        head = RECORD_HEAD.pack(chunk_id, n)
        if n < COPY_BELOW:  # copied now: the caller's bytes may change once this returns
            self._buffer += head
            self._buffer += mv
            self.offset += RECORD_HEAD.size + n
            if len(self._buffer) >= BUFFER_BYTES:
                self._write([])
        else:
            self._write([head, mv])
        self.ids.append(chunk_id)
        self.offsets.append(self.offset - n)
        self.lengths.append(n)
        return self.offset - n

    def append_rows(self, ids: list, data, size: int, rows: list) -> None:
        """Append raw records of chunks ``data[r * size:(r + 1) * size]`` (the last row may be
        shorter, where ``data`` ends) for each row r of ``rows``, under ``ids``. Records of
        small chunks are built as one array and written with one call (a commit of millions
        of small chunks would otherwise spend its time here), large ones one by one."""
        view = memoryview(data).cast("B")
        full = len(view) // size
        if size >= COPY_BELOW or any(r >= full for r in rows[:-1]):  # big chunks, or rows out of order
            for cid, r in zip(ids, rows):
                self.append(cid, view[r * size:(r + 1) * size])
            return
        if rows and rows[-1] >= full:  # a short last chunk: the rest as one array, then it
            self.append_rows(ids[:-1], data, size, rows[:-1])
            self.append(ids[-1], view[rows[-1] * size:(rows[-1] + 1) * size])
            return
        k, width = len(ids), RECORD_HEAD.size + size
        if not k:
            return
        records = np.empty((k, width), dtype=np.uint8)
        records[:, :32] = np.frombuffer(b"".join(ids), dtype=np.uint8).reshape(k, 32)
        records[:, 32:RECORD_HEAD.size] = np.frombuffer(RECORD_HEAD.pack(bytes(32), size)[32:], dtype=np.uint8)
        grid = np.frombuffer(view, dtype=np.uint8, count=full * size).reshape(full, size)
        # a copy: the caller's bytes may change once this returns
        records[:, RECORD_HEAD.size:] = grid[np.asarray(rows, dtype=np.int64)]
        at = self.offset
        self.ids += ids
        self.offsets += range(at + RECORD_HEAD.size, at + k * width, width)
        self.lengths += [size] * k
        self.offset = at + k * width
        flat = memoryview(records).cast("B")
        if records.nbytes >= BUFFER_BYTES:
            self._write([flat])
        else:
            self._buffer += flat
            if len(self._buffer) >= BUFFER_BYTES:
                self._write([])

    def add(self, chunk_id: bytes, data, kind: int = 0, size: int = -1, depth: int = 0,
            base: Optional[bytes] = None) -> Location:
        """Append one chunk record (its bytes, or with ``kind`` an encoding of
        them that decodes to ``size`` bytes); returns where its data lies."""
        if kind and self.version < 2:  # a caller that did not re-read FORMAT after a repack elsewhere
            raise UnsupportedFormat(f"chunk {chunk_id.hex()[:12]}: encoded records go only into version 2 packs, "
                                    "and this process opened the repository before its FORMAT listed "
                                    "encoded-records: open it again", problem="stale", version=self.version)
        offset = self.append(chunk_id, data)
        if kind:
            self.coding[len(self.ids) - 1] = (kind, size, depth, base)
        return self.location(len(self.ids) - 1) if kind else Location(self.name, offset, self.lengths[-1])

    def location(self, row: int) -> Location:
        """The Location of the ``row``-th record appended."""
        coding = self.coding.get(row)
        if coding is None:
            return Location(self.name, self.offsets[row], self.lengths[row])
        kind, size, depth, base = coding
        return Location(self.name, self.offsets[row], self.lengths[row], kind, size if kind else -1, depth, base)

    @property
    def entries(self) -> list:
        """(id, Location) of every record appended, in order."""
        return [(cid, self.location(row)) for row, cid in enumerate(self.ids)]

    def _trailer(self) -> bytes:
        if self.version >= 2 or self.coding:
            return packformat.trailer(self.entries, self.offset, self.version)
        table = np.empty(len(self.ids), dtype=_RAW_ENTRY)  # version 1: built as one array, same bytes
        table["id"] = np.frombuffer(b"".join(self.ids), dtype="S32") if self.ids else []
        table["offset"], table["length"] = self.offsets, self.lengths
        body = packformat.COUNT.pack(len(self.ids)) + table.tobytes()
        return body + FOOTER.pack(hashing.digest(body), self.offset, SEAL)

    def seal(self) -> Path:
        """Write the buffered records and the trailer, fsync (if ``durable``), and rename
        into place; returns the path."""
        self._write([self._trailer()])
        if self.durable:
            os.fsync(self.fd)
        os.close(self.fd)
        self.fd = None
        final = self.directory / pack_filename(self.name)
        os.rename(self.tmp_path, final)
        if self.durable:
            fsync_dir(self.directory)
        return final

    def abort(self) -> None:
        """Close and remove the unsealed file (best effort)."""
        self._buffer = bytearray()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass


def read_trailer(path: Path) -> list:
    """The (id, offset, stored length) entries a sealed pack lists; CorruptObject if damaged."""
    table = read_trailer_table(path)  # no Location per record: gc reads every pack's trailer
    return list(zip(idarray.ids(table["id"]), table["offset"].tolist(), table["length"].tolist()))


pack_version = packformat.version


def read_locations(path: Path, name: bytes = NO_BASE[:NAME_BYTES]) -> list:
    """(id, Location in pack ``name``) for each record a sealed pack lists, in
    order; CorruptObject if the pack is damaged."""
    body, footer, what, version = _trailer_bytes(path)
    return packformat.parse_trailer(body, footer, what, name, version)


def _trailer_bytes(path: Path) -> tuple:
    """(trailer, footer, what, version) of a sealed pack; PackDamaged if it is not one."""
    what = f"pack {path.name}"
    with os.fdopen(open_file(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        version = pack_version(f.read(len(HEADER))) if size >= packformat.SMALLEST else 0
        if not version:
            raise PackDamaged(f"{what} has no valid header or is truncated", pack=path.name, problem="header")
        f.seek(size - FOOTER.size)
        footer = f.read(FOOTER.size)
        start, stop = packformat.trailer_span(footer, size, what)
        f.seek(start)
        body = f.read(stop - start)
    return body, footer, what, version


# A trailer's entries as columns (fsck's metadata pass over millions of records).
TRAILER = np.dtype([("id", "S32"), ("offset", "<u8"), ("length", "<u4")])
_ENTRY_V1 = np.dtype([("id", "S32"), ("offset", "<u8"), ("length", "<u4")])
assert _ENTRY_V1.itemsize == ENTRY.size


def read_trailer_table(path: Path) -> np.ndarray:
    """The (id, offset, stored length) entries a sealed pack lists, as a TRAILER array in
    listed order; CorruptObject if the pack is damaged (as ``read_locations``).

    A version 1 trailer is checked and read as one array; a version 2 one
    goes through ``read_locations``, which checks each entry's coding."""
    body, footer, what, version = _trailer_bytes(path)
    if version != 1:
        rows = packformat.parse_trailer(body, footer, what, NO_BASE[:NAME_BYTES], version)
        return np.array([(cid, loc.offset, loc.length) for cid, loc in rows], dtype=TRAILER)
    digest, trailer_offset, _ = FOOTER.unpack(footer[-FOOTER.size:])
    if hashing.digest(body) != digest:
        raise packformat._damaged(what, "has a damaged trailer (checksum mismatch)", "trailer-checksum")
    count = packformat.COUNT.unpack_from(body)[0] if len(body) >= packformat.COUNT.size else -1
    if count < 0 or len(body) != packformat.COUNT.size + count * ENTRY.size:
        raise packformat._damaged(what, "trailer length does not match its count", "trailer-count")
    table = np.frombuffer(body, dtype=_ENTRY_V1, offset=packformat.COUNT.size).astype(TRAILER)
    ends = table["offset"] + table["length"]
    if ((table["offset"] < len(HEADER) + RECORD_HEAD.size) | (ends > trailer_offset)).any():
        raise packformat._damaged(what, "lists a record outside its data", "outside")
    return table


# The trailer entries of each version, as numpy reads them in place (packed, little-endian).
TRAILER_V1 = np.dtype([("id", "S32"), ("offset", "<u8"), ("length", "<u4")])
TRAILER_V2 = np.dtype([("id", "S32"), ("offset", "<u8"), ("length", "<u4"), ("kind", "u1"), ("size", "<u4"),
                       ("depth", "u1"), ("base", "S32")])
assert TRAILER_V1.itemsize == ENTRY.size and TRAILER_V2.itemsize == ENTRY_V2.size


@dataclass(frozen=True)
class TrailerView:
    """A sealed pack's trailer entries read in place (memory-mapped, nothing copied): what a
    pack index's rows point into. ``table`` is a TRAILER_V1 or TRAILER_V2 array; ``end`` the
    trailer's offset, which every record's data must end before."""

    name: bytes
    table: np.ndarray
    end: int
    version: int
    buf: object = None  # the trailer's entries as bytes (from ``at``), for one entry at a time
    at: int = 0

    def location(self, row: int, cid: bytes) -> Optional[Location]:
        """The Location of entry ``row`` if it lists ``cid`` (None if it does not, or is past the
        end); CorruptObject if the entry lies outside the pack's data or its coding is invalid."""
        if row >= len(self.table):
            return None
        buf, at = (self.buf, self.at) if self.buf is not None else (self.table.tobytes(), 0)
        entry = ENTRY_V2 if self.version >= 2 else ENTRY
        fields = entry.unpack_from(buf, at + row * entry.size)
        if fields[0] != cid:
            return None
        offset, length = fields[1], fields[2]
        what = f"pack {pack_filename(self.name)}"
        if offset < len(HEADER) + RECORD_HEAD.size or offset + length > self.end:
            raise CorruptObject(f"{what} lists a record outside its data", kind="index", field="location")
        if entry is ENTRY:
            return Location(self.name, offset, length)
        return packformat.coded_location(self.name, *fields[1:], what=f"an entry of {what}")

    def locations(self, rows: np.ndarray) -> tuple:
        """(LOCATIONS-like columns, {position: (base, depth)}, {position: why}) of ``rows``: each
        checked to lie inside the pack's data (and, in a version 2 pack, to have a valid coding)."""
        entries = self.table[rows]
        bad = {}
        ends = entries["offset"] + entries["length"]
        outside = (entries["offset"] < len(HEADER) + RECORD_HEAD.size) | (ends > self.end)
        for i in np.flatnonzero(outside).tolist():
            bad[i] = f"pack {pack_filename(self.name)} lists a record outside its data"
        deltas = {}
        if self.version >= 2:
            for i in np.flatnonzero(entries["kind"] != 0).tolist():
                e = entries[i]
                try:
                    loc = packformat.coded_location(self.name, int(e["offset"]), int(e["length"]), int(e["kind"]),
                                                    int(e["size"]), int(e["depth"]), entries["base"][i:i + 1].tobytes(),
                                                    what=f"an entry of pack {pack_filename(self.name)}")
                except CorruptObject as exc:
                    bad[i] = str(exc)
                    continue
                if loc.base is not None:
                    deltas[i] = (loc.base, loc.depth)
        return entries, deltas, bad


def trailer_view(path: Path, name: bytes, verified: bool = False) -> TrailerView:
    """The TrailerView of the sealed pack at ``path``; PackDamaged if it is no sealed pack (its
    header, footer, trailer length or trailer checksum; ``verified``: the checksum was found
    to match before, in this very file)."""
    what = f"pack {path.name}"
    fd = open_file(path)
    try:
        size = os.fstat(fd).st_size
        if size < packformat.SMALLEST:
            raise PackDamaged(f"{what} has no valid header or is truncated", pack=path.name, problem="header")
        view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    version = pack_version(view[:len(HEADER)])
    if not version:
        raise PackDamaged(f"{what} has no valid header or is truncated", pack=path.name, problem="header")
    start, stop = packformat.trailer_span(view[size - FOOTER.size:], size, what)
    count = packformat.COUNT.unpack_from(view, start)[0]
    dtype = TRAILER_V2 if version >= 2 else TRAILER_V1
    if stop - start != packformat.COUNT.size + count * dtype.itemsize:
        raise packformat._damaged(what, "trailer length does not match its count", "trailer-count")
    digest = FOOTER.unpack(view[size - FOOTER.size:])[0]
    if not verified and hashing.digest(memoryview(view)[start:stop]) != digest:
        raise packformat._damaged(what, "has a damaged trailer (checksum mismatch)", "trailer-checksum")
    table = np.frombuffer(view, dtype=dtype, count=count, offset=start + packformat.COUNT.size)
    return TrailerView(name, table, start, version, view, start + packformat.COUNT.size)


# (path, inode, size, mtime) -> TrailerView. Each mapping holds a descriptor (CPython's mmap keeps
# one), so few are kept, beside PackReader's MAX_OPEN; a trailer's checksum is checked once.
_VIEWS: OrderedDict = OrderedDict()
_VIEWS_LOCK = threading.Lock()
_VERIFIED: set = set()
MAX_VIEWS = 32


def forget_trailer_views(paths) -> None:
    """Drop the kept TrailerViews of packs at ``paths`` (taken out of the index: about to be
    deleted, or deleted by another process), so no mapping keeps a deleted pack's space."""
    paths = {str(p) for p in paths}
    with _VIEWS_LOCK:
        for key in [k for k in _VIEWS if k[0] in paths]:
            del _VIEWS[key]


def cached_trailer_view(path: Path, name: bytes) -> TrailerView:
    """``trailer_view``, kept (up to MAX_VIEWS) while the file is the same file: a sealed pack
    never changes, so its trailer's checksum is checked once per process, not per lookup."""
    st = os.stat(path)
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _VIEWS_LOCK:
        hit = _VIEWS.get(key)
        if hit is not None:
            _VIEWS.move_to_end(key)
            return hit
    view = trailer_view(path, name, verified=key in _VERIFIED)
    with _VIEWS_LOCK:
        _VERIFIED.add(key)
        _VIEWS[key] = view
        while len(_VIEWS) > MAX_VIEWS:
            _VIEWS.popitem(last=False)
    return view


def walked_view(path: Path, name: bytes) -> TrailerView:
    """A TrailerView of a pack whose trailer or header is damaged, from its record heads: records
    are read in order from the start, as they were written (so a record's place is its trailer
    row), until one does not fit in the file. Raw records only (a version 2 pack's coding is in
    its trailer): what such a record holds is verified when it is read, as always."""
    found, size = [], os.path.getsize(path)
    with os.fdopen(open_file(path), "rb") as f:
        at = len(HEADER)
        f.seek(at)
        while at + RECORD_HEAD.size <= size:
            head = f.read(RECORD_HEAD.size)
            if len(head) < RECORD_HEAD.size:
                break
            cid, length = RECORD_HEAD.unpack(head)
            if at + RECORD_HEAD.size + length > size:
                break
            found.append((cid, at + RECORD_HEAD.size, length))
            at += RECORD_HEAD.size + length
            f.seek(at)
    return TrailerView(name, np.array(found, dtype=TRAILER_V1), size, 1)


def salvage_records(path: Path, limit: int = 1 << 32) -> Iterator[tuple]:
    """(id, data) of each record of a damaged pack whose bytes hash to its id.

    For a pack whose trailer is lost (a truncated file): records are read in
    order from the header, one at a time; a record whose data does not
    verify is skipped, and the scan ends where a record is cut short. Only
    data that proves itself comes out. ``limit`` bounds a record's length.
    """
    from . import codec
    with os.fdopen(open_file(path), "rb") as f:
        version = pack_version(f.read(len(HEADER)))
        if not version:
            return
        while True:
            head = f.read(RECORD_HEAD.size)
            if len(head) < RECORD_HEAD.size:
                return
            cid, length = RECORD_HEAD.unpack(head)
            if length > limit:
                return
            data = f.read(length)
            if len(data) != length:
                return
            if intact(cid, data):
                yield cid, data
            elif version == 2:  # a grouped record proves itself once decoded; a delta needs its base: lost
                decoded = _decode_alone(codec, data, limit)
                if decoded is not None and intact(cid, decoded):
                    yield cid, decoded


def _decode_alone(codec, payload: bytes, limit: int):
    if len(payload) < codec.GROUP_HEAD.size:
        return None
    _, size = codec.GROUP_HEAD.unpack_from(payload, 0)
    if size > limit:
        return None
    out = bytearray(size)
    try:
        codec.decode(codec.GROUPED, payload, size, out)
    except CorruptObject:
        return None
    return bytes(out)


MAX_OPEN = 128  # pack descriptors kept open: far below the usual 1024 limit, whatever the pack count
SWEEP_S = 10.0  # at most this long between looks for cached descriptors of deleted packs


class PackReader:
    """Reads chunk records from sealed packs by location.

    Keeps at most ``max_open`` descriptors open, least recently used closed
    first, so thousands of packs never exhaust the process's file limit. A
    descriptor in use by a read is never closed under it. One of a pack that
    another process deleted (a repack, gc or eviction there) would keep its
    disk space until this process exits: such descriptors are closed when a
    read opens another pack (where the deleted pack's chunks went) and at
    least every ``SWEEP_S`` seconds of reads, not with a system call per read.
    """

    def __init__(self, directory: Path, max_open: int = MAX_OPEN):
        self.directory = Path(directory)
        self.max_open = max_open
        self._fds: OrderedDict = OrderedDict()  # pack name -> [fd, readers using it]
        self._lock = threading.Lock()
        self._next_sweep = time.monotonic() + SWEEP_S

    @contextmanager
    def _fd(self, name: bytes) -> Iterator[int]:
        with self._lock:
            if time.monotonic() >= self._next_sweep:
                self._sweep()
            entry = self._fds.get(name)
            if entry is not None:
                self._fds.move_to_end(name)
                entry[1] += 1
        if entry is None:
            entry = self._open(name)
        try:
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1
                self._trim()

    def _open(self, name: bytes) -> list:
        path = self.directory / pack_filename(name)
        try:
            fd = open_file(path)
        except FileNotFoundError:
            raise PackMissing(f"pack {path.name} is missing", pack=path.name, problem="missing") from None
        if hasattr(os, "posix_fadvise"):  # loads read runs in order: a larger readahead window
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        with self._lock:
            entry = self._fds.get(name)
            if entry is None:
                self._sweep()  # a chunk moved to this pack: the one it left may be deleted
                entry = self._fds[name] = [fd, 0]
            else:  # another thread opened it first: keep one descriptor
                os.close(fd)
            entry[1] += 1
            return entry

    def _sweep(self) -> None:
        """Close the unused cached descriptors of packs whose file is gone (under the lock)."""
        self._next_sweep = time.monotonic() + SWEEP_S
        for name, (fd, users) in list(self._fds.items()):
            if users == 0 and os.fstat(fd).st_nlink == 0:
                del self._fds[name]
                os.close(fd)

    def _trim(self) -> None:
        for name in list(self._fds):
            if len(self._fds) <= self.max_open:
                return
            fd, users = self._fds[name]
            if users == 0:
                del self._fds[name]
                os.close(fd)

    def read_run(self, locs: list, buffers: list) -> None:
        """Read chunks whose records lie back to back in one pack with one call.

        ``locs[i + 1]`` must start right after ``locs[i]``'s data and the next
        record header; each chunk lands in ``buffers[i]``. Returns the record
        headers read along (for checkers). One large read instead of many
        small ones keeps the kernel's readahead going when the pack is not
        in the page cache.
        """
        heads = [bytearray(RECORD_HEAD.size) for _ in locs]
        iov = []
        for head, buffer in zip(heads, buffers):
            iov += [head, buffer]
        start = locs[0].offset - RECORD_HEAD.size
        want = sum(loc.length for loc in locs) + RECORD_HEAD.size * len(locs)
        with self._fd(locs[0].pack) as fd:
            got = os.preadv(fd, iov, start)
        if got != want:
            raise PackDamaged(f"pack {pack_filename(locs[0].pack)} is truncated at offset {locs[0].offset}",
                              pack=pack_filename(locs[0].pack), problem="truncated")
        return heads

    def prefetch(self, runs: list, gap: int = 1 << 20, budget: int = PREFETCH_BYTES) -> None:
        """Ask the kernel to start reading runs of back-to-back chunks (lists
        of Locations, as ``read_run`` takes them) in the background. Runs of
        one pack less than ``gap`` apart are asked for as one span: fewer,
        longer reads, at the cost of a few bytes nobody needs."""
        spans: dict = {}
        for locs in runs:
            spans.setdefault(locs[0].pack, []).append((locs[0].offset, locs[-1].offset + locs[-1].length))
        for name, ranges in spans.items():
            merged = []
            for lo, hi in sorted(ranges):
                if merged and lo - merged[-1][1] <= gap:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            for lo, hi in merged:
                if budget <= 0 or not hasattr(os, "posix_fadvise"):
                    return  # beyond the budget the kernel's own readahead serves
                with self._fd(name) as fd:
                    os.posix_fadvise(fd, lo, min(hi - lo, budget), os.POSIX_FADV_WILLNEED)
                budget -= hi - lo

    def read(self, loc: Location) -> bytes:
        """One record's data, unverified: the chunk store verifies what it returns."""
        buffer = bytearray(loc.length)
        self.read_run([loc], [buffer])
        return bytes(buffer)

    def open_count(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._fds.values():
                os.close(fd)
            self._fds.clear()
