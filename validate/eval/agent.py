"""The model agent: a chat model on the host whose one tool, ``bash``, runs inside the sandbox.

`converse` plays one conversation: system and user messages from the contract's templates
(the agent view only: the task's prompt and public meta), then up to ``max_turns`` model
calls. Each tool call is checked first; a well-formed ``bash`` call runs as
``bash -c COMMAND`` in the attempt's live sandbox session (network off, the sandbox's user,
``/workspace`` as working directory, the tool timeout), and its output — cut at
``max_tool_output_bytes`` with a note — goes back as the tool message. The API key stays in
the client on the host; nothing but the command crosses into the sandbox.

A **malformed tool call** (not a function call, a tool other than bash, arguments that are
not a JSON object with a string ``command``) is the model's failure: it is counted, not
run, and answered with an error tool message so the conversation goes on (harnesses in RL
training do the same, and ending it would hide whether the model recovers). A message with
no tool call ends the conversation: its text is the answer.

How it ended (`Termination`): ``answer``; ``max_tokens`` (the answer was cut at
max_tokens; scored as it is); ``empty_answer``; ``max_turns``; ``context_length`` (the
endpoint refused the conversation as longer than the model's context); ``timeout`` (the
attempt's wall clock, run out while the harness holds the turn: between model calls or in the
model's commands; or run out while the model's streamed answer was still arriving,
`DeadlineCut`: the cut answer is kept in its turn as evidence and is never the reply, so it is
never scored as an answer); ``sandbox_ended`` (a command of the model ended its own sandbox before the
deadline, `SandboxEnded`: the call is recorded with that error, and no answer follows).
Endpoint faults after retries (`EndpointUnavailable`), a refused request
(`EndpointRejected`) and a sandbox that failed for a harness-side cause (`SandboxError`) are
raised to the runner, the
exception carrying the time spent on the request that never answered (``wait_s``).

The attempt's clock running out *while a model request is in flight and none of the answer
has arrived* is such an endpoint fault too, never a ``timeout`` of the model: the harness saw
no progress of the model during that wait, and the endpoint is infrastructure. Calling it the
model's timeout scored a hung endpoint as an unsolved sample and dropped the wait from the
evidence. Once a streamed answer has begun, the model is visibly at work, and the deadline
cutting it is the attempt's ``timeout``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Literal

from environment.protocol import safe_text, sha256_tag
from validate.eval.client import ChatClient, Completion, DeadlineCut, EndpointRejected
from validate.eval.contract import EvalContract
from validate.eval.records import ToolCallRow
from validate.sandbox.session import SandboxEnded, Session

Termination = Literal["answer", "max_tokens", "empty_answer", "max_turns", "context_length", "timeout",
                      "sandbox_ended"]


def cap(text: str, max_bytes: int) -> str:
    """The first `max_bytes` UTF-8 bytes of `text` (a character cut in two is dropped)."""
    data = text.encode("utf-8", "replace")
    return text if len(data) <= max_bytes else data[:max_bytes].decode("utf-8", "ignore")


@dataclass
class Turn:
    """One model call and its tool results (becomes a `validate.eval.records.TurnRow`)."""

    completion: Completion
    content: str | None
    calls: list[ToolCallRow] = field(default_factory=list)


@dataclass
class Conversation:
    system: str
    user: str
    termination: Termination | None = None
    reply: str | None = None
    turns: list[Turn] = field(default_factory=list)
    tool_s: float = 0.0


def check_call(call: object, index: int, turn: int) -> tuple[dict, str | None, str | None]:
    """(the call as it goes back into the history, the command, why it is malformed)."""
    call = call if isinstance(call, dict) else {}
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{turn}_{index}"
    name = fn.get("name") if isinstance(fn.get("name"), str) else ""
    args = fn.get("arguments")
    args_text = args if isinstance(args, str) else json.dumps(args)
    clean = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args_text}}
    if not fn or call.get("type", "function") != "function":
        return clean, None, "not a function call"
    if name != "bash":
        return clean, None, f"unknown tool {name[:80]!r}; the only tool is bash"
    try:
        parsed = json.loads(args_text) if isinstance(args, str) else args
    except ValueError as e:
        return clean, None, f"arguments are not valid JSON ({e.msg})"
    if not isinstance(parsed, dict) or not isinstance(parsed.get("command"), str) or not parsed["command"].strip():
        return clean, None, 'arguments must be a JSON object with a non-empty string "command"'
    if safe_text(parsed["command"]) != parsed["command"]:  # a "\ud800" escape: nothing a shell can be given
        return clean, None, "the command is not text (it holds a lone surrogate)"
    return clean, parsed["command"], None


def tool_message(result, limit: int) -> tuple[str, bool]:
    """The tool message of a command's result, and whether its output was cut."""
    out, err = result.stdout, result.stderr
    cut = len(out) > limit or len(err) > limit
    text = out[:limit].decode("utf-8", "replace")
    if len(out) > limit:
        text += f"\n[output cut: only the first {limit} bytes are shown]"
    if err:
        text += "\n[stderr]\n" + err[:limit].decode("utf-8", "replace")
    if result.timed_out:
        text += f"\n[the command timed out after {result.runtime_s:.1f} s and was killed]"
    elif result.oom_killed:
        text += "\n[the command was killed: out of memory]"
    elif result.exit_code:
        text += f"\n[exit code {result.exit_code}]"
    return text, cut


def run_call(session: Session, contract: EvalContract, call: object, index: int, turn: int,
             deadline: float) -> tuple[dict, dict, ToolCallRow]:
    """Check and run one tool call: (history call, tool message, its row)."""
    lim = contract.limits
    clean, command, error = check_call(call, index, turn)
    fn = clean["function"]
    row = dict(call_id=clean["id"], name=cap(fn["name"], 256), arguments=cap(fn["arguments"], lim.stored_message_bytes),
               well_formed=error is None, error=error)
    if error is not None:
        text = f"error: malformed tool call: {error}. Call bash with {{\"command\": \"...\"}}."
    else:
        result = session.exec(["bash", "-c", command], timeout_s=min(lim.tool_timeout_s, deadline - time.monotonic()),
                              max_output_bytes=lim.max_tool_output_bytes + 1)
        text, cut = tool_message(result, lim.max_tool_output_bytes)
        row.update(exit_code=result.exit_code, timed_out=result.timed_out, oom_killed=result.oom_killed,
                   runtime_s=result.runtime_s, output_cut=cut)
    data = text.encode("utf-8", "replace")
    row.update(output=cap(text, lim.stored_tool_output_bytes), output_bytes=len(data), output_sha256=sha256_tag(data))
    return clean, {"role": "tool", "tool_call_id": clean["id"], "content": text}, ToolCallRow(**row)


def ended_call_row(contract: EvalContract, call: object, index: int, turn: int, e: SandboxEnded) -> ToolCallRow:
    """The row of the tool call whose command ended the sandbox (no tool message followed)."""
    clean, _, _ = check_call(call, index, turn)
    fn = clean["function"]
    return ToolCallRow(call_id=clean["id"], name=cap(fn["name"], 256),
                       arguments=cap(fn["arguments"], contract.limits.stored_message_bytes), well_formed=True,
                       error=cap(f"the command ended the sandbox: {e}", 2000), output_sha256=sha256_tag(b""))


def request_body(contract: EvalContract, messages: list[dict], temperature: float, seed: int) -> dict:
    s = contract.sampling
    body = {"model": contract.model.id, "messages": messages, "tools": contract.tools, "tool_choice": "auto",
            "temperature": temperature, "top_p": s.top_p, "max_tokens": s.max_tokens, "seed": seed,
            "stream": s.stream}
    if s.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def opening(contract: EvalContract, prompt: str, meta: dict) -> Conversation:
    """A conversation not yet played: its system and user messages from the templates."""
    system, user = contract.prompts.render(prompt, meta)
    return Conversation(system=system, user=user)


def converse(client: ChatClient, contract: EvalContract, session: Session, conv: Conversation, temperature: float,
             seed: int, deadline: float) -> Conversation:
    """Play `conv` to its end (see the module docstring), filling it in as it goes, so what was
    said before an exception stays in it."""
    system, user = conv.system, conv.user
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    for turn in range(contract.limits.max_turns):
        if time.monotonic() >= deadline:
            conv.termination = "timeout"
            return conv
        try:
            done = client.complete(request_body(contract, messages, temperature, seed), deadline=deadline)
        except EndpointRejected as e:
            if e.context_length:
                conv.termination = "context_length"
                return conv
            raise
        except DeadlineCut as e:  # the answer had begun: kept as evidence, never the reply
            conv.turns.append(Turn(completion=e.completion, content=e.completion.message.get("content")))
            conv.termination = "timeout"
            return conv
        content = done.message.get("content")
        step = Turn(completion=done, content=content)
        conv.turns.append(step)
        calls = done.message.get("tool_calls") or []
        if not calls:
            conv.reply = content if content else None
            conv.termination = ("max_tokens" if done.finish_reason == "length" and content
                                else "answer" if content else "empty_answer")
            return conv
        history = []
        tool_messages = []
        t0 = time.monotonic()
        for i, call in enumerate(calls):
            try:
                clean, message, row = run_call(session, contract, call, i, turn, deadline)
            except SandboxEnded as e:  # the model's own command ended its sandbox: its conversation is over
                step.calls.append(ended_call_row(contract, call, i, turn, e))
                conv.tool_s += time.monotonic() - t0
                conv.termination = "sandbox_ended"
                return conv
            history.append(clean)
            tool_messages.append(message)
            step.calls.append(row)
        conv.tool_s += time.monotonic() - t0
        messages.append({"role": "assistant", "content": content, "tool_calls": history})
        messages += tool_messages
    conv.termination = "max_turns"
    return conv
