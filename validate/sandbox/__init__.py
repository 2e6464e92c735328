"""Sandbox backends, loaded lazily by name: the runner never imports a concrete backend."""

from __future__ import annotations

import importlib

from validate.errors import ProfileUnavailable
from validate.sandbox.base import BackendFacts, ExecResult, Limits, Mount, RunRequest, Sandbox

BACKENDS: dict[str, str] = {
    "docker": "validate.sandbox.docker:DockerSandbox",
    "bwrap": "validate.sandbox.bwrap:BwrapSandbox",
    "subprocess": "validate.sandbox.subprocess:SubprocessSandbox",
}


def open_sandbox(backend: str, *, image: str, run_label: str = "adhoc") -> Sandbox:
    """Instantiate a backend by its registry name."""
    if backend not in BACKENDS:
        raise ProfileUnavailable(f"execution.backend: unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[backend].split(":")
    return getattr(importlib.import_module(module), cls)(image=image, run_label=run_label)


__all__ = ["BACKENDS", "BackendFacts", "ExecResult", "Limits", "Mount", "RunRequest", "Sandbox", "open_sandbox"]
