"""Dataset snapshots: labels selected from the store, split by question, written once and named by content.

A snapshot is a folder ``<root>/<snapshot_id>/`` with ``manifest.json`` and, per non-empty split
(``train``, ``validation``, ``test``), ``<split>.parquet`` (columns ``question_id``, ``solution_id``,
``prompt``, ``completions``, ``labels``, ``soft_labels``, ``first_error_step``, ``source``,
``label_event_id``; ``prompt``/``completions``/``labels`` are the TRL PRM format) and ``<split>.jsonl``
(those three fields per line). ``snapshot_id`` is the first 16 hex digits of a SHA-256 over the rows, so
the same labels give the same snapshot, and an existing snapshot is never overwritten.

Selection (:func:`select_labels`, read-only: works while the sink writes): the newest consensus
decision per solution that accepted its labels (``accepted``), or the newest MC label per solution
(``mc``), optionally of one method, in a time range, or from one generator; joined with the solution's
problem and steps; identical (question, steps) solutions are kept once. Splits are by a hash of the
question id (:func:`split_of`), so no question is in two splits and a question keeps its split as the
data grow.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from prmloop.store.tables.duck import query

__all__ = [
    "SPLITS",
    "SnapshotRow",
    "load_snapshot",
    "select_labels",
    "split_of",
    "write_snapshot",
]

SPLITS = ("train", "validation", "test")
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SnapshotRow:
    question_id: str
    solution_id: str
    prompt: str
    completions: tuple[str, ...]
    labels: tuple[bool, ...]
    soft_labels: tuple[float, ...] | None
    first_error_step: int | None
    source: str
    label_event_id: str | None


def split_of(question_id: str, ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> str:
    """The split of a question: a uniform hash of its id against the cumulative ``ratios``."""
    if any(r < 0 for r in ratios) or sum(ratios) <= 0:
        raise ValueError(f"split ratios must be >= 0 and not all 0, got {ratios}")
    u = int.from_bytes(hashlib.sha256(question_id.encode()).digest()[:8], "big") / 2**64
    total, edge = sum(ratios), 0.0
    for name, ratio in zip(SPLITS, ratios, strict=True):
        edge += ratio / total
        if u < edge:
            return name
    return SPLITS[-1]


_SELECT = """
WITH sol AS (
    SELECT payload->>'solution_id' AS solution_id, payload->>'problem' AS problem, payload->'steps' AS steps,
           payload->'generator'->>'name' AS generator
    FROM events WHERE event_type = 'SolutionSampled'
    QUALIFY row_number() OVER (PARTITION BY payload->>'solution_id' ORDER BY occurred_at DESC, event_id) = 1
), mc AS (
    SELECT payload->>'solution_id' AS solution_id, payload->>'question_id' AS question_id,
           payload->>'method' AS method, payload->'labels' AS labels, payload->'soft_labels' AS soft_labels,
           TRY_CAST(payload->>'first_error_step' AS INTEGER) AS first_error_step, occurred_at, event_id
    FROM events WHERE event_type = 'StepsLabeled'
    QUALIFY row_number() OVER (PARTITION BY payload->>'solution_id' ORDER BY occurred_at DESC, event_id) = 1
), decision AS (
    SELECT payload->>'solution_id' AS solution_id, event_type, payload->'labels' AS labels,
           TRY_CAST(payload->>'first_error_step' AS INTEGER) AS first_error_step, occurred_at, event_id
    FROM events WHERE event_type IN ('LabelsAccepted', 'LabelsRejected')
    QUALIFY row_number() OVER (PARTITION BY payload->>'solution_id' ORDER BY occurred_at DESC, event_id) = 1
)
"""


def select_labels(
    db: Path,
    *,
    kind: Literal["accepted", "mc"] = "accepted",
    method: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    generator: str | None = None,
) -> list[SnapshotRow]:
    """The labelled solutions the filters select, one row per distinct (question, steps), newest first."""
    if kind == "accepted":
        sql = _SELECT + (
            "SELECT mc.question_id, d.solution_id, sol.problem, sol.steps, d.labels, mc.soft_labels, "
            "d.first_error_step, 'consensus:' || coalesce(mc.method, '?'), CAST(d.event_id AS VARCHAR), "
            "d.occurred_at, mc.method, sol.generator "
            "FROM decision d JOIN sol USING (solution_id) JOIN mc USING (solution_id) "
            "WHERE d.event_type = 'LabelsAccepted'"
        )
    else:
        sql = _SELECT + (
            "SELECT mc.question_id, mc.solution_id, sol.problem, sol.steps, mc.labels, mc.soft_labels, "
            "mc.first_error_step, mc.method, CAST(mc.event_id AS VARCHAR), mc.occurred_at, mc.method, sol.generator "
            "FROM mc JOIN sol USING (solution_id)"
        )
    rows = query(db, sql + " ORDER BY 10 DESC, 2").rows
    seen: set[tuple[str, tuple[str, ...]]] = set()
    out = []
    for qid, sid, problem, steps, labels, soft, first, source, event_id, at, mc_method, gen in rows:
        if (method and mc_method != method) or (generator and gen != generator):
            continue
        if (since and at < since) or (until and at >= until):
            continue
        completions = tuple(json.loads(steps) if isinstance(steps, str) else steps or ())
        flags = tuple(bool(v) for v in (json.loads(labels) if isinstance(labels, str) else labels or ()))
        if not problem or not completions or len(flags) != len(completions):
            continue
        key = (qid, completions)
        if key in seen:
            continue
        seen.add(key)
        soft_values = json.loads(soft) if isinstance(soft, str) else soft
        soft_tuple = tuple(float(v) for v in soft_values) if soft_values and len(soft_values) == len(flags) else None
        out.append(SnapshotRow(qid, sid, problem, completions, flags, soft_tuple, first, source, event_id))
    return out


def _content_id(rows: Sequence[SnapshotRow]) -> str:
    digest = hashlib.sha256()
    for row in sorted(rows, key=lambda r: (r.question_id, r.solution_id, r.completions)):
        digest.update(json.dumps(asdict(row), sort_keys=True, default=list).encode())
    return digest.hexdigest()[:16]


def write_snapshot(
    rows: Sequence[SnapshotRow],
    root: Path,
    *,
    selection: dict[str, Any],
    ratios: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> dict[str, Any]:
    """Write ``rows`` as a snapshot under ``root``; returns its manifest (the existing one if the same
    content was written before).

    Raises:
        ValueError: no rows.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise ValueError("no labelled solutions match the selection; nothing to snapshot")
    snapshot_id = _content_id(rows)
    target = Path(root) / snapshot_id
    if (target / "manifest.json").is_file():
        return dict(json.loads((target / "manifest.json").read_text()))
    staging = Path(root) / f".{snapshot_id}.tmp"
    staging.mkdir(parents=True, exist_ok=True)
    by_split: dict[str, list[SnapshotRow]] = {s: [] for s in SPLITS}
    for row in rows:
        by_split[split_of(row.question_id, ratios)].append(row)
    files, counts, questions = {}, {}, {}
    for split, chosen in by_split.items():
        if not chosen:
            continue
        table = pa.Table.from_pylist(
            [
                {
                    **asdict(r),
                    "completions": list(r.completions),
                    "labels": list(r.labels),
                    "soft_labels": list(r.soft_labels) if r.soft_labels else None,
                }
                for r in chosen
            ]
        )
        pq.write_table(table, staging / f"{split}.parquet")
        with (staging / f"{split}.jsonl").open("w") as handle:
            for r in chosen:
                handle.write(
                    json.dumps({"prompt": r.prompt, "completions": list(r.completions), "labels": list(r.labels)})
                    + "\n"
                )
        for name in (f"{split}.parquet", f"{split}.jsonl"):
            files[name] = hashlib.sha256((staging / name).read_bytes()).hexdigest()
        counts[split], questions[split] = len(chosen), len({r.question_id for r in chosen})
    manifest = {
        "snapshot_id": snapshot_id,
        "schema_version": SCHEMA_VERSION,
        "created_at": datetime.now(UTC).isoformat(),
        "selection": selection,
        "split_ratios": list(ratios),
        "rows": counts,
        "questions": questions,
        "label_kinds": sorted({r.source for r in rows}),
        "with_soft_labels": sum(r.soft_labels is not None for r in rows),
        "files": files,
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2))
    staging.rename(target)
    return manifest


def load_snapshot(path: Path, split: str = "train") -> tuple[dict[str, Any], list[SnapshotRow]]:
    """A snapshot's manifest and the rows of one split (empty when the split has none).

    Raises:
        FileNotFoundError: ``path`` is not a snapshot folder.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    if not (path / "manifest.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a snapshot (no manifest.json): make one with `prmloop dataset snapshot`"
        )
    manifest = json.loads((path / "manifest.json").read_text())
    file = path / f"{split}.parquet"
    if not file.is_file():
        return manifest, []
    rows = []
    for r in pq.read_table(file).to_pylist():
        rows.append(
            SnapshotRow(
                question_id=r["question_id"],
                solution_id=r["solution_id"],
                prompt=r["prompt"],
                completions=tuple(r["completions"]),
                labels=tuple(r["labels"]),
                soft_labels=tuple(r["soft_labels"]) if r["soft_labels"] else None,
                first_error_step=r["first_error_step"],
                source=r["source"],
                label_event_id=r["label_event_id"],
            )
        )
    return manifest, rows
