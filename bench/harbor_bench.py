"""Harbor trials per second through the harness vs a bare loop of the same container work.

    python bench/harbor_bench.py [-n 40] [-c 4] [--rounds 2] [--resolver {none,harness}]

One trivial task directory (written here, in a temporary directory: its image is the sandbox
image plus one file; ``solve.sh`` writes one line, ``test.sh`` compares it and writes
``reward.txt``) is built once. Then, at the same concurrency, alternating round by round so
both see the same machine:

- **bare**: the docker API doing what one trial needs at the least — create a container of
  the task image with the network off, start it, one exec for the solution, one exec for the
  test, read ``/logs/verifier/reward.txt``, remove the container;
- **harness**: `validate.trial.run_trial` playing the oracle on the same task — the agent
  phase, its processes gone (PID 1 aside), what the agent left read, fresh log and test
  directories, the verifier in the same container, the reward read by Harbor's rule,
  everything removed; with ``--resolver harness`` (as `validate run` plays a trial) also
  the trial's network signal — the harness's own sockets in the container's namespace when
  it runs as root (`validate.trial.nsresolver`), else the resolver sidecar
  (`validate.trial.network`) — with ``none`` (the default) no resolver.

It prints both rates and their ratio (harness / bare; the issue's goal is ≥ 0.9 at ``-c 4``)
and the harness's per-phase share from the trial records. The docker daemon is the one
``DOCKER_HOST`` names: run it against a daemon you started (the suite's `tests.dockerd`
starts a private one); the sandbox image must be loaded (``validate image build``).
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
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
from validate.paths import DEFAULT_IMAGE  # noqa: E402
from validate.trial.result import TrialLimits  # noqa: E402
from validate.trial.run import run_trial  # noqa: E402

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
TEST = ["sh", "-c", 'mkdir -p /logs/verifier && if [ "$(cat /app/out.txt)" = ok ]; then echo 1; else echo 0; fi'
        ' > /logs/verifier/reward.txt']


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


def time_calls(api, table: dict[str, list[float]]) -> None:
    """Wrap `api`'s methods so each call's wall time lands in `table` (the per-call breakdown)."""
    for name in ("create_container", "start", "exec_create", "exec_start", "exec_inspect", "kill", "wait",
                 "get_archive", "put_archive", "commit", "remove_container", "create_volume", "remove_volume",
                 "remove_image", "inspect_container", "pause", "unpause", "containers", "volumes", "images"):
        fn = getattr(api, name)

        def timed(*args, _fn=fn, _name=name, **kwargs):
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                table.setdefault(_name, []).append(time.perf_counter() - t0)

        setattr(api, name, timed)


def breakdown(client, image: str, task, task_dir: Path, limits, names, n: int, resolver: str | None) -> None:
    """Docker API seconds per trial, call by call, one trial at a time (no contention)."""
    table: dict[str, list[float]] = {}
    time_calls(client.api, table)
    for label, fn in (("bare", lambda: bare_trial(client.api, image, names)),
                      ("harness", lambda: run_trial(client, task, task_dir, image, "oracle", limits,
                                                    run_label="harbor-bench", resolver_image=resolver))):
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
    p.add_argument("--rounds", type=int, default=2, help="rounds, alternating bare and harness (default 2)")
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
        bare_fn = lambda: bare_trial(client.api, image, names)  # noqa: E731
        resolver = DEFAULT_IMAGE if a.resolver == "harness" else None
        harness_fn = lambda: run_trial(client, task, task_dir, image, "oracle", limits,  # noqa: E731
                                       run_label="harbor-bench", resolver_image=resolver)
        bare_fn(), harness_fn()  # warm: the image's layers, the first exec
        bare, harness, records = [], [], []
        for r in range(a.rounds):
            b, rewards = rate(bare_fn, a.n, a.c)
            assert all(x == 1.0 for x in rewards), rewards
            h, results = rate(harness_fn, a.n, a.c)
            bad = [x for x in results if x.reward != 1.0 or x.status != "ok"]
            assert not bad, bad[0].model_dump_json()[:2000]
            bare.append(b), harness.append(h), records.extend(results)
            print(f"round {r + 1}: bare {b:.2f} trials/s, harness {h:.2f} trials/s, ratio {h / b:.2f}", flush=True)
        if a.calls:
            breakdown(client, image, task, task_dir, limits, names, a.calls, resolver)
        client.images.remove(image, force=True)
    b, h = statistics.mean(bare), statistics.mean(harness)
    how = {"none": "none", "harness": "own sockets (root)" if os.geteuid() == 0 else "sidecar"}[a.resolver]
    print(f"\nharbor_bench -n {a.n} -c {a.c} x {a.rounds} rounds, resolver: {how}")
    print(f"  bare docker API trial : {b:.2f} trials/s")
    print(f"  harness run_trial     : {h:.2f} trials/s")
    print(f"  ratio harness / bare  : {h / b:.2f}  (goal >= 0.9)")
    runtimes = [x.runtime_s for x in records]
    print(f"  harness trial wall    : median {statistics.median(runtimes):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
