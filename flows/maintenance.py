"""The Prefect flow ``compact``: keep a DuckLake store fast and bounded while sinks write to it.

Removes event ids two sinks stored at the same moment (the view ``events`` already shows one), flushes
rows inlined in the catalog to Parquet, merges small Parquet files, expires snapshots older than
``keep_days`` and deletes the files no snapshot needs. Every step is its own retried transaction, so
it runs beside the sinks (infra/ schedules it hourly). On a DuckDB file there is nothing to do: the
file compacts itself on checkpoint.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from prmloop.store.settings import StateSettings
from prmloop.store.tables.duck import locate
from prmloop.store.tables.lake import LakeStore
from prmloop.store.tables.lake import compact as compact_lake

__all__ = ["compact"]


def compact_store(store: str | None = None, keep_days: float = 7.0) -> dict[str, Any]:
    """Compact ``store`` (default ``PRMLOOP_STORE``); returns what was done."""
    if keep_days < 0:
        raise ValueError(f"keep_days must be >= 0, got {keep_days}")
    where = locate(store if store else StateSettings().store_location)
    if not isinstance(where, LakeStore):
        return {"store": str(where), "skipped": "a DuckDB file needs no compaction (set PRMLOOP_STORE=ducklake:...)"}
    return compact_lake(where, keep_snapshots_for=timedelta(days=keep_days))


@flow(name="compact")
def compact(store: str | None = None, keep_days: float = 7.0) -> dict[str, Any]:
    """Compact the DuckLake store and expire its old snapshots (a table artifact ``store-compaction``)."""
    report = compact_store(store, keep_days)
    get_run_logger().info("compaction: %s", report)
    create_table_artifact(
        key="store-compaction",
        table=[{"what": k, "value": str(v)} for k, v in report.items()],
        description="What the last compaction of the store did",
    )
    return report
