"""Audit: who made each commit and tag, whether it holds, and scans that keep proving it.

Vocabulary (signatures themselves are in ``mvc/signing.py``):

- **verification**: a commit's or tag's signature verdict (good, bad,
  unknown, unsigned) against the repository's allowed signers, after its
  stored bytes were checked against its id (bytes that do not hash to the
  id are ``bad``, whatever the signature says).
- **audit**: the history from a commit back to its roots, every commit
  with its parents, author, time, training record, context highlights and
  verification: what a reviewer needs to check a deployed checkpoint.
- **policy**: refs that require good signatures (``signing.require``); a
  commit, push or fetch that would put a commit whose verdict is not good
  on such a ref, or rewrite it (anything but a fast-forward), is refused
  (fetch may only flag it, ``signing.fetch flag``).
- **scan**: one run of the scheduled integrity scan. The sealed packs'
  records form a **ring** (packs by name, records by offset); each run
  re-verifies records from where the last run stopped (the **cursor**, in
  ``.mvc/scan-state``) until its budget is spent: a share of all stored
  bytes (``"10%"``) or of time (``"30s"``). With a share of P percent, any
  ``ceil(100 / P)`` consecutive runs verify every record of every pack that
  existed throughout them. Every run also verifies every pack's trailer
  (its BLAKE3), which is small. A record the chunk index does not point at
  is **unused**: garbage nothing reads (gc reclaims it, and may already have
  dropped the index entry of the base a garbage delta needs), so a scan
  passes over it without judging it and counts it apart from what it verified.
"""

import itertools
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from . import reach
from . import refs as refnames
from . import signing
from .errors import (BadInput, CorruptObject, HistoryRewritten, ObjectNotFound, ScanFoundDamage,
                     SignatureRequired, SigningKeyError, UnknownRevision)
from .objects import CommitObject, TagObject, object_id
from .store import fs
from .store.chunks import pack_filename

log = logging.getLogger("mvc.audit")
SCAN_STATE = "scan-state"
# The context fields an audit shows beside the user's own top-level values.
HIGHLIGHTS = (("code", "git_commit"), ("code", "dirty"), ("code", "entry_script"), ("hardware", "hostname"),
              ("hardware", "gpu_names"), ("software", "torch"), ("software", "mvc"), ("seed",),
              ("distributed", "world_size"), ("data", "dataset"))


# -- keys and settings ------------------------------------------------------------

def signer(repo, sign, passphrase=None) -> Optional[signing.SigningKey]:
    """The key ``sign`` names: None/False (no signing), a SigningKey, a key file path, or
    True for the key in setting ``signing.key``. SigningKeyError if it cannot be used."""
    if sign is None or sign is False:
        return None
    if isinstance(sign, signing.SigningKey):
        return sign
    if sign is True:
        with repo.index.read() as txn:
            path = signing.get_setting(txn, signing.KEY)
        if path is None:
            raise SigningKeyError("no signing key is set: setting signing.key names no key file, and none "
                                  "was given (an Ed25519 key: ssh-keygen -t ed25519)")
        sign = signing.resolve_path(repo.root, path)
    passphrase = passphrase if passphrase is not None else os.environ.get("MVC_SIGNING_PASSPHRASE")
    return signing.load_key(sign, passphrase)


def config(repo, key: str, value: Optional[str], unset: bool) -> Optional[str]:
    """Read or set a ``signing.*`` setting (see mvc.signing)."""
    if value is None and not unset:
        with repo.index.read() as txn:
            return signing.get_setting(txn, key)
    with repo.index.write() as txn:
        return signing.set_setting(txn, key, None if unset else value)


_ALLOWED_CACHE: dict = {}  # path -> (its bytes, AllowedSigners): log --show-signature reads it per commit


def allowed_signers(repo, txn) -> Optional[list]:
    """The repository's AllowedSigners, None when no file is configured; BadAllowedSigners if unreadable."""
    return _allowed_signers_at(repo.root, txn)


def _allowed_signers_at(root: Path, txn) -> Optional[list]:
    path = signing.get_setting(txn, signing.ALLOWED)
    if path is None:
        return None
    path = signing.resolve_path(root, path)
    try:  # the bytes, not the file's times and size: a key replaced in place by one of the same
        data = path.read_bytes()  # length within the clock's tick (or with its mtime kept) is a new file
    except OSError:
        data = None  # read_allowed_signers says what is wrong
    cached = _ALLOWED_CACHE.get(str(path))
    if data is not None and cached is not None and cached[0] == data:
        return cached[1]
    allowed = signing.read_allowed_signers(path)
    if data is not None:
        _ALLOWED_CACHE[str(path)] = (data, allowed)
    return allowed


def sign_commit(obj: CommitObject, key: signing.SigningKey) -> CommitObject:
    return CommitObject(obj.tree, obj.parents, obj.message, obj.author, obj.time, obj.step, obj.epoch,
                        obj.metrics, obj.context, signing.sign(key, obj.payload()))


# -- verification ---------------------------------------------------------------

@dataclass(frozen=True)
class CommitVerification:
    id: str
    status: str  # good, bad, unknown, unsigned
    principal: Optional[str] = None
    key: Optional[str] = None  # SHA256 fingerprint
    reason: str = ""
    author: str = ""
    time: float = 0.0

    @property
    def good(self) -> bool:
        return self.status == signing.GOOD


def verify_stored_commit(txn, oid: bytes, allowed: Optional[list]) -> tuple:
    """(CommitVerification, CommitObject or None) for commit ``oid`` as the index holds it."""
    data = txn.get("commits", oid)
    if data is None:
        raise ObjectNotFound(f"commit {oid.hex()[:12]} is missing from the index", id=oid)
    return verify_commit_bytes(oid, data, allowed)


def verify_commit_bytes(oid: bytes, data: bytes, allowed: Optional[list]) -> tuple:
    """(CommitVerification, CommitObject or None) for the bytes ``data`` claimed to be commit ``oid``."""
    if object_id(data) != oid:
        return CommitVerification(oid.hex(), signing.BAD, reason="its bytes do not hash to its id "
                                  "(damaged or altered)"), None
    try:
        obj = CommitObject.decode(data)
    except CorruptObject as exc:
        return CommitVerification(oid.hex(), signing.BAD, reason=f"it does not decode: {exc}"), None
    v = signing.verify(obj.signature, obj.payload(), allowed, obj.time / 1e6)
    return CommitVerification(oid.hex(), v.status, v.principal, v.key, v.reason, obj.author, obj.time / 1e6), obj


def verify_commit(repo, rev: str) -> CommitVerification:
    with repo.index.read() as txn:
        oid = repo.refs.resolve(txn, rev)
        allowed = allowed_signers(repo, txn)
        return verify_stored_commit(txn, oid, allowed)[0]


@dataclass(frozen=True)
class TagVerification:
    name: str
    target: str  # the commit the tag's ref names (hex)
    status: str
    principal: Optional[str] = None
    key: Optional[str] = None
    reason: str = ""
    tagger: str = ""
    time: float = 0.0
    message: str = ""
    tag_id: Optional[str] = None  # BLAKE3 of the tag object, when signed

    @property
    def good(self) -> bool:
        return self.status == signing.GOOD


def _tag_key(name: str) -> str:
    return signing.TAG_PREFIX + name


def put_tag(txn, name: str, target: Optional[bytes], key: Optional[signing.SigningKey], message: str = "",
            tagger: str = "", now_us: int = 0) -> None:
    """Store the signed tag object of tag ``name`` (``key`` given), or drop a signed
    tag object that no longer names the tag's target (a tag moved or deleted unsigned)."""
    meta = _tag_key(name)
    if key is not None:
        obj = TagObject(name, target, tagger, now_us, message)
        txn.put_meta(meta, TagObject(name, target, tagger, now_us, message,
                                     signing.sign(key, obj.payload())).encode())
        return
    raw = txn.meta(meta)
    if raw is None:
        return
    try:
        keep = target is not None and TagObject.decode(raw).target == target
    except CorruptObject:
        keep = False
    if not keep:
        txn.delete("meta", meta.encode())


def verify_tag(repo, name: str) -> TagVerification:
    """UnknownRevision if there is no tag ``name``."""
    ref = refnames.TAGS + refnames.check_name(name, "tag")
    with repo.index.read() as txn:
        value = txn.ref(ref)
        if value is None or value.id is None:
            raise UnknownRevision(f"no tag named {name!r}")
        raw = txn.meta(_tag_key(name))
        allowed = allowed_signers(repo, txn) if raw is not None else None
    target = value.id.hex()
    if raw is None:
        return TagVerification(name, target, signing.UNSIGNED)
    tag_id = object_id(raw).hex()
    try:
        obj = TagObject.decode(raw)
    except CorruptObject as exc:
        return TagVerification(name, target, signing.BAD, reason=f"its tag object does not decode: {exc}",
                               tag_id=tag_id)
    v = signing.verify(obj.signature, obj.payload(), allowed, obj.time / 1e6)
    status, reason = v.status, v.reason
    if obj.name != name or obj.target != value.id:
        status = signing.BAD
        reason = (f"the signed tag names {obj.name!r} at {obj.target.hex()[:12]}, but tag {name!r} is at "
                  f"{target[:12]} (moved after it was signed)")
    return TagVerification(name, target, status, v.principal, v.key, reason, obj.tagger, obj.time / 1e6,
                           obj.message, tag_id)


# -- audit ------------------------------------------------------------------------

@dataclass(frozen=True)
class AuditEntry:
    id: str
    parents: tuple
    author: str
    time: float
    message: str
    step: Optional[int]
    epoch: Optional[int]
    metrics: dict
    highlights: dict  # context fields a reviewer looks at first (dotted names)
    tree: str
    signature: CommitVerification
    pruned: bool = False
    encoding: bytes = b""  # with objects=True: the stored bytes (BLAKE3 of them is the id) ...
    payload: bytes = b""  # ... and what the signature covers, for checking without mvc
    sshsig: bytes = b""


@dataclass(frozen=True)
class AuditReport:
    rev: str
    id: str
    commits: tuple  # AuditEntry, newest first (every ancestor, all parents)
    roots: tuple  # ids of the commits with no parents
    allowed_signers: Optional[str]  # the file verified against, None when none is set

    @property
    def counts(self) -> dict:
        out = {s: 0 for s in (signing.GOOD, signing.BAD, signing.UNKNOWN, signing.UNSIGNED)}
        for e in self.commits:
            out[e.signature.status] += 1
        return out

    @property
    def ok(self) -> bool:
        """True when every commit back to the roots has a good signature."""
        return all(e.signature.good for e in self.commits)


def highlights(context: dict) -> dict:
    out = {str(k): v for k, v in context.items() if isinstance(v, (str, int, float, bool)) or v is None}
    for path in HIGHLIGHTS:
        value = context
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None:
            out[".".join(path)] = value
    return out


def audit(repo, rev: str, objects: bool = False) -> AuditReport:
    """Every commit ``rev`` reaches (all parents), newest first, each verified;
    with ``objects``, each entry carries its stored bytes, payload and signature.

    A commit whose stored bytes are damaged is listed as ``bad`` with no
    record (its parents cannot be trusted, so the walk stops there).
    """
    with repo.index.read() as txn:
        start = repo.refs.resolve(txn, rev)
        path = signing.get_setting(txn, signing.ALLOWED)
        allowed = allowed_signers(repo, txn)
        entries, roots, verdicts = [], [], {}

        def commit(oid):  # a damaged one is listed with no record, and its line ends there
            verdicts[oid], obj = verify_stored_commit(txn, oid, allowed)
            if obj is None:
                entries.append(AuditEntry(oid.hex(), (), "", 0.0, "", None, None, {}, {}, "", verdicts[oid]))
            return obj
        for oid, obj in reach.ancestors(commit, [start]):
            verdict = verdicts[oid]
            raw = (txn.get("commits", oid), obj.payload(), obj.signature) if objects else (b"", b"", b"")
            entries.append(AuditEntry(oid.hex(), tuple(p.hex() for p in obj.parents), obj.author, obj.time / 1e6,
                                      obj.message, obj.step, obj.epoch, dict(obj.metrics), highlights(obj.context),
                                      obj.tree.hex(), verdict, txn.pruned(oid) is not None, *raw))
            if not obj.parents:
                roots.append(oid.hex())
    entries.sort(key=lambda e: -e.time)
    return AuditReport(rev, start.hex(), tuple(entries), tuple(roots), path)


# -- policy -------------------------------------------------------------------------

def check_commit_policy(txn, ref: Optional[str], key) -> None:
    """SignatureRequired if ``ref`` requires signatures and the commit is not to be signed."""
    if key is None and ref is not None and signing.required(signing.get_setting(txn, signing.REQUIRE), ref):
        raise SignatureRequired(f"{refnames.human(ref)} requires signed commits (signing.require); nothing was "
                                "written: sign the commit with a signing key",
                                ref=ref, status=signing.UNSIGNED)


def _ancestors(get: Callable, tip: Optional[bytes]) -> set:
    """Every commit ``tip`` reaches (itself included, and ids held nowhere that a commit names as a
    parent); ``get(oid)`` gives a CommitObject or None."""
    return reach.reached(get, [tip] if tip is not None else [])


def _first_failure(new: bytes, old: Optional[bytes], data_of: Callable, get: Callable,
                   allowed) -> Optional[CommitVerification]:
    """The first commit ``new`` reaches that ``old`` does not whose verdict is not good (None: all good)."""
    failed = []

    def commit(oid):  # the first failure ends the walk: nothing after it is read
        if failed:
            return None
        data = data_of(oid)
        if data is None:
            failed.append(CommitVerification(oid.hex(), signing.BAD, reason="the commit is missing"))
            return None
        verdict, obj = verify_commit_bytes(oid, data, allowed)
        if not verdict.good:
            failed.append(verdict)
            return None
        return obj
    for _ in reach.ancestors(commit, [new], stop=_ancestors(get, old)):
        if failed:
            break
    return failed[0] if failed else None


def check_ref_move(repo, txn, ref: str, old: Optional[bytes], new: bytes, where: str,
                   fetched: Optional[dict] = None) -> Optional[Exception]:
    """The error a move of ``ref`` from ``old`` to ``new`` breaks its policy with
    (HistoryRewritten, SignatureRequired), or None when the ref requires nothing or
    the move is a fast-forward over commits whose signatures are all good.
    ``fetched``: {id: bytes} of commits not stored locally yet."""
    return _move_error(repo.root, txn, ref, old, new, where, fetched)


class RefPolicy:
    """The check of every local move of a branch or tag (``mvc.refs.Refs``' policy hook):
    a ref that ``signing.require`` names may only fast-forward, onto commits whose
    signatures are good (a commit, merge, pull, branch, tag, rename or ``checkout -b``
    alike; ``force`` does not bypass it). Raises HistoryRewritten or SignatureRequired
    (``ref``, ``id``, ``status``). Holds the work directory only (allowed-signers paths
    are relative to it), so the repository holding it makes no reference cycle."""

    def __init__(self, root):
        self.root = Path(root)

    def __call__(self, txn, ref: str, old: Optional[bytes], new: bytes) -> None:
        error = _move_error(self.root, txn, ref, old, new, "")
        if error is not None:
            raise error


def _move_error(root: Path, txn, ref: str, old: Optional[bytes], new: bytes, where: str,
                fetched: Optional[dict] = None) -> Optional[Exception]:
    if not signing.required(signing.get_setting(txn, signing.REQUIRE), ref) or old == new:
        return None
    fetched = fetched or {}

    def data_of(oid):
        return txn.get("commits", oid) if txn.get("commits", oid) is not None else fetched.get(oid)

    def get(oid):
        data = data_of(oid)
        try:
            return CommitObject.decode(data) if data is not None else None
        except CorruptObject:
            return None
    human = " ".join(w for w in (refnames.human(ref), where) if w)
    tip = get(new)
    if old is not None and tip is not None and tip.parents == (old,):
        # one commit on the tip (every commit, most moves): it is the only commit the move adds
        verdict, _ = verify_commit_bytes(new, data_of(new), _allowed_signers_at(root, txn))
        failed = None if verdict.good else verdict
    else:
        if old is not None and old not in _ancestors(get, new):
            return HistoryRewritten(f"{human} requires signed history and may only fast-forward, but "
                                    f"{new.hex()[:12]} does not descend from {old.hex()[:12]}",
                                    ref=ref, old=old.hex(), new=new.hex())
        failed = _first_failure(new, old, data_of, get, _allowed_signers_at(root, txn))
    if failed is None:
        return None
    return SignatureRequired(f"{human} requires good signatures, and commit {failed.id[:12]} is "
                             f"{failed.status}{': ' + failed.reason if failed.reason else ''}",
                             ref=ref, id=failed.id, status=failed.status)


def check_push(repo, ref: str, old: Optional[bytes], new: bytes, remote: str) -> None:
    """Raise the policy's error for moving ``ref`` on ``remote`` from ``old`` to ``new``
    (force does not bypass it). Called by push before each conditional ref write."""
    with repo.index.read() as txn:
        error = check_ref_move(repo, txn, ref, old, new, f"on remote {remote!r}")
    if error is not None:
        raise error


def check_push_targets(repo, remote_refs: Callable, targets: dict, remote: str) -> None:
    """``check_push`` for every ref a push will move (``targets``: {ref: (tip, protected)}),
    before anything is uploaded; ``remote_refs()`` (read only when a policy is set) gives
    {ref: (id, protected, etag)}. The check before each ref write still decides."""
    with repo.index.read() as txn:
        patterns = signing.get_setting(txn, signing.REQUIRE)
    if not any(signing.required(patterns, ref) for ref in targets):
        return
    current = remote_refs()
    for ref, (tip, _) in sorted(targets.items()):
        check_push(repo, ref, current.get(ref, (None,))[0], tip, remote)


def check_fetch(repo, remote: str, refs: dict, fetched: dict) -> list:
    """The policy errors of fetching ``refs`` ({ref: new id}) from ``remote``,
    checked against the tracking refs (``remotes/NAME/BRANCH``) and, for tags,
    the local tags. With ``signing.fetch`` ``refuse`` (the default) the first
    is raised; ``flag`` logs them and returns them; ``off`` checks nothing."""
    with repo.index.read() as txn:
        mode = signing.get_setting(txn, signing.FETCH) or "refuse"
        if mode == "off":
            return []
        errors = []
        for ref, new in sorted(refs.items()):
            local = (refnames.REMOTES + remote + "/" + refnames.short_name(ref)
                     if ref.startswith(refnames.BRANCHES) else ref)
            current = txn.ref(local)
            old = current.id if current is not None else None
            error = check_ref_move(repo, txn, ref, old, new, f"on remote {remote!r}", fetched)
            if error is not None:
                errors.append(error)
    if errors and mode == "refuse":
        raise errors[0]
    for error in errors:
        log.warning("fetch from %s: %s", remote, error)
    return errors


REWRITTEN, UNTRUSTED = "rewritten-protected-ref", "untrusted-history"


def remote_findings(repo, remote: str, refs: dict, objects: dict, protected=frozenset()) -> list:
    """(kind, ref key, detail) for each remote ref (``{"refs/heads/x": id}``) that is
    protected (its key in ``protected``, the remote's flag) or requires signatures and was
    rewritten since this repository last saw it (its tracking ref, or local tag), or
    whose new commits' signatures are not good. ``objects``: the remote's objects {id:
    bytes}. For ``fsck --remote``; whatever ``signing.fetch`` says."""
    out = []
    with repo.index.read() as txn:
        for key, new in sorted(refs.items()):
            ref = key[len("refs/"):] if key.startswith("refs/") else key
            local = (refnames.REMOTES + remote + "/" + refnames.short_name(ref)
                     if ref.startswith(refnames.BRANCHES) else ref)
            current = txn.ref(local)
            old = current.id if current is not None else None
            error = check_ref_move(repo, txn, ref, old, new, f"on remote {remote!r}", objects)
            if error is None and key in protected and old is not None and old != new:
                error = _rewrite(txn, ref, old, new, objects, f"(protected) on remote {remote!r}")
            if error is not None:
                out.append((REWRITTEN if isinstance(error, HistoryRewritten) else UNTRUSTED, key, str(error)))
    return out


def _rewrite(txn, ref: str, old: bytes, new: bytes, objects: dict, where: str) -> Optional[HistoryRewritten]:
    """HistoryRewritten when ``new`` does not descend from ``old`` (commits local or in ``objects``)."""
    def get(oid):
        data = txn.get("commits", oid)
        data = data if data is not None else objects.get(oid)
        try:
            return CommitObject.decode(data) if data is not None else None
        except CorruptObject:
            return None
    if old in _ancestors(get, new):
        return None
    return HistoryRewritten(f"{refnames.human(ref)} {where} was rewritten: {new.hex()[:12]} does not descend "
                            f"from {old.hex()[:12]}, which this repository saw there",
                            ref=ref, old=old.hex(), new=new.hex())


# -- scheduled integrity scans ------------------------------------------------------

@dataclass(frozen=True)
class ScanProblem:
    pack: str  # file name in .mvc/packs
    chunk: Optional[str]  # hex id of the record's chunk; None for a damaged pack trailer
    kind: str
    detail: str


@dataclass(frozen=True)
class ScanReport:
    budget: str  # as given: "10%" or "30s"
    packs: int  # packs whose records the run verified
    records: int  # records verified
    bytes_verified: int
    bytes_total: int  # record bytes in all sealed packs
    seconds: float
    wrapped: bool  # the cursor passed the end of the ring (a full pass since the state began ended)
    runs_to_cover: Optional[int]  # the promise: any this many consecutive runs cover everything (share budgets)
    problems: tuple = ()
    cursor: tuple = ()  # (pack file, offset) where the next run starts
    unused: int = 0  # records passed over, not verified: the index points at none of them (garbage)
    unused_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def parse_budget(budget) -> tuple:
    """("share", fraction) for "10%", ("seconds", s) for "30s" / "30" / 30; BadInput otherwise."""
    text = str(budget).strip().lower()
    try:
        if text.endswith("%"):
            share = float(text[:-1]) / 100
            if not 0 < share <= 1:
                raise ValueError
            return "share", share
        seconds = float(text[:-1] if text.endswith("s") else text)
        if not seconds > 0 or math.isinf(seconds):
            raise ValueError
        return "seconds", seconds
    except ValueError:
        raise BadInput(f"scan budget {budget!r} is not a share of the repository (like 10%) "
                       "or a number of seconds (like 30s)") from None


def _load_state(path: Path) -> dict:
    try:
        state = json.loads(path.read_text())
        if isinstance(state, dict) and isinstance(state.get("pack"), str) and isinstance(state.get("offset"), int):
            return state
    except (OSError, ValueError):
        pass  # derived data: a lost or damaged state starts the ring over
    return {"pack": "", "offset": 0, "runs": 0, "passes": 0}


def _save_state(path: Path, state: dict) -> None:
    fs.atomic_write(path, json.dumps(state).encode())


def _ring(repo) -> list:
    """(pack name bytes, file name) of the sealed packs, by name."""
    return [(f.pack, f.name) for f in repo.chunks.pack_files() if f.regular and f.pack is not None]


def scan(repo, budget="10%", progress: Optional[Callable[[int, int], None]] = None) -> ScanReport:
    """Verify the next part of the ring within ``budget``; see the module docstring.

    Never raises on damage: the report lists it. Holds the shared gc lock.
    """
    kind, amount = parse_budget(budget)
    with repo.gc_lock.shared():
        return _scan(repo, str(budget), kind, amount, progress)


def _records(chunks, ring: list) -> tuple:
    """(the ring's records [(key, id, Location)] in order, ScanProblems of packs whose trailer
    is damaged). ``key`` is (pack name hex, offset). Every trailer is verified here, each run."""
    items, problems = [], []
    for name, fname in ring:
        try:
            located = chunks.pack_locations(name)
        except (CorruptObject, OSError) as exc:
            problems.append(ScanProblem(fname, None, "damaged-pack", str(exc)))
            continue
        items += [((name.hex(), loc.offset), cid, loc) for cid, loc in located]
    return items, problems


def _pieces(items: list, limit: int = 4 << 20):
    """``items`` cut into runs of about ``limit`` bytes with no chunk id twice (verify takes a dict)."""
    piece, ids, size = [], set(), 0
    for item in items:
        if piece and (size >= limit or item[1] in ids):
            yield piece
            piece, ids, size = [], set(), 0
        piece.append(item)
        ids.add(item[1])
        size += item[2].length
    if piece:
        yield piece


def _scan(repo, budget: str, kind: str, amount: float, progress) -> ScanReport:
    started = time.monotonic()
    state_path = repo.dir / SCAN_STATE
    state = _load_state(state_path)
    ring = _ring(repo)
    items, problems = _records(repo.chunks, ring)
    total = sum(loc.length for _, _, loc in items)
    limit = math.ceil(total * amount) if kind == "share" else None
    n = len(items)
    start = next((i for i, (key, _, _) in enumerate(items) if key >= (state["pack"], state["offset"])), 0)
    lap = items[start:] + items[:start]  # one pass around the ring, from the cursor
    if limit is not None:  # the fewest records, from the cursor, that make up the share
        taken = 0
        for count, (_, _, loc) in enumerate(lap, 1):
            taken += loc.length
            if taken >= limit:
                lap = lap[:count]
                break
    done = visited = verified = verified_bytes = 0
    for piece in _pieces(lap, 16 << 20):
        with repo.index.read() as txn:  # a delta's base may lie outside this piece: the index says where
            live = [item for item in piece if _indexed(txn, item[1], item[2])]
            by_pack = [(bytes.fromhex(pack), {cid: loc for _, cid, loc in records})
                       for pack, records in itertools.groupby(live, key=lambda item: item[0][0])]
            problems += [ScanProblem(check.pack, p.id.hex(), p.kind, p.detail)
                         for check in repo.chunks.check_packs(by_pack, txn, threads=1) for p in check.problems]
        done += sum(loc.length for _, _, loc in piece)  # the budget counts every record passed
        visited += len(piece)
        verified += len(live)
        verified_bytes += sum(loc.length for _, _, loc in live)
        if progress:
            progress(done, limit or total)
        if (limit is not None and done >= limit) or (limit is None and time.monotonic() - started >= amount):
            break
    wrapped = n > 0 and start + visited >= n
    cursor = items[(start + visited) % n][0] if n else ("", 0)
    state.update(pack=cursor[0], offset=cursor[1], runs=state.get("runs", 0) + 1,
                 passes=state.get("passes", 0) + (1 if wrapped else 0))
    _save_state(state_path, state)
    cover = math.ceil(1 / amount - 1e-9) if kind == "share" else None
    packs = len({key[0] for key, _, _ in lap[:visited]})
    return ScanReport(budget, packs, verified, verified_bytes, total, time.monotonic() - started, wrapped, cover,
                      tuple(problems), (pack_filename(bytes.fromhex(cursor[0])) if cursor[0] else "", cursor[1]),
                      visited - verified, done - verified_bytes)


def _indexed(txn, cid: bytes, loc) -> bool:
    """Whether the chunk index points at the record at ``loc``: only such a record is judged."""
    try:
        here = txn.chunk(cid)
    except CorruptObject:  # the damaged entry may have named this record: judged, not passed over
        return True
    return here is not None and (here.pack, here.offset) == (loc.pack, loc.offset)


def parse_subset(text: str) -> tuple:
    """(n, t) of "N/T" with 1 <= N <= T; BadInput otherwise."""
    n, _, t = str(text).partition("/")
    try:
        n, t = int(n), int(t)
        if not 1 <= n <= t:
            raise ValueError
    except ValueError:
        raise BadInput(f"read subset {text!r} is not N/T with 1 <= N <= T (like 1/10)") from None
    return n, t


def in_subset(pack: bytes, group: tuple) -> bool:
    """Whether a pack (its 16-byte name) is in group N of T: its first byte mod T is N - 1."""
    n, t = group
    return pack[0] % t == n - 1


def raise_for(report: ScanReport) -> None:
    """ScanFoundDamage for a report that found damage."""
    if report.problems:
        first = report.problems[0]
        raise ScanFoundDamage(f"integrity scan found {len(report.problems)} damaged record(s), first in "
                              f"{first.pack}: {first.detail}",
                              problems=tuple((p.pack, p.chunk, p.kind) for p in report.problems))


class Trust:
    """The signature and audit verbs of a repository (``repo.trust``): the
    signing key (``signer``), signature verdicts (``verify_commit``,
    ``verify_tag``), a verified walk of history (``audit``) and one run of
    the rotating integrity scan (``scan``)."""

    def __init__(self, repo):
        self.repo = repo

    def signer(self, sign=True, passphrase=None):
        """The ``mvc.signing.SigningKey`` that ``sign`` names (a key, a key file path, True for
        setting ``signing.key``; None/False: None), loaded once for many commits. SigningKeyError."""
        return signer(self.repo, sign, passphrase)

    def verify_commit(self, rev: str = refnames.HEAD) -> CommitVerification:
        """The signature verdict of the commit ``rev`` names, against ``signing.allowed-signers``."""
        return verify_commit(self.repo, rev)

    def verify_tag(self, name: str) -> TagVerification:
        """The signature verdict of tag ``name`` (unsigned for a plain tag)."""
        return verify_tag(self.repo, name)

    def audit(self, rev: str = refnames.HEAD, objects: bool = False) -> AuditReport:
        """The history from ``rev`` back to its roots, each commit verified; see ``audit``."""
        return audit(self.repo, rev, objects)

    def scan(self, budget="10%", progress=None) -> ScanReport:
        """One run of the rotating integrity scan; see ``scan``."""
        return scan(self.repo, budget, progress)
