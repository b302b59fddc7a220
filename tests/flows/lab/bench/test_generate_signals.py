"""SIGTERM to `prmloop bench generate` stops the vLLM server it started (issue 39, point 7).

What the issue saw: the bench's server kept running as an orphan (parent 1, 800 MB, holding the cores).
Real components: the bench (its server engine only: ``--engines server``), the vLLM server from
.venv-vllm; the test waits for the server to appear among the bench's descendants, sends the bench
SIGTERM, and checks that nothing of it is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.vllm]

SERVER_ONLY = ("--engines", "server")


def _descendants(root: int) -> set[int]:
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        children = Path(f"/proc/{pid}/task/{pid}/children")
        try:
            kids = [int(c) for c in children.read_text().split()]
        except OSError:
            continue
        found.update(kids)
        todo.extend(kids)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[-1].startswith("Z")
    except OSError:
        return False


def test_sigterm_to_bench_generate_leaves_no_vllm_server(tmp_path: Path) -> None:
    from prmloop.flows.ops.engine import engine_unavailable

    reason = engine_unavailable()
    if reason is not None:
        pytest.skip(f"no vLLM engine here: {reason}")
    env = {**os.environ, "PRMLOOP_HOME": str(tmp_path)}
    bench = subprocess.Popen(
        [sys.executable, "-m", "prmloop.flows.cli", "bench", "generate", "--quick", "--threads", "1", *SERVER_ONLY],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        server = None
        deadline = time.monotonic() + 900
        while server is None and time.monotonic() < deadline and bench.poll() is None:
            server = next(
                (p for p in _descendants(bench.pid) if "vllm.entrypoints.openai.api_server" in _cmdline(p)), None
            )
            time.sleep(0.5)
        assert server is not None, "the bench never started its vLLM server"
        tree = _descendants(bench.pid)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {p: _cmdline(p)[:120] for p in tree if _alive(p)}
        assert left == {}, f"processes of the bench outlived it: {left}"
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
