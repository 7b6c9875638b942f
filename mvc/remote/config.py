"""Remote and cache settings, kept in the index's ``meta`` database (``docs/format.md`` 5.6).

- ``remote/NAME``: canonical msgpack ``{"url", "endpoint_url", "conditional"}``;
  ``conditional`` records that the store was once found to honour
  conditional writes (so the probe runs once per remote).
- ``cache.remote``: the remote the local disk caches (its name, UTF-8);
  set, the repository reads chunks it no longer holds from there.
- ``cache.max-bytes``: the budget of local pack bytes (ASCII decimal).
- ``cache.pin/REF``: a ref whose chunks are never evicted (value empty).
"""

import os
import re
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from .. import encoding
from ..errors import (BadInput, CorruptObject, InvalidRemoteName, RemoteExists,  # noqa: F401
                      UnknownRemote)  # (UnknownRemote re-exported)
from .bucket import parse_url

PREFIX = "remote/"
CACHE_REMOTE, CACHE_MAX, PIN = "cache.remote", "cache.max-bytes", "cache.pin/"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?", re.IGNORECASE)
SETTINGS = (CACHE_REMOTE, CACHE_MAX)


@dataclass(frozen=True)
class RemoteInfo:
    name: str
    url: str
    endpoint_url: Optional[str] = None
    conditional: bool = False


def environment_endpoint() -> Optional[str]:
    """The S3 endpoint the AWS environment names (``AWS_ENDPOINT_URL_S3``, else
    ``AWS_ENDPOINT_URL``, as boto3 reads them), or None; None too when
    ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` tells boto3 to ignore them."""
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true":
        return None
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def check_endpoint(endpoint_url: str) -> str:
    """``endpoint_url`` if it is an http(s) URL with a host and a port that can be (BadInput, at
    once, not after a push's retries: ``http://127.0.0.1:45001:99``)."""
    bad = BadInput(f"endpoint URL {endpoint_url!r} is not valid: use http(s)://HOST[:PORT] (like "
                   "http://127.0.0.1:8333)")
    if not isinstance(endpoint_url, str) or not re.match(r"https?://", endpoint_url):
        raise BadInput(f"endpoint URL {endpoint_url!r} must start with http:// or https://")
    try:
        parts = urlsplit(endpoint_url)
        port = parts.port  # ValueError for a port out of range or not a number
    except ValueError:
        raise bad from None
    if not parts.hostname or port == 0 or any(c.isspace() for c in endpoint_url):
        raise bad
    return endpoint_url


# names a new remote may not take: tracking refs are remotes/NAME/BRANCH and revisions name them
# NAME/BRANCH, so a remote named like a ref namespace makes tags/v1 (or heads/x) mean two refs
RESERVED = ("heads", "tags", "remotes", "refs", "HEAD")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.endswith((".", ".lock")):
        raise InvalidRemoteName(f"remote name {name!r} is not valid: use letters, digits, '.', '_' and '-' "
                                "(like 'origin')", name=name, problem="invalid")
    return name


def check_new_name(name: str) -> str:
    """``check_name``, and not a RESERVED name (checked for new remotes only: one added before
    the rule stays usable, so it can be removed)."""
    check_name(name)
    if name in RESERVED:
        raise InvalidRemoteName(f"remote name {name!r} is reserved: {name}/X would also name a ref "
                                f"(reserved: {', '.join(RESERVED)})", name=name, problem="reserved")
    return name


def get(txn, name: str) -> RemoteInfo:
    raw = txn.meta(PREFIX + check_name(name))
    if raw is None:
        raise UnknownRemote(f"no remote named {name!r}", name=name, known=names(txn))
    value = encoding.unpack(raw, f"settings of remote {name!r}")
    if type(value) is not dict or not isinstance(value.get("url"), str):
        raise CorruptObject(f"the settings of remote {name!r} are damaged; remove and add it again")
    return RemoteInfo(name, value["url"], value.get("endpoint_url"), bool(value.get("conditional")))


def put(txn, info: RemoteInfo) -> None:
    txn.put_meta(PREFIX + info.name, encoding.pack({"url": info.url, "endpoint_url": info.endpoint_url,
                                                    "conditional": info.conditional}))


def add(txn, name: str, url: str, endpoint_url: Optional[str]) -> RemoteInfo:
    check_new_name(name)
    kind, where, _ = parse_url(url)
    if kind == "folder":
        url = where  # absolute: a relative path would change meaning with the working directory
    if txn.meta(PREFIX + name) is not None:
        raise RemoteExists(f"remote {name!r} already exists", name=name)
    if endpoint_url is not None:
        check_endpoint(endpoint_url)
    info = RemoteInfo(name, url, endpoint_url)
    put(txn, info)
    return info


def names(txn) -> list:
    return sorted(key.decode()[len(PREFIX):] for key in txn.ids("meta", PREFIX.encode()))


def default(txn, name: Optional[str]) -> str:
    """``name``, or the remote a command means when none is given: origin, or the only one."""
    if name is not None:
        return check_name(name)
    known = names(txn)
    if "origin" in known or len(known) == 1:
        return "origin" if "origin" in known else known[0]
    if not known:
        raise UnknownRemote("no remote is configured")
    raise UnknownRemote(f"several remotes are configured ({', '.join(known)}); name the one to use", known=known)


def remove(txn, name: str) -> None:
    get(txn, name)
    txn.delete("meta", (PREFIX + name).encode())
    if cache_remote(txn) == name:
        txn.delete("meta", CACHE_REMOTE.encode())


def cache_remote(txn) -> Optional[str]:
    raw = txn.meta(CACHE_REMOTE)
    return raw.decode("utf-8", "replace") if raw else None


def cache_max(txn) -> Optional[int]:
    raw = txn.meta(CACHE_MAX)
    return int(raw) if raw and raw.isdigit() else None


def parse_size(text) -> int:
    """'20G', '512MiB', '1000' -> bytes; BadInput otherwise."""
    if isinstance(text, int) and text >= 0:
        return text
    match = _SIZE.fullmatch(str(text).strip())
    if not match:
        raise BadInput(f"{text!r} is not a size: give bytes or a number with K, M, G or T (like 20G)")
    unit = match.group(2).upper()
    return int(float(match.group(1)) * (1024 ** ("KMGT".find(unit) + 1) if unit else 1))


def set_value(txn, key: str, value: Optional[str]) -> Optional[str]:
    """Set (or with None unset) a setting; returns its value as stored."""
    if key not in SETTINGS:
        raise BadInput(f"unknown setting {key!r}; known: {', '.join(SETTINGS)}")
    if value is None:
        txn.delete("meta", key.encode())
        return None
    if key == CACHE_MAX:
        value = str(parse_size(value))
    else:
        get(txn, value)  # the cached remote must exist
    txn.put_meta(key, value.encode())
    return value


def get_value(txn, key: str) -> Optional[str]:
    if key not in SETTINGS:
        raise BadInput(f"unknown setting {key!r}; known: {', '.join(SETTINGS)}")
    raw = txn.meta(key)
    return raw.decode("utf-8", "replace") if raw is not None else None


def pins(txn) -> list:
    return sorted(key.decode()[len(PIN):] for key in txn.ids("meta", PIN.encode()))
