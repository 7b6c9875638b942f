"""The one check of bytes read against the id they were asked for.

Vocabulary:

- **id**: the 32-byte BLAKE3 digest that names a chunk or object;
- **what**: the words that name the bytes in an error ("tensor 'w' in commit
  1a2b3c4d5e6f", "object"), empty when the id alone says it;
- **where**: where they were read ("offset 4096 in pack-….pack", "remote pack
  chunks/…"), empty when unknown.

Every reader of stored or fetched bytes (local packs, decoded records, remote
packs, the object store, salvage) proves them here before anyone sees them:
``verified`` returns the bytes or raises ``HashMismatch``; ``intact`` is the
same test as a value, for checkers that collect damage instead of stopping.

``record_fault`` is the one judgement of a raw pack record read back (its
header and its bytes), shared by the local pack check (``ChunkStore.check_packs``)
and the remote check (``mvc.remote.check``), which read the bytes their own way.
"""

from typing import Optional

from .. import hashing
from ..errors import HashMismatch, RemoteCorrupt
from .packformat import RECORD_HEAD

# What can be wrong with one record read back (``record_fault``).
BAD_RECORD, CHECKSUM = "bad-record-header", "checksum-mismatch"


def intact(cid: bytes, data) -> bool:
    """Whether ``data`` (any bytes-like object) hashes to ``cid``."""
    return hashing.digest(data) == cid


def mismatch(cid: bytes, what: str = "", where: str = "", base: bytes = None, noun: str = "chunk",
             key: str = None) -> HashMismatch:
    """The error for bytes that do not hash to ``cid`` (``base``: a damaged delta base that explains it;
    ``noun``: "chunk" or "object"; ``key``: the remote object they came from, which makes it a
    RemoteCorrupt)."""
    named = f"{noun} {cid.hex()[:12]}" + (f" of {what}" if what else "")
    read = f" read from {where}" if where else ""
    why = f" (its delta base {base.hex()[:12]} is damaged)" if base else ""
    message = f"{named}{read} is corrupt (BLAKE3 mismatch){why}"
    if key is not None:
        return RemoteCorrupt(message + "; nothing was stored", key=key, id=cid, what=what, where=where, base=base)
    return HashMismatch(message, id=cid, what=what, where=where, base=base)


def verified(cid: bytes, data, what: str = "", where: str = "", noun: str = "chunk", key: str = None):
    """``data``, once it is proven to hash to ``cid``; HashMismatch naming ``what`` and ``where`` if not
    (RemoteCorrupt naming ``key`` too, for bytes read from a remote)."""
    if hashing.digest(data) != cid:
        raise mismatch(cid, what, where, noun=noun, key=key)
    return data


def record_fault(cid: bytes, length: int, head, data) -> Optional[str]:
    """What is wrong with a raw record that its pack lists as chunk ``cid`` of ``length`` bytes,
    read back as its header ``head`` and its bytes ``data``: BAD_RECORD if the header names
    another id or length, CHECKSUM if the bytes do not hash to ``cid``; None if it is intact."""
    if RECORD_HEAD.unpack(head) != (cid, length):
        return BAD_RECORD
    if not intact(cid, data):
        return CHECKSUM
    return None
