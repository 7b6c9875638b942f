"""Compaction: the one place packs are rewritten without their garbage (gc, repack, eviction).

Vocabulary:

- **kept record**: a record of a pack being rewritten that is still wanted;
  it is copied as it is (raw, or encoded: grouped or a delta, never
  re-encoded), proven to decode to its id before it is written.
- **dropped entry**: an index entry to delete in the same transaction (an
  evicted chunk, whose copy lives on the remote).

Order, each step harmless to interrupt:

1. the kept records go to one new pack, sealed and fsynced;
2. one index write transaction points every kept chunk whose entry still
   names the record it named at its copy, and deletes the dropped entries
   that still name the record they named (a concurrent change wins); the
   new pack's index is registered there and the rewritten packs' indexes
   unregistered (a pack index locates the chunks its pack holds);
3. the rewritten packs and the other files to remove are deleted, the
   folder fsynced (packs whose index is registered are unregistered in a
   transaction of their own before the first of them goes).

A crash between steps leaves only unreferenced packs that the next gc
deletes. A pack with a kept record that cannot be read verified is left
whole (its garbage stays, and so does the last copy of that record); the
report notes it. The caller holds the exclusive gc lock.
"""

import os
from dataclasses import dataclass
from typing import Iterable

from ..errors import MvcError
from .fs import fsync_dir
from .packindex import collect, pidx_path
from .packs import PACK_NAME, forget_trailer_views, pack_filename


@dataclass(frozen=True)
class Compacted:
    moved: int = 0  # records copied into the new pack
    rewritten: tuple = ()  # names of the packs rewritten (and deleted)
    removed: int = 0  # other files deleted
    notes: tuple = ()  # packs left whole, and why


def compact(store, index, rewrite: list, drop: Iterable = (), remove: Iterable = (), via=None) -> Compacted:
    """Rewrite ``rewrite`` [(pack name, [(id, Location) kept])] of PackStore ``store``; see the
    module doc. Kept records are read and written through ``via`` (default ``store``)."""
    drop, remove, via = list(drop), list(remove), via or store
    # dead files go first: on a full disk they are the room the new pack needs
    removed = _unlink(store, index, remove)
    batch, moves, done, notes = via.writer(), [], [], []
    try:
        with index.read() as txn:
            for name, keep in rewrite:
                copied = _copy(via, txn, batch, name, keep, notes)
                if copied is not None:
                    moves += copied
                    done.append(name)
        batch.seal()
    except BaseException:
        batch.abort()
        raise
    new = batch.locations
    gone = [pack_filename(name) for name in done]
    if moves or drop or _registered(index, gone):
        with index.write() as txn:
            now = {cid: txn.chunk(cid) for cid in new}
            # the new pack's index, where it has one, locates what moved: no entry per chunk; each
            # of its records that did not move (a concurrent change, a pack left whole) keeps
            # the location it had
            registered = batch.register(txn)
            moved = {cid for cid, old in moves if now[cid] == old}
            for cid in new:
                if cid in moved:  # with the pack registered, an entry only where it says otherwise
                    txn.put_chunk(cid, new[cid], overwrite=True)
                elif registered:
                    txn.set_chunk(cid, now[cid])
            for cid, old in drop:
                if txn.chunk(cid) == old:
                    txn.delete_chunk(cid)
            txn.unregister_packs(_names(gone))  # committed before the first unlink below
    _unlink(store, None, gone)
    return Compacted(len(moves), tuple(done), removed, tuple(notes))


def _names(fnames: list) -> list:
    """The pack names of those of ``fnames`` that are sealed packs' file names."""
    return [bytes.fromhex(m.group(1)) for m in map(PACK_NAME.fullmatch, fnames) if m]


def _registered(index, fnames: list) -> bool:
    names = _names(fnames)
    if not names:
        return False
    with index.read() as txn:
        return any(name in {n for _, n, _ in txn.registered_packs()} for name in names)


def _unlink(store, index, names: list) -> int:
    """Delete ``names`` from the pack folder (durably), a sealed pack's index with it; returns how
    many were there. With ``index``, the packs among them whose index is registered are taken out
    of the chunk index first, in a transaction that commits before the first unlink."""
    if not names:
        return 0
    if index is not None and _registered(index, names):
        with index.write() as txn:
            txn.unregister_packs(_names(names))
    store.packs.close()  # no descriptor may keep a deleted pack's space
    forget_trailer_views(store.directory / fname for fname in names)
    removed = 0
    for fname in names:
        try:
            os.unlink(store.directory / fname)
            removed += 1
        except FileNotFoundError:
            pass
    for name in _names(names):
        try:
            os.unlink(pidx_path(store.directory, name))
        except FileNotFoundError:
            pass
    collect(store.directory)  # multi-pack indexes that name a deleted pack
    fsync_dir(store.directory)
    return removed


def _copy(store, txn, batch, name: bytes, keep: list, notes: list):
    """[(id, old Location)] of ``keep`` copied into ``batch``; None (a note said why) if one cannot be read."""
    moves = []
    for cid, _ in keep:
        try:
            loc, payload = store.read_stored(cid, txn)
        except MvcError as exc:  # records already copied become garbage in the new pack
            notes.append(f"{pack_filename(name)} not rewritten: {exc}")
            return None
        batch.add_record(cid, payload, loc.kind, loc.size, loc.depth, loc.base)
        moves.append((cid, loc))
    return moves
