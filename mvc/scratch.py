"""Scratch space: the temporary files and folders commands make under ``.mvc/tmp``.

A **scratch** entry is named ``PREFIX<tag>-...`` by the process that made it
(``bisect-`` for the checkpoints ``bisect run`` hands its evaluation command,
``walk-`` for the live chunk records fsck and gc spill, ``mvc.sliced``);
its **tag** is ``<pid>-<place>``: the pid, and where it means that process
(host, boot and pid namespace, ``mvc.store.processes.place``). An older mvc
wrote the pid alone. A **leftover** is one whose process is gone (killed
before it cleaned up): nothing will use it again. The next run of the same
command and ``gc`` remove leftovers; ``fsck`` lists them. An entry of a live
process is never touched, whatever its age, nor one whose process cannot be
seen from here (another host, or a container with pids of its own).
"""

import os
import shutil
from pathlib import Path
from typing import Optional

from .store.processes import Seen, place, process_alive, seen_place

PREFIXES = ("bisect-", "walk-")  # walk-: the spills of fsck and gc (mvc.sliced)


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
        made = maker(name[len(prefix):])
        if made is None or gone(*made):  # no pid: an older mvc's, made by a finished process
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


def tag() -> str:
    """This process's tag, for the names of the scratch it makes."""
    return f"{os.getpid()}-{place()}"


def maker(rest: str) -> Optional[tuple]:
    """(pid, place) of the process that named an entry ``<tag>-<random>`` (``rest``: the
    name after its prefix); place None for an older mvc's ``<pid>-<random>``; None if
    it names no pid. The random parts hold no ``-``."""
    parts = rest.split("-")
    if not parts[0].isdigit():
        return None
    return int(parts[0]), parts[1] if len(parts) > 2 else None


def gone(pid: int, where: Optional[str] = None) -> bool:
    """Whether process ``pid`` of place ``where`` is known not to run any more (this
    process's own never counts as gone).

    ``where`` None is a name of an older mvc, which wrote the pid alone: it is
    judged by the pid, as that mvc did. Holding it instead would keep its
    checkpoints forever (scratch has no expiry), and what a wrong guess
    costs is a concurrent older bisect's evaluation, not history.
    """
    seen = Seen.HERE if where is None else seen_place(where)
    if seen is not Seen.HERE:
        return seen is Seen.ENDED  # ENDED: made on this host before it rebooted
    return pid != os.getpid() and not process_alive(pid, None)
