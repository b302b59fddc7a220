"""The credentials file (issue 39): generated on first use, private, the same for every process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prmloop.store.auth.credentials import CREDENTIALS_FILE, ROLES, CredentialsError, load_credentials


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_use_writes_every_secret_into_a_private_file_in_a_closed_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    credentials = load_credentials(home)
    assert _mode(home) == 0o700
    assert _mode(home / CREDENTIALS_FILE) == 0o600
    passwords = {role: credentials.postgres_password(role) for role in ROLES}
    secrets = [
        *passwords.values(),
        credentials.prefect_auth_string,
        credentials.engine_api_key,
        credentials.gateway_secret_key,
        credentials.signing_key.hex(),
    ]
    assert all(len(s) >= 24 for s in secrets)
    assert len(set(secrets)) == len(secrets)  # no secret is another's
    assert credentials.prefect_auth_string.startswith("prmloop:")
    assert load_credentials(home) == credentials  # read back, not generated again


def test_a_second_home_gets_secrets_of_its_own(tmp_path: Path) -> None:
    one, two = load_credentials(tmp_path / "a"), load_credentials(tmp_path / "b")
    assert one.engine_api_key != two.engine_api_key
    assert one.postgres_password("postgres") != two.postgres_password("postgres")


_READER = """
import json, sys, time
from pathlib import Path
start = Path(sys.argv[2])
while not start.exists():
    time.sleep(0.001)
from prmloop.store.auth.credentials import load_credentials
print(json.dumps(dict(load_credentials(Path(sys.argv[1])).secrets)))
"""


def test_processes_asking_at_once_all_get_the_same_secrets(tmp_path: Path) -> None:
    home, start = tmp_path / "home", tmp_path / "go"
    readers = [
        subprocess.Popen([sys.executable, "-c", _READER, str(home), str(start)], stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    time.sleep(1.5)  # every reader has imported and waits for the start signal
    start.touch()
    outputs = [json.loads(reader.communicate(timeout=60)[0]) for reader in readers]
    assert all(output == outputs[0] for output in outputs)
    assert json.loads((home / CREDENTIALS_FILE).read_text()) == outputs[0]


def test_a_secret_missing_from_an_older_file_is_added_and_the_others_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / CREDENTIALS_FILE).write_text(json.dumps({"engine_api_key": "kept-as-it-was-by-an-older-prmloop"}))
    credentials = load_credentials(home)
    assert credentials.engine_api_key == "kept-as-it-was-by-an-older-prmloop"
    assert len(credentials.postgres_password("prmloop_sink")) >= 24
    assert _mode(home / CREDENTIALS_FILE) == 0o600


def test_an_unreadable_credentials_file_is_one_line_naming_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / CREDENTIALS_FILE).write_text("{not json")
    with pytest.raises(CredentialsError, match=r"credentials\.json.*remove it to generate new secrets"):
        load_credentials(home)


def test_each_role_has_a_passfile_of_its_own_readable_by_the_user_only(tmp_path: Path) -> None:
    credentials = load_credentials(tmp_path / "home")
    sink = credentials.passfile("prmloop_sink")
    reader = credentials.passfile("prmloop_reader")
    assert sink.read_text() == f"*:*:*:prmloop_sink:{credentials.postgres_password('prmloop_sink')}\n"
    assert credentials.postgres_password("prmloop_sink") not in reader.read_text()
    assert _mode(sink) == 0o600 and _mode(sink.parent) == 0o700


def test_an_old_world_readable_home_is_closed_at_first_use(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    home.chmod(0o755)
    (home / "logs").chmod(0o755)
    (home / "prmloop.duckdb").write_bytes(b"x")
    (home / "logs" / "sink.log").write_text("x")
    for path in (home / "prmloop.duckdb", home / "logs" / "sink.log"):
        path.chmod(0o644)
    load_credentials(home)
    assert _mode(home) == 0o700
    assert _mode(home / "logs") == 0o700
    assert _mode(home / "prmloop.duckdb") == 0o600
    assert _mode(home / "logs" / "sink.log") == 0o600


def test_the_user_nobody_cannot_read_the_credentials(tmp_path: Path, open_dir: Path, as_nobody) -> None:  # type: ignore[no-untyped-def]
    home = open_dir / "home"
    load_credentials(home)
    read = as_nobody(["cat", str(home / CREDENTIALS_FILE)])
    assert read.returncode != 0 and "Permission denied" in read.stderr
    assert os.access(home / CREDENTIALS_FILE, os.R_OK)  # its own user can
