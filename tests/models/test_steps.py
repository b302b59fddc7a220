"""Specification of step splitting, token offsets and step/token alignment (prmloop.models.steps)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from prmloop.models.answers import extract_answer
from prmloop.models.backends.base import Completion
from prmloop.models.grading import grade
from prmloop.models.prompts import (
    EPICPRM_EXAMPLES,
    EPICPRM_RESPONSE_PREFIX,
    StepFormat,
    continuation_prompt,
    format_steps,
    render_chat,
    render_plain,
    solution_messages,
)
from prmloop.models.steps import align_steps, split_completion, split_steps, token_char_spans

EPIC_RESPONSE = (
    "Response: Let's think step by step.\n"
    "Step 1: 16 - 3 - 4 = 9 eggs are left.\n"
    "Step 2: She earns 9 * 2 = $18 😀.\n"
    "Step 3: The final answer is: 18"
)


def test_step_k_markers_start_steps_and_the_preamble_is_not_a_step() -> None:
    steps = split_steps(EPIC_RESPONSE)
    assert [s.text for s in steps] == [
        "16 - 3 - 4 = 9 eggs are left.",
        "She earns 9 * 2 = $18 😀.",
        "The final answer is: 18",
    ]
    assert EPIC_RESPONSE[steps[0].start :].startswith("Step 1:")
    assert [a.end for a in steps[:-1]] == [b.start for b in steps[1:]]
    assert steps[-1].end == len(EPIC_RESPONSE)


def test_blank_lines_separate_steps_and_trailing_separators_stay_with_their_step() -> None:
    text = "  First, 2 + 2 = 4.\n\nThen 4 * 3 = 12.\n \n\nSo the answer is $\\boxed{12}$.\n\n"
    steps = split_steps(text, "double_newline")
    assert [s.text for s in steps] == ["First, 2 + 2 = 4.", "Then 4 * 3 = 12.", "So the answer is $\\boxed{12}$."]
    assert steps[0].start == 2
    assert text[: steps[1].end] == "  First, 2 + 2 = 4.\n\nThen 4 * 3 = 12.\n \n\n"
    assert steps[-1].end == len(text)


def test_auto_detects_the_format() -> None:
    assert len(split_steps("Step 1: a\nStep 2: b")) == 2
    assert len(split_steps("a\n\nb\n\nc")) == 3
    assert split_steps("") == []


@pytest.mark.parametrize("style", ["step_k", "double_newline"])
def test_format_steps_and_split_steps_round_trip(style: StepFormat) -> None:
    steps = ["Let x = 2.", "Then 2x = 4, i.e. Step-free text.", "The answer is 4."]
    text = format_steps(steps, style)
    assert [s.text for s in split_steps(text, style)] == steps


@pytest.mark.parametrize("subset", ["gsm8k", "math"])
def test_processbench_solutions_split_back_into_their_steps(shared_data_dir: Path, subset: str) -> None:
    rows = json.loads((shared_data_dir / "processbench" / f"{subset}.json").read_text(encoding="utf-8"))
    for row in rows:
        text = "\n\n".join(row["steps"])
        assert [s.text for s in split_steps(text, "double_newline")] == [s.strip() for s in row["steps"]], row["id"]


def test_token_spans_tile_the_decoded_text_even_through_multibyte_characters(
    smollm2_tokenizer: PreTrainedTokenizerBase,
) -> None:
    ids = smollm2_tokenizer.encode(EPIC_RESPONSE, add_special_tokens=False)
    spans = token_char_spans(smollm2_tokenizer, ids)
    decoded = smollm2_tokenizer.decode(ids)
    assert decoded == EPIC_RESPONSE
    assert spans[0][0] == 0 and spans[-1][1] == len(decoded)
    assert all(a[1] == b[0] and a[0] <= a[1] for a, b in itertools.pairwise(spans))
    # The emoji is split over several byte-level tokens: only the last one carries the character.
    emoji = decoded.index("😀")
    assert [s for s in spans if s[0] <= emoji < s[1]] == [(emoji, emoji + 1)]


def test_steps_get_the_tokens_that_produced_them(smollm2_tokenizer: PreTrainedTokenizerBase) -> None:
    ids = smollm2_tokenizer.encode(EPIC_RESPONSE, add_special_tokens=False)
    logprobs = [-float(i) for i in range(len(ids))]
    token_steps = align_steps(
        EPIC_RESPONSE, split_steps(EPIC_RESPONSE), token_char_spans(smollm2_tokenizer, ids), logprobs
    )
    pieces = [smollm2_tokenizer.decode(ids[t.token_start : t.token_end]) for t in token_steps]
    assert pieces == [
        "Step 1: 16 - 3 - 4 = 9 eggs are left.\n",
        "Step 2: She earns 9 * 2 = $18 😀.\n",
        "Step 3: The final answer is: 18",
    ]
    assert token_steps[0].token_start > 0, "the preamble's tokens belong to no step"
    assert token_steps[-1].token_end == len(ids)
    assert token_steps[1].logprobs == tuple(logprobs[token_steps[1].token_start : token_steps[1].token_end])


def test_a_token_starting_with_a_space_goes_to_the_step_its_word_begins(
    smollm2_tokenizer: PreTrainedTokenizerBase,
) -> None:
    text = "Step 1: a = 1. Step 2: b = 2."
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    token_steps = align_steps(text, split_steps(text), token_char_spans(smollm2_tokenizer, ids), [0.0] * len(ids))
    assert [smollm2_tokenizer.decode(ids[t.token_start : t.token_end]) for t in token_steps] == [
        "Step 1: a = 1.",
        " Step 2: b = 2.",
    ]


def test_split_completion_uses_the_text_cut_at_the_stop_string(smollm2_tokenizer: PreTrainedTokenizerBase) -> None:
    full = "First, 2 + 2 = 4.\n\nSo the answer is 4.\n\nUser:"
    ids = tuple(smollm2_tokenizer.encode(full, add_special_tokens=False))
    completion = Completion(
        text=full[: full.index("User:")],
        token_ids=ids,
        logprobs=tuple(-0.5 for _ in ids),
        finish_reason="stop",
        prompt_tokens=3,
        stop_reason="User:",
    )
    token_steps = split_completion(smollm2_tokenizer, completion, "double_newline")
    assert [t.step.text for t in token_steps] == ["First, 2 + 2 = 4.", "So the answer is 4."]
    assert token_steps[-1].token_end == len(ids)
    assert token_steps[0].perplexity == pytest.approx(1.6487212707, rel=1e-9)  # exp(0.5)


def test_epicprm_prompt_is_the_two_shot_chat_of_appendix_a1(smollm2_tokenizer: PreTrainedTokenizerBase) -> None:
    messages = solution_messages("What is 1 + 1?", "step_k")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[-1]["content"] == "Instruction: What is 1 + 1?"
    example = messages[2]["content"]
    assert example.startswith(EPICPRM_RESPONSE_PREFIX)
    assert len(split_steps(example)) == len(EPICPRM_EXAMPLES[0].steps) + 1
    assert extract_answer(example) == "\\sqrt{119}"
    assert grade(messages[4]["content"], "100+75\\pi").is_correct
    prompt = render_chat(smollm2_tokenizer, messages)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_qwen_prompt_asks_for_a_boxed_answer() -> None:
    messages = solution_messages("What is 1 + 1?", "double_newline")
    assert "\\boxed{}" in messages[0]["content"]
    assert render_plain(messages).endswith("What is 1 + 1?\n\n")


def test_continuation_prompt_ends_where_the_next_step_begins() -> None:
    prompt = continuation_prompt("<prompt>", ["a = 1.", "b = 2."], "step_k")
    assert prompt == "<prompt>" + EPICPRM_RESPONSE_PREFIX + "Step 1: a = 1.\nStep 2: b = 2.\n"
    assert [s.text for s in split_steps(prompt.removeprefix("<prompt>"))] == ["a = 1.", "b = 2."]
    assert continuation_prompt("<p>", ["a"], "double_newline") == "<p>a\n\n"


def test_render_chat_refuses_a_tokenizer_without_a_template(smollm2_tokenizer: PreTrainedTokenizerBase) -> None:
    template = smollm2_tokenizer.chat_template
    smollm2_tokenizer.chat_template = None
    try:
        with pytest.raises(ValueError, match="render_plain"):
            render_chat(smollm2_tokenizer, solution_messages("x"))
    finally:
        smollm2_tokenizer.chat_template = template
