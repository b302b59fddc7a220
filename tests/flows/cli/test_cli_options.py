"""Each service's options are declared once, by its settings object: the command line, the environment
and the Prefect flow's parameters all come from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic_settings import BaseSettings
from typer.testing import CliRunner

from prmloop.consumers.annotator import AnnotatorSettings
from prmloop.consumers.consensus import ConsensusSettings
from prmloop.consumers.judge import JudgeSettings
from prmloop.consumers.scorer import ScorerSettings
from prmloop.flows.cli import app
from prmloop.flows.cli.app import app as bare_app
from prmloop.flows.cli.options import settings_command
from prmloop.producers.sampler import SampleSettings

runner = CliRunner()


def _options(command: str) -> set[str]:
    click_app = typer.main.get_command(app)
    params = click_app.commands[command].params  # type: ignore[attr-defined]
    return {p.name for p in params if p.name not in {"ctx", "help"}}


@pytest.mark.parametrize(
    ("command", "settings"),
    [
        ("sample", SampleSettings),
        ("score", ScorerSettings),
        ("annotate", AnnotatorSettings),
        ("judge", JudgeSettings),
        ("consensus", ConsensusSettings),
    ],
)
def test_every_settings_field_is_an_option_and_nothing_else(command: str, settings: type[BaseSettings]) -> None:
    """...but a secret (the engine's API key), which is read from the environment only: every user of the
    machine sees a process's command line (issue 39)."""
    assert _options(command) == set(settings.model_fields) - {"api_key"}


def test_field_descriptions_are_the_help_text() -> None:
    result = runner.invoke(app, ["annotate", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in ("n_min", "in_flight", "weighting"):
        description = AnnotatorSettings.model_fields[name].description
        assert description is not None and description.split(";")[0][:30] in result.output


def _capture(settings_cls: type[BaseSettings]) -> tuple[typer.Typer, list[Any]]:
    captured: list[Any] = []
    local = typer.Typer()

    @settings_command(local, settings_cls, name="run")
    def run(settings: Any) -> None:
        captured.append(settings)

    @local.command("other")
    def other() -> None:  # a second command keeps typer from collapsing the group
        pass

    return local, captured


def test_the_environment_applies_unless_the_command_line_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    local, captured = _capture(SampleSettings)
    monkeypatch.setenv("PRMLOOP_SAMPLE_K", "16")
    monkeypatch.setenv("PRMLOOP_SAMPLE_STRATEGY", "random")
    assert runner.invoke(local, ["run", "--dataset", "gsm8k"]).exit_code == 0
    assert runner.invoke(local, ["run", "--dataset", "gsm8k", "-k", "3", "--no-prefect"]).exit_code == 0
    from_env, from_cli = captured
    assert (from_env.k, from_env.strategy, from_env.prefect) == (16, "random", True)
    assert (from_cli.k, from_cli.strategy, from_cli.prefect) == (3, "random", False)


def test_a_refused_value_is_a_usage_error_naming_the_option() -> None:
    result = runner.invoke(bare_app, ["annotate", "--strategy", "guess"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "--strategy" in result.output and "unknown annotation strategy 'guess'" in result.output


def test_the_sample_flow_takes_the_settings_object_as_its_parameter() -> None:
    from prmloop.flows.sample import sample

    schema = sample.parameters.model_dump()
    assert "settings" in schema["properties"]
    definitions = schema.get("definitions", {})
    assert "SampleSettings" in definitions
    assert set(definitions["SampleSettings"]["properties"]) == set(SampleSettings.model_fields)


_DATASETS = ["arith", "gsm8k", "gsm_plus", "math", "math500"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["sample", "--dataset", "nosuch"], ["'nosuch'", *_DATASETS]),
        (["prioritize", "--dataset", "nosuch"], ["'nosuch'", *_DATASETS]),
        (["sample", "--dataset", "math500", "--split", "train"], ["--split", "'train'", "test"]),
        (["sample", "--prompt-format", "nosuch"], ["'nosuch'", "auto", "step_k", "double_newline", "step_k_arith"]),
        (["sample", "--level", "9"], ["--level 9", "5"]),
        (["sample", "--file", "{tmp}/missing.jsonl"], ["missing.jsonl not found"]),
        (["sample", "--dataset", "gsm8k"], ["gsm8k/test.jsonl not found", "../shared"]),
        (["retrain", "--kind", "nosuch"], ["--kind 'nosuch'", "accepted", "mc"]),
        (["retrain", "--prm-kind", "nosuch"], ["--prm-kind 'nosuch'", "ensemble", "lora"]),
        (["retrain", "--eval-set", "nosuch"], ["--eval-set 'nosuch'", "processbench", "arith"]),
        (["retrain"], ["no prmloop database", "prmloop sink"]),
        (["eval", "annotate", "--dataset", "nosuch"], ["--dataset 'nosuch'", "processbench", "arith"]),
    ],
)
def test_a_wrong_option_of_a_flow_command_is_one_line_naming_the_value_and_the_choices(
    args: list[str], named: list[str], tmp_path: Path
) -> None:
    """Seen: `prmloop sample --dataset nosuch` printed 77 lines (two Prefect tracebacks) and left a Failed
    flow run before its one-line error; typer's usage box wrapped a list of choices over five lines."""
    env = {"PRMLOOP_HOME": str(tmp_path / "home"), "PRMLOOP_DATA_DIR": str(tmp_path / "no-data"), "COLUMNS": "80"}
    env |= {"KAFKA_BOOTSTRAP_SERVERS": None, "PREFECT_API_URL": None}  # type: ignore[dict-item]
    result = runner.invoke(app, [a.format(tmp=tmp_path) for a in args], env=env)
    assert result.exit_code == 2, result.output[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output[-2000:]
    assert all(name in lines[0] for name in named), lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["sample", "--dataset", "nosuch"],
            "error: --dataset: unknown dataset 'nosuch'; choose one of arith, gsm8k, gsm_plus, math, math500",
        ),
        (["prioritize", "--dataset", "arith"], "error: no Kafka broker found: start the embedded one with"),
    ],
)
def test_a_command_that_cannot_run_leaves_no_flow_run_behind(args: list[str], line: str, tmp_path: Path) -> None:
    """The console command itself: one line, exit code 2, and Prefect never started (the database it
    makes under $PRMLOOP_HOME/prefect for its first flow run does not exist)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "PREFECT_API_URL")}
    env["PRMLOOP_HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith(line), done.stderr[-2000:]
    assert not list(tmp_path.rglob("prefect.db"))
