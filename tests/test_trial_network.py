"""The trial's own network signal and the separate verifier, on real docker (the suite's own
dockerd): tiny task directories written here, built FROM the sandbox image, run through
`validate.taskdir.trial.run_trial` with the harness's resolver (`validate.taskdir.trial.network`).

What is shown: a verifier that looks a host up is logged by the resolver (the harness reads
its log), and the oracle's trial is then ``unsupported_execution_contract`` naming the host;
a solve.sh that looks one up and fails likewise; a control's lookups — its own, or ones it
makes the verifier do by planting a ``.pth`` file — are recorded and change nothing;
an agent that rewrites the shared resolv.conf and hosts cannot hide the verifier's lookups
(the harness rewrites them at the boundary); a passing oracle is never excluded; after every
trial and after an interrupted one nothing is left (containers, the resolver, volumes,
images). A separate verifier (its image from ``tests/Dockerfile``) passes the oracle, fails
nop, sees ``/logs/artifacts`` and nothing else of the agent's filesystem, and is never handed
a link.
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from pathlib import Path

import docker
import pytest

from environment.harbor.taskdir import HarborTask, load_task
from validate.core.paths import DEFAULT_IMAGE
from validate.core.records import ORACLE
from validate.sandbox.docker.wire import LABEL
from validate.taskdir.trial import docker as dk, network, run as trial_run
from validate.taskdir.trial.agents import NOP, AgentPlan
from validate.taskdir.trial.result import TrialLimits
from validate.taskdir.trial.run import run_trial

pytestmark = pytest.mark.docker

RUN_LABEL = f"pytest-trialnet-{os.getpid()}"
IMAGE_LABEL = f"{LABEL}.test-trialnet-image"
LIMITS = TrialLimits(cpus=1, memory_mb=512, max_agent_timeout_s=60, max_verifier_timeout_s=60)
DOCKERFILE = f"FROM {DEFAULT_IMAGE}\nWORKDIR /app\nRUN chmod 777 /app\n"
SOLVE = "#!/bin/bash\necho 60 > /app/sum.txt\n"
#: A verifier that downloads its checker (as many upstream test.sh do), then would check.
TEST_NEEDS_NETWORK = """#!/bin/bash
set -euo pipefail
python3 -c 'import urllib.request; urllib.request.urlopen("https://checker.example.com/sum.py", timeout=5)'
echo 1 > /logs/verifier/reward.txt
"""
#: A verifier that needs nothing but runs python3 (so a planted .pth file runs in it).
TEST_OFFLINE = """#!/bin/bash
if python3 -c 'import sys; sys.exit(open("/app/sum.txt").read().strip() != "60")'; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt
"""  # noqa: E501
#: The separate verifier: reports what it can see, rewards the artifact only.
TEST_SEPARATE = """#!/bin/bash
for p in /app/sum.txt /app/outside.txt /logs/agent/oracle.txt /solution/solve.sh /tmp/planted; do
  if [ -e "$p" ]; then echo "sees $p"; fi
done
ls -la /logs/artifacts
if [ "$(cat /logs/artifacts/sum.txt 2>/dev/null)" = "60" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""  # noqa: E501
SOLVE_SEPARATE = """#!/bin/bash
echo 60 > /logs/artifacts/sum.txt
echo secret > /app/outside.txt
echo planted > /tmp/planted
ln -s /etc/passwd /logs/artifacts/passwd-link
mkdir -p /logs/artifacts/sub && echo deeper > /logs/artifacts/sub/note.txt
"""


def _task(root: Path, name: str, test_sh: str, solve: str = SOLVE, separate: bool = False) -> Path:
    files = {
        "task.toml": textwrap.dedent(f"""\
            schema_version = "1.4"
            [task]
            name = "test/{name}"
            [verifier]
            timeout_sec = 30
            {'environment_mode = "separate"' if separate else ''}
            [agent]
            timeout_sec = 30
            user = "root"
            [environment]
            network_mode = "public"
            """),
        "instruction.md": "Write the sum of the numbers, 60, to `/app/sum.txt`.\n",
        "environment/Dockerfile": DOCKERFILE, "solution/solve.sh": solve, "tests/test.sh": test_sh}
    if separate:
        files["tests/Dockerfile"] = f"FROM {DEFAULT_IMAGE}\nCOPY . /tests/\n"
    for rel, text in files.items():
        (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / name / rel).write_text(text)
    return root / name


@pytest.fixture(scope="module")
def client():
    c = docker.from_env(timeout=120)
    yield c
    dk.sweep(c.api, f"{IMAGE_LABEL}=1")


def _build(client, path: Path) -> str:
    image, _ = client.images.build(path=str(path), labels={IMAGE_LABEL: "1"}, network_mode="none", rm=True,
                                   forcerm=True)
    return image.id


@pytest.fixture(scope="module")
def tasks(tmp_path_factory, client) -> dict[str, tuple[HarborTask, Path, str, str | None]]:
    root = tmp_path_factory.mktemp("trialnet")
    _task(root, "needs-network", TEST_NEEDS_NETWORK)
    _task(root, "offline", TEST_OFFLINE)
    _task(root, "solve-needs-network", TEST_OFFLINE,
          solve="#!/bin/bash\nset -e\ngetent hosts pypi.example.org\necho 60 > /app/sum.txt\n")
    _task(root, "separate", TEST_SEPARATE, solve=SOLVE_SEPARATE, separate=True)
    built = {}
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        task = load_task(root, task_dir.name)
        assert isinstance(task, HarborTask), task
        verifier = _build(client, task_dir / "tests") if task.verifier == "separate" else None
        built[task_dir.name] = (task, task_dir, _build(client, task_dir / "environment"), verifier)
    return built


def _left_behind(client) -> list[str]:
    api, f = client.api, {"label": f"{LABEL}={RUN_LABEL}"}
    return ([f"container {c['Id'][:12]} {c['Names']}" for c in api.containers(all=True, filters=f)]
            + [f"volume {v['Name']}" for v in (api.volumes(filters=f) or {}).get("Volumes") or []]
            + [f"image {i[:19]}" for i in api.images(all=True, quiet=True, filters=f)])


def trial(client, tasks, name: str, agent: str, resolver: bool = True, mode: str = "trusted"):
    task, task_dir, image, verifier = tasks[name]
    result = run_trial(client, task, task_dir, image, agent,
                       LIMITS.model_copy(update={"verifier_mode": mode}), run_label=RUN_LABEL,
                       resolver_image=DEFAULT_IMAGE if resolver else None, verifier_image=verifier)
    assert result.cleanup_errors == []
    assert _left_behind(client) == [], f"{name}/{agent} left things behind"
    return result


def _as(monkeypatch, command: str) -> None:
    """The next trials' agent runs `command` (a control written for the test)."""
    monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
        name=agent, command=["sh", "-c", command], output="/logs/agent/control.txt"))


# --- the resolver ---------------------------------------------------------------------------------


def test_a_verifier_that_looks_a_host_up_excludes_the_oracles_trial_naming_it(client, tasks):
    r = trial(client, tasks, "needs-network", ORACLE)
    assert (r.status, r.verifier_error.kind) == ("verifier_error", "missing")  # test.sh died: no reward
    assert r.lookups.verifier == ["checker.example.com"] and r.lookups.agent == []
    reason = network.offline_reason(r.lookups, is_reference=True, passed=r.passed())
    assert reason == "the verifier looked up checker.example.com (no network on this profile)"
    assert "checker.example.com" in network.describe(r.lookups)


def test_a_solve_sh_that_looks_a_host_up_and_fails_is_excluded_too(client, tasks):
    r = trial(client, tasks, "solve-needs-network", ORACLE)
    assert (r.status, r.reward, r.agent_run.exit_code) == ("ok", 0.0, 2)  # getent: not found
    assert r.lookups.agent == ["pypi.example.org"] and r.lookups.verifier == []
    assert network.offline_reason(r.lookups, True, r.passed()) == \
        "the reference solution looked up pypi.example.org (no network on this profile)"


def test_a_passing_oracle_is_never_excluded_and_a_quiet_one_asks_nothing(client, tasks):
    r = trial(client, tasks, "offline", ORACLE)
    assert (r.status, r.reward) == ("ok", 1.0) and not r.lookups.any() and r.lookups.problem is None
    assert network.offline_reason(r.lookups, True, r.passed()) is None


def test_a_controls_lookups_change_nothing_even_those_it_makes_the_verifier_do(client, tasks, monkeypatch):
    """The control asks names itself and plants a .pth file that makes the verifier's
    python3 ask one: in the shared verifier both are logged, in their phases; the trusted
    verifier's python3 is the image's own (the .pth stays in the agent's container, recorded
    as its change outside the work paths); the control still just fails either way."""
    plant = ("getent hosts exfil.example.net; "
             "d=$(python3 -c 'import site; print(site.getsitepackages()[0])') && mkdir -p $d && "
             "echo 'import os; os.system(\"getent hosts planted.example.org\")' > $d/planted.pth")
    _as(monkeypatch, plant)
    r = trial(client, tasks, "offline", "planter", mode="shared")
    assert (r.status, r.reward) == ("ok", 0.0)
    assert r.lookups.agent == ["exfil.example.net"] and r.lookups.verifier == ["planted.example.org"]
    assert network.offline_reason(r.lookups, is_reference=False, passed=False) is None
    r = trial(client, tasks, "offline", "planter")
    assert (r.status, r.reward, r.verifier_mode) == ("ok", 0.0, "trusted")
    assert r.lookups.agent == ["exfil.example.net"] and r.lookups.verifier == []
    assert [c.path for c in r.outside_changes if c.path.endswith("planted.pth")], r.outside_changes


def test_an_agent_cannot_hide_the_verifiers_lookups_by_rewriting_the_resolver_files(client, tasks,
                                                                                    monkeypatch):
    """resolv.conf and hosts are the resolver's own files, bind-mounted into every container
    that joins it: the agent (root) points them away; the harness rewrites them in place."""
    _as(monkeypatch, "echo 'nameserver 10.1.2.3' > /etc/resolv.conf; "
                     "echo '127.0.0.1 checker.example.com' >> /etc/hosts; chmod 000 /etc/resolv.conf")
    r = trial(client, tasks, "needs-network", "hider")
    assert r.lookups.verifier == ["checker.example.com"], r.verifier_run


def test_without_a_resolver_nothing_is_recorded(client, tasks):
    r = trial(client, tasks, "needs-network", ORACLE, resolver=False)
    assert r.status == "verifier_error" and r.lookups is None


@pytest.mark.parametrize("at", [1, 2], ids=["in-the-agent-phase", "in-the-verifier-phase"])
def test_an_interrupted_trial_leaves_no_resolver_behind(client, tasks, monkeypatch, at):
    name = "separate" if at == 1 else "needs-network"
    task, task_dir, image, verifier = tasks[name]
    real = trial_run.dk.run_exec
    calls = []

    def own() -> list[threading.Thread]:  # the one-container trial's own resolver (its loop)
        return [t for t in threading.enumerate() if t.name == "nsresolver"]

    def interrupted(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == at:  # the separate verifier's agent exec (its sidecar runs), or the verifier's
            assert any("resolver" in x for x in _left_behind(client)) if at == 1 else own()
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(trial_run.dk, "run_exec", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_trial(client, task, task_dir, image, ORACLE, LIMITS, run_label=RUN_LABEL,
                  resolver_image=DEFAULT_IMAGE, verifier_image=verifier)
    assert len(calls) == at and _left_behind(client) == [] and own() == []


def test_the_resolvers_cost_per_trial_is_measured(client, tasks, capsys):
    """Reported, not a pass/fail number: the same nop trial with and without the resolver,
    alternated (this machine's load varies), the best and the median of each."""
    cost: dict[bool, list[float]] = {}
    for resolver in (False, True) * 4:
        t0 = time.monotonic()
        trial(client, tasks, "offline", NOP, resolver=resolver)
        cost.setdefault(resolver, []).append(time.monotonic() - t0)
    best = {k: min(v) for k, v in cost.items()}
    median = {k: sorted(v)[len(v) // 2] for k, v in cost.items()}
    with capsys.disabled():
        print(f"\nnop trial, best/median of 4: {best[False]:.2f}/{median[False]:.2f} s without the resolver, "
              f"{best[True]:.2f}/{median[True]:.2f} s with it")
    assert best[True] < best[False] + 5


# --- the separate verifier ------------------------------------------------------------------------


def test_a_separate_verifier_passes_the_oracle_and_sees_only_the_artifacts(client, tasks):
    r = trial(client, tasks, "separate", ORACLE)
    assert (r.status, r.reward) == ("ok", 1.0), r.verifier_run
    assert r.verifier_image == tasks["separate"][3]
    assert "sees" not in r.verifier_run.stdout  # nothing of the agent's filesystem outside /logs/artifacts
    assert r.artifacts.files == ["sub/note.txt", "sum.txt"]
    assert r.artifacts.dropped == ["passwd-link (a symlink)"] and "passwd-link" not in r.verifier_run.stdout


def test_a_separate_verifier_fails_nop(client, tasks):
    r = trial(client, tasks, "separate", NOP)
    assert (r.status, r.reward) == ("ok", 0.0) and r.artifacts.files == []


# --- without docker: the responder's parsing and the log's reading ----------------------------------


def _query(name: bytes, qtype: int = 1) -> bytes:
    import struct
    q = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    for label in name.split(b"."):
        q += bytes([len(label)]) + label
    return q + b"\0" + struct.pack("!HH", qtype, 1)


def test_the_responder_answers_nxdomain_and_renders_hostile_names_inert(capsys):
    from validate.taskdir.trial import dnslog

    reply = dnslog.answer(_query(b"checker.example.com"))
    assert reply[:2] == b"\x12\x34" and reply[3] & 0x0F == 3 and reply[2] & 0x80  # an NXDOMAIN response
    assert dnslog.name_of(_query(b'Evil\n{"mark": 1}.Example', 28)) == ('evil\\010{"mark":\\0321}.example',
                                                                        28)
    assert dnslog.name_of(b"\x00" * 11) is None and dnslog.answer(reply) is None  # short; a response
    log = dnslog.Log()
    for name in [b"a.test", b"a.test"] + [b"n%d.test" % i for i in range(dnslog.MAX_NAMES + 5)]:
        log.note(_query(name), "udp")
    log.mark()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == dnslog.MAX_NAMES + 2 and lines[-2:] == ['{"overflow": 6}', '{"mark": 1}']


def test_the_harness_reads_the_log_by_phase_and_ignores_what_is_not_its_format():
    class Api:
        def logs(self, sid, stdout, stderr):
            return (b'{"ready": true}\nnot json\n[1]\n{"name": "b.test", "type": 1, "via": "udp"}\n'
                    b'{"name": "a.test", "type": 1, "via": "tcp"}\n{"mark": 1}\n'
                    b'{"name": "a.test", "type": 28, "via": "udp"}\n{"overflow": 3}\n')

    res = dk.Resources(Api(), "r", "t")
    found = network.lookups(res, "sid", 1)
    assert (found.agent, found.verifier, found.overflow) == (["a.test", "b.test"], ["a.test"], 3)
    assert network.lookups(res, "sid", None).agent == ["a.test", "b.test"]  # no boundary: all the agent's
    assert network.offline_reason(found, True, False) == ("the verifier looked up a.test; the reference "
                                                          "solution looked up a.test, b.test (no network "
                                                          "on this profile)")
