"""Audit: every document a run holds is rendered again from sealed evidence and compared
byte for byte — never parsed, never searched for a string.

- Run reports (``reports/<t>/``): `validate.report.run.render` of the files report.json names
  (``ledgers``), found in the run directory or in the copy a resume kept (``earlier/<key>/``,
  `validate.evidence.journal.ledger_source`; such a copy is itself audited first,
  `validate.audit.earlier`), with the renderer report.json names. report.md, report.html and
  report.json must equal it, and the entry must hold nothing else.
- Smoke results (``smoke/<t>/result.json``): `validate.run.smoke.smoke_result` of the run's and the
  rerun's ledgers and the sample contract (the build's facts taken from result.json itself).
- Eval reports: `validate.eval.report.render` likewise; compare entries
  (``<ledgers>/compare/<A>--<B>/<t>/``) that name an audited eval run: `comparison` of A's and
  B's evidence and its `render`, and their own seal.
- Profile comparisons (``<ledgers>/compare-profiles/<A>--<B>/<t>/``) that name an audited
  dataset run: `validate.report.profiles.comparison` of A's and B's evidence and its `render`, and
  their own seal.

A document that cannot be rendered again (an unknown renderer version, inputs that are
gone or changed) is a problem, never a note: its claims would otherwise go unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from validate.audit.earlier import check_earlier
from validate.audit.seal import AuditResult, check_seal
from validate.contract.manifest import load_manifest
from validate.core.jsonio import loads
from validate.core.paths import (
    ATTEMPTS,
    COMPARE_JSON,
    MANIFEST,
    REPORT_JSON,
    SMOKE_RESULT,
    SMOKE_RUN,
    RunPaths,
)
from validate.core.records import EVAL, RUN, RunKind
from validate.eval import compare, report as eval_report
from validate.evidence.journal import file_sha256, ledger_source
from validate.report import profiles, run as report
from validate.run.smoke import PROCESS_FIELDS, SmokeResult, result_json, smoke_result
from validate.taskdir.smoke_package import PACKAGE

#: The full audit of a run directory (`validate.audit.run.audit`, `validate.audit.eval.audit`),
#: handed down by the audit that calls this module: a copy a resume kept is audited with it,
#: so this module, below both audits, imports neither.
Audit = Callable[[Path], AuditResult]


def first_difference(stored: bytes, expected: bytes) -> str:
    """Where `stored` first departs from `expected`: the byte offset, the heading it falls
    under and whether in a table, and the two texts there (short, repr'd: stored text is
    hostile)."""
    at = next((i for i, (x, y) in enumerate(zip(stored, expected, strict=False)) if x != y),
              min(len(stored), len(expected)))
    before = expected[:at].decode("utf-8", "replace")
    heads = re.findall(r"(?m)^#+ (.*)$", before) or re.findall(r"<h[1-3]>(.*?)</h[1-3]>", before)
    line = before.rsplit("\n", 1)[-1]
    in_table = line.startswith("|") or before.rfind("<table") > before.rfind("</table>")
    where = f" in the {heads[-1]} {'table' if in_table else 'section'}" if heads else ""
    return (f"first difference at byte {at}{where}: {stored[at:at + 60].decode('utf-8', 'replace')!r} where "
            f"the evidence renders {expected[at:at + 60].decode('utf-8', 'replace')!r}")


def _compare_files(entry: Path, files: dict[str, bytes], r, seal: tuple[str, ...] = ()) -> bool:
    """The entry holds exactly `files` (and its own `seal` files), each byte for byte; a
    problem per departure."""
    ok = True
    extra = sorted(p.name for p in entry.iterdir() if p.name not in files and p.name not in seal)
    if extra:
        r.problems.append(f"{entry}: holds {', '.join(extra)}, which its renderer does not write")
        ok = False
    for name, expected in files.items():
        path = entry / name
        stored = path.read_bytes() if path.is_file() else None
        if stored is None:
            r.problems.append(f"{path}: missing")
            ok = False
        elif stored != expected:
            r.problems.append(f"{path}: is not what its evidence renders "
                              f"({first_difference(stored, expected)})")
            ok = False
    return ok


def _record(path: Path, renderer: str, r) -> dict | None:
    """report.json (or compare.json) as JSON naming `renderer` and its ``ledgers``, or None
    with the problem recorded."""
    try:
        data = loads(path.read_bytes())
    except (OSError, ValueError) as e:  # JSONInputError is a ValueError
        r.problems.append(f"{path}: unreadable ({type(e).__name__}: {e})")
        return None
    if not isinstance(data, dict) or data.get("renderer") != renderer:
        said = data.get("renderer") if isinstance(data, dict) else None
        what = "names no renderer version (written before the audit re-rendered documents)" if said is None \
            else f"names renderer {str(said)[:40]!r}"
        r.problems.append(f"{path}: {what}, and this audit can render again only with {renderer}; a document "
                          "it cannot render again is not evidence: write a new one")
        return None
    ledgers = data.get("ledgers")
    if not isinstance(ledgers, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in ledgers.items()):
        r.problems.append(f"{path}: names no input files (ledgers)")
        return None
    return data


def _entries(parent: Path, r=None) -> list[Path]:
    """The entries (plain directories) under `parent`; with `r`, anything else there (a file,
    a symlink) is a problem: it would be sealed, shown, and never rendered again."""
    if not parent.is_dir() or parent.is_symlink():
        if r is not None and parent.is_symlink():
            r.problems.append(f"{parent}: a symlink, not a directory of entries")
        return []
    out = []
    for p in sorted(parent.iterdir()):
        if p.is_dir() and not p.is_symlink():
            out.append(p)
        elif r is not None:
            r.problems.append(f"{p}: not an entry (a plain directory) of {parent.name}/; nothing renders it")
    return out


def _rendered(kind: str, entries: list[Path], check, r) -> None:
    """Run `check(entry) -> bool` on each entry and say honestly how many were equal."""
    equal = 0
    for entry in entries:
        try:
            equal += bool(check(entry))
        except Exception as e:  # noqa: BLE001 - evidence that breaks the renderer is the finding
            r.problems.append(f"{entry}: cannot be rendered again ({type(e).__name__}: {e})")
    if entries:
        r.checked.append(f"{equal} of {len(entries)} {kind} re-rendered and equal" if equal < len(entries)
                         else f"{equal} {kind} re-rendered and equal")


def _report(paths: RunPaths, entry: Path, r, kept: dict[Path, bool], kind: RunKind, audit: Audit) -> bool:
    """One report entry of a run (`kind` "run") or an eval run ("eval"), rendered again from
    the files its report.json names, with the renderer it names; a copy a resume kept is
    first audited with `audit`."""
    if kind == EVAL:
        renderer = eval_report.RENDERER
        render = lambda src, names: eval_report.render(src)  # noqa: E731 - an eval report reads a fixed set
    else:
        renderer, render = report.RENDERER, report.render
    record = _record(entry / REPORT_JSON, renderer, r)
    if record is None:
        return False
    src = ledger_source(paths, record["ledgers"])
    if src is None:
        r.problems.append(f"{entry / REPORT_JSON}: the files it was rendered from (ledgers) are neither this "
                          "run's nor a copy kept at a resume (earlier/): it cannot be rendered again")
        return False
    if src != paths.root:  # a copy kept at a resume: evidence only once audited itself
        if src not in kept:
            kept[src] = check_earlier(paths, src, sorted(record["ledgers"]), r, audit)
        if not kept[src]:
            return False
    return _compare_files(entry, render(src, list(record["ledgers"])), r)


def _smoke_result(paths: RunPaths, entry: Path, r) -> bool:
    if not (entry / SMOKE_RUN / ATTEMPTS).is_file() or not (entry / MANIFEST).is_file():
        r.problems.append(f"{entry}: no rerun evidence (run/attempts.parquet, manifest.json)")
        return False
    extra = sorted(p.name for p in entry.iterdir()
                   if p.name not in (MANIFEST, SMOKE_RESULT, SMOKE_RUN, PACKAGE))
    if extra:
        r.problems.append(f"{entry}: holds {', '.join(extra)}, which a smoke test does not write")
        return False
    stored = SmokeResult.model_validate_json((entry / SMOKE_RESULT).read_bytes())
    tolerance = load_manifest(paths.manifest).environment.scorer.smoke_tolerance
    process = {f: getattr(stored, f) for f in PROCESS_FIELDS}
    expected = result_json(smoke_result(paths.root, entry / SMOKE_RUN, entry / MANIFEST, tolerance, process))
    got = (entry / SMOKE_RESULT).read_bytes()
    if got != expected:
        r.problems.append(f"{entry / SMOKE_RESULT}: does not derive again from the two ledgers "
                          f"({first_difference(got, expected)})")
        return False
    return True


def check_rendered(ev, paths: RunPaths, r, audit: Audit) -> None:
    """A run directory's reports and smoke results, each rendered again (`validate audit`,
    which hands itself down as `audit`)."""
    kept: dict[Path, bool] = {}  # each copy kept at a resume audited once
    _rendered("reports", _entries(paths.reports, r), lambda e: _report(paths, e, r, kept, RUN, audit), r)
    _rendered("smoke results", _entries(paths.smoke, r), lambda e: _smoke_result(paths, e, r), r)
    _rendered("profile comparisons", profiles.entries_naming(paths.root),
              lambda e: _sealed_entry(e, r, lambda: check_profiles(e, r, {paths.root.name: paths.root})), r)


def _check_pair(entry: Path, r, renderer: str, sides: Callable[[dict], tuple[object, object]],
                rerender: Callable[[Path, Path], dict[str, bytes]], runs: dict[str, Path] | None) -> bool:
    """One entry comparing two runs A and B (named by `sides` of its JSON record): computed
    again from their evidence (by default the run directories beside the entry's folder,
    ``<ledgers>/<folder>/<A>--<B>/<t>``) and rendered again, byte for byte."""
    record = _record(entry / COMPARE_JSON, renderer, r)
    if record is None:
        return False
    home = entry.parent.parent.parent
    dirs = {side: (runs or {}).get(str(run), home / str(run))
            for side, run in zip(("A", "B"), sides(record), strict=True)}
    for name, digest in sorted(record["ledgers"].items()):
        side, _, rel = name.partition("/")
        path = dirs[side] / rel if side in dirs and rel and ".." not in Path(rel).parts else None
        if path is None or not path.is_file() or file_sha256(path) != digest:
            r.problems.append(f"{entry / COMPARE_JSON}: was not computed from {path or name} as it is now "
                              f"(missing or changed): it cannot be computed again")
            return False
    seal = (RunPaths(entry).checksums.name, RunPaths(entry).signature.name)  # a compare entry is sealed alone
    return _compare_files(entry, rerender(dirs["A"], dirs["B"]), r, seal)


def check_compare(entry: Path, r, runs: dict[str, Path] | None = None) -> bool:
    """One eval compare entry (`validate.eval.compare`), computed and rendered again."""
    return _check_pair(entry, r, compare.RENDERER, lambda rec: (rec.get("run_a"), rec.get("run_b")),
                       lambda a, b: compare.render(compare.comparison(a, b)), runs)


def check_profiles(entry: Path, r, runs: dict[str, Path] | None = None) -> bool:
    """One profile comparison (`validate.report.profiles`), computed and rendered again."""
    def sides(rec: dict) -> tuple[object, object]:
        a, b = rec.get("a"), rec.get("b")
        return (a.get("run_id") if isinstance(a, dict) else None,
                b.get("run_id") if isinstance(b, dict) else None)

    return _check_pair(entry, r, profiles.RENDERER, sides,
                       lambda a, b: profiles.render(profiles.comparison(a, b)), runs)


def _sealed_entry(entry: Path, r, check: Callable[[], bool]) -> bool:
    """An entry sealed alone: its seal (counted with the entries, not on a line of its own), then `check`."""
    before, said = len(r.problems), len(r.checked)
    check_seal(RunPaths(entry), r)
    del r.checked[said:]
    return check() and len(r.problems) == before


def audit_compare(entry: Path, runs: dict[str, Path] | None = None):
    """A compare entry's whole audit: its seal, then `check_compare`."""
    r = AuditResult()
    check_seal(RunPaths(Path(entry)), r)
    _rendered("comparisons", [Path(entry)], lambda e: check_compare(e, r, runs), r)
    return r


def _compares_of(root: Path) -> list[Path]:
    """Compare entries beside this eval run (``../compare/*--*/<t>/``) whose pair names it."""
    parent = root.parent / "compare"
    pairs = [d for d in _entries(parent) if root.name in d.name.split("--")]
    return [e for d in pairs for e in _entries(d)]


def check_eval_rendered(ev, paths, r, audit: Audit) -> None:
    """An eval run's reports and the compare entries that name it, rendered again
    (`validate eval audit`, which hands itself down as `audit`); `paths` is the run's `EvalPaths`."""
    run = paths.run
    kept: dict[Path, bool] = {}
    _rendered("eval reports", _entries(run.reports, r), lambda e: _report(run, e, r, kept, EVAL, audit), r)

    _rendered("comparisons", _compares_of(paths.root),
              lambda e: _sealed_entry(e, r, lambda: check_compare(e, r, {paths.root.name: paths.root})), r)
