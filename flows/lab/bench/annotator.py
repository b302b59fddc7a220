"""``prmloop bench annotator``: does labelling throughput grow with annotator processes and in-flight solutions?

One world of simulated incorrect solutions, scored as ``prmloop score --simulator`` scores them, is
published to a fresh topic per configuration; each
configuration runs real ``prmloop annotate --completer simulator`` processes in one consumer group on
that topic until they are idle. The simulator sleeps ``latency_s`` per engine call, standing in for
the time a GPU engine takes per batched request (the labels themselves cost no CPU), so the figure is
the service's scaling: partitions shared by the group, solutions in flight, commit and publish costs.

Throughput of a configuration: solutions labelled / (last label published - first solution taken up),
over all its processes (process start-up and the group join are excluded; a process that joins late
still counts, as it would in production). Every configuration sees the same solutions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prmloop.consumers.scorer import StepScorer
from prmloop.flows.ops.broker import EmbeddedBroker, parent_death_signal
from prmloop.models.simulator import SimulatedSolution, SimulatedStepUncertainty, SimulatorConfig, simulate_solutions
from prmloop.producers.simulated import simulated_events
from prmloop.store.events import Envelope, SolutionSampled
from prmloop.store.events.codec import encode_event
from prmloop.store.events.topics import TopicSpec, dlq_topic
from prmloop.store.kafka.producer import EventProducer, ensure_topics
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.settings import KafkaSettings

__all__ = ["DEFAULT_CONFIGS", "bench_annotator", "scored_simulated_events"]

#: (processes, solutions in flight per process)
DEFAULT_CONFIGS: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (1, 4))


def scored_simulated_events(world: Sequence[SimulatedSolution], seed: int) -> tuple[list[Envelope], list[Envelope]]:
    """The questions and solutions of a simulated world, and their ``StepsScored`` as the real step
    scorer (``prmloop score --simulator``) makes them: what the annotator consumes."""
    events = simulated_events(world, seed)
    scored: list[Envelope] = []
    handler = StepScorer(scored.extend, simulated=SimulatedStepUncertainty(world))
    sampled = [e for e in events if isinstance(e.payload, SolutionSampled)]
    handler([ConsumedEvent(e, SolutionSampled.TOPIC, 0, i, 0) for i, e in enumerate(sampled)])
    return events, scored


def _run_config(
    servers: str, world: tuple[int, int], *, processes: int, in_flight: int, latency_s: float, home: Path
) -> dict[str, Any]:
    n, seed = world
    topic = f"bench-annotate-{uuid.uuid4().hex[:8]}"
    ensure_topics(servers, [TopicSpec(topic, 4), TopicSpec(dlq_topic(topic), 1)])
    _, scored = scored_simulated_events(simulate_solutions(n, SimulatorConfig(), seed=seed), seed)
    with EventProducer(servers) as producer:
        for e in scored:
            producer.send_raw(topic, e.correlation_id.encode(), encode_event(e), [])
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": servers, "PRMLOOP_HOME": str(home)}
    command = [sys.executable, "-m", "prmloop.flows.cli", "annotate", "--completer", "simulator"]
    command += ["--sim-n", str(n), "--sim-seed", str(seed), "--sim-latency", str(latency_s), "--topic", topic]
    command += ["--group", f"group-{topic}", "--in-flight", str(in_flight), "--until-idle", "5"]
    procs = [
        subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=parent_death_signal(),  # noqa: PLW1509 - never outlives the bench
        )
        for _ in range(processes)
    ]
    summaries = []
    for proc in procs:
        out, errors = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"an annotator process failed ({proc.returncode}): {errors[-2000:]}")
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    published = sum(int(s["published"]) for s in summaries)
    starts = [s["first_started"] for s in summaries if s["first_started"] is not None]
    ends = [s["last_published"] for s in summaries if s["last_published"] is not None]
    busy = max(ends) - min(starts) if starts and ends else float("nan")
    return {
        "processes": processes,
        "in_flight": in_flight,
        "published": published,
        "per_process": [int(s["published"]) for s in summaries],
        "busy_s": round(busy, 3),
        "solutions_per_s": round(published / busy, 3) if busy > 0 else None,
    }


def bench_annotator(
    *,
    n_solutions: int = 48,
    latency_s: float = 0.05,
    configs: Sequence[tuple[int, int]] = DEFAULT_CONFIGS,
    seed: int = 0,
) -> dict[str, Any]:
    """Throughput of each (processes, in-flight) configuration on the same simulated solutions."""
    world = (n_solutions, seed)
    with tempfile.TemporaryDirectory(prefix="prmloop-bench-annotator-") as tmp:
        servers = KafkaSettings().bootstrap_servers
        broker = None if servers else EmbeddedBroker().start()
        try:
            servers = servers or broker.bootstrap_servers  # type: ignore[union-attr]
            ensure_topics(servers)
            results = [
                _run_config(servers, world, processes=p, in_flight=f, latency_s=latency_s, home=Path(tmp))
                for p, f in configs
            ]
        finally:
            if broker is not None:
                broker.stop()
    base = results[0]["solutions_per_s"] or float("nan")
    for r in results:
        r["speedup"] = round((r["solutions_per_s"] or float("nan")) / base, 3)
    return {"solutions": n_solutions, "latency_s": latency_s, "configs": results}
