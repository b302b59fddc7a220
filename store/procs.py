"""Whether a process of this machine still runs, for the records that name one by pid (``broker.json``,
the followers' links, the outbox's segments)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["pid_running"]


def pid_running(pid: int) -> bool:
    """``pid`` exists and has not exited: another user's process counts as running, a zombie waiting for
    its reaper does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
