"""Session fixtures shared by the whole suite: a real Kafka broker."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from prmloop.store.broker import EmbeddedBroker
from prmloop.store.kafka import ensure_topics


def _docker_engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:  # noqa: BLE001 - any failure means: no usable engine
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """KAFKA_BOOTSTRAP_SERVERS if set, else testcontainers Kafka (KRaft) if Docker answers, else the
    embedded Tansu broker on a free port. Every test gets a real broker."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        servers = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        ensure_topics(servers)
        yield servers
        return
    if _docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            servers = kafka.get_bootstrap_server()
            ensure_topics(servers)
            yield servers
        return
    with EmbeddedBroker() as broker:
        ensure_topics(broker.bootstrap_servers)
        yield broker.bootstrap_servers
