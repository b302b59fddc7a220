"""A PostgreSQL server run as a service (``prmloop postgres``): the cluster's one database server.

On a cluster PostgreSQL is a service of its own (the compose file's ``postgres``); on one machine
prmloop runs the same server from the binaries the ``pgserver`` wheel ships (or Debian's
``postgresql`` package), in the foreground, so that it can be supervised, killed and restarted like any
other service: a SIGKILLed postmaster is restarted on the same folder, and PostgreSQL's crash recovery
replays its write-ahead log (committed transactions survive). It listens on loopback TCP, which every
client here speaks: asyncpg (the broker's object gateway, the Prefect server) and libpq (DuckLake).

When prmloop runs as root, PostgreSQL runs as the user ``pgserver`` (PostgreSQL refuses root): its
data folder is created for that user, and initdb needs it empty.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from prmloop.store.broker import BrokerError, parent_death_signal
from prmloop.store.settings import StateSettings

__all__ = [
    "PostgresError",
    "create_databases",
    "postgres_bin_dir",
    "resolve_storage",
    "run_sql",
    "serve_postgres",
    "wait_ready",
]

#: The user PostgreSQL runs as when prmloop runs as root (pgserver creates it too).
SYSTEM_USER = "pgserver"


class PostgresError(RuntimeError):
    pass


def postgres_bin_dir() -> Path:
    """Where ``initdb``, ``postgres`` and ``psql`` are: Debian's ``postgresql`` package first (it has the
    contrib extensions: the Prefect server needs ``pg_trgm``, which the pgserver wheel lacks), then the
    pgserver wheel's, then PATH's."""
    for folder_name in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder_name) / "postgres").is_file():
            return Path(folder_name)
    with contextlib.suppress(ImportError):
        import pgserver

        folder = Path(pgserver.__file__).parent / "pginstall" / "bin"
        if (folder / "postgres").is_file():
            return folder
    found = shutil.which("postgres")
    if found:
        return Path(found).parent
    raise PostgresError(
        "no PostgreSQL binaries found: `apt-get install postgresql` (or `pip install pgserver`, whose "
        "binaries lack the pg_trgm extension the Prefect server needs)"
    )


def _as_user() -> tuple[int, int] | None:
    """(uid, gid) to run PostgreSQL as, or None when this process is not root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SYSTEM_USER], check=True, capture_output=True)
        entry = pwd.getpwnam(SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


def _demote(ids: tuple[int, int] | None, *, die_with_parent: bool = False) -> Callable[[], None] | None:
    """A ``preexec_fn``: become ``ids``, then (Linux clears the setting when the user changes, so after)
    ask for SIGKILL when the parent dies: a killed ``prmloop postgres`` leaves no postmaster behind."""
    on_parent_death = parent_death_signal() if die_with_parent else None
    if ids is None and on_parent_death is None:
        return None

    def run() -> None:
        if ids is not None:
            os.setgid(ids[1])
            os.setuid(ids[0])
        if on_parent_death is not None:
            on_parent_death()

    return run


def _init(data_dir: Path, bin_dir: Path, ids: tuple[int, int] | None) -> None:
    if (data_dir / "PG_VERSION").exists():
        return
    if data_dir.exists() and any(data_dir.iterdir()):
        raise PostgresError(
            f"cannot create a PostgreSQL cluster in {data_dir}: the folder is not empty and holds no cluster "
            "(initdb needs an empty folder); empty it or name another --dir"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    if ids is not None:
        for folder in [data_dir, *data_dir.parents]:  # the postgres user must reach its folder
            if folder == Path("/"):
                break
            if folder == data_dir:
                os.chown(folder, *ids)
            elif not os.stat(folder).st_mode & 0o001:
                folder.chmod(folder.stat().st_mode | 0o011)
    data_dir.chmod(0o700)
    done = subprocess.run(
        [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust", "--encoding=utf8"],
        capture_output=True,
        text=True,
        preexec_fn=_demote(ids),
        check=False,
    )
    if done.returncode != 0:
        raise PostgresError(f"initdb in {data_dir} failed: {' '.join(done.stderr.split())[:300]}")


def wait_ready(
    host: str, port: int, timeout_s: float = 60.0, *, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until the server accepts connections (``pg_isready``)."""
    isready = postgres_bin_dir() / "pg_isready"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise PostgresError(f"PostgreSQL exited with code {process.returncode} at start")
        done = subprocess.run(
            [str(isready), "-h", host, "-p", str(port), "-U", "postgres", "-q"], check=False, capture_output=True
        )
        if done.returncode == 0:
            return
        time.sleep(0.2)
    raise PostgresError(f"PostgreSQL on {host}:{port} did not accept connections within {timeout_s:.0f} s")


def create_databases(host: str, port: int, names: Sequence[str]) -> list[str]:
    """Create the databases that do not exist yet; returns those created."""
    psql = postgres_bin_dir() / "psql"
    created = []
    for name in names:
        base = [str(psql), "-X", "-q", "-t", "-A", "-h", host, "-p", str(port), "-U", "postgres", "-d", "postgres"]
        exists = subprocess.run(
            [*base, "-c", f"SELECT 1 FROM pg_database WHERE datname = '{name}'"],
            capture_output=True,
            text=True,
            check=False,
        )
        if exists.stdout.strip() == "1":
            continue
        done = subprocess.run([*base, "-c", f'CREATE DATABASE "{name}"'], capture_output=True, text=True, check=False)
        if done.returncode != 0 and "already exists" not in done.stderr:
            raise PostgresError(f"CREATE DATABASE {name} on {host}:{port} failed: {done.stderr.strip()}")
        created.append(name)
    return created


def run_sql(host: str, port: int, database: str, sql: str) -> None:
    """Run ``sql`` (several statements, one transaction each as psql sends them) as ``postgres`` in ``database``.

    Raises:
        PostgresError: psql failed (its message, one line).
    """
    psql = postgres_bin_dir() / "psql"
    done = subprocess.run(
        [str(psql), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", str(port), "-U", "postgres", "-d", database],
        input=sql,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise PostgresError(f"SQL in {database} on {host}:{port} failed: {' '.join(done.stderr.split())[:300]}")


def serve_postgres(
    data_dir: Path,
    port: int,
    databases: Sequence[str] = (),
    *,
    host: str = "127.0.0.1",
    log: Path | None = None,
    on_ready: Callable[[], None] | None = None,
) -> int:
    """Run PostgreSQL on ``data_dir`` (initdb on first use) until SIGTERM/SIGINT, then stop it with a fast
    shutdown; returns its exit code. Creates ``databases`` once it accepts connections."""
    bin_dir = postgres_bin_dir()
    ids = _as_user()
    _init(data_dir, bin_dir, ids)
    out = log.open("ab") if log else subprocess.DEVNULL
    # A stale postmaster.pid of a killed server names a pid that may now be another process: PostgreSQL
    # checks it, and refuses to start only if that process is a live postmaster on this folder.
    process = subprocess.Popen(
        [str(bin_dir / "postgres"), "-D", str(data_dir), "-p", str(port), "-h", host, "-k", str(data_dir)],
        stdout=out,
        stderr=subprocess.STDOUT,
        preexec_fn=_demote(ids, die_with_parent=True),  # noqa: PLW1509
    )
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        wait_ready(host, port, process=process)
        create_databases(host, port, databases)
        if on_ready is not None:
            on_ready()
        while process.poll() is None:
            time.sleep(0.5)
        return 0 if stopping else int(process.returncode or 1)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if log and not isinstance(out, int):
            out.close()


def resolve_storage(storage: str | None, state: StateSettings | None = None) -> str | None:
    """The PostgreSQL URL of durable broker storage, or None for memory.

    ``memory`` (or nothing): in memory. ``postgresql://...`` / ``postgres://...``: that database (created
    by the gateway if missing). ``postgres``: a PostgreSQL of the broker's own under
    ``$PRMLOOP_HOME/broker-postgres`` (the pgserver wheel's binaries; it keeps running after the broker
    stops, and the next broker joins it).
    """
    value = (storage or "memory").strip()
    if value == "memory":
        return None
    if value.startswith(("postgresql://", "postgres://")):
        return value
    if value == "postgres":
        return _own_postgres((state or StateSettings()).home / "broker-postgres")
    raise BrokerError(
        f"unknown broker storage {value!r}: write memory, postgres (a PostgreSQL of the broker's own) or "
        "postgresql://user@host:port/database"
    )


def _own_postgres(folder: Path) -> str:
    try:
        import pgserver
    except ImportError as exc:
        raise BrokerError(
            "--storage postgres needs the pgserver package (pip install pgserver), or give a "
            "postgresql://user@host:port/database URL"
        ) from exc
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(folder, cleanup_mode=None)  # outlives the broker: the next one joins
    except (subprocess.CalledProcessError, OSError) as exc:
        raise BrokerError(
            f"cannot start the broker's PostgreSQL in {folder} ({type(exc).__name__}); the folder must be "
            "empty or a PostgreSQL cluster, writable by the user that runs PostgreSQL (pgserver, as root)"
        ) from exc
    return str(server.get_uri(database="prmloop_broker"))
