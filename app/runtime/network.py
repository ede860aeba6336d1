"""This host's network, as the rendezvous sees it: names, interfaces, routes and ports, each in bounded time.

    python -m app doctor          # runs these probes on every rank and prints what they found

Linux only (interfaces come from ``socket.if_nameindex``, the ``SIOCGIFADDR`` ioctl and
/proc/net). No packet leaves the host except the TCP connections of ``reach`` and ``reaches_self``.
"""

import fcntl
import ipaddress
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SIOCGIFADDR = 0x8915
"""ioctl: the IPv4 address of an interface (linux/sockios.h)."""
CONNECT_ATTEMPT_S = 2.0
"""Longest single connection attempt; a dropped SYN (firewall) costs at most this much per try."""
RETRY_S = 0.25
"""Pause between connection attempts while the other side is not listening yet."""


class Unresolved(Exception):
    """A host name that did not resolve (or not in time): the message says why."""


def resolve(host: str, timeout: float) -> list[str]:
    """The addresses of ``host`` in getaddrinfo's order, within ``timeout`` seconds (getaddrinfo itself can block).

    The lookup runs in a daemon thread: a stuck resolver is abandoned, not waited for.
    """
    result: dict = {}

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            result["addresses"] = list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))
        except OSError as error:
            result["error"] = error.strerror or str(error)

    thread = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Unresolved(f"no answer from the resolver within {timeout:g}s")
    if "error" in result:
        raise Unresolved(result["error"])
    return result["addresses"]


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8 and ::1."""
    return ipaddress.ip_address(address).is_loopback


def _ipv4(name: str) -> list[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address on it
            return []
    return [socket.inet_ntoa(packed[20:24])]


def _ipv6() -> dict[str, list[str]]:
    """Interface -> IPv6 addresses, from /proc/net/if_inet6 (empty without IPv6)."""
    found: dict[str, list[str]] = {}
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) == 6:
            found.setdefault(fields[5], []).append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def interfaces() -> dict[str, list[str]]:
    """Every interface of this host and its addresses (IPv4 first), e.g. ``{'lo': ['127.0.0.1', '::1'], ...}``."""
    v6 = _ipv6()
    return {name: _ipv4(name) + v6.get(name, []) for _, name in socket.if_nameindex()}


def route_source(address: str, port: int) -> str:
    """The local address this host would use to reach ``address`` (a UDP connect: routing only, nothing is sent)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect((address, port))
        return str(sock.getsockname()[0]).split("%")[0]


def default_route_interface() -> str | None:
    """The interface of the IPv4 default route (/proc/net/route), if there is one."""
    try:
        rows = [line.split() for line in Path("/proc/net/route").read_text().splitlines()[1:]]
    except OSError:
        return None
    return next((row[0] for row in rows if len(row) > 7 and row[1] == "00000000" and row[7] == "00000000"), None)


def bind(port: int) -> socket.socket:
    """A listening socket on ``port`` of every address, as the rendezvous store binds it (raises OSError if taken)."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


@dataclass(frozen=True)
class Reached:
    """The outcome of trying to connect."""

    ok: bool
    seconds: float
    why: str = ""
    """The last error, when not ok."""


def reach(address: str, port: int, timeout: float) -> Reached:
    """Connect to ``address:port``, retrying until ``timeout`` seconds have passed (the other side may start late)."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((address, port), timeout=max(0.05, min(CONNECT_ATTEMPT_S, left))):
                return Reached(True, time.monotonic() - start)
        except OSError as error:
            why = error.strerror or str(error) or type(error).__name__
        if time.monotonic() + RETRY_S >= deadline:
            return Reached(False, time.monotonic() - start, why)
        time.sleep(RETRY_S)


def reaches_self(server: socket.socket, address: str, port: int, timeout: float) -> Reached:
    """Whether ``address:port`` leads to ``server`` (listening here): a token sent to it must arrive on it."""
    token = os.urandom(16)
    start = time.monotonic()
    try:
        client = socket.create_connection((address, port), timeout=timeout)
    except OSError as error:
        return Reached(False, time.monotonic() - start, error.strerror or str(error))
    peer = None
    try:
        client.sendall(token)
        peer = _accept_token(server, token, start + timeout)
    finally:
        client.close()  # the client closes first: TIME_WAIT stays on its own port, not on the rendezvous port
        if peer is not None:
            peer.close()
    if peer is not None:
        return Reached(True, time.monotonic() - start)
    return Reached(False, time.monotonic() - start, "connected, but to another host's listener on that port")


def _accept_token(server: socket.socket, token: bytes, deadline: float) -> socket.socket | None:
    """The connection on ``server`` that brings ``token``, accepted before ``deadline`` (other ranks connect too)."""
    while time.monotonic() < deadline:
        server.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            peer, _ = server.accept()
        except OSError:  # timed out
            return None
        peer.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if peer.recv(len(token), socket.MSG_WAITALL) == token:
                return peer
        except OSError:
            pass
        peer.close()
    return None
