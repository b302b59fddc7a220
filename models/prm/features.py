"""Step features from a frozen backbone, computed once per (backbone, solution) and cached.

ActPRM (Duan et al., 2025, "Efficient Process Reward Model Training via Active Learning", Sec. 3)
puts an ensemble of small heads on one language-model backbone. Here the backbone is frozen, so a
step's input to every head is fixed: the backbone's hidden state at the step's end (the tag after
the step, :func:`~prmloop.models.prm.data.encode_solution`, the same encoding as the LoRA PRM). With
causal attention the state at step ``t`` sees only the question and steps ``1..t``, so one forward
pass per solution gives every step's feature. Computing them is the expensive part (a forward pass of
the backbone); training the heads on them takes seconds. So they are computed once and kept in a
:class:`FeatureCache`, a file under the caller's state folder keyed by the backbone's digest and the
solution's content: a cache, rebuildable at any time from the events that carry the solutions.

Features are the hidden states of the layers in :attr:`FeatureSpec.layers`, concatenated (by default
the middle layer alone: probes of middle layers often separate properties that the last layer has
folded into next-token prediction), then, with :attr:`FeatureSpec.uncertainty` (the default), the
step's token uncertainty under the backbone (:mod:`prmloop.models.prm.step_uncertainty`: 12 numbers
read off its next-token distributions, so the whole backbone runs; on this 2-core CPU it reads about
240 tokens/s). Without it, the layers above the deepest one asked for are never run, which halves
the cost. The ensemble whitens the hidden part by its principal directions and the uncertainty part
column by column (:func:`~prmloop.models.prm.ensemble.fit_ensemble`'s ``raw_tail``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from prmloop.models.prm.data import encode_solution
from prmloop.models.prm.step_uncertainty import UNCERTAINTY_FEATURES, digit_tokens, step_token_statistics

__all__ = [
    "FeatureCache",
    "FeatureExtractor",
    "FeatureSpec",
    "backbone_digest",
    "cached_features",
    "shared_extractor",
    "solution_key",
]

#: Bump when the way features are computed changes: cached features of another version are not reused.
FEATURES_VERSION = 2


class FeatureSpec(BaseModel):
    """Which backbone and layers give the step features (part of every cache key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backbone: str = Field(default="smollm2", description="'smollm2' (embedded) or a local causal-LM folder")
    layers: tuple[float, ...] = Field(
        default=(0.5,),
        description="hidden layers to concatenate, as fractions of the depth (0.5: the middle, 1.0: the last); "
        "layers above the deepest one named are not computed",
    )
    max_length: int = Field(default=768, ge=32, description="tokens per solution; later steps get no feature")
    uncertainty: bool = Field(
        default=True,
        description="append the step's token uncertainty under the backbone (log-probs, gaps to the top token, "
        "entropies, over all its tokens and its digits); runs the whole backbone",
    )

    @property
    def uncertainty_dims(self) -> int:
        """Trailing columns of a feature row that are token-uncertainty statistics (not hidden state)."""
        return len(UNCERTAINTY_FEATURES) if self.uncertainty else 0


def solution_key(problem: str, steps: Sequence[str]) -> str:
    """The cache key of one solution: SHA-256 of its question and steps."""
    digest = hashlib.sha256(problem.encode())
    for step in steps:
        digest.update(b"\x1e" + step.encode())
    return digest.hexdigest()


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, int(stat.st_mtime_ns))
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def backbone_digest(backbone: str) -> str:
    """SHA-256 of the backbone's weights and configuration (the embedded GGUF, or a folder's files)."""
    from prmloop.models.backends.embedded import EMBEDDED_MODEL_NAME, smollm2_gguf_path

    if backbone == EMBEDDED_MODEL_NAME:
        return _file_digest(smollm2_gguf_path())
    root = Path(backbone)
    if not root.is_dir():
        raise FileNotFoundError(f"backbone {backbone!r} is neither 'smollm2' nor a local model folder")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix in {".json", ".safetensors", ".bin", ".gguf"})
    if not files:
        raise FileNotFoundError(f"{root}: no model files (config.json, *.safetensors) in the backbone folder")
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + _file_digest(file).encode())
    return digest.hexdigest()


def spec_digest(spec: FeatureSpec) -> str:
    """What a cached feature depends on: the backbone's weights, the spec and :data:`FEATURES_VERSION`."""
    text = json.dumps({"backbone": backbone_digest(spec.backbone), "spec": spec.model_dump(mode="json")})
    return hashlib.sha256(f"{FEATURES_VERSION}:{text}".encode()).hexdigest()


class FeatureExtractor:
    """The frozen backbone: step features of solutions, one forward pass each (batched, by length)."""

    def __init__(
        self,
        spec: FeatureSpec,
        *,
        model: Any = None,
        tokenizer: Any = None,
        threads: int | None = None,
        lock: threading.Lock | None = None,
    ):
        self.spec = spec
        self.threads = threads
        # one pass at a time on this model: the layers' outputs are caught by hooks on the model itself
        self._lock = lock or threading.Lock()
        if model is None or tokenizer is None:
            from prmloop.models.backends.registry import BackendConfig, build_backend

            options = {"num_threads": threads} if threads else {}
            backend: Any = build_backend(BackendConfig(backend="transformers", model=spec.backbone, options=options))
            model, tokenizer = backend.model, backend.tokenizer
        self.model = model.eval()
        self.tokenizer = tokenizer
        depth = int(model.config.num_hidden_layers)
        # hidden_states[0] is the embedding output; [depth] the last layer's (after the final norm).
        self.layer_indices = tuple(sorted({max(1, min(depth, round(f * depth))) for f in spec.layers}))
        self.dim = int(model.config.hidden_size) * len(self.layer_indices) + spec.uncertainty_dims
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._digits: Any = None

    def extract(
        self, problems: Sequence[str], steps: Sequence[Sequence[str]], *, max_tokens_per_batch: int = 4096
    ) -> list[np.ndarray]:
        """One ``(steps kept, dim)`` float32 array per solution (steps past ``max_length`` get no row)."""
        import torch

        encoded = [
            encode_solution(self.tokenizer, p, s, max_length=self.spec.max_length)
            for p, s in zip(problems, steps, strict=True)
        ]
        out: list[np.ndarray] = [np.zeros((0, self.dim), dtype=np.float32) for _ in encoded]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].input_ids))
        threads_before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            with self._lock, torch.inference_mode():
                batch: list[int] = []
                for index in [*order, None]:
                    if index is not None and not encoded[index].tag_positions:
                        continue
                    width = max((len(encoded[i].input_ids) for i in batch), default=0)
                    if index is not None:
                        width = max(width, len(encoded[index].input_ids))
                    if batch and (index is None or width * (len(batch) + 1) > max_tokens_per_batch):
                        self._run(batch, encoded, out)
                        batch = []
                    if index is not None:
                        batch.append(index)
        finally:
            torch.set_num_threads(threads_before)
        return out

    def _run(self, batch: list[int], encoded: list[Any], out: list[np.ndarray]) -> None:
        import torch

        width = max(len(encoded[i].input_ids) for i in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            tokens = encoded[i].input_ids
            ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        device = getattr(self.model, "device", ids.device)  # the backbone may sit on a GPU (default_device)
        ids, mask = ids.to(device), mask.to(device)
        if self.spec.uncertainty:
            hidden, last = self._all_states(ids, mask)
        else:
            hidden, last = self._hidden_states(ids, mask), None
        for row, i in enumerate(batch):
            positions = torch.tensor(encoded[i].tag_positions, dtype=torch.long, device=device)
            parts = [hidden[layer][row, positions].float().cpu() for layer in self.layer_indices]
            if last is not None:
                parts.append(torch.from_numpy(self._uncertainty(last[row], ids[row], encoded[i])))
            out[i] = torch.cat(parts, dim=-1).numpy()

    def _uncertainty(self, last: Any, ids: Any, encoded: Any) -> np.ndarray:
        """The step statistics of :mod:`~prmloop.models.prm.step_uncertainty` for one solution of a batch."""
        import torch

        head = self.model.get_output_embeddings()
        if self._digits is None:
            self._digits = digit_tokens(self.tokenizer, int(head.weight.shape[0]))
        spans = encoded.step_spans()
        # every step token, and the position whose next-token logits predict it
        targets = torch.tensor([p for a, b in spans for p in range(a, b)], dtype=torch.long, device=ids.device)
        rows, cursor = [], 0
        for a, b in spans:
            rows.append((cursor, cursor + b - a))
            cursor += b - a
        logits = head(last[targets - 1]).float().cpu() if cursor else torch.zeros((0, 1))
        return step_token_statistics(logits, ids[targets].cpu(), self._digits, rows)

    def _all_states(self, ids: Any, mask: Any) -> tuple[dict[int, Any], Any]:
        """The layers of :attr:`layer_indices` and the final (normed) hidden state, from one full pass."""
        inner = getattr(self.model, "model", None)
        if inner is None:
            raise TypeError(f"{type(self.model).__name__}: no base model at .model; use uncertainty=False for it")
        depth = int(self.model.config.num_hidden_layers)
        captured, output = self._capture(
            [layer for layer in self.layer_indices if layer < depth],
            lambda: inner(input_ids=ids, attention_mask=mask, use_cache=False),
            stop=False,
        )
        last = output.last_hidden_state
        if depth in self.layer_indices:
            captured[depth] = last  # the last layer's state after the final norm, as output_hidden_states gives it
        return captured, last

    def _hidden_states(self, ids: Any, mask: Any) -> dict[int, Any]:
        """The outputs of the layers in :attr:`layer_indices` (1-based), stopping after the deepest."""
        depth = int(self.model.config.num_hidden_layers)
        if self.layer_indices[-1] == depth:
            states = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
            return {layer: states[layer] for layer in self.layer_indices}
        captured, _ = self._capture(
            self.layer_indices, lambda: self.model(input_ids=ids, attention_mask=mask, use_cache=False), stop=True
        )
        return captured

    def _capture(self, indices: Sequence[int], forward: Callable[[], Any], *, stop: bool) -> tuple[dict[int, Any], Any]:
        """Run ``forward`` with the outputs of the decoder layers ``indices`` (1-based) captured; with
        ``stop`` the pass ends once the deepest of them has run (and returns None), else its result."""
        layers = _decoder_layers(self.model)
        captured: dict[int, Any] = {}
        deepest = max(indices, default=0)

        def keep(layer: int) -> Callable[..., None]:
            def hook(_module: Any, _inputs: Any, output: Any) -> None:
                captured[layer] = output[0] if isinstance(output, tuple) else output
                if stop and layer == deepest:
                    raise _DeepEnough

            return hook

        handles = [layers[layer - 1].register_forward_hook(keep(layer)) for layer in indices]
        result = None
        try:
            result = forward()
        except _DeepEnough:
            pass
        finally:
            for handle in handles:
                handle.remove()
        return captured, result


_BACKBONES: dict[str, tuple[Any, Any, threading.Lock]] = {}
_BACKBONES_LOCK = threading.Lock()


def shared_extractor(spec: FeatureSpec, *, threads: int | None = None) -> FeatureExtractor:
    """A feature extractor on this process's one copy of ``spec.backbone``, loaded on first use: the
    next promoted PRM (the selector's, the prioritizer's, a retrain's) reuses it instead of loading the
    backbone again (0.4 CPU-seconds, and twice the memory while both are held, each time). Its passes
    take turns on the shared model."""
    with _BACKBONES_LOCK:
        held = _BACKBONES.get(spec.backbone)
        if held is None:
            first = FeatureExtractor(spec, threads=threads)
            _BACKBONES[spec.backbone] = (first.model, first.tokenizer, first._lock)
            return first
    model, tokenizer, lock = held
    return FeatureExtractor(spec, model=model, tokenizer=tokenizer, threads=threads, lock=lock)


class _DeepEnough(Exception):
    """Raised by a forward hook once the deepest wanted layer has run: the rest of the model is skipped."""


def _decoder_layers(model: Any) -> Any:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no decoder layers at .model.layers; use layers=(1.0,) for it")
    return layers


class FeatureCache:
    """Step features on disk: one SQLite file per feature digest, one row per solution (float16).

    Safe for several processes (SQLite's locking; a row is written once, by whoever computes it first).
    """

    def __init__(self, root: Path, spec: FeatureSpec) -> None:
        self.spec = spec
        self.digest = spec_digest(spec)
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"{self.digest[:16]}.sqlite3"
        self._local = threading.local()
        with self._connect() as con:
            con.execute("CREATE TABLE IF NOT EXISTS features (key TEXT PRIMARY KEY, rows INT, dim INT, data BLOB)")
            con.execute("CREATE TABLE IF NOT EXISTS spec (digest TEXT, spec TEXT)")
            if not con.execute("SELECT 1 FROM spec").fetchone():
                con.execute("INSERT INTO spec VALUES (?, ?)", (self.digest, spec.model_dump_json()))

    def _connect(self) -> sqlite3.Connection:
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(self.path, timeout=60)
            con.execute("PRAGMA journal_mode=WAL")
            self._local.con = con
        return con

    def get(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        con = self._connect()
        for start in range(0, len(keys), 500):
            chunk = list(keys[start : start + 500])
            marks = ",".join("?" * len(chunk))
            for key, rows, dim, data in con.execute(
                f"SELECT key, rows, dim, data FROM features WHERE key IN ({marks})", chunk
            ):
                found[key] = np.frombuffer(data, dtype=np.float16).reshape(rows, dim).astype(np.float32)
        return found

    def put(self, items: dict[str, np.ndarray]) -> None:
        rows = [(k, int(v.shape[0]), int(v.shape[1]), v.astype(np.float16).tobytes()) for k, v in items.items()]
        with self._connect() as con:
            con.executemany("INSERT OR IGNORE INTO features VALUES (?, ?, ?, ?)", rows)

    def __len__(self) -> int:
        return int(self._connect().execute("SELECT count(*) FROM features").fetchone()[0])


def cached_features(
    problems: Sequence[str],
    steps: Sequence[Sequence[str]],
    *,
    cache: FeatureCache | None,
    extractor: Callable[[], FeatureExtractor],
    chunk: int = 32,
    progress: Callable[[int, int, float], None] | None = None,
) -> list[np.ndarray]:
    """Every solution's step features: from ``cache`` where present, else computed (the backbone is
    loaded only if something is missing) and stored chunk by chunk, so an interrupted run keeps its work.

    ``progress(done, missing, seconds)`` is called after each computed chunk.
    """
    keys = [solution_key(p, s) for p, s in zip(problems, steps, strict=True)]
    found = cache.get(keys) if cache is not None else {}
    missing = [i for i, k in enumerate(keys) if k not in found]
    if missing:
        engine = extractor()
        started = time.perf_counter()
        for start in range(0, len(missing), chunk):
            part = missing[start : start + chunk]
            arrays = engine.extract([problems[i] for i in part], [steps[i] for i in part])
            computed = {keys[i]: a for i, a in zip(part, arrays, strict=True)}
            if cache is not None:
                cache.put(computed)
            found.update(computed)
            if progress is not None:
                progress(min(start + chunk, len(missing)), len(missing), time.perf_counter() - started)
    # float16 storage: computed features are rounded the same way, so a cached and a fresh run agree.
    return [found[k].astype(np.float16).astype(np.float32) for k in keys]
