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

Running trials (images, containers, agents) is the harness's business, not this package's.
"""
