"""A deshuffle pool at scale through the ``ray`` executor: wall time, the driver's peak RSS
and the evidence's size at each pool size.

    python bench/ray_scale_bench.py [--sizes 1000,10000] [-c N] [--nodes 2] [--backend bwrap]

This bench starts its own local Ray cluster (a head with no CPUs and `--nodes` worker nodes
of ``-c / nodes`` CPUs each, every one its own raylet process in a temporary directory of the
bench's; `ray.cluster_utils.Cluster`, stopped by this bench, never another Ray). For each
size it freezes a contract (the oracle and every control, `--backend`) and runs
``validate pool --executor ray --ray-address …`` in a child process, the driver, as a user
would: the driver's peak RSS is its own (``wait4``'s ``ru_maxrss`` of that process; the
sandboxes run on the nodes, not under it), sampled every second as well so a growth shows.
Evidence size: the run directory's bytes. Target: driver peak RSS ≤ 300 MB and flat from
1,000 to 10,000 tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALIDATE = [sys.executable, "-m", "validate.cli"]
#: Ray's failure detection as the tests set it (a lost node is seen within seconds).
FAST_FAILURE = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                "health_check_timeout_ms": 1000, "health_check_failure_threshold": 5}


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _journaled(run: Path) -> int:
    try:
        with open(run / "journal.jsonl", "rb") as fh:
            return sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return 0


def run_driver(argv: list[str], cwd: Path, log: Path, run: Path,
               every_s: float) -> tuple[int, float, float, float, list[float]]:
    """(exit code, wall seconds, peak RSS in MB and CPU seconds by wait4, RSS samples each second)
    of the driver; every `every_s` a progress line (attempts journaled so far, the driver's RSS
    now and its peak)."""
    samples: list[float] = []
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            last = time.perf_counter()
            while not done.wait(1.0):
                rss = _rss_mb(proc.pid)
                if rss is not None:
                    samples.append(rss)
                if time.perf_counter() - last >= every_s and samples:
                    last = time.perf_counter()
                    print(f"  {last - t0:7.0f}s  {_journaled(run):7d} attempts journaled  driver RSS "
                          f"{samples[-1]:.0f} MB (peak so far {max(samples):.0f} MB)", flush=True)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
    return (
        proc.returncode,
        time.perf_counter() - t0,
        usage.ru_maxrss / 1024,
        usage.ru_utime + usage.ru_stime,
        samples,
    )


def one_size(n: int, args, address: str, work: Path) -> dict:
    here = work / f"n{n}"
    here.mkdir()
    manifest = here / f"scale{n}.json"
    data = ["--data", args.corpus]
    freeze = [*VALIDATE, "freeze", "--name", f"scale{n}", "--idx-start", "0", "--idx-stop", str(n),
              "--backend", args.backend, "--max-papers", "3", "--corpus", args.corpus, "--min-count", "1",
              "--out", str(manifest), "--allow-patch", *data]
    subprocess.run(freeze, cwd=here, check=True, capture_output=True)
    # A run id no other run on the machine has: attempt storage is labelled by it, and a sandbox
    # opened for another run of the same id sweeps that storage.
    run = here / f"scale{n}-{os.getpid()}"
    argv = [*VALIDATE, "pool", "--manifest", str(manifest), "--run-dir", str(run), "--executor", "ray",
            "--ray-address", address, "-c", str(args.c), "--smoke-sample", "0", "--allow-patch", "--json",
            *data]
    code, wall, peak, cpu, samples = run_driver(argv, here, here / "driver.log", run, args.every)
    # Exit 1: the dataset's verdict is INCOMPLETE, as it must be without the smoke test (skipped here).
    if code not in (0, 1) or not (run / "run.json").is_file():
        tail = (here / "driver.log").read_text()[-2000:]
        raise SystemExit(f"{n} tasks: the driver exited {code}:\n{tail}")
    summary = json.loads((run / "run.json").read_text())
    counts = summary.get("counts", {})
    third = max(1, len(samples) // 3)
    return {"tasks": n, "attempts": counts.get("attempts"), "wall_s": wall, "peak_rss_mb": peak,
            "driver_cpu_s": cpu, "rss_first_third_mb": max(samples[:third], default=0.0),
            "rss_last_third_mb": max(samples[-third:], default=0.0), "evidence_mb": _size(run) / 2**20,
            "compatible": counts.get("compatible")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("-c", type=int, default=4, help="attempts in flight, and the worker nodes' CPUs in all")
    ap.add_argument("--nodes", type=int, default=2, help="worker nodes (each its own raylet)")
    ap.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    ap.add_argument("--keep", type=Path, default=None,
                    help="move each size's run directory here (default: removed)")
    ap.add_argument("--every", type=float, default=120.0,
                    help="seconds between progress lines (default: %(default)s)")
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/corpus/papers.jsonl.gz"))
    args = ap.parse_args()
    from ray.cluster_utils import Cluster  # lazy: the extra `ray`

    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths stay under 108 bytes
    os.environ["RAY_TMPDIR"] = temp
    work = Path(tempfile.mkdtemp(prefix="ray-scale-bench-"))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST_FAILURE})
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=max(1, args.c // args.nodes))
        cluster.wait_for_nodes()
        print(f"deshuffle pool (oracle + every control) on {args.backend}, ray: head + {args.nodes} worker "
              f"nodes, -c {args.c}", flush=True)
        print(f"{'tasks':>6s} {'attempts':>9s} {'wall':>9s} {'att/s':>7s} {'driver peak RSS':>16s} "
              f"{'RSS 1st/last third':>19s} {'driver CPU/att':>15s} {'evidence':>9s}  compatible", flush=True)
        for n in map(int, args.sizes.split(",")):
            r = one_size(n, args, cluster.address, work)
            print(f"{n:6d} {r['attempts']:9d} {r['wall_s']:8.1f}s {r['attempts'] / r['wall_s']:7.1f} "
                  f"{r['peak_rss_mb']:14.0f}MB {r['rss_first_third_mb']:8.0f}/{r['rss_last_third_mb']:.0f}MB "
                  f"{1000 * r['driver_cpu_s'] / r['attempts']:12.1f}ms {r['evidence_mb']:7.1f}MB  "
                  f"{r['compatible']}/{n}",
                  flush=True)
            print(json.dumps(r), flush=True)
            if args.keep is None:
                shutil.rmtree(work / f"n{n}", ignore_errors=True)
            else:
                shutil.move(work / f"n{n}", args.keep / f"n{n}")
    finally:
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
