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
import textwrap
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["OutputFormat", "escape_control", "print_rows", "print_status"]


class OutputFormat(StrEnum):
    """``table``: columns, or one block per record where the columns do not fit the terminal;
    ``records``: always one block per record; ``csv``; ``json`` (one object per line)."""

    table = "table"
    records = "records"
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
        console = console or Console()
        names = [escape_control(str(c), keep_layout=False) for c in columns]
        cells = [[_cell(v) for v in row] for row in rows]
        if fmt is OutputFormat.records or _natural_width(names, cells) > console.width:
            _print_records(names, cells, console)
        else:
            table = Table(show_lines=False)
            for name in names:
                table.add_column(Text(name))
            for row in cells:
                table.add_row(*(Text(v) for v in row))
            console.print(table)
        (err or Console(stderr=True)).print(Text(f"{len(rows)} row(s)"))


def _natural_width(names: Sequence[str], cells: Sequence[Sequence[str]]) -> int:
    """The width a table needs to show every cell on one line (Rich's borders and padding included)."""
    widths = [len(name) for name in names]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], max((len(line) for line in value.split("\n")), default=0))
    return sum(widths) + 3 * len(widths) + 1


def _print_records(names: Sequence[str], cells: Sequence[Sequence[str]], console: Console) -> None:
    """One block per record, ``column  value`` a line, long values folded under their start (``psql``'s
    expanded display): what a table too wide for the terminal becomes."""
    width = max(20, console.width)
    label = min(max((len(n) for n in names), default=0), max(8, width // 3))
    room = width - label - 2
    for number, row in enumerate(cells, start=1):
        console.print(Text(f"-- record {number} ".ljust(min(width, 40), "-")), soft_wrap=True)
        for name, value in zip(names, row, strict=True):
            fits = len(name) <= label
            lines = [] if fits else [name]  # a name wider than its column gets a line of its own
            for part in value.expandtabs(4).split("\n"):
                for i in range(0, max(1, len(part)), room):
                    prefix = name.ljust(label) if fits and not lines else " " * label
                    lines.append(f"{prefix}  {part[i : i + room]}".rstrip())
            console.print(Text("\n".join(lines)), soft_wrap=True)


# --------------------------------------------------------------------------------------------------
# `prmloop status` on a terminal
# --------------------------------------------------------------------------------------------------


def print_status(report: dict[str, Any], console: Console | None = None) -> None:
    """``prmloop status``'s report as a few readable lines (its JSON is ``--json``): services and their
    state, broker, consumer lag, dead letters, the newest hour's rates, labels kept and MC-vs-judge
    agreement, cost, the PRM in force (ensemble or LoRA), the learning curve and the calibration."""
    console = console or Console()
    width = max(40, console.width)
    for line in status_lines(report):
        shown = escape_control(line, keep_layout=False)
        wrapped = textwrap.wrap(shown, width, subsequent_indent=" " * 12, break_on_hyphens=False) or [""]
        console.print(Text("\n".join(wrapped)), soft_wrap=True)


def status_lines(report: dict[str, Any]) -> list[str]:
    """The lines :func:`print_status` prints (plain text; stored and logged text is escaped there)."""
    lines: list[str] = []
    store = report.get("db_path") or report.get("store")
    if "events" in report:
        last = str(report.get("last_ingested_at") or "never")[:19].replace("T", " ")
        lines.append(f"store       {store}: {report['events']:,} events, last stored {last}")
        if report.get("conflicts"):
            lines.append(f"            {report['conflicts']} conflicting duplicates (SELECT * FROM conflicts)")
    else:
        lines.append(f"store       {store}")
    lines += _service_lines("services", report.get("services"))
    if "cluster" in report:
        lines += _service_lines("cluster", report.get("cluster"))
    lines.append("broker      " + _broker(report.get("broker")))
    lines.append("lag         " + _lag(report.get("consumers")))
    lines.append("dead        " + _dead(report.get("dead_letters")))
    if "per_hour" in report:
        lines += _label_lines(report)
    lines.append("(prmloop status --json: everything, as JSON)")
    return lines


def _service_lines(title: str, services: Any) -> list[str]:
    if not isinstance(services, dict) or not services:
        return [f"{title:<12}none recorded (prmloop up starts them)"]
    out = []
    for i, (name, s) in enumerate(services.items()):
        state = s.get("state", "?")
        detail = f"pid {s.get('pid')}"
        if state == "dead":
            detail += f", last log line: {s.get('last_log_line') or '(empty)'}"
        elif isinstance(s.get("serves"), dict):
            detail += f", serves {s['serves'].get('bootstrap_servers')}"
        elif s.get("serves"):
            detail += f", serves {s['serves']}"
        elif isinstance(s.get("broker"), dict):
            broker = s["broker"]
            where = broker.get("name") or broker.get("bootstrap_servers")
            stale = " (not the broker of broker.json)" if broker.get("current") is False else ""
            detail += f", reads {where}{stale}"
        if isinstance(s.get("load"), dict):
            detail += ", " + _engine_load(s["load"])
        out.append(f"{title if i == 0 else '':<12}{name:<11} {state:<8} {detail}")
    return out


def _engine_load(load: dict[str, Any]) -> str:
    parts = []
    if "cpu_cores_busy" in load:
        parts.append(f"{load['cpu_cores_busy']} cores busy")
    if "requests_running" in load:
        parts.append(f"{load['requests_running']:g} running, {load.get('requests_waiting', 0):g} waiting")
    if "generation_tokens" in load:
        parts.append(f"{load['generation_tokens']:,.0f} tokens generated")
    return ", ".join(parts) or "load unknown"


def _broker(broker: Any) -> str:
    if not isinstance(broker, dict):
        return str(broker)
    reachable = broker.get("reachable")
    if isinstance(reachable, list):
        answer = f"{len(reachable)} answering" if reachable else "none answering"
    else:
        answer = "reachable" if reachable else "not reachable"
    return f"{broker.get('bootstrap_servers') or 'none'} (from {broker.get('from')}), {answer}"


def _lag(consumers: Any) -> str:
    if not isinstance(consumers, dict):
        return str(consumers)
    lag = consumers.get("lag") or {}
    if not lag:
        return "no consumer group has committed yet"
    parts = [f"{group.removeprefix('prmloop-')} {sum(topics.values()):,}" for group, topics in lag.items()]
    return " · ".join(parts) + (" (approximate)" if consumers.get("approximate") else "")


def _dead(dead: Any) -> str:
    if not isinstance(dead, dict):
        return str(dead)
    held = {topic: d for topic, d in dead.items() if isinstance(d, dict) and d.get("count")}
    if not held:
        return "none"
    return " · ".join(
        f"{topic} {d['count']}" + (f" (newest {d['newest_error_type']})" if d.get("newest_error_type") else "")
        for topic, d in held.items()
    )


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _label_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    hours = report.get("per_hour") or []
    if hours:
        h = hours[-1]
        lines.append(
            f"per hour    {h['solutions']:,} solutions, {h['labels']:,} MC labels, {h['judged']:,} judged, "
            f"{h['accepted']:,} accepted, {h['rejected']:,} rejected (the hour from {str(h['hour'])[:16]}, "
            "the newest with events)"
        )
    accepted, rejected = report.get("accepted", 0), report.get("rejected", 0)
    line = (
        f"labels      {accepted:,} accepted, {rejected:,} rejected (acceptance {_pct(report.get('acceptance_rate'))})"
    )
    lines.append(line)
    for method, a in (report.get("agreement") or {}).items():
        lines.append(
            f"            MC vs {method} judge: same first error on {a['agree']} of {a['decided']} it decided "
            f"({_pct(a['rate'])}); it decided {a['decided']} of {a['solutions']}"
        )
    for i, (why, n) in enumerate((report.get("rejections") or {}).items()):
        lines.append(f"{'rejected' if i == 0 else '':<12}{n:>5}  {why}")
    per_label = report.get("tokens_per_accepted_label")
    lines.append(
        f"cost        {report.get('label_tokens', 0):,} tokens labelling"
        + (f" ({per_label:,.0f} per accepted label)" if per_label else "")
        + f"; {report.get('sampling_tokens', 0):,} tokens sampling {report.get('solutions', 0):,} solutions"
    )
    lines += _prm_lines(report)
    return lines


def _prm_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    models = [("ensemble", report.get("current_prm_ensemble")), ("LoRA", report.get("current_prm"))]
    in_force = [(kind, m) for kind, m in models if isinstance(m, dict)]
    if not in_force:
        lines.append("PRM         none in force yet (none promoted)")
    for i, (kind, m) in enumerate(in_force):
        metrics = m["metrics"] if isinstance(m.get("metrics"), dict) else {}
        shown = ", ".join(f"{k} {v:.3g}" for k, v in metrics.items() if isinstance(v, int | float))[:60]
        when = str(m.get("registered_at") or "")[:16]
        lines.append(f"{'PRM' if i == 0 else '':<12}{kind} {m.get('model_id')} in force since {when}; {shown}")
    learning = report.get("learning") or []
    if learning:
        lines.append(
            f"learning    test F1 [95 % CI] by retrain: {_test_curve(learning[-5:])} ({len(learning)} retrains)"
        )
    calibration = report.get("calibration")
    if isinstance(calibration, dict):
        lines.append(
            f"calibrated  {calibration.get('calibration_id')}: {calibration.get('method')} on "
            f"{calibration.get('prm')} ({calibration.get('score_rule')}), {str(calibration.get('fitted_at'))[:16]}"
        )
    else:
        lines.append("calibrated  not yet")
    return lines


def _test_curve(learning: list[dict[str, Any]]) -> str:
    """Retrains' test F1 with their intervals (``0.81 [0.79, 0.83]``); the validation F1 of older models
    that have none, marked ``(val)``."""
    parts = []
    for r in learning:
        if r.get("test_f1") is not None:
            lo, hi = r.get("test_f1_lo"), r.get("test_f1_hi")
            interval = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
            parts.append(f"{r['test_f1']:.2f}{interval}")
        elif r.get("heldout_f1") is not None:
            parts.append(f"{r['heldout_f1']:.2f} (val)")
        else:
            parts.append("-")
    return " → ".join(parts)
