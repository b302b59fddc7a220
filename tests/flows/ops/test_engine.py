"""How the stack finds, configures and points services at the machine's vLLM engine (no engine runs
here: tests/models/backends/test_vllm_engine.py runs the real one)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prmloop.flows.ops.engine import (
    ENGINE_SERVICES,
    ONEDNN_PRIMITIVE_CACHE,
    EngineError,
    cpu_dtype,
    engine_command,
    engine_environment,
    engine_unavailable,
    parse_metrics,
    service_environment,
    vllm_python,
)


def test_without_a_vllm_environment_the_reason_says_to_run_make_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRMLOOP_VLLM_PYTHON", str(tmp_path / "nowhere" / "bin" / "python"))
    with pytest.raises(EngineError, match="make vllm"):
        vllm_python()
    reason = engine_unavailable()
    assert reason is not None and "make vllm" in reason


def test_a_recorded_install_failure_is_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = tmp_path / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    (tmp_path / ".venv-vllm" / ".install-failed").write_text("vLLM could not install here:\nno wheel for this CPU\n")
    monkeypatch.setenv("PRMLOOP_VLLM_PYTHON", str(python))
    assert vllm_python() == python
    assert engine_unavailable() == "vLLM could not install here: no wheel for this CPU"


def test_the_server_runs_with_the_settings_this_cpu_needs(tmp_path: Path) -> None:
    argv = engine_command(Path("/v/bin/python"), tmp_path, 4321, gpu=False)
    assert argv[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = " ".join(argv)
    for flag in ("--enforce-eager", "--enable-prefix-caching", "--port 4321", "--host 127.0.0.1"):
        assert flag in flags
    assert f"--dtype {cpu_dtype()}" in flags
    # Whole prefills (seeded chunked prefills crash the CPU build), so a step holds a whole prompt.
    assert "--no-enable-chunked-prefill --max-model-len 4096 --max-num-batched-tokens 4096" in flags
    assert "--no-enable-prefix-caching" in engine_command(Path("p"), tmp_path, 1, prefix_caching=False, gpu=False)
    # The model in the engine's own process: a worker of its own left the engine spinning while it waited.
    assert "--distributed-executor-backend uni" in flags
    env = engine_environment(threads=1, gpu=False)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OMP_NUM_THREADS"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    # libgomp's own wait policy (spin briefly, then sleep): PASSIVE cost the engine 13-20 % here.
    assert "OMP_WAIT_POLICY" not in env and env["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_the_engine_keeps_few_compiled_onednn_primitives_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    # oneDNN's default (1,024 primitives, one per token count a step carried) grew the engine for hours.
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert engine_environment(gpu=False)["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_PRIMITIVE_CACHE)
    assert 0 < ONEDNN_PRIMITIVE_CACHE < 1024
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    assert engine_environment(gpu=False)["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"


def test_the_cpu_engine_runs_in_bfloat16_only_where_the_cpu_has_its_kernels() -> None:
    assert cpu_dtype(["avx2", "avx512f", "avx512_bf16"]) == "bfloat16"
    assert cpu_dtype(["avx2", "amx_bf16"]) == "bfloat16"
    assert cpu_dtype(["avx2", "avx512f", "avx512_vnni"]) == "float32"  # bfloat16 falls back to slow kernels
    assert cpu_dtype([]) == "float32"


def test_on_a_gpu_the_server_keeps_vllms_own_fast_defaults(tmp_path: Path) -> None:
    flags = " ".join(engine_command(Path("p"), tmp_path, 1, gpu=True))
    assert "--dtype bfloat16" in flags and "--gpu-memory-utilization 0.5" in flags
    for cpu_only in ("--enforce-eager", "chunked-prefill", "--max-model-len", "float32", "executor-backend"):
        assert cpu_only not in flags
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine_environment(gpu=True)


def test_workers_asked_for_keep_vllms_multiprocess_executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRMLOOP_VLLM_OPTIONS", '{"tensor_parallel_size": 2}')
    flags = " ".join(engine_command(Path("p"), tmp_path, 1, gpu=False))
    assert "--tensor-parallel-size 2" in flags and "executor-backend" not in flags
    monkeypatch.setenv("PRMLOOP_VLLM_OPTIONS", '{"distributed_executor_backend": "mp"}')
    flags = " ".join(engine_command(Path("p"), tmp_path, 1, gpu=False))
    assert flags.count("--distributed-executor-backend") == 1 and "--distributed-executor-backend mp" in flags


def test_extra_engine_options_reach_the_server_and_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "PRMLOOP_VLLM_OPTIONS", '{"attention_backend": "TRITON_ATTN", "max_model_len": 2048, "enforce_eager": false}'
    )
    argv = engine_command(Path("p"), tmp_path, 1, gpu=False)
    flags = " ".join(argv)
    assert "--attention-backend TRITON_ATTN" in flags and "--no-enforce-eager" in flags
    assert argv.count("--max-model-len") == 1 and "--max-model-len 2048" in flags


@pytest.mark.parametrize("raw", ["{attention_backend: x}", "[1, 2]", '{"a": {"nested": 1}}'])
def test_bad_engine_options_are_one_line_naming_the_variable(raw: str) -> None:
    from prmloop.models.backends.vllm_backend import engine_options_from_environment

    with pytest.raises(ValueError, match="PRMLOOP_VLLM_OPTIONS") as caught:
        engine_options_from_environment({"PRMLOOP_VLLM_OPTIONS": raw})
    assert "\n" not in str(caught.value)


def test_engine_flags_spell_vllms_command_line() -> None:
    from prmloop.models.backends.vllm_backend import engine_flags

    options = {"tensor_parallel_size": 2, "enforce_eager": True, "enable_chunked_prefill": False, "x": None}
    assert engine_flags(options) == ["--tensor-parallel-size", "2", "--enforce-eager", "--no-enable-chunked-prefill"]


def test_every_model_using_service_reads_the_engine_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from prmloop.consumers.annotator import AnnotatorSettings
    from prmloop.consumers.judge import JudgeSettings
    from prmloop.consumers.scorer import ScorerSettings
    from prmloop.producers.prioritize import PrioritizeSettings
    from prmloop.producers.sampler import SampleSettings

    url = "http://127.0.0.1:9/v1"
    for key, value in service_environment(url).items():
        monkeypatch.setenv(key, value)
    for settings in (SampleSettings, PrioritizeSettings, ScorerSettings, AnnotatorSettings, JudgeSettings):
        loaded = settings()
        assert (loaded.backend, loaded.base_url, loaded.model) == ("openai", url, "smollm2"), settings.__name__


def test_the_engines_load_is_read_from_its_metrics() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="smollm2"} 3.0',
            'vllm:num_requests_waiting{engine="0",model_name="smollm2"} 1.0',
            'vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.125',
            'vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 640.0',
            'vllm:prefix_cache_queries_total{engine="0",model_name="smollm2"} 1024.0',
            'vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="smollm2"} 2.0',
        ]
    )
    assert parse_metrics(text) == {
        "requests_running": 3.0,
        "requests_waiting": 1.0,
        "kv_cache_usage": 0.125,
        "prefix_cache_hits": 640.0,
        "prefix_cache_queries": 1024.0,
    }


def test_up_picks_the_engine_only_for_the_whole_stack_and_where_it_can_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prmloop.flows.cli.stack import _auto_engine

    assert _auto_engine(only=True, without_engine=False) == "transformers"
    assert _auto_engine(only=False, without_engine=True) == "transformers"
    monkeypatch.setenv("PRMLOOP_VLLM_PYTHON", str(tmp_path / "nowhere" / "bin" / "python"))
    assert _auto_engine(only=False, without_engine=False) == "transformers"


def test_the_benchs_dtype_wins_over_the_cpu_default_and_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRMLOOP_VLLM_OPTIONS", '{"dtype": "float16"}')
    argv = engine_command(Path("p"), tmp_path, 1, gpu=False, overrides={"dtype": "bfloat16"})
    assert argv.count("--dtype") == 1 and argv[argv.index("--dtype") + 1] == "bfloat16"


def test_the_services_get_the_engines_api_key_from_the_environment_never_from_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prmloop.flows.ops.engine import engine_key_environment
    from prmloop.producers.sampler import SampleSettings
    from prmloop.store.auth.credentials import load_credentials

    key = load_credentials(tmp_path).engine_api_key
    assert engine_key_environment(tmp_path) == {"VLLM_API_KEY": key}
    env = service_environment("http://127.0.0.1:9/v1", tmp_path)
    assert all(env[f"PRMLOOP_{prefix}_API_KEY"] == key for prefix in ENGINE_SERVICES)
    assert key not in " ".join(engine_command(Path("p"), tmp_path, 1, gpu=False))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = SampleSettings()
    assert key not in repr(settings)  # a SecretStr: masked in logs and in Prefect's flow-run parameters
    assert settings.backend_config().options["api_key"] == key
    monkeypatch.setenv("PRMLOOP_SAMPLE_BACKEND", "transformers")  # the user's choice: no key to a local model
    assert "api_key" not in SampleSettings().backend_config().options
