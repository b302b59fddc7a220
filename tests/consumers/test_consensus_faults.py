"""The consensus service under SIGKILL on a real broker: killed again and again while labels and verdicts
flow in, restarted each time, it ends with exactly one decision per solution (the same id on every
re-publication) and loses none."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

from test_consensus import decisions_on_the_wire, private_topics, send, world

from prmloop.consumers.consensus import ConsensusSettings, decision_event, labels_decision
from prmloop.store.events import Envelope, StepsJudged, StepsLabeled

SERVICE = """
import json, sys
from prmloop.consumers.consensus import ConsensusSettings, run_consensus
print("consensus: started", flush=True)
print(json.dumps(run_consensus(ConsensusSettings(), bootstrap_servers=sys.argv[1])), flush=True)
"""


def service(servers: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """The service as its own process; its settings come from ``PRMLOOP_CONSENSUS_*`` like the CLI's."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVICE, servers],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("consensus: started"), line
    return proc


def recorded(state_file: Path) -> int:
    """Decisions in the service's state file (read while it runs: SQLite's WAL lets a reader in)."""
    if not state_file.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{state_file}?mode=ro", uri=True, timeout=5) as con:
            return int(con.execute("SELECT count(*) FROM decisions").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def expected_decisions(mcs: list[Envelope], judges: list[Envelope], rule: str) -> dict[str, uuid.UUID]:
    """What the rule decides for each solution, computed here: the ids must match exactly."""
    out = {}
    for mc, judge in zip(mcs, judges, strict=True):
        assert isinstance(mc.payload, StepsLabeled) and isinstance(judge.payload, StepsJudged)
        decision = labels_decision(mc.payload, judge.payload)
        out[mc.correlation_id] = decision_event(decision, [mc, judge], rule=rule).event_id
    return out


def test_killed_at_random_moments_it_decides_every_solution_exactly_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    labeled_topic, judged_topic = private_topics(kafka_bootstrap)
    topic_of = {"StepsLabeled": labeled_topic, "StepsJudged": judged_topic}
    tag = uuid.uuid4().hex[:6]
    n = 240
    mcs, judges = world(n, seed=21, prefix=f"{tag}-")
    rng = random.Random(22)
    stream = [*mcs, *judges, *rng.sample(mcs, 30), *rng.sample(judges, 30)]  # with re-deliveries
    rng.shuffle(stream)
    env = {
        "PRMLOOP_HOME": str(tmp_path),
        "PRMLOOP_CONSENSUS_LABELED_TOPIC": labeled_topic,
        "PRMLOOP_CONSENSUS_JUDGED_TOPIC": judged_topic,
        "PRMLOOP_CONSENSUS_GROUP": f"consensus-{tag}",
        "PRMLOOP_CONSENSUS_MAX_BATCH": "10",  # many small transactions: kills land between and inside them
        "PRMLOOP_CONSENSUS_SESSION_TIMEOUT": "2",  # a killed member's partitions move on after 2 s
    }
    state_file = tmp_path / "consensus" / f"consensus-{tag}.sqlite3"
    settings = ConsensusSettings(group=f"consensus-{tag}", state_dir=tmp_path / "consensus")
    assert settings.state_path() == state_file

    # Each round: start the service, give it a share of the stream, kill it at a random moment once it
    # has decided something from it (it joins the group first); the last round lets it finish.
    rounds = 6
    share = -(-len(stream) // rounds)
    chunks = [stream[i : i + share] for i in range(0, len(stream), share)]
    started = time.monotonic()
    for chunk in chunks[:-1]:
        proc = service(kafka_bootstrap, env)
        before = recorded(state_file)
        send(kafka_bootstrap, topic_of, chunk)
        deadline = time.monotonic() + 30
        while recorded(state_file) == before and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.15))
        proc.kill()
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, output
        print(f"killed at {time.monotonic() - started:.1f}s with {recorded(state_file)} decided")
    kills = len(chunks) - 1
    mid_stream = recorded(state_file)

    proc = service(kafka_bootstrap, env)
    send(kafka_bootstrap, topic_of, chunks[-1])
    ids = {e.correlation_id for e in mcs}
    deadline = time.monotonic() + 60
    while recorded(state_file) < n:
        assert time.monotonic() < deadline, f"{recorded(state_file)} of {n} decided after the restart"
        time.sleep(0.2)
    time.sleep(0.5)  # recorded, then published: let the last batch's publication finish
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    summary = json.loads(output.strip().splitlines()[-1])
    assert summary["accepted_total"] + summary["rejected_total"] == n and summary["waiting"] == 0
    with sqlite3.connect(state_file) as con:
        assert con.execute("SELECT count(*) FROM decisions WHERE published = 0").fetchone() == (0,)

    wire = decisions_on_the_wire(kafka_bootstrap, ids)
    assert set(wire) == ids, f"no decision for {sorted(ids - set(wire))[:5]}"
    distinct = {sid: {e.event_id for e in events} for sid, events in wire.items()}
    twice = {sid: found for sid, found in distinct.items() if len(found) > 1}
    assert twice == {}, f"solutions decided more than once: {twice}"
    assert {sid: found.pop() for sid, found in distinct.items()} == expected_decisions(mcs, judges, settings.rule())
    print(f"{kills} kills ({mid_stream} of {n} decided by then) in {time.monotonic() - started:.1f}s")


def test_two_processes_of_one_group_on_one_host_share_partitions_and_state(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Range assignment gives each process partition p of both topics; the shared state file keeps
    what a rebalance moves between them, so each solution is still decided exactly once."""
    labeled_topic, judged_topic = private_topics(kafka_bootstrap)
    topic_of = {"StepsLabeled": labeled_topic, "StepsJudged": judged_topic}
    tag = uuid.uuid4().hex[:6]
    n = 120
    mcs, judges = world(n, seed=31, prefix=f"{tag}-")
    stream = [*mcs, *judges]
    random.Random(32).shuffle(stream)
    env = {
        "PRMLOOP_HOME": str(tmp_path),
        "PRMLOOP_CONSENSUS_LABELED_TOPIC": labeled_topic,
        "PRMLOOP_CONSENSUS_JUDGED_TOPIC": judged_topic,
        "PRMLOOP_CONSENSUS_GROUP": f"consensus-{tag}",
        "PRMLOOP_CONSENSUS_MAX_BATCH": "10",
        "PRMLOOP_CONSENSUS_SESSION_TIMEOUT": "2",
        "PRMLOOP_CONSENSUS_UNTIL_IDLE": "4",
    }
    procs = [service(kafka_bootstrap, env) for _ in range(2)]
    for i in range(0, len(stream), 12):
        send(kafka_bootstrap, topic_of, stream[i : i + 12])
        time.sleep(0.3)
    summaries = []
    for proc in procs:
        output, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, output
        summaries.append(json.loads(output.strip().splitlines()[-1]))
    wire = decisions_on_the_wire(kafka_bootstrap, {e.correlation_id for e in mcs})
    assert len(wire) == n and all(len({e.event_id for e in events}) == 1 for events in wire.values())
    settings = ConsensusSettings(group=f"consensus-{tag}")
    assert {sid: events[0].event_id for sid, events in wire.items()} == expected_decisions(mcs, judges, settings.rule())
    received = [s["received"] for s in summaries]
    print(f"received per process: {received}")
    assert all(r > 0 for r in received), f"one process did no work: {summaries}"
    assert sum(received) >= 2 * n
