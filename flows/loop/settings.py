"""What the streaming loop is told and what it knows: its settings (``prmloop run``'s options), the
stream of new questions, where a later run goes on, and the status its view and results read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from prmloop.flows.loop.processes import CpuSample
from prmloop.models.questions import Question

__all__ = ["LoopError", "LoopSettings", "LoopStatus", "QuestionStream", "Retrain", "sampled_indices"]


class LoopError(RuntimeError):
    """The loop cannot run as asked (one line, said to the user)."""


class LoopSettings(BaseSettings):
    """Options of the streaming loop (``prmloop run``; environment ``PRMLOOP_LOOP_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_LOOP_", frozen=True, extra="ignore")

    minutes: float | None = Field(
        default=None, gt=0, description="stop after this many minutes (default: run until stopped)"
    )
    until_retrains: int | None = Field(
        default=None,
        ge=1,
        description="stop once this many retrains have scored on the held-out set (with --minutes: whichever first)",
    )
    engine: Literal["auto", "vllm", "transformers"] = Field(
        default="auto", description="auto: the machine's vLLM engine where `make vllm` made it ready, else transformers"
    )
    levels: str = Field(
        default="1,2,3,4,5", description="arith curriculum levels the loop samples (default: every level), e.g. 1,2"
    )
    seed: int = Field(default=0, description="question and sampling seed (the held-out set uses another)")
    order: Literal["priority", "random"] = Field(
        default="priority", description="priority: probe new questions and top up the best; random: as they come"
    )
    k: int = Field(default=4, ge=1, description="solutions per question (its probes among them)")
    probe_k: int = Field(default=2, ge=1, description="probe samples of each new question (order=priority)")
    probe_batch: int = Field(default=6, ge=1, description="new questions per feed")
    top_up_batch: int = Field(default=3, ge=0, description="queued questions topped up per feed (order=priority)")
    feeds: int = Field(
        default=1,
        ge=1,
        description="feeds at once on a server engine: the next feed's questions are sampled while the last one's "
        "slowest solutions finish (more requests in the engine's batch; no gain measured on 2 CPU cores)",
    )
    ahead: int = Field(
        default=48,
        ge=1,
        description=(
            "sampled solutions waiting for the annotator, at most, before a feed (its solutions in flight"
            " count until their batch is committed: keep it above --annotate-batch)"
        ),
    )
    retrain_every: int = Field(default=10, ge=1, description="retrain after this many new accepted labels")
    retrain_seconds: float = Field(default=90.0, gt=0, description="or after this many seconds with a new one")
    min_labels: int = Field(default=6, ge=1, description="accepted labels before the first retrain")
    calibrate_minutes: float | None = Field(default=30.0, gt=0, description="calibrate the aggregation this often")
    eval_set: str = Field(
        default="arith",
        description="the validation set promotion is decided on (arith, arith-reference); every figure shown is "
        "on the shipped test set",
    )
    eval_questions: int = Field(default=20, ge=1, description="validation questions per level (4 solutions each)")
    in_flight: int = Field(
        default=12,
        ge=1,
        description="solutions the annotator searches at once (their rollouts fill the engine's batches)",
    )
    annotate_batch: int | None = Field(
        default=None,
        ge=1,
        description="solutions the annotator takes at once (default: three times --in-flight), so a search that ends "
        "makes room for the next; keep --ahead above it",
    )
    n0: int = Field(
        default=2,
        ge=1,
        description="MC rollouts each state starts with (N0; the papers take 16, a laptop engine cannot)",
    )
    n_min: int = Field(default=1, ge=0, description="more rollouts until this many reach the answer (N_min)")
    n_max: int = Field(default=4, ge=1, description="at most this many rollouts of a state (N_max)")
    state_n_max: int = Field(
        default=4,
        ge=0,
        description="a state none of whose rollouts reach the answer gets more, up to this many, before its step "
        "is called wrong (0: as many as the question's start took)",
    )
    rollout_tokens: int = Field(default=128, ge=16, description="MC rollout budget in tokens")
    max_new_tokens: int = Field(default=192, ge=16, description="sampling budget per solution in tokens")
    threads: int | None = Field(default=None, ge=1, description="torch threads of in-process models")
    record_requests: bool = Field(
        default=False,
        description="record every request the services send the engine under $PRMLOOP_HOME/requests "
        "(for `prmloop bench replay`)",
    )

    @field_validator("levels", mode="before")
    @classmethod
    def _parse_levels(cls, value: object) -> str:
        items = value if isinstance(value, tuple | list) else str(value).replace(" ", "").split(",")
        try:
            levels = [int(v) for v in items if str(v)]
        except ValueError:
            levels = []
        if not levels or any(not 1 <= v <= 5 for v in levels):
            raise ValueError(f"levels must be curriculum levels 1-5 such as 1,2, not {value!r}")
        return ",".join(str(v) for v in levels)

    @model_validator(mode="after")
    def _rollouts_fit(self) -> LoopSettings:
        if self.n0 > self.n_max:
            raise ValueError(f"n0 ({self.n0}) must not exceed n_max ({self.n_max}): raise --n-max or lower --n0")
        from prmloop.consumers.annotator_settings import check_batch

        check_batch(self.annotate_batch, self.in_flight, "annotate_batch")
        return self

    @property
    def level_list(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.levels.split(","))

    def service_environment(self) -> dict[str, str]:
        """The services' settings this loop asks for (a variable the user exported wins)."""
        return {
            "PRMLOOP_ANNOTATOR_STRATEGY": "adaptive_binary",
            "PRMLOOP_ANNOTATOR_N0": str(self.n0),
            "PRMLOOP_ANNOTATOR_N_MIN": str(self.n_min),
            "PRMLOOP_ANNOTATOR_N_MAX": str(self.n_max),
            "PRMLOOP_ANNOTATOR_STATE_N_MAX": str(self.state_n_max),
            "PRMLOOP_ANNOTATOR_MAX_NEW_TOKENS": str(self.rollout_tokens),
            "PRMLOOP_ANNOTATOR_IN_FLIGHT": str(self.in_flight),
            "PRMLOOP_ANNOTATOR_BATCH": str(self.annotate_batch or 3 * self.in_flight),
            "PRMLOOP_JUDGE_METHOD": "exact",
            "PRMLOOP_SELECTOR_REFRESH_S": "5",
        }


class QuestionStream:
    """New curriculum questions, the levels taken in turn, each level's indices from ``start[level]`` on."""

    def __init__(self, levels: tuple[int, ...], seed: int, start: dict[int, int] | None = None) -> None:
        self.levels = levels
        self.seed = seed
        self.next = {level: (start or {}).get(level, 0) for level in levels}
        self._turn = 0

    def take(self, n: int) -> list[Question]:
        from prmloop.models.arith import generate_question
        from prmloop.producers.arith import arith_question

        out = []
        for _ in range(n):
            level = self.levels[self._turn % len(self.levels)]
            self._turn += 1
            out.append(arith_question(generate_question(level, self.seed, self.next[level])))
            self.next[level] += 1
        return out


def sampled_indices(db: Path | str, seed: int) -> dict[int, int]:
    """Per level, one past the highest question index of ``seed`` the store has seen (a later run goes on)."""
    from prmloop.store.tables.duck import QueryError, StoreLocked, query, store_exists

    if not store_exists(db):
        return {}
    try:
        rows = query(
            db,
            "SELECT DISTINCT question_id FROM questions WHERE question_id LIKE ?",
            [f"arith/L%/{seed}/%"],
            timeout_s=30,
        ).rows
    except (QueryError, StoreLocked, FileNotFoundError):
        return {}
    out: dict[int, int] = {}
    for (question_id,) in rows:
        parts = str(question_id).split("/")
        if len(parts) == 4 and parts[1].startswith("L") and parts[3].isdigit():
            level = int(parts[1][1:])
            out[level] = max(out.get(level, 0), int(parts[3]) + 1)
    return out


@dataclass
class Retrain:
    """One retrain as the view and the learning curve show it."""

    at_s: float
    accepted: int
    f1: float | None
    promoted: bool
    model_id: str | None
    wall_s: float
    reason: str | None = None
    #: generated tokens when the retrain started (what its labels cost)
    tokens: int = 0
    #: ``f1`` is the test F1 (the shipped test set nothing trains or promotes on); its bootstrap 95 %
    #: interval, the F1 per level (``{"L1": (f1, lo, hi)}``) and the validation F1 promotion used
    f1_lo: float | None = None
    f1_hi: float | None = None
    by_level: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    val_f1: float | None = None

    def f1_text(self) -> str:
        """``0.812 [0.790, 0.833]`` (the interval where there is one), ``-`` without an F1."""
        if self.f1 is None:
            return "-"
        if self.f1_lo is None or self.f1_hi is None:
            return f"{self.f1:.3f}"
        return f"{self.f1:.3f} [{self.f1_lo:.3f}, {self.f1_hi:.3f}]"


@dataclass
class LoopStatus:
    """What the view shows; updated by the driver's threads."""

    started: float = field(default_factory=time.monotonic)
    engine: str = "transformers"
    engine_url: str | None = None
    ui: str | None = None
    home: Path | None = None
    feeds: int = 0
    #: seconds after start when the first feed began (the engine's warm-up is measured from it)
    first_feed_at: float | None = None
    feeds_running: int = 0
    published: int = 0
    waiting: int = 0
    queue: int = 0
    accepted_before: int = 0
    retrains: list[Retrain] = field(default_factory=list)
    retraining: bool = False
    prm: str | None = None
    calibrations: int = 0
    last_error: str | None = None
    stopping: bool = False
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: CPU seconds each process (with its children) has used, at the last sample
    cpu_s: dict[str, float] = field(default_factory=dict)
    #: (seconds into the run, CPU seconds by process, the machine's (total, idle) ticks) every 30 s
    cpu_samples: list[CpuSample] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def retrain_of(summary: dict[str, Any], *, at_s: float, accepted: int, wall_s: float, tokens: int) -> Retrain:
    """A trained retrain's point on the curve from its summary (``metrics``, ``promoted``, ``model_id``):
    the test F1 with its interval and per level (the validation F1 where a store predates the test set);
    ``accepted`` counts only where the metrics do not say how many solutions it trained on."""
    metrics = summary["metrics"]
    test = metrics.get("test_f1")
    val = metrics.get("heldout_f1")
    levels = {
        key.removeprefix("test_f1_"): (float(metrics[key]), float(metrics[f"{key}_lo"]), float(metrics[f"{key}_hi"]))
        for key in metrics
        if key.startswith("test_f1_L") and not key.endswith(("_lo", "_hi")) and f"{key}_lo" in metrics
    }
    return Retrain(
        at_s,
        int(metrics.get("train_solutions", accepted)),
        float(test if test is not None else (val or 0.0)),
        bool(summary["promoted"]),
        summary.get("model_id"),
        wall_s,
        None,
        tokens,
        f1_lo=None if test is None else float(metrics["test_f1_lo"]),
        f1_hi=None if test is None else float(metrics["test_f1_hi"]),
        by_level=dict(sorted(levels.items())),
        val_f1=None if val is None else float(val),
    )
