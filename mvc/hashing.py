"""BLAKE3, the only hash mvc uses.

Ids of chunks and objects are 32-byte BLAKE3 digests. This is the only module
that imports ``blake3``. The hasher releases the GIL, so hashing chunks from a
thread pool uses every core.
"""

import blake3

DIGEST_SIZE = 32


def digest(data) -> bytes:
    """The 32-byte BLAKE3 digest of a bytes-like object (one thread)."""
    return blake3.blake3(data).digest()

