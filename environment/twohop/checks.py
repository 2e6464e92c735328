"""The dataset's own validation, before any agent runs: per-task checks and dataset checks.

Each check returns a `Check` (passed or not, with a detail); the environment turns failed
ones into blocking findings. The two chain checks are the seed's:

- **ablation**: remove each fact of the proof; the answer must change (for a single chain,
  become ``unknown``). It proves the *resolver* reads every fact.
- **non-forcing**: at every intermediate entity of every chain (the employer; for three
  hops also its city), some other entity of the same type must lead to a different,
  derivable answer. It proves the hop is load-bearing for whoever *answers*: if every
  organisation sat in the same city, ablation would still pass, while a model could name
  that city having ignored the employer — a one-hop question in a two-hop costume.

Further per-task checks: the chain length matches the category; the one-hop shortcut (a
home city standing in for the employer's) answers differently; a distractor's former
employer leads elsewhere; a broken question breaks after its first hop and another
employer would make it answerable; the gold is recomputed from the workspace file exactly
as an agent reads it; no gold name appears in the prompt.

Dataset checks: the modal answer, and the modal city among city answers, each cover fewer
than half of the answers; every broken question's wording is shared with answerable ones;
every task shows the same public meta.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from typing import NamedTuple

from environment.twohop.dataset import FACTS_FILE, facts_text
from environment.twohop.solver import HOPS, UNKNOWN, Index, Question, resolve, shortcut
from environment.twohop.universe import FORMERLY, TYPES, Fact, Universe, parse_facts

#: Category → the hops every chain of its questions must have (broken: a chain that breaks).
CATEGORY_HOPS = {"twohop": 2, "distractor": 2, "reverse": 2, "threehop": 3, "aggregate": 3, "broken": 0}


class Check(NamedTuple):
    kind: str
    passed: bool
    detail: str


def _without(facts, fact: Fact) -> list[Fact]:
    return [f for f in facts if f != fact]


def _substituted(facts, old: Fact, new: Fact) -> list[Fact]:
    """``old`` replaced by ``new``; relations are functional, so ``new``'s subject loses its
    other fact of that relation."""
    return [f for f in facts if f != old and (f.relation, f.subject) != (new.relation, new.subject)] + [new]


def ablation(facts, question: Question, gold: tuple[str, ...]) -> Check:
    res = resolve(facts, question)
    proof = list(dict.fromkeys(f for chain in res.chains for f in chain))
    single = len(res.chains) == 1
    survivors = []
    for fact in proof:
        rows = resolve(_without(facts, fact), question).rows
        if rows == gold or (single and rows != (UNKNOWN,)):
            survivors.append(fact.text())
    if not proof:
        return Check("ablation", False, "no chain proves the answer, so there is nothing to ablate")
    if survivors:
        return Check("ablation", False, f"the answer stays derivable without {'; '.join(survivors[:3])}: "
                                        f"that fact is not load-bearing")
    return Check("ablation", True, f"removing any of the {len(proof)} facts of the proof makes the answer "
                                   f"{'underivable' if single else 'change'}")


def _alternatives(universe: Universe, facts, question: Question, gold, fact: Fact, entity: str) -> bool:
    """Whether some other entity of ``entity``'s type, put in its place in ``fact``, leads
    to a different derivable answer."""
    kind = TYPES[fact.relation][0 if fact.subject == entity else 1]
    for other in universe.of_type(kind):
        if other == entity:
            continue
        new = Fact(fact.relation, other if fact.subject == entity else fact.subject,
                   other if fact.object == entity else fact.object)
        res = resolve(_substituted(facts, fact, new), question)
        if res.derivable and res.rows != gold:
            return True
    return False


def non_forcing(universe: Universe, facts, question: Question, gold: tuple[str, ...]) -> Check:
    forced = []
    res = resolve(facts, question)
    for chain in res.chains:
        for here, nxt in pairwise(chain):
            entity = ({here.subject, here.object} & {nxt.subject, nxt.object}).pop()
            if not _alternatives(universe, facts, question, gold, here, entity):
                forced.append(f"{entity} (in “{here.text()}”)")
    if forced:
        return Check("non_forcing", False, f"no other entity in place of {'; '.join(forced[:3])} leads "
                                           "elsewhere: the answer can be named with that hop ignored")
    return Check("non_forcing", True, "at every intermediate entity another choice leads elsewhere")


def chain_length(category: str, question: Question, facts) -> Check:
    res = resolve(facts, question)
    want = CATEGORY_HOPS[category]
    if category == "broken":
        ok = not res.derivable and 1 <= len(res.partial) < HOPS[question.kind]
        return Check(
            "chain_length",
            ok,
            f"the chain breaks after {len(res.partial)} of "
            f"{HOPS[question.kind]} "
            f"hops{'' if ok else ': a broken question must name an employed person'}",
        )
    lengths = sorted({len(c) for c in res.chains})
    ok = bool(lengths) and lengths == [want] and HOPS[question.kind] == want
    return Check("chain_length", ok,
                 f"chains of {lengths or 'no'} hops for a {category} question ({want} expected)")


def shortcut_differs(facts, question: Question, gold) -> Check:
    rows = shortcut(facts, question).rows
    return Check(
        "shortcut",
        rows != gold,
        "the one-hop shortcut (home city for the employer's) "
        f"{'answers differently' if rows != gold else 'gives the gold answer'}",
    )


def distractor_misleads(facts, question: Question, gold) -> Check:
    old = resolve(facts, question, first=FORMERLY)
    ok = old.derivable and old.rows != gold
    return Check("distractor", ok,
                 "the former employer leads " + ("elsewhere" if ok else "nowhere or to the gold"))


def decline_load_bearing(universe: Universe, facts, question: Question) -> Check:
    """For a broken question: another employer would make it answerable, so ``unknown``
    is this chain's answer, not every chain's."""
    res = resolve(facts, question)
    ok = bool(res.partial) and _alternatives(universe, facts, question, res.rows, res.partial[0],
                                             res.partial[0].object)
    return Check("decline", ok and res.rows == (UNKNOWN,),
                 "another employer would lead to an answer" if ok else "no employer leads anywhere")


def workspace_roundtrip(universe: Universe, files, question: Question, gold) -> Check:
    try:
        parsed = parse_facts(facts_text(files[FACTS_FILE].decode("utf-8")))
    except (KeyError, UnicodeDecodeError) as e:
        return Check("workspace", False, f"{FACTS_FILE} is unreadable: {e}")
    ok = parsed == list(universe.facts) and resolve(parsed, question).rows == gold
    return Check(
        "workspace",
        ok,
        f"the {len(parsed)} facts read back from {FACTS_FILE} "
        f"{'give the gold answer' if ok else 'differ from the universe or its answer'}",
    )


def gold_hidden(prompt: str, gold) -> Check:
    shown = [r for r in gold if r != UNKNOWN and r in prompt]
    return Check("gold_in_prompt", not shown, f"the prompt names {', '.join(shown)}" if shown
                 else "no gold name appears in the prompt")


def task_checks(universe: Universe, category: str, question: Question, gold, prompt: str,
                files) -> list[Check]:
    """Every per-task check, passed or not, in a fixed order."""
    facts = list(universe.facts)
    out = [chain_length(category, question, facts), workspace_roundtrip(universe, files, question, gold),
           gold_hidden(prompt, gold)]
    if category == "broken":
        return out + [decline_load_bearing(universe, facts, question)]
    out += [ablation(facts, question, gold), non_forcing(universe, facts, question, gold),
            shortcut_differs(facts, question, gold)]
    if category == "distractor":
        out.append(distractor_misleads(facts, question, gold))
    return out


def chains_proved(universe: Universe, question: Question) -> int:
    """Chains of a question's proof (one per listed person for an aggregate)."""
    return len(resolve(Index(universe.facts), question).chains)


def modal_share(golds) -> tuple[tuple[str, ...], int, int]:
    """(modal answer, its count, the number of answers); ties go to the smallest answer."""
    counts = Counter(tuple(g) for g in golds)
    if not counts:
        return (), 0, 0
    top = min(counts, key=lambda g: (-counts[g], g))
    return top, counts[top], sum(counts.values())


def dataset_checks(items, metas) -> list[Check]:
    """``items``: (category, question, gold) of every task of the dataset."""
    items = list(items)
    out = []
    for label, golds in (("modal_answer", [g for _, _, g in items]),
                         ("modal_city",
                          [g for c, q, g in items if q.kind == "employer_city" and c != "broken"])):
        top, count, total = modal_share(golds)
        ok = 2 * count < total
        out.append(Check(label, ok, f"the modal {'answer' if label == 'modal_answer' else 'city'} "
                                    f"{'/'.join(top)} covers {count} of {total} "
                                    f"({count / max(total, 1):.3f}); fewer than half "
                                    f"{'holds' if ok else 'does not hold'}"))
    derivable_kinds = {q.kind for c, q, _ in items if c != "broken"}
    bare = sorted({q.kind for c, q, _ in items if c == "broken"} - derivable_kinds)
    out.append(Check("decline_hidden", not bare, f"broken questions of kind {', '.join(bare)} have no "
                     "answerable twin: their wording gives `unknown` away" if bare
                     else "every broken question is worded like answerable ones"))
    distinct = sorted({repr(sorted(m.items())) for m in metas})
    out.append(Check("meta_constant", len(distinct) <= 1,
                     "every task shows the same public meta" if len(distinct) <= 1
                     else f"public meta differs between tasks ({len(distinct)} variants): it may "
                          "tell tasks apart"))
    return out
