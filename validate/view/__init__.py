"""`validate view`: browse run directories in a web browser, read-only, on loopback only.

It owns the viewer: which runs, model evaluations and comparisons it finds and how it opens
their files (`catalog`), the columns it reads (`tables`, and `evaldata` for an evaluation's),
the HTML it writes from untrusted evidence (`markup`, `pages`, `runpage`, `evalpage`) and the
HTTP server (`server`). The run directories are never written to.

    with serve([Path("ledgers")]) as server:
        server.url  # "http://127.0.0.1:<port>/"
"""

from validate.view.server import ViewServer, make_server, serve

__all__ = ["ViewServer", "make_server", "serve"]
