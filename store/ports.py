"""Ports on this host: one nobody listens on, and whether somebody does."""

from __future__ import annotations

import contextlib
import socket

__all__ = ["free_port", "port_open"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (tests never use fixed ports: leftovers may hold them)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Something listens at ``host:port`` (a loopback connect to itself, TCP's self-connect, does not count)."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout) as conn:
        return bool(conn.getsockname() != conn.getpeername())
    return False
