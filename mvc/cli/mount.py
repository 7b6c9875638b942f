"""Mount commands: mount, umount (a read-only FUSE view of the repository), verify-model."""

import click

from .base import echo_json, human_bytes, main, open_repo, to_jsonable


@main.command()
@click.argument("directory", metavar="DIRECTORY")  # not click.Path: it stats the path, which hangs on a stuck mount
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
@click.argument("directory", metavar="DIRECTORY")  # not click.Path: it stats the path, which hangs on a stuck mount
def umount(directory):
    """Unmount an 'mvc mount' at DIRECTORY (also one a killed mount left behind)."""
    from .. import mount as mounting
    click.echo(f"unmounted {mounting.umount(directory)}")


@main.command("verify-model")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--key", "public_key", type=click.Path(dir_okay=False), required=True, metavar="PUB",
              help="The PEM public key that pairs with the signer's private key.")
@click.option("--signature", type=click.Path(dir_okay=False), default=None,
              help="The signature file (default: DIRECTORY/model.sig).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def verify_model(directory, public_key, signature, as_json):
    """Check a model folder's OpenSSF model signature (OMS v1.0, key method, offline).

    Passes when PUB's key signed it and the folder holds exactly the signed
    files, byte for byte; says which mvc commit it came from when mvc signed it.
    """
    from .. import oms
    result = oms.verify_folder(directory, public_key, signature)
    if as_json:
        echo_json(to_jsonable(result))
        return
    origin = f"mvc commit {result.commit}" if result.commit else "no mvc commit named (signed by another tool)"
    click.echo(f"ok: {result.files} files of {result.folder}/ match the signature by {public_key}; {origin}")


@main.command("sign-model")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--key", "private_key", type=click.Path(dir_okay=False), required=True, metavar="KEY",
              help="The PEM EC private key (P-256, P-384 or P-521) to sign with.")
@click.option("--signature", type=click.Path(dir_okay=False), default=None,
              help="Where to write the signature (default: DIRECTORY/model.sig; give another path for a "
                   "folder of an 'mvc mount', which is read-only).")
@click.option("--commit", default=None, metavar="ID", callback=lambda ctx, param, value: _full_id(value),
              help="The full id of the mvc commit to name in the signature (default: the commit of a "
                   "DIR/commits/ID folder of an 'mvc mount').")
def sign_model(directory, private_key, signature, commit):
    """Sign a model folder with OpenSSF model signing (OMS v1.0, key method, offline).

    Every file's SHA-256 goes into the signature; 'mvc verify-model' or the
    reference 'model_signing verify key' checks it.
    """
    import os
    from pathlib import Path
    from .. import oms
    folder = directory
    if commit is None:  # a mounted revision folder: DIR/main resolves to DIR/commits/<id>
        real = Path(os.path.realpath(directory))
        if real.parent.name == "commits" and _is_full_id(real.name):
            # sign that folder, not the branch link: the link may move while the files are read,
            # and the signature would name one commit over another's files
            commit, folder = real.name, real
    signed = oms.sign_folder(folder, private_key, commit, signature=signature)
    named = f"; it names mvc commit {commit}" if commit else ""
    click.echo(f"signed {signed.files} files of {directory} in {signed.signature}{named}")


def _is_full_id(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _full_id(value):
    """--commit as given, if it is a full commit id: the signature names it and verify-model
    repeats it as the commit the folder came from, so a branch name or short id would mislead."""
    if value is not None and not _is_full_id(value):
        raise click.BadParameter(f"{value!r} is not a full commit id (64 hex digits, as 'mvc show' prints it)")
    return value
