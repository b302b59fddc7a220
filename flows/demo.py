"""``prmloop demo``: the loop, round after round, on the embedded defaults, within a time budget.

It makes a held-out set (reference solutions of curriculum questions the loop never samples, and copies
with one result changed: known first errors), then runs rounds of the loop (:mod:`prmloop.flows.demo_stages`:
prioritize new questions, sample the top of the queue, score, select, annotate, judge, consensus, retrain
the ensemble PRM) and reports each round's
held-out F1 next to the labels and tokens spent: the loop's learning curve. Then it **calibrates** the
aggregation and publishes the monitor's artifacts (``loop-learning`` among them).

Where things go. The demo uses the default state folder (``$PRMLOOP_HOME``, ``~/.prmloop``): its DuckDB
store, outboxes, consensus state, PRMs, caches and Prefect state, so that ``prmloop status``, ``prmloop
sql``, ``prmloop models list`` and ``prmloop down`` find them afterwards. It writes nothing into the
working directory. The terminal shows one line per stage and a summary; everything else (Prefect's
logs, library warnings) goes to ``$PRMLOOP_HOME/logs/demo.log``, which also has the stage lines.

The budget. Sizes come from a speed probe and are planned again before every round from the speed
measured so far; a round that no longer fits is cut (said so), and the annotator stops where the
round's time ends. Ctrl-C or SIGTERM stops everything the demo started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from prmloop.flows.demo_stages import (
    FINAL_RESERVE_S,
    MIN_ROUND_TOKENS,
    ROUND_OVERHEAD_S,
    DemoSettings,
    Stages,
    plan_round,
    wait_stored,
)
from prmloop.store.settings import KafkaSettings, StateSettings

__all__ = ["DEMO_QUERIES", "DemoError", "command_prefix", "next_commands", "run_demo"]

#: Queries the demo ends with (and runs), for the user to try with ``prmloop sql``.
DEMO_QUERIES = {
    "the loop learning: each round's ensemble PRM on the held-out set": (
        "SELECT model_id, train_examples AS trained_on, round(CAST(metrics->>'heldout_f1' AS DOUBLE), 3) AS "
        "heldout_f1, registered_at FROM model_versions WHERE kind = 'prm_ensemble' ORDER BY registered_at"
    ),
    "what the PRM sent to be labelled or skipped, and why": (
        "SELECT solution_id[:8] AS solution, decision, coalesce(prm, '-') AS prm, reason FROM selections "
        "WHERE is_latest ORDER BY score DESC NULLS FIRST LIMIT 8"
    ),
    "MC labels and whether consensus kept them": (
        "SELECT l.solution_id[:8] AS solution, l.method, l.first_error_step AS mc_first_error, "
        "c.decision, c.reason FROM (SELECT DISTINCT solution_id, method, first_error_step FROM label_history "
        "WHERE source = 'StepsLabeled') l LEFT JOIN consensus c ON c.solution_id = l.solution_id LIMIT 10"
    ),
    "what the labels cost": (
        "SELECT method, count(*) AS solutions, sum(rollouts) AS rollouts, sum(generated_tokens) AS tokens "
        "FROM cost_ledger GROUP BY ALL ORDER BY tokens DESC"
    ),
}

#: Seconds before the first round: the Prefect server, the model load and probe, the broker, the
#: held-out set (first run only) and prioritizing (measured here: 2-4 minutes on a loaded machine).
SETUP_S = 150.0


def command_prefix(home: Path, shell_home: Path) -> str:
    """How to call ``prmloop`` so a printed command runs as it stands: ``prmloop`` when the shell finds
    this one on its PATH, else its path (``.venv/bin/prmloop`` after ``make demo``); with
    ``PRMLOOP_HOME=...`` in front when the demo's home is not ``shell_home``, the one the shell uses."""
    own = Path(sys.executable).parent / "prmloop"
    found = shutil.which("prmloop")
    if found and Path(found).resolve() == own.resolve():
        command = "prmloop"
    else:
        relative = os.path.relpath(own)
        command = relative if not relative.startswith("..") else str(own)
    if home.expanduser().resolve() != shell_home.expanduser().resolve():
        command = f"PRMLOOP_HOME={home} {command}"
    return command


def next_commands(home: Path, *, shell_home: Path, prefect_started: bool) -> list[str]:
    """The commands the demo ends with, exactly as printed (each runs as it stands in the shell)."""
    p = command_prefix(home, shell_home)
    commands = [f"{p} status", f"{p} models list"]
    commands += [f'{p} sql "{sql}"' for sql in list(DEMO_QUERIES.values())[:2]]
    if prefect_started:
        commands.append(f"{p} down")
    return commands


@dataclass
class _Terminal:
    """Stage lines to the terminal and the log file; everything else (fd 1 and 2) to the log file only."""

    log_path: Path
    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log: IO[str] = self.log_path.open("a", buffering=1)
        self.out: IO[str] = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
        self.console = Console(file=self.out, soft_wrap=True, highlight=False)

    def stage(self, name: str, text: str) -> None:
        line = f"[{time.monotonic() - self.started:5.0f}s] {name}: {text}"
        self.lines.append(line)
        self.out.write(line + "\n")
        self.log.write(line + "\n")

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.log.write(text + "\n")

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Send whatever the stages print (Prefect's console logs, warnings, progress) to the log file."""
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(self.log.fileno(), 1)
        os.dup2(self.log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _speed_probe(threads: int | None, base_url: str | None = None) -> float:
    """Tokens per second of the engine the stages will use: transformers in process, or the vLLM
    engine at ``base_url``."""
    from prmloop.models.backends.base import SamplingParams
    from prmloop.models.backends.registry import EngineSettings, build_backend

    engine = EngineSettings(threads=threads) if base_url is None else _engine_settings(base_url)
    generator = build_backend(engine.backend_config())
    generator.generate(["Count: 1,"], SamplingParams(n=1, max_new_tokens=4, temperature=0.7, seed=0))  # warm-up
    # Batched like the loop's sampling and rollouts (two prompts x 4), which decode several times
    # more tokens per second than a single sequence does.
    started = time.perf_counter()
    batches = generator.generate(
        ["Count: 1, 2, 3,", "Tom has 3 apples and buys 2 more."],
        SamplingParams(n=4, max_new_tokens=24, temperature=0.7, seed=0),
    )
    tokens = sum(c.completion_tokens for batch in batches for c in batch)
    return tokens / max(time.perf_counter() - started, 1e-6)


def _engine_settings(base_url: str) -> Any:
    from prmloop.flows.engine import SERVED_MODEL_NAME
    from prmloop.models.backends.registry import EngineSettings

    return EngineSettings(backend="openai", model=SERVED_MODEL_NAME, base_url=base_url)


@dataclass
class _Engine:
    """The engine the demo's model-using stages call: ``url`` is the vLLM engine's, None for transformers."""

    url: str | None = None
    started: bool = False
    set_keys: list[str] = field(default_factory=list)  # environment variables the demo set (none were set before)

    def describe(self, speed: float, busy: str) -> str:
        if self.url is None:
            return f"transformers, SmolLM2-135M-Instruct in process on the CPU: {speed:.0f} tokens/s (probe){busy}"
        how = "started for the demo" if self.started else "already running"
        return f"vLLM ({how}, {self.url}), SmolLM2-135M-Instruct on the CPU: {speed:.0f} tokens/s (probe)"


class DemoError(RuntimeError):
    """The demo cannot run as asked (one line, said to the user)."""


def _open_engine(choice: str, home: Path, report: Callable[[str, str], None]) -> _Engine:
    """The engine for ``--engine`` ``choice``: the vLLM engine of ``prmloop up`` if one runs, else one
    started here (auto falls back to transformers where vLLM is not ready or does not start); the
    stages reach it through the settings ``prmloop up`` gives its services."""
    if choice == "transformers":
        return _Engine()
    from prmloop.flows.engine import engine_unavailable, service_environment
    from prmloop.flows.stack import read_state, up

    state = StateSettings(home=home)
    record = read_state(state, "engine")
    started = False
    if record is None or not record.alive or not record.url:
        reason = engine_unavailable()
        if reason is None:
            try:
                up(["engine"], state=state, say=lambda line: report("engine", line))
            except (RuntimeError, OSError) as exc:
                reason = f"it did not start: {' '.join(str(exc).split())[:300]}"
        record = read_state(state, "engine") if reason is None else None
        if record is None or not record.url:
            if choice == "vllm":
                raise DemoError(f"--engine vllm: the vLLM engine is not available ({reason}); or --engine transformers")
            report("engine", f"vLLM unavailable ({reason}): transformers in process instead")
            return _Engine()
        started = True
    engine = _Engine(url=record.url, started=started)
    for key, value in service_environment(record.url).items():
        if key not in os.environ:  # a setting the user exported wins, as under `prmloop up`
            engine.set_keys.append(key)
            os.environ[key] = value
    return engine


def _close_engine(engine: _Engine, home: Path, report: Callable[[str, str], None]) -> None:
    """Take back the settings the demo set; stop the engine if the demo started it (its KV cache holds
    2 GiB of memory)."""
    for key in engine.set_keys:
        os.environ.pop(key, None)
    if engine.started:
        from prmloop.flows.stack import down

        down(["engine"], state=StateSettings(home=home), say=lambda line: report("engine", line))


@contextmanager
def _broker(report: Callable[[str, str], None]) -> Iterator[str]:
    configured = KafkaSettings().bootstrap_servers
    if configured:
        report("broker", f"{configured} (KAFKA_BOOTSTRAP_SERVERS)")
        yield configured
        return
    from prmloop.store.broker import EmbeddedBroker
    from prmloop.store.kafka import ensure_topics

    with EmbeddedBroker() as broker:
        ensure_topics(broker.bootstrap_servers)
        report("broker", f"embedded Tansu on {broker.bootstrap_servers}")
        yield broker.bootstrap_servers


@contextmanager
def _sink(db: Path, servers: str) -> Iterator[Callable[[], int]]:
    from prmloop.consumers.sink import run_sink
    from prmloop.store.duck import StoreLocked, query

    stop = threading.Event()
    thread = threading.Thread(
        target=run_sink,
        kwargs={"bootstrap_servers": servers, "db_path": db, "until": stop.is_set, "install_signal_handlers": False},
        daemon=True,
    )
    thread.start()

    def stored() -> int:
        try:
            return int(query(db, "SELECT count(*) FROM events", timeout_s=5).rows[0][0])
        except (StoreLocked, FileNotFoundError):
            return -1

    try:
        yield stored
    finally:
        stop.set()
        thread.join(timeout=30)


def _prefect_server(home: Path, report: Callable[[str, str], None]) -> tuple[str | None, bool]:
    """(UI URL, whether the demo started it): the server of ``prmloop up`` if one runs, else a new one."""
    from prmloop.flows.prefect_home import USER_CHOSE_PREFECT
    from prmloop.flows.stack import prefect_api_url, up

    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"].removesuffix("/api"), False
    if USER_CHOSE_PREFECT:
        return None, False
    url = prefect_api_url(StateSettings(home=home))
    started = False
    if url is None:
        up(["prefect"], state=StateSettings(home=home), say=lambda line: report("prefect", line))
        url, started = prefect_api_url(StateSettings(home=home)), True
    if url:
        os.environ["PREFECT_API_URL"] = url
    return (url.removesuffix("/api") if url else None), started


def _stop_on_signals() -> None:
    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)


def run_demo(settings: DemoSettings | None = None) -> dict[str, Any]:
    """Run the loop's rounds within the budget (see the module docstring); returns what each did."""
    from prmloop.flows.prefect_home import isolate_prefect_state
    from prmloop.models.backends.registry import shared_backends

    s = settings or DemoSettings()
    busy = ""
    if s.threads is None and os.getloadavg()[0] > 0.75 * (os.cpu_count() or 1):
        # Torch's threads spin while they wait for a core: on a busy machine one thread decodes faster.
        s = dataclasses.replace(s, threads=1)
        busy = f" (one torch thread: the machine is busy, load {os.getloadavg()[0]:.1f})"
    shell_home = StateSettings().home
    home = (s.home or shell_home).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["PRMLOOP_HOME"] = str(home)  # every service's outbox and state goes into this home
    db = StateSettings().db_path
    term = _Terminal(home / "logs" / "demo.log")
    deadline = time.monotonic() + s.minutes * 60.0

    def left() -> float:
        return deadline - time.monotonic()

    existing = db.is_file()
    term.stage(
        "home", f"{home} (store {db.name}{', adding to what it holds' if existing else ''}); log {term.log_path}"
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _stop_on_signals()
    ui, started_server = None, False
    out: dict[str, Any] = {"rounds": [], "cut": []}
    engine = _Engine()
    with isolate_prefect_state(home), shared_backends():
        try:
            with term.quiet():
                ui, started_server = _prefect_server(home, term.stage)
                term.stage("prefect", f"flow runs go to {ui}" if ui else "a throw-away local Prefect API")
                engine = _open_engine(s.engine, home, term.stage)
                speed = _speed_probe(s.threads, engine.url)
            term.stage("engine", engine.describe(speed, busy))
            out["engine"] = "vllm" if engine.url else "transformers"
            with term.quiet(), _broker(term.stage) as servers, _sink(db, servers) as stored:
                # A server batches the rollouts of several solutions at once; in process they take turns.
                stages = Stages(s, servers, db, home, term.stage, stored, left, in_flight=4 if engine.url else 1)
                out.update(_run_rounds(s, stages, speed, left, term, engine=out["engine"]))
        except KeyboardInterrupt:
            term.stage("interrupted", "stopping what the demo started")
            if started_server:
                from prmloop.flows.stack import down

                with term.quiet():
                    down(state=StateSettings(home=home), say=lambda line: term.stage("prefect", line))
            raise
        finally:
            with term.quiet():
                _close_engine(engine, home, term.stage)
    _summary(term, db, out, ui=ui, commands=next_commands(home, shell_home=shell_home, prefect_started=started_server))
    return {"home": str(home), "db": str(db), "ui": ui, **out}


def _run_rounds(
    s: DemoSettings, stages: Stages, speed: float, left: Callable[[], float], term: _Terminal, *, engine: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": [], "cut": []}
    first = plan_round(speed, left() - SETUP_S, s.rounds)
    if first is None:
        need = (SETUP_S + FINAL_RESERVE_S + s.rounds * (ROUND_OVERHEAD_S + MIN_ROUND_TOKENS / max(speed, 0.1))) / 60
        term.stage(
            "budget", f"cut every round: at {speed:.1f} tokens/s a round does not fit; --minutes {need:.0f} would"
        )
        out["cut"].append("every round")
        return out
    term.stage("plan", f"{s.rounds} rounds in {s.minutes:g} min on {engine}; round 1: {first.describe()}")
    stages.heldout()
    measured_tokens, measured_s = 0.0, 0.0
    last = False
    for index in range(s.rounds):
        rate = (measured_tokens / measured_s) if measured_s > 20 else speed
        plan = plan_round(rate, left(), s.rounds - index)
        if plan is None and index + 1 < s.rounds:
            # Fewer rounds then: this one gets all the time left, the later ones are cut.
            plan = plan_round(rate, left(), 1)
            if plan is not None:
                what = f"rounds {index + 2}-{s.rounds}" if index + 2 < s.rounds else f"round {index + 2}"
                term.stage("budget", f"cut {what} ({left():.0f}s left at {rate:.0f} tokens/s): this round is the last")
                out["cut"].append(what)
                last = True
        if plan is None:
            what = f"rounds {index + 1}-{s.rounds}" if index + 1 < s.rounds else f"round {index + 1}"
            term.stage("budget", f"cut {what}: {left():.0f}s left at {rate:.0f} tokens/s")
            out["cut"].append(what)
            break
        term.stage(f"round {index + 1}/{s.rounds}", f"plan at {rate:.0f} tokens/s: {plan.describe()}")
        result = stages.round(index, index + 1 if last else s.rounds, plan)
        out["rounds"].append(result)
        measured_tokens += result["generated_tokens"]
        measured_s += result["generation_s"]
        if result["cut"]:
            out["cut"].append(f"round {index + 1}'s annotation")
        if last:
            break
    if left() > 40:
        stages.calibrate()
    else:
        term.stage("budget", "cut the calibration: the budget is spent")
        out["cut"].append("calibration")
    out["events"] = wait_stored(stages.stored)
    from prmloop.flows.monitor import ARTIFACT_KEYS, monitor

    metrics = monitor(str(stages.db))
    out["learning"] = metrics["learning"]
    term.stage("monitor", f"artifacts {', '.join(ARTIFACT_KEYS)} published; {out['events']} events stored")
    return out


def _summary(term: _Terminal, db: Path, out: dict[str, Any], *, ui: str | None, commands: list[str]) -> None:
    from prmloop.flows.monitor import learning_table

    elapsed = time.monotonic() - term.started
    term.say()
    term.say(f"Done in {elapsed:.0f}s. The loop's learning curve (held-out F1 of each round's ensemble PRM):")
    for line in learning_table(out.get("learning") or []) if out.get("learning") else ["  no PRM was trained"]:
        term.say(line)
    if out["cut"]:
        term.say(f"Cut to keep the budget: {', '.join(out['cut'])}.")
    _print_queries(term.console, db)
    term.say(f"The store: {db}. Log: {term.log_path}")
    if ui:
        term.say(f"Prefect UI (flow runs, artifacts such as loop-learning): {ui}")
    term.say("Next, as they stand:")
    for command in commands:
        term.say(f"  {command}")


def _print_queries(console: Console, db: Path) -> None:
    from prmloop.store.duck import QueryError, query

    for title, sql in DEMO_QUERIES.items():
        try:
            result = query(db, sql)
        except QueryError as exc:
            console.print(f"{title}: {exc}", markup=False)
            continue
        if not result.rows:
            continue
        table = Table(*result.columns, title=title)
        for row in result.rows:
            table.add_row(*(str(v) for v in row))
        with contextlib.suppress(BrokenPipeError):
            console.print(table)
