"""Remote commands: remote, push, fetch, pull, clone, config, cache."""

import textwrap
from contextlib import contextmanager

import click

from .. import Repository
from ..errors import RemoteDamaged
from ..remote.backend import on_notice
from ..remote.verbs import SETTINGS
from .base import plural, Transfer, echo_json, fail, human_bytes, main, open_repo, to_jsonable


def _notice(message: str) -> None:
    click.echo(f"mvc: {message}", err=True)


on_notice(_notice)  # a remote's waits and retries are shown as they happen ("retry 2/5")


@contextmanager
def _advice():
    """A damaged remote's error, with the commands that check and heal it."""
    try:
        yield
    except RemoteDamaged as exc:
        fail(f"{exc}: 'mvc fsck --remote {exc.remote}' names what is lost; 'mvc remote repair {exc.remote}' "
             "in a repository that holds it uploads it again")


SHOWN = 5


def _short(hex_id) -> str:
    return hex_id[:12] if hex_id else "(none)"


def _ref_lines(updates) -> None:
    for u in updates:
        name = u.ref.split("/", 1)[1] if u.ref.startswith(("heads/", "tags/")) else u.ref
        if u.status in ("deleted", "pruned"):
            click.echo(f"  - {name:<24} {_short(u.old)} ({u.status})")
        elif u.status == "up to date":
            click.echo(f"  = {name:<24} {_short(u.new)} (up to date)")
        elif u.status == "new":
            click.echo(f"  * {name:<24} {_short(u.new)} (new)")
        elif u.status.startswith("not fetched"):
            click.echo(f"  ! {name:<24} {_short(u.new)} ({u.status})")
        else:
            mark = "+" if u.status == "forced" else " "
            click.echo(f"  {mark} {name:<24} {_short(u.old)}..{_short(u.new)}{' (forced)' if mark == '+' else ''}")


# -- remote ---------------------------------------------------------------------

@main.group(invoke_without_command=True)
@click.pass_context
def remote(ctx):
    """Manage remotes: list (default), add, remove, lock, unlock."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(remote_list)


@remote.command("add")
@click.argument("name")
@click.argument("url")
@click.option("--endpoint-url", default=None, metavar="URL",
              help="S3 endpoint (for S3-compatible stores such as SeaweedFS or MinIO); kept with the remote.")
def remote_add(name, url, endpoint_url):
    """Add remote NAME at URL: s3://BUCKET/PREFIX, file:///PATH or a folder path.

    Credentials come from the standard AWS configuration chain (AWS_*
    environment variables, ~/.aws profiles); they are never stored.
    """
    with open_repo() as repo:
        info = repo.remotes.add(name, url, endpoint_url)
    click.echo(f"added remote {info.name}: {info.url}" + (f" (endpoint {info.endpoint_url})" if info.endpoint_url else ""))


@remote.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def remote_list(as_json=False):
    """List the remotes."""
    with open_repo() as repo:
        items = repo.remotes.list()
    if as_json:
        echo_json(items)
        return
    for info in items:
        click.echo(f"{info.name}\t{info.url}" + (f"\t(endpoint {info.endpoint_url})" if info.endpoint_url else ""))


@remote.command("remove")
@click.argument("name")
def remote_remove(name):
    """Forget remote NAME and its tracking refs (the remote's data is untouched)."""
    with open_repo() as repo:
        repo.remotes.remove(name)
    click.echo(f"removed remote {name}")


@remote.command("lock")
@click.argument("name")
@click.argument("branch")
@click.option("--owner", default=None, help="Hold the lock as OWNER (default: your commit author).")
def remote_lock(name, branch, owner):
    """Lock BRANCH on remote NAME: pushes to it by anyone else are refused."""
    with open_repo() as repo:
        who = repo.remotes.lock(branch, name, owner)
    click.echo(f"locked branch {branch!r} on {name} for {who}")


@remote.command("unlock")
@click.argument("name")
@click.argument("branch")
@click.option("--force", is_flag=True, help="Remove the lock whoever holds it.")
@click.option("--owner", default=None, help="Release as OWNER (default: your commit author).")
def remote_unlock(name, branch, force, owner):
    """Release BRANCH's lock on remote NAME."""
    with open_repo() as repo:
        had = repo.remotes.unlock(branch, name, force, owner)
    click.echo(f"unlocked branch {branch!r} on {name}" if had else f"branch {branch!r} was not locked on {name}")


@remote.command("repair")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def remote_repair(name, as_json):
    """Heal remote NAME (default: origin) from this repository.

    Reads every pack of the remote; uploads again what its refs need that no
    intact pack holds and this repository holds intact, moves the intact
    records out of damaged packs, then removes the damaged and unreadable
    packs (a zero-byte one, say). Exits 1 if something stays unrepaired.
    """
    with open_repo() as repo:
        r = repo.remotes.repair(name)
    if as_json:
        out = to_jsonable(r)
        out["ok"] = r.ok
        echo_json(out)
    else:
        click.echo(f"checked {plural(r.packs_checked, 'pack')} of remote {r.remote}: "
                   f"{r.problems_before} damaged or missing; "
                   f"uploaded {plural(r.chunks_uploaded, 'chunk')} and {plural(r.objects_uploaded, 'object')} "
                   f"in {plural(r.packs_uploaded, 'pack')}, removed {len(r.packs_removed)} damaged packs")
        for key in r.packs_removed:
            click.echo(f"  removed {key}")
        if r.unrepaired:
            click.echo(f"no intact copy here of {len(r.unrepaired)} things the remote's refs need: "
                       f"{', '.join(i[:12] for i in r.unrepaired[:5])}{' ...' if len(r.unrepaired) > 5 else ''}; "
                       "repair from a repository that has them")
        else:
            click.echo("ok: the remote holds everything its refs need")
        for key in r.packs_kept:
            click.echo(f"  left damaged: {key}")
    if not r.ok:
        raise click.exceptions.Exit(1)


# -- push, fetch, pull, clone ---------------------------------------------------------

@main.command()
@click.argument("name", required=False, metavar="[REMOTE]")
@click.argument("refs", nargs=-1, metavar="[REF]...")
@click.option("-f", "--force", is_flag=True, help="Move remote refs even if that drops their commits.")
@click.option("-d", "--delete", is_flag=True, help="Delete the remote branches or tags REF... instead "
              "(also written ':REF').")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def push(name, refs, force, delete, as_json):
    """Send REFs (default: the current branch) to REMOTE (default: origin).

    Only the chunks and objects the remote lacks are sent, in packs; the
    remote's refs move last, by conditional writes: if someone else pushed
    meanwhile, the push is rejected and nothing they pushed is lost.
    'mvc push origin --delete exp' (or 'mvc push origin :exp') deletes
    branch exp on the remote and its tracking ref origin/exp here; the data
    goes at the next 'mvc gc --remote origin'.
    """
    if delete and not refs:
        raise click.UsageError("--delete needs the names of the remote branches or tags to delete")
    if name is not None and name.startswith(":"):
        name, refs = None, (name,) + tuple(refs)
    with open_repo() as repo, Transfer("sending") as progress:
        report = repo.remotes.push(name, () if delete else refs, force=force, delete=refs if delete else (),
                                   progress=progress)
    if as_json:
        echo_json(report)
        return
    if report.packs or any(u.status != "deleted" for u in report.refs):
        click.echo(f"to {report.remote}: {plural(report.commits, 'commit')}, "
                   f"{plural(report.objects, 'object')}, {plural(report.chunks, 'chunk')} "
                   f"({human_bytes(report.chunk_bytes)} of chunk data, {human_bytes(report.bytes_sent)} in "
                   f"{plural(report.packs, 'pack')})")
    else:
        click.echo(f"to {report.remote}:")
    _ref_lines(report.refs)


def _show_fetch(report) -> None:
    where = "left on the remote until read (cached remote)" if report.lazy else \
        f"{plural(report.chunks, 'chunk')}, {human_bytes(report.bytes_received)}"
    click.echo(f"from {report.remote}: {plural(report.objects, 'object')}; {where}")
    _ref_lines(report.refs)
    for ref in report.damaged_refs:
        click.echo(f"  ! {ref.split('/', 1)[1]:<24} left out: its object on the remote does not decode "
                   "('mvc push --force' replaces it)")
    if report.lost:
        click.echo(f"  ! {report.lost} chunk{'' if report.lost == 1 else 's'} that refs here need are neither here "
                   f"nor on {report.remote} (a branch deleted and collected there?): 'mvc fsck' names what they break")
    if report.pruned:
        click.echo(f"  {len(report.pruned)} commit{'' if len(report.pruned) == 1 else 's'} the remote's retention "
                   f"pruned, not whole here, now pruned here too: {', '.join(c[:12] for c in report.pruned[:5])}"
                   + (" ..." if len(report.pruned) > 5 else ""))


@main.command()
@click.argument("name", required=False, metavar="[REMOTE]")
@click.option("-p", "--prune", is_flag=True, help="Also remove REMOTE/BRANCH refs of branches REMOTE no longer has.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def fetch(name, prune, as_json):
    """Bring REMOTE's branches (as REMOTE/BRANCH) and what they need that is missing here."""
    with _advice(), open_repo() as repo, Transfer("receiving") as progress:
        report = repo.remotes.fetch(name, prune=prune, progress=progress)
    if as_json:
        echo_json(report)
    else:
        _show_fetch(report)


@main.command()
@click.argument("name", required=False, metavar="[REMOTE]")
@click.argument("branch", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def pull(name, branch, as_json):
    """fetch REMOTE, then fast-forward BRANCH (default: the current one) to REMOTE/BRANCH."""
    with _advice(), open_repo() as repo, Transfer("receiving") as progress:
        report = repo.remotes.pull(name, branch, progress=progress)
    if as_json:
        echo_json(report)
        return
    _show_fetch(report.fetch)
    if report.status == "up to date":
        click.echo(f"branch {report.branch} is up to date")
    else:
        click.echo(f"branch {report.branch}: {_short(report.old)}..{_short(report.new)} ({report.status})")


@main.command()
@click.argument("url")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--lazy", is_flag=True, help="Fetch metadata only; chunks come from the remote when a version is read.")
@click.option("--endpoint-url", default=None, metavar="URL", help="S3 endpoint for S3-compatible stores.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def clone(url, directory, lazy, endpoint_url, as_json):
    """Make DIRECTORY a new repository with the history of the remote at URL (as remote origin)."""
    with _advice(), Transfer("receiving") as progress, \
            Repository.clone(url, directory, lazy=lazy, endpoint_url=endpoint_url, progress=progress) as repo:
        head = repo.head()
        report = repo.cloned
    if as_json:
        echo_json({"fetch": to_jsonable(report), "head": to_jsonable(head)})
        return
    click.echo(f"cloned {url} into {directory}{' (lazy: metadata only)' if lazy else ''}")
    _show_fetch(report)
    if head.id:
        click.echo(f"on branch {head.branch} at {_short(head.id)}")


# -- settings and the cache -------------------------------------------------------------

def _config_help() -> str:
    known = "\n".join(textwrap.fill(f"{key}: {what}.", 76, subsequent_indent="    ") for key, what in SETTINGS.items())
    return ("Read or set a setting; with no KEY, list the settings that are set (KEY=VALUE).\n\n"
            f"\b\n{known}\n\n"
            "A budget never evicts chunks only here, nor those of HEAD, of a locked branch's tip, "
            "or of pinned refs ('mvc cache pin').")


@main.command(help=_config_help())
@click.argument("key", required=False)
@click.argument("value", required=False)
@click.option("--unset", is_flag=True, help="Remove the setting.")
@click.option("--json", "as_json", is_flag=True, help="With no KEY: print the settings as JSON.")
def config(key, value, unset, as_json):
    if key is None:
        if unset:
            raise click.UsageError("--unset takes the KEY to remove")
        with open_repo() as repo:
            found = repo.settings()
        if as_json:
            echo_json(found)
        for name, setting in ({} if as_json else found).items():
            click.echo(f"{name}={setting}")
        return
    with open_repo() as repo:
        out = repo.config(key, value, unset=unset)
    if value is None and not unset:
        if out is None:
            raise click.exceptions.Exit(1)
        click.echo(out)


@main.group()
def cache():
    """The local cache of a remote: status, evict, pin, unpin."""


@cache.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def cache_status(as_json):
    """Local vs remote bytes."""
    with open_repo() as repo:
        s = repo.cache.status()
    if as_json:
        echo_json(s)
        return
    for line in status_lines(s):
        click.echo(line)


def status_lines(s) -> list:
    if s.remote is None:
        return []
    budget = f", budget {human_bytes(s.budget)}" if s.budget is not None else ""
    return [f"local: {human_bytes(s.local_bytes)} of packs, {plural(s.local_chunks, 'chunk')}{budget}",
            f"remote {s.remote}: {plural(s.remote_chunks, 'chunk')}, {human_bytes(s.remote_bytes)} (as last listed); "
            f"{s.only_remote} reachable chunks only there, {s.only_local} only here (not pushed)"] + \
        ([f"{s.lost} reachable chunks neither here nor there (as last listed): 'mvc fsck' names what they break"]
         if s.lost else [])


@cache.command("evict")
@click.option("--max-bytes", default=None, metavar="SIZE", help="Evict down to SIZE (default: cache.max-bytes).")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def cache_evict(max_bytes, as_json):
    """Evict chunks that are safely on the cached remote until the packs fit the budget."""
    with open_repo() as repo:
        r = repo.cache.evict(max_bytes)
    if as_json:
        echo_json(r)
        return
    click.echo(f"evicted {plural(r.chunks_evicted, 'chunk')} ({plural(r.packs_evicted, 'pack')} deleted, "
               f"{r.packs_rewritten} rewritten): "
               f"{human_bytes(r.bytes_before)} -> {human_bytes(r.bytes_after)} (budget {human_bytes(r.budget)})")
    if r.kept_pinned or r.kept_local:
        click.echo(f"kept {plural(r.kept_pinned, 'chunk')} of pinned commits and {r.kept_local} not yet on the remote")
    if r.kept_garbage:
        click.echo(f"kept {plural(r.kept_garbage, 'chunk')} the remote holds only in packs its branches and tags "
                   "do not need (its gc may delete them)")
    if r.remote_ahead:
        click.echo(f"the remote's {', '.join(x.split('/', 1)[-1] for x in r.remote_ahead)} moved past what this "
                   "clone holds: what they reach is not known here, so nothing they may have left is evicted; "
                   "'mvc fetch' first")
    if r.kept_unverified:
        click.echo(f"kept {plural(r.kept_unverified, 'chunk')} whose remote copy is not intact (the local copy "
                   "is the last good one): 'mvc remote repair' uploads them again")
        for cid, key, why in r.unverified[:5]:
            click.echo(f"  chunk {cid[:12]} in {key}: {why}")


@cache.command("pin")
@click.argument("ref")
def cache_pin(ref):
    """Keep branch or tag REF's chunks local whatever the budget (keep-local)."""
    with open_repo() as repo:
        name = repo.cache.pin(ref, True)
    click.echo(f"pinned {name}")


@cache.command("unpin")
@click.argument("ref")
def cache_unpin(ref):
    """Let branch or tag REF's chunks be evicted again."""
    with open_repo() as repo:
        name = repo.cache.pin(ref, False)
    click.echo(f"unpinned {name}")


# -- fsck --remote / --repair (options of 'mvc fsck') ------------------------------------

def fsck_remote_or_repair(name, repair: bool, as_json: bool, read_subset=None) -> int:
    """Run 'mvc fsck --remote NAME' or 'mvc fsck --repair'; the exit code."""
    with open_repo() as repo:
        if repair:
            r = repo.cache.repair()
        else:
            r = repo.remotes.fsck(name, read_subset)
    if as_json:
        out = to_jsonable(r)
        out["ok"] = r.after.verified if repair else r.ok
        echo_json(out)
        return 0 if (r.after.ok if repair else r.ok) else 1  # not verified is not damage, as plain fsck
    if repair:
        click.echo(f"repaired {plural(r.chunks_repaired, 'chunk')} and {plural(r.objects_repaired, 'object')}"
                   + (f" from {', '.join(r.remotes)}" if r.remotes else ""))
        for remote, why in r.failed:
            click.echo(f"could not repair from remote {remote}: {why}")
        if r.unrepaired:
            click.echo(f"no remote holds {len(r.unrepaired)} of them: {', '.join(i[:12] for i in r.unrepaired[:5])}")
        if not r.after.ok:
            click.echo(f"damage remains: {len(r.after.damage)} problems (run 'mvc fsck' for details)")
        elif r.after.unverified:
            click.echo(f"no damage found here; {r.after.unverified} reachable chunks held only by remote "
                       f"{r.after.unverified_remote} were not verified ('mvc fsck --fetch' checks them)")
        else:
            click.echo("ok: no damage found")
        return 0 if r.after.ok else 1
    click.echo(f"checked remote {r.remote} ({r.url}): {plural(r.packs, 'pack')}, {plural(r.chunks, 'chunk')}, "
               f"{plural(r.objects, 'object')}, "
               f"{plural(r.refs, 'ref')}; re-hashed {human_bytes(r.bytes_verified)}")
    if r.subset:
        click.echo(f"read subset {r.subset}: {r.packs_trusted} chunk packs outside it were checked by their "
                   "trailers only, their records not re-hashed")
    for p in r.problems:
        click.echo(f"  {p.kind}: {p.object}: {p.detail}" + (f" (needed by {', '.join(p.refs)})" if p.refs else ""))
    if r.unreferenced:
        click.echo(f"unreferenced packs (harmless: a killed or rejected push, a deleted branch): "
                   f"{len(r.unreferenced)}, {human_bytes(sum(n for _, n in r.unreferenced))}; 'mvc gc --remote {r.remote}' reclaims them "
                   "once older than its grace period")
        for key, n in r.unreferenced[:SHOWN]:
            click.echo(f"  {key} ({human_bytes(n)})")
    click.echo("ok: no damage found" if r.ok else f"DAMAGE: {len(r.problems)} problems on remote {r.remote}")
    return 0 if r.ok else 1
