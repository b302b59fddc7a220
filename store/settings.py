"""Settings from the environment: one frozen object per concern (Kafka connection, local state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class KafkaSettings(BaseSettings):
    """How to reach Kafka. ``KAFKA_BOOTSTRAP_SERVERS`` unset means: use the embedded broker.

    Security settings follow kafka-python's names, read from ``KAFKA_SECURITY_PROTOCOL``,
    ``KAFKA_SASL_MECHANISM``, ``KAFKA_SASL_PLAIN_USERNAME``, ``KAFKA_SASL_PLAIN_PASSWORD``,
    ``KAFKA_SSL_CAFILE``, ``KAFKA_SSL_CERTFILE``, ``KAFKA_SSL_KEYFILE``.
    """

    model_config = SettingsConfigDict(env_prefix="KAFKA_", frozen=True, extra="ignore")

    bootstrap_servers: str | None = None
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = Field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    client_id: str = "prmloop"
    #: ``KAFKA_ASSIGN_ALL=1``: every consumer reads all partitions of its topics without joining its
    #: group (offsets are still committed under it), so it starts without the broker's join delay (about
    #: 5 s on Tansu). Only for services that run alone, one consumer per group: the benchmark's
    #: round-based loop, whose five stages start once per round.
    assign_all: bool = False
    #: ``KAFKA_CONNECT_WAIT_S``: how long a client waits at start for a broker that does not answer yet
    #: (starting, or slow on a loaded machine) before it fails; it says every 30 s what it waits for.
    connect_wait_s: float = Field(default=300.0, ge=0)

    def client_kwargs(self, bootstrap_servers: str | None = None) -> dict[str, Any]:
        """Keyword arguments shared by kafka-python's producer, consumer and admin client."""
        servers = bootstrap_servers or self.bootstrap_servers
        if not servers:
            raise RuntimeError(
                "no Kafka broker configured: set KAFKA_BOOTSTRAP_SERVERS=host:port, "
                "or start the embedded one with `prmloop broker`"
            )
        kwargs: dict[str, Any] = {
            "bootstrap_servers": servers.split(","),
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
        }
        optional = {
            "sasl_mechanism": self.sasl_mechanism,
            "sasl_plain_username": self.sasl_plain_username,
            "sasl_plain_password": self.sasl_plain_password,
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
        }
        kwargs.update({k: v for k, v in optional.items() if v is not None})
        return kwargs


class StateSettings(BaseSettings):
    """Where prmloop keeps its local state: the DuckDB file, the outbox, the broker's address."""

    model_config = SettingsConfigDict(env_prefix="PRMLOOP_", frozen=True, extra="ignore")

    home: Path = Field(default=Path.home() / ".prmloop", description="PRMLOOP_HOME")
    #: ``PRMLOOP_STORE``: unset (the DuckDB file in home), a DuckDB file's path, or a DuckLake:
    #: ``ducklake:pgserver:<dir>`` (a local PostgreSQL catalog in ``<dir>/catalog``, data in
    #: ``<dir>/data``) or ``ducklake:postgres:<conninfo>`` (optionally ``#reader=<libpq keywords>``:
    #: how readers connect), optionally followed by ``#data=<dir>`` (default for a PostgreSQL server:
    #: ``$PRMLOOP_HOME/lake/data``).
    store: str | None = Field(default=None, description="PRMLOOP_STORE")
    #: ``PRMLOOP_BROKER_STORAGE``: where ``prmloop broker`` keeps topics: ``memory``, ``postgres`` (a
    #: PostgreSQL of its own) or a ``postgresql://`` URL.
    broker_storage: str = Field(default="memory", description="PRMLOOP_BROKER_STORAGE")

    @property
    def db_path(self) -> Path:
        return self.home / "prmloop.duckdb"

    @property
    def store_location(self) -> Path | str:
        """What every reader and the sink open: ``PRMLOOP_STORE`` if set, else the DuckDB file."""
        return self.store if self.store else self.db_path

    @property
    def outbox_dir(self) -> Path:
        return self.home / "outbox"

    @property
    def features_dir(self) -> Path:
        """The PRMs' cache of step features (rebuildable from the events; safe to delete)."""
        return self.home / "features"

    @property
    def broker_file(self) -> Path:
        return self.home / "broker.json"

    @property
    def run_dir(self) -> Path:
        """One record per service ``prmloop up`` started (``<name>.json``)."""
        return self.home / "run"

    @property
    def links_dir(self) -> Path:
        """One record per running Kafka client that follows ``broker.json``: the broker it uses now."""
        return self.run_dir / "links"
