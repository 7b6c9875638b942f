"""The layout of a remote: which keys hold what, and the bytes of each (``docs/format.md`` section 11).

Vocabulary:

- **chunk pack** (``packs/<name>.pack``): many chunk records in one object,
  in exactly the local pack format (header, records, trailer, footer), so
  a ranged GET of a record's bytes reads one chunk and the trailer lists
  what the pack holds.
- **object pack** (``objects/<name>.pack``): the same format, whose records
  are commit, tree and tensor objects (and notes of pruned commits); a
  record's id is the BLAKE3 of its bytes, like every id.
- **where hint** (``where/<name>``): for the tensor objects of object pack
  ``objects/<name>.pack``, which chunk packs their chunks lie in
  (``mvc.remote.where``); only ever a speed matter.
- **ref** (``refs/heads/NAME``, ``refs/tags/NAME``): a small object naming a
  commit; moved only by conditional puts, after everything it reaches is on
  the remote. ``HEAD`` names the default branch, ``locks/NAME`` a branch's
  write lock, ``MVCREMOTE`` the layout version.
"""

import os
import secrets
import time
from typing import Optional

import numpy as np

from .. import encoding, hashing, refs as refnames
from ..errors import CorruptObject, InvalidRefName, LockDamaged
from ..store import packformat
from ..store.packformat import FOOTER, HEADER, RECORD_HEAD  # noqa: F401 (FOOTER: callers size a pack's tail with it)
from .backend import _KEY

# layout 2: refs and tombstones carry a ``fence`` and gc leases ``condemned`` (docs/format.md 11.1.1,
# 11.6); an mvc that reads only layout 1 refuses such a remote by its MVCREMOTE ("upgrade mvc")
# instead of reading its fenced refs as damaged. Writers upgrade a layout-1 remote before their
# first such write (``Connection.upgrade``); layout 1 is still read.
LAYOUT_VERSION = 2
READS = (1, 2)
MARKER = "MVCREMOTE"
CHUNK_PACKS, OBJECT_PACKS, REFS, LOCKS, HEAD = "packs/", "objects/", "refs/", "locks/", "HEAD"
WHERE = "where/"  # where hints, one per object pack (docs/format.md 11.8, ``mvc.remote.where``)
# 32 MiB packs, from benchmarks/bench_remote.py --pack-sizes on SeaweedFS: a
# first push of 1 GiB ran as fast with 32 MiB packs as with 64-128 MiB (the
# per-object cost is gone by 16 MiB), while a killed push loses at most a few
# packs in flight and a fetch of one version never reads a whole large pack.
PACK_BYTES = int(os.environ.get("MVC_REMOTE_PACK_BYTES", 32 << 20))  # the variable: a knob for tests
NAME_BYTES = 16


def marker(chunk_size: int) -> bytes:
    return f"mvc-remote {LAYOUT_VERSION}\nchunk-size {chunk_size}\n".encode()


def parse_marker(data: bytes, url: str) -> int:
    """The chunk size a remote's MVCREMOTE names; CorruptObject if it is not one this mvc reads."""
    return read_marker(data, url)[1]


def read_marker(data: bytes, url: str) -> tuple:
    """(layout, chunk size) a remote's MVCREMOTE names; CorruptObject if it is not one this mvc reads."""
    try:
        fields = dict(line.split(" ", 1) for line in data.decode().splitlines() if line)
        version, size = int(fields["mvc-remote"]), int(fields["chunk-size"])
    except (ValueError, KeyError, UnicodeDecodeError):
        raise CorruptObject(f"{url}/{MARKER} is damaged; it is not an mvc remote") from None
    if version not in READS:
        raise CorruptObject(f"{url} uses remote layout {version}; this mvc reads layouts "
                            f"{', '.join(map(str, READS))}: upgrade mvc")
    return version, size


def new_name() -> bytes:
    return secrets.token_bytes(NAME_BYTES)


def pack_key(folder: str, name: bytes) -> str:
    return f"{folder}{name.hex()}.pack"


def where_key(object_pack: str) -> str:
    """The key of the where hint of object pack ``object_pack`` (``objects/<name>.pack``)."""
    return WHERE + pack_name(object_pack).hex()


def pack_name(key: str) -> Optional[bytes]:
    """The 16-byte name in a pack key, or None if ``key`` is not a pack's."""
    stem = key.rpartition("/")[2]
    if not stem.endswith(".pack") or len(stem) != 2 * NAME_BYTES + 5:
        return None
    try:
        return bytes.fromhex(stem[:-5])
    except ValueError:
        return None


class PackImage:
    """One pack built in memory for upload: headers and trailer first, data filled in after.

    ``items`` are (id, length); ``slot(i)`` is the writable view where record
    ``i``'s bytes go; ``offsets[i]`` where they lie in the object. ``buffer``
    (a bytearray at least ``PackImage.size(items)`` long, say one a sent
    image left) is written into instead of new memory; ``data`` is then a
    view of its first bytes.
    """

    def __init__(self, items: list, buffer: Optional[bytearray] = None):
        self.items = items
        located, size = packformat.layout(items)
        self.offsets = [loc.offset for _, loc in located]
        tail = packformat.trailer(located, size, 1)
        self.buffer = buffer if buffer is not None and len(buffer) >= size + len(tail) else bytearray(size + len(tail))
        self._view = memoryview(self.buffer)[:size + len(tail)]
        self.data = self.buffer if len(self.buffer) == size + len(tail) else self._view
        self._view[:len(HEADER)] = HEADER
        for cid, loc in located:
            self._view[loc.offset - RECORD_HEAD.size:loc.offset] = RECORD_HEAD.pack(cid, loc.length)
        self._view[size:] = tail

    @staticmethod
    def size(items: list) -> int:
        """The bytes of a pack object holding ``items`` (id, length)."""
        return packformat.layout(items)[1] + packformat.COUNT.size + len(items) * packformat.ENTRY.size + FOOTER.size

    def slot(self, i: int) -> memoryview:
        return self._view[self.offsets[i]:self.offsets[i] + self.items[i][1]]


def trailer_span(tail: bytes, size: int, key: str) -> tuple:
    """(start, stop) of a pack object's trailer, from its last bytes; CorruptObject if not sealed."""
    return packformat.trailer_span(tail, size, f"remote pack {key}")


def parse_trailer(body: bytes, footer: bytes, size: int, key: str) -> list:
    """The (id, data offset, length) records a pack's trailer lists, checked as for local packs
    (``store/packformat.py``; a version 2 pack's encoded records are listed with their stored length)."""
    return [(cid, loc.offset, loc.length) for cid, loc in packformat.parse_trailer(body, footer, f"remote pack {key}")]


_ENTRY_V1 = np.dtype([("id", "V32"), ("offset", "<u8"), ("length", "<u4")])  # packformat.ENTRY as an array


def parse_trailer_table(body: bytes, footer: bytes, size: int, key: str) -> tuple:
    """``parse_trailer``'s records as (ids, offsets, lengths): a list of 32-byte ids and two numpy
    arrays, checked the same way in numpy (a pack of 64-byte chunks lists some 3·10⁵ records)."""
    digest, trailer_offset, _ = FOOTER.unpack(footer[-FOOTER.size:])
    count = int.from_bytes(body[:packformat.COUNT.size], "little") if len(body) >= packformat.COUNT.size else -1
    if hashing.digest(body) != digest or len(body) != packformat.COUNT.size + count * _ENTRY_V1.itemsize:
        entries = parse_trailer(body, footer, size, key)  # a version 2 trailer, or damage: its error
        return ([cid for cid, _, _ in entries], np.array([o for _, o, _ in entries], dtype=np.uint64),
                np.array([n for _, _, n in entries], dtype=np.uint64))
    table = np.frombuffer(body, dtype=_ENTRY_V1, offset=packformat.COUNT.size, count=count)
    offsets, lengths = table["offset"].astype(np.uint64), table["length"].astype(np.uint64)
    if count and (int(offsets.min()) < len(HEADER) + RECORD_HEAD.size or
                  int((offsets + lengths).max()) > trailer_offset):
        parse_trailer(body, footer, size, key)  # raises, naming what is wrong
    raw = np.ascontiguousarray(table["id"]).tobytes()
    return [raw[i:i + 32] for i in range(0, len(raw), 32)], offsets, lengths


# -- refs -----------------------------------------------------------------------

def ref_key(ref: str) -> str:
    """The key of local ref ``heads/X`` / ``tags/X`` on a remote; InvalidRefName if a name cannot be a key."""
    key = REFS + ref
    if not _KEY.fullmatch(key):
        raise InvalidRefName(f"{refnames.human(ref)} cannot be pushed: remote ref names may hold only "
                             "letters, digits, '.', '_', '-' and '/'")
    return key


FENCE_BYTES = 16


def encode_ref(oid: bytes, protected: bool) -> bytes:
    """A ref object; every write carries a fresh random ``fence``, so no two writes of a ref have the
    same bytes (nor etag): a conditional put against an etag read before a remote gc fenced the ref
    fails, however long its writer stalled (``docs/format.md`` 11.6)."""
    return encoding.pack({"id": oid, "protected": bool(protected), "fence": secrets.token_bytes(FENCE_BYTES)})


def decode_ref(data: bytes, key: str) -> tuple:
    """(commit id, protected) of a remote ref object; CorruptObject if damaged."""
    value = encoding.unpack(data, f"remote ref {key}")
    if type(value) is not dict or set(value) - {"fence"} != {"id", "protected"} or type(value["id"]) is not bytes \
            or len(value["id"]) != hashing.DIGEST_SIZE or type(value["protected"]) is not bool \
            or type(value.get("fence", b"")) is not bytes:
        raise CorruptObject(f"remote ref {key} is damaged")
    return value["id"], value["protected"]


def encode_tombstone(when: float) -> bytes:
    """A deleted ref: its object stays, so a later create still goes by If-Match on this one's etag
    and a racing writer's conditional put fails instead of being undone by a plain delete. Fenced
    as a ref is (``encode_ref``)."""
    return encoding.pack({"deleted": True, "time": float(when), "fence": secrets.token_bytes(FENCE_BYTES)})


def is_tombstone(data: bytes) -> bool:
    try:
        value = encoding.unpack(data, "remote ref")
    except CorruptObject:
        return False
    return type(value) is dict and value.get("deleted") is True


def encode_head(target: str) -> bytes:
    return encoding.pack({"target": target})


def decode_head(data: bytes) -> Optional[str]:
    try:
        value = encoding.unpack(data, "remote HEAD")
    except CorruptObject:
        return None
    target = value.get("target") if type(value) is dict else None
    return target if isinstance(target, str) and target.startswith(refnames.BRANCHES) else None


def encode_lock(owner: str, host: str, since: float) -> bytes:
    return encoding.pack({"owner": owner, "host": host, "since": float(since)})


def decode_lock(data: bytes, key: str, remote: str = "") -> dict:
    value = encoding.unpack(data, f"remote lock {key}")
    if type(value) is not dict or not isinstance(value.get("owner"), str):
        raise LockDamaged(f"remote lock {key} is damaged", branch=key.removeprefix(LOCKS), remote=remote)
    return value


def encode_pruned(commit: bytes, note: dict) -> bytes:
    """A note that retention pruned ``commit``'s data, as an object-pack record."""
    return encoding.pack({"type": "pruned", "commit": commit, "time": int(note.get("time", 0)),
                          "policy": str(note.get("policy", "retention"))})
