"""The ``.mvc`` folder on disk: where it is, its ``FORMAT`` file, and how ``init`` lays it out.

Vocabulary:

- **FORMAT**: ``mvc-format N`` and ``extensions A B ...``; an mvc refuses a
  version newer than it reads or an extension it does not know
  (``docs/format.md``).
- **extension**: a feature a repository uses that an older mvc would
  misread, named in FORMAT *before* the first data that needs it is
  written (``require_extension``), so a crash in between leaves only a
  harmless flag.
"""

import errno
import os
import secrets
import shutil
from pathlib import Path

from . import refs, scratch
from .errors import BadInput, CorruptObject, NotARepository, RepositoryExists, UnsupportedFormat
from .store import fs
from .store.index import Index

MVC_DIR = ".mvc"
FORMAT_VERSION = 1
SEALED_VALUES = "sealed-values"  # refs, reflog, locks and pruned notes carry checksums (format.md 5.8)
# encoded-records: packs of version 2, whose records may be byte-grouped zstd
# or deltas (docs/format.md 4.2); written to FORMAT before the first such pack
# is indexed, so an mvc that cannot decode them refuses the repository.
ENCODED_RECORDS = "encoded-records"
SIGNATURES = "signatures"  # commit objects may carry a signature field (format.md 7.3.1)
SHARDED = "sharded"  # commits of sharded saves: trees may carry DCP metadata (format.md 7.2.1)
DICT_METADATA = "dict-metadata"  # trees may carry torch's _metadata of their dicts (format.md 7.2.2)
LOCK_HOLDERS = "lock-holders"  # lock records carry pidns and flock (format.md 5.5)
# pack-indexes: chunks are located by registered per-pack index files (pack-<name>.pidx) and the
# chunks table holds overrides and tombstones (format.md 5.10); listed before the first is written.
PACK_INDEXES = "pack-indexes"
KNOWN_EXTENSIONS: frozenset = frozenset({SEALED_VALUES, ENCODED_RECORDS, SHARDED, SIGNATURES, DICT_METADATA,
                                         LOCK_HOLDERS, PACK_INDEXES})
# 256 KiB, from benchmarks/bench_core.py --chunk-sizes (1 GiB state): commits
# and loads are as fast as with 1-4 MiB chunks (per-chunk costs show only at
# 128 KiB and below), while a few touched embedding rows rewrite a quarter
# as many bytes as with 1 MiB (storage 1.012x vs 1.042x the changed bytes).
DEFAULT_CHUNK_SIZE = 256 << 10
MAX_WRITE_CHUNK = 1 << 30  # the writer's limit: one read of a chunk must stay under Linux's 2 GiB per call
SUBDIRS = ("packs", "tmp", "locks", "index")


def find_root(path) -> Path:
    """The directory holding ``.mvc``: ``path`` or the nearest parent that has one."""
    start = Path(path).resolve()
    for candidate in (start, *start.parents):
        if (candidate / MVC_DIR).is_dir():  # .mvc itself may be a link (to another disk); nothing inside may
            return candidate
    raise NotARepository(f"not an mvc repository (nor is any parent): {start}", path=str(start))


def read_format(mvc_dir: Path) -> tuple:
    """(format version, set of extensions) in ``FORMAT``; UnsupportedFormat if this mvc cannot read it."""
    try:
        lines = fs.read_small(mvc_dir / "FORMAT", 1 << 16).decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError, CorruptObject):
        raise NotARepository(f"{mvc_dir} has no readable FORMAT file; it is not an mvc repository",
                              path=str(mvc_dir)) from None
    pairs = [line.partition(" ")[::2] for line in lines if line.strip()]
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise UnsupportedFormat(f"{mvc_dir}/FORMAT is damaged: a key appears twice", problem="damaged")
    version = fields.get("mvc-format", "")
    if not (version.isascii() and version.isdigit()) or int(version) < 1:
        raise UnsupportedFormat(f"{mvc_dir}/FORMAT is damaged: no 'mvc-format N' line", problem="damaged")
    if int(version) > FORMAT_VERSION:
        raise UnsupportedFormat(f"repository format {version} is newer than this mvc reads "
                                f"({FORMAT_VERSION}); upgrade mvc", problem="newer", version=int(version))
    extensions = set(fields.get("extensions", "").split())
    unknown = extensions - KNOWN_EXTENSIONS
    if unknown:
        raise UnsupportedFormat(f"repository uses extensions this mvc does not know: {sorted(unknown)}",
                                problem="extensions", extensions=sorted(unknown))
    return int(version), extensions


def write_format(mvc_dir: Path, extensions) -> None:
    """Write ``FORMAT`` atomically (temporary file, fsync, rename)."""
    fs.atomic_write(mvc_dir / "FORMAT", f"mvc-format {FORMAT_VERSION}\nextensions {' '.join(sorted(extensions))}\n"
                    .replace("extensions \n", "extensions\n").encode())


def require_extension(mvc_dir: Path, name: str) -> None:
    """List extension ``name`` in ``FORMAT`` (atomically, ``write_format``). Called
    before the first data that needs it is indexed; a crash after it leaves a
    flag nothing needs yet, which is harmless."""
    _, extensions = read_format(mvc_dir)
    if name not in extensions:
        write_format(mvc_dir, extensions | {name})


def _remove_killed_inits(root: Path) -> None:
    """Remove the staging folders of inits in ``root`` that were killed (their process is gone)."""
    for path in root.glob(".mvc-init-*-*"):
        made = scratch.maker(path.name[len(".mvc-init-"):])
        if made is not None and scratch.gone(*made) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _populate(mvc_dir: Path, chunk_size: int) -> None:
    """Lay out an empty repository in ``mvc_dir``: folders, index, FORMAT."""
    for sub in ("packs", "tmp", "locks"):
        (mvc_dir / sub).mkdir()
    index = Index(mvc_dir / "index", create=True)
    try:
        with index.write() as txn:
            txn.put_meta("chunk_size", chunk_size.to_bytes(8, "little"))
            refs.Refs.attach(txn, refs.BRANCHES + "main")
    finally:
        index.close()
    write_format(mvc_dir, {SEALED_VALUES})


def create(path, chunk_size: int) -> Path:
    """Create ``path/.mvc`` (staged under a temporary name, then renamed into
    place); the repository's root. RepositoryExists if it is there."""
    if not isinstance(chunk_size, int) or not 1 <= chunk_size <= MAX_WRITE_CHUNK:
        raise BadInput(f"chunk size must be between 1 byte and 1 GiB, not {chunk_size}")
    root = Path(path)
    mvc_dir = root / MVC_DIR
    if os.path.lexists(mvc_dir):
        raise RepositoryExists(f"{mvc_dir} already exists")
    # Built under a temporary name and renamed into place, so an
    # interrupted init never leaves a half-made .mvc behind.
    root.mkdir(parents=True, exist_ok=True)
    _remove_killed_inits(root)
    staging = root / f".mvc-init-{scratch.tag()}-{secrets.token_hex(8)}"
    staging.mkdir()  # not mkdtemp: that would make .mvc 0700 whatever the umask says
    try:
        _populate(staging, chunk_size)
        try:
            os.rename(staging, mvc_dir)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another init won the race
                raise RepositoryExists(f"{mvc_dir} already exists") from None
            raise
        fs.fsync_dir(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return root
