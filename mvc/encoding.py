"""Canonical msgpack, the encoding of every object mvc stores.

Canonical means one value has exactly one encoding, so ids (hashes of the
bytes) do not depend on how the value was built:

- maps are written with their keys sorted: integer keys first in ascending
  order, then string keys in ascending order of their UTF-8 bytes;
- integers use the shortest msgpack form, floats are always float64;
- strings are ``str``, byte strings are ``bin``, tuples are written as arrays;
- ``Ext`` values are msgpack extension types whose payload is itself a
  canonical encoding (or raw bytes), chosen by the caller.

This is the only module that imports ``msgpack``. ``unpack`` raises only
``CorruptObject``, whatever bytes it is given.
"""

from typing import Any, NamedTuple

import msgpack

from .errors import BadInput, CorruptObject, Unstorable

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1


class Ext(NamedTuple):
    """A msgpack extension value: a type code (0-127) and its payload."""

    code: int
    data: bytes


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; BadInput if it holds lone surrogates (undecodable input)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"text {text[:40]!r} is not valid Unicode (it holds undecodable bytes)") from None


def key_order(key):
    """Sort key for map keys: ints first (numerically), then str by UTF-8."""
    if type(key) is int:
        return (0, key, b"")
    if type(key) is str:
        return (1, 0, utf8(key))
    raise BadInput(f"map key {key!r} is a {type(key).__name__}; keys must be str or int")


def _normalize(value: Any) -> Any:
    # Rebuild the value with plain types and sorted dicts; msgpack then packs
    # dicts in iteration order, which is the canonical order.
    t = type(value)
    if t is str:
        utf8(value)
        return value
    if value is None or t is bool or t is bytes or t is float:
        return value
    if t is int:
        if not INT_MIN <= value <= INT_MAX:
            raise Unstorable(f"integer {value} does not fit in 64 bits", reason="int-range")
        return value
    if isinstance(value, Ext):
        return msgpack.ExtType(value.code, value.data)
    if isinstance(value, dict):
        for k in value:
            if type(k) not in (int, str):
                raise Unstorable(f"map key {k!r} is not a str or int", reason="key-type", type=type(k).__name__)
            if type(k) is int and not INT_MIN <= k <= INT_MAX:
                raise Unstorable(f"map key {k} does not fit in 64 bits", reason="int-range")
        return {k: _normalize(value[k]) for k in sorted(value, key=key_order)}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    raise Unstorable(f"cannot encode a value of type {t.__name__}", reason="type", type=t.__name__)


def pack(value: Any) -> bytes:
    """The canonical encoding of ``value``; BadInput if it holds other types."""
    return msgpack.packb(
        _normalize(value), use_bin_type=True, use_single_float=False, strict_types=True
    )


def _ext_hook(code: int, data: bytes) -> Ext:
    return Ext(code, data)


def unpack(data: bytes, what: str = "object", kind=None, field=None) -> Any:
    """Decode canonical msgpack; CorruptObject (with ``kind`` and ``field``) on anything malformed.

    msgpack bounds every length field by the size of the input, so hostile
    bytes cannot make it allocate more than the input holds.
    """
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False, use_list=True, ext_hook=_ext_hook
        )
    except Exception as exc:  # msgpack raises many types; callers get one
        raise CorruptObject(f"{what} does not decode: {exc.__class__.__name__}: {exc}", kind=kind, field=field) from None
