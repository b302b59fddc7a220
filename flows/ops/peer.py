"""Who is at the other end of a loopback TCP connection: its owner's user id, from the kernel's table.

A TCP socket on 127.0.0.1 can be reached by every user of the machine. Linux lists every socket with
the user id that owns it (``/proc/net/tcp``, the ``uid`` column); for a connection between two local
sockets, the client's entry names its address as local and the server's as remote. So a server on
loopback can ask who connected and let in its own user only (and root, who may read its credentials
anyway): how prmloop keeps listeners that cannot authenticate (the embedded broker, Tansu; a
proxy in front of an authenticating server) reachable by this user alone.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import IO

__all__ = ["is_own_user", "loopback_peer_uid", "open_tcp_table"]


def _hex_address(host: str, port: int) -> str:
    """An IPv4 address and port as /proc/net/tcp writes them (the address in host byte order)."""
    packed = socket.inet_aton(host)
    return f"{struct.unpack('=I', packed)[0]:08X}:{port:04X}"


def open_tcp_table() -> IO[str]:
    """``/proc/net/tcp`` of this process's network namespace, kept open: read again (after a seek to 0)
    it lists that namespace's sockets even once the process has moved to another one."""
    return open("/proc/net/tcp")


def loopback_peer_uid(conn: socket.socket, table: IO[str] | None = None) -> int | None:
    """The user id owning the client end of the accepted IPv4 connection ``conn``, or None when the
    kernel's table does not list it (not loopback, or already closed)."""
    try:
        server_host, server_port = conn.getsockname()[:2]
        client_host, client_port = conn.getpeername()[:2]
    except OSError:
        return None
    client = _hex_address(client_host, client_port)
    server = _hex_address(server_host, server_port)
    own = table is None
    source = table if table is not None else open_tcp_table()
    try:
        source.seek(0)
        for line in source.read().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 7 and fields[1] == client and fields[2] == server:
                return int(fields[7])
    finally:
        if own:
            source.close()
    return None


def is_own_user(uid: int | None) -> bool:
    """``uid`` is this process's user, or root."""
    return uid is not None and uid in (os.geteuid(), 0)
