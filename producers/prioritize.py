"""Prioritizing questions: probe each with a few samples, score the signals, emit ``QuestionPrioritized``.

A probe is an ordinary sampling of ``k`` solutions (:func:`~prmloop.producers.sampler.sample_question`
with a seed of its own, so probes never share solution ids with the samples the loop keeps), graded
against the gold answer; :mod:`prmloop.models.priority` turns what it showed into a priority. A PRM,
once one exists, adds the spread of its solution scores and, without a gold answer, the calibrated
reliability estimate. The sample flow then takes the highest-priority questions first
(``prmloop sample --from-queue``).

:class:`PrioritizeSettings` is the one declaration of the options: the ``prmloop prioritize`` command,
the Prefect flow ``prioritize`` and the environment (``PRMLOOP_PRIORITIZE_*``) read it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from prmloop.models.backends.base import Generator
from prmloop.models.backends.registry import EngineSettings
from prmloop.models.priority import PriorityWeights, Probe, priority, priority_signals
from prmloop.models.questions import Question
from prmloop.producers.events import question_prioritized
from prmloop.producers.sampler import SampleSettings, sample_question
from prmloop.producers.sources import check_dataset, check_split
from prmloop.store.events import Envelope, ModelRef, SolutionSampled

__all__ = [
    "PRODUCER",
    "PrioritizeSettings",
    "Prioritized",
    "SolutionScorer",
    "prioritize_question",
    "probe_seed",
]

PRODUCER = "prmloop-prioritize/0.1.0"


class SolutionScorer(Protocol):
    """A PRM as the prioritizer uses it: one score in [0, 1] per step of each solution."""

    def score_solutions(self, problems: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]: ...


class PrioritizeSettings(EngineSettings):
    """Options of one prioritization round."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_PRIORITIZE_", frozen=True, extra="ignore")

    dataset: str | None = Field(
        default=None, description="arith (generated), or gsm8k, gsm_plus, math or math500 (../shared/data)"
    )
    file: Path | None = Field(default=None, description="JSONL questions: {id, problem, answer} per line")
    limit: int | None = Field(default=None, ge=1, description="only the first N questions")
    split: str | None = Field(default=None, description="data-set split, e.g. test or train")
    level: int = Field(default=1, ge=1, le=5, description="arith: difficulty level 1-5")
    k: int = Field(default=4, ge=1, description="probe samples per question", json_schema_extra={"flag": "-k"})
    round: int = Field(default=0, ge=0, description="prioritization round (the loop counts them)")
    seed: int = Field(default=0, description="run seed; the probe's sampling seed derives from it and the round")
    prompt_format: Literal["auto", "step_k", "double_newline", "step_k_arith"] = Field(
        default="auto", description="solution prompt (auto: step_k_arith for arith questions, else step_k)"
    )
    temperature: float = Field(default=0.7, ge=0.0, description="probe sampling temperature")
    max_new_tokens: int = Field(default=256, ge=1, description="probe generation budget per solution, in tokens")
    w_reliability: float = Field(default=0.5, ge=0.0, description="weight of 4q(1-q), q = estimated accuracy")
    w_dispersion: float = Field(default=0.2, ge=0.0, description="weight of the answer dispersion")
    w_token: float = Field(default=0.1, ge=0.0, description="weight of the token uncertainty 1-exp(-NLL)")
    w_prm_spread: float = Field(default=0.2, ge=0.0, description="weight of the PRM score spread (with --prm)")
    extreme_factor: float = Field(
        default=0.1, ge=0.0, le=1.0, description="priority factor for all-wrong (hopeless) or all-right probes"
    )
    publish_probes: bool = Field(
        default=True, description="publish the probe's graded solutions to solutions.sampled (no token wasted)"
    )
    prm: Path | None = Field(default=None, description="a trained PRM's artifact directory (adds the PRM spread)")
    prefect: bool = Field(default=True, description="run as the Prefect flow `prioritize` (tasks, artifact)")

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str | None) -> str | None:
        return check_dataset(value)

    @field_validator("split")
    @classmethod
    def _known_split(cls, value: str | None, info: ValidationInfo) -> str | None:
        return check_split(info.data.get("dataset"), value)

    def weights(self) -> PriorityWeights:
        return PriorityWeights(
            reliability=self.w_reliability,
            dispersion=self.w_dispersion,
            token=self.w_token,
            prm_spread=self.w_prm_spread,
            extreme_factor=self.extreme_factor,
        )

    def probe_settings(self) -> SampleSettings:
        """The sampling a probe does: every sample kept (m = n = 0, all published as unselected)."""
        return SampleSettings(
            backend=self.backend,
            model=self.model,
            base_url=self.base_url,
            threads=self.threads,
            k=self.k,
            m=0,
            n=0,
            seed=probe_seed(self.seed, self.round),
            prompt_format=self.prompt_format,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            publish_unselected=True,
            prefect=False,
        )


def probe_seed(seed: int, round: int) -> int:
    """The probe's sampling seed: distinct from the run seed, so probe and kept samples never share ids."""
    return int.from_bytes(hashlib.sha256(f"probe\x1f{seed}\x1f{round}".encode()).digest()[:4], "big")


@dataclass(frozen=True)
class Prioritized:
    """One question's probe, signals, priority, its ``QuestionPrioritized`` event and the probe's
    solutions (``SolutionSampled``, the graded ones: real samples the loop can label like any other)."""

    question: Question
    probe: Probe
    signals: dict[str, float]
    priority: float
    event: Envelope
    wall_s: float
    solutions: tuple[Envelope, ...] = ()

    def row(self) -> dict[str, Any]:
        """One row of the per-question table artifact."""
        return {
            "question_id": self.question.id,
            "priority": round(self.priority, 4),
            **{k: round(v, 4) for k, v in self.signals.items()},
        }


def _probe(
    generator: Generator, model: ModelRef, question: Question, settings: PrioritizeSettings, prm: SolutionScorer | None
) -> tuple[Probe, list[Envelope]]:
    sampled = sample_question(generator, model, question, settings.probe_settings())
    prm_scores: tuple[float, ...] | None = None
    if prm is not None:
        steps = [e.payload.steps for e in sampled.events if isinstance(e.payload, SolutionSampled)]
        step_scores = prm.score_solutions([question.problem] * len(steps), steps)
        prm_scores = tuple(min(s) if s else 0.0 for s in step_scores)
    probe = Probe(
        answers=tuple(sampled.answers),
        correct=tuple(sampled.correct),
        mean_nll=tuple(sampled.mean_nll),
        prm_scores=prm_scores,
        tokens=sampled.completion_tokens,
    )
    # Only graded solutions are worth labelling (an annotator cannot search one without a verdict).
    graded = [e for e in sampled.events if isinstance(e.payload, SolutionSampled) and e.payload.correct is not None]
    return probe, graded


def prioritize_question(
    generator: Generator,
    model: ModelRef,
    question: Question,
    settings: PrioritizeSettings,
    *,
    prm: SolutionScorer | None = None,
    prm_ref: ModelRef | None = None,
    calibrator: Callable[[float], float] | None = None,
) -> Prioritized:
    """Probe ``question``, compute its signals and priority, and build its ``QuestionPrioritized``."""
    started = time.perf_counter()
    probe, solutions = _probe(generator, model, question, settings, prm)
    signals = priority_signals(probe, calibrator)
    value = priority(signals, settings.weights())
    event = question_prioritized(
        question,
        priority=value,
        round=settings.round,
        signals=signals,
        prm=prm_ref,
        identity=(settings.round, settings.seed, model.model_dump(mode="json"), settings.k),
        producer=PRODUCER,
    )
    return Prioritized(
        question,
        probe,
        signals,
        value,
        event,
        time.perf_counter() - started,
        tuple(solutions) if settings.publish_probes else (),
    )
