"""Mount commands: mount, umount (a read-only FUSE view of the repository), verify-model."""

import click

from .base import echo_json, human_bytes, main, open_repo, to_jsonable


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--rev", default=None, metavar="REV", help="Show only this revision's files at the top "
              "(the commit REV names now).")
@click.option("--json", "as_json", is_flag=True, help="Print what the mount served as JSON when it stops.")
def mount(directory, rev, as_json):
    """Show branches, tags and commits as read-only model folders in DIRECTORY.

    DIRECTORY/main/model.safetensors (or the commit's own model folder
    layout), DIRECTORY/tags/NAME/..., DIRECTORY/commits/ID/...: files are
    made as they are read, from verified chunks; nothing is copied first.
    Runs until 'mvc umount DIRECTORY' or Ctrl-C.
    """
    from .. import mount as mounting

    def ready(where):
        click.echo(f"mounted {'commit ' + pinned[:12] if rev else 'the repository'} at {where} "
                   f"(read-only); stop with 'mvc umount {where}' or Ctrl-C", err=True)

    with open_repo() as repo:
        pinned = repo.resolve(rev) if rev else None
        stats = mounting.mount(repo, directory, pinned, ready=ready)
    if as_json:
        echo_json(to_jsonable(stats))
        return
    click.echo(f"unmounted: served {human_bytes(stats.bytes_served)} in {stats.reads} reads from "
               f"{stats.chunks_read} verified chunks ({human_bytes(stats.chunk_bytes_read)})"
               + (f"; {stats.errors} reads failed (damage: run 'mvc fsck')" if stats.errors else ""))


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
def umount(directory):
    """Unmount an 'mvc mount' at DIRECTORY (also one a killed mount left behind)."""
    from .. import mount as mounting
    click.echo(f"unmounted {mounting.umount(directory)}")
