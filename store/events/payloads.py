"""The payloads of events: one class per event type, each with its ``SCHEMA_VERSION`` and topic, and the
value records they share (:class:`ModelRef`, :class:`SamplingSpec`, ...).

Producers forbid unknown fields (a typo is a bug and fails loudly); consumers ignore them (a newer
producer may add an optional field before every consumer is upgraded). Both use the same classes:
constructing a record in Python checks the field names, decoding JSON ignores the unknown ones.

Every number and time has a type of :mod:`prmloop.store.events.bounds` (``Int32``, ``Count64``, ``Real``,
``EventTime``, ``JsonData``, ...): what the store's columns and views hold, so an event the schema
accepts can always be stored, read through every view and exported. New payloads use them too.
"""

from __future__ import annotations

import uuid
from typing import Annotated, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prmloop.store.events.bounds import Count32, Count64, Int32, Int64, JsonData, NonNegReal, Real

__all__ = [
    "EVENT_NAMESPACE",
    "CalibrationFitted",
    "CostLedger",
    "LabelsAccepted",
    "LabelsRejected",
    "MCEstimate",
    "ModelRef",
    "ModelRegistered",
    "Payload",
    "QuestionPrioritized",
    "QuestionRegistered",
    "Record",
    "SampleAsRollout",
    "SamplingSpec",
    "SolutionSampled",
    "SolutionSelected",
    "SolutionUncertainty",
    "StepJudgment",
    "StepsJudged",
    "StepsLabeled",
    "StepsScored",
    "UnknownFieldError",
    "scored_to_label",
    "unknown_fields",
]

#: Namespace of deterministic event ids: the same logical fact always gets the same id, which is what
#: makes re-running a flow or restarting a consumer publish nothing new.
EVENT_NAMESPACE = uuid.UUID("6f1c2b0e-4d53-5a8e-9a57-1f0c2e7d9b31")


class UnknownFieldError(ValueError):
    pass


class Record(BaseModel):
    """Base of every payload and nested record: frozen; unknown fields are kept aside, never used.

    ``extra="allow"`` keeps validation entirely in pydantic's compiled core (the sink validates tens
    of thousands of events a second). Consumers simply never read the extras; producers are held to
    the schema by :func:`make_event`, which refuses any record that carries one.
    """

    model_config = ConfigDict(frozen=True, extra="allow")


def unknown_fields(record: BaseModel, path: str = "") -> list[str]:
    """Dotted paths of every field in ``record`` (recursively) that its class does not declare."""
    found = [f"{path}{name}" for name in (record.model_extra or {})]
    for name in type(record).model_fields:
        value = getattr(record, name)
        items = value if isinstance(value, tuple | list) else (value,)
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                suffix = f"[{i}]" if isinstance(value, tuple | list) else ""
                found.extend(unknown_fields(item, f"{path}{name}{suffix}."))
    return found


class ModelRef(Record):
    """Which model produced something: enough to reproduce it."""

    backend: str = Field(description="engine: transformers, vllm, openai, simulator, ...")
    name: str = Field(description="model name or path, e.g. SmolLM2-135M-Instruct")
    revision: str | None = Field(default=None, description="weights hash, adapter id or version tag")


class SamplingSpec(Record):
    """Sampling parameters of a generation or rollout call."""

    temperature: Real = 0.7
    top_p: Real = 1.0
    max_new_tokens: Int64 = 512
    seed: Int64 | None = None
    n: Int64 = 1
    stop: tuple[str, ...] = ()


class SolutionUncertainty(Record):
    """Token-level uncertainty of one whole sampled solution (UnPRM section 3), what selection ranks by.

    Per-step uncertainty u(s_t) is not here: the step scorer owns it (``StepsScored``).
    """

    entropy: Real | None = Field(default=None, description="UnPRM u = -sum z_i log z_i over the solution")
    mean_nll: Real | None = Field(default=None, description="mean negative log-likelihood per token")
    perplexity: Real | None = None
    answer_dispersion: Real | None = Field(
        default=None, description="entropy of the final-answer distribution across the k samples"
    )


class MCEstimate(Record):
    """One Monte-Carlo estimate of a state s_t (EpicPRM Eq. 1-2)."""

    step_index: Annotated[Int32, Field(ge=-1)] = Field(description="-1 is the empty prefix s_0")
    value: Real
    rollouts: Count64
    correct_rollouts: Count64
    weighted: bool = Field(default=False, description="True for MC-PPL (perplexity-weighted), False for hard MC")


class CostLedger(Record):
    """What a label cost: the figures the papers compare strategies by (EpicPRM Table 2)."""

    verified_steps: Count64 = 0
    rollouts: Count64 = 0
    generated_tokens: Count64 = 0
    wall_time_s: NonNegReal = 0.0
    failures: dict[str, Count64] = Field(
        default_factory=dict, description="counted, never crashed on: max_tokens, unparseable, completer_error"
    )


class Payload(Record):
    """Base of event payloads. Subclasses set ``event_type`` (the discriminator) and ``SCHEMA_VERSION``."""

    SCHEMA_VERSION: ClassVar[int] = 1
    #: Topic the event is published to (see :mod:`prmloop.store.events.topics`).
    TOPIC: ClassVar[str]

    def correlation_id(self) -> str:
        """The question or solution this event concerns; it is the Kafka key, so order is kept."""
        for name in ("solution_id", "question_id", "model_id", "calibration_id"):
            value = getattr(self, name, None)
            if value:
                return str(value)
        raise NotImplementedError(f"{type(self).__name__} has no correlation id field")


class QuestionRegistered(Payload):
    event_type: Literal["QuestionRegistered"] = "QuestionRegistered"
    TOPIC: ClassVar[str] = "questions.registered"

    question_id: str
    dataset: str
    problem: str
    gold_answer: str | None = None
    source: str | None = Field(default=None, description="file and line, or data set and index")
    metadata: dict[str, JsonData] = Field(default_factory=dict)


class QuestionPrioritized(Payload):
    event_type: Literal["QuestionPrioritized"] = "QuestionPrioritized"
    TOPIC: ClassVar[str] = "questions.prioritized"

    question_id: str
    priority: Real
    round: Count32
    signals: dict[str, Real] = Field(default_factory=dict, description="the uncertainty terms behind priority")
    prm: ModelRef | None = None


class SolutionSampled(Payload):
    event_type: Literal["SolutionSampled"] = "SolutionSampled"
    TOPIC: ClassVar[str] = "solutions.sampled"

    solution_id: str
    question_id: str
    problem: str | None = Field(
        default=None, description="the question's text, so no consumer has to look it up (None: older producers)"
    )
    generator: ModelRef
    sampling: SamplingSpec
    prompt_format: str = Field(description="step format: step_k, double_newline, chat")
    text: str
    steps: tuple[str, ...]
    step_token_offsets: tuple[Int64, ...] | None = Field(
        default=None, description="token index where each step starts in the completion"
    )
    token_logprobs: tuple[Real, ...] | None = Field(
        default=None, description="log-prob of every generated token, or None when token_logprobs_ref is set"
    )
    token_logprobs_ref: str | None = Field(default=None, description="where large log-prob arrays are stored")
    final_answer: str | None = None
    correct: bool | None = Field(default=None, description="None: not graded or unparseable")
    gold_answer: str | None = None
    uncertainty: SolutionUncertainty | None = None
    selected_by: str | None = Field(default=None, description="selection strategy that kept this solution")
    completion_tokens: Count64 = 0
    metadata: dict[str, JsonData] = Field(
        default_factory=dict, description="where an imported solution came from (file, its id, a reference label)"
    )


class SampleAsRollout(Record):
    """A sampled solution seen as one rollout from its question (the state ``s_0``): who drew it, how,
    and its log-probability, so the annotator can count it in ``MC(s_0)`` instead of drawing anew."""

    generator: ModelRef
    temperature: Real
    top_p: Real = 1.0
    completion_tokens: Count64
    sum_logprob: Real = Field(description="sum of the generator's log-probs of the completion's tokens")


class StepsScored(Payload):
    """A solution with the uncertainty of each step: the step scorer's output and the annotator's and
    judge's input. It carries the solution as they need it (problem, steps, grade, gold answer), so
    nothing downstream reads ``solutions.sampled`` or ``questions.registered`` on the side."""

    event_type: Literal["StepsScored"] = "StepsScored"
    TOPIC: ClassVar[str] = "steps.scored"

    solution_id: str
    question_id: str
    scorer: ModelRef
    step_uncertainty: tuple[Real, ...] | None = Field(
        description="u(s_t) for t = 1..T; None: unknown (no log-probs and no model to teacher-force)"
    )
    uncertainty_delta: tuple[Real, ...] | None = Field(description="Δu(s_t) = u(s_t) - u(s_{t-1})")
    step_order: tuple[Count32, ...] | None = Field(description="step indices by descending Δu (UnPRM Algorithm 1)")
    temperature: Real | None = Field(default=None, description="T of the softmax u was computed with")
    source: str | None = Field(default=None, description="sampled (generator log-probs), teacher_forced or none")
    problem: str | None = None
    steps: tuple[str, ...] = ()
    prompt_format: str = "step_k"
    correct: bool | None = None
    final_answer: str | None = None
    gold_answer: str | None = None
    as_rollout: SampleAsRollout | None = Field(
        default=None,
        description="the solution as a rollout from its question, for MC(s_0); None: no generator log-probs",
    )


class SolutionSelected(Payload):
    """Whether a scored solution is worth its labels, decided by the promoted ensemble PRM (ActPRM's
    rule, in the models layer's prm/active.py): the annotator and the judge read this topic and label only
    ``decision == "label"``. It carries the scored solution whole, so they read nothing on the side; a
    newer PRM may decide again on a solution an older one skipped (a new event, a new id)."""

    event_type: Literal["SolutionSelected"] = "SolutionSelected"
    TOPIC: ClassVar[str] = "steps.selected"

    solution_id: str
    question_id: str
    decision: Literal["label", "skip"]
    reason: str = Field(description="the verdict in words: which step was least confident, and how")
    prm: ModelRef | None = Field(default=None, description="the ensemble PRM that decided; None: none promoted yet")
    rule: str = Field(default="actprm", description="actprm (both uncertainties), epistemic, aleatoric or none")
    thresholds: dict[str, Real] = Field(default_factory=dict, description="delta, std_max, tau")
    score: Real | None = Field(default=None, description="largest relative uncertainty of a checked step")
    checked_steps: Count32 = Field(default=0, description="steps checked: through the first predicted error")
    step_mean: tuple[Real, ...] = Field(default=(), description="per step: the heads' mean P(correct)")
    step_std: tuple[Real, ...] = Field(default=(), description="per step: the heads' standard deviation")
    scored: StepsScored


def scored_to_label(payload: Payload) -> StepsScored | None:
    """The scored solution a labeller should work on: a ``StepsScored`` as is, a ``SolutionSelected``'s
    own when its decision is "label", nothing otherwise."""
    if isinstance(payload, StepsScored):
        return payload
    if isinstance(payload, SolutionSelected):
        return payload.scored if payload.decision == "label" else None
    return None


class StepsLabeled(Payload):
    event_type: Literal["StepsLabeled"] = "StepsLabeled"
    TOPIC: ClassVar[str] = "steps.labeled"

    solution_id: str
    question_id: str
    method: str = Field(description="sequential, binary, adaptive_binary, uncertainty_driven, all_correct, ...")
    parameters: dict[str, JsonData] = Field(default_factory=dict)
    labels: tuple[bool, ...]
    soft_labels: tuple[Real, ...] | None = None
    first_error_step: Count32 | None = Field(default=None, description="0-based; None: every step correct")
    mc_estimates: tuple[MCEstimate, ...] = ()
    completers: tuple[ModelRef, ...] = ()
    cost: CostLedger = Field(default_factory=CostLedger)

    @model_validator(mode="after")
    def _first_error_consistent(self) -> Self:
        if self.first_error_step is not None and self.first_error_step >= len(self.labels):
            raise ValueError(
                f"first_error_step {self.first_error_step} is outside the {len(self.labels)} labelled steps"
            )
        return self


class StepJudgment(Record):
    """The judge's verdict on one step and how sure it was (CoT Entropy paper, Sec. 2.3-5).

    ``has_error`` is the prediction from one low-temperature sample (Eq. 4) and ``p_error`` its
    normalised decision-token probability (Eq. 5); the uncertainties come from ``samples``
    high-temperature rationales: CoT Entropy (Eq. 7), its discrete variant, naive entropy, and the
    split of the predictive entropy into epistemic and aleatoric parts (Eq. 9).
    """

    step_index: Count32
    has_error: bool | None = Field(description="None: the judgment was not valid JSON (never guessed)")
    p_error: Real | None = None
    cot_entropy: Real | None = None
    cot_entropy_discrete: Real | None = None
    naive_entropy: Real | None = None
    epistemic: Real | None = None
    aleatoric: Real | None = None
    samples: Count64 = Field(default=0, description="high-temperature rationales drawn")
    unparsed: Count32 = Field(default=0, description="of those, how many were not valid JSON")
    rationale_digest: str | None = Field(default=None, description="sha256 of the prediction's rationale")


class StepsJudged(Payload):
    """An LLM judge's verdict on a solution's steps: per step (``stepwise``) or its first wrong
    paragraph (``critic``, the ProcessBench protocol)."""

    event_type: Literal["StepsJudged"] = "StepsJudged"
    TOPIC: ClassVar[str] = "steps.judged"

    solution_id: str
    question_id: str
    judge: ModelRef
    method: str = Field(default="stepwise", description="stepwise (CoT judge per step) or critic (whole solution)")
    parameters: dict[str, JsonData] = Field(default_factory=dict)
    verdicts: tuple[bool | None, ...] = Field(
        description="per step, as labels are: True = no error found; None = not judged or no valid verdict"
    )
    first_error_step: Count32 | None = Field(default=None, description="None: the judge found no error")
    step_entropy: tuple[Real | None, ...] | None = Field(default=None, description="CoT entropy per step")
    judgments: tuple[StepJudgment, ...] = ()
    cost: CostLedger = Field(default_factory=CostLedger)
    reason: str | None = Field(default=None, description="the judge's reason in words (the exact checker's)")


class _ConsensusDecision(Payload):
    solution_id: str
    question_id: str
    labels: tuple[bool, ...]
    first_error_step: Count32 | None = None
    source_event_ids: tuple[uuid.UUID, ...] = Field(description="the labelled/judged events weighed")
    rule: str = Field(description="consensus rule and its parameters")


class LabelsAccepted(_ConsensusDecision):
    event_type: Literal["LabelsAccepted"] = "LabelsAccepted"
    TOPIC: ClassVar[str] = "labels.accepted"


class LabelsRejected(_ConsensusDecision):
    event_type: Literal["LabelsRejected"] = "LabelsRejected"
    TOPIC: ClassVar[str] = "labels.rejected"

    reason: str


class ModelRegistered(Payload):
    event_type: Literal["ModelRegistered"] = "ModelRegistered"
    TOPIC: ClassVar[str] = "models.registered"

    model_id: str
    kind: Literal["prm", "prm_ensemble", "generator", "judge"]
    base_model: ModelRef
    artifact_uri: str = Field(description="where the adapter or weights are stored")
    dataset_snapshot: str = Field(description="the query or hash of the training set")
    train_examples: Count64
    parameters: dict[str, JsonData] = Field(default_factory=dict)
    metrics: dict[str, Real] = Field(default_factory=dict)
    signature: str | None = Field(default=None, description="hmac-sha256 by prmloop's key (store/auth/signing.py)")


class CalibrationFitted(Payload):
    event_type: Literal["CalibrationFitted"] = "CalibrationFitted"
    TOPIC: ClassVar[str] = "calibrations.fitted"

    calibration_id: str
    generator: str
    prm: str
    score_rule: str = Field(description="min, prod, last, ...")
    method: str = Field(description="logit, linear, kde, wrf, ...")
    fit: dict[str, JsonData] = Field(description="fitted parameters (b, alpha, KDE grid, ...)")
    calibration_split: str
    metrics: dict[str, Real] = Field(default_factory=dict)
    signature: str | None = Field(default=None, description="hmac-sha256 by prmloop's key (store/auth/signing.py)")
