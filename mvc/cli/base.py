"""The ``mvc`` command group and what every command shares.

Commands parse options, call one API function, and render its result. Only
this package prints. Expected errors (``MvcError``, OS errors such as a full
disk) become one line on stderr and exit 1; usage errors exit 2; no Python
traceback reaches the user for them.
"""

import dataclasses
import json
import os
import sys

import click

from ..errors import MvcError


class Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MvcError as exc:
            fail(str(exc))
        except BrokenPipeError:  # the reader went away (mvc log | head): stop quietly, like git
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except OSError as exc:
            fail(f"{exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}")
        except KeyboardInterrupt:
            click.echo("mvc: interrupted", err=True)
            sys.exit(130)


def fail(message: str, code: int = 1):
    click.echo(f"mvc: error: {message}", err=True)
    sys.exit(code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mvc", prog_name="mvc")
@click.option("-C", "directory", default=".", metavar="PATH", help="Run as if started in PATH.")
@click.pass_context
def main(ctx, directory):
    """mvc: Git for model checkpoints."""
    if directory != ".":
        try:  # like git -C: every path on the command line is then relative to it
            os.chdir(directory)
        except OSError as exc:
            fail(f"cannot change to {directory}: {exc.strerror}")


def open_repo():
    """The repository the command runs in: the current directory or a parent's."""
    from .. import Repository
    return Repository.open(".")


def to_jsonable(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return out
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    return value


def echo_json(value) -> None:
    click.echo(json.dumps(to_jsonable(value), indent=2, sort_keys=False))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class Progress:
    """A ``progress(done, total)`` callback for the API: a click bar on a
    terminal (stderr), drawn once the total is known; nothing when piped."""

    def __init__(self, label: str):
        self.label, self.bar, self.done = label, None, 0

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None and sys.stderr.isatty() and total > 0:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr)
            self.bar.__enter__()
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)


def parse_pairs(pairs, what: str) -> dict:
    """``k=v`` options into a dict; values become int, float, bool or stay text."""
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint=what)
        out[key] = parse_value(raw)
    return out


def parse_value(raw: str):
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(raw.lower(), raw)


def number(value) -> str:
    """A metric or value as people read it: floats to 6 significant digits."""
    if value is None:
        return "-"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def record_line(c) -> str:
    """A commit's step, epoch and metrics on one line."""
    parts = [f"{name} {value}" for name, value in (("step", c.step), ("epoch", c.epoch)) if value is not None]
    parts += [f"{k}={number(v)}" for k, v in sorted(c.metrics.items())]
    return "  ".join(parts)


def title(c) -> str:
    """The first line of a commit's message."""
    return c.message.splitlines()[0] if c.message else ""
