"""Leases: who is changing a remote right now, so a gc never deletes what a running push needs.

Vocabulary:

- **lease**: an object ``leases/<kind>-<random>`` a process writes before
  it changes the remote and deletes when it is done. It names its owner,
  host and process and an expiry time (``TTL`` seconds ahead, renewed by a
  thread every ``TTL / 3`` while the work runs). A lease past its expiry is
  **expired**: its writer died or stalled, and nobody has to wait for it.
  A lease whose writer is a process that no longer runs counts as expired
  at once, if its pid can be asked about here: same host, boot and pid
  namespace (``mvc.store.processes``; a container on this host has pids of
  its own). Any other lease lives until it expires.
- **kinds**: ``push`` (a push, an upload of shards) and ``gc`` (a remote
  gc or repair: anything that deletes packs). Any number of push leases may
  live together; a gc lease excludes every other live lease.

Taking a lease (restic's lock protocol): write your own, then list
``leases/``; if a live lease conflicts, delete your own and fail
(``RemoteBusy``). Of two writers that race, the one that lists second sees
the other's lease, so at least one of them backs off: a gc and a push never
both proceed. This needs only a store whose listings show an object once
its put returned (S3 since 2020, SeaweedFS, MinIO, moto).

A holder checks its lease (``check``) right before the step that depends
on it: a gc before each deletion, a push before it moves refs. A lease that
was lost (expired, or deleted by someone who found it expired) fails that
step. A holder that stalls right after a check still acts once when it
resumes; what makes that harmless is the fence (a gc's lease names the packs
it is **condemning**, then the gc rewrites every ref, so a push's late ref
move fails, and a later push avoids the condemned packs): ``docs/format.md``
(section 11.6) gives the whole protocol and why it is safe.
"""

import os
import secrets
import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from .. import encoding
from ..errors import CorruptObject, RemoteBusy
from ..store import locks as locking
from ..store import processes
from .bucket import NotFound, PreconditionFailed

FOLDER = "leases/"
PUSH, GC = "push", "gc"


def ttl() -> float:
    """Seconds a lease lives unless renewed (``MVC_REMOTE_LEASE_S``, default 300)."""
    try:
        value = float(os.environ.get("MVC_REMOTE_LEASE_S", "300"))
    except ValueError:
        value = 300.0
    return value if value > 0 else 300.0


def encode(kind: str, owner: str, expires: float, condemned: tuple = ()) -> bytes:
    value = {"kind": kind, "owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
             "started": processes.start_token(os.getpid()), "pidns": processes.pid_namespace(),
             "since": time.time(), "expires": float(expires)}
    if condemned:
        value["condemned"] = list(condemned)
    return encoding.pack(value)


def _gone(lease: dict) -> bool:
    """Whether the lease's writer is a process seen from here that is no longer running (killed):
    its lease is as good as expired, as a branch lock of a dead process is stale.

    Anything less certain waits for the expiry, which costs at most ``ttl()``:
    another host's lease, one without a start token or pid namespace (an
    older mvc's), one from another container on this host, and, unlike a
    branch lock, one of this host's name from another boot, since many
    machines share a remote and two of them may carry the same name."""
    pid, started = lease.get("pid"), lease.get("started")
    if type(pid) is not int or not isinstance(started, str):
        return False
    if processes.seen(lease.get("host"), started, lease.get("pidns")) is not processes.Seen.HERE:
        return False
    return not processes.process_alive(pid, started)


def decode(data: bytes, key: str) -> Optional[dict]:
    """The lease's fields, or None if the object is not a lease mvc wrote."""
    try:
        value = encoding.unpack(data, f"remote lease {key}")
    except CorruptObject:
        return None
    if type(value) is not dict or value.get("kind") not in (PUSH, GC) or type(value.get("expires")) is not float:
        return None
    condemned = value.get("condemned", [])
    if type(condemned) is not list or not all(type(k) is str for k in condemned):
        return None
    return value


def condemned(bucket) -> set:
    """The pack keys that any gc lease, live or expired, names as about to be deleted: a push must
    not count on them (a gc that stalled past its lease may still delete one). A lease that does
    not decode is read as condemning nothing, as ``take`` reads it as no lease."""
    out = set()
    for key, _ in bucket.list(FOLDER):
        current = bucket.get_versioned(key)
        value = decode(current[0], key) if current else None
        if value is not None and value["kind"] == GC:
            out.update(value.get("condemned", ()))
    return out


def drop_spent(bucket, listed: set) -> None:
    """Delete the expired gc leases whose condemned packs are all gone from ``listed`` (the
    remote's pack keys): nothing is left for their stalled writers to delete."""
    now = time.time()
    for key, _ in bucket.list(FOLDER):
        current = bucket.get_versioned(key)
        value = decode(current[0], key) if current else None
        if value is not None and value.get("condemned") and value["expires"] < now \
                and not listed & set(value["condemned"]):
            _delete_if_unchanged(bucket, key, current[1])


class Lease:
    """One held lease: renewed in a thread; ``check()`` raises RemoteBusy once it is lost."""

    def __init__(self, conn, kind: str):
        self.conn, self.kind = conn, kind
        self.key = f"{FOLDER}{kind}-{secrets.token_hex(8)}"
        self.owner = locking.default_author()
        self.etag: Optional[str] = None
        self.expires = 0.0
        self.condemned: tuple = ()  # a gc's: the packs it is about to delete
        self.lost = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._guard = threading.Lock()

    def take(self) -> None:
        """Write the lease, then back off (RemoteBusy) if a live lease conflicts with it."""
        bucket = self.conn.bucket
        self.expires = time.time() + ttl()
        self.etag = bucket.put(self.key, encode(self.kind, self.owner, self.expires), if_absent=True)
        now = time.time()
        for key, _ in bucket.list(FOLDER):
            if key == self.key:
                continue
            current = bucket.get_versioned(key)
            other = decode(current[0], key) if current else None
            if other is None:
                continue
            if other["expires"] < now or _gone(other):
                # its writer died or stalled: it checks its lease before acting. A stalled gc's
                # condemned packs stay named (pushes avoid them) until its writer is seen gone or
                # the packs are (drop_spent): it may still delete the one it last checked for.
                if self.kind == GC and (not other.get("condemned") or _gone(other)):
                    _delete_if_unchanged(bucket, key, current[1])
                continue
            if self.kind == GC or other["kind"] == GC:
                self._drop()
                what = "a remote gc" if other["kind"] == GC else "a push"
                raise RemoteBusy(f"{what} by {other.get('owner')} on {other.get('host')} is changing remote "
                                 f"{self.conn.name!r} (lease {key}, until "
                                 f"{time.strftime('%H:%M:%S', time.localtime(other['expires']))}); try again "
                                 "when it is done", remote=self.conn.name,
                                 holder=f"{other.get('owner')}@{other.get('host')}", kind=other["kind"])
        self._thread = threading.Thread(target=self._renew, name="mvc-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(ttl() / 3):
            expires = time.time() + ttl()
            try:
                with self._guard:
                    self.etag = self.conn.bucket.put(self.key, encode(self.kind, self.owner, expires,
                                                                      self.condemned), if_match=self.etag)
                    self.expires = expires
            except (PreconditionFailed, NotFound):
                self.lost = True
                return
            except Exception:  # the server is away: check() fails once the lease runs out
                continue

    def check(self) -> None:
        """RemoteBusy unless this lease is still ours and live, with a margin for the step ahead."""
        margin = min(30.0, ttl() / 10)
        with self._guard:
            live = not self.lost and time.time() + margin < self.expires
            if live:
                current = self.conn.bucket.get_versioned(self.key)
                live = current is not None and current[1] == self.etag
        if not live:
            self.lost = True
            raise RemoteBusy(f"this process's lease on remote {self.conn.name!r} ran out (it stalled, or the "
                             "server was away); nothing more was changed: run the command again",
                             remote=self.conn.name, holder=self.owner, kind=self.kind)

    def condemn(self, keys) -> None:
        """Name in this (gc) lease the packs it is about to delete, before the refs are fenced
        (``docs/format.md`` 11.6); RemoteBusy if the lease was lost."""
        with self._guard:
            condemned = tuple(sorted(keys))
            try:
                self.etag = self.conn.bucket.put(self.key, encode(self.kind, self.owner, self.expires, condemned),
                                                 if_match=self.etag)
            except (PreconditionFailed, NotFound):
                self.lost = True
            else:
                self.condemned = condemned
        self.check()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._drop()

    def _drop(self) -> None:
        if self.conn.bucket.away:  # the command's deadline is spent: the lease expires on its own
            return
        try:
            self.conn.bucket.delete(self.key)
        except Exception:  # best effort: it expires on its own
            pass


def _delete_if_unchanged(bucket, key: str, etag: str) -> None:
    current = bucket.get_versioned(key)
    if current is not None and current[1] == etag:
        bucket.delete(key)


@contextmanager
def held(conn, kind: str) -> Iterator[Lease]:
    """Hold a ``kind`` lease on ``conn``'s remote for the block (RemoteBusy if one conflicts)."""
    lease = Lease(conn, kind)
    lease.take()
    try:
        yield lease
    finally:
        lease.release()
