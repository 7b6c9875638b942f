"""``mvc serve``: the read-only web view (mvc/web)."""

import click

from .base import fail, main, open_repo


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (IPv4 or IPv6, e.g. ::1). Any address but the loopback requires the printed "
                   "token on every request.")
@click.option("--port", type=click.IntRange(0, 65535), default=8470, show_default=True, help="Port (0: any free one).")
@click.option("--quiet", is_flag=True, help="Do not log each request.")
def serve(host, port, quiet):
    """Show the history, commits, metric curves, diffs, bisect and storage in a browser.

    Read-only: no request changes the repository. On a lazy clone, chunks
    are fetched only for a diff's norms, when asked for.
    """
    from ..web import Server, View
    with open_repo() as repo:
        try:
            server = Server(View(repo), host, port, quiet=quiet)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
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
