"""A fork server for the soak test: forks one process per operation, which the soak may SIGKILL.

Run as ``python soak_child.py``. It imports torch and mvc once and never opens a
repository itself (an LMDB environment must not cross a fork); for each JSON line
on stdin it forks a child that opens the repository, runs the operation and
reports on stdout, one line each: ``pid N`` when the child starts, then the
child's own lines (``landed ID`` after a commit, ``tip ID`` for a look,
``done`` at the end, ``error CLASS MESSAGE`` for an MvcError), and
``reaped N STATUS`` when it has died.

Operations (``op`` of the JSON line; every one names ``root``):
``commit`` (``branch``, ``sid``): commit ``soak_driver.make_state(sid)``;
``gc`` (``keep_last``): gc with retention and no grace; ``repack``;
``push`` (``remote``, ``branch``); ``fetch`` (``remote``);
``tip`` (``rev``): print the id ``rev`` names in a process that never had the
repository open (``tip -`` if none).
"""

import json
import sys

import torch

import mvc

from crash_child import fork_and_reap, say
from soak_driver import make_state


def run(cmd: dict) -> None:
    repo = mvc.Repository.open(cmd["root"])
    op = cmd["op"]
    try:
        if op == "commit":
            c = repo.commit(make_state(cmd["sid"]), f"sid {cmd['sid']}", step=cmd["sid"], branch=cmd["branch"])
            say(f"landed {c.id}")
        elif op == "gc":
            repo.gc(keep_last=cmd["keep_last"], grace=0)
        elif op == "repack":
            repo.repack()
        elif op == "push":
            repo.remotes.push(cmd["remote"], (cmd["branch"],))
        elif op == "fetch":
            repo.remotes.fetch(cmd["remote"])
        elif op == "tip":
            try:
                say(f"tip {repo.resolve(cmd['rev'])}")
            except mvc.UnknownRevision:
                say("tip -")
        say("done")
    except mvc.MvcError as exc:
        say(f"error {type(exc).__name__} {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        repo.close()


def serve() -> None:
    torch.set_num_threads(1)
    for line in sys.stdin:
        fork_and_reap(run, json.loads(line))


if __name__ == "__main__":
    serve()
