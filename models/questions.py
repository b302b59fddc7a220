"""Question sets with gold answers: GSM8K, MATH-500, MATH (test 5000) and GSM-Plus, as one record.

The files live in the shared data folder (``../shared/data`` next to the repository, see its
``MANIFEST.md``), never in the repository; ``PRMLOOP_DATA_DIR`` points elsewhere. Every loader
returns :class:`Question` records in file order, with a stable ``id`` so events can refer to them.

Gold answers, per the data sets' own conventions:

- GSM8K: the text after ``####`` in ``answer`` (Cobbe et al., 2021);
- MATH-500 (the PRM800K test split): the ``answer`` field;
- MATH test: the last ``\\boxed{}`` of ``solution`` (Hendrycks et al., 2021);
- GSM-Plus: the ``answer`` field; the "critical thinking" perturbation has none (``"None"``) and is
  skipped unless asked for, with ``gold_answer=None``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, JsonValue

from prmloop.models.answers import last_boxed
from prmloop.models.jsonl import json_error

__all__ = [
    "DATASETS",
    "DATASET_FILES",
    "Question",
    "data_dir",
    "dataset_file",
    "load_gsm8k",
    "load_gsm_plus",
    "load_math",
    "load_math500",
    "load_questions",
]

DATA_DIR_ENV = "PRMLOOP_DATA_DIR"


class Question(BaseModel):
    """One question with its gold answer.

    Attributes:
        id: stable identifier, ``<dataset>/<split>/<row or upstream id>``.
        dataset: ``gsm8k``, ``math500``, ``math`` or ``gsm_plus``.
        problem: the question text shown to the generator.
        gold_answer: the reference final answer (``None`` only for GSM-Plus critical-thinking items).
        metadata: everything else the source row carries that is useful downstream (level, subject,
            reference solution, perturbation type, ...).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    dataset: str
    problem: str
    gold_answer: str | None
    metadata: dict[str, JsonValue] = {}


def data_dir() -> Path:
    """The shared data folder: ``$PRMLOOP_DATA_DIR``, else ``../shared/data`` beside the repository."""
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data"


#: The file of each data set's split, relative to :func:`data_dir`; the first split is the default.
DATASET_FILES: dict[str, dict[str, str]] = {
    "gsm8k": {"test": "gsm8k/test.jsonl", "train": "gsm8k/train.jsonl"},
    "math500": {"test": "math/math500_test.jsonl"},
    "math": {"test": "math/math_test_5000.jsonl"},
    "gsm_plus": {"testmini": "gsm_plus/gsmplus_testmini.jsonl"},
}


def dataset_file(dataset: str, split: str | None = None, *, root: Path | None = None) -> Path:
    """The file of ``dataset``'s ``split`` (default: its first), checked to exist.

    Raises:
        ValueError: an unknown data set or split (the message lists the valid ones).
        FileNotFoundError: the file is not in the shared data folder.
    """
    splits = DATASET_FILES.get(dataset)
    if splits is None:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(sorted(DATASET_FILES))}")
    chosen = split if split is not None else next(iter(splits))
    if chosen not in splits:
        raise ValueError(f"{dataset} has no split {chosen!r}; choose one of {', '.join(splits)}")
    return _resolve(splits[chosen], root)


def _resolve(relative: str, root: Path | None) -> Path:
    base = root if root is not None else data_dir()
    path = base / relative
    if not path.is_file():
        raise FileNotFoundError(
            f"question file {path} not found; put the shared folder beside the clone (../shared/data) or set "
            f"{DATA_DIR_ENV} to the folder that holds {relative} (the shared data folder described by its MANIFEST.md)"
        )
    return path


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(1-based line number, row)`` for each non-blank JSON line, checking the required keys."""
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            text = line.rstrip("\r\n")
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: {json_error(text, exc)}") from exc
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            missing = [key for key in required if not isinstance(row.get(key), str)]
            if missing:
                raise ValueError(f"{path}:{line_no}: missing or non-string field(s) {missing}")
            yield line_no, row


def _take(rows: Iterator[Question], limit: int | None) -> list[Question]:
    out: list[Question] = []
    for question in rows:
        if limit is not None and len(out) >= limit:
            break
        out.append(question)
    return out


def load_gsm8k(
    split: Literal["train", "test"] = "test", *, limit: int | None = None, root: Path | None = None
) -> list[Question]:
    """GSM8K (``gsm8k/{split}.jsonl``); the gold answer is the text after ``####``."""
    path = dataset_file("gsm8k", split, root=root)

    def rows() -> Iterator[Question]:
        for index, (line_no, row) in enumerate(_rows(path, ("question", "answer"))):
            solution, sep, gold = row["answer"].rpartition("####")
            if not sep or not gold.strip():
                raise ValueError(f"{path}:{line_no}: GSM8K answer has no '#### <answer>' line")
            yield Question(
                id=f"gsm8k/{split}/{index}",
                dataset="gsm8k",
                problem=row["question"],
                gold_answer=gold.strip(),
                metadata={"solution": solution.strip()},
            )

    return _take(rows(), limit)


def load_math500(*, limit: int | None = None, root: Path | None = None) -> list[Question]:
    """MATH-500 (``math/math500_test.jsonl``, the PRM800K test split); gold = the ``answer`` field."""
    path = dataset_file("math500", root=root)

    def rows() -> Iterator[Question]:
        for _, row in _rows(path, ("problem", "answer", "unique_id")):
            yield Question(
                id=f"math500/{row['unique_id']}",
                dataset="math500",
                problem=row["problem"],
                gold_answer=row["answer"],
                metadata={
                    "solution": row.get("solution"),
                    "subject": row.get("subject"),
                    "level": row.get("level"),
                    "unique_id": row["unique_id"],
                },
            )

    return _take(rows(), limit)


def load_math(*, limit: int | None = None, root: Path | None = None) -> list[Question]:
    """MATH test set (``math/math_test_5000.jsonl``); gold = the last ``\\boxed{}`` of ``solution``."""
    path = dataset_file("math", root=root)

    def rows() -> Iterator[Question]:
        for index, (line_no, row) in enumerate(_rows(path, ("problem", "solution"))):
            gold = last_boxed(row["solution"])
            if gold is None:
                raise ValueError(f"{path}:{line_no}: MATH solution has no complete \\boxed{{...}} answer")
            yield Question(
                id=f"math/test/{row.get('idx', index)}",
                dataset="math",
                problem=row["problem"],
                gold_answer=gold,
                metadata={"solution": row["solution"], "level": row.get("level"), "type": row.get("type")},
            )

    return _take(rows(), limit)


def load_gsm_plus(
    *, include_unanswerable: bool = False, limit: int | None = None, root: Path | None = None
) -> list[Question]:
    """GSM-Plus test-mini (``gsm_plus/gsmplus_testmini.jsonl``); ids keep the file's row number."""
    path = dataset_file("gsm_plus", root=root)

    def rows() -> Iterator[Question]:
        for index, (_, row) in enumerate(_rows(path, ("question", "answer", "perturbation_type"))):
            gold: str | None = row["answer"].strip()
            if gold in ("", "None"):
                if not include_unanswerable:
                    continue
                gold = None
            yield Question(
                id=f"gsm_plus/testmini/{index}",
                dataset="gsm_plus",
                problem=row["question"],
                gold_answer=gold,
                metadata={
                    "perturbation_type": row["perturbation_type"],
                    "solution": row.get("solution"),
                    "seed_question": row.get("seed_question"),
                    "seed_answer": row.get("seed_answer"),
                },
            )

    return _take(rows(), limit)


DATASETS: dict[str, Callable[..., list[Question]]] = {
    "gsm8k": load_gsm8k,
    "math500": load_math500,
    "math": load_math,
    "gsm_plus": load_gsm_plus,
}
"""Loader per dataset name; each accepts ``limit=`` and ``root=`` keywords."""


def load_questions(
    dataset: str, *, limit: int | None = None, root: Path | None = None, split: str | None = None, **options: Any
) -> list[Question]:
    """Load ``dataset`` (a key of :data:`DATASETS`), of ``split`` (one of its :data:`DATASET_FILES`),
    passing ``options`` such as ``include_unanswerable=True``.

    Raises:
        ValueError: an unknown data set or split.
        FileNotFoundError: its file is not in the shared data folder.
    """
    dataset_file(dataset, split, root=root)
    # Only GSM8K's loader takes a split; the others have one, which dataset_file has just checked.
    if split is not None and len(DATASET_FILES[dataset]) > 1:
        options["split"] = split
    return DATASETS[dataset](limit=limit, root=root, **options)
