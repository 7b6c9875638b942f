"""Crash atomicity: real writers killed with SIGKILL inside chosen phases and at random moments.

Writers are forked from one server process (tests/crash_child.py) that has
imported torch already, so each kill costs milliseconds, not an import.
After every kill: fsck finds no damage, every ref loads bit-exact, and the
branch is at the commit before the killed one or (for a random kill that
came after the index transaction) at the killed one.
"""

import os
import queue
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import mvc
from mvc import gc as G

from crash_child import COMMIT_PHASES, GC_PHASES, state

HELPER = Path(__file__).with_name("crash_child.py")
TIMEOUT_S = 60


class Server:
    """The fork server and the lines it and its children print."""

    def __init__(self, root: Path):
        self.proc = subprocess.Popen([sys.executable, str(HELPER), str(root)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def start(self, kind: str, phase: str, nth: int = 0, keep_last: int = 2) -> int:
        self.proc.stdin.write(f"{kind} {phase} {nth} {keep_last}\n")
        self.proc.stdin.flush()
        return int(self.until(lambda line: line.startswith("pid "))[-1].split()[1])

    def until(self, done) -> list:
        """Lines up to and including the first for which ``done`` is true."""
        seen = []
        while True:
            line = self.lines.get(timeout=TIMEOUT_S)
            seen.append(line)
            if done(line):
                return seen
            assert not line.startswith("reaped"), f"the writer died on its own: {seen}"

    def head(self):
        """The tip a process that opens the repository now sees (None: unborn)."""
        self.proc.stdin.write("head - 0 0\n")
        self.proc.stdin.flush()
        tip = self.until(lambda line: line.startswith("head "))[-1].split()[1]
        return None if tip == "None" else tip

    def kill(self, pid: int) -> list:
        os.kill(pid, signal.SIGKILL)
        seen = self.until(lambda line: line.startswith(f"reaped {pid} "))
        status = int(seen[-1].split()[2])
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, seen
        return seen

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=TIMEOUT_S)


@pytest.fixture
def server(repo):
    s = Server(repo.root)
    yield s
    s.close()


def assert_state(loaded: dict, step: int) -> None:
    want = state(step)
    assert loaded["step"] == step
    for key, tensor in want["model"].items():
        got = loaded["model"][key]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape and torch.equal(got, tensor), key


def landed(lines: list, last):
    for line in lines:
        if line.startswith("landed "):
            _, cid, step = line.split()
            last = (cid, int(step))
    return last


def in_phase(lines: list, phase: str) -> bool:
    return f"in {phase}" in lines and f"missed {phase}" not in lines


def check(repo, last, exact: bool, lines=(), server=None):
    """fsck is clean, refs load bit-exact, main is at ``last`` (or one commit on if not ``exact``),
    and ``repo``, open since before the kill, sees the tip a process that opens it now sees."""
    tip = repo.head().id  # read before any new process opens the index (opening recovers it)
    if server is not None:
        assert server.head() == tip, f"a new process sees another tip than this one: {lines}"
    report = repo.fsck()
    assert report.ok, report.damage
    if last is None:
        assert tip is None or (not exact and repo.get_commit(tip).parents == ())
    elif tip != last[0]:
        assert not exact, f"main moved to {tip} though the writer died before its commit landed: {lines}"
        c = repo.get_commit(tip)
        assert c.parents == (last[0],) and c.step == last[1] + 1
    if tip is not None:
        c = repo.get_commit(tip)
        last = (tip, c.step)
        assert_state(repo.load(tip), c.step)
    for ref in repo.branches() + repo.tags():
        assert_state(repo.load(ref.id), repo.get_commit(ref.id).step)
    return last


def check_history(repo) -> None:
    for c in repo.log():
        if c.pruned:
            with pytest.raises(mvc.CommitPruned) as err:
                repo.load(c.id)
            assert err.value.id == c.id
        else:
            assert_state(repo.load(c.id), c.step)


@pytest.mark.slow
def test_killed_commits_leave_the_old_or_the_new_commit(repo, server):
    rng = random.Random(20261201)
    plan = [("pack", rng.randint(1, 20)) for _ in range(10)] + [("rename", rng.randint(1, 4)) for _ in range(6)]
    plan += [("index", rng.randint(1, 4)) for _ in range(10)] + [("random", 0)] * 14
    rng.shuffle(plan)
    last, hits = None, {p: 0 for p in COMMIT_PHASES}
    for phase, nth in plan:
        pid = server.start("commit", phase, nth)
        if phase == "random":
            threading.Event().wait(rng.uniform(0.0, 0.25))
            lines = server.kill(pid)
        else:
            lines = server.until(lambda line: line == f"in {phase}")
            lines += server.kill(pid)
            hits[phase] += in_phase(lines, phase)
        last = landed(lines, last)
        last = check(repo, last, exact=phase != "random", lines=lines, server=server)
    print("kills inside phases:", hits)
    assert all(n >= 5 for n in hits.values()), hits
    check_history(repo)
    assert len(list(repo.log())) >= 20


@pytest.mark.slow
def test_killed_gc_leaves_a_clean_repository(repo, server):
    rng = random.Random(1312)
    plan = [(p, rng.randint(1, 3 if p == "gc-sweep" else 1)) for p in GC_PHASES for _ in range(5)]
    plan += [("random", 0)] * 6
    rng.shuffle(plan)
    last, hits = None, {p: 0 for p in GC_PHASES}
    for phase, nth in plan:
        pid = server.start("gc", phase, nth, rng.randint(1, 3))
        lines = server.until(lambda line: line == "gc-start")
        last = landed(lines, last)
        if phase == "random":
            threading.Event().wait(rng.uniform(0.0, 0.03))
        else:
            lines += server.until(lambda line: line in (f"in {phase}", "gc-done"))
        lines += server.kill(pid)
        if phase != "random":
            hits[phase] += in_phase(lines, phase)
        last = check(repo, last, exact=True, lines=lines, server=server)
        check_history(repo)
    print("kills inside phases:", hits)
    assert all(hits[p] >= 2 for p in GC_PHASES), hits
    report = G.gc(repo, grace=0)  # a gc that finishes reclaims whatever the killed ones left
    assert repo.fsck().unreferenced == (), report
    check_history(repo)
