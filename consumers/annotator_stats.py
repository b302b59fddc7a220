"""What an annotator did: thread-safe counters of its labels, rollouts and tokens, and its busy window."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from prmloop.models.annotation.strategies import Annotation

__all__ = ["COUNTED", "AnnotatorStats"]


#: What :class:`AnnotatorStats` counts, in the order its summary lists them.
COUNTED: tuple[str, ...] = ("labelled", "all_correct", "unresolved", "aborted", "rejected", "skipped_by_selection")
COUNTED += ("left_for_rollouts", "published", "started_ahead")


class AnnotatorStats:
    """What an annotator did (thread-safe counters; ``as_dict`` for a JSON summary)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.rollouts = 0
        self.generated_tokens = 0
        self.verified_steps = 0
        #: rollouts from s_0 taken from the question's sampled solutions instead of generated
        self.reused_rollouts = 0
        self.failures: Counter[str] = Counter()
        #: Wall-clock (``time.time()``) when the first solution was taken up and the last label published:
        #: the busy window, without start-up and group-join time (what the scaling benchmark compares).
        self.first_started: float | None = None
        self.last_published: float | None = None
        #: the most solutions handed over in one batch (``--batch``: what a search that ends can make room for)
        self.largest_batch = 0

    def started(self, batch: int = 0) -> None:
        with self._lock:
            if self.first_started is None:
                self.first_started = time.time()
            self.largest_batch = max(self.largest_batch, batch)

    def add(self, annotation: Annotation) -> None:
        with self._lock:
            self.counts[annotation.status] += 1
            self.rollouts += annotation.cost.rollouts
            self.generated_tokens += annotation.cost.generated_tokens
            self.verified_steps += annotation.cost.verified_steps
            self.reused_rollouts += annotation.cost.reused_rollouts
            self.failures.update(annotation.cost.failures)

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                **{k: self.counts[k] for k in COUNTED},
                "rollouts": self.rollouts,
                "generated_tokens": self.generated_tokens,
                "verified_steps": self.verified_steps,
                "reused_rollouts": self.reused_rollouts,
                "failures": dict(self.failures),
                "first_started": self.first_started,
                "last_published": self.last_published,
                "largest_batch": self.largest_batch,
            }
