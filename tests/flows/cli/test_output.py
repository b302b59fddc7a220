"""print_rows: stored text can never style, move or clear the terminal, and JSON stays JSON."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from rich.console import Console

from prmloop.flows.cli.output import escape_control, print_rows

HOSTILE = "ok\x1b[2J\x1b]0;owned\x07\rover\u202eevil[bold red]markup[/] :smile: \\LaTeX{x}\nline2\ttab"
COLUMNS = ["text", "[red]col[/]", "n"]
ROWS = [(HOSTILE, None, 1.5), ("plain", "x", float("nan"))]


def _table(*, colour: bool = False) -> str:
    out = io.StringIO()
    err = io.StringIO()
    console = (
        Console(file=out, width=400, force_terminal=True, color_system="truecolor")
        if colour
        else Console(file=out, width=400)
    )
    print_rows(COLUMNS, ROWS, "table", console=console, err=Console(file=err))
    assert err.getvalue().strip() == "2 row(s)"
    return out.getvalue()


def test_table_shows_control_characters_as_visible_escapes_and_never_reads_markup() -> None:
    text = _table()
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b[2J" in text and "\\x1b]0;owned\\x07" in text and "\\rover" in text and "\\u202e" in text
    assert "[bold red]markup[/]" in text  # shown as written, not styled
    assert "[red]col[/]" in text
    assert ":smile:" in text  # no emoji substitution
    assert "\\LaTeX{x}" in text
    assert "NULL" in text


def test_a_colour_terminal_gets_only_richs_own_escape_sequences() -> None:
    text = _table(colour=True)
    # Rich styles the table header; the data must add nothing: no clear-screen, no title change.
    assert "\x1b[2J" not in text and "\x1b]0;" not in text and "\r" not in text


def test_json_lines_are_valid_json_that_round_trip_the_text() -> None:
    out = io.StringIO()
    print_rows(COLUMNS, ROWS, "json", out=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert all("\x1b" not in line and "\r" not in line for line in lines)
    first, second = (json.loads(line) for line in lines)
    assert first == {"text": HOSTILE, "[red]col[/]": None, "n": 1.5}
    assert second["n"] is None  # NaN is not JSON


def test_csv_escapes_controls_but_keeps_newlines_in_quoted_fields() -> None:
    out = io.StringIO()
    print_rows(COLUMNS, ROWS, "csv", out=out)
    assert "\x1b" not in out.getvalue() and "\u202e" not in out.getvalue()
    parsed = list(csv.reader(io.StringIO(out.getvalue())))
    assert parsed[0] == COLUMNS
    assert parsed[1][0] == escape_control(HOSTILE)
    assert "\nline2\ttab" in parsed[1][0]
    assert parsed[1][0].startswith("ok\\x1b[2J")


def test_escape_control_leaves_ordinary_text_alone() -> None:
    text = "Schritt 1: x² + y² = z², ∑ 5 → 25; 日本語 ✓"
    assert escape_control(text) == text
    assert escape_control("a\nb\tc\r", keep_layout=False) == "a\\nb\\tc\\r"


# The columns of current_labels, and a row as docs/events-and-sql.md's `prmloop sql` shows it.
LABEL_COLUMNS = [
    "solution_id",
    "question_id",
    "step_index",
    "label",
    "source",
    "method",
    "first_error_step",
    "labeled_at",
    "event_id",
    "n_versions",
]
LABEL_ROW = (
    "8d0c2c1e-5a9b-5f7e-9a43-2f1d6e7c8b90",
    "arith/L1/0/3",
    2,
    True,
    "LabelsAccepted",
    "first-error-consensus",
    None,
    "2026-11-27 10:36:03.056976+00:00",
    "0d9c1f4e-8a51-4f43-9d76-3d1a2b7c9e01",
    2,
)


def _render(columns: list[str], rows: Sequence[Sequence[object]], fmt: str, width: int) -> str:
    out = io.StringIO()
    print_rows(columns, rows, fmt, console=Console(file=out, width=width), err=Console(file=io.StringIO()))
    return out.getvalue()


def test_a_table_too_wide_for_80_columns_becomes_one_block_per_record_with_every_value_whole() -> None:
    text = _render(LABEL_COLUMNS, [LABEL_ROW, LABEL_ROW], "table", 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert sum(line.startswith("-- record ") for line in lines) == 2
    for name, value in zip(LABEL_COLUMNS, LABEL_ROW, strict=True):
        shown = "NULL" if value is None else str(value)
        assert any(line.split(None, 1) == [name, shown] for line in lines), (name, shown)


def test_a_table_that_fits_stays_a_table_and_records_can_be_asked_for() -> None:
    narrow = _render(["n", "label"], [(1, True), (2, False)], "table", 80)
    assert "-- record" not in narrow and "label" in narrow.splitlines()[1]
    assert "-- record 2" in _render(["n", "label"], [(1, True), (2, False)], "records", 80)


def test_long_and_multi_line_values_fold_under_their_start() -> None:
    text = _render(["id", "text"], [("s1", "Step 1: " + "x" * 150 + "\nStep 2: done")], "records", 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    start = lines[2].index("Step 1")
    assert all(line[:start].strip() == "" for line in lines[3:])  # continuations are indented
    assert "".join(line[start:] for line in lines[2:-1]) == "Step 1: " + "x" * 150
    assert lines[-1][start:] == "Step 2: done"


def test_records_show_control_characters_as_escapes_too() -> None:
    text = _render(COLUMNS, ROWS, "records", 60)
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text and "\\x1b[2J" in text
