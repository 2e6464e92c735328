"""The agents of a Harbor trial: for each, the files it puts into the agent's container and
the command it runs there (as the task's agent user, against the task's agent timeout).

- the oracle (`validate.core.records.ORACLE`): ``solution/`` uploaded to ``/solution`` (only
  for this agent), ``solve.sh`` run with output to ``/logs/agent/oracle.txt``; its exit code
  does not end the trial (Harbor's rule);
- ``nop``: runs nothing;
- every other agent is a control the environment declares (`AgentSpec`: its program and
  support files): its program uploaded to ``/logs/agent/control/`` with its support files
  (a C source among them built by the harness into a shared object of the same stem,
  `validate.taskdir.trial.tool.shared_object`), run by the image's ``sh`` (a ``.sh``) or ``python3``
  (a ``.py``); output to ``/logs/agent/<name>.txt``. Each is given the instruction, as every
  agent is, at ``/logs/agent/instruction.md``, and the words of the task's ``tests/test.sh``
  at ``/logs/agent/control/verifier-words`` (what a tampering control replaces: a verifier's
  programs are no secret to an agent that has seen a few). Adding a control is its program
  file and its line in the environment's ``agents()``.

``tests/`` never goes into the agent's container; the verifier phase uploads it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from environment.harbor.env import HarborConfig, HarborEnvironment
from environment.harbor.taskdir import HarborTask
from environment.protocol import AgentSpec
from validate.core.errors import ContractError
from validate.core.records import ORACLE
from validate.taskdir.trial import tool as harness_tool

NOP = "nop"
REWARD_FORGER = "reward-forger"
TEST_READER = "test-reader"
HISTORY_MINER = "history-miner"

AGENT_DIR = "/logs/agent"
CONTROL_DIR = f"{AGENT_DIR}/control"
INSTRUCTION = f"{AGENT_DIR}/instruction.md"
SOLUTION_DIR = "/solution"
VERIFIER_WORDS = f"{CONTROL_DIR}/verifier-words"
#: Shell words that are no program (a tampering control would find nothing to replace).
_SHELL_WORDS = frozenset("if then else elif fi for while until do done case esac in function return exit set "
                         "export local read cd shift trap eval exec source unset".split())
_WORD = re.compile(r"(?<![\w./$-])([A-Za-z_][A-Za-z0-9_.+-]{0,63})")
#: An absolute path test.sh spells (``/opt/venv/bin/python``): a program it may run by its path.
_PATH = re.compile(r"(?<![\w./$-])(/[A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+){0,15})")
MAX_WORDS = 256

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


class UnknownAgent(ContractError):
    """An agent name no trial plays: neither the oracle, the no-op nor a declared control."""


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


def declared() -> dict[str, AgentSpec]:
    """The task-directory environment's own agents by name (for a caller that names an agent
    without its declaration)."""
    return {a.name: a for a in HarborEnvironment().agents(HarborConfig(dataset="-"))}


def verifier_words(task_dir: Path, max_bytes: int = 1 << 20) -> bytes:
    """The words of the task's ``tests/test.sh`` that could name a program — bare names and
    absolute paths — sorted, one a line."""
    try:
        with open(Path(task_dir) / "tests" / "test.sh", "rb") as f:
            text = f.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return b""
    names = {w for w in _WORD.findall(text) if w not in _SHELL_WORDS}
    paths = {p for p in _PATH.findall(text) if len(p) <= 255}
    words = sorted(names | paths)[:MAX_WORDS]
    return "".join(f"{w}\n" for w in words).encode()


def plan(agent: str, task: HarborTask, task_dir: Path, spec: AgentSpec | None = None) -> AgentPlan:
    """The plan of `agent` on `task` (whose files are in `task_dir`); `spec`: its declaration
    (default: the task-directory environment's agent of that name)."""
    output = f"{AGENT_DIR}/{agent}.txt"
    if agent == ORACLE:
        solve = f"{SOLUTION_DIR}/solve.sh"
        return AgentPlan(name=agent, command=["sh", "-c", f"{{ {_SHELL.format(solve)}; }} > {output} 2>&1"],
                         output=output, env=dict(task.config.solution.env),
                         uploads=tree_entries(task_dir / "solution", SOLUTION_DIR.lstrip("/")))
    if agent == NOP:
        return AgentPlan(name=agent, command=None, output=output)
    if spec is None:
        spec = declared().get(agent)
    if spec is None:
        raise UnknownAgent(f"agent {agent!r} is not one of: {', '.join(sorted([ORACLE, *declared()]))}")
    program = f"{CONTROL_DIR}/{spec.program.name}"
    run = f"exec sh {program}" if spec.program.suffix == ".sh" else f"exec python3 {program} {INSTRUCTION}"
    uploads: list[Entry] = [
        (CONTROL_DIR.lstrip("/"), 0o755, None),
        (program.lstrip("/"), 0o755, spec.program.read_bytes()),
        (INSTRUCTION.lstrip("/"), 0o644, task.instruction.encode()),
        (VERIFIER_WORDS.lstrip("/"), 0o644, verifier_words(task_dir)),
    ]
    for support in spec.support:
        built = harness_tool.shared_object(support) if support.suffix == ".c" else support
        name = f"{support.stem}.so" if support.suffix == ".c" else support.name
        uploads.append((f"{CONTROL_DIR.lstrip('/')}/{name}", 0o755, built.read_bytes()))
    return AgentPlan(name=agent, command=["sh", "-c", f"{run} > {output} 2>&1"], output=output,
                     uploads=uploads)
