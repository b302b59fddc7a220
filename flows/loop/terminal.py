"""The terminal session around the streaming loop: ``prmloop run`` and ``prmloop demo`` both run here.

The terminal shows stage lines (what started, where the UI is), then the live view of
:mod:`prmloop.flows.loop.view`, then the learning curve; everything else the loop's libraries print
(Prefect's logs, warnings, progress bars) goes to ``$PRMLOOP_HOME/logs/<name>.log``, which has the
stage lines too. Ctrl-C or SIGTERM asks the loop to stop cleanly; a second Ctrl-C leaves at once
(the services still stop, their offsets committed).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from rich.console import Console

from prmloop.flows.loop.driver import Loop, LoopSettings
from prmloop.flows.loop.view import LoopView, cpu_line, curve_lines

__all__ = ["Terminal", "finish", "leave", "run_session"]

log = logging.getLogger(__name__)


@dataclass
class Terminal:
    """Stage lines to the terminal and the log file; everything else (fd 1 and 2) to the log file only."""

    log_path: Path
    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log: IO[str] = self.log_path.open("a", buffering=1)
        self.out: IO[str] = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
        self.console = Console(file=self.out, soft_wrap=True, highlight=False)

    def stage(self, name: str, text: str) -> None:
        line = f"[{time.monotonic() - self.started:5.0f}s] {name}: {text}"
        self.lines.append(line)
        self.out.write(line + "\n")
        self.log.write(line + "\n")

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.log.write(text + "\n")

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Send whatever the block prints (Prefect's console logs, warnings, progress) to the log file."""
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(self.log.fileno(), 1)
        os.dup2(self.log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _interrupt_on_sigterm() -> None:
    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)


def run_session(
    settings: LoopSettings, home: Path, *, name: str = "loop", term: Terminal | None = None, reserve_s: float = 0.0
) -> tuple[Loop, dict[str, Any]]:
    """Start the loop, show it, stop it cleanly; returns the driver and its figures (``Loop.result``).

    ``reserve_s``: seconds of ``settings.minutes`` kept for what follows the loop (the demo's summary).
    """
    from prmloop.flows.ops.prefect_home import isolate_prefect_state
    from prmloop.models.backends.registry import shared_backends

    home.mkdir(parents=True, exist_ok=True)
    os.environ["PRMLOOP_HOME"] = str(home)
    term = term or Terminal(home / "logs" / f"{name}.log")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _interrupt_on_sigterm()
    if settings.minutes is not None and reserve_s:
        settings = settings.model_copy(update={"minutes": max(1.0, settings.minutes - reserve_s / 60.0)})
    loop = Loop(settings, home=home, say=lambda line: term.stage("up", line))
    with isolate_prefect_state(home), shared_backends():
        try:
            with term.quiet():
                loop.start()
            term.stage(
                "loop",
                f"streaming on {loop.status.engine}"
                + (f" ({loop.status.engine_url})" if loop.status.engine_url else "")
                + (f"; Prefect UI {loop.status.ui}" if loop.status.ui else "")
                + (f"; for {settings.minutes:g} min" if settings.minutes else "")
                + (f"; until {settings.until_retrains} retrains have scored" if settings.until_retrains else "")
                + ("" if settings.minutes or settings.until_retrains else "; Ctrl-C stops"),
            )
            with term.quiet(), LoopView(loop, term.out) as view:
                loop.run(on_tick=view.tick)
        except KeyboardInterrupt:
            term.stage("stop", "finishing the feed and retrain in flight (Ctrl-C again leaves now)")
        try:
            with term.quiet():
                loop.stop()
        except KeyboardInterrupt:
            with term.quiet():
                loop.stop(wait_s=0.0)
    if loop.unfinished():
        term.stage("stop", f"left unfinished: {', '.join(loop.unfinished())} (what it wrote so far is kept)")
    return loop, loop.result()


def leave(loop: Loop, code: int = 0) -> None:
    """End the process: at once where a job of the driver is still running in a thread of its own (a
    model computing in native code would abort the interpreter's shutdown), else normally."""
    if loop.unfinished():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def finish(loop: Loop, result: dict[str, Any], term: Terminal) -> None:
    """After the loop: the monitor's artifacts, the learning curve as a table and a PNG artifact."""
    png = loop.home / "loop" / "learning-curve.png"
    try:
        with term.quiet():
            loop.publish_progress()
    except Exception as exc:  # noqa: BLE001 - the figures are printed whatever the UI got
        term.stage("monitor", f"artifacts not published: {type(exc).__name__}: {exc}")
    result["learning_curve_png"] = str(png) if png.is_file() else None
    term.say()
    term.say(
        "The loop's learning curve (each retrain's ensemble PRM on the test set; nothing trains or promotes on it):"
    )
    for line in curve_lines(loop.status.retrains) if loop.status.retrains else ["  no PRM was trained"]:
        term.say(line)
    if png.is_file():
        term.say(f"  (plot: {png}; Prefect artifact loop-learning-curve)")
    term.say(cpu_line(result.get("cpu_after_warm_up")))
