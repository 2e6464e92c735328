"""The HTTP side: a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 only, GET and HEAD only.

Routes (``KEY`` is a run key, percent-encoded as one segment)::

    /                              the index of runs
    /run/KEY?family=&verdict=&…    a run's page (filters as query parameters)
    /run/KEY/task?phase=P&id=T     one task: its verdict and every attempt
    /eval/KEY?family=&rule=        a model evaluation's page
    /eval/KEY/task?id=T            one task of it: its figures and every attempt
    /eval/KEY/sample?phase=P&id=T&agent=G&sample=S&attempt=A   one attempt's trajectory
    /compare/KEY                   a comparison of two evaluations
    /file/KEY/PATH                 one of the run's own files, from a fixed list of names
    /file/KEY/                     the run directory itself: redirects to its page

Files sit under ``/file/`` in the run directories' own layout, so the relative links a report
makes to its sibling runs (``../../../<run>/…``) resolve here as they do on disk.

A request whose ``Host`` is not this server's loopback address is refused (a web page
cannot rebind a name to 127.0.0.1 and read the evidence). Pages carry a Content Security
Policy that allows no script at all, so even a report written by an older harness with an
escaping bug runs nothing; files are served with ``nosniff`` and HTML reports under the same
policy.
"""

from __future__ import annotations

import re
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from validate.core.errors import InputError, ValidateError
from validate.core.paths import (
    ATTEMPTS,
    CHECKSUMS,
    COMPARE_HTML,
    COMPARE_JSON,
    COMPARE_MD,
    EVAL_CONTRACT,
    EVAL_SUMMARY,
    EVAL_TASKS,
    EXCLUSIONS,
    FROZEN_MANIFEST,
    MANIFEST,
    PATCH,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    REPORTS,
    SAMPLES,
    SIGNATURE,
    SMOKE,
    SMOKE_RESULT,
    SUMMARY,
    TASKS,
    TRAJECTORIES,
    VARIANTS,
)
from validate.view import evaldata, tables
from validate.view.catalog import Catalog, CompareEntry, EvalEntry, Listing, NotInside, RunEntry, open_inside
from validate.view.evalpage import attempt_page, compare_page, eval_page, eval_task_page
from validate.view.markup import url
from validate.view.pages import index_page, message_page, task_page
from validate.view.runpage import run_page

HTML = "text/html; charset=utf-8"
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; base-uri 'none'"
#: The run files the viewer serves: (path pattern, content type). Nothing else is reachable.
_ENTRY = r"[A-Za-z0-9._-]+"  # an entry's or a variant's name


def _one_of(*names: str) -> str:
    return "(" + "|".join(re.escape(n) for n in names) + ")"


FILES: tuple[tuple[re.Pattern, str], ...] = tuple((re.compile(p), t) for p, t in (
    (_one_of(SUMMARY, MANIFEST, FROZEN_MANIFEST, EVAL_SUMMARY, EVAL_CONTRACT, COMPARE_JSON),
     "application/json"),
    (_one_of(SAMPLES, TRAJECTORIES, EVAL_TASKS), "application/vnd.apache.parquet"),
    (re.escape(COMPARE_HTML), "text/html; charset=utf-8"),
    (re.escape(COMPARE_MD), "text/markdown; charset=utf-8"),
    (rf"{re.escape(VARIANTS)}/{_ENTRY}\.json", "application/json"),
    (_one_of(PATCH, CHECKSUMS, SIGNATURE), "text/plain; charset=utf-8"),
    (_one_of(ATTEMPTS, TASKS, EXCLUSIONS), "application/vnd.apache.parquet"),
    (rf"{re.escape(SMOKE)}/{_ENTRY}/{_one_of(SMOKE_RESULT, MANIFEST)}", "application/json"),
    (rf"{re.escape(REPORTS)}/{_ENTRY}/{re.escape(REPORT_HTML)}", "text/html; charset=utf-8"),
    (rf"{re.escape(REPORTS)}/{_ENTRY}/{re.escape(REPORT_MD)}", "text/markdown; charset=utf-8"),
    (rf"{re.escape(REPORTS)}/{_ENTRY}/{re.escape(REPORT_JSON)}", "application/json"),
))


class Redirect(ValidateError):  # not an error: the answer is elsewhere (never leaves the handler)
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


class HTTPError(InputError):  # a request the viewer cannot answer (404, 403, 400)
    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


def _query(raw: str) -> dict[str, str]:
    """The last value of each parameter; blank values dropped."""
    return {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=False).items()}


def task_filter(q: dict[str, str]) -> tables.TaskFilter:
    page = q.get("page", "1")
    return tables.TaskFilter(phase=q.get("phase"), family=q.get("family"), verdict=q.get("verdict"),
                             agent=q.get("agent"), outcome=q.get("outcome") if q.get("outcome") in
                             ("expected", "unexpected") else None, page=int(page) if page.isdigit() else 1)


class Viewer:
    """Routing: a path and query in, (status, content type, body) out; no socket involved."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def _run(self, key: str) -> tuple[RunEntry, Listing]:
        listing = self.catalog.scan()
        entry = listing.runs.get(key)
        if entry is None:
            raise HTTPError(404, "Not Found", f"no run {key!r} under the directories this viewer shows")
        if entry.summary is None:
            raise HTTPError(404, "Not Found", f"run {key!r} cannot be shown: {entry.error}")
        return entry, listing

    def _eval(self, key: str) -> tuple[EvalEntry, Listing]:
        listing = self.catalog.scan()
        entry = listing.evals.get(key)
        if entry is None:
            raise HTTPError(404, "Not Found",
                            f"no evaluation {key!r} under the directories this viewer shows")
        if entry.summary is None:
            raise HTTPError(404, "Not Found", f"evaluation {key!r} cannot be shown: {entry.error}")
        return entry, listing

    def _compare(self, key: str) -> tuple[CompareEntry, Listing]:
        listing = self.catalog.scan()
        entry = listing.compares.get(key)
        if entry is None or entry.comparison is None:
            raise HTTPError(404, "Not Found", f"no readable comparison {key!r} under the directories this "
                                              "viewer shows"
                            + (f": {entry.error}" if entry is not None else ""))
        return entry, listing

    def _eval_pages(self, seg: list[str], q: dict[str, str]) -> tuple[int, str, bytes]:
        entry, listing = self._eval(seg[1])
        if len(seg) == 2:
            return 200, HTML, eval_page(entry, listing, q.get("family"), q.get("rule"))
        if seg[2:] == ["task"]:
            row = evaldata.task_row(entry.root, q.get("id", ""))
            if row is None:
                raise HTTPError(404, "Not Found", f"evaluation {entry.key} has no task {q.get('id')!r}")
            return 200, HTML, eval_task_page(entry, row)
        if seg[2:] == ["sample"]:
            numbers = [q.get(n, "") for n in ("sample", "attempt")]
            one = None
            if all(n.isdigit() for n in numbers):
                key = (q.get("phase", ""), q.get("id", ""), q.get("agent", ""), int(numbers[0]),
                       int(numbers[1]))
                one = evaldata.one_attempt(entry.root, key)
            if one is None:
                raise HTTPError(404, "Not Found", f"evaluation {entry.key} has no such attempt")
            return 200, HTML, attempt_page(entry, one, key)
        raise HTTPError(404, "Not Found", "no such page")

    def _file(self, root: Path, parts: Sequence[str]) -> tuple[int, str, bytes]:
        rel = "/".join(parts)
        kind = next((t for p, t in FILES if p.fullmatch(rel)), None)
        if kind is None:
            raise HTTPError(404, "Not Found", f"{rel!r} is not a file this viewer serves")
        try:
            with open_inside(root, parts) as fh:
                return 200, kind, fh.read()
        except NotInside as e:
            raise HTTPError(404, "Not Found", str(e)) from None

    def handle(self, target: str) -> tuple[int, str, bytes]:
        split = urlsplit(target)
        raw = split.path.split("/")[1:]
        inner = raw[1:-1] if raw[0] == "file" and raw[-1] == "" else raw[1:]  # /file/KEY/: a run directory
        if any(s in ("", ".", "..") for s in inner) and raw != [""]:
            raise HTTPError(404, "Not Found", "no such page")
        try:
            seg = [unquote(s, errors="strict") for s in raw]
        except UnicodeDecodeError:
            raise HTTPError(400, "Bad Request", "the path is not percent-encoded UTF-8") from None
        q = _query(split.query)
        if seg == [""]:
            return 200, HTML, index_page(self.catalog.scan(), [str(d) for d in self.catalog.dirs])
        if len(seg) >= 2 and seg[0] == "eval":
            return self._eval_pages(seg, q)
        if len(seg) == 2 and seg[0] == "compare":
            return 200, HTML, compare_page(*self._compare(seg[1]))
        if len(seg) >= 2 and seg[0] == "run":
            entry, listing = self._run(seg[1])
            if len(seg) == 2:
                return 200, HTML, run_page(entry, listing.runs, task_filter(q), list(listing.evals.values()))
            if seg[2:] == ["task"]:
                row = tables.task_row(entry.root, q.get("phase", ""), q.get("id", ""))
                if row is None:
                    raise HTTPError(404, "Not Found", f"run {entry.key} has no task {q.get('id')!r} in phase "
                                                      f"{q.get('phase')!r}")
                return 200, "text/html; charset=utf-8", task_page(entry, row)
        if len(seg) >= 3 and seg[0] == "file":
            listing = self.catalog.scan()
            if seg[1] in listing.evals:
                kind, root = "eval", listing.evals[seg[1]].root
            elif seg[1] in listing.compares:
                kind, root = "compare", listing.compares[seg[1]].root
            else:
                # a dataset run, or a 404 naming why not; its root from this same scan (a run
                # that appeared after the listing above is served, never a 500)
                kind, root = "run", self._run(seg[1])[0].root
            if seg[2:] == [""]:
                raise Redirect(url([kind, seg[1]]))
            return self._file(root, seg[2:])
        raise HTTPError(404, "Not Found", "no such page")


def _handler(viewer: Viewer, log: Callable[[str], None] | None):
    class Handler(BaseHTTPRequestHandler):
        server_version = "validate-view"
        sys_version = ""

        def _allowed_host(self) -> bool:
            address = self.server.server_address  # (host, port): this viewer binds an IPv4 address
            port = address[1] if isinstance(address, tuple) else None
            return self.headers.get("Host", "") in (f"127.0.0.1:{port}", f"localhost:{port}")

        def _respond(self, head_only: bool) -> None:
            try:
                if not self._allowed_host():
                    raise HTTPError(403, "Forbidden", "this viewer answers only to 127.0.0.1 and localhost")
                status, kind, body = viewer.handle(self.path)
            except Redirect as e:
                self.send_response(302)
                self.send_header("Location", e.location)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            except HTTPError as e:
                status, kind, body = e.status, "text/html; charset=utf-8", message_page(e.status, e.title,
                                                                                        e.detail)
            # unreadable or missing evidence (pyarrow raises the first two)
            except (OSError, ValueError, NotInside) as e:
                status, kind = 500, "text/html; charset=utf-8"
                body = message_page(500, "Unreadable evidence", f"{type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - a bug answers 500 and is logged; the server goes on
                status, kind = 500, "text/html; charset=utf-8"
                body = message_page(500, "Internal error", f"{type(e).__name__} (see the viewer's log)")
                if log is not None:
                    log("".join(traceback.format_exception(e)))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if not head_only:
                self.wfile.write(body)

        def do_GET(self) -> None:
            self._respond(head_only=False)

        def do_HEAD(self) -> None:
            self._respond(head_only=True)

        def log_message(self, fmt: str, *args) -> None:
            if log is not None:
                log(f"{self.address_string()} {fmt % args}")

    return Handler


class ViewServer(ThreadingHTTPServer):
    daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


def make_server(dirs: Sequence[Path], port: int = 0, log: Callable[[str], None] | None = None) -> ViewServer:
    """A server bound to 127.0.0.1:`port` (0: any free port) showing the runs under `dirs`."""
    return ViewServer(("127.0.0.1", port), _handler(Viewer(Catalog(dirs)), log))


@contextmanager
def serve(dirs: Sequence[Path], port: int = 0,
          log: Callable[[str], None] | None = None) -> Iterator[ViewServer]:
    """Serve in a background thread for the duration of the block."""
    server = make_server(dirs, port, log)
    thread = threading.Thread(target=server.serve_forever, name="validate-view", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
