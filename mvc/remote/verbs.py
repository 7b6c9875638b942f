"""The remote verbs of a repository, grouped: ``repo.remotes`` and ``repo.cache``.

- ``Remotes`` (``repo.remotes``): configure remotes (add, remove, list),
  their tracking refs (branches), exchange history with them (push, fetch,
  pull, refresh, upload_shards), lock their branches (lock, unlock), and
  keep them healthy (fsck, gc, repair).
- ``Cache`` (``repo.cache``): the local packs as a bounded cache of the
  remote named by ``cache.remote`` (``remote``): eviction under a budget
  (evict, keep_budget), pinned refs (pin), how much is local (status),
  and reading back or refetching what only a remote holds (fsck_fetch,
  repair).
- ``setting``: read or change a repository setting (``repo.config``).

Each takes the repository's core (index, refs, chunks) and calls the module
that does the work: ``sync``, ``check``, ``collect``, ``tiers``, ``config``.
"""

from typing import Optional

from .. import audit, signing
from .. import refs as refnames
from ..errors import BadInput, MvcError
from . import catalogue, check, collect, config, sync, tiers


class Remotes:
    """The remotes of ``repo`` and the verbs that talk to them."""

    def __init__(self, repo):
        self.repo = repo

    def add(self, name: str, url: str, endpoint_url: Optional[str] = None):
        """Add remote ``name`` at ``url`` (s3://BUCKET/PREFIX, file:///PATH or a path); a RemoteInfo."""
        with self.repo.index.write() as txn:
            return config.add(txn, name, url, endpoint_url)

    def remove(self, name: str) -> None:
        """Forget remote ``name``, its tracking refs and its catalogue (the remote itself is untouched)."""
        with self.repo.index.write() as txn:
            config.remove(txn, name)
            for ref, _ in list(txn.refs(f"{sync.REMOTES}{name}/")):
                self.repo.refs.drop(txn, ref)
        catalogue.forget(self.repo.dir, name)

    def branches(self) -> list:
        """Tracking refs (``NAME/BRANCH``), as Refs."""
        return self.repo.listed(sync.REMOTES)

    def push(self, remote: Optional[str] = None, refs: tuple = (), force: bool = False, progress=None,
             delete: tuple = ()):
        """Send what the remote lacks of ``refs`` (default: HEAD's branch) and move its refs, and delete
        the remote branches or tags in ``delete`` (or given as ``:NAME``); see ``mvc.remote.sync.push``.
        Then keeps the local cache to its budget, if one is set."""
        report = sync.push(self.repo, remote, tuple(refs), force, progress, tuple(delete))
        self.repo.cache.keep_budget()
        return report

    def fetch(self, remote: Optional[str] = None, progress=None, prune: bool = False):
        """Bring the remote's branches as tracking refs with what they need (``prune``: and drop the
        tracking refs of branches it no longer has); see ``mvc.remote.sync.fetch``."""
        return sync.fetch(self.repo, remote, progress, prune)

    def pull(self, remote: Optional[str] = None, branch: Optional[str] = None, progress=None):
        """fetch, then fast-forward ``branch`` (default HEAD's); see ``mvc.remote.sync.pull``."""
        return sync.pull(self.repo, remote, branch, progress)

    def lock(self, branch: str, remote: Optional[str] = None, owner: Optional[str] = None) -> str:
        """Lock ``branch`` on the remote: pushes to it by anyone but ``owner`` are refused."""
        return sync.lock(self.repo, remote, branch, owner)

    def unlock(self, branch: str, remote: Optional[str] = None, force: bool = False,
               owner: Optional[str] = None) -> bool:
        return sync.unlock(self.repo, remote, branch, force, owner)

    def refresh(self, remote: str) -> int:
        """Learn the packs remote ``remote`` gained since it was last listed; how many were new."""
        return sync.refresh(self.repo, remote)

    def upload_shards(self, remote: str, locations: dict, ids) -> tuple:
        """A rank's part of a sharded save across hosts: index the chunks ``shards.write``
        just wrote, and upload those of ``ids`` that ``remote`` lacks; see ``mvc.remote.sync.upload_shards``."""
        return sync.upload_shards(self.repo, remote, locations, ids)

    def fsck(self, remote: Optional[str] = None, read_subset: Optional[str] = None):
        """Verify every pack (or the ``read_subset`` "N/T" of chunk packs) and ref of a remote;
        see ``mvc.remote.check.fsck_remote``."""
        return check.fsck_remote(self.repo, remote, read_subset)

    def gc(self, remote: Optional[str] = None, keep_last=None, branch=None, keep_best=None,
           mode: str = "min", top: int = 1, force: bool = False, grace: Optional[float] = None,
           dry_run: bool = False):
        """Retention and garbage collection on a remote, safe against concurrent pushes; see
        ``mvc.remote.collect.gc_remote``."""
        return collect.gc_remote(self.repo, remote, keep_last, branch, keep_best, mode, top, force,
                                 collect.GRACE_S if grace is None else grace, dry_run)

    def repair(self, remote: Optional[str] = None):
        """Heal a damaged remote from this repository's intact copies; see ``mvc.remote.check.repair_remote``."""
        return check.repair_remote(self.repo, remote)

    def list(self) -> "list":
        """Every configured remote (RemoteInfo), by name."""
        with self.repo.index.read() as txn:
            return [config.get(txn, name) for name in config.names(txn)]


class Cache:
    """The local packs of ``repo`` as a bounded cache of its cached remote."""

    def __init__(self, repo):
        self.repo = repo

    def remote(self) -> Optional[str]:
        """The remote this repository caches (``cache.remote``), or None."""
        with self.repo.index.read() as txn:
            return config.cache_remote(txn)

    def pin(self, name: str, pinned: bool = True) -> str:
        """Keep the chunks of branch or tag ``name`` local whatever the cache budget (or stop)."""
        with self.repo.index.write() as txn:
            ref = self.repo.refs.branch_ref(txn, name) or (
                refnames.TAGS + name if txn.ref(refnames.TAGS + name) else None)
            if ref is None:
                raise BadInput(f"no branch or tag named {name!r}")
            if pinned:
                txn.put_meta(config.PIN + ref, b"")
            else:
                txn.delete("meta", (config.PIN + ref).encode())
        return ref

    def evict(self, max_bytes=None):
        """Evict chunks safely on the cached remote until local packs fit ``max_bytes``
        (default ``cache.max-bytes``); see ``mvc.remote.tiers.evict``."""
        budget = None if max_bytes is None else config.parse_size(max_bytes)
        return tiers.evict(self.repo, budget)

    def keep_budget(self) -> None:
        """Evict down to ``cache.max-bytes`` if the local packs grew past it; a goal, not a promise."""
        with self.repo.index.read() as txn:
            budget, cached = config.cache_max(txn), config.cache_remote(txn)
        if budget is not None and cached is not None and tiers.local_bytes(self.repo) > budget:
            try:
                tiers.evict(self.repo, budget)
            except MvcError:  # the budget is a goal, not a promise: the push itself succeeded
                pass

    def status(self):
        """Local vs remote bytes (CacheStatus)."""
        return tiers.status(self.repo)

    def fsck_fetch(self, report):
        """Complete a fsck report by reading back the chunks only the cached remote holds;
        see ``mvc.remote.check.fsck_fetch``."""
        return check.fsck_fetch(self.repo, report)

    def restorable(self, ids) -> dict:
        """{chunk id: remote name} of the ``ids`` a remote holds; see ``mvc.remote.check.restorable``."""
        return check.restorable(self.repo, ids)

    def repair(self):
        """Refetch damaged or missing local chunks and objects from remotes; see ``mvc.remote.check.repair``."""
        return check.repair(self.repo)


# Every setting there is, with what its value is: the one list that ``mvc config``'s
# help, the error for an unknown key and ``settings()`` come from.
SETTINGS = {
    config.CACHE_REMOTE: "the remote whose copy the local disk caches (a remote's name)",
    config.CACHE_MAX: "the budget of local pack bytes (e.g. 20G): beyond it, chunks that are safe on "
                      "cache.remote are evicted here, least recently read first",
    signing.KEY: "the OpenSSH Ed25519 private key file that -S signs with",
    signing.ALLOWED: "the allowed-signers file (ssh-keygen's format) that signatures are checked against",
    signing.REQUIRE: "the branches and tags (comma-separated globs; tags/PATTERN for tags) "
                     "that take only signed commits",
    signing.FETCH: "what fetch does with a remote ref that breaks signing.require: "
                   "refuse (the default: store nothing), flag (store it and log a warning) or off (check nothing)",
}


def setting(repo, key: str, value: Optional[str] = None, unset: bool = False) -> Optional[str]:
    """Read a setting (a key of ``SETTINGS``), or set it / unset it.

    Setting ``cache.remote`` takes effect when the repository is next opened.
    Raises BadInput for an unknown key or a value the setting does not take.
    """
    if key not in SETTINGS:
        raise BadInput(f"unknown setting {key!r}; known: {', '.join(SETTINGS)}")
    if key.startswith("signing."):
        return audit.config(repo, key, value, unset)
    if value is None and not unset:
        with repo.index.read() as txn:
            return config.get_value(txn, key)
    with repo.index.write() as txn:
        if key == config.CACHE_MAX and value is not None and config.cache_remote(txn) is None:
            name = config.default(txn, None)
            config.set_value(txn, config.CACHE_REMOTE, name)  # a budget needs a remote to evict to
        return config.set_value(txn, key, None if unset else value)


def settings(repo) -> dict:
    """{key: value} of the settings that are set, in ``SETTINGS``' order."""
    values = {key: setting(repo, key) for key in SETTINGS}
    return {key: value for key, value in values.items() if value is not None}
