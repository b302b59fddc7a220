"""``prmloop export``: any table or view of the store as Parquet, for people who use other tools.

Streams record batches from a read-only connection into a Parquet writer, so a view larger than
memory exports too; writes to a temporary file and renames it, so a reader of the output never sees
half a file. Works on the DuckDB file and on a DuckLake.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from prmloop.store.duck import StoreLocation, open_reader

BATCH_ROWS = 50_000


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
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Write each of ``names`` to ``out_dir/<name>.parquet``; returns one row per file (rows, bytes).

    Raises:
        ValueError: a name that is no table or view of the store (the message lists them).
    """
    available = exportable(location)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(
            f"no table or view named {', '.join(unknown)} in the store; choose from {', '.join(available)}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        target = out_dir / f"{name}.parquet"
        partial = out_dir / f".{name}.parquet.partial"
        rows = 0
        with open_reader(location) as (con, _):
            reader = con.execute(f'SELECT * FROM "{name}"').to_arrow_reader(BATCH_ROWS)
            with pq.ParquetWriter(partial, reader.schema, compression="zstd") as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    if progress is not None:
                        progress({"view": name, "rows": rows})
        os.replace(partial, target)
        written.append({"view": name, "path": str(target), "rows": rows, "bytes": target.stat().st_size})
    return written
