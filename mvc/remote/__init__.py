"""Remotes and tiers: history kept in object storage, the local disk as a bounded cache of it.

- ``backend``    the object-store interface (get, ranged get, conditional
                 put, list, delete); the bottom of this package
- ``bucket``     a folder implementation, and ``open_bucket`` by URL
- ``s3``         the S3 implementation (the only module that imports boto3)
- ``layout``     the remote's keys and bytes: packs, object packs, refs
- ``catalogue``  what a remote holds and where, as last listed (derived)
- ``transfer``   verified ranged reads of packs; packing and uploading
- ``config``     remote and cache settings in the index's meta database
- ``sync``       push, fetch, pull, clone
- ``tiers``      ``CacheStore`` (a decorator over a ``ChunkStore`` and a
                 remote) and eviction under a budget
- ``check``      ``fsck --remote`` and ``fsck --repair``
- ``verbs``      the verb groups ``repo.remotes`` (``Remotes``) and
                 ``repo.cache`` (``Cache``), and ``setting`` (``repo.config``)

Everything here is reached through those groups (and ``Repository.clone``);
only ``mvc/cli/remote.py`` prints.
"""
