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


# -- signatures, audit and scheduled integrity scans (mvc/signing.py, mvc/audit.py) --

class SigningKeyError(MvcError):
    """A signing key cannot be used: unreadable, encrypted without (or with a
    wrong) passphrase, or not Ed25519. ``path`` names the key file."""

    def __init__(self, message: str = "", *, path: str = "", needs_passphrase: bool = False):
        super().__init__(message)
        self.path, self.needs_passphrase = path, needs_passphrase


class BadAllowedSigners(MvcError):
    """The allowed signers file cannot be read or has a malformed line (``path``, ``line``)."""

    def __init__(self, message: str = "", *, path: str = "", line: int = 0):
        super().__init__(message)
        self.path, self.line = path, line


class SignatureRequired(MvcError):
    """A ref whose policy requires good signatures would name a commit (or a
    tag) whose verdict is not good. ``ref`` is the ref, ``id`` the commit,
    ``status`` its verdict (unsigned, unknown, bad)."""

    def __init__(self, message: str = "", *, ref: str = "", id=None, status: str = ""):
        super().__init__(message, id=id)
        self.ref, self.status = ref, status


class HistoryRewritten(MvcError):
    """A ref that requires signatures would move (or has moved) to a commit
    that does not descend from where it was. ``ref``, ``old``, ``new`` (hex)."""

    def __init__(self, message: str = "", *, ref: str = "", old: str = "", new: str = ""):
        super().__init__(message, id=new)
        self.ref, self.old, self.new = ref, old, new


class ScanFoundDamage(CorruptObject):
    """A scheduled integrity scan found records that do not verify.
    ``problems``: ((pack file, chunk id hex, kind), ...)."""

    def __init__(self, message: str = "", *, problems: tuple = ()):
        super().__init__(message, id=problems[0][1] if problems else None)
        self.problems = tuple(problems)
