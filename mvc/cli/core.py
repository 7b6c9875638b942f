"""Core commands: init, commit, log, show, checkout, export, branch, tag, status."""

import time

import click

from .. import Repository
from ..files import FORMATS
from ..repository import DEFAULT_CHUNK_SIZE, MAX_WRITE_CHUNK
from ..errors import MvcError
from .base import (Progress, echo_json, human_bytes, main, open_repo, parse_pairs, record_line, title,
                   to_jsonable)


# -- rendering helpers --------------------------------------------------------

def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(seconds))


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{'' if n == 1 else plural}"


def _decorations(repo) -> dict:
    """{commit id: ["HEAD -> main", "tag: v1", ...]} like git log's decorations."""
    head = repo.head()
    out: dict = {}
    for ref in repo.branches():
        name = f"HEAD -> {ref.name}" if ref.name == head.branch else ref.name
        out.setdefault(ref.id, []).append(name)
    for ref in repo.tags():
        out.setdefault(ref.id, []).append(f"tag: {ref.name}")
    if head.branch is None and head.id:
        out.setdefault(head.id, []).insert(0, "HEAD")
    return out


def _flat(mapping: dict, prefix: str = "") -> list:
    """Nested metadata as (dotted key, value) pairs, for display."""
    items = []
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            items += _flat(v, key + ".")
        else:
            items.append((key, v))
    return items


# -- commands -------------------------------------------------------------------

@main.command()
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("--chunk-size", type=click.IntRange(1, MAX_WRITE_CHUNK), default=DEFAULT_CHUNK_SIZE,
              show_default=True, help="Bytes per chunk: smaller dedups finer, larger writes faster.")
def init(path, chunk_size):
    """Create an empty repository in PATH/.mvc."""
    repo = Repository.init(path, chunk_size=chunk_size)
    click.echo(f"Initialized empty mvc repository in {repo.dir}")
    repo.close()


@main.command()
@click.argument("file", type=click.Path())
@click.option("-m", "--message", default=None,
              help="Commit message (default: one naming what was committed, e.g. 'Import a.pt: 12 tensors').")
@click.option("-b", "--branch", default=None, help="Branch to commit to (default: HEAD's).")
@click.option("--step", type=int, default=None, help="Training step of this checkpoint.")
@click.option("--epoch", type=int, default=None, help="Training epoch of this checkpoint.")
@click.option("--metric", "metrics", multiple=True, metavar="K=V", help="A metric (repeatable).")
@click.option("--context", "context", multiple=True, metavar="K=V", help="A context field (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the commit as JSON.")
def commit(file, message, branch, step, epoch, metrics, context, as_json):
    """Commit the state in FILE (.pt/.pth/.bin/.ckpt or .safetensors), or a
    Hugging Face model folder (model.safetensors or its shards, config and
    tokenizer files)."""
    metrics = parse_pairs(metrics, "--metric")
    context = parse_pairs(context, "--context")
    with open_repo() as repo, Progress("reading") as reading, \
            Progress("hashing", then="syncing to disk") as hashing:
        c = repo.commit_file(file, message, step=step, epoch=epoch, metrics=metrics, context=context,
                             branch=branch, read_progress=reading, progress=hashing)
    if as_json:
        echo_json(c)
        return
    s = c.stats
    root = " (root-commit)" if not c.parents else ""  # a new branch, or a typo in --branch
    click.echo(f"[{c.branch or 'detached HEAD'}{root} {c.short_id}] {title(c)}")
    click.echo(f" {s.tensors} tensor{'' if s.tensors == 1 else 's'}, {human_bytes(s.bytes_total)}: {human_bytes(s.bytes_new)} new, "
               f"{human_bytes(s.bytes_reused)} shared with the repository "
               f"({s.chunks_new} of {s.chunks} chunks written)")


@main.command()
@click.argument("rev", required=False)
@click.option("-n", "--max-count", type=click.IntRange(min=0), default=None, help="Show at most N commits.")
@click.option("--oneline", is_flag=True, help="One line per commit.")
@click.option("--json", "as_json", is_flag=True, help="Print commits as JSON.")
@click.option("--plot", "plot_to", nargs=2, metavar="METRIC FILE", default=None,
              help="Also draw METRIC across these commits into FILE (e.g. loss.png). "
                   "Needs matplotlib: pip install 'mvc-checkpoints[plot]'.")
def log(rev, max_count, oneline, as_json, plot_to):
    """Show the history from REV (default HEAD), newest first."""
    from .. import plot  # mvc.plot loads matplotlib only when it draws
    if plot_to:
        plot.require_matplotlib()  # fail before the work, not after it
    with open_repo() as repo:
        commits = list(repo.log(rev, n=max_count))
        decorations = _decorations(repo)
    if plot_to:
        metric, path = plot_to
        written = plot.plot_metric(commits, metric, path, title=f"{metric} on {rev or 'HEAD'}")
        click.echo(f"plot written to {written}", err=True)
    if as_json:
        echo_json(commits)
        return
    for c in commits:
        names = decorations.get(c.id)
        deco = f" ({', '.join(names)})" if names else ""
        deco += " [pruned]" if c.pruned else ""
        if oneline:
            record = record_line(c, beside=title(c))
            click.echo(f"{c.short_id}{deco} {record + '  ' if record else ''}{title(c)}".rstrip())
            continue
        click.echo(f"commit {c.id}{deco}")
        click.echo(f"Author: {c.author}")
        click.echo(f"Date:   {_when(c.time)}")
        if record_line(c):
            click.echo(f"Record: {record_line(c)}")
        click.echo()
        for line in (c.message or "(no message)").splitlines():
            click.echo(f"    {line}")
        click.echo()


@main.command()
@click.argument("rev", default="HEAD")
@click.option("--tensors", "show_tensors", is_flag=True, help="List every tensor and value in the tree.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def show(rev, show_tensors, as_json):
    """Show a commit: its record, training context and (with --tensors) its tree."""
    with open_repo() as repo:
        c = repo.get_commit(rev)
        entries = repo.entries(c.id) if show_tensors and not c.pruned else None
    if as_json:
        out = {"commit": c}
        if entries is not None:
            out["entries"] = [_entry_json(e) for e in entries]
        echo_json(out)
        return
    click.echo(f"commit {c.id}{' [pruned: gc deleted its tensors, its record is kept]' if c.pruned else ''}")
    if c.parents:
        click.echo(f"Parent: {' '.join(c.parents)}")
    click.echo(f"Author: {c.author}")
    click.echo(f"Date:   {_when(c.time)}")
    if record_line(c):
        click.echo(f"Record: {record_line(c)}")
    click.echo()
    for line in (c.message or "(no message)").splitlines():
        click.echo(f"    {line}")
    if c.context:
        click.echo("\nContext:")
        for key, value in _flat(c.context):
            click.echo(f"  {key}: {value}")
    if entries is not None:
        _show_entries(entries)


def _entry_json(e) -> dict:
    if e.kind == "tensor":
        return {"key": e.key, "kind": "tensor", "dtype": e.dtype, "shape": list(e.shape),
                "nbytes": e.nbytes, "tensor_id": e.tensor_id, "chunks": len(e.chunks)}
    return {"key": e.key, "kind": "value", "value": e.value}


def _show_entries(entries) -> None:
    tensors = [e for e in entries if e.kind == "tensor"]
    total = sum(e.nbytes for e in tensors)
    click.echo(f"\nTree: {len(tensors)} tensors, {human_bytes(total)}")
    width = max([len(e.key) for e in entries] + [3])
    for e in entries:
        if e.kind == "tensor":
            shape = "x".join(map(str, e.shape)) or "scalar"
            click.echo(f"  {e.key:<{width}}  {e.dtype:<6} {shape:<16} {human_bytes(e.nbytes):>10}  "
                       f"{e.tensor_id[:12]}")
        else:
            click.echo(f"  {e.key:<{width}}  = {e.value!r}")


_output_options = [
    click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
                 help="File format (default: from the suffix of --output, else pt)."),
    click.option("-f", "--force", is_flag=True,
                 help="Overwrite an existing output (through a symbolic link: the file it points at)."),
    click.option("--only", metavar="GLOB", default=None,
                 help="Write only the keys matching GLOB (e.g. 'model.*') as a flat state dict."),
    click.option("--strip-prefix", metavar="PREFIX", default=None,
                 help="Take PREFIX (e.g. 'model.') off every key written."),
]


def output_options(command):
    for option in reversed(_output_options):
        command = option(command)
    return command


@main.command()
@click.argument("rev")
@click.option("-o", "--output", type=click.Path(), default=None,
              help="Write the checkpoint to this file (or model folder) instead of moving HEAD.")
@output_options
def checkout(rev, output, fmt, force, only, strip_prefix):
    """Move HEAD to REV, or with -o write REV's checkpoint to a file.

    The output is written under a temporary name and renamed into place, so
    an interrupted export leaves no partial file; an existing one is kept
    unless --force. A commit of a model folder is written back as that
    folder when -o names a folder (or has no suffix).
    """
    if output is None:
        if fmt or force or only or strip_prefix:
            raise click.UsageError("--format, --force, --only and --strip-prefix need -o/--output")
        with open_repo() as repo:
            head = repo.checkout(rev)
        click.echo(f"Switched to branch '{head.branch}'" if head.branch else f"HEAD is now detached at {head.id[:12]}")
        return
    _export(rev, output, fmt, force, only, strip_prefix)


@main.command()
@click.argument("rev", default="HEAD")
@click.option("-o", "--output", type=click.Path(), required=True, help="File (or model folder) to write.")
@output_options
def export(rev, output, fmt, force, only, strip_prefix):
    """Write REV's checkpoint to a .pt or .safetensors file (or a model folder); see checkout -o."""
    _export(rev, output, fmt, force, only, strip_prefix)


def _export(rev, output, fmt, force, only, strip_prefix):
    with open_repo() as repo, Progress("reading") as reading, Progress("writing", then="syncing to disk") as writing:
        written = repo.export(rev, output, fmt, progress=reading, force=force, only=only,
                              strip_prefix=strip_prefix, write_progress=writing)
    if written.format == "folder":
        size = sum(p.stat().st_size for p in written.path.rglob("*") if p.is_file())
        click.echo(f"wrote {written.commit[:12]} to {written.path}/ (model folder: "
                   f"{_count(written.shards, 'safetensors file')}, {_count(written.folder_files, 'other file')}, "
                   f"{human_bytes(size)})")
        return
    click.echo(f"wrote {written.commit[:12]} to {written.path} ({written.format}, "
               f"{human_bytes(written.path.stat().st_size)})")
    if written.left_out:
        click.echo(f"note: {_count(written.left_out, 'plain value')} left out: safetensors holds only "
                   "tensors (export as pt to keep them)", err=True)
    if written.folder_files:
        click.echo(f"note: the model folder's {_count(written.folder_files, 'other file')} (config, tokenizer) "
                   "left out; -o DIR writes the whole folder", err=True)


def _list_refs(items, current=None, as_json=False):
    if as_json:
        echo_json(items)
        return
    for ref in items:
        mark = "*" if ref.name == current else " "
        flag = "  [protected]" if ref.protected else ""
        click.echo(f"{mark} {ref.name:<24} {ref.id[:12]}{flag}")


def _ref_command(kind: str, name, rev, delete, force, protect, as_json) -> None:
    """What ``mvc branch`` and ``mvc tag`` share: list, create, protect, delete."""
    with open_repo() as repo:
        existing = repo.branches() if kind == "branch" else repo.tags()
        if delete:
            (repo.delete_branch if kind == "branch" else repo.delete_tag)(delete, force=force)
            click.echo(f"Deleted {kind} {delete}")
        elif name is None:
            _list_refs(existing, repo.head().branch if kind == "branch" else None, as_json)
        elif protect is not None and rev is None and name in {r.name for r in existing}:
            ref = repo.set_protected(name, protect, kind)
            click.echo(f"{'Protected' if protect else 'Unprotected'} {kind} {ref.name}")
        else:
            create = repo.create_branch if kind == "branch" else repo.create_tag
            ref = create(name, rev or "HEAD", force=force, protect=protect)
            click.echo(f"{kind.capitalize()} {ref.name} at {ref.id[:12]}"
                       f"{' (protected)' if ref.protected else ''}")


_REF_HELP = """With no NAME, list them. With NAME, point it at REV (default HEAD); with
--protect/--unprotect and no REV, change the protection of an existing one.
A protected {kind} is not moved or deleted without --force."""


@main.command(help="List branches, create NAME at REV, or delete one with -d.\n\n"
              + _REF_HELP.format(kind="branch"))
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.option("-d", "--delete", "delete", metavar="NAME", default=None, help="Delete branch NAME.")
@click.option("-f", "--force", is_flag=True, help="Move or delete even if protected or existing.")
@click.option("--protect/--unprotect", default=None, help="Protect NAME from moves and deletion.")
@click.option("--json", "as_json", is_flag=True, help="List branches as JSON.")
def branch(name, rev, delete, force, protect, as_json):
    _ref_command("branch", name, rev, delete, force, protect, as_json)


@main.command(help="List tags, tag REV as NAME, or delete one with -d.\n\n" + _REF_HELP.format(kind="tag"))
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.option("-d", "--delete", "delete", metavar="NAME", default=None, help="Delete tag NAME.")
@click.option("-f", "--force", is_flag=True, help="Move or delete even a protected tag.")
@click.option("--protect/--unprotect", default=None, help="Protect the tag from moves and deletion.")
@click.option("--json", "as_json", is_flag=True, help="List tags as JSON.")
def tag(name, rev, delete, force, protect, as_json):
    _ref_command("tag", name, rev, delete, force, protect, as_json)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def status(as_json):
    """Show where HEAD is, a bisect in progress, and what the repository holds."""
    with open_repo() as repo:
        s = repo.status()
        bisecting, bisect_data = _bisect_line(repo)
    if as_json:
        out = to_jsonable(s)
        out["bisect"] = bisect_data
        echo_json(out)
        return
    if s.head.branch:
        click.echo(f"On branch {s.head.branch}")
    else:
        click.echo(f"HEAD detached at {s.head.id[:12]}")
    click.echo(f"HEAD commit: {s.head.id[:12] if s.head.id else '(no commits yet)'}")
    if bisecting:
        click.echo(bisecting)
    click.echo(f"{_count(s.commits, 'commit')}, {_count(s.branches, 'branch', 'es')}, {_count(s.tags, 'tag')}")
    click.echo(f"{_count(s.chunks, 'chunk')} in {_count(s.packs, 'pack')}, {human_bytes(s.pack_bytes)} of packs "
               f"(chunk size {human_bytes(s.chunk_size)})")


def _bisect_line(repo) -> tuple:
    """(one line, JSON data) on a bisect in progress, as git status says so; (None, None) if none."""
    from .. import bisect as bisect_api
    if not bisect_api.in_progress(repo):
        return None, None
    try:
        b = bisect_api.status(repo)
    except MvcError as exc:
        return f"You are bisecting, but its state cannot be read ({exc})", {"error": str(exc)}
    if b.first_bad is not None:
        where = f"first bad commit found: {b.first_bad.short_id}"
    elif b.suspects:
        where = f"only skipped commits are left ({len(b.suspects)} suspects)"
    else:
        where = f"{_count(b.remaining, 'commit')} left to judge, next {b.candidate.short_id}"
    data = {"good": b.good, "bad": b.bad, "remaining": b.remaining,
            "candidate": b.candidate.id if b.candidate else None,
            "first_bad": b.first_bad.id if b.first_bad else None, "suspects": list(b.suspects)}
    return (f"You are bisecting (good {b.good[:12]}, bad {b.bad[:12]}): {where}; "
            "'mvc bisect log' shows it, 'mvc bisect reset' ends it"), data
