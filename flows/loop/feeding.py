"""The streaming loop's feeding: when the annotator's backlog runs short, a ``feed`` flow run probes new
questions and tops up the best queued ones (:mod:`prmloop.flows.feed`); up to ``feeds`` at once, a failed
one tried again later with the same questions."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prmloop.models.questions import Question

if TYPE_CHECKING:
    from prmloop.flows.loop.settings import LoopSettings, LoopStatus, QuestionStream
    from prmloop.flows.loop.watch import CommittedOffsets

__all__ = ["MAX_QUEUE", "LoopFeeding", "sampling_engine"]

#: Probed questions the driver keeps in its queue at most (the best by priority).
MAX_QUEUE = 500


class LoopFeeding:
    """The feeding part of :class:`~prmloop.flows.loop.driver.Loop` (which it is mixed into)."""

    s: LoopSettings
    status: LoopStatus
    stream: QuestionStream
    servers: str
    use_prefect: bool
    _threads: list[threading.Thread]
    _queue: dict[str, tuple[float, Question]]
    _retry_batches: list[tuple[list[Question], list[Question]]]
    _feed_lock: threading.Lock
    _feed_retry_at: float
    _feed_backoff_s: float
    _committed: CommittedOffsets | None
    _annotated_at_start: int

    def _background(self, name: str, work: Callable[[], None]) -> None:
        raise NotImplementedError  # the driver's

    def _busy(self, name: str) -> bool:
        raise NotImplementedError  # the driver's

    def waiting(self) -> int:
        """Solutions this run published that the annotator has not finished (exact: committed offsets)."""
        done = self._committed.total() - self._annotated_at_start if self._committed else 0
        return max(0, self.status.published - done)

    def feed_size(self) -> int:
        """Solutions one feed publishes: ``probe_k`` of each probed question, ``k - probe_k`` of each topped up
        (``k`` of each question in random order)."""
        if self.s.order == "random":
            return self.s.probe_batch * self.s.k
        return self.s.probe_batch * self.s.probe_k + self.s.top_up_batch * max(0, self.s.k - self.s.probe_k)

    def _maybe_feed(self) -> None:
        running = sum(1 for t in self._threads if t.name == "feed" and t.is_alive())
        # in process (transformers) a feed runs the model itself: two at once would only share its cores
        limit = self.s.feeds if self.status.engine == "vllm" else 1
        if running >= limit or time.monotonic() < self._feed_retry_at:
            return
        self.status.waiting = self.waiting()
        # the feeds still sampling will publish theirs too: the backlog stays under about ``ahead`` plus a feed
        if self.status.waiting + running * self.feed_size() >= self.s.ahead:
            return
        with self._feed_lock:
            probe, top_up = self._retry_batches.pop(0) if self._retry_batches else self._next_batch()
        if self.status.first_feed_at is None:
            self.status.first_feed_at = self.status.elapsed()
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
            **sampling_engine(),
            k=self.s.k,
            probe_k=self.s.probe_k if self.s.order == "priority" else 0,
            max_new_tokens=self.s.max_new_tokens,
            seed=self.s.seed,
            threads=self.s.threads,
            prm=Path(self.status.prm) if self.status.prm and self.s.order == "priority" else None,
        )
        with self._feed_lock:
            self.status.feeds_running += 1
        try:
            out = run_feed(probe, top_up, settings, bootstrap_servers=self.servers, prefect=self.use_prefect)
        except Exception:
            # The same questions again later (the engine may be restarting): 10 s, then twice as long, up to 2 min.
            with self._feed_lock:
                self._retry_batches.append((probe, top_up))
                self._feed_backoff_s = min(120.0, 2 * self._feed_backoff_s) if self._feed_backoff_s else 10.0
                self._feed_retry_at = time.monotonic() + self._feed_backoff_s
            raise
        finally:
            with self._feed_lock:
                self.status.feeds_running -= 1
        by_id = {q.id: q for q in probe}
        with self._feed_lock:
            self._feed_backoff_s = 0.0
            for row in out["probed"]:
                question = by_id.get(row["question_id"])
                if question is not None:
                    self._queue[question.id] = (float(row["priority"]), question)
            if len(self._queue) > MAX_QUEUE:  # a run of days keeps the best; the rest would never be topped up
                kept = sorted(self._queue.items(), key=lambda kv: -kv[1][0])[:MAX_QUEUE]
                self._queue = dict(kept)
            self.status.published += int(out["solutions"])
            self.status.feeds += 1
            self.status.queue = len(self._queue)


def sampling_engine() -> dict[str, Any]:
    """The sampler's engine as ``up`` set it for the services (``PRMLOOP_SAMPLE_*``), its API key included."""
    out: dict[str, Any] = {}
    for key in ("backend", "model", "base_url", "api_key"):
        value = os.environ.get(f"PRMLOOP_SAMPLE_{key.upper()}")
        if value:
            out[key] = value
    return out
