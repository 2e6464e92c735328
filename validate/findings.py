"""What can be seen wrong with a task before any agent runs (pure, no I/O).

A *blocking* finding makes the task invalid whatever the agents do (the verdict's reason is
``invalid_task_or_verifier``); a non-blocking one is a note added to the verdict's detail.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    blocking: bool
    detail: str


def task_findings(task) -> list[Finding]:
    out: list[Finding] = []
    gold = [list(t) for t in task.gold]
    blob = b"".join(task.files.values())
    compact = json.dumps(gold, separators=(",", ":")).encode()
    spaced = json.dumps(gold).encode()
    if task.answer_key in blob or compact in blob or spaced in blob:
        out.append(Finding(kind="gold_in_workspace", blocking=True,
                           detail="the workspace files contain the gold answer"))
    short = [pid for pid, t in zip(task.paper_ids, gold) if len(t) < 2]
    if short:
        out.append(Finding(kind="single_unit_paper", blocking=True,
                           detail=f"paper(s) {', '.join(short)} have a single unit: no comparable pair, "
                                  f"so norm_kendall_tau is 0 and even the oracle cannot pass"))
    texts = [json.loads(line)["text"] for line in task.files["paragraphs.jsonl"].decode().splitlines()]
    first: dict[str, int] = {}
    dupes: list[tuple[int, int]] = []
    for label, text in enumerate(texts, 1):
        if text in first:
            dupes.append((first[text], label))
        else:
            first[text] = label
    if dupes:
        pairs = ", ".join(f"{a}={b}" for a, b in dupes[:5])
        out.append(Finding(kind="duplicate_units", blocking=False,
                           detail=f"{len(dupes)} unit(s) repeat an earlier unit's text (labels {pairs}"
                                  f"{', ...' if len(dupes) > 5 else ''}): their relative order cannot be "
                                  f"recovered from the text"))
    displayed = [label for t in gold for label in t]
    if len(gold) == 1 and displayed == sorted(displayed):
        out.append(Finding(kind="displayed_order_correct", blocking=False,
                           detail="the displayed order is already the true order, so `identity` passes"))
    return out
