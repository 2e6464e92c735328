"""The heuristic baseline for deshuffle-papers, on real corpus tasks and behind the real
local server: above the shuffled control, below the oracle, always a valid partition,
deterministic at temperature 0, sampling above it."""

from __future__ import annotations

import json
import statistics
import subprocess

import pytest
import requests

from environment.deshuffle import PARAGRAPHS_FILE, parse_partition
from environment.deshuffle.baseline import BASH_TOOL, MODEL_NAME, answer, parse_paragraphs, policy, solve
from tests.deshuffle_shuffled import shuffled_reply
from validate.devtools.localserver import serve

N_TASKS = 200


def first_turn(task, **extra) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": task.prompt}], "tools": [BASH_TOOL],
            **extra}


def after_tool(task, tool_output: str, **extra) -> dict:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "bash",
                         "arguments": json.dumps({"command": "cat /workspace/paragraphs.jsonl"})}}
    request = first_turn(task, **extra)
    request["messages"] += [{"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": "call_1", "content": tool_output}]
    return request


@pytest.fixture(scope="module")
def played(taskset3):
    """Baseline (temperature 0) and shuffled-control rewards on 200 tasks of 1–3 papers."""
    rows = []
    for task in taskset3.tasks(0, N_TASKS):
        reply = policy(after_tool(task, task.files[PARAGRAPHS_FILE].decode(), temperature=0))["content"]
        rows.append(
            {
                "k": task.n_papers,
                "reply": reply,
                "n_labels": task.n_labels,
                "baseline": taskset3.score(task, reply).reward,
                "shuffled": taskset3.score(task, shuffled_reply(task, opaque_id=task.id)).reward,
                "oracle": taskset3.score(
                    task, f"\\boxed{{{json.dumps([list(p) for p in task.gold])}}}"
                ).reward,
            }
        )
    return rows


def test_the_host_shuffled_reply_is_the_shuffled_agents_own(taskset3):
    """The comparison above stands for the real control only if the host's draw is its draw."""
    import shutil

    from environment.deshuffle.env import DeshuffleEnvironment
    from tests.agent_play import attempt_base, run_agent

    agent = next(a for a in DeshuffleEnvironment().agents(taskset3.config) if a.name == "shuffled")
    base = attempt_base()
    try:
        for task in taskset3.tasks(0, 6):
            opaque = f"opaque-{task.idx:04d}"
            assert run_agent(agent, task, base,
                             opaque_id=opaque).decode().strip() == shuffled_reply(task, opaque)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_the_baseline_is_clearly_above_the_shuffled_control_and_below_the_oracle(played):
    for label, rows in (("1 paper", [r for r in played if r["k"] == 1]),
                        ("2-3 papers", [r for r in played if r["k"] > 1])):
        base, shuf, orac = (statistics.mean(r[key] for r in rows)
                            for key in ("baseline", "shuffled", "oracle"))
        print(f"\n{label}: {len(rows)} tasks, heuristic baseline {base:.3f}, shuffled control {shuf:.3f}, "
              f"oracle {orac:.3f}")
        assert len(rows) >= 30
        assert orac == 1.0
        assert base > shuf + 0.1, (
            f"{label}: the baseline ({base:.3f}) is not clearly above shuffled ({shuf:.3f})"
        )
        assert base < 0.95, f"{label}: a heuristic baseline near the oracle ({base:.3f}) means a leak"


@pytest.mark.slow
def test_every_reply_is_a_valid_partition(played):
    invalid = [i for i, r in enumerate(played) if parse_partition(r["reply"], r["n_labels"]) is None]
    assert not invalid, f"invalid partitions on tasks {invalid}"
    assert all(r["reply"].startswith("Heuristic baseline") for r in played)


def test_the_first_turn_reads_the_file_with_bash(taskset3):
    message = policy(first_turn(taskset3.task(0), temperature=0))
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "cat /workspace/paragraphs.jsonl"}


def test_temperature_0_is_deterministic_and_above_it_samples_by_seed(taskset3):
    task = next(t for t in taskset3.tasks(0, 50) if t.n_papers > 1)
    output = task.files[PARAGRAPHS_FILE].decode()
    greedy = [policy(after_tool(task, output, temperature=0, seed=s))["content"] for s in (1, 2)]
    assert greedy[0] == greedy[1]
    sampled = {s: policy(after_tool(task, output, temperature=1, seed=s))["content"] for s in (1, 2, 3)}
    assert len(set(sampled.values())) == 3
    assert policy(after_tool(task, output, temperature=1, seed=2))["content"] == sampled[2]
    assert all(parse_partition(r, task.n_labels) is not None for r in sampled.values())


def test_a_truncated_tool_output_is_answered_with_what_it_has(taskset3):
    task = next(t for t in taskset3.tasks(0, 50) if t.n_papers == 1)
    output = task.files[PARAGRAPHS_FILE].decode()
    cut = output[: len(output) // 3]
    seen = parse_paragraphs(cut)
    assert 0 < len(seen) < task.n_labels and seen[-1][1]  # the cut line kept its partial text
    reply = policy(after_tool(task, cut, temperature=0))["content"]
    assert parse_partition(reply, task.n_labels) is not None


HOSTILE_LINES = ('{"label": 0, "text": "x"}\n{"label": 99999, "text": "y"}\n{"label": 1, "text": 5}\n'
                 '{"label": 2, "text": "dup"}\n{"label": 2, "text": "d"}\n{"label": true, "text": "b"}')


@pytest.mark.parametrize("tool_output", ["", "bash: cat: No such file or directory", "\x00\xff{{{",
                                         HOSTILE_LINES])
def test_hostile_or_empty_tool_output_still_gives_a_valid_partition(taskset3, tool_output):
    for task in (taskset3.task(0), next(t for t in taskset3.tasks(0, 50) if t.n_papers == 1)):
        reply = policy(after_tool(task, tool_output, temperature=0))["content"]
        assert parse_partition(reply, task.n_labels) is not None


def test_the_solver_alone_is_a_partition_of_what_it_read():
    paragraphs = [(3, "Cats purr and cats sleep."), (1, "Introduction"), (2, "Dogs bark at cats.")]
    groups = solve(paragraphs, 2)
    assert sorted(x for g in groups for x in g) == [1, 2, 3] and 1 <= len(groups) <= 2
    assert answer([[2, 1, 3]], 1).endswith("\\boxed{[2, 1, 3]}")


def test_a_whole_episode_over_http_with_a_real_bash(taskset3, tmp_path):
    """The agent loop a harness runs: ask, run the tool call in bash, send its output, score."""
    task = next(t for t in taskset3.tasks(0, 50) if t.n_papers > 1)
    (tmp_path / PARAGRAPHS_FILE).write_bytes(task.files[PARAGRAPHS_FILE])
    with serve({MODEL_NAME: policy}) as server:
        url = f"{server.base_url}/chat/completions"
        listed = requests.get(f"{server.base_url}/models", timeout=10).json()["data"]
        assert [m["id"] for m in listed] == ["heuristic-baseline-deshuffle"]
        request = first_turn(task, temperature=0)
        first = requests.post(url, json=request, timeout=60).json()["choices"][0]
        assert first["finish_reason"] == "tool_calls"
        call = first["message"]["tool_calls"][0]
        # The host stands in for the sandbox: /workspace is this test's directory.
        command = json.loads(call["function"]["arguments"])["command"].replace("/workspace", str(tmp_path))
        output = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30).stdout
        request["messages"] += [first["message"], {"role": "tool", "tool_call_id": call["id"],
                                                   "content": output}]
        final = requests.post(url, json=request, timeout=60).json()["choices"][0]
    assert final["finish_reason"] == "stop"
    score = taskset3.score(task, final["message"]["content"])
    assert score.metrics["parsed_ok"] == 1.0 and 0.0 < score.reward < 1.0
    assert [r.status for r in server.requests] == [200, 200, 200]


def test_a_request_without_a_seed_is_answered_the_same_way_twice(taskset3):
    task = next(t for t in taskset3.tasks(0, 20) if t.n_labels > 20)
    request = after_tool(task, task.files[PARAGRAPHS_FILE].decode(), temperature=2.0)  # no seed
    assert "seed" not in request and policy(request)["content"] == policy(request)["content"]
