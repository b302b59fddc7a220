"""The embedded broker admits this user's clients only (issue 39, point 2).

Reproduced as the issue found it: as another local user (``nobody``), a 15-line standard-library
DeleteTopics request deleted ``steps.judged`` from a running broker. Tansu cannot authenticate as built
here (flows/ops/broker_gate.py says why), so the broker's gate lets through this user's connections alone
and Tansu itself listens in a network namespace no other process can reach. Real components: Tansu
behind the gate, kafka-python, the attack run with ``runuser -u nobody``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer

from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.store.kafka.producer import ensure_topics

#: The issue's attack: DeleteTopics v1 for one topic, with nothing but the standard library (15 lines).
DELETE_TOPIC = """
import socket, struct, sys
host, port, topic = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
body = struct.pack(">i", 1) + struct.pack(">h", len(topic)) + topic + struct.pack(">i", 10000)
header = struct.pack(">hhih", 20, 1, 7, 6) + b"mallory"[:6]
request = header + body
s = socket.create_connection((host, port), timeout=10)
try:
    s.sendall(struct.pack(">i", len(request)) + request)
    size = s.recv(4)
except OSError:  # reset: the other end closed before reading
    size = b""
if len(size) < 4:
    sys.exit(print("closed"))
answer = s.recv(struct.unpack(">i", size)[0])
print("answered", answer[8:].hex())
"""


def _topics(servers: str) -> set[str]:
    consumer = KafkaConsumer(bootstrap_servers=servers, request_timeout_ms=10_000)
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        ensure_topics(running.bootstrap_servers)
        yield running


def test_another_user_cannot_delete_a_topic(
    broker: EmbeddedBroker, as_nobody: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    attack = as_nobody(["python3", "-c", DELETE_TOPIC, broker.host, str(broker.port), "steps.judged"])
    assert attack.stdout.strip() == "closed", attack.stdout + attack.stderr
    assert "steps.judged" in _topics(broker.bootstrap_servers)


def test_the_same_request_from_this_user_is_served(broker: EmbeddedBroker) -> None:
    """The attack is a valid request: its own user's copy deletes a scratch topic (the gate is no filter
    on what a request says, only on who sends it)."""
    ensure_topics(broker.bootstrap_servers, [])
    from prmloop.store.events.topics import TopicSpec

    ensure_topics(broker.bootstrap_servers, [TopicSpec("scratch", 1)])
    assert "scratch" in _topics(broker.bootstrap_servers)
    done = subprocess.run(
        [sys.executable, "-c", DELETE_TOPIC, broker.host, str(broker.port), "scratch"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.startswith("answered"), done.stdout + done.stderr
    assert "scratch" not in _topics(broker.bootstrap_servers)


def _listening_ports(pids: set[int]) -> set[int]:
    """TCP ports the processes ``pids`` listen on in this network namespace (from /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            ports.add(int(fields[1].split(":")[1], 16))
    return ports


def _tree(root: int) -> set[int]:
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        children = Path(f"/proc/{pid}/task/{pid}/children")
        if children.exists():
            todo.extend(int(c) for c in children.read_text().split())
    return found


def test_no_port_of_the_broker_lets_another_user_in(
    broker: EmbeddedBroker, as_nobody: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """Not only the advertised address: Tansu's own listener is in a namespace of its own, so the broker's
    processes listen on no other port of this machine (where the platform cannot make one, skipped)."""
    if not broker.isolated:
        pytest.skip(f"no network namespace for Tansu here ({broker.why_not_isolated}): its port is open to all")
    assert broker.pid is not None
    assert _listening_ports(_tree(broker.pid)) == {broker.port}
    for topic in ("steps.judged", "labels.accepted"):
        attack = as_nobody(["python3", "-c", DELETE_TOPIC, broker.host, str(broker.port), topic])
        assert attack.stdout.strip() == "closed"


def test_prmloop_credentials_kafka_gives_keyword_arguments_that_connect_as_they_stand(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    env = {**os.environ, "PRMLOOP_HOME": str(tmp_path), "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers}
    done = subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", "credentials", "kafka"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    kwargs = json.loads(line)
    assert kwargs["bootstrap_servers"] == [broker.bootstrap_servers]
    producer = KafkaProducer(**kwargs)
    producer.send("questions.registered", b"{}").get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(**kwargs)
    assert "questions.registered" in consumer.topics()
    consumer.close()
