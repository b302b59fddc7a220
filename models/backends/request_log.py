"""A record of the completion requests a process sends the engine, for ``prmloop bench replay``.

Where ``$PRMLOOP_REQUEST_LOG`` names a folder (``prmloop run --record-requests`` sets it for every
service), each process that talks to the engine through :class:`~prmloop.models.backends.openai_backend.
OpenAICompatibleBackend` appends one JSON line per ``/completions`` request to ``<folder>/<pid>.jsonl``
(mode 0600): when it went out (wall clock), how long it took, the request's body (the prompt, ``n``,
``max_tokens``, sampling settings, seed; never the API key, which travels in a header) and the usage the
engine answered. The replay sends the same bodies again, all at once, to an engine of its own: the
engine's own tokens a second on the loop's own work, the ceiling the loop is compared with.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import IO, Any

__all__ = ["REQUEST_LOG_VARIABLE", "RequestLog", "read_requests"]

REQUEST_LOG_VARIABLE = "PRMLOOP_REQUEST_LOG"


class RequestLog:
    """Appends this process's requests to ``<folder>/<pid>.jsonl``; thread-safe (``generate`` sends from threads)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    @classmethod
    def from_environment(cls) -> RequestLog | None:
        """The log ``$PRMLOOP_REQUEST_LOG`` asks for, or None (the default: nothing is recorded)."""
        folder = os.environ.get(REQUEST_LOG_VARIABLE)
        return cls(Path(folder)) if folder else None

    def _open(self) -> IO[str]:
        if self._file is None:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = self.folder / f"{os.getpid()}.jsonl"
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(descriptor, "a", buffering=1)
        return self._file

    def record(self, started: float, seconds: float, body: dict[str, Any], usage: dict[str, Any] | None) -> None:
        """One request: ``started`` (``time.time()``), its ``seconds``, its ``body`` and the answer's ``usage``.

        A log that cannot be written is dropped with one line on stderr: recording never fails a request.
        """
        line = json.dumps({"t": round(started, 4), "s": round(seconds, 4), "body": body, "usage": usage or {}})
        with self._lock:
            try:
                self._open().write(line + "\n")
            except OSError as exc:
                print(f"prmloop: request log {self.folder} not written ({exc}); recording stops", flush=True)
                self.folder = Path(os.devnull)
                self._file = open(os.devnull, "a")  # noqa: SIM115 - kept for the process's life

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_requests(folder: Path) -> list[dict[str, Any]]:
    """Every recorded request under ``folder`` (all processes), oldest first.

    Raises:
        ValueError: the folder holds no recorded request (names it, and how to record one).
    """
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                float(row["t"]), float(row["s"]), dict(row["body"])
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines):
                    continue  # the last line, cut by a process killed mid-write: the rest still counts
                raise ValueError(f"{path}:{number}: not a recorded request ({exc})") from exc
            rows.append(row)
    if not rows:
        raise ValueError(
            f"{folder}: no recorded requests (record a run with `prmloop run --record-requests`, "
            "which writes them under $PRMLOOP_HOME/requests)"
        )
    rows.sort(key=lambda row: float(row["t"]))
    return rows
