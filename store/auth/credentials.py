"""The secrets every prmloop process shares, generated on first use: ``$PRMLOOP_HOME/credentials.json``.

Nothing in prmloop has a default password. The first process that needs a secret creates the file
(mode 0600, in the home made 0700) under a file lock, so two processes that ask at once get the same
secrets; every later process reads it. A secret missing from an older file is added the same way.

What it holds (ARCHITECTURE.md, "Who may do what"):

- ``postgres``: one password per PostgreSQL role (:data:`ROLES`): the administration role ``postgres``
  (used only to create the others), the lake's writer (the sinks), its reader (``prmloop sql``),
  the Prefect server's and the brokers' storage roles. Clients find them in one passfile per role
  (:meth:`Credentials.passfile`, libpq's format), never on a command line.
- ``prefect_auth``: the Prefect server's basic-auth string (``user:password``).
- ``engine_api_key``: the vLLM engine's API key.
- ``gateway``: the object gateway's access key id and secret (AWS SigV4).
- ``signing_key``: signs the events that change what the loop runs (a promoted PRM, a calibration).

Files prmloop writes are private too: :func:`private_files` sets the process's umask to 077, and
:func:`secure_home` keeps the home closed to other users (0700; when prmloop runs as root, an ACL
lets the user PostgreSQL runs as, and no one else, traverse it to its data folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ADMIN_ROLE",
    "BROKER_ROLE",
    "CREDENTIALS_FILE",
    "PREFECT_ROLE",
    "READER_ROLE",
    "ROLES",
    "SINK_ROLE",
    "Credentials",
    "CredentialsError",
    "load_credentials",
    "private_files",
    "secure_home",
]

CREDENTIALS_FILE = "credentials.json"
#: PostgreSQL's administration role: creates the others, and no service connects as it.
ADMIN_ROLE = "postgres"
#: Writes the lake's catalog (the sinks, compaction).
SINK_ROLE = "prmloop_sink"
#: Reads the lake's catalog (``prmloop sql``, exports): SELECT only.
READER_ROLE = "prmloop_reader"
#: Owns the Prefect server's database.
PREFECT_ROLE = "prmloop_prefect"
#: Owns the brokers' storage database (the object gateway's table).
BROKER_ROLE = "prmloop_broker"
ROLES = (ADMIN_ROLE, SINK_ROLE, READER_ROLE, PREFECT_ROLE, BROKER_ROLE)
#: The user PostgreSQL runs as when prmloop runs as root (PostgreSQL refuses root; pgserver uses it too).
POSTGRES_SYSTEM_USER = "pgserver"


class CredentialsError(RuntimeError):
    """The credentials file cannot be read or written: one line naming it and what to do."""


def _generate() -> dict[str, Any]:
    return {
        "postgres": {role: secrets.token_urlsafe(24) for role in ROLES},
        "prefect_auth": f"prmloop:{secrets.token_urlsafe(24)}",
        "engine_api_key": secrets.token_urlsafe(32),
        "gateway": {"access_key_id": f"prmloop-{secrets.token_hex(8)}", "secret_access_key": secrets.token_urlsafe(32)},
        "signing_key": secrets.token_hex(32),
    }


def _complete(found: Mapping[str, Any]) -> dict[str, Any]:
    """``found`` with every secret it lacks added (new ones; those it has are kept)."""
    fresh = _generate()
    merged: dict[str, Any] = dict(found)
    for key, value in fresh.items():
        if isinstance(value, dict):
            have = merged.get(key)
            merged[key] = {**value, **(have if isinstance(have, dict) else {})}
        elif not isinstance(merged.get(key), str) or not merged[key]:
            merged[key] = value
    return merged


#: The extended attribute of a folder's access ACL (Linux): where PostgreSQL's user gets its search bit.
ACL_XATTR = "system.posix_acl_access"


def acl_grants(path: Path) -> bool:
    """``path`` has an access ACL (given by :func:`~prmloop.store.auth.pg_auth.grant_traversal`): its group bits
    are the ACL's mask then, and must keep the search bit."""
    try:
        return bool(os.getxattr(path, ACL_XATTR))
    except OSError:
        return False


def secure_home(home: Path) -> Path:
    """Create ``home`` (mode 0700) or close an existing one to other users; returns it.

    When prmloop runs as root, PostgreSQL runs as ``pgserver`` and must traverse the home to its data
    folder: an ACL gives that user (and no one else) the search bit, and the mode keeps it (0710).
    """
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = home.stat()
    if st.st_uid != os.geteuid():
        return home  # not ours to change (a shared folder the user chose): its files are still 0600
    wanted = 0o700 | (0o010 if acl_grants(home) else 0)
    if stat.S_IMODE(st.st_mode) != wanted:
        home.chmod(wanted)
    return home


def private_files() -> None:
    """Everything this process (and its children) writes from now on is readable by its user only."""
    os.umask(0o077)


def _close_old_files(home: Path) -> None:
    """Strip group and other permissions from what an older prmloop left in ``home`` (its files were
    0644): done once, when the credentials file is first created. Folders of another owner (a
    PostgreSQL cluster's, owned by pgserver) are left as they are."""
    uid = os.geteuid()
    for root, dirs, files in os.walk(home):
        kept = []
        for name in [*dirs, *files]:
            path = Path(root) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if st.st_uid != uid or stat.S_ISLNK(st.st_mode):
                continue
            if name in dirs:
                kept.append(name)
            mode = stat.S_IMODE(st.st_mode)
            wanted = mode & 0o700 | (0o010 if stat.S_ISDIR(st.st_mode) and acl_grants(path) else 0)
            if mode != wanted:
                with contextlib.suppress(OSError):
                    path.chmod(wanted)
        dirs[:] = kept


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    with open(home / ".credentials.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CredentialsError(
            f"cannot read prmloop's credentials in {path} ({type(exc).__name__}: {exc}); restore the file, "
            "or remove it to generate new secrets (then restart every prmloop service and PostgreSQL)"
        ) from exc
    if not isinstance(found, dict):
        raise CredentialsError(f"{path} is not a JSON object: remove it to generate new secrets")
    return found


def _write(path: Path, secrets_: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(secrets_, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(tmp, 0o600)
    tmp.replace(path)


@dataclass(frozen=True)
class Credentials:
    """The secrets of one ``$PRMLOOP_HOME`` (see the module docstring)."""

    home: Path
    secrets: Mapping[str, Any]

    def postgres_password(self, role: str) -> str:
        if role not in ROLES:
            raise ValueError(f"unknown PostgreSQL role {role!r}; prmloop's roles are {', '.join(ROLES)}")
        return str(self.secrets["postgres"][role])

    @property
    def prefect_auth_string(self) -> str:
        return str(self.secrets["prefect_auth"])

    @property
    def engine_api_key(self) -> str:
        return str(self.secrets["engine_api_key"])

    @property
    def gateway_access_key_id(self) -> str:
        return str(self.secrets["gateway"]["access_key_id"])

    @property
    def gateway_secret_key(self) -> str:
        return str(self.secrets["gateway"]["secret_access_key"])

    @property
    def signing_key(self) -> bytes:
        return bytes.fromhex(str(self.secrets["signing_key"]))

    def passfile(self, role: str) -> Path:
        """A libpq password file holding ``role``'s password only (``$PRMLOOP_HOME/pgpass/<role>``, 0600):
        what ``passfile=`` in a conninfo, ``?passfile=`` in a URL or ``PGPASSFILE`` names."""
        password = self.postgres_password(role).replace("\\", "\\\\").replace(":", "\\:")
        line = f"*:*:*:{role}:{password}\n"
        folder = self.home / "pgpass"
        path = folder / role
        with contextlib.suppress(OSError):
            if path.read_text() == line:
                return path
        folder.mkdir(mode=0o700, exist_ok=True)
        tmp = folder / f".{role}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(line)
        tmp.replace(path)
        return path


_CACHE: dict[Path, tuple[tuple[int, int], Credentials]] = {}


def load_credentials(home: Path | None = None) -> Credentials:
    """The credentials of ``home`` (default ``$PRMLOOP_HOME``), generated on first use (see the module
    docstring). Raises :class:`CredentialsError` when the file cannot be read or written."""
    if home is None:
        from prmloop.store.settings import StateSettings

        home = StateSettings().home
    home = home.expanduser().absolute()
    path = home / CREDENTIALS_FILE
    with contextlib.suppress(OSError):
        st = path.stat()
        cached = _CACHE.get(home)
        if cached is not None and cached[0] == (st.st_ino, st.st_mtime_ns):
            return cached[1]
    try:
        secure_home(home)
        found = _read(path)
        if found is None or _complete(found) != found:
            with _locked(home):
                found = _read(path)  # another process may have written it while this one waited
                first = found is None
                complete = _complete(found or {})
                if complete != found:
                    _write(path, complete)
                    if first:
                        _close_old_files(home)
                found = complete
    except OSError as exc:
        raise CredentialsError(
            f"cannot create prmloop's credentials in {path} ({type(exc).__name__}: {exc}); "
            "PRMLOOP_HOME must be a folder this user can write"
        ) from exc
    credentials = Credentials(home, found)
    for role in ROLES:
        credentials.passfile(role)
    st = path.stat()
    _CACHE[home] = ((st.st_ino, st.st_mtime_ns), credentials)
    return credentials
