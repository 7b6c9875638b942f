"""mvc: Git for model checkpoints.

``mvc.Repository`` stores checkpoints as content-addressed chunks, so a new
save writes only the blocks that changed; commits carry the training record.
"""

from .api import Repository
from .errors import (AmbiguousRevision, BadInput, ChecksumMismatch, CorruptObject, InvalidRefName,
                     LockHeld, MvcError, NotARepository, ObjectNotFound, ProtectedRef, RefConflict,
                     RepositoryExists, UnknownRevision, UnsupportedFormat)
from .locks import BranchLock
from .repository import Commit, CommitStats, Entry, Head, Ref, Status

__version__ = "0.1.0"

__all__ = [
    "Repository", "BranchLock", "Commit", "CommitStats", "Entry", "Head", "Ref", "Status",
    "MvcError", "AmbiguousRevision", "BadInput", "ChecksumMismatch", "CorruptObject",
    "InvalidRefName", "LockHeld", "NotARepository", "ObjectNotFound", "ProtectedRef",
    "RefConflict", "RepositoryExists", "UnknownRevision", "UnsupportedFormat", "__version__",
]
