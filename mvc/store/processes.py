"""Processes that other processes recorded: where they ran, and whether they still run.

A lock, a lease or a scratch folder names the process that holds it. Whether
that process still runs can only be asked of the kernel that runs it, and
only with a pid from the same pid namespace. Vocabulary:

- **start token**: ``<boot id>/<start time in clock ticks since boot>`` of a
  process: it tells this run of a pid from a later process reusing the number.
- **pid namespace**: what ``/proc/self/ns/pid`` links to, e.g.
  ``pid:[4026531836]``; None where there is no ``/proc``. Containers started
  with ``--network=host`` share the host's name and kernel (its boot id) but
  each has a pid namespace of its own: a pid recorded in one names another
  process, or none, in the other.
- **where** a record was written, as seen by the reader (``Seen``): ``HERE``
  (this host, this boot, this pid namespace: its pid can be asked about),
  ``ENDED`` (this host's name, another boot: this machine before it
  rebooted, whose processes are all gone, unless another machine has the
  same name; callers that may share records across machines wait) or
  ``ELSEWHERE`` (another host or pid namespace, or not recorded: nobody here
  can tell whether it runs).
- **place**: a short token of the three (host, boot, pid namespace), for
  names of files and folders that carry no record (scratch).
"""

import enum
import functools
import os
import socket
from pathlib import Path
from typing import Optional

from ..hashing import digest


class Seen(enum.Enum):
    HERE = "here"
    ENDED = "ended"
    ELSEWHERE = "elsewhere"


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> Optional[str]:
    """This process's pid namespace (``pid:[4026531836]``); None without /proc.

    Not cached: a child forked after ``unshare(CLONE_NEWPID)`` runs in another one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _proc_stat(pid: int) -> Optional[tuple]:
    """(state letter, start time in clock ticks since boot) from /proc; None without /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()  # the command name may hold spaces and parens
    if len(fields) < 20:
        return None
    return fields[0], fields[19]


def start_token(pid: int) -> Optional[str]:
    """What tells this run of ``pid`` from a later process reusing the number."""
    stat = _proc_stat(pid)
    return None if stat is None else f"{boot_id()}/{stat[1]}"


def process_alive(pid: int, started: Optional[str]) -> bool:
    """Whether process ``pid`` still runs and is the one that started at ``started``.

    Only meaningful for a pid recorded ``HERE`` (see ``seen``)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no such pid can exist
        return False
    except PermissionError:  # another user's process: alive
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    if stat[0] in ("Z", "X"):  # killed but not yet reaped: it will never write again
        return False
    return started is None or started == f"{boot_id()}/{stat[1]}"


def _boot_of(started) -> Optional[str]:
    """The boot id in a start token; None if unknown (an unknown boot is not an earlier one)."""
    if not isinstance(started, str):
        return None
    return started.rpartition("/")[0] or None


def same_boot(started) -> bool:
    """Whether the start token ``started`` was taken in this boot of this kernel (False if unknown)."""
    boot = _boot_of(started)
    return boot is not None and boot == boot_id()


def seen(host, started, pidns) -> Seen:
    """Where a process that recorded ``host``, its start token ``started`` and its pid
    namespace ``pidns`` ran, as seen from this process.

    The fields come from records others wrote and may have any type. A
    record without a pid namespace (an older mvc's) is ``ELSEWHERE`` unless
    this process has none either (no /proc: no pid namespaces to tell apart).
    """
    if host != socket.gethostname():
        return Seen.ELSEWHERE
    boot = _boot_of(started)
    if boot is not None and boot != boot_id():
        return Seen.ENDED
    return Seen.HERE if pidns == pid_namespace() else Seen.ELSEWHERE


def _short(text: str) -> str:
    return digest(text.encode("utf-8", "replace"))[:4].hex()


def place() -> str:
    """This process's place: 24 hex digits, 8 each for its host, boot and pid namespace."""
    return _short(socket.gethostname()) + _short(boot_id()) + _short(pid_namespace() or "")


def seen_place(token: str) -> Seen:
    """``seen`` for a ``place`` token (ELSEWHERE for anything that is not one)."""
    mine = place()
    if len(token) != len(mine) or token[:8] != mine[:8]:
        return Seen.ELSEWHERE
    if token[8:16] not in (mine[8:16], _short("")):  # an unknown boot is not an earlier one
        return Seen.ENDED
    return Seen.HERE if token[16:] == mine[16:] else Seen.ELSEWHERE
