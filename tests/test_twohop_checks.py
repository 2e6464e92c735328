"""twohop-env's own validation: every check passes on the real dataset, and each one fails
on the defect it exists for — above all the seed's trap (every organisation in one city),
which ablation waves through and non-forcing flags."""

from __future__ import annotations

import dataclasses

import pytest

from environment.twohop import TwohopConfig, TwohopEnvironment
from environment.twohop.checks import ablation, dataset_checks, modal_share, non_forcing, task_checks
from environment.twohop.dataset import FACTS_FILE, api_description
from environment.twohop.solver import UNKNOWN, Question, resolve
from environment.twohop.universe import HQ, LIVES_IN, WORKS_FOR, Fact

ENV = TwohopEnvironment()
SPECS = {a.name: a for a in ENV.agents(TwohopConfig())}


@pytest.fixture(scope="module")
def taskset():
    return ENV.load(TwohopConfig())


@pytest.fixture(scope="module")
def tasks(taskset):
    return [taskset.task(i) for i in range(taskset.size)]


def _rebuilt(task, facts):
    """``task`` over other facts: universe, workspace file and gold all recomputed."""
    universe = task.universe.with_facts(facts)
    return dataclasses.replace(task, universe=universe, rows=resolve(universe.facts, task.question).rows,
                               files={FACTS_FILE: api_description(universe).encode()})


def _employer(task) -> str:
    return next(f.object for f in task.universe.facts
                if f.relation == WORKS_FOR and f.subject == task.question.subject)


def test_every_check_passes_on_the_real_dataset(taskset, tasks):
    for t in tasks:
        checks = task_checks(t.universe, t.family, t.question, t.rows, t.prompt, t.files)
        assert [c for c in checks if not c.passed] == [], t.id
        kinds = {c.kind for c in checks}
        if t.family != "broken":
            assert {"ablation", "non_forcing", "chain_length", "shortcut", "workspace"} <= kinds
        if t.family == "distractor":
            assert "distractor" in kinds
        assert ENV.findings(t) == []
    dataset = ENV.dataset_findings(taskset, tasks)
    assert not [f for f in dataset if f.blocking]
    print("\n".join(f.detail for f in dataset))


def test_the_seeds_trap_passes_ablation_and_is_flagged_by_non_forcing(tasks):
    """Point every organisation at the same city: deleting either fact of a chain still
    leaves the resolver nothing to follow, yet the employer no longer selects the answer."""
    city = tasks[0].universe.cities[0]
    trapped = 0
    for t in tasks:
        if t.family not in ("twohop", "distractor", "threehop"):
            continue
        facts = [Fact(HQ, f.subject, city) if f.relation == HQ else f for f in t.universe.facts]
        facts += [Fact(HQ, o, city) for o in t.universe.organisations if not any(
            f.relation == HQ and f.subject == o for f in facts)]
        trap = _rebuilt(t, facts)
        assert resolve(trap.universe.facts, Question("employer_city", t.question.subject)).rows == (city,)
        assert ablation(list(trap.universe.facts), trap.question, trap.rows).passed
        check = non_forcing(trap.universe, list(trap.universe.facts), trap.question, trap.rows)
        assert not check.passed and "leads elsewhere" in check.detail
        findings = ENV.findings(trap)
        assert [f.kind for f in findings if f.kind in ("ablation", "non_forcing")] == ["non_forcing"]
        assert all(f.blocking for f in findings)
        trapped += 1
    assert trapped == 22


def test_a_redundant_route_fails_ablation(tasks):
    """A second employer in the same city: removing the chain's employer fact leaves the
    answer derivable, so that fact is not load-bearing."""
    hq = {f.subject: f.object for f in tasks[0].universe.facts if f.relation == HQ}
    twins = {o: [p for p, c in sorted(hq.items()) if c == hq[o] and p != o] for o in hq}
    t, twin = next((t, twins[e][0]) for t in tasks if t.family == "twohop"
                   for e in [_employer(t)] if twins.get(e))
    facts = [*t.universe.facts, Fact(WORKS_FOR, t.question.subject, twin)]
    assert resolve(facts, t.question).rows == t.rows
    check = ablation(facts, t.question, t.rows)
    assert not check.passed and "stays derivable" in check.detail


def test_a_home_city_equal_to_the_answer_fails_the_shortcut_check(tasks):
    t = next(t for t in tasks if t.family == "twohop")
    facts = [Fact(LIVES_IN, f.subject, t.rows[0]) if (f.relation, f.subject) == (LIVES_IN, t.question.subject)
             else f for f in t.universe.facts]
    bad = _rebuilt(t, facts)
    assert [f.kind for f in ENV.findings(bad)] == ["shortcut"]


def test_a_distractor_whose_former_employer_agrees_is_flagged(tasks):
    t = next(t for t in tasks if t.family == "distractor")
    employer = _employer(t)
    facts = [Fact(f.relation, f.subject, employer) if f.relation == "formerly_worked_for"
             and f.subject == t.question.subject else f for f in t.universe.facts]
    assert [f.kind for f in ENV.findings(_rebuilt(t, facts))] == ["distractor"]


def test_a_broken_question_that_every_employer_leaves_unknown_is_flagged(tasks):
    t = next(t for t in tasks if t.family == "broken" and t.question.kind == "employer_city")
    facts = [f for f in t.universe.facts if f.relation != HQ]
    assert resolve(facts, t.question).rows == (UNKNOWN,)
    kinds = [f.kind for f in ENV.findings(_rebuilt(t, facts))]
    assert kinds == ["decline"]


def test_a_wrong_workspace_file_or_a_leaky_prompt_is_flagged(tasks):
    t = next(t for t in tasks if t.family == "threehop")
    cut = dataclasses.replace(t, files={FACTS_FILE: t.files[FACTS_FILE][:-200]})
    assert "workspace" in [f.kind for f in ENV.findings(cut)]
    leaky = dataclasses.replace(t, prompt=f"{t.prompt} (Hint: {t.rows[0]}.)")
    assert [f.kind for f in ENV.findings(leaky)] == ["gold_in_prompt"]
    wrong_length = dataclasses.replace(t, family="twohop")
    assert [f.kind for f in ENV.findings(wrong_length)] == ["chain_length"]


def test_modal_share_is_computed_and_guarded(tasks):
    top, count, total = modal_share(t.rows for t in tasks)
    print(f"\nmodal answer {top} covers {count} of {total} ({count / total:.3f})")
    assert total == 36 and 2 * count < total
    city_top, city_count, city_total = modal_share(t.rows for t in tasks
                                                   if t.question.kind == "employer_city"
                                                   and t.family != "broken")
    print(f"modal city {city_top} covers {city_count} of {city_total} ({city_count / city_total:.3f})")
    assert city_total == 16 and 2 * city_count < city_total
    # The same guard fails a dataset whose answers pile onto one city.
    city = tasks[0].universe.cities[0]
    piled = [(t.family, t.question, (city,) if t.question.kind == "employer_city" and t.family != "broken"
              else t.rows) for t in tasks]
    failed = {c.kind for c in dataset_checks(piled, [t.meta for t in tasks]) if not c.passed}
    assert failed == {"modal_city"}, (
        "16 of 36 answers on one city: under half overall, all of the city answers"
    )
    piled = [(t.family, t.question, (city,) if t.family != "aggregate" else t.rows) for t in tasks]
    failed = {c.kind for c in dataset_checks(piled, [t.meta for t in tasks]) if not c.passed}
    assert failed == {"modal_answer", "modal_city"}


def test_dataset_checks_catch_a_telling_meta_or_a_giveaway_wording(tasks):
    metas = [{**t.meta, "category": t.family} for t in tasks]
    items = [(t.family, t.question, t.rows) for t in tasks]
    assert {c.kind for c in dataset_checks(items, metas) if not c.passed} == {"meta_constant"}
    no_twins = [(c, q, g) for c, q, g in items if c == "broken" or q.kind != "employer_country"]
    assert {c.kind for c in dataset_checks(no_twins, [t.meta for t in tasks])
            if not c.passed} == {"decline_hidden"}


def test_control_passes_declared_expected_are_exactly_the_legitimate_ones(tasks):
    modal = tasks[0].universe.modal_hq_city()
    for t in tasks:
        assert (ENV.not_applicable(SPECS["always-unknown"], t) is not None) == (t.family == "broken")
        assert (ENV.not_applicable(SPECS["plausible-entity"], t) is not None) == (t.family != "broken")
        assert (ENV.not_applicable(SPECS["modal-city"], t) is not None) == (t.rows == (modal,))
        for name in ("empty", "one-hop", "wrong-case", "source-peek"):
            assert ENV.not_applicable(SPECS[name], t) is None


def test_a_control_is_frozen_out_by_its_answer_not_its_name(tasks):
    """The same control, the same question: frozen out when the task's answer is what it would
    reply, played when it is not — whatever the category or the control's name suggests."""
    modal = tasks[0].universe.modal_hq_city()
    named = next(t for t in tasks if t.family == "twohop" and t.rows != (modal,))
    broken = next(t for t in tasks if t.family == "broken")

    def frozen_out(name, task, rows):
        return ENV.not_applicable(SPECS[name], dataclasses.replace(task, rows=rows)) is not None

    assert frozen_out("always-unknown", named, (UNKNOWN,))  # a whole chain, yet its answer is `unknown`
    assert not frozen_out("always-unknown", broken, named.rows)  # a broken task whose answer is a name
    assert frozen_out("modal-city", named, (modal,)) and not frozen_out("modal-city", named, named.rows)
    assert not frozen_out("modal-city", named, (modal.lower(),))  # compared exactly, like the scorer
    # plausible-entity follows the chain: frozen out where its answer is the gold, played where it is not
    assert frozen_out("plausible-entity", named, named.rows)
    assert not frozen_out("plausible-entity", named, (UNKNOWN,))
    assert not frozen_out("plausible-entity", broken, broken.rows)
    for name in ("empty", "one-hop", "wrong-case", "source-peek"):  # no prediction: never frozen out
        assert not frozen_out(name, named, named.rows) and not frozen_out(name, broken, (UNKNOWN,))
