"""``prmloop eval ...``: evaluations against the shared data sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from prmloop.flows.cli.app import err, eval_app


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
    from prmloop.flows.evals.aggregate import eval_aggregate

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


@eval_app.command("annotate")
def eval_annotate_cmd(  # noqa: PLR0917 - one parameter per command-line option
    file: Annotated[Path | None, typer.Option(help="ProcessBench file (default: processbench/gsm8k.json)")] = None,
    limit: Annotated[int, typer.Option(help="solutions with a wrong final answer to label")] = 5,
    strategy: Annotated[str, typer.Option(help="sequential, binary, adaptive_binary or uncertainty_driven")] = (
        "adaptive_binary"
    ),
    n0: Annotated[int, typer.Option(help="first rollouts per state (fixed count for sequential/binary)")] = 8,
    n_min: Annotated[int, typer.Option(help="grow until this many correct rollouts")] = 4,
    n_max: Annotated[int, typer.Option(help="at most this many rollouts per state")] = 16,
    model: Annotated[str, typer.Option(help="'smollm2' (embedded), a folder, or a served model name")] = "smollm2",
    backend: Annotated[str, typer.Option(help="transformers, vllm or openai")] = "transformers",
    threads: Annotated[int | None, typer.Option(help="transformers: torch CPU threads")] = None,
    max_new_tokens: int = 256,
    temperature: float = 0.7,
    seed: int = 0,
) -> None:
    """Label ProcessBench solutions with a real completer; agreement with the human first-error labels."""
    from prmloop.flows.evals.annotate import evaluate_processbench

    options: dict[str, Any] = {"num_threads": threads} if threads is not None else {}
    summary = evaluate_processbench(
        file,
        limit=limit,
        strategy=strategy,
        n0=n0,
        n_min=n_min,
        n_max=max(n_max, n0),
        backend={"backend": backend, "model": model, "options": options},
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
        progress=lambda row: err.print(
            f"{row['id']}: human {row['human_first_error']}, predicted {row['predicted_first_error']} "
            f"({row['status']}), {row['rollouts']} rollouts, {row['wall_s']}s",
            soft_wrap=True,
        ),
    )
    typer.echo(json.dumps(summary))
