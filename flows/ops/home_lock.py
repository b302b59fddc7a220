"""One ``prmloop up`` at a time per home: a file lock in ``$PRMLOOP_HOME``.

``up`` looks at what runs and starts what does not; two at once both saw no sink and both started one
(``run/sink.json`` then named one of them, and ``down`` left the other running). The second now waits
for the first, saying who holds the lock, and then finds everything the first started running. The
lock is the kernel's (``flock``): a holder that dies lets go of it by itself.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prmloop.store.settings import StateSettings

__all__ = ["home_lock"]


@contextmanager
def home_lock(
    state: StateSettings,
    *,
    name: str = "up",
    command: str = "prmloop up",
    say: Callable[[str], None] = print,
    wait_s: float = 900.0,
) -> Iterator[None]:
    """Hold ``$PRMLOOP_HOME/<name>.lock`` for the block; wait (up to ``wait_s``) while another process
    (``command``, for the messages) holds it.

    Raises:
        TimeoutError: still held after ``wait_s``, naming the holder.
    """
    state.home.mkdir(parents=True, exist_ok=True)
    path = state.home / f"{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            say(f"another `{command}` (pid {holder}) is starting services in {state.home}: waiting for it")
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"another `{command}` (pid {holder}) still holds {path} after {wait_s:.0f} s: "
                            "wait for it, or stop it"
                        ) from None
                    time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor lets go of the lock
