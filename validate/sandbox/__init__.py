"""Sandbox backends, loaded lazily by name: the runner never imports a concrete backend."""

from __future__ import annotations

import importlib

from validate.errors import ProfileUnavailable
from validate.sandbox import storage
from validate.sandbox.base import BackendFacts, ExecResult, Limits, Mount, RunRequest, Sandbox

BACKENDS: dict[str, str] = {
    "docker": "validate.sandbox.docker:DockerSandbox",
    "bwrap": "validate.sandbox.bwrap:BwrapSandbox",
    "subprocess": "validate.sandbox.subprocess:SubprocessSandbox",
}


def open_sandbox(backend: str, *, image: str, run_label: str = "adhoc") -> Sandbox:
    """Instantiate a backend by its registry name, then sweep the attempt storage a killed
    earlier process of run `run_label` left (after the backend has swept its own leftovers,
    the processes that could still hold that storage)."""
    if backend not in BACKENDS:
        raise ProfileUnavailable(f"execution.backend: unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[backend].split(":")
    sandbox = getattr(importlib.import_module(module), cls)(image=image, run_label=run_label)
    try:
        storage.sweep(storage.DEFAULT_PARENT, run_label)
    except PermissionError:
        pass  # not root: this process could not have mounted attempt storage either
    return sandbox


__all__ = ["BACKENDS", "BackendFacts", "ExecResult", "Limits", "Mount", "RunRequest", "Sandbox", "open_sandbox"]
