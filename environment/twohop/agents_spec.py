"""The agents twohop-env declares: the oracle and one control per failure, and which
control passes are expected rather than defects.

The programs live in ``agents/`` (package data, not an importable package: they run in the
sandbox under ``python3 -S`` with the harness's ``agentlib.py`` and, where declared, the
support module ``factlib.py`` beside them).

Expected control passes (`control_may_pass`): a binary reward cannot keep every control
under 1.0 on every task, because three controls are right by construction somewhere —

- ``always-unknown`` on the ``broken`` category (5 of 36: ``unknown`` *is* their answer);
- ``plausible-entity`` on every category but ``broken`` (it solves what can be solved and
  only fabricates where the chain breaks; its failure is judged on the 5 broken tasks);
- ``modal-city`` on the tasks whose answer is the city hosting the most organisations
  (the dataset checks keep every answer's share under 1/2; the ``modal_city_control``
  dataset finding names those tasks — at seed 0, one of 36).

Every other control must score 0 on every task.
"""

from __future__ import annotations

from pathlib import Path

from environment.protocol import AgentSpec
from environment.twohop.solver import UNKNOWN

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
FACTLIB = AGENTS_DIR / "factlib.py"


def _spec(name: str, role: str, tests: str, *, support: bool = False, **kw) -> AgentSpec:
    return AgentSpec(name=name, role=role, program=AGENTS_DIR / f"{name.replace('-', '_')}.py",
                     support=(FACTLIB,) if support else (), tests=tests, **kw)


def agent_specs() -> list[AgentSpec]:
    return [
        _spec("oracle", "oracle", "writes the gold rows read from the answer key", sees_answer_key=True),
        _spec("empty", "control", "no reply at all must score 0"),
        _spec("always-unknown", "control", "declining everything: `unknown` must score 0 where the facts "
                                           "determine an answer (it is right on the broken category)"),
        _spec("modal-city", "control", "ignoring the facts: always naming the city that hosts the most "
                                       "organisations must score under 1/2 overall (right only where that "
                                       "city is the answer)", support=True),
        _spec("one-hop", "control", "skipping the first hop: answering from the person's own home city "
                                    "instead of their employer's must score 0", support=True),
        _spec("plausible-entity", "control", "fabricating: naming a plausible entity where the chain breaks "
                                             "must score 0 on the broken category (it solves the rest)",
              support=True),
        _spec("wrong-case", "control", "the right answer in the wrong case must score 0 (the comparison is "
                                       "case-sensitive)", sees_answer_key=True),
        _spec("source-peek", "control", "the environment's whole source plus the agent view's id and meta, "
                                        "without the facts, must not identify the task's answer",
              sees_source=True),
    ]


def control_may_pass(agent: str, gold: tuple[str, ...], modal_city: str) -> str | None:
    """Why ``agent`` passing a task whose answer is ``gold`` is expected, or None."""
    if agent == "always-unknown" and gold == (UNKNOWN,):
        return "the answer is `unknown`: declining is correct here"
    if agent == "plausible-entity" and gold != (UNKNOWN,):
        return "the chain is whole, so this control solves it; it is judged where the chain breaks"
    if agent == "modal-city" and gold == (modal_city,):
        return f"the answer is the modal headquarters city {modal_city}"
    return None
