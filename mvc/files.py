"""Checkpoint files: importing ``.pt``/``.safetensors`` states and exporting them.

Imports never unpickle arbitrary objects: ``.pt``/``.pth``/``.bin`` files are
read with ``torch.load(weights_only=True)``, which refuses anything but
tensors and plain containers. A safetensors file's ``__metadata__`` (text
pairs such as ``{"format": "pt"}``) is returned next to its tensors, so a
commit can keep it and an export write it back.

Exports go to a temporary file next to the target (with the target's
permissions, or the umask's for a new file), are fsynced, and only then
take the target's name, so a failed or interrupted export never leaves a
half-written file and never touches an existing one. An existing target is
refused unless ``force``; a symbolic link is followed (the file it points
at is replaced, the link stays). safetensors files are written here rather
than by ``safetensors.torch.save_file``, so a full disk is an ``OSError``,
progress can be shown, and no tensor is copied whole.

torch is imported inside the functions, so commands that never touch a file
start without it.
"""

import fnmatch
import io
import json
import os
import pickle
import re
import struct
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from .errors import BadInput, CannotHold, InsideRepository, MvcError
from .scratch import gone, tag
from .store import fs
from .traverse import format_path, walk

REPOSITORY_DIR = ".mvc"  # what a repository's folder is called (mvc.repository.MVC_DIR)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
FORMATS = ("pt", "safetensors")
PIECE = 8 << 20  # bytes written (and reported to progress) at a time
# dtypes every safetensors reader knows, by mvc's on-disk names (the same words)
SAFETENSORS_DTYPES = frozenset({"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64",
                                "F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ",
                                "F8_E5M2FNUZ", "F8_E8M0", "C64", "F4_E2M1_X2"})
# mvc's names that safetensors spells otherwise: torch's float4_e2m1fn_x2 packs two
# 4-bit values per element, safetensors' F4 counts the 4-bit values (last dim doubled)
SAFETENSORS_NAMES = {"F4_E2M1_X2": "F4"}


@dataclass
class Imported:
    """What a checkpoint file holds: the state, and the safetensors metadata (if any)."""

    state: object
    metadata: dict = field(default_factory=dict)


# -- reading -------------------------------------------------------------------

def read_checkpoint(path, progress: Optional[Callable[[int, int], None]] = None) -> object:
    """The state stored in a ``.pt``-style or ``.safetensors`` file; BadInput if unreadable."""
    return import_checkpoint(path, progress).state


def import_checkpoint(path, progress: Optional[Callable[[int, int], None]] = None) -> Imported:
    """The state (and safetensors metadata) in a checkpoint file; BadInput if unreadable.

    ``progress(done, total)`` is called with the bytes read so far.
    """
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return read_safetensors(path, progress)
    if suffix in TORCH_SUFFIXES:
        return Imported(_read_torch(path, progress))
    raise BadInput(f"{path}: unknown checkpoint type {suffix or '(no suffix)'!r}; "
                   f"use one of {', '.join(TORCH_SUFFIXES)}, .safetensors or a model folder")


class _CountingReader(io.RawIOBase):
    """A read-only file that reports how far it has been read (torch.load reads through it)."""

    def __init__(self, f, total: int, progress):
        self.f, self.total, self.progress = f, total, progress

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self.f.seek(offset, whence)

    def tell(self):
        return self.f.tell()

    def readinto(self, buffer):
        n = self.f.readinto(buffer)
        self.progress(min(self.f.tell(), self.total), self.total)
        return n


def _read_torch(path: Path, progress=None):
    import torch
    try:
        with warnings.catch_warnings(), open(path, "rb") as f:
            warnings.simplefilter("ignore")  # torch warns about odd pickle protocols; the error says enough
            source = f
            if progress is not None:
                size = os.fstat(f.fileno()).st_size
                progress(0, size)
                source = io.BufferedReader(_CountingReader(f, size, progress), PIECE)
            state = torch.load(source, map_location="cpu", weights_only=True)
        _check_expansion(state, path)
        return state
    except BadInput:
        raise
    except pickle.UnpicklingError as exc:
        found = re.search(r"(?i)unsupported global:? (?:GLOBAL )?([\w.]+)", str(exc))
        if not found:
            raise BadInput(f"{path}: not a readable PyTorch checkpoint (damaged pickle data, or pickle "
                           "features that weights-only loading refuses)") from None
        raise BadInput(f"{path}: refused to load: it holds objects other than tensors and plain "
                       f"values ({found.group(1)}), and mvc never unpickles those") from None
    except OSError:
        raise
    except Exception as exc:  # a hostile or damaged file can make the unpickler raise anything
        raise BadInput(f"{path}: not a readable PyTorch checkpoint ({_reason(exc)})") from None


MAX_EXPANSION = 4  # tensor bytes per file byte an import may expand to (views share storages)
EXPANSION_SLACK = 64 << 20


def _check_expansion(state, path: Path) -> None:
    """BadInput if the file's tensors expand far beyond its size.

    A ``.pt`` file holds storages; a tensor in it is a view (shape, strides)
    of one. Views with zero or overlapping strides can name far more bytes
    than the file holds (a 1 KB file naming a 16 GiB tensor), and a commit
    stores every view's bytes. Legitimate files stay near 1x (tied or
    transposed views of one storage at most a few times it).
    """
    import torch
    from .traverse import storage_key
    size = os.path.getsize(path)
    seen, total = set(), 0
    for _, leaf in walk(state):
        if isinstance(leaf, torch.Tensor) and not leaf.is_nested:
            key = storage_key(leaf)
            if key is None or key not in seen:
                seen.add(key)
                total += leaf.numel() * leaf.element_size()
    if total > MAX_EXPANSION * size + EXPANSION_SLACK:
        raise BadInput(f"{path}: its tensors would expand to {total:,} bytes from a {size:,}-byte file "
                       "(views with zero or overlapping strides); refused. Save the tensors contiguous "
                       "(t.contiguous()) if this is intended")


def _reason(exc: Exception) -> str:
    """An exception as a short clause in whole words: its type and its first sentence."""
    if isinstance(exc, EOFError):
        return "EOFError: the file ends early"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = re.split(r"(?<=[a-z)])\. ", text, maxsplit=1)[0].rstrip(".")
    if len(text) > 160:
        text = text[:160].rsplit(" ", 1)[0] + " ..."
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__


def read_safetensors(path: Path, progress=None) -> Imported:
    """The tensors of a safetensors file as a flat {key: tensor} dict, and its metadata."""
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            keys = list(f.keys())
            state, done = {}, 0
            total = os.path.getsize(path)
            if progress:
                progress(0, total)
            for key in keys:
                state[key] = f.get_tensor(key)
                done += state[key].nbytes
                if progress:
                    progress(min(done, total), total)
            if progress:
                progress(total, total)  # the header's bytes are read too
    except (SafetensorError, OSError, ValueError, RuntimeError, TypeError) as exc:
        raise BadInput(f"{path}: not a readable safetensors file ({_reason(exc)})") from None
    return Imported(state, dict(metadata))


# -- selecting what to export --------------------------------------------------------

def count_tensors(state) -> int:
    import torch
    return sum(1 for _, leaf in walk(state) if isinstance(leaf, torch.Tensor))


def plain_values(state) -> int:
    """How many leaves of a state are not tensors (what safetensors cannot hold)."""
    import torch
    return sum(1 for _, leaf in walk(state) if not isinstance(leaf, torch.Tensor))


def tensors_by_key(state) -> dict:
    """{dotted key path: tensor} for every tensor in a state (safetensors' flat view)."""
    import torch
    return {key: leaf for key, leaf in flat_leaves(state).items() if isinstance(leaf, torch.Tensor)}


def flat_leaves(state) -> dict:
    """{dotted key path: leaf} for every tensor and plain value; BadInput if two keys collide."""
    return {key: leaf for key, (_, leaf) in flat_paths(state).items()}


def flat_paths(state) -> dict:
    """{dotted key path: (key path, leaf)} for every leaf of a state or a tree; BadInput if two keys collide."""
    out = {}
    for path, leaf in walk(state):
        key = format_path(path)
        if key in out:
            raise BadInput(f"two entries flatten to the same key {key!r}; export as pt without only=")
        out[key] = (path, leaf)
    return out


def select(state, only: Optional[str] = None, strip_prefix: Optional[str] = None) -> dict:
    """A flat state dict of the leaves whose dotted key matches ``only`` (fnmatch),
    with ``strip_prefix`` taken off each key: what ``model.load_state_dict`` takes.

    BadInput if nothing matches, a selected key lacks the prefix, or a key would
    become empty.
    """
    return select_flat(flat_leaves(state), only, strip_prefix)


def select_flat(flat: dict, only: Optional[str] = None, strip_prefix: Optional[str] = None) -> dict:
    """``select`` on a flat {dotted key: anything} dict."""
    picked = {k: v for k, v in flat.items() if only is None or fnmatch.fnmatchcase(k, only)}
    if not picked:
        raise BadInput(f"no key matches only={only!r} (keys look like {_examples(flat)})")
    if strip_prefix and not strip_prefix.endswith("."):
        strip_prefix += "."  # a prefix is whole dotted components: "model" strips "model.", never leaves ".0.bias"
    if strip_prefix:
        lacking = [k for k in picked if not k.startswith(strip_prefix) or k == strip_prefix]
        if lacking:
            raise BadInput(f"key {lacking[0]!r} does not start with strip_prefix={strip_prefix!r}; "
                           "narrow only= to the keys under that prefix")
        picked = {k[len(strip_prefix):]: v for k, v in picked.items()}
    return picked


def _examples(flat: dict) -> str:
    keys = list(flat)[:3]
    return ", ".join(repr(k) for k in keys) + (" ..." if len(flat) > 3 else "") if keys else "none: it is empty"


# -- writing ---------------------------------------------------------------------

def formats_for(path, fmt: Optional[str]) -> str:
    """The format to write ``path`` in: ``fmt``, else from the suffix, else pt.

    BadInput for an unknown format, or one that contradicts the suffix (a
    safetensors file named .pt would be read by the wrong loader).
    """
    suffix = Path(path).suffix.lower()
    guessed = "safetensors" if suffix == ".safetensors" else "pt"
    if fmt is None:
        return guessed
    if fmt not in FORMATS:
        raise BadInput(f"unknown format {fmt!r}; use pt or safetensors")
    if (fmt == "safetensors" and suffix in TORCH_SUFFIXES) or (fmt == "pt" and suffix == ".safetensors"):
        better = Path(path).with_suffix(".safetensors" if fmt == "safetensors" else ".pt").name
        raise BadInput(f"format {fmt} does not match the name {Path(path).name}, which loaders read as "
                       f"{guessed}; name it {better}, or leave the format to the name")
    return fmt


def write_checkpoint(state, path, fmt: str = "pt", force: bool = True, metadata: Optional[dict] = None,
                     progress: Optional[Callable[[int, int], None]] = None, *, scratch: bool = False) -> Path:
    """Write ``state`` to ``path`` as ``pt`` (torch.save) or ``safetensors``; returns the path written.

    ``metadata`` (text pairs) goes into a safetensors header (default
    ``{"format": "pt"}``, what Hugging Face loaders expect).
    ``progress(done, total)`` is called with the bytes written. Raises
    BadInput if the target exists and not ``force``, is not a regular file,
    its folder is missing, or the state does not fit the format;
    InsideRepository if it is inside a ``.mvc`` (unless ``scratch``: a
    repository's own temporary file, as bisect writes); OSError (a full
    disk, a read-only folder) saying the target is unchanged.
    """
    if fmt not in FORMATS:
        raise BadInput(f"unknown format {fmt!r}; use pt or safetensors")
    if fmt == "safetensors":
        flat, header = _safetensors_layout(tensors_by_key(state), metadata)
        total = sum(t.nbytes for t in flat.values())
        write = lambda f: _save_safetensors(f, flat.values(), header, total, progress)  # noqa: E731
    else:
        write = lambda f: _save_torch(f, state, progress)  # noqa: E731
    return _atomic_write(path, force, write, scratch)


def repository_around(path) -> Optional[Path]:
    """The ``.mvc`` folder that ``path`` is or lies inside, as written or with
    its links resolved, or None: no export may write there."""
    for form in (os.path.abspath(path), os.path.realpath(path)):
        form = Path(form)
        for p in (form, *form.parents):
            if p.name == REPOSITORY_DIR:
                return p
    return None


def check_not_in_repository(path, repo_dir=None) -> None:
    """InsideRepository if writing ``path`` would write inside a ``.mvc``
    (any, or ``repo_dir`` wherever its links lead)."""
    around = repository_around(path)
    if around is None and repo_dir is not None:
        real, mine = Path(os.path.realpath(path)), Path(os.path.realpath(repo_dir))
        if real == mine or mine in real.parents:
            around = Path(repo_dir)
    if around is not None:
        raise InsideRepository(f"cannot write {path}: it is inside the repository {around}, which mvc never "
                               "writes into; give a path outside it", path=path, repository=around)


_LEFTOVER = re.compile(r"\.(.+)\.tmp(\d+)(?:-([0-9a-f]{24}))?")  # .NAME.tmp<scratch tag>; an older mvc's: the pid


def remove_leftovers(target: Path, remove: Optional[Callable] = None) -> list:
    """Remove the temporary ``.NAME.tmp<tag>`` files and folders that writes to
    ``target`` killed before they finished left beside it (their process is
    gone); returns their paths. A live process's are left alone."""
    removed = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return removed
    for name in names:
        found = _LEFTOVER.fullmatch(name)
        if found is None or found.group(1) != target.name or not gone(int(found.group(2)), found.group(3)):
            continue
        path = target.parent / name
        try:
            (remove or _remove_path)(path)
            removed.append(path)
        except FileNotFoundError:  # another export cleaned it meanwhile
            pass
    return removed


def _remove_path(path: Path) -> None:
    import shutil
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)  # never follows a link inside
    else:
        os.unlink(path)


def output_target(path, force: bool, scratch: bool = False) -> Path:
    """The file an export to ``path`` replaces (a link's target); BadInput if it
    may not be written, InsideRepository if it is inside a ``.mvc`` (and not ``scratch``)."""
    path = Path(path)
    if not scratch:
        check_not_in_repository(path)
    if path.is_symlink():
        if not force:
            raise BadInput(f"{path} is a symbolic link to {os.readlink(path)}",
                           forced="overwrite the file it points at (the link stays)")
        path = path.resolve()
    if path.exists() and not path.is_file():
        raise BadInput(f"cannot write {path}: it is not a regular file")
    if path.exists() and not force:
        raise BadInput(f"{path} already exists", forced="overwrite it")
    if not path.parent.is_dir():
        raise BadInput(f"cannot write {path}: folder {path.parent} does not exist")
    return path


def _atomic_write(path, force: bool, write: Callable, scratch: bool = False) -> Path:
    target = output_target(path, force, scratch)
    with atomic_file(target, force) as f:
        write(f)
    return target


@contextmanager
def atomic_file(target: Path, force: bool):
    """A file object that becomes ``target`` when the block ends without error
    (``store.fs.atomic_file``), with the target's permissions (or the umask's).

    No ``force``: never over a file that appeared meanwhile (BadInput). The
    temporary file is ``.NAME.tmpPID`` beside the target, so a killed export's
    is found (``remove_leftovers``). On any error an OSError says the target
    is unchanged.
    """
    existed = target.exists()
    mode = target.stat().st_mode & 0o7777 if existed else 0o666
    remove_leftovers(target)
    try:
        with fs.atomic_file(target, replace=force, tmp=target.with_name(f".{target.name}.tmp{tag()}"),
                            mode=mode) as f:
            if existed:
                os.fchmod(f.fileno(), mode)  # the umask may have cleared bits the old file had
            yield f
    except OSError as exc:
        if isinstance(exc, FileExistsError) and not force and target.exists():  # appeared meanwhile
            raise BadInput(f"{target} already exists", forced="overwrite it") from None
        raise OSError(exc.errno, f"{exc.strerror or exc} while writing {target}; "
                                 f"{'it is unchanged' if existed else 'nothing was written'}") from None


class _CountingWriter(io.RawIOBase):
    """Passes writes on to ``f`` and reports the bytes written so far."""

    def __init__(self, f, total: int, progress):
        self.f, self.total, self.progress, self.done = f, total, progress, 0

    def writable(self):
        return True

    def write(self, data):
        view = memoryview(data)
        write_bytes(self.f, view)
        self.done += len(view)
        if self.progress:
            self.progress(min(self.done, self.total), self.total)
        return len(view)


def _save_torch(f, state, progress) -> None:
    import torch
    total = sum(t.nbytes for _, t in walk(state) if isinstance(t, torch.Tensor))
    if progress:
        progress(0, total)
    out = io.BufferedWriter(_CountingWriter(f, total, progress), PIECE)
    try:
        torch.save(state, out)
        out.flush()
    except RuntimeError as exc:
        # torch's writer wraps the OSError of a full disk in a RuntimeError
        if isinstance(exc.__context__, OSError):
            raise exc.__context__ from None
        raise


def _torch_internals():
    """(open the zip writer, write the records) of torch.save, or None where
    this torch's are not the ones ``write_torch_streamed`` was written for."""
    import inspect
    import torch.serialization as ts
    save, opener = getattr(ts, "_save", None), getattr(ts, "_open_zipfile_writer", None)
    try:
        names = tuple(inspect.signature(save).parameters) if save is not None else ()
    except (TypeError, ValueError):
        return None
    if opener is None or names != ("obj", "zip_file", "pickle_module", "pickle_protocol", "_disable_byteorder_record"):
        return None
    return opener, save


def can_stream_torch() -> bool:
    return _torch_internals() is not None


class _ReadFirst:
    """torch's zip writer, holding back each storage's record until ``wait(storage)``
    says its bytes are in, and calling ``written(storage)`` once they are out.
    Knows only ``write_record``: torch.save calling anything else fails the
    export instead of writing bytes unread."""

    def __init__(self, writer, wait: Callable, written: Optional[Callable]):
        self._writer, self._wait, self._written, self.storages = writer, wait, written, 0

    def write_record(self, name, data, size):
        import torch
        if not (isinstance(data, (torch.UntypedStorage, torch.storage.TypedStorage)) and size):
            return self._writer.write_record(name, data, size)
        self._wait(data)
        self.storages += 1
        out = self._writer.write_record(name, data, size)
        if self._written is not None:
            self._written(data)
        return out

    def __getattr__(self, name):
        raise AttributeError(f"a streamed pt export does not know torch's zip writer call {name!r}")


def write_torch_streamed(path, force: bool, state, wait: Callable, storages: int,
                         progress: Optional[Callable[[int, int], None]] = None,
                         written: Optional[Callable] = None) -> Path:
    """``torch.save`` of ``state`` while its tensors are still being read:
    each storage's bytes are written once ``wait(storage)`` returns, in the
    order torch.save writes them, so reading and writing overlap; then
    ``written(storage)`` is called (torch.save reads it no more). The file
    is byte for byte what torch.save makes of the filled state. ``storages``
    is how many non-empty storages the state holds; a torch that writes
    another number fails the export (nothing is written). Atomically, as
    ``write_checkpoint``."""
    import torch
    import torch.serialization as ts
    opener, save = _torch_internals()
    total = sum(t.nbytes for _, t in walk(state) if isinstance(t, torch.Tensor))

    def write(f):
        if progress:
            progress(0, total)
        out = io.BufferedWriter(_CountingWriter(f, total, progress), PIECE)
        with opener(out) as zip_file:
            proxy = _ReadFirst(zip_file, wait, written)
            save(state, proxy, pickle, ts.DEFAULT_PROTOCOL, False)  # torch.save's defaults
        out.flush()
        if proxy.storages != storages:
            raise MvcError(f"torch wrote {proxy.storages} storages where the state has {storages}; "
                           "export as safetensors, or with another torch")
    return _atomic_write(path, force, write)


def _safetensors_layout(flat: dict, metadata: Optional[dict]) -> tuple:
    """(tensors in file order, header bytes) for {key: tensor}; see ``safetensors_header``."""
    from . import dtypes
    specs = {key: (dtypes.name_of(t.dtype, key), tuple(t.shape), t.element_size(), t.nbytes) for key, t in flat.items()}
    order, header = safetensors_header(specs, metadata)
    return {k: flat[k] for k in order}, header


def safetensors_header(specs: dict, metadata: Optional[dict]) -> tuple:
    """(keys in file order, header bytes) for {key: (mvc dtype name, shape, itemsize, nbytes)}:
    widest elements first, then by key, so every tensor starts aligned to its
    element size, as safetensors does. BadInput for a dtype safetensors cannot hold."""
    for key, (name, shape, _, _) in specs.items():
        if name not in SAFETENSORS_DTYPES or (name in SAFETENSORS_NAMES and not shape):
            raise CannotHold(f"tensor {key!r} is {name}{'' if shape else ' with no dimensions'}, which "
                             "safetensors cannot hold; export as pt", format="safetensors", key=key, dtype=name,
                             shape=tuple(shape))
    if "__metadata__" in specs:  # the header's own key: a tensor by that name makes a file nobody can read
        raise CannotHold("tensor '__metadata__' has the name safetensors gives its header's metadata; rename it "
                         "or export as pt", format="safetensors", key="__metadata__")
    meta = {"format": "pt"} if metadata is None else metadata
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise BadInput("safetensors metadata must map text to text")
    order = sorted(specs, key=lambda k: (-specs[k][2], k))
    header, offset = {}, 0
    for key in order:
        name, shape, _, n = specs[key]
        if name in SAFETENSORS_NAMES:
            name, shape = SAFETENSORS_NAMES[name], (*shape[:-1], 2 * shape[-1])
        header[key] = {"dtype": name, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    if meta:
        header["__metadata__"] = meta
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return order, struct.pack("<Q", len(raw)) + raw


def write_safetensors(path, force: bool, header: bytes, tensors: Iterable, total: int,
                      progress: Optional[Callable[[int, int], None]] = None) -> Path:
    """Write a safetensors file from its header and its tensors in file order,
    as ``tensors`` yields them (so they need not all be in memory at once);
    atomically, as ``write_checkpoint``."""
    return _atomic_write(path, force, lambda f: _save_safetensors(f, tensors, header, total, progress))


def write_bytes(f, data) -> None:
    """All of ``data`` to an unbuffered file, which may take less than it is given."""
    view, written = memoryview(data), 0
    while written < len(view):
        written += f.write(view[written:])


def _save_safetensors(f, tensors: Iterable, header: bytes, total: int, progress) -> None:
    import torch
    if progress:
        progress(0, total)
    write_bytes(f, header)
    done = 0
    for t in tensors:
        view = memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        for start in range(0, len(view), PIECE):
            write_bytes(f, view[start:start + PIECE])
            done += min(PIECE, len(view) - start)
            if progress:
                progress(done, total)
