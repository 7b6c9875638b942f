"""Fault injection on disk: flip a bit, truncate, overwrite; where records lie.

Each helper damages a real file the way storage does; tests for fsck, load
and the damaged-repository folder share them.
"""

from contextlib import contextmanager
from pathlib import Path

from mvc.store.packs import ENTRY, FOOTER, HEADER, RECORD_HEAD, read_trailer


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    """Toggle one bit of ``path`` in place (calling it again undoes it)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


@contextmanager
def flipped(path: Path, offset: int, bit: int = 0):
    """A bit flipped for the duration of the block, then restored."""
    flip_bit(path, offset, bit)
    try:
        yield
    finally:
        flip_bit(path, offset, bit)


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def pack_files(repo) -> list:
    """The sealed pack files of ``repo``, in name order."""
    return sorted((repo.dir / "packs").glob("pack-*.pack"))


def records(repo) -> list:
    """(pack path, chunk id, data offset, length) of every record in every sealed pack."""
    return [(path, cid, off, n) for path in pack_files(repo) for cid, off, n in read_trailer(path)]


def metadata_ranges(path: Path) -> list:
    """(start, end) byte ranges of a sealed pack that are not chunk data:
    the header, each record header, and the trailer with its footer."""
    entries = read_trailer(path)
    ranges = [(0, len(HEADER))]
    ranges += [(off - RECORD_HEAD.size, off) for _, off, _ in entries]
    end = max((off + n for _, off, n in entries), default=len(HEADER))
    ranges.append((end, path.stat().st_size))
    assert path.stat().st_size - end == 4 + len(entries) * ENTRY.size + FOOTER.size
    return ranges
