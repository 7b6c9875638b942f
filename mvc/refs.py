"""Refs: names, revision syntax and resolution, CAS moves, protection.

Refs live in the index under ``heads/NAME`` (branches) and ``tags/NAME``
(tags); ``HEAD`` is symbolic (names a branch) or detached (names a commit).
Names follow Git's check-ref-format rules. A revision is a base (full id,
unique id prefix of at least 4 hex digits, branch, tag, ``HEAD``, or
``REF@{N}``: the value REF had N moves ago, from its reflog) followed by any
of ``~N`` (N-th first-parent ancestor), ``^`` / ``^N`` (first / N-th parent).
A **range** ``A..B`` names the commits B reaches and A does not (either side
defaults to HEAD). Moving the branch HEAD is on is also logged in HEAD's
reflog, as Git does, so ``HEAD@{1}`` is where HEAD was before the last
commit or checkout. A **deleted** branch or tag keeps its reflog, ending in
the deletion, so ``NAME@{1}`` still names its last tip; ``deleted_entry_expired``
says when its entries may go (``DELETED_REFLOG_S``, 30 days), for gc.
"""

import itertools
import re
import sys
import unicodedata
from typing import Callable, Optional

from .errors import (AmbiguousRevision, HeadMissing, InvalidRefName, ProtectedRef, RefConflict, RefExists, RevisionTooLong,
                     UnknownRevision)
from . import reach
from .store import locks
from .store.index import RefValue, reflog_entry

HEAD = "HEAD"
BRANCHES = "heads/"
TAGS = "tags/"
REMOTES = "remotes/"  # remote-tracking refs: remotes/NAME/BRANCH, written by push and fetch
MIN_PREFIX = 4
MAX_NAME = 400  # bytes: with its prefix a ref name stays under the index's key limit

_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
# Unicode categories no name may hold: controls (C0, C1), format characters
# (bidi overrides such as U+202E, zero-width joiners), space and line separators
# (U+00A0, U+2028): each makes a name look like another one, or breaks a line.
_INVISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
_KIND_WORDS = ("heads", "tags", "remotes", "refs")  # "tags/v3" as a branch would hide the tag v3
_SUFFIX = re.compile(r"[~^][0-9]*")
_SUFFIX_CHARS = frozenset("~^0123456789")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_REVISION = 1024  # characters: a longest name, @{N}, and more ~N / ^N steps than any history needs
_AT = re.compile(r"^(.*)@\{(\d+)\}$")
# How long the reflog of a deleted branch or tag keeps its commits from gc: Git keeps
# unreachable reflog entries 30 days (gc.reflogExpireUnreachable), and a deleted branch's
# tip is the commit a user comes back for days later, not within gc's grace for packs.
DELETED_REFLOG_S = 30 * 86400.0


def check_name(name: str, what: str = "ref", existing: bool = False) -> str:
    """``name`` if it is a valid branch or tag name; InvalidRefName otherwise.

    ``existing``: the name of a ref that may have been made before the
    Unicode and kind-prefix rules, to delete, rename or protect: only Git's
    rules apply."""
    problem = _name_problem(name, existing)
    if problem:
        raise InvalidRefName(f"{what} name {name!r} is not valid: {problem}", name=name, problem=problem)
    return name


def is_valid_name(name: str) -> bool:
    return _name_problem(name) == ""


def _name_problem(name: str, existing: bool = False) -> str:
    if not isinstance(name, str) or not name:
        return "it is empty"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it holds undecodable bytes"
    if len(name.encode("utf-8")) > MAX_NAME:
        return f"it is longer than {MAX_NAME} bytes"
    if name == HEAD or name == "@":
        return f"{name!r} is reserved"
    if _BAD_CHARS.search(name):
        return "it holds a space, a control character or one of ~ ^ : ? * [ \\"
    odd = None if existing else next((c for c in name if unicodedata.category(c) in _INVISIBLE), None)
    if odd is not None:  # reads as something else: U+202E reverses the text, U+00A0 looks like a space
        return (f"it holds U+{ord(odd):04X} ({unicodedata.name(odd, 'a control character')}), a control, "
                "format, bidirectional or space character")
    if not existing and "/" in name and name.split("/", 1)[0] in _KIND_WORDS:
        return f"it starts with '{name.split('/', 1)[0]}/', which names a kind of ref (say the name without it)"
    if ".." in name or "@{" in name or "//" in name:
        return "it holds '..', '@{' or '//'"
    if name.startswith("/") or name.endswith("/") or name.endswith("."):
        return "it starts or ends with '/' or ends with '.'"
    if any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        return "a component starts with '.' or ends with '.lock'"
    if re.fullmatch(r"[0-9a-f]{64}", name):
        return "it is a full commit id"
    return ""


def split_revision(rev: str) -> tuple:
    """(base, [(op, n), ...]) where op is '~' or '^', in one pass over ``rev``;
    UnknownRevision if malformed (empty, a control character, no base),
    RevisionTooLong past MAX_REVISION characters."""
    if not isinstance(rev, str) or not rev:
        raise UnknownRevision("empty revision", rev=rev, reason="malformed")
    if len(rev) > MAX_REVISION:
        raise RevisionTooLong(f"revision {rev[:40]!r}... is {len(rev)} characters long; a revision is at most "
                              f"{MAX_REVISION} (a name of at most {MAX_NAME} bytes and its ~N / ^N steps)",
                              length=len(rev))
    if _CONTROL.search(rev):
        raise UnknownRevision(f"revision {rev!r} holds a control character; no name or id does", rev=rev,
                              reason="malformed")
    start = len(rev)  # the suffix is the longest tail of ~, ^ and digits that starts with ~ or ^
    while start > 0 and rev[start - 1] in _SUFFIX_CHARS:
        start -= 1
    while start < len(rev) and rev[start].isdigit():
        start += 1
    base, suffix = rev[:start], rev[start:]
    if not base:
        raise UnknownRevision(f"revision {rev!r} has no base", rev=rev, reason="malformed")
    ops = []
    for part in _SUFFIX.findall(suffix):
        digits = part[1:]
        ops.append((part[0], int(digits) if digits else 1))
    return base, ops


def split_range(rev: str) -> Optional[tuple]:
    """(A, B) for a range ``A..B`` (an empty side is HEAD), or None for one revision."""
    if not isinstance(rev, str) or ".." not in rev or "..." in rev:
        return None
    a, _, b = rev.partition("..")
    return a or HEAD, b or HEAD


def human(ref: str) -> str:
    """'branch NAME' / 'tag NAME' for a ref name, as messages say it."""
    kind, _, name = ref.partition("/")
    return f"{'branch' if kind == 'heads' else 'tag'} {name!r}"


def short_name(ref: str) -> str:
    return ref.split("/", 1)[1] if ref.startswith((BRANCHES, TAGS)) else ref


def _is_hex(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


class Refs:
    """Every ref of one repository, read and moved inside index transactions.

    Resolution of revisions, compare-and-swap moves (``set_if_equals``),
    protection, deletion with its reflog, HEAD, and the branch write locks
    that guard moves all live here. ``objects`` is the repository's
    ObjectStore (commits are read, verified, to follow parents).

    ``policy(txn, ref, old, new)``, when given, is called before every move
    that points a branch or tag at a commit (a commit, merge, pull, branch,
    tag, rename, ``checkout -b``): the one place a ref's policy (signatures
    required, ``mvc.audit.RefPolicy``) is enforced; it raises to refuse the
    move, and the transaction then changes nothing.
    """

    def __init__(self, objects, now: Callable[[], int], policy: Optional[Callable] = None):
        self.objects = objects
        self.now = now
        self.policy = policy

    # -- reading ------------------------------------------------------------

    def head(self, txn) -> tuple:
        """(branch ref name or None, commit id or None) that HEAD names."""
        head = txn.ref(HEAD)
        if head is None:
            raise HeadMissing("HEAD is missing from the index; check out a branch to set it again")
        if head.target is None:
            return None, head.id
        ref = txn.ref(head.target)
        return head.target, (ref.id if ref else None)

    def tip(self, txn, ref: Optional[str]) -> Optional[bytes]:
        """The commit ``ref`` names (HEAD's when ``ref`` is None); None if unborn."""
        if ref is None:
            return self.head(txn)[1]
        value = txn.ref(ref)
        return value.id if value else None

    def branch_ref(self, txn, name: str) -> Optional[str]:
        """The ref of branch ``name`` (also written ``heads/NAME``) if it exists."""
        for ref in (BRANCHES + name, name if name.startswith(BRANCHES) else None):
            if ref is not None and is_valid_name(short_name(ref)) and txn.ref(ref) is not None:
                return ref
        return None

    def reflog(self, txn, ref: str) -> list:
        """(sequence, entry) of ``ref``'s reflog, newest first."""
        return [(seq, entry) for _, seq, entry in txn.reflog(ref)][::-1]

    def listed(self, txn, prefix: str) -> list:
        """(short name, id, protected) of each branch or tag under ``prefix``."""
        return [(name[len(prefix):], v.id, v.protected) for name, v in txn.refs(prefix) if v.id is not None]

    # -- revisions ------------------------------------------------------------

    def resolve(self, txn, rev: str) -> bytes:
        """The commit id ``rev`` names; UnknownRevision / AmbiguousRevision."""
        base, ops = split_revision(rev)
        oid = self._base(txn, base)
        for op, n in ops:
            if op == "~":
                oid = self._ancestor(txn, rev, base, oid, n)
            elif n:
                parents = self.objects.commit(txn, oid).parents
                if len(parents) < n:
                    raise UnknownRevision(f"{rev}: commit {oid.hex()[:12]} has "
                                          f"{len(parents) or 'no'} parent{'' if len(parents) == 1 else 's'}",
                                          rev=rev, reason="no-such-parent" if parents else "no-parent")
                oid = parents[n - 1]
        return oid

    def _ancestor(self, txn, rev: str, base: str, oid: bytes, n: int) -> bytes:
        """The ``n``-th first-parent ancestor of ``oid`` (``rev``'s ``~n``); UnknownRevision past a root."""
        line = reach.first_parents(lambda c: self.objects.commit(txn, c), oid)
        done, found = -1, oid
        # islice takes at most sys.maxsize; no history is that long, so the walk ends first
        for done, (found, _) in enumerate(itertools.islice(line, min(n + 1, sys.maxsize))):
            pass
        if done == 0 and n:
            raise UnknownRevision(f"{rev}: commit {oid.hex()[:12]} has no parent", rev=rev, reason="no-parent")
        if done < n:
            raise UnknownRevision(f"{rev}: {base} has only {done} ancestor{'' if done == 1 else 's'} "
                                  "along first parents", rev=rev, reason="few-ancestors")
        return found

    def _at(self, txn, name: str, n: int) -> bytes:
        """The commit ``name@{n}`` names: the value ``name`` had ``n`` moves ago."""
        if name in (HEAD, "@", ""):
            ref = HEAD
        else:
            ref = next((r for r in (BRANCHES + name, TAGS + name, name) if r.startswith((BRANCHES, TAGS))
                        and txn.ref(r) is not None), None) or deleted_ref(txn, name)
            if ref is None:
                raise UnknownRevision(f"unknown revision {name + '@{' + str(n) + '}'!r}: no branch or tag {name!r}",
                                      rev=f"{name}@{{{n}}}", reason="unknown")
        entries = self.reflog(txn, ref)
        shown = "HEAD" if ref == HEAD else short_name(ref)
        if n >= len(entries):
            raise UnknownRevision(f"{shown}@{{{n}}}: the reflog of {shown} has only {len(entries)} "
                                  f"entr{'y' if len(entries) == 1 else 'ies'}", rev=f"{name}@{{{n}}}", reason="reflog")
        new = entries[n][1].get("new")
        if not isinstance(new, bytes):
            deleted = entries[n][1].get("old") if entries[n][1].get("message") == "deleted" else None
            why = (f"{shown} was deleted there; {shown}@{{{n + 1}}} is its tip before that" if deleted
                   else "that reflog entry names no commit")
            raise UnknownRevision(f"{shown}@{{{n}}}: {why}", rev=f"{name}@{{{n}}}", reason="reflog")
        return new

    def _base(self, txn, base: str) -> bytes:
        at = _AT.match(base)
        if at:
            return self._at(txn, at.group(1), int(at.group(2)))
        if base in (HEAD, "@"):
            branch, oid = self.head(txn)
            if oid is None:
                raise UnknownRevision(f"HEAD: branch {short_name(branch)!r} has no commits yet", rev=base,
                                      reason="unborn")
            return oid
        lower = base.lower()
        if len(base) == 64 and _is_hex(lower):
            oid = bytes.fromhex(lower)
            if self.objects.has(txn, "commits", oid):
                return oid
        # a name with its kind (tags/v1, heads/x) first, as Git reads refs/NAME before the guesses:
        # else a remote named "tags" would make tags/v1 its branch v1 (remotes/tags/v1), silently
        for name in (base, BRANCHES + base, TAGS + base, REMOTES + base):
            if name.startswith((BRANCHES, TAGS, REMOTES)):
                ref = txn.ref(name)
                if ref is not None and ref.id is not None:
                    self._not_also_a_prefix(txn, base, name, ref.id)
                    self._not_also_tracking(txn, base, name)
                    return ref.id
        if _is_hex(lower):
            if len(base) < MIN_PREFIX:
                raise UnknownRevision(f"unknown revision {base!r}: no branch or tag by that name, and an id "
                                      f"prefix needs at least {MIN_PREFIX} hex digits", rev=base, reason="short-prefix")
            matches = self._prefix_matches(txn, lower)
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                shown = ", ".join(m.hex()[:12] for m in matches[:5])
                raise AmbiguousRevision(f"id prefix {base!r} matches {len(matches)} commits ({shown}); "
                                        "give more digits", prefix=base, matches=[m.hex() for m in matches])
        raise UnknownRevision(f"unknown revision {base!r}: no commit, branch or tag by that name", rev=base,
                              reason="unknown")

    def _not_also_a_prefix(self, txn, base: str, ref: str, oid: bytes) -> None:
        """AmbiguousRevision if ``base`` names ref ``ref`` and is also the id prefix of another commit."""
        lower = base.lower()
        if len(base) < MIN_PREFIX or not _is_hex(lower) or base == ref:
            return
        others = [m for m in self._prefix_matches(txn, lower) if m != oid]
        if others:
            raise AmbiguousRevision(f"{base!r} is {human(ref)} and also the start of commit {others[0].hex()[:12]}'s "
                                    f"id; say {ref!r} for the {human(ref).split()[0]}, or give more digits for the "
                                    "commit", prefix=base, matches=[ref] + [m.hex() for m in others])

    @staticmethod
    def _not_also_tracking(txn, base: str, ref: str) -> None:
        """AmbiguousRevision if ``base`` names branch or tag ``ref`` and also a remote-tracking
        ref (a branch ``origin/main`` beside origin's main): neither may hide the other."""
        tracking = REMOTES + base
        other = txn.ref(tracking) if ref != tracking and ref != base else None
        if other is not None and other.id is not None:
            raise AmbiguousRevision(f"{base!r} is {human(ref)} and also the remote-tracking ref {tracking!r}; "
                                    f"say {ref!r} or {tracking!r}", prefix=base, matches=[ref, tracking])

    @staticmethod
    def _prefix_matches(txn, prefix: str) -> list:
        floor = bytes.fromhex(prefix[: len(prefix) // 2 * 2])
        return [oid for oid in txn.ids("commits", floor) if oid.hex().startswith(prefix)]

    # -- guards ---------------------------------------------------------------

    @staticmethod
    def check_writer(txn, ref: Optional[str], me) -> None:
        """LockHeld if another live owner holds the write lock of branch ``ref``."""
        if ref is not None and ref.startswith(BRANCHES):
            locks.check_writer(txn, ref[len(BRANCHES):], me)

    @staticmethod
    def check_new(txn, ref: str) -> None:
        """RefConflict if creating branch or tag ``ref`` would give a name to two
        kinds of ref (a branch and a tag of one name: the branch would hide the tag)."""
        if not ref.startswith((BRANCHES, TAGS)) or txn.ref(ref) is not None:
            return
        name = short_name(ref)
        other = (TAGS if ref.startswith(BRANCHES) else BRANCHES) + name
        if txn.ref(other) is not None:
            raise RefConflict(f"{human(other)} exists, and {human(ref)} of the same name would make {name!r} mean "
                              "two things; choose another name", ref=ref, found=txn.ref(other).id.hex())
        remote = name.split("/", 1)[0]
        if "/" in name and next(txn.ids("refs", (REMOTES + remote + "/").encode()), None) is not None:
            raise RefConflict(f"{human(ref)} would be written like a remote-tracking ref of remote {remote!r} "
                              f"(remotes/{name}) and hide it, or be hidden by it; choose another name", ref=ref)

    def check_commit(self, txn, ref: Optional[str], me) -> None:
        """ProtectedRef / LockHeld if a commit may not move ``ref``; RefConflict
        if it would create a branch named like a tag."""
        if ref is not None:
            self.check_new(txn, ref)
            value = txn.ref(ref)
            if value is not None and value.protected:
                raise ProtectedRef(f"{human(ref)} is protected; nothing was committed",
                                   ref=ref, action="commit")
        self.check_writer(txn, ref, me)

    # -- moving ---------------------------------------------------------------

    def set_if_equals(self, txn, ref: Optional[str], old: Optional[bytes], new: bytes, why: str) -> None:
        """Move ``ref`` (HEAD's branch, or detached HEAD, when None) from ``old`` to ``new``.

        RefConflict, changing nothing, if it no longer names ``old``.
        """
        self.expect(txn, ref, old)
        self._move(txn, ref or HEAD, old, new, why)

    def expect(self, txn, ref: Optional[str], old: Optional[bytes]) -> Optional[bytes]:
        """``old`` if ``ref`` (HEAD's when None) still names it; RefConflict otherwise."""
        tip = self.tip(txn, ref)
        if tip != old:
            name = short_name(ref) if ref else "HEAD"
            raise RefConflict(f"branch {name!r} moved from {old.hex()[:12] if old else 'nothing'} to "
                              f"{tip.hex()[:12] if tip else 'nothing'} while this commit was written; "
                              "nothing was committed: commit again on top of the new tip", ref=ref or HEAD,
                              expected=old.hex() if old else None, found=tip.hex() if tip else None)
        return old

    def _move(self, txn, ref: str, old: Optional[bytes], new: Optional[bytes], why: str,
              protected: Optional[bool] = None) -> None:
        current = txn.ref(ref)
        if current is None:
            self.check_new(txn, ref)
        self._check_policy(txn, ref, current, new)
        if ref == HEAD and (current is None or current.target is None):
            txn.set_ref(ref, RefValue(id=new))
        elif new is None:
            txn.delete_ref(ref)
        else:
            keep = current.protected if current is not None and current.id is not None else False
            txn.set_ref(ref, RefValue(id=new, protected=keep if protected is None else protected))
        entry = {"old": old, "new": new, "time": self.now(), "message": why}
        txn.append_reflog(ref, entry)
        head = txn.ref(HEAD) if ref != HEAD else None
        if head is not None and head.target == ref:  # HEAD moved with its branch: Git logs both
            txn.append_reflog(HEAD, entry)

    def _check_policy(self, txn, ref: str, current: Optional[RefValue], new: Optional[bytes]) -> None:
        """The policy's error (raised) for pointing ``ref``, now ``current``, at ``new``."""
        if self.policy is not None and new is not None and ref.startswith((BRANCHES, TAGS)):
            self.policy(txn, ref, current.id if current is not None else None, new)

    def set(self, txn, ref: str, rev: str, force: bool, protect: Optional[bool], why: str, me) -> tuple:
        """Point ``ref`` at ``rev`` (create or, with ``force``, move); (id, protected)."""
        oid = self.resolve(txn, rev)
        current = txn.ref(ref)
        self.check_writer(txn, ref, me)
        if current is not None and not force and current.id != oid:
            if current.protected:
                raise ProtectedRef(f"{human(ref)} is protected", ref=ref, action="move", forced="move it")
            raise RefConflict(f"{human(ref)} already exists at {current.id.hex()[:12]}",
                              ref=ref, found=current.id.hex(), forced="move it")
        self._move(txn, ref, current.id if current else None, oid, why, protect)
        return oid, txn.ref(ref).protected

    def delete(self, txn, ref: str, force: bool, me) -> None:
        """Delete ``ref``; its reflog stays, ending in a deletion entry (new: None), so
        the deleted tip can be found and recovered until gc expires it (``mvc.gc``)."""
        current = txn.ref(ref)
        if current is None:
            raise UnknownRevision(f"{human(ref)} does not exist", rev=ref, reason="unknown")
        if current.protected and not force:
            raise ProtectedRef(f"{human(ref)} is protected", ref=ref, action="delete", forced="delete it")
        self.check_writer(txn, ref, me)
        if self.head(txn)[0] == ref:
            raise RefConflict(f"{human(ref)} is checked out; check out another branch first", ref=ref)
        txn.delete_ref(ref)
        txn.append_reflog(ref, {"old": current.id, "new": None, "time": self.now(), "message": "deleted"})

    @staticmethod
    def drop(txn, ref: str) -> bool:
        """Delete ``ref`` and its reflog with no guards (a remote-tracking ref whose
        remote branch went, or a ref the caller has checked); whether it existed."""
        existed = txn.ref(ref) is not None
        if existed:
            txn.delete_ref(ref)
        for _, seq, _ in list(txn.reflog_raw(ref)):  # raw: a damaged entry must not block this
            txn.delete_reflog(ref, seq)
        return existed

    @staticmethod
    def attach(txn, ref: str) -> None:
        """Put HEAD on branch ``ref``, which may be unborn, with no reflog entry:
        the branch's first move logs HEAD too (a new repository, a clone)."""
        txn.set_ref(HEAD, RefValue(target=ref))

    def protect(self, txn, ref: str, protected: bool) -> bytes:
        current = txn.ref(ref)
        if current is None:
            raise UnknownRevision(f"{human(ref)} does not exist", rev=ref, reason="unknown")
        txn.set_ref(ref, RefValue(id=current.id, protected=protected))
        return current.id

    def rename(self, txn, old: str, new: str, force: bool, me) -> tuple:
        """Rename branch ref ``old`` to ``new`` with its protection and reflog;
        HEAD follows. (id, protected). UnknownRevision, RefConflict if ``new``
        exists (unless ``force`` and it is not protected), LockHeld."""
        current = txn.ref(old)
        if current is None or current.id is None:
            raise UnknownRevision(f"{human(old)} does not exist", rev=old, reason="unknown")
        if current.protected and not force:
            raise ProtectedRef(f"{human(old)} is protected", ref=old, action="rename", forced="rename it")
        taken = txn.ref(new)
        if taken is not None and old != new:
            if taken.protected or not force:
                raise RefConflict(f"{human(new)} already exists at {taken.id.hex()[:12]}"
                                  + ("; it is protected" if taken.protected else ""),
                                  ref=new, found=taken.id.hex(), forced="" if taken.protected else "replace it")
        self.check_writer(txn, old, me)
        self.check_writer(txn, new, me)
        self.check_new(txn, new)
        if old != new:
            self._check_policy(txn, new, taken, current.id)
        history = [entry for _, entry in self.reflog(txn, old)][::-1]
        for name in (old, new):  # a replaced branch's reflog goes, as with a deleted one
            self.drop(txn, name)
        txn.set_ref(new, RefValue(id=current.id, protected=current.protected))
        for entry in history:
            txn.append_reflog(new, entry)
        why = f"branch: renamed {short_name(old)} to {short_name(new)}"
        txn.append_reflog(new, {"old": current.id, "new": current.id, "time": self.now(), "message": why})
        head = txn.ref(HEAD)
        if head is not None and head.target == old:
            txn.set_ref(HEAD, RefValue(target=new))
        return current.id, current.protected

    def checkout_new(self, txn, ref: str, rev: str, me) -> bytes:
        """Create branch ``ref`` at ``rev`` and put HEAD on it (``checkout -b``); RefConflict if it exists."""
        taken = txn.ref(ref)
        if taken is not None:
            raise RefExists(f"{human(ref)} already exists", ref=ref, action="create-and-checkout")
        self.check_writer(txn, ref, me)
        oid = self.resolve(txn, rev)
        self._move(txn, ref, None, oid, f"branch: created from {rev}")
        self.checkout(txn, short_name(ref))
        return oid

    def checkout(self, txn, rev: str) -> None:
        """Move HEAD onto branch ``rev`` or, for any other revision, detached at its commit.
        ``HEAD`` (or ``@``) on a branch stays on it, as in Git."""
        head = txn.ref(HEAD)
        old = None if head is None else self.head(txn)[1]  # checkout repairs a lost HEAD
        on_branch = head is not None and head.target is not None and txn.ref(head.target) is not None
        ref = head.target if rev in (HEAD, "@") and on_branch else self.branch_ref(txn, rev)
        if ref is not None:
            txn.set_ref(HEAD, RefValue(target=ref))
            new = txn.ref(ref).id
        else:
            new = self.resolve(txn, rev)
            txn.set_ref(HEAD, RefValue(id=new))
        txn.append_reflog(HEAD, {"old": old, "new": new, "time": self.now(), "message": f"checkout: {rev}"})

    # -- reflog ---------------------------------------------------------------

    def expire_reflog(self, txn, ref: Optional[str] = None, before_us: Optional[int] = None,
                      damaged: bool = False) -> int:
        """Delete reflog entries (of ``ref``, or of every ref) older than ``before_us``
        (microseconds since the epoch; None: all), or with ``damaged`` only the
        entries that do not decode. Returns how many were deleted."""
        doomed = []
        for name, seq, raw in txn.reflog_raw(ref):
            entry = reflog_entry(raw)
            if damaged:
                if entry is None:
                    doomed.append((name, seq))
                continue
            when = entry.get("time") if entry is not None else None
            if before_us is None or type(when) is not int or when < before_us:
                doomed.append((name, seq))
        forget(txn, doomed)
        return len(doomed)


def deleted_ref(txn, name: str) -> Optional[str]:
    """The ref of a deleted branch (or else tag) ``name`` whose reflog is still kept; None if none."""
    for ref in (BRANCHES + name, TAGS + name):
        if txn.ref(ref) is None and any(True for _ in txn.reflog_raw(ref)):
            return ref
    return None


def deleted_entry_expired(txn, ref: str, entry, now_us: int, keep_s: float = DELETED_REFLOG_S) -> bool:
    """Whether reflog ``entry`` (decoded; None if it does not decode) of ``ref`` belongs to a
    deleted branch or tag and is older than ``keep_s`` seconds at ``now_us``: then gc may
    expire it, and with it the deleted tip. HEAD's entries and a live ref's are never expired so."""
    when = entry.get("time") if entry is not None else None
    return ref != HEAD and type(when) is int and when < now_us - int(keep_s * 1e6) and txn.ref(ref) is None


def forget(txn, entries) -> None:
    """Delete reflog entries given as (ref name, sequence number): gc's expiry of
    entries that name pruned commits, planned before the sweep that makes it."""
    for name, seq in entries:
        txn.delete_reflog(name, seq)

