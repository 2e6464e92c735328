"""The evidence of one run directory, loaded: its contract, run.json (the run model, a
`RunSummary`), the three Parquet ledgers, the frozen and variant contracts and the smoke
results, read under one set of rules, and the dataset verdict they give now.

Everything that reads a run's verdict and facts reads them here: the report renders them,
the audit re-derives them, ``eval freeze`` admits a pool run by them. So this module sits
below all three, and none of them imports another to read a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from validate.core.errors import EvidenceError
from validate.core.jsonio import JSONInputError, loads
from validate.core.paths import FROZEN_MANIFEST, LEDGER_FILES, SMOKE, SMOKE_RESULT, VARIANTS, RunPaths
from validate.evidence.summary import RunSummary
from validate.evidence.verdicts import DatasetVerdict, dataset_verdict

if TYPE_CHECKING:
    import pandas as pd


def _json(path: Path) -> dict:
    try:
        return loads(path.read_bytes())
    except (OSError, JSONInputError) as e:
        raise EvidenceError(f"{path}: not readable JSON ({e})") from None


@dataclass
class RunEvidence:
    root: Path
    manifest: dict
    summary: RunSummary
    attempts: pd.DataFrame
    tasks: pd.DataFrame
    exclusions: pd.DataFrame
    frozen: dict | None = None
    variants: dict[str, dict] = field(default_factory=dict)
    smokes: dict[str, dict] = field(default_factory=dict)

    @property
    def latest_smoke(self) -> tuple[str, dict] | None:
        return max(self.smokes.items()) if self.smokes else None


def report_inputs(root: Path) -> list[str]:
    """The files a report of this run directory is rendered from now, relative to it, sorted."""
    paths = RunPaths(Path(root))
    names = [*LEDGER_FILES, *([FROZEN_MANIFEST] if paths.frozen_manifest.exists() else [])]
    names += [p.relative_to(paths.root).as_posix() for p in sorted(paths.variants.glob("*.json"))] \
        if paths.variants.is_dir() else []
    names += [p.relative_to(paths.root).as_posix() for p in sorted(paths.smoke.glob(f"*/{SMOKE_RESULT}"))] \
        if paths.smoke.is_dir() else []
    return sorted(names)


def load_run(root: Path, names: list[str] | None = None) -> RunEvidence:
    """A run's evidence; with `names` (from `report_inputs`, or a report's record), exactly
    those files and no other (a report's inputs)."""
    paths = RunPaths(Path(root))
    names = report_inputs(paths.root) if names is None else names
    missing = [n for n in LEDGER_FILES if n not in names]
    if missing:
        raise EvidenceError(f"{paths.root}: the report inputs lack {', '.join(missing)}")
    import pandas as pd  # lazy: a run's driver imports this module but reads no run back

    try:
        summary = RunSummary.model_validate(_json(paths.summary))
        ev = RunEvidence(root=paths.root, manifest=_json(paths.manifest), summary=summary,
                         attempts=pd.read_parquet(paths.attempts), tasks=pd.read_parquet(paths.tasks),
                         exclusions=pd.read_parquet(paths.exclusions))
    except ValidationError as e:
        raise EvidenceError(f"{paths.summary}: not a run summary ({e.errors()[0]['msg']})") from None
    except (OSError, ValueError) as e:
        raise EvidenceError(f"{paths.root}: unreadable evidence ({e})") from None
    for name in sorted(names):
        parts = name.split("/")
        if name == FROZEN_MANIFEST:
            ev.frozen = _json(paths.root / name)
        elif len(parts) == 2 and parts[0] == VARIANTS and parts[1].endswith(".json"):
            ev.variants[parts[1].removesuffix(".json")] = _json(paths.root / name)
        elif len(parts) == 3 and parts[0] == SMOKE and parts[2] == SMOKE_RESULT:
            ev.smokes[parts[1]] = _json(paths.root / name)
        elif name not in LEDGER_FILES:
            raise EvidenceError(f"{paths.root}: {name} is not a file a report reads")
    return ev


def smoke_outcome(smokes: dict[str, dict]) -> str:
    """The smoke criterion from the evidence alone: the latest entry of `smokes` (entry name →
    result.json), or "not run" when there is none."""
    return ("passed" if smokes[max(smokes)].get("passed") else "failed") if smokes else "not run"


def current_verdict(summary: RunSummary, smokes: dict[str, dict]) -> DatasetVerdict:
    """The dataset verdict with the smoke criterion taken from `smokes`, the entries that exist,
    never from run.json's copy (which says what it was at the run's end)."""
    facts = summary.facts.model_copy(update={"smoke": smoke_outcome(smokes)})
    return dataset_verdict(facts, summary.required)
