"""The pack format, parsed and built from bytes, every version (``docs/format.md`` section 4).

No I/O here: the local packs (``store/packs.py``) and the remote's packs
(``remote/layout.py``) read the bytes their own way and hand them over.

Vocabulary:

- **pack**: ``header`` (8 bytes, naming the version), records, trailer, footer.
- **record**: a ``RECORD_HEAD`` (chunk id, stored length) and the stored bytes.
- **trailer**: a count and one entry per record: id, data offset, stored
  length; version 2 adds kind, decoded size, delta depth and base id.
- **footer**: BLAKE3 of the trailer, the trailer's offset, ``SEAL``.
- **Location**: where a record lies (pack name, data offset, stored length)
  and how it decodes (kind, decoded size, depth, base).
"""

import struct
from dataclasses import dataclass
from typing import Optional

from .. import hashing
from ..errors import CorruptObject, PackDamaged
from . import codec  # the record kinds and the depth limit

HEADER = b"MVCPACK1"
HEADER_V2 = b"MVCPACK2"
HEADERS = {1: HEADER, 2: HEADER_V2}
SEAL = b"MVCSEAL1"
RECORD_HEAD = struct.Struct("<32sI")
ENTRY = struct.Struct("<32sQI")
ENTRY_V2 = struct.Struct("<32sQIBIB32s")  # id, offset, length, kind, size, depth, base id (zeros: none)
ENTRIES = {1: ENTRY, 2: ENTRY_V2}
FOOTER = struct.Struct("<32sQ8s")
COUNT = struct.Struct("<I")
NO_BASE = bytes(32)
NAME_BYTES = 16
SMALLEST = len(HEADER) + COUNT.size + FOOTER.size  # an empty sealed pack


@dataclass(frozen=True)
class Location:
    """Where a chunk's record lies: pack name (16 bytes), data offset, stored
    length; and how to decode it: kind (``codec.RAW``, ``GROUPED``, ``DELTA``),
    decoded size, delta depth and base id (None unless a delta)."""

    pack: bytes
    offset: int
    length: int
    kind: int = 0
    size: int = -1  # -1: the stored length (a raw record)
    depth: int = 0
    base: Optional[bytes] = None

    def __post_init__(self):
        if self.size < 0:
            object.__setattr__(self, "size", self.length)

    @property
    def coded(self) -> bool:
        return self.kind != 0


def coded_location(pack, offset, length, kind, size, depth, base, what: str) -> Location:
    """A Location from version 2 fields, checked; CorruptObject naming ``what`` if they cannot be."""
    delta = kind == codec.DELTA
    if kind not in codec.KINDS or (base != NO_BASE) != delta or (depth > 0) != delta or \
            (kind == codec.RAW and size != length) or depth > codec.MAX_DEPTH:
        raise CorruptObject(f"{what} is damaged (record kind {kind}, depth {depth})")
    return Location(pack, offset, length, kind, size, depth, base if delta else None)


def _damaged(what: str, detail: str, problem: str) -> PackDamaged:
    # ``what`` is "<noun> <name>" ("pack pack-….pack", "remote pack packs/….pack"): the name is the attribute
    return PackDamaged(f"{what} {detail}", pack=what.rpartition(" ")[2], problem=problem)


def version(header: bytes) -> int:
    """1 or 2 for a pack's first 8 bytes; 0 if they are no pack header."""
    return {HEADER: 1, HEADER_V2: 2}.get(bytes(header), 0)


# -- parsing ------------------------------------------------------------------

def trailer_span(footer: bytes, size: int, what: str) -> tuple:
    """(start, stop) of the trailer of a pack of ``size`` bytes whose last
    FOOTER.size bytes are ``footer``; PackDamaged if it is not sealed."""
    if size < SMALLEST or len(footer) < FOOTER.size:
        raise _damaged(what, "has no valid header or is truncated", "header")
    _, trailer_offset, seal = FOOTER.unpack(footer[-FOOTER.size:])
    if seal != SEAL or not len(HEADER) <= trailer_offset <= size - FOOTER.size - COUNT.size:
        raise _damaged(what, "is not sealed (truncated or damaged trailer)", "unsealed")
    return trailer_offset, size - FOOTER.size


def parse_trailer(body: bytes, footer: bytes, what: str, pack: bytes = NO_BASE[:NAME_BYTES],
                  pack_version: Optional[int] = None) -> list:
    """(id, Location in ``pack``) of every record a trailer lists, in order.

    ``body`` is the trailer (``trailer_span``), ``footer`` the pack's last
    bytes. Without ``pack_version`` the version follows from the entry
    size (a remote reads only a pack's tail). PackDamaged naming ``what``
    for a damaged trailer or an entry outside the pack's data.
    """
    digest, trailer_offset, _ = FOOTER.unpack(footer[-FOOTER.size:])
    if hashing.digest(body) != digest:
        raise _damaged(what, "has a damaged trailer (checksum mismatch)", "trailer-checksum")
    if len(body) < COUNT.size:
        raise _damaged(what, "trailer length does not match its count", "trailer-count")
    (count,) = COUNT.unpack_from(body)
    versions = [pack_version] if pack_version else [v for v, e in ENTRIES.items() if len(body) == 4 + count * e.size]
    if len(versions) != 1 or len(body) != COUNT.size + count * ENTRIES[versions[0]].size:
        raise _damaged(what, "trailer length does not match its count", "trailer-count")
    entry, out = ENTRIES[versions[0]], []
    for i in range(count):
        fields = entry.unpack_from(body, COUNT.size + i * entry.size)
        cid, offset, length = fields[:3]
        if offset < len(HEADER) + RECORD_HEAD.size or offset + length > trailer_offset:
            raise _damaged(what, "lists a record outside its data", "outside")
        if entry is ENTRY_V2:
            out.append((cid, coded_location(pack, *fields[1:], what=f"an entry of {what}")))
        else:
            out.append((cid, Location(pack, offset, length)))
    return out


def parse(data: bytes, what: str, pack: bytes = NO_BASE[:NAME_BYTES]) -> list:
    """(id, Location) of every record of a whole pack's bytes; PackDamaged if damaged."""
    v = version(data[:len(HEADER)])
    if not v or len(data) < SMALLEST:
        raise _damaged(what, "has no valid header or is truncated", "header")
    start, stop = trailer_span(data[-FOOTER.size:], len(data), what)
    return parse_trailer(data[start:stop], data[-FOOTER.size:], what, pack, v)


# -- building -----------------------------------------------------------------

def entry(cid: bytes, loc: Location, pack_version: int) -> bytes:
    """One trailer entry; ValueError for an encoded record in a version 1 pack."""
    if pack_version < 2:
        if loc.coded:
            raise ValueError("encoded records go only into version 2 packs")
        return ENTRY.pack(cid, loc.offset, loc.length)
    return ENTRY_V2.pack(cid, loc.offset, loc.length, loc.kind, loc.size, loc.depth, loc.base or NO_BASE)


def trailer(entries: list, trailer_offset: int, pack_version: int) -> bytes:
    """Trailer and footer for (id, Location) ``entries``, the trailer starting at ``trailer_offset``."""
    body = COUNT.pack(len(entries)) + b"".join(entry(cid, loc, pack_version) for cid, loc in entries)
    return body + FOOTER.pack(hashing.digest(body), trailer_offset, SEAL)


def layout(records: list, pack_version: int = 1, pack: bytes = NO_BASE[:NAME_BYTES]) -> tuple:
    """Where each of ``records`` (id, stored length, kind, decoded size, depth, base) lies in
    a pack holding them in order: ([(id, Location)], offset of the trailer)."""
    out, at = [], len(HEADER)
    for cid, n, *coding in records:
        out.append((cid, Location(pack, at + RECORD_HEAD.size, n, *coding)))
        at += RECORD_HEAD.size + n
    return out, at
