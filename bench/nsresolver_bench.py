"""The cost per trial of the network signal: the harness's own sockets in a container's
namespace (`validate.taskdir.trial.nsresolver`) against the resolver sidecar
(`validate.taskdir.trial.network`).

    python bench/nsresolver_bench.py [--repeats 50] [--sidecars 10]

Needs root (setns) and a docker daemon with the sandbox image (``DOCKER_HOST``). One
container of the sandbox image with no network is started once; then, `--repeats` times:
``nsresolver.open(pid)``, ``boundary()``, ``lookups()``, ``close()`` (and as many with one
name asked through an exec in between, whose exec is not counted). Then `--sidecars` times
the sidecar's life for a trial: created and started, ready (its first log line), the
boundary signalled and marked, its log read, removed. Prints the mean and the median of
each, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from validate.core.paths import DEFAULT_IMAGE  # noqa: E402
from validate.taskdir.trial import (  # noqa: E402
    docker as dk,  # noqa: E402
    network,
    nsresolver,
)


def _line(what: str, times: list[float]) -> float:
    mean = statistics.fmean(times)
    print(f"  {what}: mean {mean * 1e3:.2f} ms, median {statistics.median(times) * 1e3:.2f} ms, "
          f"max {max(times) * 1e3:.2f} ms (n={len(times)})")
    return mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--sidecars", type=int, default=10)
    args = parser.parse_args()
    api = docker.from_env(timeout=120).api
    res = dk.Resources(api, "bench-nsresolver", "bench")
    try:
        with tempfile.TemporaryDirectory() as files:
            host = api.create_host_config(network_mode="none", mounts=nsresolver.mounts(Path(files), "task"))
            cid = api.create_container(DEFAULT_IMAGE, entrypoint=["sleep", "600"], command=[],
                                       hostname="task", labels=res.labels(), network_disabled=True,
                                       host_config=host)["Id"]
            res.containers.append(cid)
            api.start(cid)
            pid = int(api.inspect_container(cid)["State"]["Pid"])
            bare, asked = [], []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                r = nsresolver.open(pid)
                r.boundary()
                found = r.lookups()
                r.close()
                bare.append(time.perf_counter() - t0)
                assert not found.any()
            for n in range(args.repeats):
                t0 = time.perf_counter()
                r = nsresolver.open(pid)
                t1 = time.perf_counter()
                ex = api.exec_create(cid, ["getent", "hosts", f"n{n}.example.org"])
                api.exec_start(ex)
                t2 = time.perf_counter()
                r.boundary()
                found = r.lookups()
                r.close()
                asked.append(time.perf_counter() - t2 + t1 - t0)
                assert found.agent == [f"n{n}.example.org"], found
        sidecar_start, sidecar_all = [], []
        for _ in range(args.sidecars):
            t0 = time.perf_counter()
            s = network.Resolver(res, DEFAULT_IMAGE)
            s.started()
            network.wait_ready(res, s.id)
            t1 = time.perf_counter()
            mark = network.boundary(res, s.id)
            network.lookups(res, s.id, mark)
            api.remove_container(s.id, force=True, v=True)
            res.containers.remove(s.id)
            sidecar_start.append(t1 - t0)
            sidecar_all.append(time.perf_counter() - t0)
    finally:
        res.close()
    print("the harness's sockets in the container's namespace (nsresolver):")
    ours = _line("open + boundary + lookups + close", bare)
    _line("the same, one name asked in between (the exec not counted)", asked)
    print("the resolver sidecar (network):")
    start = _line("create + start + ready", sidecar_start)
    _line("create + start + ready + boundary + log read + remove", sidecar_all)
    print(f"ratio, the sidecar's start to nsresolver's whole life: {start / ours:.0f}x")


if __name__ == "__main__":
    main()
