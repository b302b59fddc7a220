"""Sampling one question: ``k`` solutions in, uncertainty-selected ``SolutionSampled`` events out (UnPRM Sec. 3).

For a question: sample ``k`` solutions with per-token log-probabilities; split them into steps with
token offsets; grade them against the gold answer; score each whole solution's uncertainty
(:func:`~prmloop.models.uncertainty.sequence_entropy`: what selection ranks by; per-step uncertainty is
the step scorer's, downstream); keep ``m`` correct and ``n`` incorrect with a selection strategy
(:mod:`prmloop.producers.candidates`); build the kept solutions' events with
:func:`~prmloop.producers.events.solution_sampled`.

Idempotent: every event id derives from (question id, generator, seed, sample index), and each
question's samples are drawn with a seed derived from (seed, question id), so re-running on the same
questions with the same seed publishes the same ids and the sink stores nothing new.

:class:`SampleSettings` is the one declaration of the sampling options: the ``prmloop sample`` command
line, the Prefect flow ``sample`` and the environment (``PRMLOOP_SAMPLE_*``) all read it.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from prmloop.models.answers import extract_answer
from prmloop.models.arith import ARITH_DATASET
from prmloop.models.backends.base import Completion, Generator, SamplingParams, Tokenized
from prmloop.models.backends.registry import EngineSettings
from prmloop.models.grading import GradeOutcome, grade
from prmloop.models.prompts import PromptFormat, StepFormat, solution_prompt, step_format, stop_strings
from prmloop.models.questions import Question
from prmloop.models.steps import split_completion, split_steps
from prmloop.models.uncertainty import PAPER_TEMPERATURE, answer_dispersion, mean_nll, perplexity, sequence_entropy
from prmloop.producers.candidates import SELECTION_STRATEGIES, Candidate, Selection, get_strategy
from prmloop.producers.events import question_registered, solution_sampled
from prmloop.producers.sources import check_dataset, check_split
from prmloop.store.events import Envelope, ModelRef, SamplingSpec, SolutionUncertainty, deterministic_event_id

__all__ = [
    "PRODUCER",
    "SampleSettings",
    "SampledQuestion",
    "question_seed",
    "sample_question",
    "solution_ids",
    "summarize",
]

PRODUCER = "prmloop-sample/0.1.0"


class SampleSettings(EngineSettings):
    """Options of one sampling run (defaults follow the papers where they can; UnPRM / EpicPRM use k=32)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_SAMPLE_", frozen=True, extra="ignore")

    dataset: str | None = Field(
        default=None,
        description="arith (generated, exact first errors), or gsm8k, gsm_plus, math or math500 (from ../shared/data)",
    )
    file: Path | None = Field(default=None, description="JSONL questions: {id, problem, answer} per line")
    from_queue: bool = Field(
        default=False, description="take the highest-priority questions of `prmloop prioritize` from the store"
    )
    db: str | None = Field(
        default=None,
        description="--from-queue: the store, a DuckDB file or ducklake:... (default: $PRMLOOP_STORE, else "
        "$PRMLOOP_HOME/prmloop.duckdb)",
    )
    limit: int | None = Field(default=None, ge=1, description="only the first N questions")
    split: str | None = Field(default=None, description="data-set split, e.g. test or train")
    level: int = Field(default=1, ge=1, le=5, description="arith: difficulty level 1-5 (see docs/sampling.md's table)")
    k: int = Field(default=8, ge=1, description="solutions sampled per question", json_schema_extra={"flag": "-k"})
    m: int = Field(default=2, ge=0, description="correct solutions kept per question", json_schema_extra={"flag": "-m"})
    n: int = Field(
        default=6, ge=0, description="incorrect solutions kept per question", json_schema_extra={"flag": "-n"}
    )
    strategy: str = Field(default="uncertainty", description="selection: uncertainty (UnPRM), epicprm or random")
    seed: int = Field(default=0, description="run seed; event ids and per-question sampling seeds derive from it")
    prompt_format: Literal["auto", "step_k", "double_newline", "step_k_arith"] = Field(
        default="auto",
        description=(
            "step_k (EpicPRM's 2-shot 'Step k:'), double_newline (Qwen), step_k_arith (arithmetic examples, "
            "plain text); auto: step_k_arith for arith questions, step_k otherwise"
        ),
    )
    temperature: float = Field(default=0.7, ge=0.0, description="sampling temperature")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling mass (1 = off)")
    max_new_tokens: int = Field(default=384, ge=1, description="generation budget per solution, in tokens")
    uncertainty_temperature: float = Field(
        default=PAPER_TEMPERATURE, gt=0.0, description="T of UnPRM's softmax over token log-probs (1 paper, 5 code)"
    )
    publish_unselected: bool = Field(default=False, description="also publish solutions no strategy kept")
    batch_size: int = Field(default=4, ge=1, description="questions per Prefect task (one retry unit)")
    prefect: bool = Field(default=True, description="run as the Prefect flow `sample` (tasks, retries, artifact)")

    @field_validator("db", mode="before")
    @classmethod
    def _store_as_text(cls, value: object) -> object:
        """A DuckDB file's Path is accepted as its text (a DuckLake is text anyway)."""
        return str(value) if isinstance(value, Path) else value

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str | None) -> str | None:
        return check_dataset(value)

    @field_validator("split")
    @classmethod
    def _known_split(cls, value: str | None, info: ValidationInfo) -> str | None:
        return check_split(info.data.get("dataset"), value)

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        if value not in SELECTION_STRATEGIES:
            raise ValueError(f"unknown selection strategy {value!r}; choose one of {', '.join(SELECTION_STRATEGIES)}")
        return value

    def prompt_for(self, question: Question) -> PromptFormat:
        """The prompt format of ``question``: the one asked for, or under ``auto`` the curriculum's own
        examples for an arithmetic question and EpicPRM's ``step_k`` otherwise."""
        if self.prompt_format != "auto":
            return self.prompt_format
        return "step_k_arith" if question.dataset == ARITH_DATASET else "step_k"

    def sampling_params(self, question_id: str, prompt_format: str = "step_k") -> SamplingParams:
        return SamplingParams(
            n=self.k,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=stop_strings(prompt_format),
            seed=question_seed(self.seed, question_id),
        )

    def sampling_spec(self) -> SamplingSpec:
        return SamplingSpec(
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            n=self.k,
        )


def question_seed(seed: int, question_id: str) -> int:
    """The seed of one question's samples: stable across runs, limits and batch sizes."""
    digest = hashlib.sha256(f"{seed}\x1f{question_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass
class SampledQuestion:
    """A question's ``k`` samples, graded and scored, with what the strategy kept."""

    question: Question
    registered: Envelope
    events: list[Envelope]
    selection: Selection
    uncertainties: list[float]
    correct: list[bool | None]
    completion_tokens: int
    answer_dispersion: float
    wall_s: float
    answers: list[str | None] = field(default_factory=list)
    mean_nll: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """One row of the per-question table artifact."""
        return {
            "question_id": self.question.id,
            "sampled": len(self.correct),
            "correct": sum(c is True for c in self.correct),
            "incorrect": sum(c is False for c in self.correct),
            "unparseable": sum(c is None for c in self.correct),
            "dropped": len(self.selection.dropped),
            "selected_correct": len(self.selection.correct),
            "selected_incorrect": len(self.selection.incorrect),
            "answer_dispersion": round(self.answer_dispersion, 4),
            "tokens": self.completion_tokens,
        }


def _steps_and_offsets(
    generator: Generator, completion: Completion, style: StepFormat
) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    if not isinstance(generator, Tokenized):
        # No tokenizer to map characters to tokens: steps from the text; the scorer teacher-forces them.
        return tuple(s.text for s in split_steps(completion.text, style)), None
    token_steps = split_completion(generator.tokenizer, completion, style)
    return tuple(ts.step.text for ts in token_steps), tuple(ts.token_start for ts in token_steps)


def solution_ids(question_id: str, generator: ModelRef, seed: int, index: int) -> tuple[str, tuple[object, ...]]:
    """(solution id, event identity) of sample ``index``: both from (question, generator, seed, index)."""
    key = (question_id, generator.model_dump(mode="json"), seed, index)
    return str(deterministic_event_id("Solution", *key)), key


def solution_uncertainty(
    logprobs: Sequence[float], *, temperature: float, dispersion: float | None
) -> SolutionUncertainty:
    """UnPRM's ``u`` of the whole solution, its mean NLL and perplexity, and the question's answer dispersion."""
    has_tokens = len(logprobs) > 0
    return SolutionUncertainty(
        entropy=sequence_entropy(logprobs, temperature=temperature),
        mean_nll=mean_nll(logprobs) if has_tokens else None,
        perplexity=perplexity(logprobs) if has_tokens else None,
        answer_dispersion=dispersion,
    )


def sample_question(
    generator: Generator, model: ModelRef, question: Question, settings: SampleSettings
) -> SampledQuestion:
    """Sample, split, grade, score and select one question's solutions; build their events.

    Raises:
        ValueError: the question has no gold answer (it cannot be graded).
    """
    if not question.gold_answer:
        raise ValueError(f"question {question.id!r} has no gold answer; it cannot be graded")
    started = time.perf_counter()
    registered = question_registered(question, producer=PRODUCER)
    prompt_format = settings.prompt_for(question)
    prompt = solution_prompt(generator, question.problem, prompt_format)
    [completions] = generator.generate([prompt], settings.sampling_params(question.id, prompt_format))
    parts = [_steps_and_offsets(generator, c, step_format(prompt_format)) for c in completions]
    # Only an explicitly stated answer counts (boxed, "The final answer is", ####): grade()'s bare-answer
    # fallback would take a one-line solution that never answers for its answer.
    answers = [extract_answer(c.text) for c in completions]
    correct: list[bool | None] = []
    for answer in answers:
        outcome = GradeOutcome.UNPARSEABLE if answer is None else grade(answer, question.gold_answer).outcome
        correct.append(None if outcome is GradeOutcome.UNPARSEABLE else outcome is GradeOutcome.CORRECT)
    dispersion = answer_dispersion(answers)
    records = [
        solution_uncertainty(c.logprobs, temperature=settings.uncertainty_temperature, dispersion=dispersion)
        for c in completions
    ]
    uncertainties = [r.entropy if r.entropy is not None else 0.0 for r in records]
    candidates = [
        Candidate(i, c.text, a, ok, u)
        for i, (c, a, ok, u) in enumerate(zip(completions, answers, correct, uncertainties, strict=True))
    ]
    selection = get_strategy(settings.strategy).select(candidates, m=settings.m, n=settings.n, seed=settings.seed)
    kept = set(selection.selected)
    events = []
    for i, completion in enumerate(completions):
        if i not in kept and not settings.publish_unselected:
            continue
        steps, offsets = parts[i]
        solution_id, identity = solution_ids(question.id, model, settings.seed, i)
        events.append(
            solution_sampled(
                question,
                solution_id=solution_id,
                generator=model,
                sampling=settings.sampling_spec(),
                prompt_format=prompt_format,
                text=completion.text,
                steps=steps,
                step_token_offsets=offsets,
                token_logprobs=completion.logprobs,
                final_answer=answers[i],
                correct=correct[i],
                uncertainty=records[i],
                selected_by=selection.strategy if i in kept else None,
                completion_tokens=completion.completion_tokens,
                identity=identity,
                producer=PRODUCER,
                causation_id=registered.event_id,
            )
        )
    return SampledQuestion(
        question=question,
        registered=registered,
        events=events,
        selection=selection,
        uncertainties=uncertainties,
        correct=correct,
        completion_tokens=sum(c.completion_tokens for c in completions),
        answer_dispersion=dispersion,
        wall_s=time.perf_counter() - started,
        answers=answers,
        mean_nll=[r.mean_nll for r in records if r.mean_nll is not None],
    )


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(
    results: Sequence[SampledQuestion],
    *,
    settings: SampleSettings,
    generator: str,
    errors: Sequence[str],
    published: int,
    sampling_s: float,
    wall_s: float,
) -> dict[str, Any]:
    """The run summary ``prmloop sample`` prints and the flow returns."""
    selected_u = [r.uncertainties[i] for r in results for i in r.selection.selected]
    rest_u = [u for r in results for i, u in enumerate(r.uncertainties) if i not in set(r.selection.selected)]
    graded = [c for r in results for c in r.correct]
    tokens = sum(r.completion_tokens for r in results)
    return {
        "questions": len(results),
        "question_errors": list(errors),
        "k": settings.k,
        "m": settings.m,
        "n": settings.n,
        "strategy": settings.strategy,
        "seed": settings.seed,
        "generator": generator,
        "solutions": len(graded),
        "correct": sum(c is True for c in graded),
        "incorrect": sum(c is False for c in graded),
        "unparseable": sum(c is None for c in graded),
        "fraction_correct": (sum(c is True for c in graded) / len(graded)) if graded else math.nan,
        "dropped": sum(len(r.selection.dropped) for r in results),
        "selected": len(selected_u),
        "events_published": published,
        "completion_tokens": tokens,
        "sampling_s": sampling_s,
        "tokens_per_s": tokens / sampling_s if sampling_s > 0 else math.nan,
        "wall_s": wall_s,
        "mean_uncertainty_selected": _mean(selected_u),
        "mean_uncertainty_rest": _mean(rest_u),
        "per_question": [r.row() for r in results],
    }
