"""An OpenAI-compatible chat-completions client (vLLM, llama.cpp's server, OpenAI), on the host.

One call, `ChatClient.complete`, posts a request to ``{base_url}/chat/completions``, plain
or streamed (server-sent events, assembled the way the OpenAI SDKs do), and returns the
assistant message with its finish reason, token usage and latency.

Endpoint faults are typed, never guessed from the model's text:

- `EndpointUnavailable` (retried with tenacity, exponential backoff, a 429's ``Retry-After``
  honoured up to ``max_wait_s``): connection refused or reset, a timeout, 429, 408, 5xx, an
  answer cut short (a body shorter than its Content-Length, a stream without ``[DONE]``),
  a body that is not the API's JSON. After the retries it is the attempt's infrastructure
  error.
- `EndpointRejected` (not retried): any other 4xx. ``context_length`` says the server
  refused the conversation as longer than the model's context (the model's own limit);
  otherwise the request the harness built was refused (the harness's fault, or the
  endpoint's configuration: ``auth`` for 401/403/404).

The API key is sent only in the ``Authorization`` header of requests to the endpoint; it
never reaches a sandbox or the evidence.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import requests
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

_CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "context window", "too many tokens",
                    "prompt is too long")


class EndpointError(Exception):
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
        body = resp.json()
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


def _message_of(body: object) -> tuple[dict, str | None, dict]:
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"] \
            or not isinstance(body["choices"][0], dict) or not isinstance(body["choices"][0].get("message"), dict):
        raise EndpointUnavailable("bad_response", f"not a chat completion: {str(body)[:200]}")
    choice = body["choices"][0]
    msg = choice["message"]
    content = msg.get("content")
    message = {"role": "assistant", "content": content if isinstance(content, str) and content else None}
    if msg.get("tool_calls"):
        message["tool_calls"] = msg["tool_calls"]
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return message, choice.get("finish_reason"), usage


def _assemble(lines) -> tuple[dict, str | None, dict]:
    """The message of a server-sent-event stream; `EndpointUnavailable` when it is cut."""
    content: list[str] = []
    calls: dict[int, dict] = {}
    finish, usage, done = None, {}, False
    for raw in lines:
        if done or not raw.startswith(b"data:"):
            continue  # after [DONE]: read to the end of the body, so the connection goes back to the pool
        data = raw[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            raise EndpointUnavailable("bad_response", f"a stream chunk is not JSON: {data[:200]!r}") from None
        if not isinstance(chunk, dict) or "error" in chunk:
            raise EndpointUnavailable("server_error", f"the stream reports an error: {str(chunk)[:200]}")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(int(tc.get("index", 0)), {"id": None, "type": "function",
                                                                  "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    if not done:
        raise EndpointUnavailable("truncated", "the stream ended before [DONE]")
    message = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish, usage if isinstance(usage, dict) else {}


class ChatClient:
    """Requests to one endpoint; thread-safe (one `requests.Session` per client, pooled)."""

    def __init__(self, base_url: str, api_key: str | None = None, request_timeout_s: float = 120.0,
                 retries: int = 4, max_wait_s: float = 30.0, backoff_s: float = 0.5) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.timeout_s, self.retries = request_timeout_s, retries
        self.max_wait_s, self.backoff_s = max_wait_s, backoff_s
        self.http = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=64, max_retries=0)
        self.http.mount("http://", adapter)
        self.http.mount("https://", adapter)
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self.http.close()

    def _once(self, body: dict, timeout_s: float) -> Completion:
        t0 = time.monotonic()
        try:
            with self.http.post(self.url, data=json.dumps(body), headers=self.headers, stream=True,
                                timeout=(min(10.0, timeout_s), timeout_s)) as resp:
                _check_status(resp)
                if body.get("stream"):
                    if "text/event-stream" not in resp.headers.get("Content-Type", ""):
                        raise EndpointUnavailable("bad_response", f"a stream was asked for; got "
                                                  f"{resp.headers.get('Content-Type')!r}: {resp.content[:200]!r}")
                    message, finish, usage = _assemble(resp.iter_lines())
                else:
                    try:
                        parsed = json.loads(resp.content)
                    except ValueError:
                        raise EndpointUnavailable("bad_response", f"the body is not JSON: {resp.content[:200]!r}") \
                            from None
                    message, finish, usage = _message_of(parsed)
        except requests.exceptions.Timeout as e:
            raise EndpointUnavailable("timeout", f"no answer within {timeout_s:.1f} s ({type(e).__name__})") from None
        except requests.exceptions.ChunkedEncodingError as e:
            raise EndpointUnavailable("truncated", f"the answer was cut: {e}") from None
        except requests.exceptions.ConnectionError as e:
            raise EndpointUnavailable("connection", f"{type(e).__name__}: {str(e)[:300]}") from None
        except requests.exceptions.RequestException as e:
            raise EndpointUnavailable("connection", f"{type(e).__name__}: {str(e)[:300]}") from None

        def tokens(name: str) -> int | None:
            value = usage.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return Completion(message=message, finish_reason=finish if isinstance(finish, str) else None,
                          prompt_tokens=tokens("prompt_tokens"), completion_tokens=tokens("completion_tokens"),
                          latency_s=time.monotonic() - t0)

    def _wait(self, state) -> float:
        exc = state.outcome.exception()
        backoff = self.backoff_s * 2 ** (state.attempt_number - 1)
        after = getattr(exc, "retry_after_s", None) or 0.0
        return min(max(backoff, after), self.max_wait_s)

    def complete(self, body: dict, deadline: float | None = None) -> Completion:
        """One assistant message; `EndpointUnavailable` after the retries, `EndpointRejected` at once.
        `deadline` (a `time.monotonic` instant) bounds every try and every wait."""
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
                    done = self._once(body, left())
        except EndpointUnavailable as e:
            e.tries, e.wait_s = len(faults) + 1, time.monotonic() - started
            raise
        done.tries, done.faults = len(faults) + 1, faults
        done.wait_s = time.monotonic() - started - done.latency_s
        return done
