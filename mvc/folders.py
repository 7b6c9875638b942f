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

Left out, and listed in what ``read_folder`` reports as ``skipped``: any
``.mvc`` folder (a repository never stores itself), ``.git`` and ``.cache``
(huggingface_hub's download bookkeeping), at any depth, and what the
folder's own ``.mvcignore`` names (``IGNORE_FILE``: one glob a line, ``#``
comments; a glob with no ``/`` matches a file or folder name at any depth,
one with ``/`` the path from the folder's root, one that starts with ``**/``
the rest of it at any depth, the root too (as in Git); a trailing ``/`` matches
folders only, and a matched folder leaves out all it holds). **Hidden
files** (a part of the path starts with ``.``: ``.ssh/id_ed25519``,
``.env``, ``.netrc``) are committed like any other file, and reported as
``hidden`` so that a secret is never stored without a word (the usual
``.gitattributes``, ``.gitignore`` and ``.mvcignore`` are not reported), and so is a
file linked from outside the folder (but a hub cache's ``blobs/``). Symbolic links: a
link to a regular file is read (a hub cache snapshot is made of them, and
reading a file cannot loop); a link to a folder is refused (``FolderLink``),
since it may loop (``again -> .``) or lead out of the folder, as is a link
into a ``.mvc``. Nothing else (FIFOs, sockets, devices) is read.

An **export** of a folder is atomic as a whole: the new folder is built
beside the target (``.NAME.tmpPID``), fsynced, and swapped in by one rename;
the old folder is removed only after the swap. So the folder is either all
the old commit's or all the new one's, files the new commit lacks are gone,
and nothing is ever written through a link inside the old folder. Staging
folders a killed export left are removed by the next export to that target.
"""

import errno
import fnmatch
import os
import stat
from pathlib import Path
from typing import Callable, Optional

from .errors import BadInput, FolderLink, InsideRepository, ProtectedFolder, UnsafeName
from .files import (REPOSITORY_DIR, read_safetensors, remove_leftovers, repository_around, tensors_by_key,
                    write_bytes, _safetensors_layout, _save_safetensors)
from .scratch import tag as scratch_tag
from .store.fs import fsync_dir

FOLDER_KEY = "__folder__"
SKIPPED_DIRS = frozenset({REPOSITORY_DIR, ".git", ".cache"})
IGNORE_FILE = ".mvcignore"  # globs of what a folder commit leaves out (see the module doc)
USUAL_HIDDEN = frozenset({".gitattributes", ".gitignore", IGNORE_FILE})  # hidden, but no secret
MAX_FILE = 64 << 20  # a bigger non-safetensors file is weights in another format, not a config


def is_folder_state(state) -> bool:
    return isinstance(state, dict) and isinstance(state.get(FOLDER_KEY), dict)


def _files(root: Path, skipped: Optional[list] = None, hidden: Optional[list] = None) -> list:
    """Relative paths (with /) of the folder's files, sorted (see the module doc);
    what is left out is appended to ``skipped``, the hidden files kept to
    ``hidden``. FolderLink for a link to a folder; BadInput for an unreadable ``.mvcignore``."""
    ignored = _ignore_globs(root)
    out = []
    for here, dirs, names in os.walk(root):  # never into a linked folder: they are checked below
        rel = Path(here).relative_to(root)
        for name in sorted(dirs):
            if name in SKIPPED_DIRS or _ignored(ignored, rel / name, folder=True):
                dirs.remove(name)
                if skipped is not None:
                    skipped.append((rel / name).as_posix() + "/")
            elif os.path.islink(os.path.join(here, name)):
                dirs.remove(name)
                _refuse_link(root, rel / name, "a folder")
        dirs.sort()
        for name in names:
            path = Path(here) / name
            if _ignored(ignored, rel / name, folder=False):
                if skipped is not None:
                    skipped.append((rel / name).as_posix())
                continue
            if path.is_symlink():
                if repository_around(path) is not None:
                    _refuse_link(root, rel / name, "a file inside a repository's .mvc")
            if path.is_file():
                out.append((rel / name).as_posix())
            elif skipped is not None:  # a FIFO, socket, device or dangling link: never read
                skipped.append((rel / name).as_posix())
    if hidden is not None:
        hidden.extend(n for n in sorted(out) if _hidden(n) or _leads_out(root, n))
    return sorted(out)


def _leads_out(root: Path, rel: str) -> bool:
    """Whether file ``rel`` is a link whose target lies outside the folder, other than a hub
    cache's ``blobs/`` (a snapshot's files link there): ``tokenizer.model -> ~/.ssh/id_ed25519``
    would store a secret as a model file."""
    path = Path(root) / rel
    if not path.is_symlink():
        return False
    target = path.resolve()
    return not target.is_relative_to(Path(root).resolve()) and target.parent.name != "blobs"


def _hidden(rel: str) -> bool:
    """Whether a file's path from the folder's root has a part that starts with a dot (not a usual one)."""
    parts = rel.split("/")
    return any(p.startswith(".") for p in parts[:-1]) or parts[-1].startswith(".") and parts[-1] not in USUAL_HIDDEN


def _ignore_globs(root: Path) -> tuple:
    """The globs of the folder's IGNORE_FILE (none when it has none)."""
    path = root / IGNORE_FILE
    if not path.is_file():
        return ()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def _ignored(globs: tuple, rel: Path, folder: bool) -> bool:
    """Whether ``rel`` (a path from the folder's root) matches a glob of IGNORE_FILE."""
    path = rel.as_posix()
    for glob in globs:
        if glob.endswith("/"):
            if not folder:
                continue
            glob = glob.rstrip("/")
        pattern = glob.lstrip("/")
        if pattern.startswith("**/"):  # Git's "at any depth", the root's too: "**/*.pem" leaves out ./key.pem
            rest = pattern[3:]
            if fnmatch.fnmatchcase(path, rest) or fnmatch.fnmatchcase(path, "*/" + rest):
                return True
            continue
        if fnmatch.fnmatchcase(path if "/" in glob else rel.name, pattern):
            return True
    return False


def _refuse_link(root: Path, rel: Path, what: str) -> None:
    target = os.readlink(root / rel)
    raise FolderLink(f"{root / rel} is a symbolic link to {what} ({target}); mvc does not follow links to "
                     "folders or into a repository (a loop, or files outside the model folder): replace it "
                     "with the files themselves, or move it out of the folder", path=rel.as_posix(), target=target)


def read_folder(root, progress: Optional[Callable[[int, int], None]] = None,
                skipped: Optional[list] = None, hidden: Optional[list] = None) -> dict:
    """The state of a model folder (see the module doc); BadInput if it is not
    one, FolderLink for a link it does not follow. What it leaves out
    (``.mvc/``, ``.git/``, ``.cache/``, what ``.mvcignore`` names, FIFOs...)
    is appended to ``skipped``; the hidden files it reads (``.ssh/...``,
    ``.env``) to ``hidden``."""
    root = Path(root)
    names = _files(root, skipped, hidden)
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


def layout(state) -> tuple:
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
            raise UnsafeName(f"the model folder names a file {name!r} outside itself; refusing to write it",
                             name=name, problem="outside")
        if any(ord(c) < 0x20 or c == "\x7f" for c in name):
            raise UnsafeName(f"the model folder names a file {name!r} with a control character (a NUL byte, a "
                             "newline); refusing to write it", name=name, problem="control-character")
        if any(p in SKIPPED_DIRS for p in parts):
            raise UnsafeName(f"the model folder names a file {name!r} inside {REPOSITORY_DIR}, .git or .cache, "
                             "which a folder commit never holds; refusing to write it", name=name, problem="reserved")
    return files, {k: (v["keys"], v.get("metadata", {})) for k, v in shards.items()}


def write_folder(state, out, force: bool = False,
                 progress: Optional[Callable[[int, int], None]] = None) -> Path:
    """Write a folder state back as the folder it was committed from; returns the folder.

    The folder is built beside the target and swapped in as a whole (see
    the module doc). A folder with files in it is refused unless ``force``,
    which replaces it whole: files the commit does not hold are removed.
    A link as the target is followed with ``force`` (the folder it names is
    replaced, the link stays). BadInput for a state that is not a folder or
    tensors no safetensors file holds; InsideRepository for a target inside
    a ``.mvc`` or holding one; OSError (a full disk) saying the folder is
    unchanged.
    """
    files, shards = layout(state)
    tensors = tensors_by_key({k: v for k, v in state.items() if k != FOLDER_KEY})
    placed = [k for keys, _ in shards.values() for k in keys]
    missing = [k for k in placed if k not in tensors]
    stray = sorted(set(tensors) - set(placed))
    if missing or stray:
        what = f"lacks tensor {missing[0]!r}" if missing else f"has tensor {stray[0]!r} that no file holds"
        raise BadInput(f"this model folder {what}; export it to a single .safetensors file instead")
    out = _folder_target(Path(out), force)
    total = sum(t.nbytes for t in tensors.values())
    done = [0]

    def write_all(where: Path) -> None:
        for name, (keys, metadata) in shards.items():
            prefix = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
            flat, header = _safetensors_layout({k[len(prefix):]: tensors[k] for k in keys}, metadata)
            base = done[0]

            def step(n, _total, base=base):
                done[0] = base + n
                if progress:
                    progress(done[0], total)
            _write_new(where, name, lambda f: _save_safetensors(f, flat.values(), header, total, step))
        for name, data in files.items():
            _write_new(where, name, lambda f, data=data: write_bytes(f, data))

    remove_leftovers(out, _remove_tree)
    staging = out.with_name(f".{out.name}.tmp{scratch_tag()}")
    existed = out.is_dir()
    try:
        os.mkdir(staging, 0o700)
        write_all(staging)
        os.chmod(staging, stat.S_IMODE(os.stat(out).st_mode) if existed else 0o777 & ~_umask())
        _sync_tree(staging)
    except BaseException as exc:
        _remove_tree(staging)
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            raise OSError(exc.errno, f"{exc.strerror or exc} while writing the model folder {out}; "
                                     f"{'the folder is unchanged' if existed else 'nothing was written'}"
                                     f"{_room(exc)}") from None
        raise
    _swap(staging, out, existed)
    return out


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _room(exc: OSError) -> str:
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return ""
    return " (a folder export needs room for the new folder beside the old one: free that much, or remove the old folder first)"


def _folder_target(out: Path, force: bool) -> Path:
    """The folder an export to ``out`` replaces; BadInput if it may not be written."""
    out = Path(os.path.abspath(out))
    if out.is_symlink():
        if not force:
            raise BadInput(f"{out} is a symbolic link to {os.readlink(out)}",
                           forced="replace the folder it points at (the link stays)")
        out = Path(os.path.realpath(out))
    around = repository_around(out)
    if around is not None:
        raise InsideRepository(f"cannot write the model folder to {out}: it is inside the repository "
                               f"{around}, which mvc never writes into", path=out, repository=around)
    if out.exists() and not out.is_dir():
        raise BadInput(f"cannot write the model folder to {out}: it is a file")
    if not out.parent.is_dir():
        raise BadInput(f"cannot write {out}: folder {out.parent} does not exist")
    busy = out.is_dir() and any(out.iterdir())
    if busy and not force:
        raise BadInput(f"{out} already holds files", forced="replace the folder with the commit's "
                       "(files the commit does not hold are removed)")
    if busy:
        held = _repository_inside(out)
        if held is not None:
            raise InsideRepository(f"cannot replace the folder {out}: it holds the repository {held}, which "
                                   "the export would remove; export to another folder", path=out, repository=held)
        # a replace removes what the commit lacks: never the folder a user works in
        here = Path(os.path.abspath(os.getcwd()))
        if out == here or out in here.parents or os.path.lexists(out / ".git"):
            git = os.path.lexists(out / ".git")
            what = "holds a Git work tree" if git else "is the current folder or holds it"
            raise ProtectedFolder(f"cannot replace the folder {out}: it {what}, and a replace removes the files the "
                                  "commit does not hold; export to a new folder", path=out,
                                  reason="git-work-tree" if git else "current-folder")
    return out


def _repository_inside(root: Path) -> Optional[Path]:
    """A ``.mvc`` folder anywhere under ``root`` (links not followed), or None."""
    for here, dirs, _ in os.walk(root):
        if REPOSITORY_DIR in dirs or os.path.lexists(os.path.join(here, REPOSITORY_DIR)):
            return Path(here) / REPOSITORY_DIR
    return None


def _write_new(root: Path, name: str, write: Callable) -> None:
    """Create file ``name`` under the fresh folder ``root`` (never through a link) and write it."""
    path = root / name
    for parent in reversed(path.relative_to(root).parents[:-1]):
        try:
            os.mkdir(root / parent, 0o777)
        except FileExistsError:
            pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                 0o666)
    with os.fdopen(fd, "wb", buffering=0) as f:
        write(f)
        os.fsync(f.fileno())


def _sync_tree(root: Path) -> None:
    for here, _, _ in os.walk(root, topdown=False):
        fsync_dir(here)


_RENAME_EXCHANGE = 2


def _exchange():
    """renameat2(..., RENAME_EXCHANGE) where the C library has it (Linux), else None."""
    try:
        import ctypes
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _exchange()
_AT_FDCWD = -100


def _swap(staging: Path, out: Path, existed: bool) -> None:
    """Put the folder ``staging`` in the place of ``out`` with one rename; remove the old folder after."""
    if not existed:
        try:
            os.rename(staging, out)  # onto nothing (or an empty folder that appeared: rename replaces it)
        except OSError as exc:
            _remove_tree(staging)
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise BadInput(f"{out} appeared while the model folder was written; nothing was changed: "
                               "export again", forced="replace it") from None
            raise
    elif _RENAMEAT2 is not None and _RENAMEAT2(_AT_FDCWD, os.fsencode(staging), _AT_FDCWD, os.fsencode(out),
                                               _RENAME_EXCHANGE) == 0:
        pass  # staging now holds the old folder
    else:  # no atomic exchange here: the old folder steps aside, then the new one takes its name
        import ctypes
        if _RENAMEAT2 is not None and ctypes.get_errno() not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            err = ctypes.get_errno()
            _remove_tree(staging)
            raise OSError(err, f"{os.strerror(err)} while replacing the model folder {out}; it is unchanged")
        aside = out.with_name(f".{out.name}.old{os.getpid()}")
        os.rename(out, aside)
        try:
            os.rename(staging, out)
        except BaseException:
            os.rename(aside, out)
            _remove_tree(staging)
            raise
        os.rename(aside, staging)
    fsync_dir(out.parent)
    _remove_tree(staging)


def _remove_tree(root: Path) -> None:
    """Remove a folder mvc made (links inside are removed, never followed); nothing if it is gone."""
    if not os.path.lexists(root):
        return
    if os.path.islink(root) or not os.path.isdir(root):
        os.unlink(root)
        return
    for here, dirs, names in os.walk(root, topdown=False):
        for name in names:
            os.unlink(os.path.join(here, name))
        for name in dirs:
            path = os.path.join(here, name)
            os.unlink(path) if os.path.islink(path) else os.rmdir(path)
    os.rmdir(root)
