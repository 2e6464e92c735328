"""The one-container trial (a verifier sharing the agent's environment) against hostile root
agents, on real docker (the suite's own dockerd): what the agent phase started does not
survive into the verifier's, and its container's PID 1 is out of every process's reach.

What is shown: a reward forger that double-forks and ``setsid``s a rewriter loop (writing
reward.txt and reward.json, which would win), a process ignoring every signal it may ignore
and a link out of the container planted in /logs/verifier: the harness kills them all from
the host (counted), records the planted files (the link as a link), and the verifier's
reward is the verifier's; the processes the verifier itself sees are PID 1 and its own. A
root agent that takes PID 1's real or effective uid (``setpriv``, python's ``os.setresuid``)
can neither ptrace-attach to PID 1 nor open ``/proc/1/mem``; nor move /logs or /tests away.
Orphans filling the pids limit, zombies once killed (PID 1 reaps none), do not starve the
verifier: the container starts again. Trees deeper than the recursion limit in the
directories the harness empties and removes neither stop the trial nor stay on the host.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from environment.harbor.taskdir import HarborTask, load_task
from tests import test_trial
from tests.test_trial import LIMITS as ANY_MODE, RUN_LABEL, TEST_SUM, _left_behind, sum_task
from validate.taskdir.trial import docker as dk, run as trial_run, tool as harness_tool
from validate.taskdir.trial.agents import AgentPlan
from validate.taskdir.trial.run import run_trial

#: test_trial's client fixture, shared: pytest finds it by this module-level name (bound by
#: assignment: ruff reads a test's parameter named like an imported fixture as a redefinition).
client = test_trial.client

pytestmark = pytest.mark.docker
#: Every trial here shares one container between the phases (Harbor's verifier mode).
LIMITS = ANY_MODE.model_copy(update={"verifier_mode": "shared"})

FORGER = r"""
cat > /tmp/rewriter.sh <<'EOF'
trap '' HUP INT TERM QUIT USR1 USR2
while :; do
  echo 1 > /logs/verifier/reward.txt
  echo '{"reward": 1.0}' > /logs/verifier/reward.json
  sleep 0.05
done
EOF
# double fork, each in a new session: no parent of the phase's command holds them
( setsid sh -c '( setsid sh /tmp/rewriter.sh & ); ( trap "" HUP INT TERM; exec sleep 1000 ) &' & )
ln -s /etc/shadow /logs/verifier/link
mv /logs /logs.gone 2>/dev/null && echo "moved /logs"
mv /tests /tests.gone 2>/dev/null && echo "moved /tests"
sleep 0.5
ps_count=$(ls -d /proc/[0-9]* | wc -l)
echo "alive: $ps_count"
"""

#: A root agent that becomes PID 1's real, then effective, uid and tries to take PID 1 over.
HIJACKER = r"""
python3 -u - <<'EOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ids = [line.split()[1:3] for line in open("/proc/1/status") if line.startswith("Uid:")][0]
gids = [line.split()[1:3] for line in open("/proc/1/status") if line.startswith("Gid:")][0]
print("pid1 uids", *ids)
for ruid, euid in ((ids[0], ids[0]), (ids[1], ids[1]), (ids[0], ids[1]), (ids[1], ids[0])):
    pid = os.fork()
    if pid == 0:
        os.setgroups([])
        os.setresgid(int(gids[0]), int(gids[1]), int(gids[1]))
        os.setresuid(int(ruid), int(euid), int(euid))
        tag = f"as {ruid}/{euid}"
        if libc.ptrace(16, 1, 0, 0) == 0:  # PTRACE_ATTACH
            print(tag, "ATTACHED")
        else:
            print(tag, "ptrace refused:", os.strerror(ctypes.get_errno()))
        try:
            os.open("/proc/1/mem", os.O_RDWR)
            print(tag, "MEM OPENED")
        except OSError as e:
            print(tag, "mem refused:", e.strerror)
        os._exit(0)
    os.waitpid(pid, 0)
EOF
setpriv --reuid="$(awk '/^Uid:/ {print $2}' /proc/1/status)" --regid="$(awk '/^Gid:/ {print $2}' /proc/1/status)" \
  --clear-groups python3 -c 'import os; os.open("/proc/1/mem", os.O_RDWR); print("MEM OPENED via setpriv")' \
  || echo "setpriv: mem refused"
"""  # noqa: E501


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, client) -> tuple[HarborTask, object, str]:
    root = tmp_path_factory.mktemp("hostile")
    sum_task(root, "root-agent", agent_user="root", test_sh=TEST_SUM)
    task = load_task(root, "root-agent")
    image, _ = client.images.build(path=str(root / "root-agent" / "environment"), network_mode="none",
                                   labels={"deshuffle-validate.test-task-image": "1"}, rm=True, forcerm=True)
    return task, root / "root-agent", image.id


def _play(client, hostile, monkeypatch, script: str, name: str):
    task, task_dir, image = hostile
    monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
        name=agent, command=["sh", "-c", f"exec > /logs/agent/{name}.txt 2>&1\n{script}"],
        output=f"/logs/agent/{name}.txt"))
    r = run_trial(client, task, task_dir, image, name, LIMITS, run_label=RUN_LABEL)
    assert r.cleanup_errors == [] and _left_behind(client) == []
    return r


def test_a_forger_s_detached_rewriters_are_killed_and_the_reward_is_the_verifier_s(client, hostile,
                                                                                   monkeypatch):
    r = _play(client, hostile, monkeypatch, FORGER, "forger")
    assert r.infrastructure_error is None, r.infrastructure_error
    assert "alive:" in r.agent_run.stdout and "moved" not in r.agent_run.stdout  # mount points stay put
    # the rewriter loop and the signal-ignoring sleep (and the rewriter's sleep, when caught in it)
    assert r.agent_processes_killed is not None and r.agent_processes_killed >= 2
    assert r.pid1_guarded is True
    assert (r.status, r.reward, r.rewards, r.reward_source) == ("ok", 0.0, {"reward": 0.0}, "reward.txt")
    assert "reward.json" not in r.verifier_files and "link" not in r.verifier_files
    planted = {f.path: f.kind for f in r.left_in_verifier_dir}
    assert planted == {"link": "symlink", "reward.json": "file", "reward.txt": "file"}
    # what the verifier saw alive: PID 1 and the verifier, both the harness's program, and the
    # verifier's own commands, nothing of the agent's
    alive = [line for line in r.verifier_run.stdout.splitlines() if line.strip()
             and not line.strip().isdigit()]
    assert not [line for line in alive if "rewriter" in line or "1000" in line], alive
    assert any(line.startswith(f"{harness_tool.BINARY} init ") for line in alive), alive
    assert any(line.startswith(f"{harness_tool.BINARY} run ") for line in alive), alive
    assert any("/tests/test.sh" in line for line in alive), alive


def test_a_root_agent_with_pid1_s_uids_cannot_ptrace_it_nor_write_its_memory(client, hostile, monkeypatch):
    r = _play(client, hostile, monkeypatch, HIJACKER, "hijacker")
    out = r.agent_run.stdout
    assert r.pid1_guarded is True and f"pid1 uids {dk.PID1_IDS[0]} {dk.PID1_IDS[1]}" in out, out
    assert out.count("ptrace refused: Operation not permitted") == 4, out
    assert out.count("mem refused: Permission denied") == 4, out
    assert "setpriv: mem refused" in out and "ATTACHED" not in out and "OPENED" not in out, out
    assert (r.status, r.reward) == ("ok", 0.0) and r.agent_processes_killed == 0


def test_pid1_is_the_harness_s_program_by_its_absolute_path():
    assert dk.pid1_entrypoint(10, False) == ["sleep", str(10 + dk.BACKSTOP_S)]
    guarded = dk.pid1_entrypoint(10, True)
    assert guarded[:3] == [harness_tool.BINARY, "init", str(10 + dk.BACKSTOP_S)]
    assert guarded[3:] == [str(i) for i in dk.PID1_IDS] and harness_tool.BINARY.startswith("/")


#: Fills the pids limit with orphans (reparented to PID 1, which reaps nothing: once killed,
#: each would stay a zombie holding its pid, and the verifier could not start), and solves
#: the task (a builtin: no pid left to fork).
ORPHANS = r"""
i=0
while [ $i -lt 200 ] && ( setsid sleep 1000 & ) 2>/dev/null; do i=$((i + 1)); done
echo 60 > /app/sum.txt
echo "orphans: $i"
"""


def test_orphans_filling_the_pids_limit_leave_the_verifier_its_pids(client, hostile, monkeypatch):
    task, task_dir, image = hostile
    monkeypatch.setattr(trial_run, "agent_plan", lambda agent, task, task_dir: AgentPlan(
        name=agent, command=["sh", "-c", f"exec > /logs/agent/orphans.txt 2>&1\n{ORPHANS}"],
        output="/logs/agent/orphans.txt"))
    r = run_trial(client, task, task_dir, image, "orphans", LIMITS.model_copy(update={"pids": 64}),
                  run_label=RUN_LABEL)
    assert r.cleanup_errors == [] and _left_behind(client) == []
    assert r.infrastructure_error is None, r.infrastructure_error
    assert r.agent_processes_killed is not None and r.agent_processes_killed >= 40, r.agent_run.stdout
    # the zombies went with a fresh PID 1 (the container started again), guarded again
    assert r.pid1_guarded is True
    assert (r.status, r.reward, r.verifier_error) == ("ok", 1.0, None), r.verifier_run.stderr


#: Trees deeper than Python's recursion limit in every directory the harness empties or
#: removes from the host (and the task solved, so the verifier's reward says the trial ran).
DEEP = r"""
python3 -c '
import os
for top in ("/logs/verifier", "/tests", "/logs/agent", "/logs/artifacts"):
    os.chdir(top)
    for _ in range(3000):
        os.mkdir("d")
        os.chdir("d")
'
echo 60 > /app/sum.txt
"""


def test_trees_deeper_than_the_recursion_limit_are_emptied_and_removed(client, hostile, monkeypatch):
    before = set(Path(tempfile.gettempdir()).glob("dv-*"))
    r = _play(client, hostile, monkeypatch, DEEP, "deep")
    assert r.infrastructure_error is None, r.infrastructure_error
    assert (r.status, r.reward) == ("ok", 1.0), (r.agent_run.stdout, r.verifier_run.stderr)
    assert [f.path for f in r.left_in_verifier_dir][:2] == ["d", "d/d"]
    # listed down to the host listing's depth, no further (one descriptor held per level)
    assert r.left_listing_truncated and max(f.path.count("/")
                                            for f in r.left_in_verifier_dir) == dk.MAX_DEPTH - 1
    assert set(Path(tempfile.gettempdir()).glob("dv-*")) - before == set()  # the trial's host directory went


def test_a_host_listing_holds_a_descriptor_per_level_not_per_directory(tmp_path, monkeypatch):
    """However many directories the agent made (here 2,000 side by side, and a chain deeper
    than the listing goes), reading them holds at most one descriptor per level at once."""
    top = tmp_path / "logs" / "verifier"
    for i in range(2000):
        (top / f"w{i:04d}").mkdir(parents=True)
        (top / f"w{i:04d}" / "f").write_bytes(b"x")
    chain = top
    for _ in range(dk.MAX_DEPTH + 20):
        chain = chain / "c"
    chain.mkdir(parents=True)
    real_open, real_close, held, most = dk.os.open, dk.os.close, set(), [0]

    def counted_open(*a, **kw):
        fd = real_open(*a, **kw)
        held.add(fd)
        most[0] = max(most[0], len(held))
        return fd

    def counted_close(fd):
        held.discard(fd)
        real_close(fd)

    monkeypatch.setattr(dk.os, "open", counted_open)
    monkeypatch.setattr(dk.os, "close", counted_close)
    tree = dk.read_host_tree(tmp_path / "logs", "verifier", 16, 64 * 2**20)
    monkeypatch.undo()
    assert held == set() and most[0] <= dk.MAX_DEPTH + 3, most[0]
    assert sum(f.path.endswith("/f") and f.data == b"x" for f in tree.entries) == 2000
    assert tree.truncated and max(f.path.count("/") for f in tree.entries) == dk.MAX_DEPTH - 1


#: The restart hook: an ``sh`` planted earlier on PATH that, started as a container's PID 1,
#: forks a survivor planting reward.json (which wins over reward.txt) in every fresh
#: /logs/verifier, then runs the real shell; and an orphan, which the sweep leaves a zombie of
#: the old PID 1, so that a harness restarting the container for its pids would start PID 1
#: through the planted shell after the sweep. The task is not solved.
RESTART_HOOK = r"""
cat > /usr/local/bin/sh <<'HOOK'
#!/bin/dash
if [ "$$" = 1 ]; then
  ( trap '' HUP INT TERM
    while :; do
      [ -e /logs/verifier/reward.json ] || echo '{"reward": 1.0}' > /logs/verifier/reward.json 2>/dev/null
      sleep 0.02
    done ) </dev/null >/dev/null 2>&1 &
fi
exec /bin/dash "$@"
HOOK
chmod 755 /usr/local/bin/sh
( setsid sleep 1000 & )
echo planted
"""


def test_a_shell_planted_on_path_starts_no_survivor_when_the_container_restarts(client, hostile, monkeypatch):
    r = _play(client, hostile, monkeypatch, RESTART_HOOK, "restart-hook")
    assert r.infrastructure_error is None, r.infrastructure_error
    assert "planted" in r.agent_run.stdout
    assert "reward.json" not in r.verifier_files, r.verifier_files
    assert (r.status, r.reward, r.reward_source) == ("ok", 0.0, "reward.txt")
    alive = [line for line in r.verifier_run.stdout.splitlines() if "while" in line or "dash" in line]
    assert alive == [], alive
