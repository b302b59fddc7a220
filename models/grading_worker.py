"""The grading helper process: where a grading call from a thread other than the main one runs.

math-verify bounds its work with a signal, and signals reach only a process's main thread; a call from
a worker thread (Kafka consumers, Prefect task runners) is shipped to one long-lived helper process
that runs it in *its* main thread. The caller waits with a hard deadline and kills the helper if it
does not answer (C-level big-integer work cannot be interrupted by a signal); the next call starts a
fresh one. What to run is named, not passed: the helper imports the module and looks the function up,
so this module knows nothing of grading (:mod:`prmloop.models.grading` uses it).
"""

from __future__ import annotations

import importlib
import multiprocessing
import threading
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["AnswerCheckTimeout", "GradingWorker", "serve"]


class AnswerCheckTimeout(BaseException):
    """A math-verify parse or comparison ran past its deadline.

    Derives from ``BaseException`` on purpose: math-verify and sympy catch ``Exception`` broadly and
    would otherwise turn our deadline into a silent ``False``.
    """


class GradingWorker:
    """One helper process that runs the functions ``functions`` names (call name -> function name in
    ``module``) in its own main thread."""

    def __init__(self, module: str, functions: Mapping[str, str]) -> None:
        self.module = module
        self.functions = dict(functions)
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def _start(self, on_timeout: Any) -> Connection:
        # spawn, not fork: the parent may hold torch / Kafka threads that a fork would copy mid-state.
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        process = ctx.Process(
            target=serve,
            args=(child_conn, self.module, self.functions, on_timeout),
            name="prmloop-grading",
            daemon=True,
        )
        process.start()
        child_conn.close()
        self._process, self._conn = process, parent_conn
        return parent_conn

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    def call(self, fn_name: str, args: tuple[Any, ...], deadline_s: float, *, on_timeout: Any = None) -> Any:
        """The function ``fn_name``'s result on ``args``; ``on_timeout`` where it ran past its own
        deadline in the helper; :class:`AnswerCheckTimeout` where the helper did not answer in time."""
        with self._lock:
            alive = self._process is not None and self._process.is_alive()
            conn = self._conn if alive and self._conn is not None else None
            if conn is None:
                self._kill()
                conn = self._start(on_timeout)
                # The first call also pays for importing sympy and math-verify in the helper.
                deadline_s += 30.0
            conn.send((fn_name, args))
            if not conn.poll(deadline_s):
                self._kill()
                raise AnswerCheckTimeout(f"grading helper process did not answer {fn_name} in {deadline_s:g} s")
            try:
                ok, value = conn.recv()
            except EOFError as exc:
                self._kill()
                raise RuntimeError(
                    "the grading helper process died (out of memory?) while running "
                    f"{fn_name}{args!r}; it will be restarted on the next call"
                ) from exc
            if not ok:
                raise RuntimeError(f"grading helper failed on {fn_name}{args!r}: {value}")
            return value

    def shutdown(self) -> None:
        with self._lock:
            self._kill()


def serve(conn: Connection, module: str, functions: Mapping[str, str], on_timeout: Any) -> None:
    """Entry point of the helper process: serve ``(call name, args)`` requests until EOF."""
    loaded = importlib.import_module(module)
    table = {name: getattr(loaded, target) for name, target in functions.items()}
    while True:
        try:
            fn_name, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send((True, table[fn_name](*args)))
        except AnswerCheckTimeout:
            conn.send((True, on_timeout))
        except Exception as exc:  # noqa: BLE001 - report any failure to the caller, never die silently
            conn.send((False, f"{type(exc).__name__}: {exc}"))
