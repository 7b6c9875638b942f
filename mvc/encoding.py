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


def unpack(data: bytes, what: str = "object", kind=None, field=None, canonical: bool = False) -> Any:
    """Decode msgpack; CorruptObject (with ``kind`` and ``field``) on anything malformed.

    ``canonical``: also refuse (``field`` "encoding") bytes that are well formed
    but not the canonical encoding of what they decode to (keys out of order or
    twice, a longer int or length form than needed, float32): for objects,
    whose ids must be one per value, or the same signed commit re-encoded
    would be a second commit whose signature still verifies.

    msgpack bounds every length field by the size of the input, so hostile
    bytes cannot make it allocate more than the input holds.
    """
    try:
        value = msgpack.unpackb(
            data, raw=False, strict_map_key=False, use_list=True, ext_hook=_ext_hook
        )
    except Exception as exc:  # msgpack raises many types; callers get one
        raise CorruptObject(f"{what} does not decode: {exc.__class__.__name__}: {exc}", kind=kind, field=field) from None
    if canonical:
        _check_canonical(value, data, what, kind)
    return value


def _check_canonical(value: Any, data: bytes, what: str, kind) -> None:
    # Packing what was read in the order it was read, then checking that every map was in
    # canonical key order, costs less than pack(), which rebuilds the value with a Python
    # step per item: a tensor object's list of ids is packed in C. The buffer fits the
    # input: packb's default 256 KiB would be most of a small decode's memory.
    try:
        again = msgpack.Packer(use_bin_type=True, use_single_float=False, strict_types=True, default=_ext_type,
                               buf_size=len(data) + 64).pack(value)
        canonical = again == data and _in_key_order(value)
    except Exception:  # e.g. msgpack's timestamp extension, which mvc never writes: unpack raises one type
        canonical = False
    if not canonical:
        raise CorruptObject(f"{what} is not in canonical form (docs/format.md section 6): its bytes are not "
                            "the encoding of what they decode to", kind=kind, field="encoding")


def _ext_type(value):
    if isinstance(value, Ext):
        return msgpack.ExtType(value.code, value.data)
    raise TypeError(f"{type(value).__name__} is not a canonical value")


_FLAT = frozenset({type(None), bool, int, float, str, bytes, Ext})


def _in_key_order(value: Any) -> bool:
    """Whether every map in ``value`` (as decoded: insertion order is the order read) has its
    keys in canonical order (no key twice: a decoded dict cannot hold one twice, and its
    re-encoding is then shorter than the input), and it holds only mvc's types."""
    t = type(value)
    if t is dict:
        keys = list(value)
        # str keys alone compare as their UTF-8 bytes do (UTF-8 keeps code point order): sorted() in C
        if not (keys == sorted(keys) if set(map(type, keys)) <= {str} else keys == sorted(keys, key=key_order)):
            return False
        return _all_in_key_order(value.values())
    if t is list:
        return set(map(type, value)) <= _FLAT or _all_in_key_order(value)
    return t in _FLAT  # not msgpack's timestamps: mvc stores no other type


def _all_in_key_order(values) -> bool:
    for v in values:  # inline for lists of plain values (a tensor's ids): one C pass, no call per item
        t = type(v)
        if t is list:
            if not (set(map(type, v)) <= _FLAT or _all_in_key_order(v)):
                return False
        elif t is dict:
            if not _in_key_order(v):
                return False
        elif t not in _FLAT:
            return False
    return True
