"""The judge service: ``steps.scored`` -> ``steps.judged`` with an LLM judge (CoT Entropy paper; Qwen critic).

Like the annotator, the judge reads the scorer's output, which carries the problem text and the steps,
and scales by consumer group (processes with one ``--group`` share the partitions). Each
``StepsJudged`` has a deterministic id of (solution, judge model, method, parameters): a judge killed
mid-solution and restarted publishes the same id, and the sink keeps it once.

Methods: ``stepwise`` (:class:`~prmloop.models.judge.judges.StepwiseJudge`: per-step decision, Eq. 5
probability, CoT Entropy and its split, stopping at the first error unless ``--all-steps``) and
``critic`` (:class:`~prmloop.models.judge.judges.Critic`: the first wrong paragraph of the whole
solution, the ProcessBench protocol) and ``exact``
(:class:`~prmloop.models.arith.verifier.ExactVerifier`: no model, the arithmetic curriculum's step
checker, at ``--strictness quantities`` by default; an undecided solution gets verdicts only on the
verified steps before the first it could not verify, and the checker's reason in ``reason``; so do
solutions larger than the checker reads, with a warning that names the limit: see
:mod:`prmloop.models.arith.limits`). A solution without
steps or problem text is dead-lettered with the reason; a model server that cannot be reached is
retried with backoff by the runtime, any other failure dead-letters the solution it happened on
(``prmloop.store.kafka.poison``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from prmloop.models.arith.checker import Strictness
from prmloop.models.arith.verifier import ExactVerdict, ExactVerifier
from prmloop.models.backends.registry import EngineSettings, build_backend
from prmloop.models.judge.judges import Critic, CriticVerdict, JudgeEngine, SolutionJudgment, StepwiseJudge
from prmloop.store.events import (
    CostLedger,
    Envelope,
    ModelRef,
    SolutionSelected,
    StepJudgment,
    StepsJudged,
    StepsScored,
    deterministic_event_id,
    make_event,
    scored_to_label,
)
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.kafka.service import run_service
from prmloop.store.settings import KafkaSettings

__all__ = [
    "JUDGE_GROUP",
    "PRODUCER",
    "JudgeHandler",
    "JudgeSettings",
    "build_judge",
    "critic",
    "judged_event",
    "run_judge",
    "stepwise_judge",
]

log = logging.getLogger(__name__)

PRODUCER = "prmloop.judge/1"
#: The judge name of ``--method exact`` (the arithmetic curriculum's step checker).
EXACT_JUDGE_NAME = "arith-exact-checker"
JUDGE_GROUP = "prmloop-judge"
#: Characters of a judge's reason kept in its verdict (the exact checker's reasons quote steps).
_REASON_CHARS = 600


class JudgeSettings(EngineSettings):
    """Options of the judge service (``prmloop judge``; environment ``PRMLOOP_JUDGE_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_JUDGE_", frozen=True, extra="ignore")

    method: Literal["stepwise", "critic", "exact"] = Field(
        default="stepwise",
        description="stepwise (CoT judge per step, CoT Entropy), critic (whole solution), or exact (the "
        "arithmetic curriculum's step checker, no model)",
    )
    samples: int = Field(
        default=10, ge=0, description="stepwise: rationales at --temperature per step for the uncertainty (paper: 10)"
    )
    temperature: float = Field(default=1.0, ge=0.0, description="temperature of the uncertainty samples (paper: 1.0)")
    prediction_temperature: float = Field(
        default=0.1, ge=0.0, description="stepwise: temperature of the one sample whose decision is the verdict"
    )
    critic_samples: int = Field(default=1, ge=1, description="critic: 1 = greedy, more = majority vote")
    max_new_tokens: int = Field(default=256, ge=1, description="tokens per judgment")
    all_steps: bool = Field(default=False, description="stepwise: judge every step, not only up to the first error")
    strictness: Strictness = Field(
        default="quantities",
        description="exact: which steps without an equation the checker vouches for: equations, quantities "
        "(restatements in the question's own words), numbers or lenient",
    )
    seed: int = Field(default=0, description="judge seed: the same solution and step give the same samples")
    group: str = Field(default=JUDGE_GROUP, description="consumer group; processes in one group share partitions")
    topic: str = Field(
        default=SolutionSelected.TOPIC,
        description="read the selector's decisions (steps.selected), or every scored solution (steps.scored)",
    )
    until_idle: float | None = Field(default=None, gt=0, description="exit after this many seconds without input")
    max_solutions: int | None = Field(default=None, ge=1, description="stop after judging this many solutions")


def _step_judgments(judgment: SolutionJudgment) -> tuple[StepJudgment, ...]:
    return tuple(
        StepJudgment(
            step_index=v.step_index,
            has_error=v.has_error,
            p_error=v.p_error,
            cot_entropy=v.cot_entropy,
            cot_entropy_discrete=v.cot_entropy_discrete,
            naive_entropy=v.naive_entropy,
            epistemic=v.epistemic,
            aleatoric=v.aleatoric,
            samples=v.samples,
            unparsed=v.unparsed,
            rationale_digest=v.rationale_digest,
        )
        for v in judgment.verdicts
    )


def judged_event(
    scored: StepsScored,
    outcome: SolutionJudgment | CriticVerdict | ExactVerdict,
    judge: ModelRef,
    *,
    method: str,
    parameters: dict[str, Any],
    causation_id: Any = None,
) -> Envelope:
    """The ``StepsJudged`` of one solution with its deterministic id (solution, judge, method, parameters)."""
    n = len(scored.steps)
    reason = None
    verdicts: tuple[bool | None, ...]
    judgments: tuple[StepJudgment, ...] = ()
    step_entropy: tuple[float | None, ...] | None = None
    if isinstance(outcome, ExactVerdict):
        verdicts = outcome.verdicts if len(outcome.verdicts) == n else (None,) * n
        first_error = outcome.first_error_step if outcome.decided else None
        reason = None if outcome.decided else outcome.reason[:_REASON_CHARS]
        cost = CostLedger(
            verified_steps=len(outcome.step_reasons),
            wall_time_s=outcome.wall_time_s,
            failures={} if outcome.decided else {"undecided": 1},
        )
    elif isinstance(outcome, SolutionJudgment):
        verdicts = outcome.step_labels()
        first_error = outcome.first_error_step
        judgments = _step_judgments(outcome)
        entropy_by_step = {j.step_index: j.cot_entropy for j in judgments}
        step_entropy = tuple(entropy_by_step.get(t) for t in range(n))
        cost = CostLedger(
            verified_steps=len(outcome.verdicts),
            generated_tokens=outcome.generated_tokens,
            wall_time_s=outcome.wall_time_s,
            failures=dict(outcome.failures),
        )
    else:
        found = outcome.first_error_step
        first_error = found if isinstance(found, int) else None
        if found == "unparsed":
            verdicts = (None,) * n
        else:
            verdicts = tuple(first_error is None or t < first_error for t in range(n))
        cost = CostLedger(
            verified_steps=n,
            generated_tokens=outcome.generated_tokens,
            wall_time_s=outcome.wall_time_s,
            failures={"unparsed": outcome.unparsed} if outcome.unparsed else {},
        )
    payload = StepsJudged(
        solution_id=scored.solution_id,
        question_id=scored.question_id,
        judge=judge,
        method=method,
        parameters=parameters,
        verdicts=verdicts,
        first_error_step=first_error,
        step_entropy=step_entropy,
        judgments=judgments,
        cost=cost,
        reason=reason,
    )
    event_id = deterministic_event_id("StepsJudged", scored.solution_id, judge.model_dump(), method, parameters)
    return make_event(payload, producer=PRODUCER, event_id=event_id, causation_id=causation_id)


class JudgeHandler:
    """Batch handler: judge every ``StepsScored`` of a batch and publish the verdicts before returning."""

    def __init__(
        self,
        judge: StepwiseJudge | Critic | ExactVerifier,
        judge_ref: ModelRef,
        publish: Callable[[list[Envelope]], object],
    ) -> None:
        self.judge = judge
        self.judge_ref = judge_ref
        if isinstance(judge, ExactVerifier):
            self.method = "exact"
        else:
            self.method = "stepwise" if isinstance(judge, StepwiseJudge) else "critic"
        self.publish = publish
        self.counts: Counter[str] = Counter()

    def __call__(self, batch: list[ConsumedEvent]) -> Iterable[tuple[ConsumedEvent, str]]:
        out: list[Envelope] = []
        rejected: list[tuple[ConsumedEvent, str]] = []
        for consumed in batch:
            scored = scored_to_label(consumed.event.payload)
            if scored is None:
                self.counts["skipped_by_selection"] += isinstance(consumed.event.payload, SolutionSelected)
                continue
            if not scored.steps or not scored.problem:
                reason = "no steps" if not scored.steps else "no problem text (scored by an older scorer)"
                rejected.append((consumed, f"{scored.solution_id}: cannot be judged: {reason}"))
                continue
            if isinstance(self.judge, ExactVerifier):
                verdict = self.judge.judge_question(scored.question_id, scored.steps)
                if verdict.beyond_limits:
                    # Not poison: a solution too large to check gets "undecided", like any it cannot read.
                    self.counts["beyond_limits"] += 1
                    log.warning("judge: %s left undecided: %s", scored.solution_id, verdict.reason)
                outcome: SolutionJudgment | CriticVerdict | ExactVerdict = verdict
            else:
                outcome = self.judge.judge(scored.problem, scored.steps)
            out.append(
                judged_event(
                    scored,
                    outcome,
                    self.judge_ref,
                    method=self.method,
                    parameters=self.judge.parameters(),
                    causation_id=consumed.event.event_id,
                )
            )
            if isinstance(outcome, ExactVerdict):
                self.counts["undecided"] += not outcome.decided
            else:
                self.counts["generated_tokens"] += outcome.generated_tokens
                self.counts["unparsed"] += outcome.unparsed
        if out:
            self.publish(out)
        self.counts["judged"] += len(out)
        self.counts["rejected"] += len(rejected)
        return rejected


def stepwise_judge(settings: JudgeSettings, engine: JudgeEngine) -> StepwiseJudge:
    """The step-wise judge ``settings`` describe, on ``engine``."""
    return StepwiseJudge(
        engine,
        samples=settings.samples,
        temperature=settings.temperature,
        prediction_temperature=settings.prediction_temperature,
        max_new_tokens=settings.max_new_tokens,
        all_steps=settings.all_steps,
        seed=settings.seed,
    )


def critic(settings: JudgeSettings, engine: JudgeEngine, *, max_new_tokens: int | None = None) -> Critic:
    """The whole-solution critic ``settings`` describe, on ``engine``."""
    return Critic(
        engine,
        samples=settings.critic_samples,
        temperature=settings.temperature,
        max_new_tokens=max_new_tokens or settings.max_new_tokens,
        seed=settings.seed,
    )


def build_judge(settings: JudgeSettings) -> tuple[StepwiseJudge | Critic | ExactVerifier, ModelRef]:
    """The judge ``settings`` describe, on its backend (loaded once; ``exact`` loads no model)."""
    if settings.method == "exact":
        return ExactVerifier(settings.strictness), ModelRef(backend="exact", name=EXACT_JUDGE_NAME)
    engine = build_backend(settings.backend_config())
    ref = ModelRef(backend=settings.backend, name=engine.model_name)
    judge = critic(settings, engine) if settings.method == "critic" else stepwise_judge(settings, engine)
    return judge, ref


def run_judge(
    settings: JudgeSettings,
    *,
    bootstrap_servers: str,
    kafka: KafkaSettings | None = None,
    until: Callable[[], bool] | None = None,
    install_signal_handlers: bool = True,
    components: tuple[StepwiseJudge | Critic | ExactVerifier, ModelRef] | None = None,
) -> dict[str, Any]:
    """Run the judge until SIGTERM/SIGINT, ``until()``, ``settings.until_idle`` seconds without input, or
    ``settings.max_solutions`` judged. ``components`` replaces :func:`build_judge` (a judge already built)."""
    started = time.monotonic()
    judge, ref = components or build_judge(settings)
    producer = EventProducer(bootstrap_servers, kafka=kafka)
    handler = JudgeHandler(judge, ref, producer.publish)
    limit = settings.max_solutions
    return run_service(
        "judge",
        handler,
        topics=[settings.topic],
        group_id=settings.group,
        bootstrap_servers=bootstrap_servers,
        counters=lambda: dict(handler.counts),
        kafka=kafka,
        max_batch=1,
        until=until,
        done=lambda: limit is not None and handler.counts["judged"] >= limit,
        idle_timeout_s=settings.until_idle,
        install_signal_handlers=install_signal_handlers,
        close=[producer.close],
        started=started,
    ).as_dict()
