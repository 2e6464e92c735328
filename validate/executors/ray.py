"""The ``ray`` executor: each attempt specification is a Ray task on a cluster's nodes.

Ray cannot ship the runner's worker: it holds live objects (the run's sandbox, the contract's
taskset, the attempt kind). The seam between the driver and a node is plain data both ways:

- out: the worker's **recipe** (`WorkerRecipe`: the play's contract as canonical JSON, where
  the environment's data lies, phase, kind and agents by name; `PlayWorker.recipe`) and where
  the driver's image lies (`ImageSource`), put once per play into Ray's object store, and
  each `AttemptSpec`;
- on the node: the contract's image is checked by digest, fetched from the driver's store if
  missing or different (`validate.executors.ray_image`); then
  `validate.runner.worker_from_recipe` rebuilds a worker, verifying the contract there
  (environment, that node's backend and the image's digest) once per Ray worker process and
  recipe, and each task when that process is first handed it (regenerated, its hash and
  skips against the contract's entry; a node whose task differs stops the run, named), its sandbox labelled by the run and that process (opening a sandbox
  sweeps what its label left, never another worker's attempts); its scratch (a scorer's
  cache) is a temporary directory of that node;
- back: where the task runs (the Ray node id from Ray's runtime context, the task's first
  item, sent as it starts) and then its results (rows and reply bytes). The driver names the
  host from the cluster's own node table and marks every row with both (`Worker.placed`). A
  node never writes the run directory: the driver's `record` (the runner's journal and the
  kind's `keep`) is the one writer.

The driver keeps at most `concurrency` tasks in flight and takes the next specification from
the lazy iterator only when one finishes (`ray.wait`), so its memory is flat in the number of
tasks; `record` runs on the driver's thread. Ray's own retries are off (``max_retries=0``):
a task lost with its worker or node (Ray's signals: `WorkerCrashedError`, `NodeDiedError`,
`ObjectLostError`, ...) becomes an ``infrastructure_error`` row of class `RayNodeLost` naming
the node and host (`PlayWorker.lost`), and its next try is handed out while the contract's
``infra_retries`` allow; the exception rule then judges it as any local fault. An exception
of the worker's own code is raised on the driver, as with threads; a node where the contract
does not verify (`worker_from_recipe`) stops the run naming it (`NodeRefused`). A node that
has not the image and cannot get it (`NodeImageUnavailable`) loses the attempt the same way
as a lost node, under that class, and is kept out of the rest of the run (a label selector on
Ray's ``ray.io/node-id``); the run stops when no node is left.

`cancel()` asks every task in flight to stop (a KeyboardInterrupt in the task, so its sandbox
and storage are torn down), then kills what is still running after a short grace
(``ray.cancel(force=True)``); what finishes after a cancel is dropped (a resume reruns it).
Ray is the optional extra ``ray`` (``pip install .[ray]``); the cluster is `address`
(``--ray-address``, exported as ``RAY_ADDRESS``) or Ray's own default; a Ray already
initialised in this process (a test's cluster) is used as it is.
"""

from __future__ import annotations

import atexit
import collections
import fcntl
import hashlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validate.errors import ValidateError
from validate.executors import AttemptSpec, Executor, ExecutorUnavailable, R, Worker
from validate.executors.ray_image import NodeImageUnavailable, TaskImageFetch, driver_source, ensure_image
from validate.runner import worker_from_recipe
from validate.sandbox import open_sandbox, storage

#: Seconds a cancelled task has to tear its sandbox down before it is killed.
CANCEL_GRACE_S = 10.0
#: Rebuilt workers kept per Ray worker process (a pool plays two contracts: oracle, controls).
CACHED_WORKERS = 4


class RayNodeLost(Exception):
    """An attempt lost with the Ray worker or node that ran it (the error class of its row)."""


class NodeRefused(ExecutorUnavailable):
    """A node that cannot play the contract (its backend, image digest or data differ): the
    run stops naming it rather than play anywhere the contract does not hold."""


def _where(ray) -> dict[str, str]:
    return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}


def _ray() -> Any:
    try:
        import ray  # lazy: the optional extra `ray`
    except ImportError:
        raise ExecutorUnavailable("--executor ray: Ray is not installed; pip install .[ray]") from None
    return ray


def _lost_errors(ray) -> tuple[type[BaseException], ...]:
    """Ray's signals that the machine, not the attempt, failed."""
    ex = ray.exceptions
    return (ex.WorkerCrashedError, ex.NodeDiedError, ex.ObjectLostError, ex.RaySystemError, ex.OutOfMemoryError,
            ex.LocalRayletDiedError)


_workers: collections.OrderedDict[str, Any] = collections.OrderedDict()
_workers_lock = threading.Lock()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process of that pid: not ours to judge dead
    return True


def _sweep_dead_workers(sandbox_label: str, backend: str, image: str) -> list[str]:
    """Sweep what Ray worker processes of this run that died on this machine left: each one's
    label (`<run label>.w<pid>`) whose process is gone, found by the attempt storage it left,
    swept as a sandbox of that label sweeps when it opens (its processes, cgroups or containers,
    then its storage). A killed worker sweeps nothing itself, and no later worker has its label;
    this runs when a worker is rebuilt (each Ray worker process, each play: a resumed run, the
    next play of a run that lost one). A label whose pid is alive again is left alone. Returns
    the labels swept."""
    mine = re.compile(re.escape(sandbox_label) + r"\.w([0-9]{1,10})")
    try:
        names = sorted(os.listdir(storage.DEFAULT_PARENT))
    except OSError:
        return []
    dead = [n for n in names if (m := mine.fullmatch(n)) and int(m.group(1)) != os.getpid()
            and not _alive(int(m.group(1)))]
    swept = []
    for name in dead:
        try:
            fd = os.open(storage.DEFAULT_PARENT / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # swept meanwhile
        try:
            # One sweeper per label: the other workers rebuilt on this machine at the same time pass it by.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            open_sandbox(backend, image=image, run_label=name).close()
            swept.append(name)
        finally:
            os.close(fd)
    return swept


def _node_worker(recipe_ref, source_ref) -> Any:
    """The worker rebuilt from this recipe in this Ray worker process (cached by the recipe's
    object id, so a 10,000-task manifest is neither fetched nor hashed per task), on a node
    that has the contract's image at its digest or got it (`ensure_image`)."""
    ray = _ray()
    key = recipe_ref.hex()
    with _workers_lock:
        if key not in _workers:
            where = _where(ray)
            source = ray.get(source_ref)
            ensure_image(ray, source, f"Ray node {where['node']} (host {where['host']})")
            recipe = ray.get(recipe_ref)
            label = hashlib.sha256(recipe.run_id.encode()).hexdigest()[:12]
            # Made only by a scorer that caches (most never do); removed when the Ray worker
            # process exits normally (a killed one leaves it to the node's tmp).
            scratch = Path(tempfile.gettempdir()) / f"validate-ray-{label}-{os.getpid()}-{key[-12:]}"
            atexit.register(shutil.rmtree, scratch, ignore_errors=True)
            try:
                # Its own sandbox label: opening a sandbox sweeps what an earlier process of its
                # label left, which must never be another live Ray worker's attempts (several run
                # on one node, and a test's nodes share one machine). The run's label leads it, and a
                # dot, not a dash, follows it: the driver's own sweep (of "<label>-*") passes it by.
                _workers[key] = worker_from_recipe(recipe, scratch, label=f"{recipe.sandbox_label}.w{os.getpid()}")
            except ValidateError as e:
                where = _where(ray)
                raise NodeRefused(f"Ray node {where['node']} (host {where['host']}) cannot play this contract: "
                                  f"{e}") from None
            ex = _workers[key].ctx.manifest.execution
            _sweep_dead_workers(recipe.sandbox_label, ex.backend, ex.image)
            # A task image this node lacks comes from the driver's daemon, by id (`TaskImageFetch`).
            _workers[key].ctx.fetch_image = TaskImageFetch(ray, source.driver,
                                                           f"Ray node {where['node']} (host {where['host']})")
            while len(_workers) > CACHED_WORKERS:
                _workers.popitem(last=False)[1].ctx.sandbox.close()
        _workers.move_to_end(key)
        return _workers[key]


def _play(refs: list, spec: AttemptSpec) -> Iterator[Any]:
    """The Ray task: first where it runs, then the worker's results for `spec`. The recipe's
    and the image source's references come in a list so that Ray hands the references over,
    not the objects (fetched once per Ray worker process, not per task)."""
    ray = _ray()
    yield _where(ray)
    worker = _node_worker(*refs)
    try:
        worker.task(spec.idx)  # the task regenerated here and checked against the contract, once
    except ValidateError as e:
        where = _where(ray)
        raise NodeRefused(f"Ray node {where['node']} (host {where['host']}) cannot play this contract: {e}") from None
    yield worker(spec)


@dataclass
class _Flight:
    spec: AttemptSpec
    first: int  # the key's first try in this run: lost tries count from it
    node: str | None = None
    host: str | None = None


class RayExecutor(Executor[R]):
    name = "ray"
    remote = True

    def __init__(self, concurrency: int = 1, address: str | None = None) -> None:
        super().__init__(concurrency)
        self.ray = _ray()  # refused at once when the extra is missing, before anything runs
        self.address = address
        self._stop = threading.Event()
        self._worker: Worker[R] | None = None
        self._running: dict[Any, _Flight] = {}
        #: Ray node id -> host of every node that ran an attempt of this executor.
        self.nodes: dict[str, str] = {}
        self._table: dict[str, str] = {}  # the cluster's node table: node id -> host
        #: Nodes kept out of this executor's runs: they could not get the contract's image.
        self.excluded: set[str] = set()

    def _connect(self) -> None:
        if not self.ray.is_initialized():
            # log_to_driver off: the nodes' stdout would interleave with the progress bar.
            self.ray.init(address=self.address, log_to_driver=False)

    def run(self, specs: Iterable[AttemptSpec], worker: Worker[R], record: Callable[[list[R]], None]) -> None:
        recipe = worker.recipe()  # a play that cannot be shipped is refused before anything runs
        self._connect()
        self._stop, self._worker, self._running = threading.Event(), worker, {}
        refs = [self.ray.put(recipe), self.ray.put(driver_source(self.ray, recipe.execution))]
        del recipe  # the contract's text (2.2 MB at 10,000 tasks) is the object store's now, not held here too
        try:
            self._run(specs, worker, record, refs)
        finally:
            self._worker = None

    def _run(self, specs: Iterable[AttemptSpec], worker: Worker[R], record: Callable[[list[R]], None],
             refs: list) -> None:
        ray, queue, again = self.ray, iter(specs), collections.deque()
        play = ray.remote(max_retries=0, num_returns="streaming")(_play)
        running = self._running

        def task():
            # Nodes found without the contract's image are kept out of the rest of the run.
            if not self.excluded:
                return play
            return play.options(label_selector={"ray.io/node-id": f"!in({','.join(sorted(self.excluded))})"})

        def submit_next() -> None:
            if self._stop.is_set():
                return
            if again:
                spec, first = again.popleft()
            elif (spec := next(queue, None)) is not None:
                first = spec.attempt
            else:
                return
            running[task().remote(refs, spec)] = _Flight(spec, first)

        for _ in range(self.concurrency):
            submit_next()
        try:
            while running:
                ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                for gen in ready:
                    results = self._step(gen, worker, again)
                    if results is not None and not self._stop.is_set():
                        record(results)
                        submit_next()
        except BaseException:
            # Ctrl-C, or evidence that could not be written, or the worker's own error: nothing
            # keeps running on the cluster unobserved.
            self.cancel()
            self._drain()
            raise

    def _step(self, gen, worker: Worker[R], again: collections.deque) -> list[R] | None:
        """The next item of a task in flight: where it runs (None returned) or its results
        (the lost-attempt results if its machine failed; None when cancelled)."""
        ray, flight = self.ray, self._running[gen]
        try:
            item = ray.get(next(gen))
        except ray.exceptions.TaskCancelledError:
            self._running.pop(gen)
            return None
        except StopIteration:
            # The task ended without its results: cancelled (Ray may end a cancelled streaming
            # task's stream rather than raise), or its worker stopped it; never a result.
            self._running.pop(gen)
            if self._stop.is_set():
                return None
            lost = RayNodeLost(f"Ray node {flight.node or 'unknown'} (host {flight.host or 'unknown'}) ended the "
                               f"attempt's task without its results")
            return self._lost(worker, flight, lost, again)
        except _lost_errors(ray) as e:
            self._running.pop(gen)
            if self._stop.is_set():
                return None  # killed by our own cancel: not evidence
            lost = RayNodeLost(f"Ray node {flight.node or 'unknown'} (host {flight.host or 'unknown'}) lost the "
                               f"attempt: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return self._lost(worker, flight, lost, again)
        except ray.exceptions.RayTaskError as e:
            self._running.pop(gen)
            if isinstance(e.cause, NodeImageUnavailable) and not self._stop.is_set():
                self._exclude(flight.node, str(e.cause))
                return self._lost(worker, flight, e.cause, again)
            # The worker's own code raised: its exception, as with threads (not Ray's wrapper,
            # whose text carries the node's traceback).
            raise (e.cause if isinstance(e.cause, Exception) else e) from None
        if isinstance(item, dict):
            flight.node, flight.host = item["node"], self._host(item["node"])
            self.nodes[flight.node] = flight.host
            return None
        self._running.pop(gen)
        return worker.placed(item, flight.node, flight.host)

    def _lost(self, worker: Worker[R], flight: _Flight, error: Exception, again: collections.deque) -> list[R]:
        """The infrastructure-error results of a try its node could not make, its next try queued
        while the contract's retries allow."""
        results, retry = worker.lost(flight.spec, flight.first, type(error).__name__, str(error))
        if retry is not None:
            again.append((retry, flight.first))
        return results if flight.node is None else worker.placed(results, flight.node, flight.host)

    def _exclude(self, node: str | None, why: str) -> None:
        """Keep `node` out of the rest of the run; refuse the run when no node with CPUs is left."""
        if node is None:
            return
        self.excluded.add(node)
        left = [n["NodeID"] for n in self.ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("CPU") and n["NodeID"] not in self.excluded]
        if not left:
            raise NodeRefused(f"no node of the Ray cluster is left that has the contract's image; the last: {why}")

    def _host(self, node: str) -> str:
        """The host of `node` as the cluster's own node table records it (the task only says
        which node Ray's runtime context put it on; a node the table does not hold is refused)."""
        if node not in self._table:
            self._table = {n["NodeID"]: n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "unknown"
                           for n in self.ray.nodes()}
        if node not in self._table:
            raise NodeRefused(f"a Ray task says it runs on node {node}, which the cluster's node table does not hold")
        return self._table[node]

    def cancel(self) -> None:
        """Stop handing out; ask each task in flight to stop (its sandbox torn down) and kill,
        after `CANCEL_GRACE_S`, any still running. Safe from another thread: the loop that
        consumes the tasks drops what they return."""
        self._stop.set()
        worker = self._worker
        if worker is not None:
            worker.cancel()  # the driver's side: its stop flag, its sandbox
        running = list(self._running)
        for gen in running:
            self.ray.cancel(gen, force=False)
        timer = threading.Timer(CANCEL_GRACE_S, self._kill, [running])
        timer.daemon = True
        timer.start()

    def _kill(self, gens: list) -> None:
        for gen in gens:
            if gen in self._running:
                self.ray.cancel(gen, force=True)

    def _drain(self) -> None:
        """After a cancel on the loop's own thread: wait (at most the grace) for the tasks in
        flight to end, so a driver about to exit does not kill them mid-teardown."""
        deadline = time.monotonic() + CANCEL_GRACE_S
        while self._running and time.monotonic() < deadline:
            ready, _ = self.ray.wait(list(self._running), num_returns=1, timeout=0.2)
            for gen in ready:
                try:
                    self.ray.get(next(gen))
                except StopIteration:
                    self._running.pop(gen, None)
                except Exception:  # noqa: BLE001 - cancelled, killed or failed: it no longer runs
                    self._running.pop(gen, None)
        self._kill(list(self._running))
