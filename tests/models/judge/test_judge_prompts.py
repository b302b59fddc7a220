"""Parsing judgments: valid JSON or nothing (never guessed), and the ProcessBench critic's answer."""

from __future__ import annotations

import pytest

from prmloop.models.judge.prompts import JSON_PREFIX, critic_messages, parse_critic, parse_judgment, step_messages


def test_a_valid_judgment_gives_the_decision_and_where_its_word_starts() -> None:
    completion = 'The product 3*4 is 12, not 13.", "has_error": "yes"} trailing chatter'
    parsed = parse_judgment(completion)
    assert parsed is not None and parsed.has_error is True and parsed.options == ("yes", "no")
    assert parsed.reasoning == "The product 3*4 is 12, not 13."
    assert completion[parsed.decision_at :].startswith("yes")


@pytest.mark.parametrize("value", ['"No"', '"no"', "false"])
def test_no_and_false_mean_no_error(value: str) -> None:
    parsed = parse_judgment(f'fine", "has_error": {value}}}')
    assert parsed is not None and parsed.has_error is False


@pytest.mark.parametrize(
    "completion",
    [
        'fine", "has_error": "maybe"}',  # not a decision
        'fine", "has_error": yes}',  # not JSON
        "I think the step is wrong.",  # no object
        'fine"}',  # no has_error
        'fine", "has_error": "yes"',  # unterminated
    ],
)
def test_anything_else_is_unparsed(completion: str) -> None:
    assert parse_judgment(completion) is None


def test_the_step_prompt_names_the_preceding_steps_and_the_next_one() -> None:
    [message] = step_messages("What is 3*4+1?", ["3*4 = 12.", "12 + 1 = 14."], 1)
    text = message["content"]
    assert "Preceding Steps: 3*4 = 12." in text and "Next Proposed Step to be Evaluated: 12 + 1 = 14." in text
    assert '"has_error"' in text and JSON_PREFIX.startswith("{")
    first = step_messages("q", ["a"], 0)[0]["content"]
    assert "first step" in first
    with pytest.raises(IndexError):
        step_messages("q", ["a"], 1)


def test_the_critic_names_the_last_analysed_paragraph_of_an_incorrect_solution() -> None:
    answer = (
        "<analysis_1>ok</analysis_1>\n<analysis_2>wrong: 3*4 is 12</analysis_2>\n<conclusion>\nIncorrect\n</conclusion>"
    )
    assert parse_critic(answer, 4) == 1
    assert parse_critic("<analysis_1>ok</analysis_1><conclusion>Correct</conclusion>", 4) is None
    assert parse_critic("<analysis_9>?</analysis_9><conclusion>Incorrect</conclusion>", 4) == "unparsed"
    assert parse_critic("no verdict at all", 4) == "unparsed"
    [message] = critic_messages("q", ["a", "b"])
    assert "<paragraph_2>\nb\n</paragraph_2>" in message["content"]
