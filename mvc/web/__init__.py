"""``mvc serve``: a local, read-only web view of a repository.

Pages (``pages.py``) are rendered on the server from what the library's
verbs return, with inline SVG (``svg.py``) for the commit graph
(``lanes.py``), metric curves and diff heat strips, and a few lines of
plain script; ``server.py`` answers GET requests for them on the standard
library's ThreadingHTTPServer. Nothing is fetched from the internet and no
request can change the repository.
"""

from .pages import View
from .server import Server

__all__ = ["Server", "View"]
