"""Branch write locks as a repository verb group (``repo.locks``).

A **write lock** on a branch makes commits to it by anyone but its owner
raise LockHeld. A process lock lapses when its process exits (a dead
owner's lock on the same host, or of the same kernel with a holder file, is
taken over); a named lock belongs to an owner until unlocked. The records
live in the index (``mvc.store.locks``), the holder files of process locks
in ``.mvc/locks`` (``mvc.store.holderfiles``).
"""

from typing import Optional

from . import ondisk, refs
from .store import holderfiles
from .store import locks as locking
from .store.locks import BranchLock, default_author


class Locks:
    """``lock``, ``unlock``, ``get`` and ``list`` the branch write locks of ``repo``."""

    def __init__(self, repo):
        self.repo = repo

    def lock(self, branch: str, named: bool = False, owner: Optional[str] = None) -> BranchLock:
        """Lock ``branch`` for writing; commits by anyone else raise LockHeld.

        By default the lock belongs to this process and lapses when it exits
        (a dead owner's lock is taken over on the same machine, from any pid
        namespace, and on the same host name after a reboot). ``named=True``
        makes it belong to ``owner`` (default: the commit author) until
        unlocked. Locking again as the owner is a no-op. Raises LockHeld
        naming the holder if another live owner holds it.
        """
        name = refs.check_name(branch, "branch")
        me = locking.this_process(owner or default_author())
        # an older mvc reads a record with these fields as damaged and advises --force, which
        # would break a live lock: FORMAT names them first, so it refuses the repository instead
        ondisk.require_extension(self.repo.dir, ondisk.LOCK_HOLDERS)
        flock = None if named else holderfiles.take(self._dir)  # held before any record names it
        try:
            with self.repo.index.write() as txn:
                lock = locking.acquire(txn, name, me, named, flock)
        except BaseException:
            holderfiles.drop(self._dir, flock)  # no record names it
            raise
        if lock.flock != flock:  # already this process's lock, with its own holder file
            holderfiles.drop(self._dir, flock)
        return lock

    def unlock(self, branch: str, force: bool = False, owner: Optional[str] = None) -> None:
        """Release ``branch``'s lock (a no-op if unlocked).

        Raises LockHeld if another live owner holds it, unless ``force``.
        """
        name = refs.check_name(branch, "branch")
        me = locking.this_process(owner or default_author())
        with self.repo.index.write() as txn:
            flock = locking.release(txn, name, me, force)
        holderfiles.drop(self._dir, flock)  # only now: had the transaction failed, the lock would still hold

    @property
    def _dir(self):
        return self.repo.dir / "locks"

    def get(self, branch: str) -> Optional[BranchLock]:
        """Who holds ``branch``'s write lock, or None."""
        with self.repo.index.read() as txn:
            return locking.get(txn, refs.check_name(branch, "branch"))

    def list(self) -> "list":
        """Every branch lock, stale ones (dead owner on this host) included."""
        with self.repo.index.read() as txn:
            return locking.all_locks(txn)
