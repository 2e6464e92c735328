"""The ``ray`` executor: attempt specifications played on a cluster's nodes, handed out as
calls (Ray actor tasks) to `concurrency` slots: Ray actors, each its own Ray worker process
holding one CPU, placed by Ray on the nodes. A call carries one specification, or a few short
ones (below).

Why actors: on a machine whose CPUs the sandboxes need, Ray's own work per task is the cost.
Measured on 2 cores (`bench/executor_bench.py`'s floor, empty tasks, the machine's CPU per task):
a call to an actor 1.2–1.6 ms, a plain task 2.7–3.9 ms, and the streaming task this executor
used before (to learn where a task runs before its results) 3.7–5.7 ms. A slot knows its node when it starts,
so a call needs no first item to say where it runs.

Why a few to a call: with the machine busy, Ray's work per call is dearer than its floor: at
one attempt per call (1,000-task deshuffle pool, 4 slots, 2 cores) the slots' Ray threads and
the driver took ~2–2.5 ms of CPU per attempt beyond what threads spend, ~10 % of an attempt. So a
call carries as many attempts as fill `CALL_S` (0.5 s) by the attempts timed so far, at most
`MAX_CALL` (8), and an attempt that long or longer goes alone (a task-directory trial: one per
call). The cost of a call is then shared, and what one lost node or one cancel takes from a
slot stays under about half a second of attempts, or one attempt.

Ray cannot ship the runner's worker: it holds live objects (the run's sandbox, the contract's
taskset, the attempt kind). The seam between the driver and a node is plain data both ways:

- out: the worker's **recipe** (`WorkerRecipe`: the play's contract as canonical JSON, where
  the environment's data lies, phase, kind and agents by name; `PlayWorker.recipe`) and where
  the driver's image lies (`ImageSource`), put once per play into Ray's object store and
  handed to each slot as it starts, and the `AttemptSpec`s each call carries;
- on the node: the contract's image is checked by digest, fetched from the driver's store if
  missing or different (`validate.run.executors.ray_image`); then
  `validate.run.runner.worker_from_recipe` rebuilds a worker, verifying the contract there
  (environment, that node's backend and the image's digest) once per slot and recipe, and
  each task when that slot is first handed it (regenerated, its hash and skips against the
  contract's entry; a node whose task differs stops the run, named), its sandbox labelled by
  the run and that process (opening a sandbox sweeps what its label left, never another
  worker's attempts); its scratch (a scorer's cache) is a temporary directory of that node;
- back: the call's results (rows and reply bytes). The slot said where it runs when it
  started (the Ray node id from Ray's runtime context); the driver names the host from the
  cluster's own node table and marks every row with both (`Worker.placed`). A node never
  writes the run directory: the driver's `record` (the runner's journal and the kind's
  `keep`) is the one writer.

The driver keeps at most `concurrency` calls in flight, one per slot, and takes the next
specifications (at most `MAX_CALL`) from the lazy iterator only when a slot is idle
(`ray.wait`), so its memory is flat in the number of tasks; `record` runs on the driver's
thread, for each attempt of a call in the order the slot played them, when the call returns
and the slots idle have their next calls (a record that fails cancels those, as Ctrl-C does).
Ray's own retries are off (``max_restarts=0``, ``max_task_retries=0``): a call lost with its
slot's worker or node (Ray's signals: `ActorDiedError`, `NodeDiedError`, `ObjectLostError`,
...) becomes an ``infrastructure_error`` row of class `RayNodeLost` naming the node and host
for each attempt it carried (`PlayWorker.lost`; none came back, and Ray does not say which had
started, so a call of several says so in each row's message), each one's next try handed out
while the contract's ``infra_retries`` allow, and the slot is replaced (Ray places the new
actor where a CPU is free); the exception rule then judges it as any local fault. An exception
of the worker's own code is raised on the driver, as with threads; a node where the contract
does not verify (`worker_from_recipe`) stops the run naming it (`NodeRefused`). A node that
has not the image and cannot get it (`NodeImageUnavailable`, at a slot's first call, which
carries one attempt) loses it the same way as a lost node, under that class, and is kept out
of the rest of the run (its slots replaced, new ones placed by a label selector on
Ray's ``ray.io/node-id``); the run stops when no node is left.

`cancel()` asks every slot playing to stop (its worker's own cancel, on the slot's second
thread: its sandbox and storage torn down, as with threads), then kills any slot still playing
after a short grace (``ray.kill``); a slot told to stop plays no further attempt of its call,
and what a call returns after a cancel is dropped, the attempts it finished before the cancel
with it (a resume reruns them). At the end of a run every slot closes its sandboxes and leaves.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validate.core.errors import ClusterError, ValidateError
from validate.run.executors import AttemptSpec, Executor, ExecutorUnavailable, R, Worker
from validate.run.executors.ray_image import NodeImageUnavailable, TaskImageFetch, driver_source, ensure_image
from validate.run.runner import worker_from_recipe
from validate.sandbox import open_sandbox, storage

#: Seconds a cancelled slot has to tear its sandbox down before it is killed.
CANCEL_GRACE_S = 10.0
#: Seconds of attempts one call carries, by the attempts timed so far (`RayExecutor.call_s`):
#: short attempts go several to a call, so Ray's own cost per call is shared among them; an
#: attempt as long as this, or longer, goes alone.
CALL_S = 0.5
#: The most attempts one call carries: what a lost node or a cancel can take at once per slot.
MAX_CALL = 8
#: Rebuilt workers kept per Ray worker process (a slot lives for one play, so it holds one; the
#: bound keeps a worker process that plays many recipes from holding them all).
CACHED_WORKERS = 4


class RayNodeLost(ClusterError):
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
    return (ex.WorkerCrashedError, ex.NodeDiedError, ex.ObjectLostError, ex.RaySystemError,
            ex.OutOfMemoryError, ex.LocalRayletDiedError)


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
            fd = os.open(storage.DEFAULT_PARENT / name,
                         os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
                _workers[key] = worker_from_recipe(recipe, scratch,
                                                   label=f"{recipe.sandbox_label}.w{os.getpid()}")
            except ValidateError as e:
                where = _where(ray)
                raise NodeRefused(f"Ray node {where['node']} (host {where['host']}) cannot play this "
                                  f"contract: {e}") from None
            ex = _workers[key].ctx.manifest.execution
            _sweep_dead_workers(recipe.sandbox_label, ex.backend, ex.image)
            # A task image this node lacks comes from the driver's daemon, by id (`TaskImageFetch`).
            _workers[key].ctx.fetch_image = TaskImageFetch(ray, source.driver,
                                                           f"Ray node {where['node']} (host {where['host']})")
            while len(_workers) > CACHED_WORKERS:
                _workers.popitem(last=False)[1].ctx.sandbox.close()
        _workers.move_to_end(key)
        return _workers[key]


class _SlotActor:
    """One slot in flight on the cluster: a Ray actor (its own Ray worker process, one CPU) that
    plays the attempts the driver hands it, one at a time, a few to a call. The recipe's and
    the image source's references come in a list so that Ray hands the references over, not the
    objects (fetched once per process, when its worker is rebuilt). Its second thread
    (``max_concurrency=2``) takes the driver's `stop` while an attempt plays."""

    def __init__(self, refs: list) -> None:
        self.refs = refs
        self.stopped = threading.Event()  # the driver's `stop`: no attempt is played after it

    def where(self) -> dict[str, str]:
        return _where(_ray())

    def play(self, specs: list[AttemptSpec]) -> list[Any]:
        """The results of each of `specs`, in order, played one after the other; after a `stop`
        the rest is not played (the driver drops what a cancelled call returns)."""
        if self.stopped.is_set():
            return []
        worker = _node_worker(*self.refs)
        played = []
        for spec in specs:
            # The slot's own flag too: a `stop` that came before the worker was rebuilt (its
            # workers forgotten, this one new) stops this call as well.
            if self.stopped.is_set() or worker.ctx.stop.is_set():
                break
            try:
                worker.task(spec.idx)  # the task regenerated here and checked against the contract, once
            except ValidateError as e:
                where = _where(_ray())
                raise NodeRefused(f"Ray node {where['node']} (host {where['host']}) cannot play this "
                                  f"contract: {e}") from None
            played.append(worker(spec))
        return played

    def stop(self) -> None:
        """The driver's cancel: every worker this process rebuilt stops (its stop flag, its
        sandbox torn down), as a threads executor's worker does, and none plays again."""
        self.stopped.set()
        for worker in _forget_workers():
            worker.cancel()

    def close(self) -> None:
        """The end of the run: the rebuilt workers' sandboxes closed, then the process leaves as a
        process exits (its scratch removed)."""
        for worker in _forget_workers():
            worker.ctx.sandbox.close()
        _ray().actor.exit_actor()


def _forget_workers() -> list:
    """The workers this process rebuilt, no longer cached: none is handed out again."""
    with _workers_lock:
        workers = list(_workers.values())
        _workers.clear()
    return workers


@dataclass
class _Slot:
    actor: Any
    ready: Any  # the reference of its `where`, until the driver has read it
    node: str | None = None
    host: str | None = None
    gone: bool = False  # killed, or lost with its worker or node
    calls: int = 0  # play calls handed to it


@dataclass
class _Flight:
    # each with its key's first try in this run (lost tries count from it)
    specs: list[tuple[AttemptSpec, int]]
    slot: _Slot
    started: float  # time.monotonic() when it was handed out

    @property
    def node(self) -> str | None:
        return self.slot.node

    @property
    def host(self) -> str | None:
        return self.slot.host


class RayExecutor(Executor[R]):
    name = "ray"
    remote = True

    def __init__(self, concurrency: int = 1, address: str | None = None) -> None:
        super().__init__(concurrency)
        self.ray = _ray()  # refused at once when the extra is missing, before anything runs
        self.address = address
        self._stop = threading.Event()
        self._worker: Worker[R] | None = None
        self._running: dict[Any, _Flight] = {}  # a play call in flight -> what it plays, on which slot
        #: Ray node id -> host of every node that ran an attempt of this executor.
        self.nodes: dict[str, str] = {}
        self._table: dict[str, str] = {}  # the cluster's node table: node id -> host
        #: Nodes kept out of this executor's runs: they could not get the contract's image.
        self.excluded: set[str] = set()
        #: Seconds of attempts a call carries (`CALL_S`), at most `MAX_CALL`.
        self.call_s = CALL_S
        # an attempt's seconds on a slot, as timed so far (a moving mean)
        self._attempt_s: float | None = None
        #: How many calls carried how many attempts (size -> calls), over this executor's runs.
        self.calls: collections.Counter[int] = collections.Counter()

    def _connect(self) -> None:
        if not self.ray.is_initialized():
            # log_to_driver off: the nodes' stdout would interleave with the progress bar.
            self.ray.init(address=self.address, log_to_driver=False)

    def run(self, specs: Iterable[AttemptSpec], worker: Worker[R], record: Callable[[list[R]], None]) -> None:
        recipe = worker.recipe()  # a play that cannot be shipped is refused before anything runs
        self._connect()
        self._stop, self._worker, self._running = threading.Event(), worker, {}
        self._attempt_s = None  # each play times its own attempts (an oracle's are not a control's)
        refs = [self.ray.put(recipe), self.ray.put(driver_source(self.ray, recipe.execution))]
        # the contract's text (2.2 MB at 10,000 tasks) is the object store's now, not held here too
        del recipe
        try:
            self._run(specs, worker, record, refs)
        finally:
            self._worker = None

    def _run(self, specs: Iterable[AttemptSpec], worker: Worker[R], record: Callable[[list[R]], None],
             refs: list) -> None:
        """`concurrency` slots (Ray places each actor on a node with a CPU free, never on a node
        kept out), each handed the next specification as it is idle; a slot lost with its worker
        or node is replaced (Ray places the new one where it can)."""
        ray, queue, again = self.ray, iter(specs), collections.deque()
        actor_class = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0,
                                 max_concurrency=2)(_SlotActor)
        starting: dict[Any, _Slot] = {}
        idle: list[_Slot] = []
        every: list[_Slot] = []
        failed_starts = 0

        def start() -> None:
            options = {}
            if self.excluded:  # nodes found without the contract's image are kept out of the rest of the run
                options["label_selector"] = {"ray.io/node-id": f"!in({','.join(sorted(self.excluded))})"}
            actor = actor_class.options(**options).remote(refs)
            slot = _Slot(actor, actor.where.remote())
            starting[slot.ready] = slot
            every.append(slot)

        def retire(slot: _Slot) -> None:
            slot.gone = True
            ray.kill(slot.actor)
            start()

        def take() -> tuple[AttemptSpec, int] | None:
            if again:
                return again.popleft()
            spec = next(queue, None)
            return None if spec is None else (spec, spec.attempt)

        head: tuple[AttemptSpec, int] | None = None  # the next specification, taken when a slot can play it

        def hand_out() -> None:
            """Each idle slot its next call: the next specifications, as many as `_call_size`."""
            nonlocal head
            while idle and not self._stop.is_set() and (head is not None or (head := take()) is not None):
                slot = idle.pop()
                if slot.node in self.excluded:
                    retire(slot)
                    continue
                batch, head = [head], None
                # A slot's first call carries one: it rebuilds the worker (and may find that
                # its node lacks the image), so it is neither timed nor trusted with more.
                while slot.calls and len(batch) < self._call_size() and (nxt := take()) is not None:
                    batch.append(nxt)
                slot.calls += 1
                self.calls[len(batch)] += 1
                call = slot.actor.play.remote([spec for spec, _ in batch])
                self._running[call] = _Flight(batch, slot, time.monotonic())

        for _ in range(self.concurrency):
            start()
        try:
            while True:
                hand_out()
                if not self._running:
                    if self._stop.is_set() or (head is None and (head := take()) is None):
                        break  # everything played, or cancelled and every call in flight ended
                    if not starting:
                        raise ExecutorUnavailable("--executor ray: no slot of the Ray cluster "
                                                  "is left to play on")
                ready, _ = ray.wait([*self._running, *starting], num_returns=1, timeout=0.5)
                returned: list[list[R]] = []
                for ref in ready:
                    if ref in starting:
                        slot = starting.pop(ref)
                        try:
                            where = ray.get(ref)
                        except (ray.exceptions.RayActorError, *_lost_errors(ray)) as e:
                            slot.gone = True
                            failed_starts += 1
                            if failed_starts > 10 * self.concurrency:
                                raise ExecutorUnavailable("--executor ray: Ray could not start a slot on "
                                                          f"the cluster {failed_starts} times; the last: "
                                                          f"{type(e).__name__}") from None
                            start()
                            continue
                        slot.node, slot.host = where["node"], self._host(where["node"])
                        idle.append(slot)
                        continue
                    slot = self._running[ref].slot
                    results, alive = self._step(ref, worker, again)
                    if alive:
                        idle.append(slot)
                    elif self._stop.is_set():
                        slot.gone = True
                    else:
                        retire(slot)
                    if results is not None:
                        returned.extend(results)
                # The slots idle again play on while their results are recorded: measured, a slot
                # waited ~20 ms per call on the journal (5 % of its time), ~6 ms this way.
                hand_out()
                for one in returned:  # each attempt's results, in the order its call played them
                    if self._stop.is_set():
                        break  # cancelled meanwhile (another thread): not evidence
                    record(one)
        except BaseException:
            # Ctrl-C, or evidence that could not be written, or the worker's own error: nothing
            # keeps running on the cluster unobserved.
            self.cancel()
            self._drain()
            raise
        finally:
            self._close(every)

    def _call_size(self) -> int:
        """How many attempts the next call carries: as many as fill `call_s` by the attempts
        timed so far (one until a call is timed), at most `MAX_CALL`."""
        if self._attempt_s is None:
            return 1
        return max(1, min(MAX_CALL, int(self.call_s / max(self._attempt_s, 1e-3))))

    def _timed(self, flight: _Flight, played: int) -> None:
        """A call's seconds per attempt into the moving mean; a slot's first call is passed by
        (it rebuilt the worker before it played)."""
        if flight.slot.calls > 1 and played:
            seconds = (time.monotonic() - flight.started) / played
            self._attempt_s = seconds if self._attempt_s is None else 0.8 * self._attempt_s + 0.2 * seconds

    def _step(self, call, worker: Worker[R], again: collections.deque) -> tuple[list[list[R]] | None, bool]:
        """The results of a play call, each attempt's (the lost attempts' results if its machine
        failed; None when cancelled), and whether its slot can play on."""
        ray, flight = self.ray, self._running.pop(call)
        try:
            results = ray.get(call)
        except ray.exceptions.TaskCancelledError:
            return None, True
        except (ray.exceptions.RayActorError, *_lost_errors(ray)) as e:
            if self._stop.is_set():
                return None, False  # killed by our own cancel: not evidence
            among = (f" (one of the {len(flight.specs)} attempts of one call; Ray does not say "
                     "which had started)"
                     if len(flight.specs) > 1 else "")
            lost = RayNodeLost(f"Ray node {flight.node or 'unknown'} (host {flight.host or 'unknown'}) lost "
                               f"the attempt{among}: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}")
            return self._lost(worker, flight, lost, again), False
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, NodeImageUnavailable) and not self._stop.is_set():
                self._exclude(flight.node, str(e.cause))
                return self._lost(worker, flight, e.cause, again), False
            # The worker's own code raised: its exception, as with threads (not Ray's wrapper,
            # whose text carries the node's traceback).
            raise (e.cause if isinstance(e.cause, Exception) else e) from None
        if len(results) != len(flight.specs) and not self._stop.is_set():
            raise RuntimeError(f"Ray node {flight.node}: a call of {len(flight.specs)} attempts returned "
                               f"{len(results)} results though the run was not cancelled")
        self.nodes[flight.node] = flight.host
        self._timed(flight, len(results))
        return [worker.placed(one, flight.node, flight.host) for one in results], True

    def _lost(self, worker: Worker[R], flight: _Flight, error: Exception,
              again: collections.deque) -> list[list[R]]:
        """The infrastructure-error results of each try of a call its node could not make (every
        attempt the call carried: none came back), each one's next try queued while the
        contract's retries allow."""
        lost = []
        for spec, first in flight.specs:
            results, retry = worker.lost(spec, first, type(error).__name__, str(error))
            if retry is not None:
                again.append((retry, first))
            # a slot plays only once it said where
            lost.append(worker.placed(results, flight.node, flight.host))
        return lost

    def _exclude(self, node: str | None, why: str) -> None:
        """Keep `node` out of the rest of the run; refuse the run when no node with CPUs is left."""
        if node is None:
            return
        self.excluded.add(node)
        left = [n["NodeID"] for n in self.ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("CPU") and n["NodeID"] not in self.excluded]
        if not left:
            raise NodeRefused("no node of the Ray cluster is left that has the contract's "
                              f"image; the last: {why}")

    def _host(self, node: str) -> str:
        """The host of `node` as the cluster's own node table records it (the task only says
        which node Ray's runtime context put it on; a node the table does not hold is refused)."""
        if node not in self._table:
            self._table = {n["NodeID"]: n.get("NodeManagerHostname") or n.get("NodeManagerAddress")
                           or "unknown"
                           for n in self.ray.nodes()}
        if node not in self._table:
            raise NodeRefused(f"a Ray task says it runs on node {node}, which the cluster's node "
                              "table does not hold")
        return self._table[node]

    def cancel(self) -> None:
        """Stop handing out; ask each slot playing to stop (its sandbox torn down) and kill,
        after `CANCEL_GRACE_S`, any still playing. Safe from another thread: the loop that
        consumes the calls drops what they return."""
        self._stop.set()
        worker = self._worker
        if worker is not None:
            worker.cancel()  # the driver's side: its stop flag, its sandbox
        playing = list(self._running.items())
        for _, flight in playing:
            flight.slot.actor.stop.remote()
        timer = threading.Timer(CANCEL_GRACE_S, self._kill, [[call for call, _ in playing]])
        timer.daemon = True
        timer.start()

    def _kill(self, calls: list) -> None:
        """Kill the slot of each of `calls` still playing."""
        for call in calls:
            if (flight := self._running.get(call)) is not None:
                flight.slot.gone = True
                self.ray.kill(flight.slot.actor)

    def _drain(self) -> None:
        """After a cancel on the loop's own thread: wait (at most the grace) for the calls in
        flight to end, so a driver about to exit does not kill them mid-teardown."""
        deadline = time.monotonic() + CANCEL_GRACE_S
        while self._running and time.monotonic() < deadline:
            ready, _ = self.ray.wait(list(self._running), num_returns=1, timeout=0.2)
            for call in ready:
                self._running.pop(call, None)
        self._kill(list(self._running))
        self._running.clear()

    def _close(self, slots: list[_Slot]) -> None:
        """Every slot of the run leaves: a started one closes (its sandboxes, then the process as
        it exits), one never started is killed; those killed or lost already are passed by."""
        for slot in slots:
            if slot.gone:
                continue
            if slot.node is None:
                self.ray.kill(slot.actor)
            else:
                slot.actor.close.remote()
