"""Task images at scale: builds per minute, each distinct image built once, disk per image,
and the disk budget's pruning.

    python bench/taskimage_bench.py [-n 60] [--distinct 20] [--kb 256]

Generates `n` Harbor tasks in a temporary directory, sharing the two core bases (half
``FROM python:3.11-slim-bookworm``, half ``FROM debian:bookworm-slim``); only `distinct` of
them differ in content (a file of `kb` KiB each, salted per run so no earlier run's layers
help), the rest repeat one of those, as a generated dataset's tasks do. Then, with a fresh
task-image store (the bases are the image store's, built once):

1. **cold**: `freeze_images` of every task (the fixed build clock, content digests recorded),
   counting the builds the backend is asked for: each distinct image once;
2. **warm**: the same freeze again: nothing built;
3. **budget**: after a freeze of a second salt, this bench's images held to a budget a few
   images wide (`validate.taskdir.images.budget.prune`, counting and removing only its own): the
   oldest pruned first, each logged.

It prints builds per minute, tasks per minute, the share of the freeze spent reading content
digests, the warm/cold ratio, and the disk each task image holds beyond its base (the daemon's
own accounting), then removes every image it built (by id). Run it against a daemon you
started (``DOCKER_HOST``; the suite's `tests.dockerd` starts a private one) whose image store
(``VALIDATE_IMAGE_DIR``) has the bases or can build them (mmdebstrap).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from environment.harbor.env import HarborEnvironment  # noqa: E402
from validate.core.paths import task_image_store  # noqa: E402
from validate.sandbox.image import SOURCE_DATE_EPOCH  # noqa: E402
from validate.taskdir.images import content as content_mod  # noqa: E402
from validate.taskdir.images.budget import prune, task_image_usage  # noqa: E402
from validate.taskdir.images.build import BuildPolicy  # noqa: E402
from validate.taskdir.images.docker import DockerImages  # noqa: E402
from validate.taskdir.images.frozen import freeze_images  # noqa: E402

TOML = "[verifier]\ntimeout_sec = 60\n[agent]\ntimeout_sec = 60\n"


class Counting(DockerImages):
    def __init__(self) -> None:
        super().__init__()
        self.builds = 0

    def build(self, *args, **kwargs):
        self.builds += 1
        return super().build(*args, **kwargs)


def generate(root: Path, n: int, distinct: int, kb: int, salt: str) -> None:
    for i in range(n):
        family = i % distinct
        task = root / f"task-{i:04d}"
        for sub in ("environment", "solution", "tests"):
            (task / sub).mkdir(parents=True)
        (task / "task.toml").write_text(TOML)
        (task / "instruction.md").write_text("Write the answer to /app/out.\n")
        base = "python:3.11-slim-bookworm" if family % 2 else "debian:bookworm-slim"
        (task / "environment/Dockerfile").write_text(
            f"FROM {base}\nWORKDIR /app\nCOPY data.bin /app/data.bin\n"
            "RUN sha256sum /app/data.bin > /app/sum\n")
        prefix = f"{salt}-{family}-".encode()
        block = (prefix * (1024 // len(prefix) + 1))[:1024]
        (task / "environment/data.bin").write_bytes(block * kb)
        (task / "solution/solve.sh").write_text("#!/bin/bash\necho 1 > /app/out\n")
        (task / "tests/test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")


def freeze(data: Path, store: Path, builder, policy: BuildPolicy, log=lambda m: None,
           budget: int | None = None):
    env = HarborEnvironment()
    ts = env.load(env.Config(dataset=str(data)))
    return freeze_images(ts, range(ts.size), "docker", store / "logs", store, builder=builder, log=log,
                         policy=policy, budget_bytes=budget)


def timed_content():
    """Wrap the content reader to total its time."""
    spent = [0.0]
    real = content_mod.image_content

    def wrapped(*args, **kwargs):
        t = time.monotonic()
        try:
            return real(*args, **kwargs)
        finally:
            spent[0] += time.monotonic() - t

    content_mod.image_content = wrapped
    return spent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=60)
    p.add_argument("--distinct", type=int, default=20)
    p.add_argument("--kb", type=int, default=256)
    a = p.parse_args()
    policy = BuildPolicy(clock=SOURCE_DATE_EPOCH)
    spent = timed_content()
    made: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="taskimage-bench-") as tmp:
        tmp = Path(tmp)
        store = tmp / "store"
        store.mkdir()
        (store / "bases").symlink_to(task_image_store() / "bases")
        counting = Counting()
        # the bases first: not part of the builds timed
        from validate.taskdir.images.bases import build_base_map

        build_base_map(counting, store / "bases", log=lambda m: None)
        generate(tmp / "ds", a.n, a.distinct, a.kb, secrets.token_hex(4))
        t = time.monotonic()
        cold = freeze(tmp / "ds", store, counting, policy)
        cold_s = time.monotonic() - t
        made |= {e.image for e in cold.tasks.values() if e.image}
        builds, content_s = counting.builds, spent[0]
        t = time.monotonic()
        freeze(tmp / "ds", store, counting, policy)
        warm_s = time.monotonic() - t
        usage = {i: own for i, _, own in task_image_usage(counting.client)}
        own = [usage[i] for i in made if i in usage]
        print(f"{a.n} tasks, {a.distinct} distinct contents, {a.kb} KiB each, two core bases")
        print(f"cold freeze: {cold_s:.1f} s, {builds} builds ({builds / a.distinct:.2f} per distinct image), "
              f"{builds / (cold_s / 60):.1f} builds/min, {a.n / (cold_s / 60):.1f} tasks/min; content "
              f"digests {content_s:.1f} s ({content_s / cold_s:.0%} of the freeze)")
        print(f"warm freeze: {warm_s:.1f} s, {counting.builds - builds} builds; warm/cold = "
              f"{warm_s / cold_s:.3f}")
        print(f"disk per task image beyond its base: mean {sum(own) / len(own) / 2**10:.0f} KiB, max "
              f"{max(own) / 2**10:.0f} KiB (the data file: {a.kb} KiB)")
        pruned: list[str] = []
        generate(tmp / "ds2", a.distinct, a.distinct, a.kb, secrets.token_hex(4))
        again = freeze(tmp / "ds2", store, counting, policy)
        kept = {e.image for e in again.tasks.values() if e.image}
        made |= kept
        budget = 3 * max(own)
        # only this bench's images are counted and pruned: never what else the daemon holds
        prune(counting.client, budget, keep=set(), log=pruned.append, only=made)
        left = sum(o for i, _, o in task_image_usage(counting.client) if i in made)
        print(f"budget {budget / 2**10:.0f} KiB: {len(pruned)} images pruned, each logged "
              f"(e.g. {pruned[0] if pruned else '-'}); this bench's images now hold {left / 2**10:.0f} KiB")
        for image in made:
            try:
                counting.client.api.remove_image(image, force=True)
            except Exception:  # pruned already
                pass
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
