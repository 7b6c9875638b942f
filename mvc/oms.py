"""OpenSSF model signing (OMS v1.0) with a local key: sign a model folder, verify one.

Vocabulary (as the OMS specification and its reference tool, ``model_signing``, say it):

- **signature file**: ``model.sig`` in the model folder, a Sigstore bundle
  (JSON, media type ``application/vnd.dev.sigstore.bundle.v0.3+json``) whose
  ``verificationMaterial.publicKey.hint`` is the SHA-256 of the signing
  key's public key (PEM, SubjectPublicKeyInfo) and whose ``dsseEnvelope``
  holds the payload and one signature.
- **payload**: an in-toto Statement v1 (``application/vnd.in-toto+json``):
  one subject (the folder's name, and the SHA-256 of every resource's digest
  bytes one after the other), predicate type
  ``https://model_signing/signature/v1.0``, and a predicate with
  ``resources`` (every file: its path relative to the folder, with ``/``,
  sorted, and the SHA-256 of its bytes) and ``serialization`` (method
  ``files``, hash ``sha256``, symbolic links not followed, the paths left
  out: the signature file and Git's files). mvc adds ``mvc: {"commit":
  ID}`` to the predicate; OMS v1.0 verifiers ignore fields they do not know.
- **signature**: ECDSA (P-256, P-384 or P-521, the hash of the curve's size)
  over the DSSE pre-authentication encoding of the payload bytes, base64.

The key method works offline: no transparency log, no certificate. A
verifier needs the public key that pairs with the signer's private one.
``cryptography`` is imported only when a key is used, as in mvc.signing.
"""

import base64
import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

from .errors import MissingExtra, ModelSignatureError

SIGNATURE_FILE = "model.sig"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")  # what model_signing leaves out by default
CURVES = {"secp256r1": "SHA256", "secp384r1": "SHA384", "secp521r1": "SHA512"}
PIECE = 8 << 20


@dataclass(frozen=True)
class Signed:
    """A folder signed: ``signature`` the file written, ``files`` how many files it covers."""

    folder: Path
    signature: Path
    files: int
    commit: Optional[str]


@dataclass(frozen=True)
class Verified:
    """A folder whose files match a signature by the given key: ``commit`` is the mvc commit
    its predicate names (None for a folder another tool signed), ``name`` the subject's name."""

    folder: Path
    files: int
    commit: Optional[str]
    name: str


def _need_cryptography() -> None:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise MissingExtra("OpenSSF model signing needs the Python package cryptography", package="cryptography",
                           extra="sign") from None


def pae(payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding: what the signature covers."""
    return b"DSSEv1 %d %s %d %s" % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload), payload)


def file_digest(path: Path, folder=None, rel=None) -> str:
    """SHA-256 hex of the regular file at ``path``. Opened without waiting (a FIFO would wait
    for a writer forever) and without following a link, then checked to be a regular file, so
    a FIFO, socket or device put in a model folder is refused (ModelSignatureError "not-a-file",
    as the reference tool refuses it) rather than hung on or read without end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if not os.path.exists(path) or os.path.isfile(path):
            raise
        fd = None
    if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd is not None:
            os.close(fd)
        raise ModelSignatureError(f"{path} is not a regular file (a FIFO, socket or device); OMS signs files "
                                  "only: remove it", folder=None if folder is None else Path(folder),
                                  problem="not-a-file", file=rel)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        while True:
            block = f.read(PIECE)
            if not block:
                return h.hexdigest()
            h.update(block)


def digests(folder: Path, ignore) -> dict:
    """{relative path: SHA-256 hex} of every file under ``folder`` but those under an ``ignore``
    path. ModelSignatureError "symlink" for a symbolic link (the files method does not follow them),
    "not-a-file" for a FIFO, socket or device."""
    ignore = {PurePosixPath(p) for p in ignore}
    out = {}
    for here, dirs, names in os.walk(folder):
        rel = PurePosixPath(Path(here).relative_to(folder).as_posix())
        dirs[:] = sorted(d for d in dirs if not _ignored(rel / d, ignore) and not _link(folder, rel / d))
        for name in sorted(names):
            path = rel / name
            if _ignored(path, ignore):
                continue
            _link(folder, path)
            out[str(path)] = file_digest(Path(folder) / path, folder, str(path))
    return out


def _link(folder, rel: PurePosixPath) -> bool:
    """False for what is not a symbolic link; ModelSignatureError "symlink" for one."""
    if os.path.islink(os.path.join(folder, rel)):
        raise ModelSignatureError(f"{Path(folder) / rel} is a symbolic link; OMS signing of files does not follow "
                                  "links: replace it with the file", folder=Path(folder), problem="symlink",
                                  file=str(rel))
    return False


def _ignored(path: PurePosixPath, ignore: set) -> bool:
    return any(path == p or p in path.parents for p in ignore)


def statement(name: str, files: dict, ignore, commit: Optional[str]) -> dict:
    """The in-toto statement for {relative path: SHA-256 hex}, resources sorted as the reference tool sorts them."""
    order = sorted(files, key=PurePosixPath)
    root = hashlib.sha256(b"".join(bytes.fromhex(files[p]) for p in order)).hexdigest()
    predicate = {
        "resources": [{"algorithm": "sha256", "name": p, "digest": files[p]} for p in order],
        "serialization": {"allow_symlinks": False, "ignore_paths": list(ignore), "hash_type": "sha256",
                          "method": "files"},
    }
    if commit is not None:
        predicate["mvc"] = {"commit": commit}
    return {"_type": STATEMENT_TYPE, "subject": [{"name": name, "digest": {"sha256": root}}],
            "predicateType": PREDICATE_TYPE, "predicate": predicate}


def sign_folder(folder, private_key, commit: Optional[str] = None, password: Optional[bytes] = None,
                signature=None) -> Signed:
    """Sign every file of ``folder`` with the EC private key (PEM) at ``private_key``; writes
    ``signature`` (default ``folder/model.sig``; elsewhere for a folder that cannot be written,
    a mount), replacing one that is there. ModelSignatureError "bad-key" for a key it cannot
    use, "symlink" for a link in the folder."""
    _need_cryptography()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    folder = Path(folder)
    key = _private_key(private_key, password, folder)
    ignore = [SIGNATURE_FILE, *GIT_PATHS]
    files = digests(folder, ignore)
    payload = json.dumps(statement(Path(os.path.abspath(folder)).name, files, ignore, commit), indent=2).encode()
    sig = key.sign(pae(payload), ec.ECDSA(getattr(hashes, CURVES[key.curve.name])()))
    bundle = {"mediaType": BUNDLE_MEDIA_TYPE,
              "verificationMaterial": {"publicKey": {"hint": key_hint(key.public_key())}, "tlogEntries": []},
              "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE,
                               "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]}}
    target = Path(signature) if signature is not None else folder / SIGNATURE_FILE
    staging = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        f = open(staging, "w", encoding="utf-8")
    except OSError as exc:
        if exc.errno != errno.EROFS:
            raise
        raise ModelSignatureError(f"cannot write the signature {target}: the folder is read-only (a mount's "
                                  "folders are); write the signature elsewhere", folder=folder,
                                  problem="read-only") from None
    with f:
        json.dump(bundle, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staging, target)
    return Signed(folder, target, len(files), commit)


def key_hint(public_key) -> str:
    from cryptography.hazmat.primitives import serialization
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def check_private_key(path, password: Optional[bytes] = None) -> None:
    """ModelSignatureError "bad-key" unless ``path`` holds a private key sign_folder can use."""
    _need_cryptography()
    _private_key(path, password, None)


def _private_key(path, password, folder):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelSignatureError(f"cannot read the private key {path}: {exc}; OMS key signing takes a PEM "
                                  "EC private key (openssl ecparam -name prime256v1 -genkey -noout -out key.pem)",
                                  folder=folder, problem="bad-key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in CURVES:
        raise ModelSignatureError(f"the key {path} is not an EC key on P-256, P-384 or P-521, which OMS key "
                                  "signing uses", folder=folder, problem="bad-key")
    return key


def _public_key(path, folder):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise ModelSignatureError(f"cannot read the public key {path}: {exc}", folder=folder,
                                  problem="bad-key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in CURVES:
        raise ModelSignatureError(f"the key {path} is not an EC public key on P-256, P-384 or P-521",
                                  folder=folder, problem="bad-key")
    return key


def verify_folder(folder, public_key, signature=None) -> Verified:
    """Check ``folder`` against its signature file (``signature``, default ``folder/model.sig``) and
    the EC public key (PEM) at ``public_key``: the key signed it, and the folder's files are
    exactly the signed ones, byte for byte. Raises ModelSignatureError saying which check failed."""
    _need_cryptography()
    folder = Path(folder)
    key = _public_key(public_key, folder)
    sig_path = Path(signature) if signature is not None else folder / SIGNATURE_FILE
    try:
        bundle = json.loads(sig_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelSignatureError(f"{sig_path} is not there: the folder is not signed", folder=folder,
                                  problem="no-signature") from None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
        raise _malformed(folder, f"{sig_path} is not a JSON bundle ({exc})") from None
    payload, sig = _envelope(bundle, folder)
    hint = _get(bundle, "verificationMaterial", "publicKey", "hint")
    if hint is not None and not isinstance(hint, str):  # the unsigned part: anyone may have written it
        raise _malformed(folder, "the public key hint is not text")
    if hint and hint != key_hint(key):
        raise ModelSignatureError(f"{sig_path} was signed with another key (its key hint is {hint[:16]}...)",
                                  folder=folder, problem="bad-signature")
    _check_signature(key, payload, sig, folder)
    body = _statement(payload, folder)
    expected = {r["name"]: r["digest"] for r in body["predicate"]["resources"]}
    ignore = body["predicate"]["serialization"].get("ignore_paths", [])
    if sig_path.parent.resolve() == folder.resolve():
        ignore = [*ignore, sig_path.name]
    actual = digests(folder, ignore)
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            raise ModelSignatureError(f"{name} was signed but is not in {folder}", folder=folder,
                                      problem="missing-file", file=name)
        if name not in expected:
            raise ModelSignatureError(f"{name} is in {folder} but was not signed", folder=folder,
                                      problem="extra-file", file=name)
        if actual[name] != expected[name]:
            raise ModelSignatureError(f"{name} differs from the signed file (SHA-256 {actual[name][:16]}..., "
                                      f"signed {expected[name][:16]}...)", folder=folder,
                                      problem="digest-mismatch", file=name)
    mvc = body["predicate"].get("mvc")
    commit = mvc.get("commit") if isinstance(mvc, dict) and isinstance(mvc.get("commit"), str) else None
    return Verified(folder, len(actual), commit, body["subject"][0].get("name", ""))


def _get(value, *keys):
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    return value


def _malformed(folder, why: str) -> ModelSignatureError:
    return ModelSignatureError(f"the model signature is malformed: {why}", folder=folder, problem="malformed")


def _envelope(bundle, folder) -> tuple:
    """(payload bytes, signature bytes) of a bundle mvc can check."""
    if _get(bundle, "mediaType") != BUNDLE_MEDIA_TYPE:
        raise _malformed(folder, f"media type {_get(bundle, 'mediaType')!r}, not {BUNDLE_MEDIA_TYPE}")
    env = _get(bundle, "dsseEnvelope")
    sigs = _get(env, "signatures")
    if _get(env, "payloadType") != PAYLOAD_TYPE or not isinstance(sigs, list) or len(sigs) != 1:
        raise _malformed(folder, "no DSSE envelope with an in-toto payload and one signature (a keyless "
                                 "Sigstore or certificate signature is not checked by a key)")
    try:
        return (base64.b64decode(env["payload"], validate=True),
                base64.b64decode(sigs[0]["sig"], validate=True))
    except (KeyError, TypeError, ValueError):
        raise _malformed(folder, "the payload or signature is not base64") from None


def _check_signature(key, payload: bytes, sig: bytes, folder) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    try:
        key.verify(sig, pae(payload), ec.ECDSA(getattr(hashes, CURVES[key.curve.name])()))
    except InvalidSignature:
        raise ModelSignatureError("the signature does not match the key and the signed statement (it was made "
                                  "with another key, or the signature file was changed)", folder=folder,
                                  problem="bad-signature") from None


def _statement(payload: bytes, folder) -> dict:
    """The signed statement, checked to be an OMS v1.0 one whose subject digest matches its resources."""
    try:
        body = json.loads(payload)
        resources = body["predicate"]["resources"]
        ignore = body["predicate"]["serialization"].get("ignore_paths", [])
        if not (isinstance(ignore, list) and all(isinstance(p, str) for p in ignore)):
            raise TypeError("ignore_paths is not a list of paths")
        ok = (body["_type"] == STATEMENT_TYPE and body["predicateType"] == PREDICATE_TYPE
              and len(body["subject"]) == 1 and body["predicate"]["serialization"]["method"] == "files"
              and body["predicate"]["serialization"].get("hash_type") == "sha256"
              and all(r["algorithm"] == "sha256" and isinstance(r["name"], str) for r in resources))
        root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
        claimed = body["subject"][0]["digest"]["sha256"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):  # any JSON shape
        raise _malformed(folder, "the payload is not an OMS v1.0 statement") from None
    if not ok:
        raise _malformed(folder, "the statement is not an OMS v1.0 signature of files with SHA-256 (mvc checks "
                                 "that method)")
    if root != claimed:
        raise _malformed(folder, "the statement's subject digest does not match its resources")
    return body
