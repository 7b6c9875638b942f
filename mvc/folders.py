"""Model folders as Hugging Face writes them: safetensors shards plus small files.

A **model folder** holds ``model.safetensors`` (or shards
``model-0000N-of-0000M.safetensors`` with ``model.safetensors.index.json``),
``config.json``, tokenizer files and other small files, possibly in
subfolders. Committed, it becomes one state:

- every tensor of every ``.safetensors`` file, under its own key (a file in
  a subfolder ``sub/`` prefixes its keys with ``sub/``), so a folder and a
  single-file commit of the same model share chunks and diff key by key;
- ``__folder__``: ``{"files": {relative path: bytes}, "safetensors":
  {relative path: {"keys": [stored keys], "metadata": {text: text}}}}``,
  the other files byte for byte and which tensors each safetensors file
  held, so an export writes the same folder back, sharded the same way.

``.git`` and ``.cache`` (huggingface_hub's download bookkeeping) are not
part of a model and are left out; symbolic links (a hub cache snapshot is
made of them) are followed.
"""

import os
from pathlib import Path
from typing import Callable, Optional

from .errors import BadInput
from .files import (atomic_file, read_safetensors, tensors_by_key, write_bytes, _safetensors_layout,
                    _save_safetensors)

FOLDER_KEY = "__folder__"
SKIPPED_DIRS = frozenset({".git", ".cache"})
MAX_FILE = 64 << 20  # a bigger non-safetensors file is weights in another format, not a config


def is_folder_state(state) -> bool:
    return isinstance(state, dict) and isinstance(state.get(FOLDER_KEY), dict)


def _files(root: Path) -> list:
    """Relative paths (with /) of the folder's files, sorted; links followed."""
    out = []
    for here, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in names:
            path = Path(here) / name
            if path.is_file():
                out.append(path.relative_to(root).as_posix())
    return sorted(out)


def read_folder(root, progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """The state of a model folder (see the module doc); BadInput if it is not one."""
    root = Path(root)
    names = _files(root)
    shards = [n for n in names if n.endswith(".safetensors")]
    if not shards:
        raise BadInput(f"{root} holds no .safetensors file; mvc commits a model folder's safetensors "
                       "weights (save it with save_pretrained(..., safe_serialization=True))")
    total = sum((root / n).stat().st_size for n in shards)
    state, layout, files, done = {}, {}, {}, [0]
    if progress:
        progress(0, total)
    owner = {}
    for name in shards:
        prefix = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
        base = done[0]

        def step(n, _total, base=base):
            done[0] = base + n
            if progress:
                progress(min(done[0], total), total)
        imported = read_safetensors(root / name, step)
        keys = []
        for key, tensor in imported.state.items():
            stored = prefix + key
            if stored in owner or stored == FOLDER_KEY:
                raise BadInput(f"tensor {key!r} is in both {owner.get(stored, FOLDER_KEY)} and {name}; "
                               "mvc keeps one tensor per key in a model folder")
            owner[stored] = name
            state[stored] = tensor
            keys.append(stored)
        layout[name] = {"keys": keys, "metadata": imported.metadata}
    for name in names:
        if name in layout:
            continue
        size = (root / name).stat().st_size
        if size > MAX_FILE:
            raise BadInput(f"{root / name} is {size >> 20} MiB; mvc keeps a model folder's safetensors "
                           "weights and its small files (configs, tokenizers): convert it to safetensors "
                           "or move it out of the folder")
        files[name] = (root / name).read_bytes()
    state[FOLDER_KEY] = {"files": files, "safetensors": layout}
    return state


def folder_summary(state) -> tuple:
    """(safetensors files, other files) of a folder state."""
    folder = state[FOLDER_KEY]
    return len(folder.get("safetensors", {})), len(folder.get("files", {}))


def _layout(state) -> tuple:
    """(files, {shard: (keys, metadata)}) of a folder state; BadInput if malformed."""
    folder = state[FOLDER_KEY]
    files, shards = folder.get("files", {}), folder.get("safetensors", {})
    ok = (isinstance(files, dict) and isinstance(shards, dict)
          and all(isinstance(k, str) and isinstance(v, bytes) for k, v in files.items())
          and all(isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("keys"), list)
                  and isinstance(v.get("metadata", {}), dict) for k, v in shards.items()))
    if not ok:
        raise BadInput(f"the state's {FOLDER_KEY!r} entry is not a model folder layout mvc wrote; "
                       "export it to a file instead")
    for name in list(files) + list(shards):
        parts = name.split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise BadInput(f"the model folder names a file {name!r} outside itself; refusing to write it")
    return files, {k: (v["keys"], v.get("metadata", {})) for k, v in shards.items()}


def write_folder(state, out, force: bool = False,
                 progress: Optional[Callable[[int, int], None]] = None) -> Path:
    """Write a folder state back as the folder it was committed from; returns the folder.

    A new (or empty) folder is built under a temporary name and renamed into
    place, so an interrupted export leaves nothing half-written. A folder
    with files in it is refused unless ``force``, which replaces (each
    atomically) the files the commit holds and leaves the others. BadInput
    for a state that is not a folder or tensors no safetensors file holds.
    """
    files, shards = _layout(state)
    tensors = tensors_by_key({k: v for k, v in state.items() if k != FOLDER_KEY})
    placed = [k for keys, _ in shards.values() for k in keys]
    missing = [k for k in placed if k not in tensors]
    stray = sorted(set(tensors) - set(placed))
    if missing or stray:
        what = f"lacks tensor {missing[0]!r}" if missing else f"has tensor {stray[0]!r} that no file holds"
        raise BadInput(f"this model folder {what}; export it to a single .safetensors file instead")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"cannot write the model folder to {out}: it is a file")
    if not out.parent.is_dir():
        raise BadInput(f"cannot write {out}: folder {out.parent} does not exist")
    busy = out.is_dir() and any(out.iterdir())
    if busy and not force:
        raise BadInput(f"{out} already holds files; pass --force to overwrite those the commit holds")
    total = sum(t.nbytes for t in tensors.values())
    done = [0]

    def write_all(where: Path, replace: bool) -> None:
        for name, (keys, metadata) in shards.items():
            prefix = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
            flat, header = _safetensors_layout({k[len(prefix):]: tensors[k] for k in keys}, metadata)
            base = done[0]

            def step(n, _total, base=base):
                done[0] = base + n
                if progress:
                    progress(done[0], total)
            _write_one(where / name, replace, lambda f: _save_safetensors(f, flat.values(), header, total, step))
        for name, data in files.items():
            _write_one(where / name, replace, lambda f, data=data: write_bytes(f, data))

    if busy:
        write_all(out, True)
        return out
    staging = out.with_name(f".{out.name}.tmp{os.getpid()}")
    staging.mkdir()
    try:
        write_all(staging, False)
        os.rename(staging, out)  # onto a missing or empty folder
    except BaseException:
        _remove_tree(staging)
        raise
    return out


def _write_one(path: Path, replace: bool, write: Callable) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, replace) as f:
        write(f)


def _remove_tree(root: Path) -> None:
    for here, dirs, names in os.walk(root, topdown=False):
        for name in names:
            os.unlink(os.path.join(here, name))
        for name in dirs:
            os.rmdir(os.path.join(here, name))
    os.rmdir(root)
