"""Integrity commands: fsck (and the chunk index rebuild)."""

import click

from .base import echo_json, human_bytes, main, open_repo, progress_bar, to_jsonable

SHOWN = 5  # ids listed per line before "and N more"


def _some(items, short: bool = False) -> str:
    shown = [i[:12] if short else i for i in items[:SHOWN]]
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(shown) + more


def _show_rebuild(r) -> None:
    click.echo(f"rebuilt the chunk index from {r.packs} pack{'' if r.packs == 1 else 's'}: {r.chunks} chunks "
               f"(was {r.dropped}; {r.duplicates} duplicate records skipped)")
    for name, why in r.skipped:
        click.echo(f"  skipped {name}: {why}")


def _show_damage(d) -> None:
    click.echo(f"  {d.kind}: {d.object}: {d.detail}")
    for label, items, short in (("chunks", d.chunks, True), ("tensors", d.tensors, False),
                                ("commits", d.commits, True), ("refs", d.refs, False)):
        if items and not (label == "chunks" and len(items) == 1 and d.object.startswith("chunk")):
            click.echo(f"    {label}: {_some(list(items), short)}")


def _show_report(rep) -> None:
    verified = ("chunk data not re-hashed (--quick)" if rep.quick else
                f"re-hashed {human_bytes(rep.bytes_verified)} in {rep.seconds:.2f}s")
    click.echo(f"checked {rep.commits} commits, {rep.trees} trees, {rep.tensors} tensors, {rep.chunks} chunks "
               f"in {rep.packs} packs; {verified}")
    if rep.damage:
        click.echo(f"DAMAGE: {len(rep.damage)} problem{'' if len(rep.damage) == 1 else 's'}")
        for d in rep.damage:
            _show_damage(d)
    if rep.unreferenced:
        click.echo(f"unreferenced pack bytes (harmless; 'mvc gc' reclaims them): "
                   f"{human_bytes(rep.unreferenced_bytes)}")
        for u in rep.unreferenced:
            records = f", {u.records} records" if u.records else ""
            click.echo(f"  {u.kind}: {u.pack} ({human_bytes(u.bytes)}{records})")
    click.echo("ok: no damage found" if rep.ok else
               "fsck found damage: the commits and refs listed above cannot be loaded intact")


class _Progress:
    """fsck's progress callback: a bar on a terminal, drawn once the total is known."""

    def __init__(self):
        self.bar, self.done = None, 0

    def __call__(self, done: int, total: int) -> None:
        if self.done == 0:
            self.bar = progress_bar(total, "verifying")
            if self.bar is not None:
                self.bar.__enter__()
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)


@main.command()
@click.option("--quick", is_flag=True, help="Check structure only; do not re-hash chunk data.")
@click.option("--rebuild-index", is_flag=True, help="First rebuild the chunk index from the packs' trailers.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def fsck(ctx, quick, rebuild_index, as_json):
    """Verify every commit, tree, tensor and chunk reachable from refs and the reflog.

    Exits 1 when anything reachable is damaged or missing. Unreferenced pack
    bytes are reported separately: they are harmless.
    """
    with open_repo() as repo:
        rebuilt = repo.rebuild_index() if rebuild_index else None
        with _Progress() as progress:
            report = repo.fsck(quick=quick, progress=progress)
    if as_json:
        out = to_jsonable(report)
        out["ok"] = report.ok
        out["unreferenced_bytes"] = report.unreferenced_bytes
        if rebuilt is not None:
            out["rebuild"] = to_jsonable(rebuilt)
        echo_json(out)
    else:
        if rebuilt is not None:
            _show_rebuild(rebuilt)
        _show_report(report)
    if not report.ok:
        ctx.exit(1)


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
    holds until 'mvc unlock BRANCH' run as the same owner, or 'mvc unlock
    --force BRANCH'. While it holds, commits to BRANCH by any other author
    fail with an error naming the holder; commits whose author is the owner
    go through. Locking a branch you already hold does nothing.

    Training runs lock their branch through the API (repo.lock_branch),
    which gives a lock that ends with their process.
    """
    if list_locks == bool(branch):
        raise click.UsageError("give a BRANCH to lock, or --list")
    with open_repo() as repo:
        if list_locks:
            held = repo.locks()
        else:
            held = [repo.lock_branch(branch, named=True, owner=owner)]
    if as_json:
        echo_json(held if list_locks else held[0])
    elif list_locks:
        for item in held:
            click.echo(_lock_line(item))
    else:
        click.echo(f"locked branch {branch!r} for {held[0].owner}; 'mvc unlock {branch}' releases it")


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
        held = None if force else repo.branch_lock(branch)
        repo.unlock_branch(branch, force=force, owner=owner)
    if force or held is not None:
        click.echo(f"unlocked branch {branch!r}")
    else:
        click.echo(f"branch {branch!r} was not locked")
