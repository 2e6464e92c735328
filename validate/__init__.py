"""The validation harness: freeze a contract, play the oracle and negative controls through
a real sandbox with no network, give every task one verdict, and write the evidence to
Parquet, which `validate audit` derives again.

The data path reads in package order: `contract` (what is validated) → `run` (the pending
attempts, handed to an executor, `run.executors`) → `kinds` (one attempt: its task laid out,
a `sandbox` backend or a task directory's trial, `taskdir.trial`, plays it, the kind scores
it) → `evidence` (the journal and Parquet, `evidence.journal`; one verdict per task,
`evidence.verdicts`) → `report` → `audit`.

The packages are the layers, lowest first. A module imports only from its own layer or those
below it, at the top of the module (a function-level import says why on its line), and no two
modules import each other, directly or around a loop (tests/test_layers.py holds the code to
this, with this very map as ``LAYERS``):

1. environments — ``environment/``: the environment seam (`environment.protocol`) and the
   environments built on it; they import nothing of the harness.
2. foundation — `core`: errors, JSON input, paths (every file name of a run directory), the
   Parquet row models (`core.records`), the registries of name → class, the environment
   registry, the one renderer of Markdown and HTML, a plot.
3. evidence and rules — `evidence`: the journal and Parquet files, checksums, the protocol's
   verdicts, the run model (run.json), a run directory read back, signatures, the code state;
   `agents` (what a program agent gets beside its program).
4. sandbox — `sandbox`: the backend interface, storage, cgroups, seccomp, each backend in its
   own folder, the sandbox image and its file; `taskdir.images` (a task directory's image,
   built against the profile's base-image map) and `taskdir.trial` (one trial: the agent, then
   the task's own verifier, trusted or shared, on docker, podman or bwrap).
5. contract — `contract`: the sealed manifest, its freeze and checks, its task list.
6. running — `run` (the run's context, runner, lifecycle, phases, the smoke test, executors,
   an attempt's workspace), `kinds` (every attempt kind: program, trial, chat, task-shell),
   `eval` (model evaluation: its contract, client, agent, metrics, report) and the
   task-directory package (`taskdir.package`, its card, its smoke test).
7. reading — `report` (a run's report, two profiles compared) and `view` (the browser viewer).
8. audit — `audit`: a run's (`audit.run`) and an eval run's (`audit.eval`), by concern.
9. surface — `api` (the harness as functions) and `cli` (the command, which loads `api`
   only inside the command that runs).
10. development — `devtools`: the loopback model and judge server, for tests and benches;
    never imported by the harness.
"""

__version__ = "0.1.0"
