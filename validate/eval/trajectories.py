"""One attempt's trajectory as report blocks: the system and user messages, then each turn's
assistant message, its tool calls and their results (as stored: capped, with their full
sizes and sha256), then how the attempt ended and what it scored; for a task-directory
sample, last, the task's own verifier's exit code and output (`SampleRow.verifier`)."""

from __future__ import annotations

import pandas as pd

#: Characters of one message shown in a report (the evidence keeps what the contract says).
SHOWN_CHARS = 3000


def _cut(text: str | None) -> str:
    text = text or ""
    if len(text) <= SHOWN_CHARS:
        return text
    return text[:SHOWN_CHARS] + f"\n[… {len(text) - SHOWN_CHARS} more characters]"


def _plain(row: pd.Series) -> dict:
    """A dataframe row with pandas' missing values (NaN, NaT, None) as None."""
    return {k: (None if not isinstance(v, list | tuple | dict) and pd.isna(v) else v) for k, v in row.items()}


def blocks(ev, key: tuple) -> list:
    phase, task_id, agent, sample, attempt = key
    sel = lambda df: df[(df["phase"] == phase) & (df["task_id"] == task_id) & (df["agent"] == agent)  # noqa: E731
                        & (df["sample"] == sample) & (df["attempt"] == attempt)]
    s = _plain(sel(ev.samples).iloc[0])
    a = _plain(sel(ev.attempts).iloc[0])
    turns = ev.turns.get(tuple(key), [])
    reward = "—" if a["reward"] is None else f"{a['reward']:.4f}"
    verdict = "SOLVED" if s["solved"] else f"failed: {s['failure_class']} (rule {s['failure_rule']})"
    out: list[tuple] = [("h3", f"{phase} · {task_id} · sample {sample} · try {attempt} — {verdict}"),
           ("p", [f"status {a['status']}, termination {s['termination']}, reward {reward}; {s['turns']} "
                  f"turns, {s['tool_calls']} tool calls ({s['malformed_tool_calls']} malformed, "
                  f"{s['tool_failures']} failed); {s['wall_s']:.2f} s (model {s['model_s']:.2f} s, tools "
                  f"{s['tool_s']:.2f} s)"
                  + (f"; error: {a['error_class']}: {a['error_message']}" if a["error_class"] else "")])]
    for t in turns:
        if t["turn"] == 0:
            if t["system"]:
                out.append(("message", "system", "prompt", _cut(t["system"])))
            out.append(("message", "user", "prompt", _cut(t["user"])))
        tokens = ("tokens ?" if t["prompt_tokens"] is None
                  else f"{t['prompt_tokens']} + {t['completion_tokens']} tokens")
        head = f"turn {t['turn']}, {t['finish_reason']}, {tokens}, {t['latency_s']:.2f} s" + \
            (f", {t['tries']} tries ({', '.join(t['faults'])})" if t["tries"] > 1 else "")
        calls = t["tool_calls"] or []
        text = (t["content"] or "") + "".join(f"\n→ {c['name']}({c['arguments']})" for c in calls)
        out.append(("message", "assistant", head, _cut(text) or "(empty)"))
        for c in calls:
            if not c["well_formed"]:
                about = f"malformed: {c['error']}"
            else:
                about = (f"exit {c['exit_code']}" + (", timed out" if c["timed_out"] else "")
                         + (", out of memory" if c["oom_killed"] else "") + f", {c['runtime_s']:.2f} s")
            shown = f"{about}; {c['output_bytes']} bytes to the model" + (", output cut" if c["output_cut"]
                                                                          else "")
            more = "" if len(c["output"].encode()) >= c["output_bytes"] else \
                f"\n[… stored head only: {c['output_bytes']} bytes in all, {c['output_sha256']}]"
            out.append(("message", "tool", shown, _cut(c["output"]) + more))
    if s.get("verifier"):  # task directories: what decided the reward, after the model's work
        out.append(("message", "verifier",
                    "the task's own verifier, in a fresh container of what the model left",
                    _cut(s["verifier"])))
    return out
