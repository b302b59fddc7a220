"""``prmloop export``: any table or view of the store as Parquet, for people who use other tools.

Streams record batches from a read-only connection into a Parquet writer, so a view larger than
memory exports too; writes to a temporary file and renames it, so a reader of the output never sees
half a file. Works on the DuckDB file and on a DuckLake.

An existing ``<view>.parquet`` is never overwritten silently: without ``force`` the export refuses
before writing anything (one line naming the files); with ``force`` each file is replaced whole, by
rename, and its row says what it replaced (``replaced_bytes``). A failed write leaves the old file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from prmloop.store.tables.duck import StoreLocation, open_reader

BATCH_ROWS = 50_000


class ExportError(ValueError):
    """An export that cannot start or finish: the output folder, a file in the way, a failed write."""


def exportable(location: StoreLocation) -> list[str]:
    """The store's tables and views (not DuckDB's own catalog views), sorted."""
    with open_reader(location) as (con, _):
        rows = con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT internal "
            "UNION SELECT view_name FROM duckdb_views() WHERE database_name = current_database() AND NOT internal"
        ).fetchall()
    return sorted(r[0] for r in rows)


def export_views(
    location: StoreLocation,
    names: Sequence[str],
    out_dir: Path,
    *,
    force: bool = False,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Write each of ``names`` to ``out_dir/<name>.parquet``; returns one row per file (rows, bytes,
    and ``replaced_bytes``: the size of the file it replaced, or ``None``).

    Raises:
        ValueError: a name that is no table or view of the store (the message lists them).
        ExportError: ``out_dir`` is not a folder or cannot be made; a ``<name>.parquet`` exists and
            ``force`` is not given (nothing is written); a write failed (the old file is kept).
    """
    names = list(dict.fromkeys(names))
    available = exportable(location)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(
            f"no table or view named {', '.join(unknown)} in the store; choose from {', '.join(available)}"
        )
    _prepare(out_dir, names, force=force)
    written = []
    for name in names:
        target = out_dir / f"{name}.parquet"
        partial = out_dir / f".{name}.parquet.partial"
        replaced = target.stat().st_size if target.exists() else None
        rows = 0
        try:
            with open_reader(location) as (con, _):
                reader = con.execute(f'SELECT * FROM "{name}"').to_arrow_reader(BATCH_ROWS)
                with pq.ParquetWriter(partial, reader.schema, compression="zstd") as writer:
                    for batch in reader:
                        writer.write_batch(batch)
                        rows += batch.num_rows
                        if progress is not None:
                            progress({"view": name, "rows": rows})
            os.replace(partial, target)
        except OSError as exc:
            raise ExportError(
                f"writing {target} failed ({exc.strerror or exc}); "
                f"{'the old file is kept' if replaced is not None else 'nothing written'}"
            ) from None
        finally:
            partial.unlink(missing_ok=True)
        written.append(
            {
                "view": name,
                "path": str(target),
                "rows": rows,
                "bytes": target.stat().st_size,
                "replaced_bytes": replaced,
            }
        )
    return written


def _prepare(out_dir: Path, names: Sequence[str], *, force: bool) -> None:
    """Make ``out_dir``; refuse, before anything is written, where an export would overwrite without ``force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"--out {out_dir} is a file, not a folder; give a folder for the <view>.parquet files")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create the folder {out_dir} ({exc.strerror or exc}); choose another --out") from None
    targets = [out_dir / f"{name}.parquet" for name in names]
    folders = [str(t) for t in targets if t.is_dir()]
    if folders:
        raise ExportError(f"{', '.join(folders)} is a folder; move it away or choose another --out; nothing written")
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise ExportError(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; nothing written: "
            "pass --force to replace, or choose another --out folder"
        )
