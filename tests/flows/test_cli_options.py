"""Each service's options are declared once, by its settings object: the command line, the environment
and the Prefect flow's parameters all come from it."""

from __future__ import annotations

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
    assert _options(command) == set(settings.model_fields)


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
