"""A PostgreSQL server run as a service (``prmloop postgres``): the cluster's one database server.

On a cluster PostgreSQL is a service of its own (the compose file's ``postgres``); on one machine
prmloop runs the same server from the binaries the ``pgserver`` wheel ships (or Debian's
``postgresql`` package), in the foreground, so that it can be supervised, killed and restarted like any
other service: a SIGKILLed postmaster is restarted on the same folder, and PostgreSQL's crash recovery
replays its write-ahead log (committed transactions survive). It listens on loopback TCP, which every
client here speaks: asyncpg (the broker's object gateway, the Prefect server) and libpq (DuckLake).

When prmloop runs as root, PostgreSQL runs as the user ``pgserver`` (PostgreSQL refuses root): its
data folder is created for that user, and initdb needs it empty.

Every role gives its password (``scram-sha-256``, no ``trust``: :mod:`prmloop.store.auth.pg_auth`). At each
start the server brings the service roles to the credentials file's passwords and gives each known
database its owner: ``prmloop_broker`` the brokers' storage, ``prefect`` the Prefect server's, and any
other (``prmloop_lake``) is a lake, owned by the sinks' role and readable by the readers'
(:data:`DATABASE_OWNERS`). prmloop's own set-up connects as the administration role ``postgres``; no
service does.
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
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from prmloop.flows.ops.broker import parent_death_signal
from prmloop.store.auth.credentials import (
    ADMIN_ROLE,
    BROKER_ROLE,
    POSTGRES_SYSTEM_USER,
    PREFECT_ROLE,
    SINK_ROLE,
    Credentials,
    load_credentials,
)
from prmloop.store.auth.pg_auth import (
    database_owner_sql,
    grant_traversal,
    hba_is_prmloops,
    init_cluster,
    reader_grants_sql,
    roles_sql,
    set_admin_password_offline,
    write_hba,
)
from prmloop.store.kafka.broker_file import BrokerError
from prmloop.store.settings import StateSettings

__all__ = [
    "DATABASE_OWNERS",
    "PostgresError",
    "create_databases",
    "database_owner",
    "postgres_bin_dir",
    "prepare_server",
    "resolve_storage",
    "run_sql",
    "serve_postgres",
    "wait_ready",
]

#: The user PostgreSQL runs as when prmloop runs as root (pgserver creates it too).
SYSTEM_USER = POSTGRES_SYSTEM_USER
#: The role that owns each database the cluster knows; any other database is a lake (the sinks' own).
DATABASE_OWNERS = {"prmloop_broker": BROKER_ROLE, "prefect": PREFECT_ROLE, "prmloop_lake": SINK_ROLE}


def database_owner(name: str) -> str:
    return DATABASE_OWNERS.get(name, SINK_ROLE)


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


def _init(data_dir: Path, bin_dir: Path, ids: tuple[int, int] | None, credentials: Credentials) -> None:
    """A new cluster asks every role for its password from the start; one an older prmloop made with
    ``trust`` is converted before it listens (its administration password set in single-user mode)."""
    if ids is not None and data_dir.exists():
        grant_traversal(data_dir, ids)  # the postgres user must reach its folder
    if (data_dir / "PG_VERSION").exists():
        if not hba_is_prmloops(data_dir):
            set_admin_password_offline(
                bin_dir / "postgres", data_dir, credentials.postgres_password(ADMIN_ROLE), _demote(ids)
            )
            write_hba(data_dir, ids)
        return
    if data_dir.exists() and any(data_dir.iterdir()):
        raise PostgresError(
            f"cannot create a PostgreSQL cluster in {data_dir}: the folder is not empty and holds no cluster "
            "(initdb needs an empty folder); empty it or name another --dir"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    if ids is not None:
        os.chown(data_dir, *ids)
        grant_traversal(data_dir, ids)  # the postgres user must reach its folder
    data_dir.chmod(0o700)
    error = init_cluster(bin_dir / "initdb", data_dir, credentials.postgres_password(ADMIN_ROLE), ids, _demote(ids))
    if error is not None:
        raise PostgresError(f"initdb in {data_dir} failed: {error}")


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


def _psql(
    host: str, port: int, database: str, role: str, credentials: Credentials | None
) -> tuple[list[str], dict[str, str]]:
    """psql's command line (never waiting for a password) and environment (``role``'s passfile)."""
    credentials = credentials or load_credentials()
    argv = [str(postgres_bin_dir() / "psql"), "-X", "-q", "-w", "-h", host, "-p", str(port), "-U", role, "-d", database]
    return argv, {**os.environ, "PGPASSFILE": str(credentials.passfile(role))}


def create_databases(
    host: str, port: int, names: Sequence[str], *, credentials: Credentials | None = None
) -> list[str]:
    """Create the databases that do not exist yet, each owned by :func:`database_owner`; returns those created."""
    created = []
    for name in names:
        base, env = _psql(host, port, "postgres", ADMIN_ROLE, credentials)
        exists = subprocess.run(
            [*base, "-t", "-A", "-c", f"SELECT 1 FROM pg_database WHERE datname = '{name}'"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if exists.stdout.strip() == "1":
            continue
        done = subprocess.run(
            [*base, "-c", f'CREATE DATABASE "{name}" OWNER {database_owner(name)}'],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0 and "already exists" not in done.stderr:
            raise PostgresError(f"CREATE DATABASE {name} on {host}:{port} failed: {done.stderr.strip()}")
        created.append(name)
    return created


def run_sql(
    host: str,
    port: int,
    database: str,
    sql: str,
    *,
    role: str = ADMIN_ROLE,
    credentials: Credentials | None = None,
) -> str:
    """Run ``sql`` (several statements, one transaction each as psql sends them) as ``role`` (default the
    administration role) in ``database``; returns psql's output.

    Raises:
        PostgresError: psql failed (its message, one line).
    """
    argv, env = _psql(host, port, database, role, credentials)
    done = subprocess.run(
        [*argv, "-v", "ON_ERROR_STOP=1", "-t", "-A"],
        input=sql,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise PostgresError(f"SQL in {database} on {host}:{port} failed: {' '.join(done.stderr.split())[:300]}")
    return done.stdout


def prepare_server(host: str, port: int, databases: Sequence[str], *, credentials: Credentials | None = None) -> None:
    """The service roles with the credentials' passwords, ``databases`` created with their owners
    (:func:`database_owner`; what an older prmloop made as ``postgres`` handed over to them), the reader's
    grants on every lake. Idempotent; run by the server at each start."""
    credentials = credentials or load_credentials()
    for attempt in range(5):  # two set-ups at once may collide on the catalog rows a GRANT updates
        try:
            run_sql(host, port, "postgres", roles_sql(credentials), credentials=credentials)
            create_databases(host, port, databases, credentials=credentials)
            for name in databases:
                owner = database_owner(name)
                sql = database_owner_sql(name, owner) + (reader_grants_sql(name) if owner == SINK_ROLE else "")
                run_sql(host, port, name, sql, credentials=credentials)
            return
        except PostgresError:
            if attempt == 4:
                raise
            time.sleep(0.5 * (attempt + 1))


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
    credentials = load_credentials()
    _init(data_dir, bin_dir, ids, credentials)
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
        prepare_server(host, port, databases, credentials=credentials)
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
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import pgserver  # noqa: F401 - only to say what is missing
    except ImportError as exc:
        raise BrokerError(
            "--storage postgres needs the pgserver package (pip install pgserver), or give a "
            "postgresql://user@host:port/database URL"
        ) from exc
    from prmloop.store.tables.pg_local import LocalPostgresError, start_local_postgres

    folder.parent.mkdir(parents=True, exist_ok=True)
    credentials = load_credentials()
    try:
        # Outlives the broker (no clean-up): the next one joins it.
        server = start_local_postgres(
            folder, {"prmloop_broker": BROKER_ROLE}, cleanup_mode=None, credentials=credentials
        )
    except LocalPostgresError as exc:
        raise BrokerError(f"the broker's {exc}") from exc
    socket_dir = server.get_postmaster_info().socket_dir
    return f"postgresql://{BROKER_ROLE}@/prmloop_broker?host={socket_dir}&passfile={credentials.passfile(BROKER_ROLE)}"
