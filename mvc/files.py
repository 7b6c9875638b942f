"""Checkpoint files: importing ``.pt``/``.safetensors`` states and exporting them.

Imports never unpickle arbitrary objects: ``.pt``/``.pth``/``.bin`` files are
read with ``torch.load(weights_only=True)``, which refuses anything but
tensors and plain containers. Exports are written to a temporary file and
renamed into place, so a failed export never leaves a half-written file.
torch is imported inside the functions, so commands that never touch a file
start without it.
"""

import os
import pickle
import re
import warnings
from pathlib import Path

from .errors import BadInput
from .objects import format_path, walk

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
FORMATS = ("pt", "safetensors")


def read_checkpoint(path) -> object:
    """The state stored in a ``.pt``-style or ``.safetensors`` file; BadInput if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return _read_safetensors(path)
    if suffix in TORCH_SUFFIXES:
        return _read_torch(path)
    raise BadInput(f"{path}: unknown checkpoint type {suffix or '(no suffix)'!r}; "
                   f"use one of {', '.join(TORCH_SUFFIXES)} or .safetensors")


def _read_torch(path: Path):
    import torch
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols; the error says enough
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"(?i)unsupported global:? (?:GLOBAL )?([\w.]+)", str(exc))
        if not found:
            raise BadInput(f"{path}: not a readable PyTorch checkpoint (damaged pickle data, or pickle "
                           "features that weights-only loading refuses)") from None
        raise BadInput(f"{path}: refused to load: it holds objects other than tensors and plain "
                       f"values ({found.group(1)}), and mvc never unpickles those") from None
    except Exception as exc:  # a hostile or damaged file can make the unpickler raise anything
        raise BadInput(f"{path}: not a readable PyTorch checkpoint ({exc.__class__.__name__}: "
                       f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None


def _read_safetensors(path: Path):
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise BadInput(f"{path}: not a readable safetensors file ({exc})") from None


def plain_values(state) -> int:
    """How many leaves of a state are not tensors (what safetensors cannot hold)."""
    import torch
    return sum(1 for _, leaf in walk(state) if not isinstance(leaf, torch.Tensor))


def tensors_by_key(state) -> dict:
    """{dotted key path: tensor} for every tensor in a state (safetensors' flat view)."""
    import torch
    out = {}
    for path, leaf in walk(state):
        if isinstance(leaf, torch.Tensor):
            key = format_path(path)
            if key in out:
                raise BadInput(f"two tensors flatten to the same key {key!r}; export as pt instead")
            out[key] = leaf
    return out


def write_checkpoint(state, path, fmt: str = "pt") -> Path:
    """Write ``state`` to ``path`` as ``pt`` (torch.save) or ``safetensors``; returns the path.

    Raises BadInput if the folder is missing or the state does not fit the
    format (safetensors holds no complex tensors); the target is untouched then.
    """
    if fmt not in FORMATS:
        raise BadInput(f"unknown format {fmt!r}; use pt or safetensors")
    path = Path(path)
    if path.is_symlink():  # write what the link points at, and keep the link
        path = path.resolve()
    if path.exists() and not path.is_file():
        raise BadInput(f"cannot write {path}: it is not a regular file")
    if not path.parent.is_dir():
        raise BadInput(f"cannot write {path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if fmt == "pt":
            import torch
            torch.save(state, tmp)
        else:
            _save_safetensors(state, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _save_safetensors(state, tmp: Path) -> None:
    from safetensors.torch import save_file
    flat = tensors_by_key(state)
    for key, t in flat.items():
        if t.is_complex():
            raise BadInput(f"tensor {key!r} is {t.dtype}, which safetensors cannot hold; export as pt")
    # safetensors refuses tensors that share memory: give each its own copy.
    flat = {k: v.contiguous().clone() for k, v in flat.items()}
    try:
        save_file(flat, str(tmp))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # a dtype it lacks, above all
        raise BadInput(f"safetensors cannot hold this state ({exc}); export as pt") from None
