"""`validate view` shows model evaluations and their comparisons beside the dataset runs.

On the committed ledgers (read from their own files, never a number written here): the
catalog lists every run directory, the evaluations and comparisons included; an eval page
states the figures of the run's committed report (its headline, its pass@1 row, and per task
the solved / valid samples and pass@k of the report's table) and the per-task pass@1 and
pass^k of the run's own Parquet files; a trajectory page shows a tool call with its output;
every link resolves. Then a fresh evaluation through bwrap whose model writes markup and a
bidirectional override into its messages and makes its tool print markup: nothing of it
becomes markup in the viewer."""

from __future__ import annotations

import http.client
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest

from environment.deshuffle.baseline import policy as baseline
from tests.conftest import CORPUS_PATH
from validate import api
from validate.devtools.localserver import serve as serve_model
from validate.eval.metrics import GREEDY_PHASE
from validate.eval.report import headline
from validate.eval.summary import EvalSummary
from validate.view import serve
from validate.view.catalog import Catalog
from validate.view.markup import text

LEDGERS = Path(__file__).resolve().parents[1] / "ledgers"
EVALS = sorted(p for p in LEDGERS.iterdir() if (p / "eval-contract.json").is_file())
COMPARES = sorted(p.parent for p in LEDGERS.glob("compare/*/*/compare.json"))


def get(server, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read().decode("utf-8", "replace")
    conn.close()
    return resp.status, body


class Rows(HTMLParser):
    """The cells of the first ``<table class="tasks">``, as text, row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.depth = 0  # inside the tasks table's body
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and ("class", "tasks") in attrs and not self.rows:
            self.depth = 1
        elif self.depth and tag == "tr":
            self.rows.append([])
        elif self.depth and tag == "td":
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self.cell is not None:
            self.rows[-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag == "table":
            self.depth = 0

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def task_rows(body: str) -> dict[str, list[str]]:
    p = Rows()
    p.feed(body)
    return {r[0]: r for r in p.rows if r}


def eval_url(run: Path | str) -> str:
    return f"/eval/{quote(Path(run).name, safe='')}"


@pytest.fixture(scope="module")
def committed():
    with serve([LEDGERS]) as s:
        yield s


# --- the committed ledgers -----------------------------------------------------------------

def test_the_catalog_lists_every_committed_run_the_evaluations_included(committed):
    dirs = [p for p in LEDGERS.iterdir() if p.is_dir()]
    datasets = {p.name for p in dirs if (p / "run.json").is_file()
                and not (p / "eval-contract.json").is_file()}
    evals = {p.name for p in EVALS}
    assert evals and datasets, "the committed ledgers hold dataset runs and evaluations"
    listing = Catalog([LEDGERS]).scan()
    assert {k for k, e in listing.runs.items() if e.parent_key is None} == datasets
    assert set(listing.evals) == evals and all(e.summary is not None for e in listing.evals.values())
    assert set(listing.compares) == {str(p.relative_to(LEDGERS)) for p in COMPARES}
    assert all(x.comparison is not None for x in listing.compares.values())
    _, index = get(committed, "/")
    for name in datasets:
        assert f'href="/run/{quote(name, safe="")}"' in index
    for name in evals:
        assert f'href="{eval_url(name)}"' in index
    for entry in COMPARES:
        assert f'href="/compare/{quote(str(entry.relative_to(LEDGERS)), safe="")}"' in index
    def n(count, word):
        return f"{count} {word}{'' if count == 1 else 's'}"

    assert (f"{n(len(datasets), 'dataset run')}, {n(len(evals), 'model evaluation')} and "
            f"{n(len(COMPARES), 'comparison')} under {LEDGERS}") in index
    assert "Not readable" not in index


def _report_tasks(md: str) -> dict[str, list[str]]:
    """The per-task table of an eval report.md: task → its cells, Markdown escapes undone."""
    table = md[md.index("## Per task"):].split("\n\n")[1]
    rows = [[re.sub(r"\\(.)", r"\1", c.strip()) for c in line.strip("|").split(" | ")]
            for line in table.splitlines()[2:]]
    return {r[0]: r for r in rows}


@pytest.mark.parametrize("run", EVALS, ids=[p.name for p in EVALS])
def test_the_eval_page_states_the_committed_reports_figures(committed, run):
    status, body = get(committed, eval_url(run))
    assert status == 200
    summary = EvalSummary.model_validate_json((run / "eval.json").read_bytes())
    reports = sorted((run / "reports").iterdir())
    assert reports, f"{run.name}: no committed report to hold the page to"
    record = json.loads((reports[-1] / "report.json").read_text())
    md = (reports[-1] / "report.md").read_text()
    assert record["headline"] == headline(summary)
    assert f'<div class="headline">{text(record["headline"])}</div>' in body
    said = re.sub(r"\\(.)", r"\1", re.search(r"\| pass@1 \(solved / valid\) \| (.*?) \|", md).group(1))
    assert f"<td>pass@1 (greedy, solved / valid)</td><td>{said}</td>" in body
    page, report = task_rows(body), _report_tasks(md)
    tasks = pq.read_table(run / "eval-tasks.parquet").to_pylist()
    samples = pq.read_table(run / "samples.parquet").to_pylist()
    greedy: dict[str, dict] = {}
    for s in samples:  # the final greedy attempt of each task: its highest try
        if s["phase"] == GREEDY_PHASE and s["attempt"] >= greedy.get(s["task_id"], {}).get("attempt", 0):
            greedy[s["task_id"]] = s
    assert set(page) == set(report) == {t["task_id"] for t in tasks}
    for t in tasks:
        row, theirs = page[t["task_id"]], report[t["task_id"]]
        assert row[3].split(" ")[0] == theirs[3].split(" ")[0] == f"{t['solved']}/{t['n_valid']}"
        assert row[4] == theirs[6]  # pass@k, three decimals in both
        assert row[5] == ("—" if t["pass_hat_k"] is None else f"{t['pass_hat_k']:.3f}")
        assert row[2].startswith("yes" if greedy[t["task_id"]]["solved"] else "no")


def test_a_trajectory_page_shows_a_tool_call_and_its_output(committed):
    run = EVALS[0]
    turn = next(t for t in pq.read_table(run / "trajectories.parquet").to_pylist() if t["tool_calls"])
    call = turn["tool_calls"][0]
    sample = next(s for s in pq.read_table(run / "samples.parquet").to_pylist()
                  if all(s[k] == turn[k] for k in ("phase", "task_id", "agent", "sample", "attempt")))
    path = (f"{eval_url(run)}/sample?phase={quote(turn['phase'])}&id={quote(turn['task_id'], safe='')}"
            f"&agent={quote(turn['agent'])}&sample={turn['sample']}&attempt={turn['attempt']}")
    status, body = get(committed, path)
    assert status == 200
    assert text(f"→ {call['name']}({call['arguments']})") in body
    assert text(call["output"][:200]) in body and f"{call['output_bytes']} bytes to the model" in body
    outcome = (
        "SOLVED" if sample["solved"] else f"failed: {sample['failure_class']} (rule {sample['failure_rule']})"
    )
    assert text(outcome) in body
    # and the task's page links to it, with every attempt's failure class
    status, task = get(committed, f"{eval_url(run)}/task?id={quote(turn['task_id'], safe='')}")
    assert status == 200 and path.replace("&", "&amp;").split("?")[0] in task
    assert sample["failure_rule"] is None or sample["failure_rule"] in task


def test_a_task_directory_sample_shows_its_verifier_reward_files_and_class(committed):
    """A committed eval of task directories: a failed sample's page shows every tool call with
    its capped output, the task's verifier's output, the reward files as read, and its class."""
    import base64

    run = next(p for p in EVALS if json.loads((p / "eval-contract.json").read_text())["agent"]["name"]
               == "task-shell-agent")
    samples = pq.read_table(run / "samples.parquet").to_pylist()
    s = next(x for x in samples if not x["solved"] and x["verifier"] and x["tool_calls"] >= 2)
    key = {k: s[k] for k in ("phase", "task_id", "agent", "sample", "attempt")}
    turns = [t for t in pq.read_table(run / "trajectories.parquet").to_pylist()
             if all(t[k] == v for k, v in key.items())]
    attempt = next(a for a in pq.read_table(run / "attempts.parquet").to_pylist()
                   if all(a[k] == v for k, v in key.items()))
    path = (f"{eval_url(run)}/sample?phase={quote(s['phase'])}&id={quote(s['task_id'], safe='')}"
            f"&agent={quote(s['agent'])}&sample={s['sample']}&attempt={s['attempt']}")
    status, body = get(committed, path)
    assert status == 200
    for call in (c for t in turns for c in t["tool_calls"]):
        assert text(f"→ {call['name']}({call['arguments']})"[:200]) in body
        assert text(call["output"][:200]) in body
    assert "the task&#x27;s own verifier" in body or "the task's own verifier" in body
    assert text(s["verifier"][:120]) in body
    assert text(f"failed: {s['failure_class']} (rule {s['failure_rule']})") in body
    record = json.loads(attempt["reply_text"])
    for name, data in record["files"].items():
        assert text(name) in body and text(base64.b64decode(data).decode().strip()) in body


def test_every_link_of_the_evaluation_pages_resolves(committed):
    _, index = get(committed, "/")
    todo = [h for h in re.findall(r'href="(/(?:eval|compare)/[^"#]*)', index)]
    seen: set[str] = set()
    while todo:
        path = todo.pop().replace("&amp;", "&")
        if path in seen:
            continue
        seen.add(path)
        status, body = get(committed, path)
        assert status == 200, (path, body[:300])
        if "/task?" in path or "/sample?" in path or path.startswith("/file/"):
            continue  # one level below the eval pages is enough: 2,000 trajectories each
        hrefs = [h for h in re.findall(r'href="(/[^"#]*)', body) if not h.startswith("/run/")]
        per_page = [h for h in hrefs if "/task?" in h or "/sample?" in h][:3]
        todo += [h for h in hrefs if "/task?" not in h and "/sample?" not in h] + per_page
    assert any(p.startswith("/file/") for p in seen) and any("/task?" in p for p in seen)
    assert len(seen) > 20


def test_an_evaluations_files_are_never_read_through_a_symlink(tmp_path):
    """A copy of a committed evaluation whose trajectories point outside, and one whose eval.json
    does: the first's trajectory page is refused, the second is listed as not readable."""
    run = EVALS[0]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text('{"secret": "eval-view-secret-41c2"}')
    ledgers = tmp_path / "ledgers"
    for name in ("linked-turns", "linked-summary"):
        shutil.copytree(run, ledgers / name, ignore=shutil.ignore_patterns("replies"))
    (ledgers / "linked-turns/trajectories.parquet").unlink()
    (ledgers / "linked-turns/trajectories.parquet").symlink_to(run / "trajectories.parquet")
    (ledgers / "linked-summary/eval.json").unlink()
    (ledgers / "linked-summary/eval.json").symlink_to(outside / "secret.json")
    turn = pq.read_table(run / "trajectories.parquet").slice(0, 1).to_pylist()[0]
    with serve([ledgers]) as s:
        _, index = get(s, "/")
        status, body = get(s, f"/eval/linked-turns/sample?phase={quote(turn['phase'])}&id="
                              f"{quote(turn['task_id'], safe='')}&agent={quote(turn['agent'])}"
                              f"&sample={turn['sample']}&attempt={turn['attempt']}")
        assert get(s, "/eval/linked-turns")[0] == 200  # what it does not read through the link still shows
        status_summary, _ = get(s, "/eval/linked-summary")
    assert 'href="/eval/linked-turns"' in index and 'href="/eval/linked-summary"' not in index
    assert "linked-summary" in index[index.index("Not readable"):]
    assert status == 500 and "no such file" in body and text(turn["user"][:80]) not in body
    assert status_summary == 404 and "eval-view-secret" not in index


# --- a fresh evaluation whose model and tool write markup ----------------------------------

HOSTILE_COMMAND = "printf '%s\\n' '<script>alert(1)</script>' '</pre><img src=x onerror=alert(2)>'"
HOSTILE_ANSWER = "</pre><script>alert(3)</script>\u202eevil\u202c <b>bold</b> \\boxed{[[1]]}"


def hostile(request: dict) -> dict:
    if not any(m["role"] == "tool" for m in request["messages"]):
        return {"content": "<i>thinking</i>", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"command": HOSTILE_COMMAND}}}]}
    return {"content": HOSTILE_ANSWER}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, passed_pool):
    """ledgers/{pool, hostile eval, baseline eval, their comparison} made for real through bwrap:
    the pool a copy of the session's passed pool (tests/conftest.py; made once, never written)."""
    base = tmp_path_factory.mktemp("vieweval")
    ledgers = base / "ledgers"
    shutil.copytree(passed_pool, ledgers / "pool", symlinks=True)
    with serve_model({"hostile": hostile, "baseline": baseline}) as model:
        for name in ("hostile", "baseline"):
            api.eval_freeze(name, pool_run=ledgers / "pool", model=name, model_revision="test",
                            base_url=model.base_url, server="localserver", k=2, data=(CORPUS_PATH,),
                            allow_patch=True, out=base / f"{name}.json")
            api.eval_run(base / f"{name}.json", run_dir=ledgers / name, concurrency=3, data=(CORPUS_PATH,),
                         allow_patch=True)
            api.eval_report(ledgers / name)
    return ledgers


@pytest.mark.bwrap
@pytest.mark.slow
def test_model_and_tool_markup_is_shown_as_text(fresh):
    turn = next(t for t in pq.read_table(fresh / "hostile/trajectories.parquet").to_pylist()
                if t["tool_calls"] and t["phase"] == GREEDY_PHASE)
    assert "<script>alert(1)</script>" in turn["tool_calls"][0]["output"]  # the tool really printed it
    with serve([fresh]) as s:
        _, index = get(s, "/")
        assert 'href="/eval/hostile"' in index and 'href="/eval/baseline"' in index
        pages = [get(s, "/eval/hostile"), get(s, f"/eval/hostile/task?id={quote(turn['task_id'], safe='')}"),
                 get(s, f"/eval/hostile/sample?phase={GREEDY_PHASE}&id={quote(turn['task_id'], safe='')}"
                        f"&agent={quote(turn['agent'])}&sample=0&attempt={turn['attempt']}")]
    assert all(status == 200 for status, _ in pages)
    body = pages[2][1]
    for raw in ("<script>alert(", "<img src=x", "<b>bold</b>", "<i>thinking</i>", "\u202e"):
        assert raw not in body
    for shown in ("&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;/pre&gt;&lt;img src=x onerror=alert(2)&gt;",
                  "&lt;script&gt;alert(3)&lt;/script&gt;", "&lt;i&gt;thinking&lt;/i&gt;", "\\u202e"):
        assert shown in body, shown
    assert "failed: capability" in body  # its answer is wrong, and the page says which class and rule


@pytest.mark.bwrap
@pytest.mark.slow
def test_a_fresh_evaluation_and_its_comparison_are_browsable(fresh):
    result, entry = api.compare(fresh / "baseline", fresh / "hostile",
                                out=fresh / "compare" / "baseline--hostile")
    with serve([fresh]) as s:
        status, body = get(s, "/eval/baseline")
        key = quote(str(entry.relative_to(fresh)), safe="")
        status_c, comparison = get(s, f"/compare/{key}")
        _, pool_page = get(s, "/run/pool")
    assert status == 200 and status_c == 200
    tasks = {t["task_id"]: t for t in pq.read_table(fresh / "baseline/eval-tasks.parquet").to_pylist()}
    rows = task_rows(body)
    assert set(rows) == set(tasks)
    for task_id, t in tasks.items():
        assert (
            rows[task_id][3] == f"{t['solved']}/{t['n_valid']}"
            and rows[task_id][4] == f"{t['pass_at_k']:.3f}"
        )
    assert 'href="/eval/hostile"' in comparison and 'href="/eval/baseline"' in comparison
    assert [v[0] for v in result.varied][0] in comparison
    assert f'href="/compare/{key}"' in body  # the eval page names its comparison
    # and the pool its evals
    assert 'href="/eval/baseline"' in pool_page and 'href="/eval/hostile"' in pool_page
    assert get_file(fresh, key) == (entry / "compare.html").read_bytes().decode()


def get_file(fresh: Path, key: str) -> str:
    with serve([fresh]) as s:
        status, body = get(s, f"/file/{key}/compare.html")
    assert status == 200
    return body
