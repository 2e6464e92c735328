"""One Harbor trial under bwrap, without root inside the sandbox: the task image as an
unpacked tree (`validate.taskdir.trial.roots`, the nearest thing here to an Apptainer sandbox
directory), the agent and then the verifier as one unprivileged uid, no network.

The same sequence as the docker trial (`validate.taskdir.trial.run`), with what it needs from docker
replaced by what bwrap has:

1. **The tree.** The task image unpacked once per image by an unprivileged ``tar``: every
   file is the sandbox user's (uid `roots.TREE_UID`), as in a sandbox directory an
   unprivileged user unpacked. Each trial runs on an overlay of it: the lower layer the
   shared tree (never written), the upper one on the trial's own tmpfs capped at the
   contract's ``storage_mb`` and ``storage_inodes`` (`validate.sandbox.storage`: swept by the
   next open of the run's sandbox if the harness is killed). ``/logs`` and the uploads are
   written by the harness into the overlay, never through a link (`roots.put_entries`).
2. **Agent phase.** bwrap over the overlay, started exactly as the bwrap backend starts its
   sandboxes (`validate.sandbox.bwrap.launch`): a fresh cgroup with the task's limits capped
   by the profile (memory without swap, pids, cpu quota), ``ulimit -f``, root dropped with
   ``setpriv`` *before* bwrap, new user/pid/net/ipc/uts namespaces, the harness's seccomp
   filter, the watchdog as PID 1. There is no uid 0 in the sandbox: the task's ``[agent]
   user`` and ``[verifier] user`` are not switched to (the execution profile says so), and
   a ``solve.sh`` that needs root (``apt-get``, ``dpkg -i``, ``chown``) fails — which is
   what a rootless profile shows. When the agent's command ends (or times out) the
   sandbox's PID 1 is killed with its whole pid namespace, and its cgroup is emptied.
3. **Verifier phase.** A fresh bwrap over the same overlay (what the agent left), with a
   fresh empty ``/logs/verifier`` and a fresh ``/tests`` bound from the trial's tmpfs (the
   agent's ``/logs/verifier`` and ``/tests``, recorded first, are replaced by empty mount
   points); ``test.sh`` runs against the verifier timeout; the reward is read from the
   fresh directory on the host side with the docker trial's own rule (`run._reward`).
4. **Cleanup**, always: the cgroups killed and removed, the overlay and the tmpfs unmounted.

Task images are still built by the task-image builder (docker) and exported from it; the
trials themselves use no container engine.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

from environment.harbor.reward import MAX_REWARD_BYTES
from environment.harbor.taskdir import HarborTask
from validate.core.errors import SandboxError
from validate.sandbox import seccomp, storage
from validate.sandbox.base import Limits, supervise, watchdog_argv
from validate.sandbox.bwrap.launch import _JOIN, Launch
from validate.sandbox.storage import remove_tree
from validate.taskdir.trial import layers, roots, run as docker_trial, tool as harness_tool, workpaths
from validate.taskdir.trial.agents import plan as agent_plan, tree_entries
from validate.taskdir.trial.result import LeftFile, PhaseRun, TrialLimits, TrialResult
from validate.taskdir.trial.run import UnsupportedTask, apply_limits
from validate.taskdir.trial.trusted import MAX_LISTED

#: Directories every phase finds, as the docker trial makes them (relative to the root).
LOG_DIRS = [(path, mode, None) for path, mode, _ in docker_trial._LOG_DIRS]
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Trial:
    """One trial's overlay, tmpfs and cgroups, removed by `close` whatever happened."""

    def __init__(self, sandbox, storage_limits: Limits) -> None:
        self.sandbox = sandbox
        self.name = f"trial-{secrets.token_hex(6)}"
        self._storage = storage.attempt_storage(sandbox.run_label, self.name, storage_limits,
                                                gid=roots.TREE_UID)
        self.dir: Path = self._storage.__enter__()
        self.merged = self.dir / "root"
        self.groups: list[str] = []
        self.mounted: list[Path] = []

    def mount(self, lower: Path, layer: str = "", fresh: bool = True) -> Path:
        """An overlay of `lower` (read-only; several joined with ``:``, the first on top) with a
        writable layer of this trial's tmpfs (``upper<layer>``, fresh or kept); its merged tree."""
        upper, work, merged = (self.dir / f"{d}{layer}" for d in ("upper", "work", "root"))
        for d in (upper, work, merged) if fresh else (work, merged):
            d.mkdir(mode=0o755, exist_ok=not fresh or d == merged)
        if fresh:
            st = os.stat(lower.split(":")[-1] if isinstance(lower, str) else lower)
            os.chown(upper, st.st_uid, st.st_gid)
            os.chmod(upper, st.st_mode & 0o7777)
        options = f"lowerdir={lower},upperdir={upper},workdir={work}"
        done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SandboxError(f"bwrap trial: cannot mount the task's overlay: {done.stderr.strip()[:300]}")
        self.mounted.append(merged)
        return merged

    def unmount(self, merged: Path) -> None:
        storage.unmount(merged)
        if merged in self.mounted:
            self.mounted.remove(merged)

    def close(self) -> list[str]:
        errors: list[str] = []
        hierarchy = self.sandbox.hierarchy
        for group in self.groups:
            try:
                hierarchy.kill(group)
                hierarchy.remove(group)
            except OSError as e:
                errors.append(f"cgroup {group}: {e}")
        try:
            for merged in reversed(self.mounted):
                storage.unmount(merged)
            self._storage.__exit__(None, None, None)
        except (OSError, SandboxError) as e:
            errors.append(f"trial storage {self.dir}: {e}")
        return errors


def run_trial(sandbox, docker_client, task: HarborTask, task_dir: Path, image: str, agent: str,
              limits: TrialLimits = TrialLimits(), contract: Limits = Limits(), *, reward_key: str = "reward",
              reward_range: tuple[float, float] = (0.0, 1.0), plan=None,
              replay_below: float | None = None) -> TrialResult:
    """Run `agent` on `task` (its files in `task_dir`) over the unpacked `image` (built in
    `docker_client`'s daemon) under the bwrap backend `sandbox`; `contract` gives the limits a
    trial's cgroup and storage take from the contract beyond `limits` (file size, storage).
    The verifier is trusted (`TrialLimits.verifier_mode`, the default: a fresh overlay of the
    pristine tree with only the agent's changes under its work paths, `validate.taskdir.trial.layers`)
    or shared (the agent's own overlay); `replay_below` as `validate.taskdir.trial.run.run_trial`'s."""
    if task.steps or task.verifier == "separate":
        raise UnsupportedTask(f"{task.id}: multi-step tasks and separate verifier environments are not run "
                              f"by a single-sandbox trial")
    plan = plan if plan is not None else agent_plan(agent, task, Path(task_dir))
    t0 = time.monotonic()
    result = TrialResult(task_id=task.id, task_hash=task.hash, agent=agent, image=image, status="ok",
                         reward_key=reward_key, applied=apply_limits(task.config, limits),
                         verifier_mode=limits.verifier_mode, storage_bounded=True)
    trial = None
    try:
        root = roots.task_root(docker_client, image)
        trial = Trial(sandbox, contract)
        trial.mount(root.root)
        _agent_phase(trial, task, root, plan, result, limits, contract)
        if limits.verifier_mode == "trusted":
            trusted = _carry(trial, task, Path(task_dir), root, result)
            _verifier_phase(trial, task, Path(task_dir), root, result, limits, contract, reward_key,
                            reward_range, tree=trusted)
            if replay_below is not None and result.outside_changes_total and not result.passed(replay_below):
                shadow = result.model_copy(deep=True)
                _verifier_phase(trial, task, Path(task_dir), root, shadow, limits, contract, reward_key,
                                reward_range, tree=trial.mount(str(root.root), fresh=False))
                result.shared_replayed, result.shared_record = True, shadow.record
                result.shared_reward = shadow.reward if shadow.verifier_error is None else None
        else:
            _verifier_phase(trial, task, Path(task_dir), root, result, limits, contract, reward_key,
                            reward_range)
        result.status = docker_trial._status(result)
    except SandboxError as e:
        result.status, result.infrastructure_error = "infrastructure_error", str(e)
    finally:
        result.cleanup_errors = trial.close() if trial is not None else []
        result.runtime_s = round(time.monotonic() - t0, 3)
    return result


def _env(task: HarborTask, root: roots.TaskRoot, result: TrialResult,
         extra: dict[str, str]) -> dict[str, str]:
    env = {"PATH": _DEFAULT_PATH, "HOME": "/root", **root.env, **result.applied.pinned_env,
           **task.config.environment.env, **extra}
    return dict(sorted(env.items()))


def _workdir(task: HarborTask, root: roots.TaskRoot) -> str:
    return task.config.environment.workdir or root.workdir or "/"


def _agent_phase(trial: Trial, task: HarborTask, root: roots.TaskRoot, plan, result: TrialResult,
                 limits: TrialLimits, contract: Limits) -> None:
    """Run the agent; record its output and what it left in /logs/verifier."""
    a = result.applied
    workdir = _workdir(task, root)
    roots.put_entries(trial.merged, LOG_DIRS + list(plan.uploads))
    roots.ensure_dir(trial.merged, workdir)
    run = PhaseRun()
    if plan.command is not None:
        ran = _phase(trial, "agent", plan.command, _env(task, root, result, plan.env), workdir, [],
                     _limits(result, contract, a.agent_timeout_s))
        run = PhaseRun(exit_code=ran.exit_code, timed_out=ran.timed_out, oom_killed=ran.oom_killed,
                       runtime_s=ran.runtime_s)
        out = roots.read_tree(trial.merged, plan.output, limits.max_output_bytes, limits.max_output_bytes * 2)
        run.stdout, run.truncated = docker_trial._text(out, ".", limits.max_output_bytes)
    result.agent_run = run
    left = roots.read_tree(trial.merged, docker_trial.VERIFIER_DIR, MAX_REWARD_BYTES + 1,
                           limits.max_listing_bytes)
    result.left_in_verifier_dir = [LeftFile(path=f.path, kind=f.kind, size=f.size, sha256=left.sha256(f))
                                   for f in left.entries if f.path != "." or f.kind != "dir"]
    result.left_listing_truncated = left.truncated


def _carry(trial: Trial, task: HarborTask, task_dir: Path, root: roots.TaskRoot, result: TrialResult) -> Path:
    """The trusted verifier's tree: the agent's overlay unmounted (nothing of its phase runs),
    its writable layer read as the agent's changes, those under the work paths copied into a
    layer of their own, and a fresh overlay of that layer over the pristine tree mounted."""
    trial.unmount(trial.merged)
    work = workpaths.work_paths(_workdir(task, root), [a.source for a in task.config.artifacts],
                                workpaths.named_paths(workpaths.task_texts(task_dir, task.instruction)))
    changes, cut = layers.diff(trial.dir / "upper", root.root)
    carry = workpaths.plan(changes, work)
    dropped = layers.carried_layer(trial.dir / "upper", trial.dir / "carried", carry.copy, carry.delete,
                                   tuple(work.all()))
    result.work_paths, result.named_paths = list(work.full), list(work.named)
    result.carried, result.carried_total = list(carry.copy[:MAX_LISTED]), len(carry.copy)
    result.dropped = dropped + ([f"(the agent's changes past {layers.MAX_ENTRIES} entries were not read)"]
                                if cut else [])
    result.outside_changes, result.outside_changes_total = (
        list(carry.outside[:MAX_LISTED]),
        len(carry.outside),
    )
    return trial.mount(f"{trial.dir / 'carried'}:{root.root}", layer="-verifier")


def _verifier_phase(trial: Trial, task: HarborTask, task_dir: Path, root: roots.TaskRoot, result: TrialResult,
                    limits: TrialLimits, contract: Limits, reward_key: str, reward_range: tuple[float, float],
                    tree: Path | None = None) -> None:
    """The verifier over `tree` (default: the agent's own overlay)."""
    a = result.applied
    tree = tree if tree is not None else trial.merged
    # The tree's /logs/verifier and /tests become empty mount points; fresh directories of
    # the trial's own storage are bound over them.
    for point in (docker_trial.VERIFIER_DIR, docker_trial.TESTS_DIR):
        roots.fresh_dir(tree, point)
    for made in ("verifier", "tests"):
        if (trial.dir / made).exists():
            remove_tree(trial.dir / made)
    roots.put_entries(trial.dir, [("verifier", 0o777, None), *tree_entries(task_dir / "tests", "tests")])
    binds = ["--bind", str(trial.dir / "verifier"), docker_trial.VERIFIER_DIR,
             "--bind", str(trial.dir / "tests"), docker_trial.TESTS_DIR,
             "--ro-bind", str(harness_tool.tool_dir()), harness_tool.MOUNT]
    # PID 1 is the harness's program itself (never the tree's `timeout`, which the agent could
    # have replaced): it runs test.sh and, ending, takes the sandbox's pid namespace with it
    ran = _phase(trial, f"verifier-{len(trial.groups)}", docker_trial.VERIFY,
                 _env(task, root, result, dict(task.config.verifier.env)), _workdir(task, root), binds,
                 _limits(result, contract, a.verifier_timeout_s), own_pid1=True, tree=tree)
    per_file = max(limits.max_output_bytes, MAX_REWARD_BYTES + 1)
    tree = roots.read_tree(trial.dir, "verifier", per_file, limits.max_listing_bytes)
    out, cut_out = docker_trial._text(tree, docker_trial.VERIFIER_STDOUT, limits.max_output_bytes)
    err, cut_err = docker_trial._text(tree, docker_trial.VERIFIER_STDERR, limits.max_output_bytes)
    result.verifier_run = PhaseRun(exit_code=ran.exit_code, timed_out=ran.timed_out,
                                   oom_killed=ran.oom_killed, runtime_s=ran.runtime_s, stdout=out, stderr=err,
                                   truncated=cut_out or cut_err)
    result.verifier_files = sorted(f.path for f in tree.entries if f.path != ".")
    docker_trial._reward(result, tree, reward_key, reward_range)


def _limits(result: TrialResult, contract: Limits, timeout_s: float) -> Limits:
    a = result.applied
    return contract.model_copy(update={"memory_mb": a.memory_mb, "cpus": a.cpus, "pids": a.pids,
                                       "timeout_s": timeout_s})


def _phase(trial: Trial, name: str, argv: list[str], env: dict[str, str], workdir: str, binds: list[str],
           lim: Limits, own_pid1: bool = False, tree: Path | None = None) -> PhaseRun:
    """One sandbox over the trial's overlay, run to its end or its timeout, then killed with
    everything in its cgroup. `SandboxError` when bwrap never started the sandbox."""
    hierarchy = trial.sandbox.hierarchy
    group = f"{trial.sandbox.run_label}-{trial.name}-{name}"
    trial.groups.append(group)
    cgroups = hierarchy.create(group, lim)
    status_r, status_w = os.pipe()
    try:
        seccomp_fd = seccomp.filter_fd()
    except BaseException:
        os.close(status_r)
        os.close(status_w)
        raise
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(_argv(tree if tree is not None else trial.merged, argv, env, workdir, binds,
                                      lim, cgroups, status_w, seccomp_fd, own_pid1),
                                stdin=status_r, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(status_w, seccomp_fd), start_new_session=True,
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    except OSError as e:
        os.close(status_r)
        raise SandboxError(f"bwrap trial: cannot start bwrap: {e}") from None
    finally:
        os.close(status_w)
        os.close(seccomp_fd)
    launch = Launch(proc, status_r, hierarchy, group)
    try:
        launch.await_sandbox()
        timed_out, _, stderr = supervise(proc, lim.timeout_s, 2048, kill=launch.kill)
        exit_code = launch.exit_code()
    finally:
        launch.close()
        hierarchy.kill(group)
    if exit_code is None:
        raise SandboxError(f"bwrap trial: the {name} sandbox did not start (bwrap exited {proc.returncode}): "
                           f"{stderr[:300]!r}")
    return PhaseRun(exit_code=None if timed_out else exit_code, timed_out=timed_out,
                    oom_killed=hierarchy.oom_killed(group), runtime_s=round(time.monotonic() - t0, 3))


def _argv(tree: Path, argv: list[str], env: dict[str, str], workdir: str, binds: list[str], lim: Limits,
          cgroups: list[Path], status_fd: int, seccomp_fd: int, own_pid1: bool = False) -> list[str]:
    """The bwrap backend's launch chain (`validate.sandbox.bwrap.launch`) over a writable tree;
    `own_pid1`: `argv` is the harness's own program, PID 1 itself (no watchdog of the tree's)."""
    uid = roots.TREE_UID
    out = ["/bin/sh", "-c", _JOIN, "sh", str(len(cgroups)), *map(str, cgroups), str(lim.max_file_mb * 2048),
           "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
           "--no-new-privs", "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
           "--die-with-parent", "--new-session", "--as-pid-1", "--json-status-fd", str(status_fd),
           "--seccomp", str(seccomp_fd), "--bind", str(tree), "/", "--proc", "/proc", "--dev", "/dev", *binds,
           "--hostname", "sandbox", "--clearenv"]
    for key, value in env.items():
        out += ["--setenv", key, value]
    return [*out, "--chdir", workdir, "--", *(argv if own_pid1
                                              else watchdog_argv(tuple(argv), lim.timeout_s))]
