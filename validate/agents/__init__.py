"""Agents, harness side: which of an environment's declared agents a run plays.

Each environment declares its agents (`environment.protocol.AgentSpec`: program, support
files, role, what it tests); the contract names the oracle, the controls a task must reject
and the probes. An agent's role, never its name, says what is expected of it. Every agent
gets the harness's ``agentlib.py`` beside its program (`AGENTLIB`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path

from environment.protocol import AgentSpec, Environment
from validate.core.errors import ContractError
from validate.core.records import CONTROL, ORACLE, PROBE


@cache
def agentlib_source() -> bytes:
    return resources.files("validate.agents").joinpath("agentlib.py").read_bytes()


def declared(env: Environment, config) -> dict[str, AgentSpec]:
    return {a.name: a for a in env.agents(config)}


def resolve(env: Environment, config, contract_agents: Sequence[str],
            names: str | Sequence[str]) -> list[AgentSpec]:
    """Agents by name, in the contract's order; ``all`` (the oracle and the contract's
    controls), ``controls`` and ``probes`` expand. A name the contract does not hold is an error."""
    specs = declared(env, config)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    groups = {"all": (ORACLE, CONTROL), "controls": (CONTROL,), "probes": (PROBE,)}
    out: list[str] = []
    for n in names:
        if n in groups:
            expanded = [a for a in contract_agents if specs[a].role in groups[n]]
        else:
            expanded = [n]
        out += [x for x in expanded if x not in out]
    unknown = [n for n in out if n not in contract_agents]
    if unknown:
        raise ContractError(f"agents: {', '.join(unknown)} not in the contract; it names "
                            f"{', '.join(contract_agents)} (and the groups all, controls, probes)")
    return [specs[n] for n in out]


def source_files(env: Environment) -> list[tuple[str, Path]]:
    """The environment's source files for agents that see them (see `Environment.source_files`)."""
    return env.source_files()
