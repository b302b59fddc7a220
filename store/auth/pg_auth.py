"""Who may connect to the PostgreSQL servers prmloop runs, and as which role.

Every PostgreSQL prmloop starts (``prmloop postgres``, the pgserver catalog of a local DuckLake, the
broker's own storage) asks every role for its password (``scram-sha-256``; :data:`HBA`, no ``trust``
line anywhere, the Unix socket included), and has one role per component, none of them superuser but
the administration role, which only prmloop's set-up code uses (:func:`roles_sql`):

============== ======================================================================
role           may
============== ======================================================================
postgres       everything (administration: creates the others; no service connects as it)
prmloop_sink   own the lake's catalog tables: the sinks write the lake
prmloop_reader SELECT the lake's catalog tables (``prmloop sql``, exports)
prmloop_prefect own the Prefect server's database
prmloop_broker own the brokers' storage database (the object gateway's table)
============== ======================================================================

Passwords come from the credentials file (:mod:`prmloop.store.auth.credentials`) and travel as SCRAM
verifiers (:func:`scram_verifier`), so no server log or statistics view ever holds one in clear.
A cluster an older prmloop made with ``trust`` is converted at its next start: its administration
password is set in single-user mode (:func:`set_admin_password_offline`), before it listens.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pwd
import secrets
import stat
import struct
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from prmloop.store.auth.credentials import (
    ACL_XATTR,
    ADMIN_ROLE,
    BROKER_ROLE,
    PREFECT_ROLE,
    READER_ROLE,
    SINK_ROLE,
    Credentials,
    acl_grants,
)

__all__ = [
    "HBA",
    "SERVICE_ROLES",
    "database_owner_sql",
    "grant_traversal",
    "hba_is_prmloops",
    "initdb_arguments",
    "reader_grants_sql",
    "roles_sql",
    "scram_verifier",
    "set_admin_password_offline",
    "system_user_ids",
    "write_hba",
]

#: pg_hba.conf of every PostgreSQL prmloop runs: a password for every role, over the socket too.
HBA = """# Written by prmloop (store/auth/pg_auth.py): every role gives its password (scram-sha-256).
local   all          all                     scram-sha-256
host    all          all   127.0.0.1/32      scram-sha-256
host    all          all   ::1/128           scram-sha-256
local   replication  all                     scram-sha-256
host    replication  all   127.0.0.1/32      scram-sha-256
host    replication  all   ::1/128           scram-sha-256
"""

#: The roles services connect as (see the module docstring); none may do more than its own work.
SERVICE_ROLES = (SINK_ROLE, READER_ROLE, PREFECT_ROLE, BROKER_ROLE)


def scram_verifier(password: str, *, iterations: int = 4096) -> str:
    """PostgreSQL's stored form of ``password`` for ``scram-sha-256`` (RFC 5802/7677): what
    ``ALTER ROLE ... PASSWORD`` accepts instead of the clear text."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def initdb_arguments(password_file: Path) -> list[str]:
    """initdb's options for a new cluster: scram-sha-256 everywhere, the administration role's
    password read from ``password_file``."""
    return [
        "-U",
        ADMIN_ROLE,
        "--auth-local=scram-sha-256",
        "--auth-host=scram-sha-256",
        f"--pwfile={password_file}",
        "--encoding=utf8",
    ]


def init_cluster(
    initdb: Path, data_dir: Path, password: str, ids: tuple[int, int] | None, preexec: Callable[[], None] | None
) -> str | None:
    """A new cluster in the empty ``data_dir`` (made by the caller, owned by ``ids``) that asks every role
    for its password from the start (:func:`initdb_arguments`, then :data:`HBA`); ``initdb`` runs as
    ``preexec`` makes it. Returns None, or initdb's complaint on one line."""
    with tempfile.TemporaryDirectory(prefix="prmloop-initdb-") as tmp:
        password_file = Path(tmp) / "password"
        password_file.write_text(password + "\n")
        if ids is not None:
            os.chown(tmp, *ids)
            os.chown(password_file, *ids)
        done = subprocess.run(
            [str(initdb), "-D", str(data_dir), *initdb_arguments(password_file)],
            capture_output=True,
            text=True,
            preexec_fn=preexec,
            check=False,
        )
    if done.returncode != 0:
        return " ".join((done.stderr or done.stdout).split())[:300]
    write_hba(data_dir, ids)
    return None


def hba_is_prmloops(data_dir: Path) -> bool:
    """The cluster's pg_hba.conf is :data:`HBA` (an older prmloop's said ``trust``)."""
    try:
        return (data_dir / "pg_hba.conf").read_text() == HBA
    except OSError:
        return False


def write_hba(data_dir: Path, ids: tuple[int, int] | None) -> None:
    """Replace the cluster's pg_hba.conf by :data:`HBA` (owned by PostgreSQL's user, 0600)."""
    path = data_dir / "pg_hba.conf"
    tmp = data_dir / f".pg_hba.conf.{os.getpid()}"
    tmp.write_text(HBA)
    tmp.chmod(0o600)
    if ids is not None:
        os.chown(tmp, *ids)
    tmp.replace(path)


def set_admin_password_offline(
    postgres: Path, data_dir: Path, password: str, preexec: Callable[[], None] | None
) -> None:
    """Set the administration role's password with PostgreSQL in single-user mode (the server must
    not run): how a cluster made with ``trust`` gets one before it listens with :data:`HBA`."""
    statement = f"ALTER ROLE {ADMIN_ROLE} PASSWORD '{scram_verifier(password)}';\n"
    done = subprocess.run(
        [str(postgres), "--single", "-D", str(data_dir), "-j", "postgres"],
        input=statement,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"setting the PostgreSQL administration password in {data_dir} failed: "
            + " ".join((done.stderr or done.stdout).split())[:300]
        )


def roles_sql(credentials: Credentials) -> str:
    """SQL (for the ``postgres`` database, as the administration role) that creates each service role,
    or brings an existing one up to date: login with its password, and no other right."""
    parts = [f"ALTER ROLE {ADMIN_ROLE} PASSWORD '{scram_verifier(credentials.postgres_password(ADMIN_ROLE))}';"]
    for role in SERVICE_ROLES:
        parts.append(
            f"DO $$ BEGIN CREATE ROLE {role} LOGIN; "
            "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;\n"
            f"ALTER ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
            f"NOINHERIT PASSWORD '{scram_verifier(credentials.postgres_password(role))}';"
        )
    parts.append(f"ALTER ROLE {READER_ROLE} SET default_transaction_read_only = on;")
    return "\n".join(parts) + "\n"


def database_owner_sql(database: str, owner: str) -> str:
    """SQL (run in ``database``, as the administration role) that gives ``owner`` the database and every
    table, sequence, view, type and function an older prmloop created in its schema ``public`` as
    ``postgres`` (so that a converted cluster's Prefect can migrate its tables, a sink write its lake)."""
    return f"""
ALTER DATABASE "{database}" OWNER TO {owner};
REVOKE ALL ON DATABASE "{database}" FROM PUBLIC;
GRANT ALL ON SCHEMA public TO {owner};
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
               AND pg_get_userbyid(c.relowner) = '{ADMIN_ROLE}'
               AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid
                                                    AND d.deptype IN ('a', 'i')))
    LOOP
        EXECUTE format('ALTER %s public.%I OWNER TO {owner}',
                       CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                      WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
                       r.relname);
    END LOOP;
    FOR r IN SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
             WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd', 'c') AND t.typrelid = 0
               AND pg_get_userbyid(t.typowner) = '{ADMIN_ROLE}'
    LOOP
        EXECUTE format('ALTER TYPE public.%I OWNER TO {owner}', r.typname);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS signature FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             LEFT JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
             WHERE n.nspname = 'public' AND d.objid IS NULL AND pg_get_userbyid(p.proowner) = '{ADMIN_ROLE}'
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO {owner}', r.signature);
    END LOOP;
END $$;
"""


def reader_grants_sql(database: str, writer: str = SINK_ROLE) -> str:
    """SQL (run in ``database``) that lets :data:`READER_ROLE` read every table ``writer`` has made or makes
    in ``public``, and nothing else."""
    return f"""
GRANT CONNECT ON DATABASE "{database}" TO {READER_ROLE};
GRANT USAGE ON SCHEMA public TO {READER_ROLE};
GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER_ROLE};
ALTER DEFAULT PRIVILEGES FOR ROLE {writer} IN SCHEMA public GRANT SELECT ON TABLES TO {READER_ROLE};
"""


def _acl(mode: int, uid: int) -> bytes:
    """An access ACL (the kernel's xattr format, version 2) keeping ``mode`` for owner, group and others,
    adding the search bit for the user ``uid`` alone (its mask: the group bits and that bit)."""
    undefined = 0xFFFFFFFF
    owner, group, other = (mode >> 6) & 7, (mode >> 3) & 7, mode & 7
    entries = [(0x01, owner, undefined), (0x02, 1, uid), (0x04, group, undefined), (0x10, group | 1, undefined)]
    entries.append((0x20, other, undefined))
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, who) for tag, perm, who in entries)


def _can_search(folder: Path, ids: tuple[int, int]) -> bool:
    """The user ``ids`` can search ``folder``, whether it runs with its own group (prmloop's PostgreSQL)
    or with root's (pgserver's, which changes the user only), by mode or by an ACL naming it."""
    st = folder.stat()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == ids[0]:
        return bool(mode & stat.S_IXUSR)
    if acl_grants(folder) and mode & stat.S_IXGRP:  # our ACL: the user named, the mask letting it search
        return True
    return all(bool(mode & (stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH)) for gid in {ids[1], 0})


def grant_traversal(path: Path, ids: tuple[int, int]) -> None:
    """Let the user ``ids`` (PostgreSQL's, when prmloop runs as root) reach ``path``: each folder above it
    that this user cannot search gets the search bit for it and nothing more, through an ACL naming that
    user alone, so a home stays closed to every other user (pgserver would open every folder above to
    everyone, read included). Where the file system has no ACLs, the search bit for group and others."""
    for folder in path.resolve().parents:
        if _can_search(folder, ids):
            continue
        mode = stat.S_IMODE(folder.stat().st_mode)
        try:
            os.setxattr(folder, ACL_XATTR, _acl(mode, ids[0]))
            continue
        except OSError:
            pass  # no ACLs here, or not our folder
        folder.chmod(mode | 0o011)


def system_user_ids(name: str) -> tuple[int, int]:
    entry = pwd.getpwnam(name)
    return entry.pw_uid, entry.pw_gid
