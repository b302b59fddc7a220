"""Engine replicas: several vLLM servers under one process, which ``up`` records as the machine's engine.

``python -m prmloop.flows.ops.replicas --ports 40001,40002`` starts one server of the embedded model per
port (:func:`~prmloop.flows.ops.engine.engine_command`, the environment it was given: ``OMP_NUM_THREADS``
and the API key), each dying with this process, and waits. It stops them all when it is told to stop
(SIGTERM, SIGINT) and when any one of them ends, so the stack never records an engine that is half
there: ``prmloop status`` sees it gone and ``prmloop up`` starts it again.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

from prmloop.flows.ops.broker import parent_death_signal

__all__ = ["main", "parse_ports", "replica_ports", "replicas_command"]

#: Seconds the servers get to stop after SIGTERM before they are killed.
STOP_GRACE_S = 20.0


def parse_ports(text: str) -> list[int]:
    """``40001,40002`` as distinct TCP ports.

    Raises:
        ValueError: not a comma-separated list of distinct ports 1-65535.
    """
    try:
        ports = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        ports = []
    if not ports or len(set(ports)) != len(ports) or not all(0 < p < 65536 for p in ports):
        raise ValueError(f"--ports {text!r}: give distinct TCP ports separated by commas, such as 40001,40002")
    return ports


def replica_ports(first: int, n: int) -> list[int]:
    """``first`` and ``n - 1`` more free ports, all distinct: one per server."""
    from prmloop.store.ports import free_port

    ports = [first]
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def replicas_command(ports: Sequence[int]) -> list[str]:
    """The supervisor's command line for servers on ``ports`` (what ``up`` records as the engine's)."""
    return [sys.executable, "-m", "prmloop.flows.ops.replicas", "--ports", ",".join(map(str, ports))]


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()


def supervise(commands: Sequence[Sequence[str]], poll_s: float = 1.0) -> int:
    """Run ``commands`` side by side until told to stop (0) or until one ends (its exit code, at least 1)."""
    stopping = {"signal": False}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping["signal"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    processes = [
        subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, preexec_fn=parent_death_signal())  # noqa: PLW1509
        for argv in commands
    ]
    code = 0
    try:
        while not stopping["signal"]:
            ended = [p for p in processes if p.poll() is not None]
            if ended:
                code = ended[0].returncode or 1
                print(
                    f"replicas: server pid {ended[0].pid} ended (exit {ended[0].returncode}): stopping the others",
                    file=sys.stderr,
                    flush=True,
                )
                break
            time.sleep(poll_s)
    finally:
        _stop(processes)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m prmloop.flows.ops.replicas",
        description="Run one vLLM server of the embedded model per port, until stopped or until one ends.",
    )
    parser.add_argument("--ports", required=True, help="the servers' ports, comma-separated")
    args = parser.parse_args(argv)
    try:
        ports = parse_ports(args.ports)
    except ValueError as exc:
        parser.error(str(exc))
    from prmloop.flows.ops.engine import EngineError, converted_model, engine_command, vllm_python

    try:
        python = vllm_python()
        model = converted_model(python)
    except EngineError as exc:
        print(f"replicas: {exc}", file=sys.stderr)
        return 2
    return supervise([engine_command(python, model, port) for port in ports])


if __name__ == "__main__":
    raise SystemExit(main())
