"""The annotator service's options (``prmloop annotate``; environment ``PRMLOOP_ANNOTATOR_*``), declared once.

:mod:`prmloop.consumers.annotator` builds the strategy, completers and checker from them and runs the service.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from prmloop.models.annotation.strategies import STRATEGIES, AnnotationStrategy
from prmloop.models.backends.registry import EngineSettings
from prmloop.models.simulator import SimulatorOptions
from prmloop.store.events import SolutionSelected

__all__ = ["AnnotatorSettings", "check_batch"]


def check_batch(batch: int | None, in_flight: int, option: str = "batch") -> None:
    """Refuse a batch (solutions taken at once) smaller than the searches in flight: the rest would idle."""
    if batch is not None and batch < in_flight:
        raise ValueError(
            f"{option} ({batch}) must be at least in_flight ({in_flight}): "
            f"raise --{option.replace('_', '-')} or lower --in-flight"
        )


class AnnotatorSettings(EngineSettings, SimulatorOptions):
    """Options of the annotator service (``prmloop annotate``; environment ``PRMLOOP_ANNOTATOR_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_ANNOTATOR_", frozen=True, extra="ignore")

    strategy: str = Field(
        default="adaptive_binary",
        description="sequential, binary, adaptive_binary, uncertainty_driven or bisection (Δu prior, sequential stop)",
    )
    completer: Literal["model", "simulator"] = Field(default="model", description="a model backend, or the simulator")
    prompt_format: Literal["step_k", "double_newline", "step_k_arith"] = Field(
        default="step_k",
        description="prompt the completer continues in evaluations (the service uses each solution's own)",
    )
    temperature: float = Field(default=0.7, ge=0.0, description="rollout sampling temperature")
    max_new_tokens: int = Field(default=384, ge=1, description="rollout budget; longer rollouts count as wrong")
    stop_at_answer: bool = Field(
        default=True,
        description="end a rollout once its answer is stated (a closed \\boxed{} or 'The answer is X.'): fewer tokens",
    )
    rollouts: int = Field(default=48, ge=1, description="sequential/binary: rollouts per state (hard MC)")
    n0: int = Field(default=16, ge=1, description="adaptive sampling: first rollouts of a state (N0)")
    n_min: int = Field(default=10, ge=0, description="adaptive sampling: grow until this many correct (N_min)")
    n_max: int = Field(default=72, ge=1, description="adaptive sampling: at most this many rollouts (N_max)")
    alpha: float = Field(default=0.5, gt=0.0, description="adaptive_binary: contribution threshold")
    state_n_max: int = Field(
        default=0,
        ge=0,
        description="adaptive_binary: a state none of whose rollouts reach the answer gets more, up to this many, "
        "before its step is called wrong (0: as many as s_0 took, as EpicPRM)",
    )
    weighting: str | None = Field(
        default=None, description="MC weighting: count, inv_ppl (1/PPL, default) or log_ppl (printed Eq. 2)"
    )
    in_flight: int = Field(
        default=1,
        ge=1,
        description="solutions annotated at once (a server engine batches them; transformers gets them as one batch)",
    )
    batch: int | None = Field(
        default=None,
        ge=1,
        description="solutions taken from the topic at once, at least --in-flight (default: --in-flight); more keeps "
        "--in-flight searches going while a batch's slowest finish (its offsets are committed when all are done)",
    )
    look_ahead: bool = Field(
        default=True,
        description="with --in-flight above 1, start the next batch's searches as its records are fetched, behind "
        "this batch's, so a search that ends makes room across batches (its labels and offsets go with that batch)",
    )
    group: str = Field(
        default="prmloop-annotator", description="consumer group; processes in one group share partitions"
    )
    topic: str = Field(
        default=SolutionSelected.TOPIC,
        description="read the selector's decisions (steps.selected), or every scored solution (steps.scored)",
    )
    until_idle: float | None = Field(default=None, gt=0, description="exit after this many seconds without input")
    max_solutions: int | None = Field(
        default=None, ge=1, description="stop after searching this many incorrect solutions (the rest stay uncommitted)"
    )
    free_only: bool = Field(
        default=False, description="label only the correct solutions (no rollouts); run it in a --group of its own"
    )
    reuse_samples: bool = Field(
        default=True,
        description="count a question's sampled solutions (same model, temperature, top-p) as its first rollouts "
        "from the question, MC(s_0), instead of drawing them anew",
    )
    sim_latency: float = Field(default=0.0, ge=0.0, description="simulator: seconds per engine call")
    seed: int = Field(default=0, description="rollout seed: the same state and draw give the same rollouts")

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        if value not in STRATEGIES:
            raise ValueError(f"unknown annotation strategy {value!r}; choose one of {', '.join(STRATEGIES)}")
        return value

    @model_validator(mode="after")
    def _batch_holds_the_searches(self) -> AnnotatorSettings:
        check_batch(self.batch, self.in_flight)
        return self

    @property
    def taken_at_once(self) -> int:
        """Solutions taken from the topic per batch: ``batch``, else ``in_flight``."""
        return self.batch or self.in_flight

    def make_strategy(self) -> AnnotationStrategy:
        """The configured strategy with its parameters (fixed N for the hard-MC baselines)."""
        from prmloop.models.annotation.estimate import Sampling
        from prmloop.models.annotation.strategies import make_strategy

        params: dict[str, Any] = {}
        if self.strategy in ("sequential", "binary"):
            params["n"] = self.rollouts
        else:
            params["sampling"] = Sampling(n0=self.n0, n_min_correct=self.n_min, n_max=max(self.n_max, self.n0))
            if self.strategy in ("adaptive_binary", "bisection"):
                params["alpha"] = self.alpha
            if self.strategy == "adaptive_binary" and self.state_n_max:
                params["state_n_max"] = self.state_n_max
        if self.weighting is not None:
            params["weighting"] = self.weighting
        return make_strategy(self.strategy, **params)
