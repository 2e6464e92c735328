"""Harbor 0.25.0 itself beside this harness: the same task directories, one private dockerd,
one invocation — trials per second and every task's outcome, side by side.

    python bench/harbor_anchor_bench.py --harbor-root DIR [--dataset examples/harbor-sample]
        [-c 4] [--rounds 1] [--tasks a,b,...] [--keep DIR]

Harbor needs Python >= 3.12; this machine's is 3.11. So the bench builds, once, into
``--harbor-root`` (`harbor_anchor.harbor.ensure_root`): a Debian trixie root filesystem
(``mmdebstrap trixie`` with python3.13, python3-venv, docker-cli and docker-compose v2) with
this machine's CA bundle copied in (pip's TLS goes through whatever proxy the machine's own
trust store vouches for) and a venv holding ``harbor==0.25.0`` from PyPI. Harbor runs from
that root under bubblewrap: read-only, in a network namespace of its own holding only
loopback, the bench's dockerd socket bound in, ``DOCKER_BUILDKIT=0`` (BuildKit needs docker's default
bridge, and the daemon has none), ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and
``HARBOR_TELEMETRY=0`` (no fetch, no report at start).

The bench starts one private dockerd of its own (socket, data-root, exec-root, pidfile and
cgroup parent under a fresh temporary directory; ``--bridge=none --iptables=false``; its
registry proxy a closed loopback port, so any pull fails on this machine instead of leaving
it) and, in it: the sandbox image (``validate image build``), the harness's offline bases
(an unmeasured ``validate freeze`` of a one-task dataset the bench writes imports them), those bases tagged
under the upstream names the tasks' Dockerfiles ask for (``python:3.11-slim-bookworm``,
``debian:bookworm-slim``, …) so Harbor's builds find them, and the clearly labelled local
stand-ins Harbor's egress control needs (`harbor_anchor.harbor`: its pinned alpine probe
and gost sidecar cannot be pulled here). Harbor's compose project network is made internal.
`docs/harbor.md` says what these change in Harbor's outcomes.

Then, ``--rounds`` times, at concurrency ``-c`` on each side:

- **cold**, each side after every image but the bases and stand-ins is removed: Harbor's one
  job with agents ``oracle`` and ``nop`` (``harbor run -c CONFIG``: the same trials as
  ``harbor run -a oracle`` then ``-a nop``, in one queue); ours, ``validate freeze --env
  harbor`` (every task image built) + ``validate run --agents oracle,nop``; and ours again
  with the default contract (``validate run``: the oracle and every control);
- **warm**, in the reverse order, nothing removed, after an unmeasured freeze has made sure
  the daemon holds every task's image: our freeze finds each image by its content digest;
  Harbor's classic builds find every layer of the same Dockerfiles on the same bases in the
  daemon's build cache (its own ``compose down --rmi local`` removes its images after every
  trial, so under its defaults it never warms itself).

The next round reverses the cold order. The bench prints each measurement's trials (played:
an agent ran; recorded: also those that ended before), wall time, trials/s (played over
wall; ours: freeze + run) and where the median trial's time went, then over all rounds each
side's trials/s and the ratios, and a table of every task: Harbor's
reward or exception per agent next to our oracle's and nop's outcome and our verdict and
reason (from the first round's cold runs; a task whose outcome changed in a later
measurement is listed). It removes every container, network, volume and image it made,
stops only the daemon it started, by its pidfile, and deletes its directory (``--keep DIR``
keeps Harbor's job directories, our manifests and run directories, and ``summary.json``).
When the trixie root cannot be built it says why and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harbor_anchor import (  # noqa: E402
    BenchError,
    Measurement,
    harbor as hh,  # noqa: E402
    ours,
)
from harbor_anchor.daemon import BenchDaemon  # noqa: E402
from validate.cli.options import DEFAULT_CONCURRENCY  # noqa: E402

SIDES = ("harbor", "ours-oracle-nop", "ours-default")


def measure(side: str, temp: str, n: int, ctx: dict) -> Measurement:
    """One measurement of `side`; `temp` ('cold'/'warm') and `n` name its outputs."""
    name = f"{side}-{temp}-{n + 1}"
    if side == "harbor":
        m = hh.run_harbor(ctx["rootfs"], ctx["daemon"], ctx["dataset"], ctx["work"], name, ctx["c"])
    else:
        agents = ",".join(hh.AGENTS) if side == "ours-oracle-nop" else None
        m = ours.run_ours(ctx["daemon"], ctx["dataset"], ctx["work"], name, ctx["c"], agents)
    return dataclasses.replace(m, temp=temp, round=n + 1)


def one_round(n: int, order: tuple[str, ...], ctx: dict, log) -> list[Measurement]:
    out = []
    for side in order:
        ctx["daemon"].purge()
        log(f"round {n + 1}, cold: {side} ...")
        out.append(measure(side, "cold", n, ctx))
        log(f"  {out[-1].line()}")
    log(f"round {n + 1}: an unmeasured freeze so the daemon holds every task image ...")
    ours.freeze(ctx["daemon"], ctx["dataset"], ctx["work"], f"prime-{n + 1}")
    for side in reversed(order):
        log(f"round {n + 1}, warm: {side} ...")
        out.append(measure(side, "warm", n, ctx))
        log(f"  {out[-1].line()}")
    return out


def rates(ms: list[Measurement], side: str, temp: str) -> tuple[int, int, float]:
    picked = [m for m in ms if m.side == side and m.temp == temp]
    return sum(m.played for m in picked), sum(m.trials for m in picked), sum(m.wall_s for m in picked)


def code_state() -> str:
    """The checkout's commit, and whether it had uncommitted changes (the runs record the diff)."""
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "--short=12", "HEAD") + (" + uncommitted changes" if git("status", "--porcelain")
                                                     else "")


def print_figures(ms: list[Measurement], a: argparse.Namespace, load: tuple[str, str]) -> dict:
    print(f"\nharbor_anchor_bench -c {a.c}, {a.rounds} round(s), {len(list(a.dataset_copy.iterdir()))} "
          f"tasks, code {code_state()}; load average before {load[0]}, after {load[1]}")
    print("trials/s = trials played (an agent ran) over wall time (ours: freeze + run), all rounds")
    figures: dict = {}
    for temp in ("cold", "warm"):
        for side in SIDES:
            played, trials, wall = rates(ms, side, temp)
            figures[f"{side}/{temp}"] = {"played": played, "recorded": trials, "wall_s": round(wall, 1),
                                         "trials_per_s": round(played / wall, 3)}
            print(f"  {temp:4s} {side:16s} {played:5d} played ({trials:4d} recorded) in {wall:7.1f} s "
                  f"= {played / wall:6.3f} trials/s")
        h = figures[f"harbor/{temp}"]["trials_per_s"]
        for side in SIDES[1:]:
            r = figures[f"{side}/{temp}"]["trials_per_s"] / h
            figures[f"ratio {side} / harbor, {temp}"] = round(r, 2)
            print(f"  {temp:4s} ratio {side} / harbor: {r:.2f}")
    return figures


def print_table(ms: list[Measurement]) -> list[dict]:
    """Every task: Harbor's outcome per agent, ours per agent, our verdict (first round's cold runs)."""
    first: dict[str, Measurement] = {}
    for m in ms:
        if m.temp == "cold":
            first.setdefault(m.side, m)
    h, o, d = first["harbor"], first["ours-oracle-nop"], first["ours-default"]
    tasks = sorted(set(h.outcomes) | set(o.outcomes) | set(d.verdicts))
    rows = [{"task": t, "harbor_oracle": h.outcomes.get(t, {}).get("oracle", "-"),
             "harbor_nop": h.outcomes.get(t, {}).get("nop", "-"),
             "our_oracle": o.outcomes.get(t, {}).get("oracle", "-"),
             "our_nop": o.outcomes.get(t, {}).get("nop", "-"),
             "our_verdict": " ".join(d.verdicts.get(t, ("-", ""))).strip(),
             "our_detail": d.details.get(t, "")}
            for t in tasks]
    columns = ["task", "harbor_oracle", "harbor_nop", "our_oracle", "our_nop", "our_verdict"]
    width = {k: max(len(k), *(len(r[k]) for r in rows)) for k in columns}
    print("\n" + "  ".join(k.replace("_", " ").ljust(width[k]) for k in columns).rstrip())
    for r in rows:
        print("  ".join(r[k].ljust(width[k]) for k in columns).rstrip())
    excluded = [r for r in rows if r["our_detail"] and not r["our_verdict"].startswith("compatible")]
    if excluded:
        print("\nour exclusions' details (first line, 240 characters; summary.json has them whole):")
        for r in excluded:
            print(f"  {r['task']}: {r['our_detail'].splitlines()[0][:240]}")
    said = lambda m, t: (m.outcomes.get(t), m.verdicts.get(t))  # noqa: E731
    changed = [f"{t}: {m.side} {m.temp} round {m.round} {said(m, t)}, first cold {said(first[m.side], t)}"
               for m in ms for t in sorted(set(m.outcomes) | set(m.verdicts))
               if said(m, t) != said(first[m.side], t)]
    if changed:
        print("\noutcomes (per agent) and verdicts that differ from the same side's first cold measurement:")
        for line in changed:
            print(f"  {line}")
    return rows


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--harbor-root", type=Path, required=True,
                   help="where the trixie root with Harbor is built once and kept (reused when complete)")
    p.add_argument("--dataset", type=Path, default=ROOT / "examples/harbor-sample",
                   help="a directory of Harbor task directories (default examples/harbor-sample)")
    p.add_argument("-c", type=int, default=DEFAULT_CONCURRENCY,
                   help=f"trials at once, each side (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--rounds", type=int, default=1, help="rounds of cold and warm measurements (default 1)")
    p.add_argument("--tasks", help="only these task directories, comma-separated (a quick look)")
    p.add_argument("--keep", type=Path, help="keep the outputs in this new or empty directory (Harbor's "
                   "jobs, our manifests, run directories and logs, summary.json); default: a "
                   "temporary one, removed")
    a = p.parse_args(argv)
    if a.c < 1 or a.rounds < 1:
        p.error("-c and --rounds must be at least 1")
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    # Stopped by SIGTERM (a timeout) or SIGINT (even when started in the background, where the
    # shell ignores it), the bench still removes what it made and stops its daemon.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    work = None
    try:
        rootfs = hh.ensure_root(a.harbor_root.resolve(), log)
        if a.keep is not None and a.keep.exists() and any(a.keep.iterdir()):
            raise BenchError(f"--keep {a.keep}: not empty (Harbor would resume a job of the same "
                             "name); name a new one")
        work = Path(tempfile.mkdtemp(prefix="hab-", dir="/tmp")) if a.keep is None else a.keep.resolve()
        work.mkdir(parents=True, exist_ok=True)
        a.dataset_copy = hh.copy_dataset(a.dataset.resolve(), work / "dataset", a.tasks)
        return measure_all(a, rootfs, work, log)
    except BenchError as e:
        print(f"harbor_anchor_bench: {e}", file=sys.stderr)
        return 2
    except docker.errors.DockerException as e:  # the daemon itself failed: no verdict on either side
        print(f"harbor_anchor_bench: the bench's dockerd failed: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("harbor_anchor_bench: interrupted (what it made is removed)", file=sys.stderr)
        return 130
    finally:
        if work is not None and a.keep is None:
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)


def measure_all(a: argparse.Namespace, rootfs: Path, work: Path, log) -> int:
    """Start the daemon, prepare it, measure every round, print; always clean up what was made."""
    daemon = BenchDaemon(Path(tempfile.mkdtemp(prefix="hab", dir="/tmp")))
    load_before = "%.2f %.2f %.2f" % os.getloadavg()
    try:
        try:
            daemon.start()
        except RuntimeError as e:
            raise BenchError(f"the bench's dockerd did not start: {e}") from None
        log(f"private dockerd on {daemon.host}; preparing its images ...")
        base_map = ours.prepare(daemon, work, log)
        hh.prepare(daemon, base_map, work, log)
        daemon.mark_baseline()
        ctx = {"rootfs": rootfs, "daemon": daemon, "dataset": a.dataset_copy, "work": work, "c": a.c}
        ms: list[Measurement] = []
        for n in range(a.rounds):
            ms += one_round(n, SIDES if n % 2 == 0 else tuple(reversed(SIDES)), ctx, log)
        figures = print_figures(ms, a, (load_before, "%.2f %.2f %.2f" % os.getloadavg()))
        rows = print_table(ms)
        (work / "summary.json").write_text(json.dumps(
            {"figures": figures, "tasks": rows, "measurements": [m.summary() for m in ms]},
            indent=1, sort_keys=True) + "\n")
        return 0
    finally:
        daemon.close()


if __name__ == "__main__":
    sys.exit(main())
