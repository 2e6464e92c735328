"""A second OpenAI-compatible chat-completions server, written apart from `validate.devtools.localserver`.

The eval's own tests talk to the project's local server; this one exists so that a test can
run the whole eval against a server that shares none of its code or habits, the way a
hosted API or vLLM would answer:

- streaming is off: a request with ``"stream": true`` is refused (400), so an eval that
  works here needs no server-sent events;
- answers are the API's documented shape, with the fields real servers add and the local
  server does not (``refusal``, ``logprobs``, ``system_fingerprint``, usage details);
  tool calls come as ``message.tool_calls`` with ``call_…`` ids, JSON-string arguments and
  ``content: null``; the finish reason is ``tool_calls``;
- usage is present and counted its own way (UTF-8 bytes / 4, rounded up, as a tokenizer
  would roughly count), never whitespace tokens;
- JSON goes out as UTF-8 (``ensure_ascii=False``), keys in insertion order, not sorted;
- errors carry OpenAI's error object: 401 for a wrong key, 404 ``model_not_found``, 400
  ``invalid_request_error`` naming the parameter.

The model behind a name is a policy, ``policy(request) -> {"content": …, "tool_calls": […]}``
(arguments a dict or a string): the same policies the local server serves, so what differs
is the server, not the model. `requests` records what was asked, for the tests' asserts.

    with OpenAIStub({"m": policy}, api_key="k") as stub:
        stub.base_url  # http://127.0.0.1:<port>/v1
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Policy = Callable[[dict], dict]


def usage_tokens(text: str) -> int:
    """This server's token count: UTF-8 bytes / 4, rounded up."""
    return -(-len(text.encode()) // 4)


def _error(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class OpenAIStub:
    """The server, running on loopback for the duration of a ``with`` block."""

    def __init__(self, models: Mapping[str, Policy], api_key: str | None = None, list_models: bool = True,
                 answer_as: str | None = None) -> None:
        self.models, self.api_key = dict(models), api_key
        #: False: no ``GET /models`` (404), as a server without a listing answers.
        self.list_models = list_models
        #: Answer as this model name instead of the one asked for (a misrouted endpoint).
        self.answer_as = answer_as
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> OpenAIStub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    def chat(self, body: object) -> tuple[int, dict]:
        """(status, answer) of one chat-completions request body."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return 400, _error("'messages' is a required property", "invalid_request_error", "messages")
        if body.get("stream"):
            return 400, _error("Streaming is not supported by this server.", "invalid_request_error",
                               "stream")
        name = body.get("model")
        policy = self.models.get(name)
        if policy is None:
            return 404, _error(f"The model `{name}` does not exist or you do not have access to it.",
                               "invalid_request_error", "model", "model_not_found")
        try:
            message = self._message(policy(json.loads(json.dumps(body))), body)
        except Exception as e:  # noqa: BLE001 - a policy's bug is this server's 500
            return 500, _error(f"The model raised {type(e).__name__}: {e}", "server_error")
        prompt = usage_tokens(json.dumps(body["messages"], ensure_ascii=False))
        if body.get("tools"):
            prompt += usage_tokens(json.dumps(body["tools"], ensure_ascii=False))
        completion = usage_tokens((message["content"] or "") + "".join(
            c["function"]["name"] + c["function"]["arguments"] for c in message.get("tool_calls", [])))
        return 200, {
            "id": "chatcmpl-" + hashlib.sha256(json.dumps(body).encode()).hexdigest()[:29],
            "object": "chat.completion", "created": int(time.time()), "model": self.answer_as or name,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0}},
            "system_fingerprint": "fp_openai_stub"}

    @staticmethod
    def _message(reply: dict, body: dict) -> dict:
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        calls = []
        for i, call in enumerate(reply.get("tool_calls") or []):
            fn = call["function"]
            if fn["name"] not in offered:
                raise ValueError(f"tool {fn['name']!r} is not offered")
            args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
            digest = hashlib.sha256(f"{i}:{fn['name']}:{args}".encode()).hexdigest()
            calls.append({"id": f"call_{digest[:24]}", "type": "function",
                          "function": {"name": fn["name"], "arguments": args}})
        message = {"role": "assistant", "content": reply.get("content"), "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return message


def _handler(stub: OpenAIStub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, answer: dict) -> None:
            data = json.dumps(answer, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            with stub.lock:
                stub.requests.append({"method": method, "path": self.path, "body": body,
                                      "authorization": self.headers.get("Authorization")})
            if stub.api_key is not None and self.headers.get("Authorization") != f"Bearer {stub.api_key}":
                return self._send(401, _error("Incorrect API key provided.", "invalid_request_error", None,
                                              "invalid_api_key"))
            if method == "GET" and self.path == "/v1/models" and stub.list_models:
                return self._send(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": 1700000000,
                     "owned_by": "stub"} for m in stub.models]})
            if method == "POST" and self.path == "/v1/chat/completions":
                return self._send(*stub.chat(body))
            self._send(404, _error(f"Invalid URL ({method} {self.path})", "invalid_request_error"))

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler
