"""The public Repository: the core (``BaseRepository``) plus the higher verbs.

The verbs live in their own modules (fsck, gc, diff, bisect) and take a
repository; the methods here only forward to them, so the layers point down.
"""

from dataclasses import dataclass
from pathlib import Path

from . import bisect as _bisect
from . import diff as _diff
from . import fsck as _fsck
from . import files as _files
from . import gc as _gc
from .errors import BadInput
from .repository import BaseRepository


@dataclass(frozen=True)
class Export:
    """A checkpoint file written by ``Repository.export``."""

    commit: str
    path: Path
    format: str
    left_out: int = 0  # plain values a safetensors file cannot hold


class Repository(BaseRepository):
    """A ``.mvc`` repository. ``Repository.init(path)`` creates one,
    ``Repository.open(path)`` finds one in ``path`` or above."""

    def fsck(self, quick: bool = False, threads=None, progress=None) -> "_fsck.FsckReport":
        """Check everything reachable; see ``mvc.fsck.fsck``."""
        return _fsck.fsck(self, quick=quick, threads=threads, progress=progress)

    def rebuild_index(self) -> "_fsck.RebuildReport":
        """Rebuild the chunk index from the packs' trailers; see ``mvc.fsck.rebuild_index``."""
        return _fsck.rebuild_index(self)

    def diff(self, a: str, b=None, only=None):
        """Compare commit ``a`` with ``b`` (default HEAD); see ``mvc.diff.diff``."""
        return _diff.diff(self, a, b, only)

    def bisect(self, good: str, bad: str, is_good, branch=None, progress=None):
        """Find the first commit after ``good`` for which ``is_good(state)`` is
        False; see ``mvc.bisect.bisect``."""
        return _bisect.bisect(self, good, bad, is_good, branch=branch, progress=progress)

    def gc(self, keep_last=None, branch=None, keep_best=None, mode: str = "min", top: int = 1,
           force: bool = False, dry_run: bool = False) -> "_gc.GcReport":
        """Prune by retention, delete what nothing reaches, reclaim pack space; see ``mvc.gc.gc``."""
        return _gc.gc(self, keep_last=keep_last, branch=branch, keep_best=keep_best, mode=mode, top=top,
                      force=force, dry_run=dry_run)

    def export(self, rev: str, path, fmt=None, progress=None) -> Export:
        """Write the checkpoint at ``rev`` to ``path`` as "pt" or "safetensors"
        (default: from the suffix, else pt); see ``mvc.files.write_checkpoint``."""
        fmt = fmt or ("safetensors" if Path(path).suffix.lower() == ".safetensors" else "pt")
        if fmt not in _files.FORMATS:
            raise BadInput(f"unknown format {fmt!r}; use pt or safetensors")
        commit = self.resolve(rev)
        state = self.load(commit, progress=progress)
        left_out = _files.plain_values(state) if fmt == "safetensors" else 0
        return Export(commit, _files.write_checkpoint(state, path, fmt), fmt, left_out)
