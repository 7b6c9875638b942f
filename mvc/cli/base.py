"""The ``mvc`` command group and what every command shares.

Commands parse options, call one API function, and render its result. Only
this package prints. Expected errors (``MvcError``, OS errors such as a full
disk) become one line on stderr and exit 1; usage errors exit 2. Anything
else is a bug in mvc: one line naming the exception, a request to report
it, and exit 70 (``EX_SOFTWARE``). No Python traceback ever reaches the
user; ``MVC_TRACEBACK=1`` in the environment shows it for a bug report.
"""

import dataclasses
import difflib
import json
import os
import re
import shlex
import sys
import time
import unicodedata

import click

from ..errors import (BisectEndMisjudged, BisectFinished, BisectInProgress, BisectStateDamaged, BisectStopped,
                      BranchLocked, CommitPruned, CorruptObject, Diverged, HashMismatch, HeadMissing, LockDamaged,
                      MergeMismatch, MetricNotRecorded, MvcError, NoBisect, NotARepository, NotConfigured,
                      NotRegular, ObjectNotFound, PackDamaged, ProtectedRef, ReaderClash, RefExists, RefRejected,
                      RemoteCorrupt, RemoteDamaged, RemoteExists, ScanFoundDamage, SigningKeyError, UnknownRemote,
                      UnmergedBranch, VerdictContradicts, WalkDamaged)


# The commands by what they are for, as 'git help' groups its own; the order within a group is
# the order a user meets them. A command not named here is listed under "other commands".
COMMAND_GROUPS = (
    ("start a repository", ("init", "clone")),
    ("record checkpoints and look at them", ("commit", "status", "log", "show", "diff", "best", "checkout", "export",
                                             "reflog", "mount", "umount")),
    ("branches, tags and merging", ("branch", "tag", "merge", "average")),
    ("find a regression", ("bisect",)),
    ("share with remotes", ("remote", "push", "fetch", "pull", "cache", "config")),
    ("keep it safe and small", ("fsck", "gc", "repack", "lock", "unlock")),
    ("audit and signatures", ("audit", "verify-commit", "verify-tag", "sign-model", "verify-model")),
    ("in the browser", ("serve",)),
)


def first_sentence(text: str) -> str:
    """A command's help up to its first full stop: whole words, never cut mid-sentence."""
    text = " ".join((text or "").split("\n\n")[0].split())
    end = re.search(r"(?<!\.)(?<!e\.g)(?<!i\.e)\.\s", text)  # not "REV... (" nor "(e.g. main~4)"
    return text if end is None else text[:end.start() + 1]


def escaped(text: str, keep: str = "\n\t") -> str:
    """``text`` with control, format and line-separator characters written as escapes
    (``\\x1b``), but those in ``keep``: a commit's author, message, record or a tensor's key
    is anyone's text (a fetched commit, a folder's file names), and raw on a terminal it could
    move the cursor, retitle the window or forge lines of mvc's own output."""
    plain = text
    for c in keep:
        plain = plain.replace(c, "")
    if plain.isprintable():  # the common case, checked in C: nothing to escape
        return text
    return "".join(c if c in keep or not (unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp"))
                   else c.encode("unicode_escape").decode("ascii") for c in text)


class EscapedStream:
    """Standard output as the commands see it: every write escaped (``escaped``), the rest of the
    stream (its buffer, encoding, isatty) as it is. One seam for every command's text."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("a text stream")  # click asks whether this is a binary stream so
        return self._stream.write(escaped(text))

    def __getattr__(self, name):
        return getattr(self._stream, name)


class Group(click.Group):
    def format_commands(self, ctx, formatter):
        """The commands in groups (COMMAND_GROUPS), each with its first sentence."""
        names = [n for n in self.list_commands(ctx) if not self.get_command(ctx, n).hidden]
        grouped = [(title, [n for n in members if n in names]) for title, members in COMMAND_GROUPS]
        listed = {n for _, members in grouped for n in members}
        grouped.append(("other commands", [n for n in names if n not in listed]))
        for title, members in grouped:
            if members:
                with formatter.section(title[0].upper() + title[1:]):
                    formatter.write_dl([(n, first_sentence(self.get_command(ctx, n).help or "")) for n in members])

    def invoke(self, ctx):
        plain, sys.stdout = sys.stdout, EscapedStream(sys.stdout)
        try:
            return self._invoke(ctx)
        finally:
            sys.stdout = plain

    def _invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # one line, like every other error
            where = exc.ctx.command_path if exc.ctx is not None else "mvc"
            fail(f"{exc.format_message().rstrip('.')}; see '{where} --help'", 2)
        except MvcError as exc:
            fail(advice(exc))
        except BrokenPipeError:  # the reader went away (mvc log | head): stop quietly, like git
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except OSError as exc:
            fail(f"{exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}")
        except KeyboardInterrupt:
            click.echo("mvc: interrupted", err=True)
            sys.exit(130)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise  # click's own ways to stop (--help, a declined prompt)
        except Exception as exc:  # a bug: say what, never a traceback
            if os.environ.get("MVC_TRACEBACK"):
                raise
            fail(f"internal error: {type(exc).__name__}: {str(exc)[:300] or 'no message'} (a bug in mvc; "
                 "please report it with the command you ran, and MVC_TRACEBACK=1 shows the traceback)", BUG)


def advice(exc: MvcError) -> str:
    """The error's message, and what to run about it: the library says what went wrong
    (a type with attributes), only the CLI names commands."""
    if exc.forced:  # the library says what force=True would do; here that is --force
        return f"{exc.summary}; pass --force to {exc.forced}"
    text = str(exc)
    if "'mvc " in text:  # the message already says which command
        return text
    hint = next((hint(exc) for kind, hint in HINTS if isinstance(exc, kind)), "")
    return f"{text}; {hint}" if hint else text


def _lock_hint(exc: BranchLocked) -> str:
    b = exc.branch
    if exc.remote is not None:
        return f"ask them to run 'mvc remote unlock {exc.remote} {b}'"
    if exc.named:
        # the owner's own 'mvc unlock' matches by author; anyone else must name the owner
        return (f"ask {exc.owner} to run 'mvc unlock {b}' (or run 'mvc unlock {b} --owner "
                f"{shlex.quote(str(exc.owner))}' for them), or free it with 'mvc unlock --force {b}'")
    if not exc.here:
        return f"if it is gone, free the lock with 'mvc unlock --force {b}'"
    return f"wait for that process to finish, or free the lock with 'mvc unlock --force {b}'"


def _damage_hint(exc) -> str:
    """A stored object or pack that is missing or damaged: fsck names everything it breaks."""
    if isinstance(exc, (CommitPruned, NotRegular)) or (exc.id is None and not isinstance(exc, PackDamaged)):
        return ""
    return "run 'mvc fsck'"


def _walk_hint(exc: WalkDamaged) -> str:
    if exc.kind == "corrupt-reflog":
        return "run 'mvc fsck' and 'mvc reflog expire --damaged'"
    return "run 'mvc fsck' (its --prune-lost lets gc run again without the lost commits)"


def _remote_hint(exc: UnknownRemote) -> str:
    """A mistyped remote is answered as a mistyped command is ("did you mean 'origin'?"); one
    that resembles none can be added; several and none named are listed in the message."""
    if exc.name is None:
        return "" if exc.known else "add one with 'mvc remote add origin URL'"
    close = difflib.get_close_matches(exc.name, exc.known, n=1)
    return f"did you mean {close[0]!r}?" if close else f"add it with 'mvc remote add {exc.name} URL'"


# (error class, advice for it), the first class that matches wins: what to run about each error
HINTS = (
    (NotARepository, lambda e: "run 'mvc init' first"),
    (ReaderClash, lambda e: "share the host's pid namespace between the containers that use this repository "
                            "(docker run --pid=host, Kubernetes hostPID or shareProcessNamespace), or run "
                            "this command again (its pid will differ)"),
    (UnknownRemote, lambda e: _remote_hint(e)),
    (RemoteExists, lambda e: f"remove it first ('mvc remote remove {e.name}')"),
    (NotConfigured, lambda e: f"set it with 'mvc config {e.setting} VALUE'"),
    (RefRejected, lambda e: f"run 'mvc fetch {e.remote}', then build on {e.remote}/BRANCH"),
    (Diverged, lambda e: f"merge the two checkpoints with 'mvc merge {e.branch} {e.remote}/{e.branch} "
                         f"-b {e.branch}' (a merge commit on {e.branch}), or keep yours on a new branch "
                         f"('mvc branch NAME {e.branch}') and then take theirs with "
                         f"'mvc branch --force {e.branch} {e.remote}/{e.branch}'"),
    (RefExists, lambda e: f"'mvc checkout {e.ref.split('/', 1)[-1]}' switches to it"
                          if e.action == "create-and-checkout" else ""),
    (UnmergedBranch, lambda e: f"if you are sure, delete it with 'mvc branch -D {e.ref.split('/', 1)[-1]}'"),
    (ProtectedRef, lambda e: f"unprotect it first ('mvc branch --unprotect {e.ref.split('/', 1)[-1]}')"
                             if e.action == "commit" else ""),
    (BranchLocked, _lock_hint),
    (SigningKeyError, lambda e: "" if e.path else "set one with 'mvc config signing.key KEYFILE', or give one "
                                                  "with --signing-key KEYFILE"),
    (MergeMismatch, lambda e: "merge only the model's tensors with --only 'model.*' (a training run's "
                              "commits also hold optimizer, RNG and data-loader state)"
                              if any(not k.startswith("model.") for k in e.keys) else ""),
    (MetricNotRecorded, lambda e: "pick branches that record it with --branch" if e.branches else ""),
    (LockDamaged, lambda e: f"remove it with 'mvc remote unlock --force {e.remote} {e.branch}'" if e.remote
                            else f"remove it with 'mvc unlock --force {e.branch}'"),
    (HeadMissing, lambda e: "run 'mvc checkout BRANCH' to set it again"),
    (NoBisect, lambda e: "start one with 'mvc bisect start BAD GOOD'"),
    (BisectInProgress, lambda e: "finish it or run 'mvc bisect reset'"),
    (BisectFinished, lambda e: "give a revision to judge, or run 'mvc bisect reset'"),
    (BisectStopped, lambda e: "judge this commit with 'mvc bisect good|bad|skip' or fix the command and run "
                              "'mvc bisect run' again"),
    (BisectStateDamaged, lambda e: "run 'mvc bisect reset' and start again"),
    (BisectEndMisjudged, lambda e: ("check --threshold and --higher-is-worse" if e.metric else "fix the command")
                                   + ", or if that end is wrong run 'mvc bisect reset' and start with other ends"),
    (VerdictContradicts, lambda e: "see 'mvc bisect log', or 'mvc bisect reset' and start again"),
    (RemoteDamaged, lambda e: f"run 'mvc fsck --remote {e.remote}'".rstrip()),
    (RemoteCorrupt, lambda e: "run 'mvc fsck --remote'"),
    (HashMismatch, lambda e: "run 'mvc fsck --remote'" if e.where.startswith("remote pack") else _damage_hint(e)),
    (WalkDamaged, _walk_hint),
    (ScanFoundDamage, lambda e: "run 'mvc fsck' to see what it breaks"),
    ((CorruptObject, ObjectNotFound), _damage_hint),
)


BUG = 70  # exit code of an unexpected exception (sysexits' EX_SOFTWARE)


def fail(message: str, code: int = 1):
    click.echo(f"mvc: error: {escaped(message)}", err=True)
    sys.exit(code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mvc-checkpoints", prog_name="mvc")
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
    """A ``progress(done, total)`` callback for the API: a bar on a terminal
    (stderr) that names its phase (reading, hashing, writing, verifying) and
    shows bytes done, the total, the throughput and the time left (ETA);
    nothing when piped.

    The bar is drawn as soon as its total is known: at once when ``total`` is
    given, else at the API's first call (which the API makes before any work).
    ``then`` names what follows the last byte (``syncing to disk``), so the
    wait after 100% is said, not silent.
    """

    def __init__(self, phase: str, total: int = 0, then: str = "", stream=None):
        self.phase, self.then, self.stream = phase, then, stream or sys.stderr
        self.bar, self.done, self.total, self.started, self.finished = None, 0, 0, 0.0, False
        if total:
            self(0, total)

    def _on_terminal(self) -> bool:
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):
            return False

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None and not self.finished and total > 0 and self._on_terminal():
            self.total, self.started = total, time.monotonic()
            self.bar = click.progressbar(length=total, label=f"{self.phase:<9}", file=self.stream,
                                         item_show_func=self._bytes, show_eta=False, width=24)
            self.bar.__enter__()
        if self.bar is not None:
            self.bar.update(max(0, done - self.done), done)
            if done >= total:
                self._finish()
        self.done = done

    def _bytes(self, done) -> str:
        done = self.done if done is None else done
        seconds = time.monotonic() - self.started
        if not (seconds > 0 and done):
            return f"{human_bytes(done)} of {human_bytes(self.total)}"
        rate = done / seconds
        return (f"{human_bytes(done)} of {human_bytes(self.total)}  {human_bytes(rate)}/s  "
                f"ETA {clock(max(0, self.total - done) / rate)}")

    def _finish(self) -> None:
        self.bar.__exit__(None, None, None)
        self.bar, self.finished = None, True
        if self.then:
            click.echo(f"{self.then} ...", file=self.stream)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
            self.bar = None


def plural(n: int, noun: str, suffix: str = "s") -> str:
    """``1 commit``, ``2 commits``, ``0 commits``."""
    return f"{n} {noun}{'' if n == 1 else suffix}"


def clock(seconds: float) -> str:
    """Seconds as a countdown: 0:07, 12:30, 3:05:00."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Transfer:
    """A ``progress(nbytes)`` callback for transfers (push, fetch, clone): on a terminal
    (stderr) one line, redrawn at most 5 times a second, with the bytes moved so far and the
    rate, and once the API said how many chunk bytes it will move (``expect``) their total and
    the time left; nothing when piped. (Object packs and refs are moved on top of that total.)"""

    REDRAW_S = 0.2

    def __init__(self, phase: str, stream=None):
        self.phase, self.stream = phase, stream or sys.stderr
        self.done, self.total, self.started, self.drawn, self.shown = 0, 0, time.monotonic(), 0.0, False
        self.terminal = Progress._on_terminal(self)

    def expect(self, nbytes: int) -> None:
        self.total += nbytes

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if self.terminal and now - self.drawn >= self.REDRAW_S:
            self.drawn, self.shown = now, True
            self.stream.write(f"\r{self.line(now - self.started)}")
            self.stream.flush()

    def line(self, seconds: float) -> str:
        moved = f"{human_bytes(self.done)} of {human_bytes(self.total)}" if self.total else human_bytes(self.done)
        if not (seconds > 0 and self.done):
            return f"{self.phase:<9} {moved}"
        rate = self.done / seconds
        left = f"  ETA {clock(max(0, self.total - self.done) / rate)}" if self.total > self.done else ""
        return f"{self.phase:<9} {moved}  {human_bytes(rate)}/s{left}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.shown:
            self.stream.write(f"\r{self.line(time.monotonic() - self.started)}\n")
            self.stream.flush()


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


def record_line(c, beside: str = "") -> str:
    """A commit's step, epoch and metrics on one line; a step or epoch that
    ``beside`` (the title printed next to it, e.g. "step 500") already says is left out."""
    parts = [f"{name} {value}" for name, value in (("step", c.step), ("epoch", c.epoch))
             if value is not None and not re.search(rf"\b{name} {value}\b", beside)]
    parts += [f"{k}={number(v)}" for k, v in sorted(c.metrics.items())]
    return "  ".join(parts)


def title(c) -> str:
    """The first line of a commit's message."""
    return c.message.splitlines()[0] if c.message else ""
