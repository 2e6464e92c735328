"""The bwrap backend: one class (`BwrapSandbox`, in `backend`) for one-shot runs and live
sessions; `launch` holds the bwrap command line and the handle on a running bwrap, `server`
the command server a session's sandbox runs."""

from validate.sandbox.bwrap.backend import BwrapSandbox

__all__ = ["BwrapSandbox"]
