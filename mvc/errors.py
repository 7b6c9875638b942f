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


# -- hardening (issue 21): targets, links, names, limits ------------------------

class InsideRepository(BadInput):
    """A write would land in a repository's ``.mvc`` (or replace a folder holding one).

    ``path`` is the target asked for, ``repository`` the ``.mvc`` folder it would hit.
    """

    def __init__(self, message: str = "", *, path=None, repository=None):
        super().__init__(message)
        self.path, self.repository = str(path), str(repository)


class FolderLink(BadInput):
    """A model folder holds a symbolic link mvc will not follow (to a folder, or into a ``.mvc``).

    ``path`` is the link (relative to the folder), ``target`` what it points at.
    """

    def __init__(self, message: str = "", *, path=None, target=None):
        super().__init__(message)
        self.path, self.target = path, target


class TooLarge(BadInput):
    """A tensor's shape is beyond what a reader accepts (``key`` names it), so it is not stored."""

    def __init__(self, message: str = "", *, key=None, shape=None):
        super().__init__(message)
        self.key, self.shape = key, shape


class RevisionTooLong(UnknownRevision):
    """A revision is longer than any that names a commit (``length`` characters)."""

    def __init__(self, message: str = "", *, length=0):
        super().__init__(message)
        self.length = length


class Unreadable(BadInput):
    """An object would not decode once stored (``kind``: tensor, tree, commit; ``reason``: the decoder's)."""

    def __init__(self, message: str = "", *, kind=None, reason=None):
        super().__init__(message)
        self.kind, self.reason = kind, reason
