"""Fault injection by wrapping calls: a function that fails after N calls, short writes.

Each helper swaps one attribute (for example ``os.writev``) for the length
of a ``with`` block and puts the original back afterwards. tests/damage.py
holds the on-disk faults (flipped bits, truncation).
"""

import errno
import os
from contextlib import contextmanager


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
