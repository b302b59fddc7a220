"""``prmloop eval ...``: evaluations against the shared data sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from prmloop.flows.cli.app import DbOption, db_path, err, eval_app
from prmloop.flows.cli.options import settings_command
from prmloop.flows.lab.evals.annotate import SERVICE_ONLY_ALL, EvalAnnotateSettings
from prmloop.flows.lab.evals.judge import SERVICE_ONLY as JUDGE_SERVICE_ONLY
from prmloop.flows.lab.evals.judge import EvalJudgeSettings


@eval_app.command("aggregate")
def eval_aggregate_cmd(  # noqa: PLR0917 - one parameter per command-line option
    pool: Annotated[Path, typer.Option(help="Best-of-N pool, e.g. ../shared/data/bon/gsm8k_candidates.jsonl.gz")],
    scores: Annotated[Path | None, typer.Option(help="step scores (default: step_scores/<prm>_<dataset>)")] = None,
    prm: str = "qwen_prm",
    reference: Annotated[Path | None, typer.Option(help="gold answers to re-grade against (MATH-500)")] = None,
    score_rule: Annotated[str, typer.Option(help="min, product or last")] = "min",
    score_kind: Annotated[str | None, typer.Option(help="probability or reward (default: by PRM)")] = None,
    ns: Annotated[str, typer.Option(help="comma-separated budgets N")] = "1,2,4,8,16,32",
    subsamples: int = 50,
    splits: int = 5,
    calibration_size: int = 100,
    seed: int = 0,
    out_dir: Annotated[Path, typer.Option(help="where PNGs and JSON go")] = Path("out/aggregate"),
    as_json: Annotated[bool, typer.Option("--json", help="print the whole result as JSON")] = False,
) -> None:
    """Accuracy of every aggregation method at each N, and the compute fraction of calibrated methods."""
    from prmloop.flows.lab.evals.aggregate import eval_aggregate

    result = eval_aggregate(
        pool,
        scores,
        prm=prm,
        reference=reference,
        score_rule=score_rule,
        score_kind=score_kind,
        ns=tuple(int(n) for n in ns.split(",")),
        subsamples=subsamples,
        splits=splits,
        calibration_size=calibration_size,
        seed=seed,
        out_dir=out_dir,
    )
    if as_json:
        typer.echo(json.dumps(result, default=str))
        return
    typer.echo(result["table_markdown"])
    for name, path in result.get("files", {}).items():
        err.print(f"{name}: {path}")


@settings_command(eval_app, EvalAnnotateSettings, name="annotate", exclude=SERVICE_ONLY_ALL)
def eval_annotate(settings: EvalAnnotateSettings) -> None:
    """Label solutions with a real completer and compare with the truth: ProcessBench's human first-error
    labels, or (--dataset arith) the exact first errors of the model's own arithmetic solutions, for
    every strategy on the same solutions."""
    from prmloop.flows.lab.evals.annotate import evaluate_processbench

    if settings.dataset == "arith":
        _eval_annotate_arith(settings)
        return
    summary = evaluate_processbench(
        settings,
        progress=lambda row: err.print(
            f"{row['id']}: human {row['human_first_error']}, predicted {row['predicted_first_error']} "
            f"({row['status']}), {row['rollouts']} rollouts, {row['wall_s']}s",
            soft_wrap=True,
        ),
    )
    _write_report(settings, summary)
    typer.echo(json.dumps(summary))


def _write_report(settings: EvalAnnotateSettings, summary: dict[str, object]) -> None:
    """The whole report (every solution) as JSON at ``--out``, when given."""
    if settings.out is not None:
        settings.out.parent.mkdir(parents=True, exist_ok=True)
        settings.out.write_text(json.dumps(summary, indent=1))
        err.print(f"report: {settings.out}")


def _eval_annotate_arith(settings: EvalAnnotateSettings) -> None:
    from prmloop.flows.lab.evals.annotate_arith import evaluate_arith, parse_strategies

    try:
        levels = [int(level.strip().upper().removeprefix("L")) for level in settings.levels.split(",") if level.strip()]
        parse_strategies(settings.strategies)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None

    def progress(row: dict[str, object]) -> None:
        if row["phase"] == "sampling":
            err.print(f"sampled {row['solutions']} solutions: {row['chosen']} of {row['limit']} chosen", soft_wrap=True)
        else:
            err.print(
                f"{row['phase']}: {row['question_id']}#{row['sample']} exact {row['exact_first_error']}, "
                f"predicted {row['predicted_first_error']} ({row['status']}), {row['rollouts']} rollouts",
                soft_wrap=True,
                markup=False,
            )

    summary = evaluate_arith(
        settings,
        levels=levels,
        limit=settings.limit,
        k=settings.k,
        sample_temperature=settings.sample_temperature,
        seed=settings.seed,
        strategies=settings.strategies,
        progress=progress,
    )
    _write_report(settings, summary)
    summary.pop("per_solution")
    typer.echo(json.dumps(summary))


@settings_command(eval_app, EvalJudgeSettings, name="judge", exclude=JUDGE_SERVICE_ONLY)
def eval_judge(settings: EvalJudgeSettings) -> None:
    """The LLM judge on ProcessBench: step verdicts scored with the CoT Entropy paper's metrics, the
    critic with the ProcessBench protocol. One JSON line; table, rows and plot under --out-dir."""
    from prmloop.flows.lab.evals.judge import evaluate_judge

    summary = evaluate_judge(
        settings,
        progress=lambda row: err.print(
            f"{row['id']} step {row['step']}: error {row['has_error']}, predicted {row['predicted_error']}, "
            f"CoT entropy {row['cot_entropy']}, {row['tokens']} tokens",
            soft_wrap=True,
            markup=False,
        ),
    )
    typer.echo(json.dumps(summary, default=str))


@eval_app.command("consensus")
def eval_consensus(
    db: DbOption = None,
    thresholds: Annotated[
        str, typer.Option(help="comma-separated CoT-entropy thresholds; 'none' = no abstention")
    ] = "none,0.69,0.6,0.5,0.4,0.3,0.2,0.1",
) -> None:
    """Consensus retention over the store's labelled and judged solutions, per CoT-entropy threshold."""
    from prmloop.flows.lab.evals.consensus import consensus_retention

    try:
        values = [None if t.strip().lower() == "none" else float(t) for t in thresholds.split(",")]
    except ValueError:
        raise typer.BadParameter(f"--thresholds must be numbers or 'none', got {thresholds!r}") from None
    typer.echo(json.dumps(consensus_retention(db_path(db), values)))
