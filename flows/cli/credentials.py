"""``prmloop credentials``: what a user's own clients need to reach prmloop's services.

``kafka`` prints one JSON object of kafka-python keyword arguments for the broker other commands use
(``KAFKA_BOOTSTRAP_SERVERS`` with its security settings, else the cluster ``up --cluster`` runs here,
else the embedded broker of ``broker.json``): ``KafkaProducer(**that)`` and ``KafkaConsumer(**that)``
connect as they stand. ``prefect`` prints the Prefect servers' basic-auth string and ``engine`` the
vLLM engine's address and API key, for ``PREFECT_API_AUTH_STRING`` and an OpenAI client.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from prmloop.flows.cli.app import app, usage_error
from prmloop.store.settings import KafkaSettings, StateSettings

credentials_app = typer.Typer(help="What your own clients need to reach prmloop's services.", no_args_is_help=True)
app.add_typer(credentials_app, name="credentials")


@credentials_app.command("kafka")
def kafka(
    client_id: Annotated[str, typer.Option(help="the client id your clients announce")] = "prmloop-user",
) -> None:
    """One JSON object of kafka-python keyword arguments: KafkaProducer(**that) and KafkaConsumer(**that)
    connect to the broker prmloop's commands use (the embedded broker admits this user's clients only)."""
    from prmloop.flows.ops.cluster import cluster_connection
    from prmloop.store.kafka.broker_file import find_bootstrap_servers

    settings = KafkaSettings()
    servers = settings.bootstrap_servers
    if not servers:
        cluster = cluster_connection()
        servers = cluster["bootstrap_servers"] if cluster is not None else find_bootstrap_servers(settings)
    if not servers:
        usage_error(
            "no Kafka broker found: start one with `prmloop up` (or `prmloop broker`), or set KAFKA_BOOTSTRAP_SERVERS"
        )
    kwargs = settings.model_copy(update={"client_id": client_id}).client_kwargs(servers)
    typer.echo(json.dumps(kwargs))


@credentials_app.command("prefect")
def prefect() -> None:
    """The basic-auth string every Prefect server prmloop starts asks for (PREFECT_API_AUTH_STRING)."""
    from prmloop.store.auth.credentials import load_credentials

    typer.echo(load_credentials(StateSettings().home).prefect_auth_string)


@credentials_app.command("engine")
def engine() -> None:
    """The vLLM engine's /v1 address (when `prmloop up` runs one) and its API key, as one JSON object."""
    from prmloop.flows.ops.services import read_state
    from prmloop.store.auth.credentials import load_credentials

    state = StateSettings()
    record = read_state(state, "engine")
    url = record.url if record is not None and record.alive else None
    typer.echo(json.dumps({"base_url": url, "api_key": load_credentials(state.home).engine_api_key}))
