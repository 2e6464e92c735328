"""The trial's own network signal: a resolver sidecar that logs every name a phase looks up,
and the rule that turns those lookups into ``unsupported_execution_contract``.

Why a sidecar: a task container has no network (``network_mode=none``); a verifier that
downloads its checker fails with some message of its own, which the harness must never
trust. So per trial the harness starts one container of its own (`Resolver`, from the
contract's sandbox image, PID 1 the standard-library responder `validate.taskdir.trial.dnslog`),
with no network either and ``nameserver 127.0.0.1`` in its resolv.conf; the agent's and
the verifier's containers join its network namespace (`mode`): they still have only
``lo`` and no route out, and every name they ask DNS for reaches the responder, which
answers NXDOMAIN and writes the name to its stdout. The harness reads that stream with
docker's log API (`lookups`): a process in a task container can ask names, and cannot write
anything else into it.

One sidecar serves both phases (a second one for the verifier would cost another
container start, about what the agent's costs; an exec at the boundary, a Python start).
At the boundary (`boundary`), with the agent's container dead, the harness signals the
responder (``SIGUSR1``: nothing in a task container can signal it), which serves every
question already waiting, rewrites ``/etc/resolv.conf`` and ``/etc/hosts`` in place —
docker bind-mounts the sidecar's own files into every container that joins it, so an agent
running as root could have pointed them elsewhere — and writes a mark
(`validate.taskdir.trial.dnslog`): the log splits into the agent's lookups and the verifier's.

The rule (`offline_reason`): only the oracle's trial is classified. A reference solution
whose trial gets no pass and that looked names up (in ``solve.sh`` or in ``test.sh``) needs a
network this profile does not have: the attempt is ``unsupported_execution_contract`` naming
the hosts. A control's or a model's lookups are recorded and change nothing: in a shared
verifier the verifier runs the agent's binaries and imports, so an agent could make the
verifier ask a name; were that an exclusion, an agent could turn its failure into one.
Declaring ``network_mode = "public"`` is no signal at all.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from pydantic import BaseModel, Field

from validate.taskdir.trial import docker as dk

PROGRAM = (Path(__file__).resolve().parent / "dnslog.py").read_text()
#: Bytes of the sidecar's log read at most (the responder caps its own lines per phase).
MAX_LOG_BYTES = 256 * 1024
READY_S = 20.0
class Lookups(BaseModel):
    """The names each phase asked DNS for, from the harness's resolver (sorted, distinct)."""

    agent: list[str] = Field(default_factory=list)
    verifier: list[str] = Field(default_factory=list)
    #: Questions past the responder's per-phase cap (not named).
    overflow: int = 0
    #: Why the log could not be read whole (None: it was).
    problem: str | None = None

    def any(self) -> bool:
        return bool(self.agent or self.verifier or self.overflow)


class Resolver:
    """The trial's resolver sidecar: created at once (so `mode` can name it in the agent's
    container's creation), started on a thread while the agent's container is being made
    (`started` joins it); measured here, that hides most of the start's cost."""

    def __init__(self, res: dk.Resources, image: str) -> None:
        self.res, self.error = res, None
        api = res.api
        try:
            host = api.create_host_config(
                network_mode="none", dns=["127.0.0.1"], mem_limit="64m", memswap_limit="64m", pids_limit=16,
                nano_cpus=int(0.5e9), cap_drop=["ALL"], security_opt=["no-new-privileges"],
                # binding port 53, and at a boundary rewriting files an agent may have chowned
                cap_add=["NET_BIND_SERVICE", "CHOWN", "DAC_OVERRIDE", "FOWNER"])
            self.id = api.create_container(image, entrypoint=["python3", "-I", "-u", "-c", PROGRAM],
                                           command=[], name=f"dv-{res.trial}-resolver", labels=res.labels(),
                                           user="0", working_dir="/", host_config=host)["Id"]
        except dk.DOCKER_ERRORS as e:
            raise dk.fault(f"create the resolver from {image[:19]}", e) from None
        res.containers.append(self.id)
        self._thread = threading.Thread(target=self._start, name=f"resolver-{res.trial}", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self.res.api.start(self.id)
        except dk.DOCKER_ERRORS as e:
            self.error = dk.fault("start the resolver", e)

    def started(self) -> None:
        """Until the sidecar runs (a `DockerFault` if docker refused)."""
        self._thread.join(timeout=120)
        if self._thread.is_alive():
            raise dk.DockerFault("docker: the resolver did not start in 120 s")
        if self.error is not None:
            raise self.error


def mode(sid: str) -> str:
    """The network mode of a task container that joins the resolver's namespace."""
    return f"container:{sid}"


def wait_ready(res: dk.Resources, sid: str, timeout_s: float = READY_S) -> None:
    """Until the responder listens (its first line), so no early question goes unlogged."""
    deadline = time.monotonic() + timeout_s
    while b'"ready"' not in dk.call("read the resolver's log", res.api.logs, sid, stdout=True, stderr=False):
        state = dk.call("inspect the resolver", res.api.inspect_container, sid)["State"]
        if not state.get("Running") or time.monotonic() > deadline:
            tail = res.api.logs(sid, stdout=False, stderr=True, tail=5).decode("utf-8", "replace")
            raise dk.DockerFault(f"docker: the resolver did not start ({tail.strip()[-300:] or 'no output'})")
        time.sleep(0.02)


def boundary(res: dk.Resources, sid: str, timeout_s: float = READY_S) -> int:
    """End the agent's phase in the resolver's log (see the module docstring); the mark."""
    dk.call("signal the resolver", res.api.kill, sid, signal="SIGUSR1")
    deadline = time.monotonic() + timeout_s
    while b'{"mark": 1}' not in dk.call("read the resolver's log", res.api.logs, sid, stdout=True,
                                        stderr=False):
        if time.monotonic() > deadline:
            raise dk.DockerFault("docker: the resolver did not mark the end of the agent's phase")
        time.sleep(0.01)
    return 1


def lookups(res: dk.Resources, sid: str, mark: int | None) -> Lookups:
    """The names asked before `mark` (the agent's) and after it (the verifier's); all are the
    agent's when the trial ended before its boundary (`mark` None)."""
    try:
        raw = res.api.logs(sid, stdout=True, stderr=False)
    except dk.DOCKER_ERRORS as e:
        return Lookups(problem=f"the resolver's log could not be read: {type(e).__name__}")
    found = Lookups(problem="the resolver's log was cut" if len(raw) > MAX_LOG_BYTES else None)
    phase = found.agent
    for line in raw[:MAX_LOG_BYTES].decode("utf-8", "replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if mark is not None and entry.get("mark") == mark:
            phase = found.verifier
        elif isinstance(entry.get("name"), str) and entry["name"] not in phase:
            phase.append(entry["name"][:300])
        elif isinstance(entry.get("overflow"), int):
            found.overflow += entry["overflow"]
    found.agent.sort()
    found.verifier.sort()
    return found


def offline_reason(found: Lookups | None, is_reference: bool, passed: bool) -> str | None:
    """Why the attempt is ``unsupported_execution_contract`` (a reference solution's trial
    that got no pass and looked names up), or None. See the module docstring."""
    if found is None or not is_reference or passed or not found.any():
        return None
    parts = []
    if found.verifier:
        parts.append(f"the verifier looked up {_names(found.verifier)}")
    if found.agent:
        parts.append(f"the reference solution looked up {_names(found.agent)}")
    if not parts:
        parts.append(f"the trial asked {found.overflow} names")
    return "; ".join(parts) + " (no network on this profile)"


def describe(found: Lookups | None) -> str:
    """One line of evidence for a row (empty when nothing was looked up)."""
    if found is None or not (found.any() or found.problem):
        return ""
    bits = [f"agent phase: {_names(found.agent)}" if found.agent else "",
            f"verifier phase: {_names(found.verifier)}" if found.verifier else "",
            f"{found.overflow} more not named" if found.overflow else "", found.problem or ""]
    return "[names looked up through the harness's resolver: " + "; ".join(b for b in bits if b) + "]"


def _names(names: list[str], most: int = 10) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
