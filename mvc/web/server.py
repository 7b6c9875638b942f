"""The HTTP server of ``mvc serve``: routes, the token, and what every answer carries.

Vocabulary:

- a **route** is a fixed path (``/``, ``/commit``, ``/diff``, ...) mapped to a
  page function; parameters travel in the query string. Request paths are
  looked up in that table only, so no request names a file: the style
  sheet and script are Python strings.
- the **token** guards a server bound to anything but the loopback: every
  request must carry it (``?token=``, an ``Authorization: Bearer`` header,
  or the cookie the first tokened request sets), as Jupyter does.
- the server is **read-only**: GET only (every other method is refused
  with 405), and the pages call only reading verbs.
- the **gate**: the Host check, the token, the method and a GET's lack of
  a body, checked for every request before anything else; a request it
  refuses ends its connection.

Why the standard library's ThreadingHTTPServer: pages are rendered whole
on the server from data the library returns, so the server's own cost is
tiny next to the page's (see benchmarks/bench_web.py), and it adds no
dependency for users of an offline training box.
"""

import hmac
import secrets
import socket
import sys
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address
from urllib.parse import parse_qs, urlsplit

from ..errors import (AmbiguousRevision, BadInput, CommitPruned, InvalidRefName, LockHeld, MvcError, ObjectNotFound,
                      RemoteDamaged, RemoteError, UnknownRevision)
from . import pages
from .html import SCRIPT, STYLE, esc, page

ROUTES = {"/": pages.history, "/commit": pages.commit, "/diff": pages.diff, "/curves": pages.curves,
          "/bisect": pages.bisect, "/storage": pages.storage}
STATIC = {"/static/style.css": ("text/css; charset=utf-8", STYLE.encode()),
          "/static/app.js": ("text/javascript; charset=utf-8", SCRIPT.encode())}
# no inline script or style, nothing from elsewhere, no framing, forms only to this server
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
          "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
COOKIE = "mvc_token"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
TEXT, HTML = "text/plain; charset=utf-8", "text/html; charset=utf-8"
# An error's status says whose it is: the request's (4xx: ask otherwise) or what the server
# relies on (5xx: the same request may work later, or the repository needs care). First match wins.
STATUS_OF = (((UnknownRevision, AmbiguousRevision, ObjectNotFound, CommitPruned), HTTPStatus.NOT_FOUND),
             ((BadInput, InvalidRefName), HTTPStatus.BAD_REQUEST),
             (LockHeld, HTTPStatus.SERVICE_UNAVAILABLE),  # a gc or a remote's lease: busy for now
             ((RemoteError, RemoteDamaged), HTTPStatus.BAD_GATEWAY),  # a lazy clone's remote failed
             (MvcError, HTTPStatus.INTERNAL_SERVER_ERROR))  # e.g. damage the page found: its message says so


def status_of(exc: MvcError) -> HTTPStatus:
    return next(status for kinds, status in STATUS_OF if isinstance(exc, kinds))


def is_loopback(host: str) -> bool:
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class Handler(BaseHTTPRequestHandler):
    server_version = "mvc-serve"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def setup(self):
        # each connection holds a thread: without a timeout, idle or half-sent requests
        # would hold them (and their sockets) for ever
        self.timeout = self.server.request_timeout
        super().setup()

    # -- the gate every request passes ------------------------------------------
    def parse_request(self) -> bool:
        """Read the request line and headers, then pass the request through the gate: on
        False the refusal is sent and the connection closed. http.server calls this for
        every request before it looks at the method, so no method skips the checks."""
        if not super().parse_request():
            return False  # http.server answered (400, 414 ...) and closes the connection
        refusal = self._refusal()
        if refusal is None:
            return True
        self._send(*refusal, close=True)
        return False

    def _refusal(self):
        """(status, content type, body, headers) refusing this request, or None to answer it.

        A refused request's body is never read, so its connection is closed: kept
        alive, the body would be read as the next request, one that passed no check.
        """
        if not self._host_ok():
            return (HTTPStatus.FORBIDDEN, TEXT, b"unexpected Host header: open the address mvc serve printed\n", {})
        self._query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        self._cookie = self._authorised(self._query)
        if self._cookie is False:
            return (HTTPStatus.FORBIDDEN, HTML, page(
                "Token needed", "<p>This server needs its token: open the address <code>mvc serve</code> printed "
                "(it ends in <code>?token=…</code>).</p>", "").encode(), {})
        if self.command != "GET":
            return (HTTPStatus.METHOD_NOT_ALLOWED, TEXT, b"mvc serve is read-only: only GET is answered\n",
                    {"Allow": "GET"})
        if self._has_body():
            return HTTPStatus.BAD_REQUEST, TEXT, b"a GET request carries no body\n", {}
        return None

    def _has_body(self) -> bool:
        length = self.headers.get("Content-Length", "").strip()
        return "Transfer-Encoding" in self.headers or (length != "" and (not length.isdigit() or int(length) > 0))

    def do_GET(self):
        path = urlsplit(self.path).path
        extra = {"Set-Cookie": self._cookie} if self._cookie else {}
        if path in STATIC:
            kind, data = STATIC[path]
            return self._send(HTTPStatus.OK, kind, data, dict(extra, **{"Cache-Control": "max-age=3600"}))
        route = ROUTES.get(path)
        if route is None:
            return self._error(HTTPStatus.NOT_FOUND, f"no page at {path}", extra)
        view = self.server.view
        try:
            with view.lock:
                html = route(view, self._query)
        except MvcError as exc:
            return self._error(status_of(exc), str(exc), extra)
        except Exception as exc:  # a bug: say so on the page, details on the server's terminal
            self.log_error("error in %s: %r", path, exc)
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error: see the terminal running mvc serve",
                               extra)
        self._send(HTTPStatus.OK, HTML, html.encode(), extra)

    # -- checks ------------------------------------------------------------------------
    def _host_ok(self) -> bool:
        """On the loopback, only loopback Host names: a page elsewhere cannot reach
        this server through DNS rebinding. Elsewhere the token decides."""
        if self.server.token:
            return True
        hosts = self.headers.get_all("Host", [])
        if len(hosts) != 1:  # none (HTTP/1.0), or several that a proxy and this server may read apart
            return False
        host = hosts[0]
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name.lower() in LOOPBACK_NAMES

    def _authorised(self, query: dict):
        """None when no token is needed or the cookie holds it; a Set-Cookie value when
        the query or header brings it; False when it is missing or wrong."""
        token = self.server.token
        if not token:
            return None
        given = (query.get("token") or [""])[0]
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            given = given or header[len("Bearer "):]
        if given:
            if hmac.compare_digest(given.encode(), token.encode()):
                return f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/"
            return False
        jar = SimpleCookie()
        try:
            jar.load(self.headers.get("Cookie", ""))
        except Exception:  # a malformed cookie header is no token
            return False
        held = jar.get(COOKIE)
        return None if held is not None and hmac.compare_digest(held.value.encode(), token.encode()) else False

    # -- answers -------------------------------------------------------------------------
    def _error(self, status, message: str, extra: dict):
        body = page(f"{status.value} {status.phrase}", f'<p class=err>{esc(message)}</p><p><a href="/">history</a></p>',
                    self.server.view.where())
        self._send(status, HTML, body.encode(), extra)

    def _send(self, status, kind: str, data: bytes, extra: dict = None, close: bool = False):
        """Answer with ``data``; ``close``: and close the connection after it."""
        self.send_response(status)
        headers = {"Content-Type": kind, "Content-Length": str(len(data)), "Content-Security-Policy": POLICY,
                   "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                   "X-Frame-Options": "DENY", "Cache-Control": "no-store"}
        headers.update(extra or {})
        if close:
            headers["Connection"] = "close"  # http.server then ends the connection after this answer
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, fmt, *args):
        if self.server.quiet:
            return
        line = fmt % args
        if self.server.token:
            line = line.replace(self.server.token, "…")
        sys.stderr.write(f"{self.address_string()} {line}\n")


LOCK_WAIT = 2.0  # seconds a page waits for a running gc before it answers 503
REQUEST_TIMEOUT = 30.0  # seconds a connection may stay silent (or not read) before it is dropped


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, view, host: str = "127.0.0.1", port: int = 0, token=None, quiet: bool = False,
                 request_timeout: float = REQUEST_TIMEOUT, lock_wait: float = LOCK_WAIT):
        """Serve ``view`` on ``host``:``port`` (0: a free port). ``token``: None makes one
        when ``host`` is not the loopback (and one is always made there). ``request_timeout``:
        seconds any read or write on a connection may wait before the connection is dropped.
        ``lock_wait``: the most seconds a page waits for a running gc (then 503); pages are
        answered one at a time, so a longer wait would hold up every other page too."""
        if token is None or (not token and not is_loopback(host)):  # elsewhere a token is not optional
            token = "" if is_loopback(host) else secrets.token_urlsafe(24)
        self.view, self.token, self.quiet, self.request_timeout = view, token, quiet, request_timeout
        view.repo.lock_timeout = min(view.repo.lock_timeout, lock_wait)
        super().__init__((host, port), Handler)

    def handle_error(self, request, client_address):
        """A client that went away mid-answer (a closed tab, a cancelled load) is no error
        of the server's: say nothing. Anything else keeps the standard traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if host in ("0.0.0.0", "::"):  # every address: name this machine, as Jupyter does
            host = socket.gethostname()
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/" + (f"?token={self.token}" if self.token else "")
