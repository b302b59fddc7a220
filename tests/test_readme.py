"""The README's first screen tells a new user what the two commands need and how long they take."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _first_screen() -> str:
    """From the "two commands" heading to the commands themselves."""
    return README.read_text().split("## The two commands", 1)[1].split("```", 1)[0]


def test_the_first_screen_names_the_shared_folder_the_timings_and_chromium() -> None:
    """Seen: nothing said that `../shared` must sit beside the clone, how long `make test` runs on two
    cores, or that `prmloop screenshots` needs Debian's chromium."""
    text = " ".join(_first_screen().split())
    assert "`../shared`" in text and "PRMLOOP_DATA_DIR" in text
    assert re.search(r"`make test` takes about \d+ minutes", text)
    assert re.search(r"`make demo` about \d+ minutes", text)
    assert "2 cores" in text
    assert "`prmloop screenshots`" in text and "apt-get install chromium" in text
