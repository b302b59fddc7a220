"""The model work behind ``prmloop bench active``'s pools: which engine does it, and what it costs.

- **The engine** (:class:`Sampler`): the vLLM engine ``prmloop up`` runs for this home if one runs;
  else, where ``.venv-vllm`` is ready (``$PRMLOOP_VLLM_PYTHON``), a vLLM engine of the bench's own
  (:func:`prmloop.flows.ops.engine.engine_command` on a free port, stopped when the pool is built); else
  the embedded SmolLM2 on transformers in process, saying why and what it will cost. Nothing starts
  before something must be sampled: a pool that is cached starts no engine.
- **Speeds** (:func:`speed`): tokens/s of sampling and of MC rollouts on each engine, and solutions/s of
  the backbone's features, as this home last measured them (``speeds.json`` beside the pools), else as
  measured on the team's 2-core machine (:data:`DEFAULT_SPEEDS`). A build says what it will cost
  before it starts (:func:`describe_cost`) and how far it is as it goes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_SPEEDS",
    "ENGINES",
    "ENGINE_START_S",
    "MC_TOKENS_PER_SOLUTION",
    "TOKENS_PER_SOLUTION",
    "Sampler",
    "describe_cost",
    "record_speed",
    "speed",
]

Say = Callable[[str], None]

#: ``--engine`` choices: ``auto`` (vLLM where it can run, else transformers), or one of them.
ENGINES = ("auto", "vllm", "transformers")

#: Throughput on the team's 2-core machine (float32; tokens/s, features in solutions/s; measured by the
#: bench's own builds, the machine shared with other work), used until this home has measured its own:
#: vLLM sampling 64 questions per call with 16 requests of k = 4 in flight (149-160 tokens/s), transformers
#: 4 questions x 4 on 2 threads (44), the backbone's features of arith solutions in chunks of 32 (10.9/s).
#: MC rollouts: vLLM with 4 solutions in flight, measured by ``--quick``; transformers from the 160
#: labels (about 45,000 tokens) that took about an hour there.
DEFAULT_SPEEDS: dict[str, float] = {
    "vllm.sample": 150.0,
    "vllm.mc": 150.0,
    "transformers.sample": 44.0,
    "transformers.mc": 12.0,
    "features": 10.9,
}
#: Mean completion tokens of one sampled curriculum solution (160 at most), until a cache has its own.
TOKENS_PER_SOLUTION = 55.0
#: Mean generated tokens of one solution's MC label (the arith-mc pool: 17,854 tokens over 64 solutions).
MC_TOKENS_PER_SOLUTION = 280.0
#: Seconds to start a vLLM engine of the bench's own (20-26 s here; more on two busy cores).
ENGINE_START_S = 40.0
#: Requests in flight against the vLLM engine while sampling (each samples k solutions of a question),
#: and questions per call: the next request starts as one finishes, so the engine stays full.
_CONCURRENCY, _VLLM_QUESTIONS_PER_CALL = 16, 64


def _speeds_file(root: Path) -> Path:
    return root / "speeds.json"


def speed(root: Path, key: str) -> tuple[float, str]:
    """(value, where it comes from) for ``key`` (see :data:`DEFAULT_SPEEDS`)."""
    try:
        known = json.loads(_speeds_file(root).read_text())
    except (OSError, ValueError):
        known = {}
    row = known.get(key)
    if isinstance(row, dict) and float(row.get("value", 0)) > 0:
        return float(row["value"]), f"measured here {row.get('at', '')}".strip()
    return DEFAULT_SPEEDS[key], "the team's 2-core figure"


def record_speed(root: Path, key: str, value: float) -> None:
    """Keep what this build measured, for the next estimate."""
    if value <= 0:
        return
    path = _speeds_file(root)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known[key] = {"value": round(value, 2), "at": time.strftime("%Y-%m-%d %H:%M")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    tmp.replace(path)


def describe_cost(seconds: float) -> str:
    """``about 40 s`` / ``about 12 min`` / ``about 1.5 h``."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 5400:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"


def _engine_key() -> str:
    """The API key of this home's engine (its credentials, made on first use)."""
    from prmloop.store.auth.credentials import load_credentials

    return load_credentials().engine_api_key


def _running_engine() -> str | None:
    """The ``/v1`` URL of the vLLM engine ``prmloop up`` runs for this home, if it runs."""
    from prmloop.flows.ops.services import read_state
    from prmloop.store.settings import StateSettings

    record = read_state(StateSettings(), "engine")
    return record.url if record is not None and record.alive and record.url else None


@dataclass
class Sampler:
    """The engine a pool build uses (see the module docstring), started on first use; ``close`` stops
    what it started. ``kind`` says which (``vllm`` or ``transformers``) and ``note`` why."""

    preference: str = "auto"
    threads: int | None = None
    say: Say = field(default=lambda _line: None)
    kind: str = ""
    note: str = ""
    url: str | None = None
    #: The engine's API key (the credentials' for the running one and for one started here).
    api_key: str | None = None
    _generator: Any = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __post_init__(self) -> None:
        if self.preference not in ENGINES:
            raise ValueError(f"unknown engine {self.preference!r}; choose one of {', '.join(ENGINES)}")
        if self.preference == "transformers":
            self.kind, self.note = "transformers", "transformers in process (asked for)"
            return
        self.url = _running_engine()
        if self.url is not None:
            self.kind, self.note = "vllm", f"the running vLLM engine ({self.url})"
            self.api_key = _engine_key()
            return
        from prmloop.flows.ops.engine import engine_unavailable

        reason = engine_unavailable()
        if reason is None:
            self.kind, self.note = "vllm", "a vLLM engine of the bench's own (started now, stopped after)"
        elif self.preference == "vllm":
            raise ValueError(f"--engine vllm: the vLLM engine is not available here ({reason})")
        else:
            self.kind, self.note = "transformers", f"transformers in process: vLLM is not available ({reason})"

    @property
    def start_seconds(self) -> float:
        """What starting the engine will cost (0 when one runs or nothing is started)."""
        return ENGINE_START_S if self.kind == "vllm" and self.url is None else 0.0

    def _start_vllm(self) -> None:
        from prmloop.flows.ops.engine import (
            converted_model,
            engine_environment,
            engine_key_environment,
            engine_server,
            vllm_python,
        )

        python = vllm_python()
        model = converted_model(python)
        keyed = engine_key_environment()
        env = {**os.environ, **engine_environment(self.threads), **keyed}
        self.api_key = keyed["VLLM_API_KEY"]
        self.say("starting a vLLM engine for the bench (stopped when the pool is built)")
        url, start_s = self._stack.enter_context(engine_server(python, model, True, env, {}))
        self.url = url
        self.say(f"vLLM engine up in {start_s:.0f}s at {url}")

    def generator(self) -> Any:
        """The sampling engine, started now if it has not been."""
        if self._generator is not None:
            return self._generator
        from prmloop.models.backends.registry import BackendConfig, build_backend

        if self.kind == "vllm":
            if self.url is None:
                try:
                    self._start_vllm()
                except (RuntimeError, OSError) as exc:
                    if self.preference == "vllm":
                        raise
                    self.kind = "transformers"
                    self.note = (
                        f"transformers in process: the vLLM engine did not start ({' '.join(str(exc).split())[:200]})"
                    )
                    slower = DEFAULT_SPEEDS["vllm.sample"] / DEFAULT_SPEEDS["transformers.sample"]
                    self.say(f"{self.note}; expect about {slower:.1f}x the time estimated above")
            if self.kind == "vllm":
                from prmloop.flows.ops.engine import SERVED_MODEL_NAME

                options = {"base_url": self.url, "max_concurrency": _CONCURRENCY, "api_key": self.api_key}
                self._generator = build_backend(
                    BackendConfig(backend="openai", model=SERVED_MODEL_NAME, options=options)
                )
                return self._generator
        options = {"num_threads": self.threads} if self.threads else {}
        self._generator = build_backend(BackendConfig(backend="transformers", model="smollm2", options=options))
        return self._generator

    @property
    def questions_per_call(self) -> int:
        """Questions per ``generate`` call: on vLLM many (16 requests in flight, continuous batching), 4 in process."""
        return _VLLM_QUESTIONS_PER_CALL if self.kind == "vllm" else 4

    def annotator_options(self) -> dict[str, Any]:
        """The annotator's engine settings: the vLLM engine (started now if need be), or transformers."""
        if self.kind == "vllm":
            self.generator()
        if self.kind == "vllm":
            from prmloop.flows.ops.engine import SERVED_MODEL_NAME

            return {"backend": "openai", "base_url": self.url, "model": SERVED_MODEL_NAME, "api_key": self.api_key}
        return {"backend": "transformers", "model": "smollm2", "threads": self.threads}

    def close(self) -> None:
        closer = getattr(self._generator, "close", None)
        if callable(closer):
            closer()
        self._generator = None
        self._stack.close()

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
