"""The ``ray`` executor on a real Ray cluster this module starts and stops: a head (no CPUs,
so every attempt runs on a worker node) and two worker nodes, each its own raylet process on
this machine, in a temporary directory of their own; the second starts with an empty image
store of its own. A deshuffle pool through real bubblewrap gives the same verdicts, task
hashes and attempt rows through ``ray`` as through ``threads`` and passes the audit, each row
naming the node and host it ran on; the node with the empty store fetched the image by digest;
a node that cannot get it is that node's infrastructure fault and the verdicts stand; the run
directory is written by the driver only; a driver killed mid-run is resumed with no attempt
played twice, and Ctrl-C on it leaves no sandbox running; a worker node whose raylet is killed
mid-run loses its attempts as infrastructure errors naming the node, and every task is still
judged; a slot lost so is replaced, and its replacement plays the lost attempt again.
Without Ray a command asking for it exits 2 naming the extra; ``validate eval`` refuses ray."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray
from ray._private import ray_constants
from ray.cluster_utils import Cluster

from tests.conftest import CORPUS_PATH, VALIDATE, make_ctx, make_manifest, subprocess_env
from validate.agents import resolve
from validate.audit.run import audit
from validate.contract.manifest import task_list_sha256
from validate.core.paths import DEFAULT_IMAGE, ImagePaths, RunPaths
from validate.evidence.journal import file_sha256, read_attempts
from validate.kinds import kind_of
from validate.run.context import Interrupted, Play
from validate.run.executors import WorkerRecipe, make_executor
from validate.run.executors.ray import CANCEL_GRACE_S, NodeRefused, _sweep_dead_workers
from validate.run.phases import PoolPhase, pool
from validate.run.runner import PlayWorker, pending, worker_from_recipe
from validate.sandbox import Limits
from validate.sandbox.image import rootfs_facts
from validate.sandbox.storage import DEFAULT_PARENT, mount_tmpfs, sweep
from validate.view import pages, tables

pytestmark = [pytest.mark.bwrap, pytest.mark.slow]

KEY = ("phase", "task_id", "task_hash", "agent", "sample", "attempt", "status", "reward", "reply_sha256",
       "as_expected")
VERDICT = ("phase", "task_id", "idx", "task_hash", "verdict", "reason", "oracle_reward", "max_control_reward")
#: Ray's failure detection made quick: a killed raylet is a dead node within seconds, and its
#: worker processes leave within 0.1 s of it (Ray's default: a second), as a node's would when
#: the node dies whole.
FAST_FAILURE = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                "health_check_timeout_ms": 500, "health_check_failure_threshold": 3,
                "raylet_death_check_interval_milliseconds": 100}


def _rows(run, name: str, key: tuple) -> list[tuple]:
    return sorted(tuple(r[k] for k in key) for r in pq.read_table(run / name).to_pylist())


def _node_with_store(c: Cluster, store: Path, **kw):
    """A worker node whose processes see `store` as their image store (VALIDATE_IMAGE_DIR in the
    environment its raylet starts with, as `ray start` on a machine of its own would)."""
    before = os.environ.get("VALIDATE_IMAGE_DIR")
    os.environ["VALIDATE_IMAGE_DIR"] = str(store)
    try:
        return c.add_node(num_cpus=1, **kw)
    finally:
        if before is None:
            os.environ.pop("VALIDATE_IMAGE_DIR", None)
        else:
            os.environ["VALIDATE_IMAGE_DIR"] = before


@pytest.fixture(scope="module")
def cluster():
    # A short temporary directory of its own (Ray's socket paths must stay under 108 bytes),
    # where Ray also writes its "current cluster" file: nothing shared with another Ray.
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST_FAILURE})
    # The second worker node starts with an image store of its own, empty: it must fetch the
    # contract's image from the driver's store (the default one) before its first attempt.
    fresh = Path(temp) / "images"
    try:
        workers = [c.add_node(num_cpus=1), _node_with_store(c, fresh)]
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        yield c, workers, fresh
    finally:
        ray.shutdown()
        c.shutdown()
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def manifest(sandboxes):
    # Three tasks (the oracle and seven controls each); infrastructure retries on, and the retry
    # exception rule, so a task whose attempt was lost with its node is still judged.
    return make_manifest(sandboxes("bwrap"), idx=[0, 1, 2], exception_rule="retry", infra_retries=2)


@pytest.fixture(scope="module")
def on_threads(tmp_path_factory, manifest, sandboxes):
    """The module's contract pooled once on threads: what each run through Ray is compared with
    (its directory only read)."""
    run = tmp_path_factory.mktemp("ray-baseline") / "threads"
    return run, pool(make_ctx(manifest, sandboxes("bwrap"), run, concurrency=2), PoolPhase())


def test_a_worker_rebuilt_from_its_recipe_plays_without_writing_the_run_directory(tmp_path, manifest,
                                                                                  sandboxes):
    # A run id of its own: opening a sandbox sweeps what its label left, and "run" is a name
    # other runs on this machine use too.
    run = tmp_path / f"recipe-{os.getpid()}"
    ctx = make_ctx(manifest, sandboxes("bwrap"), run, concurrency=1)
    config = ctx.env.Config.model_validate(manifest.environment.config)
    agents = resolve(ctx.env, config, list(manifest.expectations.agents), ["oracle", "identity"])
    play = Play("oracle", manifest, ctx.taskset, [0], agents, kind_of(ctx.env))
    # as over a wire
    shipped = WorkerRecipe.model_validate_json(PlayWorker(ctx, play).recipe().model_dump_json())
    worker = worker_from_recipe(shipped, tmp_path / "scratch")
    results = [r for spec in pending([], play) for r in worker(spec)]
    worker.ctx.sandbox.close()
    assert [play.kind.row(r).status for r in results] == ["ok", "ok"]
    assert not any(p.is_file() for p in run.rglob("*"))  # nothing written by the worker
    play.kind.keep(ctx, results)  # the driver keeps the replies the rows name
    for r in results:
        stored = run / "replies" / r.row.reply_sha256.removeprefix("sha256:")
        assert stored.read_bytes() == r.reply


def test_a_pool_through_ray_is_judged_as_through_threads_and_passes_the_audit(tmp_path, cluster, manifest,
                                                                              sandboxes, on_threads):
    sandbox = sandboxes("bwrap")
    threads_dir, threads = on_threads
    ctx = make_ctx(manifest, sandbox, tmp_path / "ray", concurrency=2, executor="ray")
    ctx.executor.call_s = 60.0  # once an attempt is timed, every call carries as many as it may
    on_ray = pool(ctx, PoolPhase())
    assert max(ctx.executor.calls) > 1  # calls of several attempts, recorded one by one, judged the same
    # Both worker nodes ran attempts, the head none (it has no CPU).
    head = cluster[0].head_node.node_id
    assert len(ctx.executor.nodes) == 2 and head not in ctx.executor.nodes
    assert _rows(tmp_path / "ray", "tasks.parquet", VERDICT) == _rows(threads_dir, "tasks.parquet", VERDICT)
    assert _rows(tmp_path / "ray", "attempts.parquet", KEY) == _rows(threads_dir, "attempts.parquet", KEY)
    assert on_ray.counts == threads.counts
    # Where each attempt ran: the node Ray put it on and that node's host in the cluster's own
    # table; a run on threads has no such columns at all (its evidence as it always was).
    table = {n["NodeID"]: n["NodeManagerHostname"] for n in ray.nodes()}
    placed = pq.read_table(tmp_path / "ray" / "attempts.parquet").to_pylist()
    assert {r["node"] for r in placed} == set(ctx.executor.nodes) and all(table[r["node"]] == r["host"]
                                                                          for r in placed)
    # The node that started with an empty image store fetched the contract's image from the
    # driver's, by digest, and played with it: the same verdicts as above.
    fetched = ImagePaths(manifest.execution.image, base=cluster[2])
    assert "sha256:" + file_sha256(fetched.tarball) == manifest.execution.image_digest
    assert rootfs_facts(fetched).digest == manifest.execution.image_digest
    assert any(r["node"] == cluster[1][1].node_id and r["status"] == "ok" for r in placed)
    assert not {"node", "host"} & set(pq.read_schema(threads_dir / "attempts.parquet").names)
    # The viewer's task page says where each attempt ran.
    first = tables.task_attempts(tmp_path / "ray", ["oracle", "controls"], placed[0]["task_id"])[0]
    shown = str(pages._attempt_section(1, first))
    assert "ran on" in shown and first["node"] in shown and first["host"] in shown
    # The replies the rows name were stored by the driver, whole.
    replies = {r["reply_sha256"]
               for r in pq.read_table(tmp_path / "ray" / "attempts.parquet").to_pylist()} - {None}
    assert replies and all((tmp_path / "ray" / "replies" / s.removeprefix("sha256:")).is_file()
                           for s in replies)
    result = audit(tmp_path / "ray")
    assert result.problems == [] and result.checked


def test_a_cancel_stops_every_task_on_the_cluster_and_leaves_no_attempt_storage(tmp_path, cluster, manifest,
                                                                              sandboxes):
    run = tmp_path / f"cancel-{os.getpid()}"  # the run id labels its attempts' storage on every node
    ctx = make_ctx(manifest, sandboxes("bwrap"), run, concurrency=2, executor="ray")
    ctx.executor.call_s = 60.0  # once an attempt is timed, calls of several: cancelled mid-call
    raised: dict = {}

    def play():
        try:
            pool(ctx, PoolPhase())
        except Interrupted as e:
            raised["interrupted"] = e

    runner = threading.Thread(target=play, daemon=True)
    runner.start()
    deadline = time.monotonic() + 120
    while not any(f.node is not None and len(f.specs) > 1 for f in list(ctx.executor._running.values())):
        assert time.monotonic() < deadline and runner.is_alive(), "no call of several attempts ran on a node"
        time.sleep(0.02)
    cancelled = time.monotonic()
    ctx.executor.cancel()
    runner.join(timeout=60)
    assert not runner.is_alive() and "interrupted" in raised
    # The slots stopped within their call (its other attempts not played), not killed after the grace.
    assert time.monotonic() - cancelled < CANCEL_GRACE_S
    assert not ctx.executor._running  # every task in flight ended (cancelled or finished, dropped)
    # Each Ray worker's sandbox is labelled by the run and its pid: none left a tmpfs behind.
    assert not any(any(storage.iterdir()) for storage in DEFAULT_PARENT.glob(f"{run.name}*"))
    rows = pq.read_table(run / "attempts.parquet").to_pylist() if (run / "attempts.parquet").exists() else []
    assert len(rows) < len(manifest.tasks) * 8  # it stopped early


def test_a_node_where_the_contract_does_not_verify_stops_the_run_naming_it(tmp_path, cluster, manifest,
                                                                           sandboxes):
    # The driver's context takes the contract as given; each node re-verifies it against its
    # own backend and image, here a backend version no node has.
    ex = manifest.execution.model_copy(update={"backend_version": "bubblewrap 0.0.1"})
    forged = manifest.model_copy(update={"execution": ex}).sealed()
    ctx = make_ctx(forged, sandboxes("bwrap"), tmp_path / "forged", concurrency=2, executor="ray")
    with pytest.raises(NodeRefused, match=r"Ray node \w+ \(host .+\) cannot play this contract: "
                                          r"execution.backend_version"):
        pool(ctx, PoolPhase())
    assert not (tmp_path / "forged" / "attempts.parquet").exists() or not pq.read_table(
        tmp_path / "forged" / "attempts.parquet").num_rows


def test_a_node_whose_task_differs_from_the_contract_stops_the_run_naming_it(tmp_path, cluster, manifest,
                                                                             sandboxes):
    # A node checks each task when it is first handed it (not the whole contract up front):
    # here the contract's last task says another hash than the one every node regenerates.
    last = manifest.tasks[-1]
    tasks = [*manifest.tasks[:-1], last.model_copy(update={"hash": "sha256:" + "0" * 64})]
    forged = manifest.model_copy(update={"tasks": tasks,
                                         "task_list_sha256": task_list_sha256(tasks)}).sealed()
    ctx = make_ctx(forged, sandboxes("bwrap"), tmp_path / "forged", concurrency=2, executor="ray")
    with pytest.raises(NodeRefused, match=rf"Ray node \w+ \(host .+\) cannot play this contract: "
                                          rf"tasks\[{len(tasks) - 1}\].hash \({last.id}\)"):
        pool(ctx, PoolPhase())
    played = read_attempts(RunPaths(tmp_path / "forged"))  # the journal: the run stopped before folding it
    assert played and last.idx not in {a.idx for a in played}  # the other tasks ran; nothing of it did


def test_an_image_digest_no_node_has_nor_the_driver_can_send_stops_the_run_naming_the_last_node(
        tmp_path, cluster, manifest, sandboxes):
    ex = manifest.execution.model_copy(update={"image_digest": "sha256:" + "0" * 64})
    forged = manifest.model_copy(update={"execution": ex}).sealed()
    ctx = make_ctx(forged, sandboxes("bwrap"), tmp_path / "forged", concurrency=2, executor="ray")
    with pytest.raises(NodeRefused, match=r"no node of the Ray cluster is left that has the contract's "
                                          r"image; the last: Ray node \w+ \(host .+\): not the contract's "
                                          r"image .* at sha256:0{64}: it has sha256:[0-9a-f]{64}; the "
                                          r"driver's store has none"):
        pool(ctx, PoolPhase())
    assert ctx.executor.excluded == {w.node_id for w in cluster[1]}  # every worker node, each named
    # What was journaled before the refusal: each node's fault, no reward.
    rows = [json.loads(line) for line in (tmp_path / "forged" / "journal.jsonl").read_text().splitlines()]
    assert rows and all(r["error_class"] == "NodeImageUnavailable" and r["reward"] is None for r in rows)


def test_asking_for_ray_without_it_names_the_extra_and_exits_2(tmp_path):
    # A Python where `import ray` fails: this venv with a `ray` module that raises ImportError first.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "ray.py").write_text("raise ImportError('No module named ray')\n")
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env.get("PYTHONPATH", "")])
    r = subprocess.run([*VALIDATE, "run", "--manifest", "x.json", "--executor", "ray"], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "pip install .[ray]" in r.stderr and "Traceback" not in r.stderr, r.stderr
    code = "from validate.run.executors import make_executor; make_executor('ray')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode != 0 and "ExecutorUnavailable" in r.stderr and "pip install .[ray]" in r.stderr


def test_ray_address_is_refused_without_the_ray_executor(tmp_path):
    r = subprocess.run([*VALIDATE, "run", "--manifest", "x.json", "--ray-address", "127.0.0.1:1"],
                       capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path)
    assert r.returncode == 2 and "--ray-address: only with --executor ray" in r.stderr
    assert make_executor("ray", 2).concurrency == 2


def test_an_eval_on_ray_is_refused_before_anything_is_read_or_written(tmp_path):
    # The chat kind plays with the driver's live context (the endpoint's client): it is not shipped.
    r = subprocess.run([*VALIDATE, "eval", "run", "--contract", "missing.json", "--executor", "ray"],
                       capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--executor ray: `validate eval` plays the model's conversations" in r.stderr
    assert "--executor threads" in r.stderr and not any(tmp_path.iterdir())


def test_the_command_runs_on_the_cluster_named_by_ray_address(tmp_path, cluster, sandboxes):
    # one task: the path, not the pool
    manifest = make_manifest(sandboxes("bwrap"), idx=[0], min_task_count=1)
    (tmp_path / "m.json").write_bytes(manifest.to_json())
    r = subprocess.run([*VALIDATE, "run", "--manifest", "m.json", "--run-dir", "ledgers/r", "--allow-patch",
                        "--data", str(CORPUS_PATH), "--executor", "ray", "--ray-address", cluster[0].address,
                        "-c", "2", "--json"], capture_output=True, text=True, env=subprocess_env(),
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"]["attempts"] == len(manifest.tasks) * 8
    assert audit(tmp_path / "ledgers/r").problems == []


def _driver(tmp_path, cluster, *args: str) -> subprocess.Popen:
    """``validate pool … --executor ray`` as a user runs it: a process of its own, the driver."""
    argv = [*VALIDATE, "pool", *args, "--executor", "ray", "--ray-address", cluster[0].address, "-c", "2",
            "--smoke-sample", "0", "--allow-patch", "--data", str(CORPUS_PATH)]
    return subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _journaled(run) -> int:
    journal = run / "journal.jsonl"
    return journal.read_bytes().count(b"\n") if journal.exists() else 0


def _wait_for_attempts(run, proc: subprocess.Popen, n: int) -> None:
    deadline = time.monotonic() + 300
    while _journaled(run) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the driver recorded no attempts"
        time.sleep(0.05)


def _sandboxes_of(run_id: str) -> list[str]:
    """Command lines of the processes running anything of the run (its sandboxes name the run's storage)."""
    found = []
    for proc in os.listdir("/proc"):
        try:
            cmdline = open(f"/proc/{proc}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.isdigit() and run_id in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found


def _leftover_of_a_dead_worker(label: str) -> Path:
    """Attempt storage, mounted, as a Ray worker process of run label `label` killed mid-attempt
    leaves it (its pid: one no process has now)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    planted = DEFAULT_PARENT / f"{label}.w{gone.pid}" / "attempt-left"
    planted.mkdir(parents=True)
    mount_tmpfs(planted, Limits())
    (planted / "written-by-the-agent").write_text("x")
    return planted.parent


def test_a_rebuilt_worker_sweeps_what_dead_workers_of_its_run_left_and_no_live_ones():
    label = f"sweep-{os.getpid()}-{time.monotonic_ns()}"
    dead = _leftover_of_a_dead_worker(label)
    other_run = _leftover_of_a_dead_worker(label + "x")
    alive = DEFAULT_PARENT / f"{label}.w{os.getppid()}" / "attempt-running"  # a live process's label
    alive.mkdir(parents=True)
    try:
        assert _sweep_dead_workers(label, "bwrap", DEFAULT_IMAGE) == [dead.name]
        assert not dead.exists() and str(dead) not in Path("/proc/self/mounts").read_text()
        assert alive.is_dir() and (other_run / "attempt-left" / "written-by-the-agent").is_file()
    finally:
        sweep(DEFAULT_PARENT, other_run.name)
        shutil.rmtree(alive.parent, ignore_errors=True)


def test_a_killed_driver_resumed_completes_with_no_attempt_run_twice(tmp_path, cluster, manifest):
    (tmp_path / "m.json").write_bytes(manifest.to_json())
    run = tmp_path / "ledgers" / f"killed-driver-{os.getpid()}"
    driver = _driver(tmp_path, cluster, "--manifest", "m.json", "--run-dir", str(run))
    _wait_for_attempts(run, driver, 3)
    os.kill(driver.pid, signal.SIGKILL)  # no handler, no cleanup: what finished is in the journal
    driver.communicate()
    before = _journaled(run)
    assert 3 <= before < len(manifest.tasks) * 8  # it died mid-run
    # What a Ray worker process killed mid-attempt leaves: the resume's workers sweep it.
    left = _leftover_of_a_dead_worker(RunPaths(run).sandbox_label)
    resumed = _driver(tmp_path, cluster, "--resume", str(run))
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode in (0, 1), err  # 1: the dataset verdict waits for its smoke test
    rows = pq.read_table(run / "attempts.parquet").to_pylist()
    final = [(r["phase"], r["task_id"], r["agent"], r["sample"])
             for r in rows if r["status"] != "infrastructure_error"]
    assert len(final) == len(set(final)) == len(manifest.tasks) * 8  # each key played to its end exactly once
    verdicts = pq.read_table(run / "tasks.parquet").to_pylist()
    assert sorted(v["idx"] for v in verdicts) == [0, 1, 2] and all(v["verdict"] != "incomplete"
                                                                   for v in verdicts)
    assert not left.exists() and str(left) not in Path("/proc/self/mounts").read_text()
    result = audit(run)
    assert result.problems == [] and result.checked


def test_ctrl_c_on_the_driver_cancels_every_task_and_leaves_no_sandbox_running(tmp_path, cluster, manifest):
    (tmp_path / "m.json").write_bytes(manifest.to_json())
    run = tmp_path / "ledgers" / f"ctrl-c-{os.getpid()}"
    driver = _driver(tmp_path, cluster, "--manifest", "m.json", "--run-dir", str(run))
    _wait_for_attempts(run, driver, 1)
    deadline = time.monotonic() + 120
    while not _sandboxes_of(run.name):  # an attempt is in its sandbox on a node right now
        assert time.monotonic() < deadline and driver.poll() is None, "no sandbox ran"
        time.sleep(0.02)
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 130 and f"--resume {run}" in err, err
    assert _sandboxes_of(run.name) == []  # nothing of the run outlives its driver, on any node
    assert not any(any(storage.iterdir()) for storage in DEFAULT_PARENT.glob(f"{run.name}*"))


def test_a_node_that_cannot_get_the_image_is_its_own_infrastructure_fault_and_verdicts_stand(
    tmp_path, cluster, manifest, sandboxes, on_threads
):
    c, _, _ = cluster
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    # Its image store lies under a regular file: it can neither hold nor fetch any image.
    bad = _node_with_store(c, blocker / "images")
    try:
        c.wait_for_nodes()
        ctx = make_ctx(manifest, sandboxes("bwrap"), tmp_path / "bad-node", concurrency=3, executor="ray")
        on_ray = pool(ctx, PoolPhase())
    finally:
        c.remove_node(bad)
    rows = pq.read_table(tmp_path / "bad-node" / "attempts.parquet").to_pylist()
    faults = [r for r in rows if r["error_class"] == "NodeImageUnavailable"]
    assert faults and all(r["status"] == "infrastructure_error" and r["node"] == bad.node_id
                          and bad.node_id in r["error_message"] and "image store" in r["error_message"]
                          for r in faults)
    assert ctx.executor.excluded == {bad.node_id}  # kept out of the rest of the run
    assert not any(r["node"] == bad.node_id and r["status"] != "infrastructure_error" for r in rows)
    threads_dir, threads = on_threads
    assert _rows(tmp_path / "bad-node", "tasks.parquet", VERDICT) == _rows(threads_dir, "tasks.parquet",
                                                                           VERDICT)
    assert on_ray.counts.compatible == threads.counts.compatible
    result = audit(tmp_path / "bad-node")
    assert result.problems == [] and result.checked


def test_a_node_whose_image_store_is_corrupted_fetches_the_image_again_by_digest(tmp_path, cluster, manifest,
                                                                                  sandboxes):
    c, _, _ = cluster
    # Its store claims the contract's image (the record names the digest) over other bytes.
    store = tmp_path / "images"
    damaged = ImagePaths(manifest.execution.image, base=store)
    damaged.root.mkdir(parents=True)
    damaged.record.write_bytes(ImagePaths(manifest.execution.image).record.read_bytes())
    damaged.tarball.write_bytes(b"not the image" * 1000)
    node = _node_with_store(c, store)
    try:
        c.wait_for_nodes()
        ctx = make_ctx(manifest, sandboxes("bwrap"), tmp_path / "damaged", concurrency=3, executor="ray")
        pool(ctx, PoolPhase())
    finally:
        c.remove_node(node)
    rows = pq.read_table(tmp_path / "damaged" / "attempts.parquet").to_pylist()
    assert any(r["node"] == node.node_id and r["status"] == "ok" for r in rows)  # it played, with the image
    assert "sha256:" + file_sha256(damaged.tarball) == manifest.execution.image_digest
    assert all(v["verdict"] == "compatible"
               for v in pq.read_table(tmp_path / "damaged" / "tasks.parquet").to_pylist())
    assert audit(tmp_path / "damaged").problems == []


def _pool_losing_a_node(ctx, nodes: dict, carrying: int = 1) -> tuple[object, list]:
    """`pool(ctx)` in a thread; the raylet of the first node of `nodes` (node id -> node) with
    a call of at least `carrying` attempts handed out under 0.3 s before killed (by pid), so
    the call still plays when its worker leaves with the raylet; the run waited for to its
    end. Returns the node killed and the specifications of that call."""
    done: dict = {}
    runner = threading.Thread(target=lambda: done.setdefault("summary", pool(ctx, PoolPhase())), daemon=True)
    runner.start()
    deadline = time.monotonic() + 120
    while not (on := [f for f in list(ctx.executor._running.values())
                      if f.node in nodes and len(f.specs) >= carrying
                      and time.monotonic() - f.started < 0.3]):
        assert time.monotonic() < deadline and runner.is_alive(), "no call reached a node to kill"
        time.sleep(0.02)
    victim = nodes[on[0].node]
    raylet = victim.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
    os.kill(raylet.pid, signal.SIGKILL)
    raylet.wait()
    runner.join(timeout=240)
    assert not runner.is_alive() and "summary" in done
    # The killed node's worker left the storage of the attempt it played (its tmpfs, on this
    # machine): swept as the run's next rebuilt worker would sweep it, and nothing left behind.
    label = ctx.paths.sandbox_label
    pids = [int(d.name.rsplit(".w", 1)[1]) for d in DEFAULT_PARENT.glob(f"{label}.w*")]
    deadline = time.monotonic() + 60  # the killed node's worker may still be leaving
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    _sweep_dead_workers(label, "bwrap", DEFAULT_IMAGE)
    assert not [m for m in Path("/proc/mounts").read_text().splitlines() if f"{DEFAULT_PARENT}/{label}." in m]
    return victim, [spec for spec, _ in on[0].specs]


# The last two: each leaves the cluster one worker node short.
def test_a_worker_node_killed_mid_run_loses_its_attempts_as_infrastructure_errors_naming_it(tmp_path, cluster,
                                                                                           manifest,
                                                                                            sandboxes):
    c, workers, _ = cluster
    victim = workers[0]
    ctx = make_ctx(manifest, sandboxes("bwrap"), tmp_path / "killed", concurrency=2, executor="ray")
    ctx.executor.call_s = 60.0  # calls of several attempts: killed while one of them plays
    _pool_losing_a_node(ctx, {victim.node_id: victim}, carrying=2)
    rows = pq.read_table(tmp_path / "killed" / "attempts.parquet").to_pylist()
    lost = [r for r in rows if r["error_class"] == "RayNodeLost"]
    assert lost and all(r["status"] == "infrastructure_error" and victim.node_id in r["error_message"]
                        and r["node"] == victim.node_id for r in lost)
    # The node's one slot had one call in flight: every attempt it carried is a lost try of its
    # own, each saying it was one of that call's (read from the rows: the call seen before the
    # kill may have ended meanwhile, and the slot's next one been lost instead).
    assert len(lost) >= 2 and all(f"one of the {len(lost)} attempts of one call" in r["error_message"]
                                  for r in lost)
    assert len({(r["phase"], r["task_id"], r["agent"], r["sample"]) for r in lost}) == len(lost)
    # Each lost attempt was played again (a later try of its key, on the surviving node).
    for r in lost:
        key = (r["phase"], r["task_id"], r["agent"], r["sample"])
        assert any((x["phase"], x["task_id"], x["agent"], x["sample"]) == key and x["attempt"] > r["attempt"]
                   and x["status"] != "infrastructure_error" for x in rows)
    verdicts = pq.read_table(tmp_path / "killed" / "tasks.parquet").to_pylist()
    assert sorted(v["idx"] for v in verdicts if v["phase"] == "pool") == [0, 1, 2]
    assert all(v["verdict"] != "incomplete" for v in verdicts)
    result = audit(tmp_path / "killed")
    assert result.problems == [] and result.checked


def test_a_slot_lost_with_its_node_is_replaced_and_its_replacement_plays_the_lost_attempt(tmp_path, cluster,
                                                                                          manifest,
                                                                                          sandboxes):
    """One slot (``-c 1``) and a node to spare: the slot's node killed while it plays its first
    attempt; the attempt, lost naming that node, is played again in the same play by the slot
    that replaced it (there is no other), on another node. Last in the module: it kills a node."""
    c, workers, _ = cluster
    spare = c.add_node(num_cpus=1)
    deadline = time.monotonic() + 60  # (the cluster's own wait counts the node killed above too)
    while not any(n["NodeID"] == spare.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, "the spare node did not join"
        time.sleep(0.1)
    nodes = {w.node_id: w for w in [*workers, spare]}
    ctx = make_ctx(manifest, sandboxes("bwrap"), tmp_path / "replaced", concurrency=1, executor="ray")
    victim, carried = _pool_losing_a_node(ctx, nodes)  # the first play call: it rebuilds, then plays
    assert len(carried) == 1  # a slot's first call carries one attempt (it rebuilds the worker)
    rows = pq.read_table(tmp_path / "replaced" / "attempts.parquet").to_pylist()
    lost = [r for r in rows if r["error_class"] == "RayNodeLost"]
    assert len(lost) == 1 and lost[0]["node"] == victim.node_id and victim.node_id in lost[0]["error_message"]
    key = ("phase", "task_id", "agent", "sample")
    again = [r for r in rows if tuple(r[k] for k in key) == tuple(lost[0][k] for k in key)
             and r["attempt"] == lost[0]["attempt"] + 1]
    assert len(again) == 1 and again[0]["status"] != "infrastructure_error"
    assert again[0]["node"] in nodes and again[0]["node"] != victim.node_id
    assert all(v["verdict"] != "incomplete"
               for v in pq.read_table(tmp_path / "replaced" / "tasks.parquet").to_pylist())
    assert audit(tmp_path / "replaced").problems == []
