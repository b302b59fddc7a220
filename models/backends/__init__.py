"""Language-model backends: the Generator/Scorer protocols, their records, and the engines behind them
(transformers in process, vLLM in process, OpenAI-compatible HTTP), built from configuration by the registry."""

from prmloop.models.backends.base import Completion, Generator, SamplingParams, ScoredText, Scorer
from prmloop.models.backends.registry import BACKENDS, Backend, BackendConfig, build_backend, register_backend

__all__ = [
    "BACKENDS",
    "Backend",
    "BackendConfig",
    "Completion",
    "Generator",
    "SamplingParams",
    "ScoredText",
    "Scorer",
    "build_backend",
    "register_backend",
]
