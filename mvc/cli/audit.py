"""``mvc verify-commit``, ``mvc verify-tag``, ``mvc audit``, and what ``commit -S``,
``tag -s``, ``log --show-signature`` and ``fsck --budget`` share."""

import sys
import time

import click

from ..errors import SigningKeyError
from .base import echo_json, escaped, main, open_repo, plural, title, to_jsonable

MARKS = {"good": "Good", "bad": "BAD", "unknown": "Unknown-signer", "unsigned": "No"}


def shown(value) -> str:
    """``value`` as text with every control, format and line-separator character escaped, line
    breaks too: an author, message or context of a fetched commit is anyone's text, and raw it
    could add lines that read as another commit's verdict."""
    return escaped(str(value), keep="")


def load_signer(repo, sign: bool, key_path):
    """The SigningKey ``-S`` / ``--signing-key`` name (None without either); asks
    for the passphrase of an encrypted key on a terminal."""
    if not sign and key_path is None:
        return None
    from .. import audit
    want = key_path if key_path is not None else True
    try:
        return audit.signer(repo, want)
    except SigningKeyError as exc:
        if not exc.needs_passphrase or not sys.stdin.isatty():
            raise
        phrase = click.prompt(f"Passphrase for {exc.path}", hide_input=True, err=True)
        return audit.signer(repo, want, phrase)


def signature_line(v) -> str:
    """One line, in the manner of ``git log --show-signature``."""
    if v.status == "unsigned":
        return "No signature"
    who = f" from {shown(v.principal)}" if v.principal else ""
    key = f" with ED25519 key {v.key}" if v.key else ""
    why = f" ({shown(v.reason)})" if v.reason and v.status != "good" else ""
    return f"{MARKS[v.status]} signature{who}{key}{why}"


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(seconds))


@main.command("verify-commit")
@click.argument("revs", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.pass_context
def verify_commit(ctx, revs, as_json):
    """Check the signature of each REV (default HEAD) against signing.allowed-signers.

    Exits 1 unless every signature is good (a valid signature by an allowed signer).
    """
    with open_repo() as repo:
        verdicts = [repo.trust.verify_commit(rev) for rev in revs or ("HEAD",)]
    if as_json:
        echo_json([{**to_jsonable(v), "good": v.good} for v in verdicts])
    else:
        for v in verdicts:
            click.echo(f"commit {v.id}: {signature_line(v)}")
    if not all(v.good for v in verdicts):
        ctx.exit(1)


@main.command("verify-tag")
@click.argument("names", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.pass_context
def verify_tag(ctx, names, as_json):
    """Check the signature of signed tag NAME (made with 'mvc tag -s'). Exits 1 unless good."""
    with open_repo() as repo:
        verdicts = [repo.trust.verify_tag(name) for name in names]
    if as_json:
        echo_json([{**to_jsonable(v), "good": v.good} for v in verdicts])
    else:
        for v in verdicts:
            click.echo(f"tag {v.name} -> {v.target[:12]}: {signature_line(v)}")
            if v.tag_id:
                click.echo(f"  tagger {shown(v.tagger)}, {_when(v.time)}{': ' + shown(v.message) if v.message else ''}")
    if not all(v.good for v in verdicts):
        ctx.exit(1)


@main.command("audit")
@click.argument("rev", default="HEAD")
@click.option("--json", "as_json", is_flag=True, help="Emit the chain as JSON (for reviewers' tools).")
@click.option("--objects", is_flag=True, help="With --json: each commit's stored bytes (hex; BLAKE3 gives "
              "its id), signed payload (hex) and armored SSH signature, to check with b3sum and "
              "'ssh-keygen -Y verify -n mvc' without mvc.")
@click.pass_context
def audit_command(ctx, rev, as_json, objects):
    """The history from REV back to its roots: ids, parents, signers, times,
    training record, context highlights and each commit's signature verdict.

    Exits 1 unless every commit on it has a good signature.
    """
    from ..signing import armor
    with open_repo() as repo:
        report = repo.trust.audit(rev, objects=objects)
    if as_json:
        out = to_jsonable(report)
        out["ok"], out["counts"] = report.ok, report.counts
        for entry, e in zip(out["commits"], report.commits):
            entry["signature"]["good"] = e.signature.good
            entry["time_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.time)) if e.time else None
            for name in ("encoding", "payload", "sshsig"):
                if not objects:
                    entry.pop(name)
            if objects:
                entry["sshsig"] = armor(e.sshsig) if e.sshsig else None
        echo_json(out)
    else:
        _show_audit(report)
    if not report.ok:
        ctx.exit(1)


def _show_audit(report) -> None:
    n = len(report.commits)
    click.echo(f"audit of {report.rev} ({report.id}): {n} commit{'' if n == 1 else 's'} back to "
               f"{len(report.roots)} root{'' if len(report.roots) == 1 else 's'}; allowed signers: "
               f"{report.allowed_signers or '(none set: signing.allowed-signers)'}")
    for e in report.commits:
        click.echo("")
        click.echo(f"commit {e.id}{' [pruned]' if e.pruned else ''}")
        click.echo(f"  signature: {signature_line(e.signature)}")
        if not e.tree:
            continue
        click.echo(f"  parents:   {' '.join(e.parents) if e.parents else '(root)'}")
        click.echo(f"  author:    {shown(e.author)}, {_when(e.time)}")
        record = [f"{k} {v}" for k, v in (("step", e.step), ("epoch", e.epoch)) if v is not None]
        record += [f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(e.metrics.items())]
        if record:
            click.echo(f"  record:    {shown('  '.join(record))}")
        for k, v in sorted(e.highlights.items()):
            click.echo(f"  context:   {shown(k)} = {shown(v)}")
        click.echo(f"  message:   {shown(title(e))}")
    c = report.counts
    click.echo("")
    click.echo(f"{c['good']} good, {c['bad']} bad, {c['unknown']} unknown signer, {c['unsigned']} unsigned: "
               + ("every commit is signed by an allowed signer" if report.ok else "NOT every commit verifies"))


def show_scan(report, as_json: bool) -> None:
    """What ``mvc fsck --budget`` prints."""
    if as_json:
        out = to_jsonable(report)
        out["ok"] = report.ok
        echo_json(out)
        return
    from .base import human_bytes
    share = report.bytes_verified / report.bytes_total if report.bytes_total else 1.0
    click.echo(f"scan ({report.budget}): verified {plural(report.records, 'record')}, "
               f"{human_bytes(report.bytes_verified)} "
               f"of {human_bytes(report.bytes_total)} ({share:.0%}) in {report.packs} pack(s), "
               f"{report.seconds:.2f} s; next run starts at {report.cursor[0] or '(start)'}:{report.cursor[1]}")
    if report.unused:
        click.echo(f"passed over {report.unused} unused record(s), {human_bytes(report.unused_bytes)}, that the "
                   "chunk index does not point at (garbage: 'mvc gc' reclaims it)")
    if report.runs_to_cover:
        click.echo(f"any {report.runs_to_cover} consecutive runs at this budget verify every pack")
    for p in report.problems:
        click.echo(f"  {p.kind}: {p.pack}{' chunk ' + p.chunk[:12] if p.chunk else ''}: {p.detail}")
    click.echo("ok: no damage found in this part" if report.ok else
               "scan found damage: run 'mvc fsck' to see what it breaks, 'mvc fsck --repair' to fix it from a remote")
