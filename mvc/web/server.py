"""The HTTP server of ``mvc serve``: routes, the token, and what every answer carries.

Vocabulary:

- a **route** is a fixed path (``/``, ``/commit``, ``/diff``, ...) mapped to a
  page function; parameters travel in the query string. Request paths are
  looked up in that table only, so no request names a file: the style
  sheet and script are Python strings.
- the **token** guards a server bound to anything but the loopback: every
  request must carry it (``?token=``, an ``Authorization: Bearer`` header,
  or the cookie the first tokened request sets), as Jupyter does. The
  cookie is named with the port (``mvc_token_8470``): cookies do not keep
  ports apart, so two servers on one host would otherwise overwrite
  each other's.
- the server is **read-only**: GET only (every other method is refused
  with 405), and the pages call only reading verbs.
- the **gate**: the Host check, the browser's word that another site sent
  the request (``Sec-Fetch-Site``), the token, the method and a GET's lack
  of a body, checked for every request before anything else; a request it
  refuses ends its connection.
- the **deadline**: each request must arrive whole within
  ``request_timeout`` seconds of the server waiting for it, and each answer
  be sent within as long again, however the client paces its bytes; and
  at most ``workers`` connections are served at once (any more are
  answered 503 and closed), so slow clients cannot pile up threads.
- the **log** (the terminal running ``mvc serve``) shows what clients sent
  with every byte but printable ASCII escaped: a request line cannot move
  the cursor, retitle the window or forge a line.

Why the standard library's ThreadingHTTPServer: pages are rendered whole
on the server from data the library returns, so the server's own cost is
tiny next to the page's (see benchmarks/bench_web.py), and it adds no
dependency for users of an offline training box.
"""

import hmac
import io
import secrets
import socket
import sys
import threading
import time
import traceback
from http import HTTPStatus
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
COOKIE = "mvc_token_{port}"
# what a browser says of a request another site's page made (a link, a form, an image):
# such a request may not read this server, and a lazy clone's page would download for it
FOREIGN_SITES = {"cross-site", "same-site"}  # same-site: another port of this host is another app
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


def printable(text: str) -> str:
    """``text`` with every character but printable ASCII escaped (as ``\\x1b``, ``\\n``, ``\\\\``):
    what clients send reaches the log only as text that cannot drive a terminal."""
    return text.encode("unicode_escape").decode("ascii")


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
        self.deadline = time.monotonic() + self.timeout
        self.rfile.close()  # read through the deadline instead: a timeout per read resets with each byte
        self.rfile = io.BufferedReader(_DeadlineReader(self))

    def handle_one_request(self):
        """Each request (the next one on a kept-alive connection too) must arrive whole
        within the request timeout, however slowly its bytes trickle in."""
        self.deadline = time.monotonic() + self.server.request_timeout
        super().handle_one_request()

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
        if FOREIGN_SITES & {value.strip().lower() for value in self.headers.get_all("Sec-Fetch-Site", [])}:
            return (HTTPStatus.FORBIDDEN, TEXT, b"a page of another site sent this request: open the address "
                    b"mvc serve printed yourself\n", {})
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
        name = COOKIE.format(port=self.server.server_address[1])
        if given:
            if hmac.compare_digest(given.encode(), token.encode()):
                return f"{name}={token}; HttpOnly; SameSite=Strict; Path=/"
            return False
        held = cookies(self.headers.get_all("Cookie", []), name)
        return None if any(hmac.compare_digest(value.encode(), token.encode()) for value in held) else False

    # -- answers -------------------------------------------------------------------------
    def _error(self, status, message: str, extra: dict):
        body = page(f"{status.value} {status.phrase}", f'<p class=err>{esc(message)}</p><p><a href="/">history</a></p>',
                    self.server.view.where())
        self._send(status, HTML, body.encode(), extra)

    def _send(self, status, kind: str, data: bytes, extra: dict = None, close: bool = False):
        """Answer with ``data``; ``close``: and close the connection after it."""
        self.connection.settimeout(self.server.request_timeout)  # in all, for the whole answer (sendall)
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
            line = line.replace(self.server.token, "...")
        sys.stderr.write(f"{self.address_string()} {printable(line)}\n")


def cookies(headers: list, name: str) -> list:
    """The values of every cookie ``name`` in the Cookie ``headers``, read pair by pair: a
    pair another application wrote against the RFC (spaces, commas, quotes) spoils only itself."""
    found = []
    for header in headers:
        for pair in header.split(";"):
            key, sep, value = pair.partition("=")
            if sep and key.strip() == name:
                found.append(value.strip())
    return found


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, read so that none arrives after its handler's ``deadline``:
    each read waits at most for what is left of it (TimeoutError once none is)."""

    def __init__(self, handler):
        super().__init__()
        self.handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive within the request timeout")
        self.handler.connection.settimeout(left)
        return self.handler.connection.recv_into(buffer)


LOCK_WAIT = 2.0  # seconds a page waits for a running gc before it answers 503
REQUEST_TIMEOUT = 30.0  # seconds a request may take to arrive (or its answer to be read) before it is dropped
WORKERS = 32  # connections served at once; a browser opens about 6
_BUSY_TEXT = b"mvc serve is answering too many connections now\n"
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
        b"Retry-After: 5\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT))


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, view, host: str = "127.0.0.1", port: int = 0, token=None, quiet: bool = False,
                 request_timeout: float = REQUEST_TIMEOUT, lock_wait: float = LOCK_WAIT, workers: int = WORKERS):
        """Serve ``view`` on ``host``:``port`` (0: a free port); ``host`` may be an IPv6
        address (``::1``, also in brackets). ``token``: None makes one when ``host`` is not
        the loopback (and one is always made there). ``request_timeout``: the most seconds
        a request may take to arrive whole, and its answer to be sent, before the
        connection is dropped. ``lock_wait``: the most seconds a page waits for a running
        gc (then 503); pages are answered one at a time, so a longer wait would hold up
        every other page too. ``workers``: connections served at once; more are answered 503.
        Raises OSError if it cannot listen there."""
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if token is None or (not token and not is_loopback(host)):  # elsewhere a token is not optional
            token = "" if is_loopback(host) else secrets.token_urlsafe(24)
        self.view, self.token, self.quiet, self.request_timeout = view, token, quiet, request_timeout
        self._slots = threading.BoundedSemaphore(workers)
        view.repo.lock_timeout = min(view.repo.lock_timeout, lock_wait)
        self.address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]  # IPv4 or IPv6
        super().__init__((host, port), Handler)

    def process_request(self, request, client_address):
        """Serve the connection in a thread of its own if fewer than ``workers`` run; else say busy."""
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(BUSY)
                request.setblocking(False)
                request.recv(65536)  # what the client sent already: closed unread, it would reset away the 503
            except OSError:
                pass
            self.shutdown_request(request)
            return
        threading.Thread(target=self._serve, args=(request, client_address), daemon=True).start()

    def _serve(self, request, client_address):
        try:
            self.process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        """A client that went away mid-answer (a closed tab, a cancelled load) is no error
        of the server's: say nothing. Anything else prints its traceback, escaped line by
        line as the log is (an exception's message may quote what the client sent)."""
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            return
        lines = [f"Exception occurred during processing of request from {client_address}"]
        lines += traceback.format_exc().splitlines()
        sys.stderr.write("".join(printable(line) + "\n" for line in lines))

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if host in ("0.0.0.0", "::"):  # every address: name this machine, as Jupyter does
            host = socket.gethostname()
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/" + (f"?token={self.token}" if self.token else "")
