"""The ``ray`` executor against ``threads`` on the same pool, in one invocation.

    python bench/executor_bench.py [--tasks 100] [-c N] [--backend bwrap|docker] [--rounds 3]
        [--floor-tasks 3000]

One contract (the deshuffle oracle and five controls on `--tasks` tasks) is frozen once and run
through each executor in a fresh process of its own (its peak RSS its own): ``threads``, and
``ray`` on a local Ray this bench starts (a single node with `-c` CPUs, ``ray.init`` in the
child; stopped with it), `--rounds` times, alternating which goes first. Prints the time to
start Ray (apart), the run's wall time, attempts/s, driver peak RSS and CPU per attempt per
executor (the whole machine's busy CPU, from /proc/stat, so run it on an idle machine; and the
driver process's own) and the ratio of their attempts/s (each round's, and all rounds' attempts
over their wall time); the ray run includes starting its worker processes and rebuilding the
runner's worker in each (verify the contract, load the taskset). Last, Ray's floor: the busy CPU
of empty Ray tasks (`--floor-tasks`, `-c` in flight), as a share of the threads executor's CPU
per attempt, in four shapes: calls to each of `-c` actors (the executor's: a slot per call in
flight) carrying one item, and carrying eight (the most a call of the executor carries, per
item) — what no harness change can take off the ray executor on this machine — and for
comparison the streaming task the executor used before (where it runs, then its results) and a
plain task of one return.
Target: the ray executor's overhead on one machine ≤ 10 %.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from validate.cli.options import DEFAULT_CONCURRENCY  # noqa: E402

CONTROLS = "empty,shuffled,identity,reversed,malformed"

CHILD = r"""
import json, os, resource, shutil, sys, tempfile, time
from pathlib import Path
from environment.protocol import LoadHints
from validate.core import environments
from validate.contract.manifest import check_environment, freeze
from validate.evidence.patches import code_state
from validate.core.paths import DEFAULT_IMAGE, RunPaths
from validate.run.phases import RunPhase, run_agents
from validate.run.context import RunContext
from validate.run.executors import make_executor
from validate.sandbox import open_sandbox

executor, backend, n, c, corpus_path, controls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5], sys.argv[6]
hints = LoadHints(search=(Path(corpus_path),))
env = environments.get("deshuffle-papers")
sandbox = open_sandbox(backend, image=DEFAULT_IMAGE, run_label=f"xbench-{executor}")
config = env.Config(corpus=corpus_path, min_papers=1, max_papers=3)
manifest = freeze(name="xbench", env_name=env.name, config=config, hints=hints, idx=list(range(n)), rule="bench",
                  facts=sandbox.facts(), controls=controls.split(","), git_commit=code_state().label)
root = Path(tempfile.mkdtemp(prefix="executor-bench-"))
try:
    t0 = time.perf_counter()
    if executor == "ray":
        import ray
        ray.init(num_cpus=c, include_dashboard=False, log_to_driver=False)
    start_s = time.perf_counter() - t0
    def machine_cpu_s():  # busy CPU of the whole machine (sandboxes, Ray's processes, this one)
        v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
    cpu0, self0 = machine_cpu_s(), time.process_time()
    t0 = time.perf_counter()
    env, _, taskset = check_environment(manifest, hints)
    ctx = RunContext(env=env, manifest=manifest, taskset=taskset, sandbox=sandbox, paths=RunPaths(root / "run"),
                     executor=make_executor(executor, c), run_id=f"xbench-{executor}", code=code_state(), hints=hints)
    summary = run_agents(ctx, RunPhase())
    wall = time.perf_counter() - t0
    cpu_s, self_s = machine_cpu_s() - cpu0, time.process_time() - self0
finally:
    sandbox.close()
    shutil.rmtree(root, ignore_errors=True)
    if executor == "ray":
        ray.shutdown()
print(json.dumps({"executor": executor, "attempts": summary.counts.attempts, "wall_s": wall, "start_s": start_s,
                  "compatible": summary.counts.compatible, "cpu_s": cpu_s, "driver_cpu_s": self_s,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""  # noqa: E501

# Ray's own cost per task on this machine, apart from any harness work, `c` in flight as the
# executor keeps them: calls to `c` actors (the executor's shape: a slot per call in flight,
# `_SlotActor.play`) of one item and of `MAX_CALL` items (per item) and, for comparison, the
# streaming task the executor used before (yielding where it runs, then a short list) and
# plain tasks of one return.
FLOOR = r"""
import json, os, sys, time
import ray
from validate.run.executors.ray import MAX_CALL
c, n = int(sys.argv[1]), int(sys.argv[2])
ray.init(num_cpus=c, include_dashboard=False, log_to_driver=False)
def busy():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
def streaming(i):
    yield {"node": "n", "host": "h"}
    yield [i, i, i]
def plain(i):
    return {"node": "n", "host": "h"}, [i, i, i]
class Slot:  # an actor per slot in flight: each call one or a few items
    def play(self, i):
        return {"node": "n", "host": "h"}, [i, i, i]
    def play_many(self, ii):
        return [({"node": "n", "host": "h"}, [i, i, i]) for i in ii]
def timed(submit, items, per=1):  # `c` in flight, the next submitted as one finishes; busy CPU per item
    cpu0, todo, running = busy(), iter(range(0, n, per)), {}
    for slot in range(c):
        running[submit(slot, next(todo))] = slot
    while running:
        ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
        for ref in ready:
            slot = running.pop(ref)
            for _ in range(items):
                ray.get(next(ref))
            if not items:
                ray.get(ref)
            if (i := next(todo, None)) is not None:
                running[submit(slot, i)] = slot
    return (busy() - cpu0) / (len(range(0, n, per)) * per)
out = {}
for name, f, items in (("streaming", ray.remote(max_retries=0, num_returns="streaming")(streaming), 2),
                       ("plain", ray.remote(max_retries=0)(plain), 0)):
    for warm in [f.remote(0) for _ in range(c)]:  # the worker processes started, apart from the timing
        ray.get(next(warm) if items else warm)
    out[name] = timed(lambda slot, i: f.remote(i), items)
slots = [ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(Slot).remote() for _ in range(c)]
ray.get([s.play.remote(0) for s in slots])
out["actor"] = timed(lambda slot, i: slots[slot].play.remote(i), 0)
out[f"actor, {MAX_CALL} a call"] = timed(lambda slot, i: slots[slot].play_many.remote(list(range(i, i + MAX_CALL))), 0,
                                       MAX_CALL)
ray.shutdown()
print(json.dumps(out))
"""  # noqa: E501


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--backend", default="bwrap", choices=["bwrap", "docker"])
    ap.add_argument("-c", type=int, default=DEFAULT_CONCURRENCY,
                    help="attempts at once, and the local Ray's CPUs (default: the harness's, %(default)s)")
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared/corpus/papers.jsonl.gz"))
    ap.add_argument("--floor-tasks", type=int, default=3000, help="empty Ray tasks timed for Ray's floor")
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of each executor, alternating which goes first; the ratio is of all their "
                         "attempts over all their wall time (this machine's speed drifts by several %% "
                         "between runs minutes apart; default %(default)s)")
    args = ap.parse_args()
    if args.rounds < 1 or args.tasks < 1:
        ap.error("--rounds and --tasks must be at least 1")
    print(f"{args.tasks} tasks × oracle,{CONTROLS} on {args.backend}; concurrency {args.c}")
    print(f"{'executor':8s} {'start':>7s} {'attempts':>9s} {'wall':>9s} {'attempts/s':>11s} {'peak RSS':>9s} "
          f"{'CPU/attempt (machine, driver)':>30s}  compatible")
    attempts: dict[str, int] = {"threads": 0, "ray": 0}
    wall: dict[str, float] = {"threads": 0.0, "ray": 0.0}
    cpu: dict[str, float] = {"threads": 0.0, "ray": 0.0}
    ratios = []
    for n in range(args.rounds):
        # Alternate which goes first (threads, ray; ray, threads; ...): a drift of the machine's
        # speed during a round then weighs on both alike over an even number of rounds.
        rate = {}
        for executor in ("threads", "ray") if n % 2 == 0 else ("ray", "threads"):
            out = subprocess.run([sys.executable, "-c", CHILD, executor, args.backend, str(args.tasks),
                                  str(args.c), args.corpus, CONTROLS], cwd=ROOT, capture_output=True,
                                 text=True)
            if out.returncode != 0:
                sys.exit(f"{executor}: the run failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rate[executor] = r["attempts"] / r["wall_s"]
            attempts[executor] += r["attempts"]
            wall[executor] += r["wall_s"]
            cpu[executor] += r["cpu_s"]
            print(f"{executor:8s} {r['start_s']:6.1f}s {r['attempts']:9d} {r['wall_s']:8.1f}s "
                  f"{rate[executor]:11.2f} {r['peak_rss_mb']:7.0f}MB "
                  f"{1000 * r['cpu_s'] / r['attempts']:17.1f} ms "
                  f"{1000 * r['driver_cpu_s'] / r['attempts']:6.1f} ms  {r['compatible']}")
        ratios.append(rate["ray"] / rate["threads"])
        if args.rounds > 1:
            print(f"  round {n + 1}: ray / threads attempts/s {ratios[-1]:.2f}")
    ratio = (attempts["ray"] / wall["ray"]) / (attempts["threads"] / wall["threads"])
    over = (
        f" over {args.rounds} rounds (all attempts / all wall time; "
        f"rounds {min(ratios):.2f}–{max(ratios):.2f})"
        if args.rounds > 1
        else ""
    )
    print(f"ray / threads attempts/s: {ratio:.2f} (overhead {100 * (1 - ratio):.1f} %){over}")
    cpu_per_attempt = {executor: cpu[executor] / attempts[executor] for executor in cpu}
    out = subprocess.run([sys.executable, "-c", FLOOR, str(args.c), str(args.floor_tasks)], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"Ray's floor: the run failed:\n{out.stderr[-3000:]}")
    floor = json.loads(out.stdout.strip().splitlines()[-1])
    per_attempt = cpu_per_attempt["threads"]
    print(f"Ray's floor, {args.floor_tasks} empty tasks, {args.c} in flight (machine busy CPU per task): "
          + ", ".join(f"{name} {1000 * v:.2f} ms ({100 * v / per_attempt:.1f} % of a threads attempt)"
                      for name, v in floor.items()))


if __name__ == "__main__":
    main()
