"""A Harbor trial on docker: one agent on one task image, verified through a reward channel
the agent cannot touch, as a library (the attempt kind that runs trials in a pool is built
on it). The modules:

- `validate.taskdir.trial.run`: the trial itself (`run_trial`): the agent phase, its processes
  killed, the verifier phase in the same container (a separate verifier: in its own), the
  reward, the cleanup; and the task's limits capped by the profile;
- `validate.taskdir.trial.docker`: the container mechanics (create, exec against the harness's
  clock, files in and out as capped archives, labelled resources and their removal);
- `validate.taskdir.trial.network`: the trial's resolver sidecar (every name either phase looks up,
  logged where only the harness reads it; `validate.taskdir.trial.dnslog` is its program) and the
  rule that makes a reference solution's lookups ``unsupported_execution_contract``;
- `validate.taskdir.trial.artifacts`: what a separate verifier is handed (``/logs/artifacts`` only);
- `validate.taskdir.trial.agents`: what each agent uploads and runs (the oracle, ``nop``, the leak
  controls), with the controls' programs in `environment.harbor.agents`;
- `validate.taskdir.trial.result`: the pydantic models of the inputs' limits and of the result.
"""
