"""The errors mvc raises.

Every expected failure is an ``MvcError``; subclasses say what went wrong.
Messages name the object involved and say what to do about it. Only the CLI
maps these to exit codes.
"""


class MvcError(Exception):
    """Root of every error mvc raises on purpose.

    ``id`` is the hex id of the object, chunk or commit the error concerns,
    when there is one (None otherwise). ``forced`` says what the call would
    have done with ``force=True`` ("move it", "overwrite it"), when that is
    the way past the refusal ("" otherwise); the message then ends with it,
    and ``summary`` is the message without it.
    """

    def __init__(self, message: str = "", *, id=None, forced: str = ""):
        super().__init__(f"{message}; force=True would {forced}" if forced else message)
        self.id = id.hex() if isinstance(id, (bytes, bytearray)) else id
        self.summary, self.forced = message, forced


class NotARepository(MvcError):
    """No ``.mvc`` directory was found where one was expected; ``path`` is where it was looked for."""

    def __init__(self, message: str = "", *, path: str = ""):
        super().__init__(message)
        self.path = path


class RepositoryExists(MvcError):
    """``init`` was asked to create a repository where one already is."""


class UnknownRevision(MvcError):
    """A revision names no commit, branch or tag. ``rev`` is the revision (or name) asked for,
    ``reason`` says why, one of: "unknown" (no such name or id), "short-prefix" (an id
    prefix under 4 digits), "unborn" (a branch with no commits), "no-parent" (``~``/``^``
    past a root), "no-such-parent" (``^N`` past the last parent), "few-ancestors" (``~N``
    past the root), "reflog" (``@{N}`` past its reflog), "malformed" (empty, a control
    character, no base); None where not said."""

    def __init__(self, message: str = "", *, rev=None, reason=None):
        super().__init__(message)
        self.rev, self.reason = rev, reason


class AmbiguousRevision(MvcError):
    """An id prefix ``prefix`` matches more than one commit (``matches``: their hex ids, or a
    ref and a commit: the ref's name among them)."""

    def __init__(self, message: str = "", *, prefix=None, matches=()):
        super().__init__(message)
        self.prefix, self.matches = prefix, tuple(matches)


class ObjectNotFound(MvcError):
    """An object or chunk the index should hold is missing."""


class CommitPruned(ObjectNotFound):
    """The commit's record is kept but gc retention deleted its tensors; ``id`` is the commit,
    ``policy`` the retention that pruned it (as gc described it)."""

    def __init__(self, message: str = "", *, id=None, policy=None):
        super().__init__(message, id=id)
        self.policy = policy


class CorruptObject(MvcError):
    """Stored bytes do not decode, or do not match their id. Where the raiser knows them:
    ``kind`` is what was found damaged ("tensor", "tree", "commit", "tag": an object;
    "index": the index or a value in it; "ref": a ref's value), ``field`` the part of it at
    fault (an object's field: "dtype", "shape", "chunks", "root", "parents" …, "type" for
    another kind of object, "fields" for missing or extra ones; in the index: "chunk_size",
    "location"), ``name`` the ref it concerns. None where not said."""

    def __init__(self, message: str = "", *, id=None, kind=None, field=None, name=None):
        super().__init__(message, id=id)
        self.kind, self.field, self.name = kind, field, name


class ChecksumMismatch(CorruptObject):
    """A chunk's bytes do not hash to its id."""


class RefConflict(MvcError):
    """A ref moved between reading it and updating it (compare-and-swap failed), or cannot
    be made or moved as asked. ``ref`` names it when known; for a failed compare-and-swap
    ``expected`` and ``found`` are the hex ids (None: no commit) it should and did name."""

    def __init__(self, message: str = "", *, ref=None, expected=None, found=None, forced: str = ""):
        super().__init__(message, forced=forced)
        self.ref, self.expected, self.found = ref, expected, found


class UnmergedBranch(RefConflict):
    """Branch ``ref`` (``heads/NAME``) would be deleted though HEAD does not reach its tip
    ``id`` (hex): commits only it reaches would be left for gc. ``force=True`` deletes it."""

    def __init__(self, message: str = "", *, ref=None, id=None):
        super().__init__(message, ref=ref)
        self.id = id


class LockHeld(MvcError):
    """Someone else holds the write lock that is needed."""


class ProtectedRef(MvcError):
    """A protected ref would be moved or deleted without ``force``; ``ref`` names it
    (``heads/NAME``, ``tags/NAME``) and ``action`` what was refused ("commit", "move", …)."""

    def __init__(self, message: str = "", *, ref=None, action=None, id=None, forced: str = ""):
        super().__init__(message, id=id, forced=forced)
        self.ref, self.action = ref, action


class InvalidRefName(MvcError):
    """A branch or tag name ``name`` breaks the ref-name rules; ``problem`` says which."""

    def __init__(self, message: str = "", *, name=None, problem=None):
        super().__init__(message)
        self.name, self.problem = name, problem


class UnsupportedFormat(MvcError):
    """The repository uses a format version or extension this mvc does not know. ``problem``
    is "damaged" (FORMAT does not parse), "newer" (``version``: the format it names),
    "extensions" (``extensions``: the unknown ones, sorted) or "stale" (this process's view
    of FORMAT predates a change another made: ``version`` is the pack version it writes);
    None where not said."""

    def __init__(self, message: str = "", *, problem=None, version=None, extensions=()):
        super().__init__(message)
        self.problem, self.version, self.extensions = problem, version, tuple(extensions)


class BadInput(MvcError):
    """A state or an input file cannot be stored (unsupported object, bad file)."""


class ReaderClash(MvcError):
    """The index cannot take this process as a reader because another live
    process holds the same pid number: LMDB keys its reader table by pid,
    and processes in different pid namespaces (containers) that share one
    repository can have equal pids. Nothing is damaged. ``path`` is the
    index folder, ``pid`` this process's pid."""

    def __init__(self, message: str = "", *, path=None, pid=None):
        super().__init__(message)
        self.path, self.pid = path, pid


class NoMatch(BadInput):
    """A key pattern (``only``) matches no key of a commit: a load of nothing
    would look like a load of what was asked. ``pattern`` and ``commit`` (hex)."""

    def __init__(self, message: str = "", *, pattern=None, commit=None):
        super().__init__(message)
        self.pattern, self.commit = pattern, commit


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
    """An object would not decode once stored (``kind``: tensor, tree, commit; ``reason``: the decoder's;
    ``field``: the field the decoder refused, as CorruptObject's)."""

    def __init__(self, message: str = "", *, kind=None, reason=None, field=None):
        super().__init__(message)
        self.kind, self.reason, self.field = kind, reason, field


# -- DCP checkpoint ids (hooks/dcp.py) -------------------------------------------------

class CheckpointNotFound(UnknownRevision, FileNotFoundError):
    """A DCP checkpoint id names no checkpoint that was saved: ``checkpoint_id``
    is the id, ``ref`` the tag or branch it maps to (None when no repository
    holds the id). A FileNotFoundError too, as for DCP's FileSystemReader."""

    def __init__(self, message: str = "", *, checkpoint_id=None, ref=None):
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.ref = ref


class CheckpointExists(MvcError, FileExistsError):
    """A DCP save with ``overwrite=False`` to a checkpoint id that already names
    a checkpoint: ``checkpoint_id`` is the id, ``ref`` the tag or branch it
    maps to, ``commit`` the full id it names. A FileExistsError too, as DCP's
    FileSystemWriter refuses with overwrite=False."""

    def __init__(self, message: str = "", *, checkpoint_id=None, ref=None, commit=None):
        super().__init__(message)
        self.checkpoint_id, self.ref, self.commit = checkpoint_id, ref, commit


# -- the chunk store (issue 20): errors that say which file ----------------------------

class NotRegular(CorruptObject):
    """A path inside ``.mvc`` is a symlink, FIFO, device or socket where a file or folder
    belongs; ``path`` is that path."""

    def __init__(self, message: str = "", *, path=None, id=None):
        super().__init__(message, id=id)
        self.path = None if path is None else str(path)


class PackDamaged(CorruptObject):
    """A pack (a local file, or an object on a remote) cannot be parsed: no header, not
    sealed, a damaged trailer, a record cut short. ``pack`` is its file name or remote key,
    ``problem`` one of "header", "unsealed", "trailer-checksum", "trailer-count", "outside"
    (a record listed outside the data), "truncated", "missing" (PackMissing)."""

    def __init__(self, message: str = "", *, pack=None, id=None, problem=None):
        super().__init__(message, id=id)
        self.pack, self.problem = pack, problem


class PackMissing(PackDamaged):
    """A pack the index names is not there; ``pack`` is its file name."""


class ReadOnlyRepository(MvcError):
    """A write to a repository this process may only read (its index folder is not
    writable); nothing was changed. ``path`` is the repository's ``.mvc`` folder."""

    def __init__(self, message: str = "", *, path=None, id=None):
        super().__init__(message, id=id)
        self.path = None if path is None else str(path)


# -- remotes (issue 23: lifecycle, repair, trust) ---------------------------------------
# RemoteError lives here so these can extend it; mvc.remote.bucket re-exports it.

class RemoteError(MvcError):
    """The remote failed, or cannot be used as it is (one line saying what to do)."""


class RemoteUnreachable(RemoteError):
    """The server did not answer (refused, reset, timed out) after every retry; ``url``, ``attempts``."""

    def __init__(self, message: str = "", url: str = "", attempts: int = 0):
        super().__init__(message)
        self.url, self.attempts = url, attempts


class RemoteVanished(RemoteError):
    """Remote ``remote`` (at ``url``) holds no mvc remote, though this repository pushed to or fetched
    from it before: it moved, or its disk is not mounted. Nothing is created there."""

    def __init__(self, message: str = "", remote: str = "", url: str = ""):
        super().__init__(message)
        self.remote, self.url = remote, url


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


class MergeDtypeRefused(MergeRefused):
    """Tensors that differ between the inputs in a dtype no merge strategy has
    arithmetic for (complex, F8_E8M0, F4); ``keys`` names them, ``dtypes`` their dtypes."""

    def __init__(self, message: str = "", *, keys=(), dtypes=()):
        super().__init__(message, keys=keys)
        self.dtypes = tuple(dtypes)


class MergeNotFinite(MergeError):
    """A merged tensor would hold values that are not finite, or do not fit its
    dtype, where every input's value is finite (weights or parameters out of
    range); nothing was written. ``key``, ``dtype``, ``count`` (how many such
    values in the merged range), ``element`` (the first one's index)."""

    def __init__(self, message: str = "", *, key="", dtype="", count=0, element=0):
        super().__init__(message)
        self.key, self.dtype, self.count, self.element = key, dtype, count, element


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


class BadEncoding(CorruptObject):
    """A stored record does not decode (a compressed plane that does not decompress, lengths
    that do not add up). ``id``: the chunk asked for; ``base``: the hex id of the delta base
    whose own record failed, when that is why (None: the record of ``id`` itself); ``where``:
    where the failing record lies. ``link``: its place in the chain handed to
    ``codec.decode_chain`` (0: the first), for the caller that knows the chain's ids."""

    def __init__(self, message: str = "", *, id=None, base=None, where: str = "", link=None):
        super().__init__(message, id=id)
        self.base = base.hex() if isinstance(base, (bytes, bytearray)) else base
        self.where, self.link = where, link


# -- the library names no commands (issue 20): classes that carry what the CLI's advice needs --
# mvc/cli/base.py (advice) adds the command to run per class; messages say only what went wrong.

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


class UnknownRemote(MvcError):
    """No remote ``name`` is configured (``name`` None: none at all, or several and none
    named; ``known`` lists those configured)."""

    def __init__(self, message: str = "", *, name=None, known=()):
        super().__init__(message)
        self.name, self.known = name, tuple(known)


class RemoteExists(BadInput):
    """A remote named ``name`` is configured already."""

    def __init__(self, message: str = "", *, name: str = ""):
        super().__init__(message)
        self.name = name


class InvalidRemoteName(BadInput):
    """A new remote's name ``name`` cannot be used; ``problem`` is "invalid" (characters, form)
    or "reserved" (a ref namespace or HEAD: ``tags/v1`` would mean a tag or a tracking ref)."""

    def __init__(self, message: str = "", *, name=None, problem: str = ""):
        super().__init__(message)
        self.name, self.problem = name, problem


class NotConfigured(BadInput):
    """A setting the verb needs is not set; ``setting`` names it (``cache.remote``, ``cache.max-bytes``)."""

    def __init__(self, message: str = "", *, setting: str = ""):
        super().__init__(message)
        self.setting = setting


class RefRejected(RefConflict):
    """A remote ref moved to commits this repository lacks (or diverged): fetch first.
    ``remote`` names the remote, ``refs`` the refs not moved."""

    def __init__(self, message: str = "", *, remote: str = "", refs=()):
        super().__init__(message)
        self.remote, self.refs = remote, tuple(refs)


class PrunedOnRemote(RefConflict):
    """A push would point remote ``remote``'s ref ``ref`` at commit ``id`` (hex), which that remote's
    retention pruned: the remote keeps its record, not its data, and a ref there must not name a
    commit without data. ``policy`` is the retention that pruned it."""

    def __init__(self, message: str = "", *, remote: str = "", ref=None, id=None, policy=None):
        super().__init__(message, ref=ref)
        self.remote, self.id, self.policy = remote, id, policy


class Diverged(RefConflict):
    """Local branch ``branch`` and ``remote``'s branch of that name have diverged: a pull
    cannot fast-forward (``Repository.merge`` can combine the two checkpoints)."""

    def __init__(self, message: str = "", *, branch: str = "", remote: str = ""):
        super().__init__(message)
        self.branch, self.remote = branch, remote


class BranchLocked(LockHeld):
    """Branch ``branch``'s write lock is held by ``owner`` (on ``host``; ``named``: a lock a
    person took, not a running process), in this repository or, with ``remote``, on that remote."""

    def __init__(self, message: str = "", *, branch: str = "", owner: str = "", host: str = "",
                 named: bool = False, here: bool = True, remote=None, forced: str = ""):
        super().__init__(message, forced=forced)
        self.branch, self.owner, self.host = branch, owner, host
        self.named, self.here, self.remote = named, here, remote


class LockDamaged(CorruptObject):
    """The record of branch ``branch``'s write lock does not decode (on ``remote`` when given)."""

    def __init__(self, message: str = "", *, branch: str = "", remote=None):
        super().__init__(message)
        self.branch, self.remote = branch, remote


class HeadMissing(CorruptObject):
    """HEAD is missing from the index."""


class WalkDamaged(CorruptObject):
    """gc's walk of what is live met damage, so nothing was deleted: ``kind`` is the kind of
    damage (``mvc.reach``'s: missing-commit, corrupt-reflog …), ``what`` the object, ``id`` its id."""

    def __init__(self, message: str = "", *, kind: str = "", what: str = "", id=None):
        super().__init__(message, id=id)
        self.kind, self.what = kind, what


class RemoteCorrupt(HashMismatch):
    """Bytes read from a remote do not hash to their id, or are cut short; nothing was stored.
    ``id`` is the chunk or object, ``key`` the remote object (a pack) they came from."""

    def __init__(self, message: str = "", *, key: str = "", id=None, what: str = "", where: str = "", base=None):
        super().__init__(message, id=id, what=what, where=where or f"remote pack {key}", base=base)
        self.key = key


class NoBisect(MvcError):
    """No bisect is in progress."""


class BisectInProgress(MvcError):
    """A bisect is in progress already, between ``good`` and ``bad`` (hex ids)."""

    def __init__(self, message: str = "", *, good: str = "", bad: str = ""):
        super().__init__(message)
        self.good, self.bad = good, bad


class BisectFinished(MvcError):
    """The bisect has found its first bad commit: nothing is left to judge without a revision."""


class BisectStopped(MvcError):
    """``bisect run``'s command ended as no verdict (a crash, a signal); ``id`` is the commit it
    judged, ``code`` its exit code. Every earlier verdict is kept."""

    def __init__(self, message: str = "", *, id=None, code=None):
        super().__init__(message, id=id)
        self.code = code


class BisectEndMisjudged(MvcError):
    """``bisect run`` judged an end of the range (commit ``id``, the newest good or the oldest bad
    one, ``expected`` "good" or "bad") otherwise: ``verdict`` is what it came out as ("good",
    "bad", "skip", or None when the command stopped). By a recorded metric, ``metric`` names it
    and ``value`` is its value there; by a command, ``code`` is the exit code (None: timed out).
    A search against such an end names a wrong first bad commit, so nothing was recorded."""

    def __init__(self, message: str = "", *, id=None, expected: str = "", verdict=None, code=None,
                 metric=None, value=None):
        super().__init__(message, id=id)
        self.expected, self.verdict, self.code, self.metric, self.value = expected, verdict, code, metric, value


class BisectStateDamaged(CorruptObject):
    """The bisect state file (``path``) does not decode; ``problem`` says how."""

    def __init__(self, message: str = "", *, path: str = "", problem: str = ""):
        super().__init__(message)
        self.path, self.problem = path, problem


class VerdictContradicts(BadInput):
    """Verdict ``verdict`` on commit ``id`` contradicts earlier verdicts (a good commit after a bad one)."""

    def __init__(self, message: str = "", *, id=None, verdict: str = ""):
        super().__init__(message, id=id)
        self.verdict = verdict


class RefExists(RefConflict):
    """Ref ``ref`` exists already where ``action`` ("create-and-checkout", …) would make it."""

    def __init__(self, message: str = "", *, ref: str = "", action: str = ""):
        super().__init__(message)
        self.ref, self.action = ref, action


class GcLockBusy(LockHeld):
    """The gc lock could not be taken within ``timeout`` seconds: ``waited_for`` is "gc" (a gc
    runs; ``holder`` says which, as "pid P on HOST, started T") or "commits" (commits and
    loads kept running, so gc could not start)."""

    def __init__(self, message: str = "", *, waited_for: str = "", holder: str = "", timeout: float = 0.0):
        super().__init__(message)
        self.waited_for, self.holder, self.timeout = waited_for, holder, timeout


class MetricNotRecorded(BadInput):
    """No commit the verb looks at records metric ``metric``; ``recorded`` lists the metrics they
    do record, ``branches`` the branches concerned (gc retention), when it is about branches."""

    def __init__(self, message: str = "", *, metric: str = "", recorded=(), branches=()):
        super().__init__(message)
        self.metric, self.recorded, self.branches = metric, tuple(recorded), tuple(branches)


class NothingQualifies(BadInput):
    """Commits record metric ``metric`` (``recorded``: how many), but none passes every
    condition of ``conditions`` (texts such as "eval_loss<2.3"): there is no best one."""

    def __init__(self, message: str = "", *, metric: str = "", conditions=(), recorded: int = 0):
        super().__init__(message)
        self.metric, self.conditions, self.recorded = metric, tuple(conditions), recorded


class Unstorable(BadInput):
    """A state holds something mvc does not store: ``key`` is its dotted key path ("<root>"
    for the state itself; None for the whole state, or where the encoder does not know it), ``reason`` one of "type" (not a tensor
    or plain value; ``type`` names it), "key-type" (a dict key neither str nor int),
    "int-range" (an int beyond 64 bits), "nested-tensor", "layout" (sparse …), "meta" (a
    meta-device tensor), "depth" (nested too deeply, or contains itself), "metadata" (a
    dict's ``_metadata`` attribute that is not torch's module prefix -> {name: scalar})."""

    def __init__(self, message: str = "", *, key=None, reason: str = "", type=None):
        super().__init__(message)
        self.key, self.reason, self.type = key, reason, type


# -- errors as data (issue 20): what tests and callers assert on instead of message text --

class TargetMismatch(BadInput):
    """``load_into``'s targets do not fit commit ``id``; nothing was loaded. ``key`` is the
    dotted key path, ``problem`` one of "no-key" (the commit has no such key), "dtype-shape"
    (``here`` and ``committed``: (dtype name, shape) of the live and the stored tensor),
    "kind" (a tensor on one side, a plain value or container on the other), "not-dense"."""

    def __init__(self, message: str = "", *, id=None, key=None, problem=None, here=None, committed=None):
        super().__init__(message, id=id)
        self.key, self.problem, self.here, self.committed = key, problem, here, committed


class BadRange(BadInput):
    """GOOD and BAD do not bound a bisect: ``bad`` and ``good`` are their hex ids, ``branch``
    the branch asked for (None: BAD's history), ``problem`` one of "same" (one commit),
    "not-on-branch" (BAD is not on the branch's first-parent history), "not-descendant"
    (BAD does not descend from GOOD along first parents)."""

    def __init__(self, message: str = "", *, bad=None, good=None, branch=None, problem=None):
        super().__init__(message)
        self.bad, self.good, self.branch, self.problem = bad, good, branch, problem


class BadVerdict(BadInput):
    """A verdict that is none of good, bad, skip: ``verdict`` is what was given (for
    ``bisect.find``, is_good's answer), ``id`` the commit judged when known."""

    def __init__(self, message: str = "", *, verdict=None, id=None):
        super().__init__(message, id=id)
        self.verdict = verdict


class ProtectedFolder(BadInput):
    """A forced export would replace folder ``path``, which a replace must never remove:
    ``reason`` is "current-folder" (it is the current folder or holds it) or "git-work-tree"."""

    def __init__(self, message: str = "", *, path=None, reason=None):
        super().__init__(message)
        self.path, self.reason = None if path is None else str(path), reason


class UnsafeName(BadInput):
    """A model folder layout names a file ``name`` that export refuses to write: ``problem``
    is "outside" (an absolute path, "." or ".." parts), "control-character" or "reserved"
    (inside .mvc, .git or .cache)."""

    def __init__(self, message: str = "", *, name=None, problem=None):
        super().__init__(message)
        self.name, self.problem = name, problem


class CannotHold(BadInput):
    """File format ``format`` cannot hold tensor ``key`` of dtype ``dtype`` (``shape`` its shape)."""

    def __init__(self, message: str = "", *, format=None, key=None, dtype=None, shape=None):
        super().__init__(message)
        self.format, self.key, self.dtype, self.shape = format, key, dtype, shape


class PiecesDoNotTile(BadInput):
    """The pieces the ranks saved of tensor ``where`` (its key path, as the save names it) do
    not make one tensor of ``shape`` (they overlap, leave gaps, or lie outside); ``field`` is
    the field the tensor decoder refused ("shards", "chunks" …)."""

    def __init__(self, message: str = "", *, where=None, shape=None, field=None):
        super().__init__(message)
        self.where, self.shape, self.field = where, shape, field


class BadChunkLocation(BadInput):
    """A chunk location a rank reported cannot be adopted; nothing was committed. ``pack`` is
    the pack file's name, ``id`` the chunk, ``problem`` one of "malformed", "missing-pack"
    (not in the packs folder), "unreadable" (its trailer), "not-listed" (the pack does not
    hold the chunk there)."""

    def __init__(self, message: str = "", *, pack=None, id=None, problem=None):
        super().__init__(message, id=id)
        self.pack, self.problem = pack, problem


class MissingExtra(MvcError):
    """A feature needs package ``package``, which is not installed; ``extra`` is the
    optional-dependency group of mvc-checkpoints that installs it ("plot" …)."""

    def __init__(self, message: str = "", *, package: str = "", extra: str = ""):
        super().__init__(message)
        self.package, self.extra = package, extra


class MountError(MvcError):
    """A read-only mount (mvc.mount) cannot start or stop at ``mountpoint``. ``problem`` is one
    of "not-a-folder" (missing, or a file), "not-empty" (it holds files), "inside-repository", "already-mounted" (a live
    mount is there), "not-mounted" (umount of a folder no mvc mount holds), "busy" (files are
    open in it), "no-fuse" (libfuse or /dev/fuse missing), "failed" (libfuse refused)."""

    def __init__(self, message: str = "", *, mountpoint=None, problem: str = ""):
        super().__init__(message)
        self.mountpoint, self.problem = mountpoint, problem


class ModelSignatureError(MvcError):
    """An OMS model signature (mvc.oms) does not check out for folder ``folder``. ``problem``
    is one of "no-signature" (no model.sig), "malformed" (not a bundle, envelope or statement
    mvc reads), "bad-signature" (the key did not sign it), "digest-mismatch" (``file``'s bytes
    differ from what was signed), "missing-file" (``file`` was signed but is gone), "extra-file"
    (``file`` is in the folder but was not signed), "symlink" (``file`` is a symbolic link, which
    signing files does not follow), "not-a-file" (``file`` is a FIFO, socket or device, which
    reading would hang on or make up), "read-only" (the signature cannot be written in the
    folder: write it elsewhere), "bad-key" (the key cannot be read or is not an EC key)."""

    def __init__(self, message: str = "", *, folder=None, problem: str = "", file=None):
        super().__init__(message)
        self.folder, self.problem, self.file = folder, problem, file
