"""The storage layer: where bytes live, and nothing about what they mean above.

- ``fs``          opening files under ``.mvc`` without following links or
                  blocking on FIFOs; ``atomic_write``
- ``packformat``  the pack format from bytes, every version: parse and build
                  trailers, ``Location`` (no I/O)
- ``packs``       pack files: append-only chunk records sealed by a trailer
                  (``PackWriter``, ``PackReader``)
- ``index``       the LMDB environment: chunk locations, objects, refs,
                  reflog, locks (the only module that imports lmdb)
- ``chunks``      the chunk store seam (``ChunkStore``, an ABC; ``Forwarding``,
                  the base of decorators) and its local implementation over
                  packs and the index (``PackStore``)
- ``compact``     the one compaction: packs rewritten without their garbage,
                  records copied as they are (gc, repack, eviction)
- ``objectstore`` commits, trees and tensors by id, verified, with one
                  policy for missing and corrupt objects
- ``locks``       branch write locks (in the index) and the gc file lock
- ``holderfiles`` the flocked file a process lock's holder keeps open, which
                  tells its liveness to every process of the kernel

Above this layer: ``mvc.refs`` (revisions and ref moves), ``mvc.reach``
(reachability), ``mvc.repository`` (composition and the verbs).
"""
