"""``prmloop bench replay``: the engine's own tokens a second on the loop's own requests, the loop's ceiling.

A run recorded with ``prmloop run --record-requests`` leaves every ``/completions`` request its services
sent the engine under ``$PRMLOOP_HOME/requests`` (:mod:`prmloop.models.backends.request_log`): the
sampler's solutions, the annotator's rollouts (``n`` each), the judge's and the scorer's calls, with when
each went out and the usage the engine answered. The bench starts an engine of its own (the loop's
settings: :func:`~prmloop.flows.ops.engine.engine_environment`), sends the same bodies again with
``--concurrency`` in flight at once (no request waits for another's answer, as the annotator's search
does in the loop) and reports:

- ``loop_tokens_per_s``: the tokens the engine generated for the recorded run over the span from its
  first request to its last answer (the run's warm-up excluded: ``--skip-s``);
- ``replay_tokens_per_s``: the same requests' tokens over the replay's wall time;
- ``loop_to_replay``: their ratio (issue 55's target: at least 0.8);
- ``replay_engine_cores`` and ``replay_idle_cores``: the engine's processes' CPU and the machine's idle
  CPU during the replay (from ``/proc``);
- ``loop_cores``: the loop's own, where the run left its figures beside the requests
  (``$PRMLOOP_HOME/loop/last-run.json``): the engine's cores and the other processes' over the run;
- with ``--at-loop``, the same requests replayed again at the loop's own requests in flight (its mean,
  rounded up), which splits the gap in two: ``batch_factor`` (the engine alone at the loop's batch
  against full concurrency: what more requests in flight could win) times ``contention_factor`` (the
  loop against the engine alone at its own batch: what the loop's other work and its gaps cost) is
  ``loop_to_replay``.

Both figures come from one machine: compare the ratio, not the tokens a second, across machines.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prmloop.flows.ops.engine import (
    SERVED_MODEL_NAME,
    converted_model,
    cpu_flags,
    default_threads,
    engine_environment,
    engine_server,
    group_cpu_ticks,
    vllm_python,
)
from prmloop.models.backends.request_log import read_requests

__all__ = ["bench_replay", "gap_factors", "loop_figures", "per_engine_core", "run_cores"]


def loop_figures(rows: list[dict[str, Any]], skip_s: float = 0.0) -> dict[str, Any]:
    """The recorded run's own figures: requests, completion tokens and tokens a second over its span.

    ``skip_s``: requests that went out in the first ``skip_s`` seconds of the recording are left out
    (the engine's warm-up). Requests overlap in time, so the span runs from the first request out to
    the last answer in.
    """
    start = float(rows[0]["t"]) + skip_s
    kept = [row for row in rows if float(row["t"]) >= start]
    if not kept:
        raise ValueError(f"no recorded request after the first {skip_s:g} s: lower --skip-s")
    tokens = sum(int(row["usage"].get("completion_tokens", 0)) for row in kept)
    first = min(float(row["t"]) for row in kept)
    last = max(float(row["t"]) + float(row["s"]) for row in kept)
    span = max(last - first, 1e-9)
    sequences = sum(int(row["body"].get("n", 1)) for row in kept)
    return {
        "requests": len(kept),
        "sequences": sequences,
        "completion_tokens": tokens,
        "prompt_tokens": sum(int(row["usage"].get("prompt_tokens", 0)) for row in kept),
        "span_s": round(span, 1),
        "tokens_per_s": round(tokens / span, 2),
        "mean_in_flight": round(sum(float(row["s"]) for row in kept) / span, 2),
    }


def run_cores(run_json: Path) -> dict[str, Any] | None:
    """The recorded run's cores, from the JSON ``prmloop run`` leaves: after warm-up where the run measured
    it (``cpu_after_warm_up``: the engine's, the other processes', the machine's idle, the engine's share of
    what the others left), else its engine's and the other processes' CPU-seconds over its whole wall time
    (start and stop included); None where there is none or it lacks them."""
    try:
        result = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return None
    warm = result.get("cpu_after_warm_up") if isinstance(result, dict) else None
    if isinstance(warm, dict) and "engine" in warm:
        keys = ("engine", "others", "idle", "engine_share_of_left", "from_s", "to_s")
        return {key: warm.get(key) for key in keys} | {"after_warm_up": True}
    try:
        cpu = {str(k): float(v) for k, v in result["cpu_s"].items()}
        wall = float(result["wall_s"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if wall <= 0 or "engine" not in cpu:
        return None
    return {
        "engine": round(cpu["engine"] / wall, 2),
        "others": round(sum(v for k, v in cpu.items() if k != "engine") / wall, 2),
        "after_warm_up": False,
    }


def per_engine_core(tokens_per_s: float | None, engine_cores: float | None) -> float | None:
    """Tokens a second per core the engine had: equal in the loop and the replay when the loop's gap is
    only the CPU its other processes take."""
    if not tokens_per_s or not engine_cores or engine_cores <= 0:
        return None
    return round(tokens_per_s / engine_cores, 1)


def gap_factors(loop_tps: float, replay_tps: float, at_loop_tps: float) -> dict[str, float | None]:
    """``loop / replay`` split as ``(at_loop / replay) * (loop / at_loop)``: the batch and the rest."""
    if replay_tps <= 0 or at_loop_tps <= 0:
        return {"batch_factor": None, "contention_factor": None}
    return {
        "batch_factor": round(at_loop_tps / replay_tps, 3),
        "contention_factor": round(loop_tps / at_loop_tps, 3),
    }


def _cpu_ticks(pgid: int | None) -> tuple[int, int]:
    """(ticks of the processes in group ``pgid``, the machine's idle ticks) from ``/proc``."""
    with open("/proc/stat") as machine:
        cpu = machine.readline().split()[1:]
    return (group_cpu_ticks(pgid) if pgid is not None else 0), int(cpu[3]) + int(cpu[4])


def _server_group(port: str) -> int | None:
    """The process group of the vLLM server listening on ``port`` (its command line names it)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in words and port.encode() in words:
            return os.getpgid(int(cmdline.parent.name))
    return None


@contextlib.contextmanager
def _metered(pgid: int | None) -> Iterator[dict[str, float]]:
    """Cores the group ``pgid`` kept busy and the machine left idle while the block ran (filled on exit)."""
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    group, idle = _cpu_ticks(pgid)
    started = time.perf_counter()
    yield out
    wall = max(time.perf_counter() - started, 1e-9)
    group2, idle2 = _cpu_ticks(pgid)
    out["engine_cores"] = round((group2 - group) / hz / wall, 2)
    out["idle_cores"] = round((idle2 - idle) / hz / wall, 2)


def replay(
    url: str,
    bodies: list[dict[str, Any]],
    concurrency: int,
    say: Callable[[str], None],
    *,
    model: str = SERVED_MODEL_NAME,
) -> dict[str, Any]:
    """Send ``bodies`` to the server at ``url`` with ``concurrency`` in flight: tokens, seconds, errors."""
    import httpx

    done = {"tokens": 0, "requests": 0, "errors": 0}
    last_said = [time.monotonic()]
    lock = threading.Lock()

    def one(client: httpx.Client, body: dict[str, Any]) -> None:
        try:
            response = client.post("/completions", json=body | {"model": model})
            usage = response.json().get("usage", {}) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            usage = None
        with lock:
            if usage is None:
                done["errors"] += 1
            else:
                done["tokens"] += int(usage.get("completion_tokens", 0))
            done["requests"] += 1
            if time.monotonic() - last_said[0] < 30:
                return
            last_said[0] = time.monotonic()
        say(f"replay: {done['requests']}/{len(bodies)} requests, {done['tokens']:,} tokens")

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(base_url=url, timeout=600.0, limits=limits) as client:
        client.post("/completions", json={"model": model, "prompt": "1+1=", "max_tokens": 4})
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(lambda body: one(client, body), bodies))
        seconds = time.perf_counter() - started
    return done | {"seconds": round(seconds, 1), "tokens_per_s": round(done["tokens"] / max(seconds, 1e-9), 2)}


def bench_replay(
    folder: Path,
    *,
    concurrency: int = 64,
    skip_s: float = 60.0,
    threads: int | None = None,
    at_loop: bool = False,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The recorded run's tokens a second against the same requests replayed at full concurrency (and, with
    ``at_loop``, again at the loop's own requests in flight, on the same engine)."""
    rows = read_requests(folder)
    loop = loop_figures(rows, skip_s)
    start = float(rows[0]["t"]) + skip_s
    bodies = [row["body"] for row in rows if float(row["t"]) >= start]
    say(
        f"replay: {loop['requests']} requests ({loop['completion_tokens']:,} tokens, {loop['span_s']:.0f} s in the "
        f"loop) at {concurrency} in flight on an engine of the bench's own"
    )
    python = vllm_python()
    model = converted_model(python)
    threads = threads or default_threads()
    env = {key: value for key, value in os.environ.items() if key != "VLLM_API_KEY"}
    env |= engine_environment(threads)
    load_before = os.getloadavg()[0]
    with engine_server(python, model, True, env, {}) as (url, start_s):
        port = url.rsplit(":", 1)[1].split("/")[0]
        with _metered(_server_group(port)) as cpu:
            replayed = replay(url, bodies, concurrency, say)
        at = None
        if at_loop:
            own = max(1, math.ceil(loop["mean_in_flight"]))
            say(f"replay: again at the loop's own {own} in flight")
            at = replay(url, bodies, own, say) | {"concurrency": own}
    loop_cores = run_cores(folder.parent / "loop" / "last-run.json")
    extra: dict[str, Any] = {}
    if at is not None:
        extra = {
            "replay_at_loop": at,
            **gap_factors(loop["tokens_per_s"], replayed["tokens_per_s"], at["tokens_per_s"]),
        }
    return {
        "bench": "replay",
        "requests_from": str(folder),
        "cpu_flags": cpu_flags(),
        "threads": threads,
        "concurrency": concurrency,
        "skip_s": skip_s,
        "loop": loop,
        "replay": replayed | {"engine_start_s": round(start_s, 1)},
        "loop_tokens_per_s": loop["tokens_per_s"],
        "replay_tokens_per_s": replayed["tokens_per_s"],
        "loop_to_replay": round(loop["tokens_per_s"] / replayed["tokens_per_s"], 3)
        if replayed["tokens_per_s"]
        else None,
        "replay_engine_cores": cpu["engine_cores"],
        "replay_idle_cores": cpu["idle_cores"],
        "loop_cores": loop_cores,
        # the engine's tokens per core it had: the same in both when the gap is the CPU the rest takes
        "loop_tokens_per_engine_core": per_engine_core(loop["tokens_per_s"], (loop_cores or {}).get("engine")),
        "replay_tokens_per_engine_core": per_engine_core(replayed["tokens_per_s"], cpu["engine_cores"]),
        **extra,
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
