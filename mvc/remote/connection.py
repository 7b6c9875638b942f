"""A remote as one command uses it: its settings, bucket and catalogue (``Connection``), and the
small readings of the remote's keys every remote module shares (``is_ref``, ``classify``).

Vocabulary:

- **connection**: remote NAME's settings (``config``), its bucket (opened on
  first use) and this repository's catalogue of its packs. push, fetch,
  gc, fsck --remote, repair and the cache each open one per command.
- **remote ref**: a key ``refs/heads/X`` or ``refs/tags/X`` (``docs/format.md``
  11.1); ``is_ref`` says whether a key's name is one mvc reads.
"""

from typing import Optional

from .. import encoding
from .. import refs as refnames
from ..errors import CorruptObject, RemoteError, RemoteVanished
from ..objects import CommitObject, TensorObject, TreeObject
from . import config, layout
from .bucket import NotFound, PreconditionFailed, open_bucket
from .catalogue import Catalogue

REMOTES = refnames.REMOTES


class Connection:
    """One remote as a command uses it: its settings, bucket and catalogue."""

    def __init__(self, repo, name: Optional[str] = None, create: bool = False):
        self.repo, self.create = repo, create  # create: a push may make a folder remote's folder
        with repo.index.read() as txn:
            self.name = config.default(txn, name)
            self.info = config.get(txn, self.name)
        self._bucket = None
        self.layout: Optional[int] = None  # the remote's layout, once MVCREMOTE was read
        self.catalogue = Catalogue(repo.dir, self.name)
        self.catalogue.source = lambda: self.bucket  # a lookup may read trailers not read yet

    @property
    def bucket(self):
        if self._bucket is None:
            self._bucket = open_bucket(self.info.url, self.info.endpoint_url, create=self.create)
        return self._bucket

    def ensure_conditional(self) -> None:
        """Probe that conditional writes are honoured (RemoteError if not), at every command that
        moves refs: a bucket can move behind the same endpoint to a store that ignores If-Match,
        and a probe remembered from before would let two racing pushes both "win"."""
        self.bucket.check_conditional()
        if not self.info.conditional:
            self.info = config.RemoteInfo(self.info.name, self.info.url, self.info.endpoint_url, True)
            with self.repo.index.write() as txn:
                config.put(txn, self.info)

    def known(self) -> bool:
        """Whether this repository used the remote before (it holds tracking refs of it, or a listing
        of its packs): a push must then find it there, not make a new one where it was."""
        with self.repo.index.read() as txn:
            if any(True for _ in txn.refs(f"{REMOTES}{self.name}/")):
                return True
        return bool(self.catalogue.pack_keys())

    def vanished(self) -> RemoteVanished:
        """The error for a remote this repository used before that holds no mvc remote now."""
        return RemoteVanished(f"remote {self.name!r} ({self.info.url}) holds no mvc remote, though this repository "
                              "used it before: it moved or its disk is not mounted; nothing was written there",
                              remote=self.name, url=self.info.url)

    def marker(self, create: bool) -> Optional[int]:
        """The remote's chunk size from MVCREMOTE; with ``create``, write it if absent."""
        current = self.bucket.get_versioned(layout.MARKER)
        if current is None and create:
            try:
                self.bucket.put(layout.MARKER, layout.marker(self.repo.chunk_size), if_absent=True)
            except PreconditionFailed:
                pass  # another pusher made it first
            current = self.bucket.get_versioned(layout.MARKER)
        if current is None:
            return None
        self.layout, size = layout.read_marker(current[0], self.bucket.url)
        return size

    def upgrade(self) -> None:
        """Make the remote's MVCREMOTE name layout 2 (``layout.LAYOUT_VERSION``) before this command's
        first fenced ref or tombstone or condemned lease, so an mvc that reads only layout 1 refuses
        the remote ("upgrade mvc") instead of reading fenced refs as damaged or pushing without
        honouring condemned packs (docs/format.md 11.1.1). A conditional put on the etag read; a lost
        race reads again. RemoteVanished if the remote holds no MVCREMOTE."""
        if self.layout == layout.LAYOUT_VERSION:
            return
        for _ in range(5):
            current = self.bucket.get_versioned(layout.MARKER)
            if current is None:
                raise self.vanished()
            version, size = layout.read_marker(current[0], self.bucket.url)
            if version == layout.LAYOUT_VERSION:
                self.layout = version
                return
            try:
                self.bucket.put(layout.MARKER, layout.marker(size), if_match=current[1])
            except (PreconditionFailed, NotFound):
                continue  # someone else rewrote or removed it meanwhile: read it again
            self.layout = layout.LAYOUT_VERSION
            return
        raise RemoteError(f"{self.bucket.url}/{layout.MARKER} kept changing while this command upgraded it to "
                          f"layout {layout.LAYOUT_VERSION}; it moved no ref: run the command again")

    def remote_refs(self) -> dict:
        """{heads/X or tags/X: (commit id, protected, etag)} as the remote holds them now.

        Deleted refs (tombstones) are left out, their etags kept in
        ``self.deleted`` (a new ref of that name replaces the tombstone by
        If-Match); refs whose object does not decode are left out too, named
        in ``self.damaged`` {ref: etag}: one bad object must not stop every
        fetch of the others.
        """
        out, self.deleted, self.damaged = {}, {}, {}
        for key, _ in self.bucket.list(layout.REFS):
            ref = key[len(layout.REFS):]
            if not is_ref(ref):
                continue  # not a ref mvc writes: never let a remote's key become a local ref name
            current = self.bucket.get_versioned(key)
            if current is None:  # deleted since the listing
                continue
            if layout.is_tombstone(current[0]):
                self.deleted[ref] = current[1]
                continue
            try:
                oid, protected = layout.decode_ref(current[0], key)
            except CorruptObject:
                self.damaged[ref] = current[1]
                continue
            out[ref] = (oid, protected, current[1])
        return out

    def close(self) -> None:
        self.catalogue.close()
        if self._bucket is not None:
            self._bucket.close()


def is_ref(ref: str) -> bool:
    """Whether ``ref`` (a key under ``refs/`` without it) names a branch or tag mvc reads."""
    return ref.startswith((refnames.BRANCHES, refnames.TAGS)) and refnames.is_valid_name(refnames.short_name(ref))


def classify(data: bytes, oid: bytes):
    """(kind, decoded) of a verified object record: commits, trees, tensors or pruned."""
    value = encoding.unpack(data, f"object {oid.hex()[:12]}")
    kind = value.get("type") if type(value) is dict else None
    if kind == "commit":
        return "commits", CommitObject.decode(data)
    if kind == "tree":
        return "trees", TreeObject.decode(data)
    if kind == "tensor":
        return "tensors", TensorObject.decode(data)
    if kind == "pruned" and type(value.get("commit")) is bytes:
        return "pruned", value
    raise CorruptObject(f"object {oid.hex()[:12]} on the remote is of no known type")
