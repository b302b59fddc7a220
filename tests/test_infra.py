"""infra/: the deployment files parse, and every command, option, variable, entrypoint and flow
parameter they name exists in the project (what a typo would break only on a cluster)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic_settings import BaseSettings
from typer.core import TyperGroup

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"


def _compose() -> dict[str, Any]:
    return yaml.safe_load((INFRA / "docker-compose.yml").read_text())


def _prmloop_services() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in _compose()["services"].items() if s.get("image") == "prmloop:latest"}


def _settings_env_names() -> set[str]:
    """Every environment variable a prmloop settings class reads (prefix + field name)."""
    modules = [
        "prmloop.store.settings",
        "prmloop.store.events.limits",
        "prmloop.producers.sampler",
        "prmloop.producers.prioritize",
        "prmloop.consumers.scorer",
        "prmloop.consumers.annotator",
        "prmloop.consumers.judge",
        "prmloop.consumers.consensus",
    ]
    names: set[str] = set()
    for module in map(importlib.import_module, modules):
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj is not BaseSettings:
                prefix = str(obj.model_config.get("env_prefix", ""))
                names.update((prefix + field).upper() for field in obj.model_fields)
    return names


def test_compose_has_the_services_a_cluster_needs() -> None:
    services = _compose()["services"]
    for name in (
        "kafka",
        "postgres",
        "prefect-server",
        "vllm-0",
        "scorer",
        "selector",
        "annotator",
        "judge",
        "consensus",
        "sink",
    ):
        assert name in services, name
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert "postgresql+asyncpg://" in services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert "--enable-prefix-caching" in services["vllm-0"]["command"]


def test_images_are_pinned_and_the_project_image_builds_from_files_that_exist() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        image = service["image"]
        assert (":" in image and not image.endswith(":latest")) or image == "prmloop:latest", f"{name}: pin {image}"
    for name, service in _prmloop_services().items():
        build = service["build"]
        dockerfile = (INFRA / build["context"] / build["dockerfile"]).resolve()
        assert dockerfile.is_file(), name
    for line in (INFRA / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"


def _check_command(args: list[str]) -> None:
    from prmloop.flows.cli import app

    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    ctx = root.make_context("prmloop", list(args), resilient_parsing=False)
    name = args[0]
    command = root.get_command(ctx, name)
    assert command is not None, f"prmloop has no command {name!r}"
    command.make_context(name, list(args[1:]), parent=ctx)  # raises on an unknown option or a bad value


@pytest.mark.parametrize("service", sorted(_prmloop_services()))
def test_every_prmloop_command_and_variable_exists(service: str) -> None:
    spec = _prmloop_services()[service]
    if spec.get("entrypoint", ["prmloop"]) == ["prmloop"]:
        _check_command(spec["command"])
    known = _settings_env_names() | {"PREFECT_API_URL", "PREFECT_API_AUTH_STRING"}
    for variable in spec.get("environment", {}):
        if variable.startswith(("PRMLOOP_", "KAFKA_")) or variable.startswith("PREFECT_"):
            assert variable in known, f"{service}: {variable} is read by nothing in prmloop"


def test_an_unknown_option_would_be_caught() -> None:
    with pytest.raises(Exception, match="No such option"):
        _check_command(["sink", "--no-such-option"])
    with pytest.raises(AssertionError, match="no command"):
        _check_command(["no-such-command"])


def test_env_example_names_only_variables_the_compose_file_uses() -> None:
    text = (INFRA / "docker-compose.yml").read_text()
    for line in (INFRA / ".env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            name = line.split("=", 1)[0]
            assert re.search(r"\$\{" + name + r"(:[-?][^}]*)?\}", text), f"{name} is not used in docker-compose.yml"


def test_prefect_deployments_point_at_real_flows_with_valid_parameters() -> None:
    from prefect.cli.deploy._models import PrefectYamlModel
    from prefect.flows import Flow

    raw = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    model = PrefectYamlModel.model_validate(raw)
    assert {d.name for d in model.deployments} >= {"prioritize", "sample", "retrain", "calibrate"}
    pools = {d.work_pool.name for d in model.deployments if d.work_pool}
    assert pools <= {"cpu", "gpu"}
    workers = [s for s in _compose()["services"].values() if s.get("entrypoint") == ["prefect"]]
    served = {s["command"][s["command"].index("--pool") + 1] for s in workers}
    assert pools <= served, "a deployment's work pool has no worker in docker-compose.yml"
    for deployment in model.deployments:
        assert deployment.entrypoint is not None
        path, name = deployment.entrypoint.split(":")
        assert (ROOT / path).is_file(), path
        module = importlib.import_module("prmloop." + path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, name)
        assert isinstance(flow, Flow), deployment.entrypoint
        flow.validate_parameters(deployment.parameters)  # raises on an unknown or mistyped parameter


def _replicas(service: dict[str, Any]) -> int:
    value = service.get("deploy", {}).get("replicas", 1)
    match = re.fullmatch(r"\$\{\w+:-(\d+)\}", str(value))
    return int(match.group(1)) if match else int(value)


def test_compose_runs_the_topology_that_up_cluster_runs() -> None:
    """infra/docker-compose.yml and `prmloop up --cluster` start the same prmloop services, with the same
    commands, environment variables and replicas (flows/ops/topology.py is the one description)."""
    from prmloop.flows.ops.topology import APP_SERVICES, ENGINE_VARIABLES, SHARED_VARIABLES

    compose = _prmloop_services()
    assert set(compose) == {s.name for s in APP_SERVICES}
    for service in APP_SERVICES:
        spec = compose[service.name]
        assert spec.get("entrypoint", ["prmloop"]) == [service.entrypoint], service.name
        assert tuple(spec["command"]) == service.command, service.name
        assert _replicas(spec) == service.replicas, service.name
        assert set(spec.get("environment", _compose()["x-prmloop"]["environment"])) == {
            *SHARED_VARIABLES,
            *service.environment,
        }, service.name
        assert set(service.engine) <= set(ENGINE_VARIABLES)


def test_the_topology_check_would_catch_a_drift() -> None:
    from prmloop.flows.ops.topology import APP_SERVICES

    compose = _prmloop_services()
    compose["judge"]["deploy"]["replicas"] = "${PRMLOOP_JUDGE_REPLICAS:-1}"
    judge = next(s for s in APP_SERVICES if s.name == "judge")
    assert _replicas(compose["judge"]) != judge.replicas


def test_no_secret_has_a_default_and_prefect_is_published_on_loopback() -> None:
    """Issue 39, point 4: compose published Prefect on 0.0.0.0:4200 with the passwords prefect/prmloop.
    Every secret now comes from the operator's infra/.env (compose refuses to start without it), and the
    Prefect port is bound to 127.0.0.1 unless the operator names another address."""
    text = (INFRA / "docker-compose.yml").read_text()
    secrets = ("POSTGRES_PASSWORD", "LAKE_PASSWORD", "PREFECT_AUTH_STRING", "VLLM_API_KEY")
    for name in secrets:
        uses = re.findall(r"\$\{" + name + r"([^}]*)\}", text)
        assert uses and all(use.startswith(":?") for use in uses), f"{name} has a default: {uses}"
    example = dict(
        line.split("=", 1)
        for line in (INFRA / ".env.example").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert all(example[name] == "" for name in secrets), "the example .env must not carry a password"
    compose = _compose()["services"]
    assert compose["prefect-server"]["ports"] == ["${PREFECT_PUBLISH_ADDRESS:-127.0.0.1}:4200:4200"]
    assert [name for name, service in compose.items() if service.get("ports")] == ["prefect-server"]
    assert "PREFECT_SERVER_API_AUTH_STRING" in compose["prefect-server"]["environment"]
    for name, service in compose.items():
        if service.get("entrypoint") == ["prefect"]:
            assert "PREFECT_API_AUTH_STRING" in service["environment"], name
    assert "VLLM_API_KEY" in _compose()["x-gpu"]["environment"]


def test_the_cluster_deploys_from_the_checkout_and_finds_its_vllm_environment_there() -> None:
    from prmloop.flows.ops import engine
    from prmloop.flows.ops.cluster import ROOT

    assert (ROOT / "infra" / "prefect.yaml").is_file() and (ROOT / "pyproject.toml").is_file()
    assert (
        f"parents[{len(Path(engine.__file__).resolve().relative_to(ROOT).parts) - 1}]"
        in Path(engine.__file__).read_text()
    )
