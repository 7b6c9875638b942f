"""Fault injection by wrapping calls: a function that fails after N calls, short writes.

Each helper swaps one attribute (for example ``os.writev``) for the length
of a ``with`` block and puts the original back afterwards. tests/damage.py
holds the on-disk faults (flipped bits, truncation).
"""

import errno
import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest


@contextmanager
def failing(owner, name: str, after: int = 0, err: int = errno.ENOSPC):
    """``owner.name`` works for ``after`` calls, then raises ``OSError(err)`` on every call.

    Yields a one-item list holding the number of calls so far.
    """
    original = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise OSError(err, os.strerror(err))
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)
    try:
        yield calls
    finally:
        setattr(owner, name, original)


@contextmanager
def short_writes():
    """``os.writev`` writes only the first half of what it is given and says so, as a filling disk does."""
    original, write = os.writev, os.write

    def half(fd, buffers):
        data = b"".join(bytes(b) for b in buffers)
        return write(fd, data[:max(1, len(data) // 2)])
    os.writev = half
    try:
        yield
    finally:
        os.writev = original


def on_small_tmpfs(tmp_path, code: str, size: str = "4m") -> dict:
    """Run ``code`` in a Python child, in a private mount namespace where a ``size`` tmpfs is
    mounted on a folder it gets as ``sys.argv[1]``: a real full disk. Returns the JSON the child
    prints; skips where unprivileged mount namespaces are not allowed."""
    mount = tmp_path / "small"
    mount.mkdir()
    script = f'mount -t tmpfs -o size={size} tmpfs "$0" || exit 77; exec "$1" -c "$2" "$0"'
    try:
        out = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(mount), sys.executable, code],
                             capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here")
    if out.returncode == 77 or out.stderr.startswith("unshare:"):
        pytest.skip(f"cannot mount a small filesystem here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
