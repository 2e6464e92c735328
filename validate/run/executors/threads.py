"""The ``threads`` executor: attempts on a pool of this process's threads.

Each thread runs the worker on one specification; the caller's thread waits for the first to
finish, records it, and only then hands out the next one, so at most `concurrency` attempts
run and none runs that could not be recorded. Cancelling stops the hand-out, asks the worker
to kill what runs (it closes the sandbox) and waits for the threads; what they return after
is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from validate.run.executors import AttemptSpec, Executor, R, Worker


class ThreadsExecutor(Executor[R]):
    name = "threads"

    def __init__(self, concurrency: int = 1) -> None:
        super().__init__(concurrency)
        self._stop = threading.Event()
        self._worker: Worker[R] | None = None

    def run(self, specs: Iterable[AttemptSpec], worker: Worker[R], record: Callable[[list[R]], None]) -> None:
        # Each run has its own stop: a cancel ends that run only (the runner then raises
        # Interrupted), never a later play on the same executor.
        self._stop, self._worker = threading.Event(), worker
        try:
            self._run(specs, worker, record)
        finally:
            self._worker = None

    def _run(self, specs: Iterable[AttemptSpec], worker: Worker[R],
             record: Callable[[list[R]], None]) -> None:
        queue = iter(specs)
        running: dict[Future, AttemptSpec] = {}
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="attempt") as pool:

            def submit_next() -> None:
                spec = None if self._stop.is_set() else next(queue, None)
                if spec is not None:
                    running[pool.submit(worker, spec)] = spec

            for _ in range(self.concurrency):
                submit_next()
            try:
                while running:
                    done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                    for fut in done:
                        running.pop(fut)
                        results = fut.result()
                        if self._stop.is_set():
                            continue  # killed by our own cancel: not evidence, rerun on resume
                        record(results)
                        submit_next()
            except KeyboardInterrupt:
                self.cancel()
                for fut in running:
                    fut.cancel()
                wait(list(running))
                raise

    def cancel(self) -> None:
        self._stop.set()
        worker = self._worker
        if worker is not None:
            worker.cancel()
