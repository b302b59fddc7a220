"""In-process ``transformers`` backend (CPU or GPU): batched sampling with per-token log-probabilities.

One ``model.generate`` call serves a whole batch: ``k`` samples of each of several prompts, or ``n``
rollouts of one prefix (Math-Shepherd / EpicPRM completers, Sec. 3.1), with each prompt prefilled once
and its KV cache repeated for its samples (the analogue of vLLM's prefix caching). The
log-probability of each sampled token is recorded *inside* that call by a logits processor placed
before temperature and top-p, from the raw logits of the step (``log_softmax``), so it is the model's
``log p(token | context)`` and agrees with a teacher-forced forward pass (:meth:`score`). Only one
``[batch, vocab]`` tensor is kept at a time, unlike ``output_logits=True`` which keeps every step.

This module owns the model, its lock, threads, seeding and batching; how one generation is configured
and how its rows are read back as completions is :mod:`~prmloop.models.backends.transformers_decoding`'s.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from prmloop.models.backends.base import Completion, SamplingParams, ScoredText
from prmloop.models.backends.transformers_decoding import (
    SampledTokenLogprobs,
    generation_kwargs,
    neutral_generation_config,
    read_completion,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["TransformersBackend", "default_device"]


def _torch() -> Any:
    import torch

    return torch


def default_device() -> str:
    """Where a model runs when its caller names no device: the first GPU where torch sees one (``cuda``),
    else the CPU. The loop's services build their backends without naming one, so on a GPU machine every
    stage samples, scores and rolls out there."""
    return "cuda" if _torch().cuda.is_available() else "cpu"


def _quiet_gguf_progress() -> None:
    import importlib

    try:
        module = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:
        return
    bar = getattr(module, "tqdm", None)
    if bar is not None and not isinstance(bar, functools.partial):
        setattr(module, "tqdm", functools.partial(bar, disable=True))  # noqa: B010 - a module without stubs


class TransformersBackend:
    """A causal LM and its tokenizer in this process; implements ``Generator`` and ``Scorer``.

    Attributes:
        model_name: name recorded in events' provenance.
        max_batch_size: most sequences (prompts x completions) in one ``generate`` call.
        add_special_tokens: whether tokenising a prompt adds BOS etc.; off by default because chat
            templates already write them (and OpenAI-compatible servers get the same raw text).
        num_threads: torch CPU threads while this backend computes (restored afterwards; torch's
            setting is process-wide). On a CPU shared with other processes, fewer threads than cores
            avoid oversubscription, which here made decoding ten times slower.
        share_prefix: prefill each prompt once for its ``n`` samples / rollouts and repeat the KV
            cache (the in-process analogue of vLLM's prefix caching); off = ``num_return_sequences``.

    Examples:
        >>> backend = TransformersBackend.from_pretrained("smollm2")  # doctest: +SKIP
        >>> [completions] = backend.generate(["2+2="], SamplingParams(n=4, max_new_tokens=8))  # doctest: +SKIP
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_name: str,
        default_params: SamplingParams | None = None,
        max_batch_size: int = 64,
        add_special_tokens: bool = False,
        num_threads: int | None = None,
        share_prefix: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.default_params = default_params or SamplingParams()
        self.max_batch_size = max_batch_size
        self.add_special_tokens = add_special_tokens
        self.num_threads = num_threads
        self.share_prefix = share_prefix
        if tokenizer.pad_token_id is None:
            # Padding positions are masked out; any id works, the end-of-sequence one is conventional.
            tokenizer.pad_token = tokenizer.eos_token
        self._eos_ids = self._end_of_sequence_ids()
        # The checkpoint's sampling defaults (repetition penalty, top-k, ...) are kept for reference
        # only: generate() would apply them before the log-probability recorder. SamplingParams rule.
        self.checkpoint_generation_config = model.generation_config
        self.model.generation_config = neutral_generation_config(model.generation_config)
        # generate() is neither thread-safe nor reentrant on one model, and seeding touches global RNG.
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------------------
    # construction
    # ---------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        *,
        device: str | None = None,
        dtype: str = "float32",
        gguf_file: str | None = None,
        default_params: SamplingParams | None = None,
        max_batch_size: int = 64,
        add_special_tokens: bool = False,
        num_threads: int | None = None,
        share_prefix: bool = True,
    ) -> TransformersBackend:
        """Load ``model`` (a local folder or hub id, or ``"smollm2"`` for the embedded GGUF) onto ``device``
        (default: :func:`default_device`, a GPU where there is one), in ``dtype`` (float32 unless told).

        GGUF weights are de-quantised to ``dtype`` by transformers (SmolLM2 Q4_1: about 21 s on two
        CPU cores); the embedded model is read from its converted folder instead (0.5 s; see
        :mod:`~prmloop.models.backends.hf_export`). Nothing is downloaded when ``model`` is a local folder.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from prmloop.models.backends.embedded import EMBEDDED_MODEL_NAME, smollm2_gguf_path
        from prmloop.models.backends.hf_export import embedded_smollm2_source

        if not sys.stderr.isatty():
            # A bar redrawn 30 times is noise in a log file: transformers' own bars, and the GGUF
            # de-quantisation's, which uses tqdm directly (transformers 5.23).
            hf_logging.disable_progress_bar()
            _quiet_gguf_progress()

        torch = _torch()
        if model == EMBEDDED_MODEL_NAME:
            name = f"{EMBEDDED_MODEL_NAME}:{smollm2_gguf_path().stem}"
            model, gguf_file = embedded_smollm2_source()
        elif gguf_file is not None:
            name = f"{model}/{gguf_file}"
        else:
            name = model
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
        tokenizer = AutoTokenizer.from_pretrained(model, gguf_file=gguf_file)
        # Left padding: a batch of prompts ends at the same column, where generation starts.
        tokenizer.padding_side = "left"
        lm = AutoModelForCausalLM.from_pretrained(model, gguf_file=gguf_file, dtype=torch_dtype)
        cast(Any, lm).to(device or default_device())  # nn.Module.to moves in place; transformers' stub mistypes it
        return cls(
            lm,
            tokenizer,
            model_name=name,
            default_params=default_params,
            max_batch_size=max_batch_size,
            add_special_tokens=add_special_tokens,
            num_threads=num_threads,
            share_prefix=share_prefix,
        )

    def _end_of_sequence_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list):
                ids.update(source)
        if not ids:
            raise ValueError(f"{self.model_name}: neither the model nor the tokenizer defines an end-of-sequence token")
        return frozenset(ids)

    @contextmanager
    def _threads(self) -> Iterator[None]:
        if self.num_threads is None:
            yield
            return
        torch = _torch()
        previous = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            yield
        finally:
            torch.set_num_threads(previous)

    @contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """Seed torch for one call and restore the global RNG state afterwards (``None``: unseeded)."""
        if seed is None:
            yield
            return
        torch = _torch()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    @property
    def device(self) -> torch.device:
        device: torch.device = self.model.device
        return device

    # ---------------------------------------------------------------------------------------------
    # Generator
    # ---------------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        if isinstance(prompts, str):
            raise TypeError("generate() takes a sequence of prompts; wrap a single prompt in a list")
        return self.generate_ids([self.encode_prompt(prompt) for prompt in prompts], params)

    def encode_prompt(self, prompt: str) -> list[int]:
        """The token ids ``generate`` conditions on for ``prompt``."""
        return list(self.tokenizer.encode(prompt, add_special_tokens=self.add_special_tokens))

    def generate_ids(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None
    ) -> list[list[Completion]]:
        """:meth:`generate` for already tokenised prompts (what a server receives as token-id prompts)."""
        params = params or self.default_params
        if any(not prompt for prompt in prompts):
            raise ValueError("every prompt needs at least one token; got an empty prompt")
        results: list[list[Completion]] = [[] for _ in prompts]
        # Greedy copies are identical: decode each prompt once and repeat the (immutable) result.
        n_engine = 1 if params.greedy else params.n
        with self._lock, self._threads(), self._seeded(params.seed):
            for indices, copies in self._batches(len(prompts), n_engine):
                batch = self._generate_batch([list(prompts[i]) for i in indices], copies, params)
                for i, completions in zip(indices, batch, strict=True):
                    results[i].extend(completions)
        if n_engine != params.n:
            results = [completions * params.n for completions in results]
        return results

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        params = (params or self.default_params).model_copy(update={"n": n})
        return self.generate([prefix], params)[0]

    def _batches(self, n_prompts: int, n: int) -> Iterator[tuple[list[int], int]]:
        """``(prompt indices, copies)`` chunks with ``len(indices) * copies <= max_batch_size``."""
        if n >= self.max_batch_size:
            for index in range(n_prompts):
                remaining = n
                while remaining:
                    copies = min(remaining, self.max_batch_size)
                    yield [index], copies
                    remaining -= copies
            return
        per_batch = self.max_batch_size // n
        for start in range(0, n_prompts, per_batch):
            yield list(range(start, min(start + per_batch, n_prompts))), n

    def generation_inputs(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """Left-padded ``input_ids`` and ``attention_mask`` on the model's device (what ``generate`` sees)."""
        torch = _torch()
        ids = [self.encode_prompt(p) if isinstance(p, str) else list(p) for p in prompts]
        width = max(len(row) for row in ids)
        input_ids = torch.full((len(ids), width), int(self.tokenizer.pad_token_id), dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for r, row in enumerate(ids):
            input_ids[r, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[r, width - len(row) :] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}

    def generation_kwargs(self, params: SamplingParams, copies: int, prompt_width: int) -> dict[str, Any]:
        """``model.generate`` keyword arguments for ``params`` (its warpers after the log-probability recorder)."""
        return generation_kwargs(self.tokenizer, self._eos_ids, params, copies, prompt_width)

    def _shared_prefix_inputs(self, inputs: dict[str, torch.Tensor], copies: int) -> dict[str, Any] | None:
        """Prefill each prompt once and repeat its KV cache ``copies`` times (prefix sharing).

        ``num_return_sequences`` would copy the prompts first and prefill every copy; rollouts of a
        long prefix (EpicPRM's 2-shot prompt is about 850 tokens) spend most of their time there. The
        last prompt token is left for ``generate`` so that it produces the first step's logits.
        Returns ``None`` when the model's cache cannot be repeated (then copies are prefilled).
        """
        torch = _torch()
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        if ids.shape[1] < 2:
            return None
        # Left padding: positions count real tokens only, as generate() computes them.
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        with torch.inference_mode():
            out = self.model(
                input_ids=ids[:, :-1],
                attention_mask=mask[:, :-1],
                position_ids=positions[:, :-1],
                use_cache=True,
            )
        cache = getattr(out, "past_key_values", None)
        if cache is None or not hasattr(cache, "batch_repeat_interleave"):
            return None
        cache.batch_repeat_interleave(copies)
        return {
            "input_ids": ids.repeat_interleave(copies, dim=0),
            "attention_mask": mask.repeat_interleave(copies, dim=0),
            "past_key_values": cache,
        }

    def _generate_batch(self, prompts: list[list[int]], copies: int, params: SamplingParams) -> list[list[Completion]]:
        torch = _torch()
        inputs = self.generation_inputs(prompts)
        prompt_width = inputs["input_ids"].shape[1]
        shared = self._shared_prefix_inputs(inputs, copies) if copies > 1 and self.share_prefix else None
        kwargs = self.generation_kwargs(params, 1 if shared is not None else copies, prompt_width)
        recorder = SampledTokenLogprobs()
        kwargs["logits_processor"].insert(0, recorder)
        with torch.inference_mode():
            sequences = self.model.generate(**(shared if shared is not None else inputs), **kwargs)
        generated = sequences[:, prompt_width:].tolist()
        logprobs = recorder.finish(sequences).tolist()
        prompt_lengths = inputs["attention_mask"].sum(dim=1).tolist()
        out: list[list[Completion]] = []
        for p in range(len(prompts)):
            row_completions = []
            for c in range(copies):
                row = p * copies + c
                row_completions.append(
                    read_completion(
                        self.tokenizer,
                        self._eos_ids,
                        generated[row],
                        logprobs[row],
                        prompt_tokens=int(prompt_lengths[p]),
                        params=params,
                    )
                )
            out.append(row_completions)
        return out

    # ---------------------------------------------------------------------------------------------
    # Scorer
    # ---------------------------------------------------------------------------------------------

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[ScoredText]:
        encoded = [
            (
                self.tokenizer.encode(prompt, add_special_tokens=self.add_special_tokens),
                self.tokenizer.encode(continuation, add_special_tokens=False),
            )
            for prompt, continuation in pairs
        ]
        return self.score_ids(encoded)

    def score_ids(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[ScoredText]:
        """Teacher-forced log-probabilities of token ids (for exact comparison with sampled tokens)."""
        torch = _torch()
        results: list[ScoredText] = []
        with self._lock, self._threads():
            for start in range(0, len(pairs), self.max_batch_size):
                chunk = pairs[start : start + self.max_batch_size]
                rows = [list(prompt) + list(cont) for prompt, cont in chunk]
                if any(not prompt for prompt, _ in chunk):
                    raise ValueError("score() needs a non-empty prompt: the first token has no context to be scored in")
                width = max(len(row) for row in rows)
                # Right padding: positions start at 0 for every row, as in an unpadded forward pass.
                ids = torch.full((len(rows), width), int(self.tokenizer.pad_token_id), dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for r, row in enumerate(rows):
                    ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
                    mask[r, : len(row)] = 1
                with torch.inference_mode():
                    logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
                    logprobs = torch.log_softmax(logits.float(), dim=-1)
                for r, (prompt, cont) in enumerate(chunk):
                    positions = torch.arange(len(prompt) - 1, len(prompt) + len(cont) - 1)
                    targets = torch.tensor(list(cont), dtype=torch.long)
                    values = logprobs[r, positions.to(self.device), targets.to(self.device)].tolist()
                    results.append(ScoredText(token_ids=tuple(cont), logprobs=tuple(values), prompt_tokens=len(prompt)))
        return results
