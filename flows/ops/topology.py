"""The cluster's topology: which prmloop services run, with which command, environment and replicas.

One description for the two ways to start a cluster: ``infra/docker-compose.yml`` (containers on GPU
nodes) and ``prmloop up --cluster`` (native processes on one machine, :mod:`prmloop.flows.ops.cluster`).
``tests/test_infra.py`` checks that the compose file names exactly these services, commands,
environment variables and replicas, so neither can drift from the other.

What differs between the two is only what one machine lacks: Kafka (KRaft) becomes two Tansu brokers
on PostgreSQL storage, the two PostgreSQL containers one local PostgreSQL server with three databases,
and the vLLM servers the simulator (or the embedded model): the variables that name a GPU engine
(:data:`ENGINE_VARIABLES`) get the simulator's values instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["APP_SERVICES", "ENGINE_VARIABLES", "SHARED_VARIABLES", "Service", "native_engine"]


@dataclass(frozen=True)
class Service:
    """One service of the prmloop image: ``entrypoint command...``, ``replicas`` processes."""

    name: str
    command: tuple[str, ...]
    #: Variables set for this service beyond :data:`SHARED_VARIABLES` (names; values depend on the place).
    environment: tuple[str, ...] = ()
    replicas: int = 1
    entrypoint: str = "prmloop"
    #: A one-shot job (it exits 0 when done) rather than a long-running service.
    job: bool = False
    #: Variables of the GPU engine, replaced natively by :func:`native_engine`.
    engine: tuple[str, ...] = field(default=())


#: Set for every prmloop service (compose: the ``x-prmloop`` anchor).
SHARED_VARIABLES: tuple[str, ...] = ("KAFKA_BOOTSTRAP_SERVERS", "PRMLOOP_HOME", "PRMLOOP_STORE")

_ANNOTATOR_ENGINE = (
    "PRMLOOP_ANNOTATOR_BACKEND",
    "PRMLOOP_ANNOTATOR_MODEL",
    "PRMLOOP_ANNOTATOR_BASE_URL",
    "PRMLOOP_ANNOTATOR_API_KEY",
)
_JUDGE_ENGINE = ("PRMLOOP_JUDGE_BACKEND", "PRMLOOP_JUDGE_MODEL", "PRMLOOP_JUDGE_BASE_URL", "PRMLOOP_JUDGE_API_KEY")
_SAMPLE_ENGINE = (
    "PRMLOOP_SAMPLE_BACKEND",
    "PRMLOOP_SAMPLE_MODEL",
    "PRMLOOP_SAMPLE_BASE_URL",
    "PRMLOOP_SAMPLE_API_KEY",
    "PRMLOOP_PRIORITIZE_BACKEND",
    "PRMLOOP_PRIORITIZE_MODEL",
    "PRMLOOP_PRIORITIZE_BASE_URL",
    "PRMLOOP_PRIORITIZE_API_KEY",
)
#: What a Prefect worker sends the server (its basic auth); natively, the credentials file's.
_PREFECT_CLIENT = ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING")
#: Every variable that names the GPU engine (a vLLM server) in the compose file.
ENGINE_VARIABLES: tuple[str, ...] = (*_ANNOTATOR_ENGINE, *_JUDGE_ENGINE, *_SAMPLE_ENGINE)

#: The prmloop image's services, in start order (the jobs first).
APP_SERVICES: tuple[Service, ...] = (
    Service("topics", ("topics", "--partitions", "8"), job=True),
    Service("sink", ("sink",), replicas=2),
    Service("scorer", ("score",), replicas=2),
    Service("selector", ("select",), replicas=2),
    Service(
        "annotator",
        ("annotate",),
        environment=(*_ANNOTATOR_ENGINE, "PRMLOOP_ANNOTATOR_STRATEGY"),
        replicas=2,
        engine=_ANNOTATOR_ENGINE,
    ),
    Service("judge", ("judge",), environment=_JUDGE_ENGINE, replicas=2, engine=_JUDGE_ENGINE),
    Service("consensus", ("consensus",), replicas=2),
    Service(
        "worker-cpu",
        ("worker", "start", "--pool", "cpu", "--type", "process"),
        environment=_PREFECT_CLIENT,
        replicas=2,
        entrypoint="prefect",
    ),
    Service(
        "worker-gpu",
        ("worker", "start", "--pool", "gpu", "--type", "process", "--limit", "2"),
        environment=(*_PREFECT_CLIENT, *_SAMPLE_ENGINE),
        entrypoint="prefect",
        engine=_SAMPLE_ENGINE,
    ),
)


def native_engine(service: Service, engine: str) -> dict[str, str]:
    """The engine variables of ``service`` on one machine: ``simulator`` (the simulated world of
    ``prmloop simulate``, and the exact step checker as the judge) or ``model`` (the embedded
    SmolLM2 on the CPU). The compose file's vLLM variables are left out."""
    env: dict[str, str] = {}
    if service.name == "scorer" and engine == "simulator":
        env["PRMLOOP_SCORER_SIMULATOR"] = "true"
    if service.name == "annotator":
        env["PRMLOOP_ANNOTATOR_COMPLETER"] = "simulator" if engine == "simulator" else "model"
        env["PRMLOOP_ANNOTATOR_STRATEGY"] = "adaptive_binary"
    if service.name == "judge":
        env["PRMLOOP_JUDGE_METHOD"] = "exact"
    return env
