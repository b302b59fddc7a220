"""Tansu in a network namespace of its own: the half of the broker gate that lives inside it.

Run by :mod:`prmloop.flows.ops.broker_gate` as ``python -m prmloop.flows.ops.broker_ns``, with one end of a
``SOCK_SEQPACKET`` socket pair (``--control-fd``). It moves into a new network namespace (root: one
``unshare``; another user: a user namespace too, where the kernel allows unprivileged ones), brings
its loopback up, and starts Tansu there, listening on ``127.0.0.1:<tansu port>``: no process outside
the namespace can connect to it, whoever it runs as. The gate, outside, reaches Tansu through sockets
this process creates in the namespace and hands over (``SCM_RIGHTS``): the gate asks ``S``, it answers
``K`` with a fresh unconnected socket. With durable storage it also listens inside for Tansu's S3
requests and hands that listening socket over first (``3``), before Tansu starts and reads its
storage; the gate forwards them to the object gateway. ``R`` says Tansu is ready.

Where no namespace can be made (another platform, a container that forbids it), Tansu listens on a free
loopback port of the machine instead, and the ready message says why it is not private.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

from prmloop.flows.ops.broker import parent_death_signal

__all__ = ["enter_private_network", "main"]

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def _write(path: str, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)


def enter_private_network() -> str | None:
    """Move this (single-threaded) process into a new network namespace with its loopback up; returns
    None, or why it could not (then nothing changed)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux's ({sys.platform} has none)"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNET if uid == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        return f"unshare({'CLONE_NEWNET' if uid == 0 else 'CLONE_NEWUSER|CLONE_NEWNET'}) failed: {os.strerror(errno)}"
    try:
        if uid != 0:  # the same ids inside the user namespace as outside
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            request = struct.pack("16sH14x", b"lo", 0)
            current = struct.unpack("16sH14x", fcntl.ioctl(probe, _SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(probe, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", current | _IFF_UP))
    except OSError as exc:
        # Half made: this process is in a namespace without a working loopback. Nothing outside can
        # reach it, so the broker cannot serve: say so and stop (the gate reports it).
        raise SystemExit(f"the broker's network namespace has no loopback ({exc}); see the broker log") from exc
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Tansu in a private network namespace (the broker gate's half)")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--advertised", required=True, help="tcp://host:port clients are told to use (the gate's)")
    parser.add_argument("--s3", action="store_true", help="listen inside for Tansu's S3 requests (durable storage)")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("tansu", nargs=argparse.REMAINDER, help="-- then Tansu's command line, without listeners")
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    why_not = enter_private_network()
    port = 9092 if why_not is None else _free_port()
    s3: socket.socket | None = None
    env = dict(os.environ)
    if args.s3:
        s3 = socket.socket()
        s3.bind(("127.0.0.1", 0))
        s3.listen(64)
        env["AWS_ENDPOINT"] = f"http://127.0.0.1:{s3.getsockname()[1]}"
    # The listening socket first: Tansu reads and writes its storage while it starts.
    socket.send_fds(control, [b"3"], [s3.fileno()] if s3 is not None else [])
    url = f"tcp://127.0.0.1:{port}"
    tansu_argv = [a for a in args.tansu if a != "--"]
    tansu = subprocess.Popen(
        [*tansu_argv, "--listener-url", url, "--advertised-listener-url", args.advertised],
        env=env,
        preexec_fn=parent_death_signal(),  # noqa: PLW1509 - dies with this process, whatever kills it
    )
    signal.signal(signal.SIGTERM, lambda *_: tansu.terminate())
    deadline = time.monotonic() + args.timeout
    while not _listening(port):
        if tansu.poll() is not None:
            return tansu.returncode or 1
        if time.monotonic() > deadline:
            tansu.kill()
            return 1
        time.sleep(0.05)
    ready = json.dumps({"isolated": why_not is None, "why_not": why_not, "tansu_port": port}).encode()
    control.send(b"R" + ready)
    control.settimeout(0.5)
    while tansu.poll() is None:
        try:
            request = control.recv(16)
        except TimeoutError:
            continue
        except OSError:
            break
        if not request:  # the gate is gone
            break
        fresh = socket.socket()
        try:
            socket.send_fds(control, [b"K"], [fresh.fileno()])
        finally:
            fresh.close()
    if tansu.poll() is None:
        tansu.terminate()
        try:
            tansu.wait(timeout=10)
        except subprocess.TimeoutExpired:
            tansu.kill()
    return tansu.wait()


if __name__ == "__main__":
    sys.exit(main())
