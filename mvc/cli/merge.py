"""Merging checkpoints: merge, average."""

import click

from ..errors import MergeDtypeRefused, MergeNotFinite, MergeRefused
from .audit import load_signer
from .base import Progress, echo_json, fail, human_bytes, main, open_repo, parse_pairs

STRATEGY_NAMES = ("average", "linear", "slerp", "task-arithmetic", "ties", "dare")


def _options(command):
    options = [
        click.option("--weights", metavar="W1,W2,...", default=None, help="One weight per input, in order."),
        click.option("--only", metavar="GLOB", default=None,
                     help="Merge only the keys matching GLOB (e.g. 'model.*'); the rest are left out."),
        click.option("-b", "--branch", metavar="NAME", default=None,
                     help="Commit on branch NAME (a new branch starts with the inputs as its parents); "
                          "default: the current branch."),
        click.option("-m", "--message", default=None, help="The merge commit's message."),
        click.option("--recipe", "recipe_file", metavar="FILE", type=click.Path(dir_okay=False), default=None,
                     help="A JSON or TOML recipe (strategy, weights, base, params, only, rules); flags win."),
        click.option("--json", "as_json", is_flag=True, help="Print the commit and the report as JSON."),
        click.option("-S", "--sign", "sign", is_flag=True, help="Sign the merge commit with the key in signing.key."),
        click.option("--signing-key", metavar="KEYFILE", default=None, help="Sign with this key file (implies -S)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@main.command()
@click.argument("revs", nargs=-1, required=True, metavar="REV...")
@click.option("-s", "--strategy", type=click.Choice(STRATEGY_NAMES), default=None,
              help="How tensors are merged (default: average).")
@click.option("--base", metavar="REV", default=None,
              help="The commit the inputs were fine-tuned from (task-arithmetic, ties, dare).")
@click.option("--param", "params", multiple=True, metavar="K=V",
              help="A strategy parameter (repeatable): t, density, normalize, rescale, consensus, seed.")
@_options
def merge(revs, strategy, base, params, weights, only, branch, message, recipe_file, as_json, sign=False,
          signing_key=None):
    """Merge the checkpoints at REV... (or A..B ranges) into a merge commit.

    The commit's parents are the branch's tip, then the inputs; it records
    the strategy, its parameters, the inputs and the base. Keys, dtypes and
    shapes are checked before any work; tensors are merged one at a time.
    """
    _run(revs, strategy, base, parse_pairs(params, "--param") or None, weights, only, branch, message,
         recipe_file, as_json, (sign, signing_key))


@main.command()
@click.argument("revs", nargs=-1, required=True, metavar="A..B | REV...")
@_options
def average(revs, weights, only, branch, message, recipe_file, as_json, sign=False, signing_key=None):
    """Average checkpoints: the commits of a range (e.g. main~4..main) or the REVs given."""
    _run(revs, "linear" if weights else "average", None, None, weights, only, branch, message,
         recipe_file, as_json, (sign, signing_key))


def _run(revs, strategy, base, params, weights, only, branch, message, recipe_file, as_json, signing=(False, None)):
    with open_repo() as repo:
        signer = load_signer(repo, *signing)  # before the progress bar: it may ask for a passphrase
        with Progress("merging") as bar:
            try:
                commit, report = repo.merge(revs, recipe_file, strategy=strategy, weights=weights, base=base,
                                            params=params, only=only, branch=branch, message=message,
                                            progress=bar, sign=signer)
            except MergeDtypeRefused as exc:
                fail(f"{exc}; leave them out (--only GLOB) or take them from one input (a recipe rule with "
                     "take = 0)")
            except MergeRefused as exc:
                fail(f"{exc}; merge the model alone (--only 'model.*') or take them from one input "
                     "(a recipe rule with take = 0)")
            except MergeNotFinite as exc:
                fail(f"{exc}; check --weights and --param, or take {exc.key} from one input (a recipe "
                     "rule with take = 0)")
    if as_json:
        echo_json({"commit": commit, "report": report})
        return
    where = commit.branch or "detached HEAD"
    click.echo(f"[{where} {commit.short_id}] {commit.message.splitlines()[0] if commit.message else ''}")
    click.echo(f" {len(report.inputs)} inputs, {report.strategy}: {report.tensors_merged} tensors merged, "
               f"{report.tensors_reused} reused, {report.tensors_taken} taken from one input; "
               f"{human_bytes(report.bytes_read)} read, {human_bytes(report.bytes_written)} new")
    if report.not_merged:
        shown = ", ".join(report.not_merged[:5]) + (f" and {len(report.not_merged) - 5} more"
                                                    if len(report.not_merged) > 5 else "")
        click.echo(f" not merged (not float; they differ, input 0's taken): {shown}")
