"""The PostgreSQL servers prmloop starts from the ``pgserver`` package: a local DuckLake's catalog
(``ducklake:pgserver:<dir>``) and the broker's own storage (``prmloop broker --storage postgres``).

pgserver starts a server on a Unix socket and stops it with its last user; it would make a cluster
with ``trust`` for everyone. prmloop makes the cluster itself first (initdb with ``scram-sha-256`` and
the administration password of the credentials file), converts one an older prmloop made
(:mod:`prmloop.store.auth.pg_auth`), and then sets up the service roles and the databases' owners, so that
the sinks connect as ``prmloop_sink``, readers as ``prmloop_reader``, the broker's gateway as
``prmloop_broker``: with a password each, from a passfile of their own.

When prmloop runs as root, pgserver runs PostgreSQL as the user ``pgserver`` and would open every
folder above the cluster to everyone (g+rx,o+rx): here only the search bit is given, to that user alone
(an ACL: :func:`~prmloop.store.auth.pg_auth.grant_traversal`), so a home stays closed to everyone else.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prmloop.store.auth.credentials import ADMIN_ROLE, POSTGRES_SYSTEM_USER, Credentials, load_credentials
from prmloop.store.auth.pg_auth import (
    database_owner_sql,
    grant_traversal,
    hba_is_prmloops,
    init_cluster,
    reader_grants_sql,
    roles_sql,
    set_admin_password_offline,
    system_user_ids,
    write_hba,
)

__all__ = ["LocalPostgresError", "local_conninfo", "local_psql", "start_local_postgres"]

log = logging.getLogger(__name__)


class LocalPostgresError(RuntimeError):
    """The local PostgreSQL cannot be made, started or set up: one line naming its folder."""


def _pgserver() -> Any:
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pgserver
        import pgserver.postgres_server

    return pgserver


def _bin(name: str) -> Path:
    return Path(_pgserver().__file__).parent / "pginstall" / "bin" / name


def _ids() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    from pgserver.utils import ensure_user_exists

    ensure_user_exists(POSTGRES_SYSTEM_USER)
    return system_user_ids(POSTGRES_SYSTEM_USER)


def _as(ids: tuple[int, int] | None) -> Any:
    if ids is None:
        return None

    def become() -> None:
        os.setgid(ids[1])
        os.setuid(ids[0])

    return become


def _one_line(text: object, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


def _initdb(folder: Path, ids: tuple[int, int] | None, credentials: Credentials) -> None:
    """A new cluster in ``folder`` that asks every role for its password from the start."""
    folder.mkdir(parents=True, exist_ok=True)
    if ids is not None:
        os.chown(folder, *ids)
    folder.chmod(0o700)
    error = init_cluster(_bin("initdb"), folder, credentials.postgres_password(ADMIN_ROLE), ids, _as(ids))
    if error is not None:
        raise LocalPostgresError(f"initdb in {folder} failed: {error}")


def _running(folder: Path) -> bool:
    from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(folder)
    return info is not None and info.is_running()


def _convert(folder: Path, ids: tuple[int, int] | None, credentials: Credentials) -> None:
    """A cluster an older prmloop made with ``trust``: give its administration role a password and
    replace its pg_hba.conf. Stopped, in single-user mode; running (an older prmloop's process still
    uses it), over its socket while ``trust`` still holds, then the server re-reads pg_hba.conf."""
    if _running(folder):
        from pgserver.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(folder)
        assert info is not None
        _run_psql(info.get_uri(), roles_sql(credentials), env=os.environ)
        write_hba(folder, ids)
        _run_psql(info.get_uri(), "SELECT pg_reload_conf();", env=os.environ)
    else:
        set_admin_password_offline(_bin("postgres"), folder, credentials.postgres_password(ADMIN_ROLE), _as(ids))
        write_hba(folder, ids)
    log.warning("the PostgreSQL in %s trusted every local connection: it now asks for passwords", folder)


def _run_psql(uri: str, sql: str, *, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(_bin("psql")), "-X", "-q", "-w", "-v", "ON_ERROR_STOP=1", uri],
        input=sql,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(env),
        check=False,
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, "psql", done.stdout, done.stderr)
    return done


def local_psql(
    server: Any, sql: str, *, role: str = ADMIN_ROLE, database: str = "postgres", credentials: Credentials
) -> subprocess.CompletedProcess[str]:
    """Run ``sql`` on the pgserver ``server`` as ``role`` (its password from its passfile), over the socket.

    Raises:
        subprocess.CalledProcessError: psql failed (its stderr says why).
    """
    env = {**os.environ, "PGPASSFILE": str(credentials.passfile(role))}
    return _run_psql(server.get_postmaster_info().get_uri(user=role, database=database), sql, env=env)


def _set_up(server: Any, folder: Path, databases: Mapping[str, str], credentials: Credentials) -> None:
    """The service roles with their current passwords, the databases with their owners, the reader's
    grants on a lake's database. Skipped when every owner can already log in to its database."""

    def owners_can_log_in() -> bool:
        try:
            for database, owner in databases.items():
                local_psql(server, "SELECT 1", role=owner, database=database, credentials=credentials)
        except subprocess.CalledProcessError:
            return False
        return True

    if owners_can_log_in():
        return
    # Two processes joining at once may collide on the catalog rows a GRANT updates: try again.
    for attempt in range(5):
        try:
            local_psql(server, roles_sql(credentials), credentials=credentials)
            for database, owner in databases.items():
                exists = local_psql(
                    server, f"SELECT 1 FROM pg_database WHERE datname = '{database}'", credentials=credentials
                )
                if "1" not in exists.stdout:
                    local_psql(server, f'CREATE DATABASE "{database}" OWNER {owner}', credentials=credentials)
                sql = database_owner_sql(database, owner) + reader_grants_sql(database, owner)
                local_psql(server, sql, database=database, credentials=credentials)
            return
        except subprocess.CalledProcessError as exc:
            if attempt == 4:
                raise LocalPostgresError(
                    f"cannot set up the roles of the PostgreSQL in {folder}: {_one_line(exc.stderr or exc)}"
                ) from exc
            time.sleep(0.2 * (attempt + 1))


def start_local_postgres(
    folder: Path,
    databases: Mapping[str, str],
    *,
    cleanup_mode: str | None = "stop",
    credentials: Credentials | None = None,
    home: Path | None = None,
) -> Any:
    """Start (or join) the pgserver PostgreSQL of ``folder``, made or converted as the module says, with
    ``databases`` (name: owning role) set up; returns pgserver's handle. ``home``: the prmloop home the
    folder may lie in (kept closed to other users when PostgreSQL runs as another user)."""
    pgserver = _pgserver()
    if credentials is None:
        credentials = load_credentials(home)
    home = home or credentials.home
    ids = _ids()
    folder.parent.mkdir(parents=True, exist_ok=True)
    if ids is not None:
        # pgserver would open every folder above the cluster, and its binaries', to everyone.
        pgserver.postgres_server.ensure_prefix_permissions = lambda path: grant_traversal(path, ids)
        grant_traversal(folder, ids)
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)  # our errors below are one line
    if not (folder / "PG_VERSION").exists():
        _initdb(folder, ids, credentials)
    elif not hba_is_prmloops(folder):
        _convert(folder, ids, credentials)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = pgserver.get_server(folder, cleanup_mode=cleanup_mode)
    except (subprocess.CalledProcessError, OSError) as exc:
        raise LocalPostgresError(
            f"cannot start the PostgreSQL in {folder} ({type(exc).__name__}: {_one_line(exc)}); the folder must "
            "be empty or a PostgreSQL cluster, writable by the user that runs PostgreSQL (pgserver, as root)"
        ) from exc
    _set_up(server, folder, databases, credentials)
    return server


def local_conninfo(server: Any, role: str, database: str, credentials: Credentials) -> str:
    """libpq conninfo of ``role`` on the pgserver ``server`` (socket folder, passfile)."""
    uri = server.get_uri()
    host = re.search(r"host=([^&]+)", uri)
    where = host.group(1) if host else ""
    return f"dbname={database} user={role} host={where} passfile={credentials.passfile(role)}"
