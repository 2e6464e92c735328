"""Exact scoring of a label partition against the gold papers, in O(N log N).

With M labels, gold papers T_t (labels in true order) and predicted groups G_g (labels in
predicted order), and c_gt = |G_g ∩ T_t|:

- B-cubed precision P = (1/M) Σ_gt c_gt² / |G_g|, recall R = (1/M) Σ_gt c_gt² / |T_t|
  (the per-label averages of |pred(i) ∩ gold(i)| / |pred(i)| and / |gold(i)|, summed by
  contingency cell instead of by label); grouping_f1 = 2PR / (P + R), 0 when P + R = 0.
- norm_kendall_tau: for each true paper t, the pairs (a before b in the true order) that
  sit in one predicted group are comparable; tau_t = concordant / comparable, and 0 when
  nothing is comparable. Concordant = comparable − inversions, where the inversions of
  each (t, g) cell are counted by merge sort over the predicted positions taken in true
  order. The macro-average over true papers is the metric.
- reward = grouping_f1 × norm_kendall_tau; paper_exact_match (diagnostic) is the fraction
  of true papers equal to one predicted group, in the same order.

An invalid reply (see `environment.deshuffle.parse`) scores 0 on every metric.
"""

from __future__ import annotations

from collections.abc import Sequence

from environment.deshuffle.parse import Partition, parse_partition

METRIC_NAMES: tuple[str, ...] = (
    "parsed_ok",
    "grouping_precision",
    "grouping_recall",
    "grouping_f1",
    "norm_kendall_tau",
    "paper_exact_match",
)

Gold = Sequence[Sequence[int]]


def zero_metrics() -> dict[str, float]:
    return dict.fromkeys(METRIC_NAMES, 0.0)


def count_inversions(seq: list[int]) -> int:
    """Pairs i < j with seq[i] > seq[j] (values distinct), by bottom-up merge sort."""
    n = len(seq)
    if n < 2:
        return 0
    src, dst = list(seq), [0] * n
    inv, width = 0, 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                if src[j] < src[i]:
                    dst[k] = src[j]
                    inv += mid - i
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            dst[k:hi] = src[i:mid] if i < mid else src[j:hi]
        src, dst = dst, src
        width *= 2
    return inv


def score_partition(groups: Partition, gold: Gold) -> dict[str, float]:
    """Metrics of a valid partition (every gold label exactly once) against `gold`."""
    n_labels = sum(len(t) for t in gold)
    group_of = [0] * (n_labels + 1)
    pos_of = [0] * (n_labels + 1)
    for g, members in enumerate(groups):
        for q, label in enumerate(members):
            group_of[label] = g
            pos_of[label] = q
    group_size = [len(m) for m in groups]

    p_sum = r_sum = 0.0
    tau_sum = 0.0
    exact = 0
    for paper in gold:
        cells: dict[int, list[int]] = {}
        for label in paper:
            cells.setdefault(group_of[label], []).append(pos_of[label])
        comparable = concordant = 0
        for g, positions in cells.items():
            c = len(positions)
            p_sum += c * c / group_size[g]
            r_sum += c * c / len(paper)
            pairs = c * (c - 1) // 2
            comparable += pairs
            concordant += pairs - count_inversions(positions)
        tau_sum += concordant / comparable if comparable else 0.0
        if len(cells) == 1:
            (g, positions), = cells.items()
            if group_size[g] == len(paper) and all(
                positions[i] == i for i in range(len(positions))
            ):
                exact += 1
    precision = p_sum / n_labels
    recall = r_sum / n_labels
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "parsed_ok": 1.0,
        "grouping_precision": precision,
        "grouping_recall": recall,
        "grouping_f1": f1,
        "norm_kendall_tau": tau_sum / len(gold),
        "paper_exact_match": exact / len(gold),
    }


def analyze_ordering(reply_text: str | bytes, gold: Gold) -> tuple[float, dict[str, float]]:
    """Parse a reply and score it: ``(reward, metrics)``; never raises on a bad reply."""
    groups = parse_partition(reply_text, sum(len(t) for t in gold))
    if groups is None:
        return 0.0, zero_metrics()
    metrics = score_partition(groups, gold)
    return metrics["grouping_f1"] * metrics["norm_kendall_tau"], metrics
