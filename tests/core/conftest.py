"""Fixtures shared by the guard tests: a ``Reliability`` on the parametrised database and the shared Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from reliable import Reliability
from tests.core.guard_helpers import make_rel


@pytest.fixture
def rel(db_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(db_url, redis_url, key_prefix)
    yield r
    r.close()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()
