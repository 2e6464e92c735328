"""deshuffle-papers: rebuild full research papers from their shuffled paragraphs.

Spec: the deshuffle-papers seed. Where the seed is silent, this package decides:

Task generation
    Papers are taken in corpus order after the ``source`` filter; let N be their number.
    Task ``idx`` anchors paper ``idx % N``. The paper count k is uniform in
    ``min_papers..max_papers``; the other k−1 papers are drawn without replacement from the
    other N−1. Beyond N the anchors repeat with fresh co-papers and shuffles. With
    ``include_headers`` each section heading is an orderable unit of its own, emitted just
    before a paragraph whenever ``section`` changes to a non-empty value. All units of all
    k papers are shuffled together and labelled 1..M in displayed order (line j of
    ``paragraphs.jsonl`` is ``{"label": j, "text": ...}``), so a displayed order can already
    be correct. Every random choice comes from (seed, idx), the shuffle also from the
    contract's task secret and the true-order text (see `generate`): the same corpus
    revision, config, secret and idx give byte-identical files and the same hash.

Task identity
    ``id`` is ``deshuffle-papers/<config digest>/<idx>`` (unique per config); ``hash`` is
    ``sha256:`` of the canonical JSON (sorted keys, no whitespace) of
    ``{id, prompt, files: {name: sha256}, gold}``. Agents see neither: the harness shows them
    an opaque id. The family of a task is its anchor paper's source; its public meta is
    ``n_papers`` (the prompt states it) and ``n_units``.

Answers and scoring
    See `parse` (the last balanced ``\\boxed{}``; a 4 MiB reply cap) and `score`
    (B-cubed grouping F1 × macro normalised Kendall tau, O(N log N)).
"""

from environment.deshuffle.corpus import Corpus, CorpusError, Paper, Paragraph
from environment.deshuffle.generate import (
    ENV_NAME,
    PARAGRAPHS_FILE,
    DeshuffleConfig,
    DeshuffleTask,
    DeshuffleTaskset,
)
from environment.deshuffle.hub import HUB_REPO, HUB_REVISION
from environment.deshuffle.parse import MAX_REPLY_CHARS, parse_partition
from environment.deshuffle.score import METRIC_NAMES, analyze_ordering

__all__ = [
    "ENV_NAME", "HUB_REPO", "HUB_REVISION", "MAX_REPLY_CHARS", "METRIC_NAMES", "PARAGRAPHS_FILE",
    "Corpus", "CorpusError", "DeshuffleConfig", "DeshuffleTask", "DeshuffleTaskset", "Paper",
    "Paragraph", "analyze_ordering", "parse_partition",
]
