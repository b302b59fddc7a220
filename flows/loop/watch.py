"""What the streaming loop's driver watches while it runs: the events as they arrive, the engine's own
metrics, and the memory of every process.

- :class:`EventWatch` reads the loop's topics from their end at start (only this run's events), with
  no consumer group (it commits nothing and slows no service), and keeps counts, generated tokens and
  each stage's activity over time: the view's labels per minute, the retrainer's trigger (new accepted
  labels) and the proof that the stages ran at once (:func:`overlap`).
- :class:`EngineMeter` polls the vLLM engine's Prometheus ``/metrics`` every half second: the engine is
  busy while ``vllm:num_requests_running`` is above zero; the busy fraction is busy samples over all
  samples, from the engine's own gauge rather than the loop's idea of what it sent.
- :class:`CommittedOffsets`: what a consumer group has finished (the memory and CPU of the loop's
  processes: :mod:`prmloop.flows.loop.processes`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prmloop.store.events import (
    LabelsAccepted,
    LabelsRejected,
    ModelRegistered,
    SolutionSampled,
    SolutionSelected,
    StepsJudged,
    StepsLabeled,
    StepsScored,
)
from prmloop.store.events.codec import decode_stored_form
from prmloop.store.settings import KafkaSettings

__all__ = [
    "STAGE_OF",
    "CommittedOffsets",
    "EngineMeter",
    "EventWatch",
    "StageTimeline",
    "overlap",
    "paced_width",
]

log = logging.getLogger(__name__)

#: The stage that produces each watched event type (the view and the overlap measure name stages).
STAGE_OF: dict[str, str] = {
    "SolutionSampled": "sample",
    "StepsScored": "score",
    "SolutionSelected": "select",
    "StepsLabeled": "annotate",
    "StepsJudged": "judge",
    "LabelsAccepted": "consensus",
    "LabelsRejected": "consensus",
    "ModelRegistered": "retrain",
}
WATCHED_TOPICS: tuple[str, ...] = tuple(
    dict.fromkeys(
        t.TOPIC
        for t in (
            SolutionSampled,
            StepsScored,
            SolutionSelected,
            StepsLabeled,
            StepsJudged,
            LabelsAccepted,
            LabelsRejected,
            ModelRegistered,
        )
    )
)
#: Seconds per bucket of the activity timeline: a feed publishes its solutions together every few tens
#: of seconds, so a bucket this wide sees every stage of a loop that streams.
BUCKET_S = 30.0
#: Every bucket width the overlap is also counted in: a slower engine spaces each stage's events wider,
#: and :func:`paced_width` picks the one that fits a run's own pace.
OVERLAP_WIDTHS_S: tuple[float, ...] = (BUCKET_S, 60.0, 120.0, 240.0)
#: Events of the sparsest stage a bucket should hold on average for its overlap to say anything.
EVENTS_PER_BUCKET = 2.0
#: The stages whose activity in one bucket counts as running at once (:func:`overlap`).
OVERLAP_STAGES: tuple[str, ...] = ("sample", "annotate", "consensus")
#: Seconds per bucket of the engine meter's busy samples.
METER_BUCKET_S = 5.0
#: Seconds of accepted labels kept with their times (the view's recent rate); older ones are counted only.
RECENT_S = 600.0
#: Distinct rejection reasons counted one by one; the rest as "other".
MAX_REASONS = 50


class StageTimeline:
    """Which :data:`OVERLAP_STAGES` stages produced in each ``width_s`` bucket: two counts and the bucket in
    progress, so a run of days keeps it small (events arrive in order of time)."""

    def __init__(self, width_s: float) -> None:
        self.width_s = width_s
        self.active = 0
        self.together = 0
        self.bucket = -1
        self.stages: set[str] = set()

    def add(self, at: float, stage: str) -> None:
        bucket = int(at // self.width_s)
        if bucket != self.bucket:
            self._close()
            self.bucket, self.stages = bucket, set()
        self.stages.add(stage)

    def _close(self) -> None:
        self.active, self.together = self._counts()

    def _counts(self) -> tuple[int, int]:
        """Buckets with any stage and with every stage, the bucket in progress included."""
        if not self.stages:
            return self.active, self.together
        return self.active + 1, self.together + all(s in self.stages for s in OVERLAP_STAGES)

    def overlap(self) -> float:
        """Buckets with every stage over buckets with any (the bucket in progress included)."""
        active, together = self._counts()
        return together / active if active else 0.0

    def copy(self) -> StageTimeline:
        out = StageTimeline(self.width_s)
        out.active, out.together, out.bucket, out.stages = self.active, self.together, self.bucket, set(self.stages)
        return out


def paced_width(stage_events: dict[str, int], wall_s: float) -> float | None:
    """The narrowest :data:`OVERLAP_WIDTHS_S` width whose buckets hold on average at least
    :data:`EVENTS_PER_BUCKET` events of the sparsest stage over ``wall_s`` (``None``: none does). On a fast
    engine that is 30 s; where each stage produces more slowly, a wider bucket, so the overlap measures
    whether the stages ran at once, not how fast the machine is."""
    sparsest = min(stage_events.values(), default=0)
    for width in OVERLAP_WIDTHS_S:
        if sparsest and wall_s / sparsest * EVENTS_PER_BUCKET <= width:
            return width
    return None


@dataclass
class WatchTotals:
    """What the loop produced since the watch started: counters only, so a run of days keeps it small."""

    counts: Counter[str] = field(default_factory=Counter)
    sampled_tokens: int = 0
    rollout_tokens: int = 0
    correct_solutions: int = 0
    accepted_errors: int = 0
    #: times (seconds after start) of the accepted labels of the last :data:`RECENT_S` seconds
    recent_accepted: list[float] = field(default_factory=list)
    #: accepted labels per 10-minute window, in order
    accepted_windows: list[int] = field(default_factory=list)
    reject_reasons: Counter[str] = field(default_factory=Counter)
    labels_by_method: Counter[str] = field(default_factory=Counter)
    #: the activity timeline in buckets of each :data:`OVERLAP_WIDTHS_S` width
    timelines: dict[float, StageTimeline] = field(
        default_factory=lambda: {w: StageTimeline(w) for w in OVERLAP_WIDTHS_S}
    )
    #: accepted labels per 10-minute window and curriculum level (``L1`` ...; ``other`` off the curriculum)
    accepted_levels: list[Counter[str]] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return self.sampled_tokens + self.rollout_tokens

    @property
    def accepted(self) -> int:
        return self.counts["LabelsAccepted"]

    def stage_overlap(self, width_s: float = BUCKET_S) -> float:
        """Buckets of ``width_s`` in which every :data:`OVERLAP_STAGES` stage produced, over buckets with any
        event: 0 for a loop that runs stage after stage, near 1 for one that streams."""
        return self.timelines[width_s].overlap()

    def stage_events(self) -> dict[str, int]:
        """Events of each :data:`OVERLAP_STAGES` stage so far."""
        out = dict.fromkeys(OVERLAP_STAGES, 0)
        for event_type, n in self.counts.items():
            stage = STAGE_OF.get(event_type)
            if stage in out:
                out[stage] += n
        return out

    def add_stage(self, at: float, stage: str) -> None:
        """A ``stage`` event ``at`` seconds after start, in every width's timeline."""
        for timeline in self.timelines.values():
            timeline.add(at, stage)

    def add_accepted(self, at: float, question_id: str = "") -> None:
        window = int(at // RECENT_S)
        while len(self.accepted_windows) <= window:
            self.accepted_windows.append(0)
        self.accepted_windows[window] += 1
        while len(self.accepted_levels) <= window:
            self.accepted_levels.append(Counter())
        self.accepted_levels[window][level_of(question_id)] += 1
        self.recent_accepted.append(at)
        if self.recent_accepted[0] < at - RECENT_S:
            self.recent_accepted = [t for t in self.recent_accepted if t >= at - RECENT_S]

    def copy(self) -> WatchTotals:
        return WatchTotals(
            Counter(self.counts),
            self.sampled_tokens,
            self.rollout_tokens,
            self.correct_solutions,
            self.accepted_errors,
            list(self.recent_accepted),
            list(self.accepted_windows),
            Counter(self.reject_reasons),
            Counter(self.labels_by_method),
            {w: t.copy() for w, t in self.timelines.items()},
            [Counter(c) for c in self.accepted_levels],
        )


class EventWatch:
    """Count the loop's events as they arrive (a thread; :meth:`snapshot` is safe from any other)."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        kafka: KafkaSettings | None = None,
        topics: Sequence[str] = WATCHED_TOPICS,
        started: float | None = None,
    ) -> None:
        """``started``: the ``time.monotonic()`` its times count from (the loop's start)."""
        self.bootstrap_servers = bootstrap_servers
        self.kafka = kafka or KafkaSettings()
        self.topics = tuple(topics)
        self.started = time.monotonic() if started is None else started
        self._totals = WatchTotals()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-watch", daemon=True)
        self.error: str | None = None

    def start(self, timeout_s: float = 30.0) -> EventWatch:
        self._thread.start()
        self._ready.wait(timeout_s)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def snapshot(self) -> WatchTotals:
        with self._lock:
            return self._totals.copy()

    def _run(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        try:
            consumer = KafkaConsumer(**self.kafka.client_kwargs(self.bootstrap_servers), enable_auto_commit=False)
            parts = [TopicPartition(t, p) for t in self.topics for p in sorted(consumer.partitions_for_topic(t) or ())]
            consumer.assign(parts)
            consumer.seek_to_end(*parts)
            for tp in parts:
                consumer.position(tp)  # resolve the end now: only events from here on are this run's
        except Exception as exc:  # noqa: BLE001 - the view goes without counts; the loop still runs
            self.error = f"the event watch could not start: {type(exc).__name__}: {exc}"
            log.warning("%s", self.error)
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                batches = consumer.poll(timeout_ms=500, max_records=500)
                for records in batches.values():
                    self.count(r.value for r in records)
        except Exception as exc:  # noqa: BLE001
            self.error = f"the event watch stopped: {type(exc).__name__}: {exc}"
            log.warning("%s", self.error)
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def count(self, values: Iterable[bytes | None], now: float | None = None) -> None:
        """Count the events of these records as arriving ``now`` seconds after start (default: now)."""
        now = time.monotonic() - self.started if now is None else now
        for value in values:
            try:
                event, _ = decode_stored_form(value or b"")
            except Exception:  # noqa: BLE001 - a bad record is the dead-letter topics' business
                continue
            p = event.payload
            with self._lock:
                t = self._totals
                t.counts[event.event_type] += 1
                stage = STAGE_OF.get(event.event_type)
                if stage:
                    t.add_stage(now, stage)
                if isinstance(p, SolutionSampled):
                    t.sampled_tokens += int(p.completion_tokens)
                    t.correct_solutions += p.correct is True
                elif isinstance(p, StepsLabeled):
                    t.rollout_tokens += int(p.cost.generated_tokens)
                    t.labels_by_method[p.method] += 1
                elif isinstance(p, LabelsAccepted):
                    t.add_accepted(now, p.question_id)
                    t.accepted_errors += p.first_error_step is not None
                elif isinstance(p, LabelsRejected):
                    kind = _reason_kind(p.reason)
                    if kind not in t.reject_reasons and len(t.reject_reasons) >= MAX_REASONS:
                        kind = "other"
                    t.reject_reasons[kind] += 1


def level_of(question_id: str) -> str:
    """``L3`` for a curriculum question id (``arith/L3/<seed>/<index>``), else ``other``."""
    parts = question_id.split("/")
    if len(parts) == 4 and parts[1][:1] == "L" and parts[1][1:].isdigit():
        return parts[1]
    return "other"


def _reason_kind(reason: str | None) -> str:
    """A rejection reason without its step numbers, to count alike reasons together."""
    if not reason:
        return "unknown"
    return " ".join("N" if w.strip(",.:").isdigit() else w for w in reason.split())[:80]


def overlap(activity: dict[int, set[str]], stages: Sequence[str] = OVERLAP_STAGES) -> float:
    """The fraction of active buckets in which every one of ``stages`` produced an event: 0 for a loop
    that runs stage after stage (rounds), near 1 for one whose stages run at once."""
    active = [b for b, seen in activity.items() if seen]
    if not active:
        return 0.0
    together = sum(all(s in activity[b] for s in stages) for b in active)
    return together / len(active)


class EngineMeter:
    """Poll the engine's ``/metrics``: busy samples, generation tokens and prefix-cache hits over time.

    Busy samples are kept per ``METER_BUCKET_S`` bucket (busy, taken), so memory grows by a few bytes a
    bucket however long the loop runs; the token counter's history is kept for the last few minutes.
    """

    def __init__(self, url: str, interval_s: float = 0.5, started: float | None = None) -> None:
        """``started``: the ``time.monotonic()`` its times count from (the loop's start)."""
        self.url = url  # replicas: their URLs comma-separated, their metrics summed
        self.interval_s = interval_s
        self.buckets: dict[int, list[int]] = {}
        self.tokens: list[tuple[float, float]] = []
        self.last: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.started = time.monotonic() if started is None else started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-meter", daemon=True)

    def start(self) -> EngineMeter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        from prmloop.flows.ops.engine import read_metrics

        while not self._stop.wait(self.interval_s):
            try:
                metrics = read_metrics(self.url)
            except OSError:
                continue
            self.record(time.monotonic() - self.started, metrics)

    def record(self, at: float, metrics: dict[str, float]) -> None:
        """One sample of the engine's metrics taken ``at`` seconds after start."""
        if not self.first:
            self.first = metrics
        self.last = metrics
        bucket = self.buckets.setdefault(int(at // METER_BUCKET_S), [0, 0])
        bucket[0] += metrics.get("requests_running", 0.0) > 0
        bucket[1] += 1
        self.tokens.append((at, metrics.get("generation_tokens", 0.0)))
        if len(self.tokens) > 1200:
            del self.tokens[:600]

    def busy_fraction(self, since_s: float = 0.0, until_s: float | None = None) -> float | None:
        """Busy samples over all samples taken between ``since_s`` and ``until_s`` (seconds after start,
        to the bucket)."""
        first = int(max(0.0, since_s) // METER_BUCKET_S)
        last = None if until_s is None else int(until_s // METER_BUCKET_S)
        chosen = [v for k, v in list(self.buckets.items()) if k >= first and (last is None or k <= last)]
        taken = sum(v[1] for v in chosen)
        return sum(v[0] for v in chosen) / taken if taken else None

    def rate(self, window_s: float) -> float | None:
        """Generated tokens per second over the last ``window_s`` seconds."""
        tokens = list(self.tokens)
        if len(tokens) < 2:
            return None
        end = tokens[-1]
        start = next((t for t in tokens if t[0] >= end[0] - window_s), tokens[0])
        return (end[1] - start[1]) / (end[0] - start[0]) if end[0] > start[0] else None

    def generated_tokens(self) -> int:
        return int(self.last.get("generation_tokens", 0.0) - self.first.get("generation_tokens", 0.0))

    def prefix_cache_hit_rate(self) -> float | None:
        queries = self.last.get("prefix_cache_queries", 0.0) - self.first.get("prefix_cache_queries", 0.0)
        hits = self.last.get("prefix_cache_hits", 0.0) - self.first.get("prefix_cache_hits", 0.0)
        return hits / queries if queries > 0 else None


class CommittedOffsets:
    """The sum of a group's committed offsets on a topic (the records it has finished), polled cheaply."""

    def __init__(self, servers: str, group: str, topic: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self._consumer = KafkaConsumer(
            **KafkaSettings().client_kwargs(servers), group_id=group, enable_auto_commit=False
        )
        self._parts = [TopicPartition(topic, p) for p in sorted(self._consumer.partitions_for_topic(topic) or ())]
        self._lock = threading.Lock()

    def total(self) -> int:
        with self._lock:
            try:
                return sum(int(self._consumer.committed(tp) or 0) for tp in self._parts)
            except Exception:  # noqa: BLE001 - a broker hiccup: count nothing new this tick
                return 0

    def close(self) -> None:
        with self._lock:
            self._consumer.close()
