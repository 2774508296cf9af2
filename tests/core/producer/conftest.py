"""Fixtures of the stub-first producer tests (SQLite, PostgreSQL and MariaDB, all real)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import delete

from reliable import Reliability, StubProducer
from tests.core.producer.support import DELAY_S, Clock, RecordingSender, business, orders


@pytest.fixture
def rel(db_url: str) -> Iterator[Reliability]:
    r = Reliability(db_url, first_resend_delay_s=DELAY_S)
    business.create_all(r.engine)
    with r.engine.begin() as conn:
        conn.execute(delete(orders))
    yield r
    r.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sender() -> RecordingSender:
    return RecordingSender()


@pytest.fixture
def producer(rel: Reliability, sender: RecordingSender, clock: Clock) -> StubProducer:
    return StubProducer(rel, sender, default_group="billing", clock=clock)
