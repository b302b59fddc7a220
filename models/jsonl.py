"""Reading JSON-lines files that people give us, where a bad line costs only itself.

Question files (``prmloop sample --file``) and outside data sets (``prmloop dataset import``) are
JSON lines, plain or gzip-compressed. :func:`read_json_lines` yields every line that is a JSON object
and reports every other line as ``<file>:<line>: <what>; line skipped``: not UTF-8, not JSON, nested
deeper than :data:`MAX_DEPTH`, longer than the caller's byte limit, or not an object. A damaged archive
(truncated, corrupt) keeps the lines read before the damage and says at which line reading stopped;
a file named ``.gz`` that is not compressed is read as plain text, with a note.

Why here: the readers above (question sources, dataset importers) share one rule and one owner, and
this module needs nothing but the standard library.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from io import BufferedIOBase
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_MAX_LINE_BYTES", "MAX_DEPTH", "DataFileError", "JsonLine", "json_error", "read_json_lines"]

#: A line longer than this is skipped unless the caller sets its own limit (read in bounded pieces).
DEFAULT_MAX_LINE_BYTES = 1024 * 1024
#: Objects and lists nested deeper than this are refused: what reads the rows may recurse.
MAX_DEPTH = 64

_GZIP_MAGIC = b"\x1f\x8b"
#: What ends a JSON token: whitespace, a structural character or a quote.
_TOKEN_END = re.compile(r'[\s,:{}\[\]"]')
_SKIP_CHUNK = 1024 * 1024


class DataFileError(ValueError):
    """A data file that cannot be opened at all (missing, a folder, not readable)."""


@dataclass(frozen=True, slots=True)
class JsonLine:
    """One JSON object of a file, with where it was: ``where`` is ``<file>:<line>``."""

    line_no: int
    where: str
    row: dict[str, Any]


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests objects or lists deeper than :data:`MAX_DEPTH` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > MAX_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def _open(path: Path, errors: list[str]) -> tuple[BufferedIOBase, BufferedIOBase]:
    """(the file, its lines' bytes): decompressed when it is gzip data, by its first bytes whatever its name."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise DataFileError(f"{path} not found") from None
    except OSError as exc:
        raise DataFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        compressed = handle.read(2) == _GZIP_MAGIC
        handle.seek(0)
    except OSError as exc:
        handle.close()
        raise DataFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if compressed:
        return handle, gzip.GzipFile(fileobj=handle, mode="rb")
    if path.suffix == ".gz":
        errors.append(f"{path}: named .gz but not gzip-compressed; read as plain text")
    return handle, handle


def read_json_lines(
    path: Path, errors: list[str], *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[JsonLine]:
    """The JSON objects of ``path``, one per non-blank line; every problem is appended to ``errors``.

    Raises:
        DataFileError: the file does not exist or cannot be opened.
    """
    path = Path(path)
    file, handle = _open(path, errors)
    line_no = 0
    try:
        while True:
            line_no += 1
            where = f"{path}:{line_no}"
            try:
                raw = handle.readline(max_line_bytes + 1)
                if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                    size = len(raw) + _skip_rest_of_line(handle)
                    errors.append(f"{where}: line of {size} bytes is longer than {max_line_bytes}; line skipped")
                    continue
            except (EOFError, OSError, zlib.error) as exc:
                damage = "ends early (truncated?)" if isinstance(exc, EOFError) else f"is damaged ({exc})"
                errors.append(
                    f"{where}: the file {damage}; reading stopped here, the {line_no - 1} lines before it were read"
                )
                return
            if not raw:
                return
            row = _parse(raw, where, errors)
            if row is not None:
                yield JsonLine(line_no, where, row)
    finally:
        handle.close()
        file.close()


def json_error(text: str, exc: json.JSONDecodeError) -> str:
    """What is wrong with the JSON ``text`` (one line, without its line break), at the column where it is.

    A line cut short (an open string, or the text ending where more JSON must follow) is called
    truncated: JSON's own message for it ("Expecting value") would point at the end, not say why.
    """
    end = len(text.rstrip())
    if exc.msg.startswith("Unterminated string"):
        return (
            f"not valid JSON: truncated line (the string starting at column {exc.colno} is still open "
            f"where the line ends, column {end})"
        )
    # The parser stopped in the line's last token (`tr` of `true`, `1.` of `1.5`) or at its end.
    if not exc.msg.startswith("Extra data") and not _TOKEN_END.search(text, exc.pos, end):
        return f"not valid JSON: truncated line (it ends at column {end} before the JSON is complete)"
    return f"not valid JSON ({exc.msg} at column {exc.colno})"


def _skip_rest_of_line(handle: BufferedIOBase) -> int:
    skipped = 0
    while True:
        chunk = handle.readline(_SKIP_CHUNK)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped


def _parse(raw: bytes, where: str, errors: list[str]) -> dict[str, Any] | None:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        errors.append(f"{where}: not UTF-8 (byte {exc.start}); re-encode the file as UTF-8; line skipped")
        return None
    if not line.strip():
        return None
    # Without its line break, so that a position at the end of the line is a column of this line.
    line = line.rstrip("\r\n")
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        errors.append(f"{where}: {json_error(line, exc)}; line skipped")
        return None
    except RecursionError:
        errors.append(f"{where}: JSON nested too deeply (more than {MAX_DEPTH} levels); line skipped")
        return None
    if not isinstance(row, dict):
        errors.append(f"{where}: expected a JSON object, got {type(row).__name__}; line skipped")
        return None
    if _too_deep(row):
        errors.append(f"{where}: JSON nested too deeply (more than {MAX_DEPTH} levels); line skipped")
        return None
    return row
