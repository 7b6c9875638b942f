"""A catalogue's chunk tables: where a remote's chunk packs hold each chunk, in sorted files.

A remote's catalogue (``mvc.remote.catalogue``) keeps what the trailers of the remote's chunk
packs list, chunk id -> (pack, offset, length), in **tables**: immutable files of entries
sorted by id, memory-mapped and searched in numpy, 48 bytes an entry (its id and its
location) whatever the number of packs. A batch of trailers read, or a pack pushed, becomes
one small table; past MAX_TABLES the newest are merged (``group``: a geometric policy, so
each entry is rewritten a few times at most) in bounded memory, leaving out the entries of
packs the catalogue no longer holds there.

Vocabulary:

- **home**: the table that holds a pack's current entries, as the catalogue records it
  (``in:KEY`` in its LMDB environment). An entry of any other table that names the pack is
  **stale** (the pack was forgotten, or its trailer read again into a newer table) and never
  matches; merges drop stale entries.
- **live**: per table, a flag per pack it lists: its home is this table (and no command
  asked to avoid it, ``Catalogue.shun``).

File layout (little-endian; ``docs/format.md`` 11.5)::

    header   b"MVCCTAB1" | pack count u32 | entry count u64
    names    pack count x 16-byte pack names (pack number = place in this list)
    fan-out  256 x u64: entries whose id's first byte is <= b
    heads    entry count x u64: id bytes 0-7 read big-endian (numbers sort as the bytes do)
    rests    entry count x 24 bytes: id bytes 8-31
    packs    entry count x u32 pack number
    offsets  entry count x u64: the record's data offset in its pack
    lengths  entry count x u32: its length
    (entries ascending by id, then pack number)
    footer   the checksum of the pack indexes' files (``packindex.write_summed``), 32 bytes
"""

import functools
import os
import re
import struct
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np

from ..errors import CorruptObject
from ..store import idarray
from ..store.fs import open_file
from ..store.packindex import (FANOUT, NAME, delete_stale, fanout_of, map_readonly, merge_group, slice_runs,
                               slice_starts, summed, write_summed)

MAGIC = b"MVCCTAB1"
HEAD = struct.Struct("<8sIQ")
COLUMNS = (("heads", "<u8"), ("rests", "V24"), ("packs", "<u4"), ("offsets", "<u8"), ("lengths", "<u4"))
ENTRY_BYTES = 8 + 24 + 4 + 8 + 4
DIGEST = 32
MAX_TABLES = 8  # searched one after the other; more are merged into fewer
MERGE_BUDGET = 1 << 20  # entries a merge holds at a time (about 48 MiB of them)
FILE = re.compile(r"([0-9a-f]{32})\.ctab")
TMP = re.compile(r"[0-9a-f]{32}\.ctab\.tmp")
GRACE_S = 3600  # a table file no list names, this old, is no write in progress


def _damaged(path, why: str) -> CorruptObject:
    return CorruptObject(f"catalogue table {Path(path).name} is damaged: {why}; it is derived data, read "
                         "again from the remote's trailers", kind="catalogue-table")


def split(ids: np.ndarray) -> tuple:
    """(heads, rests) of an id array (``idarray``): bytes 0-7 as u64 numbers read big-endian, so
    that numbers compare as the bytes do, and bytes 8-31."""
    raw = np.ascontiguousarray(ids).view(np.uint8).reshape(len(ids), idarray.WIDTH)
    heads = raw[:, :8].copy().view(">u8").reshape(len(ids)).astype("<u8")
    rests = np.ascontiguousarray(raw[:, 8:]).view("V24").reshape(len(ids))
    return heads, rests


def joined(heads: np.ndarray, rests: np.ndarray) -> np.ndarray:
    """The id array of (heads, rests): ``split``'s inverse."""
    raw = np.empty((len(heads), idarray.WIDTH), dtype=np.uint8)
    raw[:, :8] = heads.astype(">u8").view(np.uint8).reshape(len(heads), 8)
    raw[:, 8:] = np.ascontiguousarray(rests).view(np.uint8).reshape(len(heads), 24)
    return raw.view(idarray.ID).reshape(len(heads))


def _in_order(columns: dict) -> dict:
    """``columns`` sorted by id, then pack number: one sort of the heads (numbers) where they are
    unique, all of the id and the pack number where two share a head (an id in two packs)."""
    heads = columns["heads"]
    order = np.argsort(heads, kind="stable")
    ordered = heads[order]
    if len(ordered) > 1 and (ordered[1:] == ordered[:-1]).any():
        rests = np.ascontiguousarray(columns["rests"]).view(">u8").reshape(len(heads), 3)
        order = np.lexsort((columns["packs"], rests[:, 2], rests[:, 1], rests[:, 0], heads))
    return {name: values[order] for name, values in columns.items()}


class Table:
    """One table file, memory-mapped (the mapping goes with the last array that views it; it holds
    no descriptor). CorruptObject if its layout is not one (its checksum is checked by ``verify``)."""

    def __init__(self, path):
        self.path = Path(path)
        self.name = self.path.name[:-len(".ctab")]
        fd = open_file(self.path)
        try:
            size = os.fstat(fd).st_size
            buf = map_readonly(fd, size) if size else None
        finally:
            os.close(fd)
        if size < HEAD.size or buf is None:
            raise _damaged(self.path, "it is shorter than its header")
        magic, npacks, count = HEAD.unpack_from(buf)
        need = HEAD.size + npacks * NAME + FANOUT * 8 + count * ENTRY_BYTES + DIGEST
        if magic != MAGIC or size != need:
            raise _damaged(self.path, f"it has no valid header, or is {size} bytes long where its header says {need}")
        self._buf = buf
        view = memoryview(buf).cast("B")
        at = HEAD.size
        self.names = [bytes(view[at + k * NAME:at + (k + 1) * NAME]) for k in range(npacks)]
        at += npacks * NAME
        self.fanout = np.frombuffer(view, dtype="<u8", count=FANOUT, offset=at)
        at += FANOUT * 8
        for name, dtype in COLUMNS:
            setattr(self, name, np.frombuffer(view, dtype=dtype, count=count, offset=at))
            at += count * np.dtype(dtype).itemsize
        if count and (int(self.fanout[-1]) != count or (np.diff(self.fanout.astype(np.int64)) < 0).any()):
            raise _damaged(self.path, "its fan-out table does not add up")

    @functools.cached_property
    def number(self) -> dict:
        """{pack name: its pack number}."""
        return {name: k for k, name in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.heads)

    def verify(self) -> None:
        """CorruptObject unless its checksum matches and every entry names a pack it lists."""
        if not summed(self._buf):
            raise _damaged(self.path, "its checksum does not match")
        for _, _, s, t in slice_runs(self.fanout, MERGE_BUDGET):
            if t > s and int(self.packs[s:t].max()) >= len(self.names):
                raise _damaged(self.path, "an entry names a pack it does not list")

    def span(self, first: int, last: int) -> tuple:
        """(start, stop) of the entries whose id's first byte is in [first, last)."""
        starts = slice_starts(self.fanout)
        return int(starts[first]), int(starts[last])

    def entries_of(self, numbers) -> np.ndarray:
        """Indices of the entries that name the packs ``numbers`` (one pass over the table)."""
        return np.flatnonzero(np.isin(self.packs, np.asarray(list(numbers), dtype="<u4")))


def live_of(flags, packs: np.ndarray) -> np.ndarray:
    """``flags[packs]``: whether each entry's pack is live, False for a pack number the table does
    not list (a damaged table: ``Table`` does not read the whole column when it opens)."""
    flags = np.append(np.asarray(flags, dtype=bool), False)
    return flags[np.minimum(packs, len(flags) - 1)]


def path_of(folder, name: str) -> Path:
    return Path(folder) / f"{name}.ctab"


def _write(folder, names: list, count: int, fanout: np.ndarray, parts) -> Table:
    """Write a table whose entries are ``parts()``'s column dicts, in order (each column in a pass
    of its own over them), under a new name: fsynced, renamed into place, opened."""
    path = path_of(folder, os.urandom(16).hex())

    def pieces():
        yield HEAD.pack(MAGIC, len(names), count)
        yield b"".join(names)
        yield fanout.astype("<u8").tobytes()
        for column, dtype in COLUMNS:
            for part in parts():
                yield np.ascontiguousarray(part[column]).astype(dtype).tobytes()
    write_summed(path, pieces())
    return Table(path)


def write(folder, packs: list) -> Table:
    """A new table of ``packs``: (16-byte pack name, id array, offsets, lengths) each, its
    trailer's records in any order. Holds its entries in memory: for a batch of trailers."""
    names = [name for name, _, _, _ in packs]
    if len(set(names)) != len(names) or any(len(n) != NAME for n in names):
        raise ValueError("one entry per 16-byte pack name")
    ids = np.concatenate([p[1] for p in packs]) if packs else np.zeros(0, dtype=idarray.ID)
    heads, rests = split(ids)
    columns = _in_order(dict(
        heads=heads, rests=rests,
        packs=np.repeat(np.arange(len(packs), dtype="<u4"), [len(p[1]) for p in packs]),
        offsets=np.concatenate([np.asarray(p[2], dtype="<u8") for p in packs]) if packs else np.zeros(0, "<u8"),
        lengths=np.concatenate([np.asarray(p[3], dtype="<u4") for p in packs]) if packs else np.zeros(0, "<u4")))
    return _write(folder, names, len(heads), fanout_of(columns["heads"]), lambda: iter([columns]))


def merge(folder, inputs: list, live: list) -> Table:
    """A new table of the live entries of ``inputs`` (Tables; ``live[k]``: a flag per pack number
    of input k). Memory: the entries of about MERGE_BUDGET at a time (whole first-byte slices)."""
    names, number = [], {}
    for table, keep in zip(inputs, live):
        for k, name in enumerate(table.names):
            if keep[k] and name not in number:  # a pack is live in one table only: its home
                number[name] = len(names)
                names.append(name)
    maps = [np.array([number.get(n, 0) for n in table.names], dtype="<u4") for table in inputs]

    def picked(k: int, b: int, e: int) -> dict:
        table = inputs[k]
        s, t = table.span(b, e)
        sel = live_of(live[k], table.packs[s:t])
        out = {column: getattr(table, column)[s:t][sel] for column, _ in COLUMNS}
        out["packs"] = maps[k][out["packs"]]
        return out

    counts = np.zeros(FANOUT, dtype=np.int64)
    for k, table in enumerate(inputs):
        for _, _, s, t in slice_runs(table.fanout, MERGE_BUDGET):
            keep = live_of(live[k], table.packs[s:t])
            counts += np.bincount((table.heads[s:t][keep] >> np.uint64(56)).astype(np.intp), minlength=FANOUT)
    fanout = np.cumsum(counts).astype("<u8")

    def parts() -> Iterator[dict]:
        for b, e, _, _ in slice_runs(fanout, MERGE_BUDGET):
            got = [picked(k, b, e) for k in range(len(inputs))]
            yield _in_order({column: np.concatenate([g[column] for g in got]) if got else np.zeros(0, dtype)
                             for column, dtype in COLUMNS})
    return _write(folder, names, int(fanout[-1]), fanout, parts)


def group(sizes: list) -> int:
    """How many of the newest tables (``sizes``, newest first) to merge into one now (0: none):
    the pack indexes' policy (``packindex.merge_group``), leaving at most MAX_TABLES."""
    return merge_group(sizes, MAX_TABLES)


def locate(tables: list, live: list, ids: np.ndarray) -> tuple:
    """(table number, entry) per id of ``ids`` (an id array), -1 where no live entry lists it; the
    first table (newest) that does wins. ``live[t]``: table t's flag per pack number."""
    heads, rests = split(ids)
    where = np.full(len(ids), -1, dtype=np.int64)
    entry = np.full(len(ids), -1, dtype=np.int64)
    order = np.argsort(heads, kind="stable")  # searched in sorted order: neighbouring probes
    for t, table in enumerate(tables):
        todo = order[where[order] < 0]
        if not len(todo) or not len(table):
            continue
        lo = np.searchsorted(table.heads, heads[todo], "left")
        hi = np.searchsorted(table.heads, heads[todo], "right")
        flags = live[t]
        for step in range(int((hi - lo).max(initial=0))):  # most often one step: ids are unique
            open_ = (lo + step < hi) & (where[todo] < 0)
            at = (lo + step)[open_]
            mine = todo[open_]
            ok = (table.rests[at] == rests[mine]) & live_of(flags, table.packs[at])
            where[mine[ok]], entry[mine[ok]] = t, at[ok]
    return where, entry


def distinct(tables: list, live: list) -> tuple:
    """(distinct ids, their bytes: each id's length once) of the live entries of ``tables``,
    a run of first-byte slices at a time (bounded memory)."""
    counts = np.zeros(FANOUT, dtype=np.int64)
    for table in tables:
        counts += np.diff(slice_starts(table.fanout))
    n = total = 0
    for b, e, _, _ in slice_runs(np.cumsum(counts), MERGE_BUDGET):
        ids, lengths = [], []
        for table, flags in zip(tables, live):
            s, t = table.span(b, e)
            sel = live_of(flags, table.packs[s:t])
            ids.append(joined(table.heads[s:t][sel], table.rests[s:t][sel]))
            lengths.append(table.lengths[s:t][sel])
        if ids:
            _, first = idarray.unique(np.concatenate(ids))
            n += len(first)
            total += int(np.concatenate(lengths)[first].sum(dtype=np.int64))
    return n, total


def held(tables: list, live: list, needed: Iterable[tuple]) -> list:
    """(needed entries, entries) per pack number of each of ``tables``' live entries (``live[t]``:
    table t's flags per pack number); ``needed`` yields (first byte, last byte + 1, sorted id
    array of the needed ids there), as ``packindex.IdSpill.slices`` does. Memory: a run of
    first-byte slices at a time."""
    out = [(np.zeros(len(t.names), dtype=np.int64), np.zeros(len(t.names), dtype=np.int64)) for t in tables]
    for table, flags, (_, total) in zip(tables, live, out):
        for _, _, s, t in slice_runs(table.fanout, MERGE_BUDGET):
            packs = table.packs[s:t]
            total += np.bincount(packs[live_of(flags, packs)], minlength=len(table.names))
    for b, e, ids in needed:
        for table, flags, (count, _) in zip(tables, live, out):
            s, t = table.span(b, e)
            packs = table.packs[s:t]
            keep = live_of(flags, packs)
            found = idarray.find(ids, joined(table.heads[s:t][keep], table.rests[s:t][keep])) >= 0
            count += np.bincount(packs[keep][found], minlength=len(table.names))
    return out


def sweep(folder, listed: set) -> list:
    """Delete the table files of ``folder`` no list names (``listed``: their names), and the
    temporary files of killed writers, once GRACE_S old (a younger one may be a write in
    progress in another process); returns the paths deleted."""
    try:
        with os.scandir(folder) as it:
            found = [Path(e.path) for e in it if (FILE.fullmatch(e.name) and e.name[:32] not in listed)
                     or TMP.fullmatch(e.name)]
    except OSError:
        return []
    return delete_stale(found, GRACE_S)


def unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:  # gone already: it was only derived data
        pass


def open_table(folder, name: str) -> Optional[Table]:
    """Table ``name`` of ``folder``; None if its file is gone. CorruptObject if damaged."""
    try:
        return Table(path_of(folder, name))
    except FileNotFoundError:
        return None
