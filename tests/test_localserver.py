"""`validate.devtools.localserver`: real HTTP over loopback with a plain client (`requests`); every
fault observed from the client's side."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from validate.devtools.localserver import Faults, serve

ROOT = Path(__file__).resolve().parents[1]
BASH_TOOL = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
SEEN: list[dict] = []  # what policies were handed, for the tests that look at it


def echo_policy(request: dict) -> dict:
    """Echo the last user text; with tools offered and nothing run yet, call bash once."""
    SEEN.append(request)
    last = request["messages"][-1]
    if request.get("tools") and last["role"] == "user" and request.get("tool_choice") != "none":
        return {"tool_calls": [{"type": "function",
                                "function": {"name": "bash", "arguments": {"command": "ls -l"}}}]}
    return {"content": f"you said: {last.get('content')}"}


def chat(server, body: dict | None = None, key: str | None = None, **kw) -> requests.Response:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hello there world"}], **(body or {})}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{server.base_url}/chat/completions", json=body, headers=headers, timeout=10, **kw)


def sse_events(resp: requests.Response) -> list[str]:
    """The `data:` payloads of a server-sent-event body, in order."""
    return [
        line[len("data: ") :] for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")
    ]


def assemble(events: list[str]) -> dict:
    """Rebuild the message and finish reason from stream chunks, as an SDK does."""
    content, calls, finish, usage = "", {}, None, None
    for event in events[:-1]:
        chunk = json.loads(event)
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            content += choice["delta"].get("content") or ""
            for tc in choice["delta"].get("tool_calls", []):
                slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id", slot["id"])
                slot["name"] += tc.get("function", {}).get("name", "")
                slot["arguments"] += tc.get("function", {}).get("arguments", "")
            finish = choice["finish_reason"] or finish
    return {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish": finish, "usage": usage}


@pytest.fixture
def server():
    with serve({"echo": echo_policy}) as s:
        yield s


def test_models_are_listed_and_an_unknown_one_is_openais_404(server):
    listed = requests.get(f"{server.base_url}/models", timeout=10).json()
    assert [m["id"] for m in listed["data"]] == ["echo"] and listed["object"] == "list"
    assert requests.get(f"{server.base_url}/models/echo", timeout=10).json()["id"] == "echo"
    for resp in (requests.get(f"{server.base_url}/models/gpt-x", timeout=10),
                 chat(server, {"model": "gpt-x"})):
        assert resp.status_code == 404
        assert (
            resp.json()["error"]["code"] == "model_not_found" and "`gpt-x`" in resp.json()["error"]["message"]
        )


def test_a_text_answer_with_whitespace_token_usage(server):
    resp = chat(server, {"messages": [{"role": "system", "content": "be  brief"},
                                      {"role": "user", "content": "hello there world"}]})
    body = resp.json()
    assert resp.status_code == 200 and body["object"] == "chat.completion" and body["model"] == "echo"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "you said: hello there world"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


def test_a_tool_call_has_json_string_arguments(server):
    body = chat(server, {"tools": [BASH_TOOL], "tool_choice": "auto", "temperature": 0.7, "seed": 11}).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"] and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls -l"}
    assert (SEEN[-1]["temperature"], SEEN[-1]["seed"], SEEN[-1]["tools"]) == (0.7, 11, [BASH_TOOL])


def test_the_stream_parses_to_the_same_message_and_ends_with_done(server):
    resp = chat(server, {"tools": [BASH_TOOL], "stream": True, "stream_options": {"include_usage": True}},
                stream=True)
    assert resp.headers["Content-Type"] == "text/event-stream"
    events = sse_events(resp)
    assert events[-1] == "[DONE]"
    got = assemble(events)
    assert got["finish"] == "tool_calls" and got["calls"][0]["name"] == "bash"
    assert json.loads(got["calls"][0]["arguments"]) == {"command": "ls -l"}
    assert got["usage"]["completion_tokens"] == 4  # bash {"command": "ls -l"}
    text = assemble(sse_events(chat(server, {"stream": True}, stream=True)))
    assert (text["content"], text["finish"], text["usage"]) == ("you said: hello there world", "stop", None)


def test_max_tokens_cuts_the_answer_with_finish_reason_length(server):
    body = chat(server, {"max_tokens": 2}).json()
    assert body["choices"][0]["message"]["content"] == "you said:"
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 2


def test_bad_requests_name_the_field_and_policy_bugs_are_a_500():
    def broken(request):
        raise RuntimeError("boom")

    with serve({"echo": echo_policy, "broken": broken, "rogue": lambda r: {"tool_calls": [
            {"function": {"name": "rm", "arguments": "{}"}}]}}) as server:
        resp = chat(server, {"n": 2})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"
        for bad, param in (({"tools": [{"type": "function", "function": "bash"}]}, "tools.0.function"),
                           ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
                           ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
                           ({"temperature": 3}, "temperature")):
            resp = chat(server, bad)
            assert resp.status_code == 400 and resp.json()["error"]["param"].startswith(param), resp.text
        resp = requests.post(f"{server.base_url}/chat/completions", data=b"{not json", timeout=10)
        assert resp.status_code == 400 and "not a JSON object" in resp.json()["error"]["message"]
        resp = chat(server, {"model": "broken"})
        assert (
            resp.status_code == 500
            and "'broken' raised RuntimeError: boom" in resp.json()["error"]["message"]
        )
        resp = chat(server, {"model": "rogue", "tools": [BASH_TOOL]})
        assert resp.status_code == 500 and "'rm'" in resp.json()["error"]["message"]
        assert chat(server).status_code == 200  # the server survives its policies


def test_the_api_key_is_required_when_set():
    with serve({"echo": echo_policy}, api_key="sekrit") as server:
        assert chat(server).status_code == 401
        wrong = chat(server, key="guess")
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        assert requests.get(f"{server.base_url}/models", timeout=10).status_code == 401
        assert chat(server, key="sekrit").status_code == 200
        log = server.requests
        assert [r.authorized for r in log] == [False, False, False, True]
        assert all(r.headers.get("authorization") in (None, "<redacted>") for r in log)


def test_the_request_log_holds_every_request_in_order(server):
    requests.get(f"{server.base_url}/models", timeout=10)
    chat(server, {"messages": [{"role": "user", "content": "one"}]})
    chat(server, {"messages": [{"role": "user", "content": "two"}], "model": "nope"})
    log = server.requests
    assert [(r.index, r.method, r.path, r.status) for r in log] == [
        (0, "GET", "/v1/models", 200), (1, "POST", "/v1/chat/completions", 200),
        (2, "POST", "/v1/chat/completions", 404)]
    assert [r.body["messages"][0]["content"] for r in log[1:]] == ["one", "two"]
    log[1].body["model"] = "mutated"  # a snapshot: the server's own log is untouched
    assert server.requests[1].body["model"] == "echo"


def test_429_with_retry_after_for_the_first_n_then_answers():
    with serve({"echo": echo_policy}, faults=Faults(rate_limit_first_n=2, retry_after_s=7)) as server:
        first, second, third = chat(server), chat(server), chat(server)
    assert (first.status_code, second.status_code, third.status_code) == (429, 429, 200)
    assert first.headers["Retry-After"] == "7" and first.json()["error"]["code"] == "rate_limit_exceeded"
    assert [r.fault for r in server.requests] == ["rate_limit", "rate_limit", None]


def test_5xx_for_the_first_n_then_answers():
    with serve({"echo": echo_policy},
               faults=Faults(server_error_first_n=1, server_error_status=503)) as server:
        down, up = chat(server), chat(server)
    assert down.status_code == 503 and down.json()["error"]["type"] == "server_error"
    assert up.status_code == 200


def test_a_delay_times_a_client_out_and_a_patient_client_gets_the_answer():
    with serve({"echo": echo_policy}, faults=Faults(delay_s=0.6)) as server:
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(f"{server.base_url}/chat/completions", timeout=0.1,
                          json={"model": "echo", "messages": [{"role": "user", "content": "x"}]})
        t0 = time.monotonic()
        assert chat(server).status_code == 200
        assert time.monotonic() - t0 >= 0.6
        assert server.requests[1].fault == "delay"


def test_close_ends_a_pending_delayed_answer_at_once():
    with serve({"echo": echo_policy}, faults=Faults(delay_s=60)) as server:
        errors = []
        worker = threading.Thread(target=lambda: errors.append(_catch(lambda: chat(server))))
        worker.start()
        while not server.requests:
            time.sleep(0.01)
        t0 = time.monotonic()
    worker.join(10)
    assert time.monotonic() - t0 < 5 and not worker.is_alive()
    assert isinstance(errors[0], requests.exceptions.ConnectionError)


def _catch(fn):
    try:
        return fn()
    except Exception as exc:  # the test inspects which exception
        return exc


def test_a_garbage_body_is_not_json():
    with serve({"echo": echo_policy}, faults=Faults(garbage_first_n=1)) as server:
        resp = chat(server)
        assert resp.status_code == 200
        with pytest.raises(requests.exceptions.JSONDecodeError):
            resp.json()
        assert chat(server).json()["choices"]  # only the first


def test_a_truncated_stream_has_no_done_and_breaks_the_transfer():
    with serve({"echo": echo_policy}, faults=Faults(truncate_first_n=2)) as server:
        resp = chat(server, {"stream": True}, stream=True)
        got = []
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            for line in resp.iter_lines(decode_unicode=True):
                got.append(line)
        payloads = [g[6:] for g in got if g.startswith("data: ")]
        assert payloads and "[DONE]" not in payloads
        assert all(json.loads(p)["object"] == "chat.completion.chunk" for p in payloads)
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            chat(server)  # a plain answer shorter than its Content-Length
        assert sse_events(chat(server, {"stream": True}, stream=True))[-1] == "[DONE]"


def test_malformed_tool_arguments_do_not_parse():
    with serve({"echo": echo_policy}, faults=Faults(malformed_tool_args_first_n=1)) as server:
        bad = chat(server, {"tools": [BASH_TOOL]}).json()["choices"][0]["message"]["tool_calls"][0]
        with pytest.raises(json.JSONDecodeError):
            json.loads(bad["function"]["arguments"])
        good = chat(server, {"tools": [BASH_TOOL]}).json()["choices"][0]["message"]["tool_calls"][0]
        assert json.loads(good["function"]["arguments"]) == {"command": "ls -l"}


def test_a_dropped_connection_gets_no_answer():
    with serve({"echo": echo_policy}, faults=Faults(drop_first_n=1)) as server:
        with pytest.raises(requests.exceptions.ConnectionError):
            chat(server)
        assert chat(server).status_code == 200
        assert [(r.status, r.fault) for r in server.requests] == [(None, "drop"), (200, None)]


def test_a_closed_server_refuses_connections():
    with serve({"echo": echo_policy}) as server:
        url = server.base_url
    with pytest.raises(requests.exceptions.ConnectionError, match="refused"):
        requests.get(f"{url}/models", timeout=5)
    host, port = url.split("//")[1].split("/")[0].split(":")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5)


def test_set_faults_restarts_the_count():
    with serve({"echo": echo_policy}) as server:
        assert chat(server).status_code == 200
        server.set_faults(Faults(server_error_first_n=1))
        assert [chat(server).status_code, chat(server).status_code] == [500, 200]


def test_the_command_line_serves_a_policy_by_module_path():
    proc = subprocess.Popen([sys.executable, "-m", "validate.devtools.localserver", "--model",
                             "echo=tests.test_localserver:echo_policy", "--port", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        body = requests.post(f"{url}/chat/completions", timeout=10, json={
            "model": "echo", "messages": [{"role": "user", "content": "hi"}]}).json()
        assert body["choices"][0]["message"]["content"] == "you said: hi"
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


@pytest.mark.parametrize("spec, message", [("echo", "NAME=module:function"),
                                           ("echo=tests.test_localserver", "module:function"),
                                           ("echo=tests.nowhere:f", "cannot be loaded")])
def test_the_command_line_names_a_bad_model_spec(spec, message):
    done = subprocess.run([sys.executable, "-m", "validate.devtools.localserver", "--model", spec], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
