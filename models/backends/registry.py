"""Build a backend from configuration: a name -> factory table, not an if-chain (lm-eval's registry).

Every factory returns an object that implements both :class:`~prmloop.models.backends.base.Generator`
and :class:`~prmloop.models.backends.base.Scorer`. Heavy engines (torch, vLLM, httpx) are imported by
the factory, never at import time of this module.

Examples:
    >>> config = BackendConfig(backend="transformers", model="smollm2", sampling={"temperature": 0.7})
    >>> backend = build_backend(config)  # doctest: +SKIP
    >>> completions = backend.rollouts("Step 1: ...", n=8)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from prmloop.models.backends.base import Generator, SamplingParams, Scorer

__all__ = ["BACKENDS", "Backend", "BackendConfig", "EngineSettings", "build_backend", "register_backend"]


class Backend(Generator, Scorer, Protocol):
    """What :func:`build_backend` returns: a generator that can also score text."""


class BackendConfig(BaseModel):
    """Which engine, which model, default sampling, and engine options."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = Field(default="transformers", description="engine name; one of the keys of BACKENDS")
    model: str = Field(
        default="smollm2",
        description="'smollm2' (the embedded GGUF), a local folder / hub id, or the served model's name",
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams, description="default sampling parameters")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "engine options: transformers {device, dtype, gguf_file, max_batch_size}; "
            "vllm {enable_prefix_caching, gpu_memory_utilization, dtype, max_model_len, ...}; "
            "openai {base_url, api_key, timeout_s, max_concurrency, tokenizer ('smollm2', a folder or hub id; "
            "'smollm2' by default for the model 'smollm2', '' for none)}"
        ),
    )


class EngineSettings(BaseSettings):
    """The model options every service shares (``--backend``, ``--model``, ``--base-url``, ``--threads``).

    Services inherit these fields into their own settings object, so each option is declared once.
    """

    model_config = SettingsConfigDict(frozen=True, extra="ignore")

    backend: str = Field(default="transformers", description="engine: transformers, vllm or openai")
    model: str = Field(
        default="smollm2", description="'smollm2' (the embedded model), a local folder, or a served model's name"
    )
    base_url: str | None = Field(default=None, description="openai backend: the server's /v1 URL")
    #: The server's API key: from the environment only (``PRMLOOP_<SERVICE>_API_KEY``, set by whatever points
    #: the service at the machine's engine), never a command-line option, masked in flow-run parameters.
    api_key: SecretStr | None = Field(default=None, description="openai backend: the server's API key")
    threads: int | None = Field(
        default=None, ge=1, description="transformers: torch CPU threads (1 on a shared CPU; default: torch's)"
    )

    def backend_config(self, sampling: SamplingParams | None = None) -> BackendConfig:
        """The :class:`BackendConfig` these options name."""
        options: dict[str, Any] = {}
        if self.threads is not None:
            options["num_threads"] = self.threads
        if self.base_url is not None:
            options["base_url"] = self.base_url
        if self.api_key is not None and self.backend == "openai":
            options["api_key"] = self.api_key.get_secret_value()
        return BackendConfig(
            backend=self.backend, model=self.model, options=options, sampling=sampling or SamplingParams()
        )


BackendFactory = Callable[[BackendConfig], Backend]

BACKENDS: dict[str, BackendFactory] = {}
"""Registered engines by name; add one with :func:`register_backend`."""


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Decorator that registers ``factory`` under ``name`` (a name can be registered once)."""

    def decorator(factory: BackendFactory) -> BackendFactory:
        if name in BACKENDS:
            raise ValueError(f"backend {name!r} is already registered by {BACKENDS[name].__module__}")
        BACKENDS[name] = factory
        return factory

    return decorator


_SHARED: dict[str, Backend] | None = None


@contextmanager
def shared_backends() -> Iterator[None]:
    """Within this block :func:`build_backend` builds one backend per configuration and hands the same
    one to every caller: a process that runs stage after stage (the demo) loads each model once instead
    of at every stage (de-quantising SmolLM2 takes 10-35 s here). Stages must take turns: a local
    backend is not meant to serve two callers at once."""
    global _SHARED  # noqa: PLW0603 - one table per process, set only for the block's duration
    outer, _SHARED = _SHARED, ({} if _SHARED is None else _SHARED)
    try:
        yield
    finally:
        _SHARED = outer


def build_backend(config: BackendConfig | dict[str, Any]) -> Backend:
    """Construct the backend ``config`` names (a dict is validated as :class:`BackendConfig`); inside
    :func:`shared_backends`, the one already built for an equal configuration."""
    config = BackendConfig.model_validate(config)
    try:
        factory = BACKENDS[config.backend]
    except KeyError:
        raise ValueError(f"unknown backend {config.backend!r}; choose one of {sorted(BACKENDS)}") from None
    if _SHARED is None:
        return factory(config)
    # The weights are what is worth sharing; default sampling parameters may differ between callers.
    key = config.model_copy(update={"sampling": SamplingParams()}).model_dump_json()
    if key not in _SHARED:
        _SHARED[key] = factory(config)
    backend = _SHARED[key]
    if getattr(backend, "default_params", config.sampling) != config.sampling:
        backend = copy.copy(backend)  # same model, tokenizer and lock; its own defaults
        backend.default_params = config.sampling
    return backend


@register_backend("transformers")
def _transformers(config: BackendConfig) -> Backend:
    from prmloop.models.backends.transformers_backend import TransformersBackend

    return TransformersBackend.from_pretrained(config.model, default_params=config.sampling, **config.options)


@register_backend("vllm")
def _vllm(config: BackendConfig) -> Backend:
    from prmloop.models.backends.vllm_backend import VLLMBackend

    return VLLMBackend.from_model(config.model, default_params=config.sampling, **config.options)


@register_backend("openai")
def _openai(config: BackendConfig) -> Backend:
    from prmloop.models.backends.embedded import EMBEDDED_MODEL_NAME
    from prmloop.models.backends.openai_backend import OpenAICompatibleBackend, TokenizedOpenAIBackend, load_tokenizer

    options = dict(config.options)
    # The embedded model's tokenizer is on this machine: with it the client renders chat prompts and
    # records step token offsets exactly as the in-process engines do.
    tokenizer = options.pop("tokenizer", EMBEDDED_MODEL_NAME if config.model == EMBEDDED_MODEL_NAME else None)
    options.pop("num_threads", None)  # a server's threads are the server's
    if tokenizer:
        return TokenizedOpenAIBackend(
            config.model, tokenizer=load_tokenizer(str(tokenizer)), default_params=config.sampling, **options
        )
    return OpenAICompatibleBackend(model_name=config.model, default_params=config.sampling, **options)
