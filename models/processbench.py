"""ProcessBench: solutions with human first-error labels (Zheng et al., 2024), read strictly.

``../shared/data/processbench/{gsm8k,math}.json`` is a JSON list; each item has ``id``, ``problem``,
``steps`` (a list of strings), ``label`` (0-based index of the first wrong step, -1 for none),
``final_answer_correct`` (a JSON boolean) and optionally ``generator``. The gold answers are not in
the file; they are looked up by problem text in GSM8K test (``gsm8k``) or MATH test (``math``).

Every item is validated with strict types: ``"false"`` is not a boolean, a string is not a list of
steps, ``null`` is not a list. An item that fails is reported by its position and left out; the rest
are read. The file is one JSON array (gzip-compressed or not), not lines, so a file that is not one
(cut short, not UTF-8, JSON lines) is refused whole, with a one-line error that says where it broke.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from prmloop.models.questions import load_questions

__all__ = [
    "ProcessBenchFileError",
    "ProcessBenchItem",
    "load_processbench",
    "processbench_f1",
    "read_processbench",
]


_GZIP_MAGIC = b"\x1f\x8b"


class ProcessBenchFileError(ValueError):
    """A ProcessBench file that is missing, not JSON, not a list, or has no usable item."""


class ProcessBenchItem(BaseModel):
    """One ProcessBench solution, with its gold answer once looked up."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: StrictStr | StrictInt
    problem: StrictStr = Field(min_length=1)
    steps: tuple[StrictStr, ...] = Field(min_length=1)
    label: StrictInt = Field(ge=-1, description="first wrong step, 0-based; -1: no wrong step")
    final_answer_correct: StrictBool
    generator: StrictStr = ""
    gold_answer: str | None = None

    @property
    def key(self) -> str:
        """The item's id as text (ProcessBench ids are strings such as ``gsm8k-0``)."""
        return str(self.id)


def _problem_key(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def read_processbench(path: Path) -> tuple[list[ProcessBenchItem], list[str]]:
    """The valid items of a ProcessBench file (without gold answers) and one error per invalid item.

    Raises:
        ProcessBenchFileError: no such file, not JSON, not a non-empty list, or not one valid item.
    """
    if not path.is_file():
        raise ProcessBenchFileError(f"{path}: no such ProcessBench file (e.g. ../shared/data/processbench/gsm8k.json)")
    what = "expected one non-empty JSON list of ProcessBench solutions, like ../shared/data/processbench/gsm8k.json"
    try:
        raw = path.read_bytes()
        if raw[:2] == _GZIP_MAGIC:
            raw = gzip.decompress(raw)
        rows = json.loads(raw)
    except OSError as error:  # also a damaged gzip file (BadGzipFile)
        raise ProcessBenchFileError(f"{path}: cannot be read ({error}); {what}") from None
    except (EOFError, zlib.error) as error:
        raise ProcessBenchFileError(f"{path}: damaged gzip data ({error or 'truncated'}); {what}") from None
    except UnicodeDecodeError as error:
        raise ProcessBenchFileError(f"{path}: not UTF-8 (byte {error.start}); {what}") from None
    except json.JSONDecodeError as error:
        hint = " (it looks like JSON lines)" if error.msg == "Extra data" else ""
        raise ProcessBenchFileError(
            f"{path}: not JSON ({error.msg} at line {error.lineno} column {error.colno}){hint}; {what}"
        ) from None
    except RecursionError:
        raise ProcessBenchFileError(f"{path}: JSON nested too deeply to read; {what}") from None
    if not isinstance(rows, list) or not rows:
        kind = "an empty list" if rows == [] else f"a JSON {type(rows).__name__}"
        raise ProcessBenchFileError(f"{path}: {kind}; {what}")
    items: list[ProcessBenchItem] = []
    errors: list[str] = []
    for index, row in enumerate(rows):
        try:
            items.append(ProcessBenchItem.model_validate(row))
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "item"
            errors.append(f"{path}[{index}]: {where}: {first['msg']}; item skipped")
    if not items:
        raise ProcessBenchFileError(
            f"{path}: no valid ProcessBench solution ({len(errors)} invalid; first: {errors[0]})"
        )
    return items, errors


def load_processbench(path: Path, *, subset: str | None = None) -> tuple[list[ProcessBenchItem], list[str]]:
    """The valid items of a ProcessBench file with gold answers looked up by problem text, and the errors.

    ``subset`` (``gsm8k`` or ``math``) names where the gold answers come from; by default it is read
    from the file name.

    Raises:
        ProcessBenchFileError: see :func:`read_processbench`; or an unknown ``subset``.
    """
    items, errors = read_processbench(path)
    subset = subset or processbench_subset(path)
    if subset == "gsm8k":
        source = load_questions("gsm8k", split="test")
    elif subset == "math":
        source = load_questions("math")
    else:
        raise ProcessBenchFileError(f"unknown ProcessBench subset {subset!r}; gold answers exist for gsm8k and math")
    gold = {_problem_key(q.problem): q.gold_answer for q in source}
    return [i.model_copy(update={"gold_answer": gold.get(_problem_key(i.problem))}) for i in items], errors


def processbench_subset(path: Path) -> str:
    """``math`` for a file named like ``math.json``, else ``gsm8k``."""
    return "math" if "math" in path.stem else "gsm8k"


def processbench_f1(predicted: Sequence[int | None], labels: Sequence[int]) -> dict[str, float | None]:
    """The ProcessBench protocol: accuracy on erroneous samples (predicted first error == label), on
    correct samples (predicted "no error", -1 or ``None``), and their harmonic mean (the F1).

    A prediction that could not be read counts as wrong: pass any value that is not a valid step index
    (``-2``, say). A subset with no sample of one kind has ``None`` accuracy for it and no F1.
    """
    if len(predicted) != len(labels):
        raise ValueError(f"{len(predicted)} predictions for {len(labels)} labels")
    normal = [-1 if p is None else p for p in predicted]
    erroneous = [p == y for p, y in zip(normal, labels, strict=True) if y >= 0]
    correct = [p == -1 for p, y in zip(normal, labels, strict=True) if y < 0]
    acc_error = sum(erroneous) / len(erroneous) if erroneous else None
    acc_correct = sum(correct) / len(correct) if correct else None
    f1 = None
    if acc_error is not None and acc_correct is not None:
        f1 = 0.0 if acc_error + acc_correct == 0 else 2 * acc_error * acc_correct / (acc_error + acc_correct)
    return {"error_accuracy": acc_error, "correct_accuracy": acc_correct, "f1": f1}
