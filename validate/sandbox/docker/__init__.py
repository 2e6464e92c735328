"""The docker backend: one class (`DockerSandbox`, in `backend`) for one-shot runs and live
sessions; `wire` holds what it says to the daemon, `image` its side of the sandbox image."""

from validate.sandbox.docker.backend import DockerSandbox
from validate.sandbox.docker.wire import LABEL, demux_log, unreachable

__all__ = ["LABEL", "DockerSandbox", "demux_log", "unreachable"]
