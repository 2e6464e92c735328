"""Environments by name: the ``validate.environments`` entry-point group of every installed
distribution, plus those registered at run time (`register`).

An entry point's object is an `environment.protocol.Environment` subclass; it is
instantiated once, with no arguments. Which environment ``validate freeze`` uses when
``--env`` is not given is the entry point ``environment`` of the ``validate.defaults``
group, so the harness itself names none.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from environment.protocol import Environment
from validate.errors import ContractError

GROUP = "validate.environments"
_registered: dict[str, type[Environment]] = {}


def register(cls: type[Environment]) -> type[Environment]:
    """Make `cls` available under ``cls.name`` in this process (usable as a decorator)."""
    _registered[cls.name] = cls
    _instance.cache_clear()
    return cls


def _entry_points() -> dict[str, object]:
    return {ep.name: ep for ep in sorted(entry_points(group=GROUP), key=lambda ep: ep.name)}


def names() -> list[str]:
    return sorted({*_entry_points(), *_registered})


def default_name() -> str | None:
    for ep in entry_points(group="validate.defaults"):
        if ep.name == "environment":
            return str(ep.load())
    return None


@cache
def _instance(name: str) -> Environment:
    if name in _registered:
        cls = _registered[name]
    else:
        ep = _entry_points().get(name)
        if ep is None:
            known = ", ".join(names()) or "none (is the project installed? pip install -e .)"
            raise ContractError(f"environment.name: no environment named {name!r}; installed: {known}")
        try:
            cls = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken third-party package is reported, not a crash
            raise ContractError(f"environment.name: the package registering {name!r} ({ep.value}) does not "
                                f"import: {type(e).__name__}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Environment)) or cls.name != name:
        raise ContractError(f"environment.name: {name!r} is registered to {cls!r}, which is not an Environment "
                            f"subclass named {name!r}")
    return cls()


def get(name: str) -> Environment:
    """The environment registered under `name`; `ContractError` naming the installed ones."""
    return _instance(name)
