"""Harbor trials per second: the trusted trial, the one-container trial, and a bare loop of the
trusted trial's container work, in one invocation.

    python bench/harbor_bench.py [-n 40] [-c 4] [--rounds 3] [--resolver {none,harness}] [--calls N]

One trivial task directory (written here, in a temporary directory: its image is the sandbox
image plus one file; ``solve.sh`` writes one line, ``test.sh`` compares it and writes
``reward.txt``) is built once. Then, at the same concurrency, each round runs every side in
turn (the order rotating round by round, so each sees the same machine):

- **trusted** (the default): `validate.taskdir.trial.run_trial` playing the oracle with the trusted
  verifier — the agent's container (PID 1 the harness's program), killed whole; its writable
  layer read and made to hold only the agent's work (the image's own files show again
  elsewhere); the container started again, fresh; the verifier there; the reward read by
  Harbor's rule; all removed;
- **shared** (Harbor's mode, the one-container trial the harness played before): the agent's
  processes swept (PID 1 aside), fresh log and test directories, the verifier in the same
  container;
- **bare trusted**: the docker API and the disk doing the trusted trial's container work at
  the least — create, start, exec the solution, kill, read the writable layer, keep only the
  changed path under the work path, start again, exec the test, read the reward, remove.

With ``--resolver harness`` (as `validate run` plays a trial) the harness's trials also carry
the trial's network signal (its own sockets in the containers' namespaces as root, else the
resolver sidecar); with ``none`` (the default) no resolver. It prints each rate (trials over
the wall time of all of that side's rounds) and the goals' ratios: trusted ≥ 0.7 × shared,
trusted ≥ 0.9 × bare trusted at ``-c 4``. The docker daemon is the one ``DOCKER_HOST`` names
(overlay2, on this machine, as root: the bare loop reads and writes the containers' layers on
disk as the harness does); the sandbox image must be loaded (``validate image build``).
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from environment.harbor.taskdir import load_task  # noqa: E402
from validate.core.paths import DEFAULT_IMAGE  # noqa: E402
from validate.taskdir.trial import layers  # noqa: E402
from validate.taskdir.trial.result import TrialLimits  # noqa: E402
from validate.taskdir.trial.run import run_trial  # noqa: E402

LABEL = "deshuffle-validate.bench"
TASK = {
    "task.toml": '[task]\nname = "bench/echo"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 60\n',
    "instruction.md": "Write `ok` to `/app/out.txt`.\n",
    "environment/Dockerfile": f"FROM {DEFAULT_IMAGE}\nWORKDIR /app\nRUN chmod 777 /app\n",
    "solution/solve.sh": "#!/bin/sh\necho ok > /app/out.txt\n",
    "tests/test.sh": '#!/bin/sh\nif [ "$(cat /app/out.txt)" = ok ]; then echo 1; else echo 0; fi'
                     ' > /logs/verifier/reward.txt\n',
}
SOLVE = ["sh", "-c", "echo ok > /app/out.txt"]
TEST = ["sh", "-c", 'mkdir -p /logs/verifier && if [ "$(cat /app/out.txt)" = ok ]; then echo 1; else echo 0; '
        'fi > /logs/verifier/reward.txt']


def write_task(root: Path) -> Path:
    task_dir = root / "echo"
    for rel, text in TASK.items():
        path = task_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    return task_dir


def build(client, task_dir: Path) -> str:
    image, _ = client.images.build(path=str(task_dir / "environment"), rm=True, forcerm=True,
                                   labels={LABEL: "1"}, network_mode="none")
    return image.id


def bare_trial(api, image: str, names) -> float:
    """One bare trial; returns the reward it read."""
    cid = api.create_container(image, command=["sleep", "infinity"], network_disabled=True, name=next(names),
                               labels={LABEL: "1"},
                               host_config=api.create_host_config(network_mode="none"))["Id"]
    try:
        api.start(cid)
        for argv in (SOLVE, TEST):
            api.exec_start(api.exec_create(cid, argv)["Id"])
        stream, _ = api.get_archive(cid, "/logs/verifier/reward.txt")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.getmembers()[0]
            return float(tar.extractfile(member).read())
    finally:
        api.remove_container(cid, force=True)


def bare_trusted_trial(api, image: str, names, scratch: Path) -> float:
    """The trusted trial's container work at the least (as the harness does it on this machine's
    overlay2 daemon): create, start, exec the solution, kill, read the writable layer, keep only
    the changed path under /app, start again, exec the test, read the reward, remove."""
    out = Path(tempfile.mkdtemp(dir=scratch))
    out.chmod(0o777)
    cid = api.create_container(image, command=["sleep", "infinity"], network_disabled=True, name=next(names),
                               labels={LABEL: "1"}, host_config=api.create_host_config(
                                   network_mode="none", binds=[f"{out}:/logs/verifier"]))["Id"]
    try:
        api.start(cid)
        api.exec_start(api.exec_create(cid, SOLVE)["Id"])
        api.kill(cid)
        upper, lowers = _layers(api, cid)
        changes, _ = layers.diff(upper, lowers)
        keep = tuple(c["Path"] for c in changes if c["Path"].startswith("/app/"))
        stash = upper.parent / "bench-stash"
        stash.mkdir(exist_ok=True)
        layers.revert(upper, stash, keep, ["/app"])
        api.start(cid)
        api.exec_start(api.exec_create(cid, TEST)["Id"])
        return float((out / "reward.txt").read_text())
    finally:
        api.remove_container(cid, force=True)
        shutil.rmtree(out, ignore_errors=True)


def _layers(api, cid: str) -> tuple[Path, list[Path]]:
    data = api.inspect_container(cid)["GraphDriver"]["Data"]
    return Path(data["UpperDir"]), [Path(p) for p in data["LowerDir"].split(":")]


def time_calls(api, table: dict[str, list[float]]) -> None:
    """Wrap `api`'s methods so each call's wall time lands in `table` (the per-call breakdown)."""
    for name in ("create_container", "start", "exec_create", "exec_start", "exec_inspect", "kill", "wait",
                 "get_archive", "put_archive", "commit", "remove_container", "create_volume", "remove_volume",
                 "remove_image", "inspect_container", "pause", "unpause", "containers", "volumes", "images",
                 "diff", "inspect_image", "events", "info"):
        fn = getattr(api, name)

        def timed(*args, _fn=fn, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                table.setdefault(_name, []).append(time.perf_counter() - t0)

        setattr(api, name, timed)


def breakdown(client, sides: dict, n: int) -> None:
    """Docker API seconds per trial, call by call, one trial at a time (no contention)."""
    table: dict[str, list[float]] = {}
    time_calls(client.api, table)
    for label, fn in sides.items():
        table.clear()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        wall = (time.perf_counter() - t0) / n
        calls = sorted(table.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
        print(f"\n{label}: {wall:.3f} s per trial, {sum(map(sum, table.values())) / n:.3f} s in docker calls")
        for name, secs in calls:
            print(f"  {name:18s} {len(secs) / n:4.1f} calls  {sum(secs) / n:.3f} s")


def rate(fn, n: int, c: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        out = list(pool.map(lambda _: fn(), range(n)))
    return n / (time.perf_counter() - t0), out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=40, help="trials per round and side (default 40)")
    p.add_argument("-c", type=int, default=4, help="concurrency (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every side, their order "
                                                         "rotating (default 3)")
    p.add_argument("--resolver", choices=("none", "harness"), default="none",
                   help="the harness's trials with no resolver, or with the trial's own as `validate run` "
                        "plays them (its sockets in the container's namespace as root, else the sidecar; "
                        "default none)")
    p.add_argument("--calls", type=int, default=0, metavar="N",
                   help="also time N trials of each, one at a time, docker call by call")
    a = p.parse_args(argv)
    import docker

    client = docker.from_env(timeout=300)
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as tmp:
        task_dir = write_task(Path(tmp))
        task = load_task(Path(tmp), "echo")
        image = build(client, task_dir)
        names = (f"harbor-bench-bare-{i}" for i in itertools.count())
        limits = TrialLimits(cpus=1, memory_mb=512, max_agent_timeout_s=60, max_verifier_timeout_s=60)
        resolver = DEFAULT_IMAGE if a.resolver == "harness" else None
        shared_limits = limits.model_copy(update={"verifier_mode": "shared"})
        sides = {
            "trusted": lambda: run_trial(client, task, task_dir, image, "oracle", limits,
                                         run_label="harbor-bench", resolver_image=resolver),
            "shared": lambda: run_trial(client, task, task_dir, image, "oracle", shared_limits,
                                        run_label="harbor-bench", resolver_image=resolver),
            "bare trusted": lambda: bare_trusted_trial(client.api, image, names, Path(tmp)),
        }
        for fn in sides.values():  # warm: the image's layers, the first exec, the harness's program
            fn()
        rates: dict[str, list[float]] = {k: [] for k in sides}
        records = []
        order = list(sides)
        for r in range(a.rounds):
            line = []
            for name in order[r % len(order):] + order[:r % len(order)]:
                got, results = rate(sides[name], a.n, a.c)
                if name == "bare trusted":
                    assert all(x == 1.0 for x in results), results
                else:
                    bad = [x for x in results if x.reward != 1.0 or x.status != "ok"]
                    assert not bad, bad[0].model_dump_json()[:2000]
                    records += results if name == "trusted" else []
                rates[name].append(got)
                line.append(f"{name} {got:.2f}/s")
            print(f"round {r + 1}: " + ", ".join(line), flush=True)
        if a.calls:
            breakdown(client, sides, a.calls)
        client.images.remove(image, force=True)
    # each side's rate over all its rounds: its trials over the wall time they took
    m = {k: len(v) * a.n / sum(a.n / x for x in v) for k, v in rates.items()}
    how = {"none": "none", "harness": "own sockets (root)" if os.geteuid() == 0 else "sidecar"}[a.resolver]
    print(f"\nharbor_bench -n {a.n} -c {a.c} x {a.rounds} rounds, resolver: {how}")
    print(f"  trusted run_trial (default) : {m['trusted']:.2f} trials/s")
    print(f"  shared run_trial (one box)  : {m['shared']:.2f} trials/s")
    print(f"  bare trusted loop           : {m['bare trusted']:.2f} trials/s")
    print(f"  trusted / shared            : {m['trusted'] / m['shared']:.2f}  (goal >= 0.7)")
    print(f"  trusted / bare trusted      : {m['trusted'] / m['bare trusted']:.2f}  (goal >= 0.9)")
    print(f"  trusted trial wall          : median {statistics.median(x.runtime_s for x in records):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
