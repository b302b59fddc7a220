"""Rollouts of several solutions in one engine call: a generator wrapper that coalesces concurrent requests.

An annotator with ``--in-flight N`` searches N solutions at once, each in its own thread, and each
probe asks the engine for a handful of rollouts of one state. A server engine (vLLM behind an
OpenAI-compatible endpoint) batches concurrent requests by itself; a local engine (transformers on a
CPU or one GPU) is not re-entrant, so the calls would queue one behind the other, each decoding a
small batch. :class:`CoalescingGenerator` turns the requests that arrive together into one
``generate`` call over all their prefixes, which decodes them as one batch.

How it works: the first caller becomes the *leader*; it waits until ``expected`` requests are pending
or ``window_s`` has passed, takes every pending request, groups them by sampling parameters (``n``
and the seed aside: one call draws ``n`` per prompt, so requests are grouped by ``n`` too), makes
one ``generate`` call per group and hands each caller its completions. Callers that arrive while the
leader is generating wait; the next one to find the engine idle leads the next batch.

Seeds: a coalesced call uses the seed of its first request, so rollouts are reproducible only when
the requests arrive in the same groups; pass ``expected=1`` (or do not wrap) for per-request seeds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prmloop.models.backends.base import Completion, Generator, SamplingParams

__all__ = ["CoalescingGenerator"]


@dataclass(eq=False)
class _Pending:
    prefix: str
    n: int
    params: SamplingParams
    done: bool = False
    result: list[Completion] = field(default_factory=list)
    error: BaseException | None = None


class CoalescingGenerator:
    """A :class:`~prmloop.models.backends.base.Generator` whose concurrent ``rollouts`` share engine calls.

    Args:
        inner: the engine (used by one thread at a time).
        expected: how many requests to wait for before a batch starts (the annotator's in-flight count).
        window_s: the longest a leader waits for them.
    """

    def __init__(self, inner: Generator, *, expected: int = 4, window_s: float = 0.05) -> None:
        if expected < 1 or window_s < 0:
            raise ValueError(f"expected must be >= 1 and window_s >= 0, got {expected} and {window_s}")
        self.inner = inner
        self.expected = expected
        self.window_s = window_s
        self.calls = 0
        self.batched_requests = 0
        self._cv = threading.Condition()
        self._pending: list[_Pending] = []
        self._busy = False

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    def __getattr__(self, name: str) -> Any:
        # tokenizer, score, encode_prompt, ...: whatever the engine offers, unchanged.
        return getattr(self.inner, name)

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        with self._cv:
            self._cv.wait_for(lambda: not self._busy)
            self._busy = True
        try:
            return self.inner.generate(prompts, params)
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        request = _Pending(prefix, n, params or SamplingParams())
        with self._cv:
            self._pending.append(request)
            self._cv.notify_all()
            while not request.done and self._busy:
                self._cv.wait()
            if request.done:
                return self._take(request)
            self._busy = True  # this caller leads the next batch
            deadline = time.monotonic() + self.window_s
            self._cv.wait_for(
                lambda: len(self._pending) >= self.expected, timeout=max(0.0, deadline - time.monotonic())
            )
            batch, self._pending = self._pending, []
        try:
            self._run(batch)
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
        return self._take(request)

    def _run(self, batch: list[_Pending]) -> None:
        groups: dict[tuple[int, str], list[_Pending]] = {}
        for item in batch:
            key = item.params.model_dump_json(exclude={"n", "seed"})
            groups.setdefault((item.n, key), []).append(item)
        for (n, _key), items in groups.items():
            params = items[0].params.model_copy(update={"n": n})
            try:
                results = self.inner.generate([item.prefix for item in items], params)
                if len(results) != len(items):
                    raise RuntimeError(f"{self.model_name} answered {len(results)} prompts of {len(items)}")
            except BaseException as error:  # noqa: BLE001 - handed to every caller of the group
                for item in items:
                    item.error, item.done = error, True
                continue
            self.calls += 1
            self.batched_requests += len(items)
            for item, completions in zip(items, results, strict=True):
                item.result, item.done = list(completions), True

    @staticmethod
    def _take(request: _Pending) -> list[Completion]:
        if request.error is not None:
            raise request.error
        return request.result
