"""Run the ``prmloop`` command line in a process of its own, in a home of the test's (imported by the
flow tests that start servers: ``from cli_process import prmloop_cli``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def prmloop_cli(
    home: Path, *args: str, timeout: float = 300, drop: tuple[str, ...] = ("PREFECT_", "KAFKA_")
) -> subprocess.CompletedProcess[str]:
    """``prmloop *args`` with ``PRMLOOP_HOME=home`` and without the variables starting with ``drop`` (the
    test session's Prefect and broker must not leak into the home's own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PRMLOOP_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "prmloop.flows.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
