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


# -- merging checkpoints (mvc/merge.py) ----------------------------------------

class MergeError(MvcError):
    """A merge cannot run as asked; nothing was written."""


class MergeMismatch(MergeError):
    """The inputs (or the base) differ in keys, dtypes or shapes.

    ``keys``: the dotted keys that differ, sorted; ``problems``: {key: what
    differs}; ``inputs``: the full ids of the commits compared (inputs, then the base).
    """

    def __init__(self, message: str = "", *, keys=(), problems=None, inputs=()):
        super().__init__(message)
        self.keys = tuple(keys)
        self.problems = dict(problems or {})
        self.inputs = tuple(inputs)


class MergeRefused(MergeError):
    """Keys the merge rules refuse to merge (optimizer state); ``keys`` names them."""

    def __init__(self, message: str = "", *, keys=()):
        super().__init__(message)
        self.keys = tuple(keys)


class BadRecipe(MergeError, BadInput):
    """A merge recipe, strategy or parameter is invalid; ``field`` names it."""

    def __init__(self, message: str = "", *, field=None):
        super().__init__(message)
        self.field = field
