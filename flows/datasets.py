"""Importers of outside step-labelled data into snapshots (the format of :mod:`prmloop.store.tables.snapshot`).

- ProcessBench (``{id, problem, steps, label}``, ``label`` = first wrong step or -1);
- PRMBench (``modified_process`` with 1-based ``error_steps``, and the ``original_process`` as a correct
  solution);
- Math-Shepherd-style text: a JSONL with ``input`` (the question and the steps, each step ending in the
  tag ``ки``) and ``label`` (the same text with each tag replaced by ``+`` or ``-``).

Steps after a solution's first error carry no trustworthy label in any of these (PRMBench and
ProcessBench annotate the first error; a later step may be right or wrong), so a solution is cut after
its first wrong step: its labels are ``True ... True False``.

Line files (PRMBench, Math-Shepherd; plain or gzip) are read by
:func:`~prmloop.models.jsonl.read_json_lines`, the reader of question files: a line that is not
UTF-8, not JSON, nested too deeply, too long, or whose fields have the wrong types is reported as
``file:line: what; line skipped`` and the import goes on with the good lines; a truncated or damaged
archive keeps the lines before the damage and says at which line reading stopped. ProcessBench is one
JSON array, not lines: a file that is not one is refused with a one-line error
(:class:`~prmloop.models.processbench.ProcessBenchFileError`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from prmloop.models.jsonl import read_json_lines
from prmloop.models.processbench import read_processbench
from prmloop.store.tables.snapshot import SnapshotRow

__all__ = ["SHEPHERD_TAG", "import_rows"]

SHEPHERD_TAG = "ки"
_STEP_ONE = re.compile(r"Step\s*1\s*[:.]")


def _truncated(qid: str, sid: str, problem: str, steps: list[str], *, first_error: int, source: str) -> SnapshotRow:
    if first_error < 0:
        kept, labels, first = steps, [True] * len(steps), None
    else:
        kept, labels, first = steps[: first_error + 1], [True] * first_error + [False], first_error
    return SnapshotRow(qid, sid, problem, tuple(kept), tuple(labels), None, first, source, None)


class _PrmBenchCase(BaseModel):
    """One PRMBench line, strictly typed (a step that is not a string is not a step)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    idx: StrictStr | StrictInt
    question: StrictStr | None = None
    modified_question: StrictStr | None = None
    original_question: StrictStr | None = None
    modified_process: list[StrictStr]
    original_process: list[StrictStr] | None = None
    error_steps: list[StrictInt]
    classification: StrictStr = "?"


class _ShepherdLine(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    input: StrictStr
    label: StrictStr
    task: StrictStr | None = None


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "line"
    return f"{where}: {first['msg']}"


def _processbench(path: Path) -> tuple[list[SnapshotRow], list[str]]:
    items, errors = read_processbench(path)
    subset = "math" if "math" in path.stem else "gsm8k"
    rows = [
        _truncated(
            f"processbench/{subset}/{i.id}",
            f"processbench/{subset}/{i.id}",
            i.problem,
            list(i.steps),
            first_error=i.label,
            source=f"processbench:{subset}",
        )
        for i in items
    ]
    return rows, errors


def _prmbench(path: Path) -> tuple[list[SnapshotRow], list[str]]:
    rows: list[SnapshotRow] = []
    errors: list[str] = []
    for line in read_json_lines(path, errors):
        where = line.where
        try:
            case = _PrmBenchCase.model_validate(line.row)
        except ValidationError as exc:
            errors.append(f"{where}: not a PRMBench case ({_first_error(exc)}); line skipped")
            continue
        qid = f"prmbench/{case.idx}"
        problem = case.modified_question or case.question
        steps = list(case.modified_process)
        if not problem:
            errors.append(f"{where}: no 'question' or 'modified_question'; line skipped")
            continue
        if not steps:
            errors.append(f"{where}: no steps; line skipped")
            continue
        first = min(case.error_steps) - 1 if case.error_steps else -1
        if first >= len(steps) or (case.error_steps and first < 0):
            errors.append(f"{where}: error step {first + 1} is not one of its {len(steps)} steps; line skipped")
            continue
        source = f"prmbench:{case.classification}"
        rows.append(_truncated(qid, f"{qid}/modified", problem, steps, first_error=first, source=source))
        original = list(case.original_process or [])
        if original:
            question = case.original_question or problem
            rows.append(
                _truncated(qid, f"{qid}/original", question, original, first_error=-1, source="prmbench:original")
            )
    return rows, errors


def _shepherd(path: Path) -> tuple[list[SnapshotRow], list[str]]:
    rows: list[SnapshotRow] = []
    errors: list[str] = []
    for line in read_json_lines(path, errors):
        where = line.where
        try:
            d = _ShepherdLine.model_validate(line.row)
        except ValidationError as exc:
            errors.append(f"{where}: needs 'input' and 'label' as text ({_first_error(exc)}); line skipped")
            continue
        text, labelled = d.input, d.label
        parts = text.split(SHEPHERD_TAG)
        if len(parts) < 2:
            errors.append(f"{where}: no '{SHEPHERD_TAG}' step tag in 'input'; line skipped")
            continue
        head, *steps = [p.strip() for p in parts[:-1]]
        # The first segment is the question and step 1: split at "Step 1:" (Math-Shepherd), else at a newline.
        found = _STEP_ONE.search(head)
        if found:
            question, first_step = head[: found.start()], head[found.start() :]
        else:
            question, _, first_step = head.partition("\n")
        question = question.strip()
        steps = [first_step.strip(), *steps]
        marks = []
        cursor = 0
        for part in parts[:-1]:
            cursor += len(part)
            marks.append(labelled[cursor : cursor + 1])
            cursor += 1
        if len(marks) != len(steps) or any(m not in "+-" for m in marks):
            errors.append(f"{where}: 'label' does not put + or - at each of the {len(steps)} tags; line skipped")
            continue
        first = marks.index("-") if "-" in marks else -1
        qid = f"shepherd/{d.task or 'x'}/{hashlib.sha256(question.encode()).hexdigest()[:12]}"
        rows.append(_truncated(qid, f"{qid}/{line.line_no}", question, steps, first_error=first, source="shepherd"))
    return rows, errors


def import_rows(kind: str, path: Path) -> tuple[list[SnapshotRow], list[str]]:
    """Rows and per-line errors of an outside data set: ``processbench``, ``prmbench`` or ``shepherd``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: unknown ``kind``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found")
    readers = {"processbench": _processbench, "prmbench": _prmbench, "shepherd": _shepherd}
    if kind not in readers:
        raise ValueError(f"unknown data set kind {kind!r}; choose from {', '.join(readers)}")
    return readers[kind](path)
