"""The public Repository: the core (``BaseRepository``) plus the higher verbs.

The verbs live in their own modules (fsck, gc, diff, bisect) and take a
repository; the methods here only forward to them, so the layers point down.
"""

from .repository import BaseRepository


class Repository(BaseRepository):
    """A ``.mvc`` repository. ``Repository.init(path)`` creates one,
    ``Repository.open(path)`` finds one in ``path`` or above."""
