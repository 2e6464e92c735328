"""Agents: small stdlib-only programs run inside the sandbox, one registry.

An agent reads the task from its workspace (``$WORKSPACE``, ``/workspace``) and
``$AGENT_DIR/task.json`` (``id``, ``hash``, ``prompt`` and the task's public ``meta``), and
leaves its reply in ``$WORKSPACE/reply.txt``. Only an agent with ``sees_answer_key`` gets
``$ANSWER_KEY_DIR/answer.json`` mounted read-only; no other sandbox has that mount.

Adding an agent = one program in ``programs/`` and one `AgentSpec` line below; the runner
is not touched.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from validate.errors import ValidateError


class AgentSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    #: File name under ``validate/agents/programs/``, or an absolute path to a program elsewhere.
    program: str
    #: The outcome the contract expects: the oracle passes, a control is rejected, a
    #: partial-credit probe scores strictly between the controls and the oracle.
    expect: Literal["pass", "reject", "partial"]
    sees_answer_key: bool = False
    #: Fewest papers a task needs for this agent to apply (the merge probe needs two).
    min_papers: int = 1
    description: str

    def source(self) -> bytes:
        return program_source(self.program)


@cache
def program_source(filename: str) -> bytes:
    """A file of ``validate/agents/programs/`` (an agent, or the shared ``agentlib.py``),
    or a program at an absolute path (an agent that lives outside the package)."""
    if filename.startswith("/"):
        return Path(filename).read_bytes()
    return resources.files("validate.agents.programs").joinpath(filename).read_bytes()


REGISTRY: dict[str, AgentSpec] = {a.name: a for a in [
    AgentSpec(name="oracle", program="oracle.py", expect="pass", sees_answer_key=True,
              description="writes the gold answer read from the answer key"),
    AgentSpec(name="empty", program="empty.py", expect="reject",
              description="leaves no reply"),
    AgentSpec(name="shuffled", program="shuffled.py", expect="reject",
              description="a random permutation (and for k > 1 a random grouping), seeded from the task hash"),
    AgentSpec(name="identity", program="identity.py", expect="reject",
              description="the displayed order, as one group"),
    AgentSpec(name="reversed", program="reversed.py", expect="reject",
              description="the displayed order reversed, as one group"),
    AgentSpec(name="single-group", program="single_group.py", expect="reject",
              description="all labels in one group (a list of one list)"),
    AgentSpec(name="malformed", program="malformed.py", expect="reject",
              description="an answer that is not a valid partition"),
    AgentSpec(name="probe-swap", program="probe_swap.py", expect="partial", sees_answer_key=True,
              description="the oracle's answer with one adjacent swap"),
    AgentSpec(name="probe-merge", program="probe_merge.py", expect="partial", sees_answer_key=True, min_papers=2,
              description="the oracle's answer with two papers merged into one group"),
    AgentSpec(name="probe-split", program="probe_split.py", expect="partial", sees_answer_key=True,
              description="the oracle's answer with one paper split in two groups"),
]}

CONTROLS: tuple[str, ...] = tuple(n for n, a in REGISTRY.items() if a.expect == "reject")
PROBES: tuple[str, ...] = tuple(n for n, a in REGISTRY.items() if a.expect == "partial")
#: ``all``: the oracle and every control (the probes are the pilot's own).
ALL_AGENTS: tuple[str, ...] = ("oracle", *CONTROLS)


def resolve(names: str | list[str] | tuple[str, ...]) -> list[AgentSpec]:
    """Agents by name (``all``, ``controls`` and ``probes`` expand); unknown names are an error."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out: list[str] = []
    for n in names:
        expanded = {"all": ALL_AGENTS, "controls": CONTROLS, "probes": PROBES}.get(n, (n,))
        out += [x for x in expanded if x not in out]
    unknown = [n for n in out if n not in REGISTRY]
    if unknown:
        raise ValidateError(f"agents: unknown agent(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)}")
    return [REGISTRY[n] for n in out]
