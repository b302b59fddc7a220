"""``prmloop run``: the loop as a stream (:mod:`prmloop.flows.loop.driver`)."""

from __future__ import annotations

import json

import typer

from prmloop.flows.cli.app import app, print_error
from prmloop.flows.cli.options import settings_command
from prmloop.flows.loop.driver import LoopError, LoopSettings
from prmloop.store.settings import StateSettings


@settings_command(app, LoopSettings, name="run")
def run(settings: LoopSettings) -> None:
    """The loop as a stream: every service at once on one engine (`prmloop up` starts them), new questions
    probed and sampled whenever the annotator's backlog runs short, the ensemble PRM retrained as accepted
    labels arrive (a Prefect flow run each; the selector and the prioritizer switch to a promoted one),
    the aggregation calibrated on its schedule. A live view on a terminal, a progress line every 30 s
    elsewhere; runs until Ctrl-C (or --minutes), then stops cleanly and prints the learning curve and one
    JSON line of figures. The broker, the sink and Prefect keep running (`prmloop down` stops them);
    libraries' output goes to $PRMLOOP_HOME/logs/loop.log."""
    from prmloop.flows.loop.terminal import Terminal, finish, leave, run_session

    home = StateSettings().home
    term = Terminal(home / "logs" / "loop.log")
    try:
        loop, result = run_session(settings, home, term=term)
    except LoopError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None
    finish(loop, result, term)
    term.say(json.dumps({k: v for k, v in result.items() if k != "rss_mib"}, default=str))
    (home / "loop").mkdir(parents=True, exist_ok=True)
    (home / "loop" / "last-run.json").write_text(json.dumps(result, default=str))
    leave(loop)
