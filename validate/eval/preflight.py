"""The endpoint's preflight: one look at the model endpoint before `validate eval run` writes anything.

Without it a wrong API key, model id or base URL is found once per attempt: each attempt is
written as an infrastructure error after its retries and backoff, hundreds of lost samples
for one typo. `preflight` asks first and refuses the command with `EndpointMisconfigured` (a
`ValidateError`: exit 2, one line naming the contract's field, the cause and the fix); the
caller calls it before the run directory is made, so nothing is written.

What is asked, least costly first:

1. ``GET {base_url}/models`` — every OpenAI-compatible server answers it (OpenAI, vLLM,
   SGLang, llama.cpp's server, the project's local server). It costs no tokens and is not a
   chat completion, so a completion's rate limit or fault injection never sees it. A list
   naming the model ends the preflight.
2. Only when the list does not name the model, or the server has no listing (404, 405, a
   body that is not a list): one minimal chat completion (``max_tokens`` 1) with the
   contract's model id. Some servers serve models they do not list (aliases, routers); the
   completion decides.

Refused (`EndpointMisconfigured`): connection refused or a name that does not resolve, a TLS
failure, 401 or 403 (the key), 404 (the model id when the error names it, else the base
URL), a 200 whose body is not JSON (a web page, not the API), an answer from another model
than the contract's. A transient fault (429, 408, 5xx, a timeout, a reset connection) is
tried again ``tries`` times in all, then refused as unavailable: a run against an endpoint
that never answers would only fill the ledger with lost samples. A 4xx the preflight cannot
explain (a 400 about a parameter of its own minimal request) lets the run go on: the
attempts' own requests then show what the endpoint says.

The key is sent only in the ``Authorization`` header and never appears in a message; the
endpoint's own words are quoted on one line, capped, as untrusted text.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

import requests
import urllib3

from validate.core.errors import ServiceError

#: Seconds to wait for a connection; the answer gets the contract's request timeout (at most READ_S).
CONNECT_S = 10.0
READ_S = 60.0
#: Characters of the endpoint's own words quoted in a message.
QUOTED = 200
#: Bytes of an answer read (a hosted API's model list is a few hundred kilobytes).
MAX_BODY = 8 * 1024 * 1024


class EndpointMisconfigured(ServiceError):
    """The endpoint cannot serve this contract as configured; nothing was run."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str

    def json(self) -> object | None:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def error(self) -> dict | str | None:
        """The body's ``error``: OpenAI's object, or the plain string some servers send."""
        parsed = self.json()
        err = parsed.get("error") if isinstance(parsed, dict) else None
        return err if isinstance(err, dict | str) else None

    def names_model(self, model: str) -> bool:
        """The error is about the model asked for: OpenAI's ``model_not_found`` code or ``model``
        param, or words that say "model" and name it as a token of its own (vLLM's "The model
        `x` does not exist", Ollama's 'model "x" not found'), not inside a path or a longer name."""
        err = self.error()
        if isinstance(err, dict) and (err.get("code") == "model_not_found" or err.get("param") == "model"):
            return True
        said = self.said()
        return re.search(r"\bmodel\b", said, re.IGNORECASE) is not None and \
            re.search(rf"(?<![\w./:-]){re.escape(model)}(?![\w./:-])", said) is not None

    def said(self) -> str:
        """The endpoint's own words on one line, capped: an OpenAI error's message, else the body."""
        err = self.error()
        text = err.get("message") if isinstance(err, dict) else err
        if not isinstance(text, str):
            text = self.body.decode("utf-8", "replace")
        return quoted(text)


def quoted(text: str) -> str:
    """Untrusted text for a one-line message: whitespace runs made one space, every other control
    character shown as ``\\xNN`` (no terminal escape reaches the screen), capped at QUOTED."""
    flat = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                   for c in " ".join(text.split()))
    return flat[:QUOTED] + ("…" if len(flat) > QUOTED else "")


class _Transient(ServiceError):
    """A fault that may pass (tried again); `what` says which."""

    def __init__(self, what: str, retry_after_s: float | None = None) -> None:
        super().__init__(what)
        self.what, self.retry_after_s = what, retry_after_s


@dataclass
class Probe:
    """The endpoint of one contract, as the preflight asks it."""

    base_url: str
    model: str
    api_key: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 30.0
    tries: int = 3
    backoff_s: float = 1.0
    max_wait_s: float = 10.0

    def __post_init__(self) -> None:
        self.base = self.base_url.rstrip("/")
        self.http = requests.Session()  # as `ChatClient`'s: the same proxies and certificates as the attempts
        self.headers = {"Content-Type": "application/json"}
        if self.api_key:
            self.headers["Authorization"] = f"Bearer {self.api_key}"

    # --- one request, its faults sorted ---------------------------------------------------

    def _once(self, method: str, path: str, body: dict | None) -> Answer:
        url = self.base + path
        try:
            with self.http.request(method, url, data=None if body is None else json.dumps(body),
                                   headers=self.headers, timeout=(CONNECT_S, min(self.timeout_s, READ_S)),
                                   stream=True) as resp:
                data = b""
                # a model list is kilobytes; a runaway body is cut, not read
                for chunk in resp.iter_content(65536):
                    data += chunk
                    if len(data) > MAX_BODY:
                        break
        except requests.exceptions.SSLError as e:
            raise self._refuse("model.base_url",
                               f"the TLS handshake with {self.base_url} failed ({_first_line(e)})",
                               "check the scheme (http or https) and the certificate") from None
        except requests.exceptions.Timeout:
            raise _Transient(f"no answer to {method} {url} within "
                             f"{min(self.timeout_s, READ_S):.0f} s") from None
        except requests.exceptions.ConnectionError as e:
            if _cannot_connect(e):
                raise self._refuse("model.base_url",
                                   f"nothing answers at {self.base_url} ({_connect_cause(e)})",
                                   "start the server, or freeze the contract with the "
                                   "--base-url it listens on") \
                    from None
            raise _Transient(f"{method} {url}: the connection failed ({_first_line(e)})") from None
        except requests.exceptions.RequestException as e:
            raise self._refuse("model.base_url", f"{method} {url} cannot be sent ({_first_line(e)})",
                               "freeze the contract with a valid --base-url") from None
        answer = Answer(resp.status_code, data[:MAX_BODY], resp.headers.get("Content-Type", ""))
        if answer.status == 429 or answer.status == 408 or answer.status >= 500:
            raise _Transient(f"{method} {url} answered {answer.status} {answer.said()}", _retry_after(resp))
        return answer

    def _ask(self, method: str, path: str, body: dict | None = None) -> Answer:
        """`_once`, tried again after a transient fault; refused as unavailable when they run out."""
        for n in range(1, self.tries + 1):
            try:
                return self._once(method, path, body)
            except _Transient as e:
                if n == self.tries:
                    raise self._refuse("model.base_url",
                                       f"the endpoint is unavailable: {e.what} (after {n} tries)",
                                       "start or fix the server, or try again when it answers") from None
                time.sleep(min(max(self.backoff_s * 2 ** (n - 1), e.retry_after_s or 0.0), self.max_wait_s))
        raise AssertionError("unreachable")  # the loop returns or raises

    # --- what an answer means -------------------------------------------------------------

    def _refuse(self, field: str, cause: str, fix: str) -> EndpointMisconfigured:
        return EndpointMisconfigured(f"{field}: {cause}; {fix} (the endpoint was checked before the run: "
                                     "nothing was run or written)")

    def _auth(self, a: Answer, what: str) -> EndpointMisconfigured:
        if self.api_key is None:
            return self._refuse("model.api_key_env", f"{what} answered {a.status} ({a.said()}) and the "
                                "contract sends no API key",
                                "freeze it with --api-key-env VAR and export the key in VAR")
        return self._refuse("model.api_key_env", f"{what} answered {a.status} ({a.said()}): the endpoint "
                            f"refused the API key in ${self.api_key_env}",
                            f"export the endpoint's own key in {self.api_key_env}")

    def _not_json(self, a: Answer, what: str) -> EndpointMisconfigured:
        kind = a.content_type or "no Content-Type"
        return self._refuse("model.base_url", f"{what} answered {a.status} with a body that is not JSON "
                            f"({kind}: {a.said()}): {self.base_url} is not an OpenAI-compatible API",
                            "freeze the contract with the API's base URL (it usually ends in /v1)")

    def _wrong_model(self, detail: str) -> EndpointMisconfigured:
        return self._refuse("model.id", f"the endpoint does not serve model {self.model!r} ({detail})",
                            "freeze the contract with a model id the endpoint serves")

    def listed(self) -> list[str] | None:
        """The model ids ``GET /models`` lists; None when the server has no listing of that shape."""
        what = f"GET {self.base}/models"
        a = self._ask("GET", "/models")
        if a.status in (401, 403):
            raise self._auth(a, what)
        if a.status != 200:
            return None  # 404, 405, …: no listing here; the chat completion decides
        body = a.json()
        if body is None:
            raise self._not_json(a, what)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return None
        return sorted(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)

    def chat(self, listed: list[str] | None) -> None:
        """One minimal chat completion with the contract's model id; refused unless it is answered
        as that model."""
        what = f"POST {self.base}/chat/completions"
        a = self._ask("POST", "/chat/completions", {
            "model": self.model, "messages": [{"role": "user", "content": "Reply with one word."}],
            "max_tokens": 1})
        if a.status in (401, 403):
            raise self._auth(a, what)
        said = a.said()
        listing = "" if listed is None else f"; it lists {quoted(', '.join(listed[:10])) or 'no model'}" + \
            (" …" if len(listed) > 10 else "")
        if a.status in (400, 404, 422) and a.names_model(self.model):
            raise self._wrong_model(f"{what} answered {a.status}: {said}{listing}")
        if a.status == 404:
            raise self._refuse("model.base_url", f"{what} answered 404 ({said}): no chat-completions API at "
                               f"{self.base_url}", "freeze the contract with the API's base URL (it usually "
                               "ends in /v1)")
        if a.status != 200:
            return  # a 4xx about the minimal request itself: the attempts' own requests will show it
        body = a.json()
        if body is None:
            raise self._not_json(a, what)
        answered = body.get("model") if isinstance(body, dict) else None
        if answered != self.model:
            raise self._wrong_model(f"{what} was answered as model {quoted(repr(answered))}{listing}")

    def run(self) -> str:
        """Check the endpoint; return what was checked in words, or raise `EndpointMisconfigured`."""
        try:
            listed = self.listed()
            if listed is not None and self.model in listed:
                return f"{self.base}/models lists {self.model}"
            self.chat(listed)
            return f"{self.base}/chat/completions answered as {self.model}"
        finally:
            self.http.close()


def preflight(base_url: str, model: str, api_key: str | None = None, api_key_env: str | None = None,
              timeout_s: float = 30.0, max_wait_s: float = 10.0) -> str:
    """Refuse (`EndpointMisconfigured`, exit 2) an endpoint that cannot serve `model` as configured;
    return what was checked. See the module docstring for what is asked and what is refused."""
    return Probe(base_url, model, api_key, api_key_env, timeout_s=timeout_s, max_wait_s=max_wait_s).run()


def _retry_after(resp: requests.Response) -> float | None:
    try:
        return max(0.0, float(resp.headers.get("Retry-After", "")))
    except ValueError:
        return None


def _first_line(e: BaseException) -> str:
    return quoted(str(e))


def _reason(e: requests.exceptions.ConnectionError) -> BaseException | None:
    """urllib3's reason under `requests`' wrapper (a MaxRetryError's `reason`)."""
    inner = e.args[0] if e.args else None
    return getattr(inner, "reason", inner)


def _cannot_connect(e: requests.exceptions.ConnectionError) -> bool:
    """No connection could be made at all (refused, no route, a name that does not resolve),
    as opposed to one that broke mid-answer (a reset: transient)."""
    return isinstance(_reason(e), urllib3.exceptions.NewConnectionError)  # NameResolutionError is one too


def _connect_cause(e: requests.exceptions.ConnectionError) -> str:
    reason = _reason(e)
    if isinstance(reason, urllib3.exceptions.NameResolutionError):
        return "the host name does not resolve"
    if "refused" in str(reason).lower():
        return "connection refused"
    return _first_line(reason if reason is not None else e)
