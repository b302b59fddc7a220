"""``prmloop testset``: the test set every figure is scored on (build, show, score a PRM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from prmloop.flows.cli.app import app, progress_line

testset_app = typer.Typer(
    help="The test set nothing trains or promotes on: build it, show its manifest, score a PRM on it.",
    no_args_is_help=True,
)
app.add_typer(testset_app, name="testset")


_SEED_HELP = "which set of the folder, by its curriculum seed (default: the test seed, else the folder's only set)"


@testset_app.command("build")
def build(
    *,
    out: Annotated[
        Path | None, typer.Option(help="folder to write into (default: the shipped folder, flows/pools/testsets)")
    ] = None,
    questions: Annotated[int, typer.Option(min=1, help="curriculum questions per level (4 solutions each)")] = 100,
    seed: Annotated[int, typer.Option(help="curriculum seed (reserved: no loop or validation set samples it)")] = 2000,
    levels: Annotated[str, typer.Option(help="curriculum levels, e.g. 1,2,3,4,5")] = "1,2,3,4,5",
    engine: Annotated[
        str, typer.Option(help="auto (vLLM where it runs, else transformers), vllm, transformers")
    ] = "auto",
    threads: Annotated[int | None, typer.Option(help="CPU threads of an in-process engine and the features")] = None,
    features: Annotated[bool, typer.Option(help="also compute the backbone's step features of every solution")] = True,
) -> None:
    """Sample the embedded model's solutions to the reserved seed's questions, keep what the checker
    decides, and write the data file and its manifest (says what it costs first; resumes); then the
    backbone's step features of each solution, so that scoring on the set costs no forward pass.
    The validation set promotion uses is built the same way: `--seed 1000 --questions 20`."""
    from prmloop.flows.pools.testset import SHIPPED_DIR, build_testset, write_features

    try:
        chosen = tuple(int(v) for v in levels.split(","))
    except ValueError:
        raise typer.BadParameter(f"--levels takes numbers like 1,2,3,4,5, not {levels!r}") from None
    if not chosen or any(level not in range(1, 6) for level in chosen):
        raise typer.BadParameter(f"--levels: curriculum levels are 1-5, not {levels!r}")
    manifest = build_testset(
        out or SHIPPED_DIR,
        questions=questions,
        seed=seed,
        levels=chosen,
        engine=engine,
        threads=threads,
        say=progress_line,
    )
    if features:
        manifest["features"] = write_features(out or SHIPPED_DIR, seed=seed, threads=threads, say=progress_line)
    typer.echo(json.dumps(manifest))


@testset_app.command("features")
def features_command(
    directory: Annotated[Path | None, typer.Option("--dir", help="the set's folder (default: the shipped one)")] = None,
    seed: Annotated[int | None, typer.Option(help=_SEED_HELP)] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for the backbone")] = None,
) -> None:
    """Compute a set's step features anew for the default feature spec and write them beside it (the
    manifest names the new file; the old one is removed). Run it after the feature spec or its version
    changes: scoring then costs no forward pass again. About 0.6 s a solution on 2 cores (17 minutes
    for the shipped test set's 1,612)."""
    from prmloop.flows.pools.testset import SHIPPED_DIR, load_testset, seed_in, write_features

    folder = directory or SHIPPED_DIR
    chosen = seed_in(folder) if seed is None else seed
    manifest, _ = load_testset(folder, chosen)
    before = (manifest.get("features") or {}).get("file")
    entry = write_features(folder, seed=chosen, threads=threads, say=progress_line)
    if before and before != entry["file"]:
        (folder / before).unlink(missing_ok=True)
    typer.echo(json.dumps(entry))


@testset_app.command("show")
def show(
    directory: Annotated[
        Path | None, typer.Option("--dir", help="the test set's folder (default: the shipped one)")
    ] = None,
    seed: Annotated[int | None, typer.Option(help=_SEED_HELP)] = None,
) -> None:
    """The test set's manifest (generator and digest, sampling, checker, counts per level) as JSON."""
    from prmloop.flows.pools.testset import SHIPPED_DIR, load_testset, seed_in

    folder = directory or SHIPPED_DIR
    manifest, items = load_testset(folder, seed_in(folder) if seed is None else seed)
    typer.echo(json.dumps({**manifest, "loaded": len(items)}))


@testset_app.command("score")
def score(
    prm: Annotated[
        Path | None, typer.Option(help="an ensemble PRM's folder (default: the one in force in the store)")
    ] = None,
    db: Annotated[str | None, typer.Option(help="the store whose PRM in force is scored")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads for the backbone's features")] = None,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            help="score on the set built into this folder (`prmloop testset build --out`), e.g. of another seed",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help=_SEED_HELP)] = None,
) -> None:
    """Score an ensemble PRM on the test set: F1 with its bootstrap 95 % interval, over all and per level.

    With `--dir`, on a set built anew (another seed, say): for the PRM in force the line also holds the
    test F1 it reported when it was registered and the difference, a check that the scoreboard holds."""
    from prmloop.flows.retrain_ensemble import score_on_test
    from prmloop.models.prm.ensemble_prm import EnsemblePRM

    reported: dict[str, float] = {}
    if prm is None:
        from prmloop.flows.cli.app import db_path
        from prmloop.store.tables.registry import current_model

        model = current_model(str(db_path(db)), kind="prm_ensemble")
        if model is None:
            raise ValueError("no ensemble PRM is in force in the store: pass --prm <folder>, or run the loop first")
        prm = Path(model["artifact_uri"])
        metrics = model.get("metrics") or {}
        reported = {k: float(metrics[k]) for k in ("test_f1", "test_f1_lo", "test_f1_hi") if k in metrics}
    if not (prm / "prm.json").is_file():
        raise FileNotFoundError(
            f"--prm {prm}: no ensemble PRM there (no prm.json): pass a folder `prmloop models list` names"
        )
    from prmloop.store.settings import StateSettings

    model_obj = EnsemblePRM.load(prm, cache_dir=StateSettings().features_dir, threads=threads)
    result = score_on_test(model_obj, threads=threads, say=progress_line, directory=directory, seed=seed)
    line = {"prm": str(prm), **result}
    fresh = result["test"]["all"]["f1"]
    if directory is not None and reported and fresh is not None:
        line["reported"] = {k.replace("test_", ""): v for k, v in reported.items()}
        line["f1_minus_reported"] = round(fresh - reported["test_f1"], 4)
    typer.echo(json.dumps(line))
