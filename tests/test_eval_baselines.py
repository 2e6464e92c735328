"""The scripted baselines (`environment/twohop/baseline.py`, `environment/curator/baseline.py`)
are policies: deterministic given a request, different between samples, worse as the
temperature rises, and blind to the answer — they open no file but (curator) the published
theme specs, their well-formed tool calls read only the task's own file, and the curator
memory holds no intruder. The committed evaluations made with them meet what issue 22 asks of
them (0 < pass@1 < pass@8 < 1, zero-variance groups on both sides, the failure rules seen).

Conversations are played on the host with the real environments' tasks and scorers; a tool
call is answered with the task's file only when it is exactly the read the policy announces
(no command is run: ``kill 1`` must never meet the host).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from environment.curator import baseline as curator_baseline
from environment.twohop import baseline as twohop_baseline

ROOT = Path(__file__).resolve().parents[1]
LEDGERS = ROOT / "ledgers"
SPECS = (ROOT / "environment" / "curator" / "specs").resolve()


def seed_of(task_id: str, sample: int) -> int:
    return int.from_bytes(hashlib.sha256(f"0\n{task_id}\n{sample}".encode()).digest()[:8], "big") >> 1


@pytest.fixture(scope="module")
def twohop_tasks():
    from environment.twohop.env import TwohopConfig, TwohopEnvironment
    ts = TwohopEnvironment().load(TwohopConfig())
    return ts, [ts.task(i) for i in range(ts.size)]


@pytest.fixture(scope="module")
def curator_tasks():
    from environment.curator.taskset import CuratorConfig, CuratorTaskset
    from environment.curator.themes import SPECS_DIR, load_specs
    ts = CuratorTaskset(CuratorConfig(), load_specs(SPECS_DIR))
    return ts, [ts.task(i) for i in range(ts.size)]


class Opens:
    """Every file the interpreter opens while it is armed (an audit hook: hooks cannot be removed)."""

    paths: list[str] = []
    armed = False

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if cls.armed and event == "open" and isinstance(args[0], (str, bytes, Path)):
            cls.paths.append(str(args[0]))


sys.addaudithook(Opens.hook)


def play(policy, read_command: str, file_text: str, prompt: str, temperature: float,
         seed: int) -> tuple[str, list]:
    """(how it ended, the well-formed commands) of one conversation of at most 8 turns."""
    messages = [{"role": "system", "content": "system"}, {"role": "user", "content": prompt}]
    commands = []
    for _ in range(8):
        out = policy({"messages": messages, "temperature": temperature, "seed": seed,
                      "tools": [{"type": "function", "function": {"name": "bash"}}]})
        calls = out.get("tool_calls")
        if not calls:
            return out.get("content") or "", commands
        assert [c["function"]["name"] for c in calls] == ["bash"]
        try:
            command = json.loads(calls[0]["function"]["arguments"])["command"]
        except (ValueError, KeyError, TypeError):
            command = None
        if command is not None:
            commands.append(command)
        text = (
            file_text if command == read_command else "error: malformed tool call" if command is None else ""
        )
        messages += [{"role": "assistant", "content": None, "tool_calls": calls},
                     {"role": "tool", "tool_call_id": calls[0]["id"], "content": text}]
    return "<max_turns>", commands


def test_twohop_baseline_is_deterministic_seeded_and_opens_nothing(twohop_tasks):
    ts, tasks = twohop_tasks
    facts = tasks[0].files["api_description.txt"].decode()
    Opens.paths, Opens.armed = [], True
    try:
        runs = {(t.id, s): play(twohop_baseline.policy, twohop_baseline.READ, facts, t.prompt, 1.0,
                                seed_of(t.id, s))
                for t in tasks for s in range(8)}
        again = {(t.id, 3): play(twohop_baseline.policy, twohop_baseline.READ, facts, t.prompt, 1.0,
                                 seed_of(t.id, 3))
                 for t in tasks}
    finally:
        Opens.armed = False
    assert Opens.paths == []  # no answer key, no dataset source: only what the conversation holds
    assert all(runs[key] == value for key, value in again.items())
    for _, commands in runs.values():  # each command touches the task's own file only
        assert all("api_description.txt" in c or c == "kill 1" for c in commands), commands
        assert not any("answer" in c or "/" in c.split()[-1] for c in commands), commands
    per_task = Counter(task_id for (task_id, _), (reply, _) in runs.items()
                       if ts.score(next(t for t in tasks if t.id == task_id), reply.encode()).reward == 1.0)
    assert len({per_task[t.id] for t in tasks}) > 2  # samples differ: not one answer per task


def solve_rate(ts, tasks, policy, read, file_name, temperature) -> float:
    solved = 0
    for t in tasks:
        text = t.files[file_name].decode()
        for s in range(4):
            reply, _ = play(policy, read, text, t.prompt, temperature, seed_of(t.id, s))
            solved += ts.score(t, reply.encode()).reward >= 1.0
    return solved / (4 * len(tasks))


def test_twohop_baseline_is_right_less_often_as_the_temperature_rises(twohop_tasks):
    ts, tasks = twohop_tasks
    rates = [solve_rate(ts, tasks, twohop_baseline.policy, twohop_baseline.READ, "api_description.txt", t)
             for t in (0.0, 2.0)]
    assert 0.2 < rates[1] < rates[0] - 0.2 and rates[0] < 1.0, rates


def test_curator_baseline_knows_no_intruder_and_opens_only_the_specs(curator_tasks):
    _, tasks = curator_tasks
    curator_baseline.memory.cache_clear()
    Opens.paths, Opens.armed = [], True
    try:
        memory = curator_baseline.memory()
        t = tasks[0]
        first = play(curator_baseline.policy, curator_baseline.READ, t.files["collection.json"].decode(),
                     t.prompt, 0.7, 11)
    finally:
        Opens.armed = False
    assert Opens.paths and all(Path(p).resolve().parent == SPECS for p in Opens.paths), Opens.paths
    for task in tasks:
        titles = {it["id"]: it["title"] for it in json.loads(task.files["collection.json"])}
        intruders = {titles[i] for i in task.gold}
        assert all(not (m["members"] & intruders) for m in memory), task.id
        assert all(set(m) == {"principle", "decoy", "tier", "members"} for m in memory)
    again = play(curator_baseline.policy, curator_baseline.READ, t.files["collection.json"].decode(),
                 t.prompt, 0.7, 11)
    assert first == again and all(c.endswith("collection.json") or c == "kill 1" for c in first[1])


def committed(prefix: str) -> list[Path]:
    return sorted(p for p in LEDGERS.glob(f"{prefix}-eval-*") if (p / "eval.json").is_file())


@pytest.mark.parametrize("prefix", ["eval-twohop-t1.0", "eval-twohop-t0.7", "eval-curator-t1.0"])
def test_the_committed_baseline_evaluations_say_something(prefix):
    runs = committed(prefix)
    assert runs, f"no committed run of {prefix}"
    summary = json.loads((runs[-1] / "eval.json").read_text())
    p1, pk = summary["greedy"]["pass_at_1"]["value"], summary["sampled"]["pass_at_k"]["value"]
    assert 0 < p1 < pk < 1, (p1, pk)
    assert summary["sampled"]["zero_variance_solved"] > 0 and summary["sampled"]["zero_variance_failed"] > 0
    rules = set(pd.read_parquet(runs[-1] / "samples.parquet")["failure_rule"].dropna())
    assert {"wrong-answer", "no-answer", "out-of-turns", "sandbox-ended", "no-rule"} <= rules, rules


def test_the_committed_comparison_of_two_twohop_baselines_has_task_and_family_deltas():
    entries = sorted((LEDGERS / "compare").glob("eval-twohop-t0.7-*--eval-twohop-t1.0-*/*/compare.json"))
    assert entries
    c = json.loads(entries[-1].read_text())
    assert c["varied"] == [["sampling.temperature", "0.7", "1.0"]]
    assert len(c["tasks"]) == 36 and {t["family"] for t in c["tasks"]} == {f[0] for f in c["families"]}
    moved = [t for t in c["tasks"] if t["sampled_a"] != t["sampled_b"]]
    assert moved and all(t["greedy_a"] == t["greedy_b"] for t in c["tasks"])  # temperature 0 is deterministic


@pytest.mark.parametrize(("contract", "source"), [("eval-twohop-t1.0", "environment/twohop/baseline.py"),
                                                  ("eval-twohop-t0.7", "environment/twohop/baseline.py"),
                                                  ("eval-curator-t1.0", "environment/curator/baseline.py")])
def test_each_contracts_model_revision_is_the_sha256_of_the_baseline_as_committed(contract, source):
    # The revision is free text to the harness: this is what ties it to the code that ran.
    raw = json.loads((ROOT / "manifests" / f"{contract}.json").read_text())
    assert raw["model"]["revision"] == "sha256:" + hashlib.sha256((ROOT / source).read_bytes()).hexdigest()
    for run in committed(contract):
        assert json.loads((run / "eval-contract.json").read_text())["sha256"] == raw["sha256"]
