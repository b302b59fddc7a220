"""Answer grading: extract a final answer from a solution and decide equivalence with math-verify.

Every label in prmloop ends in the question "is this answer right?": Monte-Carlo rollouts are scored
by the fraction that reach the gold answer (EpicPRM, Sec. 3, the ``MC`` estimate; Qwen's "Lessons",
Sec. 2), and majority / PRM-weighted voting groups equivalent answers. This module is that oracle.

- :func:`~prmloop.models.answers.extract_answer` finds the final answer in free text (boxed, "The
  answer is", ``####``).
- :func:`answers_equivalent` and :func:`grade` decide equivalence with math-verify (``parse`` +
  ``verify``), after a cheap normalised-string fast path.
- :func:`group_equivalent_answers` clusters answers for voting.

Timeouts. math-verify bounds its own work with ``signal.alarm``, which only works in the main thread
and only in whole seconds; its timeouts are therefore always switched off here and replaced by ours:

- in the main thread, a ``signal.setitimer`` deadline that raises :class:`AnswerCheckTimeout`
  (a ``BaseException``, so math-verify's ``except Exception`` cannot swallow it); a timer that was
  already armed (for example pytest-timeout's) is restored afterwards;
- in any other thread (Kafka consumer workers, Prefect task runners), the whole call is shipped to one
  long-lived helper process that runs it in *its* main thread with the same per-comparison deadline;
  the caller also waits with a hard deadline and kills the helper if it does not answer (C-level
  big-integer work cannot be interrupted by a signal), and the next call starts a fresh one.

A timeout never raises out of the public functions: :func:`answers_equivalent` returns ``False``
(and logs a warning) and :func:`grade` returns the ``unparseable`` outcome with ``reason="timeout"``.

Length. Answers come from stored text (a gold answer in an event, a step of an imported solution), so
one can be megabytes long; math-verify would spend its whole budget on each comparison with it (5 s,
every rollout again: failures are not cached). An answer longer than :data:`MAX_ANSWER_CHARS` is
compared as a normalised string only, never parsed (real answers are a few dozen characters).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Any, TypeVar

from prmloop.models.answers import answer_or_bare, normalize_answer
from prmloop.models.grading_worker import AnswerCheckTimeout, GradingWorker

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_ANSWER_CHARS",
    "AnswerCheckTimeout",
    "GradeOutcome",
    "GradeResult",
    "answers_equivalent",
    "grade",
    "group_equivalent_answers",
    "shutdown_grading_worker",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
"""Per-comparison budget in seconds (math-verify's own default is 5 s)."""

MAX_ANSWER_CHARS = 1_000
"""Longest answer math-verify is asked to parse; a longer one is compared as a string only."""

_T = TypeVar("_T")


class GradeOutcome(StrEnum):
    """The three outcomes of :func:`grade`."""

    CORRECT = "correct"
    INCORRECT = "incorrect"
    UNPARSEABLE = "unparseable"
    """No final answer could be found in the prediction, it could not be parsed, or the check timed out."""


@dataclass(frozen=True, slots=True)
class GradeResult:
    """The verdict on one prediction.

    Attributes:
        outcome: correct, incorrect or unparseable.
        predicted_answer: the answer extracted from the prediction (``None`` if none was found).
        gold_answer: the gold answer as compared (extracted from ``\\boxed{}``/``####`` if it had one).
        reason: how the verdict was reached: ``"string-match"``, ``"math-verify"``, ``"no-answer"``,
            ``"parse-failed"``, ``"timeout"`` or ``"too-long"`` (the prediction's answer is longer
            than :data:`MAX_ANSWER_CHARS`).
    """

    outcome: GradeOutcome
    predicted_answer: str | None
    gold_answer: str
    reason: str

    @property
    def is_correct(self) -> bool:
        return self.outcome is GradeOutcome.CORRECT


# --------------------------------------------------------------------------------------------------
# Deadlines
# --------------------------------------------------------------------------------------------------


@contextmanager
def _signal_deadline(timeout_s: float) -> Iterator[None]:
    """Raise :class:`AnswerCheckTimeout` in the main thread after ``timeout_s`` seconds.

    Restores the previous SIGALRM handler and re-arms a timer that was already running (minus the
    time spent here), so an outer watchdog such as pytest-timeout keeps working.
    """
    if timeout_s <= 0:
        yield
        return

    def _on_alarm(signum: int, frame: object) -> None:
        raise AnswerCheckTimeout(f"answer check exceeded {timeout_s:g} s")

    previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
    started = time.monotonic()
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay > 0:
            remaining = max(previous_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, remaining, previous_interval)


_WORKER = GradingWorker("prmloop.models.grading", {"compare": "_compare_in_process", "group": "_group_in_process"})


def shutdown_grading_worker() -> None:
    """Stop the helper process used for calls from non-main threads (it restarts on demand)."""
    _WORKER.shutdown()


def _dispatch(fn: Callable[..., _T], fn_name: str, args: tuple[Any, ...], deadline_s: float) -> _T:
    """``fn(*args)`` here in the main thread (its deadline a signal), else in the helper process."""
    if threading.current_thread() is threading.main_thread():
        return fn(*args)
    result: _T = _WORKER.call(fn_name, args, deadline_s, on_timeout=_Verdict.TIMEOUT)
    return result


# --------------------------------------------------------------------------------------------------
# math-verify core (runs in a main thread: the caller's or the helper process's)
# --------------------------------------------------------------------------------------------------


class _Verdict(StrEnum):
    EQUAL = "equal"
    DIFFERENT = "different"
    GOLD_UNPARSEABLE = "gold-unparseable"
    PRED_UNPARSEABLE = "pred-unparseable"
    TIMEOUT = "timeout"
    GOLD_TOO_LONG = "gold-too-long"
    PRED_TOO_LONG = "pred-too-long"


@lru_cache(maxsize=1)
def _math_verify() -> tuple[Callable[..., list[Any]], Callable[..., bool], list[Any]]:
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError as exc:  # pragma: no cover - it is a core dependency
        raise ImportError("prmloop's grading needs math-verify: pip install 'math-verify>=0.9,<0.10'") from exc
    # math-verify warns once that its timeouts are off; they are replaced by ours (module docstring).
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return parse, verify, config


@lru_cache(maxsize=4096)
def _parse_cached(answer: str) -> tuple[Any, ...]:
    parse, _, config = _math_verify()
    # Wrapping in \boxed{} makes math-verify read the whole answer as one LaTeX expression.
    parsed = parse("\\boxed{" + answer + "}", extraction_config=config, parsing_timeout=None)
    # math-verify appends the raw string as a fallback; with no sympy object it did not parse.
    if all(isinstance(item, str) for item in parsed):
        return ()
    return tuple(parsed)


def _parse(answer: str, timeout_s: float) -> list[Any]:
    with _signal_deadline(timeout_s):
        return list(_parse_cached(answer))


def _verify(gold: list[Any], pred: list[Any], timeout_s: float) -> bool:
    _, verify, _ = _math_verify()
    with _signal_deadline(timeout_s):
        return bool(verify(gold, pred, timeout_seconds=None))


def _compare_in_process(
    gold: str, pred: str, timeout_s: float, symmetric: bool, string_fast_path: bool = True
) -> _Verdict:
    """Compare two already-extracted answers; ``gold`` first (math-verify's ``verify`` is asymmetric)."""
    if string_fast_path and normalize_answer(gold) == normalize_answer(pred):
        return _Verdict.EQUAL
    if len(pred) > MAX_ANSWER_CHARS:
        return _Verdict.PRED_TOO_LONG
    if len(gold) > MAX_ANSWER_CHARS:
        return _Verdict.GOLD_TOO_LONG
    try:
        parsed_pred = _parse(pred, timeout_s)
        if not parsed_pred:
            return _Verdict.PRED_UNPARSEABLE
        parsed_gold = _parse(gold, timeout_s)
        if not parsed_gold:
            return _Verdict.GOLD_UNPARSEABLE
        if _verify(parsed_gold, parsed_pred, timeout_s):
            return _Verdict.EQUAL
        if symmetric and _verify(parsed_pred, parsed_gold, timeout_s):
            return _Verdict.EQUAL
    except AnswerCheckTimeout:
        return _Verdict.TIMEOUT
    return _Verdict.DIFFERENT


def _group_in_process(answers: Sequence[str], timeout_s: float) -> list[int]:
    cluster_of_key: dict[str, int] = {}
    representatives: list[str] = []
    cluster_ids: list[int] = []
    for answer in answers:
        key = normalize_answer(answer)
        cluster = cluster_of_key.get(key)
        if cluster is None:
            for index, representative in enumerate(representatives):
                if _compare_in_process(representative, answer, timeout_s, symmetric=True) is _Verdict.EQUAL:
                    cluster = index
                    break
        if cluster is None:
            cluster = len(representatives)
            representatives.append(answer)
        cluster_of_key.setdefault(key, cluster)
        cluster_ids.append(cluster)
    return cluster_ids


def _compare(gold: str, pred: str, timeout_s: float, symmetric: bool, string_fast_path: bool = True) -> _Verdict:
    # Two parses and up to two comparisons, each with its own budget, plus slack for the round trip.
    try:
        return _dispatch(
            _compare_in_process,
            "compare",
            (gold, pred, timeout_s, symmetric, string_fast_path),
            deadline_s=4 * timeout_s + 2,
        )
    except AnswerCheckTimeout:
        return _Verdict.TIMEOUT


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------


def answers_equivalent(a: str, b: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, string_fast_path: bool = True) -> bool:
    """Whether two extracted answers denote the same mathematical object (symmetric).

    Equal :func:`normalize_answer` keys decide at once; otherwise both are parsed with math-verify and
    compared in both directions. Unparseable answers, answers longer than :data:`MAX_ANSWER_CHARS`
    and timeouts count as not equivalent (a timeout is logged as a warning). Safe to call from any
    thread (module docstring).
    ``string_fast_path=False`` always asks math-verify (for testing the parser on known answers).

    Examples:
        >>> answers_equivalent(r"\\dfrac{1}{2}", "0.5")
        True
        >>> answers_equivalent("17", "18")
        False
    """
    verdict = _compare(a, b, timeout_s, symmetric=True, string_fast_path=string_fast_path)
    if verdict is _Verdict.TIMEOUT:
        logger.warning("answer comparison timed out after %.3g s: %.80r vs %.80r", timeout_s, a, b)
    return verdict is _Verdict.EQUAL


def grade(prediction: str, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> GradeResult:
    """Grade a prediction (a whole solution or a bare answer) against a gold answer.

    The prediction's answer is :func:`extract_answer` of it, or the prediction itself when it has no
    answer marker but is a short bare answer (``"0.5"``, ``"\\frac{1}{2}"``, ``"Evelyn"``). The gold
    answer is used as given unless it carries a ``\\boxed{}`` or ``####`` marker.

    Outcomes: ``correct`` / ``incorrect`` from math-verify's ``verify(gold, prediction)``; a
    gold answer math-verify cannot parse, or one longer than :data:`MAX_ANSWER_CHARS`, is compared as
    a normalised string; ``unparseable`` when the prediction states no answer, its answer cannot be
    parsed or is longer than :data:`MAX_ANSWER_CHARS`, or the check ran past ``timeout_s``.

    Raises:
        ValueError: if ``gold`` is empty (a data error, not a model error).
    """
    gold_answer = answer_or_bare(gold) or gold.strip()
    if not gold_answer:
        raise ValueError("grade() needs a non-empty gold answer; check the question's gold_answer field")
    predicted = answer_or_bare(prediction)
    if predicted is None:
        return GradeResult(GradeOutcome.UNPARSEABLE, None, gold_answer, "no-answer")
    if normalize_answer(predicted) == normalize_answer(gold_answer):
        return GradeResult(GradeOutcome.CORRECT, predicted, gold_answer, "string-match")
    verdict = _compare(gold_answer, predicted, timeout_s, symmetric=False)
    outcome, reason = {
        _Verdict.EQUAL: (GradeOutcome.CORRECT, "math-verify"),
        _Verdict.DIFFERENT: (GradeOutcome.INCORRECT, "math-verify"),
        # The normalised strings already differ, so an unparseable gold means a different answer.
        _Verdict.GOLD_UNPARSEABLE: (GradeOutcome.INCORRECT, "string-match"),
        _Verdict.PRED_UNPARSEABLE: (GradeOutcome.UNPARSEABLE, "parse-failed"),
        _Verdict.TIMEOUT: (GradeOutcome.UNPARSEABLE, "timeout"),
        _Verdict.GOLD_TOO_LONG: (GradeOutcome.INCORRECT, "string-match"),
        _Verdict.PRED_TOO_LONG: (GradeOutcome.UNPARSEABLE, "too-long"),
    }[verdict]
    return GradeResult(outcome, predicted, gold_answer, reason)


def group_equivalent_answers(answers: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[int]:
    """Cluster ids for ``answers``: equal ids mean equivalent answers (for majority / weighted votes).

    Ids are assigned in first-seen order (the first answer gets 0, the first answer not equivalent
    to it gets 1, ...). Each answer is compared with one representative (the first member) of each
    existing cluster: equal :func:`normalize_answer` keys join at once, otherwise math-verify decides
    symmetrically; an answer that times out against every cluster starts its own. Pass *extracted*
    answers (see :func:`extract_answer`); empty strings form their own cluster.

    Cost: O(n x clusters) comparisons in the worst case; the normalised fast path and math-verify's
    parse cache make repeated answers cheap.

    Examples:
        >>> group_equivalent_answers(["0.5", r"\\frac{1}{2}", "3", r"\\dfrac12", "3.0"])
        [0, 0, 1, 0, 1]
    """
    answers = list(answers)
    if not answers:
        return []
    # Bound for the helper process: every answer against every representative, with slack.
    deadline_s = 2 * timeout_s * len(answers) * len(answers) + 5
    try:
        return _dispatch(_group_in_process, "group", (answers, timeout_s), deadline_s=deadline_s)
    except AnswerCheckTimeout:
        logger.warning(
            "grouping %d answers ran past %.3g s; falling back to normalised-string keys",
            len(answers),
            deadline_s,
        )
        keys: dict[str, int] = {}
        return [keys.setdefault(normalize_answer(answer), len(keys)) for answer in answers]
