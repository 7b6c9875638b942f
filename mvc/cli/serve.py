"""``mvc serve``: the read-only web view (mvc/web)."""

import errno

import click

from .base import fail, main, open_repo

DEFAULT_PORT = 8470
NEXT_PORTS = 10  # with no --port, the ports after DEFAULT_PORT tried when it is taken (Jupyter's habit)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (IPv4 or IPv6, e.g. ::1). Any address but the loopback requires the printed "
                   "token on every request.")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help=f"Port (default {DEFAULT_PORT}, or the next free one after it; 0: any free one).")
@click.option("--quiet", is_flag=True, help="Do not log each request.")
def serve(host, port, quiet):
    """Show the history, commits, metric curves, diffs, bisect and storage in a browser.

    Read-only: no request changes the repository. On a lazy clone, chunks
    are fetched only for a diff's norms, when asked for.
    """
    from ..web import View
    with open_repo() as repo:
        server = _listen(View(repo), host, port, quiet)
        click.echo(f"Serving {repo.root} at {server.url}", err=True)
        if server.token:
            click.echo("Every request needs that token: share the whole address only with people you trust.", err=True)
        click.echo("Press Ctrl-C to stop.", err=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


def _listen(view, host: str, port, quiet: bool):
    """A Server of ``view`` on ``host``:``port``; with no port given, on DEFAULT_PORT or, when
    another program holds it, the first free one of the NEXT_PORTS after it (said)."""
    from ..web import Server
    ports = [port] if port is not None else range(DEFAULT_PORT, DEFAULT_PORT + NEXT_PORTS + 1)
    for tried, each in enumerate(ports):
        try:
            server = Server(view, host, each, quiet=quiet)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and port is None and tried < NEXT_PORTS:
                continue
            taken = exc.errno == errno.EADDRINUSE
            fail(f"cannot listen on {host}:{each}: {exc.strerror or exc}"
                 + ("; pass another --port (--port 0: any free one)" if taken else ""))
        if each != ports[0]:
            click.echo(f"port {ports[0]} is in use: serving on {each} instead", err=True)
        return server
