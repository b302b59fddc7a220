"""print_rows: stored text can never style, move or clear the terminal, and JSON stays JSON."""

from __future__ import annotations

import csv
import io
import json

from rich.console import Console

from prmloop.flows.output import escape_control, print_rows

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
