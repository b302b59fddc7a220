"""Prefect's state is kept under $PRMLOOP_HOME, not in the ~/.prefect every other Prefect run shares."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_PROBE = """
import sys
from pathlib import Path
from prmloop.flows.ops.prefect_home import isolate_prefect_state
assert "prefect" not in sys.modules
with isolate_prefect_state(Path(sys.argv[1])) as where:
    from prefect.settings import get_current_settings
    settings = get_current_settings()
    print(where, settings.home, settings.server.ephemeral.startup_timeout_seconds)
"""


def _run(home: Path, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(home)],
        check=False,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_prefect_state_goes_under_the_prmloop_home(tmp_path: Path) -> None:
    where, home, startup = _run(tmp_path)
    assert where == home == str(tmp_path / "prefect")
    assert float(startup) >= 120


def test_a_user_choice_of_prefect_home_is_kept(tmp_path: Path) -> None:
    where, home, _ = _run(tmp_path, PREFECT_HOME=str(tmp_path / "mine"))
    assert where == "None" and home == str(tmp_path / "mine")


def test_once_prefect_is_imported_temporary_settings_apply(tmp_path: Path) -> None:
    import prefect  # noqa: F401
    from prefect.settings import get_current_settings

    from prmloop.flows.ops.prefect_home import USER_CHOSE_PREFECT, isolate_prefect_state

    before = get_current_settings().home
    with isolate_prefect_state(tmp_path) as where:
        if USER_CHOSE_PREFECT:
            assert where is None
        else:
            assert where == tmp_path / "prefect" and get_current_settings().home == where
    assert get_current_settings().home == before


def test_prefect_cli_runs_without_a_script_beside_python(tmp_path: Path) -> None:
    """Prefect's command line is this interpreter's ``-m prefect``: it runs where ``pip install
    --target`` put no ``prefect`` script beside ``python`` (a GPU node's bench lost its server so)."""
    from importlib.metadata import version

    from prmloop.flows.ops.prefect_home import prefect_cli

    argv = prefect_cli("version")
    assert argv[:3] == [sys.executable, "-m", "prefect"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    done = subprocess.run(
        argv, check=False, env={**clean, "PREFECT_HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-800:]
    assert version("prefect") in done.stdout
