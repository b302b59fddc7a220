"""``prmloop run``: the loop as a stream, every service at once on one engine, retraining as labels arrive.

It starts what ``prmloop up`` starts (the machine's vLLM engine where it is ready, the broker, the sink,
the scorer, selector, annotator, judge and consensus services, the Prefect server and the process
serving the deployments) and then drives the loop from this process:

- **feeding** (:mod:`prmloop.flows.feed`): whenever fewer than ``ahead`` sampled solutions wait for the
  annotator (counted exactly: solutions this run published less the annotator group's committed
  offsets), one ``feed`` flow run probes ``probe_batch`` new questions and tops up the best of the
  queue (``order=priority``), or samples new questions in the order they come (``order=random``).
  Up to ``feeds`` run at once, so the next feed's questions are sampled while the last one's slowest
  solutions finish; a feed still sampling counts as the solutions it will publish, so the backlog
  never grows past about ``ahead`` plus one feed: backpressure from consumer lag;
- **retraining**: ``retrain_every`` new accepted labels, or ``retrain_seconds`` with at least one new,
  start a ``retrain`` flow run of the ensemble PRM on every accepted label, promoted on the validation set
  and scored on the shipped test set (:mod:`prmloop.flows.pools.testset`); the validation set
  (``eval_set``: by default the model's own solutions to questions of another seed than the loop's and
  the test set's, with the curriculum checker's exact first errors, shipped for the embedded model, else
  made once and cached). A promoted PRM is picked up by the
  selector (it looks the registry up every few seconds) and by the next feed's prioritizer, without a
  restart;
- **calibrating** the aggregation every ``calibrate_minutes`` (a ``calibrate`` flow run);
- **watching** (:mod:`prmloop.flows.loop.watch`): this run's events as they arrive, the engine's own
  busy gauge, and the memory of every process; :mod:`prmloop.flows.loop.view` shows them live.

It runs until stopped (Ctrl-C or SIGTERM), for ``minutes``, or until ``until_retrains`` retrains have
scored on the held-out set (whichever first). Stopping is clean: no new work starts,
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
from pathlib import Path

from prmloop.flows.loop.feeding import MAX_QUEUE, LoopFeeding
from prmloop.flows.loop.report import LoopReport
from prmloop.flows.loop.settings import LoopError, LoopSettings, LoopStatus, QuestionStream, Retrain, sampled_indices
from prmloop.flows.loop.watch import (
    CommittedOffsets,
    EngineMeter,
    EventWatch,
)
from prmloop.flows.ops.services import SERVICES
from prmloop.models.backends.request_log import REQUEST_LOG_VARIABLE
from prmloop.models.questions import Question
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = ["KEEP_RUNNING", "LOOP_SERVICES", "MAX_QUEUE", "Loop", "LoopError", "LoopSettings", "QuestionStream"]

log = logging.getLogger(__name__)

#: What the loop starts, in ``prmloop up``'s order (the engine when there is one).
LOOP_SERVICES: tuple[str, ...] = tuple(s for s in SERVICES if s != "engine")
#: the run's figures the learning-curve artifact shows (:func:`~prmloop.flows.monitor.publish_curve`)
CURVE_FIGURES = ("accepted_labels", "accepted_per_minute", "engine_busy_fraction", "f1_curve")
#: What keeps running when the loop stops: nothing published is lost, the UI stays up.
KEEP_RUNNING: frozenset[str] = frozenset({"broker", "sink", "prefect", "deployments"})


class Loop(LoopReport, LoopFeeding):
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
        self._trained_snapshot: str | None = None  # the last trained retrain's snapshot (its labels)
        self._committed: CommittedOffsets | None = None
        # batches of failed feeds, tried again first; the lock guards them, the queue and the counts the
        # feeds' threads update (``feeds`` of them may run at once)
        self._retry_batches: list[tuple[list[Question], list[Question]]] = []
        self._feed_lock = threading.Lock()
        self._feed_retry_at = 0.0
        self._feed_backoff_s = 0.0
        self.stream = QuestionStream(settings.level_list, settings.seed)

    # -- start ---------------------------------------------------------------------------------------
    def start(self) -> None:
        from prmloop.flows.ops.services import prefect_api_url, read_state
        from prmloop.flows.ops.stack import up

        self.home.mkdir(parents=True, exist_ok=True)
        os.environ["PRMLOOP_HOME"] = str(self.home)
        for key, value in self.s.service_environment().items():
            os.environ.setdefault(key, value)
        if self.s.record_requests:  # the services inherit it (models/backends/request_log.py)
            os.environ[REQUEST_LOG_VARIABLE] = str(self.home / "requests")
        wanted = list(self.services)
        engine_url = self.engine_url or self._engine_url()
        if engine_url is None and self.start_engine():
            wanted.insert(0, "engine")
        if engine_url is not None:
            self._use_engine(engine_url)
        if self.s.threads is not None:
            os.environ.setdefault("PRMLOOP_ENGINE_THREADS", str(self.s.threads))
        if "engine" in wanted:
            os.environ.setdefault("PRMLOOP_ENGINE_REPLICAS", str(_loop_replicas()))
        result = up(wanted, state=self.state, say=self.say)
        self.started_services = list(result["started"])
        if engine_url is None:
            record = read_state(self.state, "engine")
            if record is not None and record.alive and record.url:
                engine_url = record.url
                self._use_engine(engine_url)
        if engine_url is not None:
            self.status.engine, self.status.engine_url = "vllm", engine_url
            self.meter = EngineMeter(engine_url, started=self.status.started).start()
            if self.s.threads is None:
                import torch

                # The engine has the cores; this process's models (the PRM's backbone: features for the
                # retrains and the prioritizer) run on one thread beside it, as the services' do.
                torch.set_num_threads(1)
        url = prefect_api_url(self.state)
        if url and self.use_prefect:
            os.environ["PREFECT_API_URL"] = url
            self.status.ui = url.removesuffix("/api")
        from prmloop.store.kafka.broker_file import find_bootstrap_servers

        servers = find_bootstrap_servers(KafkaSettings(), self.state)
        if not servers:
            raise LoopError(f"no broker: `prmloop up` did not start one (see {self.home / 'logs' / 'broker.log'})")
        self.servers = servers
        self.watch = EventWatch(servers, started=self.status.started).start()
        self._committed = CommittedOffsets(servers, _annotator_group(), _annotator_topic())
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

    def _use_engine(self, url: str) -> None:
        """Point what starts from here (services, feeds) at the engine, with its API key (this loop's
        home's credentials); settings the user gave stay."""
        from prmloop.flows.ops.engine import service_environment

        for key, value in service_environment(url, self.home).items():
            os.environ.setdefault(key, value)

    def _engine_url(self) -> str | None:
        from prmloop.flows.ops.services import read_state

        if self.s.engine == "transformers":
            return None
        record = read_state(self.state, "engine")
        return record.url if record is not None and record.alive and record.url else None

    # -- run -----------------------------------------------------------------------------------------
    def run(self, on_tick: Callable[[], None] | None = None, tick_s: float = 1.0) -> None:
        """Drive the loop until :meth:`request_stop`, ``minutes`` or ``until_retrains``; ``on_tick``
        refreshes a view."""
        deadline = None if self.s.minutes is None else self.status.started + 60.0 * self.s.minutes
        next_rss = 0.0
        every = self.s.calibrate_minutes
        next_calibration = None if every is None else self.status.started + min(300.0, 60 * every)
        while not self._stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            if self.s.until_retrains is not None and self.scored_retrains() >= self.s.until_retrains:
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
        self._sample_rss()  # the last CPU sample of the running loop (its figures end here, not in the stop)

    def scored_retrains(self) -> int:
        """Retrains of this run that trained and scored on the held-out set."""
        return sum(1 for r in self.status.retrains if r.f1 is not None)

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, *, keep: frozenset[str] = KEEP_RUNNING, wait_s: float = 120.0, grace_s: float = 45.0) -> None:
        """Let the feed and retrain in flight finish, stop the services this run started (but ``keep``)."""
        from prmloop.flows.ops.stack import down

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
            # The annotator finishes the solutions in hand (rollouts: seconds each) before it commits.
            down(stop, state=self.state, say=self.say, grace_s=grace_s)

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
        from prmloop.flows.loop.settings import retrain_of
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
                unless_snapshot=self._trained_snapshot,
            )
        finally:
            self.status.retraining = False
        at = started - self.status.started
        wall = time.monotonic() - started
        if not summary.get("trained"):
            reason = str(summary.get("reason"))
            self.status.retrains.append(Retrain(at, accepted, None, False, None, wall, reason, tokens))
            return
        self._trained_snapshot = str(summary["snapshot"])
        self.status.retrains.append(retrain_of(summary, at_s=at + wall, accepted=accepted, wall_s=wall, tokens=tokens))
        if summary["promoted"]:
            self.status.prm = summary["artifact"]
        self.publish_progress()

    def publish_progress(self) -> None:
        """The monitor's artifacts and the learning curve's picture, as each retrain lands (the UI shows
        the loop learning while it runs)."""
        if not self.use_prefect:
            return
        from prmloop.flows.loop.view import curve_png
        from prmloop.flows.monitor import monitor

        png = curve_png(self.status.retrains, self.home / "loop" / "learning-curve.png")
        result = self.result()
        figures = {key: result.get(key) for key in CURVE_FIGURES}  # a flow run's parameters: keep them small
        figures["test_curve"] = [
            {k: p[k] for k in ("at_s", "labels", "f1", "lo", "hi")} for p in result["test_curve"][-12:]
        ]
        monitor(str(self.db), curve=str(png) if png is not None else None, figures=figures)

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

    def unfinished(self) -> list[str]:
        """The driver's jobs still running (after :meth:`stop`: the ones it gave up waiting for)."""
        return [t.name for t in self._threads if t.is_alive()]

    def _busy(self, name: str) -> bool:
        return any(t.name == name and t.is_alive() for t in self._threads)


def _engine_unavailable() -> str | None:
    from prmloop.flows.ops.engine import engine_unavailable

    return engine_unavailable()


def _loop_replicas() -> int:
    """The engine the loop starts for itself: on a CPU, one one-thread server per core (at most 2), unless
    the engine's threads are set; on a GPU one server. In the loop a two-thread engine stalls whenever
    another process takes one of its cores, and two one-thread servers do not (docs/loop.md: 32.9 against
    24-27 tokens a second on 2 cores)."""
    from prmloop.flows.ops.engine import default_threads, gpu_present

    if os.environ.get("PRMLOOP_ENGINE_THREADS") or gpu_present():
        return 1
    return default_threads()


def _annotator_group() -> str:
    from prmloop.consumers.annotator import AnnotatorSettings

    return AnnotatorSettings().group


def _annotator_topic() -> str:
    from prmloop.consumers.annotator import AnnotatorSettings

    return AnnotatorSettings().topic


def _accepted_in_store(db: Path | str) -> int:
    from prmloop.store.tables.duck import QueryError, StoreLocked, query, store_exists

    if not store_exists(db):
        return 0
    try:
        return int(query(db, "SELECT count(*) FROM consensus WHERE decision = 'accepted'", timeout_s=30).rows[0][0])
    except (QueryError, StoreLocked, FileNotFoundError):
        return 0
