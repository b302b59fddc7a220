"""Flow runs a dead Prefect worker left behind, found and retried by ``prmloop up --cluster``.

A process worker runs each flow run in a child process and records that process's pid on the run
(``infrastructure_pid``). SIGKILLing the worker takes the flow run's process with it (seen here: the
workspace supervisor exits with its worker), but the server is never told: the run stays ``PENDING``
or ``RUNNING`` for good, and Prefect marks it crashed only from missed flow-run heartbeats, which are
off by default. On one machine the pid says it all: a run that is pending or running on a pid that no
longer runs Prefect is marked ``CRASHED`` (with why) and scheduled again, as ``prefect flow-run retry``
does (a forced ``SCHEDULED`` state), so a worker of its pool runs it again (its ``run_count`` grows).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

__all__ = ["orphaned_runs", "retry_orphaned_runs"]

_ACTIVE = ("PENDING", "RUNNING")


def _runs_prefect(pid: int) -> bool:
    """The pid is a live process of Prefect's (not a zombie, not a recycled pid of something else)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return not stat.split(") ", 1)[-1].startswith("Z") and b"prefect" in cmdline


def _auth(auth_string: str | None) -> tuple[str, str] | None:
    """The server's basic-auth string (``user:password``; every server prmloop starts asks for one)."""
    if not auth_string:
        return None
    user, _, password = auth_string.partition(":")
    return user, password


def orphaned_runs(api_url: str, *, auth: str | None = None, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Flow runs of deployments, pending or running on this machine in a process that is gone."""
    body = {"flow_runs": {"state": {"type": {"any_": list(_ACTIVE)}}}, "limit": 200}
    response = httpx.post(f"{api_url}/flow_runs/filter", json=body, auth=_auth(auth), timeout=timeout_s)
    response.raise_for_status()
    orphans = []
    for run in response.json():
        pid = str(run.get("infrastructure_pid") or "")
        if run.get("deployment_id") and pid.isdigit() and not _runs_prefect(int(pid)):
            orphans.append(run)
    return orphans


def retry_orphaned_runs(api_url: str, *, auth: str | None = None, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Mark each orphaned run ``CRASHED`` and schedule it again; returns ``{id, name, pid, was}`` of each."""
    retried = []
    with httpx.Client(base_url=api_url, auth=_auth(auth), timeout=timeout_s) as http:
        for run in orphaned_runs(api_url, auth=auth, timeout_s=timeout_s):
            pid, was = run["infrastructure_pid"], run["state_type"]
            crashed = {
                "type": "CRASHED",
                "name": "Crashed",
                "message": f"its process (pid {pid}) is gone: its worker died while the run was {was.lower()}",
            }
            now = datetime.now(UTC).isoformat()
            scheduled = {
                "type": "SCHEDULED",
                "name": "Scheduled",
                "message": "retried by prmloop up --cluster after its worker died",
                "state_details": {"scheduled_time": now},
            }
            for state in (crashed, scheduled):
                done = http.post(f"/flow_runs/{run['id']}/set_state", json={"state": state, "force": True})
                done.raise_for_status()
            retried.append({"id": run["id"], "name": run["name"], "pid": pid, "was": was})
    return retried
