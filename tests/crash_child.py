"""A fork server for the crash tests: forks writers that the test kills with SIGKILL.

Run as ``python crash_child.py REPO``. It imports mvc and torch once, then
for each command line on stdin forks a child and reports on stdout:
``pid N`` when the child starts, ``reaped N STATUS`` when it has died.

Commands (one per line): ``commit PHASE NTH`` commits the next step to
``main`` in a loop; ``gc PHASE NTH`` commits three steps, then runs gc with
retention. The NTH time the child reaches PHASE it prints ``in PHASE`` and
sleeps, so the test's SIGKILL lands inside that phase; ``random`` phases
never stop. The child prints ``landed ID STEP`` after each commit.
``head - 0 0`` forks a child that opens the repository and prints ``head ID``
(what a new process sees).

Phases, where the child stops (by wrapping mvc's functions inside the child
only, never in the library):
``pack`` after a record was appended to the unsealed pack; ``rename``
after the pack was written and fsynced, before it is renamed into place;
``index`` inside the commit's index transaction; ``gc-sweep`` inside gc's
deleting transaction; ``gc-copy`` while live records are copied to a new
pack; ``gc-relocate`` inside the transaction that moves index entries to
it; ``gc-unlink`` after gc deleted its first pack file.
"""

import os
import sys
import time
import traceback

import torch

import mvc
from mvc import gc as mvc_gc
from mvc.store import index, packs

COMMIT_PHASES = ("pack", "rename", "index")
GC_PHASES = ("gc-sweep", "gc-copy", "gc-relocate", "gc-unlink")
STOP_S = 20.0  # how long a child waits in its phase for the kill


def state(step: int) -> dict:
    """The state committed at ``step``: parts that change every step, every 4th step, never."""
    fast = torch.Generator().manual_seed(step)
    slow = torch.Generator().manual_seed(10_000 + step // 4)
    return {"model": {"fast": torch.randn(48, generator=fast),
                      "slow": torch.randint(-1000, 1000, (40,), generator=slow, dtype=torch.int32),
                      "frozen": torch.ones(24, dtype=torch.bfloat16)},
            "step": step}


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one unbuffered write: lines from parent and child never mix


class Stopper:
    """Stops the child the NTH time it reaches ``phase``."""

    def __init__(self, phase: str, nth: int):
        self.phase, self.nth, self.calls = phase, nth, 0

    def at(self, name: str) -> None:
        if name != self.phase:
            return
        self.calls += 1
        if self.calls == self.nth:
            say(f"in {name}")
            time.sleep(STOP_S)
            say(f"missed {name}")


def wrap(owner, attr: str, stopper: Stopper, name: str, after: bool = False, when=None) -> None:
    """Replace ``owner.attr`` by a version that reaches phase ``name`` before (or after) it runs."""
    original = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        hit = when is None or when(*args)
        if hit and not after:
            stopper.at(name)
        result = original(*args, **kwargs)
        if hit and after:
            stopper.at(name)
        return result
    setattr(owner, attr, wrapper)


def hook_commit(stopper: Stopper) -> None:
    wrap(packs.PackWriter, "append", stopper, "pack", after=True)  # every record goes through one of these two
    wrap(packs.PackWriter, "append_rows", stopper, "pack", after=True)
    wrap(os, "rename", stopper, "rename")  # the pack is complete and fsynced, not yet in place
    wrap(index.Txn, "put", stopper, "index", when=lambda txn, kind, *rest: kind == "commits")


def hook_gc(stopper: Stopper) -> None:
    wrap(index.Txn, "delete", stopper, "gc-sweep")
    wrap(packs.PackWriter, "append", stopper, "gc-copy")
    wrap(index.Txn, "put_chunk", stopper, "gc-relocate")
    wrap(os, "unlink", stopper, "gc-unlink", after=True)


def commit_next(repo) -> None:
    tip = repo.head().id
    step = 0 if tip is None else repo.get_commit(tip).step + 1
    c = repo.commit(state(step), f"step {step}", step=step, metrics={"loss": float((step * 7919) % 101)})
    say(f"landed {c.id} {step}")


def child(root: str, kind: str, phase: str, nth: int, keep_last: int) -> None:
    torch.set_num_threads(1)
    repo = mvc.Repository.open(root)
    if kind == "commit":
        hook_commit(Stopper(phase, nth))
        while True:
            commit_next(repo)
    for _ in range(3):
        commit_next(repo)
    hook_gc(Stopper(phase, nth))
    say("gc-start")
    repo.gc(keep_last=keep_last, keep_best="loss", grace=0)
    say("gc-done")
    time.sleep(STOP_S)


def fork_and_reap(fn, *args) -> None:
    """Run ``fn(*args)`` in a forked child (exit 1 with its traceback if it raises), saying its
    pid first (the test kills it by that) and how it ended once reaped."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn(*args)
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    say(f"pid {pid}")
    _, status = os.waitpid(pid, 0)
    say(f"reaped {pid} {status}")


def serve(root: str) -> None:
    for line in sys.stdin:
        kind, phase, nth, keep_last = line.split()
        if kind == "head":  # what a process that opens the repository now sees
            pid = os.fork()
            if pid == 0:
                with mvc.Repository.open(root) as repo:
                    say(f"head {repo.head().id}")
                os._exit(0)
            os.waitpid(pid, 0)
            continue
        fork_and_reap(child, root, kind, phase, int(nth), int(keep_last))


if __name__ == "__main__":
    serve(sys.argv[1])
