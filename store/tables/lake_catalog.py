"""The PostgreSQL catalog of a DuckLake: where it is, and as whom writers and readers reach it.

``ducklake:pgserver:<dir>`` is a local PostgreSQL that prmloop starts (the ``pgserver`` package's
binaries): the cluster in ``<dir>/catalog``, the Parquet files in ``<dir>/data`` unless the spec
says ``#data=<dir>``. A ``<dir>`` that is itself a cluster (``PG_VERSION`` in it: made before the
catalog got its own folder) stays one, with its data where it was (``$PRMLOOP_HOME/lake/data``).

``ducklake:postgres:<conninfo>`` is a PostgreSQL server; ``#reader=<libpq keywords>`` (e.g.
``#reader=user=prmloop_reader password=...``) says how readers connect instead.

Writers (sinks, compaction) connect as the catalog's owner. Readers connect as a role that may only
SELECT the catalog tables: on a pgserver catalog and on the cluster's PostgreSQL prmloop creates both
(``prmloop_sink`` and :data:`READER_ROLE`, each with its password from the credentials file:
:mod:`prmloop.store.auth.pg_auth`); on another PostgreSQL server the administrator does (docs/events-and-sql.md,
"DuckLake"), and ``prmloop sql`` refuses to run user SQL as any role that could do more
(:func:`reader_role_problems`).
"""

from __future__ import annotations

import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from prmloop.store.auth.credentials import READER_ROLE, SINK_ROLE, Credentials, load_credentials
from prmloop.store.kafka.poison import TransientError
from prmloop.store.tables.pg_local import LocalPostgresError, local_conninfo, start_local_postgres

LAKE_PREFIX = "ducklake:"


class LakeError(TransientError):
    """The lake cannot be reached or set up: one line naming the catalog and what to do. Transient
    for the sink (it retries the batch with backoff: a catalog restarting is not a reason to exit)."""


class ReaderRoleError(ValueError):
    """``prmloop sql`` would run user SQL as a catalog role that can do more than read."""


@dataclass(frozen=True)
class LakeStore:
    """Where a DuckLake lives: ``catalog`` is ``postgres:<libpq conninfo>`` (a PostgreSQL server) or
    ``pgserver:<directory>`` (a local PostgreSQL that prmloop starts there); ``data_path`` holds the
    Parquet files; ``reader`` the libpq keywords readers of a PostgreSQL server use instead."""

    catalog: str
    data_path: Path
    reader: str = ""

    @property
    def spec(self) -> str:
        """The ``ducklake:...#data=...`` text :func:`parse_lake` reads back (passwords included)."""
        reader = f"#reader={self.reader}" if self.reader else ""
        return f"{LAKE_PREFIX}{self.catalog}{reader}#data={self.data_path}"

    def __str__(self) -> str:
        """For logs and messages: the spec with any password masked."""
        return re.sub(r"(password=)\S+", r"\1***", self.spec)


def is_lake_spec(value: object) -> bool:
    return isinstance(value, str | LakeStore) and str(value).startswith(LAKE_PREFIX)


def pgserver_folders(directory: Path) -> tuple[Path, Path | None]:
    """The PostgreSQL cluster's folder of ``ducklake:pgserver:<directory>`` and its default data
    folder: ``<directory>/catalog`` and ``<directory>/data`` (initdb needs an empty folder, so the
    Parquet files cannot live in the cluster's); a cluster made directly in ``<directory>`` by an
    older prmloop keeps working there, with no default of its own (None: the caller's)."""
    if (directory / "PG_VERSION").exists():
        return directory, None
    return directory / "catalog", directory / "data"


def parse_lake(spec: str, *, default_data_path: Path) -> LakeStore:
    """``ducklake:postgres:<conninfo>`` or ``ducklake:pgserver:<dir>``, then optionally
    ``#reader=<libpq keywords>`` and ``#data=<dir>`` (else ``<dir>/data`` for a pgserver catalog,
    ``default_data_path`` otherwise). Clear one-line errors otherwise."""
    if not spec.startswith(LAKE_PREFIX):
        raise ValueError(
            f"not a DuckLake store: {spec!r}; write ducklake:pgserver:<dir> or ducklake:postgres:<conninfo>"
        )
    rest, *pairs = re.split(r"#(data|reader)=", spec[len(LAKE_PREFIX) :])
    options = dict(zip(pairs[::2], pairs[1::2], strict=True))
    kind, _, where = rest.partition(":")
    if kind not in ("postgres", "pgserver") or not where.strip():
        raise ValueError(
            f"PRMLOOP_STORE={spec!r}: the catalog must be postgres:<libpq conninfo> "
            "(e.g. ducklake:postgres:dbname=prmloop host=db user=prmloop) or pgserver:<directory> "
            "(a local PostgreSQL, e.g. ducklake:pgserver:~/.prmloop/lake)"
        )
    data_path = default_data_path
    if kind == "pgserver":
        where = str(Path(where).expanduser().resolve())
        if Path(where).exists() and not Path(where).is_dir():
            raise ValueError(
                f"PRMLOOP_STORE={spec!r}: {where} is a file; ducklake:pgserver: needs a folder (new or the lake's own)"
            )
        if "reader" in options:
            raise ValueError(f"PRMLOOP_STORE={spec!r}: #reader= is for postgres: catalogs (pgserver makes its own)")
        data_path = pgserver_folders(Path(where))[1] or default_data_path
    if "data" in options:
        data_path = Path(options["data"]).expanduser()
    return LakeStore(f"{kind}:{where}", data_path.resolve(), options.get("reader", "").strip())


# ------------------------------------------------------------------------------- a local PostgreSQL

_servers: dict[str, Any] = {}
_servers_lock = threading.Lock()


def local_postgres(directory: str | Path) -> Any:
    """A handle on the ``pgserver`` PostgreSQL of ``ducklake:pgserver:<directory>`` (in the folder
    :func:`pgserver_folders` names; made, started or joined by
    :func:`~prmloop.store.tables.pg_local.start_local_postgres`,
    stopped when the last process holding a handle exits or calls ``cleanup()``). Its lake is the database
    ``postgres``, owned by the sinks' role. A folder initdb cannot use is one line naming it."""
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import pgserver  # noqa: F401 - only to say what is missing
    except ImportError as exc:
        raise LakeError("a pgserver catalog needs the pgserver package: pip install pgserver") from exc
    folder = pgserver_folders(Path(directory))[0]
    if folder.exists() and not (folder / "PG_VERSION").exists() and any(folder.iterdir()):
        raise LakeError(
            f"cannot create the DuckLake catalog's PostgreSQL in {folder}: the folder is not empty and holds "
            "no PostgreSQL cluster (initdb needs an empty folder); empty or remove it, or name another "
            "ducklake:pgserver: folder"
        )
    folder.parent.mkdir(parents=True, exist_ok=True)
    credentials = lake_credentials(directory)
    try:
        return start_local_postgres(
            folder, {"postgres": SINK_ROLE}, cleanup_mode="stop", credentials=credentials, home=credentials.home
        )
    except LocalPostgresError as exc:
        raise LakeError(f"the DuckLake catalog's {exc}") from exc


def lake_credentials(directory: str | Path) -> Credentials:
    """The credentials of the roles of ``ducklake:pgserver:<directory>``: the lake's own, in
    ``<directory>/credentials.json`` (the folder closed like a home), so that any process of its user
    opens it, whatever its ``$PRMLOOP_HOME``; those of ``$PRMLOOP_HOME`` for a catalog made directly in
    ``<directory>`` by an older prmloop."""
    directory = Path(directory)
    if pgserver_folders(directory)[1] is None:
        return load_credentials()
    return load_credentials(directory)


def _pgserver_conninfo(directory: str, *, reader: bool) -> str:
    """Start (or join) the local PostgreSQL of ``directory``; it stops when its last user exits."""
    with _servers_lock:
        server = _servers.get(directory)
        if server is None:
            server = local_postgres(directory)
            _servers[directory] = server
    return local_conninfo(server, READER_ROLE if reader else SINK_ROLE, "postgres", lake_credentials(directory))


def release_local_postgres(directory: str | Path) -> None:
    """Let go of this process's handle on the local PostgreSQL of ``directory`` (the server stops
    when no process holds one); a later use starts or joins it again."""
    with _servers_lock:
        server = _servers.pop(str(directory), None)
    if server is not None:
        server.cleanup()


def served_form(store: LakeStore) -> LakeStore:
    """The same lake as a ``postgres:`` catalog: for a pgserver catalog, its local PostgreSQL started (or
    joined) by this process, which holds it for as long as it runs; another process then reaches that
    server without holding it (``prmloop sql``'s query process: if DuckDB crashes there, nothing is left
    holding the catalog). Passwords stay in their passfiles."""
    if not store.catalog.startswith("pgserver:"):
        return store
    reader = conninfo(store, reader=True)
    return LakeStore(f"postgres:{conninfo(store)}", store.data_path, reader=reader)


def conninfo(store: LakeStore, *, reader: bool = False) -> str:
    """The libpq conninfo of the catalog, for a writer or (``reader=True``) for a reader."""
    kind, _, where = store.catalog.partition(":")
    if kind == "pgserver":
        return _pgserver_conninfo(where, reader=reader)
    return reader_conninfo(where, store.reader) if reader and store.reader else where


# ---------------------------------------------------------------------------------------- readers

_KEYWORD = re.compile(r"\s*(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)")


def _keywords(text: str) -> dict[str, str]:
    """libpq ``key=value`` pairs (values may be single-quoted), in order."""
    return {m.group(1): m.group(2) for m in _KEYWORD.finditer(text)}


def reader_conninfo(base: str, reader: str) -> str:
    """``base`` with the keywords of ``reader`` in place of its own. A reader that names its own
    user never carries the writer's password (DuckDB shows attached paths to every query)."""
    keys = _keywords(base)
    override = _keywords(reader)
    if "user" in override:
        keys.pop("password", None)
        keys.pop("passfile", None)
    keys.update(override)
    return " ".join(f"{k}={v}" for k, v in keys.items())


_ROLE_SQL = """
SELECT current_user::text AS role,
       r.rolsuper AS superuser,
       coalesce(pg_has_role(current_user, c.relowner, 'MEMBER'), false) AS owner,
       coalesce(has_table_privilege(c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE'), false) AS writes,
       pg_has_role(current_user, 'pg_signal_backend', 'MEMBER') AS signals,
       pg_has_role(current_user, 'pg_read_server_files', 'MEMBER')
           OR pg_has_role(current_user, 'pg_write_server_files', 'MEMBER')
           OR pg_has_role(current_user, 'pg_execute_server_program', 'MEMBER') AS files
FROM pg_roles r LEFT JOIN pg_class c ON c.oid = to_regclass('ducklake_snapshot')
WHERE r.rolname = current_user
"""

_PROBLEMS = {
    "superuser": "is a superuser",
    "owner": "owns the catalog (or is a member of its owner: it could end the sinks' sessions)",
    "writes": "may change the catalog's tables",
    "signals": "may end other sessions (pg_signal_backend)",
    "files": "may read or write the server's files or run programs",
}


def reader_role_problems(con: duckdb.DuckDBPyConnection, metadata_catalog: str) -> tuple[str, list[str]]:
    """The role a reader's connection reaches the catalog as, and what it may do beyond reading."""
    sql = _ROLE_SQL.replace("'", "''")
    row = con.execute(f"SELECT * FROM postgres_query('{metadata_catalog}', '{sql}')").fetchone()
    if row is None:
        return "?", ["cannot be looked up in pg_roles"]
    role, *flags = row
    return str(role), [text for (key, text), flag in zip(_PROBLEMS.items(), flags, strict=True) if flag]


def check_reader_role(con: duckdb.DuckDBPyConnection, metadata_catalog: str, store: LakeStore) -> None:
    """Refuse (:class:`ReaderRoleError`, one line) a catalog role that can do more than read."""
    role, problems = reader_role_problems(con, metadata_catalog)
    if problems:
        raise ReaderRoleError(
            f"`prmloop sql` reads the DuckLake catalog of {store} as PostgreSQL role {role!r}, which "
            f"{'; '.join(problems)}: give readers a role that may only SELECT the catalog tables and add "
            "#reader=user=<that role> password=... to PRMLOOP_STORE (see docs/events-and-sql.md, DuckLake)"
        )


def _one_line(exc: BaseException | str, limit: int = 300) -> str:
    return " ".join(str(exc).split())[:limit]
