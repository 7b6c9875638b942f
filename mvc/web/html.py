"""Building HTML safely: every string from the repository goes through ``esc``.

Vocabulary:

- **page**: a whole HTML document, built by ``page(title, body)``; the body
  is a string of HTML made by the page functions in ``pages.py``.
- **link**: a URL to one of the server's routes with its query string,
  made by ``url`` (values percent-encoded) and escaped again where it
  lands in an attribute.

The style sheet and the script are Python strings served from
``/static/``; nothing is fetched from elsewhere, and the Content-Security-
Policy the server sends forbids inline scripts, so an escaping slip cannot
run code either.
"""

import html
import math
import time
from urllib.parse import urlencode


def esc(value) -> str:
    """``value`` as text that HTML shows literally, in content and in quoted attributes."""
    return html.escape(str(value), quote=True)


def url(route: str, **params) -> str:
    """A link to ``route`` with ``params`` (None values dropped, lists repeated), not yet HTML-escaped."""
    pairs = []
    for key, value in params.items():
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if v is not None and v != "":
                pairs.append((key, str(v)))
    return route + ("?" + urlencode(pairs) if pairs else "")


def a(href: str, text, cls: str = "", title: str = "") -> str:
    extra = (f' class="{esc(cls)}"' if cls else "") + (f' title="{esc(title)}"' if title else "")
    return f'<a href="{esc(href)}"{extra}>{esc(text)}</a>'


def human_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def number(value) -> str:
    """A metric or value as people read it: floats to 6 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)


def when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def title_of(commit) -> str:
    return commit.message.splitlines()[0] if commit.message else ""


def table(headers, rows, cls: str = "", attrs: str = "") -> str:
    """A table; ``headers`` are HTML (already escaped), each row a list of HTML cells."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{esc(cls)}"{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


NAV = (("/", "History"), ("/curves", "Curves"), ("/bisect", "Bisect"), ("/storage", "Storage"))


def page(title: str, body: str, where: str, active: str = "") -> str:
    """A whole document: the navigation bar, ``title`` (text) and ``body`` (HTML)."""
    nav = "".join(f'<a href="{route}"{" class=on" if route == active else ""}>{name}</a>' for route, name in NAV)
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<title>{esc(title)} · mvc</title>"
            '<meta name=viewport content="width=device-width, initial-scale=1">'
            '<link rel=stylesheet href="/static/style.css"><script src="/static/app.js" defer></script>'
            f'</head><body><header><b>mvc</b>{nav}<span class=where>{esc(where)}</span></header>'
            f"<main><h1>{esc(title)}</h1>{body}</main></body></html>")


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#fff}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#c9d3e6;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .where{margin-left:auto;color:#8a96ad;font-size:12px;min-width:0;overflow-wrap:anywhere}
main{padding:8px 16px}h1{font-size:18px;margin:8px 0}h2{font-size:15px;margin:16px 0 6px}
a{color:#1f5fbf}code,pre,.id{font-family:ui-monospace,monospace;font-size:12.5px}
table{border-collapse:collapse}th,td{text-align:left;padding:2px 8px;border-bottom:1px solid #eceff4;vertical-align:top}
th{background:#f5f7fa;font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
table.log td{padding:0 8px;height:26px;vertical-align:middle;border:0;white-space:nowrap}
table.log td.g{padding:0;line-height:0}table.log td.c{white-space:normal;max-width:24em}table.log th{max-width:10em;overflow-wrap:anywhere}table.log td.num{text-align:right;font-variant-numeric:tabular-nums}table.log td.best{color:#1d6b35}table.log tr:hover{background:#f3f7ff}
.deco{display:inline-block;font-size:11px;border-radius:3px;padding:0 4px;margin-right:3px;background:#e3ecfb;color:#1f4e9a}
.deco.tag{background:#fbf0d9;color:#7a5300}.deco.remote{background:#f0e6fb;color:#5b2a8a}.deco.head{background:#dff3e4;color:#1d6b35}
.muted{color:#77809a}.bar{display:inline-block;height:8px;background:#e06c3c;vertical-align:middle}
.bar.bg{background:#eceff4;width:60px;position:relative}.bar.bg .bar{position:absolute;left:0;top:0}
form.filters{display:flex;gap:8px;flex-wrap:wrap;align-items:end;margin:6px 0}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:#55607a}
form.filters label .err{max-width:36em;overflow-wrap:anywhere;font-size:13px}form.filters input[aria-invalid]{border-color:#a3262b}
form.filters label.inline{display:inline-flex;flex-direction:row;gap:4px;margin-right:10px;font-size:13px;color:#1d2330}
fieldset{border:1px solid #d5dae3;padding:2px 8px;max-width:900px}fieldset legend{font-size:12px;color:#55607a}
.cols{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap}.cols>div{min-width:280px}
.pager{margin:8px 0}.pager a,.pager span{margin-right:12px}
details{margin:4px 0;break-inside:avoid}#record{columns:3 380px;column-gap:24px}#record td{max-width:30em;overflow-wrap:anywhere}
table.log td.msg{max-width:36em;overflow:hidden;text-overflow:ellipsis}#record-diff td{max-width:28em;overflow-wrap:anywhere}#record input{column-span:all}summary{cursor:pointer;font-weight:600}
.box{border:1px solid #e1e5ec;border-radius:6px;padding:8px 12px;margin:8px 0;background:#fbfcfe}
.status-added{color:#1d6b35}.status-removed{color:#a3262b}.status-changed{color:#a35a00}.status-reshaped{color:#6a2ca3}
.status-unchanged{color:#77809a}.err{color:#a3262b}.busy{display:none;color:#a35a00}.busy.on{display:inline}
svg text{font:11px system-ui,sans-serif}
"""

# Plain script, no build step: live filtering of tables, and a note while a slow page loads.
SCRIPT = """
document.addEventListener('DOMContentLoaded', function () {
  document.querySelectorAll('input[data-filter]').forEach(function (box) {
    var rows = document.querySelectorAll(box.getAttribute('data-filter'));
    box.addEventListener('input', function () {
      var q = box.value.toLowerCase();
      rows.forEach(function (r) { r.hidden = q !== '' && r.textContent.toLowerCase().indexOf(q) < 0; });
      document.querySelectorAll('details[data-group]').forEach(function (d) {
        if (q !== '') d.open = true;
        var any = d.querySelector('tbody tr:not([hidden])');
        d.hidden = q !== '' && !any;
      });
    });
  });
  document.querySelectorAll('a[data-busy]').forEach(function (link) {
    link.addEventListener('click', function () {
      var note = document.getElementById(link.getAttribute('data-busy'));
      if (note) note.classList.add('on');
    });
  });
});
"""
