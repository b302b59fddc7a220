"""The consensus filter: ``steps.labeled`` + ``steps.judged`` -> ``labels.accepted`` / ``labels.rejected``.

Qwen "Lessons of Developing PRMs" (Sec. 3.1 "Stringent Data Filtering Mechanisms", Sec. 4.1): MC
estimation is noisy about *where* a solution goes wrong, so "the instances are only retained when both
LLM-as-a-judge and MC estimation show consensus on the error reasoning step locations". That rule is
:func:`labels_decision`, pure; the first check that fails is the reason (steps 0-based):

1. both events cover the same steps (``"step counts differ: MC 5, judge 4"``);
2. the judge gave a verdict on every step before its first error (on all when it found none): ``None``
   is not "no error" (``"judge gave no verdict on step k (its reason)"``); a wrong one there would
   contradict its own ``first_error_step``;
3. the first errors agree (``"first errors disagree: MC 2, judge 4"``; ``none``: no error);
4. with ``entropy_threshold``, the judge's CoT entropy at its first error (the largest over its steps
   when it found none) is at most the threshold, else it abstains (``"judge uncertain: CoT entropy
   0.91 > 0.5 ..."``), also when its event has no entropy. Last, so it only turns accepts into rejects.
Decisions carry the MC labels (the paper's hard labels; none when no MC label came). The join: events
come in any order, late, twice, or superseded. The first pair decides, weighing the newest
(``occurred_at``) waiting event of each side; later events of a decided solution are counted (``late``),
never re-decided. With ``max_wait`` a half whose partner has not come is rejected (``"no judge verdict
within 30 s"``) after that many wall-clock seconds held here, counted from when it was stored or from
the service's (re)start, so a backlog read after downtime is not timed out unread.

Durability: state in SQLite, ``$PRMLOOP_HOME/consensus/<group>.sqlite3``. Per batch one transaction
stores the new events (idempotent by ``event_id``) and records the decisions they complete (with
deterministic ids); then every decision not yet acknowledged is published (at start-up too) and marked,
and the runtime commits the offsets. Killed anywhere, nothing is lost or decided twice: redelivered
records are no-ops, a re-published decision keeps its id. SQLite, not DuckDB: one host's processes of a
group share the file (a transaction locks it briefly), so a rebalance between them keeps waiting halves.

Scaling out: with equal partition counts a key lands in the same partition number of both topics, and
kafka-python's default range assignor gives partition p of both to one member: label and verdict meet
in one process (:func:`run_consensus` refuses unequal counts). Hosts do not share state: a partition
moving between hosts strands its waiting halves (``max_wait`` rejects them): keep a group on one host.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prmloop.consumers.consensus_state import JoinState
from prmloop.store.events import (
    Envelope,
    LabelsAccepted,
    LabelsRejected,
    StepsJudged,
    StepsLabeled,
    deterministic_event_id,
    make_event,
)
from prmloop.store.events.codec import encode_event
from prmloop.store.kafka.producer import EventProducer
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.kafka.service import run_service
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = ["Consensus", "ConsensusSettings", "JoinState", "labels_decision", "run_consensus"]

log = logging.getLogger(__name__)

PRODUCER = "prmloop.consensus/1"
CONSENSUS_GROUP = "prmloop-consensus"


class ConsensusSettings(BaseSettings):
    """Options of the consensus filter (``prmloop consensus``; environment ``PRMLOOP_CONSENSUS_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_CONSENSUS_", frozen=True, extra="ignore")

    entropy_threshold: float | None = Field(
        default=None,
        ge=0.0,
        description="abstain (reject) when the judge's CoT entropy at its first error (its largest when it found "
        "none) is above this; unset: off",
    )
    max_wait: float | None = Field(
        default=None,
        gt=0.0,
        description="seconds (wall clock) a label or verdict may wait for its partner before rejection; unset: forever",
    )
    group: str = Field(default=CONSENSUS_GROUP, description="consumer group; names the state file <group>.sqlite3")
    labeled_topic: str = Field(default=StepsLabeled.TOPIC, description="read MC labels from this topic")
    judged_topic: str = Field(default=StepsJudged.TOPIC, description="read judge verdicts from this topic")
    state_dir: Path | None = Field(default=None, description="join state folder (default $PRMLOOP_HOME/consensus)")
    max_batch: int = Field(default=500, ge=1, description="events per batch (one state transaction each)")
    until_idle: float | None = Field(default=None, gt=0, description="exit after this many seconds without input")
    session_timeout: float = Field(
        default=10.0, ge=1.0, description="seconds until the group gives a silent (killed) member's partitions away"
    )

    def state_path(self) -> Path:
        folder = self.state_dir if self.state_dir is not None else StateSettings().home / "consensus"
        return folder / ("".join(c if c.isalnum() or c in "-_." else "_" for c in self.group) + ".sqlite3")

    def rule(self) -> str:
        return consensus_rule(self.entropy_threshold, self.max_wait)


def consensus_rule(entropy_threshold: float | None, max_wait_s: float | None) -> str:
    """The ``rule`` of every decision: the rule's name and parameters (part of the decisions' ids)."""
    return f"first_error_agreement(entropy_threshold={entropy_threshold}, max_wait_s={max_wait_s})"


# ------------------------------------------------------------------------------------------------ the rule


@dataclass(frozen=True)
class Decision:
    accept: bool
    reason: str | None = None


def _step(value: int | None) -> str:
    return "none" if value is None else str(value)


def judge_entropy(judged: StepsJudged) -> tuple[float | None, str]:
    """The judge's CoT entropy that decides abstention, and where it was read (for the reason).

    At its first-error step; when it found no error, the largest over its judged steps (``judgments``,
    else the older ``step_entropy`` list). ``None``: the event carries none there.
    """
    per_step = {j.step_index: j.cot_entropy for j in judged.judgments if j.cot_entropy is not None}
    if not per_step and judged.step_entropy is not None:
        per_step = {i: h for i, h in enumerate(judged.step_entropy) if h is not None}
    if judged.first_error_step is not None:
        return per_step.get(judged.first_error_step), f"at its first error, step {judged.first_error_step}"
    if not per_step:
        return None, "over its steps"
    return max(per_step.values()), f"the largest over its {len(per_step)} judged steps"


def labels_decision(labeled: StepsLabeled, judged: StepsJudged, *, entropy_threshold: float | None = None) -> Decision:
    """Accept the MC labels only when MC and the judge agree on the first error (Qwen "Lessons", Sec. 3.1).

    The order of the checks and the reasons are in the module docstring.
    """
    n, m, first = len(labeled.labels), len(judged.verdicts), judged.first_error_step
    if n != m:
        return Decision(False, f"step counts differ: MC {n}, judge {m}")
    if first is not None and first >= m:
        return Decision(False, f"judge's first error, step {first}, is outside its {m} verdicts")
    for k, verdict in enumerate(judged.verdicts[: m if first is None else first]):
        if verdict is None:
            return Decision(
                False, f"judge gave no verdict on step {k}" + (f" ({judged.reason})" if judged.reason else "")
            )
        if not verdict:
            return Decision(False, f"judge's verdicts contradict its first error {_step(first)}: step {k} is wrong")
    if labeled.first_error_step != first:
        return Decision(False, f"first errors disagree: MC {_step(labeled.first_error_step)}, judge {_step(first)}")
    if entropy_threshold is not None:
        entropy, where = judge_entropy(judged)
        if entropy is None:
            return Decision(
                False, f"judge uncertainty unknown: no CoT entropy {where} (threshold {entropy_threshold:g})"
            )
        if entropy > entropy_threshold:
            return Decision(False, f"judge uncertain: CoT entropy {entropy:.3g} > {entropy_threshold:g} ({where})")
    return Decision(True)


def decision_event(decision: Decision, waited: Sequence[Envelope], *, rule: str, causation_id: Any = None) -> Envelope:
    """``LabelsAccepted``/``LabelsRejected`` on the weighed events ``waited`` (MC first, when present).

    Its id is (type, solution, rule, weighed event ids): the same inputs always give the same decision.
    """
    first = waited[0].payload
    assert isinstance(first, StepsLabeled | StepsJudged)
    labeled = first if isinstance(first, StepsLabeled) else None
    source_ids = tuple(e.event_id for e in waited)
    kind, extra = (LabelsAccepted, {}) if decision.accept else (LabelsRejected, {"reason": decision.reason or ""})
    payload = kind(
        solution_id=first.solution_id,
        question_id=first.question_id,
        labels=labeled.labels if labeled else (),
        first_error_step=labeled.first_error_step if labeled else None,
        source_event_ids=source_ids,
        rule=rule,
        **extra,
    )
    event_id = deterministic_event_id(payload.event_type, first.solution_id, rule, [str(i) for i in source_ids])
    return make_event(payload, producer=PRODUCER, event_id=event_id, causation_id=causation_id)


class Consensus:
    """Batch handler: store a batch's labels and verdicts, record the decisions, publish them, return.

    ``publish`` sends a list of events and returns once they are acknowledged (``EventProducer.publish``).
    Anything but ``StepsLabeled``/``StepsJudged`` is dead-lettered with the reason.
    """

    def __init__(
        self,
        state: JoinState,
        publish: Callable[[list[Envelope]], object],
        *,
        entropy_threshold: float | None = None,
        max_wait_s: float | None = None,
    ) -> None:
        self.state = state
        self.publish = publish
        self.entropy_threshold = entropy_threshold
        self.max_wait_s = max_wait_s
        self.rule = consensus_rule(entropy_threshold, max_wait_s)
        names = ("received", "duplicates", "late", "accepted", "rejected", "timed_out", "published", "wrong_type")
        self.counts: dict[str, int] = dict.fromkeys(names, 0)
        self._publish_lock = threading.Lock()
        self._last_sweep = 0.0

    def __call__(self, batch: list[ConsumedEvent]) -> list[tuple[ConsumedEvent, str]]:
        inputs: list[tuple[Envelope, str, str, bytes]] = []
        rejected: list[tuple[ConsumedEvent, str]] = []
        for c in batch:
            payload = c.event.payload
            if isinstance(payload, StepsLabeled | StepsJudged):
                side = "mc" if isinstance(payload, StepsLabeled) else "judge"
                inputs.append((c.event, payload.solution_id, side, c.body or encode_event(c.event)))
            else:
                reason = f"consensus joins StepsLabeled and StepsJudged, not {c.event.event_type} (on {c.topic})"
                rejected.append((c, reason))
        out = self.state.ingest(inputs, self._decide)
        for name in ("duplicates", "late"):
            self.counts[name] += out[name]
        self.counts["received"] += out["new"] + out["late"]
        self.counts["wrong_type"] += len(rejected)
        self._count(out["decisions"])
        self.flush()
        return rejected

    def _count(self, decisions: Iterable[Envelope]) -> None:
        for event in decisions:
            self.counts["accepted" if isinstance(event.payload, LabelsAccepted) else "rejected"] += 1

    def _decide(self, waiting: Sequence[Envelope], cause: Envelope) -> Envelope:
        """A pair is weighed by the rule; a lone half (``max_wait`` passed) is rejected."""
        first = waiting[0].payload
        if len(waiting) == 2:
            labeled, judged = first, waiting[1].payload
            assert isinstance(labeled, StepsLabeled) and isinstance(judged, StepsJudged)
            decision = labels_decision(labeled, judged, entropy_threshold=self.entropy_threshold)
        else:
            missing = "judge verdict" if isinstance(first, StepsLabeled) else "MC label"
            decision = Decision(False, f"no {missing} within {self.max_wait_s:g} s")
        return decision_event(decision, waiting, rule=self.rule, causation_id=cause.event_id)

    def expire(self, now: float | None = None) -> int:
        """Reject the halves that waited longer than ``max_wait_s``, and publish; returns how many."""
        if self.max_wait_s is None:
            return 0
        made = self.state.expire(self.max_wait_s, self._decide, now=now)
        self.counts["timed_out"] += len(made)
        self._count(made)
        self.flush()
        return len(made)

    def tick(self, interval_s: float = 0.5) -> None:
        """Between batches (the runtime's ``until``): time out waiting halves; a failure is retried later."""
        if self.max_wait_s is None or time.monotonic() - self._last_sweep < min(interval_s, self.max_wait_s / 4):
            return
        self._last_sweep = time.monotonic()
        try:
            self.expire()
        except Exception as exc:  # noqa: BLE001 - retried at the next tick
            log.warning("consensus: timing out waiting solutions failed (%r); retrying", exc)

    def flush(self) -> int:
        """Publish every recorded decision not yet acknowledged (this or an earlier run's), then mark it."""
        total = 0
        with self._publish_lock:
            while events := self.state.unpublished():
                self.publish(events)
                self.state.mark_published(events)
                total += len(events)
        self.counts["published"] += total
        return total

    def counters(self) -> dict[str, int]:
        return {**self.counts, **self.state.totals()}


class TopicLayoutError(RuntimeError):
    """The two input topics cannot be joined (one is missing, or their partition counts differ)."""


def check_copartitioned(bootstrap_servers: str, topics: Sequence[str], kafka: KafkaSettings | None = None) -> int:
    """The topics' common partition count; :class:`TopicLayoutError` if one is missing or they differ."""
    consumer = KafkaConsumer(**(kafka or KafkaSettings()).client_kwargs(bootstrap_servers), enable_auto_commit=False)
    counts: dict[str, int] = {}
    try:
        for topic in topics:
            deadline = time.monotonic() + 15
            while (ids := consumer.partitions_for_topic(topic)) is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if not ids:
                raise TopicLayoutError(f"topic {topic!r} does not exist: create the topics first (`prmloop topics`)")
            counts[topic] = len(ids)
    finally:
        consumer.close()
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{t} has {n}" for t, n in counts.items())
        raise TopicLayoutError(
            f"the consensus join needs its topics partitioned alike ({listed} partitions) so that a solution's "
            "label and verdict reach the same process; recreate them with one partition count"
        )
    return next(iter(counts.values()))


def run_consensus(
    settings: ConsensusSettings,
    *,
    bootstrap_servers: str,
    kafka: KafkaSettings | None = None,
    until: Callable[[], bool] | None = None,
    install_signal_handlers: bool = True,
    outbox_dir: Path | None = None,
) -> dict[str, int]:
    """Run the consensus filter until SIGTERM/SIGINT, ``until()``, or ``settings.until_idle`` idle seconds.

    Decisions an earlier run recorded but never saw acknowledged are published first. ``outbox_dir``:
    also append every decision to an outbox there (``prmloop reconcile`` after an in-memory broker
    restart). Returns this run's counters (``received``, ``duplicates``, ``late``, ``accepted``,
    ``rejected``, ``timed_out``, ``published``, ``wrong_type``), the state's totals (``waiting``,
    ``accepted_total``, ``rejected_total``) and the runtime's ``batches`` and ``dead_lettered``.
    """
    from prmloop.store.kafka.outbox import Outbox

    kafka = kafka or KafkaSettings()
    topics = [settings.labeled_topic, settings.judged_topic]
    check_copartitioned(bootstrap_servers, topics, kafka)
    state = JoinState(settings.state_path())
    outbox = Outbox(outbox_dir, name="consensus") if outbox_dir is not None else None
    producer = EventProducer(bootstrap_servers, kafka=kafka, outbox=outbox)
    try:
        handler = Consensus(
            state, producer.publish, entropy_threshold=settings.entropy_threshold, max_wait_s=settings.max_wait
        )
        handler.flush()
    except BaseException:
        producer.close()
        state.close()
        raise
    counters: dict[str, int] = {}

    def done() -> bool:
        handler.tick()  # times out lone halves between batches; never stops the service
        return False

    def closing() -> None:
        counters.update(handler.counters())  # read before the state closes
        producer.close()
        state.close()

    stats = run_service(
        "consensus",
        handler,
        topics=topics,
        group_id=settings.group,
        bootstrap_servers=bootstrap_servers,
        counters=lambda: counters,
        kafka=kafka,
        max_batch=settings.max_batch,
        until=until,
        done=done,
        idle_timeout_s=settings.until_idle,
        install_signal_handlers=install_signal_handlers,
        close=[closing],
        session_timeout_ms=(timeout_ms := int(settings.session_timeout * 1000)),
        max_poll_interval_ms=timeout_ms,  # the rebalance timeout: Tansu delays joins by about half of it
    )
    return stats.as_dict()
