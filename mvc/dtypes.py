"""The fixed on-disk dtype vocabulary.

Names follow safetensors where it has one (``F32``, ``BF16``, ``I64`` ...),
so the vocabulary does not depend on torch's repr strings. The table here
holds each name's element size, so reading objects (log, show, fsck, diff
of ids) needs no torch; torch is imported only to map names to dtypes.
Dtypes that only newer torch releases have are looked up by attribute, so
older torch still works; such a dtype is simply absent there.
"""

from .errors import BadInput, CorruptObject

# on-disk name: (torch attribute, bytes per element)
VOCABULARY = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "I16": ("int16", 2),
    "I32": ("int32", 4),
    "I64": ("int64", 8),
    "U16": ("uint16", 2),
    "U32": ("uint32", 4),
    "U64": ("uint64", 8),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F32": ("float32", 4),
    "F64": ("float64", 8),
    "C32": ("complex32", 4),
    "C64": ("complex64", 8),
    "C128": ("complex128", 16),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "F4_E2M1_X2": ("float4_e2m1fn_x2", 1),
}

_maps: dict = {}


def _torch_maps() -> tuple:
    """({name: torch dtype}, {torch dtype: name}) for the dtypes this torch has."""
    if not _maps:
        import torch
        to_torch = {name: getattr(torch, attr) for name, (attr, _) in VOCABULARY.items()
                    if hasattr(torch, attr)}
        _maps["to"], _maps["from"] = to_torch, {d: n for n, d in to_torch.items()}
    return _maps["to"], _maps["from"]


def __getattr__(name):
    # TO_TORCH / FROM_TORCH are built on first use, so importing mvc stays free of torch
    if name == "TO_TORCH":
        return _torch_maps()[0]
    if name == "FROM_TORCH":
        return _torch_maps()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_name(name) -> str:
    """``name`` if it is in the vocabulary; CorruptObject otherwise."""
    if not isinstance(name, str) or name not in VOCABULARY:
        raise CorruptObject(f"unknown dtype {name!r} in a tensor object", kind="tensor", field="dtype")
    return name


def name_of(dtype, path: str = "") -> str:
    """The on-disk name of a torch dtype; BadInput if mvc cannot store it."""
    try:
        return _torch_maps()[1][dtype]
    except KeyError:
        where = f" at {path!r}" if path else ""
        raise BadInput(f"tensor{where} has dtype {dtype}, which mvc cannot store") from None


def torch_dtype(name: str):
    """The torch dtype for an on-disk name; CorruptObject if unknown to this torch."""
    check_name(name)
    try:
        return _torch_maps()[0][name]
    except KeyError:
        raise CorruptObject(f"dtype {name} needs a newer torch than this one") from None


def itemsize(name: str) -> int:
    return VOCABULARY[check_name(name)][1]
