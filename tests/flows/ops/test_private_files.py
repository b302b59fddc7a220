"""What prmloop writes is its user's alone (issue 39, point 5): the home 0700, files 0600.

Reproduced as the issue found it: ``prmloop broker`` and ``prmloop sink`` in a fresh home that lies in
a folder every user may enter; another local user (``nobody``) then lists the home and reads the log,
``broker.json`` and the DuckDB file. Before, the home was 0755 and those files 0644.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def fresh_home(open_dir: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    home = open_dir / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "PRMLOOP_STORE")}
    env["PRMLOOP_HOME"] = str(home)
    yield home, env


def _start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "prmloop.flows.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_the_home_and_everything_the_broker_and_sink_write_are_private(
    fresh_home: tuple[Path, dict[str, str]], as_nobody: Callable[..., subprocess.CompletedProcess[str]], wait_until
) -> None:  # type: ignore[no-untyped-def]
    home, env = fresh_home
    broker = _start(env, "broker")
    sink = None
    try:
        wait_until(lambda: (home / "broker.json").exists() or broker.poll() is not None, 60, "the broker")
        assert broker.poll() is None, broker.communicate()[1]
        sink = _start(env, "sink", "--group", f"files-{uuid.uuid4().hex[:8]}")
        wait_until(lambda: (home / "prmloop.duckdb").exists() or sink.poll() is not None, 120, "the DuckDB file")
        assert sink.poll() is None, sink.communicate()[1]
        written = [home / "broker.json", home / "broker.log", home / "prmloop.duckdb", home / "credentials.json"]
        assert _mode(home) == 0o700
        assert {path.name: _mode(path) for path in written} == {path.name: 0o600 for path in written}
        listed = as_nobody(["ls", str(home)])
        assert listed.returncode != 0 and "Permission denied" in listed.stderr
        for path in written:
            read = as_nobody(["cat", str(path)])
            assert read.returncode != 0 and "Permission denied" in read.stderr, path
    finally:
        if sink is not None:
            _stop(sink)
        _stop(broker)
