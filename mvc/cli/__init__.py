"""The ``mvc`` command line: one module per group of commands."""

from .base import main
from . import core  # noqa: F401  (registers init, commit, log, show, checkout, branch, tag, status)
from . import integrity  # noqa: F401  (registers fsck, lock, unlock, gc)
from . import compare  # noqa: F401  (registers diff, bisect)
from . import remote  # noqa: F401  (registers remote, push, fetch, pull, clone, config, cache)
from . import storage  # noqa: F401  (registers repack)
from . import serve  # noqa: F401  (registers serve)
from . import merge  # noqa: F401  (registers merge, average)
from . import audit  # noqa: F401  (registers verify-commit, verify-tag, audit)
from . import mount  # noqa: F401  (registers mount, umount, sign-model, verify-model)

__all__ = ["main"]
