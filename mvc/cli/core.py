"""Core commands: init, commit, log, show, checkout, export, branch, tag, status."""

import dataclasses
import os
import time

import click

from .. import Repository, history
from ..files import FORMATS
from ..ondisk import DEFAULT_CHUNK_SIZE, MAX_WRITE_CHUNK
from ..errors import MvcError
from .audit import load_signer, signature_line
from .graph import Graph
from .base import (Progress, advice, echo_json, human_bytes, main, open_repo, parse_pairs, record_line, title,
                   to_jsonable)


# -- rendering helpers --------------------------------------------------------

def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(seconds))


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{'' if n == 1 else plural}"


def _decorations(repo) -> dict:
    """{commit id: ["HEAD -> main", "tag: v1", "origin/main", ...]} like git log's decorations."""
    shown = {"HEAD": "HEAD", "current": "HEAD -> {}", "branch": "{}", "tag": "tag: {}", "remote": "{}"}
    return {cid: [shown[kind].format(name) for kind, name in names]
            for cid, names in history.decorations(repo).items()}


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
    click.echo(f"Initialized empty mvc repository in {os.path.abspath(repo.dir)}")
    repo.close()


@main.command()
@click.argument("file", type=click.Path())
@click.option("-m", "--message", default=None,
              help="Commit message (default: one naming what was committed, e.g. 'Import a.pt: 12 tensors').")
@click.option("-b", "--branch", default=None,
              help="Branch to commit to (default: HEAD's); a new one forks from HEAD, and HEAD stays where it is.")
@click.option("--orphan", is_flag=True, help="Start a new --branch with a root commit (no parent).")
@click.option("--step", type=int, default=None, help="Training step of this checkpoint.")
@click.option("--epoch", type=int, default=None, help="Training epoch of this checkpoint.")
@click.option("--metric", "metrics", multiple=True, metavar="K=V", help="A metric (repeatable).")
@click.option("--context", "context", multiple=True, metavar="K=V", help="A context field (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the commit as JSON.")
@click.option("-S", "--sign", "sign", is_flag=True, help="Sign the commit with the key in signing.key.")
@click.option("--signing-key", metavar="KEYFILE", default=None,
              help="Sign with this OpenSSH Ed25519 private key file (implies -S).")
def commit(file, message, branch, orphan, step, epoch, metrics, context, as_json, sign=False, signing_key=None):
    """Commit the state in FILE (.pt/.pth/.bin/.ckpt or .safetensors), or a
    Hugging Face model folder (model.safetensors or its shards, config and
    tokenizer files)."""
    metrics = parse_pairs(metrics, "--metric")
    for key, value in metrics.items():  # bad usage (exit 2), as a malformed K=V is
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise click.BadParameter(f"{key}={value!r} is not a number", param_hint="--metric")
    context = parse_pairs(context, "--context")
    if orphan and branch is None:
        raise click.UsageError("--orphan starts a new branch: give it with --branch NEW")
    with open_repo() as repo, Progress("reading") as reading, \
            Progress("hashing", then="syncing to disk") as hashing:
        start = None if orphan or repo.head().id is None else "HEAD"
        if orphan and branch in {b.name for b in repo.branches()}:
            raise click.UsageError(f"--orphan starts a new branch, and {branch!r} exists")
        signer = load_signer(repo, sign, signing_key)
        c = repo.commit_file(file, message, step=step, epoch=epoch, metrics=metrics, context=context,
                             branch=branch, start=start, read_progress=reading, progress=hashing, sign=signer)
    if as_json:
        echo_json(c)
        return
    s = c.stats
    root = " (root-commit)" if not c.parents else ""  # a new branch, or a typo in --branch
    click.echo(f"[{c.branch or 'detached HEAD'}{root} {c.short_id}] {title(c)}")
    click.echo(f" {s.tensors} tensor{'' if s.tensors == 1 else 's'}, {human_bytes(s.bytes_total)}: {human_bytes(s.bytes_new)} new, "
               f"{human_bytes(s.bytes_reused)} shared with the repository "
               f"({s.chunks_new} of {s.chunks} chunks written)")
    if c.left_out:  # a folder's .mvc/, .git/, .cache/, FIFOs: said, not silently dropped
        shown = ", ".join(c.left_out[:5]) + (f" and {len(c.left_out) - 5} more" if len(c.left_out) > 5 else "")
        click.echo(f"note: left out of the model folder: {shown}", err=True)
    if c.hidden:  # .ssh/, .env ...: a secret must not go into history without a word
        shown = ", ".join(c.hidden[:5]) + (f" and {len(c.hidden) - 5} more" if len(c.hidden) > 5 else "")
        ignore = str(file).rstrip("/") + "/.mvcignore"
        click.echo(f"warning: this commit holds the folder's hidden files (or files linked from outside it) {shown}; "
                   f"to leave them out, list them "
                   f"in {ignore} (e.g. '.ssh/' or '.env') and commit again", err=True)


@main.command()
@click.argument("revs", nargs=-1, metavar="[REV | A..B]...")
@click.option("-n", "--max-count", type=click.IntRange(min=0), default=None, help="Show at most N commits.")
@click.option("--all", "all_refs", is_flag=True, help="Every commit any branch, tag, remote-tracking branch or HEAD reaches.")
@click.option("--graph", is_flag=True, help="Draw the history as a graph beside the commits.")
@click.option("--oneline", is_flag=True, help="One line per commit.")
@click.option("--json", "as_json", is_flag=True, help="Print commits as JSON.")
@click.option("--plot", "plot_to", nargs=2, metavar="METRIC FILE", default=None,
              help="Also draw METRIC across these commits into FILE (e.g. loss.png). "
                   "Needs matplotlib: pip install 'mvc-checkpoints[plot]'.")
@click.option("--show-signature", is_flag=True, help="Check and show each commit's signature.")
@click.option("--where", "where", multiple=True, metavar="METRIC<VALUE",
              help="Only commits whose metric passes, e.g. 'eval_loss<2.3' (< <= > >= == !=; repeat: all must pass).")
@click.option("--sort", "sort", metavar="[-]METRIC", default=None,
              help="Order by METRIC, lowest first ('-METRIC': highest first); 'mvc log --sort eval_loss -n 1' "
                   "is the best commit.")
def log(revs, max_count, all_refs, graph, oneline, as_json, plot_to, show_signature=False, where=(), sort=None):
    """Show the history from REV (default HEAD), newest first.

    A..B shows the commits B reaches and A does not (as in Git); --all
    starts from every branch, tag, remote-tracking branch (origin/main) and
    HEAD; several REVs show what any of them reaches. --where and --sort
    pick and order commits by their metrics (step and epoch too).
    """
    from .. import plot  # mvc.plot loads matplotlib only when it draws
    from .. import refs
    if plot_to:
        plot.require_matplotlib()  # fail before the work, not after it
        plot.check_image_path(plot_to[1])
    conditions = [history.parse_condition(text) for text in where]
    if (conditions or sort) and graph:
        raise click.UsageError("--graph draws history order; it does not go with --where or --sort")
    picking, limit = bool(conditions or sort), max_count
    if picking:
        max_count = None  # -n counts the commits that pass, in their new order
    include, exclude = [], []
    for rev in revs:
        span = refs.split_range(rev)
        if span:
            exclude.append(span[0])
            include.append(span[1])
        else:
            include.append(rev)
    with open_repo() as repo:
        if graph and not include and not all_refs and repo.head().id:
            include = ["HEAD"]  # a graph follows every parent, as git log --graph does
        if len(include) == 1 and not exclude and not all_refs and not graph:
            commits = list(repo.log(include[0], n=max_count))
        elif include or all_refs:
            commits = history.walk(repo, include, exclude, all_refs, max_count)
        else:
            commits = list(repo.log(None, n=max_count))
            if not commits and repo.head().id is None:
                _say_where_commits_are(repo)
        if picking:
            commits = history.select(commits, conditions, sort)[:limit]
        decorations = _decorations(repo)
        verdicts = {c.id: repo.trust.verify_commit(c.id) for c in commits} if show_signature else {}
    if plot_to:
        metric, path = plot_to
        title_of = " ".join(revs) or ("--all" if all_refs else "HEAD")
        written = plot.plot_metric(commits, metric, path, title=f"{metric} on {title_of}")
        click.echo(f"plot written to {written}", err=True)
    if as_json:
        echo_json([{**to_jsonable(c), "signature": to_jsonable(verdicts[c.id])} for c in commits]
                  if show_signature else commits)
        return
    drawing = Graph({c.id for c in commits}) if graph else None
    for i, c in enumerate(commits):
        text = _log_entry(c, decorations, oneline, verdicts.get(c.id))
        if drawing is None:
            for line in text + ([] if oneline else [""]):
                click.echo(line.rstrip())
            continue
        drawing.update(c)
        if i and not oneline:  # the blank line between two commits, drawn as Git does
            click.echo(drawing.padding().rstrip())
        *before, node = drawing.to_commit()
        lines = before + [node + text[0]] + [drawing.next_line() + line for line in text[1:]]
        for line in lines + drawing.remainder():
            click.echo(line.rstrip())


def _elsewhere(repo) -> str:
    """When HEAD's branch has no commits: where the commits are, and what to run ("" if nowhere)."""
    others = [b.name for b in repo.branches()]
    if not others:
        return ""
    return (f"branch '{repo.head().branch}' has no commits yet; the commits are on {', '.join(others)}: "
            f"'mvc log {others[0]}', or 'mvc checkout {others[0]}' to work there")


def _say_where_commits_are(repo) -> None:
    line = _elsewhere(repo)
    if line:
        click.echo(f"mvc: {line}", err=True)


def _log_entry(c, decorations, oneline: bool, verdict=None) -> list:
    """The lines of text ``mvc log`` shows for ``c``."""
    names = decorations.get(c.id)
    deco = f" ({', '.join(names)})" if names else ""
    deco += " [pruned]" if c.pruned else ""
    if oneline:
        record = record_line(c, beside=title(c))
        mark = f"[{verdict.status}] " if verdict is not None else ""
        return [f"{c.short_id}{deco} {mark}{record + '  ' if record else ''}{title(c) or '(no message)'}"]
    lines = [f"commit {c.id}{deco}"]
    lines += [f"Merge:  {' '.join(p[:12] for p in c.parents)}"] if len(c.parents) > 1 else []
    lines += [signature_line(verdict)] if verdict is not None else []
    lines += [f"Author: {c.author}", f"Date:   {_when(c.time)}"]
    if record_line(c):
        lines.append(f"Record: {record_line(c)}")
    lines.append("")
    return lines + [f"    {line}" for line in (c.message or "(no message)").splitlines()]


@main.command()
@click.argument("args", nargs=-1, metavar="[REF] | expire [REF]")
@click.option("-n", "--max-count", type=click.IntRange(min=0), default=None, help="Show at most N entries.")
@click.option("--expire", "older_than", default="now", metavar="SECONDS|now", show_default=True,
              help="With 'expire': delete entries older than SECONDS ('now': all of them).")
@click.option("--damaged", is_flag=True, help="With 'expire': delete only entries that cannot be read.")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def reflog(args, max_count, older_than, damaged, as_json):
    """Where REF (HEAD, a branch or a tag) pointed, newest first: REF@{N} names entry N.

    A commit that no branch reaches any more (after a checkout away from a
    detached HEAD, or a branch moved with --force) is still listed here, and
    gc keeps it while the reflog does. 'mvc reflog expire [REF]' deletes
    entries (of REF, or of every ref), as 'git reflog expire' does, so gc
    can reclaim what only they kept.
    """
    if args[:1] == ("expire",):
        _expire(args[1:], older_than, damaged, as_json)
        return
    if len(args) > 1:
        raise click.UsageError("give one REF, or 'expire [REF]'")
    ref = args[0] if args else "HEAD"
    with open_repo() as repo:
        entries = repo.reflog.entries(ref)[:max_count]
    if as_json:
        echo_json([dict(entry, selector=f"{ref}@{{{i}}}") for i, (_, entry) in enumerate(entries)])
        return
    for i, (_, e) in enumerate(entries):
        where = e["new"][:12] if e["new"] else "(deleted)   "
        click.echo(f"{where} {ref}@{{{i}}}: {e['message']}")


def _expire(refs_given, older_than: str, damaged: bool, as_json: bool) -> None:
    if len(refs_given) > 1:
        raise click.UsageError("'mvc reflog expire' takes at most one REF")
    if older_than == "now":
        seconds = None
    else:
        try:
            seconds = float(older_than)
        except ValueError:
            raise click.UsageError(f"--expire takes a number of seconds or 'now', not {older_than!r}") from None
    with open_repo() as repo:
        n = repo.reflog.expire(refs_given[0] if refs_given else None, seconds, damaged)
    if as_json:
        echo_json({"expired": n})
    else:
        click.echo(f"expired {n} reflog entr{'y' if n == 1 else 'ies'}; 'mvc gc' reclaims what only they kept")


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
    if len(c.parents) > 1:
        click.echo(f"Merge:  {' '.join(c.parents)}")
    elif c.parents:
        click.echo(f"Parent: {' '.join(c.parents)}")
    click.echo(f"Author: {c.author}")
    click.echo(f"Date:   {_when(c.time)}")
    if record_line(c):
        click.echo(f"Record: {record_line(c)}")
    click.echo()
    for line in (c.message or "(no message)").splitlines():
        click.echo(f"    {line}")
    context = dict(c.context)
    recipe = context.pop("merge", None) if isinstance(c.context.get("merge"), dict) else None
    if recipe is not None:
        _show_recipe(recipe)
    if context:
        click.echo("\nContext:")
        for key, value in _flat(context):
            click.echo(f"  {key}: {value}")
    if entries is not None:
        _show_entries(entries)


def _show_recipe(recipe: dict) -> None:
    """A merge commit's recipe (mvc/merge.py records it in the context under "merge")."""
    click.echo("\nRecipe:")
    params = ", ".join(f"{k}={v}" for k, v in sorted((recipe.get("params") or {}).items()))
    click.echo(f"  strategy: {recipe.get('strategy')}" + (f" ({params})" if params else ""))
    weights = recipe.get("weights") or []
    for i, input_id in enumerate(recipe.get("inputs") or []):
        weight = f"  weight {weights[i]:g}" if i < len(weights) and isinstance(weights[i], (int, float)) else ""
        click.echo(f"  input {i}: {str(input_id)[:12]}{weight}")
    if recipe.get("base"):
        click.echo(f"  base:    {str(recipe['base'])[:12]}")
    if recipe.get("only"):
        click.echo(f"  only:    {recipe['only']}")
    for rule in recipe.get("rules") or []:
        how = f"take input {rule['take']}" if "take" in rule else f"{rule.get('strategy')} {rule.get('params')}"
        click.echo(f"  rule:    {rule.get('keys')}: {how}")


def _entry_json(e) -> dict:
    if e.kind == "tensor":
        return {"key": e.key, "kind": "tensor", "dtype": e.dtype, "shape": list(e.shape),
                "nbytes": e.nbytes, "tensor_id": e.tensor_id, "chunks": len(e.chunks)}
    return {"key": e.key, "kind": "value", "value": e.value}


def _show_entries(entries) -> None:
    tensors = [e for e in entries if e.kind == "tensor"]
    total = sum(e.nbytes for e in tensors)
    click.echo(f"\nTree: {_count(len(tensors), 'tensor')}, {human_bytes(total)}")
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
                 help="Overwrite an existing output (through a symbolic link: the file it points at); "
                      "a model folder is replaced whole, files the commit lacks removed."),
    click.option("--only", metavar="GLOB", default=None,
                 help="Write only the keys matching GLOB (e.g. 'model.*') as a flat state dict."),
    click.option("--strip-prefix", metavar="PREFIX", default=None,
                 help="Take PREFIX (e.g. 'model.'; 'model' means the same) off every key written."),
]


def output_options(command):
    for option in reversed(_output_options):
        command = option(command)
    return command


@main.command()
@click.argument("rev", required=False)
@click.option("-b", "new_branch", metavar="NEW", default=None,
              help="Create branch NEW at REV (default HEAD) and switch to it.")
@click.option("-o", "--output", type=click.Path(), default=None,
              help="Write the checkpoint to this file (or model folder) instead of moving HEAD.")
@output_options
def checkout(rev, new_branch, output, fmt, force, only, strip_prefix):
    """Move HEAD to REV, or with -o write REV's checkpoint to a file.

    Leaving a detached HEAD whose commits no branch or tag reaches warns and
    says how to keep them (they stay in 'mvc reflog' meanwhile).

    The output is written under a temporary name and renamed into place, so
    an interrupted export leaves no partial file; an existing one is kept
    unless --force. A commit of a model folder is written back as that
    folder when -o names a folder (or has no suffix).
    """
    if rev is None and new_branch is None:
        raise click.UsageError("give a REV to check out (or -b NEW)")
    if output is None:
        if fmt or force or only or strip_prefix:
            raise click.UsageError("--format, --force, --only and --strip-prefix need -o/--output")
        with open_repo() as repo:
            before = repo.head()
            head = repo.checkout("HEAD" if rev is None else rev, new_branch=new_branch)
            lost = history.left_behind(repo, before.id) if before.branch is None and before.id else []
        _warn_left_behind(lost)
        if new_branch:
            click.echo(f"Switched to a new branch '{head.branch}' at {head.id[:12]}")
        else:
            click.echo(f"Switched to branch '{head.branch}'" if head.branch
                       else f"HEAD is now detached at {head.id[:12]}")
        # mvc has no working tree: a Git user expects the files to change here, and none did
        click.echo(f"No file was written; 'mvc checkout {rev or 'HEAD'} -o FILE' writes this checkpoint out.",
                   err=True)
        return
    if new_branch:
        raise click.UsageError("-b moves HEAD; it does not go with -o/--output")
    _export("HEAD" if rev is None else rev, output, fmt, force, only, strip_prefix)


def _warn_left_behind(lost) -> None:
    """Git's warning when HEAD leaves commits that nothing but the reflog reaches."""
    if not lost:
        return
    click.echo(f"Warning: you are leaving {_count(len(lost), 'commit')} behind, not connected to any "
               "branch or tag:", err=True)
    for c in lost[:5]:
        click.echo(f"  {c.short_id} {title(c)}", err=True)
    if len(lost) > 5:
        click.echo(f"  ... and {len(lost) - 5} more", err=True)
    click.echo(f"Keep them with a branch now: mvc branch NEW {lost[0].short_id} "
               "(until then 'mvc reflog' lists them)", err=True)


@main.command()
@click.argument("rev", default="HEAD")
@click.option("-o", "--output", type=click.Path(), required=True, help="File (or model folder) to write.")
@output_options
@click.option("--sign", "sign_key", type=click.Path(dir_okay=False), default=None, metavar="KEY",
              help="Write OUTPUT as a model folder signed with OpenSSF model signing (model.sig) by this PEM EC "
                   "private key; check it with 'mvc verify-model'.")
def export(rev, output, fmt, force, only, strip_prefix, sign_key):
    """Write REV's checkpoint to a .pt or .safetensors file (or a model folder); see checkout -o."""
    if sign_key is None:
        _export(rev, output, fmt, force, only, strip_prefix)
        return
    from ..exchange import export_signed
    if fmt is not None or only is not None or strip_prefix is not None:
        raise click.UsageError("--sign writes a whole model folder; it does not go with --format, --only or "
                               "--strip-prefix")
    with open_repo() as repo, Progress("reading") as reading, Progress("writing", then="syncing to disk") as writing:
        written, signed = export_signed(repo, rev, output, sign_key, progress=reading, force=force,
                                        write_progress=writing)
    click.echo(f"wrote {written.commit[:12]} to {signed.folder}/ and signed its {signed.files} files "
               f"({signed.signature.name}, OpenSSF model signing v1.0)")


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


def _ref_command(kind: str, name, rev, delete, force, protect, as_json, move=False, more=()) -> None:
    """What ``mvc branch`` and ``mvc tag`` share: list, create, protect, delete (and rename branches).
    With -d, every NAME given is deleted (``mvc branch -d a b c``), as Git does."""
    if delete:
        _delete_refs(kind, [n for n in (delete, name, rev, *more) if n is not None], force)
        return
    if more:
        raise click.UsageError(f"too many arguments: {' '.join(more)}")
    if move:
        if name is None or rev is None or delete:
            raise click.UsageError("-m takes OLD NEW: mvc branch -m OLD NEW")
        with open_repo() as repo:
            ref = repo.rename_branch(name, rev, force=force)
        click.echo(f"Renamed branch {name} to {ref.name} ({ref.id[:12]})")
        return
    with open_repo() as repo:
        existing = repo.branches() if kind == "branch" else repo.tags()
        if name is None:
            _list_refs(existing, repo.head().branch if kind == "branch" else None, as_json)
        elif protect is not None and rev is None and name in {r.name for r in existing}:
            ref = repo.set_protected(name, protect, kind)
            click.echo(f"{'Protected' if protect else 'Unprotected'} {kind} {ref.name}")
        else:
            create = repo.create_branch if kind == "branch" else repo.create_tag
            ref = create(name, "HEAD" if rev is None else rev, force=force, protect=protect)
            click.echo(f"{kind.capitalize()} {ref.name} at {ref.id[:12]}"
                       f"{' (protected)' if ref.protected else ''}")


def _delete_refs(kind: str, names: list, force: bool) -> None:
    """Delete each named branch or tag; one that cannot be deleted is said and the rest go on (exit 1)."""
    failed = False
    with open_repo() as repo:
        tags = {t.name: t.id for t in repo.tags()} if kind == "tag" else {}
        for name in dict.fromkeys(names):
            try:
                was = repo.delete_branch(name, force=force) if kind == "branch" else (
                    repo.delete_tag(name, force=force) or tags.get(name, ""))
            except MvcError as exc:
                click.echo(f"mvc: error: {advice(exc)}", err=True)
                failed = True
                continue
            click.echo(f"Deleted {kind} {name} (was {was[:12]})" if was else f"Deleted {kind} {name}")
    if failed:
        raise click.exceptions.Exit(1)


_REF_HELP = """With no NAME, list them. With NAME, point it at REV (default HEAD); with
--protect/--unprotect and no REV, change the protection of an existing one.
A protected {kind} is not moved or deleted without --force."""


@main.command(help="List branches, create NAME at REV, or delete them (-d NAME...).\n\n"
              + _REF_HELP.format(kind="branch"))
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.argument("more", nargs=-1, metavar="")
@click.option("-d", "--delete", "delete", metavar="NAME", default=None,
              help="Delete branch NAME, and every other NAME given, if HEAD reaches its tip.")
@click.option("-D", "force_delete", metavar="NAME", default=None,
              help="Delete branch NAME even if HEAD does not reach it (--delete --force).")
@click.option("-m", "--move", is_flag=True, help="Rename branch NAME to REV's place: mvc branch -m OLD NEW "
              "(its protection and reflog go with it; HEAD follows).")
@click.option("-f", "--force", is_flag=True, help="Move or delete even if protected or existing.")
@click.option("--protect/--unprotect", default=None, help="Protect NAME from moves and deletion.")
@click.option("--json", "as_json", is_flag=True, help="List branches as JSON.")
@click.option("-r", "--remotes", "remotes", is_flag=True, help="List remote-tracking branches (REMOTE/BRANCH).")
@click.option("-a", "--all", "all_", is_flag=True, help="List local and remote-tracking branches (remotes/REMOTE/BRANCH).")
def branch(name, rev, more, delete, move, force, protect, as_json, remotes=False, force_delete=None, all_=False):
    if force_delete is not None:
        delete, force = force_delete, True
    if (remotes or all_) and (name is not None or delete or move or protect is not None):
        raise click.UsageError("-r and -a list branches; they take no NAME and go with no -d, -m or --protect")
    if remotes:
        with open_repo() as repo:
            return _list_refs(repo.remotes.branches(), as_json=as_json)
    if all_:
        with open_repo() as repo:
            tracking = [dataclasses.replace(r, name="remotes/" + r.name) for r in repo.remotes.branches()]
            return _list_refs(repo.branches() + tracking, repo.head().branch, as_json)
    _ref_command("branch", name, rev, delete, force, protect, as_json, move, more)


@main.command(help="List tags, tag REV as NAME, or delete them (-d NAME...).\n\n" + _REF_HELP.format(kind="tag"))
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.argument("more", nargs=-1, metavar="")
@click.option("-d", "--delete", "delete", metavar="NAME", default=None,
              help="Delete tag NAME, and every other NAME given.")
@click.option("-f", "--force", is_flag=True, help="Move or delete even a protected tag.")
@click.option("--protect/--unprotect", default=None, help="Protect the tag from moves and deletion.")
@click.option("--json", "as_json", is_flag=True, help="List tags as JSON.")
@click.option("--keep-local/--no-keep-local", "keep_local", default=None,
              help="Keep the tag's chunks on this disk whatever the cache budget (as 'mvc cache pin').")
@click.option("-s", "--sign", "sign", is_flag=True, help="Make a signed tag with the key in signing.key.")
@click.option("--signing-key", metavar="KEYFILE", default=None, help="Sign with this key file (implies -s).")
@click.option("-m", "--message", default="", help="The signed tag's message.")
def tag(name, rev, more, delete, force, protect, as_json, keep_local=None, sign=False, signing_key=None, message=""):
    if keep_local is not None and (name is None or delete):
        raise click.UsageError("--keep-local takes a tag NAME: mvc tag NAME [REV] --keep-local")
    pin_only = False  # --keep-local alone on an existing tag only pins it
    if keep_local is not None and rev is None and protect is None:
        with open_repo() as repo:
            pin_only = name in {t.name for t in repo.tags()}
    if sign or signing_key is not None:
        if name is None or delete:
            raise click.UsageError("-s signs a new tag: mvc tag -s NAME [REV]")
        with open_repo() as repo:
            ref = repo.create_tag(name, "HEAD" if rev is None else rev, protect=protect, force=force,
                                  sign=load_signer(repo, sign, signing_key), message=message)
        click.echo(f"Signed tag {ref.name} at {ref.id[:12]}{' (protected)' if ref.protected else ''}")
    elif not pin_only:
        _ref_command("tag", name, rev, delete, force, protect, as_json, more=more)
    if keep_local is not None:
        with open_repo() as repo:
            repo.cache.pin(name, keep_local)
        click.echo(f"{'Keeping' if keep_local else 'No longer keeping'} tag {name}'s chunks on this disk "
                   f"{'whatever' if keep_local else 'beyond'} the cache budget")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def status(as_json):
    """Show where HEAD is, a bisect in progress, and what the repository holds."""
    with open_repo() as repo:
        s = repo.status()
        bisecting, bisect_data = _bisect_line(repo)
        remote_status = repo.cache.status()
        tracked = history.upstream(repo, s.head.branch) if s.head.branch and s.head.id else None
        elsewhere = _elsewhere(repo) if s.head.branch and not s.head.id else ""
        ahead, behind = history.ahead_behind(repo, "HEAD", tracked) if tracked else (0, 0)
    if as_json:
        out = to_jsonable(s)
        out["bisect"] = bisect_data
        out["upstream"] = {"ref": tracked, "ahead": ahead, "behind": behind} if tracked else None
        if remote_status.remote:
            out["remote"] = to_jsonable(remote_status)
        echo_json(out)
        return
    if s.head.branch:
        click.echo(f"On branch {s.head.branch}")
    else:
        click.echo(f"HEAD detached at {s.head.id[:12]}")
    if tracked:
        click.echo(_upstream_line(tracked, ahead, behind))
    click.echo(f"HEAD commit: {s.head.id[:12] if s.head.id else '(no commits yet)'}")
    if elsewhere:  # a script committed to its own branch in a new repository: say where
        click.echo(elsewhere[0].upper() + elsewhere[1:])
    if bisecting:
        click.echo(bisecting)
    click.echo(f"{_count(s.commits, 'commit')}, {_count(s.branches, 'branch', 'es')}, {_count(s.tags, 'tag')}")
    click.echo(f"{_count(s.chunks, 'chunk')} in {_count(s.packs, 'pack')}, {human_bytes(s.pack_bytes)} of packs "
               f"(chunk size {human_bytes(s.chunk_size)})")
    from .remote import status_lines  # local vs remote bytes, when a remote is configured
    for line in status_lines(remote_status):
        click.echo(line)


def _upstream_line(tracked: str, ahead: int, behind: int) -> str:
    """Git's words for a branch against its remote-tracking branch."""
    if ahead and behind:
        branch = tracked.split("/", 1)[1]
        return (f"Your branch and '{tracked}' have diverged, and have {ahead} and {behind} different commits "
                f"each, respectively ('mvc merge {branch} {tracked} -b {branch}' joins them)")
    if ahead:
        return f"Your branch is ahead of '{tracked}' by {_count(ahead, 'commit')} ('mvc push' to publish)"
    if behind:
        return f"Your branch is behind '{tracked}' by {_count(behind, 'commit')} ('mvc pull' to update)"
    return f"Your branch is up to date with '{tracked}'"


def _bisect_line(repo) -> tuple:
    """(one line, JSON data) on a bisect in progress, as git status says so; (None, None) if none."""
    if not repo.bisect.in_progress():
        return None, None
    try:
        b = repo.bisect.status()
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
