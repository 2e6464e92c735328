"""The bwrap backend's cgroups: one group per attempt with its limits, on cgroup v1 or v2.

One interface, `Cgroups`, keyed by the attempt's name (``<run label>-<request name>``):
`create` a group with the attempt's limits (returning the groups its first process joins by
writing its pid to each one's ``cgroup.procs``), `release` the launch's own processes from
the limited group once the sandbox exists, read whether the OOM killer fired, list and
kill the group's processes, remove it, and `sweep` what a killed earlier run left.
`open_cgroups` picks the implementation the machine has (`detect`):

- **v2** when the hierarchy's root is itself cgroup2 (it has ``cgroup.controllers``), as on
  stock Debian 12 and Ubuntu. Two levels per attempt, so that no group both holds
  processes and gives its children controllers (v2's "no internal processes" rule)::

      <root>/                          the harness lives wherever it was started, never below
        deshuffle-validate/            subtree_control +memory +pids +cpu; holds no process
          <run label>-<attempt>/       subtree_control +memory +pids +cpu; holds no process
            agent/                     memory.max, memory.swap.max 0, pids.max, cpu.max: the
                                       launching shell joins it, the sandbox lives in it
            launch/                    no limits: the shell and bwrap's monitor, moved here
                                       once the sandbox exists (`release`)

  The OOM killer is read from ``agent/memory.events`` (``oom_kill``); a kill writes
  ``cgroup.kill`` of the attempt's group (Linux ≥ 5.14), else SIGKILLs each pid it holds.
  The parent sits at the root like v1's and like docker's cgroupfs driver's ``docker/``;
  enabling the controllers in the root's ``subtree_control`` is allowed while the root holds
  processes, not so in a container whose cgroup namespace root holds them (the error says so).
- **v1** otherwise, *including a hybrid host* (systemd's v1 controllers plus an empty
  unified mount at ``/sys/fs/cgroup/unified``, like the machine this was written on): a
  controller is bound to one hierarchy only, and there memory, pids and cpu are bound to
  their v1 mounts, so the unified hierarchy could hold groups but limit nothing. One group
  per controller, ``<root>/<controller>/deshuffle-validate/<attempt>``; release moves the
  launch into the parent's memory and pids groups (it stays in the attempt's cpu group);
  OOM from ``memory.oom_control``.

What was verified, and where (tests/test_cgroups.py). v1, on a real hybrid v1 host: the
limits as written before this module existed, an OOM by a real memory bomb, the pids cap,
cpu throttling, release, kill, sweep. v2, on the test's own cgroup2 mount of such a host,
which offers none of memory, pids, cpu (v1 holds them): detection, the refusal naming the
missing controllers, the layout, joining by a real shell, release into ``launch/``, no
process in the parent or the attempt's group, ``cgroup.kill`` and the pid-by-pid kill of
real process trees, removal, the sweep of one run label, and bwrap's launch chain through
those groups. v2 with its controllers, in a VM booting Debian 12's kernel (6.1) with a
pure cgroup2 hierarchy and no systemd (tests/cgroup2_vm.py): the controllers enabled at
the root, the parent and the attempt, the limits read back, the OOM of a memory bomb read
from ``memory.events``, pids.max stopping forks, cpu.max throttling, kills and sweeps, an
OOM through bwrap's whole chain, and v2 in both backends' facts; once, by hand, the refusal
of a cgroup namespace whose root holds a process. Not verified: a host
whose hierarchy systemd manages (that it leaves a foreign top-level group and the
controllers it needs alone, which docker's cgroupfs driver relies on too).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

from validate.core.errors import ProfileUnavailable, SandboxError
from validate.sandbox.base import Limits

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The one group (per controller on v1) under which every attempt's group lives.
PARENT = "deshuffle-validate"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100000
#: How long a kill or a removal waits for a group's processes to be gone: a pid namespace
#: tears down in a few ms, so it polls every millisecond.
_POLLS, _POLL_S = 2000, 0.001


def detect(root: Path = CGROUP_ROOT) -> str:
    """'v2' when `root` is a cgroup2 mount, else 'v1' (a hybrid host is v1: see the module)."""
    return "v2" if (root / "cgroup.controllers").is_file() else "v1"


def open_cgroups(root: Path = CGROUP_ROOT) -> Cgroups:
    """The implementation for the hierarchy at `root`; `Cgroups.check` says whether it is usable."""
    return V2Cgroups(root) if detect(root) == "v2" else V1Cgroups(root)


def read_counters(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, memory.oom_control, cgroup.events) as a dict;
    lines that are not one name and one integer are skipped."""
    counters: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            counters[parts[0]] = int(parts[1])
    return counters


def _groups_of_pid(pid: int | None) -> list[tuple[str, str]]:
    """(controllers, path) of each line of ``/proc/<pid>/cgroup``; none when unreadable."""
    if not pid:
        return []
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return []
    fields = (line.split(":", 2) + ["", ""] for line in lines)
    return [(f[1], f[2]) for f in fields]


def oom_kills_of_pid(pid: int | None, root: Path = CGROUP_ROOT) -> int | None:
    """The ``oom_kill`` counter of the memory cgroup process `pid` is in (a docker container's
    PID 1: the container's group), from ``memory.events`` on v2 or ``memory.oom_control`` on
    v1; None when unreadable (no such process, no memory controller)."""
    v2 = detect(root) == "v2"
    for controllers, path in _groups_of_pid(pid):
        if v2 and controllers == "":
            return _counter(root / path.lstrip("/") / "memory.events", "oom_kill")
        if not v2 and "memory" in controllers.split(","):
            return _counter(root / "memory" / path.lstrip("/") / "memory.oom_control", "oom_kill")
    return None


def group_of_pid(pid: int | None, root: Path = CGROUP_ROOT) -> Path | None:
    """The group process `pid` is in whose ``cgroup.procs`` lists every process of it (a
    docker container's PID 1: the container's group): the unified group on v2, the pids
    controller's on v1; None when unreadable (no such process, no pids hierarchy)."""
    v2 = detect(root) == "v2"
    for controllers, path in _groups_of_pid(pid):
        if (v2 and controllers == "") or (not v2 and "pids" in controllers.split(",")):
            group = (root if v2 else root / "pids") / path.lstrip("/")
            return group if (group / "cgroup.procs").is_file() else None
    return None


def procs_of(group: Path) -> list[int]:
    """The pids `group` holds now (sorted; empty when it is gone)."""
    return sorted(_procs(group))


class Cgroups(ABC):
    """The attempts' groups on one hierarchy; every method takes the attempt's name."""

    #: "v1" or "v2", as the execution profile records it.
    version: Literal["v1", "v2"]

    def __init__(self, root: Path = CGROUP_ROOT, parent: str = PARENT) -> None:
        self.root = root
        self.parent = parent

    @abstractmethod
    def check(self) -> None:
        """Raise `ProfileUnavailable` (saying what is missing and the fix) if no limits can be set."""

    @abstractmethod
    def create(self, name: str, limits: Limits) -> list[Path]:
        """Make the attempt's group with `limits`; return the groups its first process joins.
        `SandboxError` (nothing left behind) if the kernel refuses."""

    @abstractmethod
    def release(self, name: str, pids: Iterable[int]) -> None:
        """Move the launch's own processes (bwrap's monitor, the shell) out of the limited
        group, so that an agent's OOM cannot take them. `ProcessLookupError` if one is gone."""

    @abstractmethod
    def oom_kills(self, name: str) -> int | None:
        """How many processes of the attempt the kernel's OOM killer has killed so far (None:
        unreadable, e.g. no memory controller); a session compares it before and after a command."""

    def oom_killed(self, name: str) -> bool:
        """Whether the kernel's OOM killer killed a process of the attempt."""
        return (self.oom_kills(name) or 0) > 0

    @abstractmethod
    def pids(self, name: str) -> list[int]:
        """The processes in the attempt's limited group (the sandbox's, after `release`)."""

    @abstractmethod
    def kill(self, name: str) -> None:
        """SIGKILL every process of the attempt's group and wait (≤ 2 s) until none is left."""

    @abstractmethod
    def remove(self, name: str) -> None:
        """Remove the attempt's group (waiting ≤ 2 s for dying processes); absent is fine."""

    @abstractmethod
    def names(self, run_label: str) -> list[str]:
        """The attempts of `run_label` that have a group, sorted."""

    def sweep(self, run_label: str) -> None:
        """Kill and remove the groups a killed earlier process of `run_label` left."""
        for name in self.names(run_label):
            self.kill(name)
            self.remove(name)


class V1Cgroups(Cgroups):
    """One group per controller, ``<root>/<controller>/<parent>/<name>``."""

    version = "v1"

    def _dirs(self, name: str) -> list[Path]:
        return [self.root / c / self.parent / name for c in CONTROLLERS]

    def check(self) -> None:
        missing = [c for c in CONTROLLERS if not (self.root / c / "cgroup.procs").exists()]
        if missing:
            raise ProfileUnavailable(
                f"backend bwrap: neither cgroup v2 ({self.root}/cgroup.controllers) nor the cgroup v1 "
                f"controllers {', '.join(missing)} are mounted under {self.root}; mount a cgroup2 hierarchy "
                f"there (the default of systemd ≥ 247) or each v1 controller at {self.root}/<controller>")

    def create(self, name: str, limits: Limits) -> list[Path]:
        dirs = self._dirs(name)
        try:
            for d in dirs:
                d.mkdir(parents=True, exist_ok=True)
            mem, pids, cpu = dirs
            limit = str(limits.memory_mb * 1024 * 1024)
            (mem / "memory.limit_in_bytes").write_text(limit)
            if (mem / "memory.memsw.limit_in_bytes").exists():
                (mem / "memory.memsw.limit_in_bytes").write_text(limit)
            (mem / "memory.swappiness").write_text("0")
            (pids / "pids.max").write_text(str(limits.pids))
            (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (cpu / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * CPU_PERIOD_US)))
        except OSError as e:
            self.remove(name)
            raise SandboxError(f"bwrap: cannot set up cgroup {name}: {e}") from None
        return dirs

    def release(self, name: str, pids: Iterable[int]) -> None:
        pids = list(pids)
        for controller in ("memory", "pids"):
            for pid in pids:
                (self.root / controller / self.parent / "cgroup.procs").write_text(str(pid))

    def oom_kills(self, name: str) -> int | None:
        return _counter(self._dirs(name)[0] / "memory.oom_control", "oom_kill")

    def pids(self, name: str) -> list[int]:
        return _procs(self._dirs(name)[1])

    def kill(self, name: str) -> None:
        _kill_each(lambda: _procs(self._dirs(name)[1]))

    def remove(self, name: str) -> None:
        for d in self._dirs(name):
            _rmdir(d)

    def names(self, run_label: str) -> list[str]:
        return sorted(p.name for p in (self.root / "pids" / self.parent).glob(f"{run_label}-*") if p.is_dir())


class V2Cgroups(Cgroups):
    """The unified hierarchy: ``<root>/<parent>/<name>/{agent,launch}`` (see the module).

    `controllers` are the ones enabled and limited: the harness always uses all three; a
    smaller set serves a hierarchy where they are bound elsewhere (a v1 host's own cgroup2
    mount, in the tests), where groups, joining, kills and removal work the same.
    """

    version = "v2"
    AGENT, LAUNCH = "agent", "launch"
    #: The one-write kill of a whole subtree (Linux ≥ 5.14); without it each pid is killed.
    KILL_FILE = "cgroup.kill"

    def __init__(self, root: Path = CGROUP_ROOT, parent: str = PARENT,
                 controllers: tuple[str, ...] = CONTROLLERS) -> None:
        super().__init__(root, parent)
        self.controllers = controllers
        # Whether the root and the parent have the controllers enabled: once per instance.
        # `check` (from the backend's facts, before any production run) does it; `create`
        # does it only when nothing did, as for a backend used without its facts.
        self._enabled = False

    def _node(self, name: str) -> Path:
        return self.root / self.parent / name

    def check(self) -> None:
        offered = (self.root / "cgroup.controllers").read_text().split()
        missing = [c for c in self.controllers if c not in offered]
        if missing:
            raise ProfileUnavailable(
                f"backend bwrap: the cgroup v2 hierarchy at {self.root} does not offer {', '.join(missing)} "
                f"(it offers: {' '.join(offered) or 'nothing'}); a controller still bound to a cgroup v1 "
                f"mount is not available in v2: boot with cgroup v2 only (systemd.unified_cgroup_hierarchy=1)"
            )
        try:
            self._enable_parent()
        except OSError as e:
            raise ProfileUnavailable(self._enable_error(e)) from None
        self._enabled = True

    def _enable_parent(self) -> None:
        """Enable the controllers at the root (for the parent) and in the parent (for the attempts)."""
        parent = self.root / self.parent
        _enable(self.root, self.controllers)
        if not parent.is_dir():
            parent.mkdir(exist_ok=True)
        _enable(parent, self.controllers)

    def _enable_error(self, e: OSError) -> str:
        if e.errno == errno.EBUSY:  # the group holds processes, so its children get no controllers
            return (f"backend bwrap: cannot enable {' '.join(self.controllers)} for "
                    f"{self.root / self.parent} ({e.strerror}): the hierarchy's root holds processes and is "
                    "not the machine's root (a container's cgroup namespace?); move them into a child group "
                    "first, as docker-in-docker's entrypoint does, or run the harness on the host")
        return f"backend bwrap: cannot enable {' '.join(self.controllers)} for {self.root / self.parent}: {e}"

    def create(self, name: str, limits: Limits) -> list[Path]:
        node = self._node(name)
        agent = node / self.AGENT
        try:
            if not self._enabled:
                self._enable_parent()
                self._enabled = True
            node.mkdir()
            _enable(node, self.controllers)
            agent.mkdir()
            (node / self.LAUNCH).mkdir()
            for file, value in self._limit_files(limits):
                # memory.swap.max exists only with swap accounting (as v1's memory.memsw.*):
                # without it the kernel offers no way to forbid swap.
                if file != "memory.swap.max" or (agent / file).exists():
                    (agent / file).write_text(value)
        except OSError as e:
            self.remove(name)
            raise SandboxError(f"bwrap: cannot set up cgroup {name}: {e}") from None
        return [agent]

    def _limit_files(self, limits: Limits) -> list[tuple[str, str]]:
        files = {"memory": [("memory.max", str(limits.memory_mb * 1024 * 1024)), ("memory.swap.max", "0")],
                 "pids": [("pids.max", str(limits.pids))],
                 "cpu": [("cpu.max", f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")]}
        return [fv for c in self.controllers for fv in files[c]]

    def release(self, name: str, pids: Iterable[int]) -> None:
        procs = self._node(name) / self.LAUNCH / "cgroup.procs"
        for pid in pids:
            procs.write_text(str(pid))

    def oom_kills(self, name: str) -> int | None:
        return _counter(self._node(name) / self.AGENT / "memory.events", "oom_kill")

    def pids(self, name: str) -> list[int]:
        return _procs(self._node(name) / self.AGENT)

    def kill(self, name: str) -> None:
        node = self._node(name)
        groups = [node / self.AGENT, node / self.LAUNCH, node]
        if (node / self.KILL_FILE).exists():
            # One write kills the whole subtree, forks racing it included; then wait for the exits.
            try:
                (node / self.KILL_FILE).write_text("1")
            except FileNotFoundError:
                return
            _wait_empty(lambda: [p for g in groups for p in _procs(g)])
        else:
            _kill_each(lambda: [p for g in groups for p in _procs(g)])

    def remove(self, name: str) -> None:
        node = self._node(name)
        for d in (node / self.AGENT, node / self.LAUNCH, node):
            _rmdir(d)

    def names(self, run_label: str) -> list[str]:
        return sorted(p.name for p in (self.root / self.parent).glob(f"{run_label}-*") if p.is_dir())


def _enable(group: Path, controllers: tuple[str, ...]) -> None:
    """Add `controllers` to `group`'s subtree_control, writing only those not yet there."""
    if not controllers:
        return
    enabled = (group / "cgroup.subtree_control").read_text().split()
    wanted = [c for c in controllers if c not in enabled]
    if wanted:
        (group / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))


def _counter(file: Path, key: str) -> int | None:
    try:
        return read_counters(file.read_text()).get(key)
    except OSError:
        return None


def _procs(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_each(list_pids: Callable[[], list[int]]) -> None:
    for _ in range(_POLLS):
        pids = list_pids()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(_POLL_S)


def _wait_empty(list_pids: Callable[[], list[int]]) -> None:
    for _ in range(_POLLS):
        if not list_pids():
            return
        time.sleep(_POLL_S)


def _rmdir(group: Path) -> None:
    for _ in range(_POLLS):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(_POLL_S)
