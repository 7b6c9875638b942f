"""Ref names and revision syntax.

Refs live in the index under ``heads/NAME`` (branches) and ``tags/NAME``
(tags); ``HEAD`` is symbolic (names a branch) or detached (names a commit).
Names follow Git's check-ref-format rules. A revision is a base (full id,
unique id prefix of at least 4 hex digits, branch, tag or ``HEAD``)
followed by any of ``~N`` (N-th first-parent ancestor), ``^`` / ``^N``
(first / N-th parent).
"""

import re

from .errors import InvalidRefName, UnknownRevision

HEAD = "HEAD"
BRANCHES = "heads/"
TAGS = "tags/"
MIN_PREFIX = 4

_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
_SUFFIX = re.compile(r"(~\d*|\^\d*)")


def check_name(name: str, what: str = "ref") -> str:
    """``name`` if it is a valid branch or tag name; InvalidRefName otherwise."""
    problem = _name_problem(name)
    if problem:
        raise InvalidRefName(f"{what} name {name!r} is not valid: {problem}")
    return name


def is_valid_name(name: str) -> bool:
    return _name_problem(name) == ""


def _name_problem(name: str) -> str:
    if not isinstance(name, str) or not name:
        return "it is empty"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it holds undecodable bytes"
    if name == HEAD or name == "@":
        return f"{name!r} is reserved"
    if _BAD_CHARS.search(name):
        return "it holds a space, a control character or one of ~ ^ : ? * [ \\"
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
    """(base, [(op, n), ...]) where op is '~' or '^'; UnknownRevision if malformed."""
    if not isinstance(rev, str) or not rev:
        raise UnknownRevision("empty revision")
    match = re.match(r"^(.*?)((?:~\d*|\^\d*)*)$", rev)
    base, suffix = match.group(1), match.group(2)
    if not base:
        raise UnknownRevision(f"revision {rev!r} has no base")
    ops = []
    for part in _SUFFIX.findall(suffix):
        digits = part[1:]
        ops.append((part[0], int(digits) if digits else 1))
    return base, ops
