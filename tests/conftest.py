"""Shared fixtures: real databases (one scratch database per test session), real Redis, real RabbitMQ."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete

from tests import services

BACKENDS = ["sqlite", "postgres", "mariadb"]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with services.scratch_database("postgres") as url:
        yield url


@pytest.fixture(scope="session")
def mariadb_url() -> Iterator[str]:
    with services.scratch_database("mariadb") as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'reliable.db'}"


@pytest.fixture(scope="session")
def redis_url() -> str:
    return services.service_url("redis")


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    return services.service_url("rabbitmq")


@pytest.fixture
def private_redis() -> Iterator[services.PrivateRedis]:
    """A redis-server of this test's own, to FLUSHALL, kill or restart."""
    with services.private_redis() as r:
        yield r


@pytest.fixture
def key_prefix() -> str:
    """A Redis key prefix unique to the test, so tests sharing the local Redis never see each other's keys."""
    return f"rt{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs on SQLite, PostgreSQL and MariaDB; the schema is at head and empty."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    _ensure_clean_schema(url)
    return url


@pytest.fixture(params=["postgres", "mariadb"])
def server_url(request: pytest.FixtureRequest) -> str:
    """As ``db_url`` for the client/server databases only: row locks and concurrent transactions."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    _ensure_clean_schema(url)
    return url


_schema_ready: set[str] = set()


def _ensure_clean_schema(url: str) -> None:
    from reliable.facade import make_engine
    from reliable.migrate import upgrade
    from reliable.models import metadata

    engine = make_engine(url)
    try:
        if url not in _schema_ready:
            upgrade(engine)
            _schema_ready.add(url)
        with engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):  # every contract table, children first
                conn.execute(delete(table))
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests leave files worth looking at (screenshots, reports); kept after the run."""
    d = Path(__file__).resolve().parent.parent / "test-artifacts"
    d.mkdir(exist_ok=True)
    return d
