"""Harbor 0.25.0 as the bench runs it: its root, what it needs in the daemon, one job, its outcomes.

- `ensure_root`: a Debian trixie root filesystem (``mmdebstrap``: python3.13, python3-venv,
  docker-cli, docker-compose v2, ca-certificates) with this machine's CA bundle copied in and
  ``harbor==0.25.0`` from PyPI in a venv at /opt/harbor; built once into the directory the
  user names, reused while its record matches this recipe. Nothing of it is ever committed.
- `prepare`: the harness's offline bases tagged under the upstream names the tasks' ``FROM``
  lines and compose files use; Harbor's local stand-ins (below); the compose overlay that
  makes every Harbor compose project's network internal.
- `run_harbor`: one ``harbor run -c CONFIG`` job (agents ``oracle`` and ``nop``, the bench's
  concurrency) from that root under bubblewrap, timed; `outcomes` reads its trial results.

The stand-ins, all in `STANDIN_MODULE`, an environment class Harbor loads by import path
(``environment.import_path``), a subclass of Harbor's own ``DockerEnvironment`` that changes
only this: (1) the egress-control kernel probe runs in the harness's Debian base instead of
``alpine:3.23.4@sha256:…`` (a pinned digest cannot be served by a local tag); (2) the egress
sidecar is a local image instead of one built ``FROM gogost/gost@sha256:…``: it becomes
ready as Harbor's waits for, and its ``network-policy`` accepts Harbor's calls but enforces
nothing; (3) one compose overlay is added to every project: its network internal (so no
phase of any trial can leave the machine, whatever policy Harbor asks for) and the main
image built with the host's network, as this harness builds task images (the daemon has no
default bridge for the classic builder's ``RUN`` steps). So every no-network policy holds
here, and no allow-all does: a task whose verifier Harbor would let out (``[verifier]
network_mode = "public"``) has no network under this bench.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import time
from datetime import datetime
from pathlib import Path

from harbor_anchor import BenchError, Measurement

HARBOR = "harbor==0.25.0"
SUITE = "trixie"
PACKAGES = ("python3.13", "python3-venv", "docker-cli", "docker-compose", "ca-certificates")
RECIPE = {"suite": SUITE, "packages": list(PACKAGES), "pip": HARBOR, "version": 1}
VENV = "/opt/harbor"
CA_IN_ROOT = "/etc/ssl/certs/host-ca-bundle.crt"
AGENTS = ("oracle", "nop")
#: Harbor's message when a compose command fails: "... Command: docker compose ... -f FILE up --detach --wait.
#: Return code: 1 ...": the subcommand is the word after the last compose file.
COMPOSE_FAILURE = re.compile(r"Command: docker compose .* -f \S+ ([a-z]+)\b[^\n]*\. Return code: ")

STANDIN = "harbor-anchor-bench"  # the repository of every stand-in image: never an upstream name
SIDECAR_IMAGE, PROBE_IMAGE = f"{STANDIN}/egress-sidecar-standin:1", f"{STANDIN}/egress-probe-standin:1"
READY_FILE = "/tmp/harbor-docker-egress-control-sidecar.ready"  # Harbor's healthcheck tests this file
SIDECAR_FILES = {
    "Dockerfile": "FROM {base}\nCOPY entrypoint.sh /opt/egress-sidecar/entrypoint.sh\n"
                  "COPY network-policy /usr/local/bin/network-policy\n",
    "entrypoint.sh": "#!/bin/sh\n"
                     "# harbor_anchor_bench's stand-in for Harbor's egress sidecar (gost + nftables): it\n"
                     "# enforces nothing; the project's network is internal.\n"
                     f"touch {READY_FILE}\n"
                     'echo "stand-in sidecar: initial policy ${EGRESS_CONTROL_INITIAL_NETWORK_MODE:-public}, '
                     'not enforced (internal network)"\nexec sleep infinity\n',
    "network-policy": '#!/bin/sh\necho "stand-in network-policy $*: not enforced (internal network)"\n',
}
OVERLAY = ("# harbor_anchor_bench: no route off the machine; builds use the host's network, as "
           "the harness's.\n"
           "networks:\n  default:\n    internal: true\n")
OVERLAY_BUILD = OVERLAY + "services:\n  main:\n    build:\n      network: host\n"
STANDIN_MODULE = '''"""Harbor's DockerEnvironment with harbor_anchor_bench's local stand-ins (see the bench)."""
from pathlib import Path

from harbor.environments.docker.docker import DockerEnvironment


class AnchorBenchDockerEnvironment(DockerEnvironment):
    _EGRESS_CONTROL_KERNEL_PROBE_IMAGE = "{probe}"

    async def _ensure_egress_control_sidecar_image_built(self) -> None:
        self._env_vars.egress_control_sidecar_image_name = "{sidecar}"

    @property
    def _docker_compose_paths(self):
        return [*super()._docker_compose_paths, Path("{prebuilt}" if self._use_prebuilt else "{build}")]
'''  # noqa: E501


def _host_ca_bundle() -> Path:
    """The CA bundle this machine's own TLS clients trust (a TLS-intercepting proxy's CA included)."""
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      ssl.get_default_verify_paths().openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise BenchError("the trixie root cannot be built: no CA bundle found on this machine for pip in it to "
                     "trust (set SSL_CERT_FILE to the bundle this machine's TLS clients use)")


def _need(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        raise BenchError(f"the trixie root with Harbor needs {tool}, which is not installed (apt-get "
                         f"install {package})")


def _in_root(rootfs: Path, argv: list[str], *, network: bool, binds: tuple[str, ...] = (),
             env: dict | None = None, writable: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """`argv` in the root under bubblewrap: loopback only unless `network`, a fresh /tmp and ~."""
    bwrap = ["bwrap", "--bind" if writable else "--ro-bind", str(rootfs), "/", "--dev", "/dev", "--proc",
             "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run", "--unshare-pid", "--unshare-ipc",
             "--die-with-parent", "--new-session", *([] if writable else ["--tmpfs", "/root"]),
             *([] if network else ["--unshare-net"]), *binds, "--clearenv"]
    for key, value in {"PATH": f"{VENV}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                       "LANG": "C.UTF-8", **(env or {})}.items():
        bwrap += ["--setenv", key, value]
    return subprocess.run([*bwrap, "--", *argv], stdin=subprocess.DEVNULL, **kwargs)


def ensure_root(root_dir: Path, log) -> Path:
    """The trixie root with Harbor, built into `root_dir` unless a complete one of this recipe is there."""
    try:
        return _ensure_root(root_dir, log)
    except OSError as e:
        raise BenchError(f"the trixie root cannot be built in {root_dir}: {e}") from None
    finally:  # a build that did not finish leaves nothing half-made behind
        if (root_dir / "rootfs.partial").exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(root_dir / "rootfs.partial")], check=False)


def _recorded(record: Path) -> dict | None:
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):
        return None


def _ensure_root(root_dir: Path, log) -> Path:
    rootfs, record = root_dir / "rootfs", root_dir / "harbor-root.json"
    _need("bwrap", "bubblewrap")  # Harbor runs under it
    if (_recorded(record) or {}).get("recipe") == RECIPE and rootfs.is_dir():
        log(f"trixie root with {HARBOR}: {rootfs} (built before)")
        return rootfs
    _need("mmdebstrap", "mmdebstrap")
    ca = _host_ca_bundle()
    partial = root_dir / "rootfs.partial"
    root_dir.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    for old in (partial, rootfs):
        subprocess.run(["rm", "-rf", "--one-file-system", str(old)], check=False)
    log(f"building a Debian {SUITE} root with {', '.join(PACKAGES)} (mmdebstrap, about a minute) ...")
    proc = subprocess.run(["mmdebstrap", "--variant=apt", f"--include={','.join(PACKAGES)}", SUITE,
                           str(partial)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"the trixie root cannot be built: mmdebstrap {SUITE} exited {proc.returncode} "
                         f"(it needs Debian's {SUITE} archive reachable through apt): "
                         f"{proc.stderr.strip()[-1500:]}")
    shutil.copyfile(ca, partial / CA_IN_ROOT.lstrip("/"))
    log(f"installing {HARBOR} into {VENV} in it (pip trusting this machine's CA bundle, {ca}) ...")
    proxies = {k: v for k, v in os.environ.items() if k.lower() in ("http_proxy", "https_proxy", "no_proxy")}
    proc = _in_root(partial, ["sh", "-c", f"python3.13 -m venv {VENV} && {VENV}/bin/pip install -q "
                              f"--disable-pip-version-check --no-input --cert {CA_IN_ROOT} '{HARBOR}'"],
                    network=True, writable=True, binds=("--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"),
                    env=proxies, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"the trixie root cannot be built: pip could not install {HARBOR} in it "
                         f"(exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-1500:]}")
    partial.rename(rootfs)
    record.write_text(json.dumps({"recipe": RECIPE,
                                  "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                 indent=1, sort_keys=True) + "\n")
    return rootfs


def copy_dataset(src: Path, dst: Path, tasks: str | None) -> Path:
    """A copy of the dataset (or of the named tasks) that both sides read: the same bytes, one place."""
    if not src.is_dir():
        raise BenchError(f"--dataset {src}: not a directory of task directories")
    names = sorted(p.name for p in src.iterdir() if p.is_dir()) if tasks is None else tasks.split(",")
    missing = [n for n in names if not (src / n).is_dir()]
    if missing:
        raise BenchError(f"--tasks: no such task directory in {src}: {', '.join(missing)}")
    shutil.rmtree(dst, ignore_errors=True)
    for name in names:
        shutil.copytree(src / name, dst / name, symlinks=True)
    return dst


def prepare(daemon, base_map: dict, work: Path, log) -> None:
    """The upstream tags, the stand-in images, the stand-in module and overlays under `work`/harbor."""
    client = daemon.client
    for sub in base_map["substitutions"]:
        # a glob serves many names: tag only plain ones, of the bases this map built
        if not any(c in sub["upstream"] for c in "*?[") and sub["recipe"] in base_map["bases"]:
            repo, tag = sub["upstream"].rsplit(":", 1)
            client.images.get(base_map["bases"][sub["recipe"]]["image_id"]).tag(repo, tag)
            log(f"  {sub['upstream']} = the harness's base {sub['recipe']}")
    base = next(b["image_id"] for name, b in sorted(base_map["bases"].items()) if "debian" in name)
    client.images.get(base).tag(*PROBE_IMAGE.split(":"))
    here = work / "harbor"
    context = here / "sidecar"
    context.mkdir(parents=True, exist_ok=True)
    for name, text in SIDECAR_FILES.items():
        (context / name).write_text(text.format(base=base) if name == "Dockerfile" else text)
        (context / name).chmod(0o755)
    client.images.build(path=str(context), tag=SIDECAR_IMAGE, network_mode="none", rm=True, forcerm=True)
    (here / "overlay-build.yaml").write_text(OVERLAY_BUILD)
    (here / "overlay-prebuilt.yaml").write_text(OVERLAY)
    (here / "harbor_anchor_standin.py").write_text(STANDIN_MODULE.format(
        probe=PROBE_IMAGE, sidecar=SIDECAR_IMAGE, build=here / "overlay-build.yaml",
        prebuilt=here / "overlay-prebuilt.yaml"))
    log(f"  stand-ins: {PROBE_IMAGE}, {SIDECAR_IMAGE}; overlays and module in {here}")


def job_config(dataset: Path, jobs: Path, name: str, c: int) -> dict:
    return {"job_name": name, "jobs_dir": str(jobs), "n_concurrent_trials": c, "quiet": True,
            "agents": [{"name": a} for a in AGENTS],
            "environment": {"import_path": "harbor_anchor_standin:AnchorBenchDockerEnvironment",
                            "delete": True},
            "datasets": [{"path": str(dataset)}]}


def run_harbor(rootfs: Path, daemon, dataset: Path, work: Path, name: str, c: int) -> Measurement:
    """One Harbor job over `dataset` with agents oracle and nop, timed from start to exit."""
    jobs, logs = work / "harbor-jobs", work / "logs"
    jobs.mkdir(parents=True, exist_ok=True), logs.mkdir(parents=True, exist_ok=True)
    config = work / "harbor" / f"{name}.json"
    config.write_text(json.dumps(job_config(dataset, jobs, name, c), indent=1, sort_keys=True) + "\n")
    env = {"DOCKER_HOST": "unix:///run/docker.sock", "DOCKER_BUILDKIT": "0", "COMPOSE_DOCKER_CLI_BUILD": "0",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HARBOR_TELEMETRY": "0",
           "PYTHONPATH": str(work / "harbor")}
    binds = ("--bind", str(daemon.socket), "/run/docker.sock", "--bind", str(work), str(work), "--chdir",
             str(work))
    with open(logs / f"{name}.log", "w") as out:
        t0 = time.perf_counter()
        proc = _in_root(rootfs, ["harbor", "run", "-c", str(config), "-y"], network=False, binds=binds,
                        env=env, stdout=out, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - t0
    trials, played, outcome = outcomes(jobs / name)
    if proc.returncode != 0 or trials == 0:
        tail = (logs / f"{name}.log").read_text(errors="replace")[-2000:]
        raise BenchError(f"harbor run exited {proc.returncode} with {trials} trial results; its "
                         f"output ends: {tail}")
    return Measurement(side="harbor", trials=trials, played=played, wall_s=wall, outcomes=outcome,
                       phases_s=phase_medians(jobs / name), where=str(jobs / name))


def outcome_text(result: dict) -> str:
    """A trial's outcome: its reward(s), or the exception Harbor recorded."""
    exc = result.get("exception_info")
    if exc:
        failed = COMPOSE_FAILURE.search(exc["exception_message"])
        return exc["exception_type"] + (f" in compose {failed.group(1)}" if failed else "")
    rewards = (result.get("verifier_result") or {}).get("rewards")
    if not rewards:
        return "no reward"
    if set(rewards) == {"reward"}:
        return f"{rewards['reward']}"
    return " ".join(f"{k}={v}" for k, v in sorted(rewards.items()))


def outcomes(job_dir: Path) -> tuple[int, int, dict[str, dict[str, str]]]:
    """(trial results, trials whose agent ran, task → agent → outcome) of one Harbor job directory."""
    out: dict[str, dict[str, str]] = {}
    trials = played = 0
    for path in sorted(job_dir.glob("*/result.json")):
        result = json.loads(path.read_text())
        trials += 1
        # a multi-step trial's agent runs are its steps'
        played += any(r.get("agent_execution") for r in [result, *(result.get("step_results") or [])])
        task = Path(result["task_id"]["path"]).name
        out.setdefault(task, {})[result["agent_info"]["name"]] = outcome_text(result)
    return trials, played, out


def _seconds(timing: dict | None) -> float:
    if not timing or not timing.get("started_at") or not timing.get("finished_at"):
        return 0.0
    started, finished = (datetime.fromisoformat(timing[k]) for k in ("started_at", "finished_at"))
    return (finished - started).total_seconds()


def phase_medians(job_dir: Path) -> dict[str, float]:
    """Where a Harbor trial's time goes, the median over the job's trials: environment set-up (the
    compose build and up), agent set-up, the agent, the verifier (a multi-step trial's steps
    summed), and the rest (teardown: ``compose down --rmi local``; downloading logs)."""
    rows = []
    for path in sorted(job_dir.glob("*/result.json")):
        r = json.loads(path.read_text())
        parts = [r, *(r.get("step_results") or [])]
        row = {"setup": _seconds(r.get("environment_setup")) + _seconds(r.get("agent_setup")),
               "agent": sum(_seconds(x.get("agent_execution")) for x in parts),
               "verifier": sum(_seconds(x.get("verifier")) for x in parts)}
        row["rest"] = _seconds(r) - sum(row.values())
        rows.append(row)
    return {k: statistics.median(x[k] for x in rows)
            for k in ("setup", "agent", "verifier", "rest")} if rows else {}
