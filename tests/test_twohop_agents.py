"""twohop-env's agents, each run for real as ``python3 -S agent.py`` on every task, in a
workspace laid out the way the harness lays it out (workspace/, agent/ with agentlib.py,
support files and task.json, answer_key/ only for agents that see it, agent/source only
for the source-peek control), with WORKSPACE, AGENT_DIR and ANSWER_KEY_DIR set.

The oracle scores 1.0 on all 36; every control scores 0 on every task except where
`control_may_pass` says its pass is right by construction, and each control the host
predicts replies exactly its prediction; source-peek, with an opaque id,
scores no better than the empty control — and handed a leaky id or meta, it does answer.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from environment.twohop import TwohopConfig, TwohopEnvironment
from environment.twohop.agents_spec import predicted
from environment.twohop.score import parse_reply

ROOT = Path(__file__).resolve().parents[1]
AGENTLIB = ROOT / "validate" / "agents" / "agentlib.py"
ENV = TwohopEnvironment()
TASKSET = ENV.load(TwohopConfig())
TASKS = [TASKSET.task(i) for i in range(TASKSET.size)]
SPECS = {a.name: a for a in ENV.agents(TwohopConfig())}

pytestmark = pytest.mark.slow


def run_agent(root: Path, task, spec, view_id: str | None = None, meta: dict | None = None) -> bytes:
    """Materialise one attempt under ``root`` and run the agent; the reply's bytes (b"" if
    it left none). ``view_id`` defaults to an opaque random id, as the harness makes."""
    ws, ad = root / "workspace", root / "agent"
    ws.mkdir(parents=True)
    ad.mkdir()
    for name, data in task.files.items():
        (ws / name).write_bytes(data)
    shutil.copyfile(spec.program, ad / "agent.py")
    shutil.copyfile(AGENTLIB, ad / "agentlib.py")
    for path in spec.support:
        shutil.copyfile(path, ad / path.name)
    view = {"id": view_id or secrets.token_hex(16), "prompt": task.prompt,
            "meta": dict(task.meta if meta is None else meta)}
    (ad / "task.json").write_text(json.dumps(view, sort_keys=True))
    env = {"PATH": os.environ["PATH"], "WORKSPACE": str(ws), "AGENT_DIR": str(ad),
           "ANSWER_KEY_DIR": str(root / "answer_key"), "PYTHONDONTWRITEBYTECODE": "1"}
    if spec.sees_answer_key:
        (root / "answer_key").mkdir()
        (root / "answer_key" / "answer.json").write_bytes(task.answer_key)
    if spec.sees_source:
        shutil.copytree(ENV.source_dir(), ad / "source", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-S", str(ad / "agent.py")], cwd=ws, env=env, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, f"{spec.name} on {task.id}: {proc.stderr.decode()[-2000:]}"
    reply = ws / "reply.txt"
    return reply.read_bytes() if reply.exists() else b""


def rewards(tmp_path: Path, name: str, view=None) -> list[float]:
    """The agent's reward on every task; ``view(task)`` gives `run_agent` a view override."""
    spec = SPECS[name]

    def one(t):
        reply = run_agent(tmp_path / f"{name}-{t.idx}", t, spec, **(view(t) if view else {}))
        return TASKSET.score(t, reply).reward

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, TASKS))


def test_the_declared_agents_are_programs_that_exist():
    assert list(SPECS) == ["oracle", "empty", "always-unknown", "modal-city", "one-hop", "plausible-entity",
                           "wrong-case", "source-peek"]
    assert [a.role for a in SPECS.values()] == ["oracle"] + ["control"] * 7
    assert not [a for a in SPECS.values() if a.role == "probe"], "binary reward: no partial-credit probe"
    for spec in SPECS.values():
        assert spec.program.is_file() and all(p.is_file() for p in spec.support)
    assert [a.name for a in SPECS.values() if a.sees_answer_key] == ["oracle", "wrong-case"]
    assert [a.name for a in SPECS.values() if a.sees_source] == ["source-peek"]


def test_the_oracle_scores_one_on_every_task(tmp_path):
    assert rewards(tmp_path, "oracle") == [1.0] * 36


@pytest.mark.parametrize("name", ["empty", "always-unknown", "modal-city", "one-hop", "plausible-entity",
                                  "wrong-case", "source-peek"])
def test_each_control_fails_everywhere_it_is_not_right_by_construction(tmp_path, name):
    got = rewards(tmp_path, name)
    expected = [float(ENV.not_applicable(SPECS[name], t) is not None) for t in TASKS]
    assert got == expected
    print(f"\n{name}: mean reward {sum(got) / len(got):.3f} ({int(sum(got))} of 36)")
    if name in ("always-unknown", "plausible-entity"):
        broken = [r for r, t in zip(got, TASKS, strict=True) if t.family == "broken"]
        assert broken == ([1.0] * 5 if name == "always-unknown" else [0.0] * 5)
    if name == "modal-city":
        assert sum(got) > 0 and 2 * sum(got) < 36, "right only where the modal city is the answer"


@pytest.mark.parametrize("name", ["always-unknown", "modal-city", "plausible-entity"])
def test_each_program_replies_what_the_host_predicts_on_every_task(tmp_path, name):
    """The contract freezes a control out of a task by its predicted reply
    (`agents_spec.predicted`); the program itself must give exactly that reply everywhere."""
    spec = SPECS[name]

    def one(t):
        return parse_reply(run_agent(tmp_path / f"{name}-{t.idx}", t, spec))

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(one, TASKS))
    assert got == [predicted(name, t.universe, t.question)[0] for t in TASKS]


def test_source_peek_does_no_better_than_empty(tmp_path):
    assert sum(rewards(tmp_path, "source-peek")) <= sum(rewards(tmp_path / "e", "empty")) == 0.0


def test_source_peek_has_teeth_given_a_leaky_id(tmp_path):
    """Shown the real task id instead of an opaque one, it finds every answer."""
    assert rewards(tmp_path, "source-peek", view=lambda t: {"view_id": t.id}) == [1.0] * 36


def test_source_peek_has_teeth_given_the_category_in_meta(tmp_path):
    """A meta carrying the category gives ``unknown`` away on the broken tasks."""
    got = rewards(tmp_path, "source-peek", view=lambda t: {"meta": {**t.meta, "category": t.family}})
    assert got == [float(t.family == "broken") for t in TASKS]
