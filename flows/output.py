"""Printing query results (``prmloop sql``) so that stored data can never drive the terminal.

Stored text comes from models and imported files: it may hold ANSI escape sequences (colours,
cursor moves, a cleared screen, a changed window title), carriage returns that overwrite what was
printed, bidirectional overrides that reorder it, or Rich markup such as ``[red]``. The table format
shows every such character as a visible escape (``\\x1b``, ``\\r``, ``\\u202e``) and hands cells to
Rich as :class:`~rich.text.Text`, which is never parsed for markup or emoji codes. CSV gets the same
escapes except for newlines and tabs (quoted fields keep them). JSON is JSON: ``json.dumps`` escapes
every control character, and non-finite floats become ``null`` so each line stays valid JSON.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["OutputFormat", "escape_control", "print_rows"]


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


# C0 and C1 controls (but newline and tab), DEL, zero-width and bidirectional formatting characters,
# line/paragraph separators, and the byte-order mark.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")
_CONTROL_OR_LAYOUT = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}


def _visible(match: re.Match[str]) -> str:
    """The escape Python's ``repr`` would show for the character."""
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape_control(text: str, *, keep_layout: bool = True) -> str:
    """``text`` with every terminal control character shown as a visible escape.

    ``keep_layout`` keeps newlines and tabs (harmless, and part of multi-line text such as a
    solution); everything else that a terminal would act on is escaped.
    """
    return (_CONTROL if keep_layout else _CONTROL_OR_LAYOUT).sub(_visible, text)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _cell(value: Any) -> str:
    return "NULL" if value is None else escape_control(str(value))


def print_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: OutputFormat | str = OutputFormat.table,
    *,
    out: TextIO | None = None,
    console: Console | None = None,
    err: Console | None = None,
) -> None:
    """Print a query result as a table (default), CSV, or JSON lines (one object per row).

    ``out`` is where CSV and JSON go (stdout by default); ``console`` renders the table and ``err``
    gets the row count (stdout and stderr consoles by default).
    """
    fmt = OutputFormat(fmt)
    stream = out or sys.stdout
    if fmt is OutputFormat.csv:
        writer = csv.writer(stream)
        writer.writerow([escape_control(str(c)) for c in columns])
        writer.writerows(
            [v if v is None or isinstance(v, int | float) else escape_control(str(v)) for v in row] for row in rows
        )
    elif fmt is OutputFormat.json:
        for row in rows:
            record = {str(c): _json_safe(v) for c, v in zip(columns, row, strict=True)}
            stream.write(json.dumps(record, default=str, allow_nan=False) + "\n")
    else:
        table = Table(show_lines=False)
        for column in columns:
            table.add_column(Text(escape_control(str(column), keep_layout=False)))
        for row in rows:
            table.add_row(*(Text(_cell(v)) for v in row))
        (console or Console()).print(table)
        (err or Console(stderr=True)).print(Text(f"{len(rows)} row(s)"))
