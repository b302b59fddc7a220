"""Prefect's own state (its SQLite database, the ephemeral API's files) under ``$PRMLOOP_HOME``.

Prefect keeps state in ``~/.prefect`` by default, shared with every other Prefect run on the machine;
two of them at once lock each other's SQLite database (seen: ``database is locked`` and "Timed out while
attempting to connect to ephemeral Prefect API server" on a busy machine). prmloop keeps it in
``$PRMLOOP_HOME/prefect`` instead, unless the user chose for themselves (``PREFECT_HOME`` or
``PREFECT_API_URL`` set before prmloop started), and gives the ephemeral API more time to start on a
loaded laptop.

Every Prefect server prmloop starts asks for the basic-auth string of the credentials file
(:func:`prefect_auth_environment`: ``server.api.auth_string`` for the server, ``api.auth_string`` for
its clients), the ephemeral API's too: another user of the machine cannot run, read or cancel flows.

Prefect reads its settings when it is first imported, so :func:`isolate_prefect_state` sets the
environment when Prefect is not imported yet and enters Prefect's ``temporary_settings`` otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prmloop.store.auth.credentials import load_credentials

__all__ = [
    "USER_CHOSE_PREFECT",
    "isolate_prefect_state",
    "prefect_auth_environment",
    "prefect_cli",
    "prefect_home",
]

#: The user configured Prefect themselves (evaluated once, before prmloop changes anything).
USER_CHOSE_PREFECT = bool(os.environ.get("PREFECT_HOME") or os.environ.get("PREFECT_API_URL"))

#: Seconds the ephemeral API may take to start (Prefect's default is too short on a busy 2-core machine).
EPHEMERAL_STARTUP_S = "120"


def prefect_home(home: Path) -> Path:
    """Where Prefect's state lives for the prmloop state directory ``home``."""
    return home / "prefect"


def prefect_auth_environment(home: Path) -> dict[str, str]:
    """The variables that make a Prefect server started with them ask for the credentials' auth string,
    and a client started with them send it."""
    auth = load_credentials(home).prefect_auth_string
    return {"PREFECT_SERVER_API_AUTH_STRING": auth, "PREFECT_API_AUTH_STRING": auth}


@contextmanager
def isolate_prefect_state(home: Path) -> Iterator[Path | None]:
    """Within the block, Prefect keeps its state under ``home/prefect`` (yielded); ``None`` when the
    user configured Prefect themselves and nothing was changed."""
    if USER_CHOSE_PREFECT:
        yield None
        return
    path = prefect_home(home)
    path.mkdir(parents=True, exist_ok=True)
    updates = {
        "PREFECT_HOME": str(path),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": EPHEMERAL_STARTUP_S,
        **prefect_auth_environment(home),
    }
    if "prefect" not in sys.modules:
        saved = {k: os.environ.get(k) for k in updates}
        os.environ.update(updates)
        try:
            yield path
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        return
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_HOME,
        PREFECT_SERVER_API_AUTH_STRING,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    with temporary_settings(
        updates={
            PREFECT_HOME: str(path),
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: int(EPHEMERAL_STARTUP_S),
            PREFECT_SERVER_API_AUTH_STRING: updates["PREFECT_SERVER_API_AUTH_STRING"],
            PREFECT_API_AUTH_STRING: updates["PREFECT_API_AUTH_STRING"],
        }
    ):
        yield path


def prefect_cli(*args: str) -> list[str]:
    """The argv of Prefect's command line under this interpreter (``python -m prefect``): found however
    prmloop was installed, also where no ``prefect`` script sits beside ``python`` (``pip install
    --target``, seen on a GPU node: the bench's Prefect server never started)."""
    return [sys.executable, "-m", "prefect", *args]
