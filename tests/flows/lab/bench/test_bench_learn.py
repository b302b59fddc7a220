"""``bench learn``'s reading of a loop's store: which solutions the loop labelled, what the checker says
of them, and where the labels fell (a real DuckDB store of hand-made events)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.bench.learn import (
    across_runs,
    bench_learn,
    budgets_for,
    labelling_cost,
    random_draws,
    random_order_tokens,
    random_summary,
    tokens_to_match,
)
from prmloop.flows.lab.bench.learn_store import LearnRow, label_spread, read_loop_store
from prmloop.models.arith import generate_question
from prmloop.models.arith.corrupt import corrupted_solution
from prmloop.producers.arith import arith_question
from prmloop.producers.events import solution_sampled
from prmloop.store.events import LabelsAccepted, LabelsRejected, ModelRef, StepsLabeled, make_event
from prmloop.store.events.payloads import CostLedger
from prmloop.store.kafka.records import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore

GENERATOR = ModelRef(backend="transformers", name="SmolLM2-135M-Instruct")


def _store(tmp_path: Path) -> Path:
    """Two level-1 and one level-2 question; per question a right and a corrupted solution. The loop
    accepts the right one of q0 (no error), the wrong one of q0 with the wrong first error (off by one),
    the wrong one of q1 right, rejects the right one of q1, and never decides question 3's."""
    rng = random.Random(3)
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    events = []
    truth: dict[str, int] = {}
    plan: list[tuple[int, int, str]] = [(1, 0, "right"), (1, 0, "wrong"), (1, 1, "right"), (1, 1, "wrong")]
    plan += [(2, 0, "right"), (2, 0, "wrong")]
    for n, (level, index, tag) in enumerate(plan):
        generated = generate_question(level, 77, index)
        question = arith_question(generated)
        if tag == "right":
            steps, first, correct = list(generated.reference_steps), -1, True
        else:
            wrong = corrupted_solution(generated, rng)
            assert wrong is not None
            steps, first, correct = list(wrong[0]), wrong[1], False
        sid = f"{question.id}/{tag}"
        truth[sid] = first
        events.append(
            solution_sampled(
                question,
                solution_id=sid,
                generator=GENERATOR,
                prompt_format="step_k_arith",
                text="\n".join(steps),
                steps=steps,
                correct=correct,
                final_answer=None,
                identity=(sid,),
                producer="test/0",
                completion_tokens=10,
            ).model_copy(update={"occurred_at": t0 + timedelta(seconds=n)})
        )
    # the annotator labelled q1's wrong solution with 40 tokens of rollouts, before any decision
    q1_wrong = f"{arith_question(generate_question(1, 77, 1)).id}/wrong"
    mc = StepsLabeled(
        solution_id=q1_wrong,
        question_id=q1_wrong.rsplit("/", 1)[0],
        method="adaptive_binary",
        labels=tuple(i < truth[q1_wrong] for i in range(truth[q1_wrong] + 1)),
        first_error_step=truth[q1_wrong],
        cost=CostLedger(rollouts=4, generated_tokens=40),
    )
    events.append(make_event(mc, producer="test/0", occurred_at=t0 + timedelta(seconds=50)))
    decisions = [
        (f"{arith_question(generate_question(1, 77, 0)).id}/right", "accept", None),
        (f"{arith_question(generate_question(1, 77, 0)).id}/wrong", "accept", "off"),
        (f"{arith_question(generate_question(1, 77, 1)).id}/wrong", "accept", "exact"),
        (f"{arith_question(generate_question(1, 77, 1)).id}/right", "reject", None),
    ]
    for n, (sid, what, how) in enumerate(decisions):
        qid = sid.rsplit("/", 1)[0]
        first = None if how is None else truth[sid] + (1 if how == "off" else 0)
        labels = (True,) * 3 if first is None else tuple(i < first for i in range(first + 1))
        kind = LabelsAccepted if what == "accept" else LabelsRejected
        extra = {} if what == "accept" else {"reason": "disagree"}
        payload = kind(
            solution_id=sid,
            question_id=qid,
            labels=labels,
            first_error_step=first,
            source_event_ids=(events[0].event_id,),
            rule="test",
            **extra,
        )
        events.append(make_event(payload, producer="test/0", occurred_at=t0 + timedelta(seconds=100 + n)))
    store = DuckEventStore(tmp_path / "loop.duckdb")
    store.write_batch(
        events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, len(events))]
    )
    return tmp_path / "loop.duckdb"


def test_the_store_gives_every_sampled_solution_with_its_loop_and_exact_labels(tmp_path: Path) -> None:
    rows = {
        r.solution_id.rsplit("/", 1)[1] + r.question_id.split("/")[1] + r.question_id[-1]: r
        for r in read_loop_store(_store(tmp_path))
    }
    assert len(rows) == 6
    right0, wrong0 = rows["rightL10"], rows["wrongL10"]
    assert right0.accepted_first_error == -1 and right0.exact_first_error == -1
    assert wrong0.exact_first_error is not None and wrong0.accepted_first_error == wrong0.exact_first_error + 1
    assert rows["wrongL11"].accepted_first_error == rows["wrongL11"].exact_first_error
    assert rows["rightL11"].rejected and rows["rightL11"].accepted_first_error is None
    assert rows["rightL20"].accepted_first_error is None and not rows["rightL20"].rejected
    # tokens: the loop had sampled all six solutions (10 tokens each) and spent 40 labelling one before
    # its first decision
    assert right0.tokens_by_then == 100
    assert all(r.own_tokens == 10 for r in rows.values())
    assert rows["wrongL11"].mc_labelled and rows["wrongL11"].label_tokens == 40
    assert not right0.mc_labelled and right0.label_tokens == 0


def _row(name: str, *, correct: bool | None, mc: bool, label_tokens: int = 0, own: int = 10) -> LearnRow:
    return LearnRow(
        solution_id=name, question_id=f"arith/L1/{name}", problem="p", steps=("s",), correct=correct,
        sampled_at=0.0, tokens_by_then=0, accepted_first_error=None, accepted_at=None, rejected=False,
        exact_first_error=None, own_tokens=own, label_tokens=label_tokens, mc_labelled=mc,
    )  # fmt: skip


def test_random_order_pays_for_every_solution_as_the_loop_paid_for_its_like() -> None:
    wrong_a = _row("a", correct=False, mc=True, label_tokens=100)
    wrong_b = _row("b", correct=False, mc=True, label_tokens=200)
    right_c = _row("c", correct=True, mc=True, label_tokens=0)
    wrong_d, right_e, unknown_f = (
        _row("d", correct=False, mc=False, own=30), _row("e", correct=True, mc=False), _row("f", correct=None, mc=False)
    )  # fmt: skip
    cost = labelling_cost([wrong_a, wrong_b, right_c, wrong_d, right_e, unknown_f])
    assert cost(wrong_a) == 100 and cost(right_c) == 0  # labelled: what it cost
    assert cost(wrong_d) == 150 and cost(right_e) == 0  # not labelled: the mean of its like (wrong: 100, 200)
    assert cost(unknown_f) == 100  # no labelled solution like it: the mean of all three labelled
    # two draws: (a, d) costs 10 + 100 + 30 + 150 = 290, (c, e) 10 + 0 + 10 + 0 = 20; their mean 155
    assert random_order_tokens([[wrong_a, wrong_d], [right_c, right_e]], cost) == 155
    assert labelling_cost([wrong_d])(wrong_d) == 0.0  # nothing labelled: no cost known, none counted


def test_tokens_to_match_finds_where_the_loop_reaches_random_orders_final_f1() -> None:
    arms = {
        "loop": [{"labels": 8, "tokens": 1000, "f1": 0.4}, {"labels": 15, "tokens": 2000, "f1": 0.62}],
        "random": [{"labels": 8, "tokens": 1500, "f1": 0.5}, {"labels": 15, "tokens": 5000, "f1": 0.6}],
    }
    match = tokens_to_match(arms)
    assert match["random_final_f1"] == 0.6 and match["random_tokens"] == 5000
    assert (match["loop_labels"], match["loop_tokens"], match["ratio"]) == (15, 2000, 0.4)
    arms["loop"][1]["f1"] = 0.59  # never reached within the budgets
    assert tokens_to_match(arms)["ratio"] is None and tokens_to_match(arms)["loop_labels"] is None


def test_the_spread_counts_levels_positions_and_agreement(tmp_path: Path) -> None:
    spread = label_spread(read_loop_store(_store(tmp_path)))
    assert spread["sampled"] == 6 and spread["accepted"] == 3 and spread["rejected"] == 1 and spread["unlabelled"] == 2
    assert spread["accepted_by_level"] == {"L1": 3} and spread["sampled_by_level"] == {"L1": 4, "L2": 2}
    assert spread["accepted_questions"] == 2 and spread["sampled_questions"] == 3
    assert spread["accepted_agree_with_exact"] == round(2 / 3, 4)  # the off-by-one label disagrees
    assert spread["accepted_first_error_position"]["none"] == 1
    assert spread["rejected_exact_with_error_share"] == 0.0  # the rejected one was right


def test_budgets_double_and_end_on_what_was_accepted() -> None:
    assert budgets_for(100) == [15, 30, 60, 100]
    assert budgets_for(15) == [15]
    assert budgets_for(7) == [7]
    assert budgets_for(0) == []


def test_the_random_arm_draws_anew_every_time() -> None:
    pool = list(range(40))
    draws = random_draws(pool, 15, 20)
    assert len(draws) == 20 and all(len(d) == 15 and len(set(d)) == 15 for d in draws)
    assert len({tuple(sorted(d)) for d in draws}) == 20  # twenty draws, not one drawn twenty times
    assert random_draws(pool, 15, 3) == draws[:3]  # more draws add to the first ones
    assert draws == random_draws(pool, 15, 20)  # the same on every run
    assert [sorted(d) for d in random_draws(pool, 60, 2)] == [pool, pool]  # fewer than asked: all of them


def test_the_random_arm_is_the_mean_of_its_draws_not_their_pooled_predictions() -> None:
    # Two erroneous solutions (first error at step 0, level L1) and two correct ones (L2). One draw's
    # model says "no error" everywhere (F1 0: no error found), the other flags step 0 everywhere (F1 0: no
    # correct solution passed). Pooled, each accuracy is 1/2 and the mixture's F1 is 1/2: above both.
    truth, levels = [0, 0, -1, -1], ["L1", "L1", "L2", "L2"]
    lenient, strict = [-1, -1, -1, -1], [0, 0, 0, 0]
    summary = random_summary([lenient, strict], truth, levels)
    assert summary["f1"] == 0.0 and summary["pooled_f1"] == 0.5
    assert summary["draw_f1"]["n"] == 2 and summary["lo"] == 0.0 and summary["hi"] == 0.0
    assert summary["by_level"] == {"L1": None, "L2": None}  # each level holds one kind only: no F1
    # a draw that is right everywhere: F1 1, and the mean of (0, 0, 1) is a third
    summary = random_summary([lenient, strict, [0, 0, -1, -1]], truth, levels)
    assert summary["f1"] == round(1 / 3, 4) and summary["draw_f1"]["median"] == 0.0


def test_bench_learn_ranks_the_loop_among_random_draws_on_the_test_set(tmp_path: Path) -> None:
    """The whole bench on the hand-made store: the embedded backbone's features, the shipped test set."""
    lines: list[str] = []
    result = bench_learn(_store(tmp_path), seeds=1, draws=4, budgets=[3], say=lines.append)
    (loop,), (oracle,), (rand,) = result["arms"]["loop"], result["arms"]["oracle"], result["arms"]["random"]
    assert result["draws"] == 4 and result["test_solutions"] >= 1500
    spread = rand["draw_f1"]
    assert spread["n"] == 4 and spread["lo"] <= spread["median"] <= spread["hi"]
    assert rand["f1"] == spread["mean"] and (rand["lo"], rand["hi"]) == (spread["lo"], spread["hi"])
    for arm in (loop, oracle):
        assert arm["lo"] <= arm["f1"] <= arm["hi"]  # its own interval: over test questions
        expected = "above" if arm["f1"] > spread["hi"] else "below" if arm["f1"] < spread["lo"] else "within"
        assert arm["vs_random"] == expected and 0.0 <= arm["random_rank"] <= 100.0
        assert arm["random_rank"] >= 50.0 if arm["f1"] > spread["median"] else arm["random_rank"] <= 50.0
    assert "beats" in lines[-1] and "random draws' mean" in lines[-1]
    # random order's tokens: three solutions of 10 tokens each, each labelled as the loop paid for its like
    # (the one wrong solution the annotator labelled cost 40; no right one was labelled: the mean of all, 40)
    assert rand["tokens"] == 3 * (10 + 40)
    assert loop["tokens"] == oracle["tokens"] == 100  # six solutions and one labelling, by the third label
    assert result["tokens_to_match"]["random_tokens"] == rand["tokens"]


def _run(loop: list[tuple[float, float | None, str | None]], oracle: list[float], rand: list[float]) -> dict:
    """A bench learn result as :func:`bench_learn` shapes it: per budget, (F1, rank, verdict) of the loop."""
    return {
        "budgets": [8, 15][: len(loop)],
        "arms": {
            "loop": [
                {"f1": f, "random_rank": r, "vs_random": v, "tokens": 1000 * (i + 1)}
                for i, (f, r, v) in enumerate(loop)
            ],
            "oracle": [{"f1": f} for f in oracle],
            "random": [{"f1": f, "tokens": 500 * (i + 1)} for i, f in enumerate(rand)],
        },
    }


def test_across_runs_sets_each_loop_beside_its_own_random_draws() -> None:
    runs = [
        _run([(0.4, 30.0, "within"), (0.6, 95.0, "above")], [0.5, 0.6], [0.38, 0.50]),
        _run([(0.2, 0.0, "below"), (0.7, 80.0, "within")], [0.3, 0.7], [0.42, 0.54]),
        _run([(0.3, None, None), (0.5, 40.0, "within")], [0.4, 0.5], [0.40, 0.58]),  # no random F1 at 8
    ]
    at8, at15 = across_runs(runs)
    assert at8["labels"] == 8 and at8["runs"] == 3
    assert at8["loop_f1_mean"] == 0.3 and at8["oracle_f1_mean"] == 0.4 and at8["random_f1_mean"] == 0.4
    assert at8["loop_ranks"] == [30.0, 0.0] and at8["loop_rank_mean"] == 15.0  # the run without a rank left out
    assert at8["loop_vs_random"] == {"above": 0, "within": 1, "below": 1}
    assert (at8["loop_tokens_mean"], at8["random_tokens_mean"], at15["loop_tokens_mean"]) == (1000, 500, 2000)
    assert at15["loop_rank_mean"] == round((95 + 80 + 40) / 3, 4)
    assert at15["loop_vs_random"] == {"above": 1, "within": 2, "below": 0}


def test_a_budget_beyond_the_accepted_labels_is_refused_by_name(tmp_path: Path) -> None:
    db = _store(tmp_path)
    with pytest.raises(ValueError, match=r"budget 5 is not within the 3 labels it accepted; choose --budgets up to 3"):
        bench_learn(db, budgets=[2, 5])
