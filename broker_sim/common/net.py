"""The address a server tells others to connect to, as opposed to the one it binds.

A broker registers its address with the name servers, and clients, slaves and other groups' 5.x front ends
connect to what was registered. Bound to a wildcard (``--host 0.0.0.0``, the usual choice in a container)
that address would be ``0.0.0.0:port``, which no other machine can reach. RocketMQ separates the two
(``brokerIP1`` / ``brokerIP2`` are announced, the sockets bind every interface); so does broker_sim:
``announce_host`` is what is registered, and by default it is the bind host, or this machine's own address
when the bind host is a wildcard."""

from __future__ import annotations

import logging
import socket

log = logging.getLogger("broker_sim.net")

#: bind hosts that mean "every interface" and so cannot be handed to a client
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
#: TEST-NET-1 (RFC 5737): only used to ask the kernel which local address routes outward; nothing is sent
_ROUTE_PROBE = ("192.0.2.1", 9)


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
