"""The pinned Hugging Face corpus, loaded through ``huggingface_hub``.

Dataset ``PrimeIntellect/deshuffle-papers-v1-corpus`` at revision `HUB_REVISION` (a commit
sha, so immutable). The loader first asks the hub for the dataset's file list at that
revision with a short timeout and no retries, so an unreachable hub fails within seconds
with a message naming the revision and the local-snapshot alternative; only then does it
download the data files (``*.parquet``, ``*.jsonl``, ``*.jsonl.gz``) of that revision.

Field mapping, hub record → `Paper` (first present name wins):

| Paper field  | hub record fields                                  |
|--------------|----------------------------------------------------|
| paper_id     | ``paper_id``, ``id`` (prefixed ``<source>:`` if it has no colon) |
| source       | ``source``                                         |
| license      | ``license``, ``licence``                           |
| title        | ``title``                                          |
| paragraphs   | ``paragraphs``: a list of strings, or of objects with ``text`` and optional ``section`` |

Only a string, or an integer that is not a bool, is taken as an id; anything else is
passed on unchanged so that validation names the field, rather than being turned into text.
Each downloaded file is read under the same `CorpusLimits` as a local snapshot, and every
fault is a `CorpusError` naming ``hf:<file>`` and the line or row.

The corpus revision is ``hf:<repo>@<revision>``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from environment.deshuffle.corpus import (
    DEFAULT_CORPUS_HINT,
    DEFAULT_LIMITS,
    Corpus,
    CorpusError,
    CorpusLimits,
    iter_records,
)

HUB_REPO = "PrimeIntellect/deshuffle-papers-v1-corpus"
HUB_REVISION = "dbd5cd49aff9fc1bbdc2579ff6d861ca2c868bfa"
_DATA_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz")


def map_hub_record(rec: dict) -> dict:
    """Map one hub record onto the local snapshot's field names (see the module table)."""
    out = dict(rec)
    source = rec.get("source")
    pid = rec.get("paper_id") or rec.get("id")
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)
    if isinstance(pid, str) and isinstance(source, str) and source and ":" not in pid:
        pid = f"{source}:{pid}"
    out["paper_id"] = pid
    out["license"] = rec.get("license", rec.get("licence"))
    paras = rec.get("paragraphs")
    if isinstance(paras, list):
        out["paragraphs"] = [{"text": p} if isinstance(p, str) else p for p in paras]
    return out


def iter_hub_file(name: str, local: Path, limits: CorpusLimits = DEFAULT_LIMITS,
                  ) -> Iterator[tuple[object, str]]:
    """Yield the mapped records of one downloaded data file; `name` is its hub name.

    A fault of the file itself (not gzip, truncated, over a cap, ...) is a `CorpusError`
    that names the hub file as well as the local copy.
    """
    try:
        for rec, where in iter_records(local, limits):
            yield (map_hub_record(rec) if isinstance(rec, dict) else rec), f"hf:{name} {where}"
    except CorpusError as e:
        raise CorpusError(f"hf:{name}: {e}") from None


def _unreachable(repo: str, revision: str, err: Exception) -> CorpusError:
    return CorpusError(
        f"the Hugging Face hub did not answer for dataset {repo} at revision {revision} "
        f"({type(err).__name__}: {err}). Point the corpus at a local snapshot instead, e.g. "
        f"`--corpus {DEFAULT_CORPUS_HINT}` (a .jsonl, .jsonl.gz or .parquet file)"
    )


def load_hub(*, repo: str = HUB_REPO, revision: str = HUB_REVISION,
             cache_dir: str | Path | None = None, timeout_s: float = 5.0,
             skip_invalid: bool = False, limits: CorpusLimits = DEFAULT_LIMITS,
             endpoint: str | None = None) -> Corpus:
    """Download the pinned dataset revision and build a `Corpus` from it. `endpoint` is the
    hub's base URL (None: huggingface_hub's own, which `HF_ENDPOINT` sets)."""
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise CorpusError(
            "corpus 'hub' needs the [hub] extra: pip install 'deshuffle-validate[hub]' (or "
            f"point the corpus at a local snapshot, e.g. --corpus {DEFAULT_CORPUS_HINT})"
        ) from None

    try:
        info = HfApi(endpoint=endpoint).dataset_info(repo, revision=revision, timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 - any transport/HTTP error means "not reachable"
        raise _unreachable(repo, revision, e) from None
    names = sorted(s.rfilename for s in (info.siblings or [])
                   if s.rfilename.endswith(_DATA_SUFFIXES))
    if not names:
        raise CorpusError(f"dataset {repo}@{revision} holds no .parquet/.jsonl data file")

    def records():
        for name in names:
            try:
                local = hf_hub_download(repo, name, repo_type="dataset", revision=revision,
                                        cache_dir=cache_dir, etag_timeout=timeout_s, endpoint=endpoint)
            except Exception as e:  # noqa: BLE001
                raise _unreachable(repo, revision, e) from None
            yield from iter_hub_file(f"{repo}@{revision}/{name}", Path(local), limits)

    return Corpus.from_records(records(), revision=f"hf:{repo}@{revision}",
                               location=f"hf:{repo}", skip_invalid=skip_invalid)
