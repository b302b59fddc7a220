"""Specification of the arithmetic curriculum and its exact step checker (prmloop.models.arith)."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prmloop.models.answers import extract_answer
from prmloop.models.arith import (
    LEVELS,
    ArithChain,
    ChainStep,
    check_steps,
    find_equations,
    generate_question,
    generate_questions,
    level_spec,
    parse_number,
    reference_solution,
)
from prmloop.models.grading import grade

# "Tom has 3 apples. He buys 4 more apples. Then he buys 2 bags with 5 apples in each bag."
# Reference chain: 3 + 4 = 7, 2 * 5 = 10, 7 + 10 = 17.
TOM = ArithChain(
    numbers=(3, 4, 2, 5),
    steps=(ChainStep("+", 3, 4, 7), ChainStep("*", 2, 5, 10), ChainStep("+", 7, 10, 17)),
)


# --------------------------------------------------------------------------------------------------
# Generator
# --------------------------------------------------------------------------------------------------


def test_level_one_is_a_single_small_addition() -> None:
    for index in range(50):
        question = generate_question(1, seed=0, index=index)
        [step] = question.chain.steps
        assert step.op == "+"
        assert 1 <= step.left <= 5 and 1 <= step.right <= 5
        assert question.answer == step.left + step.right
        assert question.problem.endswith("have now?")
        assert f"{step.left} " in question.problem and f"{step.right} more" in question.problem


def test_the_same_level_seed_and_index_give_the_same_question_and_other_seeds_differ() -> None:
    first = generate_questions(20, level=3, seed=7)
    assert first == generate_questions(20, level=3, seed=7)
    assert generate_questions(5, level=3, seed=7) == first[:5]
    assert [q.problem for q in generate_questions(20, level=3, seed=8)] != [q.problem for q in first]


def test_levels_get_longer() -> None:
    mean_steps = [sum(len(generate_question(level, 0, i).chain.steps) for i in range(40)) / 40 for level in LEVELS]
    assert mean_steps == sorted(mean_steps)
    assert mean_steps[0] == 1 and mean_steps[-1] >= 3


def test_level_names_are_accepted_in_several_spellings() -> None:
    assert level_spec("L3") is level_spec("3") is level_spec(3) is LEVELS[3]
    with pytest.raises(ValueError, match="unknown arithmetic level"):
        level_spec(9)


def test_distractor_numbers_are_in_the_question_but_not_in_the_chain() -> None:
    question = generate_question(5, seed=0, index=0)
    [distractor] = question.chain.distractors
    used = {n for s in question.chain.steps for n in (s.left, s.right)}
    assert distractor not in used
    assert str(distractor) in question.problem
    assert [int(n) for n in re.findall(r"\d+", question.problem)] == list(question.chain.numbers)


def test_a_false_chain_step_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="is false"):
        ChainStep("*", 3, 4, 13)


def test_chain_json_round_trips_and_checks_its_answer() -> None:
    data = TOM.to_json()
    assert data["answer"] == 17
    assert ArithChain.from_json(data) == TOM
    with pytest.raises(ValueError, match="differs"):
        ArithChain.from_json({**data, "answer": 18})


@settings(max_examples=200, deadline=None)
@given(level=st.sampled_from(sorted(LEVELS)), seed=st.integers(0, 10_000), index=st.integers(0, 1_000))
def test_any_question_has_a_positive_integer_chain_that_recomputes_to_its_answer(
    level: int, seed: int, index: int
) -> None:
    question = generate_question(level, seed, index)
    assert question.chain.answer == question.answer
    for step in question.chain.steps:
        assert step.result > 0 and isinstance(step.result, int)
        assert {"+": step.left + step.right, "-": step.left - step.right, "*": step.left * step.right}.get(
            step.op, step.left // step.right
        ) == step.result
        if step.op == "/":
            assert step.left % step.right == 0
    # Every operand is a number of the question or an earlier result.
    available = set(question.chain.numbers)
    for step in question.chain.steps:
        assert {step.left, step.right} <= available
        available.add(step.result)


@settings(max_examples=200, deadline=None)
@given(level=st.sampled_from(sorted(LEVELS)), seed=st.integers(0, 10_000), index=st.integers(0, 1_000))
def test_the_reference_solution_of_any_question_checks_as_all_correct(level: int, seed: int, index: int) -> None:
    question = generate_question(level, seed, index)
    check = check_steps(question.chain, reference_solution(question))
    assert check.status == "exact", check.reason
    assert check.first_error_step is None
    assert set(check.verdicts) == {"verified"}


@settings(max_examples=200, deadline=None)
@given(
    level=st.sampled_from(sorted(LEVELS)),
    seed=st.integers(0, 10_000),
    data=st.data(),
)
def test_changing_one_result_in_the_reference_solution_is_found_at_that_step(
    level: int, seed: int, data: st.DataObject
) -> None:
    question = generate_question(level, seed, 0)
    steps = reference_solution(question)
    target = data.draw(st.integers(0, len(question.chain.steps) - 1), label="step")
    delta = data.draw(st.integers(-5, 5).filter(bool), label="delta")
    result = question.chain.steps[target].result
    # Replace the result after the last "=" of that step only.
    head, _, tail = steps[target].rpartition(f"= {result}")
    steps[target] = f"{head}= {result + delta}{tail}"
    check = check_steps(question.chain, steps)
    assert check.status == "exact"
    assert check.first_error_step == target
    assert "false equation" in check.reason


@settings(max_examples=100, deadline=None)
@given(level=st.sampled_from(sorted(LEVELS)), seed=st.integers(0, 10_000), delta=st.integers(1, 9))
def test_a_wrong_final_answer_after_a_correct_chain_is_the_first_error(level: int, seed: int, delta: int) -> None:
    question = generate_question(level, seed, 0)
    steps = [*reference_solution(question)[:-1], f"The final answer is: {question.answer + delta}"]
    check = check_steps(question.chain, steps)
    assert (check.status, check.first_error_step) == ("exact", len(steps) - 1)


# --------------------------------------------------------------------------------------------------
# Reading equations
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Step 2: 3 + 4 = 7", "3 + 4 = 7"),
        ("He has 3*4=12 apples", "3 * 4 = 12"),
        ("3 x 4 = 12", "3 * 4 = 12"),
        ("3×4 = 12", "3 * 4 = 12"),
        ("12 ÷ 4 = 3", "12 / 4 = 3"),
        (r"$3 \times 4 = \$12$", "3 * 4 = 12"),
        (r"\(2 \cdot 5 = 10\)", "2 * 5 = 10"),
        ("$1,000 + $5.0 = $1,005", "1000 + 5 = 1005"),
        ("3 apples + 4 apples = 7 apples.", "3 + 4 = 7"),
        ("Total = 3 + 4 = 7.", "3 + 4 = 7"),
        ("(3 + 4) * 2 = 14", "( 3 + 4 ) * 2 = 14"),
        ("2(5) = 10", "2 ( 5 ) = 10"),
    ],
)
def test_equations_are_read_from_free_text(text: str, expected: str) -> None:
    [equation] = find_equations(text)
    assert equation.text == expected
    assert equation.holds


@pytest.mark.parametrize(
    "text", ["He buys 4 more = 7 apples", "Step 3: he has 7 apples.", "x = 3 + 4", "3 + 4", "2x + 3 = 7", "nx = 3x - 1"]
)
def test_text_without_a_computing_equation_has_none(text: str) -> None:
    assert find_equations(text) == []


def test_numbers_are_exact_and_a_false_equation_does_not_hold() -> None:
    assert parse_number("1,000") == 1000
    assert parse_number("5.0") == 5
    assert parse_number("2.5") == Fraction(5, 2)
    [equation] = find_equations("So 3 * 4 = 13 apples")
    assert not equation.holds
    [chained] = find_equations("3 + 4 = 7 = 8")
    assert not chained.holds


# --------------------------------------------------------------------------------------------------
# The checker on hand-written solutions of TOM (3 + 4 = 7, 2 * 5 = 10, 7 + 10 = 17)
# --------------------------------------------------------------------------------------------------


def test_a_correct_chain_in_free_wording_is_all_verified() -> None:
    steps = [
        "Tom has 3 apples and buys 4 more, so he has 3 + 4 = 7 apples.",
        "The 2 bags hold 2 x 5 = 10 apples.",
        "In total he has 7 + 10 = 17 apples.",
        "The final answer is: 17",
    ]
    check = check_steps(TOM, steps)
    assert (check.status, check.first_error_step) == ("exact", None)
    assert check.verdicts == ("verified",) * 4
    assert check.equations == 3


def test_the_answer_may_be_boxed_or_share_a_step_with_the_last_equation() -> None:
    steps = ["Step 1: 3 + 4 = 7", "Step 2: 2 * 5 = 10", r"Step 3: 7 + 10 = 17, so the answer is $\boxed{17}$."]
    assert check_steps(TOM.to_json(), steps).first_error_step is None
    assert check_steps(TOM.to_json(), steps).status == "exact"


def test_a_wrong_product_at_step_two_is_the_first_error() -> None:
    steps = [
        "Step 1: 3 + 4 = 7",
        "Step 2: The bags hold 2 * 5 = 12 apples.",
        "Step 3: 7 + 12 = 19",
        "Step 4: The final answer is: 19",
    ]
    check = check_steps(TOM, steps)
    assert (check.status, check.first_error_step) == ("exact", 1)
    assert "false equation 2 * 5 = 12" in check.reason


def test_an_invented_number_at_step_one_is_the_first_error() -> None:
    steps = ["Tom has 6 apples, and 6 + 4 = 10.", "10 + 10 = 20", "The final answer is: 20"]
    check = check_steps(TOM, steps)
    assert (check.status, check.first_error_step) == ("exact", 0)
    assert "uses 6" in check.reason


def test_an_invented_number_stated_in_words_is_an_error() -> None:
    # 11 is in no equation, and no single operation on two of 3, 4, 2, 5 gives it.
    check = check_steps(TOM, ["He has 11 apples now.", "The final answer is: 11"])
    assert (check.status, check.first_error_step) == ("exact", 0)
    assert "states 11" in check.reason


def test_a_final_answer_that_differs_from_the_last_result_is_wrong_at_that_step() -> None:
    steps = ["3 + 4 = 7", "2 * 5 = 10", "7 + 10 = 17", "The final answer is: 71"]
    check = check_steps(TOM, steps)
    assert (check.status, check.first_error_step) == ("exact", 3)
    assert "final answer 71" in check.reason


def test_stopping_at_an_intermediate_result_is_wrong_at_the_answer() -> None:
    check = check_steps(TOM, ["3 + 4 = 7", "The final answer is: 7"])
    assert (check.status, check.first_error_step) == ("exact", 1)


def test_no_equation_at_all_is_unknown() -> None:
    steps = ["Tom likes apples.", "He buys some more apples, so he has more than before."]
    check = check_steps(TOM, steps)
    assert (check.status, check.first_error_step) == ("unknown", None)
    assert "no equation" in check.reason
    assert check_steps(TOM, []).status == "unknown"


def test_a_true_step_off_the_reference_chain_makes_a_later_error_unlocatable() -> None:
    # 4 + 2 = 6 is true arithmetic on question numbers, but the wrong quantity (a logic slip or not:
    # arithmetic cannot tell). The false equation after it is found, but not claimed as the first error.
    steps = ["4 + 2 = 6", "6 * 5 = 31", "The final answer is: 31"]
    check = check_steps(TOM, steps)
    assert (check.status, check.first_error_step) == ("unknown", None)
    assert check.wrong_step == 1
    assert check.verdicts == ("unverified", "wrong")


def test_a_right_answer_after_an_off_chain_step_is_unknown_not_all_correct() -> None:
    steps = ["2 * 5 = 10", "4 + 10 = 14", "3 + 14 = 17", "The final answer is: 17"]
    # 14 is not on the chain (a regrouping that happens to work); the checker does not vouch for it.
    check = check_steps(TOM, steps)
    assert (check.status, check.first_error_step) == ("unknown", None)
    assert check.verdicts == ("verified", "unverified", "unverified", "verified")


def test_using_a_result_before_it_is_derived_is_an_invented_number() -> None:
    check = check_steps(TOM, ["4 + 10 = 14", "2 * 5 = 10", "3 + 14 = 17", "The final answer is: 17"])
    assert (check.status, check.first_error_step) == ("exact", 0)
    assert "uses 10" in check.reason


def test_step_labels_and_ordinals_are_not_operands() -> None:
    steps = ["Step 3: the 2nd purchase: 3 + 4 = 7", "Step 4: 2 * 5 = 10", "Step 5: 7 + 10 = 17", "The answer is 17"]
    assert check_steps(TOM, steps).first_error_step is None
    assert check_steps(TOM, steps).status == "exact"


# --------------------------------------------------------------------------------------------------
# Answer formats (prmloop.models.grading on arith answers)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "solution",
    [
        "Step 1: 3 + 4 = 7\nStep 2: The answer is 7",
        "Step 1: 3 + 4 = 7\nStep 2: The final answer is: 7",
        "3 + 4 = 7, so he has $\\boxed{7}$ apples.",
        "So the answer is \\boxed{7}.",
    ],
)
def test_extract_answer_reads_both_the_answer_sentence_and_a_box(solution: str) -> None:
    assert extract_answer(solution) == "7"
    assert grade(solution, "7").is_correct


def test_every_arith_gold_answer_grades_its_own_reference_solution_correct() -> None:
    for level in LEVELS:
        question = generate_question(level, seed=3, index=1)
        text = "\n".join(f"Step {i + 1}: {s}" for i, s in enumerate(reference_solution(question)))
        assert extract_answer(text) == str(question.answer)
        assert grade(text, str(question.answer)).is_correct
        boxed = f"So the answer is \\boxed{{{question.answer}}}."
        assert grade(boxed, str(question.answer)).is_correct
        assert not grade(f"The answer is {question.answer + 1}", str(question.answer)).is_correct


def test_a_number_word_off_the_chain_makes_the_step_unverified() -> None:
    # "eight apples" is wrong (Tom has 3), but words are not read as claims; the later error is not exact.
    steps = ["Tom has eight apples.", "He buys 4 more, so 8 + 4 = 12.", "The final answer is: 12"]
    check = check_steps(TOM, steps)
    assert (check.status, check.first_error_step, check.wrong_step) == ("unknown", None, 1)


def test_which_steps_without_equations_are_vouched_for_depends_on_strictness() -> None:
    # Step 0 is a false claim in words; step 1 restates the question. By default only equations vouch
    # for a step, so the false equation in step 2 is found but not claimed as the first error.
    steps = ["I cannot know how many apples he has.", "Tom has 3 apples.", "3 + 4 = 8", "The final answer is: 8"]
    strict = check_steps(TOM, steps)
    assert (strict.status, strict.first_error_step, strict.wrong_step) == ("unknown", None, 2)
    assert strict.verdicts == ("unverified", "unverified", "wrong")
    numbers = check_steps(TOM, steps[1:], strictness="numbers")
    assert (numbers.status, numbers.first_error_step) == ("exact", 1)
    assert check_steps(TOM, steps, strictness="numbers").status == "unknown"
    lenient = check_steps(TOM, steps, strictness="lenient")
    assert (lenient.status, lenient.first_error_step) == ("exact", 2)


def test_an_error_in_the_first_step_is_exact_at_any_strictness() -> None:
    for strictness in ("equations", "numbers", "lenient"):
        check = check_steps(TOM, ["Tom has 3 apples and buys 4, so 3 + 4 = 8."], strictness=strictness)
        assert (check.status, check.first_error_step) == ("exact", 0)


def test_one_operation_must_be_a_chain_step_at_hand() -> None:
    # 2 * 5 = 10 is at hand from the start; 7 + 10 = 17 only once 7 and 10 are.
    assert check_steps(TOM, ["2 * 5 = 10", "3 + 4 = 7", "7 + 10 = 17", "The answer is 17"]).status == "exact"
    # 5 + 2 = 7 is true and 7 is on the chain, but it is not the chain's 3 + 4: not vouched for.
    check = check_steps(TOM, ["5 + 2 = 7", "7 + 10 = 18"])
    assert (check.status, check.verdicts) == ("unknown", ("unverified", "wrong"))
    # A longer expression may reach a later value of the chain in one go.
    assert check_steps(TOM, ["3 + 4 + 2 * 5 = 17", "The final answer is: 17"]).status == "exact"


def test_a_result_stated_before_it_can_be_had_is_not_vouched_for() -> None:
    # 6 + 2 = 8, 8 - 3 = 5. Stating 5 first is not an invented number (2 + 3 gives it), but it is the
    # final result before its operand 8 exists: the step is unverified, so the error after it is not exact.
    chain = ArithChain(numbers=(6, 2, 3), steps=(ChainStep("+", 6, 2, 8), ChainStep("-", 8, 3, 5)))
    check = check_steps(chain, ["So he has 5 apples.", "6 + 2 = 9", "The final answer is: 6"])
    assert (check.status, check.wrong_step, check.verdicts) == ("unknown", 1, ("unverified", "wrong"))
    # Stating the next result of the chain is fine: 6 + 2 can be had from the question.
    steps = ["He has 8 apples now.", "8 - 3 = 5", "The final answer is: 5"]
    assert check_steps(chain, steps, strictness="numbers").status == "exact"
    assert check_steps(chain, steps).status == "unknown"  # by default a restatement vouches for nothing


def test_a_bare_constant_stated_as_a_quantity_is_not_vouched_for() -> None:
    check = check_steps(TOM, ["If he had 1 apple he would have 0 apples.", "3 + 4 = 8", "The final answer is: 8"])
    assert (check.status, check.wrong_step) == ("unknown", 1)


def test_an_expression_without_a_result_asserts_its_value() -> None:
    # "3 + 1" is not an equation, but it claims Tom has 4 apples: off the chain, so not vouched for.
    check = check_steps(TOM, ["He must have 3 + 1 apples.", "3 + 4 = 8", "The final answer is: 8"])
    assert (check.status, check.wrong_step, check.verdicts) == ("unknown", 1, ("unverified", "wrong"))
    on_chain = check_steps(TOM, ["He has 3 + 4 apples.", "2 * 5 = 11", "The final answer is: 18"], strictness="numbers")
    assert (on_chain.status, on_chain.first_error_step) == ("exact", 1)


def test_a_fraction_in_latex_is_a_division() -> None:
    [equation] = find_equations(r"$\frac{10}{2} \cdot 39 = 195$")
    assert equation.holds
    [false] = find_equations(r"$\dfrac{12}{4} = 4$")
    assert not false.holds


def test_an_unreadable_side_is_no_verdict_on_the_equation() -> None:
    # "10 2 * 39" is not an expression (two numbers side by side): neither true nor false, unverified.
    check = check_steps(TOM, ["So 3 4 * 2 = 7.", "3 + 4 = 8", "The final answer is: 8"])
    assert (check.status, check.wrong_step) == ("unknown", 1)


def test_a_square_of_a_number_the_question_states_twice_is_not_invented() -> None:
    chain = ArithChain(numbers=(4, 4, 18), steps=(ChainStep("*", 4, 4, 16), ChainStep("+", 16, 18, 34)))
    check = check_steps(
        chain, ["4 times 4 is 16 apples.", "16 + 18 = 35", "The final answer is: 35"], strictness="numbers"
    )
    assert (check.status, check.first_error_step) == ("exact", 1)
    # With a single 4 in the question, 4 * 4 is not one operation on known numbers, but it is the
    # next result of the chain here, so it is not called invented either.
    single = ArithChain(numbers=(4, 18), steps=(ChainStep("*", 4, 4, 16), ChainStep("+", 16, 18, 34)))
    assert check_steps(single, ["He has 16 now.", "16 + 18 = 35"], strictness="numbers").first_error_step == 1
    # 8 = 4 + 4 needs two 4s: invented when the question has one.
    assert check_steps(single, ["He has 8 now."]).first_error_step == 0


@pytest.mark.parametrize(
    "claim",
    [
        "The total number of apples Tom has is $3$.",
        "He gives some away, so he has 4 apples left.",
        "Tom has 3 apples now.",
    ],
)
def test_a_question_number_claimed_as_a_result_is_not_vouched_for(claim: str) -> None:
    check = check_steps(TOM, [claim, "3 + 4 = 8", "The final answer is: 8"])
    assert (check.status, check.wrong_step) == ("unknown", 1)


def test_a_result_claimed_as_a_result_is_fine() -> None:
    steps = ["3 + 4 = 7, so he now has 7 apples.", "2 * 5 = 10", "He has 17 apples in total.", "The answer is 17"]
    check = check_steps(TOM, steps, strictness="numbers")
    assert (check.status, check.first_error_step) == ("exact", None)
    restated = ["Tom has 3 apples and buys 4 more.", "3 + 4 = 8", "The final answer is: 8"]
    assert check_steps(TOM, restated, strictness="numbers").first_error_step == 1


def test_a_corrupted_reference_solution_has_its_first_error_where_the_result_was_changed() -> None:
    import random

    from prmloop.models.arith import check_steps, generate_question
    from prmloop.models.arith.corrupt import corrupted_solution

    rng = random.Random(0)
    made = 0
    for level in (1, 2, 3):
        for index in range(15):
            question = generate_question(level, 1000, index)
            result = corrupted_solution(question, rng)
            if result is None:
                continue
            steps, first_error = result
            made += 1
            assert steps[:first_error] == list(question.reference_steps[:first_error])
            assert steps[first_error] != question.reference_steps[first_error]
            check = check_steps(question.chain, steps)
            assert check.exact and check.first_error_step == first_error
    assert made >= 40  # nearly every question gives one
