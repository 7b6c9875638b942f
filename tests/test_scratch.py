"""Scratch entries and export leftovers: removed once their process is known to be gone, and only then."""

import os
import subprocess
import sys

from mvc import scratch
from mvc.files import remove_leftovers
from mvc.store import processes


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def places() -> dict:
    """This process's place, and places that differ from it in one part each."""
    mine = processes.place()
    other = "".join("0" if c != "0" else "1" for c in mine)  # differs in every digit
    host, boot, ns = (slice(0, 8), slice(8, 16), slice(16, 24))
    swap = lambda part: mine[:part.start] + other[part] + mine[part.stop:]  # noqa: E731
    return {"here": mine, "other host": swap(host), "rebooted": swap(boot), "other pid namespace": swap(ns)}


def test_leftovers_are_judged_by_pid_only_in_this_pid_namespace(tmp_path):
    pid, at = dead_pid(), places()
    names = {kind: f"bisect-{pid}-{place}-x" for kind, place in at.items()}
    names["older mvc"] = f"bisect-{pid}-x"  # the pid alone: judged by it, as before
    names["live"] = f"bisect-{os.getpid()}-{at['here']}-x"
    for name in names.values():
        (tmp_path / "tmp" / name).mkdir(parents=True)
    gone = {names[kind] for kind in ("here", "rebooted", "older mvc")}
    assert [p.name for p in scratch.leftovers(tmp_path)] == sorted(gone)
    assert scratch.tag() == f"{os.getpid()}-{at['here']}"


def test_export_leftovers_of_another_pid_namespace_are_left_alone(tmp_path):
    pid, at = dead_pid(), places()
    target = tmp_path / "model.pt"
    mine, theirs, older = (tmp_path / f".model.pt.tmp{pid}{tail}"
                           for tail in (f"-{at['here']}", f"-{at['other pid namespace']}", ""))
    for path in (mine, theirs, older):
        path.write_bytes(b"half")
    assert sorted(remove_leftovers(target)) == sorted([mine, older])
    assert theirs.exists() and not mine.exists()


def test_an_init_staging_folder_of_another_pid_namespace_is_left_alone(tmp_path):
    import mvc
    pid, at = dead_pid(), places()
    killed = tmp_path / f".mvc-init-{pid}-{at['here']}-0123456789abcdef"
    theirs = tmp_path / f".mvc-init-{pid}-{at['other pid namespace']}-fedcba9876543210"
    killed.mkdir()
    theirs.mkdir()
    mvc.Repository.init(tmp_path).close()
    assert theirs.is_dir() and not killed.exists()
