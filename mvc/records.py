"""The records mvc's verbs return: commits, refs, tree entries, status.

Plain frozen dataclasses; ids are hex strings as the CLI prints them.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .traverse import format_path


@dataclass(frozen=True)
class CommitStats:
    """What a commit wrote: ``bytes_new`` went to a pack, the rest was reused."""

    tensors: int
    chunks: int
    chunks_new: int
    bytes_total: int
    bytes_new: int

    @property
    def bytes_reused(self) -> int:
        return self.bytes_total - self.bytes_new


@dataclass(frozen=True)
class Commit:
    id: str
    tree: str
    parents: tuple
    message: str
    author: str
    time: float  # seconds since the Unix epoch
    step: Optional[int] = None
    epoch: Optional[int] = None
    metrics: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)
    stats: Optional[CommitStats] = None  # what a new commit wrote (None when read back)
    pruned: bool = False  # retention deleted its tensors; its record stays in history
    branch: Optional[str] = None  # the branch a new commit moved (None when detached or read back)
    left_out: tuple = ()  # what a new commit of a model folder did not store (".mvc/", ".git/", a FIFO)
    hidden: tuple = ()  # hidden files a new commit of a model folder stored (".ssh/id_ed25519", ".env"), and
    # files linked from outside the folder

    @property
    def short_id(self) -> str:
        return self.id[:12]


@dataclass(frozen=True)
class Ref:
    name: str
    id: str
    protected: bool = False


@dataclass(frozen=True)
class Head:
    branch: Optional[str]  # None when HEAD is detached
    id: Optional[str]  # None on a branch with no commits yet


@dataclass(frozen=True)
class Entry:
    """One leaf of a commit's tree: a tensor or a plain value."""

    path: tuple
    kind: str  # "tensor" or "value"
    dtype: Optional[str] = None
    shape: Optional[tuple] = None
    nbytes: int = 0
    tensor_id: Optional[str] = None
    chunks: tuple = ()
    value: Any = None

    @property
    def key(self) -> str:
        return format_path(self.path)


@dataclass(frozen=True)
class Status:
    path: str
    head: Head
    branches: int
    tags: int
    commits: int
    chunks: int
    packs: int
    pack_bytes: int
    chunk_size: int


@dataclass(frozen=True)
class Export:
    """A checkpoint file (or model folder) written by ``Repository.export``."""

    commit: str
    path: Path
    format: str  # "pt", "safetensors" or "folder"
    left_out: int = 0  # plain values a safetensors file cannot hold
    folder_files: int = 0  # a model folder's other files: written ("folder"), else left out
    shards: int = 0  # safetensors files written into a model folder
