"""SSH signatures over mvc objects, as Git's ``gpg.format=ssh`` makes them.

Vocabulary:

- **SSHSIG**: the signature format of ``ssh-keygen -Y sign`` (OpenSSH's
  PROTOCOL.sshsig): magic ``SSHSIG``, version 1, the signer's public key,
  a **namespace**, the hash algorithm (``sha512``) and the signature over
  ``SSHSIG · namespace · reserved · hash alg · SHA-512(message)``. mvc
  stores the binary blob; ``armor`` gives the text form ``ssh-keygen``
  reads, so any signature can be checked without mvc.
- **payload**: what is signed: a commit's or tag's canonical bytes without
  its ``signature`` field (``docs/format.md`` 7.3.1, 7.4).
- **allowed signers**: a file in the format of ``ssh-keygen``'s ALLOWED
  SIGNERS section (Git's ``gpg.ssh.allowedSignersFile``): principals,
  options (``namespaces=``, ``valid-after=``, ``valid-before=``), a public
  key. Its path is the repository setting ``signing.allowed-signers``.
- **verdict**: ``good`` (the signature verifies and its key is an allowed
  signer for the namespace at the object's time), ``unknown`` (it verifies,
  but the key is not allowed), ``bad`` (it does not verify, or the bytes
  are damaged), ``unsigned``.
- **policy**: refs that require good signatures (``signing.require``, a
  comma-separated list of ref-name globs: ``main``, ``release/*``,
  ``tags/*``); what fetch does with history that fails it
  (``signing.fetch``: ``refuse``, ``flag`` or ``off``).

Keys are Ed25519 (``ssh-keygen -t ed25519``), loaded from OpenSSH private
key files (no ssh-agent needed). This is the only module that imports
``cryptography``, and only when a key is used.
"""

import base64
import binascii
import calendar
import fnmatch
import hashlib
import math
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .errors import BadAllowedSigners, BadInput, SigningKeyError

NAMESPACE = "mvc"  # one namespace for commits and tags: their payloads say which they are ("type")
MAGIC = b"SSHSIG"
VERSION = 1
HASH = "sha512"
ED25519 = "ssh-ed25519"
ARMOR_BEGIN, ARMOR_END = "-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----"

GOOD, BAD, UNKNOWN, UNSIGNED = "good", "bad", "unknown", "unsigned"

# Repository settings (index ``meta``; docs/format.md 5.6).
KEY, ALLOWED, REQUIRE, FETCH = "signing.key", "signing.allowed-signers", "signing.require", "signing.fetch"
SETTINGS = (KEY, ALLOWED, REQUIRE, FETCH)
FETCH_MODES = ("refuse", "flag", "off")
TAG_PREFIX = "tag/"  # meta key of a signed tag's object: tag/<name>


# -- SSH wire encoding ----------------------------------------------------------

def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


class _Reader:
    """Reads SSH wire strings; ValueError on anything short or malformed."""

    def __init__(self, data: bytes):
        self.data, self.at = bytes(data), 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def u32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def string(self) -> bytes:
        return self.take(self.u32())

    def done(self) -> bool:
        return self.at == len(self.data)


def public_blob(raw_public: bytes) -> bytes:
    """The SSH wire form of an Ed25519 public key (what ``.pub`` files hold in base64)."""
    return _string(ED25519.encode()) + _string(raw_public)


def fingerprint(blob: bytes) -> str:
    """``SHA256:…`` as ``ssh-keygen -l`` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _key_of(blob: bytes) -> tuple:
    """(key type, raw key bytes) of a public key blob; ValueError if malformed."""
    r = _Reader(blob)
    kind = r.string().decode("ascii", "replace")
    raw = r.string()
    return kind, raw


# -- keys and signing -----------------------------------------------------------

@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key to sign with, and where it came from."""

    private: object  # cryptography's Ed25519PrivateKey
    public: bytes  # its SSH public key blob
    path: str = ""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)

    def public_line(self, comment: str = "") -> str:
        """The key as a ``.pub`` / allowed-signers line (``ssh-ed25519 AAAA… comment``)."""
        return f"{ED25519} {base64.b64encode(self.public).decode()}{' ' + comment if comment else ''}"


def key_from_seed(seed: bytes) -> SigningKey:
    """The Ed25519 key with this 32-byte seed (tests and fixed examples)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    private = Ed25519PrivateKey.from_private_bytes(seed)
    return _signing_key(private, "")


def _signing_key(private, path: str) -> SigningKey:
    from cryptography.hazmat.primitives import serialization
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey(private, public_blob(raw), path)


def load_key(path, passphrase: Optional[bytes] = None) -> SigningKey:
    """An Ed25519 key from an OpenSSH private key file (``ssh-keygen -t ed25519``).

    Raises SigningKeyError (``.path``, ``.needs_passphrase``) if the file
    cannot be read, is encrypted and no (or a wrong) passphrase was given,
    or holds another kind of key.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    path = str(Path(path).expanduser())
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"cannot read signing key {path}: {exc.strerror}", path=path) from None
    if isinstance(passphrase, str):
        passphrase = passphrase.encode()
    from cryptography.exceptions import UnsupportedAlgorithm
    try:
        private = serialization.load_ssh_private_key(data, password=passphrase)
    except UnsupportedAlgorithm as exc:  # an encrypted key needs bcrypt (pip install 'mvc-checkpoints[sign]')
        raise SigningKeyError(f"signing key {path} cannot be decrypted here ({exc}): "
                              "pip install 'mvc-checkpoints[sign]'", path=path) from None
    except TypeError:  # encrypted and no passphrase given (or one given for a plain key)
        if passphrase is None:
            raise SigningKeyError(f"signing key {path} is encrypted: give its passphrase",
                                  path=path, needs_passphrase=True) from None
        return load_key(path, None)
    except (ValueError, binascii.Error) as exc:
        # a wrong passphrase decrypts to garbage: OpenSSH's check ints differ ("broken checksum")
        wrong = passphrase is not None and any(w in str(exc).lower() for w in ("password", "checksum"))
        raise SigningKeyError(f"signing key {path} {'cannot be decrypted (wrong passphrase?)' if wrong else 'is not an OpenSSH private key'}",
                              path=path, needs_passphrase=wrong) from None
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyError(f"signing key {path} is not an Ed25519 key; make one with 'ssh-keygen -t ed25519'",
                              path=path)
    return _signing_key(private, path)


def _signed_data(message: bytes, namespace: str) -> bytes:
    return (MAGIC + _string(namespace.encode()) + _string(b"") + _string(HASH.encode())
            + _string(hashlib.sha512(message).digest()))


def sign(key: SigningKey, message: bytes, namespace: str = NAMESPACE) -> bytes:
    """The binary SSHSIG blob of ``key`` over ``message``. Ed25519 is deterministic:
    the same key, message and namespace give the same bytes."""
    raw = key.private.sign(_signed_data(message, namespace))
    return (MAGIC + struct.pack(">I", VERSION) + _string(key.public) + _string(namespace.encode())
            + _string(b"") + _string(HASH.encode()) + _string(_string(ED25519.encode()) + _string(raw)))


def armor(blob: bytes) -> str:
    """The text form ``ssh-keygen -Y verify -s FILE`` reads."""
    text = base64.b64encode(blob).decode()
    lines = [text[i:i + 70] for i in range(0, len(text), 70)]
    return "\n".join([ARMOR_BEGIN, *lines, ARMOR_END]) + "\n"


def dearmor(text: str) -> bytes:
    """The blob of an armored signature; BadInput if it is not one."""
    body = text.strip()
    if not (body.startswith(ARMOR_BEGIN) and body.endswith(ARMOR_END)):
        raise BadInput("not an armored SSH signature (-----BEGIN SSH SIGNATURE-----)")
    try:
        return base64.b64decode("".join(body[len(ARMOR_BEGIN):-len(ARMOR_END)].split()), validate=True)
    except binascii.Error:
        raise BadInput("the armored SSH signature is not valid base64") from None


@dataclass(frozen=True)
class Parsed:
    public: bytes  # the signer's public key blob
    namespace: str
    hash: str
    signature: bytes  # SSH signature blob: string key type · string raw signature


def parse(blob: bytes) -> Parsed:
    """The fields of an SSHSIG blob; ValueError if it is not one."""
    r = _Reader(blob)
    if r.take(len(MAGIC)) != MAGIC or r.u32() != VERSION:
        raise ValueError("not an SSHSIG version 1 signature")
    public, namespace, _, alg, signature = r.string(), r.string(), r.string(), r.string(), r.string()
    if not r.done():
        raise ValueError("trailing bytes after the signature")
    return Parsed(public, namespace.decode("utf-8", "replace"), alg.decode("ascii", "replace"), signature)


def check(blob: bytes, message: bytes, namespace: str = NAMESPACE) -> tuple:
    """(True, parsed) if ``blob`` is a valid signature of ``message`` in
    ``namespace`` by the key it names; (False, why) otherwise. Says nothing
    about whether that key is trusted (see ``verify``)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    try:
        p = parse(blob)
        kind, raw = _key_of(p.public)
        sr = _Reader(p.signature)
        sig_kind, sig = sr.string().decode("ascii", "replace"), sr.string()
    except ValueError as exc:
        return False, f"the signature is malformed ({exc})"
    if p.namespace != namespace:
        return False, f"the signature is for namespace {p.namespace!r}, not {namespace!r}"
    if kind != ED25519 or sig_kind != ED25519 or len(raw) != 32:
        return False, f"key type {kind!r} is not supported (mvc verifies {ED25519})"
    if _small_order(raw):
        return False, "the key is a weak (small-order or non-canonical) Ed25519 point that 'verifies' anything"
    if p.hash not in ("sha512", "sha256"):
        return False, f"hash algorithm {p.hash!r} is not supported"
    digest = (hashlib.sha512 if p.hash == "sha512" else hashlib.sha256)(message).digest()
    data = MAGIC + _string(namespace.encode()) + _string(b"") + _string(p.hash.encode()) + _string(digest)
    try:
        Ed25519PublicKey.from_public_bytes(raw).verify(sig, data)
    except InvalidSignature:
        return False, "the signature does not match the signed bytes"
    return True, p


_P = 2**255 - 19
_D = -121665 * pow(121666, _P - 2, _P) % _P


def _add(a: tuple, b: tuple) -> tuple:
    """Affine addition on edwards25519 (-x^2 + y^2 = 1 + d x^2 y^2); complete, so no special cases."""
    (x1, y1), (x2, y2) = a, b
    t = _D * x1 * x2 * y1 * y2 % _P
    return ((x1 * y2 + y1 * x2) * pow(1 + t, _P - 2, _P) % _P, (y1 * y2 + x1 * x2) * pow(1 - t, _P - 2, _P) % _P)


def _small_order(raw: bytes) -> bool:
    """Whether a 32-byte Ed25519 public key is non-canonical, not a point, or of order
    dividing 8. OpenSSL accepts such keys, and for them a fixed signature verifies any
    message (the all-zero key and signature, for one), so a forger could make a
    'valid' signature by an unknown key over anything. ssh-keygen never makes them."""
    y = int.from_bytes(raw, "little") & (2**255 - 1)
    if y >= _P:
        return True
    u, v = (y * y - 1) % _P, (_D * y * y + 1) % _P
    x = u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P) % _P
    if v * x * x % _P == (-u) % _P:
        x = x * pow(2, (_P - 1) // 4, _P) % _P
    if v * x * x % _P != u:
        return True  # no such point
    if x == 0 and raw[31] >> 7:
        return True  # -0: non-canonical
    if (x & 1) != raw[31] >> 7:
        x = _P - x
    point = (x, y)
    for _ in range(3):
        point = _add(point, point)
    return point == (0, 1)


# -- allowed signers ------------------------------------------------------------
#
# Read as OpenSSH reads them (sshsig.c, misc.c, match.c of OpenSSH 9), so that a line
# allows here exactly what it allows to ``ssh-keygen -Y verify``, and where in doubt
# nothing: a line ssh-keygen cannot read (an unknown or misspelt option, a bad time, a
# missing quote) is an error naming it, never a line read some other way.

_SPACE = " \t\r\n"
# The key type names ssh-keygen reads on a line, by the family of the key a blob must hold.
_FAMILIES = {
    "ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ssh-dss": "dsa", "ecdsa-sha2-nistp256": "ecdsa",
    "ecdsa-sha2-nistp384": "ecdsa", "ecdsa-sha2-nistp521": "ecdsa", "sk-ssh-ed25519@openssh.com": "ed25519-sk",
    "sk-ecdsa-sha2-nistp256@openssh.com": "ecdsa-sk", "ssh-ed25519-cert-v01@openssh.com": "ed25519-cert",
    "ssh-rsa-cert-v01@openssh.com": "rsa-cert", "ssh-dss-cert-v01@openssh.com": "dsa-cert",
    "ecdsa-sha2-nistp256-cert-v01@openssh.com": "ecdsa-cert", "ecdsa-sha2-nistp384-cert-v01@openssh.com": "ecdsa-cert",
    "ecdsa-sha2-nistp521-cert-v01@openssh.com": "ecdsa-cert",
    "sk-ssh-ed25519-cert-v01@openssh.com": "ed25519-sk-cert", "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com": "ecdsa-sk-cert"}


def match_pattern(text: str, pattern: str) -> bool:
    """OpenSSH's match_pattern: ``*`` any run, ``?`` any one character, nothing else special
    (no ``[...]`` classes, unlike fnmatch)."""
    return re.fullmatch("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern),
                        text, re.DOTALL) is not None


def match_pattern_list(text: str, patterns: str) -> bool:
    """OpenSSH's match_pattern_list: comma-separated patterns, ``!`` negates one; ``text``
    matches if some positive pattern matches it and no negated one does (a negated match
    fails the whole list, wherever it stands)."""
    positive = False
    for sub in patterns.split(","):
        negated = sub.startswith("!")
        sub = sub[1:] if negated else sub
        if len(sub) >= 1023:  # OpenSSH's buffer: a longer pattern fails the list
            return False
        if match_pattern(text, sub):
            if negated:
                return False
            positive = True
    return positive


def _has_positive(patterns: str) -> bool:
    """Whether any principal could match ``patterns`` (a list of negations alone matches none)."""
    return any(p and not p.startswith("!") for p in patterns.split(","))


@dataclass(frozen=True)
class AllowedSigner:
    principals: tuple  # patterns, as given (comma-separated in the file)
    key: bytes  # public key blob
    namespaces: Optional[str] = None  # OpenSSH pattern list (``!`` negates); None: any
    valid_after: Optional[int] = None  # seconds since the epoch
    valid_before: Optional[int] = None
    line: int = 0

    def allows(self, blob: bytes, namespace: str, when: Optional[float]) -> bool:
        if blob != self.key or not _has_positive(",".join(self.principals)):
            return False
        if self.namespaces is not None and not match_pattern_list(namespace, self.namespaces):
            return False
        if when is None:
            return True
        when = math.floor(when)  # ssh-keygen compares whole seconds
        if self.valid_after is not None and when < self.valid_after:
            return False
        return not (self.valid_before is not None and when > self.valid_before)


class _LineError(Exception):
    """Why one line cannot be read (ssh-keygen's words where it has them)."""


def _time(text: str) -> int:
    """ssh-keygen's YYYYMMDD[HHMM[SS]] with a ``Z`` or ``UTC`` suffix (UTC) or none (local
    time), with the ranges of C's strptime (a day past the month's end rolls over, as there)."""
    digits, utc = text, False
    for suffix in ("z", "utc"):
        if len(text) > len(suffix) and text.lower().endswith(suffix):
            digits, utc = text[:-len(suffix)], True
            break
    if len(digits) not in (8, 12, 14) or not (digits.isascii() and digits.isdigit()):
        raise _LineError(f"{text!r} is not a time (YYYYMMDD[HHMM[SS]][Z])")
    fields = [int(digits[i:i + n]) for i, n in ((0, 4), (4, 2), (6, 2), (8, 2), (10, 2), (12, 2)) if i < len(digits)]
    fields += [0] * (6 - len(fields))
    _, month, day, hour, minute, second = fields
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 61):
        raise _LineError(f"{text!r} is not a time (YYYYMMDD[HHMM[SS]][Z])")
    try:
        seconds = int(calendar.timegm((*fields, 0, 0, 0)) if utc else time.mktime((*fields, 0, 0, -1)))
    except (OverflowError, ValueError):
        raise _LineError(f"{text!r} is not a time (YYYYMMDD[HHMM[SS]][Z])") from None
    if seconds < 0:
        raise _LineError(f"{text!r} is before 1970")
    return seconds


def _token(text: str) -> tuple:
    """OpenSSH's strdelimw: (the first word, the rest after the spaces that follow it, or None
    at the end of the line). A double quote starts a quoted run the word takes whole; the word
    ends at its closing quote."""
    at = next((i for i, c in enumerate(text) if c in _SPACE or c == '"'), None)
    if at is None:
        return text, None
    if text[at] == '"':
        end = text.find('"', at + 1)
        if end < 0:
            raise _LineError("a quote is not closed")
        return text[:at] + text[at + 1:end], text[end + 1:].lstrip(_SPACE)
    return text[:at], text[at + 1:].lstrip(_SPACE)


def _read_key(text: str) -> Optional[tuple]:
    """(key type, blob) of ``KEYTYPE BASE64 [COMMENT]`` as sshkey_read reads it; None if it is not one."""
    end = next((i for i, c in enumerate(text) if c in " \t"), None)
    if end is None:
        return None
    name, rest = text[:end], text[end:].lstrip(" \t")
    family = _FAMILIES.get(name)  # (short names such as ED25519 are no key type to ssh-keygen 9 here)
    if family is None or not rest:
        return None
    encoded = rest[:next((i for i, c in enumerate(rest) if c in " \t"), len(rest))]
    try:
        blob = base64.b64decode("".join(encoded.split()), validate=True)
        r = _Reader(blob)
        kind = r.string().decode("ascii")
        if _FAMILIES.get(kind) != family:
            return None
        if kind == ED25519 and (len(r.string()) != 32 or not r.done()):
            return None
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    return kind, blob


def _skip_options(text: str) -> tuple:
    """(options text, the rest) as sshkey_advance_past_options splits them: the options end at
    the first space or tab outside double quotes (``\\"`` inside quotes is a quote)."""
    quoted, i = False, 0
    while i < len(text) and (quoted or text[i] not in " \t"):
        if text[i] == "\\" and text[i + 1:i + 2] == '"':
            i += 1
        elif text[i] == '"':
            quoted = not quoted
        i += 1
    if quoted and i >= len(text):
        raise _LineError("invalid options: a quote is not closed")
    return text[:i], text[i:]


def _dequote(text: str, at: int) -> tuple:
    """OpenSSH's opt_dequote: (the value of ``"..."`` at ``at``, where it ends)."""
    if text[at:at + 1] != '"':
        raise _LineError("bad options: missing start quote")
    out, i = [], at + 1
    while i < len(text) and text[i] != '"':
        if text[i] == "\\" and text[i + 1:i + 2] == '"':
            i += 1
        out.append(text[i])
        i += 1
    if i >= len(text):
        raise _LineError("bad options: missing end quote")
    return "".join(out), i + 1


def _options(text: str) -> dict:
    """OpenSSH's sshsigopt_parse: ``cert-authority``, ``namespaces="..."``,
    ``valid-after="..."``, ``valid-before="..."`` (names in any case), comma-separated;
    anything else is an unknown option, and the line allows nothing."""
    out, at = {}, 0
    while at < len(text):
        name = next((n for n in ("cert-authority", "namespaces=", "valid-after=", "valid-before=")
                     if text[at:at + len(n)].lower() == n), None)
        if name is None:  # (only a comma may follow: ",," passes, as in OpenSSH)
            pass
        elif name == "cert-authority":
            at += len(name)
            out["cert-authority"] = True
        else:
            at += len(name)
            key = name[:-1]
            if key in out:
                raise _LineError(f'bad options: multiple "{key}" clauses')
            value, at = _dequote(text, at)
            out[key] = value if key == "namespaces" else _time(value)
            if out[key] == 0:  # OpenSSH keeps 0 for "not set", and refuses it as a time
                raise _LineError(f'bad options: invalid "{key}" time')
        if at == len(text):
            break
        if text[at] != ",":
            raise _LineError(f"bad options: unknown key option at {text[at:]!r}")
        at += 1
        if at == len(text):
            raise _LineError("bad options: unexpected end-of-options")
    after, before = out.get("valid-after"), out.get("valid-before")
    if after and before and before <= after:
        raise _LineError('bad options: "valid-before" time is before "valid-after"')
    return out


def _parse_line(line: str, number: int) -> Optional[AllowedSigner]:
    """One line's AllowedSigner; None for a blank or comment line, or one that allows nothing
    here (``cert-authority``, a key type mvc does not verify); _LineError if unreadable."""
    cp = line.lstrip(_SPACE)
    if not cp or cp.startswith("#"):
        return None
    principals, cp = _token(cp)
    if cp is None:
        raise _LineError("invalid line: expected PRINCIPALS [OPTIONS] KEYTYPE BASE64")
    key = _read_key(cp)
    options = {}
    if key is None:  # not a key: options, then the key
        opts, cp = _skip_options(cp)
        if not cp:
            raise _LineError("missing key")
        key = _read_key(cp.lstrip(" \t"))
        if key is None:
            raise _LineError("invalid key")
        options = _options(opts)
    kind, blob = key
    if options.get("cert-authority") or kind != ED25519:
        return None
    return AllowedSigner(tuple(principals.split(",")), blob, options.get("namespaces"),
                         options.get("valid-after"), options.get("valid-before"), number)


def parse_allowed_signers(text: str, path: str = "allowed signers") -> list:
    """AllowedSigners of an allowed-signers file's text, read as ``ssh-keygen`` reads it:
    ``PRINCIPALS [OPTIONS] KEYTYPE BASE64 [COMMENT]``, principals a comma-separated
    pattern list (a double-quoted run may hold spaces), options ``cert-authority``,
    ``namespaces="LIST"``, ``valid-after="TIME"``, ``valid-before="TIME"``.
    BadAllowedSigners (``path``, ``line``) for a line ``ssh-keygen`` cannot read (an
    unknown or misspelt option among them): fail closed and say so, where ssh-keygen
    passes over the line. Lines with ``cert-authority`` or a key type mvc cannot verify
    are kept out (they allow nothing here)."""
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        try:
            signer = _parse_line(line, number)
        except _LineError as exc:
            raise BadAllowedSigners(f"{path}:{number}: {exc}", path=path, line=number) from None
        if signer is not None:
            out.append(signer)
    return out


def read_allowed_signers(path) -> list:
    """The AllowedSigners of the file at ``path``; BadAllowedSigners if it is unreadable or malformed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadAllowedSigners(f"cannot read the allowed signers file {path}: "
                                f"{getattr(exc, 'strerror', None) or exc}", path=str(path), line=0) from None
    return parse_allowed_signers(text, str(path))


# -- verdicts -------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """Whether an object's signature holds, and whose it is."""

    status: str  # good, bad, unknown, unsigned
    principal: Optional[str] = None  # the allowed signer's principals (comma-joined) for good
    key: Optional[str] = None  # SHA256 fingerprint of the signing key, when the signature names one
    reason: str = ""  # for bad / unknown: why

    @property
    def good(self) -> bool:
        return self.status == GOOD


def verify(blob: bytes, payload: bytes, allowed: Optional[list], when: Optional[float] = None,
           namespace: str = NAMESPACE) -> Verdict:
    """The Verdict on signature ``blob`` over ``payload``, made at ``when``
    (seconds since the epoch; None: ignore validity periods), against
    ``allowed`` (AllowedSigners; None when no file is configured)."""
    if not blob:
        return Verdict(UNSIGNED)
    ok, found = check(blob, payload, namespace)
    if not ok:
        key = None
        try:
            key = fingerprint(parse(blob).public)
        except ValueError:
            pass
        return Verdict(BAD, key=key, reason=found)
    key = fingerprint(found.public)
    if allowed is None:
        return Verdict(UNKNOWN, key=key, reason="no allowed signers file is configured (signing.allowed-signers)")
    for signer in allowed:
        if signer.allows(found.public, namespace, when):
            return Verdict(GOOD, ",".join(signer.principals), key)
    return Verdict(UNKNOWN, key=key, reason="the key is not an allowed signer"
                   + (f" for namespace {namespace!r} at the time it signed"
                      if any(s.key == found.public for s in allowed) else ""))


# -- settings and policy --------------------------------------------------------

def get_setting(txn, key: str) -> Optional[str]:
    _check_setting(key)
    raw = txn.meta(key)
    return raw.decode("utf-8", "replace") if raw is not None else None


def set_setting(txn, key: str, value: Optional[str]) -> Optional[str]:
    """Set (None: unset) a ``signing.*`` setting; returns it as stored. Paths are kept as given
    (absolute, or relative to the work directory)."""
    _check_setting(key)
    if value is None:
        txn.delete("meta", key.encode())
        return None
    if key == FETCH and value not in FETCH_MODES:
        raise BadInput(f"signing.fetch must be one of {', '.join(FETCH_MODES)}, not {value!r}")
    if key == REQUIRE:
        value = ",".join(p.strip() for p in value.split(",") if p.strip())
    txn.put_meta(key, value.encode())
    return value


def _check_setting(key: str) -> None:
    if key not in SETTINGS:
        raise BadInput(f"unknown setting {key!r}; known: {', '.join(SETTINGS)}")


def resolve_path(root: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path(root) / path


def required(patterns: Optional[str], ref: str) -> bool:
    """Whether full ref name ``ref`` (``heads/x``, ``tags/x``) matches a ``signing.require``
    pattern; a pattern without ``heads/`` or ``tags/`` names branches."""
    for pattern in (patterns or "").split(","):
        pattern = pattern.strip()
        if not pattern:
            continue
        full = pattern if pattern.startswith(("heads/", "tags/")) else "heads/" + pattern
        if fnmatch.fnmatchcase(ref, full):
            return True
    return False
