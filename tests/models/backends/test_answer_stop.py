"""Rollouts end once their answer is stated (issue: rollout economics): where an answer is complete,
the local engine's stopping criterion and cut, and the cut of a server's completion."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from prmloop.models.annotation.completer import GeneratorCompleter
from prmloop.models.answers import answer_end, extract_answer
from prmloop.models.backends.base import Completion, SamplingParams
from prmloop.models.backends.stopping import StopInCompletion, cut_at_answer
from prmloop.models.backends.transformers_backend import TransformersBackend
from prmloop.models.backends.transformers_decoding import read_completion


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("3 + 4 = 7, so \\boxed{7} and then more", "3 + 4 = 7, so \\boxed{7}"),
        ("x = \\boxed{\\frac{1}{2}} trailing", "x = \\boxed{\\frac{1}{2}}"),
        ("The answer is 3.5. Next question", "The answer is 3.5."),
        ("Step 3: The final answer is: 8\nQuestion:", "Step 3: The final answer is: 8"),
        ("the answer is 12.\n", "the answer is 12."),
    ],
)
def test_the_answer_is_complete_where_a_reader_would_stop(text: str, kept: str) -> None:
    end = answer_end(text)
    assert end is not None and text[:end] == kept
    assert extract_answer(text[:end]) == extract_answer(kept)


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 3.",  # may still become 3.5
        "The answer is 3",  # the line may go on
        "so \\boxed{7",  # the box is still open
        "Let us find the answer: first",  # not a statement of the answer
        "We compute 3 + 4 = 7.\n",
    ],
)
def test_an_answer_that_may_still_change_is_not_complete(text: str) -> None:
    assert answer_end(text) is None


@given(st.text(alphabet="The answer is 0123456789.\\boxed{} \nx", max_size=40), st.text(max_size=20))
def test_once_complete_an_answer_stays_complete_and_never_moves_later(prefix: str, more: str) -> None:
    end = answer_end(prefix)
    if end is not None:
        later = answer_end(prefix + more)
        assert later is not None and later <= end


def _ids(tokenizer: object, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


def test_the_local_engine_stops_a_row_once_it_states_its_answer(tiny_backend: TransformersBackend) -> None:
    tok = tiny_backend.tokenizer
    prompt = _ids(tok, "Question: 3 + 4?\n")
    answered = prompt + _ids(tok, "3 + 4 = 7. The answer is 7.\n")
    open_box = prompt + _ids(tok, "3 + 4 = 7 so \\boxed{7")
    width = max(len(answered), len(open_box))
    pad = tok.pad_token_id
    rows = torch.tensor([answered + [pad] * (width - len(answered)), open_box + [pad] * (width - len(open_box))])
    criterion = StopInCompletion(tok, (), len(prompt), at_answer=True)
    assert criterion(rows, torch.zeros(1)).tolist() == [True, False]
    without = StopInCompletion(tok, ("\n\n",), len(prompt))
    assert without(rows, torch.zeros(1)).tolist() == [False, False]


def test_the_local_engine_keeps_the_answer_and_drops_what_follows(tiny_backend: TransformersBackend) -> None:
    tokens = _ids(tiny_backend.tokenizer, "so 3 + 4 = 7 and \\boxed{7} because it is what we found")
    logprobs = [-0.5] * len(tokens)
    tok, eos = tiny_backend.tokenizer, frozenset({int(tiny_backend.tokenizer.eos_token_id)})
    cut = read_completion(tok, eos, tokens, logprobs, prompt_tokens=10, params=SamplingParams(stop_at_answer=True))
    full = read_completion(tok, eos, tokens, logprobs, prompt_tokens=10, params=SamplingParams())
    assert cut.text.endswith("\\boxed{7}") and cut.stop_reason == "answer" and cut.finish_reason == "stop"
    assert len(cut.token_ids) < len(full.token_ids) == len(tokens)
    assert cut.logprobs == tuple(logprobs[: len(cut.token_ids)])
    assert extract_answer(cut.text) == "7"


def test_a_servers_completion_is_cut_at_its_answer_keeping_the_tokens_before_it() -> None:
    pieces = ["The", " answer", " is", " 12", ".", " Then", " more"]
    offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    text = "".join(pieces)
    kept, ids, lps, cut = cut_at_answer(
        text, list(range(7)), [-1.0] * 7, lambda end: sum(1 for o in offsets if o < end)
    )
    assert cut and kept == "The answer is 12." and ids == [0, 1, 2, 3, 4] and lps == [-1.0] * 5
    assert cut_at_answer("no answer here", [1, 2], [-1.0, -1.0], lambda end: 1) == (
        "no answer here",
        [1, 2],
        [-1.0, -1.0],
        False,
    )


class _Recorder:
    model_name = "recorder"

    def __init__(self) -> None:
        self.params: list[SamplingParams] = []

    def rollouts(self, prefix: str, n: int, params: SamplingParams) -> list[Completion]:
        self.params.append(params)
        return [
            Completion(text="\\boxed{7}", token_ids=(1,), logprobs=(-0.1,), finish_reason="stop", prompt_tokens=3)
        ] * n

    def generate(self, prompts: object, params: SamplingParams | None = None) -> list[list[Completion]]:
        raise NotImplementedError

    def apply_chat_template(self, messages: object) -> str:
        return "chat:"


def test_rollouts_ask_the_engine_to_stop_at_the_answer_by_default() -> None:
    recorder = _Recorder()
    GeneratorCompleter(recorder).complete("q", ("a",), 2)  # type: ignore[arg-type]
    off = GeneratorCompleter(recorder, params=SamplingParams(stop_at_answer=False))  # type: ignore[arg-type]
    off.complete("q", ("a",), 1)
    assert [p.stop_at_answer for p in recorder.params] == [True, False]
