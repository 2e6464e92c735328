"""The chat-completions client against real servers on loopback: every endpoint fault is typed
(`EndpointUnavailable` retried, Retry-After honoured; `EndpointRejected` at once), streamed
and plain answers assemble alike, and the API key goes only into the Authorization header."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from validate.devtools.localserver import Faults, serve
from validate.eval.agent import check_call
from validate.eval.client import ChatClient, DeadlineCut, EndpointRejected, EndpointUnavailable

BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}


def policy(request: dict) -> dict:
    if not any(m["role"] == "tool" for m in request["messages"]):
        return {"tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "bash", "arguments": {"command": "ls -la /workspace"}}}]}
    return {"content": "the answer is \\boxed{[1, 2]}"}


def body(stream: bool, **extra) -> dict:
    b = {"model": "m", "messages": [{"role": "user", "content": "hi there"}], "tools": [BASH],
         "stream": stream, **extra}
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


@pytest.fixture
def server():
    with serve({"m": policy}) as s:
        yield s


@pytest.mark.parametrize("stream", [False, True])
def test_plain_and_streamed_answers_assemble_alike(server, stream):
    done = ChatClient(server.base_url, retries=0).complete(body(stream))
    call = done.message["tool_calls"][0]
    assert call["id"] == "c1" and call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls -la /workspace"}
    assert done.finish_reason == "tool_calls" and done.tries == 1 and done.faults == []
    assert done.prompt_tokens > 0
    assert done.completion_tokens == 5  # "bash" + the four whitespace tokens of the arguments
    assert done.message["content"] is None


def test_a_429_is_retried_after_its_retry_after(server):
    server.set_faults(Faults(rate_limit_first_n=2, retry_after_s=1))
    t0 = time.monotonic()
    done = ChatClient(server.base_url, retries=3, backoff_s=0.01).complete(body(True))
    assert time.monotonic() - t0 >= 2.0, "Retry-After: 1 was not honoured twice"
    assert done.tries == 3 and done.faults == ["rate_limited", "rate_limited"] and done.wait_s >= 2.0
    assert [r.status for r in server.requests] == [429, 429, 200]


def test_a_429_that_outlasts_the_retries_is_unavailable(server):
    server.set_faults(Faults(rate_limit_first_n=10, retry_after_s=0))
    with pytest.raises(EndpointUnavailable) as e:
        ChatClient(server.base_url, retries=2, backoff_s=0.01).complete(body(False))
    assert e.value.kind == "rate_limited" and e.value.status == 429 and e.value.tries == 3
    assert len(server.requests) == 3


@pytest.mark.parametrize("faults,kind", [
    (Faults(server_error_first_n=2, server_error_status=503), "server_error"),
    (Faults(truncate_first_n=2), "truncated"),
    (Faults(garbage_first_n=2), "bad_response"),
    (Faults(drop_first_n=2), "connection"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_transient_faults_are_retried_then_answered(server, faults, kind, stream):
    server.set_faults(faults)
    done = ChatClient(server.base_url, retries=2, backoff_s=0.01).complete(body(stream))
    assert done.faults == [kind, kind] and done.message["tool_calls"]
    with pytest.raises(EndpointUnavailable) as e:
        server.set_faults(faults)
        ChatClient(server.base_url, retries=1, backoff_s=0.01).complete(body(stream))
    assert e.value.kind == kind


def test_a_slow_endpoint_times_out():
    with serve({"m": policy}, faults=Faults(delay_s=30.0)) as server:
        t0 = time.monotonic()
        with pytest.raises(EndpointUnavailable) as e:
            ChatClient(server.base_url, request_timeout_s=0.3, retries=1, backoff_s=0.01).complete(body(True))
        assert e.value.kind == "timeout" and e.value.tries == 2
        assert time.monotonic() - t0 < 10  # the timeout cut both tries; waiting them out takes 60 s


def test_the_deadline_bounds_every_try_and_wait(server):
    server.set_faults(Faults(rate_limit_first_n=10, retry_after_s=5))
    t0 = time.monotonic()
    with pytest.raises(EndpointUnavailable):
        ChatClient(server.base_url, retries=5, max_wait_s=30).complete(body(False),
                                                                       deadline=time.monotonic() + 1.0)
    # honouring Retry-After: 5 s or more
    assert time.monotonic() - t0 < 4, "waited past the attempt's deadline"


def test_connection_refused_is_unavailable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    with pytest.raises(EndpointUnavailable) as e:
        ChatClient(f"http://127.0.0.1:{port}/v1", retries=2, backoff_s=0.01).complete(body(False))
    assert e.value.kind == "connection" and e.value.tries == 3


def test_a_wrong_key_or_model_is_rejected_at_once_and_the_key_stays_in_the_header():
    with serve({"m": policy}, api_key="sekret-key") as server:
        with pytest.raises(EndpointRejected) as e:
            ChatClient(server.base_url, api_key="wrong", retries=3).complete(body(False))
        assert e.value.status == 401 and e.value.auth and len(server.requests) == 1
        with pytest.raises(EndpointRejected) as e:
            ChatClient(server.base_url, api_key="sekret-key", retries=3).complete(body(False, model="nope"))
        assert e.value.status == 404 and e.value.auth
        done = ChatClient(server.base_url, api_key="sekret-key").complete(body(False))
        assert done.message["tool_calls"]
        last = server.requests[-1]
        assert last.authorized and last.headers["authorization"] == "<redacted>"
        assert "sekret-key" not in json.dumps(last.body)


class _ContextTooLong(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps({"error": {"message": "This model's maximum context length is 4096 tokens. "
                                                "However, you requested 9000 tokens.",
                                     "type": "BadRequestError"}}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


def test_a_context_length_refusal_is_told_apart_from_a_bad_request(server):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _ContextTooLong)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(EndpointRejected) as e:
            ChatClient(f"http://127.0.0.1:{httpd.server_address[1]}/v1").complete(body(False))
        assert e.value.context_length and not e.value.auth
    finally:
        httpd.shutdown()
        httpd.server_close()
    with pytest.raises(EndpointRejected) as e:  # the local server refuses a request body it cannot read
        ChatClient(server.base_url).complete(body(False, temperature=7))
    assert e.value.status == 400 and not e.value.context_length and "temperature" in str(e.value)


class _Hostile(BaseHTTPRequestHandler):
    """Answers as `server.mode` says: a stream dripping a chunk a second (chunked, or delimited by
    the connection closing) or stalling 10 s after a first chunk sent 1.5 s in, headers or a
    plain body dripping, or an answer of the wrong shape or model."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode, model = self.server.mode, request["model"]
        chunk = {"model": model, "object": "chat.completion.chunk"}
        try:
            if mode in ("drip", "drip_close", "stall"):
                events = [{**chunk, "choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
                          for i in range(6)]
                if mode == "stall":  # past the first read's timeout (the 3 s left when the request began)
                    time.sleep(1.5)
                self._events(events, gap_s=10.0 if mode == "stall" else 1.0, chunked=mode != "drip_close")
            elif mode == "drip_headers":  # a header line a second: no read ever waits long
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for i in range(10):
                    self.wfile.write(b"X-Slow-%d: %d\r\n" % (i, i))
                    self.wfile.flush()
                    time.sleep(1.0)
                data = json.dumps(answer(model, "late")).encode()
                self.wfile.write(
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
                )
            elif mode == "drip_plain":
                data = json.dumps(answer(model, "slow")).encode()
                self._head("application/json", {"Content-Length": str(len(data))})
                for i in range(0, len(data), 8):
                    self.wfile.write(data[i:i + 8])
                    self.wfile.flush()
                    time.sleep(0.5)
            elif mode == "content_int":
                self._json(answer(model, 123))
            elif mode == "content_int_stream":
                self._events([{**chunk, "choices": [{"index": 0, "delta": {"content": 123}}]}], 0,
                             chunked=True)
            elif mode == "other_model":
                self._json(answer("someone-else", "hello"))
            elif mode == "other_model_stream":
                self._events([{**chunk, "model": "someone-else",
                               "choices": [{"index": 0, "delta": {"content": "x"}}]}],
                             0, chunked=True)
        except OSError:  # the client shut its end at the deadline
            pass

    def _head(self, ctype: str, headers: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self._head("application/json", {"Content-Length": str(len(data))})
        self.wfile.write(data)

    def _events(self, events: list[dict], gap_s: float, chunked: bool) -> None:
        self._head("text/event-stream", {"Transfer-Encoding": "chunked"} if chunked
                   else {"Connection": "close"})
        for data in [json.dumps(e).encode() for e in events] + [b"[DONE]"]:
            event = b"data: " + data + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event) if chunked else event)
            self.wfile.flush()
            time.sleep(gap_s)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = not chunked

    def log_message(self, *a):
        pass


def answer(model: str, content) -> dict:
    return {"model": model, "object": "chat.completion",
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}]}


@pytest.fixture
def hostile():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("mode", ["drip", "drip_close", "stall"])
def test_a_dripping_stream_is_cut_at_the_deadline_never_answered(hostile, mode):
    """A chunk every second never trips the 30 s read timeout; the 3 s deadline bounds the whole
    request, and the cut answer is the attempt's timeout (`DeadlineCut`), never a Completion.
    A stream stalled mid-read is cut by the socket's shutdown at the deadline, not by the read
    timeout (at best the time left when the request began: 1.5 + 3 s)."""
    hostile.mode = mode
    t0 = time.monotonic()
    with pytest.raises(DeadlineCut) as e:
        ChatClient(hostile.base_url, request_timeout_s=30, retries=2).complete(body(True), deadline=t0 + 3.0)
    spent = time.monotonic() - t0
    assert 2.9 < spent < 4.0, f"the request ran {spent:.1f} s under a 3 s deadline"
    cut = e.value.completion
    assert cut.message["content"].startswith("w0 " if mode == "stall" else "w0 w1 ")
    assert "w5" not in cut.message["content"]
    assert cut.finish_reason is None and cut.tries == 1 and 2.9 < cut.latency_s < 4.0


@pytest.mark.parametrize("mode", ["drip_plain", "drip_headers"])
def test_a_dripping_plain_body_or_header_is_an_endpoint_timeout_at_the_deadline(hostile, mode):
    hostile.mode = mode  # no sign of the model's progress until the body is whole: the endpoint's fault
    t0 = time.monotonic()
    with pytest.raises(EndpointUnavailable) as e:
        ChatClient(hostile.base_url, request_timeout_s=30, retries=2).complete(body(False), deadline=t0 + 3.0)
    assert e.value.kind == "timeout" and "deadline" in str(e.value) and time.monotonic() - t0 < 4.0


def test_the_agent_ends_a_cut_answer_as_the_attempts_timeout_and_scores_no_reply(hostile, tmp_path):
    from tests.test_eval_agent import contract
    from validate.eval.agent import converse, opening
    from validate.kinds.chat import _status
    from validate.sandbox import Mount, RunRequest, open_sandbox
    from validate.sandbox.session import open_session

    hostile.mode = "drip"
    c = contract(hostile.base_url, model="m", attempt_timeout_s=30)
    request = RunRequest(argv=(), mounts=(Mount(source=tmp_path, target="/workspace", read_only=False),),
                         name="cut", env={"HOME": "/tmp"})
    with open_session(open_sandbox("subprocess", image="host"), request) as session:
        conv = opening(c, "order the paragraphs", {})
        converse(ChatClient(hostile.base_url, request_timeout_s=30), c, session, conv, 0.0, 1,
                 time.monotonic() + 3.0)
    assert conv.termination == "timeout" and conv.reply is None
    # the evidence
    assert conv.turns[-1].content.startswith("w0 ") and conv.turns[-1].completion.latency_s > 2.9
    assert _status(conv, 1 << 20) == ("timeout", None)


@pytest.mark.parametrize("stream", [False, True])
def test_a_non_string_content_is_a_bad_response_of_the_endpoint(hostile, stream):
    hostile.mode = "content_int_stream" if stream else "content_int"
    with pytest.raises(EndpointUnavailable) as e:
        ChatClient(hostile.base_url, retries=1, backoff_s=0.01).complete(body(stream))
    assert e.value.kind == "bad_response" and "content" in str(e.value) and "123" in str(e.value)
    assert e.value.tries == 2  # retried like every malformed answer, then the attempt's infrastructure error


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_from_another_model_is_refused_naming_both(hostile, stream):
    hostile.mode = "other_model_stream" if stream else "other_model"
    with pytest.raises(EndpointUnavailable) as e:
        ChatClient(hostile.base_url, retries=0).complete(body(stream))
    assert e.value.kind == "wrong_model" and "'someone-else'" in str(e.value) and "'m'" in str(e.value)


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_from_the_model_is_its_text_stored_escaped(stream):
    """A JSON ``\\ud800`` escape in an answer is the model's text: kept, escaped, so every writer
    of the evidence (JSON, Parquet) can store it; it never stops the run."""
    def lone(request: dict) -> dict:
        return {"tool_calls": [{"id": "c\udcff", "type": "function",
                                "function": {"name": "bash", "arguments": {"command": "echo \ud800"}}}]}

    with serve({"m": lone}) as s:
        done = ChatClient(s.base_url, retries=0).complete(body(stream))
    call = done.message["tool_calls"][0]
    assert call["id"] == "c\\udcff" and done.message["content"] is None
    json.dumps(done.message, ensure_ascii=False).encode("utf-8")  # strict: storable as UTF-8
    # The arguments are JSON text as sent; the command in them is refused, never run.
    assert check_call(call, 0, 0)[1:] == (None, "the command is not text (it holds a lone surrogate)")
    with serve({"m": lambda request: {"content": "done \ud800"}}) as s:
        assert ChatClient(s.base_url, retries=0).complete(body(stream)).message["content"] == "done \\ud800"
