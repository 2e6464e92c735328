"""Attempt kinds by name: how one attempt is prepared, played and scored.

The ``validate.attempt_kinds`` entry-point group of every installed distribution, loaded
through `validate.core.registry`. This project registers four: ``program`` (an environment's
agent program runs in a fresh sandbox and its reply is scored on the host,
`validate.kinds.program`), ``trial`` (a task directory's own image, the agent in it, then the
task's verifier, by default in a fresh container of the pristine image with only the agent's
work carried, `validate.kinds.trial`), ``chat`` (a model converses and calls tools in a live
session, `validate.kinds.chat`) and ``task-shell`` (a model's shell in a task directory's
container, then its verifier, `validate.kinds.task_shell`). What they share is
`validate.kinds.base`. An environment names the kind its tasks are played with
(`Environment.attempt_kind`); a kind that plays a model declares whose (``evaluates``).
"""

from __future__ import annotations

from environment.protocol import Environment
from validate.core.errors import ContractError
from validate.core.registry import Registry
from validate.run.context import AttemptKind

# The seam's base is abstract: the registry only checks classes against it (mypy #4717).
KINDS: Registry[AttemptKind] = Registry(
    "validate.attempt_kinds", base=AttemptKind,  # type: ignore[type-abstract]
    key="name", field="environment.attempt_kind", kind="attempt kind", error=ContractError)


def kind_names() -> list[str]:
    """The installed attempt kinds' names, sorted (nothing is imported)."""
    return KINDS.names()


def kind_of(env: Environment) -> AttemptKind:
    """A fresh instance of the kind `env`'s tasks are played with; `ContractError` naming the
    field for a kind nobody registered or one an environment cannot name."""
    cls = KINDS.load(env.attempt_kind)
    if not cls.standalone:
        raise ContractError(f"environment.attempt_kind: {env.name} names {cls.name!r}, which only a command "
                            "that supplies its context plays (e.g. `validate eval`); name a standalone kind "
                            f"({', '.join(n for n in kind_names() if KINDS.load(n).standalone)})")
    return cls()


__all__ = ["KINDS", "AttemptKind", "kind_names", "kind_of"]
