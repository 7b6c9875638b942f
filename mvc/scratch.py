"""Scratch space: the temporary files and folders commands make under ``.mvc/tmp``.

A **scratch** entry is named ``PREFIX<pid>-...`` by the process that made it
(``bisect-`` for the checkpoints ``bisect run`` hands its evaluation command).
A **leftover** is one whose process is gone (killed before it cleaned up):
nothing will use it again. The next run of the same command and ``gc``
remove leftovers; ``fsck`` lists them. An entry of a live process is never
touched, whatever its age.
"""

import os
import shutil
from pathlib import Path

PREFIXES = ("bisect-",)


def leftovers(mvc_dir) -> list:
    """Paths of the scratch entries under ``mvc_dir/tmp`` whose process is gone, sorted."""
    tmp = Path(mvc_dir) / "tmp"
    try:
        names = sorted(os.listdir(tmp))
    except OSError:
        return []
    out = []
    for name in names:
        prefix = next((p for p in PREFIXES if name.startswith(p)), None)
        if prefix is None:
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or gone(int(pid)):  # no pid: an older mvc's, made by a finished process
            out.append(tmp / name)
    return out


def remove_leftovers(mvc_dir) -> list:
    """Remove what ``leftovers`` finds (links inside are removed, never followed); their paths."""
    removed = []
    for path in leftovers(mvc_dir):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        removed.append(path)
    return removed


def gone(pid: int) -> bool:
    """Whether no process ``pid`` runs here (this process's own never counts as gone)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OverflowError:  # no such pid can exist
        return True
    except PermissionError:  # another user's live process
        return False
    return False
