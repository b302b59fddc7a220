"""The machine's one vLLM engine: an OpenAI-compatible server every model-using service shares.

``prmloop engine`` (or ``prmloop up --engine vllm``) starts ``python -m vllm.entrypoints.openai.api_server``
from ``.venv-vllm`` (``make vllm`` builds it: vLLM pins ``transformers<5.20`` and ``fastapi<0.137``,
which the project's Prefect cannot share) on the embedded SmolLM2, converted once into a Hugging
Face folder (:mod:`prmloop.models.backends.hf_export`). The services reach it through the
OpenAI-compatible backend (``PRMLOOP_<SERVICE>_BACKEND=openai`` and ``..._BASE_URL``, set by ``up``),
so one engine batches the sampler's, scorer's, annotator's, judge's and prioritizer's requests.

Settings for vLLM's CPU build, each measured on this 2-core machine (ARCHITECTURE.md's traps):

- ``--dtype``: bfloat16 where the CPU has native bfloat16 instructions (AVX512_BF16 or AMX: 1.4x the
  tokens/s of float32 there, docs/vllm.md), else float32 (bfloat16 falls back to slow kernels on an
  AVX2 CPU, about 5x slower); :func:`cpu_dtype`. ``PRMLOOP_VLLM_OPTIONS='{"dtype": ...}'`` chooses.
- ``--distributed-executor-backend uni`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the model runs in the
  engine's process, not in a worker of its own that the engine process waits on spinning; that spinning
  took about a third of the tokens/s on two cores (``cpu_executor`` in models/backends/vllm_backend.py).
- ``--enforce-eager``: torch.compile's warm-up costs 77-133 s at every start (its cache fails to reload).
- ``--enable-prefix-caching``: Monte-Carlo rollouts of one solution share their prefix's KV blocks.
- ``--enable-prompt-tokens-details``: responses report ``cached_tokens``, how tests and the bench see hits.
- ``VLLM_CPU_OMP_THREADS_BIND=nobind`` with ``OMP_NUM_THREADS=<threads>``: pinned threads cannot move
  off a core another process is busy on, so on a shared machine binding collapses under load; the
  default (``auto``) runs one pinned thread and reserves the other core, idle.
- OpenMP's wait policy is left at libgomp's default: a thread spins briefly (300,000 turns) after a
  parallel region, then sleeps, so an idle engine still leaves the cores to the loop's other processes.
  ``OMP_WAIT_POLICY=PASSIVE`` (sleep at once) cost 13-20 % of the engine's tokens/s here (in process,
  the bench's workload, alternated runs: sampling 108.3 and 107.2 against 93.2 and 88.5 tokens/s).
- ``--no-enable-chunked-prefill`` with a 4,096-token context: a seeded request prefilled in chunks
  crashes the CPU build's engine (``prmloop bench generate``'s 8 prompts x n=8 did).
- ``VLLM_CPU_KVCACHE_SPACE=2`` (GiB): 46,592 tokens of KV cache, room for every prefix a loop reuses.
- ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=64`` (oneDNN's default is 1,024): the CPU build's matrix products
  are oneDNN primitives compiled for each number of tokens a step carries (2-13 ms each here), and
  oneDNN keeps up to 1,024 of them in a process-wide cache, which grew one weight shape's process by
  1.5 GiB over 1,200 token counts (118 MiB at 64). A loop's steps carry ever new counts, so the default
  let the engine grow for as long as it ran (docs/loop.md, "Running for an hour"). vLLM keeps its own
  32 most recent primitives per weight shape, so the smaller cache recompiles only a count that comes
  back after both have let it go. A value the user exported wins.

Replicas (``PRMLOOP_ENGINE_REPLICAS=N``, ``prmloop engine --replicas N``): N servers of one thread each
(unless ``--threads`` says otherwise) under one supervisor (:mod:`prmloop.flows.ops.replicas`), recorded
as one engine whose URL lists theirs, comma-separated. The services' client spreads its requests over
them (least in flight), and the loop's meter and ``prmloop status`` sum their ``/metrics``. Two engines of
one thread alone make what one of two threads makes, and neither waits on the other when another process
takes a core from it (docs/loop.md, "Where the gap goes").

The engine asks every ``/v1`` request for the credentials' API key (``VLLM_API_KEY``:
:func:`engine_key_environment`); the services get it with its address (:func:`service_environment`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prmloop.flows.ops.broker import parent_death_signal
from prmloop.models.backends.vllm_backend import (
    CPU_MAX_MODEL_LEN,
    ONE_PROCESS_VARIABLE,
    cpu_executor,
    engine_flags,
    engine_options_from_environment,
)
from prmloop.store.auth.credentials import load_credentials
from prmloop.store.ports import free_port

__all__ = [
    "ENGINE_SERVICES",
    "ONEDNN_PRIMITIVE_CACHE",
    "EngineError",
    "engine_command",
    "engine_environment",
    "engine_key_environment",
    "engine_load",
    "engine_replicas",
    "engine_unavailable",
    "engine_urls",
    "gpu_present",
    "group_cpu_ticks",
    "read_metrics",
    "service_environment",
    "vllm_python",
]

SERVED_MODEL_NAME = "smollm2"
"""The name the engine serves the embedded model under: the services' default ``--model``, unchanged."""

ENGINE_SERVICES: tuple[str, ...] = ("SAMPLE", "PRIORITIZE", "SCORER", "ANNOTATOR", "JUDGE")
"""Services whose model calls go to the engine (their settings' environment prefixes, ``PRMLOOP_<X>_``)."""

_INSTALL_HINT = "run `make vllm` in the prmloop checkout (builds .venv-vllm, about 3-7 minutes)"


class EngineError(RuntimeError):
    """The engine cannot start here (no vLLM environment, no converted model)."""


def vllm_python() -> Path:
    """The Python of the vLLM environment: ``$PRMLOOP_VLLM_PYTHON``, else ``.venv-vllm`` of the checkout.

    Raises:
        EngineError: none is found.
    """
    explicit = os.environ.get("PRMLOOP_VLLM_PYTHON")
    candidates = (
        [Path(explicit)]
        if explicit
        else [
            Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python",
            Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python",
        ]
    )
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise EngineError(f"no vLLM environment found (looked for {', '.join(map(str, candidates))}): {_INSTALL_HINT}")


def engine_unavailable() -> str | None:
    """Why this machine cannot run the engine (None: it can): no ``.venv-vllm``, or vLLM failed to
    install there (``make vllm`` records why), or the embedded model is not converted yet."""
    from prmloop.models.backends.hf_export import converted_smollm2_folder, smollm2_folder

    try:
        python = vllm_python()
    except EngineError as exc:
        return str(exc)
    failed = python.parent.parent / ".install-failed"
    if failed.is_file():
        return " ".join(failed.read_text().split())[:300]
    if converted_smollm2_folder() is None:
        return f"the embedded model is not converted for vLLM ({smollm2_folder()}): {_INSTALL_HINT}"
    return None


PRIMITIVE_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"

ONEDNN_PRIMITIVE_CACHE = 64
"""Compiled oneDNN primitives the CPU engine keeps (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; see the module docstring)."""


def default_threads() -> int:
    """OpenMP threads of the engine: every core, at most 2 (the loop's other processes share them)."""
    return max(1, min(2, os.cpu_count() or 1))


def engine_environment(threads: int | None = None, kv_cache_gib: int = 2, *, gpu: bool | None = None) -> dict[str, str]:
    """The variables that set the CPU engine's threads, binding, process and KV cache (see the module docstring).

    Without a GPU (``gpu``; default: :func:`gpu_present`) they also let the model run in the engine's
    own process (:func:`~prmloop.models.backends.vllm_backend.cpu_executor`).
    """
    one_process = {} if (gpu_present() if gpu is None else gpu) else {ONE_PROCESS_VARIABLE: "0"}
    return one_process | {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(threads or default_threads()),
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        PRIMITIVE_CACHE_VARIABLE: os.environ.get(PRIMITIVE_CACHE_VARIABLE, str(ONEDNN_PRIMITIVE_CACHE)),
        # The engine needs no usage reporting; nothing outside this machine can be reached anyway.
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def gpu_present() -> bool:
    """An NVIDIA GPU answers ``nvidia-smi -L`` here (what ``make vllm`` checks to install the official vLLM)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def engine_command(
    python: Path,
    model_dir: Path,
    port: int,
    *,
    prefix_caching: bool = True,
    gpu: bool | None = None,
    overrides: dict[str, Any] | None = None,
) -> list[str]:
    """The server's command line (``python -m``: the ``vllm`` script fails for the ``vllm-cpu`` distribution).

    On a GPU (``gpu``; default: :func:`gpu_present`) vLLM's own defaults hold (bfloat16, CUDA graphs,
    chunked prefill); on a CPU, the settings of the module docstring. ``$PRMLOOP_VLLM_OPTIONS`` adds
    flags or overrides these (:func:`~prmloop.models.backends.vllm_backend.engine_options_from_environment`),
    and ``overrides`` (the bench's ``--dtype``) win over both.
    """
    options: dict[str, Any] = {"dtype": "bfloat16", "gpu_memory_utilization": 0.5}
    cpu = not (gpu_present() if gpu is None else gpu)
    if cpu:
        # Whole prefills: a seeded request prefilled in chunks crashes the CPU build's engine ("CPU
        # Generator does not use offset"; see models/backends/vllm_backend.py), and a step must then hold a
        # whole prompt, so the context is capped there too.
        options = {
            "dtype": cpu_dtype(),
            "enforce_eager": True,
            "enable_chunked_prefill": False,
            "max_model_len": CPU_MAX_MODEL_LEN,
            "max_num_batched_tokens": CPU_MAX_MODEL_LEN,
        }
    options |= {"enable_prefix_caching": prefix_caching, "seed": 0} | engine_options_from_environment()
    options |= overrides or {}
    if cpu:
        options = cpu_executor(options) | options
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *engine_flags(options),
        "--enable-prompt-tokens-details",
        "--disable-uvicorn-access-log",
    ]


def cpu_flags() -> list[str]:
    """The vector extensions this CPU reports that decide its matrix kernels (``/proc/cpuinfo``; [] elsewhere)."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in wanted if flag in flags]


def cpu_dtype(flags: list[str] | None = None) -> str:
    """The engine's dtype on a CPU: bfloat16 where it has native bfloat16 kernels, else float32."""
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


def converted_model(python: Path) -> Path:
    """The embedded model's Hugging Face folder, converting it with the project's own environment.

    The conversion needs the ``gguf`` package, which the project's environment has and vLLM's does not.
    """
    from prmloop.models.backends.hf_export import ensure_smollm2_folder

    try:
        return ensure_smollm2_folder()
    except ImportError as exc:
        raise EngineError(f"cannot convert the embedded GGUF for vLLM ({exc}); {_INSTALL_HINT}") from exc


def engine_key_environment(home: Path | None = None) -> dict[str, str]:
    """What makes the engine ask for the credentials' API key (vLLM reads ``VLLM_API_KEY``; ``--api-key``
    would show it to every user in the process list)."""
    return {"VLLM_API_KEY": load_credentials(home).engine_api_key}


def service_environment(url: str, home: Path | None = None) -> dict[str, str]:
    """What points the services at the engine at ``url`` (its ``/v1`` root), with its API key (the
    credentials of ``home``, default ``$PRMLOOP_HOME``)."""
    key = load_credentials(home).engine_api_key
    env: dict[str, str] = {}
    for prefix in ENGINE_SERVICES:
        env[f"PRMLOOP_{prefix}_BACKEND"] = "openai"
        env[f"PRMLOOP_{prefix}_BASE_URL"] = url
        env[f"PRMLOOP_{prefix}_MODEL"] = SERVED_MODEL_NAME
        env[f"PRMLOOP_{prefix}_API_KEY"] = key
    return env


REPLICAS_VARIABLE = "PRMLOOP_ENGINE_REPLICAS"


def engine_replicas(env: dict[str, str] | None = None) -> int:
    """Engine servers to start (``$PRMLOOP_ENGINE_REPLICAS``, default 1).

    Raises:
        EngineError: the variable is not a whole number from 1 to 16.
    """
    value = (os.environ if env is None else env).get(REPLICAS_VARIABLE, "").strip() or "1"
    if not value.isdigit() or not 1 <= int(value) <= 16:
        raise EngineError(f"{REPLICAS_VARIABLE}={value!r}: give a whole number of engine servers from 1 to 16")
    return int(value)


def engine_urls(url: str) -> list[str]:
    """The servers of an engine's URL (replicas list theirs, comma-separated)."""
    return [u.strip().rstrip("/") for u in url.split(",") if u.strip()]


def wait_ready(url: str, timeout_s: float, alive: Any) -> bool:
    """Wait until every server of ``url`` (``/v1``; replicas: comma-separated) answers ``/health``; False if
    ``alive()`` turns False first."""
    waiting = [u.removesuffix("/v1") + "/health" for u in engine_urls(url)]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for health in list(waiting):
            try:
                with urllib.request.urlopen(health, timeout=2) as response:
                    if response.status == 200:
                        waiting.remove(health)
            except OSError:
                pass
        if not waiting:
            return True
        if not alive():
            return False
        time.sleep(1.0)
    return False


_METRICS = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+|NaN)$")


def parse_metrics(text: str) -> dict[str, float]:
    """The engine's load from its Prometheus ``/metrics`` text (summed over label sets)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match and match.group(1) in _METRICS and match.group(2) != "NaN":
            key = _METRICS[match.group(1)]
            out[key] = out.get(key, 0.0) + float(match.group(2))
    return out


def read_metrics(url: str, timeout_s: float = 2.0) -> dict[str, float]:
    """The engine's load, summed over its servers' ``/metrics`` (replicas: every one must answer).

    Raises:
        OSError: a server did not answer.
    """
    out: dict[str, float] = {}
    for server in engine_urls(url):
        with urllib.request.urlopen(server.removesuffix("/v1") + "/metrics", timeout=timeout_s) as response:
            for key, value in parse_metrics(response.read().decode()).items():
                out[key] = out.get(key, 0.0) + value
    return out


def group_cpu_ticks(pgid: int) -> int:
    """CPU ticks (user + system) of every process in the process group ``pgid`` (the engine's children too)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total


def engine_load(pid: int, url: str | None, sample_s: float = 0.5) -> dict[str, Any]:
    """For ``prmloop status``: cores the engine's processes keep busy, its memory, and its request queue."""
    load: dict[str, Any] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    before = group_cpu_ticks(pid)
    time.sleep(sample_s)
    load["cpu_cores_busy"] = round((group_cpu_ticks(pid) - before) / ticks / sample_s, 2)
    if url:
        try:
            load.update({k: round(v, 4) for k, v in read_metrics(url).items()})
            load["servers"] = len(engine_urls(url))
        except OSError as exc:
            load["metrics"] = f"unavailable ({type(exc).__name__})"
    return load


@contextlib.contextmanager
def engine_server(
    python: Path, model: Path, caching: bool, env: dict[str, str], overrides: dict[str, Any]
) -> Iterator[tuple[str, float]]:
    """A vLLM server of the caller's own (a bench, a pool's sampler) on a free port: (URL, start seconds);
    stopped on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with tempfile.NamedTemporaryFile(prefix="prmloop-bench-engine-", suffix=".log", delete=False) as log:
        started = time.perf_counter()
        process = subprocess.Popen(
            engine_command(python, model, port, prefix_caching=caching, overrides=overrides),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            # SIGKILLed with this process, whatever ends it (SIGTERM goes through the finally below).
            preexec_fn=parent_death_signal(),  # noqa: PLW1509
        )
    try:
        if not wait_ready(url, 600, lambda: process.poll() is None):
            raise RuntimeError(f"the vLLM server did not come up (exit {process.poll()}); see {log.name}")
        yield url, time.perf_counter() - started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    Path(log.name).unlink(missing_ok=True)
