"""mvc: Git for model checkpoints.

``mvc.Repository`` stores checkpoints as content-addressed chunks, so a new
save writes only the blocks that changed; commits carry the training record.
"""

from . import audit, dtypes, signing, traverse  # audit, signing: signed commits, audits, scheduled scans
from . import fsck, history, reader  # verbs that take a repository: mvc.reader.load_keys(repo, ...)
from .errors import (AmbiguousRevision, BadInput, ChecksumMismatch, CommitPruned, CorruptObject,
                     InvalidRefName, LockHeld, MvcError, NotARepository, ObjectNotFound, ProtectedRef,
                     RefConflict, RepositoryExists, UnknownRevision, UnsupportedFormat)
from .errors import BadRecipe, MergeError, MergeMismatch, MergeRefused  # merging (mvc/merge.py)
from .errors import MergeDtypeRefused, MergeNotFinite  # merging: dtypes without arithmetic, results out of range
from .errors import HashMismatch  # verified reads: chunk id, what and where (mvc/store/verify.py)
from .refs import check_name as check_ref_name  # the name rules, for callers that name refs (mvc_hooks.dcp)
from .records import Commit, CommitStats, Entry, Export, Head, Ref, Status
from .repository import Repository
from .sharded import ShardedTensor
from .store.chunks import batches  # cutting read work into bounded pieces, as loads do (used by mvc_hooks.dcp)
from .store.locks import BranchLock

__version__ = "0.1.0"

__all__ = [
    "Repository", "ShardedTensor", "BranchLock", "dtypes", "Commit", "CommitStats", "Entry", "Export", "Head", "Ref", "Status",
    "batches", "traverse", "MvcError", "AmbiguousRevision", "BadInput", "ChecksumMismatch", "CommitPruned", "CorruptObject",
    "InvalidRefName", "LockHeld", "NotARepository", "ObjectNotFound", "ProtectedRef",
    "RefConflict", "RepositoryExists", "UnknownRevision", "UnsupportedFormat", "__version__",
]
__all__ += ["BadRecipe", "MergeError", "MergeMismatch", "MergeRefused", "check_ref_name"]
__all__ += ["MergeDtypeRefused", "MergeNotFinite"]
__all__ += ["HashMismatch"]
__all__ += ["fsck", "history", "reader"]  # verb modules that take a repository (see the README, "What moved")
