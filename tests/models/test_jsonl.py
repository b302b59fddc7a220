"""The shared JSON-lines reader (models/jsonl.py): a bad line or a damaged archive costs only itself."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prmloop.models.jsonl import MAX_DEPTH, DataFileError, read_json_lines


def _read(path: Path, **options: int) -> tuple[list[int], list[str]]:
    errors: list[str] = []
    lines = [line.line_no for line in read_json_lines(path, errors, **options)]
    return lines, errors


def test_every_kind_of_bad_line_is_named_and_the_good_ones_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    deep_but_parseable = json.dumps({"a": json.loads("[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5))})
    path.write_bytes(
        b"\n".join(
            [
                b'{"ok": 1}',
                b"",  # blank: not a problem
                b"[1, 2]",
                b'{"text": "caf\xe9"}',
                b"{not json",
                deep_but_parseable.encode(),
                b'{"big": "' + b"x" * 5000 + b'"}',
                b'{"ok": 2}',
            ]
        )
    )
    lines, errors = _read(path, max_line_bytes=1000)
    assert lines == [1, 8]
    assert [e.split(": ", 1)[0] for e in errors] == [f"{path}:{n}" for n in (3, 4, 5, 6, 7)]
    assert "expected a JSON object, got list" in errors[0]
    assert "not UTF-8 (byte 13)" in errors[1]
    assert "not valid JSON" in errors[2]
    assert f"nested too deeply (more than {MAX_DEPTH} levels)" in errors[3]
    assert "line of 5012 bytes is longer than 1000" in errors[4]
    assert all(e.endswith("; line skipped") for e in errors)


def test_a_damaged_archive_keeps_the_lines_before_the_damage(tmp_path: Path) -> None:
    data = b"".join(json.dumps({"i": i}).encode() + b"\n" for i in range(500))
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(gzip.compress(data) + b"not a gzip member")  # e.g. two files glued together
    lines, errors = _read(path)
    assert lines == list(range(1, 501))
    assert errors == [
        f"{path}:501: the file is damaged (Not a gzipped file (b'no')); "
        "reading stopped here, the 500 lines before it were read"
    ]


def test_a_file_that_cannot_be_opened_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="not found"):
        _read(tmp_path / "missing.jsonl")
    with pytest.raises(DataFileError, match="cannot read"):
        _read(tmp_path)


_QUESTION = {"id": "q-1", "problem": 'What is 2 + 3.5? Say "x".', "answer": -5.5e-1, "ok": True, "none": None, "m": [1]}


@given(cut=st.integers(min_value=1, max_value=len(json.dumps(_QUESTION)) - 1), newline=st.sampled_from(["\n", "\r\n"]))
@settings(max_examples=200, deadline=None)
def test_a_line_cut_short_is_called_truncated_at_a_column_of_that_line(
    cut: int, newline: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Seen: a truncated line was reported as "Expecting value at column 1" (the column after the line break)."""
    path = tmp_path_factory.mktemp("cut") / "questions.jsonl"
    whole = json.dumps(_QUESTION)
    path.write_text(whole + newline + whole[:cut] + newline + whole + newline, newline="")
    lines, errors = _read(path)
    assert lines == [1, 3]
    assert len(errors) == 1 and errors[0].startswith(f"{path}:2: not valid JSON: truncated line")
    columns = [int(c) for c in re.findall(r"column (\d+)", errors[0])]
    assert columns and all(1 <= c <= cut for c in columns)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"a": 1} x', "Extra data at column 10"),
        ('{"a": tru, "b": 1}', "Expecting value at column 7"),
        ('{"a": 1 "b": 2}', "Expecting ',' delimiter at column 9"),
    ],
)
def test_a_broken_line_that_is_not_cut_short_names_the_column_of_the_damage(
    line: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(line + "\n")
    _, errors = _read(path)
    assert errors == [f"{path}:1: not valid JSON ({message}); line skipped"]
