"""The agents of a Harbor trial: for each, the files it puts into the agent's container and
the command it runs there (as the task's agent user, against the task's agent timeout).

- the oracle (`validate.records.ORACLE`): ``solution/`` uploaded to ``/solution`` (only
  for this agent), ``solve.sh`` run with output to ``/logs/agent/oracle.txt``; its exit code
  does not end the trial (Harbor's rule);
- ``nop``: runs nothing;
- three leak controls, each a generic in-container program that never reads the task's name
  (a pass means the task leaks its answer): ``reward-forger`` (POSIX sh: plants both reward
  files and leaves a background process that keeps rewriting them), ``test-reader`` and
  ``history-miner`` (standard-library Python 3); their programs are the Harbor environment's
  own agents, `environment.harbor.agents`. Each is given
  the instruction, as every agent is, at ``/logs/agent/instruction.md``.

``tests/`` never goes into the agent's container; the verifier phase uploads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import environment.harbor.agents
from environment.harbor.taskdir import HarborTask
from validate.records import ORACLE

NOP = "nop"
REWARD_FORGER = "reward-forger"
TEST_READER = "test-reader"
HISTORY_MINER = "history-miner"
CONTROLS = (NOP, REWARD_FORGER, TEST_READER, HISTORY_MINER)
AGENTS = (ORACLE, *CONTROLS)

AGENT_DIR = "/logs/agent"
CONTROL_DIR = f"{AGENT_DIR}/control"
INSTRUCTION = f"{AGENT_DIR}/instruction.md"
SOLUTION_DIR = "/solution"
PROGRAMS = Path(environment.harbor.agents.__file__).resolve().parent

#: Runs a script with bash when the image has it (as Harbor does), else sh.
_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash {0}; else exec sh {0}; fi"

Entry = tuple[str, int, "bytes | None"]


@dataclass(frozen=True)
class AgentPlan:
    """What the harness does for one agent: uploads (each a tar's entries, extracted at
    ``/``), then `command` (None: nothing runs), its output in `output`."""

    name: str
    command: list[str] | None
    output: str
    env: dict[str, str] = field(default_factory=dict)
    uploads: list[Entry] = field(default_factory=list)


class UnknownAgent(ValueError):
    pass


def tree_entries(src: Path, dest: str) -> list[Entry]:
    """`src` (a task's ``solution/`` or ``tests/``) as tar entries under `dest` (relative,
    e.g. ``tests``): directories 0755, files 0644 (0755 when executable or a ``.sh``), a
    symlink as the file it reaches inside the task (the loader refused links leaving it)."""
    root = src.resolve()
    entries: list[Entry] = [(dest, 0o755, None)]
    for top, dirs, files in os.walk(src):
        dirs.sort()
        rel = Path(top).relative_to(src).as_posix()
        base = dest if rel == "." else f"{dest}/{rel}"
        for d in dirs:
            entries.append((f"{base}/{d}", 0o755, None))
        for name in sorted(files):
            path = Path(top) / name
            real = path.resolve()
            if not real.is_file() or (real != root and root not in real.parents):
                continue
            executable = os.access(real, os.X_OK) or name.endswith(".sh")
            entries.append((f"{base}/{name}", 0o755 if executable else 0o644, real.read_bytes()))
    return entries


def plan(agent: str, task: HarborTask, task_dir: Path) -> AgentPlan:
    """The plan of `agent` on `task` (whose files are in `task_dir`)."""
    output = f"{AGENT_DIR}/{agent}.txt"
    if agent == ORACLE:
        solve = f"{SOLUTION_DIR}/solve.sh"
        return AgentPlan(name=agent, command=["sh", "-c", f"{{ {_SHELL.format(solve)}; }} > {output} 2>&1"],
                         output=output, env=dict(task.config.solution.env),
                         uploads=tree_entries(task_dir / "solution", SOLUTION_DIR.lstrip("/")))
    if agent == NOP:
        return AgentPlan(name=agent, command=None, output=output)
    programs = {REWARD_FORGER: "forger.sh", TEST_READER: "reader.py", HISTORY_MINER: "miner.py"}
    if agent not in programs:
        raise UnknownAgent(f"agent {agent!r} is not one of: {', '.join(AGENTS)}")
    name = programs[agent]
    program = f"{CONTROL_DIR}/{name}"
    run = f"exec sh {program}" if name.endswith(".sh") else f"exec python3 {program} {INSTRUCTION}"
    uploads: list[Entry] = [
        (CONTROL_DIR.lstrip("/"), 0o755, None),
        (program.lstrip("/"), 0o755, (PROGRAMS / name).read_bytes()),
        (INSTRUCTION.lstrip("/"), 0o644, task.instruction.encode()),
    ]
    return AgentPlan(name=agent, command=["sh", "-c", f"{run} > {output} 2>&1"], output=output, uploads=uploads)
