"""Comparing versions: ``mvc diff`` and the ``mvc bisect`` commands."""

import click

from ..bisect import VERDICTS
from .. import plot
from ..files import FORMATS
from ..diff import section_of
from .base import echo_json, human_bytes, main, number, open_repo, record_line, title

TOP_CHANGES = 10  # tensors listed under a first bad commit


# -- rendering helpers --------------------------------------------------------

def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def _shape(dtype, shape) -> str:
    if dtype is None:
        return ""
    return f"{dtype} {'x'.join(map(str, shape)) or 'scalar'}"


def _kinds(tensors) -> list:
    """[(how many, status)] of the ``tensors`` that differ, in the order changed, reshaped, added, removed."""
    return [(n, status) for status in ("changed", "reshaped", "added", "removed")
            if (n := sum(t.status == status for t in tensors))]


def _differ(tensors, total=None) -> str:
    """What happened to ``tensors`` (those that differ): "4 tensors changed", or "20 of 20 tensors
    differ (4 changed, 16 removed)" when more than a change happened (``total``: out of how many)."""
    kinds = _kinds(tensors)
    n = sum(k for k, _ in kinds)
    counted = f"{n} of {total} tensors" if total is not None else f"{n} tensor{'' if n == 1 else 's'}"
    if len(kinds) == 1 and (total is None or kinds[0][1] == "changed"):
        return f"{counted} {kinds[0][1]}"
    if not kinds:
        return f"{counted} changed"
    return f"{counted} differ ({', '.join(f'{k} {status}' for k, status in kinds)})"


def _summary_line(d) -> str:
    s = d.summary
    values = f", {s.values_changed} value{'' if s.values_changed == 1 else 's'} changed" if s.values_changed else ""
    removed = f" ({human_bytes(s.bytes_removed)} of them removed)" if s.bytes_removed else ""
    return (f"{_differ(d.changed(), s.tensors)}, "
            f"{human_bytes(s.bytes_changed)} of {human_bytes(s.bytes_total)} in changed chunks{removed}, "
            f"{100 * s.parameters_changed:.3g}% of parameters{values}")


BRIEF = 80  # characters of a record value shown before it is shortened


def _brief(value) -> str:
    """A record value short enough for one line: long lists by their ends, long text cut at a word."""
    if isinstance(value, (list, tuple)) and len(value) > 6:
        head = ", ".join(repr(v) for v in value[:3])
        return f"[{head}, ... {value[-1]!r}] ({len(value)} items)"
    text = repr(value)
    if len(text) <= BRIEF:
        return text
    cut = text[:BRIEF].rsplit(" ", 1)[0]
    return f"{cut} ... ({len(text)} characters)"


def _render_record(fields, show_context: bool) -> None:
    shown = [f for f in fields if show_context or not f.name.startswith("context.")]
    hidden = [f for f in fields if f not in shown]
    if not fields:
        return
    click.echo("record:")
    for f in shown:
        click.echo(f"  {f.name}: {_brief(f.a)} -> {_brief(f.b)}")
    if hidden:
        groups = list(dict.fromkeys(f.name.split(".")[1] for f in hidden))
        names = ", ".join(groups[:5]) + (f" and {len(groups) - 5} more" if len(groups) > 5 else "")
        click.echo(f"  context: {len(hidden)} field{'' if len(hidden) == 1 else 's'} differ ({names}); "
                   "--context shows them")


def _tensor_line(t, width: int) -> str:
    head = f"  {t.status:<9} {t.key:<{width}}"
    if t.status == "reshaped":
        return f"{head}  {_shape(t.dtype_a, t.shape_a)} -> {_shape(t.dtype_b, t.shape_b)}"
    if t.status in ("added", "removed"):
        shape = t.shape_b if t.shape_b is not None else t.shape_a  # () is a 0-dim tensor's shape, not absent
        return f"{head}  {_shape(t.dtype_b or t.dtype_a, shape)}"
    return (f"{head}  {_shape(t.dtype_b, t.shape_b):<14} chunks {t.chunks_changed}/{t.chunks} "
            f"({100 * t.chunk_fraction:.3g}%)  rel {_num(t.relative_change)}  "
            f"max {_num(t.max_abs_diff)}  cos {_num(t.cosine)}")


def _stat_line(t, width: int) -> str:
    if t.status != "changed":
        return f" {t.key:<{width}} | {t.status}"
    bar = "#" * max(1, round(20 * t.chunk_fraction))
    chunks = f"{t.chunks_changed}/{t.chunks} chunks"
    return (f" {t.key:<{width}} | {chunks:>15} {bar:<20} "
            f"rel {_num(t.relative_change)}")


def _render_diff(d, show_context: bool = False) -> None:
    """Tensors first (what a checkpoint diff is for), then plain values, then the record."""
    click.echo(f"diff {d.a.short_id} -> {d.b.short_id}" + (f"  (only {d.only!r})" if d.only else ""))
    changed = d.changed()
    width = max([len(t.key) for t in changed] + [1])
    if changed:
        click.echo("tensors:")
    for t in changed:
        click.echo(_tensor_line(t, width))
    if d.values:
        click.echo("values:")
        vwidth = max(len(v.key) for v in d.values)
        for v in d.values:
            click.echo(f"  {v.status:<9} {v.key:<{vwidth}}  {_brief(v.a)} -> {_brief(v.b)}")
    _render_record(d.commit, show_context)
    click.echo(_summary_line(d))


def _by_section(tensors) -> tuple:
    """(the model's tensors, {section: its tensors} of the optimizer, RNG and data state)."""
    model, rest = [], {}
    for t in tensors:
        if section_of(t.key) == "model":
            model.append(t)
        else:
            rest.setdefault(section_of(t.key), []).append(t)
    return model, rest


_SECTION_NAMES = {"optimizer": "optimizer state", "rng": "RNG state", "data": "data-loader state"}


def _section_line(section: str, tensors: list) -> str:
    """One line for a section's tensors that differ: what happened to how many, how many
    bytes, the largest change."""
    moved = [t.relative_change for t in tensors if t.relative_change is not None]
    largest = f", largest rel {_num(max(moved))}" if moved and section == "optimizer" else ""  # RNG bytes: no scale
    (n, first), *more = _kinds(tensors)  # "12 tensors removed", "3 tensors changed, 2 added"
    counted = ", ".join([f"{n} tensor{'' if n == 1 else 's'} {first}"] + [f"{k} {status}" for k, status in more])
    kept = [t for t in tensors if t.status != "removed"]  # a removed tensor's bytes are gone, not changed
    gone = sum(t.bytes_changed for t in tensors if t.status == "removed")
    sizes = ([f"{human_bytes(sum(t.bytes_changed for t in kept))} in changed chunks"] if kept else []) + \
        ([f"{human_bytes(gone)} removed"] if gone else [])
    return f"{_SECTION_NAMES[section]}: {counted} ({', '.join(sizes) or 'no bytes'}{largest})"


def _render_stat(d) -> None:
    """The model's tensors one per line, the optimizer, RNG and data state one line each."""
    model, rest = _by_section(d.changed())
    width = max([len(t.key) for t in model] + [1])
    for t in model:
        click.echo(_stat_line(t, width))
    for section, tensors in rest.items():
        click.echo(f" {_section_line(section, tensors)}")
    if rest:
        click.echo(" (mvc diff without --stat lists every tensor)")
    click.echo(" " + _summary_line(d))


# -- diff -----------------------------------------------------------------------

@main.command()
@click.argument("a", required=False, metavar="A[..B]")
@click.argument("b", required=False)
@click.option("--stat", is_flag=True, help="One line per changed tensor and the summary.")
@click.option("--only", metavar="GLOB", default=None,
              help="Compare only keys matching GLOB, e.g. 'model.layers.*' (fnmatch on dotted keys).")
@click.option("--plot", "plot_file", metavar="FILE.png", type=click.Path(dir_okay=False), default=None,
              help="Also draw the relative change of each tensor (of each layer when there are many: "
                   "its tensors' changes weighted by their bytes) in model order: keys sorted with digit runs as numbers, so layers.2 comes "
                   "before layers.10. Needs matplotlib: pip install 'mvc-checkpoints[plot]'.")
@click.option("--context", "show_context", is_flag=True,
              help="List every context field of the record that differs (default: how many).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole diff as JSON.")
def diff(a, b, stat, only, plot_file, show_context, as_json):
    """Compare commit A with B (default HEAD): tensors, plain values and the training record.

    For each changed tensor: the share of its chunks that differ, the relative
    change |B-A|/|A|, max |B-A| and the cosine similarity. Unchanged tensors
    are recognised from ids without reading data. Then the plain values and
    the record fields that differ (context fields counted; --context lists
    them).
    """
    if a is None:
        raise click.UsageError("give a revision to compare: mvc diff A [B] compares A with B "
                               "(default HEAD), e.g. 'mvc diff HEAD~1'")
    from .. import refs
    span = refs.split_range(a)
    if span and b is None:  # git diff A..B is git diff A B
        a, b = span
    if plot_file:
        plot.require_matplotlib()  # fail before the work, not after it
        plot.check_image_path(plot_file)
    with open_repo() as repo:
        d = repo.diff(a, b, only=only)
    if plot_file:
        click.echo(f"plot written to {plot.plot_diff(d, plot_file)}", err=True)
    if as_json:
        echo_json(d)
    elif stat:
        _render_stat(d)
    else:
        _render_diff(d, show_context)


# -- best -----------------------------------------------------------------------

@main.command()
@click.argument("metric", metavar="[-]METRIC")
@click.argument("rev", required=False)
@click.option("--max", "highest", is_flag=True,
              help="The highest value is the best (accuracy, reward); the same as '-METRIC'. Default: the lowest.")
@click.option("--all", "all_refs", is_flag=True,
              help="Look at every commit any branch, tag, remote-tracking branch or HEAD reaches, as 'mvc log --all'.")
@click.option("--where", "where", multiple=True, metavar="METRIC<VALUE",
              help="Only commits whose metric passes, e.g. 'step>=1000' (< <= > >= == !=; repeat: all must pass).")
@click.option("--json", "as_json", is_flag=True, help="Print the best commit, what changed since and the diff as JSON.")
def best(metric, rev, highest, all_refs, where, as_json):
    """Which checkpoint had the best METRIC, and what changed since.

    Finds the commit of REV's history (default HEAD; --all: every ref's) with
    the lowest METRIC (--max or '-METRIC': the highest), the one 'mvc log
    --sort METRIC -n 1' lists first, and prints it with its record; then how
    many commits REV is past it, METRIC now against the best, and the diff
    from the best commit to REV as 'mvc diff BEST REV --stat' shows it (the
    model's tensors first, optimizer and RNG state summarised). A metric no
    commit records is an error naming those that are recorded.
    """
    from .. import best as verb
    with open_repo() as repo:
        answer = verb.best(repo, metric, rev, all_refs, where, highest)
    if as_json:
        echo_json(answer)
        return
    if not answer.highest and verb.higher_is_better(answer.metric):
        click.echo(f"mvc: note: the lowest {answer.metric} is taken as the best; --max takes the highest", err=True)
    _render_best(answer, rev or "HEAD")


def _render_best(b, rev: str) -> None:
    """The best commit and its record, then what changed from it to REV."""
    c, way = b.commit, "highest" if b.highest else "lowest"
    click.echo(f"best {b.metric}: {number(b.value)} ({way} of {b.candidates} commit{'' if b.candidates == 1 else 's'} "
               f"recording it)")
    record = record_line(c, beside=title(c))
    click.echo(f"  {c.short_id}  {record + '  ' if record else ''}{title(c) or '(no message)'}"
               + ("  [pruned]" if c.pruned else ""))
    if b.target is None:
        click.echo("since then: HEAD has no commits yet")
        return
    click.echo(f"since then: {_since(b, rev)}")
    if b.latest is not None and b.latest.id != c.id:
        at = "" if b.latest.id == b.target.id else f" at {b.latest.short_id}, the newest of {rev}'s commits recording it"
        click.echo(f"  {b.metric} now {number(b.latest_value)}{at} ({_signed(b.latest_value - b.value)} from the best)")
    elif b.latest is not None and c.id != b.target.id:
        click.echo(f"  no later commit of {rev}'s history records {b.metric}")
    elif b.latest is None:
        click.echo(f"  no commit of {rev}'s history records {b.metric}")
    if b.diff is not None:
        click.echo(f"diff {c.short_id} -> {b.target.short_id} ({rev}):")
        _render_stat(b.diff)
    elif c.pruned and c.id != b.target.id:
        click.echo("  (gc retention pruned the best commit's tensors: no diff; its record is kept)")


def _since(b, rev: str) -> str:
    target = f"{rev} ({b.target.short_id})" if rev != b.target.short_id else rev
    if b.commit.id == b.target.id:
        return f"nothing: {target} is the best commit"
    commits = f"{b.since} commit{'' if b.since == 1 else 's'}"
    if b.apart == 0:
        return f"{commits} to {target}"
    return (f"{target} is on another line of history: it has {commits} the best lacks, the best has "
            f"{b.apart} commit{'' if b.apart == 1 else 's'} it lacks")


def _signed(x: float) -> str:
    return f"+{_num(x)}" if x > 0 else _num(x)


# -- bisect ---------------------------------------------------------------------

@main.group()
def bisect():
    """Find the first bad commit by binary search over first-parent history.

    Start with 'mvc bisect start BAD GOOD', then judge each commit it offers
    with 'mvc bisect good|bad|skip', or let 'mvc bisect run' judge them with an
    evaluation command or a recorded metric. 'mvc bisect reset' ends it.
    """


def _render_status(s) -> None:
    if s.first_bad is not None:
        _render_first_bad(s)
    elif s.suspects:
        click.echo("only skipped commits are left: the first bad commit is one of")
        for cid in s.suspects:
            click.echo(f"  {cid}")
    else:
        c = s.candidate
        click.echo(f"Bisecting: {s.remaining} commit{'' if s.remaining == 1 else 's'} left to judge "
                   f"(about {s.steps} step{'' if s.steps == 1 else 's'})")
        click.echo(f"next: {c.id}  {record_line(c, beside=title(c))}  {title(c)}".rstrip())
        click.echo(f"judge it (e.g. mvc export {c.short_id} -o FILE), then run 'mvc bisect good' or "
                   "'mvc bisect bad' ('mvc bisect skip' if it cannot be judged)")


def _render_first_bad(s) -> None:
    c = s.first_bad
    click.echo(f"first bad commit: {c.id}")
    if record_line(c):
        click.echo(f"  {record_line(c)}")
    for line in (c.message or "(no message)").splitlines():
        click.echo(f"    {line}")
    if s.changes is None:
        if s.changes_note:
            click.echo(f"  ({s.changes_note})")
        return
    click.echo(f"  against its parent {s.changes.a.short_id}: {_summary_line(s.changes)}")
    model, rest = _by_section(s.changes.changed())
    changed = sorted(model, key=lambda t: -(t.relative_change or 0))  # the weights that moved most
    width = max([len(t.key) for t in changed[:TOP_CHANGES]] + [1])
    for t in changed[:TOP_CHANGES]:
        click.echo("  " + _tensor_line(t, width))
    if len(changed) > TOP_CHANGES:
        click.echo(f"    ... and {len(changed) - TOP_CHANGES} more model tensors "
                   f"(mvc diff {s.changes.a.short_id} {c.short_id})")
    for section, tensors in rest.items():
        click.echo(f"    {_section_line(section, tensors)}")
    for f in s.changes.commit:
        if f.name != "message":
            click.echo(f"    {f.name}: {_brief(f.a)} -> {_brief(f.b)}")  # shortened as mvc diff shortens it


def _show(status, as_json: bool) -> None:
    if as_json:
        echo_json(status)
    else:
        _render_status(status)


_json_option = click.option("--json", "as_json", is_flag=True, help="Print as JSON.")


@bisect.command("start")
@click.argument("bad")
@click.argument("good")
@click.option("--branch", default=None, help="Follow this branch's first parents (default: BAD's).")
@_json_option
def bisect_start(bad, good, branch, as_json):
    """Start bisecting between BAD (a bad commit) and GOOD (an older good one)."""
    with open_repo() as repo:
        _show(repo.bisect.start(bad, good, branch=branch), as_json)


VERDICT_HELP = {"good": "Mark REV (default: the commit offered) good.",
                "bad": "Mark REV (default: the commit offered) bad.",
                "skip": "Mark REV (default: the commit offered) as one that cannot be judged."}


def _verdict_command(verdict: str):
    @bisect.command(verdict, help=VERDICT_HELP[verdict])
    @click.argument("rev", required=False)
    @_json_option
    def command(rev, as_json):
        with open_repo() as repo:
            _show(repo.bisect.mark(verdict, rev), as_json)
    return command


for _verdict in VERDICTS:
    _verdict_command(_verdict)


@bisect.command("log")
@_json_option
def bisect_log(as_json):
    """Show the verdicts given so far and where the bisect stands."""
    with open_repo() as repo:
        result = repo.bisect.log()
    if as_json:
        echo_json(result)
        return
    for e in result.entries:
        step = f"step {e.step}  " if e.step is not None else ""
        note = f"  ({e.note})" if e.note else ""
        click.echo(f"# {e.verdict}: {e.commit[:12]}  {step}{e.message.splitlines()[0] if e.message else ''}"
                   f"{note}".rstrip())
    _render_status(result.status)


@bisect.command("reset")
def bisect_reset():
    """End the bisect and forget its verdicts."""
    with open_repo() as repo:
        if not repo.bisect.in_progress():
            click.echo("no bisect in progress; nothing to reset", err=True)
            return
        where = repo.bisect.reset()
    found = f" (first bad commit was {where.first_bad.short_id})" if where and where.first_bad else ""
    click.echo(f"bisect reset{found}")


def _progress(commit, verdict) -> None:
    click.echo(f"{commit.short_id}  {record_line(commit)}  -> {verdict}", err=True)


@bisect.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Checkpoint file format handed to CMD (default pt).")
@click.option("--metric", default=None, help="Judge by this metric recorded in each commit instead.")
@click.option("--threshold", type=float, default=None, help="With --metric: the boundary of good.")
@click.option("--higher-is-worse", is_flag=True,
              help="With --metric: above the threshold is bad (a loss); default: below it is bad.")
@click.option("--no-check-ends", "no_check_ends", is_flag=True,
              help="Do not first run CMD on the good and the bad end (which must come out good and bad).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Kill an evaluation still running after SECONDS (with what it started) and judge it skip.")
@click.option("--timeout-bad", is_flag=True, help="With --timeout: judge a timed-out evaluation bad (a hang "
              "is the regression), not skip.")
@_json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def bisect_run(fmt, metric, threshold, higher_is_worse, no_check_ends, timeout, timeout_bad, as_json, command):
    """Judge every commit offered until the first bad one is found.

    Either run CMD ARGS... on each candidate's checkpoint (its path is in
    $MVC_CHECKPOINT, the commit id in $MVC_COMMIT, and replaces {} in ARGS):
    exit 0 means good, 125 skip, 1-127 bad, 128 or more (or a signal) stops
    the bisect. CMD first runs on the newest good and the oldest bad commit:
    if they do not come out good and bad (a broken script calls everything
    bad), the bisect stops before any verdict. Or, with --metric NAME
    --threshold X, judge each commit by the metric it recorded, running nothing
    (the good and the bad end first, by the same rule).
    """
    if metric is None:
        if threshold is not None or higher_is_worse:
            raise click.UsageError("--threshold and --higher-is-worse go with --metric")
        if not command:
            raise click.UsageError("give an evaluation command, or --metric NAME --threshold X")
    elif command or fmt or no_check_ends or timeout is not None:
        raise click.UsageError("--metric judges by recorded metrics: give no command, --format, --timeout "
                               "or --no-check-ends")
    elif threshold is None:
        raise click.UsageError("--metric needs --threshold X")
    if timeout_bad and timeout is None:
        raise click.UsageError("--timeout-bad goes with --timeout SECONDS")
    with open_repo() as repo:
        if metric is None:
            status = repo.bisect.run(list(command), fmt or "pt", progress=_progress,
                                     check_ends=not no_check_ends, timeout=timeout,
                                     timeout_verdict="bad" if timeout_bad else "skip")
        else:
            status = repo.bisect.run_metric(metric, threshold, higher_is_worse, progress=_progress)
    if not as_json:
        click.echo(f"{status.evaluations} evaluation{'' if status.evaluations == 1 else 's'}")
    _show(status, as_json)
