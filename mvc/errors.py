"""The errors mvc raises.

Every expected failure is an ``MvcError``; subclasses say what went wrong.
Messages name the object involved and say what to do about it. Only the CLI
maps these to exit codes.
"""


class MvcError(Exception):
    """Root of every error mvc raises on purpose.

    ``id`` is the hex id of the object, chunk or commit the error concerns,
    when there is one (None otherwise).
    """

    def __init__(self, message: str = "", *, id=None):
        super().__init__(message)
        self.id = id.hex() if isinstance(id, (bytes, bytearray)) else id


class NotARepository(MvcError):
    """No ``.mvc`` directory was found where one was expected."""


class RepositoryExists(MvcError):
    """``init`` was asked to create a repository where one already is."""


class UnknownRevision(MvcError):
    """A revision names no commit, branch or tag."""


class AmbiguousRevision(MvcError):
    """An id prefix matches more than one commit."""


class ObjectNotFound(MvcError):
    """An object or chunk the index should hold is missing."""


class CommitPruned(ObjectNotFound):
    """The commit's record is kept but gc retention deleted its tensors; ``id`` is the commit."""


class CorruptObject(MvcError):
    """Stored bytes do not decode, or do not match their id."""


class ChecksumMismatch(CorruptObject):
    """A chunk's bytes do not hash to its id."""


class RefConflict(MvcError):
    """A ref moved between reading it and updating it (compare-and-swap failed)."""


class LockHeld(MvcError):
    """Someone else holds the write lock that is needed."""


class ProtectedRef(MvcError):
    """A protected ref would be moved or deleted without ``force``."""


class InvalidRefName(MvcError):
    """A branch or tag name breaks the ref-name rules."""


class UnsupportedFormat(MvcError):
    """The repository uses a format version or extension this mvc does not know."""


class BadInput(MvcError):
    """A state or an input file cannot be stored (unsupported object, bad file)."""


# -- the chunk store (issue 20): errors that say which file ----------------------------

class NotRegular(CorruptObject):
    """A path inside ``.mvc`` is a symlink, FIFO, device or socket where a file or folder
    belongs; ``path`` is that path."""

    def __init__(self, message: str = "", *, path=None, id=None):
        super().__init__(message, id=id)
        self.path = None if path is None else str(path)


class PackDamaged(CorruptObject):
    """A pack (a local file, or an object on a remote) cannot be parsed: no header, not
    sealed, a damaged trailer, a record cut short. ``pack`` is its file name or remote key."""

    def __init__(self, message: str = "", *, pack=None, id=None):
        super().__init__(message, id=id)
        self.pack = pack


class PackMissing(PackDamaged):
    """A pack the index names is not there; ``pack`` is its file name."""


class ReadOnlyRepository(MvcError):
    """A write to a repository this process may only read (its index folder is not
    writable); nothing was changed. ``path`` is the repository's ``.mvc`` folder."""

    def __init__(self, message: str = "", *, path=None, id=None):
        super().__init__(message, id=id)
        self.path = None if path is None else str(path)
