"""Ref verbs: branches, tags, HEAD and the reflog, as the user moves them.

Every write goes through ``mvc.refs.Refs`` (compare-and-swap moves, the
reflog, protection, write locks) in one index write transaction; these
functions name refs the way users do (``main``, ``v1``) and return
``Ref`` / ``Head`` records. ``Reflog`` is the verb group ``repo.reflog``.
"""

from typing import Optional

from . import audit, ondisk, refs
from .commits import now_us
from .errors import UnknownRevision
from .records import Head, Ref
from .store import locks as locking
from .store.locks import default_author


def _set(repo, ref: str, rev: str, force: bool, protect: Optional[bool], why: str) -> Ref:
    with repo.index.write() as txn:
        oid, protected = repo.refs.set(txn, ref, rev, force, protect, why, locking.this_process(default_author()))
    return Ref(refs.short_name(ref), oid.hex(), protected)


def _delete(repo, ref: str, force: bool) -> None:
    with repo.index.write() as txn:
        repo.refs.delete(txn, ref, force, locking.this_process(default_author()))


def create_branch(repo, name: str, rev: str = refs.HEAD, force: bool = False,
                  protect: Optional[bool] = None) -> Ref:
    """Point branch ``name`` at ``rev``; RefConflict if it exists elsewhere (unless force).

    ``protect`` True/False sets its protection in the same transaction.
    """
    ref = refs.BRANCHES + refs.check_name(name, "branch")
    return _set(repo, ref, rev, force, protect, f"branch: {rev}")


def delete_branch(repo, name: str, force: bool = False) -> None:
    _delete(repo, refs.BRANCHES + refs.check_name(name, "branch", existing=True), force)


def create_tag(repo, name: str, rev: str = refs.HEAD, protect: Optional[bool] = None,
               force: bool = False, sign=None, message: str = "") -> Ref:
    """Tag ``rev``; a protected tag is not moved or deleted without ``force``.

    ``sign`` (a key, a key path, or True for ``signing.key``) makes it a
    signed tag: a tag object over its name, target, tagger, time and
    ``message`` is stored with the ref (``docs/format.md`` 7.4).
    """
    ref = refs.TAGS + refs.check_name(name, "tag")
    signer = audit.signer(repo, sign)
    if signer is not None:  # a tag object is signed data an mvc without signatures would leave stale
        ondisk.require_extension(repo.dir, ondisk.SIGNATURES)
    with repo.index.write() as txn:
        me = locking.this_process(default_author())
        oid, protected = repo.refs.set(txn, ref, rev, force, protect, f"tag: {rev}", me)
        audit.put_tag(txn, name, oid, signer, message, default_author(), now_us())
    return Ref(name, oid.hex(), protected)


def delete_tag(repo, name: str, force: bool = False) -> None:
    with repo.index.write() as txn:
        repo.refs.delete(txn, refs.TAGS + refs.check_name(name, "tag", existing=True), force,
                         locking.this_process(default_author()))
        audit.put_tag(txn, name, None, None)


def set_protected(repo, name: str, protected: bool = True, kind: str = "branch") -> Ref:
    """Protect or unprotect a branch or tag (kind "branch" or "tag")."""
    ref = (refs.BRANCHES if kind == "branch" else refs.TAGS) + refs.check_name(name, kind, existing=True)
    with repo.index.write() as txn:
        oid = repo.refs.protect(txn, ref, protected)
    return Ref(name, oid.hex(), protected)


def checkout(repo, rev: str, new_branch: Optional[str] = None) -> Head:
    """Move HEAD: onto a branch (by name) or detached at any other revision;
    with ``new_branch``, onto that new branch created at ``rev`` (``checkout -b``)."""
    with repo.index.write() as txn:
        if new_branch is None:
            repo.refs.checkout(txn, rev)
        else:
            ref = refs.BRANCHES + refs.check_name(new_branch, "branch")
            repo.refs.checkout_new(txn, ref, rev, locking.this_process(default_author()))
    with repo.index.read() as txn:
        ref, oid = repo.refs.head(txn)
    return Head(refs.short_name(ref) if ref else None, oid.hex() if oid else None)


def rename_branch(repo, old: str, new: str, force: bool = False) -> Ref:
    """Rename branch ``old`` to ``new``, keeping its protection and reflog; HEAD follows."""
    old_ref = refs.BRANCHES + refs.check_name(old, "branch", existing=True)
    new_ref = refs.BRANCHES + refs.check_name(new, "branch")
    with repo.index.write() as txn:
        oid, protected = repo.refs.rename(txn, old_ref, new_ref, force, locking.this_process(default_author()))
    return Ref(new, oid.hex(), protected)


def _tag_ref(txn, name: str) -> str:
    ref = name if name.startswith(refs.TAGS) else refs.TAGS + name
    if txn.ref(ref) is None:
        raise UnknownRevision(f"no branch or tag named {name!r}")
    return ref


class Reflog:
    """The reflogs of ``repo`` (``repo.reflog``): read one (``entries``), or expire entries (``expire``)."""

    def __init__(self, repo):
        self.repo = repo

    def entries(self, name: str = refs.HEAD) -> list:
        """(sequence, entry) of a ref's reflog, newest first: ``name`` is HEAD, a
        branch or a tag; an entry is {"old", "new" (hex or None), "time" (s), "message"}."""
        with self.repo.index.read() as txn:
            ref = refs.HEAD if name in (refs.HEAD, "@") else (
                self.repo.refs.branch_ref(txn, name) or (refs.TAGS + name if txn.ref(refs.TAGS + name) else None))
            if ref is None:
                raise UnknownRevision(f"no branch or tag {name!r}")
            return [(seq, {"old": e.get("old").hex() if isinstance(e.get("old"), bytes) else None,
                           "new": e.get("new").hex() if isinstance(e.get("new"), bytes) else None,
                           "time": e.get("time", 0) / 1e6, "message": e.get("message", "")})
                    for seq, e in self.repo.refs.reflog(txn, ref)]

    def expire(self, ref: Optional[str] = None, older_than: Optional[float] = None,
               damaged: bool = False) -> int:
        """Delete reflog entries, as ``git reflog expire`` does; returns how many.

        ``ref``: a branch, tag or ``HEAD`` (default: every ref). ``older_than``:
        seconds; only entries older than that go (default: all of them, as
        ``--expire=now``). ``damaged=True`` deletes only entries that cannot be
        read (what fsck reports as corrupt-reflog), leaving the rest.
        """
        before = None if older_than is None else now_us() - int(older_than * 1e6)
        with self.repo.index.write() as txn:
            name = None if ref is None else (refs.HEAD if ref in (refs.HEAD, "@")
                                             else self.repo.refs.branch_ref(txn, ref) or _tag_ref(txn, ref))
            return self.repo.refs.expire_reflog(txn, name, before, damaged)
