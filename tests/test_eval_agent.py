"""The model agent (`validate.eval.agent.converse`) with the heuristic baseline behind the real
local server, its bash tool in a real live session: deterministic at temperature 0, sampling
above it, malformed tool calls counted and answered, limits ending the conversation, the
API key never reaching the sandbox."""

from __future__ import annotations

import json
import time
import types

import pytest

from environment.deshuffle.baseline import MODEL_NAME, policy as baseline
from environment.protocol import ScorerSpec
from tests.conftest import SESSION_SANDBOX_BACKENDS as SANDBOX_BACKENDS
from validate.devtools.localserver import Faults, serve
from validate.eval import contract as ec
from validate.eval.agent import check_call, converse, opening
from validate.eval.client import ChatClient, EndpointUnavailable
from validate.sandbox import Mount, RunRequest, open_sandbox
from validate.sandbox.session import open_session

BACKENDS = [*SANDBOX_BACKENDS, pytest.param("subprocess")]
PARENT = ec.DatasetParent(manifest_name="m", manifest_sha256="sha256:m", manifest_path="m.json",
                          pool_run_id="pool", pool_run_dir="ledgers/pool", pool_manifest_sha256="sha256:p",
                          pool_checksums_sha256="sha256:c",
                          dataset_verdict="PASS", environment="deshuffle-papers", task_count=1)
MANIFEST = types.SimpleNamespace(environment=types.SimpleNamespace(scorer=ScorerSpec(), revision="sha256:r"),
                                 expectations=types.SimpleNamespace(pass_threshold=1.0))


def contract(base_url: str, model: str = MODEL_NAME, **limits) -> ec.EvalContract:
    return ec.build(name="t", parent=PARENT, manifest=MANIFEST, reward_code="sha256:x",
                    model=ec.ModelSpec(id=model, revision="test", server="localserver", base_url=base_url),
                    limits=ec.AgentLimits(**limits))


@pytest.fixture
def workspace(taskset3):
    from validate.kinds.chat import lay_out
    from validate.run.workspace import temp_storage

    task = taskset3.task(7)
    with temp_storage() as root:
        (mount,), _ = lay_out(root, task)
        yield task, mount.source


@pytest.fixture
def sandbox(sandboxes):
    return lambda backend: open_sandbox("subprocess",
                                        image="host") if backend == "subprocess" else sandboxes(backend)


def play(sandbox, c, task, ws, temperature=0.0, seed=1, deadline_s=60.0, key=None):
    request = RunRequest(argv=(), mounts=(Mount(source=ws, target="/workspace", read_only=False),),
                         name="agent-test", env={"HOME": "/tmp"})
    with open_session(sandbox, request) as session:
        conv = opening(c, task.prompt, dict(task.meta))
        converse(ChatClient(c.model.base_url, api_key=key), c, session, conv, temperature, seed,
                 time.monotonic() + deadline_s)
    return conv


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_baseline_reads_with_bash_then_answers_deterministically_at_temperature_0(sandbox, backend,
                                                                                      workspace, taskset3):
    task, ws = workspace
    with serve({MODEL_NAME: baseline}) as server:
        c = contract(server.base_url)
        a, b = play(sandbox(backend), c, task, ws), play(sandbox(backend), c, task, ws, seed=99)
        sent = [r.body for r in server.requests]
    assert a.termination == "answer" and len(a.turns) == 2
    call = a.turns[0].calls[0]
    assert call.well_formed and call.exit_code == 0 and not call.output_cut
    assert call.output_bytes == len(task.files["paragraphs.jsonl"])  # the whole file, as the model saw it
    assert a.reply == b.reply and a.reply.startswith("Heuristic baseline")
    assert 0.0 < taskset3.score(task, a.reply.encode()).reward < 1.0
    first = sent[0]
    assert first["temperature"] == 0.0 and first["tools"] == c.tools and first["seed"] == 1
    assert [m["role"] for m in sent[1]["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent[1]["messages"][1]["content"] == task.prompt  # the user template is $prompt


@pytest.mark.parametrize("backend", BACKENDS)
def test_samples_differ_by_seed_above_temperature_0(sandbox, backend, workspace):
    task, ws = workspace
    with serve({MODEL_NAME: baseline}) as server:
        c = contract(server.base_url)
        replies = {play(sandbox(backend), c, task, ws, temperature=1.0, seed=s).reply for s in range(4)}
        again = play(sandbox(backend), c, task, ws, temperature=1.0, seed=0).reply
    assert len(replies) > 1
    assert again in replies  # the same seed samples the same answer


@pytest.mark.parametrize("backend", BACKENDS)
def test_malformed_tool_arguments_are_the_models_failure_and_the_conversation_goes_on(sandbox, backend,
                                                                                      workspace):
    task, ws = workspace
    with serve({MODEL_NAME: baseline}, faults=Faults(malformed_tool_args_first_n=1)) as server:
        conv = play(sandbox(backend), contract(server.base_url), task, ws)
        second = server.requests[1].body
    bad = conv.turns[0].calls[0]
    assert not bad.well_formed and "not valid JSON" in bad.error and bad.exit_code is None
    assert (
        second["messages"][-1]["role"] == "tool"
        and "malformed tool call" in second["messages"][-1]["content"]
    )
    # the baseline answers from the prompt alone once it has a tool result: a valid partition, unread
    assert conv.termination == "answer" and conv.reply


@pytest.mark.parametrize("call,error", [
    ("not a dict", "not a function call"),
    ({"type": "function", "function": {"name": "python", "arguments": "{}"}}, "unknown tool 'python'"),
    ({"type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}},
     "non-empty string"),
    ({"type": "function", "function": {"name": "bash", "arguments": "[1]"}}, "non-empty string"),
    ({"type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls"}}, "not valid JSON"),
    ({"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}, None),
])
def test_check_call_names_what_is_malformed(call, error):
    clean, command, why = check_call(call, 2, 5)
    assert (why is None) == (error is None) and (error is None or error in why)
    assert clean["id"] == "call_5_2" and isinstance(clean["function"]["arguments"], str)
    assert command == ("ls" if error is None else None)


def scripted(commands: list[str]):
    """A policy running `commands` one per turn, then answering."""
    def policy(request: dict) -> dict:
        done = sum(m["role"] == "tool" for m in request["messages"])
        if done < len(commands):
            return {
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "bash", "arguments": {"command": commands[done]}},
                    }
                ]
            }
        return {"content": "\\boxed{[1]}"}
    return policy


@pytest.mark.parametrize("backend", BACKENDS)
def test_tool_limits_timeout_and_cut_output_and_max_turns(sandbox, backend, workspace):
    task, ws = workspace
    cmds = ["sleep 5", "head -c 5000 /workspace/paragraphs.jsonl", "echo oops >&2; exit 3"]
    with serve({"s": scripted(cmds)}) as server:
        c = contract(server.base_url, model="s", tool_timeout_s=0.5, max_tool_output_bytes=1000, max_turns=3)
        conv = play(sandbox(backend), c, task, ws)
    slow, big, fails = (t.calls[0] for t in conv.turns)
    assert slow.timed_out and slow.exit_code is None and "timed out" in slow.output
    assert big.output_cut and big.output.endswith("[output cut: only the first 1000 bytes are shown]")
    assert fails.exit_code == 3 and "[stderr]\noops" in fails.output and "[exit code 3]" in fails.output
    assert conv.termination == "max_turns" and conv.reply is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_attempt_deadline_ends_the_conversation(sandbox, backend, workspace):
    task, ws = workspace
    with serve({"s": scripted(["sleep 3"] * 5)}) as server:
        conv = play(sandbox(backend), contract(server.base_url, model="s", tool_timeout_s=10), task, ws,
                    deadline_s=1.0)
    assert conv.termination == "timeout" and conv.turns[0].calls[0].timed_out


def test_a_request_in_flight_at_the_deadline_is_the_endpoints_fault_with_its_wait(sandbox, workspace):
    task, ws = workspace
    with serve({MODEL_NAME: baseline}, faults=Faults(delay_s=5.0)) as server:
        c = contract(server.base_url)
        request = RunRequest(argv=(), mounts=(Mount(source=ws, target="/workspace", read_only=False),),
                             name="hung", env={"HOME": "/tmp"})
        with open_session(sandbox("subprocess"), request) as session:
            conv = opening(c, task.prompt, dict(task.meta))
            t0 = time.monotonic()
            with pytest.raises(EndpointUnavailable) as info:
                converse(ChatClient(server.base_url, request_timeout_s=1.0, retries=1, max_wait_s=0.1), c,
                         session, conv, 0.0, 1, t0 + 2.0)
    assert info.value.kind == "timeout" and info.value.tries == 2
    assert 1.8 < info.value.wait_s <= time.monotonic() - t0  # the whole wait, up to the deadline
    assert conv.termination is None and conv.turns == []  # not the model's timeout


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_api_key_never_reaches_the_sandbox(sandbox, backend, workspace):
    task, ws = workspace
    with serve({"s": scripted(["env; cat /proc/self/environ | tr '\\0' '\\n'; ls -la /workspace"])},
               api_key="sk-never-in-the-sandbox") as server:
        c = contract(server.base_url, model="s")
        conv = play(sandbox(backend), c, task, ws, key="sk-never-in-the-sandbox")
    out = conv.turns[0].calls[0]
    assert out.exit_code == 0 and "paragraphs.jsonl" in out.output
    assert "sk-never-in-the-sandbox" not in out.output
    assert "sk-never" not in json.dumps(c.model_dump(mode="json"))
