"""One root exception, one subclass per boundary. Library code raises; only the CLI exits."""

from __future__ import annotations


class ValidateError(Exception):
    """Root of every error the harness reports to a user (the CLI prints it, exit 2)."""


class ContractError(ValidateError):
    """A manifest that cannot be read, or does not match this machine; names the field."""


class ProfileUnavailable(ValidateError):
    """The execution profile's backend, image or limits cannot be provided on this machine."""


class SandboxError(ValidateError):
    """An infrastructure fault: the sandbox could not start, or ended for a harness-side cause
    (the daemon's error or a kill the harness did not send; what the agent's own commands do
    to it is `validate.sandbox.session.SandboxEnded`).

    Retryable. Never raised for the agent's own failure (exit code, timeout, OOM): those
    come back as data in `ExecResult`.
    """


class EvidenceError(ValidateError):
    """The run directory cannot be written, or its files do not check out; names the file."""


class InputError(ValidateError):
    """A file or text from outside the harness (JSON anyone may have written, a path into a run
    directory, a request to the viewer) that is not what it must be; names it."""


class TaskError(ValidateError):
    """A task's own files are wrong, or ask for what this harness does not do: the task's
    fault (or this harness's limit), never the infrastructure's or the agent's."""


class AgentError(ValidateError):
    """What the attempt left is not what the harness can take: a reply that is not a file, or a
    container the harness can no longer vouch for (a process it did not start, PID 1 replaced).
    Recorded in the attempt's row, never retried."""


class DaemonError(ValidateError):
    """A task-directory trial's container engine (its daemon's API, the kernel's namespaces
    under it) failed the harness: an infrastructure fault the trial records as its own. Not a
    `SandboxError`, which an attempt kind records as its sandbox's: one raised before a trial
    starts keeps the row it always had (``harness_error``)."""


class ServiceError(ValidateError):
    """A service the harness calls over the network (a model endpoint, an image registry)
    failed or refused what it was asked; names the service and what it said."""


class ClusterError(ValidateError):
    """A node of the cluster an executor plays on (Ray) failed the attempts it held: lost with
    them, or unable to get the contract's image. An infrastructure fault of that node."""
