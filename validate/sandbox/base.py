"""The sandbox interface: one small class per backend.

A backend turns a `RunRequest` (argv, mounts, environment, limits) into an `ExecResult`.
A failed command is not a failed sandbox: the agent's non-zero exit, OOM kill or timeout
come back as data; a sandbox that cannot start or dies under the agent raises
`SandboxError` (an infrastructure fault, which the runner retries).
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict, Field


class Mount(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: Path
    target: str
    read_only: bool = True


class Limits(BaseModel):
    """Resource limits of one attempt. Units in the names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_mb: int = Field(default=512, ge=16)
    cpus: float = Field(default=1.0, gt=0)
    pids: int = Field(default=64, ge=4)
    timeout_s: float = Field(default=60.0, gt=0)
    tmpfs_mb: int = Field(default=64, ge=1)
    #: Largest file the agent may write (RLIMIT_FSIZE): bounds a disk filler or a huge reply.
    max_file_mb: int = Field(default=64, ge=1)
    #: Bytes of stdout / stderr kept for the evidence; the rest is drained and dropped.
    max_log_bytes: int = Field(default=4096, ge=0)


class RunRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    argv: tuple[str, ...]
    mounts: tuple[Mount, ...] = ()
    env: dict[str, str] = {}
    workdir: str = "/workspace"
    limits: Limits = Limits()
    #: A label for the sandbox instance (container name suffix, cgroup name); unique per run.
    name: str


class ExecResult(BaseModel):
    """What happened to the agent. `exit_code` is None when it was killed by us."""

    exit_code: int | None
    timed_out: bool = False
    oom_killed: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    runtime_s: float


class BackendFacts(BaseModel):
    """What a backend reports of itself; the contract's execution profile is checked against it."""

    backend: str
    image: str
    image_digest: str
    architecture: str
    version: str


class Sandbox(ABC):
    #: Registry name of the backend.
    backend: str
    #: True when the backend runs agents with no network (tasks with network_allow=[] need it).
    isolates_network: bool

    @abstractmethod
    def facts(self) -> BackendFacts:
        """Probe the backend and its image; raise `ProfileUnavailable` if it cannot run."""

    @abstractmethod
    def run(self, request: RunRequest) -> ExecResult:
        """Run one agent in a fresh sandbox; raise `SandboxError` on an infrastructure fault."""

    def close(self) -> None:  # noqa: B027 - a backend with nothing to clean up keeps this default
        """Stop and remove everything still running. Safe to call twice."""


def drain(stream: IO[bytes], keep: int, out: list[bytes]) -> threading.Thread:
    """Read `stream` to EOF in a thread, keeping the first `keep` bytes in `out[0]`."""

    def work() -> None:
        kept = bytearray()
        for chunk in iter(lambda: stream.read(65536), b""):
            if len(kept) < keep:
                kept += chunk[: keep - len(kept)]
        out.append(bytes(kept))
        stream.close()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t


def wait_exit(proc: subprocess.Popen, timeout_s: float) -> bool:
    """True when `proc` exits within `timeout_s`. A pidfd wakes us at the exit itself;
    `Popen.wait(timeout=)` would poll with sleeps growing to 50 ms."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)
