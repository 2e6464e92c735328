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
