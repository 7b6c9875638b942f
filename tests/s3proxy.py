"""A loopback HTTP proxy in front of a real S3 server that misbehaves on purpose, as some servers do.

Modes (attributes, changeable while it runs):

- ``suffix_quirk``: a suffix range ``Range: bytes=-N`` is sent on as
  ``bytes=0-(N-1)``, so the answer is the object's first N bytes with a
  Content-Range saying so: what s3rver (npm) does.
- ``ignore_ranges``: ``Range`` headers are dropped from GETs, so the answer
  is the whole object (200, no Content-Range): a server without ranges.
- ``ignore_conditions``: ``If-Match`` and ``If-None-Match`` are dropped from
  writes: a store that does not honour conditional writes.
- ``delay_listings``: seconds to hold back the next answer to a chunk
  pack listing (``list-type=2`` with ``prefix=…packs/``), then 0 again.
- ``stop()``: the port stops answering (connection refused), as a server
  that went away.

Rewriting requests changes what a SigV4 signature covers, so the proxy
sits in front of moto, which checks no signatures (tests/s3server.py).
"""

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class S3Proxy:
    def __init__(self, upstream: str):
        self.upstream = urlparse(upstream)
        self.suffix_quirk = False
        self.ignore_conditions = False
        self.ignore_ranges = False
        self.delay_listings = 0.0
        self.suffix_requests = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                proxy.forward(self)
            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def forward(self, req) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else None
        headers = {k: v for k, v in req.headers.items() if k.lower() not in HOP}
        rng = headers.get("Range") or headers.get("range")
        if self.suffix_quirk and rng and rng.startswith("bytes=-"):
            self.suffix_requests += 1
            n = int(rng[len("bytes=-"):])
            for k in [k for k in headers if k.lower() == "range"]:
                headers[k] = f"bytes=0-{n - 1}"
        if self.ignore_ranges and req.command == "GET":
            headers = {k: v for k, v in headers.items() if k.lower() != "range"}
        if self.ignore_conditions and req.command == "PUT":
            headers = {k: v for k, v in headers.items() if k.lower() not in ("if-match", "if-none-match")}
        query = parse_qs(urlparse(req.path).query)
        if self.delay_listings and query.get("list-type") and query.get("prefix", [""])[0].endswith("packs/"):
            delay, self.delay_listings = self.delay_listings, 0.0  # once
            time.sleep(delay)
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=60)
        try:
            conn.request(req.command, req.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            req.send_response(answer.status, answer.reason)
            for k, v in answer.getheaders():
                if k.lower() not in HOP and (k.lower() != "content-length" or req.command == "HEAD"):
                    req.send_header(k, v)
            if req.command != "HEAD":
                req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            if req.command != "HEAD":
                req.wfile.write(data)
        finally:
            conn.close()
