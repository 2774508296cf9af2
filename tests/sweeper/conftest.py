"""Fixtures of the sweeper tests: a Reliability on each backend with the notification table emptied too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reliable import Reliability
from tests.sweeper.helpers import Clock, QueueSender, clean


@pytest.fixture
def rel(db_url: str) -> Iterator[Reliability]:
    r = Reliability(db_url, redis_url="", max_sends=3, stuck_after_s=600, log_retention_s=3600)
    clean(r.engine)
    yield r
    r.close()


@pytest.fixture
def sqlite_rel(sqlite_url: str) -> Reliability:
    from tests.conftest import _ensure_clean_schema

    _ensure_clean_schema(sqlite_url)
    r = Reliability(sqlite_url, redis_url="")
    clean(r.engine)
    return r


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sender() -> QueueSender:
    return QueueSender()
