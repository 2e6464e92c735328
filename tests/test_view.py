"""`validate view`: a real server on loopback over real runs made through bwrap, fetched with
a plain HTTP client (raw paths, so traversal attempts reach the server unnormalised) and with
Debian's chromium headless (a screenshot, and the DOM after a filter).

The runs: a deshuffle-papers pool and a pilot of the same contract, a run whose control
writes markup and terminal escapes into its stdout, stderr and reply, and a toy pool that
stops below its minimum (one task excluded, the rest incomplete)."""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import zlib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from environment.deshuffle.env import AGENTS as DESHUFFLE_AGENTS, DeshuffleEnvironment
from environment.protocol import AgentSpec
from tests.conftest import VALIDATE, make_ctx, make_manifest, subprocess_env
from validate.contract.manifest import load_manifest
from validate.core import environments
from validate.report.run import write_report
from validate.run.phases import PilotPhase, PoolPhase, RunPhase, pilot, pool, run_agents
from validate.view import serve, tables
from validate.view.markup import text

pytestmark = pytest.mark.bwrap

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
SECRET = "view-test-secret-7f3a9c"

INJECTOR = '''"""Writes markup and terminal escapes wherever a reviewer reads: stdout, stderr, the reply."""
import sys

sys.stdout.write('"><img src=x onerror=alert(2)> \\x1b[31mred\\x1b[0m\\n')
sys.stderr.write("<script>alert(1)</script>\\n")
with open("/workspace/reply.txt", "w") as fh:
    fh.write("</pre><script>alert(3)</script>\\u202eevil\\u202c")
sys.exit(3)
'''


def _register_hostile(program: Path) -> str:
    class ViewHostile(DeshuffleEnvironment):
        name = "deshuffle-view-hostile"

        def agents(self, config):
            return [*super().agents(config), AgentSpec(name="injector", role="control", program=program,
                                                       tests="hostile: markup and escapes in its output")]

        def source_dir(self) -> Path:
            return DESHUFFLE_AGENTS.parent

    environments.register(ViewHostile)
    return ViewHostile.name


@pytest.fixture(scope="module")
def base(tmp_path_factory, sandboxes, reported_pool):
    """ledgers/{pool,pilot,hostile,toy} made for real through bwrap; the pool and the pilot with a report."""
    root = tmp_path_factory.mktemp("view")
    ledgers = root / "ledgers"
    sandbox = sandboxes("bwrap")
    shutil.copytree(reported_pool, ledgers / "pool")  # the session's (tests/conftest.py), with its report
    manifest = load_manifest(ledgers / "pool/manifest.json")
    pilot(make_ctx(manifest, sandbox, ledgers / "pilot"), PilotPhase())
    write_report(ledgers / "pilot")
    program = root / "injector.py"
    program.write_text(INJECTOR)
    hostile = make_manifest(sandbox, idx=[0, 1], env_name=_register_hostile(program), controls=["injector"],
                            max_papers=2)
    run_agents(make_ctx(hostile, sandbox, ledgers / "hostile"), RunPhase())
    toy = make_manifest(sandbox, idx=list(range(6)), env_name="toy", broken=[2], min_task_count=6)
    pool(make_ctx(toy, sandbox, ledgers / "toy"), PoolPhase())
    return root


@pytest.fixture(scope="module")
def server(base):
    with serve([base / "ledgers"]) as s:
        yield s


def get(server, path: str, host: str | None = None, method: str = "GET") -> tuple[int, str, dict]:
    """A raw request: the path goes on the wire exactly as given."""
    port = server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest(method, path, skip_host=True)
    conn.putheader("Host", host or f"127.0.0.1:{port}")
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode("utf-8", "replace")  # Parquet files too
    conn.close()
    return resp.status, body, dict(resp.getheaders())


def task_path(run: str, phase: str, task_id: str) -> str:
    return f"/run/{quote(run, safe='')}/task?phase={quote(phase)}&id={quote(task_id, safe='')}"


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.hrefs += [v for k, v in attrs if k == "href" and v]


def links(body: str) -> list[str]:
    p = Links()
    p.feed(body)
    return p.hrefs


def section(body: str, start_id: str, end_id: str) -> str:
    return body[body.index(f'id="{start_id}"'):body.index(f'id="{end_id}"')]


# --- the pages ---------------------------------------------------------------------------

def test_index_lists_every_run_with_kind_contract_verdict_and_counts(server):
    status, body, headers = get(server, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    for run in ("pool", "pilot", "hostile", "toy"):
        assert f'href="/run/{run}"' in body
    row = re.search(r'href="/run/toy">toy</a>.*?</tr>', body, re.DOTALL).group(0)
    cells = [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", row, re.DOTALL)]
    assert cells[:3] == ["pool", "toy", "pytest" + re.search(r"sha256:[0-9a-f]{12}", row).group(0)]
    assert cells[3] == "FAIL"  # below its minimum: controls never ran
    assert cells[4] == "0 / 1 / 5 of 6"  # compatible / excluded / incomplete of tasks
    assert re.search(r"pytest<br><code>sha256:[0-9a-f]{12}</code>", body)


def test_run_page_has_verdict_criteria_tasks_ledger_and_incomplete(server):
    status, body, _ = get(server, "/run/toy")
    assert status == 200
    assert "Dataset verdict: FAIL" in body and "minimum" in body
    tasks = section(body, "tasks", "ledger")
    assert tasks.count("/run/toy/task?") == 6
    ledger = section(body, "ledger", "incomplete")
    assert "invalid_task_or_verifier" in ledger and ledger.count("/run/toy/task?") == 1
    incomplete = section(body, "incomplete", "agents")
    assert incomplete.count("/run/toy/task?") == 5 and "controls never ran" in incomplete
    assert "report.html" not in body and "No report yet" in body


@pytest.mark.parametrize("query, rows", [("verdict=excluded", 1), ("verdict=incomplete", 5),
                                         ("family=even", 3), ("family=even&verdict=incomplete", 2),
                                         ("family=nope", 0), ("agent=oracle", 6),
                                         ("agent=oracle&outcome=expected", 6),
                                         ("agent=oracle&outcome=unexpected", 0), ("outcome=expected", 6)])
def test_task_filters_are_query_parameters(server, query, rows):
    status, body, _ = get(server, f"/run/toy?{query}")
    assert status == 200
    assert section(body, "tasks", "ledger").count("/run/toy/task?") == rows
    for pair in query.split("&"):
        name, value = pair.split("=")
        if value != "nope":
            assert re.search(rf'<select name="{name}">.*?<option value="{value}" selected="selected">', body,
                             re.DOTALL)


def test_long_task_tables_are_paged(server, monkeypatch):
    monkeypatch.setattr(tables, "PAGE_ROWS", 2)
    pages = {}
    for page in ("1", "2", "3", "99", "x"):
        _, body, _ = get(server, f"/run/toy?page={page}")
        tasks = section(body, "tasks", "ledger")
        pages[page] = re.findall(r'href="/run/toy/task\?id=toy%2F[0-9a-f]+%2F(\d+)&amp;phase=pool"', tasks)
        assert 'href="/run/toy?page=2#tasks"' in tasks or page == "2"
    assert pages["1"] == ["0", "1"] and pages["2"] == ["2", "3"] and pages["3"] == ["4", "5"]
    assert pages["99"] == pages["3"] and pages["x"] == pages["1"]  # clamped; not a number: the first page
    _, body, _ = get(server, "/run/toy?verdict=incomplete&page=3")
    assert "rows 5–5" in body and 'href="/run/toy?page=2&amp;verdict=incomplete#tasks"' in body


def test_agent_filter_shows_that_agents_outcome_per_task(server):
    _, body, _ = get(server, "/run/hostile?agent=injector")
    tasks = section(body, "tasks", "ledger")
    assert "<th>injector: status</th>" in tasks and tasks.count("exit_nonzero") == 2
    assert "injector: sample" not in tasks  # one sample per task: no sample column
    _, body, _ = get(server, "/run/hostile?agent=injector&outcome=unexpected")
    assert section(body, "tasks", "ledger").count("/run/hostile/task?") == 0


def test_task_page_shows_every_attempt_with_reply_stdout_and_stderr(server):
    _, run, _ = get(server, "/run/pool")
    first = next(h for h in links(run) if "/task?" in h)
    status, body, _ = get(server, first)
    assert status == 200
    assert "Attempts (8, superseded included)" in body  # oracle + 7 controls
    for agent in ("oracle", "shuffled", "empty", "reversed"):
        assert f"{agent} (" in body
    assert body.count("<h3>Reply</h3>") == 8 and body.count("<h3>stderr</h3>") == 8
    assert "\\boxed{" in body  # the oracle's reply text
    assert "NoReply" in body  # the empty control's error class


def test_a_trials_task_page_shows_its_reward_files_decoded_and_each_phases_output():
    """A task directory's trial: its reply is the harness's record of the reward files (base64
    in JSON); the page shows each file as read, and says which output is whose."""
    ledger = next((Path(__file__).resolve().parents[1] / "ledgers").glob("harbor-sample-docker-run-*"))
    att = tables.read(ledger, "attempts.parquet").to_pylist()
    oracle = next(r for r in att if r["task_id"] == "csv-to-json" and r["agent"] == "oracle")
    with serve([ledger]) as s:
        status, body, _ = get(s, task_path(ledger.name, oracle["phase"], "csv-to-json"))
    assert status == 200
    tried = sum(r["task_id"] == "csv-to-json" for r in att)
    assert body.count("Reward files, as the harness read them") == tried
    assert "<h3>reward.txt (2 bytes)</h3>" in body and "MQo=" in body  # decoded, and the record as kept
    assert body.count("stdout: the agent phase&#x27;s output") == tried
    assert "[verifier exit 0]" in body


def test_agent_text_is_escaped_everywhere(server):
    _, run, _ = get(server, "/run/hostile")
    pages = [get(server, h)[1] for h in links(run) if "/task?" in h]
    assert len(pages) == 2
    for body in pages:
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body  # stderr
        assert "&lt;/pre&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in body  # the reply
        assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in body  # stdout
        assert "<script" not in body and "<img" not in body
        assert "\x1b" not in body and "\u202e" not in body  # shown as visible escapes instead
        assert 'title="U+001B">\\x1b</span>[31mred' in body and 'title="U+202E">\\u202e</span>evil' in body


def test_markup_text_escapes_quotes_and_shows_invisible_characters():
    assert text('<a href="x">\'&') == "&lt;a href=&quot;x&quot;&gt;&#x27;&amp;"
    assert text("a\tb\nc") == "a\tb\nc"
    for ch in ("\x00", "\x1b", "\x7f", "\x85", "\u200b", "\u2028", "\u202e", "\u2066", "\ufeff"):
        out = text(f"x{ch}y")
        assert ch not in out and f"U+{ord(ch):04X}" in out


def test_pool_and_pilot_of_one_contract_link_to_each_other(server):
    _, body, _ = get(server, "/run/pool")
    related = section(body, "related", "tasks")
    assert 'href="/run/pilot"' in related and "same contract (pilot)" in related
    _, body, _ = get(server, "/run/pilot")
    assert 'href="/run/pool"' in section(body, "related", "tasks")
    assert "Partial-credit probes" in body and "Pilot strata" in body
    assert 'href="/run/hostile"' not in section(body, "related", "tasks")


def test_report_entries_are_linked_and_served(server, base):
    (entry,) = (base / "ledgers/pool/reports").iterdir()
    _, body, _ = get(server, "/run/pool")
    href = f"/file/pool/reports/{entry.name}/report.html"
    assert f'href="{href}"' in body
    status, report, headers = get(server, href)
    assert status == 200 and report == (entry / "report.html").read_text()
    assert "script-src" not in headers["Content-Security-Policy"] and "default-src 'none'" in \
        headers["Content-Security-Policy"]
    status, md, headers = get(server, f"/file/pool/reports/{entry.name}/report.md")
    assert status == 200 and headers["Content-Type"].startswith("text/markdown") and md.startswith("# ")


def test_a_report_links_no_other_run_and_the_viewer_relates_them(server, base):
    """A report is rendered from its own run's sealed evidence alone (the audit renders it
    again), so it names no sibling run; the viewer's run page relates the pool and its pilot."""
    for run in ("pool", "pilot"):
        entry = next((base / "ledgers" / run / "reports").iterdir()).name
        here = f"/file/{run}/reports/{entry}/report.html"
        assert [h for h in links(get(server, here)[1]) if not h.startswith("#")] == []
    assert 'href="/run/pilot"' in section(get(server, "/run/pool")[1], "related", "tasks")
    assert 'href="/run/pool"' in section(get(server, "/run/pilot")[1], "related", "tasks")


def test_every_link_on_every_page_resolves_and_nothing_is_written(server, base):
    before = snapshot(base / "ledgers")
    seen, todo = set(), ["/"]
    while todo:
        href = todo.pop()
        path = urlsplit(href)._replace(fragment="").geturl()
        if path in seen:
            continue
        seen.add(path)
        status, body, headers = get(server, path)
        assert status == 200, (path, body[:500])
        if headers["Content-Type"].startswith("text/html") and not path.startswith("/file/"):
            todo += [h for h in links(body) if h.startswith("/")]
    assert len(seen) > 40  # index, 4 runs, their filters, every task, files
    assert snapshot(base / "ledgers") == before


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = os.lstat(p)
            digest = (
                hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
            )
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


# --- refusals ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def traps(base, tmp_path_factory):
    """A copy of the pool run whose entries point outside through symlinks, a symlinked run, a
    secret beside the ledgers, an unreadable run.json and a truncated tasks.parquet."""
    root = tmp_path_factory.mktemp("traps")
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    (outside / "result.json").write_text(f'{{"passed": true, "summary": "{SECRET}"}}')
    ledgers = root / "ledgers"
    shutil.copytree(base / "ledgers/pool", ledgers / "trap")
    (ledgers / "trap/reports/20990101T000000000000Z").mkdir()
    (ledgers / "trap/reports/20990101T000000000000Z/report.html").symlink_to(outside / "secret.txt")
    (ledgers / "trap/reports/20990102T000000000000Z").symlink_to(outside)
    (ledgers / "trap/variants").mkdir()
    (ledgers / "trap/variants/evil.json").symlink_to(outside / "secret.txt")
    (ledgers / "trap/smoke").mkdir()
    (ledgers / "trap/smoke/20990101T000000000000Z").symlink_to(outside)
    (ledgers / "trap/patch.diff").unlink(missing_ok=True)  # there is one when the tests run on a patched tree
    (ledgers / "trap/patch.diff").symlink_to(outside / "secret.txt")
    shutil.copytree(base / "ledgers/toy", outside / "linked")
    (ledgers / "linked").symlink_to(outside / "linked")
    shutil.copytree(base / "ledgers/toy", ledgers / "garbled")
    (ledgers / "garbled/run.json").write_text("{not json")
    shutil.copytree(base / "ledgers/toy", ledgers / "truncated")
    data = (ledgers / "truncated/tasks.parquet").read_bytes()
    (ledgers / "truncated/tasks.parquet").write_bytes(data[: len(data) // 2])
    with serve([ledgers]) as s:
        yield s, ledgers


@pytest.mark.parametrize("path", [
    "/file/trap/../../outside/secret.txt",
    "/file/trap/%2e%2e/%2e%2e/outside/secret.txt",
    "/file/trap/reports/..%2f..%2f..%2foutside%2fsecret.txt",
    "/file/..%2f..%2foutside/secret.txt",
    "/file/../outside/secret.txt",
    "/file/trap//etc/passwd",
    "/file/trap/%2fetc%2fpasswd",
    "/../../outside/secret.txt",
    "/file/trap/reports/20990101T000000000000Z/report.html",  # a symlink to the secret
    "/file/trap/reports/20990102T000000000000Z/secret.txt",  # a symlinked entry, and not a report name
    "/file/trap/reports/20990102T000000000000Z/report.html",
    "/file/trap/variants/evil.json",
    "/file/trap/smoke/20990101T000000000000Z/result.json",
    "/file/trap/patch.diff",
    "/file/trap/journal.jsonl",
    "/file/trap/reports/x/report.html%00.json",
    "/run/linked",
    "/run/nope",
    "/nope",
    "/run/trap/task?phase=pool&id=nope",
])
def test_traversal_symlinks_and_unknown_paths_are_refused(traps, path):
    s, _ = traps
    status, body, _ = get(s, path)
    assert status in (400, 404), (path, status)
    assert SECRET not in body


def test_symlinked_entries_are_left_out_of_the_pages(traps):
    s, _ = traps
    _, index, _ = get(s, "/")
    assert 'href="/run/trap"' in index and 'href="/run/linked"' not in index
    _, body, _ = get(s, "/run/trap")
    assert SECRET not in body
    assert "20990101T000000000000Z" not in body and "20990102T000000000000Z" not in body
    assert "evil.json" not in body and "patch.diff" not in body


def test_unreadable_runs_are_named_and_the_server_goes_on(traps):
    s, _ = traps
    _, index, _ = get(s, "/")
    bad = index[index.index("Not readable"):]
    assert "garbled" in bad and "run.json: not JSON" in bad
    status, body, _ = get(s, "/run/garbled")
    assert status == 404 and "not JSON" in body
    status, body, _ = get(s, "/run/truncated")
    assert status == 500 and "Unreadable evidence" in body and "Traceback" not in body
    assert get(s, "/run/trap")[0] == 200


def test_runs_of_the_same_name_under_two_directories_both_get_a_page(base, tmp_path):
    shutil.copytree(base / "ledgers/toy", tmp_path / "pool")
    with serve([base / "ledgers", tmp_path]) as s:
        _, index, _ = get(s, "/")
        assert 'href="/run/pool"' in index and 'href="/run/pool~2"' in index
        assert "deshuffle-papers" in get(s, "/run/pool")[1] and "toy · contract" in get(s, "/run/pool~2")[1]


def test_other_hosts_and_methods_are_refused(server):
    status, body, _ = get(server, "/", host="evil.example")
    assert status == 403 and "pool" not in body
    assert get(server, "/", host=f"localhost:{server.server_address[1]}")[0] == 200
    assert get(server, "/", method="POST")[0] == 501
    assert get(server, "/", method="HEAD")[0] == 200


# --- the command line ------------------------------------------------------------------------

def test_cli_serves_on_loopback_until_sigterm(base):
    proc = subprocess.Popen([*VALIDATE, "view", str(base / "ledgers"), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert url, line + proc.stderr.read()
        conn = http.client.HTTPConnection("127.0.0.1", int(url.group(1)), timeout=30)
        conn.request("GET", "/run/pool")
        resp = conn.getresponse()
        assert resp.status == 200 and b"Dataset verdict" in resp.read()
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()


def test_cli_refuses_a_missing_directory_and_a_busy_port(base, tmp_path):
    r = subprocess.run([*VALIDATE, "view", str(tmp_path / "nope")], capture_output=True, text=True,
                       env=subprocess_env(), timeout=60, check=False)
    assert r.returncode == 2 and "not a directory" in r.stderr
    with serve([base / "ledgers"]) as busy:
        r = subprocess.run([*VALIDATE, "view", str(base / "ledgers"), "--port", str(busy.server_address[1])],
                           capture_output=True, text=True, env=subprocess_env(), timeout=60, check=False)
    assert r.returncode == 2 and "--port: cannot listen" in r.stderr


# --- a real browser ----------------------------------------------------------------------------

@pytest.fixture
def artifacts(tmp_path) -> Path:
    where = Path(os.environ.get("VALIDATE_TEST_ARTIFACTS", tmp_path)) / "view"
    where.mkdir(parents=True, exist_ok=True)
    return where


def chromium(tmp_path: Path, *args: str) -> str:
    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: apt-get install -y chromium"
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    proc = subprocess.run([str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit, non-interlaced RGB or RGBA PNG (what chromium
    writes), decoded with the stdlib: a test dependency less for one screenshot."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, b"", None
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0], kind
        head = struct.unpack(">IIBBBBB", body) if kind == b"IHDR" else head
        idat += body if kind == b"IDAT" else b""
        pos += 12 + n
    width, height, depth, colour, _, _, interlace = head
    assert depth == 8 and colour in (2, 6) and interlace == 0, head
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left, up = line[i - bpp] if i >= bpp else 0, prev[i]
            corner = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(b for j in range(0, stride, bpp) for b in line[j:j + 3]))
        prev = line
    return width, height, rows


def test_chromium_renders_the_run_page_and_applies_a_filter(server, tmp_path, artifacts):
    shot = artifacts / "run-page.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", server.url + "run/pool")
    width, height, rows = png_pixels(shot.read_bytes())
    assert (width, height) == (1280, 900)
    pixels = [row[i:i + 3] for row in rows[::3] for i in range(0, len(row), 9)]  # every third pixel each way
    ink = sum(p != b"\xff\xff\xff" for p in pixels)
    assert len(set(pixels)) > 50 and ink > 0.05 * len(pixels)  # text, tables and badges, not a blank page
    assert rows[5][15:18] == bytes([0x24, 0x29, 0x2F])  # the top bar: the page's own stylesheet applied

    dom = chromium(tmp_path, "--dump-dom", server.url + "run/toy?verdict=excluded&family=even")
    tasks = section(dom, "tasks", "ledger")
    assert "1 of 6 tasks" in tasks and tasks.count('href="/run/toy/task?') == 1
    assert re.search(r'<option value="excluded" selected="[^"]*">', tasks)


def test_chromium_builds_no_script_from_agent_text(server, tmp_path, artifacts):
    _, run, _ = get(server, "/run/hostile")
    href = next(h for h in links(run) if "/task?" in h)
    chromium(tmp_path, f"--screenshot={artifacts / 'task-page.png'}", "--window-size=1280,2400",
             server.url.rstrip("/") + href)
    dom = chromium(tmp_path, "--dump-dom", server.url.rstrip("/") + href)
    assert "<script" not in dom and "<img" not in dom  # the browser parsed no element out of agent text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom


# --- a real smoke test: the pool links to it, it links back ---------------------------------------

@pytest.mark.slow
def test_a_pool_and_its_smoke_rerun_link_to_each_other(base, sandboxes, tmp_path):
    from validate.run.smoke import SmokePhase, smoke

    ledgers = tmp_path / "ledgers"
    shutil.copytree(base / "ledgers/pool", ledgers / "pool")
    ctx = make_ctx(load_manifest(ledgers / "pool/manifest.json"), sandboxes("bwrap"), ledgers / "pool")
    result = smoke(ctx, load_manifest(ledgers / "pool/frozen-manifest.json"), SmokePhase(sample=1),
                   log=lambda m: None)
    assert result.passed, result.mismatches
    (entry,) = (ledgers / "pool/smoke").iterdir()
    key = f"pool/smoke/{entry.name}"
    with serve([ledgers]) as s:
        _, index, _ = get(s, "/")
        assert f'href="/run/{quote(key, safe="")}"' in index and "passed" in index
        _, body, _ = get(s, "/run/pool")
        assert "Dataset verdict: PASS" in body  # the latest smoke counts, as in the report
        assert f'href="/run/{quote(key, safe="")}"' in body
        status, sub, _ = get(s, f"/run/{quote(key, safe='')}")
        assert status == 200 and "a smoke rerun of the pool" in sub and 'href="/run/pool"' in sub
