"""The fixed on-disk dtype vocabulary.

Names follow safetensors where it has one (``F32``, ``BF16``, ``I64`` ...),
so the vocabulary does not depend on torch's repr strings. Dtypes that only
newer torch releases have are looked up by attribute, so older torch still
imports this module; such a dtype is simply absent there.
"""

import torch

from .errors import BadInput, CorruptObject

_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C32": "complex32",
    "C64": "complex64",
    "C128": "complex128",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "F4_E2M1_X2": "float4_e2m1fn_x2",
}

TO_TORCH = {
    name: getattr(torch, attr) for name, attr in _NAMES.items() if hasattr(torch, attr)
}
FROM_TORCH = {dtype: name for name, dtype in TO_TORCH.items()}


def name_of(dtype: torch.dtype, path: str = "") -> str:
    """The on-disk name of a torch dtype; BadInput if mvc cannot store it."""
    try:
        return FROM_TORCH[dtype]
    except KeyError:
        where = f" at {path!r}" if path else ""
        raise BadInput(f"tensor{where} has dtype {dtype}, which mvc cannot store") from None


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for an on-disk name; CorruptObject if unknown."""
    try:
        return TO_TORCH[name]
    except (KeyError, TypeError):
        raise CorruptObject(f"unknown dtype {name!r} in a tensor object") from None


def itemsize(name: str) -> int:
    return torch_dtype(name).itemsize
