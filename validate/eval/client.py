"""An OpenAI-compatible chat-completions client (vLLM, llama.cpp's server, OpenAI), on the host.

One call, `ChatClient.complete`, posts a request to ``{base_url}/chat/completions``, plain
or streamed (server-sent events, assembled the way the OpenAI SDKs do), and returns the
assistant message with its finish reason, token usage and latency.

Endpoint faults are typed, never guessed from the model's text:

- `EndpointUnavailable` (retried with tenacity, exponential backoff, a 429's ``Retry-After``
  honoured up to ``max_wait_s``): connection refused or reset, a timeout, 429, 408, 5xx, an
  answer cut short (a body shorter than its Content-Length, a stream without ``[DONE]``),
  a body that is not the API's JSON or not its shape (``content: 123``, a chunk whose
  ``choices`` is not a list of objects: ``bad_response``), an answer from another model than
  the one asked for (``wrong_model``: the ``model`` field must be the request's, which is the
  contract's model id; a load balancer may route to another backend, hence retried). After
  the retries it is the attempt's infrastructure error.
- `EndpointRejected` (not retried): any other 4xx. ``context_length`` says the server
  refused the conversation as longer than the model's context (the model's own limit);
  otherwise the request the harness built was refused (the harness's fault, or the
  endpoint's configuration: ``auth`` for 401/403/404).
- `DeadlineCut` (not retried): the attempt's deadline passed while a streamed answer was
  still arriving. The deadline bounds the whole request, not each read: a read timeout
  alone lets a stream that drips a chunk every few seconds run for ever, so the socket is
  shut at the deadline (`validate.eval.deadline`) and the deadline is checked between
  chunks. A cut answer is never
  an answer: it is the attempt's timeout (`validate.eval.agent`), what had arrived kept as
  evidence only. A deadline passing before any text or tool call arrived, or while a plain (not
  streamed) body arrived, shows no progress of the model: that stays an
  `EndpointUnavailable` ``timeout`` (so are headers dripping past the deadline).

The API key is sent only in the ``Authorization`` header of requests to the endpoint; it
never reaches a sandbox or the evidence.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import requests
import urllib3
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from environment.protocol import safe_json
from validate.core.errors import ServiceError
from validate.eval.deadline import Adapter, Watchdog

_CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "context window",
                    "too many tokens", "prompt is too long")


class EndpointError(ServiceError):
    """A model request failed; `kind` names how."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.status = kind, status


class EndpointUnavailable(EndpointError):
    """A transient fault of the endpoint (retried; infrastructure when the retries run out)."""

    def __init__(self, kind: str, message: str, status: int | None = None, retry_after_s: float | None = None,
                 tries: int = 1, wait_s: float = 0.0) -> None:
        super().__init__(kind, message, status)
        self.retry_after_s, self.tries, self.wait_s = retry_after_s, tries, wait_s


class EndpointRejected(EndpointError):
    """The endpoint refused the request (4xx other than 408 and 429); not retried."""

    @property
    def context_length(self) -> bool:
        return self.status == 400 and any(m in str(self).lower() for m in _CONTEXT_MARKERS)

    @property
    def auth(self) -> bool:
        return self.status in (401, 403, 404)


class DeadlineCut(EndpointError):
    """The attempt's deadline cut a streamed answer; `completion` holds what had arrived."""

    def __init__(self, message: str, completion: Completion) -> None:
        super().__init__("deadline", message)
        self.completion = completion


@dataclass
class Completion:
    message: dict = field(metadata={"doc": "role, content (str or None), tool_calls (as sent)"})
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float = 0.0
    tries: int = 1
    wait_s: float = 0.0
    faults: list[str] = field(default_factory=list)


def _retry_after(resp: requests.Response) -> float | None:
    try:
        return max(0.0, float(resp.headers.get("Retry-After", "")))
    except ValueError:
        return None


def _error_text(resp: requests.Response) -> str:
    try:
        body = safe_json(resp.json())
        return str(body.get("error", {}).get("message") or body)[:500]
    except ValueError:
        return resp.text[:500]


def _check_status(resp: requests.Response) -> None:
    code = resp.status_code
    if code == 200:
        return
    text = _error_text(resp)
    if code == 429:
        raise EndpointUnavailable("rate_limited", f"429 {text}", code, _retry_after(resp))
    if code == 408 or code >= 500:
        raise EndpointUnavailable("server_error", f"{code} {text}", code, _retry_after(resp))
    raise EndpointRejected("rejected", f"{code} {text}", code)


def _bad(what: str, value: object) -> EndpointUnavailable:
    return EndpointUnavailable("bad_response", f"{what}: {str(value)[:200]}")


def _check_model(body: dict, model: str | None) -> None:
    """The answer names the model asked for; an answer from another model is refused."""
    if model is not None and body.get("model") != model:
        raise EndpointUnavailable("wrong_model", f"the endpoint answered as model {body.get('model')!r}, "
                                  f"not the contract's model {model!r}")


def _text(value: object, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _bad(f"{what} is not a string or null", value)


def _message_of(body: object, model: str | None = None) -> tuple[dict, str | None, dict]:
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"] \
            or not isinstance(body["choices"][0], dict) or not isinstance(body["choices"][0].get("message"),
                                                                          dict):
        raise _bad("not a chat completion", body)
    _check_model(body, model)
    choice = body["choices"][0]
    msg = choice["message"]
    content = _text(msg.get("content"), "message.content")
    message = {"role": "assistant", "content": content or None}
    calls = msg.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise _bad("message.tool_calls is not a list of objects", calls)
    if calls:
        message["tool_calls"] = calls
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return message, choice.get("finish_reason"), usage


class _Stream:
    """A server-sent-event stream assembled as it arrives, so a cut one still shows what came."""

    def __init__(self, model: str | None) -> None:
        self.model, self.content, self.calls = model, [], {}
        #: Chunks that carried text or a tool call: the model's answer had begun.
        self.finish, self.usage, self.done, self.pieces = None, {}, False, 0

    def feed(self, raw: bytes) -> None:
        if self.done or not raw.startswith(b"data:"):
            return  # after [DONE]: read to the end of the body, so the connection goes back to the pool
        data = raw[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            chunk = safe_json(json.loads(data))
        except ValueError:
            raise EndpointUnavailable("bad_response", f"a stream chunk is not JSON: {data[:200]!r}") from None
        if not isinstance(chunk, dict) or "error" in chunk:
            raise EndpointUnavailable("server_error", f"the stream reports an error: {str(chunk)[:200]}")
        _check_model(chunk, self.model)
        self.usage = chunk.get("usage") or self.usage
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise _bad("a stream chunk's choices is not a list of objects", choices)
        for choice in choices:
            self._delta(choice.get("delta") or {})
            self.finish = choice.get("finish_reason") or self.finish

    def _delta(self, delta: object) -> None:
        if not isinstance(delta, dict):
            raise _bad("a stream delta is not an object", delta)
        text = _text(delta.get("content"), "delta.content")
        if text:
            self.content.append(text)
        calls = delta.get("tool_calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise _bad("delta.tool_calls is not a list of objects", calls)
        self.pieces += bool(text or calls)
        for tc in calls:
            fn = tc.get("function") or {}
            index = tc.get("index", 0)
            if not isinstance(fn, dict) or not isinstance(index, int) or isinstance(index, bool):
                raise _bad("a streamed tool call is malformed", tc)
            slot = self.calls.setdefault(index, {"id": None, "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
            slot["id"] = tc.get("id") or slot["id"]
            slot["function"]["name"] += _text(fn.get("name"), "function.name") or ""
            slot["function"]["arguments"] += _text(fn.get("arguments"), "function.arguments") or ""

    def result(self) -> tuple[dict, str | None, dict]:
        message = {"role": "assistant", "content": "".join(self.content) or None}
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return message, self.finish, self.usage if isinstance(self.usage, dict) else {}


def _lines(resp: requests.Response):
    """The lines of a streamed body as they arrive. `requests`' `iter_lines` reads 512 bytes at a
    time, and on a body delimited by the connection closing it waits for all 512: the deadline
    checks between chunks would see a dripping stream only in bursts. urllib3's `read1` returns
    what one read got; its errors are mapped as `requests` maps them."""
    read1 = getattr(resp.raw, "read1", None)
    if read1 is None:
        yield from resp.iter_lines()
        return
    pending = b""
    while True:
        try:
            data = read1(65536)
        except urllib3.exceptions.ProtocolError as e:
            raise requests.exceptions.ChunkedEncodingError(e) from None
        except urllib3.exceptions.ReadTimeoutError as e:
            raise requests.exceptions.ConnectionError(e) from None
        except urllib3.exceptions.DecodeError as e:
            raise requests.exceptions.ContentDecodingError(e) from None
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        yield from (line.rstrip(b"\r") for line in lines)
    if pending:
        yield pending


def _read(resp: requests.Response, stream: _Stream | None, model: str | None,
          deadline: float | None) -> tuple[dict, str | None, dict]:
    """The answer of a response whose status is 200: a plain body, or a stream fed chunk by chunk
    with the deadline checked before each (a line that arrives after it is not taken)."""
    if stream is None:
        content = resp.content
        if deadline is not None and time.monotonic() >= deadline:
            raise EndpointUnavailable("timeout", "the deadline passed")  # made the cut by the caller
        try:
            parsed = safe_json(json.loads(content))  # a "\ud800" escape is the model's text, stored escaped
        except ValueError:
            raise EndpointUnavailable("bad_response", f"the body is not JSON: {content[:200]!r}") from None
        return _message_of(parsed, model)
    if "text/event-stream" not in resp.headers.get("Content-Type", ""):
        raise EndpointUnavailable("bad_response", f"a stream was asked for; got "
                                  f"{resp.headers.get('Content-Type')!r}: {resp.content[:200]!r}")
    for raw in _lines(resp):
        if deadline is not None and time.monotonic() >= deadline:
            raise EndpointUnavailable("timeout", "the deadline passed")  # made the cut by the caller
        stream.feed(raw)
    if not stream.done:
        raise EndpointUnavailable("truncated", "the stream ended before [DONE]")
    return stream.result()


def _fault(e: Exception, timeout_s: float) -> EndpointUnavailable:
    """The endpoint fault an exception of a request is."""
    if isinstance(e, EndpointUnavailable):
        return e
    if isinstance(e, requests.exceptions.Timeout):
        return EndpointUnavailable("timeout", f"no answer within {timeout_s:.1f} s ({type(e).__name__})")
    if isinstance(e, requests.exceptions.ChunkedEncodingError):
        return EndpointUnavailable("truncated", f"the answer was cut: {e}")
    return EndpointUnavailable("connection", f"{type(e).__name__}: {str(e)[:300]}")


def _completion(message: dict, finish: object, usage: dict, latency_s: float) -> Completion:
    def tokens(name: str) -> int | None:
        value = usage.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return Completion(message=message, finish_reason=finish if isinstance(finish, str) else None,
                      prompt_tokens=tokens("prompt_tokens"), completion_tokens=tokens("completion_tokens"),
                      latency_s=latency_s)


def _cut(stream: _Stream | None, t0: float) -> EndpointError:
    """What the deadline passing mid-request is: the attempt's timeout once the model's answer had
    begun to arrive (`DeadlineCut`), else no progress of the model was seen (an endpoint fault)."""
    spent = time.monotonic() - t0
    if stream is None or not stream.pieces:
        what = "any of the answer" if stream else "the whole answer"
        return EndpointUnavailable("timeout", f"the attempt's deadline passed {spent:.1f} s into the "
                                   f"request, before {what} arrived")
    message, _, usage = stream.result()
    return DeadlineCut(f"the attempt's deadline cut the streamed answer {spent:.1f} s into the request, "
                       f"after {stream.pieces} chunks of it", _completion(message, None, usage, spent))


class ChatClient:
    """Requests to one endpoint; thread-safe (one `requests.Session` per client, pooled)."""

    def __init__(self, base_url: str, api_key: str | None = None, request_timeout_s: float = 120.0,
                 retries: int = 4, max_wait_s: float = 30.0, backoff_s: float = 0.5) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.timeout_s, self.retries = request_timeout_s, retries
        self.max_wait_s, self.backoff_s = max_wait_s, backoff_s
        self.http = requests.Session()
        adapter = Adapter(pool_connections=4, pool_maxsize=64, max_retries=0)
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self.http.close()

    def _once(self, body: dict, timeout_s: float, deadline: float | None = None) -> Completion:
        t0 = time.monotonic()
        model = body.get("model")
        stream = _Stream(model) if body.get("stream") else None
        try:
            with Watchdog(deadline) as dog:
                resp = self.http.post(self.url, data=json.dumps(body), headers=self.headers, stream=True,
                                      timeout=(min(10.0, timeout_s), timeout_s))
                try:
                    _check_status(resp)
                    message, finish, usage = _read(resp, stream, model, deadline)
                finally:
                    dog.disarm()  # before the connection can go back to the pool
                    resp.close()
        except (EndpointUnavailable, requests.exceptions.RequestException, OSError) as e:
            if dog.fired or (deadline is not None and time.monotonic() >= deadline):
                raise _cut(stream, t0) from None
            raise _fault(e, timeout_s) from None
        return _completion(message, finish, usage, time.monotonic() - t0)

    def _wait(self, state) -> float:
        exc = state.outcome.exception()
        backoff = self.backoff_s * 2 ** (state.attempt_number - 1)
        after = getattr(exc, "retry_after_s", None) or 0.0
        return min(max(backoff, after), self.max_wait_s)

    def complete(self, body: dict, deadline: float | None = None) -> Completion:
        """One assistant message; `EndpointUnavailable` after the retries, `EndpointRejected` at once.
        `deadline` (a `time.monotonic` instant) bounds every try, every wait and every read;
        `DeadlineCut` when it cut a streamed answer that had begun."""
        faults: list[str] = []
        started = time.monotonic()

        def left() -> float:
            return self.timeout_s if deadline is None else min(self.timeout_s, deadline - time.monotonic())

        def stop(state) -> bool:
            return stop_after_attempt(1 + self.retries)(state) or left() - self._wait(state) <= 0.05

        retrying = Retrying(retry=retry_if_exception_type(EndpointUnavailable), stop=stop, wait=self._wait,
                            reraise=True, before_sleep=lambda s: faults.append(s.outcome.exception().kind))
        try:
            for attempt in retrying:
                with attempt:
                    if left() <= 0:
                        raise EndpointUnavailable("timeout", "the attempt's time ran out before the request")
                    done = self._once(body, left(), deadline)
        except EndpointUnavailable as e:
            e.tries, e.wait_s = len(faults) + 1, time.monotonic() - started
            raise
        except DeadlineCut as e:
            cut = e.completion
            cut.tries, cut.faults = len(faults) + 1, faults
            cut.wait_s = time.monotonic() - started - cut.latency_s
            raise
        done.tries, done.faults = len(faults) + 1, faults
        done.wait_s = time.monotonic() - started - done.latency_s
        return done
