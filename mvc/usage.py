"""Where a repository's chunk bytes lie, for views that report storage.

Vocabulary:

- **raw bytes** of a chunk: its decoded size, the bytes its id names.
- **stored bytes**: the length of its record in a pack, smaller than raw
  for an encoded record (byte-grouped zstd or a delta, see ``mvc repack``).
- a chunk is **local** when the index names a pack for it; on a lazy clone
  or after an eviction most chunks are only on the remote.

Only the index is read, never pack contents, so these answer in the time
of an index scan whatever the size of the data.
"""

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class PackUsage:
    """One pack file: its size on disk and the indexed chunk records it holds."""

    name: str  # file name in .mvc/packs
    file_bytes: int
    chunks: int  # records the index points into this pack
    stored_bytes: int
    raw_bytes: int


def chunk_sizes(repo, ids: Iterable[bytes]) -> dict:
    """{chunk id: (stored bytes, raw bytes)} for the ids held locally; ids
    that are not local (a lazy clone's, evicted ones) are left out."""
    out = {}
    with repo.index.read() as txn:
        for cid in ids:
            loc = txn.chunk(cid)
            if loc is not None:
                out[cid] = (loc.length, loc.size)
    return out


def pack_usage(repo) -> list:
    """PackUsage for every sealed local pack, by name (one index scan)."""
    files = {f.pack: f.size for f in repo.chunks.pack_files() if f.regular and f.pack is not None}
    counts = {name: [0, 0, 0] for name in files}
    with repo.index.read() as txn:
        for _, loc in txn.chunks():
            figures = counts.setdefault(loc.pack, [0, 0, 0])
            figures[0] += 1
            figures[1] += loc.length
            figures[2] += loc.size
    out = []
    for name, (chunks, stored, raw) in sorted(counts.items()):
        out.append(PackUsage(f"pack-{name.hex()}.pack", files.get(name, 0), chunks, stored, raw))
    return out
