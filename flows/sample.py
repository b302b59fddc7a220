"""The ``sample`` flow: questions in, uncertainty-selected ``SolutionSampled`` events out (UnPRM Sec. 3).

For each question: publish ``QuestionRegistered``; sample ``k`` solutions with per-token
log-probabilities; split them into steps with token offsets; grade them against the gold answer;
score their uncertainty (:mod:`prmloop.models.uncertainty`); keep ``m`` correct and ``n`` incorrect
with a selection strategy (:mod:`prmloop.producers.selection`); publish the kept solutions as
``SolutionSampled`` events through the acknowledged producer and its outbox.

Idempotent: every event id is derived from (question id, generator, seed, sample index), and each
question's samples are drawn with a seed derived from (seed, question id), so re-running on the same
questions with the same seed publishes the same ids and the sink stores nothing new.

Entry points: :func:`run_sample` (a plain function returning a summary dict; ``prefect=False`` skips
the Prefect API) and the flow :func:`sample`. Questions come from a data set (``dataset=``, loaded by
:func:`prmloop.models.questions.load_questions`) or a JSONL file (``file=``, see :func:`read_question_file`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prmloop.models.backends.base import Completion, Generator, SamplingParams
from prmloop.models.backends.registry import BackendConfig, build_backend
from prmloop.models.grading import GradeOutcome, extract_answer, grade
from prmloop.models.prompts import StepFormat, solution_prompt
from prmloop.models.questions import Question, load_questions
from prmloop.models.steps import split_completion, split_steps
from prmloop.models.uncertainty import PAPER_TEMPERATURE, answer_dispersion, solution_uncertainty
from prmloop.producers.selection import Candidate, Selection, get_strategy
from prmloop.store.events import (
    Envelope,
    ModelRef,
    QuestionRegistered,
    SamplingSpec,
    SolutionSampled,
    deterministic_event_id,
    make_event,
)

__all__ = [
    "PRODUCER",
    "QuestionFileError",
    "SampleConfig",
    "SampledQuestion",
    "read_question_file",
    "run_sample",
    "sample",
    "sample_question",
]

PRODUCER = "prmloop-sample/0.1.0"
ARTIFACT_KEY = "sample-per-question"

log = logging.getLogger(__name__)


class QuestionFileError(ValueError):
    """A question file none of whose lines could be used, or that does not exist."""


# --------------------------------------------------------------------------------------------------
# Reading questions
# --------------------------------------------------------------------------------------------------


def read_question_file(path: Path, *, dataset: str | None = None) -> tuple[list[Question], list[str]]:
    """Questions of a JSONL file and one error message per line that could not be used.

    Each line is an object with ``id``, ``problem`` (or ``question``) and ``gold_answer`` (or
    ``answer``; GSM8K's ``#### 18`` form is accepted and graded by its final answer), and optionally
    ``dataset`` and ``metadata``. Malformed JSON, a missing field and a repeated ``id`` are reported as
    ``"<file>:<line>: <what> ..."``; the valid lines still go through. A repeated id keeps the first.

    Raises:
        QuestionFileError: the file does not exist.
    """
    if not path.is_file():
        raise QuestionFileError(f"question file {path} not found")
    questions: list[Question] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    default_dataset = dataset or f"file:{path.stem}"
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                errors.append(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); line skipped")
                continue
            if not isinstance(row, dict):
                errors.append(f"{where}: expected a JSON object, got {type(row).__name__}; line skipped")
                continue
            qid = row.get("id")
            problem = row.get("problem", row.get("question"))
            gold = row.get("gold_answer", row.get("answer"))
            if not isinstance(qid, str | int) or not str(qid).strip():
                errors.append(f"{where}: missing 'id' (a non-empty string); line skipped")
                continue
            qid = str(qid)
            if not isinstance(problem, str) or not problem.strip():
                errors.append(f"{where}: question {qid!r} has no 'problem' (or 'question') text; line skipped")
                continue
            if isinstance(gold, int | float) and not isinstance(gold, bool):
                gold = str(gold)
            if not isinstance(gold, str) or not gold.strip():
                errors.append(
                    f"{where}: question {qid!r} has no 'gold_answer' (or 'answer'); solutions cannot be "
                    "graded without one; line skipped"
                )
                continue
            if qid in seen:
                errors.append(f"{where}: duplicate id {qid!r} (first on line {seen[qid]}); line skipped")
                continue
            seen[qid] = line_no
            metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
            questions.append(
                Question(
                    id=qid,
                    dataset=str(row.get("dataset") or default_dataset),
                    problem=problem,
                    gold_answer=gold,
                    metadata={**(metadata or {}), "source": where},
                )
            )
    return questions, errors


# --------------------------------------------------------------------------------------------------
# Sampling one question (pure apart from the generator)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleConfig:
    """Parameters of one sampling run (the flow's options; defaults follow the papers where they can).

    Attributes:
        k: solutions sampled per question (UnPRM / EpicPRM: 32).
        m: correct solutions kept per question (2).
        n: incorrect solutions kept per question (6).
        strategy: selection strategy name (``uncertainty``, ``epicprm``, ``random``).
        seed: run seed; each question samples with a seed derived from it and the question id.
        prompt_format: ``step_k`` (EpicPRM's 2-shot ``Step k:`` prompt) or ``double_newline`` (Qwen).
        temperature, top_p, max_new_tokens: sampling parameters.
        uncertainty_temperature: ``T`` of the softmax in UnPRM's ``u`` (1 = paper, 5 = UnPRM's code).
        publish_unselected: also publish the solutions no strategy kept (``selected_by=None``).
    """

    k: int = 8
    m: int = 2
    n: int = 6
    strategy: str = "uncertainty"
    seed: int = 0
    prompt_format: StepFormat = "step_k"
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 384
    uncertainty_temperature: float = PAPER_TEMPERATURE
    publish_unselected: bool = False

    def sampling_params(self, question_id: str) -> SamplingParams:
        return SamplingParams(
            n=self.k,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=question_seed(self.seed, question_id),
        )

    def sampling_spec(self) -> SamplingSpec:
        return SamplingSpec(
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            n=self.k,
        )


def question_seed(seed: int, question_id: str) -> int:
    """The seed of one question's samples: stable across runs, limits and batch sizes."""
    digest = hashlib.sha256(f"{seed}\x1f{question_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass
class SampledQuestion:
    """A question's ``k`` samples, graded and scored, with what the strategy kept."""

    question: Question
    registered: Envelope
    events: list[Envelope]
    selection: Selection
    uncertainties: list[float]
    correct: list[bool | None]
    completion_tokens: int
    answer_dispersion: float
    wall_s: float

    def row(self) -> dict[str, Any]:
        """One row of the per-question table artifact."""
        return {
            "question_id": self.question.id,
            "sampled": len(self.correct),
            "correct": sum(c is True for c in self.correct),
            "incorrect": sum(c is False for c in self.correct),
            "unparseable": sum(c is None for c in self.correct),
            "dropped": len(self.selection.dropped),
            "selected_correct": len(self.selection.correct),
            "selected_incorrect": len(self.selection.incorrect),
            "answer_dispersion": round(self.answer_dispersion, 4),
            "tokens": self.completion_tokens,
        }


def _steps_and_offsets(
    generator: Generator, completion: Completion, style: StepFormat
) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    tokenizer = getattr(generator, "tokenizer", None)
    if tokenizer is None:
        # No tokenizer to map characters to tokens: steps from the text, per-step uncertainty unknown.
        return tuple(s.text for s in split_steps(completion.text, style)), None
    token_steps = split_completion(tokenizer, completion, style)
    return tuple(ts.step.text for ts in token_steps), tuple(ts.token_start for ts in token_steps)


def register_event(question: Question) -> Envelope:
    """``QuestionRegistered`` with the id every producer uses for it (question id only)."""
    source = question.metadata.get("source") if isinstance(question.metadata.get("source"), str) else None
    payload = QuestionRegistered(
        question_id=question.id,
        dataset=question.dataset,
        problem=question.problem,
        gold_answer=question.gold_answer,
        source=str(source) if source else question.id,
        metadata=dict(question.metadata),
    )
    return make_event(payload, producer=PRODUCER, event_id=deterministic_event_id("QuestionRegistered", question.id))


def solution_ids(question_id: str, generator: ModelRef, seed: int, index: int) -> tuple[str, Any]:
    """(solution id, event id) of sample ``index``: UUIDv5 of (question, generator, seed, index)."""
    key = (question_id, generator.model_dump(mode="json"), seed, index)
    return str(deterministic_event_id("Solution", *key)), deterministic_event_id("SolutionSampled", *key)


def sample_question(generator: Generator, model: ModelRef, question: Question, config: SampleConfig) -> SampledQuestion:
    """Sample, split, grade, score and select one question's solutions; build their events.

    Raises:
        ValueError: the question has no gold answer (it cannot be graded).
    """
    if not question.gold_answer:
        raise ValueError(f"question {question.id!r} has no gold answer; it cannot be graded")
    started = time.perf_counter()
    registered = register_event(question)
    prompt = solution_prompt(generator, question.problem, config.prompt_format)
    [completions] = generator.generate([prompt], config.sampling_params(question.id))
    parts = [_steps_and_offsets(generator, c, config.prompt_format) for c in completions]
    # Only an explicitly stated answer counts (boxed, "The final answer is", ####): grade()'s bare-answer
    # fallback would take a one-line solution that never answers for its answer.
    answers = [extract_answer(c.text) for c in completions]
    correct: list[bool | None] = []
    for answer in answers:
        outcome = GradeOutcome.UNPARSEABLE if answer is None else grade(answer, question.gold_answer).outcome
        correct.append(None if outcome is GradeOutcome.UNPARSEABLE else outcome is GradeOutcome.CORRECT)
    dispersion = answer_dispersion(answers)
    records = [
        solution_uncertainty(c.logprobs, offsets, temperature=config.uncertainty_temperature, dispersion=dispersion)
        for c, (_, offsets) in zip(completions, parts, strict=True)
    ]
    uncertainties = [r.entropy if r.entropy is not None else 0.0 for r in records]
    candidates = [
        Candidate(i, c.text, a, ok, u)
        for i, (c, a, ok, u) in enumerate(zip(completions, answers, correct, uncertainties, strict=True))
    ]
    selection = get_strategy(config.strategy).select(candidates, m=config.m, n=config.n, seed=config.seed)
    kept = set(selection.selected)
    events = []
    for i, completion in enumerate(completions):
        if i not in kept and not config.publish_unselected:
            continue
        steps, offsets = parts[i]
        solution_id, event_id = solution_ids(question.id, model, config.seed, i)
        payload = SolutionSampled(
            solution_id=solution_id,
            question_id=question.id,
            generator=model,
            sampling=config.sampling_spec(),
            prompt_format=config.prompt_format,
            text=completion.text,
            steps=steps,
            step_token_offsets=offsets,
            token_logprobs=completion.logprobs,
            final_answer=answers[i],
            correct=correct[i],
            gold_answer=question.gold_answer,
            uncertainty=records[i],
            selected_by=selection.strategy if i in kept else None,
            completion_tokens=completion.completion_tokens,
        )
        events.append(make_event(payload, producer=PRODUCER, event_id=event_id, causation_id=registered.event_id))
    return SampledQuestion(
        question=question,
        registered=registered,
        events=events,
        selection=selection,
        uncertainties=uncertainties,
        correct=correct,
        completion_tokens=sum(c.completion_tokens for c in completions),
        answer_dispersion=dispersion,
        wall_s=time.perf_counter() - started,
    )


# --------------------------------------------------------------------------------------------------
# Prefect tasks and the flow
# --------------------------------------------------------------------------------------------------


@task(name="load-questions", cache_policy=NO_CACHE)
def load_questions_task(
    dataset: str | None, file: str | None, limit: int | None, split: str | None
) -> tuple[list[Question], list[str]]:
    """Questions of a data set or a JSONL file, and the errors of the file's unusable lines."""
    if (dataset is None) == (file is None):
        raise ValueError("give exactly one question source: dataset= (e.g. 'gsm8k') or file= (a JSONL path)")
    if file is not None:
        questions, errors = read_question_file(Path(file))
        return (questions[:limit] if limit is not None else questions), errors
    options = {"split": split} if split else {}
    assert dataset is not None
    return load_questions(dataset, limit=limit, **options), []


@task(name="sample-batch", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def sample_batch_task(
    generator: Generator, model: ModelRef, questions: list[Question], config: SampleConfig
) -> list[SampledQuestion]:
    """Sample one batch of questions (retried as a whole: the same seeds give the same samples)."""
    return [sample_question(generator, model, q, config) for q in questions]


@task(name="publish-events", retries=3, retry_delay_seconds=5, cache_policy=NO_CACHE)
def publish_task(bootstrap_servers: str, events: list[Envelope]) -> int:
    """Publish ``events`` with acknowledgements; each goes to the outbox first."""
    from prmloop.store.kafka import EventProducer
    from prmloop.store.outbox import Outbox
    from prmloop.store.settings import StateSettings

    with EventProducer(bootstrap_servers, outbox=Outbox(StateSettings().outbox_dir, name="sample")) as producer:
        return producer.publish(events)


@task(name="per-question-table", cache_policy=NO_CACHE)
def artifact_task(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        key=ARTIFACT_KEY,
        table=rows,
        description=(
            f"sample: {summary['questions']} questions, k={summary['k']}, strategy={summary['strategy']}, "
            f"{summary['selected']} selected, {summary['dropped']} dropped (no parseable answer), "
            f"{summary['events_published']} events published"
        ),
    )


_T = TypeVar("_T")


def _call(use_prefect: bool, t: Any, *args: Any) -> Any:
    """Run a task through Prefect (retries, UI) or as its plain function."""
    return t(*args) if use_prefect else t.fn(*args)


def _logger(use_prefect: bool) -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    return get_run_logger() if use_prefect else log


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[int], None]]:
    if not enabled:
        yield lambda _n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("sampling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False
    ) as bar:
        job = bar.add_task("questions", total=total)
        yield lambda n: bar.advance(job, n)


def _batches(items: Sequence[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _pipeline(
    *,
    use_prefect: bool,
    dataset: str | None,
    file: str | None,
    limit: int | None,
    split: str | None,
    config: SampleConfig,
    backend: dict[str, Any],
    batch_size: int,
    bootstrap_servers: str | None,
    progress: bool,
) -> dict[str, Any]:
    logger = _logger(use_prefect)
    get_strategy(config.strategy)  # fail before loading a model
    started = time.perf_counter()
    questions, errors = _call(use_prefect, load_questions_task, dataset, file, limit, split)
    for error in errors:
        logger.warning("%s", error)
    gradeable = [q for q in questions if q.gold_answer]
    for q in questions:
        if not q.gold_answer:
            errors.append(f"{q.id}: no gold answer; skipped")
    if not gradeable:
        raise QuestionFileError(
            "no usable questions" + (f"; {len(errors)} problems, first: {errors[0]}" if errors else "")
        )
    if bootstrap_servers is None:
        from prmloop.store.broker import require_bootstrap_servers

        bootstrap_servers = require_bootstrap_servers()
    backend_config = BackendConfig.model_validate(backend)
    generator = build_backend(backend_config)
    model = ModelRef(backend=backend_config.backend, name=generator.model_name)
    logger.info(
        "sampling %d questions with %s (k=%d, m=%d, n=%d, strategy=%s, seed=%d)",
        len(gradeable),
        model.name,
        config.k,
        config.m,
        config.n,
        config.strategy,
        config.seed,
    )
    published = _call(use_prefect, publish_task, bootstrap_servers, [register_event(q) for q in gradeable])
    results: list[SampledQuestion] = []
    sampling_s = 0.0
    with _progress(progress, len(gradeable)) as advance:
        for batch in _batches(gradeable, max(1, batch_size)):
            t0 = time.perf_counter()
            done: list[SampledQuestion] = _call(use_prefect, sample_batch_task, generator, model, batch, config)
            sampling_s += time.perf_counter() - t0
            published += _call(use_prefect, publish_task, bootstrap_servers, [e for r in done for e in r.events])
            results.extend(done)
            advance(len(batch))
            for r in done:
                logger.info("%s: %s", r.question.id, r.row())
    rows = [r.row() for r in results]
    selected_u = [r.uncertainties[i] for r in results for i in r.selection.selected]
    rest_u = [u for r in results for i, u in enumerate(r.uncertainties) if i not in set(r.selection.selected)]
    graded = [c for r in results for c in r.correct]
    tokens = sum(r.completion_tokens for r in results)
    summary: dict[str, Any] = {
        "questions": len(results),
        "question_errors": errors,
        "k": config.k,
        "m": config.m,
        "n": config.n,
        "strategy": config.strategy,
        "seed": config.seed,
        "generator": model.name,
        "solutions": len(graded),
        "correct": sum(c is True for c in graded),
        "incorrect": sum(c is False for c in graded),
        "unparseable": sum(c is None for c in graded),
        "fraction_correct": (sum(c is True for c in graded) / len(graded)) if graded else math.nan,
        "dropped": sum(len(r.selection.dropped) for r in results),
        "selected": len(selected_u),
        "events_published": published,
        "completion_tokens": tokens,
        "sampling_s": sampling_s,
        "tokens_per_s": tokens / sampling_s if sampling_s > 0 else math.nan,
        "wall_s": time.perf_counter() - started,
        "mean_uncertainty_selected": _mean(selected_u),
        "mean_uncertainty_rest": _mean(rest_u),
        "per_question": rows,
    }
    if use_prefect:
        _call(use_prefect, artifact_task, rows, summary)
    logger.info(
        "sampled %d solutions of %d questions: %.1f%% correct, %d selected, %d dropped, %d events in %.1f s",
        summary["solutions"],
        summary["questions"],
        100 * summary["fraction_correct"],
        summary["selected"],
        summary["dropped"],
        published,
        summary["wall_s"],
    )
    return summary


@flow(name="sample", validate_parameters=False)
def sample(  # noqa: PLR0917 - Prefect flow parameters are keyword arguments in the UI
    dataset: str | None = None,
    file: str | None = None,
    limit: int | None = None,
    split: str | None = None,
    k: int = 8,
    m: int = 2,
    n: int = 6,
    strategy: str = "uncertainty",
    seed: int = 0,
    prompt_format: StepFormat = "step_k",
    temperature: float = 0.7,
    max_new_tokens: int = 384,
    uncertainty_temperature: float = PAPER_TEMPERATURE,
    publish_unselected: bool = False,
    backend: dict[str, Any] | None = None,
    batch_size: int = 4,
    bootstrap_servers: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Sample, grade, score and select solutions of a question set; publish the kept ones.

    See :func:`run_sample` for the parameters; returns the same summary.
    """
    return _run_parameters(use_prefect=True, parameters=dict(locals()))


_CONFIG_FIELDS = (
    "k",
    "m",
    "n",
    "strategy",
    "seed",
    "prompt_format",
    "temperature",
    "max_new_tokens",
    "uncertainty_temperature",
    "publish_unselected",
)


def _run_parameters(*, use_prefect: bool, parameters: dict[str, Any]) -> dict[str, Any]:
    """The pipeline for the keyword parameters of :func:`sample` / :func:`run_sample`."""
    return _pipeline(
        use_prefect=use_prefect,
        dataset=parameters["dataset"],
        file=parameters["file"],
        limit=parameters["limit"],
        split=parameters["split"],
        config=SampleConfig(**{name: parameters[name] for name in _CONFIG_FIELDS}),
        backend=parameters["backend"] or {},
        batch_size=parameters["batch_size"],
        bootstrap_servers=parameters["bootstrap_servers"],
        progress=parameters["progress"],
    )


def run_sample(
    *,
    dataset: str | None = None,
    file: str | Path | None = None,
    limit: int | None = None,
    split: str | None = None,
    k: int = 8,
    m: int = 2,
    n: int = 6,
    strategy: str = "uncertainty",
    seed: int = 0,
    prompt_format: StepFormat = "step_k",
    temperature: float = 0.7,
    max_new_tokens: int = 384,
    uncertainty_temperature: float = PAPER_TEMPERATURE,
    publish_unselected: bool = False,
    backend: BackendConfig | dict[str, Any] | None = None,
    batch_size: int = 4,
    bootstrap_servers: str | None = None,
    progress: bool = True,
    prefect: bool = True,
) -> dict[str, Any]:
    """Run the sampling loop on ``dataset`` (e.g. ``"gsm8k"``) or ``file`` (JSONL) and return a summary.

    Args:
        dataset, file: the question source (exactly one); ``split`` is passed to the data-set loader.
        limit: the first ``limit`` questions only.
        k, m, n, strategy: sample ``k`` per question, keep ``m`` correct and ``n`` incorrect by ``strategy``.
        seed: run seed (event ids and per-question sampling seeds derive from it).
        prompt_format, temperature, max_new_tokens: how to sample.
        uncertainty_temperature: ``T`` of UnPRM's softmax (1 = paper, 5 = UnPRM's code).
        publish_unselected: also publish solutions no strategy kept (``selected_by=None``).
        backend: :class:`~prmloop.models.backends.registry.BackendConfig` (default: transformers SmolLM2).
        batch_size: questions per Prefect task (one retry unit).
        bootstrap_servers: the broker; default ``require_bootstrap_servers()`` (env or ``prmloop broker``).
        progress: show a rich progress bar on the terminal.
        prefect: run as the Prefect flow ``sample`` (tasks, retries, artifact); ``False`` runs the same
            steps as plain functions, without a Prefect API.

    Returns:
        ``questions``, ``question_errors`` (one message per unusable input line), ``solutions``,
        ``correct`` / ``incorrect`` / ``unparseable``, ``fraction_correct``, ``dropped``, ``selected``,
        ``events_published``, ``completion_tokens``, ``sampling_s``, ``tokens_per_s``, ``wall_s``,
        ``mean_uncertainty_selected`` / ``mean_uncertainty_rest`` and ``per_question`` rows.
    """
    backend_dict = backend.model_dump(mode="json") if isinstance(backend, BackendConfig) else dict(backend or {})
    kwargs: dict[str, Any] = {
        "dataset": dataset,
        "file": str(file) if file is not None else None,
        "limit": limit,
        "split": split,
        "k": k,
        "m": m,
        "n": n,
        "strategy": strategy,
        "seed": seed,
        "prompt_format": prompt_format,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "uncertainty_temperature": uncertainty_temperature,
        "publish_unselected": publish_unselected,
        "backend": backend_dict,
        "batch_size": batch_size,
        "bootstrap_servers": bootstrap_servers,
        "progress": progress,
    }
    if prefect:
        return sample(**kwargs)
    return _run_parameters(use_prefect=False, parameters=kwargs)
