"""Every Prefect server prmloop starts asks for the credentials' auth string (issue 39, point 4).

Reproduced as the issue found it: the server ``prmloop up`` starts answered anyone, so another local
user could list, start or cancel the loop's flow runs. Real components: ``prmloop up --only prefect``
(a real Prefect 3.8.8 server), the ephemeral API a flow run starts, requests as the user ``nobody``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from cli_process import prmloop_cli

from prmloop.consumers.sink import events_to_arrow
from prmloop.flows.lab.bench.synthetic import synthetic_events
from prmloop.flows.ops.prefect_home import isolate_prefect_state
from prmloop.store.auth.credentials import load_credentials
from prmloop.store.kafka.runtime import ConsumedEvent
from prmloop.store.tables.duck import DuckEventStore

_prmloop = prmloop_cli


_STRANGER = """
import sys, urllib.request, urllib.error
headers = {"content-type": "application/json"}
request = urllib.request.Request(sys.argv[1] + "/flow_runs/filter", data=b"{}", headers=headers)
try:
    print(urllib.request.urlopen(request, timeout=30).status)
except urllib.error.HTTPError as error:
    print(error.code)
"""


@pytest.mark.slow
def test_the_stacks_prefect_server_answers_only_with_the_auth_string(
    open_dir: Path, as_nobody: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    home = open_dir / "home"
    try:
        up = _prmloop(home, "up", "--only", "prefect")
        assert up.returncode == 0, up.stderr
        api = json.loads(up.stdout)["running"]["prefect"]["url"]
        auth = load_credentials(home).prefect_auth_string
        assert httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).status_code == 401
        wrong = {"Authorization": "Basic " + base64.b64encode(b"prmloop:guess").decode()}
        assert httpx.post(f"{api}/flow_runs/filter", json={}, headers=wrong, timeout=30).status_code == 401
        right = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}
        assert httpx.post(f"{api}/flow_runs/filter", json={}, headers=right, timeout=30).status_code == 200
        assert as_nobody(["python3", "-c", _STRANGER, api]).stdout.strip() == "401"
        assert httpx.get(f"{api}/health", timeout=30).status_code == 200  # probes need no login
        record = json.loads((home / "run" / "prefect.json").read_text())
        assert auth not in " ".join(record["argv"])  # the secret is in its environment, not its argv
    finally:
        _prmloop(home, "down")


def test_prmloop_processes_give_prefect_the_auth_string_for_server_and_client(tmp_path: Path) -> None:
    auth = load_credentials(tmp_path).prefect_auth_string
    saved = {k: os.environ.pop(k, None) for k in ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING")}
    try:
        with isolate_prefect_state(tmp_path) as path:
            if path is None:
                pytest.skip("PREFECT_HOME or PREFECT_API_URL was set before the suite: prmloop leaves Prefect alone")
            from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_SERVER_API_AUTH_STRING

            assert PREFECT_SERVER_API_AUTH_STRING.value() == auth
            assert PREFECT_API_AUTH_STRING.value() == auth
    finally:
        for key, value in saved.items():
            if value is not None:
                os.environ[key] = value


@pytest.mark.slow
def test_a_flow_run_on_the_ephemeral_api_works_with_auth_on_both_sides(tmp_path: Path) -> None:
    """No server runs: the flow's ephemeral API is started with the auth string, and its client sends it."""
    store = DuckEventStore(tmp_path / "prmloop.duckdb")
    events = synthetic_events(40, k=2, seed=3)
    store.write_batch(events_to_arrow([ConsumedEvent(e, "t", 0, i, 0) for i, e in enumerate(events)]), [("t", 0, 40)])
    store.close()
    ran = _prmloop(tmp_path / "home", "monitor", "--db", str(store.path), timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
