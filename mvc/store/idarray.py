"""Id arrays: many 32-byte ids held as one numpy array, for walks over millions of chunks.

Vocabulary:

- **id array**: a numpy array of dtype ``S32``, one BLAKE3 id per element,
  32 bytes each (a Python ``bytes`` id costs about 100 bytes more, and a
  set or dict entry as much again). Numpy compares ``S32`` elements as
  whole 32-byte strings, which is the byte order LMDB keys sort in.
- **sorted id array**: ascending and without duplicates; membership is a
  binary search (``find``), and searching a batch that is itself sorted
  (a cursor's keys) is one merge-like pass.

Never read an element as ``arr[i]``: numpy strips trailing NUL bytes from
``S`` scalars, so an id ending in ``00`` would come back short. ``ids``
and ``one`` slice the raw buffer instead.
"""

from typing import Iterable

import numpy as np

ID = np.dtype("S32")
WIDTH = 32


def pack(ids: Iterable[bytes]) -> np.ndarray:
    """An id array of ``ids`` (each exactly 32 bytes), in their order."""
    ids = ids if isinstance(ids, list) else list(ids)
    raw = b"".join(ids)
    if len(raw) != WIDTH * len(ids):
        raise ValueError("every id must be 32 bytes")
    return np.frombuffer(raw, dtype=ID) if ids else np.empty(0, dtype=ID)


def ids(arr: np.ndarray) -> list:
    """The ids of ``arr`` as ``bytes``, in order."""
    raw = np.ascontiguousarray(arr).tobytes()
    return [raw[i:i + WIDTH] for i in range(0, len(raw), WIDTH)]


def one(arr: np.ndarray, i: int) -> bytes:
    """Element ``i`` of ``arr`` as ``bytes`` (all 32 of them)."""
    return arr[i:i + 1].tobytes()


def unique(arr: np.ndarray) -> tuple:
    """(sorted id array of ``arr``'s distinct ids, index in ``arr`` of each one's first occurrence)."""
    order = np.argsort(arr, kind="stable")  # stable: the first occurrence of an id comes first
    ordered = arr[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return ordered[first], order[first]


def find(sorted_ids: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """For each of ``needles``, its index in ``sorted_ids``, or -1 where it is not there."""
    pos = np.searchsorted(sorted_ids, needles)
    if not len(sorted_ids):
        return np.full(len(needles), -1, dtype=np.int64)
    hit = pos < len(sorted_ids)
    hit[hit] = sorted_ids[pos[hit]] == needles[hit]
    return np.where(hit, pos, -1)


def contains(sorted_ids: np.ndarray, cid: bytes) -> int:
    """Index of ``cid`` in ``sorted_ids``, or -1."""
    if len(cid) != WIDTH:
        return -1
    needle = np.frombuffer(cid, dtype=ID)
    return int(find(sorted_ids, needle)[0])
