"""Harbor trials under bwrap (`validate.taskdir.trial.bwrap`): the task image built in the suite's own
dockerd, exported and unpacked once, each trial on an overlay of it, every process uid 65534.

What is shown: a sound task of the sample passes the oracle and fails nop; the sample's task
whose solve.sh needs root (``dpkg -i``) fails there and passes under docker; the reward
forger's files and background rewriter do not reach the verifier; the contract's limits
(memory, pids, storage, file size, network) hold in the agent's phase; nothing — no mount, no
cgroup, no process, no directory — is left after a trial; and the execution profile says the
profile is rootless, what root is, and how each limit is enforced.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import docker
import pandas as pd
import pytest

from environment.harbor.taskdir import HarborTask, load_task
from validate.core.paths import DEFAULT_IMAGE
from validate.core.records import ORACLE
from validate.sandbox import storage
from validate.sandbox.base import Limits
from validate.sandbox.docker.wire import LABEL
from validate.taskdir.trial import bwrap as bwrap_trial, docker as dk
from validate.taskdir.trial.agents import NOP, REWARD_FORGER
from validate.taskdir.trial.result import TrialLimits
from validate.taskdir.trial.roots import TREE_UID, task_root, tree_store
from validate.taskdir.trial.run import run_trial

pytestmark = [pytest.mark.bwrap, pytest.mark.docker]

SAMPLE = Path(__file__).resolve().parents[1] / "examples/harbor-sample"
IMAGE_LABEL = f"{LABEL}.test-task-image"
LIMITS = TrialLimits(cpus=1, memory_mb=256, pids=64, max_agent_timeout_s=60, max_verifier_timeout_s=60)
CONTRACT = Limits(memory_mb=256, pids=64, storage_mb=32, storage_inodes=2048, max_file_mb=8)

#: Probes of the agent's phase, each line "name value"; the verifier always writes 1.
PROBE = textwrap.dedent("""\
    #!/bin/bash
    echo "uid $(id -u)"
    echo "ifaces $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ' ')"
    python3 -c 'b = bytearray(300 * 2**20); print("allocated")' 2>/dev/null || echo "alloc-failed $?"
    head -c 20000000 /dev/zero > /app/big 2>/dev/null; echo "bigfile $(stat -c %s /app/big 2>/dev/null)"
    rm -f /app/big
    printf '#!/bin/sh\\necho ran\\n' > /app/x.sh && chmod +x /app/x.sh && echo "exec $(/app/x.sh)"
    for i in $(seq 1 40); do head -c 1000000 /dev/zero > /app/fill.$i 2>/dev/null || { echo "storage-full-at $i"; break; }; done
    rm -f /app/fill.*
    python3 -c 'import os
    n = 0
    try:
        while n < 200:
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "5"])
            n += 1
    except OSError:
        pass
    print("forked", n)'
    """)  # noqa: E501


#: Images this module built (its own dockerd's ids, never seen again): their unpacked trees
#: are removed at the end, so the tree store does not grow by a session's worth each time.
MADE: set[str] = set()


@pytest.fixture(scope="module")
def client():
    c = docker.from_env(timeout=120)
    yield c
    dk.sweep(c.api, f"{IMAGE_LABEL}=1")
    for image_id in MADE:
        storage.remove_tree(tree_store() / image_id.removeprefix("sha256:"))


def _build(client, root: Path, name: str) -> tuple[HarborTask, Path, str]:
    dockerfile = root / name / "environment/Dockerfile"
    text = dockerfile.read_text()
    for base in ("python:3.11-slim-bookworm", "debian:bookworm-slim"):
        text = text.replace(f"FROM {base}", f"FROM {DEFAULT_IMAGE}")
    dockerfile.write_text(text)
    task = load_task(root, name)
    assert isinstance(task, HarborTask), task
    image, _ = client.images.build(path=str(root / name / "environment"), labels={IMAGE_LABEL: "1"},
                                   network_mode="none", rm=True, forcerm=True)
    MADE.add(image.id)
    return task, root / name, image.id


@pytest.fixture(scope="module")
def tasks(tmp_path_factory, client) -> dict[str, tuple[HarborTask, Path, str]]:
    """Two tasks of the sample (FROM the sandbox image, which stands in for their bases) and a
    probe of the limits."""
    root = tmp_path_factory.mktemp("bwrap-trial")
    for name in ("csv-to-json", "install-local-deb"):
        shutil.copytree(SAMPLE / name, root / name)
    probe = root / "probe"
    shutil.copytree(SAMPLE / "csv-to-json", probe)
    (probe / "solution/solve.sh").write_text(PROBE)
    (probe / "tests/test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return {name: _build(client, root, name) for name in ("csv-to-json", "install-local-deb", "probe")}


@pytest.fixture(scope="module")
def bwrap(sandboxes):
    return sandboxes("bwrap")


def trial(bwrap, client, tasks, name, agent):
    task, task_dir, image = tasks[name]
    return bwrap_trial.run_trial(bwrap, client, task, task_dir, image, agent, LIMITS, CONTRACT)


def _leftovers(bwrap) -> list[str]:
    left = [f"cgroup {n}" for n in bwrap.hierarchy.names(bwrap.run_label)]
    base = storage.DEFAULT_PARENT / bwrap.run_label
    left += [f"storage {p.name}" for p in base.iterdir()] if base.is_dir() else []
    mounts = Path("/proc/self/mountinfo").read_text()
    left += [line for line in mounts.splitlines() if f"/{bwrap.run_label}/trial-" in line]
    for pid in filter(str.isdigit, os.listdir("/proc")):  # this session's only: others run bwrap too
        try:
            mine = bwrap.run_label in Path(f"/proc/{pid}/cgroup").read_text() or \
                str(base) in os.readlink(f"/proc/{pid}/root")
            if mine:
                left.append(f"process {pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:80]!r}")
        except OSError:
            continue
    return left


def test_a_sound_task_passes_the_oracle_and_fails_nop(bwrap, client, tasks):
    r = trial(bwrap, client, tasks, "csv-to-json", ORACLE)
    assert (r.status, r.reward, r.cleanup_errors) == ("ok", 1.0, []), r
    assert r.agent_run.exit_code == 0
    r = trial(bwrap, client, tasks, "csv-to-json", NOP)
    assert (r.status, r.reward) == ("ok", 0.0), r
    assert _leftovers(bwrap) == []


def test_a_task_whose_solution_needs_root_fails_here_and_passes_under_docker(bwrap, client, tasks):
    r = trial(bwrap, client, tasks, "install-local-deb", ORACLE)
    assert (r.status, r.reward) == ("ok", 0.0), r
    assert r.agent_run.exit_code == 2 and "requires superuser privilege" in r.agent_run.stdout
    task, task_dir, image = tasks["install-local-deb"]
    # docker's trusted verifier: the package dpkg installed is outside the task's work paths, so
    # it does not reach the verifier, which passes only in the agent's own container (replayed)
    on_docker = run_trial(client, task, task_dir, image, ORACLE, LIMITS, run_label="pytest-bwrap-trial",
                          replay_below=1.0)
    assert (on_docker.status, on_docker.reward, on_docker.shared_reward) == ("ok", 0.0, 1.0), (
        on_docker.infrastructure_error, on_docker.task_error, on_docker.verifier_error)
    assert [c for c in on_docker.outside_changes if c.path.startswith("/var/lib/dpkg/")], (
        on_docker.outside_changes
    )
    assert _leftovers(bwrap) == []


def test_the_forgers_files_and_rewriter_do_not_reach_the_verifier(bwrap, client, tasks):
    r = trial(bwrap, client, tasks, "csv-to-json", REWARD_FORGER)
    assert (r.status, r.reward) == ("ok", 0.0), r
    assert {f.path for f in r.left_in_verifier_dir} >= {"reward.txt", "reward.json"}
    assert set(r.verifier_files) == {"reward.txt", "test-stdout.txt", "test-stderr.txt"}
    assert _leftovers(bwrap) == []


def test_the_contracts_limits_hold_in_the_agents_phase(bwrap, client, tasks):
    r = trial(bwrap, client, tasks, "probe", ORACLE)
    out = dict(line.split(" ", 1) for line in r.agent_run.stdout.splitlines() if " " in line)
    assert out["uid"] == str(TREE_UID), r.agent_run.stdout
    assert out["exec"] == "ran"  # what the agent writes runs (the overlay's writable layer)
    assert out["ifaces"].split() == ["lo"]
    # 300 > 256 MiB
    assert out["alloc-failed"] == "137" and "allocated" not in r.agent_run.stdout.splitlines()
    assert r.agent_run.oom_killed  # read off the phase's memory cgroup
    assert out["bigfile"] == str(8 * 2**20)  # ulimit -f: the contract's max_file_mb
    assert int(out["storage-full-at"]) <= 34  # 1 MB files on the overlay's 32 MiB tmpfs
    assert 20 < int(out["forked"]) < 64, r.agent_run.stdout  # the pids cgroup
    assert r.reward == 1.0 and _leftovers(bwrap) == []


def test_the_image_is_unpacked_once_and_belongs_to_the_sandbox_user(client, tasks):
    _, _, image = tasks["csv-to-json"]
    first = task_root(client, image)
    again = task_root(client, image)
    assert first == again and first.workdir == "/app"
    st = (first.root / "app/people.csv").stat()
    assert (st.st_uid, st.st_gid) == (TREE_UID, TREE_UID)
    assert not any((first.root / "dev").iterdir())  # no device node made


def test_trials_of_one_image_starting_at_once_unpack_it_once(client, tmp_path):
    """A fresh image (its own file, so its own id), asked for by four threads at once."""
    import threading

    (tmp_path / "stamp").write_text(f"{os.getpid()} {tmp_path}\n")
    (tmp_path / "Dockerfile").write_text(f"FROM {DEFAULT_IMAGE}\nCOPY stamp /stamp\n")
    image, _ = client.images.build(path=str(tmp_path), labels={IMAGE_LABEL: "1"}, network_mode="none",
                                   rm=True)
    MADE.add(image.id)
    got, errors = [], []

    def ask():
        try:
            got.append(task_root(client, image.id))
        except Exception as e:  # noqa: BLE001 - collected and asserted on
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(got) == 4 and all(g == got[0] for g in got)
    assert (got[0].root / "stamp").read_text() == (tmp_path / "stamp").read_text()
    assert not [
        p for p in got[0].root.parent.parent.iterdir() if p.name.startswith(f".{got[0].root.parent.name}")
    ]


def test_the_profile_records_rootless_bwrap_and_how_each_limit_is_enforced(bwrap):
    iso = bwrap.facts().isolation
    assert iso is not None and iso.rootless and iso.runtime == "bwrap"
    assert "65534" in iso.root_maps_to
    assert set(Limits.model_fields) <= set(iso.limit_enforcement)


# --- through the trial attempt kind, on both profiles ---------------------------------------------

PAIR = ("csv-to-json", "install-local-deb")


@pytest.fixture(scope="module")
def two_profiles(tmp_path_factory, sandboxes, client):
    """The same contract (two tasks of the sample) run on docker and, frozen `--like` it, on bwrap."""
    from tests.conftest import make_ctx, make_manifest
    from validate.contract.manifest import reprofile
    from validate.core import environments
    from validate.run.phases import RunPhase, run_agents

    env = environments.get("harbor")
    ts = env.load(env.Config(dataset=str(SAMPLE)))
    idx = [i for i in range(ts.size) if ts.task(i).id in PAIR]
    on_docker = make_manifest(sandboxes("docker"), idx=idx, env_name="harbor", dataset=str(SAMPLE),
                              min_task_count=1)
    on_bwrap = reprofile(on_docker, name="pytest-bwrap", facts=sandboxes("bwrap").facts(),
                         limits=on_docker.execution.limits, infra_retries=on_docker.execution.infra_retries)
    runs = {}
    for backend, manifest in (("docker", on_docker), ("bwrap", on_bwrap)):
        run_dir = tmp_path_factory.mktemp(backend) / f"{backend}-run"
        run_agents(make_ctx(manifest, sandboxes(backend), run_dir, concurrency=2), RunPhase())
        runs[backend] = run_dir
    att = pd.read_parquet(runs["bwrap"] / "attempts.parquet")
    MADE.update(json.loads(text)["image"] for text in att["reply_text"].dropna())
    return runs


def test_the_kind_plays_task_directories_on_bwrap_and_the_profiles_differ_where_root_is_needed(two_profiles,
                                                                                                sandboxes,
                                                                                               tmp_path):
    from validate.audit.run import audit
    from validate.report.profiles import compare_profiles

    verdicts = {}
    def reason(tasks, t):
        return tasks.loc[t, "reason"] if isinstance(tasks.loc[t, "reason"], str) else ""

    for backend, run_dir in two_profiles.items():
        tasks = pd.read_parquet(run_dir / "tasks.parquet").set_index("task_id")
        verdicts[backend] = {t: (tasks.loc[t, "verdict"], reason(tasks, t)) for t in PAIR}
        att = pd.read_parquet(run_dir / "attempts.parquet")
        assert set(att["backend"]) == {backend}
        assert audit(run_dir).problems == []
    # docker: the root solution passes only in its own container (the package it installed is
    # outside the work paths); bwrap: no root, so it never installs the package at all
    assert verdicts["docker"] == {"csv-to-json": ("compatible", ""),
                                  "install-local-deb": ("excluded", "needs_system_changes")}
    assert verdicts["bwrap"] == {"csv-to-json": ("compatible", ""),
                                 "install-local-deb": ("excluded", "oracle_fails_on_valid_task")}
    comparison, entry = compare_profiles(two_profiles["docker"], two_profiles["bwrap"], out=tmp_path / "cmp")
    assert [d.task_id for d in comparison.differences] == ["install-local-deb"]
    assert "isolation" in {f for f, _, _ in comparison.profile}
    assert _leftovers(sandboxes("bwrap")) == []
