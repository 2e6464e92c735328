"""validate.sandbox.cgroups on real hierarchies, with real processes.

Three places: this machine's own hierarchy (whichever version it has: v1 here, limits and
the OOM killer included); the test's own cgroup2 mount (on a v1 host it offers no memory,
pids or cpu: groups, joining, release, kills, removal, sweep and the bwrap backend's
launch chain on v2, without limits); and a virtual machine booting a stock Debian 12 kernel
with a pure cgroup v2 hierarchy (tests/cgroup2_vm.py), in which this very file runs again,
so that the first group of tests exercises v2's limits. Every group made here is under the
project's parent group, with this session's own run label.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import CORPUS_PATH
from validate.core.errors import ProfileUnavailable
from validate.core.paths import DEFAULT_IMAGE, ImagePaths
from validate.sandbox import Limits, RunRequest, cgroups
from validate.sandbox.bwrap import BwrapSandbox
from validate.sandbox.cgroups import (
    CGROUP_ROOT,
    CONTROLLERS,
    PARENT,
    V1Cgroups,
    V2Cgroups,
    detect,
    open_cgroups,
    read_counters,
)

LABEL = f"cgtest-{os.getpid()}"
ROOT = Path(__file__).resolve().parents[1]


def attempt_name() -> str:
    return f"{LABEL}-{uuid.uuid4().hex[:8]}"


def join(groups: list[Path], script: str) -> subprocess.Popen:
    """A real shell that joins `groups` the way bwrap's launching shell does, then runs `script`."""
    return subprocess.Popen(["/bin/sh", "-c",
                             'for g in "$@"; do echo $$ > "$g/cgroup.procs" || exit 97; done; '
                             + script, "sh", *map(str, groups)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.01)
    raise AssertionError("timed out waiting")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "(gone)"


def cgroup_of(pid: int, controller: str) -> str:
    """`pid`'s group in the v1 `controller` hierarchy, or in v2's (controller '')."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller in names.split(",")) if controller else names == "":
            return path
    raise AssertionError(f"no {controller or 'v2'} line in /proc/{pid}/cgroup")


def read_limit(groups: list[Path], file: str) -> str:
    (found,) = [g / file for g in groups if (g / file).exists()]
    return found.read_text().strip()


# --- this machine's own hierarchy ---------------------------------------------------------

@pytest.fixture
def host():
    cg = open_cgroups()
    cg.check()
    yield cg
    cg.sweep(LABEL)
    assert cg.names(LABEL) == []


def test_detect_names_the_hierarchy_mounted_at_the_root():
    mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    mounts = {line.split()[4]: line.split(" - ")[1].split()[0] for line in mountinfo}  # mount point → fs type
    assert detect() == ("v2" if mounts.get(str(CGROUP_ROOT)) == "cgroup2" else "v1")
    assert open_cgroups().version == detect()
    assert isinstance(open_cgroups(), V2Cgroups if detect() == "v2" else V1Cgroups)


def test_the_limits_are_written(host):
    name = attempt_name()
    groups = host.create(name, Limits(memory_mb=96, pids=20, cpus=0.5))
    if host.version == "v1":
        assert [g.parent.parent.name for g in groups] == list(CONTROLLERS)
        assert read_limit(groups, "memory.limit_in_bytes") == str(96 << 20)
        assert read_limit(groups, "memory.swappiness") == "0"
        if (groups[0] / "memory.memsw.limit_in_bytes").exists():
            assert read_limit(groups, "memory.memsw.limit_in_bytes") == str(96 << 20)
        assert (read_limit(groups, "cpu.cfs_period_us"),
                read_limit(groups, "cpu.cfs_quota_us")) == ("100000", "50000")
    else:
        assert groups == [CGROUP_ROOT / PARENT / name / "agent"]
        assert read_limit(groups, "memory.max") == str(96 << 20)
        if (groups[0] / "memory.swap.max").exists():
            assert read_limit(groups, "memory.swap.max") == "0"
        assert read_limit(groups, "cpu.max") == "50000 100000"
        for group in (CGROUP_ROOT, CGROUP_ROOT / PARENT, CGROUP_ROOT / PARENT / name):
            assert set(CONTROLLERS) <= set((group / "cgroup.subtree_control").read_text().split()), group
    assert read_limit(groups, "pids.max") == "20"
    host.remove(name)
    assert not any(g.exists() for g in groups) and host.names(LABEL) == []


def test_a_memory_bomb_is_seen_by_the_oom_killer_and_a_small_program_is_not(host):
    bomb, calm = attempt_name(), attempt_name()
    code = "b = []\nwhile True: b.append(b'x' * (1 << 20))"
    proc = join(host.create(bomb, Limits(memory_mb=48)), f'exec "{sys.executable}" -S -c "{code}"')
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert host.oom_killed(bomb) and host.oom_kills(bomb) >= 1
    quiet = join(host.create(calm, Limits(memory_mb=48)), f'exec "{sys.executable}" -S -c pass')
    assert quiet.wait(timeout=60) == 0 and not host.oom_killed(calm) and host.oom_kills(calm) == 0


def test_the_pids_cap_stops_forks(host):
    name = attempt_name()
    code = ("import os, time\nok = 0\nfor _ in range(20):\n  try: pid = os.fork()\n"
            "  except BlockingIOError: continue\n"
            "  if pid == 0: time.sleep(60); os._exit(0)\n  ok += 1\nprint(ok, flush=True)")
    proc = join(host.create(name, Limits(pids=6)), f'exec "{sys.executable}" -S -c "{code}"')
    # itself and five children: six
    assert proc.stdout.readline().strip() == "5" and proc.wait(timeout=60) == 0
    proc.stdout.close()  # the children hold it open
    assert len(host.pids(name)) == 5
    host.kill(name)
    assert host.pids(name) == []


def test_the_cpu_quota_throttles(host):
    name = attempt_name()
    groups = host.create(name, Limits(cpus=0.1))
    spin = (f'exec "{sys.executable}" -S -c '
            '"import time\nt = time.monotonic() + 0.6\nwhile time.monotonic() < t: pass"')
    assert join(groups, spin).wait(timeout=60) == 0
    assert read_counters((groups[-1] / "cpu.stat").read_text())["nr_throttled"] > 0


def test_release_moves_the_launch_out_of_the_limited_group(host):
    name = attempt_name()
    proc = join(host.create(name, Limits()), "sleep 60 & exec sleep 60")
    child = wait_for(lambda: [p for p in host.pids(name) if p != proc.pid])[0]
    host.release(name, [proc.pid])
    assert host.pids(name) == [child]
    if host.version == "v1":
        assert cgroup_of(proc.pid, "memory") == cgroup_of(proc.pid, "pids") == f"/{PARENT}"
        assert cgroup_of(proc.pid, "cpu") == f"/{PARENT}/{name}"
        proc.kill()
    else:
        assert cgroup_of(proc.pid, "") == f"/{PARENT}/{name}/launch"
    host.kill(name)  # v2: the launch group is the attempt's too
    assert proc.wait(timeout=5) == -signal.SIGKILL and not alive(child)
    with pytest.raises(ProcessLookupError):
        host.release(name, [proc.pid])


# --- shared by both places: kills, sweeps ---------------------------------------------------

def check_kill_and_sweep(cg) -> None:
    """A tree of processes is killed whole; the sweep takes every group of the label and no other."""
    name = attempt_name()
    proc = join(cg.create(name, Limits()), "sleep 60 & (sleep 60 & wait) & exec sleep 60")
    tree = wait_for(lambda: len(cg.pids(name)) >= 4 and cg.pids(name))
    cg.kill(name)
    assert cg.pids(name) == [] and proc.wait(timeout=5) == -signal.SIGKILL
    assert not any(alive(p) for p in tree)
    cg.remove(name)
    assert cg.names(LABEL) == []
    other_label = f"cgtest-other{os.getpid()}"
    other = f"{other_label}-{uuid.uuid4().hex[:8]}"
    left = [join(cg.create(n, Limits()), "sleep 60 & exec sleep 60")
            for n in (attempt_name(), attempt_name())]
    cg.create(other, Limits())
    try:
        wait_for(lambda: sum(len(cg.pids(n)) for n in cg.names(LABEL)) == 4)
        cg.sweep(LABEL)
        assert cg.names(LABEL) == [] and [p.wait(timeout=5) for p in left] == [-signal.SIGKILL] * 2
        assert cg.names(other_label) == [other]
    finally:
        cg.remove(other)


def test_kill_and_sweep_on_this_machine(host):
    check_kill_and_sweep(host)


# --- v2 on the test's own cgroup2 mount ---------------------------------------------------

@pytest.fixture
def v2mount():
    """A cgroup2 mount of our own; its groups are in the machine's one unified hierarchy, so
    only the project's parent group is touched, and only under this session's label."""
    where = Path(tempfile.mkdtemp(prefix="cgroup2-"))
    subprocess.run(["mount", "-t", "cgroup2", "none", str(where)], check=True)
    try:
        yield where
    finally:
        V2Cgroups(where, controllers=()).sweep(LABEL)
        try:
            (where / PARENT).rmdir()  # only when no other session's groups are in it
        except OSError:
            pass
        subprocess.run(["umount", str(where)], check=True)
        where.rmdir()


def test_v2_check_says_which_controllers_the_hierarchy_lacks(v2mount):
    offered = (v2mount / "cgroup.controllers").read_text().split()
    missing = [c for c in CONTROLLERS if c not in offered]
    if missing:  # a v1 host: they are bound to its v1 mounts
        with pytest.raises(ProfileUnavailable, match=f"does not offer {', '.join(missing)}.*cgroup v1 mount"):
            V2Cgroups(v2mount).check()
    else:
        V2Cgroups(v2mount).check()
        assert set(CONTROLLERS) <= set((v2mount / PARENT / "cgroup.subtree_control").read_text().split())
    assert detect(v2mount) == "v2" and isinstance(open_cgroups(v2mount), V2Cgroups)


def test_v2_groups_join_release_and_are_removed(v2mount):
    cg = V2Cgroups(v2mount, controllers=())
    name = attempt_name()
    groups = cg.create(name, Limits())
    assert groups == [v2mount / PARENT / name / "agent"] and (v2mount / PARENT / name / "launch").is_dir()
    proc = join(groups, "sleep 60 & exec sleep 60")
    child = wait_for(lambda: [p for p in cg.pids(name) if p != proc.pid])[0]
    assert cgroup_of(child, "") == f"/{PARENT}/{name}/agent"
    cg.release(name, [proc.pid])
    assert cg.pids(name) == [child] and cgroup_of(proc.pid, "") == f"/{PARENT}/{name}/launch"
    # no internal processes: neither the parent nor the attempt's group holds one
    assert (
        (v2mount / PARENT / "cgroup.procs").read_text()
        == (v2mount / PARENT / name / "cgroup.procs").read_text()
        == ""
    )
    assert cg.oom_kills(name) is None and not cg.oom_killed(name)  # no memory controller: no memory.events
    cg.kill(name)
    assert proc.wait(timeout=5) == -signal.SIGKILL and not alive(child)
    cg.remove(name)
    assert not (v2mount / PARENT / name).exists()


def test_v2_enables_the_parents_controllers_once_not_per_attempt(v2mount, monkeypatch):
    cg = V2Cgroups(v2mount, controllers=())
    calls = []
    real = cg._enable_parent
    monkeypatch.setattr(cg, "_enable_parent", lambda: calls.append(1) or real())
    names = [attempt_name(), attempt_name()]
    for name in names:  # without check() first (a backend used without its facts): the first create
        cg.create(name, Limits())
    assert calls == [1] and all((v2mount / PARENT / n / "agent").is_dir() for n in names)
    for name in names:
        cg.remove(name)
    checked = V2Cgroups(v2mount, controllers=())
    monkeypatch.setattr(checked, "_enable_parent", lambda: calls.append(2) or real())
    checked.check()
    checked.create(names[0], Limits())
    checked.remove(names[0])
    assert calls == [1, 2]  # check() did it; create did not again


def test_v2_kill_and_sweep_with_cgroup_kill(v2mount, monkeypatch):
    if (v2mount / "cgroup.kill").exists():  # Linux ≥ 5.14: one write, never a pid-by-pid kill
        monkeypatch.setattr(cgroups, "_kill_each",
                            lambda _: pytest.fail("killed pid by pid despite cgroup.kill"))
    check_kill_and_sweep(V2Cgroups(v2mount, controllers=()))


def test_v2_kill_and_sweep_pid_by_pid_without_cgroup_kill(v2mount, monkeypatch):
    monkeypatch.setattr(V2Cgroups, "KILL_FILE", "cgroup.kill-of-a-kernel-before-5.14")
    check_kill_and_sweep(V2Cgroups(v2mount, controllers=()))


def test_the_oom_counter_of_a_process_is_read_from_its_own_group(v2mount, host, monkeypatch):
    """`oom_kills_of_pid` (docker sessions): v2 reads the pid's group's memory.events (on the
    test's own mount, which has no memory controller: the file it asks for is recorded), v1
    the pid's memory group's memory.oom_control, here a real one."""
    cg, name = V2Cgroups(v2mount, controllers=()), attempt_name()
    proc = join(cg.create(name, Limits()), "exec sleep 60")
    try:
        wait_for(lambda: proc.pid in cg.pids(name))
        asked = []
        monkeypatch.setattr(cgroups, "_counter", lambda file, key: asked.append((file, key)) or 7)
        assert cgroups.oom_kills_of_pid(proc.pid, v2mount) == 7
        assert asked == [(v2mount / PARENT / name / "agent" / "memory.events", "oom_kill")]
    finally:
        cg.kill(name)
        cg.remove(name)
    monkeypatch.undo()
    assert cgroups.oom_kills_of_pid(0) is None and cgroups.oom_kills_of_pid(2 ** 22 + 1) is None
    if host.version == "v1":
        calm = attempt_name()
        proc = join(host.create(calm, Limits()), "exec sleep 60")
        try:
            wait_for(lambda: proc.pid in host.pids(calm))
            assert cgroups.oom_kills_of_pid(proc.pid) == host.oom_kills(calm) == 0
        finally:
            host.kill(calm)
            host.remove(calm)


def test_oom_counters_are_read_from_the_kernels_format():
    events = "low 0\nhigh 0\nmax 1520\noom 3\noom_kill 2\noom_group_kill 0\n"  # memory.events, Linux 6.1
    assert read_counters(events) == {"low": 0, "high": 0, "max": 1520, "oom": 3, "oom_kill": 2,
                                     "oom_group_kill": 0}
    oom_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"  # memory.oom_control, v1
    assert read_counters(oom_control)["oom_kill"] == 0
    assert read_counters("garbage\noom_kill x\n\nkey 1 2\n") == {}


@pytest.mark.bwrap
def test_bwrap_launches_through_v2_groups(v2mount):
    """The whole launch chain on v2 groups: the shell joins the one group, bwrap's monitor and
    the shell are released into the launch group, the agent stays in the limited one."""
    sandbox = BwrapSandbox(run_label=LABEL)
    sandbox.hierarchy = V2Cgroups(v2mount, controllers=())
    name = f"probe-{uuid.uuid4().hex[:8]}"
    node = v2mount / PARENT / f"{LABEL}-{name}"
    seen: list[dict[str, set[str]]] = []  # the command names in each group, poll by poll

    def watch() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (seen and seen[-1]["agent"] == {"timeout", "python3"}):
            try:
                seen.append({g: {comm(int(p)) for p in (node / g / "cgroup.procs").read_text().split()}
                             for g in ("agent", "launch")})
            except FileNotFoundError:
                pass  # not made yet
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = sandbox.run(RunRequest(argv=("python3", "-S", "-c",
                                              "import time; time.sleep(1.5); print('done')"),
                                        name=name, workdir="/", limits=Limits(timeout_s=20.0)))
    finally:
        watcher.join()
        sandbox.close()
    assert (result.exit_code, result.stdout, result.timed_out, result.oom_killed) == (0, b"done\n", False,
                                                                                      False)
    assert seen[-1] == {"agent": {"timeout", "python3"}, "launch": {"bwrap", "sh"}}, seen
    assert not node.exists()


@pytest.mark.bwrap
def test_bwrap_on_this_machines_hierarchy_sees_an_oom():
    sandbox = BwrapSandbox(run_label=LABEL)
    try:
        assert sandbox.hierarchy.version == detect()
        bomb = "b = []\nwhile True: b.append(b'x' * (1 << 20))"
        result = sandbox.run(RunRequest(argv=("python3", "-S", "-c", bomb),
                                        name=f"bomb-{uuid.uuid4().hex[:8]}", workdir="/",
                                        limits=Limits(memory_mb=64, timeout_s=60.0)))
        assert result.oom_killed and result.exit_code == 128 + signal.SIGKILL and not result.timed_out
        assert sandbox.hierarchy.names(LABEL) == []
    finally:
        sandbox.close()


@pytest.mark.bwrap
def test_the_bwrap_facts_name_the_cgroup_version():
    sandbox = BwrapSandbox(run_label=LABEL)
    try:
        assert sandbox.facts().cgroup == detect()
    finally:
        sandbox.close()


@pytest.mark.docker
def test_the_docker_facts_name_the_daemons_cgroup_version(sandboxes):
    """The suite's own dockerd runs on this machine's hierarchy: it must report the same one."""
    assert sandboxes("docker").facts().cgroup == detect()


# --- the same file in a VM with a pure cgroup v2 hierarchy --------------------------------

@pytest.mark.slow
def test_in_a_vm_with_cgroup_v2_only_the_machine_tests_run_on_v2():
    """This file, run in a VM whose only hierarchy is cgroup2 with every controller: the
    machine-hierarchy tests above are then v2's limits, OOM, pids cap, cpu throttling,
    kills and sweeps, bwrap's whole launch chain on v2 with its limits, and both backends'
    facts (the suite's own dockerd runs in the VM too) must say v2."""
    from tests.cgroup2_vm import run_in_vm

    probe = (
        f'"{sys.executable}" -c "import json; from validate.sandbox.cgroups import detect; '
        f"from validate.core.paths import DEFAULT_IMAGE, ImagePaths; store = ImagePaths(DEFAULT_IMAGE).base; "
        f"print(json.dumps([detect(), open('/sys/fs/cgroup/cgroup.controllers').read().split(), "
        f"str(store), ImagePaths(DEFAULT_IMAGE).tarball.is_file()]))\""
    )
    tests = (f'PYTHONDONTWRITEBYTECODE=1 "{sys.executable}" -m pytest -q -p no:cacheprovider --color=no '
             f'tests/test_cgroups.py -k "not in_a_vm"')
    # What CI points at fresh temporary places (the image store, the corpus, the VM's kernel)
    # must be what the tests in the VM use too, not what this machine happens to hold.
    passed_on = ("VALIDATE_IMAGE_DIR", "VALIDATE_DATA_DIR")
    # The checkout and the corpus beside it may live under /tmp, which the VM covers with a tmpfs.
    status, out = run_in_vm(f"cd {ROOT} && {probe} && {tests}",
                            env={k: os.environ[k] for k in passed_on if k in os.environ},
                            visible=(ROOT, CORPUS_PATH.parent))
    assert status == 0, out[-3000:]
    version, controllers, store, tarball = json.loads(
        next(line for line in out.splitlines() if line.startswith("["))
    )
    assert version == "v2" and set(CONTROLLERS) <= set(controllers), out[:500]
    # this run's store, not the machine's
    assert store == str(ImagePaths(DEFAULT_IMAGE).base) and tarball, out[:500]
    expected = len([t for t in globals() if t.startswith("test_")]) - 1  # all but this one
    assert f"{expected} passed" in out, out[-3000:]
