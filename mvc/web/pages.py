"""The pages of ``mvc serve``: each takes the View and the query, returns HTML.

Vocabulary:

- the **view** holds the open repository and what is worth keeping
  between requests: the history walk and its lanes, keyed by the refs it
  started from and the set of pruned commits, so paging through 10,000
  commits walks them once.
- a **query** is the request's parameters: {name: [values]}.
- a **record number** of a commit is a number it records: a metric by its
  name, ``step``, ``epoch``, or a context field as ``context.DOTTED.KEY``.

Every page reads through the library's public verbs (log, history, entries,
diff, bisect_log, status, gc dry run, cache_status) and only renders what
they return; nothing here writes to the repository.
"""

import math
import operator
import threading
from collections import OrderedDict

from .. import refs as _refs
from ..diff import CHANGED, UNCHANGED, flatten_record, natural_key, section_of
from ..errors import (AmbiguousRevision, BadInput, CommitPruned, GcLockBusy, InvalidRefName, MetricNotRecorded,
                      MvcError, UnknownRevision)
from .. import reach, usage
from ..store.chunks import PackStore
from ..best import higher_is_better  # one home for the guess: mvc best's note says it too
from ..history import ahead_behind, decorations as ref_decorations, pruned_digest, walk as walk_history
from . import lanes, svg
from .html import a, esc, human_bytes, number, page, table, title_of, url, when

PER_PAGE, MAX_PER_PAGE = 100, 1000


class View:
    """The open repository and the walks worth keeping between requests."""

    def __init__(self, repo, warm: bool = True):
        self.repo = repo
        self.lock = threading.Lock()  # one request reads the repository at a time
        self._walks: OrderedDict = OrderedDict()
        self._last = None  # (key, commits) of the last walk of everything
        if warm:  # the history page's walk, before the first request asks for it
            self.everything()

    def where(self) -> str:
        return str(self.repo.root)

    def refs_now(self) -> tuple:
        head = self.repo.head()
        return (tuple((r.name, r.id) for r in self.repo.branches()), tuple((r.name, r.id) for r in self.repo.tags()),
                tuple((r.name, r.id) for r in self.repo.remotes.branches()), (head.branch, head.id))

    def state_now(self) -> tuple:
        """(refs_now(), pruned digest): what a kept walk depends on. gc prunes without
        moving a ref, and a walk marks each commit pruned or not."""
        return self.refs_now(), pruned_digest(self.repo)

    def walk(self, include: tuple, exclude: tuple, all_refs: bool) -> tuple:
        """(commits in topological order, their lane Rows), kept while the refs stay where they
        are and gc prunes nothing."""
        key = (self.state_now(), include, exclude, all_refs)
        if key not in self._walks:
            commits = walk_history(self.repo, list(include), list(exclude), all_refs) if include or all_refs else []
            self._walks[key] = (commits, lanes.layout(commits))
            while len(self._walks) > 4:  # a walk of 10,000 commits with ~90 context fields: ~60 MiB
                self._walks.popitem(last=False)
        self._walks.move_to_end(key)
        return self._walks[key]

    def everything(self) -> tuple:
        """The walk from every branch, tag, HEAD and remote-tracking branch (as ``git log --all``).

        When the refs only moved forward to newer commits (a training run
        committed), the new commits go in front of the last walk: that is
        the order a whole walk gives then, and it costs only what is new.
        """
        key = (self.state_now(), (), (), True)  # the key walk() gives it
        if key not in self._walks and self._last is not None:
            grown = self._grown(*self._last)
            if grown is not None:
                self._walks[key] = grown
        found = self.walk((), (), True)  # --all takes in the remote-tracking branches
        self._last = (key, found[0])
        return found

    def _grown(self, old_key, old: list):
        """(commits, rows) of the last whole walk with the new commits in front, or None
        when the refs did more than move forward (deleted, moved back, or older commits came)
        or gc pruned commits since (the old walk shows them whole)."""
        (old_refs, old_pruned) = old_key[0]
        if not old or old_pruned != pruned_digest(self.repo):
            return None
        new = walk_history(self.repo, [], (), True, known=[c.id for c in old])
        parents = {p for c in new for p in c.parents}
        now = {cid for group in old_refs[:3] for _, cid in group} | {old_refs[3][1]} - {None}
        tips = {cid for group in self.refs_now()[:3] for _, cid in group} | {self.repo.head().id} - {None}
        if not (now <= tips | parents) or (new and min(c.time for c in new) <= max(c.time for c in old)):
            return None
        commits = new + old
        return commits, lanes.layout(commits)

    def decorations(self) -> dict:
        """{commit id: [(label, css class)]}, as log's decorations."""
        shown = {"HEAD": ("HEAD", "head"), "current": ("HEAD → {}", "head"), "branch": ("{}", ""),
                 "tag": ("tag: {}", "tag"), "remote": ("{}", "remote")}
        return {cid: [(shown[kind][0].format(name), shown[kind][1]) for kind, name in names]
                for cid, names in ref_decorations(self.repo).items()}


def one(query: dict, name: str, default=None):
    values = query.get(name)
    return values[0] if values else default


def _int(query, name, default, lo, hi) -> int:
    try:
        return max(lo, min(hi, int(one(query, name, default))))
    except (TypeError, ValueError):
        return default


def _deco_html(labels) -> str:
    return "".join(f'<span class="deco {cls}">{esc(label)}</span>' for label, cls in labels)


def _short(cid: str) -> str:
    return cid[:12]


# -- record numbers ------------------------------------------------------------

def record_number(c, name: str):
    """The number ``c`` records under ``name`` (see module doc), or None."""
    if name in ("step", "epoch"):
        value = getattr(c, name)
    elif name.startswith("context."):
        value = flatten_record(c.context, "context").get(name) if c.context else None
    else:
        value = c.metrics.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def number_names(commits) -> list:
    """Metric names first, then step and epoch, then numeric context fields, each sorted."""
    metrics, context = set(), set()
    for c in commits:
        metrics.update(k for k in c.metrics if record_number(c, k) is not None)
        if c.context:
            context.update(k for k, v in flatten_record(c.context, "context").items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool))
    return sorted(metrics) + ["step", "epoch"] + sorted(context)


_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "=": operator.eq, "==": operator.eq, "!=": operator.ne}
MAX_FILTER = 1000  # characters; a record number's name is far shorter
_MALFORMED = "write a record number's name, or NAME<VALUE (also <=, >, >=, =, !=)"


def split_condition(text: str):
    """(name, operator, value) of ``NAME`` or ``NAME OP VALUE`` (operator and value "" for
    the first), or None if malformed. One pass over ``text``, no regular expression:
    the one it replaces backtracked cubically on runs of spaces."""
    at = next((i for i, ch in enumerate(text) if ch in "<>=!"), len(text))
    name, rest = text[:at].strip(), text[at:]
    op = rest[:2] if rest[:2] in _OPS else rest[:1]
    value = rest[len(op):].strip()
    if not name or any(ch.isspace() for ch in name + value) or (op and op not in _OPS) or bool(op) != bool(value):
        return None
    return name, op, value


def parse_condition(text: str):
    """``NAME`` (records it) or ``NAME OP NUMBER``; a predicate on commits. BadInput if malformed
    or longer than MAX_FILTER characters."""
    if len(text) > MAX_FILTER:
        raise BadInput(f"filter of {len(text)} characters: at most {MAX_FILTER}; {_MALFORMED}")
    parts = split_condition(text)
    if parts is None:
        raise BadInput(f"filter {text!r}: {_MALFORMED}")
    name, op, raw = parts
    if not op:
        return name, lambda c: record_number(c, name) is not None
    try:
        bound = float(raw)
    except ValueError:
        raise BadInput(f"filter {text!r}: {raw!r} is not a number") from None
    return name, lambda c: (v := record_number(c, name)) is not None and _OPS[op](v, bound)


def check_recorded(commits, name: str) -> None:
    """MetricNotRecorded (as ``mvc log --where`` says it) if no commit of ``commits`` records
    number ``name``: a typo must not read as "no commit qualifies"."""
    if commits and all(record_number(c, name) is None for c in commits):
        recorded = sorted({k for c in commits for k in c.metrics})
        raise MetricNotRecorded(f"no commit here records metric {name!r}; recorded: {', '.join(recorded) or 'none'}",
                                metric=name, recorded=recorded)


# -- history ---------------------------------------------------------------------

MAX_METRIC_COLUMNS = 6  # more metrics than this are counted in the last column, so the table fits


def best_commit(commits, name: str):
    """The commit with the best value of metric ``name`` (the oldest of ties: the one that reached it,
    as ``history.select`` orders them), or None."""
    have = [(record_number(c, name), i) for i, c in enumerate(commits) if record_number(c, name) is not None]
    if not have:
        return None
    sign = -1 if higher_is_better(name) else 1
    return commits[min(have, key=lambda vi: (sign * vi[0], -vi[1]))[1]]


def _sorted_by(commits, picked, sort: str) -> list:
    """``picked`` (indexes into ``commits``) by metric ``sort`` (``-NAME``: highest first; ties
    oldest first, as ``history.select``), those without it last, in history order."""
    name, sign = sort.lstrip("-"), (-1 if sort.startswith("-") else 1)
    have = [i for i in picked if record_number(commits[i], name) is not None]
    have.sort(key=lambda i: (sign * record_number(commits[i], name), -i))
    return have + [i for i in picked if record_number(commits[i], name) is None]


def history(view: View, query: dict) -> str:
    ref, span, where = one(query, "ref", ""), one(query, "range", "").strip(), one(query, "where", "").strip()
    sort = one(query, "sort", "").strip()
    per = _int(query, "per", PER_PAGE, 1, MAX_PER_PAGE)
    start = _int(query, "start", 0, 0, 1 << 40)
    walked, problems = _walk_asked(view, ref, span)
    shown_metric = None
    if where:
        try:
            shown_metric, keep = parse_condition(where)
            if walked is not None:
                check_recorded(walked[0], shown_metric)
        except BadInput as exc:
            problems["where"] = str(exc)
    if problems:  # what the boxes ask cannot be shown: say why beside them, the form kept to fix it
        return page("History", _history_filters(view, ref, span, where, problems), view.where(), "/")
    commits, rows = walked
    picked = [i for i, c in enumerate(commits) if keep(c)] if where else range(len(commits))
    chosen = [commits[i] for i in picked]
    metrics = _metric_columns(chosen, [n for n in (shown_metric, sort.lstrip("-")) if n])
    if sort:
        if sort.lstrip("-") not in metrics and not any(record_number(c, sort.lstrip("-")) is not None for c in chosen):
            raise BadInput(f"sort {sort!r}: no commit listed records {sort.lstrip('-')!r}")
        picked = _sorted_by(commits, picked, sort)
    total = len(picked)
    window = list(picked[start:start + per])
    deco = view.decorations()
    graph = not where and not sort
    width = max((rows[i].width for i in window), default=1) if graph else 0
    # every metric's best, not only the columns': a run that records more metrics than fit
    # still gets its "best by eval_loss" link, the first click of "which was best?"
    best = {name: best_commit(chosen, name) for name in _metric_columns(chosen, metrics, None)}
    best_ids = {name: (c.id if c is not None else None) for name, c in best.items()}
    more_column = any(_more(c, metrics) for c in chosen)
    body_rows = [_log_row(commits[i], svg.graph_row(rows[i], width, commits[i].pruned) if graph else None,
                          deco.get(commits[i].id, ()), metrics, best_ids, more_column) for i in window]
    params = dict(ref=ref, range=span, where=where, per=per if per != PER_PAGE else None)
    heads = ((["graph"] if graph else []) + ["A", "B", "commit", "step", "message"]
             + [_metric_head(name, sort, params) for name in metrics]
             + (["more"] if more_column else []) + ["date"])
    table_html = ('<table class="log" id="log"><thead><tr>' + "".join(f"<th>{h}</th>" for h in heads)
                  + "</tr></thead><tbody>" + "".join(body_rows) + "</tbody></table>")
    pager = _pager(total, start, per, dict(params, sort=sort or None))
    body = (_history_filters(view, ref, span, where) + _best_links(best)
            + f'<form method=get action="/diff">{pager}'
            + '<p><button type=submit>Compare A → B</button> <span class=muted>pick A and B in the table '
            '(the diff page shows what changed from A to B; B left out: HEAD)</span></p>'
            + table_html + "</form>" + pager)
    if where and not total:
        body += f'<p class=muted id=none-met>No commit here meets {esc(where)}.</p>'
    return page("History", body, view.where(), "/")


def _walk_asked(view, ref: str, span: str) -> tuple:
    """((commits, rows) of the walk the boxes ask for, or None; {box: what is wrong with it})."""
    if not span:
        return (view.walk((ref,), (), False) if ref else view.everything()), {}
    pair = _refs.split_range(span)
    if not pair:
        return None, {"range": f"range {span!r}: write it as A..B (the commits B reaches and A does not)"}
    try:
        return view.walk((pair[1],), (pair[0],), False), {}
    except (UnknownRevision, AmbiguousRevision, InvalidRefName, BadInput) as exc:
        return None, {"range": str(exc)}


def _metric_columns(commits, first, most=MAX_METRIC_COLUMNS) -> list:
    """The metric names shown as columns: those filtered or sorted by first, then the rest
    by name, at most ``most`` (None: all of them)."""
    names = sorted({k for c in commits for k in c.metrics if record_number(c, k) is not None})
    return list(dict.fromkeys([n for n in first if n in names] + names))[:most]


def _more(c, metrics) -> int:
    return sum(1 for k in c.metrics if k not in metrics)


def _metric_head(name: str, sort: str, params: dict) -> str:
    """A column head that sorts by its metric: best first on the first click, then the other way."""
    best_first = f"-{name}" if higher_is_better(name) else name
    worst_first = name if best_first.startswith("-") else f"-{name}"
    nxt = worst_first if sort == best_first else best_first
    arrow = " ▲" if sort == name else " ▼" if sort == f"-{name}" else ""
    return a(url("/", **params, sort=nxt), name, "sort", f"sort by {name}") + esc(arrow)


def _best_links(best: dict) -> str:
    links = [a(url("/commit", rev=c.id), f"best by {name}", "best", f"{c.short_id}: {name} = "
               f"{number(record_number(c, name))} ({'highest' if higher_is_better(name) else 'lowest'})")
             for name, c in best.items() if c is not None]
    return f'<p class=bestlinks>{" · ".join(links)}</p>' if links else ""


def _log_row(c, graph, labels, metrics, best_ids, more_column: bool) -> str:
    """One commit's row: its graph band (None without a graph), A/B pickers, id and
    decorations, step, title, one cell per metric column (the best value marked), date."""
    cells = [] if graph is None else [f'<td class="g">{graph}</td>']
    cells += [f'<td><input type=radio name=a value="{esc(c.id)}" aria-label="compare from {esc(c.short_id)}"></td>',
              f'<td><input type=radio name=b value="{esc(c.id)}" aria-label="compare to {esc(c.short_id)}"></td>',
              f'<td class=c>{a(url("/commit", rev=c.id), c.short_id, "id")} {_deco_html(labels)}</td>',
              f"<td>{esc(number(c.step))}</td>",
              f'<td class=msg>{esc(title_of(c))}{" <span class=muted>[pruned]</span>" if c.pruned else ""}</td>',
              *[_metric_cell(c, name, best_ids.get(name) == c.id) for name in metrics]]
    if more_column:  # metrics past the columns: counted, and all on the commit's page
        cells.append(f'<td><span class=muted>+{_more(c, metrics)}</span></td>' if _more(c, metrics) else "<td></td>")
    cells.append(f'<td><span class=muted>{esc(when(c.time))}</span></td>')
    return f'<tr data-commit="{esc(c.id)}">{"".join(cells)}</tr>'


def _metric_cell(c, name: str, best: bool) -> str:
    value = record_number(c, name)
    if value is None:
        return "<td class=num></td>"
    if best:
        return f'<td class="num best" title="best {esc(name)}"><b>{esc(number(value))}</b>&nbsp;★</td>'
    return f"<td class=num>{esc(number(value))}</td>"


def _history_filters(view, ref, span, where, problems=None) -> str:
    """The form of the history page; ``problems``: {box name: what is wrong}, said beside the box."""
    problems = problems or {}
    options = ['<option value="">all branches and tags</option>']
    for r in view.repo.branches():
        options.append(f'<option value="{esc(r.name)}"{" selected" if r.name == ref else ""}>'
                       f'branch {esc(r.name)}</option>')
    for r in view.repo.remotes.branches():
        options.append(f'<option value="{esc(r.name)}"{" selected" if r.name == ref else ""}>'
                       f'remote-tracking {esc(r.name)}</option>')
    for r in view.repo.tags():
        options.append(f'<option value="{esc(r.name)}"{" selected" if r.name == ref else ""}>'
                       f'tag {esc(r.name)}</option>')
    return ('<form class=filters method=get action="/">'
            f'<label>branch or tag<select name=ref>{"".join(options)}</select></label>'
            f'<label>range A..B<input name=range value="{esc(span)}" placeholder="main~10..main"'
            f'{_problem(problems, "range")}</label>'
            f'<label>record filter<input name=where value="{esc(where)}" placeholder="loss&lt;2.5"'
            f'{_problem(problems, "where")}</label>'
            '<button type=submit>Show</button></form>')


def _problem(problems: dict, box: str) -> str:
    """The end of box ``box``'s input tag, and what is wrong with what it holds (if anything)."""
    if box not in problems:
        return ">"
    return (f' aria-invalid=true aria-describedby={box}-error>'
            f'<span class=err id={box}-error role=alert>{esc(problems[box])}</span>')


def _pager(total: int, start: int, per: int, params: dict) -> str:
    end = min(total, start + per)
    parts = [f"<span>commits {start + 1 if total else 0}–{end} of {total}</span>"]
    if start > 0:
        parts.append(a(url("/", **params, start=max(0, start - per) or None), "← newer", "newer"))
    if end < total:
        parts.append(a(url("/", **params, start=end), "older →", "older"))
    return f'<div class=pager>{"".join(parts)}</div>'


# -- one commit -------------------------------------------------------------------

def commit(view: View, query: dict) -> str:
    repo = view.repo
    c = repo.get_commit(one(query, "rev", "HEAD"))
    deco = view.decorations().get(c.id, ())
    head = [f'<p><span class=id>{esc(c.id)}</span> {_deco_html(deco)}</p>']
    facts = [("author", esc(c.author)), ("date", esc(when(c.time)))]
    if c.parents:
        facts.append(("parents", " ".join(a(url("/commit", rev=p), _short(p), "id parent") for p in c.parents)))
    for name in ("step", "epoch"):
        if getattr(c, name) is not None:
            facts.append((name, esc(getattr(c, name))))
    head.append(table(["", ""], [[f"<b>{esc(k)}</b>", v] for k, v in facts], "facts"))
    head.append(f'<pre class=message>{esc(c.message or "(no message)")}</pre>')
    if c.parents:
        head.append("<p>" + a(url("/diff", a=c.parents[0], b=c.id), "diff with its parent") + " · "
                    + a(url("/diff", a=c.id, b="HEAD"), "compare with HEAD") + " · "
                    + a(url("/", ref=c.id), "history from here") + "</p>")
    else:
        head.append("<p>" + a(url("/diff", a=c.id, b="HEAD"), "compare with HEAD") + "</p>")
    body = "".join(head) + _record(c) + _tree(view, c) + _export(c)
    return page(f"Commit {c.short_id}", body, view.where())


def _record(c) -> str:
    """Metrics, then context fields grouped by their first key, as ``mvc show`` lists them."""
    out = ['<h2>Record</h2><input type=search data-filter="#record tbody tr" placeholder="search the record" '
           'aria-label="search the record">', '<div id=record>']
    if c.metrics:
        rows = [[esc(k), f'<span class=n>{esc(number(v))}</span>'] for k, v in sorted(c.metrics.items())]
        out.append('<details open data-group><summary>metrics</summary>' + table(["metric", "value"], rows) + "</details>")
    groups: dict = {}
    for key, value in flatten_record(c.context, "context").items() if c.context else ():
        dotted = key[len("context."):]
        groups.setdefault(dotted.split(".")[0], []).append((dotted, value))
    for group, fields in groups.items():
        rows = [[esc(k), esc(_brief(v))] for k, v in fields]
        out.append(f'<details open data-group><summary>{esc(group)} <span class=muted>({len(fields)})</span>'
                   f'</summary>{table(["field", "value"], rows)}</details>')
    if not c.metrics and not groups:
        out.append("<p class=muted>This commit records no metrics and no context.</p>")
    return "".join(out) + "</div>"


def _brief(value, limit: int = 300) -> str:
    if isinstance(value, float):
        return number(value)
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[:limit] + "…"


def _tree(view: View, c) -> str:
    repo = view.repo
    if c.pruned:
        with repo.index.read() as txn:
            note = repo.objects.pruned(txn, bytes.fromhex(c.id)) or {}
        why = note.get("policy", "retention")
        return (f"<h2>Tensors</h2><p class=muted>This commit was pruned ({esc(why)}) on "
                f"{esc(when(note.get('time', 0) / 1e6))}: its record stays, its tensors are gone.</p>")
    entries = repo.entries(c.id)
    try:
        parent_chunks = {cid for e in repo.entries(c.parents[0]) if e.kind == "tensor" for cid in e.chunks} \
            if c.parents else set()
    except CommitPruned:  # the parent's tensors are gone: every chunk counts as new against it
        parent_chunks = set()
    tensors = [e for e in entries if e.kind == "tensor"]
    values = [e for e in entries if e.kind == "value"]
    rows, new_ids, total_new, total_bytes = [], {}, 0, 0
    for e in tensors:
        spans = list(repo.tensor_object(e.tensor_id).chunk_spans())
        fresh = [(cid, n) for cid, _, n in spans if cid not in parent_chunks]
        new_bytes = sum(n for _, n in fresh)
        new_ids.update(fresh)
        total_new += new_bytes
        total_bytes += e.nbytes
        shape = "×".join(map(str, e.shape)) or "scalar"
        share = new_bytes / e.nbytes if e.nbytes else 0.0
        rows.append(f'<tr data-key="{esc(e.key)}"><td>{esc(e.key)}</td><td>{esc(e.dtype)}</td><td>{esc(shape)}</td>'
                    f'<td class=n>{esc(human_bytes(e.nbytes))}</td><td class=n>{len(spans)}</td>'
                    f'<td class=n>{len(fresh)}</td><td class=n>{len(spans) - len(fresh)}</td>'
                    f'<td>{_svg_bar(share)}</td></tr>')
    sizes = usage.chunk_sizes(repo, new_ids)
    stored = sum(s for s, _ in sizes.values())
    raw_local = sum(r for _, r in sizes.values())
    compared = f"its parent {_short(c.parents[0])}" if c.parents else "nothing (a root commit)"
    figures = [
        ("tensors", f"{len(tensors)}, {human_bytes(total_bytes)} in {sum(len(e.chunks) for e in tensors)} chunks"),
        ("new against " + compared, f"{human_bytes(total_new)} in {len(new_ids)} distinct chunks"),
        ("shared with the parent (deduplicated)", human_bytes(total_bytes - total_new)),
        ("new chunks held here", f"{len(sizes)} of {len(new_ids)}"
         + ("" if len(sizes) == len(new_ids) else " (the rest are on the remote: a lazy clone or evicted)")),
        ("stored size of those", f"{human_bytes(stored)} for {human_bytes(raw_local)} raw"
         + (f" ({stored / raw_local:.3f}×)" if raw_local else "")),
    ]
    out = ["<h2>Storage</h2>", table(["", ""], [[esc(k), esc(v)] for k, v in figures], "figures")]
    out.append(f'<h2>Tensors <span class=muted>({len(tensors)})</span></h2>'
               '<input type=search data-filter="#tensors tbody tr" placeholder="filter keys" aria-label="filter tensors">')
    head = "".join(f"<th{' class=n' if i in (3, 4, 5, 6) else ''}>{h}</th>" for i, h in enumerate(
        ["key", "dtype", "shape", "bytes", "chunks", "new", "shared", "new share"]))
    out.append(f'<table id=tensors><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')
    if values:
        vrows = [[esc(e.key), f"<code>{esc(_brief(e.value, 200))}</code>"] for e in values]
        out.append(f'<details><summary>Plain values ({len(values)})</summary>{table(["key", "value"], vrows)}</details>')
    return "".join(out)


def _svg_bar(share: float, width: int = 60) -> str:
    w = max(0.0, min(1.0, share)) * width
    return (f'<svg width="{width}" height="8" data-share="{share:.4f}"><rect width="{width}" height="8" fill="#eceff4"/>'
            f'<rect width="{w:.1f}" height="8" fill="#e06c3c"/></svg> <span class=muted>{share:.0%}</span>')


def _export(c) -> str:
    if c.pruned:
        return ""  # nothing to export: its tensors are gone
    cid = c.short_id
    lines = [f"mvc export {cid} -o model.safetensors",
             f"mvc export {cid} -o checkpoint.pt",
             f"mvc export {cid} -o model_dir/            # a Hugging Face model folder, when committed from one",
             f"mvc checkout {cid}                       # move HEAD here",
             f"python -c \"import mvc; state = mvc.Repository.open('.').load('{cid}')\""]
    return ('<h2>Export</h2><p class=muted>This view never writes; run one of these in the repository:</p>'
            f'<pre id=export>{esc(chr(10).join(lines))}</pre>')


# -- diff -----------------------------------------------------------------------------

SORTS = {"model": None, "changed": lambda t: -(t.chunk_fraction or 0), "bytes": lambda t: -(t.bytes_changed or 0),
         "relative": lambda t: -(t.relative_change if t.relative_change is not None else -1),
         "key": lambda t: t.key}


def layer_of(key: str) -> str:
    """The layer a tensor key belongs to: up to its first numeric part
    (``model.layers.3``), else its parent (``model.embed``)."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1]) or key


def diff(view: View, query: dict) -> str:
    repo = view.repo
    rev_a, rev_b = one(query, "a", ""), one(query, "b", "") or "HEAD"  # as 'mvc diff A': B is HEAD
    if not rev_a:
        raise BadInput("pick a commit to compare: A (and B, else HEAD) in the history view")
    sort, show, q = one(query, "sort", "model"), one(query, "show", "changed"), one(query, "q", "")
    asked = one(query, "numbers")
    d = repo.diff(rev_a, rev_b, read_data=asked == "1")
    numbers = asked == "1" or (asked != "0" and _norms_fit(repo, d))
    if numbers and asked != "1":  # within the budget: the norms by default, not "changed 100%" alone
        d = repo.diff(rev_a, rev_b, read_data=True)
    base = dict(a=rev_a, b=rev_b, numbers="1" if numbers else "0")
    tensors = list(d.tensors)
    strip = _strip([t for t in tensors if section_of(t.key) == "model"], numbers, base) + _sections(tensors, base)
    section = one(query, "section", "")
    if section:
        tensors = [t for t in tensors if section_of(t.key) == section]
    if show != "all":
        tensors = [t for t in tensors if t.status != UNCHANGED]
    if q:
        tensors = [t for t in tensors if q in t.key]
    if SORTS.get(sort):
        tensors.sort(key=SORTS[sort])
    s = d.summary
    counts = _status_counts(d.tensors)  # what happened, where more than a change did
    kinds = ", ".join(f"{n} {status}" for status, n in counts) if [st for st, _ in counts] != ["changed"] else ""
    summary = (f"{s.tensors_changed} of {s.tensors} tensors differ{f' ({kinds})' if kinds else ''}; "
               f"{human_bytes(s.bytes_changed)} of {human_bytes(s.bytes_total)} in changed chunks")
    if s.elements_changed is not None:
        summary += f"; {s.parameters_changed:.2%} of parameters changed"
    head = (f'<p id=compared>{_side(d.a, rev_a)} → {_side(d.b, rev_b)} · {esc(title_of(d.a))} → {esc(title_of(d.b))}'
            f'<br><span class=muted>{esc(_apart(repo, d.a, d.b))}</span></p><p id=summary>{esc(summary)}</p>')
    if numbers:
        head += f'<p>{a(url("/diff", **dict(base, numbers="0")), "chunk ids only")}</p>'
    else:
        read = sum(t.nbytes * 2 for t in d.tensors if t.status == CHANGED)
        head += (f'<p class=muted>Answered from chunk ids: no tensor bytes were read. '
                 f'<a href="{esc(url("/diff", **dict(base, numbers="1", sort=sort, show=show, q=q)))}" '
                 f'data-busy=busy id=numbers>Compute the norms of the changes</a> (reads up to '
                 f'{esc(human_bytes(read))} of changed tensors; a lazy clone fetches what it lacks) '
                 '<span id=busy class=busy>reading tensors… the page follows when done</span></p>')
    controls = _diff_controls(dict(base, section=section), sort, show, q, numbers)
    cols = ["key", "status", "dtype", "shape", "bytes", "chunks changed", "changed share", "bytes changed"]
    if numbers:
        cols += ["‖B−A‖/‖A‖", "max |B−A|", "cosine"]
    rows = []
    for t in tensors:
        dtype = t.dtype_b or t.dtype_a if t.dtype_a == t.dtype_b or None in (t.dtype_a, t.dtype_b) \
            else f"{t.dtype_a} → {t.dtype_b}"
        shape = _shape_change(t.shape_a, t.shape_b)
        cells = [esc(t.key), f'<span class="status-{esc(t.status)}">{esc(t.status)}</span>', esc(dtype), esc(shape),
                 esc(human_bytes(t.nbytes)), f"{t.chunks_changed} / {t.chunks}", _svg_bar(t.chunk_fraction),
                 esc(human_bytes(t.bytes_changed))]
        if numbers:
            cells += [esc(number(t.relative_change)), esc(number(t.max_abs_diff)), esc(number(t.cosine))]
        rows.append(f'<tr data-key="{esc(t.key)}" data-status="{esc(t.status)}">'
                    + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    tensor_table = (f'<table id=tensors><thead><tr>{"".join(f"<th>{esc(c)}</th>" for c in cols)}</tr></thead>'
                    f'<tbody>{"".join(rows)}</tbody></table>')
    if not rows:
        tensor_table += "<p class=muted>No tensor matches.</p>"
    record = table(["field", "A", "B"], [[esc(f.name), esc(_brief(f.a, 120)), esc(_brief(f.b, 120))] for f in d.commit],
                   attrs=" id=record-diff") if d.commit else "<p class=muted>The records are the same.</p>"
    values = ""
    if d.values:
        values = "<h2>Plain values</h2>" + table(["key", "status", "A", "B"], [
            [esc(v.key), esc(v.status), esc(_brief(v.a, 120)), esc(_brief(v.b, 120))] for v in d.values])
    body = (head + "<h2>Layers of the model</h2>" + strip + controls
            + f'<div class=cols><div><h2>Tensors</h2>{tensor_table}{values}</div>'
            f'<div><h2>Record</h2>{record}</div></div>')
    return page(f"Diff {d.a.short_id} → {d.b.short_id}", body, view.where())


def _side(c, rev: str) -> str:
    """A diff side's link, and the name it was asked by when that is not its id (HEAD, main)."""
    named = "" if c.id.startswith(rev.lower()) else f' <span class=muted>({esc(rev)})</span>'
    return a(url("/commit", rev=c.id), c.short_id, "id") + named


def _apart(repo, a_commit, b_commit) -> str:
    """How far B is past A in history ("what changed since"), or that they are on different lines."""
    since, apart = ahead_behind(repo, b_commit.id, a_commit.id)
    def n(k):
        return f"{k} commit{'' if k == 1 else 's'}"
    if since == apart == 0:
        return "the same commit"
    if apart == 0:
        return f"B is {n(since)} past A"
    if since == 0:
        return f"A is {n(apart)} past B"
    return f"on different lines of history: B has {n(since)} A lacks, A has {n(apart)} B lacks"


NORMS_BUDGET = 256 << 20  # bytes of changed tensors a diff page reads unasked to show the norms


def _norms_fit(repo, d) -> bool:
    """Whether the norms of ``d``'s changes are computed unasked: the changed tensors of both
    sides come to at most NORMS_BUDGET bytes, all held here (a lazy clone or a bounded cache
    would fetch them from the remote: that is asked for, not done by opening a page)."""
    read = sum(t.nbytes * 2 for t in d.tensors if t.status == CHANGED)
    return read <= NORMS_BUDGET and isinstance(repo.chunks, PackStore)


def _shape_change(a_shape, b_shape) -> str:
    def fmt(s):
        return "-" if s is None else ("×".join(map(str, s)) or "scalar")
    return fmt(b_shape or a_shape) if a_shape == b_shape or None in (a_shape, b_shape) else f"{fmt(a_shape)} → {fmt(b_shape)}"


def _strip(tensors: list, numbers: bool, base: dict) -> str:
    """The heat strip of the model's ``tensors``: one cell per layer, in model order; its heat
    is the share of the layer's bytes in changed chunks, or with numbers its largest relative
    change against the largest of any of the model's layers (the optimizer's moments move far
    more than the weights: on one scale they would leave the model white)."""
    if not tensors:
        return "<p class=muted>No tensor of the model is compared.</p>"
    layers: "OrderedDict[str, list]" = OrderedDict()
    for t in sorted(tensors, key=lambda t: natural_key(t.key)):
        layers.setdefault(layer_of(t.key), []).append(t)
    top = max((t.relative_change for t in tensors if t.relative_change is not None and math.isfinite(t.relative_change)),
              default=0.0)
    cells = []
    for name, ts in layers.items():
        total = sum(t.nbytes for t in ts)
        changed = sum(t.bytes_changed for t in ts)
        moved = sum(t.status != UNCHANGED for t in ts)
        share = changed / total if total else float(moved > 0)
        tip = f"{name}: {moved} of {len(ts)} tensors differ, {share:.0%} of bytes in changed chunks"
        if numbers:
            rels = [t.relative_change for t in ts if t.relative_change is not None]
            rel = max(rels, default=0.0)
            share = 1.0 if not math.isfinite(rel) else (rel / top if top else 0.0)
            tip += f", largest ‖B−A‖/‖A‖ {number(rel)}"
        cells.append((name, share, tip, url("/diff", **base, q=name + ".", show="all")))
    legend = (f"{len(cells)} layers of the model ({len(tensors)} tensors) in model order; heat: the share of each "
              "layer's bytes in changed chunks" if not numbers else
              f"{len(cells)} layers of the model ({len(tensors)} tensors) in model order; heat: each layer's largest "
              f"relative change ‖B−A‖/‖A‖, against the model's largest ({number(top)}, the darkest)")
    return (svg.heat_strip(cells) + f'<p class=muted id=strip-legend>{esc(legend)}; click a layer to list its '
            'tensors</p>')


SECTION_NAMES = {"data": "data-loader state", "optimizer": "optimizer state", "rng": "RNG state"}


def _sections(tensors: list, base: dict) -> str:
    """One line for each section of the state that is not the model's (optimizer, RNG, data
    loader), as ``mvc diff --stat`` sums them up: they are left out of the strip."""
    lines = []
    for section, name in SECTION_NAMES.items():
        ts = [t for t in tensors if section_of(t.key) == section]
        if not ts:
            continue
        moved = [t for t in ts if t.status != UNCHANGED]
        what = ", ".join(f"{n} {status}" for status, n in _status_counts(moved)) or "none differ"
        said = f"{name}: {len(ts)} tensor{'' if len(ts) == 1 else 's'}, {what}"
        kept = [t for t in moved if t.status != "removed"]  # a removed tensor's bytes are gone, not changed
        gone = sum(t.bytes_changed for t in moved if t.status == "removed")
        sizes = ([f"{human_bytes(sum(t.bytes_changed for t in kept))} in changed chunks"] if kept else []) + \
            ([f"{human_bytes(gone)} removed"] if gone else [])
        if moved:
            said += "; " + ", ".join(sizes or ["no bytes"])
            rels = [t.relative_change for t in moved if t.relative_change is not None]
            if rels and section == "optimizer":  # RNG and data positions are bytes and counters: no scale
                said += f", largest ‖B−A‖/‖A‖ {number(max(rels))}"
        lines.append(f'<li data-section="{esc(section)}">{esc(said)} · '
                     f'{a(url("/diff", **base, section=section, show="all"), "list them")}</li>')
    if not lines:
        return ""
    return f'<ul id=sections class=muted>{"".join(lines)}</ul>'


def _status_counts(tensors: list) -> list:
    """[(status, how many)] of ``tensors``, in the order changed, reshaped, added, removed."""
    order = ("changed", "reshaped", "added", "removed")
    return [(status, n) for status in order if (n := sum(t.status == status for t in tensors))]


def _diff_controls(base, sort, show, q, numbers) -> str:
    sorts = [s for s in SORTS if numbers or s != "relative"]
    options = "".join(f'<option value="{s}"{" selected" if s == sort else ""}>{s}</option>' for s in sorts)
    hidden = "".join(f'<input type=hidden name="{esc(k)}" value="{esc(v)}">' for k, v in base.items() if v)
    return ('<form class=filters method=get action="/diff">' + hidden
            + f'<label>sort by<select name=sort>{options}</select></label>'
            f'<label>tensors<select name=show><option value=changed{" selected" if show != "all" else ""}>'
            f'that differ</option><option value=all{" selected" if show == "all" else ""}>all</option></select></label>'
            f'<label>key contains<input name=q value="{esc(q)}"></label><button type=submit>Apply</button></form>')


# -- curves ------------------------------------------------------------------------------

def curves(view: View, query: dict) -> str:
    repo = view.repo
    local = {r.name: r.id for r in repo.branches()}
    tracking = {r.name: r.id for r in repo.remotes.branches()}
    tips = {**local, **tracking}
    branches = list(tips)
    # by default every branch, and the remote-tracking ones that add a line of their own
    default = list(local) + [b for b, cid in tracking.items() if cid not in local.values()]
    chosen = [b for b in query.get("branch", []) if b in tips] or default
    walked, rows = view.everything()
    by_id = {c.id: c for c in walked}
    lane_of = {c.id: row.lane for c, row in zip(walked, rows)}  # a branch's line has its history lane's colour
    lines = {b: _first_parents(by_id, tips[b]) for b in chosen}
    names = number_names([c for cs in lines.values() for c in cs])
    metric = one(query, "metric") or next(iter(names), "step")
    x_name = one(query, "x", "step")
    series = []
    for b, commits in lines.items():
        pts = []
        for i, c in enumerate(reversed(commits)):
            y = record_number(c, metric)
            x = c.step if x_name == "step" and c.step is not None else (c.time if x_name == "time" else i)
            if y is not None:
                pts.append((x, y, c.id, f"{b} {c.short_id} step {number(c.step)}: {metric} = {number(y)}\n{title_of(c)}"))
        series.append((b, pts))
    # a value attribute: without one a browser submits the text with its spaces collapsed
    options = "".join(f'<option value="{esc(n)}"{" selected" if n == metric else ""}>{esc(n)}</option>'
                      for n in names)
    boxes = "".join(f'<label class=inline><input type=checkbox name=branch value="{esc(b)}"'
                    f'{" checked" if b in chosen else ""}> {esc(b)}</label>' for b in branches)
    xs = "".join(f'<option value={x}{" selected" if x == x_name else ""}>{x}</option>' for x in ("step", "index", "time"))
    form = (f'<form class=filters method=get action="/curves"><label>number<select name=metric>{options}</select></label>'
            f'<label>against<select name=x>{xs}</select></label>'
            f'<label>scale<select name=y><option value=linear>linear</option>'
            f'<option value=log{" selected" if one(query, "y") == "log" else ""}>log</option></select></label><fieldset><legend>branches</legend>{boxes}</fieldset>'
            '<button type=submit>Draw</button></form>')
    counts = ", ".join(f"{esc(b)}: {len(p)} points" for b, p in series)
    log_y = one(query, "y") == "log"
    chart = svg.curves(series, x_name if x_name != "index" else "commit along the branch",
                       metric + (" (log scale)" if log_y else ""),
                       x_format=(lambda t: when(t)[5:]) if x_name == "time" else None, log_y=log_y,
                       lanes=[lane_of.get(tips[b], i) for i, (b, _) in enumerate(series)])
    body = form + chart + f'<p class=muted>{counts}. Each point is a commit: click it to open it.</p>'
    return page("Curves", body, view.where(), "/curves")


def _first_parents(by_id: dict, tip: str) -> list:
    """The commits of ``log(tip)`` (first parents, newest first), from the view's walk."""
    return [c for _, c in reach.first_parents(by_id.get, tip)]  # ends where the view's walk ended


# -- bisect -----------------------------------------------------------------------------

def bisect(view: View, query: dict) -> str:
    repo = view.repo
    if not repo.bisect.in_progress():
        body = ("<p>No bisect is in progress.</p><p class=muted>Start one at the terminal: "
                "<code>mvc bisect start BAD GOOD</code>; this page then shows its range, verdicts and candidate.</p>")
        return page("Bisect", body, view.where(), "/bisect")
    log = repo.bisect.log(changes=False)  # the page links the diff; it reads no tensor
    s = log.status
    facts = [("branch", esc(s.branch or "-")),
             ("good (the older end)", a(url("/commit", rev=s.good), _short(s.good), "id")),
             ("bad (the newer end)", a(url("/commit", rev=s.bad), _short(s.bad), "id")),
             ("range", a(url("/", range=f"{s.good}..{s.bad}"), "the commits between them")
              + " · " + a(url("/diff", a=s.good, b=s.bad), "diff good → bad"))]
    if s.first_bad is not None:
        c = s.first_bad
        facts.append(("first bad commit", a(url("/commit", rev=c.id), c.short_id, "id") + " " + esc(title_of(c))
                      + (" · " + a(url("/diff", a=c.parents[0], b=c.id), "what it changed") if c.parents else "")))
    elif s.suspects:
        facts.append(("suspects", " ".join(a(url("/commit", rev=x), _short(x), "id") for x in s.suspects)))
    else:
        c = s.candidate
        facts.append(("candidate", f'<span id=candidate>{a(url("/commit", rev=c.id), c.short_id, "id")}</span> '
                      f'{esc(title_of(c))}' + (f' <span class=muted>step {esc(number(c.step))}</span>'
                                                if f"step {c.step}" not in title_of(c) else "")))
        facts.append(("left", f"{s.remaining} commits to judge, about {s.steps} steps"))
        facts.append(("judge it", f"<code>mvc export {esc(c.short_id)} -o candidate.pt</code>, then "
                      "<code>mvc bisect good</code> or <code>mvc bisect bad</code>"))
    if s.skipped:
        facts.append(("skipped", " ".join(a(url("/commit", rev=x), _short(x), "id") for x in s.skipped)))
    rows = [[f'<span class="verdict {esc(e.verdict)}">{esc(e.verdict)}</span>',
             a(url("/commit", rev=e.commit), _short(e.commit), "id"), esc(number(e.step)),
             esc((e.message or "").splitlines()[0] if e.message else ""), esc(e.note)] for e in log.entries]
    body = (table(["", ""], [[f"<b>{esc(k)}</b>", v] for k, v in facts], "facts")
            + "<h2>Verdicts</h2>" + table(["verdict", "commit", "step", "message", "note"], rows, "verdicts"))
    return page("Bisect", body, view.where(), "/bisect")


# -- storage ------------------------------------------------------------------------------

def storage(view: View, query: dict) -> str:
    repo = view.repo
    st = repo.status()
    packs = usage.pack_usage(repo)
    stored, raw = sum(p.stored_bytes for p in packs), sum(p.raw_bytes for p in packs)
    facts = [("commits", st.commits), ("branches", st.branches), ("tags", st.tags),
             ("chunks held here", st.chunks), ("chunk size", human_bytes(st.chunk_size)),
             ("packs", f"{st.packs}, {human_bytes(st.pack_bytes)} on disk"),
             ("chunk records", f"{human_bytes(stored)} stored for {human_bytes(raw)} raw"
              + (f" ({stored / raw:.3f}×)" if raw else ""))]
    out = [table(["", ""], [[f"<b>{esc(k)}</b>", esc(v)] for k, v in facts], "facts")]
    out.append("<h2>Against one torch.save per checkpoint</h2>" + _against_torch_save(view, st.pack_bytes))
    out.append("<h2>What gc would free</h2>" + _gc_estimate(repo))
    out.append("<h2>Remotes and cache</h2>" + _remotes(repo))
    rows = [[f"<code>{esc(p.name)}</code>", f'<span class=n>{esc(human_bytes(p.file_bytes))}</span>', esc(p.chunks),
             esc(human_bytes(p.stored_bytes)), esc(human_bytes(p.raw_bytes)),
             esc(f"{p.stored_bytes / p.raw_bytes:.3f}×" if p.raw_bytes else "-")] for p in packs]
    out.append(f"<h2>Packs <span class=muted>({len(packs)})</span></h2>"
               + table(["pack", "file", "chunks", "stored", "raw", "stored/raw"], rows, attrs=" id=packs"))
    return page("Storage", "".join(out), view.where(), "/storage")


MAX_SAVINGS_TREES = 2000  # checkpoints the storage page sums unasked; more: it says so


def _against_torch_save(view, pack_bytes: int) -> str:
    """What one torch.save file per checkpoint would take (the tensor bytes of every kept
    commit's state, each checkpoint whole) against this repository's packs on disk."""
    repo = view.repo
    if not isinstance(repo.chunks, PackStore):
        return ("<p class=muted id=saving>Not figured here: part of the data is only on a remote "
                "(a lazy clone or a bounded cache), so the packs on disk are not the whole store.</p>")
    commits, _ = view.everything()
    trees = {c.tree: c.id for c in commits if not c.pruned}
    if len(trees) > MAX_SAVINGS_TREES:
        return (f"<p class=muted id=saving>Not figured here: {len(trees)} checkpoints, more than the "
                f"{MAX_SAVINGS_TREES} this page reads unasked.</p>")
    whole = sum(e.nbytes for cid in trees.values() for e in repo.entries(cid) if e.kind == "tensor")
    facts = [("checkpoints kept", str(len(trees))),
             ("one torch.save each", f"{human_bytes(whole)} of tensor data"),
             ("this repository", f"{human_bytes(pack_bytes)} of packs on disk")]
    if pack_bytes and whole:
        facts.append(("saving", f"{human_bytes(max(0, whole - pack_bytes))}: {whole / pack_bytes:.1f}× smaller"
                      if whole >= pack_bytes else f"none: the packs are {pack_bytes / whole:.2f}× the files"))
    return (table(["", ""], [[f"<b>{esc(k)}</b>", esc(v)] for k, v in facts], "facts", " id=saving")
            + "<p class=muted>Unchanged chunks are stored once across checkpoints; torch.save writes each "
            "checkpoint whole (its pickle framing not counted).</p>")


def _gc_estimate(repo) -> str:
    try:  # no wait for a running gc: the page holds the view's lock, and every other page with it
        r = repo.gc(dry_run=True, wait=0)
    except GcLockBusy as exc:
        return (f'<p class=err id=gc>gc is running ({esc(exc.holder)}): the estimate is not available now; '
                'reload this page when it is done.</p>')
    except MvcError as exc:  # say what failed; the rest of the page stands
        return f'<p class=err>{esc(exc)}</p>'
    facts = [("bytes", human_bytes(r.bytes_reclaimed)), ("chunks", r.chunks_removed),
             ("commits / trees / tensors", f"{r.commits_removed} / {r.trees_removed} / {r.tensors_removed}"),
             ("packs deleted / rewritten", f"{r.packs_deleted} / {r.packs_rewritten}")]
    notes = "".join(f"<li>{esc(left.pack)}: {esc(human_bytes(left.bytes))} kept ({esc(left.why)})</li>" for left in r.left)
    return (table(["", ""], [[esc(k), esc(v)] for k, v in facts], "facts", " id=gc")
            + (f"<ul>{notes}</ul>" if notes else "") + "<p class=muted>An estimate (gc --dry-run); "
            "<code>mvc gc</code> at the terminal frees it.</p>")


def _remotes(repo) -> str:
    remotes = repo.remotes.list()
    if not remotes:
        return "<p class=muted>No remote: every chunk is held here.</p>"
    rows = [[esc(r.name), f"<code>{esc(r.url)}</code>", esc(r.endpoint_url or "")] for r in remotes]
    out = [table(["remote", "url", "endpoint"], rows)]
    tracking = repo.remotes.branches()
    if tracking:
        out.append(table(["tracking ref", "commit"], [[esc(r.name), a(url("/commit", rev=r.id), _short(r.id), "id")]
                                                      for r in tracking]))
    try:
        cs = repo.cache.status()
    except MvcError as exc:
        return "".join(out) + f'<p class=err>{esc(exc)}</p>'
    cached = repo.cache.remote()
    facts = [("figures against remote", cs.remote or "-"),
             ("local cache of a remote", f"yes, of {cached} (chunks come back from it on demand)" if cached
              else "no: every chunk is kept here"),
             ("cache budget", human_bytes(cs.budget) if cs.budget else "none"),
             ("local packs", human_bytes(cs.local_bytes)), ("local chunks", cs.local_chunks),
             ("remote holds", f"{cs.remote_chunks} chunks, {human_bytes(cs.remote_bytes)} (as last listed)"),
             ("reachable chunks only on the remote", cs.only_remote),
             ("reachable chunks not yet on the remote", cs.only_local)] + \
        ([("reachable chunks neither here nor on the remote", cs.lost)] if cs.lost else [])
    out.append(table(["", ""], [[esc(k), esc(v)] for k, v in facts], "facts", " id=cache"))
    return "".join(out)
