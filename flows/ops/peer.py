"""Who is at the other end of a loopback TCP connection: its owner's user id, from the kernel's table.

A TCP socket on 127.0.0.1 can be reached by every user of the machine. Linux lists every socket with
the user id that owns it (``/proc/net/tcp``, the ``uid`` column); for a connection between two local
sockets, the client's entry names its address as local and the server's as remote. So a server on
loopback can ask who connected and let in its own user only (and root, who may read its credentials
anyway): how prmloop keeps listeners that cannot authenticate (the embedded broker, Tansu; a
proxy in front of an authenticating server) reachable by this user alone.

Asked per socket: the kernel's socket diagnostics (netlink ``NETLINK_SOCK_DIAG``, one
``inet_diag_req_v2`` naming the connection's exact addresses and ports, answered with that one socket's
``idiag_uid``) cost the same however many sockets the machine has. Reading ``/proc/net/tcp`` costs
its whole length, which another user grows at will (a flood's own TIME_WAIT entries took it from 524
lines to 2,393, issue 54): it is the fallback only where netlink is not available.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from typing import IO

__all__ = ["PeerLookup", "is_own_user", "loopback_peer_uid", "open_sock_diag", "open_tcp_table", "sock_diag_uid"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_REQUEST = struct.Struct("=BBBBI")  # inet_diag_req_v2: family, protocol, extensions, pad, states
_SOCKID = struct.Struct("!HH16s16s")  # inet_diag_sockid: source port, destination port, addresses (network order)
_SOCKID_TAIL = struct.Struct("=III")  # interface, cookie (INET_DIAG_NOCOOKIE: both halves all ones)
_UID_AT = _NLMSG_HEADER.size + 4 + 48 + 12  # inet_diag_msg: 4 bytes, the sockid, expires/rqueue/wqueue, then uid
_NO_COOKIE = 0xFFFFFFFF


def open_sock_diag() -> socket.socket | None:
    """A netlink socket for the kernel's socket diagnostics of this network namespace (it stays bound
    to the namespace it was made in), or None where the kernel or the sandbox offers none."""
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    nl.settimeout(1.0)  # the kernel answers in the send itself; never wait long on it
    return nl


def sock_diag_uid(nl: socket.socket, client: tuple[str, int], server: tuple[str, int], seq: int = 1) -> int | None:
    """The user id owning the TCP socket whose local end is ``client`` and remote end ``server``
    (IPv4), asked of the kernel for that socket alone; None when it lists no such socket. OSError
    when netlink itself fails (the caller falls back)."""
    sockid = _SOCKID.pack(
        client[1], server[1], socket.inet_aton(client[0]) + bytes(12), socket.inet_aton(server[0]) + bytes(12)
    ) + _SOCKID_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)
    request = _REQUEST.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    nl.sendto(
        _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq, 0) + request,
        (0, 0),
    )
    while True:
        data = nl.recv(65536)
        if len(data) < _NLMSG_HEADER.size:
            raise OSError(errno.EPROTO, "a short netlink answer")
        _, kind, _, answered, _ = _NLMSG_HEADER.unpack_from(data)
        if answered != seq:
            continue  # an answer to an earlier request that timed out
        if kind == _NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, _NLMSG_HEADER.size)
            if -code == errno.ENOENT:
                return None
            raise OSError(-code, os.strerror(-code))
        if kind != _SOCK_DIAG_BY_FAMILY or len(data) < _UID_AT + 4:
            raise OSError(errno.EPROTO, f"an unexpected netlink answer (type {kind})")
        return int(struct.unpack_from("=I", data, _UID_AT)[0])


class PeerLookup:
    """Who connected, asked per socket: netlink sock_diag where the kernel has it (``netlink`` True),
    else this namespace's ``/proc/net/tcp`` (kept open, read under a lock: one reader at a time).

    Made before the process (or its children) moves to another network namespace: both keep answering
    for the namespace they were opened in."""

    def __init__(self, *, netlink: bool = True) -> None:
        self._nl = open_sock_diag() if netlink else None
        self._table = open_tcp_table()
        self._lock = threading.Lock()
        self._seq = 0

    @property
    def netlink(self) -> bool:
        return self._nl is not None

    def uid(self, conn: socket.socket) -> int | None:
        """The user id owning the client end of the accepted IPv4 connection ``conn`` (None: not listed)."""
        try:
            server = conn.getsockname()[:2]
            client = conn.getpeername()[:2]
        except OSError:
            return None
        with self._lock:
            if self._nl is not None:
                self._seq = (self._seq + 1) & 0xFFFFFFFF
                try:
                    return sock_diag_uid(self._nl, client, server, self._seq)
                except OSError:
                    self._nl.close()
                    self._nl = None  # from now on the table: slower, still right
            return loopback_peer_uid(conn, self._table)

    def close(self) -> None:
        if self._nl is not None:
            self._nl.close()
        self._table.close()


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
    kernel does not list it (not loopback, or already closed). Without ``table``: asked of netlink
    sock_diag for that socket alone, where it is available; with one (or without netlink), the
    whole table is read."""
    try:
        server_host, server_port = conn.getsockname()[:2]
        client_host, client_port = conn.getpeername()[:2]
    except OSError:
        return None
    if table is None:
        nl = open_sock_diag()
        if nl is not None:
            try:
                return sock_diag_uid(nl, (client_host, client_port), (server_host, server_port))
            except OSError:
                pass
            finally:
                nl.close()
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
