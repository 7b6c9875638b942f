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


# -- DCP checkpoint ids (hooks/dcp.py) -------------------------------------------------

class CheckpointNotFound(UnknownRevision, FileNotFoundError):
    """A DCP checkpoint id names no checkpoint that was saved: ``checkpoint_id``
    is the id, ``ref`` the tag or branch it maps to (None when no repository
    holds the id). A FileNotFoundError too, as for DCP's FileSystemReader."""

    def __init__(self, message: str = "", *, checkpoint_id=None, ref=None):
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.ref = ref


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


# -- remotes (issue 23: lifecycle, repair, trust) ---------------------------------------
# RemoteError lives here so these can extend it; mvc.remote.bucket re-exports it and the bucket errors.

class RemoteError(MvcError):
    """The remote failed, or cannot be used as it is (one line saying what to do)."""


class NotFound(RemoteError):
    """The key names no object on the remote; ``key`` is that key."""

    def __init__(self, message: str = "", *, key: str = ""):
        super().__init__(message)
        self.key = key


class PreconditionFailed(RemoteError):
    """A conditional put lost: the object at ``key`` changed (or appeared) since it was read."""

    def __init__(self, message: str = "", *, key: str = ""):
        super().__init__(message)
        self.key = key


class RemoteUnreachable(RemoteError):
    """The server did not answer (refused, reset, timed out) after every retry; ``url``, ``attempts``."""

    def __init__(self, message: str = "", url: str = "", attempts: int = 0):
        super().__init__(message)
        self.url, self.attempts = url, attempts


class UntrustedAnswer(RemoteError):
    """The server answered a request with something else than was asked (a wrong byte range, a
    conditional write it did not honour); ``url``, ``key``."""

    def __init__(self, message: str = "", url: str = "", key: str = ""):
        super().__init__(message)
        self.url, self.key = url, key


class RemoteDamaged(CorruptObject):
    """Remote ``remote`` lacks (or holds damaged) what its refs need; ``ids``: the chunk or object ids."""

    def __init__(self, message: str = "", remote: str = "", ids: tuple = ()):
        super().__init__(message)
        self.remote, self.ids = remote, tuple(ids)


class RemoteBusy(LockHeld):
    """Another process holds a conflicting lease on the remote (a gc, or a push while gc would run);
    ``remote``, ``holder`` (its owner and host), ``kind`` ("gc" or "push")."""

    def __init__(self, message: str = "", remote: str = "", holder: str = "", kind: str = ""):
        super().__init__(message)
        self.remote, self.holder, self.kind = remote, holder, kind


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


# -- verified reads (issues 20 and 24): the one verify-or-raise, mvc/store/verify.py ----

class HashMismatch(ChecksumMismatch):
    """Bytes read for chunk or object ``id`` do not hash to it. ``what`` names what they are
    (a tensor's key path and commit, an object kind); ``where`` where they were read (a pack
    file and offset, a remote pack key); ``base``: the hex id of the delta base found damaged,
    when that is why a decoded record does not verify (None otherwise)."""

    def __init__(self, message: str = "", *, id=None, what: str = "", where: str = "", base=None):
        super().__init__(message, id=id)
        self.what, self.where = what, where
        self.base = base.hex() if isinstance(base, (bytes, bytearray)) else base
