"""The validation harness: freeze a contract, play the oracle and negative controls through
a real sandbox with no network, give every task one verdict, and write the evidence to
Parquet.

The data path, one module per step: `contract` (what is validated) → `runner` (the pending
attempts as plain specifications, handed to an `executors` executor) → `kinds` (one attempt:
`workspace` lays the task out, a `sandbox` backend runs the agent, the kind scores it) →
`evidence` (the journal, Parquet, checksums) → `verdicts` (attempts → one verdict per task).

The layers, lowest first. A module imports only from its own layer or those below it, at
the top of the module (a function-level import says why on its line), and no two modules
import each other, directly or around a loop (tests/test_layers.py holds the code to this,
with this very list as ``LAYERS``):

1. environments — ``environment/``: the environment seam (`environment.protocol`) and the
   environments built on it; they import nothing of the harness.
2. foundation — `errors`, `jsonio`, `paths` (every file name of a run directory),
   `records` (the Parquet row models), `registry` (name → class from entry points),
   `render` (the one renderer of Markdown and HTML documents), `plot`, `localserver` (a chat-completions server for tests and benches).
3. evidence and rules — `evidence` (atomic writes, checksums), `verdicts` (the protocol's
   rules), `signing`, `patches`, `environments` (the environment registry), `agents`,
   `summary` (the run model, run.json) and `run_evidence` (a run directory loaded through
   it, with its current verdict: what the report, the audit and ``eval freeze`` read).
4. sandbox — `sandbox.base` (the backend interface and its live `Session`), storage,
   cgroups, seccomp, the backends, the registry face `sandbox`; `image` (what a backend
   runs) and `imagefile` (the image as one file, exported and imported); `taskimage` (a
   task-directory dataset's per-task images, built against the profile's base-image map);
   `trial` (one Harbor trial on docker: agent phase, its processes killed, verifier phase
   in the same container, its agents and result; its network signal from a resolver
   sidecar, `trial.network`, or from the harness's own sockets in the container's
   namespace, `trial.nsresolver`).
5. contract — `sealed` (the sealed-document base), `tasklist` (a contract's task entries,
   held as columns), `contract` (the sealed manifest), `workspace` (a task laid out as files).
6. running — `context` (a run's context), `executors` and `kinds` (the registries of how
   attempts are carried out and what an attempt is), `runner`, `lifecycle`, `phases`,
   `smoke`, `package` and `package_card` (a validated task-directory dataset written as a
   Harbor dataset, with its dataset card; handed the audit by the caller), `smoke_package`
   (the smoke test of such a pool rerun from its package), and model evaluation (``eval/``: its contract, client, agent, the chat kind,
   metrics, its own report and `eval.freeze`, which is handed the pool's audit by the
   caller rather than importing it).
7. reading — `report` (the run report), `profiles` (one contract's runs on two execution
   profiles, compared) and `view` (the browser viewer).
8. audit — `audit_seal` (the result and the seal check), `audit_earlier`, `audit_contracts`,
   `audit_env`, `audit_counts`, `audit_reports` (documents rendered again), `audit` (a
   run's) and `audit_eval` (an eval run's). The audit of a copy a resume kept is the full
   audit again, handed down as a parameter, never imported upwards.
9. surface — `options` (argument checks), `api` (the harness as functions), `cli` (the
   command, which loads `api` only inside the command that runs).
"""

__version__ = "0.1.0"
