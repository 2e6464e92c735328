"""The evidence a package carries besides its tasks (`validate.taskdir.package`): which tasks are
retained, the exclusion ledger as canonical JSON, and the dataset card ``README.md``.

The card is a template filled from the evidence only — the run's verdict rows, its exclusion
ledger, its contract (execution profile, base-image map, agents) and its dataset verdict — so
every number in it is one `validate audit` re-derives: the scoped claim with explicit
denominators (N of M tasks retained), the count of each exclusion reason, how many retained
tasks are oracle-certified (they ship a reference solution that passed) and how many are not,
and the profile they were validated on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from environment.protocol import canonical_json
from validate.contract.manifest import Manifest
from validate.core.errors import ValidateError
from validate.core.records import COMPATIBLE, CONTROL, ORACLE
from validate.evidence.run import RunEvidence, current_verdict
from validate.evidence.summary import hack_claim

if TYPE_CHECKING:
    import pandas as pd

EXCLUSION_FIELDS = ("task_id", "phase", "task_hash", "reason", "detail")


def retained_ids(tasks: pd.DataFrame) -> list[str]:
    """The compatible tasks of a run's one verdict group (a pilot's several are refused)."""
    if tasks["task_id"].duplicated().any():
        raise ValidateError("RUN: its tasks.parquet judges a task more than once (a pilot's variants); "
                            "package a pool or a run of the whole contract")
    return sorted(tasks.loc[tasks["verdict"] == COMPATIBLE, "task_id"])


def exclusion_ledger(exclusions: pd.DataFrame) -> bytes:
    import pandas as pd  # lazy: a run's driver imports this module but reads no run back

    rows: list[dict[str, Any]] = [{k: (None if pd.isna(r[k]) else r[k]) for k in EXCLUSION_FIELDS if k in r}
            for r in exclusions.to_dict("records")]
    return canonical_json({"exclusions": sorted(rows, key=lambda r: r["task_id"])}) + b"\n"


def _profile(m: Manifest) -> list[str]:
    ex = m.execution
    lim = ex.limits
    lines = [f"- backend: {ex.backend} (version {ex.backend_version}), {ex.architecture}; the agent's "
             f"network: {ex.network}",
             f"- limits per attempt (the profile's caps): {lim.cpus:g} CPU, {lim.memory_mb} MiB memory, "
             f"{lim.pids} processes, {lim.timeout_s:g} s",
             f"- infrastructure retries: {ex.infra_retries}"]
    ti = ex.task_images
    if ti is None:
        return [*lines, "- task images: not frozen in the contract (built at run time)"]
    lines.append(f"- task images: one per task, built with network `{ti.build_policy.network}` at build time "
                 f"(build v{ti.build_version}, FROM rewrite v{ti.rewrite_version}); the base-image map:")
    for name, base in sorted(ti.base_map.bases.items()):
        lines.append(f"  - `{name}` v{base.recipe.version}: image `{base.image_id}`, layer `{base.layer}`"
                     f"{f', Python {base.python}' if base.python else ''}; differs from upstream: "
                     f"{'; '.join(base.recipe.differences)}")
    for sub in ti.base_map.substitutions:
        diffs = "; ".join(sub.differences) or "nothing beyond the recipe's differences"
        lines.append(f"  - `{sub.upstream}` served by `{sub.recipe}` (substitution v{sub.version}): {diffs}")
    return lines


def card(m: Manifest, ev: RunEvidence, taskset, retained: Sequence[str], source: dict[str, str]) -> str:
    """The dataset card: every count from `ev` and `m`; the prose is this template's only."""
    tasks = ev.tasks
    total = len(tasks)
    reasons = Counter(r for r in tasks.loc[tasks["verdict"] != COMPATIBLE, "reason"].fillna("incomplete"))
    by_id = {taskset.task(i).id: taskset.task(i) for i in range(taskset.size)}
    certified = sum(1 for t in retained if getattr(by_id[t].parsed, "has_solution", False))
    oracle = ", ".join(m.expectations.named(ORACLE))
    controls = ", ".join(m.expectations.named(CONTROL))
    verdict = current_verdict(ev.summary, ev.smokes)
    lines = [
        f"# {m.name}: {len(retained)} of {total} tasks retained",
        "",
        f"This Harbor dataset holds the {len(retained)} of {total} task directories of `{m.name}` that "
        f"passed validation: {certified} oracle-certified (their reference solution, `{oracle}`, passed the "
        f"task's own verifier) and {len(retained) - certified} runtime-tested only, each rejected by every "
        f"control ({controls}). The claim is scoped to the execution profile below; it says nothing of other "
        f"profiles.{hack_claim(ev.summary.counts, m.model_dump(mode='json'))}",
        "",
        f"The run's {verdict.headline}",
        "",
        "## Counts",
        "",
        "| outcome | tasks |",
        "|---|---:|",
        f"| retained (compatible) | {len(retained)} |",
        *[f"| excluded: {reason} | {n} |" for reason, n in sorted(reasons.items())],
        f"| **total validated** | **{total}** |",
        "",
        f"The {sum(reasons.values())} tasks not retained, each with its reason and detail, are in "
        "`exclusions.json`.",
        "",
        "## Execution profile",
        "",
        *_profile(m),
        "",
        "## Provenance",
        "",
        *[f"- {k}: `{v}`" for k, v in sorted(source.items())],
        "- every file's sha256: `package.json` (canonical JSON, sorted); the tasks are byte-identical to the "
        "validated ones",
        "",
    ]
    return "\n".join(lines)
