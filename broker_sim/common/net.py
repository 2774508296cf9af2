"""Addresses and ports: what a server tells others to connect to, and a port to listen on later.

**Announced address.** The address a server tells others to connect to, as opposed to the one it binds.

A broker registers its address with the name servers, and clients, slaves and other groups' 5.x front ends
connect to what was registered. Bound to a wildcard (``--host 0.0.0.0``, the usual choice in a container)
that address would be ``0.0.0.0:port``, which no other machine can reach. RocketMQ separates the two
(``brokerIP1`` / ``brokerIP2`` are announced, the sockets bind every interface); so does broker_sim:
``announce_host`` is what is registered, and by default it is the bind host, or this machine's own address
when the bind host is a wildcard.

**A port to listen on later** (:func:`listen_port`): a child process's server, or a server that must restart
on the port it had. Asking the kernel for port 0 hands out a port from its *ephemeral* range — the range every
outgoing connection of the machine draws its local port from. Between choosing such a port and the server
binding it (or between a server's stop and its restart on the same port), a client's connection can take it,
and the server then fails with "address already in use" for as long as that connection lives: a cluster
started port by port saw exactly that, one broker's port taken by another broker's connection. A port
outside the ephemeral range is never taken that way.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from pathlib import Path

log = logging.getLogger("broker_sim.net")

#: bind hosts that mean "every interface" and so cannot be handed to a client
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
#: TEST-NET-1 (RFC 5737): only used to ask the kernel which local address routes outward; nothing is sent
_ROUTE_PROBE = ("192.0.2.1", 9)
#: the kernel's ephemeral port range: where outgoing connections take their local port
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default range, assumed where the file cannot be read
EPHEMERAL_DEFAULT = (32768, 60999)
#: listen_port stays above the ports services usually own (databases, brokers, mail: all below 10000)
LISTEN_FLOOR = 10_000
#: ports this process handed out already: two servers started in turn must not be told the same port
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def announce_host(bind_host: str, announce: str | None = None) -> str:
    """``announce`` when given; else ``bind_host`` unless it is a wildcard; else :func:`local_address`."""
    if announce:
        return announce
    if bind_host not in WILDCARD_HOSTS:
        return bind_host
    return local_address()


def local_address() -> str:
    """This machine's IPv4 address as other machines would reach it: the source address of its default
    route, else a non-loopback address its host name resolves to, else loopback (logged)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(_ROUTE_PROBE)  # a UDP connect only picks a route; no packet leaves
        routed: str = probe.getsockname()[0]
        if routed not in WILDCARD_HOSTS:
            return routed
    except OSError as exc:
        log.debug("no default route to learn the local address from: %s", exc)
    finally:
        probe.close()
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError as exc:
        log.debug("host name does not resolve: %s", exc)
        infos = []
    for *_, sockaddr in infos:
        host = str(sockaddr[0])
        if not host.startswith("127."):
            return host
    log.warning("no non-loopback address found; announcing 127.0.0.1 (pass an announce host)")
    return "127.0.0.1"


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range ``(low, high)``, both included (Linux; else the default)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return low, high


def listen_ranges(ephemeral: tuple[int, int]) -> list[range]:
    """Where :func:`listen_port` may choose: from :data:`LISTEN_FLOOR` up to the ephemeral range, and above
    it; only spans of at least 1000 ports (so a random choice rarely meets a taken one)."""
    low, high = ephemeral
    spans = [range(LISTEN_FLOOR, max(LISTEN_FLOOR, low)), range(max(LISTEN_FLOOR, high + 1), 65536)]
    return [r for r in spans if len(r) >= 1000]


def listen_port(host: str = "127.0.0.1", *, tries: int = 200) -> int:
    """A TCP port on ``host`` that is free now, outside the kernel's ephemeral range, and not handed out by
    this process before (see the module docstring). With no such span: the kernel's choice (port 0)."""
    spans = listen_ranges(ephemeral_range())
    for _ in range(tries if spans else 0):
        port = random.choice(random.choice(spans))
        with _handed_out_lock:
            if port in _handed_out:
                continue
            if _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (no ``SO_REUSEADDR``: as strict as any server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
