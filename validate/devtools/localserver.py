"""A local OpenAI-compatible chat-completions server whose models are Python policies.

It owns the HTTP side of testing model agents and judges with no LLM on the machine: a real
server on loopback (stdlib ``ThreadingHTTPServer``, HTTP/1.1, keep-alive) that speaks the
part of the OpenAI API a client uses, serves each model name with a *policy* — a callable
``policy(request: dict) -> dict`` that returns the assistant message (``content`` and/or
``tool_calls``) — injects faults on demand, and records every request it received.

Routes: ``GET /v1/models``, ``GET /v1/models/<name>``, ``POST /v1/chat/completions``
(``messages``, ``tools``, ``tool_choice``, ``temperature``, ``top_p``, ``max_tokens`` or
``max_completion_tokens``, ``seed``, ``n=1``, ``stream`` with SSE ``data:`` chunks ending in
``data: [DONE]``, ``stream_options.include_usage``). Errors carry OpenAI's error body.

Usage counts are **whitespace tokens** (``len(text.split())``), not a tokenizer's: prompt
tokens over every message's text, its tool calls' names and arguments and the ``tools``
JSON; completion tokens over the reply's content and tool calls. ``max_tokens`` cuts the
reply at that many whitespace tokens with ``finish_reason: "length"``.

Faults (`Faults`) apply to ``POST /v1/chat/completions`` only, counted in arrival order
after the API-key check (``set_faults`` restarts the count). A delay comes first and does not
exclude the others; of the rest (drop, 429, 5xx, garbage, truncate, malformed tool
arguments) the first that applies to the request answers it. ``requests`` names the fault
each request got.

    with serve({"echo": echo_policy}, faults=Faults(rate_limit_first_n=1)) as server:
        server.base_url  # "http://127.0.0.1:<port>/v1"
        server.requests  # [RecordedRequest, ...] in arrival order

    python -m validate.devtools.localserver --model NAME=module:function [--model ...] [--port P]
        [--api-key KEY] [--faults '{"rate_limit_first_n": 2}']   # prints the base URL, serves
                                                                  # until SIGINT or SIGTERM
"""

from __future__ import annotations

import argparse
import hmac
import importlib
import json
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from validate.core.errors import ValidateError

Policy = Callable[[dict], dict]
GARBAGE = b"<html><body>upstream says: \xff\xfe not JSON {"
IDLE_TIMEOUT_S = 30.0


class Faults(BaseModel):
    """Faults injected into chat completions, each on the first N requests (0 = off)."""

    model_config = ConfigDict(extra="forbid")

    delay_s: float = Field(default=0.0, ge=0, description="Seconds to wait before answering.")
    delay_first_n: int | None = Field(default=None, ge=0,
                                      description="Delay only the first N requests (None = all).")
    drop_first_n: int = Field(default=0, ge=0, description="Close the connection without any answer.")
    rate_limit_first_n: int = Field(default=0, ge=0, description="Answer 429 with a Retry-After header.")
    retry_after_s: int = Field(default=1, ge=0, description="The Retry-After value of a 429, in seconds.")
    server_error_first_n: int = Field(default=0, ge=0, description="Answer with `server_error_status`.")
    server_error_status: int = Field(default=500, ge=500, le=599, description="The 5xx status to answer.")
    garbage_first_n: int = Field(default=0, ge=0, description="Answer 200 with a body that is not JSON.")
    truncate_first_n: int = Field(
        default=0, ge=0, description="Cut the answer mid-way and close: a stream without [DONE] and without "
        "its last chunk, or a JSON body shorter than its Content-Length.")
    malformed_tool_args_first_n: int = Field(
        default=0, ge=0,
        description="Cut every tool call's `arguments` to its first half (never valid JSON).")


class RecordedRequest(BaseModel):
    """One request as the server received it."""

    index: int = Field(description="Arrival order over all requests, from 0.")
    method: str = Field(description="HTTP method.")
    path: str = Field(description="Request path, query string included.")
    headers: dict[str, str] = Field(description="Headers, names lower-cased; `authorization` redacted.")
    body: Any = Field(default=None, description="The body parsed as JSON, or None when absent or not JSON.")
    authorized: bool = Field(description="Whether the API-key check passed (True when no key is required).")
    fault: str | None = Field(default=None, description="The fault injected, if any: delay, drop, "
                              "rate_limit, server_error, garbage, truncate or malformed_tool_args.")
    status: int | None = Field(default=None,
                               description="The status answered; None while pending or if dropped.")


class Message(BaseModel):
    """One message of the conversation; other fields pass through to the policy."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(description="Who speaks.")
    content: str | list[dict] | None = Field(default=None, description="Text, or a list of content parts.")
    tool_calls: list[dict] | None = Field(default=None, description="An assistant's earlier tool calls.")


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1,
                      description="The function's name; `description`, `parameters` pass through.")


class ToolSpec(BaseModel):
    """A function tool offered by the request."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = Field(description="Only function tools are served.")
    function: FunctionSpec = Field(description="The function offered.")


class ChatRequest(BaseModel):
    """The chat-completions fields this server reads; others pass through to the policy."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, description="The model (policy) name.")
    messages: list[Message] = Field(min_length=1, description="The conversation.")
    tools: list[ToolSpec] | None = Field(default=None, description="Function tools the model may call.")
    tool_choice: str | dict | None = Field(default=None,
                                           description="none, auto, required or a named function.")
    temperature: float | None = Field(default=None, ge=0, le=2, description="Sampling temperature.")
    top_p: float | None = Field(default=None, ge=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int | None = Field(default=None, ge=1, description="Completion cap, in whitespace tokens.")
    max_completion_tokens: int | None = Field(default=None, ge=1, description="Newer name of `max_tokens`.")
    seed: int | None = Field(default=None, description="Sampling seed, passed to the policy.")
    n: int = Field(default=1, ge=1, le=1, description="Number of choices; only 1 is served.")
    stream: bool = Field(default=False, description="Answer as server-sent events.")
    stream_options: dict | None = Field(default=None, description="`include_usage` adds a usage chunk.")


class ToolFunction(BaseModel):
    name: str = Field(min_length=1, description="The tool's name.")
    arguments: str | dict = Field(description="JSON-string arguments (a dict is serialised).")


class ToolCall(BaseModel):
    id: str | None = Field(default=None, description="Call id; assigned when missing.")
    type: Literal["function"] = Field(default="function", description="Always function.")
    function: ToolFunction = Field(description="What is called.")


class AssistantMessage(BaseModel):
    """What a policy returns."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["assistant"] = Field(default="assistant", description="Always assistant.")
    content: str | None = Field(default=None, description="The reply text.")
    tool_calls: list[ToolCall] | None = Field(default=None, description="Function calls, if any.")


class PolicyError(ValidateError):
    """A policy raised or returned something that is not an assistant message."""


def count_tokens(text: str) -> int:
    """Whitespace tokens: the honest count this server reports as usage."""
    return len(text.split())


def _message_text(message: Message | dict) -> str:
    if isinstance(message, Message):
        message = message.model_dump()
    content = message.get("content")
    parts = [content] if isinstance(content, str) else [
        p.get("text", "") for p in content or [] if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, Mapping) else None
        fn = fn if isinstance(fn, Mapping) else {}
        args = fn.get("arguments", "")
        parts += [str(fn.get("name", "")), args if isinstance(args, str) else json.dumps(args)]
    return " ".join(parts)


def _cut_tokens(text: str, n: int) -> str:
    """`text` up to the end of its n-th whitespace token, its own spacing kept."""
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    return text if len(ends) <= n else text[:ends[n - 1]] if n else ""


def _error(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def run_policy(name: str, policy: Policy, request: ChatRequest, body: dict) -> tuple[dict, str, int]:
    """(message, finish_reason, completion_tokens) of one policy call, checked and capped."""
    try:
        msg = AssistantMessage.model_validate(policy(json.loads(json.dumps(body))))
    except ValidationError as exc:
        raise PolicyError(f"policy {name!r} returned an invalid assistant message: {exc}") from None
    except Exception as exc:  # a policy bug is the server's 500, never a dead thread
        raise PolicyError(f"policy {name!r} raised {type(exc).__name__}: {exc}") from None
    offered = [t.function.name for t in request.tools or []]
    calls: list[dict[str, Any]] = []
    for i, call in enumerate(msg.tool_calls or []):
        if call.function.name not in offered or request.tool_choice == "none":
            raise PolicyError(f"policy {name!r} called tool {call.function.name!r}, which the request does "
                              f"not offer (tools: {offered}, tool_choice: {request.tool_choice!r})")
        args = call.function.arguments
        calls.append({"id": call.id or f"call_{i}", "type": "function", "function": {
            "name": call.function.name,
            "arguments": args if isinstance(args, str) else json.dumps(args, sort_keys=True)}})
    message: dict = {"role": "assistant", "content": msg.content}
    cap = request.max_completion_tokens or request.max_tokens
    finish = "tool_calls" if calls else "stop"
    if cap is not None and msg.content is not None and count_tokens(msg.content) > cap:
        message["content"], finish = _cut_tokens(msg.content, cap), "length"
    left = None if cap is None else cap - count_tokens(message["content"] or "")
    for made in calls:
        n = count_tokens(made["function"]["arguments"])
        if left is not None and n > left:
            made["function"]["arguments"], finish = _cut_tokens(made["function"]["arguments"],
                                                                max(left, 0)), "length"
        left = None if left is None else left - n
    if calls:
        message["tool_calls"] = calls
    return message, finish, count_tokens(_message_text(message))


def _usage(request: ChatRequest, completion_tokens: int) -> dict:
    prompt = sum(count_tokens(_message_text(m)) for m in request.messages)
    prompt += count_tokens(json.dumps([t.model_dump() for t in request.tools])) if request.tools else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens}


def stream_chunks(base: dict, message: dict, finish: str, usage: dict | None) -> list[dict]:
    """The SSE chunks of one answer: role, content pieces, tool-call pieces, finish, usage."""
    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        return {**base, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in re.findall(r"\s*\S+\s*|\s+", message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls", [])):
        fn, args = call["function"], call["function"]["arguments"]
        out.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                          "function": {"name": fn["name"], "arguments": ""}}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + 16]}}]})
                for j in range(0, len(args), 16)]
    out.append(chunk({}, finish))
    if usage is not None:
        out.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S  # an idle keep-alive connection is closed after this
    server: _Server
    record: RecordedRequest

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, opened=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, opened=False)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the request log is `LocalServer.requests`

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        raw = self.rfile.read(length) if length > 0 else b""
        self.record = self.server.record(method, self.path, dict(self.headers.items()), raw)
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            if length < 0 or "chunked" in self.headers.get("Transfer-Encoding", ""):
                self._json(400, _error("send the body with a valid Content-Length", "invalid_request_error"))
            elif not self.record.authorized:
                self._json(401, _error("Incorrect API key provided.", "invalid_request_error",
                                       code="invalid_api_key"))
            elif method == "GET" and path == "/v1/models":
                self._json(200, {"object": "list",
                                 "data": [self._model(m) for m in sorted(self.server.models)]})
            elif method == "GET" and path.startswith("/v1/models/") and path[11:] in self.server.models:
                self._json(200, self._model(path[11:]))
            elif method == "GET" and path.startswith("/v1/models/"):
                self._json(404, self._no_model(path[11:]))
            elif method == "POST" and path == "/v1/chat/completions":
                self._chat(raw)
            else:
                self._json(404, _error(f"Unknown request URL: {method} {path}", "invalid_request_error",
                                       code="unknown_url"))
        except OSError:  # the client went away mid-answer
            self.close_connection = True
        except Exception as exc:  # a server bug: answered as a 500 (best effort), not a thread traceback
            self.close_connection = True
            if self.record.status is None:
                self._json(500, _error(f"internal error: {type(exc).__name__}: {exc}", "server_error"))

    @staticmethod
    def _model(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "localserver"}

    @staticmethod
    def _no_model(name: str) -> dict:
        return _error(f"The model `{name}` does not exist or you do not have access to it.",
                      "invalid_request_error", code="model_not_found")

    def _chat(self, raw: bytes) -> None:
        faults, i = self.server.next_chat()
        if faults.delay_s and (faults.delay_first_n is None or i < faults.delay_first_n):
            self.record.fault = "delay"
            if self.server.stopping.wait(faults.delay_s):
                return self._abort("drop")
        if i < faults.drop_first_n:
            return self._abort("drop")
        if i < faults.rate_limit_first_n:
            return self._json(429, _error("Rate limit reached for requests.", "requests",
                                          code="rate_limit_exceeded"),
                              fault="rate_limit", headers={"Retry-After": str(faults.retry_after_s)})
        if i < faults.server_error_first_n:
            return self._json(faults.server_error_status, _error(
                "The server had an error while processing your request.", "server_error"),
                              fault="server_error")
        try:
            request = ChatRequest.model_validate(json.loads(raw))
        except ValueError as exc:  # ValidationError is a ValueError too
            return self._json(400, self._bad_request(exc))
        policy = self.server.models.get(request.model)
        if policy is None:
            return self._json(404, self._no_model(request.model))
        try:
            message, finish, completion_tokens = run_policy(request.model, policy, request, self.record.body)
        except PolicyError as exc:
            return self._json(500, _error(str(exc), "server_error"))
        if i < faults.garbage_first_n:
            return self._send(200, GARBAGE, "application/json", fault="garbage")
        fault = "truncate" if i < faults.truncate_first_n else None
        if fault is None and i < faults.malformed_tool_args_first_n and message.get("tool_calls"):
            fault = "malformed_tool_args"
            for call in message["tool_calls"]:
                args = call["function"]["arguments"]
                call["function"]["arguments"] = args[:len(args) // 2]
        base = {"id": f"chatcmpl-{self.record.index}", "created": int(time.time()), "model": request.model,
                "system_fingerprint": "localserver"}
        usage = _usage(request, completion_tokens)
        if request.stream:
            want_usage = bool((request.stream_options or {}).get("include_usage"))
            return self._stream(stream_chunks(base, message, finish, usage if want_usage else None), fault)
        self._json(200, {**base, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}]}, fault=fault)

    @staticmethod
    def _bad_request(exc: ValueError) -> dict:
        if isinstance(exc, ValidationError):
            err = exc.errors()[0]
            param = ".".join(str(p) for p in err["loc"]) or None
            return _error(f"{param}: {err['msg']}", "invalid_request_error", param=param)
        return _error(f"the request body is not a JSON object: {exc}", "invalid_request_error")

    def _json(self, status: int, body: dict, fault: str | None = None, headers: dict | None = None) -> None:
        data = json.dumps(body, sort_keys=True).encode()
        self._send(status, data, "application/json", fault=fault, headers=headers)

    def _send(self, status: int, data: bytes, ctype: str, fault: str | None = None,
              headers: dict | None = None) -> None:
        self.record.status, self.record.fault = status, fault or self.record.fault
        self.send_response(status)
        for name, value in {"Content-Type": ctype, "Content-Length": str(len(data)),
                            **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if fault == "truncate":
            self.wfile.write(data[:len(data) // 2])
            return self._abort("truncate", status)
        self.wfile.write(data)

    def _stream(self, chunks: list[dict], fault: str | None) -> None:
        self.record.status, self.record.fault = 200, fault or self.record.fault
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [b"data: " + json.dumps(c, sort_keys=True).encode() + b"\n\n" for c in chunks]
        events.append(b"data: [DONE]\n\n")
        if fault == "truncate":  # a few whole events, then the connection ends mid-body
            events = events[:max(1, len(events) // 2)]
        for event in events:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        if fault == "truncate":
            return self._abort("truncate", 200)
        self.wfile.write(b"0\r\n\r\n")

    def _abort(self, fault: str, status: int | None = None) -> None:
        """End the connection here: no answer (a drop) or no rest of the answer (a truncation)."""
        self.record.status, self.record.fault = status, fault
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], models: Mapping[str, Policy], faults: Faults,
                 api_key: str | None) -> None:
        super().__init__(addr, _Handler)
        self.models, self.faults, self.api_key = dict(models), faults, api_key
        self.lock = threading.Lock()
        self.records: list[RecordedRequest] = []
        self.chat_count = 0
        self.stopping = threading.Event()
        self.connections: dict[int, socket.socket] = {}

    def track(self, conn: socket.socket, opened: bool) -> None:
        with self.lock:
            if opened:
                self.connections[id(conn)] = conn
            else:
                self.connections.pop(id(conn), None)

    def record(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> RecordedRequest:
        headers = {k.lower(): v for k, v in headers.items()}
        given = headers.get("authorization", "")
        authorized = self.api_key is None or hmac.compare_digest(given.encode(),
                                                                 f"Bearer {self.api_key}".encode())
        if "authorization" in headers:
            headers["authorization"] = "<redacted>"
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self.lock:
            rec = RecordedRequest(index=len(self.records), method=method, path=path, headers=headers,
                                  body=body, authorized=authorized)
            self.records.append(rec)
        return rec

    def next_chat(self) -> tuple[Faults, int]:
        """The faults in force and this chat request's place among those seen under them."""
        with self.lock:
            self.chat_count += 1
            return self.faults, self.chat_count - 1


class LocalServer:
    """A running server on loopback: `base_url`, `requests`, `set_faults`, `close`."""

    def __init__(self, models: Mapping[str, Policy], faults: Faults | None = None, api_key: str | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        if not models:
            raise ValueError("models: serve at least one model (a name → policy mapping)")
        for name, policy in models.items():
            if not name or not callable(policy):
                raise ValueError(f"models: {name!r} needs a non-empty name and a callable policy")
        self._srv = _Server((host, port), models, faults or Faults(), api_key)
        self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="localserver", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = cast(tuple[str, int], self._srv.server_address[:2])  # AF_INET: (host, port)
        return f"http://{host}:{port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, in arrival order."""
        with self._srv.lock:
            return [r.model_copy(deep=True) for r in self._srv.records]

    def set_faults(self, faults: Faults) -> None:
        """Replace the faults; their first-N counts start again from the next request."""
        with self._srv.lock:
            self._srv.faults, self._srv.chat_count = faults, 0

    def close(self) -> None:
        """Stop serving and end every open connection (delayed answers included). Idempotent."""
        if self._srv.stopping.is_set():
            return
        self._srv.stopping.set()
        self._srv.shutdown()
        with self._srv.lock:
            open_conns = list(self._srv.connections.values())
        for conn in open_conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._srv.server_close()
        self._thread.join()


@contextmanager
def serve(models: Mapping[str, Policy], faults: Faults | None = None, api_key: str | None = None,
          host: str = "127.0.0.1", port: int = 0) -> Iterator[LocalServer]:
    """Run a `LocalServer` for the duration of a ``with`` block."""
    server = LocalServer(models, faults=faults, api_key=api_key, host=host, port=port)
    try:
        yield server
    finally:
        server.close()


def load_policy(spec: str) -> Policy:
    """The callable named by ``module:function``; a clear ValueError otherwise."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"policy {spec!r}: write it as module:function, e.g. mypkg.policies:echo")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"policy {spec!r} cannot be loaded: {exc}") from None
    if not callable(obj):
        raise ValueError(f"policy {spec!r} is not callable")
    return obj


def _parse_models(specs: list[str]) -> dict[str, Policy]:
    models: dict[str, Policy] = {}
    for spec in specs:
        name, sep, target = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--model {spec!r}: write it as NAME=module:function")
        if name in models:
            raise ValueError(f"--model {spec!r}: the name {name!r} is given twice")
        models[name] = load_policy(target)
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validate.devtools.localserver",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="NAME=module:function",
                        help="serve a policy under a model name (repeatable)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument("--faults", default=None, metavar="JSON", help="faults to inject, as Faults JSON")
    args = parser.parse_args(argv)
    try:
        models = _parse_models(args.model)
        faults = Faults.model_validate_json(args.faults) if args.faults else Faults()
        server = LocalServer(models, faults=faults, api_key=args.api_key, host=args.host, port=args.port)
    except (ValueError, OSError) as exc:  # ValidationError included: it names the field
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(server.base_url, flush=True)
    while not stop.wait(0.5):
        pass
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
