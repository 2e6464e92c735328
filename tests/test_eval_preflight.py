"""A broken endpoint is refused once, before `validate eval run` writes anything; and the whole
eval runs against a second, independently written OpenAI-compatible server.

The preflight against real servers on loopback (the project's local server, the independent
stub in `tests/openai_stub.py`, and a few raw ``http.server`` handlers for what neither
does: a web page, a 403, an endpoint that stays down): each broken case is refused naming the
contract's field and the fix, a healthy one passes without a single chat completion. Then
through the API and the command line on a real pool (bwrap): the refusal is exit 2 with one
line and leaves no run directory, no attempt, no journal and no request to the model; a
healthy endpoint (the stub: streaming off, tool calls in the standard shape, usage counted its
own way, the key from an environment variable) runs the greedy and sampled passes, and the
report and the audit check out."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow.parquet as pq
import pytest

from environment.deshuffle.baseline import MODEL_NAME, policy as baseline
from tests.conftest import CORPUS_PATH, VALIDATE, subprocess_env
from tests.openai_stub import OpenAIStub, usage_tokens
from validate import api
from validate.devtools.localserver import Faults, serve
from validate.eval.preflight import EndpointMisconfigured, Probe, preflight

DATA = (CORPUS_PATH,)
K = 2


def echo(request: dict) -> dict:
    return {"content": "ok"}


@contextmanager
def raw_server(answer) -> Iterator[str]:
    """An ``http.server`` on loopback whose every GET and POST is `answer(handler, n)` (n: the
    request's number from 0); yields its base URL."""
    count = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _any(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            n, count["n"] = count["n"], count["n"] + 1
            status, ctype, data = answer(self, n)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _any

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


HTML = (200, "text/html", b"<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>")


# --- the preflight against real servers ---------------------------------------------------

def test_a_listed_model_passes_with_one_listing_and_no_completion():
    with serve({"m": echo}, faults=Faults(rate_limit_first_n=1), api_key="right") as s:
        assert preflight(s.base_url, "m", "right", "KEY") == f"{s.base_url}/models lists m"
        # no completion: the faults a test sets up for completions still meet the attempts' first request
        assert [(r.method, r.path) for r in s.requests] == [("GET", "/v1/models")]


@pytest.mark.parametrize("given,field,cause", [
    ("wrong", "model.api_key_env", r"answered 401 \(Incorrect API key provided\.\): the endpoint refused the "
                                   r"API key in \$KEY; export the endpoint's own key in KEY"),
    (None, "model.api_key_env",
     r"answered 401 .* the contract sends no API key; freeze it with --api-key-env VAR"),
])
def test_a_wrong_or_missing_key_is_refused_naming_the_variable(given, field, cause):
    with serve({"m": echo}, api_key="right") as s:
        with pytest.raises(EndpointMisconfigured, match=rf"^{field}: GET .*/models {cause}"):
            preflight(s.base_url, "m", given, "KEY")
        assert all(r.method == "GET" for r in s.requests)  # no completion was asked for


def test_a_forbidden_key_is_refused():
    body = json.dumps({"error": {"message": "Project does not have access", "type": "permission"}}).encode()
    with raw_server(lambda h, n: (403, "application/json", body)) as url:
        with pytest.raises(EndpointMisconfigured, match=r"^model.api_key_env: .* answered 403 \(Project does "
                                                        r"not have access\): the endpoint refused the "
                                                        r"API key in \$KEY"):
            preflight(url, "m", "k", "KEY")


def test_a_wrong_model_id_is_refused_with_what_the_endpoint_lists():
    with serve({"m": echo, "other": echo}) as s:
        with pytest.raises(EndpointMisconfigured, match=r"^model.id: the endpoint does not serve model "
                                                        r"'nope' \(POST .* answered 404: The model `nope` "
                                                        r"does not exist.*; it lists m, other\); freeze the "
                                                        r"contract with a model id"):
            preflight(s.base_url, "nope")


@pytest.mark.parametrize("suffix", ["/v2", "", "/v1/chat"])
def test_a_wrong_base_url_path_is_refused(suffix):
    with serve({"m": echo}) as s:
        base = s.base_url.removesuffix("/v1") + suffix
        with pytest.raises(EndpointMisconfigured, match=r"^model.base_url: POST .*/chat/completions answered "
                                                        r"404 \(Unknown request URL.*\): no "
                                                        r"chat-completions API at "):
            preflight(base, "m")


def test_nothing_listening_is_refused_at_once():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EndpointMisconfigured, match=rf"^model.base_url: nothing answers at {url} "
                                                    r"\(connection refused\); start the server"):
        preflight(url, "m")


def test_a_web_page_instead_of_the_api_is_refused():
    with raw_server(lambda h, n: HTML) as url:
        with pytest.raises(EndpointMisconfigured, match=r"^model.base_url: GET .*/models answered 200 with a "
                                                        r"body that is not JSON \(text/html: <!doctype "
                                                        r"html>.*\): .* is not an OpenAI-compatible API; .* "
                                                        r"usually ends in /v1"):
            preflight(url, "m")


def test_the_message_is_one_line_and_quotes_the_endpoint_capped():
    hostile = b"\x1b[31m<html>\n\xe2\x80\xae" + b"x" * 5000 + b"\r\n"
    with raw_server(lambda h, n: (200, "text/html", hostile)) as url:
        with pytest.raises(EndpointMisconfigured) as e:
            preflight(url, "m")
    message = str(e.value)
    assert "\n" not in message and "\r" not in message and len(message) < 700 and "…" in message
    assert "\x1b" not in message and "\u202e" not in message  # no terminal escape, no reordering of the line
    assert "\\x1b[31m<html> \\u202exxx" in message


def test_a_server_without_a_listing_is_asked_one_completion():
    with OpenAIStub({"m": echo}, list_models=False) as stub:
        assert preflight(stub.base_url, "m") == f"{stub.base_url}/chat/completions answered as m"
        assert [(r["method"], r["path"]) for r in stub.requests] == [("GET", "/v1/models"),
                                                                      ("POST", "/v1/chat/completions")]
        assert stub.requests[1]["body"]["max_tokens"] == 1


def test_an_endpoint_answering_as_another_model_is_refused():
    with OpenAIStub({"m": echo}, list_models=False, answer_as="m-2025-01-01") as stub:
        with pytest.raises(EndpointMisconfigured,
                           match=r"^model.id: .* was answered as model 'm-2025-01-01'"):
            preflight(stub.base_url, "m")


def test_a_passing_fault_is_tried_again_and_one_that_stays_is_refused():
    listing = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
    busy = (503, "application/json", b'{"error": {"message": "loading the model"}}')
    with raw_server(lambda h, n: busy if n < 2 else (200, "application/json", listing)) as url:
        assert Probe(url, "m", backoff_s=0.01).run().endswith("/models lists m")
    with raw_server(lambda h, n: busy) as url:
        with pytest.raises(EndpointMisconfigured, match=r"^model.base_url: the endpoint is unavailable: GET "
                                                        r".*/models answered 503 loading the model "
                                                        r"\(after 3 tries\)"):
            Probe(url, "m", backoff_s=0.01).run()


# --- through the API and the command line, on a real pool ---------------------------------

def freeze(pool_run, tmp_path, name, base_url, model=MODEL_NAME, api_key_env=None, **sampling):
    return api.eval_freeze(name, pool_run=pool_run, model=model, model_revision="test", base_url=base_url,
                           server="test", api_key_env=api_key_env, k=K, sampling=sampling, data=DATA,
                           allow_patch=True, out=tmp_path / f"{name}.json")


@pytest.mark.bwrap
@pytest.mark.slow
@pytest.mark.parametrize("case", ["key", "model", "base-url", "refused", "web-page"])
def test_eval_run_refuses_a_broken_endpoint_before_writing_anything(passed_pool, tmp_path, monkeypatch, case):
    monkeypatch.setenv("PREFLIGHT_KEY", "wrong")
    with serve({MODEL_NAME: baseline}, api_key="right") as s, raw_server(lambda h, n: HTML) as page:
        base, model, env, field = {
            "key": (s.base_url, MODEL_NAME, "PREFLIGHT_KEY", "model.api_key_env"),
            "model": (s.base_url, "gpt-nope", None, "model.id"),
            "base-url": (s.base_url.removesuffix("/v1"), MODEL_NAME, None, "model.base_url"),
            "refused": (f"http://127.0.0.1:{free_port()}/v1", MODEL_NAME, None, "model.base_url"),
            "web-page": (page, MODEL_NAME, None, "model.base_url")}[case]
        if case in ("model", "base-url"):
            monkeypatch.setenv("PREFLIGHT_KEY", "right")
            env = "PREFLIGHT_KEY"
        freeze(passed_pool, tmp_path, case, base, model=model, api_key_env=env)
        with pytest.raises(EndpointMisconfigured, match=rf"^{field}: .*nothing was run or written"):
            api.eval_run(tmp_path / f"{case}.json", run_dir=tmp_path / "run", data=DATA, allow_patch=True)
        # no attempt row, no journal, no eval journal: no directory at all
        assert not (tmp_path / "run").exists()
        chats = [r.body for r in s.requests if r.path.endswith("/chat/completions")]
        # the preflight's one probe, no attempt
        assert len(chats) <= 1 and all(b["max_tokens"] == 1 for b in chats)


@pytest.mark.bwrap
@pytest.mark.slow
def test_the_command_line_exits_2_with_one_line(passed_pool, tmp_path):
    with serve({MODEL_NAME: baseline}, api_key="right") as s:
        freeze(passed_pool, tmp_path, "cli", s.base_url, api_key_env="PREFLIGHT_KEY")
        r = subprocess.run([*VALIDATE, "eval", "run", "--contract", str(tmp_path / "cli.json"), "--run-dir",
                            str(tmp_path / "ledgers/cli"), "--data", str(CORPUS_PATH), "--allow-patch"],
                           capture_output=True, text=True, timeout=300,
                           env=subprocess_env(PREFLIGHT_KEY="wrong"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model.api_key_env: GET ") and "401" in lines[0], (
        r.stderr
    )
    assert "wrong" not in r.stderr and "right" not in r.stderr  # the key is never printed
    assert not (tmp_path / "ledgers").exists()


@pytest.mark.bwrap
@pytest.mark.slow
def test_the_whole_eval_runs_against_an_independent_server(passed_pool, tmp_path, monkeypatch):
    """Same command, another server: streaming off, standard tool calls, its own usage counts, the
    key from an environment variable; freeze, both passes, report and audit."""
    monkeypatch.setenv("STUB_API_KEY", "stub-key-1")
    with OpenAIStub({MODEL_NAME: baseline}, api_key="stub-key-1") as stub:
        c = freeze(passed_pool, tmp_path, "stub", stub.base_url, api_key_env="STUB_API_KEY", stream=False,
                   temperature=1.0)
        assert c.sampling.stream is False and c.model.api_key_env == "STUB_API_KEY"
        s = api.eval_run(tmp_path / "stub.json", run_dir=tmp_path / "run", concurrency=4, data=DATA,
                         allow_patch=True)
        asked = list(stub.requests)
    chats = [r for r in asked if r["path"] == "/v1/chat/completions"]
    # the preflight, then two per attempt
    assert asked[0]["path"] == "/v1/models" and len(chats) == 2 * 5 * (1 + K)
    assert all(r["authorization"] == "Bearer stub-key-1" and r["body"]["stream"] is False for r in asked
               if r["body"] is not None)
    assert s.greedy.tasks == 5 and s.greedy.valid == 5 and s.sampled.eligible == 5 and s.errors == []
    ops = s.operations["eval"]
    assert ops.tool_calls == 5 * K and ops.malformed_tool_calls == 0 and ops.terminations == {"answer": 5 * K}
    turns = pq.read_table(tmp_path / "run/trajectories.parquet").to_pylist()
    calls = [c for t in turns for c in t["tool_calls"]]
    assert len(calls) == 5 * (1 + K) and all(c["call_id"].startswith("call_") and c["exit_code"] == 0
                                             for c in calls)
    first = next(t for t in turns if t["turn"] == 0 and t["phase"] == "eval-greedy")
    sent = next(r["body"] for r in chats if len(r["body"]["messages"]) <= 2
                and r["body"]["messages"][-1]["content"] == first["user"])
    assert first["prompt_tokens"] == usage_tokens(
        json.dumps(sent["messages"], ensure_ascii=False)
    ) + usage_tokens(
        json.dumps(sent["tools"], ensure_ascii=False)
    )  # the server's own count, recorded as it said
    assert 0.3 < s.greedy.mean_reward.value < 1.0
    entry = api.eval_report(tmp_path / "run")
    assert (entry / "report.html").is_file()
    assert api.eval_audit(tmp_path / "run").problems == []
