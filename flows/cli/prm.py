"""Commands of PRM training: dataset snapshots and imports, train, retrain, models, eval processbench,
bench prm."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from prmloop.flows.cli.app import (
    DbOption,
    app,
    bench_app,
    db_path,
    err,
    eval_app,
    progress_line,
    store_label,
    usage_error,
)
from prmloop.flows.cli.output import OutputFormat
from prmloop.store.settings import StateSettings

dataset_app = typer.Typer(help="Dataset snapshots of the labels (Parquet + TRL PRM format).", no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")
models_app = typer.Typer(help="The model registry (ModelRegistered events).", no_args_is_help=True)
app.add_typer(models_app, name="models")
train_app = typer.Typer(help="Train models.", no_args_is_help=True)
app.add_typer(train_app, name="train")

RootOption = Annotated[Path | None, typer.Option("--root", help="snapshot folder (default $PRMLOOP_HOME/snapshots)")]
RatiosOption = Annotated[str, typer.Option("--ratios", help="train,validation,test split ratios by question")]


def _root(root: Path | None) -> Path:
    return root or StateSettings().home / "snapshots"


def _ratios(text: str) -> tuple[float, float, float]:
    try:
        a, b, c = (float(v) for v in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"--ratios takes three numbers like 0.8,0.1,0.1, not {text!r}") from None
    return a, b, c


@dataset_app.command("snapshot")
def snapshot(
    *,
    db: DbOption = None,
    kind: Annotated[str, typer.Option(help="accepted (consensus kept them) or mc (every MC label)")] = "accepted",
    method: Annotated[str | None, typer.Option(help="only labels of this annotation method")] = None,
    since: Annotated[datetime | None, typer.Option(help="only labels from this time on (UTC)")] = None,
    until: Annotated[datetime | None, typer.Option(help="only labels before this time (UTC)")] = None,
    generator: Annotated[str | None, typer.Option(help="only solutions of this generator model")] = None,
    root: RootOption = None,
    ratios: RatiosOption = "0.8,0.1,0.1",
) -> None:
    """Select labels from the store, split by question and write an immutable, content-hashed snapshot."""
    from prmloop.store.tables.snapshot import select_labels, write_snapshot

    if kind not in ("accepted", "mc"):
        raise typer.BadParameter(f"--kind must be accepted or mc, not {kind!r}")
    since_utc = since.replace(tzinfo=UTC) if since and since.tzinfo is None else since
    until_utc = until.replace(tzinfo=UTC) if until and until.tzinfo is None else until
    rows = select_labels(db_path(db), kind=kind, method=method, since=since_utc, until=until_utc, generator=generator)
    selection = {
        "db": str(db_path(db)),
        "kind": kind,
        "method": method,
        "since": str(since),
        "until": str(until),
        "generator": generator,
    }
    manifest = write_snapshot(rows, _root(root), selection=selection, ratios=_ratios(ratios))
    progress_line(
        f"snapshot {manifest['snapshot_id']}: {manifest['rows']} rows in {_root(root) / manifest['snapshot_id']}"
    )
    typer.echo(json.dumps(manifest))


@dataset_app.command("import")
def import_(
    kind: Annotated[str, typer.Argument(help="processbench, prmbench or shepherd")],
    files: Annotated[list[Path], typer.Argument(help="data files (JSON, JSONL or .jsonl.gz)")],
    root: RootOption = None,
    ratios: RatiosOption = "0.5,0.0,0.5",
) -> None:
    """Import outside step-labelled data as a snapshot (steps after the first error are dropped).

    Bad lines are reported as file:line: reason and skipped; the good lines are imported. A truncated
    or damaged .gz keeps what was read before the damage and says at which line it ended."""
    from prmloop.flows.datasets import import_rows
    from prmloop.store.tables.snapshot import write_snapshot

    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} not found; nothing imported")
    rows: list[Any] = []
    for file in files:
        found, errors = import_rows(kind, file)
        for message in errors[:20]:
            progress_line(message)
        if len(errors) > 20:
            progress_line(f"... and {len(errors) - 20} more problems in {file}")
        progress_line(f"{file}: {len(found)} solutions read, {len(errors)} problem{'' if len(errors) == 1 else 's'}")
        rows.extend(found)
    if not rows:
        raise ValueError(f"nothing imported: no usable {kind} solution in {', '.join(str(f) for f in files)}")
    manifest = write_snapshot(
        rows, _root(root), selection={"import": kind, "files": [str(f) for f in files]}, ratios=_ratios(ratios)
    )
    typer.echo(json.dumps(manifest))


@dataset_app.command("list")
def list_snapshots(root: RootOption = None) -> None:
    """The snapshots under the root, newest first (one JSON object per line)."""
    folder = _root(root)
    manifests = [json.loads(p.read_text()) for p in folder.glob("*/manifest.json")] if folder.is_dir() else []
    for m in sorted(manifests, key=lambda m: m["created_at"], reverse=True):
        typer.echo(json.dumps({k: m[k] for k in ("snapshot_id", "created_at", "rows", "questions", "label_kinds")}))


#: What each PRM kind is, for the people reading ``models list``.
_KIND_NAMES = {"prm": "the LoRA PRM", "prm_ensemble": "the ensemble PRM the selector uses"}


@models_app.command("list")
def list_models(
    db: DbOption = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="table (per kind), records, csv or json")] = (
        OutputFormat.table
    ),
) -> None:
    """Registered models, newest first, one table per kind: which model of each kind is in force (the
    newest promoted one whose signature verifies, which the loop uses), which were promoted when
    registered, which are unverified (not signed by prmloop's flows: never in force), the metric each
    kind is promoted by. --format json or csv: every column of the `model_versions` view, `in_force` as
    the signatures decide it, and `signature` (verified, unsigned or bad signature)."""
    from prmloop.flows.cli.output import print_rows
    from prmloop.store.auth.signing import signature_status
    from prmloop.store.tables.duck import query

    sql = (
        "SELECT m.*, e.payload AS _payload FROM model_versions m JOIN events e USING (event_id) "
        "ORDER BY m.kind, m.registered_at DESC, m.event_id DESC"
    )
    result = query(db_path(db), sql)
    rows = [dict(zip(result.columns, row, strict=True)) for row in result.rows]
    seen: set[str] = set()
    for row in rows:  # DuckDB hands JSON columns over as text
        row["metrics"] = json.loads(row["metrics"]) if isinstance(row["metrics"], str) else row["metrics"] or {}
        row["signature"] = signature_status("ModelRegistered", row.pop("_payload"))
        row["in_force"] = bool(row["promoted"]) and row["signature"] == "verified" and row["kind"] not in seen
        if row["in_force"]:
            seen.add(row["kind"])
    columns = [c for c in result.columns if c != "_payload"] + ["signature"]
    if fmt is not OutputFormat.table:
        print_rows(columns, [[r[c] for c in columns] for r in rows], fmt, err=err)
        return
    if not rows:
        progress_line("no models registered yet: `prmloop retrain` trains and registers one")
    for kind in dict.fromkeys(r["kind"] for r in rows):
        _kind_table(kind, [r for r in rows if r["kind"] == kind])


def _kind_table(kind: str, rows: list[dict[str, Any]]) -> None:
    """One kind's models, narrow enough for 80 columns: a model id is never cut."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from prmloop.flows.cli.output import escape_control
    from prmloop.store.tables.registry import PROMOTION_METRIC

    metric = PROMOTION_METRIC.get(kind)
    heading = f"{kind}: {_KIND_NAMES.get(kind, kind)}"
    heading += f", promoted by {metric}" if metric else ""
    if not any(r["in_force"] for r in rows):
        promoted = any(r["promoted"] for r in rows)
        why = "no promoted one is signed by prmloop" if promoted else "none was promoted"
        heading += f"; none in force ({why})"
    console = Console()
    console.print(Text(escape_control(heading, keep_layout=False)), soft_wrap=True)
    table = Table(box=None, padding=(0, 1), pad_edge=False, show_edge=False)
    table.add_column("model", no_wrap=True, min_width=len(max((str(r["model_id"]) for r in rows), key=len)))
    table.add_column("status", no_wrap=True)
    table.add_column("F1" if metric and metric.endswith("f1") else "metric", justify="right", no_wrap=True)
    table.add_column("examples", justify="right", no_wrap=True)
    table.add_column("registered (UTC)", no_wrap=True)
    for r in rows:
        value = r["metrics"].get(metric) if metric else None
        status = "in force" if r["in_force"] else "superseded" if r["promoted"] else "not promoted"
        if r["signature"] != "verified":  # not made by prmloop's flows (or an older prmloop): never in force
            status = "not used: " + {"bad signature": "bad sig"}.get(r["signature"], r["signature"])
        registered = r["registered_at"]
        when = registered.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if isinstance(registered, datetime) else ""
        table.add_row(
            Text(escape_control(str(r["model_id"]), keep_layout=False)),
            status,
            "" if value is None else f"{float(value):.3f}",
            str(r["train_examples"]),
            when,
        )
    console.print(table)


def _config(**overrides: Any) -> Any:
    from prmloop.models.prm.model import PRMConfig

    return PRMConfig(**{k: v for k, v in overrides.items() if v is not None})


@train_app.command("prm")
def train_prm_cmd(
    *,
    snapshot: Annotated[Path, typer.Option(help="a snapshot folder (prmloop dataset snapshot / import)")],
    out: Annotated[Path, typer.Option(help="run folder: checkpoints, loss curve, the final PRM in prm/")] = Path(
        "out/prm/run"
    ),
    formulation: Annotated[str, typer.Option(help="step_tag (UnPRM) or head (classification head)")] = "step_tag",
    labels: Annotated[str, typer.Option(help="hard or soft (MC values) targets")] = "hard",
    base_model: Annotated[str, typer.Option(help="'smollm2' or a local model folder")] = "smollm2",
    epochs: Annotated[int, typer.Option(help="passes over the data")] = 1,
    max_steps: Annotated[int | None, typer.Option(help="stop after this many optimizer steps")] = None,
    batch_size: Annotated[int, typer.Option(help="solutions per step")] = 4,
    learning_rate: Annotated[float, typer.Option(help="AdamW learning rate")] = 2e-4,
    max_length: Annotated[int, typer.Option(help="tokens per solution")] = 768,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
) -> None:
    """Train a LoRA PRM on a snapshot's train split (resumes from the run folder's last checkpoint)."""
    from prmloop.flows.retrain import examples_of
    from prmloop.models.prm.train import train_prm

    config = _config(
        formulation=formulation,
        labels=labels,
        base_model=base_model,
        epochs=epochs,
        max_steps=max_steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        max_length=max_length,
        threads=threads,
    )
    examples = examples_of(snapshot)
    progress_line(f"training on {len(examples)} solutions of {snapshot}")
    result = train_prm(
        examples,
        config,
        out,
        on_step=lambda m: progress_line(
            f"step {int(m['step'])} loss {m['loss']:.4f} "
            f"({m['steps_per_s']:.2f} steps/s, {m['tokens_per_s']:.0f} tokens/s)"
        ),
    )
    typer.echo(json.dumps({"artifact": str(result.artifact_dir), "steps": result.steps, **result.metrics}))


@app.command()
def retrain(
    *,
    db: DbOption = None,
    kind: Annotated[str, typer.Option(help="accepted or mc labels from the store")] = "accepted",
    snapshot: Annotated[Path | None, typer.Option(help="train on this snapshot instead of a new one")] = None,
    out: Annotated[Path, typer.Option(help="folder for snapshots and runs")] = Path("out/prm"),
    max_steps: Annotated[int | None, typer.Option(help="optimizer steps at most")] = None,
    eval_limit: Annotated[int, typer.Option(help="ProcessBench solutions per subset")] = 20,
    min_examples: Annotated[int, typer.Option(help="refuse to train on fewer solutions")] = 8,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
    prefect: Annotated[bool, typer.Option(help="run as the Prefect flow `retrain`")] = True,
    publish: Annotated[bool, typer.Option(help="publish ModelRegistered")] = True,
    prm_kind: Annotated[
        str, typer.Option(help="ensemble (heads on cached features, seconds; every round) or lora (the final PRM)")
    ] = "ensemble",
    eval_set: Annotated[
        str,
        typer.Option(
            help="ensemble: held-out set, processbench, arith (the model's curriculum solutions, exact first "
            "errors) or arith-reference (reference solutions and corrupted copies: no sampling)"
        ),
    ] = "processbench",
) -> None:
    """Snapshot, train, evaluate and register a PRM (promoted only if its held-out F1 is not worse).

    `--prm-kind ensemble` (default): the ensemble PRM the selector decides with, trained in seconds on
    cached backbone features; `--prm-kind lora`: LoRA on the backbone, evaluated on ProcessBench."""
    from prmloop.flows.retrain import run_retrain

    # Checked here, before the flow run starts: a wrong choice is one line, not a failed run.
    for option, value, choices in (
        ("--kind", kind, ("accepted", "mc")),
        ("--prm-kind", prm_kind, ("ensemble", "lora")),
        ("--eval-set", eval_set, ("processbench", "arith", "arith-reference")),
    ):
        if value not in choices:
            usage_error(f"{option} {value!r}: choose one of {', '.join(choices)}")
    if snapshot is None:
        from prmloop.store.tables.duck import store_exists

        if not store_exists(db_path(db)):
            usage_error(f"no prmloop database at {store_label(db)}: start `prmloop sink` (it creates it), or give --db")

    summary = run_retrain(
        prefect=prefect,
        db=str(db_path(db)),
        kind=kind,
        snapshot=str(snapshot) if snapshot else None,
        out_dir=str(out),
        config=_config(max_steps=max_steps, threads=threads),
        eval_limit=eval_limit,
        min_examples=min_examples,
        publish=publish,
        prm_kind=prm_kind,
        eval_set=eval_set,
    )
    typer.echo(json.dumps(summary, default=str))


@eval_app.command("processbench")
def eval_processbench_cmd(
    prm: Annotated[
        Path | None,
        typer.Option(
            help="a trained PRM folder (a LoRA PRM's …/prm or an ensemble's); default: the base model with a "
            "fresh, untrained adapter"
        ),
    ] = None,
    limit: Annotated[int, typer.Option(help="solutions per subset")] = 40,
    holdout: Annotated[bool, typer.Option(help="only questions a 0.5,0,0.5 import did not train on")] = False,
    bon: Annotated[int, typer.Option(help="also Best-of-N on this many GSM8K pool problems (0: skip)")] = 0,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
) -> None:
    """ProcessBench F1 per subset (threshold chosen on GSM8K) and optionally Best-of-N accuracy."""
    from prmloop.flows.lab.evals.processbench import best_of_n, eval_processbench
    from prmloop.models.prm.load import load_prm
    from prmloop.models.prm.model import PRM
    from prmloop.store.settings import StateSettings

    model = (
        load_prm(prm, cache_dir=StateSettings().features_dir, threads=threads)
        if prm
        else PRM.create(_config(threads=threads))
    )
    result = eval_processbench(model.score_solutions, limit=limit, holdout=holdout, progress=progress_line)
    result["prm"] = str(prm) if prm else "base model, untrained adapter"
    if bon:
        result["best_of_n"] = best_of_n(model.score_solutions, problems=bon)
    typer.echo(json.dumps(result))


@bench_app.command("prm")
def bench_prm_cmd(
    solutions: Annotated[int, typer.Option(help="ProcessBench GSM8K solutions with at least --min-steps steps")] = 8,
    min_steps: Annotated[int, typer.Option(help="only solutions this long")] = 6,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
) -> None:
    """All step scores from one forward pass vs one pass per step prefix, same solutions, one run."""
    from prmloop.flows.lab.bench.prm import bench_prm

    typer.echo(json.dumps(bench_prm(solutions=solutions, min_steps=min_steps, threads=threads)))
