"""Sampling one question: selection by uncertainty, grades, events and their ids."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from prmloop.models.backends.base import Completion, SamplingParams
from prmloop.models.questions import Question
from prmloop.producers.sampler import SampleSettings, sample_question, solution_uncertainty
from prmloop.store.events import ModelRef, SolutionSampled


class ScriptedGenerator:
    """Returns fixed texts with fixed log-probabilities (no tokenizer: no token offsets)."""

    model_name = "scripted"

    def __init__(self, samples: Sequence[tuple[str, Sequence[float]]]) -> None:
        self.samples = samples
        self.calls: list[SamplingParams] = []

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        assert params is not None
        self.calls.append(params)
        completions = [Completion(text, tuple(range(len(lps))), tuple(lps), "stop", 10) for text, lps in self.samples]
        return [completions[: params.n] for _ in prompts]

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        raise NotImplementedError


def test_sample_question_keeps_the_most_uncertain_and_builds_events() -> None:
    flat, peaked = [-1.0] * 4, [0.0, -9.0, -9.0, -9.0]
    generator = ScriptedGenerator(
        [
            ("Step 1: 2+2=4.\nStep 2: The final answer is: 4", peaked),  # correct, low u
            ("Step 1: 2+2=4.\nStep 2: The final answer is: 4", flat),  # correct, high u
            ("Step 1: 2+2=5.\nStep 2: The final answer is: 5", flat),  # incorrect
            ("Step 1: I am not sure.\nStep 2: Let me stop here.", flat),  # no answer: dropped
        ]
    )
    question = Question(id="q1", dataset="t", problem="What is 2+2?", gold_answer="4")
    model = ModelRef(backend="scripted", name="scripted")
    result = sample_question(generator, model, question, SampleSettings(k=4, m=1, n=1, seed=3))
    assert result.selection.correct == (1,) and result.selection.incorrect == (2,)
    assert result.selection.dropped == (3,)
    assert result.correct == [True, True, False, None]
    assert result.uncertainties[1] == pytest.approx(math.log(4))
    # answers {4, 4, 5}: H = -(2/3 ln 2/3 + 1/3 ln 1/3)
    assert result.answer_dispersion == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    payloads = [e.payload for e in result.events]
    assert all(isinstance(p, SolutionSampled) for p in payloads)
    sampled = [p for p in payloads if isinstance(p, SolutionSampled)]
    assert [p.final_answer for p in sampled] == ["4", "5"]
    assert sampled[0].steps == ("2+2=4.", "The final answer is: 4")
    assert sampled[0].selected_by == "uncertainty" and sampled[0].sampling.seed == 3
    assert all(e.causation_id == result.registered.event_id for e in result.events)
    again = sample_question(generator, model, question, SampleSettings(k=4, m=1, n=1, seed=3))
    assert [e.event_id for e in again.events] == [e.event_id for e in result.events]
    other_seed = sample_question(generator, model, question, SampleSettings(k=4, m=1, n=1, seed=4))
    assert {e.event_id for e in other_seed.events}.isdisjoint(e.event_id for e in result.events)
    assert generator.calls[0].seed == generator.calls[1].seed != generator.calls[2].seed
    assert all(p.problem == "What is 2+2?" for p in sampled)  # consumers need not look it up


def test_solution_uncertainty_record() -> None:
    record = solution_uncertainty([-1.0, -1.0, -1.0, -1.0], temperature=1.0, dispersion=0.25)
    assert record.entropy == pytest.approx(math.log(4))
    assert record.mean_nll == pytest.approx(1.0)
    assert record.perplexity == pytest.approx(math.e)
    assert record.answer_dispersion == 0.25
    empty = solution_uncertainty([], temperature=1.0, dispersion=None)
    assert empty.mean_nll is None and empty.entropy == 0.0


def test_settings_refuse_an_unknown_strategy_by_name() -> None:
    with pytest.raises(ValueError, match="unknown selection strategy 'best'"):
        SampleSettings(strategy="best")


class RecordingGenerator(ScriptedGenerator):
    """Also records the prompts it was given."""

    def __init__(self, samples: Sequence[tuple[str, Sequence[float]]]) -> None:
        super().__init__(samples)
        self.prompts: list[str] = []

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        self.prompts.extend(prompts)
        return super().generate(prompts, params)


def test_auto_prompts_arith_questions_with_the_curriculum_examples_and_others_with_epicprm() -> None:
    from prmloop.producers.arith import arith_questions

    [arith] = arith_questions(1, level=1, seed=0)
    gsm = Question(id="g1", dataset="gsm8k", problem="What is 2+2?", gold_answer="4")
    texts = [(f"Step 1: 1+1=2.\nStep 2: The final answer is: {arith.gold_answer}", [-0.5] * 4)]
    model = ModelRef(backend="scripted", name="scripted")
    generator = RecordingGenerator(texts)
    settings = SampleSettings(k=1, m=1, n=1)
    arith_result = sample_question(generator, model, arith, settings)
    gsm_result = sample_question(generator, model, gsm, settings)
    arith_prompt, gsm_prompt = generator.prompts
    assert arith_prompt.startswith("Question: Ella has 5 cards.") and arith_prompt.endswith(f"{arith.problem}\n")
    assert "Instruction:" in gsm_prompt and "Question:" not in gsm_prompt
    # A plain few-shot prompt has no end-of-turn token: the next "Question:" block ends the solution.
    assert generator.calls[0].stop == ("\n\n", "\nQuestion:") and generator.calls[1].stop == ()
    formats = [
        e.payload.prompt_format
        for e in (*arith_result.events, *gsm_result.events)
        if isinstance(e.payload, SolutionSampled)
    ]
    assert formats == ["step_k_arith", "step_k"]
    # An explicit choice wins over auto, for arith questions too.
    explicit = sample_question(generator, model, arith, settings.model_copy(update={"prompt_format": "step_k"}))
    assert "Instruction:" in generator.prompts[-1]
    assert [e.payload.prompt_format for e in explicit.events if isinstance(e.payload, SolutionSampled)] == ["step_k"]
