"""Audit, the environment's half: what the environment's own code and data re-derive.

Both audits (`validate.audit.run`, `validate.audit.eval`) use it. `EnvAtHand` loads the
environment each contract names and holds every contract to it: the content revision, the
scorer, every agent's role and ``program_sha256`` recomputed from the code at audit time,
every task's id, hash and skips. `rescore` then walks attempts.parquet (streamed, a batch at a
time) and, for every attempt: reads its whole reply back (``replies/<sha256>``, or
``reply_text`` when that is provably the whole reply), checks ``reply_sha256``,
``reply_bytes``, ``reply_text`` and ``reply_truncated`` against it, re-derives its
``workspace_sha256`` from the task's materialisation, and re-scores it with the environment's
own scorer: reward, its exact text (``reward_decimal``) and every metric must come out as stored.

Re-scoring never asks anyone: the scorer reads a throwaway copy of the run's scorer-cache,
with the scorer's declared environment variables (a judge's key) hidden, so an answer the
cache lacks is a problem, not a request to a judge.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Literal

import pyarrow.parquet as pq

from environment.protocol import LoadHints, ScorerUnavailable
from validate.contract.manifest import ContractError, Manifest, check_environment, check_tasks, program_sha256
from validate.core.paths import SCORER_CACHE, SMOKE, RunPaths
from validate.core.records import EXCEPTION_STATUSES, SCORER_ERROR, UNSUPPORTED_EXECUTION_CONTRACT
from validate.evidence.journal import reply_path
from validate.kinds.trial import evidence_problems
from validate.run.workspace import workspace_sha256
from validate.taskdir.smoke_package import package_search

#: Statuses that carry no reward: the attempt was never scored (or its scorer raised).
UNSCORED = (*EXCEPTION_STATUSES, UNSUPPORTED_EXECUTION_CONTRACT, SCORER_ERROR)
#: Problems of one kind named one by one; the rest are counted.
SHOWN = 5


class EnvAtHand:
    """The environment of a run's contracts, loaded once per config and checked against each."""

    def __init__(self, manifests: dict[str, Manifest], data: tuple, root: Path, r) -> None:
        self.env = None
        self.search = tuple(data)
        self._sets: dict[str, tuple] = {}
        self.ok = bool(manifests)
        for name, m in manifests.items():
            try:
                # A task-directory smoke entry's tasks are its own package's.
                self._check(m, package_search((root / name).parent) if name.startswith(f"{SMOKE}/") else ())
            except ContractError as e:
                r.problems.append(f"{root / name}: {e} (recomputed from the environment's code and data at "
                                  "audit time)")
                self.ok = False
            except Exception as e:  # noqa: BLE001 - the environment or its data is not at hand
                r.problems.append(f"{root / name}: its environment {m.environment.name!r} or its data is not "
                                  f"at hand ({type(e).__name__}: {e}); give the data with --data PATH")
                self.ok = False
        if self.ok:
            r.checked.append(f"{len(manifests)} contracts held to the environment's code and data (revision, "
                             f"scorer, agents' program_sha256, task hashes)")

    @staticmethod
    def key(m: Manifest) -> str:
        return json.dumps(m.environment.config, sort_keys=True)

    def _check(self, m: Manifest, extra: tuple = ()) -> None:
        key = self.key(m)
        if key not in self._sets:
            self._sets[key] = check_environment(m, LoadHints(search=(*extra, *self.search)))
        env, config, taskset = self._sets[key]
        self.env = env
        if taskset.revision != m.environment.revision:
            raise ContractError(f"environment.revision: the contract says {m.environment.revision}, the "
                                f"environment's data gives {taskset.revision}")
        if env.scorer(config) != m.environment.scorer:
            raise ContractError("environment.scorer: not the environment's scorer")
        declared = {a.name: a for a in env.agents(config)}
        for name, entry in m.expectations.agents.items():
            spec = declared.get(name)
            if spec is None or spec.role != entry.role or program_sha256(spec) != entry.program_sha256:
                raise ContractError(f"expectations.agents.{name}: its role or program_sha256 is not the "
                                    f"agent's (program_sha256 {program_sha256(spec) if spec else 'none'})")
        check_tasks(m, env, config, taskset)

    def taskset(self, m: Manifest):
        return self._sets[self.key(m)][2]

    def tasks(self):
        """A task of a contract by (config key, idx), the last few kept (attempts come by task)."""
        return lru_cache(maxsize=256)(lambda key, idx: self._sets[key][2].task(idx))


@contextmanager
def offline(cache: Path, env_vars: tuple[str, ...]) -> Iterator[Path]:
    """A throwaway copy of the run's scorer-cache, with the scorer's own environment variables
    hidden (see the module docstring); both restored after. The variables are process-wide:
    the audit is one command, and nothing else scores while it runs."""
    saved = {k: os.environ.pop(k) for k in env_vars if k in os.environ}
    try:
        with tempfile.TemporaryDirectory(prefix="audit-cache-") as tmp:
            copy = Path(tmp) / SCORER_CACHE
            if cache.is_dir():
                shutil.copytree(cache, copy)
            else:
                copy.mkdir()
            yield copy
    finally:
        os.environ.update(saved)


class Tally:
    """Problems of each kind: the first `SHOWN` named, the rest counted."""

    def __init__(self, r, where: Path) -> None:
        self.r, self.where = r, where
        self.n: dict[str, int] = {}
        self.from_store = self.from_text = self.unset = 0

    def add(self, kind: str, text: str) -> None:
        self.n[kind] = self.n.get(kind, 0) + 1
        if self.n[kind] <= SHOWN:
            self.r.problems.append(f"{self.where}: {text}")

    def close(self) -> None:
        for kind, n in sorted(self.n.items()):
            if n > SHOWN:
                self.r.problems.append(f"{self.where}: and {n - SHOWN} more attempt(s) whose {kind}")


def stored_reply(paths: RunPaths, row: dict, cap: int, t: Tally,
                 name: str) -> bytes | None | Literal[False]:
    """The attempt's whole reply (None: it left none), its fields checked; False: unverifiable.
    Counts in ``t.n["from reply_text"]`` the replies taken from a ``reply_text`` that hashes to
    ``reply_sha256`` (evidence recorded before replies/ existed: provably the whole reply)."""
    tag = row["reply_sha256"]
    if tag is None:
        if row["reply_bytes"] is not None or row["reply_text"] is not None or row["reply_truncated"]:
            t.add("reply fields", f"{name}: reply_bytes/reply_text without a reply_sha256")
        t.unset += 1
        return None
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", tag):  # a hostile tag must not name a path outside replies/
        t.add("stored reply", f"{name}: reply_sha256 {tag[:80]!r} is not a sha256 tag")
        return False
    path = reply_path(paths, tag)
    if path.is_file() and not path.is_symlink():
        data = path.read_bytes()
        if "sha256:" + hashlib.sha256(data).hexdigest() != tag:
            t.add("stored reply", f"{name}: {path} does not hash to its reply_sha256 {tag}")
            return False
        t.from_store += 1
    elif row["reply_text"] is not None and not row["reply_truncated"] and \
            "sha256:" + hashlib.sha256(row["reply_text"].encode()).hexdigest() == tag:
        data = row["reply_text"].encode()  # the text is provably the whole reply
        t.from_text += 1
    else:
        t.add("stored reply", f"{name}: its reply is not stored ({path} is missing and reply_text is not the "
                              f"whole reply {tag}): it cannot be re-scored")
        return False
    if (row["reply_bytes"], row["reply_text"], bool(row["reply_truncated"])) != \
            (len(data), data[:cap].decode("utf-8", "replace"), len(data) > cap):
        t.add("reply fields",
              f"{name}: reply_bytes, reply_text or reply_truncated are not its stored reply's")
    return data


def _same(a, b) -> bool:
    a = None if a is None or (isinstance(a, float) and math.isnan(a)) else float(a)
    b = None if b is None or (isinstance(b, float) and math.isnan(b)) else float(b)
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) < 1e-9)


def rescore(paths: RunPaths, at: EnvAtHand, by_phase: dict[str, Manifest], r, label: str = "") -> None:
    """Every attempt's reply, workspace and reward re-derived (see the module docstring)."""
    where = paths.attempts
    if not by_phase:
        return  # no contract covers any phase: named by the attempts and verdicts checks
    t = Tally(r, where)
    source = pq.ParquetFile(where)
    metrics = [n for n in source.schema_arrow.names if n.startswith("metric_")]
    env_vars = {v for m in by_phase.values() for v in m.environment.scorer.env_vars}
    task_of = at.tasks()
    n = scored = 0
    with offline(paths.scorer_cache, tuple(sorted(env_vars))) as cache:
        for batch in source.iter_batches(batch_size=1000):
            for row in batch.to_pylist():
                m = by_phase.get(row["phase"])
                if m is None:
                    continue  # named by the attempts check
                n += 1
                name = (f"{row['phase']} {row['task_id']}/{row['agent']} sample {row['sample']} "
                        f"try {row['attempt']}")
                task = task_of(at.key(m), row["idx"])
                if row["workspace_sha256"] != workspace_sha256(dict(task.files)):
                    t.add("workspace_sha256",
                          f"{name}: workspace_sha256 is not its task's materialised workspace")
                reply = stored_reply(paths, row, m.execution.max_reply_text_bytes, t, name)
                if reply is False:
                    continue
                for problem in evidence_problems(row, reply, m) if "trial" in row else ():
                    t.add("trial evidence", f"{name}: {problem}")
                scored += _rescore_one(at.taskset(m), task, reply, row, metrics, cache, t, name)
    t.close()
    r.checked.append(f"{label}{scored} rewards re-scored from {n} attempts' whole replies ({t.from_store} "
                     f"from replies/, {t.from_text} from a reply_text that hashes to its reply_sha256, "
                     f"{t.unset} scored as no reply); {n} workspaces re-derived")


def _rescore_one(taskset, task, reply: bytes | None, row: dict, metrics: list[str], cache: Path, t: Tally,
                 name: str) -> int:
    status = row["status"]
    if status in UNSCORED:
        if row["reward"] is not None or row.get("reward_decimal") is not None:
            t.add("reward", f"{name}: status {status} but a reward {row['reward']} "
                            f"({row.get('reward_decimal')!r})")
        if status != SCORER_ERROR:
            return 0
    elif row["reward"] is None:
        t.add("reward", f"{name}: status {status} but no reward (every such reply is scored)")
        return 0
    try:
        s = taskset.score(task, reply or b"", cache)
    except ScorerUnavailable as e:
        t.add("reward", f"{name}: cannot be re-scored offline: a scorer dependency is not in the run's "
                        f"scorer-cache and the audit asks no judge ({str(e)[:200]})")
        return 0
    except Exception as e:  # noqa: BLE001 - a scorer's exception is what scorer_error records
        if status != SCORER_ERROR:
            t.add("reward", f"{name}: cannot be re-scored offline ({type(e).__name__}: {str(e)[:200]})")
            return 0
        return 1
    if status == SCORER_ERROR:
        t.add("reward", f"{name}: status scorer_error but the scorer scores its reply {s.reward}")
    elif not _same(row["reward"], s.reward):
        t.add("reward", f"{name}: reward {row['reward']} but its stored reply re-scores to {s.reward}")
    elif row.get("reward_decimal") != s.exact:  # the exact text the threshold was compared with
        t.add("reward", f"{name}: reward_decimal {row.get('reward_decimal')!r} but its stored reply "
                        f"re-scores to {s.exact!r}")
    elif any(not _same(row[c], s.metrics.get(c[len("metric_"):])) for c in metrics):
        t.add("metrics", f"{name}: its metrics are not what its stored reply re-scores to")
    return 1
