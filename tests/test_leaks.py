"""Nothing an agent can read derives the answer. For every environment, the standing
source-peek control (the environment's whole source plus the agent view) is played through
the real harness and must not beat that environment's chance-level control; and the agent
view names no task id, no idx, no seed, no hash, no salt and no task secret."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.conftest import make_ctx, make_manifest
from validate.run.phases import RunPhase, run_agents
from validate.run.workspace import agent_view

pytestmark = pytest.mark.bwrap

#: environment → (its chance-level control, tasks played, config)
CASES = {
    "deshuffle-papers": ("shuffled", list(range(40)), dict(max_papers=3)),
    "twohop-env": ("empty", list(range(36)), {}),
    "curator": ("random-count", list(range(20)), {}),
}


@pytest.mark.parametrize("env_name", list(CASES))
def test_source_peek_does_not_beat_chance(sandboxes, tmp_path, env_name):
    chance, idx, config = CASES[env_name]
    sandbox = sandboxes("bwrap")
    manifest = make_manifest(sandbox, idx=idx, env_name=env_name, controls=["source-peek", chance], **config)
    run_agents(make_ctx(manifest, sandbox, tmp_path / "run"), RunPhase(agents="controls"))
    a = pd.read_parquet(tmp_path / "run/attempts.parquet")
    # an infrastructure fault's retry (a loaded machine) keeps its first try's row too
    a = a[~a["superseded"]]
    peek, base = (a.loc[a["agent"] == n, "reward"].fillna(0.0) for n in ("source-peek", chance))
    print(f"\n{env_name}: source-peek mean {peek.mean():.4f} (max {peek.max():.4f}) vs {chance} "
          f"{base.mean():.4f}")
    assert len(peek) == len(idx) and (a["status"] != "harness_error").all()
    assert peek.mean() <= base.mean() and peek.max() < manifest.expectations.pass_threshold


@pytest.mark.parametrize("env_name", list(CASES))
def test_the_agent_view_names_no_task_id_idx_seed_hash_or_secret(sandboxes, env_name):
    _, idx, config = CASES[env_name]
    manifest = make_manifest(sandboxes("bwrap"), idx=idx[:5], env_name=env_name, **config)
    from tests.conftest import HINTS
    from validate.contract.manifest import check_environment, task_secret

    env, _, taskset = check_environment(manifest, HINTS)
    opaque = set()
    for entry in manifest.tasks:
        task = taskset.task(entry.idx)
        view = json.loads(agent_view(task, manifest.opaque_id(task.id)))
        assert set(view) == {"id", "prompt", "meta"}
        text = json.dumps(view)
        assert task.id not in text and task.hash not in text and task.hash[7:23] not in text
        assert entry.id.rsplit("/", 1)[0] not in text  # not even the config digest
        assert len(view["id"]) == 16 and all(c in "0123456789abcdef" for c in view["id"])
        opaque.add(view["id"])
        # Neither the salt nor the task secret derived from it is anywhere an agent reads.
        readable = [text.encode(), task.prompt.encode(), *task.files.values(),
                    *(path.read_bytes() for _, path in env.source_files())]
        for hidden in (manifest.salt, task_secret(manifest.salt)):
            assert not any(hidden.encode() in blob for blob in readable)
    assert len(opaque) == len(manifest.tasks)
    other = make_manifest(sandboxes("bwrap"), idx=idx[:1], env_name=env_name, **config)
    # salted per contract
    assert other.opaque_id(other.tasks[0].id) != manifest.opaque_id(manifest.tasks[0].id)
