"""Selection strategies pick exactly the expected solutions from crafted pools."""

from __future__ import annotations

import pytest

from prmloop.producers.candidates import (
    SELECTION_STRATEGIES,
    Candidate,
    bag_of_words,
    cosine_similarity,
    get_strategy,
    mean_pairwise_similarity,
)


def pool() -> list[Candidate]:
    """Correct: 0 (u=1), 2 (u=5), 4 (u=3); incorrect: 1 (u=2), 3 (u=9), 5 (u=4), 6 (u=7);
    7 has no answer (u=100), 8 could not be graded (u=50)."""
    spec = [
        (True, 1.0),
        (False, 2.0),
        (True, 5.0),
        (False, 9.0),
        (True, 3.0),
        (False, 4.0),
        (False, 7.0),
    ]
    out = [Candidate(i, f"solution {i}", "42", correct, u) for i, (correct, u) in enumerate(spec)]
    out.append(Candidate(7, "no answer here", None, None, 100.0))
    out.append(Candidate(8, "the answer is x^", "x^", None, 50.0))
    return out


def test_uncertainty_keeps_the_most_uncertain_correct_and_incorrect() -> None:
    chosen = get_strategy("uncertainty").select(pool(), m=2, n=3)
    assert chosen.correct == (2, 4)
    assert chosen.incorrect == (3, 6, 5)
    assert chosen.selected == (2, 4, 3, 6, 5)


def test_unanswered_and_ungraded_solutions_are_dropped_and_counted() -> None:
    for strategy in SELECTION_STRATEGIES.values():
        chosen = strategy.select(pool(), m=10, n=10, seed=0)
        assert chosen.dropped == (7, 8)
        assert sorted(chosen.selected) == [0, 1, 2, 3, 4, 5, 6]


def test_small_groups_give_what_they_have() -> None:
    chosen = get_strategy("uncertainty").select(pool()[:2], m=2, n=6)
    assert chosen.correct == (0,) and chosen.incorrect == (1,)


def test_ties_break_by_pool_position() -> None:
    tied = [Candidate(i, "t", "1", True, 1.0) for i in range(4)]
    assert get_strategy("uncertainty").select(tied, m=2, n=0).correct == (0, 1)


def test_cosine_of_bag_of_words() -> None:
    a, b = bag_of_words("2 + 2 = 4"), bag_of_words("Two plus two")
    assert cosine_similarity(a, a) == pytest.approx(1.0)
    assert cosine_similarity(a, b) == 0.0
    # "a a b" . "a b" = 2*1 + 1*1 = 3; |(2,1)| |(1,1)| = sqrt(5) sqrt(2)
    assert cosine_similarity(bag_of_words("a a b"), bag_of_words("a b")) == pytest.approx(3 / (5**0.5 * 2**0.5))


def test_epicprm_keeps_the_least_similar_solutions_of_each_group() -> None:
    texts = {
        0: "add 3 and 4 to get 7",
        1: "add 3 and 4 to get 7 so 7",
        2: "multiply the width by the height",  # the odd one out among the correct
        3: "half of 10 is 5",
        4: "half of 10 is 5 then 5",
        5: "subtract 9 from 20 giving 11",  # the odd one out among the incorrect
    }
    correct = {0, 1, 2}
    candidates = [Candidate(i, t, "7", i in correct, 0.0) for i, t in texts.items()]
    chosen = get_strategy("epicprm").select(candidates, m=1, n=1)
    assert chosen.correct == (2,)
    assert chosen.incorrect == (5,)
    scores = mean_pairwise_similarity([texts[0], texts[1], texts[2]])
    assert scores[2] == min(scores)


def test_random_is_reproducible_by_seed_and_respects_groups() -> None:
    strategy = get_strategy("random")
    first = strategy.select(pool(), m=2, n=2, seed=7)
    assert first == strategy.select(pool(), m=2, n=2, seed=7)
    assert set(first.correct) <= {0, 2, 4} and len(first.correct) == 2
    assert set(first.incorrect) <= {1, 3, 5, 6} and len(first.incorrect) == 2


def test_unknown_strategy_and_negative_sizes_are_reported() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        get_strategy("best")
    with pytest.raises(ValueError, match="m=-1"):
        get_strategy("uncertainty").select(pool(), m=-1, n=1)
