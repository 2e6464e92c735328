"""Sandbox backends by name: the ``validate.backends`` entry-point group of every installed
distribution (this project registers docker, docker-gvisor, podman, bwrap and subprocess in
pyproject.toml), loaded
lazily through the harness's one loader (`validate.core.registry`): the runner, the contract and
the image build never import a concrete backend, and a backend that lives elsewhere (a test's,
a third party's) is one class plus one entry point."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from validate.core.errors import ProfileUnavailable
from validate.core.registry import Registry
from validate.sandbox import storage
from validate.sandbox.base import BackendFacts, Capabilities, ExecResult, Limits, Mount, RunRequest, Sandbox

GROUP = "validate.backends"
BACKENDS: Registry[Sandbox] = Registry(GROUP, base=Sandbox, key="backend", field="execution.backend",
                                       kind="backend", error=ProfileUnavailable)


def backend_names() -> list[str]:
    """The installed backends' names, sorted (nothing is imported)."""
    return BACKENDS.names()


def backend_class(name: str) -> type[Sandbox]:
    """The backend registered under `name`; `ProfileUnavailable` naming the installed ones."""
    return BACKENDS.load(name)


def _installed(name: str) -> str:
    # A ValueError, so that pydantic reports it at the field (`execution.backend: ...`).
    if name not in BACKENDS.names():
        raise ValueError(BACKENDS.unknown(name))
    return name


#: A backend's name in a contract: any string, checked against the registry when read.
BackendName = Annotated[str, AfterValidator(_installed)]


def open_sandbox(backend: str, *, image: str, run_label: str = "adhoc") -> Sandbox:
    """Instantiate a backend by its registry name, then sweep the attempt storage a killed
    earlier process of run `run_label` left (after the backend has swept its own leftovers,
    the processes that could still hold that storage)."""
    sandbox = backend_class(backend)(image=image, run_label=run_label)
    try:
        storage.sweep(storage.DEFAULT_PARENT, run_label)
    except PermissionError:
        pass  # not root: this process could not have mounted attempt storage either
    return sandbox


def capabilities_of(backend: str) -> Capabilities:
    """What the backend registered under `backend` offers task directories (its class's
    declaration; nothing instantiated)."""
    return backend_class(backend).capabilities


__all__ = ["BACKENDS", "BackendFacts", "BackendName", "Capabilities", "capabilities_of", "ExecResult",
           "Limits", "Mount", "RunRequest", "Sandbox", "backend_class", "backend_names", "open_sandbox"]
