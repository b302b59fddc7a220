"""Importers of outside step-labelled data into snapshots (the format of :mod:`prmloop.store.snapshot`).

- ProcessBench (``{id, problem, steps, label}``, ``label`` = first wrong step or -1);
- PRMBench (``modified_process`` with 1-based ``error_steps``, and the ``original_process`` as a correct
  solution);
- Math-Shepherd-style text: a JSONL with ``input`` (the question and the steps, each step ending in the
  tag ``ки``) and ``label`` (the same text with each tag replaced by ``+`` or ``-``).

Steps after a solution's first error carry no trustworthy label in any of these (PRMBench and
ProcessBench annotate the first error; a later step may be right or wrong), so a solution is cut after
its first wrong step: its labels are ``True ... True False``. A line that cannot be read is reported
(``file:line: what``) and skipped; the import goes on.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prmloop.models.processbench import read_processbench
from prmloop.store.snapshot import SnapshotRow

__all__ = ["SHEPHERD_TAG", "import_rows"]

SHEPHERD_TAG = "ки"
_STEP_ONE = re.compile(r"Step\s*1\s*[:.]")


def _truncated(qid: str, sid: str, problem: str, steps: list[str], *, first_error: int, source: str) -> SnapshotRow:
    if first_error < 0:
        kept, labels, first = steps, [True] * len(steps), None
    else:
        kept, labels, first = steps[: first_error + 1], [True] * first_error + [False], first_error
    return SnapshotRow(qid, sid, problem, tuple(kept), tuple(labels), None, first, source, None)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        yield from enumerate(handle, start=1)


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
    rows, errors = [], []
    for line_no, line in _lines(path):
        where = f"{path}:{line_no}"
        try:
            d: dict[str, Any] = json.loads(line)
            qid = f"prmbench/{d['idx']}"
            problem = str(d.get("modified_question") or d["question"])
            steps = [str(s) for s in d["modified_process"]]
            errors_at = sorted(int(e) for e in d["error_steps"])
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"{where}: not a PRMBench case ({type(exc).__name__}: {exc}); line skipped")
            continue
        if not steps:
            errors.append(f"{where}: no steps; line skipped")
            continue
        first = errors_at[0] - 1 if errors_at else -1
        if first >= len(steps):
            errors.append(f"{where}: error step {first + 1} beyond its {len(steps)} steps; line skipped")
            continue
        kind = d.get("classification", "?")
        rows.append(_truncated(qid, f"{qid}/modified", problem, steps, first_error=first, source=f"prmbench:{kind}"))
        original = [str(s) for s in d.get("original_process") or []]
        if original:
            question = str(d.get("original_question") or problem)
            rows.append(
                _truncated(qid, f"{qid}/original", question, original, first_error=-1, source="prmbench:original")
            )
    return rows, errors


def _shepherd(path: Path) -> tuple[list[SnapshotRow], list[str]]:
    rows, errors = [], []
    for line_no, line in _lines(path):
        where = f"{path}:{line_no}"
        try:
            d = json.loads(line)
            text, labelled = str(d["input"]), str(d["label"])
        except (ValueError, KeyError, TypeError) as exc:
            errors.append(f"{where}: needs 'input' and 'label' ({type(exc).__name__}); line skipped")
            continue
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
        qid = f"shepherd/{d.get('task', 'x')}/{hashlib.sha256(question.encode()).hexdigest()[:12]}"
        rows.append(_truncated(qid, f"{qid}/{line_no}", question, steps, first_error=first, source="shepherd"))
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
