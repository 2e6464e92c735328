"""Playing a contract: the run's context, the runner that plays attempts through an executor
(`executors`), the run's lifecycle, the phases (pilot, pool, run), the smoke test, an attempt's
workspace."""
