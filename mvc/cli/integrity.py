"""Integrity commands: fsck (and the chunk index rebuild), lock / unlock, gc."""

import shlex

import click

from .. import fsck as checks, gc as collection
from .base import plural, Progress, echo_json, human_bytes, main, open_repo, to_jsonable

SHOWN = 5  # ids listed per line before "and N more"


def _some(items, short: bool = False) -> str:
    shown = [i[:12] if short else i for i in items[:SHOWN]]
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(shown) + more


def _show_rebuild(r) -> None:
    click.echo(f"rebuilt the chunk index from {r.packs} pack{'' if r.packs == 1 else 's'}: {plural(r.chunks, 'chunk')} "
               f"(was {r.dropped}; {r.duplicates} duplicate records skipped)")
    for name, why in r.skipped:
        click.echo(f"  damaged {name}: {why}")
    if r.salvaged:
        click.echo(f"  saved {r.salvaged} verified chunk{'' if r.salvaged == 1 else 's'} from damaged packs "
                   "into a new sealed pack ('mvc gc' deletes the damaged ones)")


def _show_damage(d) -> None:
    click.echo(f"  {d.kind}: {d.object}: {d.detail}")
    for label, items, short in (("chunks", d.chunks, True), ("tensors", d.tensors, False),
                                ("commits", d.commits, True), ("refs", d.refs, False)):
        if items and not (label == "chunks" and len(items) == 1 and d.object.startswith("chunk")):
            click.echo(f"    {label}: {_some(list(items), short)}")
    if d.remotes:
        click.echo(f"    not lost: remote {', '.join(d.remotes)} lists a copy; 'mvc fsck --repair' restores it")
    elif d.spared:
        click.echo(f"    not lost for commits {_some(list(d.spared), True)}: a remote lists their own chunks; "
                   "'mvc fsck --repair' restores them")


def _show_report(rep, fates) -> None:
    verified = ("chunk data not re-hashed (--quick)" if rep.quick else
                f"re-hashed {human_bytes(rep.bytes_verified)} in {rep.seconds:.2f}s")
    click.echo(f"checked {plural(rep.commits, 'commit')}, {plural(rep.trees, 'tree')}, "
               f"{plural(rep.tensors, 'tensor')}, {plural(rep.chunks, 'chunk')} "
               f"in {plural(rep.packs, 'pack')}; {verified}")
    if rep.damage:
        click.echo(f"DAMAGE: {len(rep.damage)} problem{'' if len(rep.damage) == 1 else 's'}")
        for d in rep.damage:
            _show_damage(d)
    if rep.unreferenced:
        kept = [left for _, left in fates if left is not None]
        reclaimed = rep.unreferenced_bytes - sum(u.bytes for u, left in fates if left is not None)
        click.echo(f"unreferenced pack bytes (harmless): {human_bytes(rep.unreferenced_bytes)}; 'mvc gc' "
                   f"reclaims {human_bytes(reclaimed)}" + (" and keeps the rest, see below" if kept else ""))
        for u, left in fates:
            records = f", {u.records} record{'' if u.records == 1 else 's'}" if u.records else ""
            fate = "gc reclaims it" if left is None else f"gc keeps it: {left.why}"
            click.echo(f"  {u.kind}: {u.pack} ({human_bytes(u.bytes)}{records}): {fate}")
        for hint in _hints(kept):
            click.echo(f"  {hint}")
    if rep.leftovers:
        click.echo(f"left by killed commands (harmless; 'mvc gc' removes them): {', '.join(rep.leftovers)}")
    if rep.unverified:
        where = f"remote {rep.unverified_remote}" if rep.unverified_remote else "a remote"
        name = f" {rep.unverified_remote}" if rep.unverified_remote else ""
        click.echo(f"not verified here: {rep.unverified} reachable chunk{'' if rep.unverified == 1 else 's'} "
                   f"({human_bytes(rep.unverified_bytes)}) held only by {where}; 'mvc fsck --remote{name}' "
                   "verifies that remote, 'mvc fsck --fetch' reads them back and checks them")
    if rep.lost:
        click.echo("fsck found damage: the commits and refs listed above cannot be loaded intact")
    elif not rep.ok:
        click.echo("fsck found damage here, and a remote lists a copy of every damaged chunk, or of the "
                   "chunks of every commit it breaks: 'mvc fsck --repair' restores them")
    elif rep.unverified:
        click.echo("ok: no damage found in what was checked (the chunks above were not verified here)")
    else:
        click.echo("ok: no damage found")


@main.command()
@click.option("--quick", is_flag=True, help="Check structure only; do not re-hash chunk data.")
@click.option("--rebuild-index", is_flag=True, help="First rebuild the chunk index from the packs' trailers.")
@click.option("--prune-lost", is_flag=True, help="First mark the commits whose data is lost as pruned "
              "(their records stay; gc can run again).")
@click.option("--remote", "remote_name", metavar="NAME", default=None,
              help="Verify remote NAME's packs and refs instead (reads every pack).")
@click.option("--repair", is_flag=True, help="Refetch damaged or missing chunks and objects from remotes.")
@click.option("--fetch", "fetch_remote", is_flag=True,
              help="Also read back and re-hash the reachable chunks held only by the cached remote.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--read-subset", metavar="N/T", default=None,
              help="With --remote: re-hash only group N of T of the chunk packs (as restic's "
                   "--read-data-subset); run N = 1..T in turn to cover them all.")
@click.option("--budget", metavar="PERCENT|SECONDS", default=None,
              help="Verify only the next part of the packs (like 10%% or 30s), going on where the last "
                   "run stopped: any ceil(100/PERCENT) runs cover everything.")
@click.pass_context
def fsck(ctx, quick, rebuild_index, prune_lost, remote_name, repair, fetch_remote, as_json, budget=None,
         read_subset=None):
    """Verify every commit, tree, tensor and chunk reachable from refs and the reflog.

    Exits 1 when anything reachable is damaged or missing. Chunks held
    only by a remote (a lazy clone, an evicted cache) are listed as "not
    verified here" (exit 0) unless --fetch reads them back (exit 1 if it
    cannot).
    Unreferenced pack bytes are reported separately: they are harmless. Damage that cannot be
    repaired (no backup, no remote) blocks gc; --prune-lost marks the commits
    whose tensors are lost as pruned, as retention would, so the rest of
    the repository can be collected again. Damage a remote lists a copy of
    is not lost: --prune-lost spares it and --repair restores it.
    """
    if read_subset is not None and remote_name is None:
        raise click.UsageError("--read-subset N/T goes with --remote NAME")
    others = [flag for flag, on in (("--quick", quick), ("--rebuild-index", rebuild_index), ("--prune-lost", prune_lost),
                                    ("--remote", remote_name is not None), ("--repair", repair),
                                    ("--fetch", fetch_remote)) if on]
    if budget is not None and others:
        raise click.UsageError(f"--budget runs a scheduled scan on its own; it does not go with {', '.join(others)}")
    if remote_name is not None or repair:
        from .remote import fsck_remote_or_repair  # noqa: PLC0415  (the remote layer's commands)
        ctx.exit(fsck_remote_or_repair(remote_name, repair, as_json, read_subset))
    if budget is not None:
        from .audit import show_scan  # noqa: PLC0415  (the scheduled scan's rendering)
        with open_repo() as repo, Progress("verifying") as progress:
            report = repo.trust.scan(budget, progress=progress)
        show_scan(report, as_json)
        ctx.exit(0 if report.ok else 1)
    with open_repo() as repo:
        rebuilt = checks.rebuild_index(repo) if rebuild_index else None
        if prune_lost:
            lost = checks.prune_lost(repo)
            if not as_json:
                click.echo(f"marked {len(lost)} commit{'' if len(lost) == 1 else 's'} with lost data as pruned"
                           + (f": {', '.join(c[:12] for c in lost)}" if lost else ""))
        with Progress("verifying") as progress:
            report = repo.fsck(quick=quick, progress=progress)
        if fetch_remote and report.unverified:
            report = repo.cache.fsck_fetch(report)
        fates = [(u, collection.unreferenced_fate(repo.dir / "packs", u.kind, u.pack, u.records, u.bytes,
                                                     store=repo.chunks))
                 for u in report.unreferenced]  # None: a plain gc reclaims it; else why it keeps it
    if as_json:
        out = to_jsonable(report)
        out["ok"] = report.verified  # nothing damaged, and every reachable chunk verified
        out["damaged"] = not report.ok
        out["lost"] = bool(report.lost)  # damaged, and no remote lists a copy
        out["unreferenced_bytes"] = report.unreferenced_bytes
        out["gc_keeps"] = [to_jsonable(left) for _, left in fates if left is not None]
        if rebuilt is not None:
            out["rebuild"] = to_jsonable(rebuilt)
        echo_json(out)
    else:
        if rebuilt is not None:
            _show_rebuild(rebuilt)
        _show_report(report, fates)
    if not report.ok or (fetch_remote and not report.verified):  # not verified is not damage, unless
        ctx.exit(1)                                                 # --fetch was asked to verify it


# -- branch locks -------------------------------------------------------------

def _lock_line(lock) -> str:
    kind = "stale: its process is gone" if lock.stale else ("named" if lock.named else "process")
    return f"{lock.branch}\tlocked by {lock.describe()}  [{kind}]"


@main.command()
@click.argument("branch", required=False)
@click.option("--owner", metavar="NAME", help="Hold the lock as NAME (default: your commit author, "
              "$MVC_AUTHOR or user@host).")
@click.option("--list", "list_locks", is_flag=True, help="List every branch lock instead.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def lock(branch, owner, list_locks, as_json):
    """Lock BRANCH for writing, or list the locks (--list).

    The lock belongs to an owner name, not to this short-lived command: it
    holds until 'mvc unlock BRANCH' run as the same owner (with the same
    --owner NAME, if one was given), or 'mvc unlock --force BRANCH'. While it holds, commits to BRANCH by any other author
    fail with an error naming the holder; commits whose author is the owner
    go through. Locking a branch you already hold does nothing.

    Training runs lock their branch through the API (repo.locks.lock),
    which gives a lock that ends with their process.
    """
    if list_locks == bool(branch):
        raise click.UsageError("give a BRANCH to lock, or --list")
    with open_repo() as repo:
        if list_locks:
            held = repo.locks.list()
        else:
            held = [repo.locks.lock(branch, named=True, owner=owner)]
    if as_json:
        echo_json(held if list_locks else held[0])
    elif list_locks:
        for item in held:
            click.echo(_lock_line(item))
    else:
        release = f"mvc unlock {shlex.quote(branch)}" + (f" --owner {shlex.quote(owner)}" if owner else "")
        click.echo(f"locked branch {branch!r} for {held[0].owner}; '{release}' releases it")


@main.command()
@click.argument("branch")
@click.option("--owner", metavar="NAME", help="Release as NAME (default: your commit author).")
@click.option("--force", is_flag=True, help="Remove the lock whoever holds it (also a damaged one).")
def unlock(branch, owner, force):
    """Release BRANCH's write lock.

    Without --force only its owner may: the owner name of a lock taken with
    'mvc lock' (see --owner), the process of a lock taken by a training run,
    or anyone once that process has died on this host. Unlocking a branch
    that is not locked does nothing.
    """
    with open_repo() as repo:
        held = None if force else repo.locks.get(branch)
        repo.locks.unlock(branch, force=force, owner=owner)
    if force or held is not None:
        click.echo(f"unlocked branch {branch!r}")
    else:
        click.echo(f"branch {branch!r} was not locked")


# -- gc -----------------------------------------------------------------------

def _hints(left) -> list:
    """The commands that reclaim what gc keeps on purpose."""
    from ..gc import MOSTLY_LIVE, YOUNG
    hints = []
    young = [x for x in left if x.kind == YOUNG]
    mostly = [x for x in left if x.kind == MOSTLY_LIVE]
    if young:
        hints.append(f"'mvc gc --grace 0' also removes the {human_bytes(sum(x.bytes for x in young))} of young "
                     "files; run it only when no commit or training run is writing to this repository")
    if mostly:
        hints.append(f"'mvc gc --repack' rewrites every pack holding garbage and reclaims "
                     f"{human_bytes(sum(x.bytes for x in mostly))} more (it copies their live data)")
    return hints


def _show_gc(r) -> None:
    def did(past: str, future: str) -> str:
        return f"would {future}" if r.dry_run else past

    if r.pruned:
        click.echo(f"{did('pruned', 'prune')} {len(r.pruned)} commit{'' if len(r.pruned) == 1 else 's'}: "
                   f"{_some(list(r.pruned), short=True)}; {did('expired', 'expire')} {r.reflog_expired} "
                   "reflog entries")
    if r.skipped_branches:
        click.echo(f"left protected branches alone (--force prunes them too): {', '.join(r.skipped_branches)}")
    click.echo(f"{did('removed', 'remove')} {plural(r.commits_removed, 'commit')}, {plural(r.trees_removed, 'tree')}, "
               f"{plural(r.tensors_removed, 'tensor')}, {r.chunks_removed} chunk index entries")
    click.echo(f"packs: {did('deleted', 'delete')} {r.packs_deleted}, {did('rewrote', 'rewrite')} "
               f"{r.packs_rewritten} ({r.records_moved} live records moved), {did('removed', 'remove')} "
               f"{r.tmp_removed} stale .tmp files")
    if r.scratch_removed:
        click.echo(f"removed what killed commands left in .mvc: {', '.join(r.scratch_removed)}")
    for note in r.notes:
        click.echo(f"  {note}")
    for left in r.left:
        click.echo(f"  {did('kept', 'keep')} {left.pack} ({human_bytes(left.bytes)} of garbage): {left.why}")
    for hint in _hints(r.left):
        click.echo(f"  {hint}")
    about = "about " if r.dry_run else ""
    click.echo(f"on disk: {human_bytes(r.bytes_before)} -> {about}{human_bytes(r.bytes_after)} "
               f"({human_bytes(r.bytes_reclaimed)} reclaimed; packs {human_bytes(r.pack_bytes_before)} -> "
               f"{about}{human_bytes(r.pack_bytes_after)})")


@main.command()
@click.option("--keep-last", type=click.IntRange(min=1), metavar="N", help="Keep the last N commits of each branch's history.")
@click.option("--branch", metavar="B", help="Apply --keep-last / --keep-best to branch B only.")
@click.option("--keep-best", metavar="METRIC", help="Keep the best commits by METRIC (see --mode, --top).")
@click.option("--mode", type=click.Choice(["min", "max"]), default="min", show_default=True,
              help="Whether the best METRIC is the lowest or the highest.")
@click.option("--top", type=click.IntRange(min=1), default=1, show_default=True, metavar="K", help="How many best commits to keep.")
@click.option("--dry-run", is_flag=True, help="Report what would be removed; change nothing.")
@click.option("--force", is_flag=True, help="Also prune the history of protected branches.")
@click.option("--repack", is_flag=True,
              help="Rewrite every pack that holds garbage, not only those over a quarter garbage, "
                   "and merge small packs (under 32 MiB, one per commit) into one.")
@click.option("--grace", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Leave .tmp files and packs no index entry names alone while younger than this "
                   "(default 60: a running commit may still be writing them). 0 when no writer runs.")
@click.option("--expire-reflog", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="First delete reflog entries older than SECONDS (0: all), as 'mvc reflog expire' does.")
@click.option("--remote", "remote_name", metavar="NAME", default=None,
              help="Collect remote NAME instead: the same retention on its refs, then delete its packs "
                   "nothing there needs once older than --grace (default there 3600). Safe while others push.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def gc(keep_last, branch, keep_best, mode, top, dry_run, force, repack, grace, expire_reflog, remote_name, as_json):
    """Delete what no ref or reflog entry reaches, and reclaim its space on disk.

    Packs that hold nothing live are deleted; packs over a quarter garbage
    are rewritten (all packs holding garbage with --repack). Files a crash
    left (.tmp) are removed once older than the grace period (--grace).
    The report says what was kept on purpose and why. Commits wait while gc runs.

    Retention (--keep-last N and/or --keep-best METRIC) prunes old commits of
    every branch, or of --branch B: along each branch's first-parent history
    it keeps the last N commits and the K best by METRIC, and prunes the
    rest. A pruned commit keeps its id, message, metrics and place in
    history ('mvc log' still shows it), but its tensors are deleted and
    loading it fails with a message saying so (like 'git lfs prune').
    Never pruned: branch tips, tagged commits, the commit HEAD names, commits
    on the history of a branch outside --branch, and (without --force) the
    history of protected branches. Reflog entries pointing at pruned
    commits are expired. Pruning cannot be undone.
    """
    if remote_name is not None:
        return _gc_remote(remote_name, keep_last, branch, keep_best, mode, top, force, grace, dry_run, as_json)
    with open_repo() as repo:
        extra = {} if grace is None else {"grace": grace}
        report = repo.gc(keep_last=keep_last, branch=branch, keep_best=keep_best, mode=mode, top=top,
                         force=force, dry_run=dry_run, repack=repack, expire_reflog=expire_reflog, **extra)
    if as_json:
        out = to_jsonable(report)
        out["bytes_reclaimed"] = report.bytes_reclaimed
        echo_json(out)
    else:
        _show_gc(report)


def _gc_remote(name, keep_last, branch, keep_best, mode, top, force, grace, dry_run, as_json) -> None:
    with open_repo() as repo:
        r = repo.remotes.gc(name, keep_last=keep_last, branch=branch, keep_best=keep_best, mode=mode, top=top,
                           force=force, grace=grace, dry_run=dry_run)
    if as_json:
        echo_json(r)
        return
    would = "would " if r.dry_run else ""
    if r.pruned:
        click.echo(f"{would}prune {plural(len(r.pruned), 'commit')} on remote {r.remote}: "
                   f"{_some(list(r.pruned), short=True)}"
                   if r.dry_run else f"pruned {plural(len(r.pruned), 'commit')} on remote {r.remote}: "
                   f"{_some(list(r.pruned), short=True)}")
    click.echo(f"remote {r.remote}: "
               f"{would}{'delete' if r.dry_run else 'deleted'} {plural(len(r.packs_deleted), 'pack')} "
               f"nothing needs ({human_bytes(r.bytes_reclaimed)})")
    if r.young:
        click.echo(f"  kept {len(r.young)} such packs ({human_bytes(r.young_bytes)}) younger than the grace period: "
                   "a push may still be about to name them (--grace)")
    if r.mixed:
        click.echo(f"  kept {plural(r.mixed, 'pack')} whole that also hold records something needs")
    if r.unreadable:
        click.echo(f"  left {plural(len(r.unreadable), 'pack')} whose trailer cannot be read: "
                   f"'mvc remote repair {r.remote}'")
