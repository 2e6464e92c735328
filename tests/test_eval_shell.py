"""The model agent on task directories (`validate.kinds.task_shell`, the ``task-shell`` kind) through
real docker and a real local server on loopback: the scripted Harbor baseline solves sample
tasks and a do-nothing policy fails them, by the task's own verifier through the harness's
reward channel; the trajectory holds every tool call and its capped output, and the
verifier's output; the API key is never inside the container (environment and files), the
network is off there, and a reward the model plants is never read. The eval audit passes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from environment.harbor import baseline
from tests.conftest import make_ctx, make_manifest
from validate import api
from validate.contract.manifest import load_manifest
from validate.core.paths import FROZEN_MANIFEST
from validate.devtools.localserver import serve
from validate.eval import contract as ec
from validate.eval.client import ChatClient
from validate.eval.contract import request_seed
from validate.eval.run import EvalPhase, evaluate

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "harbor-sample"
TASKS = ("csv-to-json", "declared-public-network", "edit-config")
KEY = "sk-test-0f1e2d3c4b5a69788796a5b4c3d2e1f0"
KEY_ENV = "SHELL_TEST_KEY"
NOTHING, PROBE = "do-nothing", "probe"
#: What the probe runs in the container, one command per turn.
PROBES = (
    "env; tr '\\0' '\\n' < /proc/self/environ; tr '\\0' '\\n' < /proc/1/environ 2>/dev/null; id",
    f"grep -rls --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e {KEY[:20]} / 2>/dev/null | head -n "
    "5; echo grep-done",
    "python3 -c \"import socket\ntry:\n"
    "    socket.create_connection(('192.0.2.1', 80), timeout=3); print('NET-UP')\n"
    "except OSError as e:\n    print('NET-DOWN', e)\"; cat /proc/net/dev",
    "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > "
    "/logs/verifier/reward.json; echo planted",
    "seq 1 100000",
)


def _turn(request: dict) -> int:
    return sum(1 for m in request["messages"] if m.get("role") == "assistant")


def nothing(request: dict) -> dict:
    """Looks once and says it is done: a wrong policy."""
    if _turn(request) == 0:
        return baseline.call("ls -la", 0)
    return {"content": "All done."}


def probe(request: dict) -> dict:
    turn = _turn(request)
    return baseline.call(PROBES[turn], turn) if turn < len(PROBES) else {"content": "Probed."}


@pytest.fixture(scope="module")
def server():
    with serve({baseline.MODEL_NAME: baseline.policy, NOTHING: nothing, PROBE: probe}, api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def harbor(sandboxes):
    from validate.core import environments

    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE), family_key="category"))
    idx = [i for i in range(ts.size) if ts.task(i).id in TASKS]
    sandbox = sandboxes("docker")
    manifest = make_manifest(sandbox, idx=idx, env_name="harbor", dataset=str(SAMPLE), family_key="category",
                             min_task_count=1)
    return sandbox, manifest, ts


def evaluate_with(harbor, server, tmp_path, model: str, **limits):
    sandbox, manifest, _ = harbor
    parent = ec.DatasetParent(manifest_name=manifest.name, manifest_sha256=manifest.sha256,
                              manifest_path="m.json", pool_run_id="pool", pool_run_dir="pool",
                              pool_manifest_sha256="sha256:p", pool_checksums_sha256="sha256:c",
                              dataset_verdict="PASS", environment="harbor", task_count=len(manifest.tasks))
    contract = ec.build(
        name="shell",
        parent=parent,
        manifest=manifest,
        reward_code="sha256:x",
        agent=ec.SHELL_AGENT,
        model=ec.ModelSpec(
            id=model, revision="test", server="localserver", base_url=server.base_url, api_key_env=KEY_ENV
        ),
        limits=ec.AgentLimits(**{"attempt_timeout_s": 60, "tool_timeout_s": 15, **limits}),
        k=1,
    )
    run_dir = tmp_path / "run"
    client = ChatClient(server.base_url, KEY, 30, 1, 0.1)
    try:
        summary = evaluate(make_ctx(manifest, sandbox, run_dir, concurrency=3), contract, client,
                           EvalPhase(passes=("greedy",)))
    finally:
        client.close()
    samples = {r["task_id"]: r for r in pq.read_table(run_dir / "samples.parquet").to_pylist()}
    turns = pq.read_table(run_dir / "trajectories.parquet").to_pylist()
    attempts = {r["task_id"]: r for r in pq.read_table(run_dir / "attempts.parquet").to_pylist()}
    return contract, summary, run_dir, samples, turns, attempts


def test_the_scripted_policy_solves_and_its_trajectory_holds_every_call(harbor, server, tmp_path):
    contract, s, run_dir, samples, turns, attempts = evaluate_with(harbor, server, tmp_path,
                                                                   baseline.MODEL_NAME)
    assert contract.agent.name == ec.SHELL_AGENT_NAME and contract.tools == [ec.SHELL_TOOL]
    _, _, ts = harbor
    for task_id, sample in samples.items():
        prompt = next(ts.task(i).prompt for i in range(ts.size) if ts.task(i).id == task_id)
        job = baseline.understand(prompt)
        mode = baseline.behaviour({"seed": request_seed(0, task_id, 0), "temperature": 0.0}, prompt,
                                  job.difficulty)
        assert sample["solved"] == (mode in ("solve", "malformed_then_solve")), (task_id, mode, sample)
        a = attempts[task_id]
        assert a["status"] == "ok" and a["reward"] == (1.0 if sample["solved"] else 0.0)
        assert sample["verifier"].startswith("[verifier exit 0]") and "reward.txt" in sample["verifier"]
        record = json.loads((run_dir / "replies" / a["reply_sha256"].removeprefix("sha256:")).read_bytes())
        assert set(record["files"]) & {"reward.txt", "reward.json"}
    solved = [r for r in samples.values() if r["solved"]]
    assert solved, "the easy tasks at temperature 0 are solved"
    for task_id, sample in samples.items():
        mine = sorted((t for t in turns if t["task_id"] == task_id), key=lambda t: t["turn"])
        assert len(mine) == sample["turns"] and sample["termination"] == "answer"
        calls = [c for t in mine for c in t["tool_calls"]]
        assert len(calls) == sample["tool_calls"] >= 1
        assert all(c["output_sha256"].startswith("sha256:") and c["output_bytes"] >= len(c["output"])
                   for c in calls)
        assert mine[0]["user"].strip() and "/app/" in mine[0]["user"]  # the instruction is the task
    assert s.greedy.valid == len(TASKS) and s.greedy.lost == {}
    assert api.eval_audit(run_dir).problems == []


def test_a_policy_that_does_nothing_fails_by_the_tasks_verifier(harbor, server, tmp_path):
    _, s, _, samples, _, attempts = evaluate_with(harbor, server, tmp_path, NOTHING)
    assert all(not r["solved"] for r in samples.values())
    assert {(r["failure_class"], r["failure_rule"])
            for r in samples.values()} == {("capability", "verifier-rejected")}
    assert all(a["status"] == "ok" and a["reward"] == 0.0 for a in attempts.values())
    assert s.greedy.pass_at_1.value == 0.0 and s.greedy.valid == len(TASKS)


def test_no_key_inside_no_network_a_planted_reward_is_never_read(harbor, server, tmp_path):
    _, _, run_dir, samples, turns, attempts = evaluate_with(harbor, server, tmp_path, PROBE,
                                                            max_tool_output_bytes=1024,
                                                            stored_tool_output_bytes=512)
    for task_id, sample in samples.items():
        calls = [c for t in sorted((t for t in turns if t["task_id"] == task_id), key=lambda t: t["turn"])
                 for c in t["tool_calls"]]
        assert [json.loads(c["arguments"])["command"] for c in calls] == list(PROBES)
        env, grep, net, planted, big = (c["output"] for c in calls)
        # the phase's pinned environment, nothing else of ours
        assert "LANG=C.UTF-8" in env and "TZ=UTC" in env
        assert KEY not in env and KEY[:20] not in env and KEY_ENV not in env
        assert grep.strip().endswith("grep-done") and "/" not in grep.replace("grep-done", "").strip()
        assert "NET-DOWN" in net and "NET-UP" not in net and "eth0" not in net
        assert "planted" in planted
        assert calls[-1]["output_cut"] and calls[-1]["output_bytes"] > 1024 and len(big.encode()) <= 512
        # the stored copy is cut further
        assert "[output cut: only the first 1024 bytes are shown]" not in big
        # The verifier ran in a fresh container with a fresh /logs/verifier: the planted files
        # were never read; the task's own verifier gave 0 (the work was not done).
        assert attempts[task_id]["reward"] == 0.0 and not sample["solved"]
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_freezing_on_a_task_directory_pool_freezes_the_shell_agent(tmp_path):
    """`validate eval freeze` on the committed harbor-sample pool: the contract names the
    task-shell agent (its sources' sha256), its tool and its system prompt; the chat agent's
    are for every other environment."""
    pool = next((Path(__file__).resolve().parents[1] / "ledgers").glob("harbor-sample-pool-*"))
    c = api.eval_freeze("shell", pool_run=pool, model=baseline.MODEL_NAME, model_revision="test",
                        base_url="http://127.0.0.1:9/v1", server="localserver", allow_patch=True,
                        out=tmp_path / "shell.json")
    frozen = load_manifest(pool / FROZEN_MANIFEST)  # the pool's frozen set: what an eval plays
    assert c.parent.environment == "harbor" and c.parent.task_count == len(frozen.tasks) >= 11
    assert (c.agent.name, c.agent.source_sha256) == (ec.SHELL_AGENT_NAME, ec.shell_source_sha256())
    assert c.tools == [ec.SHELL_TOOL] and c.prompts.system_template == ec.SHELL_SYSTEM
    # the pairing is the kinds' own declaration, never a branch on the kind's name
    from validate.kinds.chat import ChatKind, model_kind_class
    assert model_kind_class("trial").agent is ec.SHELL_AGENT and model_kind_class("program") is ChatKind
    assert ChatKind.agent.system == ec.DEFAULT_SYSTEM != ec.SHELL_SYSTEM


def test_the_datasets_reward_key_rule_reads_the_model_trial_as_validation_reads_it(sandboxes, server,
                                                                                   tmp_path):
    """A dataset whose contract says every reward.json key must reach the threshold (``all``):
    the model's trial record is read under that rule, as the validation trial's is, so the
    eval audit, whose scorer reads it under the contract's rule, agrees with the rows."""
    from validate.core import environments

    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE), reward_key="all"))
    idx = [i for i in range(ts.size) if ts.task(i).id == "multi-key-reward"]
    sandbox = sandboxes("docker")
    manifest = make_manifest(sandbox, idx=idx, env_name="harbor", dataset=str(SAMPLE), reward_key="all",
                             min_task_count=1)
    _, _, run_dir, samples, _, attempts = evaluate_with((sandbox, manifest, ts), server, tmp_path, NOTHING)
    a = attempts["multi-key-reward"]
    record = json.loads((run_dir / "replies" / a["reply_sha256"].removeprefix("sha256:")).read_bytes())
    assert record["key"] == "all"
    assert set(json.loads(base64.b64decode(record["files"]["reward.json"]))) == {"reward", "to_roman",
                                                                                 "from_roman"}
    assert a["status"] == "ok" and a["reward"] == 0.0 and not samples["multi-key-reward"]["solved"]
    assert api.eval_audit(run_dir).problems == []
