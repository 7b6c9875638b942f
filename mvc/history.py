"""History beyond one first-parent line: ranges, every ref at once, commits left behind.

Vocabulary:

- **ancestry** of a commit: the commit and every commit reachable through
  any of its parents.
- a **walk** lists the ancestry of some ``include`` revisions minus the
  ancestry of some ``exclude`` ones (``A..B`` is include B, exclude A),
  newest first and every commit before its parents (Git's
  ``--topo-order``), so a graph can be drawn from it top to bottom.
- a commit is **left behind** when no branch or tag reaches it: once HEAD
  moves off it, only the reflog remembers it (and gc keeps it only while
  the reflog does).
"""

import heapq
from typing import Iterable, Optional

from . import reach, refs
from .hashing import digest
from .commits import to_commit


def _ancestry(repo, txn, starts: Iterable[bytes], stop=frozenset()) -> dict:
    """{id: commit object} of the ancestry of ``starts``, not going into ``stop``."""
    return reach.ancestry(lambda oid: repo.objects.commit(txn, oid), starts, stop=stop)


def _ref_tips(repo, txn, remotes: bool = False) -> list:
    kinds = (refs.BRANCHES, refs.TAGS) + ((refs.REMOTES,) if remotes else ())
    tips = [oid for prefix in kinds for _, oid, _ in repo.refs.listed(txn, prefix)]
    head = repo.refs.head(txn)[1]
    return tips + ([head] if head else [])


def decorations(repo) -> dict:
    """{commit id: [(kind, name)]} of every ref that names a commit, as ``git log``
    decorates it: kind "HEAD" (a detached HEAD, first), "current" (HEAD's branch),
    "branch", "tag" and "remote" (a remote-tracking branch such as origin/main)."""
    with repo.index.read() as txn:
        head_branch, head_id = repo.refs.head(txn)
        out: dict = {}
        if head_branch is None and head_id:
            out[head_id.hex()] = [("HEAD", "HEAD")]
        for prefix, kind in ((refs.BRANCHES, "branch"), (refs.TAGS, "tag"), (refs.REMOTES, "remote")):
            for name, oid, _ in repo.refs.listed(txn, prefix):
                current = kind == "branch" and prefix + name == head_branch
                out.setdefault(oid.hex(), []).append(("current" if current else kind, name))
    return out


def walk(repo, include: Iterable[str] = (), exclude: Iterable[str] = (), all_refs: bool = False,
         n: Optional[int] = None, known: Iterable[str] = ()) -> list:
    """Commits (``mvc.records.Commit``) in the ancestry of ``include`` (and of
    every branch, tag, remote-tracking branch and HEAD with ``all_refs``, as
    ``git log --all``) but not of ``exclude``, in
    topological order, newest first; at most ``n``.

    ``known``: ids of commits the caller already holds with their whole
    ancestry (an earlier walk); they are left out like ``exclude``, without
    walking their ancestry again, so a history that grew costs what is new.

    Raises UnknownRevision / AmbiguousRevision for bad revisions.
    """
    with repo.index.read() as txn:
        starts = [repo.refs.resolve(txn, rev) for rev in include]
        if all_refs:
            starts += _ref_tips(repo, txn, remotes=True)
        hidden = _ancestry(repo, txn, [repo.refs.resolve(txn, rev) for rev in exclude])
        stop = frozenset(bytes.fromhex(cid) for cid in known)
        found = {oid: obj for oid, obj in _ancestry(repo, txn, starts, stop).items() if oid not in hidden}
        order = _topo_order(found)[:n]
        return [to_commit(oid, found[oid], pruned=txn.pruned(oid) is not None) for oid in order]


def pruned_digest(repo) -> bytes:
    """A digest of the set of commits gc retention pruned. gc prunes without moving a
    ref, so whoever keeps a walk keyed by the refs keys it by this too (a walk marks
    each commit pruned or not)."""
    with repo.index.read() as txn:
        return digest(b"".join(txn.ids("pruned")))


def _topo_order(found: dict) -> list:
    """Children before parents; among commits that are ready, the newest first."""
    waiting = {oid: 0 for oid in found}
    for obj in found.values():
        for p in obj.parents:
            if p in waiting:
                waiting[p] += 1
    ready = [(-found[oid].time, oid) for oid, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, oid = heapq.heappop(ready)
        out.append(oid)
        for p in found[oid].parents:
            if p in waiting:
                waiting[p] -= 1
                if waiting[p] == 0:
                    heapq.heappush(ready, (-found[p].time, p))
    return out


def left_behind(repo, commit_id: str) -> list:
    """The commits of ``commit_id``'s ancestry that no branch, tag or HEAD
    reaches, newest first: what a checkout away from a detached HEAD leaves
    only the reflog to remember."""
    with repo.index.read() as txn:
        kept = _ancestry(repo, txn, _ref_tips(repo, txn))
        found = {oid: obj for oid, obj in _ancestry(repo, txn, [bytes.fromhex(commit_id)]).items()
                 if oid not in kept}
        return [to_commit(oid, found[oid]) for oid in _topo_order(found)]
