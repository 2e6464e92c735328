"""The deshuffle shuffled control's reply computed on the host, drawn exactly as its agent
program (environment/deshuffle/agents/shuffled.py) draws it in the sandbox: the labels of
paragraphs.jsonl in displayed order, shuffled and cut by ``random.Random(opaque id)``.
For the tests and benchmarks that compare a solver with the control on many tasks without
a sandbox per task."""

from __future__ import annotations

import json
import random

from environment.deshuffle import PARAGRAPHS_FILE


def shuffled_reply(task, opaque_id: str) -> str:
    text = task.files[PARAGRAPHS_FILE].decode()  # split on "\n" only, as agentlib does (U+2028 is text)
    order = [json.loads(line)["label"] for line in text.split("\n") if line]
    rng = random.Random(opaque_id)
    rng.shuffle(order)
    k = task.meta.get("n_papers", 1)
    cuts = sorted(rng.sample(range(1, len(order)), k - 1)) if k > 1 else []
    groups = [order[a:b] for a, b in zip([0] + cuts, cuts + [len(order)], strict=True)]
    return f"\\boxed{{{json.dumps(groups[0] if k == 1 else groups)}}}"
