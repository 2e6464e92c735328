"""Harbor task-directory datasets: the format, read without the ``harbor`` package.

A Harbor dataset is a directory of task directories (``task.toml``, ``instruction.md``,
``environment/``, ``solution/solve.sh``, ``tests/test.sh``). This package owns reading one:

- `environment.harbor.config`: pydantic models of ``task.toml`` (Harbor's schema, with its
  legacy spellings, unknown keys ignored as Harbor ignores them);
- `environment.harbor.taskdir`: the loader — a dataset directory in, per task either a parsed
  task or a blocking finding naming the file and field, plus the content hashes;
- `environment.harbor.reward`: reading ``reward.json`` / ``reward.txt`` with Harbor's
  precedence and this harness's stricter rule, and what the agent left in the verifier's
  log directory.

- `environment.harbor.env`: the dataset behind the environment seam (config, taskset found
  by its revision, families, findings, the agents it declares);
- `environment.harbor.agents`: the agents' programs — the oracle (the task's own
  ``solve.sh``), ``nop`` and three leak controls (``reward-forger``, ``test-reader``,
  ``history-miner``), each generic: none ever reads which task it is on.

Running trials (images, containers, the verifier inside them) is the harness's business
(`validate.taskdir.images`, `validate.taskdir.trial`, and the ``trial`` attempt kind that plays them in a
run, `validate.kinds.trial`), not this package's.
"""
