"""Source-peek control: the environment's whole source (mounted at $AGENT_DIR/source) plus
the agent view's id and meta, and nothing else — not the facts, not the prompt.

It rebuilds the published (seed 0) dataset from the source, exactly as the environment
does, then keeps the rows its view is consistent with: rows whose ``task_id`` occurs in
the id, and rows agreeing with every meta key that is also a row field (``category``, for
instance). If the surviving rows share one ``expected_output`` it replies that; otherwise
it cannot tell the task apart and leaves no reply. With an opaque id and a meta that is the
same for every task nothing narrows, so it must score like the empty control; handed the
real task id, or a meta carrying the category, it answers (the tests show both).

What it cannot be stopped from doing, said plainly: the published dataset is fixed and its
generator is in the source, so a program that also reads the *prompt* can rebuild the
dataset and look the question up. The design does not prevent that for seed 0; looking the
prompt up is no shortcut past the task either, since the same program could read
``api_description.txt`` and run the reference solver over it. What the design does prevent
is identifying the task from anything but its question: the id is opaque, meta is the same
for every task, and th-NNN numbers are shuffled across categories. A non-default ``seed``
builds a universe that no memorised or rebuilt seed-0 copy answers (a small seed can be
found by search; held-out runs should pick a large random one).
"""
import importlib
import os
import sys
import types

from agentlib import AGENT_DIR, reply, task

SOURCE = os.path.join(AGENT_DIR, "source")


def published_rows():
    """The seed-0 dataset's rows, built by the mounted source under python3 -S."""
    for name, path in (("environment", []), ("environment.twohop", [SOURCE])):
        module = types.ModuleType(name)
        module.__path__ = path
        sys.modules[name] = module
    dataset = importlib.import_module("environment.twohop.dataset")
    return dataset.build_dataset(dataset.DEFAULT_SEED).rows()


view = task()
rows = published_rows()
candidates = [r for r in rows if r["task_id"] in view["id"]] or rows
for key, value in sorted(view["meta"].items()):
    if key in candidates[0]:
        candidates = [r for r in candidates if r[key] == value] or candidates
answers = sorted({r["expected_output"] for r in candidates})
if len(answers) == 1:
    reply(answers[0])
