"""``prmloop eval annotate`` runs the annotator's own strategy and completer on ProcessBench solutions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prmloop.flows.lab.evals.annotate import EvalAnnotateSettings, evaluate_processbench

if TYPE_CHECKING:
    from prmloop.models.backends.registry import BackendConfig


def test_one_solution_is_searched_with_the_configured_sample_counts(
    shared_data_dir: Path, tiny_backend_config: BackendConfig
) -> None:
    settings = EvalAnnotateSettings(
        file=shared_data_dir / "processbench" / "gsm8k.json",
        limit=1,
        backend=tiny_backend_config.backend,
        model=tiny_backend_config.model,
        n0=2,
        n_min=1,
        n_max=2,
        max_new_tokens=8,
    )
    rows: list[dict[str, object]] = []
    summary = evaluate_processbench(settings, progress=rows.append)
    assert summary["solutions"] == 1 and len(rows) == 1 and summary["model"] == "tiny-random-llama"
    # A random model never reaches the gold answer from the question: the search stops unresolved at
    # MC(s_0) = 0 after N_max rollouts, instead of blaming step 0.
    [row] = summary["per_solution"]
    assert row["status"] == "unresolved" and row["rollouts"] == 2 and summary["first_error_accuracy"] is None
    assert summary["sampling"]["n_max"] == 2 and summary["generated_tokens"] > 0


def test_the_command_writes_the_whole_report_to_out(
    shared_data_dir: Path, tiny_backend_config: BackendConfig, tmp_path: Path
) -> None:
    import json

    from typer.testing import CliRunner

    from prmloop.flows.cli import app

    out = tmp_path / "reports" / "pb.json"
    args = ["eval", "annotate", "--file", str(shared_data_dir / "processbench" / "gsm8k.json"), "--limit", "1"]
    args += ["--backend", tiny_backend_config.backend, "--model", str(tiny_backend_config.model)]
    args += ["--n0", "2", "--n-min", "1", "--n-max", "2", "--max-new-tokens", "8", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    written = json.loads(out.read_text())
    assert written == printed and written["per_solution"][0]["rollouts"] == 2
