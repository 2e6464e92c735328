"""An executor that lives in tests/ (one module, one entry point, no edit under validate/):
it runs one specification at a time on the caller's thread, in *reverse* order, and only
after sending each through JSON — an executor gets plain data, and the evidence must not
depend on which executor ran the attempts or in what order."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from validate.run.executors import AttemptSpec, Executor, R, Worker


class ReversedJsonExecutor(Executor[R]):
    name = "toy-reversed"

    def __init__(self, concurrency: int = 1) -> None:
        super().__init__(concurrency)
        self.cancelled = False
        self.seen: list[AttemptSpec] = []
        self._worker: Worker[R] | None = None

    def run(self, specs: Iterable[AttemptSpec], worker: Worker[R], record: Callable[[list[R]], None]) -> None:
        self._worker = worker
        for spec in reversed(list(specs)):
            if self.cancelled:
                return
            shipped = AttemptSpec.model_validate_json(spec.model_dump_json())  # as over a wire
            self.seen.append(shipped)
            record(worker(shipped))

    def cancel(self) -> None:
        self.cancelled = True
        if self._worker is not None:
            self._worker.cancel()
