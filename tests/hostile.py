"""deshuffle-papers with the hostile agents of tests/agents/ declared as extra controls, so the
harness plays them like any control (they must never pass, and never break the harness)."""

from __future__ import annotations

from pathlib import Path

from environment.deshuffle.env import AGENTS as DESHUFFLE_AGENTS, DeshuffleEnvironment
from environment.protocol import AgentSpec

HOSTILE_DIR = Path(__file__).resolve().parent / "agents"


def hostile_specs() -> list[AgentSpec]:
    out = []
    for program in sorted(HOSTILE_DIR.glob("*.py")):
        doc = (
            program.read_text().split('"""')[1].strip().splitlines()[0]
            if '"""' in program.read_text()
            else ""
        )
        out.append(AgentSpec(name=program.stem.replace("_", "-"), role="control", program=program,
                             support=(DESHUFFLE_AGENTS / "deshufflelib.py",),
                             tests=f"hostile: {doc or program.stem}",
                             sees_answer_key=program.stem in ("slow_oracle", "peek_key")))
    return out


class HostileDeshuffle(DeshuffleEnvironment):
    name = "deshuffle-hostile"

    def agents(self, config):
        return [*super().agents(config), *hostile_specs()]

    def source_dir(self) -> Path:
        return DESHUFFLE_AGENTS.parent
