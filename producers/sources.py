"""Question sources: a shared data set or a JSONL file, read into :class:`~prmloop.models.questions.Question`.

Every source returns the questions it could read and one message per input it could not, so a bad
line never costs the good ones. A question file (plain or gzip) is read by
:func:`~prmloop.models.jsonl.read_json_lines`: a line that is not UTF-8, not JSON, nested too deeply,
too long, or whose fields have the wrong types (``"id": true`` is not an id) is reported as
``<file>:<line>: <what>; line skipped``, and a truncated archive keeps the lines before the damage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from prmloop.models.arith import ARITH_DATASET
from prmloop.models.jsonl import read_json_lines
from prmloop.models.questions import DATASET_FILES, Question, dataset_file, load_questions

__all__ = [
    "DATASET_NAMES",
    "MAX_LINE_BYTES",
    "MAX_PROBLEM_CHARS",
    "QuestionFileError",
    "QuestionLine",
    "check_dataset",
    "check_source",
    "check_split",
    "default_dataset",
    "load_source",
    "read_question_file",
]

#: Every name ``--dataset`` takes: the generated arithmetic curriculum and the shared data sets.
DATASET_NAMES: tuple[str, ...] = (ARITH_DATASET, *sorted(DATASET_FILES))

#: A question line longer than this is refused (a real problem statement is a few kB).
MAX_LINE_BYTES = 256 * 1024
#: A problem text longer than this is refused: it would not fit a model's context anyway.
MAX_PROBLEM_CHARS = 32_000


class QuestionFileError(ValueError):
    """A question source that does not exist, or none of whose inputs could be used."""


class QuestionLine(BaseModel):
    """One line of a question file, validated strictly (no ``bool("false")``, no ``str(True)``)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    id: StrictStr | StrictInt
    problem: StrictStr = Field(min_length=1, max_length=MAX_PROBLEM_CHARS)
    gold_answer: StrictStr | StrictInt | StrictFloat
    dataset: StrictStr | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> QuestionLine:
        """Accept the common aliases: ``question`` for ``problem``, ``answer`` for ``gold_answer``."""
        data = dict(row)
        if "problem" not in data and "question" in data:
            data["problem"] = data["question"]
        if "gold_answer" not in data and "answer" in data:
            data["gold_answer"] = data["answer"]
        return cls.model_validate(data)


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "line"
    return f"{where}: {first['msg']}"


def read_question_file(path: Path, *, dataset: str | None = None) -> tuple[list[Question], list[str]]:
    """Questions of a JSONL file and one error message per line that could not be used.

    Each line is an object with ``id``, ``problem`` (or ``question``) and ``gold_answer`` (or
    ``answer``; GSM8K's ``#### 18`` form is accepted and graded by its final answer), and optionally
    ``dataset`` and ``metadata``. A repeated ``id`` keeps the first.

    Raises:
        QuestionFileError: the file does not exist.
    """
    if not path.is_file():
        raise QuestionFileError(f"question file {path} not found; give a JSONL file with one question per line")
    questions: list[Question] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    default_dataset = dataset or f"file:{path.stem}"
    for line in read_json_lines(path, errors, max_line_bytes=MAX_LINE_BYTES):
        where = line.where
        try:
            parsed = QuestionLine.from_row(line.row)
        except ValidationError as exc:
            errors.append(f"{where}: {_first_error(exc)}; line skipped")
            continue
        qid = str(parsed.id).strip()
        if not qid:
            errors.append(f"{where}: empty 'id'; line skipped")
            continue
        if not str(parsed.gold_answer).strip():
            errors.append(
                f"{where}: question {qid!r} has an empty gold answer; solutions cannot be graded; line skipped"
            )
            continue
        if qid in seen:
            errors.append(f"{where}: duplicate id {qid!r} (first on line {seen[qid]}); line skipped")
            continue
        seen[qid] = line.line_no
        questions.append(
            Question(
                id=qid,
                dataset=parsed.dataset or default_dataset,
                problem=parsed.problem,
                gold_answer=str(parsed.gold_answer),
                metadata={**parsed.metadata, "source": where},
            )
        )
    return questions, errors


def default_dataset(backend: str, model: str) -> str:
    """The question source when none is given: the arithmetic curriculum on the embedded SmolLM2
    (which solves about 1 GSM8K question in 160, so its labels would say nothing), whichever engine runs
    it (in process, or served by the machine's vLLM engine under the same name), GSM8K otherwise."""
    return "arith" if model == "smollm2" else "gsm8k"


def check_dataset(dataset: str | None) -> str | None:
    """``dataset`` if it is one of :data:`DATASET_NAMES` (or ``None``); a settings object's validator.

    Raises:
        ValueError: any other name, with every valid one.
    """
    if dataset is not None and dataset not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASET_NAMES)}")
    return dataset


def check_split(dataset: str | None, split: str | None) -> str | None:
    """``split`` if ``dataset`` has it (any split while no data set is named: a file or the queue ignores it).

    Raises:
        ValueError: a split the data set does not have, with the ones it has.
    """
    if split is None or dataset is None or dataset not in DATASET_NAMES:
        return split
    splits = tuple(DATASET_FILES.get(dataset, ()))
    if split not in splits:
        have = f"choose one of {', '.join(splits)}" if splits else "it is generated and has none; leave --split out"
        raise ValueError(f"{dataset} has no split {split!r}; {have}")
    return split


def check_source(*, dataset: str | None = None, file: Path | None = None, split: str | None = None) -> None:
    """Check, before any run starts, that the named question source can be read: a data set's file is
    in the shared data folder, a question file exists.

    Raises:
        QuestionFileError: what is missing and what to do.
    """
    try:
        if dataset is not None and dataset != ARITH_DATASET:
            dataset_file(check_dataset(dataset) or dataset, check_split(dataset, split))
    except (ValueError, FileNotFoundError) as exc:
        raise QuestionFileError(str(exc)) from None
    if file is not None and not Path(file).is_file():
        raise QuestionFileError(f"question file {file} not found; give a JSONL file with one question per line")


#: Questions taken from the prioritized queue when ``--from-queue`` is given no ``--limit``.
QUEUE_DEFAULT_QUESTIONS = 8

#: Questions generated when ``--dataset arith`` is given no ``--limit``.
ARITH_DEFAULT_QUESTIONS = 20


def load_source(
    *,
    dataset: str | None = None,
    file: Path | None = None,
    limit: int | None = None,
    split: str | None = None,
    level: int = 1,
    seed: int = 0,
    queue: Path | str | None = None,
) -> tuple[list[Question], list[str]]:
    """The questions of exactly one source (a data set name or a JSONL file) and the per-input errors.

    ``dataset="arith"`` generates the verifiable arithmetic curriculum (:mod:`prmloop.producers.arith`)
    at ``level`` with ``seed``: ``limit`` questions (default :data:`ARITH_DEFAULT_QUESTIONS`).

    ``queue`` (a store file) takes the ``limit`` highest-priority questions that were not sampled since
    they were prioritized (:func:`~prmloop.store.tables.queue.queued_questions`; default limit 8).

    Questions without a gold answer are left out and reported (their solutions cannot be graded).

    Raises:
        QuestionFileError: no source, two sources, a missing file, an empty queue, or no usable question.
    """
    if sum(s is not None for s in (dataset, file, queue)) != 1:
        raise QuestionFileError(
            "give exactly one question source: --dataset (e.g. gsm8k), --file (a JSONL path) or --from-queue"
        )
    errors: list[str] = []
    if queue is not None:
        from prmloop.store.tables.queue import queued_questions

        rows = queued_questions(queue, limit or QUEUE_DEFAULT_QUESTIONS)
        if not rows:
            raise QuestionFileError(
                f"the question queue in {queue} is empty: run `prmloop prioritize` first (and keep the sink running)"
            )
        questions = [
            Question(
                id=r.question_id, dataset=r.dataset, problem=r.problem, gold_answer=r.gold_answer, metadata=r.metadata
            )
            for r in rows
        ]
    elif file is not None:
        questions, errors = read_question_file(Path(file))
        questions = questions[:limit] if limit is not None else questions
    elif dataset == "arith":
        from prmloop.producers.arith import arith_questions

        questions = arith_questions(limit or ARITH_DEFAULT_QUESTIONS, level=level, seed=seed)
    else:
        assert dataset is not None
        options = {"split": split} if split else {}
        questions = load_questions(dataset, limit=limit, **options)
    usable = [q for q in questions if q.gold_answer]
    errors.extend(f"{q.id}: no gold answer; skipped" for q in questions if not q.gold_answer)
    if not usable:
        first = f"; {len(errors)} problems, first: {errors[0]}" if errors else ""
        raise QuestionFileError(f"no usable questions{first}")
    return usable, errors
