"""Every PostgreSQL prmloop runs asks every role for its password (issue 39, point 1).

Reproduced as the issue found it: ``prmloop postgres`` (the cluster's database server) wrote
``pg_hba.conf`` with ``trust``, and another local user ran, with no password,
``psql -h 127.0.0.1 -U postgres -c "select pg_read_file('/etc/hostname'); COPY (select 1) TO PROGRAM ..."``:
it read host files and ran commands as the server's user. Real components: Debian's PostgreSQL run by
``prmloop postgres``, pgserver's for a local lake's catalog, psql as the user ``nobody``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from prmloop.flows.ops.postgres import postgres_bin_dir, wait_ready
from prmloop.store.auth.credentials import ADMIN_ROLE, READER_ROLE, ROLES, SINK_ROLE, load_credentials
from prmloop.store.auth.pg_auth import HBA
from prmloop.store.ports import free_port

PSQL = str(postgres_bin_dir() / "psql")


@dataclass
class Server:
    home: Path
    port: int
    process: subprocess.Popen[bytes]

    def psql(self, sql: str, *, role: str | None, database: str = "postgres") -> subprocess.CompletedProcess[str]:
        """``sql`` as ``role`` with its passfile (``role=None``: as ``postgres`` with no password)."""
        env = {**os.environ, "PGPASSFILE": "/nonexistent"}
        if role is not None:
            env["PGPASSFILE"] = str(load_credentials(self.home).passfile(role))
        argv = [PSQL, "-X", "-w", "-t", "-A", "-h", "127.0.0.1", "-p", str(self.port)]
        argv += ["-U", role or ADMIN_ROLE, "-d", database, "-c", sql]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def _serve(home: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PRMLOOP_HOME": str(home)}
    argv = [sys.executable, "-m", "prmloop.flows.cli", "postgres", "--port", str(port)]
    argv += ["--database", "prmloop_lake", "--database", "prefect"]
    return subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _ready(server: Server) -> None:
    wait_ready("127.0.0.1", server.port, 90, process=server.process)  # type: ignore[arg-type]
    for _ in range(300):  # the server sets up its roles right after it answers
        if server.psql("SELECT 1", role=SINK_ROLE, database="prmloop_lake").returncode == 0:
            return
        import time

        time.sleep(0.2)
    raise AssertionError("the sinks' role never could log in to prmloop_lake")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``prmloop postgres`` in a fresh home lying in a folder every user may enter."""
    import shutil
    import tempfile

    outer = Path(tempfile.mkdtemp(prefix="prmloop-open-", dir="/tmp"))
    outer.chmod(0o755)
    home, port = outer / "home", free_port()
    running = Server(home, port, _serve(home, port))
    try:
        _ready(running)
        yield running
    finally:
        _stop(running.process)
        shutil.rmtree(outer, ignore_errors=True)


def test_another_user_can_neither_read_host_files_nor_run_programs_through_it(
    server: Server, as_nobody: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    marker = Path("/tmp") / f"prmloop-issue39-{os.getpid()}"
    attack = f"select pg_read_file('/etc/hostname'); COPY (select 1) TO PROGRAM 'id > {marker}'"
    for user in ("postgres", SINK_ROLE, READER_ROLE):
        done = as_nobody([PSQL, "-X", "-w", "-h", "127.0.0.1", "-p", str(server.port), "-U", user, "-c", attack])
        assert done.returncode != 0, done.stdout
        assert "no password supplied" in done.stderr, done.stderr
        guessed = as_nobody(
            [PSQL, "-X", "-w", f"host=127.0.0.1 port={server.port} user={user} password=prmloop", "-c", attack]
        )
        assert "password authentication failed" in guessed.stderr, guessed.stderr
    assert not marker.exists()


def test_no_role_gets_in_without_its_password_over_tcp_or_the_socket(server: Server) -> None:
    assert not [line for line in HBA.splitlines() if "trust" in line and not line.startswith("#")]
    assert (server.home / "postgres" / "pg_hba.conf").read_text() == HBA
    refused = server.psql("SELECT 1", role=None)
    assert refused.returncode != 0 and "no password supplied" in refused.stderr
    socket = subprocess.run(
        [
            PSQL,
            "-X",
            "-w",
            "-h",
            str(server.home / "postgres"),
            "-p",
            str(server.port),
            "-U",
            ADMIN_ROLE,
            "-c",
            "SELECT 1",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PGPASSFILE": "/nonexistent"},
        timeout=60,
        check=False,
    )
    assert socket.returncode != 0 and "no password supplied" in socket.stderr, socket.stderr


def test_only_the_administration_role_is_superuser_and_the_sinks_role_cannot_reach_the_host(server: Server) -> None:
    roles = server.psql(
        "SELECT rolname, rolsuper FROM pg_roles WHERE rolname NOT LIKE 'pg\\_%' ORDER BY 1", role=ADMIN_ROLE
    )
    assert roles.returncode == 0, roles.stderr
    found = dict(line.split("|") for line in roles.stdout.split())
    assert found == {role: "t" if role == ADMIN_ROLE else "f" for role in ROLES}
    as_sink = server.psql("SELECT pg_read_file('/etc/hostname')", role=SINK_ROLE, database="prmloop_lake")
    assert "permission denied for function pg_read_file" in as_sink.stderr
    program = server.psql("COPY (SELECT 1) TO PROGRAM 'id'", role=SINK_ROLE, database="prmloop_lake")
    assert "pg_execute_server_program" in program.stderr
    assert server.psql("CREATE TABLE t (x int)", role=SINK_ROLE, database="prmloop_lake").returncode == 0
    assert server.psql("SELECT count(*) FROM t", role=READER_ROLE, database="prmloop_lake").stdout.strip() == "0"
    written = server.psql("INSERT INTO t VALUES (1)", role=READER_ROLE, database="prmloop_lake")
    assert "read-only transaction" in written.stderr
    assert "permission denied" in server.psql("SELECT 1", role=READER_ROLE, database="prefect").stderr


def test_a_cluster_an_older_prmloop_made_with_trust_asks_for_passwords_once_restarted(tmp_path: Path) -> None:
    from prmloop.flows.ops.postgres import _as_user, _demote

    home, port = tmp_path / "home", free_port()
    data = home / "postgres"
    data.mkdir(parents=True)
    ids = _as_user()
    if ids is not None:
        os.chown(data, *ids)
        for folder in (home, tmp_path, tmp_path.parent, tmp_path.parent.parent):
            folder.chmod(folder.stat().st_mode | 0o011)
    made = subprocess.run(  # what `prmloop postgres` did before
        [str(postgres_bin_dir() / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"],
        capture_output=True,
        preexec_fn=_demote(ids),
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert "trust" in (data / "pg_hba.conf").read_text()
    server = Server(home, port, _serve(home, port))
    try:
        _ready(server)
        assert (data / "pg_hba.conf").read_text() == HBA
        assert "no password supplied" in server.psql("SELECT 1", role=None).stderr
        assert server.psql("SELECT current_user", role=ADMIN_ROLE).stdout.strip() == ADMIN_ROLE
    finally:
        _stop(server.process)


def test_a_local_lakes_pgserver_catalog_asks_for_passwords_and_its_sinks_are_not_superusers(
    open_dir: Path, as_nobody: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    from prmloop.store.tables.lake import parse_lake
    from prmloop.store.tables.lake_catalog import conninfo, lake_credentials, release_local_postgres

    lake = parse_lake(f"ducklake:pgserver:{open_dir}/lake", default_data_path=open_dir / "data")
    writer = conninfo(lake)
    try:
        catalog = open_dir / "lake" / "catalog"
        assert (catalog / "pg_hba.conf").read_text() == HBA
        assert f"user={SINK_ROLE}" in writer and "passfile=" in writer and "password" not in writer
        socket = f"host={catalog} dbname=postgres user={ADMIN_ROLE}"
        bare = subprocess.run(
            [PSQL, "-X", "-w", socket, "-c", "SELECT 1"],
            capture_output=True,
            text=True,
            env={**os.environ, "PGPASSFILE": "/nonexistent"},
            timeout=60,
            check=False,
        )
        assert "no password supplied" in bare.stderr, bare.stderr
        as_sink = subprocess.run(
            [PSQL, "-X", "-w", "-t", "-A", writer, "-c", "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert as_sink.stdout.strip() == "f", as_sink.stderr
        assert oct(lake_credentials(open_dir / "lake").home.stat().st_mode & 0o777) in ("0o700", "0o710")
        stranger = as_nobody([PSQL, "-X", "-w", socket, "-c", "SELECT pg_read_file('/etc/hostname')"])
        assert stranger.returncode != 0
        assert "Permission denied" in stranger.stderr or "no password supplied" in stranger.stderr, stranger.stderr
    finally:
        release_local_postgres(lake.catalog.partition(":")[2])
