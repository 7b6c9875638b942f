"""Background pushes of a run's branch to a remote (``Checkpointer(remote=...)``).

After each commit the run's branch is pushed by a child process running
``mvc push REMOTE BRANCH``: a push is network-bound and may hang on an
unreachable store, so it never runs in the training process, never holds
its GIL and never blocks ``step()``. At most one push runs at a time; a
commit made while one runs is covered by the next, which sends everything
the remote still lacks (a push always moves the remote branch to the local
tip). A failed push is reported (a ``RuntimeWarning``, once per run of
failures, and ``error``) and retried at the next commit, or after
``retry_s`` without one, so a run catches up once the store is back;
training goes on either way. ``close()`` waits for the push in flight and
makes one last attempt if the tip is not on the remote yet.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Optional

RETRY_S = 60.0


class Pusher:
    """Pushes ``branch`` of the repository at ``root`` to ``remote`` in the background."""

    @classmethod
    def of(cls, repo, remote: str, branch: str) -> "Pusher":
        """A Pusher for ``repo``; BadInput if it has no remote named ``remote``."""
        import mvc
        if remote not in {r.name for r in repo.remotes.list()}:
            raise mvc.BadInput(f"no remote {remote!r} in {repo.root}: add it with 'mvc remote add {remote} URL'")
        return cls(repo.root, remote, branch)

    def __init__(self, root, remote: str, branch: str, retry_s: float = RETRY_S):
        self.root, self.remote, self.branch, self.retry_s = str(root), remote, branch, retry_s
        self.error: Optional[str] = None  # why the last push failed; None once one succeeds
        self._lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None
        self._out = self._err = None
        self._wanted = False  # a commit landed that no finished push has covered
        self._attempt = 0.0  # monotonic time of the last push started
        self._warned = False

    def request(self) -> None:
        """A commit landed: push it now, or right after the push in flight."""
        with self._lock:
            self._wanted = True
            self._reap()
            self._start_if_idle()

    def poll(self) -> None:
        """Collect a finished push; start the next one if one is due. Never blocks."""
        with self._lock:
            self._reap()
            if self.error is not None and time.monotonic() - self._attempt >= self.retry_s:
                self._wanted = True
            self._start_if_idle()

    def close(self, timeout: Optional[float] = None) -> None:
        """Wait for the push in flight, then push once more if the tip may not be on the remote."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait(deadline)
        with self._lock:
            self._reap()
            self._wanted = self._wanted or self.error is not None
            self._start_if_idle()
        self._wait(deadline)
        with self._lock:
            self._reap()

    def _wait(self, deadline: Optional[float]) -> None:
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        try:
            proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # reported as a failed push
            proc.kill()
            proc.wait()

    def _start_if_idle(self) -> None:
        if self._proc is not None or not self._wanted:
            return
        self._wanted = False
        self._attempt = time.monotonic()
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "mvc", "-C", self.root, "push", self.remote, self.branch, "--json"]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
                                      env=_child_env())

    def _reap(self) -> None:
        if self._proc is None or self._proc.poll() is None:
            return
        code, self._proc = self._proc.returncode, None
        out, err = (_read(f) for f in (self._out, self._err))
        if code == 0 and _report(out):
            self.error, self._warned = None, False
            return
        lines = [line for line in err.splitlines() if line.strip()]
        self.error = lines[-1] if lines else f"mvc push exited with code {code}"
        if not self._warned:
            self._warned = True
            warnings.warn(f"mvc: pushing branch {self.branch!r} to remote {self.remote!r} failed "
                          f"({self.error}); training goes on and the push is retried", RuntimeWarning,
                          stacklevel=2)


def _child_env() -> dict:
    """This environment, with the folder this process imports mvc from first
    on the child's path: the child runs the same mvc even when the training
    script put it on ``sys.path`` itself."""
    import mvc
    here = str(Path(mvc.__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}


def _read(f) -> str:
    f.seek(0)
    text = f.read().decode(errors="replace")
    f.close()
    return text


def _report(out: str) -> bool:
    try:
        return isinstance(json.loads(out), dict)
    except ValueError:
        return False
