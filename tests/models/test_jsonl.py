"""The shared JSON-lines reader (models/jsonl.py): a bad line or a damaged archive costs only itself."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

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
