"""Storage commands: repack (dense records)."""

import click

from .base import Progress, echo_json, human_bytes, main, open_repo, to_jsonable


@main.command()
@click.option("--depth", type=click.IntRange(min=0, max=8), default=None, metavar="K",
              help="Deltas a read may follow at most (0: no deltas; default 8).")
@click.option("--dry-run", is_flag=True, help="Report what would be encoded; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def repack(depth, dry_run, as_json):
    """Store live chunks densely: byte-grouped zstd, or deltas against the parent commit's chunk.

    Only where it pays; reads verify every record as before. Runs like gc:
    no commit runs meanwhile. The repository then needs an mvc that knows
    the encoded-records format extension.
    """
    with open_repo() as repo:
        with Progress("repacking") as progress:
            r = repo.repack(depth=depth, dry_run=dry_run, progress=progress)
    if as_json:
        echo_json(to_jsonable(r))
        return
    verb = "would encode" if dry_run else "encoded"
    click.echo(f"{verb} {r.chunks} raw chunks: {r.grouped} byte-grouped zstd, {r.deltas} deltas, {r.raw} left raw")
    saved = r.bytes_before - r.bytes_after
    share = r.bytes_after / r.bytes_before if r.bytes_before else 1.0
    click.echo(f"stored bytes: {human_bytes(r.bytes_before)} -> {human_bytes(r.bytes_after)} ({share:.3f}x, "
               f"{human_bytes(saved)} saved); packs deleted {r.packs_deleted}, rewritten {r.packs_rewritten}")
