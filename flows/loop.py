"""``prmloop run``: the loop as a stream, every service at once on one engine, retraining as labels arrive.

It starts what ``prmloop up`` starts (the machine's vLLM engine where it is ready, the broker, the sink,
the scorer, selector, annotator, judge and consensus services, the Prefect server and the process
serving the deployments) and then drives the loop from this process:

- **feeding** (:mod:`prmloop.flows.feed`): whenever fewer than ``ahead`` sampled solutions wait for the
  annotator (counted exactly: solutions this run published less the annotator group's committed
  offsets), one ``feed`` flow run probes ``probe_batch`` new questions and tops up the best of the
  queue (``order=priority``), or samples new questions in the order they come (``order=random``).
  The backlog never grows past about ``ahead`` plus one feed: backpressure from consumer lag;
- **retraining**: ``retrain_every`` new accepted labels, or ``retrain_seconds`` with at least one new,
  start a ``retrain`` flow run of the ensemble PRM on every accepted label, scored on the held-out set
  (``eval_set``: by default the model's own solutions to questions the loop never samples, with the
  curriculum checker's exact first errors, made once and cached). A promoted PRM is picked up by the
  selector (it looks the registry up every few seconds) and by the next feed's prioritizer, without a
  restart;
- **calibrating** the aggregation every ``calibrate_minutes`` (a ``calibrate`` flow run);
- **watching** (:mod:`prmloop.flows.loop_watch`): this run's events as they arrive, the engine's own
  busy gauge, and the memory of every process; :mod:`prmloop.flows.loop_view` shows them live.

It runs until stopped (Ctrl-C or SIGTERM) or for ``minutes``. Stopping is clean: no new work starts,
the feed and retrain in flight finish, the model-using services stop with their offsets committed
(their unfinished solutions are picked up by the next run), and the broker, the sink and the Prefect
server keep running so that nothing published is lost and the UI stays up (``prmloop down`` stops them).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from prmloop.flows.loop_watch import EngineMeter, EventWatch, overlap, rss_mib
from prmloop.models.questions import Question
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = ["KEEP_RUNNING", "LOOP_SERVICES", "Loop", "LoopError", "LoopSettings", "QuestionStream"]

log = logging.getLogger(__name__)

#: What the loop starts, in ``prmloop up``'s order (the engine when there is one).
LOOP_SERVICES: tuple[str, ...] = (
    "broker",
    "sink",
    "scorer",
    "selector",
    "annotator",
    "judge",
    "consensus",
    "prefect",
    "deployments",
)
#: What keeps running when the loop stops: nothing published is lost, the UI stays up.
KEEP_RUNNING: frozenset[str] = frozenset({"broker", "sink", "prefect", "deployments"})


class LoopError(RuntimeError):
    """The loop cannot run as asked (one line, said to the user)."""


class LoopSettings(BaseSettings):
    """Options of the streaming loop (``prmloop run``; environment ``PRMLOOP_LOOP_*``)."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_LOOP_", frozen=True, extra="ignore")

    minutes: float | None = Field(
        default=None, gt=0, description="stop after this many minutes (default: run until stopped)"
    )
    engine: Literal["auto", "vllm", "transformers"] = Field(
        default="auto", description="auto: the machine's vLLM engine where `make vllm` made it ready, else transformers"
    )
    levels: str = Field(default="1,2", description="arith curriculum levels the loop samples, e.g. 1,2")
    seed: int = Field(default=0, description="question and sampling seed (the held-out set uses another)")
    order: Literal["priority", "random"] = Field(
        default="priority", description="priority: probe new questions and top up the best; random: as they come"
    )
    k: int = Field(default=4, ge=1, description="solutions per question (its probes among them)")
    probe_k: int = Field(default=2, ge=1, description="probe samples of each new question (order=priority)")
    probe_batch: int = Field(default=6, ge=1, description="new questions per feed")
    top_up_batch: int = Field(default=3, ge=0, description="queued questions topped up per feed (order=priority)")
    ahead: int = Field(
        default=12, ge=1, description="sampled solutions waiting for the annotator, at most, before a feed"
    )
    retrain_every: int = Field(default=10, ge=1, description="retrain after this many new accepted labels")
    retrain_seconds: float = Field(default=90.0, gt=0, description="or after this many seconds with a new one")
    min_labels: int = Field(default=6, ge=1, description="accepted labels before the first retrain")
    calibrate_minutes: float | None = Field(default=30.0, gt=0, description="calibrate the aggregation this often")
    eval_set: str = Field(default="arith", description="the retrained PRM's held-out set (arith, arith-reference)")
    eval_questions: int = Field(default=8, ge=1, description="held-out questions per level")
    in_flight: int = Field(default=4, ge=1, description="solutions the annotator searches at once")
    rollout_tokens: int = Field(default=128, ge=16, description="MC rollout budget in tokens")
    max_new_tokens: int = Field(default=192, ge=16, description="sampling budget per solution in tokens")
    threads: int | None = Field(default=None, ge=1, description="torch threads of in-process models")

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

    @property
    def level_list(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.levels.split(","))

    def service_environment(self) -> dict[str, str]:
        """The services' settings this loop asks for (a variable the user exported wins)."""
        return {
            "PRMLOOP_ANNOTATOR_STRATEGY": "adaptive_binary",
            "PRMLOOP_ANNOTATOR_N0": "4",
            "PRMLOOP_ANNOTATOR_N_MIN": "2",
            "PRMLOOP_ANNOTATOR_N_MAX": "8",
            "PRMLOOP_ANNOTATOR_MAX_NEW_TOKENS": str(self.rollout_tokens),
            "PRMLOOP_ANNOTATOR_IN_FLIGHT": str(self.in_flight),
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
    from prmloop.store.duck import QueryError, StoreLocked, query, store_exists

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


@dataclass
class LoopStatus:
    """What the view shows; updated by the driver's threads."""

    started: float = field(default_factory=time.monotonic)
    engine: str = "transformers"
    engine_url: str | None = None
    ui: str | None = None
    home: Path | None = None
    feeds: int = 0
    feed_running: bool = False
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

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class Loop:
    """The streaming loop's driver (see the module docstring): :meth:`start`, :meth:`run`, :meth:`stop`."""

    def __init__(
        self,
        settings: LoopSettings,
        *,
        home: Path,
        say: Callable[[str], None] = print,
        use_prefect: bool = True,
        services: tuple[str, ...] = LOOP_SERVICES,
        engine_url: str | None = None,
    ) -> None:
        """``engine_url``: a running vLLM engine to use (the bench's arms share one), else the home's or a
        new one; ``services``: what to start (the bench shares one Prefect server between its arms)."""
        self.s = settings
        self.engine_url = engine_url
        self.home = home
        self.say = say
        self.use_prefect = use_prefect
        self.services = services
        self.state = StateSettings(home=home)
        self.db = self.state.store_location
        self.status = LoopStatus(home=home)
        self.started_services: list[str] = []
        self.servers = ""
        self.watch: EventWatch | None = None
        self.meter: EngineMeter | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._queue: dict[str, tuple[float, Question]] = {}
        self._annotated_at_start = 0
        self._last_retrain_at = 0.0
        self._accepted_at_retrain = 0
        self._committed: _CommittedOffsets | None = None
        self.stream = QuestionStream(settings.level_list, settings.seed)

    # -- start ---------------------------------------------------------------------------------------
    def start(self) -> None:
        from prmloop.flows.stack import prefect_api_url, read_state, up

        self.home.mkdir(parents=True, exist_ok=True)
        os.environ["PRMLOOP_HOME"] = str(self.home)
        for key, value in self.s.service_environment().items():
            os.environ.setdefault(key, value)
        wanted = list(self.services)
        engine_url = self.engine_url or self._engine_url()
        if engine_url is None and self.start_engine():
            wanted.insert(0, "engine")
        if engine_url is not None:
            self._use_engine(engine_url)
        if self.s.threads is not None:
            os.environ.setdefault("PRMLOOP_ENGINE_THREADS", str(self.s.threads))
        result = up(wanted, state=self.state, say=self.say)
        self.started_services = list(result["started"])
        if engine_url is None:
            record = read_state(self.state, "engine")
            if record is not None and record.alive and record.url:
                engine_url = record.url
                self._use_engine(engine_url)
        if engine_url is not None:
            self.status.engine, self.status.engine_url = "vllm", engine_url
            self.meter = EngineMeter(engine_url).start()
        url = prefect_api_url(self.state)
        if url and self.use_prefect:
            os.environ["PREFECT_API_URL"] = url
            self.status.ui = url.removesuffix("/api")
        from prmloop.store.broker import find_bootstrap_servers

        servers = find_bootstrap_servers(KafkaSettings(), self.state)
        if not servers:
            raise LoopError(f"no broker: `prmloop up` did not start one (see {self.home / 'logs' / 'broker.log'})")
        self.servers = servers
        self.watch = EventWatch(servers).start()
        self._committed = _CommittedOffsets(servers, _annotator_group(), _annotator_topic())
        self._annotated_at_start = self._committed.total()
        self.status.accepted_before = _accepted_in_store(self.db)
        self._accepted_at_retrain = self.status.accepted_before
        self.stream = QuestionStream(self.s.level_list, self.s.seed, sampled_indices(self.db, self.s.seed))
        self._background("held-out", self._prepare_heldout)

    def start_engine(self) -> bool:
        """Whether to start the vLLM engine (none runs): yes where it is ready, unless ``engine`` is
        transformers; where it is not, ``engine=auto`` says why and goes on with transformers.

        Raises:
            LoopError: ``engine=vllm`` and vLLM is not ready here.
        """
        if self.s.engine == "transformers":
            return False
        reason = _engine_unavailable()
        if reason is None:
            return True
        if self.s.engine == "vllm":
            raise LoopError(f"--engine vllm: the vLLM engine is not available ({reason}); or --engine transformers")
        self.say(f"engine: vLLM unavailable ({reason}): transformers in each service instead")
        return False

    @staticmethod
    def _use_engine(url: str) -> None:
        """Point what starts from here (services, feeds) at the engine; settings the user gave stay."""
        from prmloop.flows.engine import service_environment

        for key, value in service_environment(url).items():
            os.environ.setdefault(key, value)

    def _engine_url(self) -> str | None:
        from prmloop.flows.stack import read_state

        if self.s.engine == "transformers":
            return None
        record = read_state(self.state, "engine")
        return record.url if record is not None and record.alive and record.url else None

    # -- run -----------------------------------------------------------------------------------------
    def run(self, on_tick: Callable[[], None] | None = None, tick_s: float = 1.0) -> None:
        """Drive the loop until :meth:`request_stop` or ``minutes``; ``on_tick`` refreshes a view."""
        deadline = None if self.s.minutes is None else self.status.started + 60.0 * self.s.minutes
        next_rss = 0.0
        every = self.s.calibrate_minutes
        next_calibration = None if every is None else self.status.started + min(300.0, 60 * every)
        while not self._stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            self._maybe_feed()
            self._maybe_retrain(now)
            if next_calibration is not None and now >= next_calibration and not self._busy("calibrate"):
                self._background("calibrate", self._calibrate)
                next_calibration = now + 60.0 * (self.s.calibrate_minutes or 30.0)
            if now >= next_rss:
                self._sample_rss()
                next_rss = now + 30.0
            if on_tick is not None:
                on_tick()
            self._stop.wait(tick_s)

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, *, keep: frozenset[str] = KEEP_RUNNING, wait_s: float = 120.0) -> None:
        """Let the feed and retrain in flight finish, stop the services this run started (but ``keep``)."""
        from prmloop.flows.stack import down

        self._stop.set()
        self.status.stopping = True
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._sample_rss()
        for part in (self.meter, self.watch):
            if part is not None:
                part.stop()
        if self._committed is not None:
            self._committed.close()
        stop = [s for s in self.started_services if s not in keep]
        if stop:
            down(stop, state=self.state, say=self.say)

    # -- feeding -------------------------------------------------------------------------------------
    def waiting(self) -> int:
        """Solutions this run published that the annotator has not finished (exact: committed offsets)."""
        done = self._committed.total() - self._annotated_at_start if self._committed else 0
        return max(0, self.status.published - done)

    def _maybe_feed(self) -> None:
        if self._busy("feed"):
            return
        self.status.waiting = self.waiting()
        if self.status.waiting >= self.s.ahead:
            return
        probe, top_up = self._next_batch()
        self.status.feed_running = True
        self._background("feed", lambda: self._feed(probe, top_up))

    def _next_batch(self) -> tuple[list[Question], list[Question]]:
        if self.s.order == "random":
            return [], self.stream.take(self.s.probe_batch)
        ranked = sorted(self._queue.items(), key=lambda kv: (-kv[1][0], kv[0]))[: self.s.top_up_batch]
        for question_id, _ in ranked:
            del self._queue[question_id]
        return self.stream.take(self.s.probe_batch), [q for _, (_, q) in ranked]

    def _feed(self, probe: list[Question], top_up: list[Question]) -> None:
        from prmloop.flows.feed import FeedSettings, run_feed

        settings = FeedSettings(
            **_sampling_engine(),
            k=self.s.k,
            probe_k=self.s.probe_k if self.s.order == "priority" else 0,
            max_new_tokens=self.s.max_new_tokens,
            seed=self.s.seed,
            threads=self.s.threads,
            prm=Path(self.status.prm) if self.status.prm and self.s.order == "priority" else None,
        )
        try:
            out = run_feed(probe, top_up, settings, bootstrap_servers=self.servers, prefect=self.use_prefect)
        finally:
            self.status.feed_running = False
        by_id = {q.id: q for q in probe}
        for row in out["probed"]:
            question = by_id.get(row["question_id"])
            if question is not None:
                self._queue[question.id] = (float(row["priority"]), question)
        self.status.published += int(out["solutions"])
        self.status.feeds += 1
        self.status.queue = len(self._queue)

    # -- retraining ----------------------------------------------------------------------------------
    def accepted(self) -> int:
        """Accepted labels in the store: before this run, and this run's as they arrive."""
        seen = self.watch.snapshot().counts["LabelsAccepted"] if self.watch else 0
        return self.status.accepted_before + seen

    def _maybe_retrain(self, now: float) -> None:
        if self._busy("retrain"):
            return
        accepted = self.accepted()
        new = accepted - self._accepted_at_retrain
        if accepted < self.s.min_labels or new < 1:
            return
        since = now - max(self._last_retrain_at, self.status.started)
        if new >= self.s.retrain_every or since >= self.s.retrain_seconds:
            self._accepted_at_retrain = accepted
            self._last_retrain_at = now
            self.status.retraining = True
            self._background("retrain", lambda: self._retrain(accepted))

    def _retrain(self, accepted: int) -> None:
        from prmloop.flows.retrain import run_retrain
        from prmloop.models.prm.model import PRMConfig

        started = time.monotonic()
        tokens = self.watch.snapshot().generated_tokens if self.watch else 0
        time.sleep(2.0)  # the sink stores the newest accepted labels within a batch or two
        try:
            summary = run_retrain(
                prefect=self.use_prefect,
                db=str(self.db),
                kind="accepted",
                prm_kind="ensemble",
                eval_set=self.s.eval_set,
                eval_limit=self.s.eval_questions,
                out_dir=str(self.home / "prm"),
                min_examples=1,
                ratios=(1.0, 0.0, 0.0),
                config=PRMConfig(threads=1),
                bootstrap_servers=self.servers,
            )
        finally:
            self.status.retraining = False
        at = started - self.status.started
        wall = time.monotonic() - started
        if not summary.get("trained"):
            reason = str(summary.get("reason"))
            self.status.retrains.append(Retrain(at, accepted, None, False, None, wall, reason, tokens))
            return
        metrics = summary["metrics"]
        f1 = float(metrics.get("heldout_f1", 0.0))
        trained_on = int(metrics.get("train_solutions", accepted))
        promoted = bool(summary["promoted"])
        self.status.retrains.append(
            Retrain(at + wall, trained_on, f1, promoted, summary["model_id"], wall, None, tokens)
        )
        if summary["promoted"]:
            self.status.prm = summary["artifact"]

    def _prepare_heldout(self) -> None:
        from prmloop.flows.retrain_ensemble import eval_items

        eval_items(self.s.eval_set, limit=self.s.eval_questions, threads=self.s.threads)

    def _calibrate(self) -> None:
        from prmloop.flows.calibrate import calibrate_and_publish

        if calibrate_and_publish(self.home, self.servers, say=self.say):
            self.status.calibrations += 1

    # -- plumbing ------------------------------------------------------------------------------------
    def _background(self, name: str, work: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                work()
            except Exception as exc:  # one failed job is reported, the loop goes on
                self.status.last_error = f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                log.exception("%s failed", name)

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _busy(self, name: str) -> bool:
        return any(t.name == name and t.is_alive() for t in self._threads)

    def _sample_rss(self) -> None:
        from prmloop.flows.stack import running_services

        at = self.status.elapsed()
        for name, record in running_services(self.state).items():
            rss = rss_mib(record.pid)
            if rss is not None:
                self.status.rss.setdefault(name, []).append((round(at, 1), rss))
        own = rss_mib(os.getpid())
        if own is not None:
            self.status.rss.setdefault("driver", []).append((round(at, 1), own))

    # -- results -------------------------------------------------------------------------------------
    def result(self, warm_up_s: float = 60.0) -> dict[str, Any]:
        """The run in figures: what the bench, the demo's summary and the soak report."""
        wall = self.status.elapsed()
        totals = self.watch.snapshot() if self.watch else None
        accepted = len(totals.accepted_at) if totals else 0
        tokens = totals.generated_tokens if totals else 0
        engine_tokens = self.meter.generated_tokens() if self.meter else None
        trained = [r for r in self.status.retrains if r.f1 is not None]
        return {
            "engine": self.status.engine,
            "wall_s": round(wall, 1),
            "accepted_labels": accepted,
            "accepted_with_error": totals.accepted_errors if totals else 0,
            "rejected_labels": totals.counts["LabelsRejected"] if totals else 0,
            "mc_labels": totals.counts["StepsLabeled"] if totals else 0,
            "solutions": totals.counts["SolutionSampled"] if totals else 0,
            "accepted_per_minute": round(accepted / (wall / 60.0), 3) if wall > 0 else 0.0,
            "generated_tokens": tokens,
            "engine_generated_tokens": engine_tokens,
            "accepted_per_1k_tokens": round(1000.0 * accepted / tokens, 3) if tokens else 0.0,
            "engine_busy_fraction": _round(self.meter.busy_fraction(since_s=warm_up_s) if self.meter else None),
            "engine_busy_fraction_all": _round(self.meter.busy_fraction() if self.meter else None),
            "prefix_cache_hit_rate": _round(self.meter.prefix_cache_hit_rate() if self.meter else None),
            "f1_curve": [[round(r.at_s, 1), round(r.f1, 4)] for r in trained if r.f1 is not None],
            "retrains": [r.__dict__ for r in self.status.retrains],
            "feeds": self.status.feeds,
            "stage_overlap": round(overlap(totals.activity), 3) if totals else 0.0,
            "reject_reasons": dict(totals.reject_reasons.most_common(5)) if totals else {},
            "rss_mib": self.status.rss,
            "errors": [self.status.last_error] if self.status.last_error else [],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _engine_unavailable() -> str | None:
    from prmloop.flows.engine import engine_unavailable

    return engine_unavailable()


def _sampling_engine() -> dict[str, Any]:
    """The sampler's engine as ``up`` set it for the services (``PRMLOOP_SAMPLE_*``)."""
    out: dict[str, Any] = {}
    for key in ("backend", "model", "base_url"):
        value = os.environ.get(f"PRMLOOP_SAMPLE_{key.upper()}")
        if value:
            out[key] = value
    return out


def _annotator_group() -> str:
    from prmloop.consumers.annotator import AnnotatorSettings

    return AnnotatorSettings().group


def _annotator_topic() -> str:
    from prmloop.consumers.annotator import AnnotatorSettings

    return AnnotatorSettings().topic


def _accepted_in_store(db: Path | str) -> int:
    from prmloop.store.duck import QueryError, StoreLocked, query, store_exists

    if not store_exists(db):
        return 0
    try:
        return int(query(db, "SELECT count(*) FROM consensus WHERE decision = 'accepted'", timeout_s=30).rows[0][0])
    except (QueryError, StoreLocked, FileNotFoundError):
        return 0


class _CommittedOffsets:
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
