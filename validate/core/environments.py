"""Environments by name: the ``validate.environments`` entry-point group of every installed
distribution, plus those registered at run time (`register`), through the harness's one
loader (`validate.core.registry`).

An entry point's object is an `environment.protocol.Environment` subclass; it is
instantiated once, with no arguments. Which environment ``validate freeze`` uses when
``--env`` is not given is the entry point ``environment`` of the ``validate.defaults``
group, so the harness itself names none.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from environment.protocol import Environment
from validate.core.errors import ContractError
from validate.core.registry import Registry

GROUP = "validate.environments"
REGISTRY: Registry[Environment] = Registry(GROUP, base=Environment, key="name", field="environment.name",
                                           kind="environment", error=ContractError)


def register(cls: type[Environment]) -> type[Environment]:
    """Make `cls` available under ``cls.name`` in this process (usable as a decorator)."""
    REGISTRY.register(cls)
    _instance.cache_clear()
    return cls


def names() -> list[str]:
    return REGISTRY.names()


def default_name() -> str | None:
    for ep in entry_points(group="validate.defaults"):
        if ep.name == "environment":
            return str(ep.load())
    return None


@cache
def _instance(name: str) -> Environment:
    return REGISTRY.load(name)()


def get(name: str) -> Environment:
    """The environment registered under `name`; `ContractError` naming the installed ones."""
    return _instance(name)
