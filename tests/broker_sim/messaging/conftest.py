"""Fixtures for the messaging tests: a started broker on a small store, with the system clock or a
ManualClock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_sim import Broker, ManualClock

SMALL_STORE = {"commit_log_file_size": 4 * 1024 * 1024, "index_hash_slots": 1024, "index_max_entries": 8192}


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def broker(store_dir: Path) -> Iterator[Broker]:
    b = Broker(store_dir, topics={"T": 4}, **SMALL_STORE).start()
    yield b
    b.shutdown()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def manual_broker(store_dir: Path, clock: ManualClock) -> Iterator[Broker]:
    b = Broker(store_dir, topics={"T": 4}, clock=clock, **SMALL_STORE).start()
    yield b
    b.shutdown()
