"""Part 2 of the protocol: evaluate a model on a validated dataset.

- `contract`: the eval contract, frozen on top of a frozen dataset manifest whose dataset
  verdict is PASS (model, agent, prompts, tool schema, sampling, limits, reward code, k);
- `client`: an OpenAI-compatible chat-completions client; endpoint faults are typed and
  retried (Retry-After honoured);
- `agent`: the model agent, on the host, whose ``bash`` tool runs inside the task's live
  sandbox session (`validate.sandbox.session`);
- the kinds that play the model are attempt kinds (`validate.kinds.chat`, the conversation
  scored on the host; `validate.kinds.task_shell`, the same agent on task directories, its
  ``bash`` in the task's live container, then the task's own verifier);
- `records`: the rows it writes (per turn, per sample) beside ``attempts.parquet``;
- `run`: the eval phases (``eval-greedy`` for pass@1 at temperature 0, ``eval`` for k
  samples) on one run directory, resumable;
- `metrics`, `classes`: pass@1, pass@k, pass^k, zero-variance groups, and one failure
  class per failed attempt — pure functions;
- `report`, `compare`: the eval report and two evals' deltas; the re-check is
  `validate.audit.eval`.
"""
