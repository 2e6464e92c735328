"""A deliberately naive O(N²) reference scorer: every metric straight from its definition,
by visiting every ordered pair of labels. No contingency table, no merge sort."""

from __future__ import annotations


def naive_metrics(groups: list[list[int]], gold: list[list[int]]) -> dict[str, float]:
    pred_group = {x: gi for gi, g in enumerate(groups) for x in g}
    pred_pos = {x: q for g in groups for q, x in enumerate(g)}
    true_paper = {x: ti for ti, t in enumerate(gold) for x in t}
    true_pos = {x: q for t in gold for q, x in enumerate(t)}
    labels = sorted(true_paper)
    prec = rec = 0.0
    comparable = [0] * len(gold)
    agree = [0] * len(gold)
    for i in labels:
        same_pred = same_gold = same_both = 0
        for j in labels:
            sp = pred_group[i] == pred_group[j]
            sg = true_paper[i] == true_paper[j]
            same_pred += sp
            same_gold += sg
            same_both += sp and sg
            if sp and sg and true_pos[i] < true_pos[j]:
                comparable[true_paper[i]] += 1
                agree[true_paper[i]] += pred_pos[i] < pred_pos[j]
        prec += same_both / same_pred
        rec += same_both / same_gold
    p, r = prec / len(labels), rec / len(labels)
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    taus = [a / c if c else 0.0 for a, c in zip(agree, comparable, strict=True)]
    exact = sum(any(list(g) == list(t) for g in groups) for t in gold) / len(gold)
    return {
        "parsed_ok": 1.0, "grouping_precision": p, "grouping_recall": r, "grouping_f1": f1,
        "norm_kendall_tau": sum(taus) / len(taus), "paper_exact_match": exact,
    }
