"""A toy environment that lives in tests/: adding an environment is this package plus one
registration (an entry point, or `validate.core.environments.register`), with no edit under
validate/.

Task idx holds the numbers of ``numbers.txt``; the reply is their sum. Reward 1.0 for the
exact sum, 0.5 when off by one (partial credit), else 0. Family: the parity of idx. Config
``broken`` lists idx whose task carries a blocking finding.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from environment.protocol import (
    AgentSpec,
    Environment,
    Finding,
    LoadHints,
    Score,
    canonical_json,
    config_digest,
    sha256_tag,
)

AGENTS = Path(__file__).resolve().parent / "agents"


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    size: int = Field(default=10, ge=1, le=1000, description="How many tasks the taskset holds.")
    seed: int = Field(default=0, ge=0, description="Seed of the numbers.")
    broken: list[int] = Field(default_factory=list, description="Task idx carrying a blocking finding.")


class ToyTask(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    idx: int
    numbers: tuple[int, ...]
    broken: bool = False
    prompt: str = "Write the sum of the numbers in numbers.txt to reply.txt."
    requires_network_isolation: bool = True

    @property
    def files(self) -> dict[str, bytes]:
        return {"numbers.txt": "".join(f"{n}\n" for n in self.numbers).encode()}

    @property
    def answer_key(self) -> bytes:
        return canonical_json({"sum": sum(self.numbers)})

    @property
    def hash(self) -> str:
        return sha256_tag(canonical_json({"id": self.id, "numbers": self.numbers, "broken": self.broken}))

    @property
    def family(self) -> str:
        return "even" if self.idx % 2 == 0 else "odd"

    @property
    def meta(self) -> dict[str, int]:
        return {"count": len(self.numbers)}


class ToyTaskset:
    metric_names = ("exact",)

    def __init__(self, config: ToyConfig) -> None:
        self.config, self.size = config, config.size
        self.revision = sha256_tag(canonical_json(config.model_dump(mode="json")))
        self._digest = config_digest(config)

    def task(self, idx: int) -> ToyTask:
        if not 0 <= idx < self.size:
            raise IndexError(f"idx {idx} is outside 0..{self.size - 1}")
        rng = random.Random(f"{self.config.seed}:{idx}")
        return ToyTask(id=f"toy/{self._digest}/{idx}", idx=idx,
                       numbers=tuple(int(rng.random() * 100) for _ in range(3 + idx % 3)),
                       broken=idx in self.config.broken)

    def score(self, task: ToyTask, reply: bytes, cache_dir=None) -> Score:
        try:
            got = int(reply.decode("utf-8", "replace").strip())
        except ValueError:
            return Score(0.0, {"exact": 0.0})
        diff = abs(got - sum(task.numbers))
        return Score(1.0 if diff == 0 else 0.5 if diff == 1 else 0.0, {"exact": float(diff == 0)})


def _agent(name: str, role: str, tests: str, **kw) -> AgentSpec:
    return AgentSpec(name=name, role=role, program=AGENTS / f"{name.replace('-', '_')}.py", tests=tests, **kw)


class ToyEnvironment(Environment):
    name = "toy"
    Config = ToyConfig

    def load(self, config: ToyConfig, hints: LoadHints = LoadHints()) -> ToyTaskset:
        return ToyTaskset(config)

    def agents(self, config: ToyConfig) -> list[AgentSpec]:
        return [_agent("oracle", "oracle", "the sum from the answer key passes", sees_answer_key=True),
                _agent("empty", "control", "no reply scores 0"),
                _agent("off-by-two", "control", "a wrong sum scores 0"),
                _agent("off-by-one", "probe", "one off earns half", sees_answer_key=True)]

    def findings(self, task: ToyTask) -> list[Finding]:
        if task.broken:
            return [Finding(kind="toy_broken", blocking=True, detail=f"task {task.idx} is broken by config")]
        return []
