"""``prmloop bench generate``: transformers in process, vLLM in process and the vLLM server, in one run.

Each engine gets the same workloads (:mod:`prmloop.flows.lab.bench.generate_vllm`: sampling ``k=8``
solutions of each question, and Monte-Carlo rollouts from the successive prefixes of one solution), on
the embedded SmolLM2, with the same number of CPU threads (on a machine with a GPU every engine runs
there, in bfloat16). vLLM runs with its prefix cache on and off
(in process: ``enable_prefix_caching``; the server: ``--[no-]enable-prefix-caching``); sampling is
measured with it on, as the loop runs it. One engine runs at a time, each after a short warm-up call.

The headline figures: ``vllm_to_transformers_ratio`` (the server's sampling tokens/s over
transformers', the way the loop's services use vLLM) and ``prefix_cache_speedup`` (the server's
rollout tokens/s with the prefix cache over without); the in-process ratios stand beside them. The
machine's load average before and after is recorded: the CPU is shared.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prmloop.flows.lab.bench.generate_vllm import Workload, run_workload
from prmloop.flows.ops.engine import (
    EngineError,
    converted_model,
    cpu_flags,
    default_threads,
    engine_environment,
    engine_key_environment,
    engine_server,
    vllm_python,
)
from prmloop.models.backends.vllm_backend import OPTIONS_VARIABLE, engine_options_from_environment

__all__ = ["ENGINES", "bench_engines"]


def _ratio(a: Any, b: Any) -> float | None:
    try:
        return round(float(a) / float(b), 3)
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _tps(runs: dict[str, Any], cache: str | None, workload: str) -> Any:
    """Tokens/s of one workload of one engine's runs (``cache``: the prefix cache's run), None if not run."""
    run = runs.get(f"prefix_cache_{cache}") if cache else runs
    return run.get(workload, {}).get("tokens_per_s") if isinstance(run, dict) else None


def _inprocess_vllm(python: Path, workload: Workload, caching: bool, env: dict[str, str]) -> dict[str, Any]:
    args = {"workload": asdict(workload), "prefix_caching": caching, "sampling": caching}
    result = subprocess.run(
        [str(python), "-m", "prmloop.flows.lab.bench.generate_vllm", json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        with tempfile.NamedTemporaryFile("w", prefix="prmloop-bench-vllm-", suffix=".log", delete=False) as log:
            log.write(result.stdout + result.stderr)
        errors = [line for line in result.stderr.splitlines() if "Error" in line]
        raise RuntimeError(
            f"the in-process vLLM run failed (exit {result.returncode}): {errors[:3]}; its output: {log.name}"
        )
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


#: The engines the bench can run, in the order it runs them (``--engines``).
ENGINES = ("transformers", "inprocess", "server")


def bench_engines(
    quick: bool,
    *,
    threads: int | None = None,
    seed: int = 0,
    dtype: str | None = None,
    engines: Sequence[str] = ENGINES,
    say: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Run the comparison (see the module docstring); returns one JSON-able dict.

    Args:
        quick: 4 questions and 32-token completions instead of 8 and 96.
        threads: CPU threads of every engine (default: the cores, at most 2).
        seed: the sampling seed of every run.
        dtype: every engine's dtype (default: float32 on a CPU, bfloat16 on a GPU); vLLM in process gets
            it through ``$PRMLOOP_VLLM_OPTIONS``, the server as its ``--dtype`` flag.
        engines: which of :data:`ENGINES` to run (a ratio needs both of its engines).
        say: progress lines.
    """
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown or not engines:
        raise ValueError(f"--engines takes some of {', '.join(ENGINES)}, got {', '.join(engines) or 'none'}")
    from prmloop.models.backends.openai_backend import TokenizedOpenAIBackend, load_tokenizer
    from prmloop.models.backends.transformers_backend import TransformersBackend

    workload = Workload(n_prompts=4 if quick else 8, max_new_tokens=32 if quick else 96, seed=seed)
    threads = threads or default_threads()
    result: dict[str, Any] = {
        "bench": "generate",
        "quick": quick,
        "workload": asdict(workload),
        "threads": threads,
        "engines": [e for e in ENGINES if e in engines],
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    import torch

    # A GPU runs every engine on it: transformers in bfloat16 there, as vLLM runs (engine_command).
    device, default_dtype = ("cuda", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")
    dtype = dtype or default_dtype
    result["device"] = torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({os.cpu_count()} cores)"
    result["dtype"], result["cpu_flags"] = dtype, cpu_flags()
    if "transformers" in engines:
        say(f"transformers in process ({device}, {dtype})")
        backend = TransformersBackend.from_pretrained("smollm2", num_threads=threads, device=device, dtype=dtype)
        result["transformers"] = run_workload(backend, workload)
        say(json.dumps({"transformers": result["transformers"]}))
        del backend
        gc.collect()
    if not {"inprocess", "server"} & set(engines):
        python = model = None
    else:
        try:
            python = vllm_python()
            model = converted_model(python)
        except EngineError as exc:
            result["vllm_inprocess"] = result["vllm_server"] = f"skipped: {exc}"
            python = model = None
    if python is not None and model is not None:
        env = {**os.environ, **engine_environment(threads), **engine_key_environment()}
        # Every engine in the bench's dtype (the loop's engine picks its own, flows.ops.engine.cpu_dtype): the
        # in-process runs read it from their environment, the server from its flags.
        overrides = {"dtype": dtype}
        env[OPTIONS_VARIABLE] = json.dumps({**engine_options_from_environment(), **overrides})
        inprocess: dict[str, Any] = {}
        server: dict[str, Any] = {}
        for caching, key in ((True, "prefix_cache_on"), (False, "prefix_cache_off")):
            if "inprocess" in engines:
                say(f"vLLM in process, {key}")
                inprocess[key] = _inprocess_vllm(python, workload, caching, env)
                say(json.dumps({"vllm_inprocess": {key: inprocess[key]}}))
            if "server" not in engines:
                continue
            say(f"vLLM server, {key}")
            with engine_server(python, model, caching, env, overrides) as (url, start_s):
                client = TokenizedOpenAIBackend(
                    "smollm2",
                    tokenizer=load_tokenizer("smollm2"),
                    base_url=url,
                    api_key=env["VLLM_API_KEY"],
                    max_concurrency=workload.n_prompts,
                )
                with client:
                    server[key] = {"start_s": round(start_s, 1), **run_workload(client, workload, sampling=caching)}
            say(json.dumps({"vllm_server": {key: server[key]}}))
        result |= {"vllm_inprocess": inprocess or "not asked for", "vllm_server": server or "not asked for"}
        tf: dict[str, Any] = result.get("transformers", {})
        result["vllm_to_transformers_ratio"] = _ratio(_tps(server, "on", "sampling"), _tps(tf, None, "sampling"))
        result["vllm_inprocess_to_transformers_ratio"] = _ratio(
            _tps(inprocess, "on", "sampling"), _tps(tf, None, "sampling")
        )
        result["prefix_cache_speedup"] = _ratio(_tps(server, "on", "rollouts"), _tps(server, "off", "rollouts"))
        result["inprocess_prefix_cache_speedup"] = _ratio(
            _tps(inprocess, "on", "rollouts"), _tps(inprocess, "off", "rollouts")
        )
        result["vllm_rollouts_to_transformers_ratio"] = _ratio(
            _tps(server, "on", "rollouts"), _tps(tf, None, "rollouts")
        )
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result
