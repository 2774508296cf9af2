"""Fixtures for the storage-engine tests: small files (to force rolls), a manual clock, a store factory
that always shuts its stores down."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_sim.clock import Clock, ManualClock
from broker_sim.store import MessageInner, MessageStore, StoreConfig, codec

StoreFactory = Callable[..., MessageStore]


#: tests comparing the compiled codec with its twin need the extension built
needs_c = pytest.mark.skipif(codec.compiled is None, reason="the compiled codec is not built here")


def small_config(**overrides: Any) -> StoreConfig:
    base: dict[str, Any] = {
        "commit_log_file_size": 8192,
        "consume_queue_units": 16,
        "index_hash_slots": 64,
        "index_max_entries": 32,
        # a CI disk above 85 % must not make the background expiry delete test data: tests that want
        # expiry inject their own usage
        "disk_usage": lambda: 0.1,
    }
    base.update(overrides)
    return StoreConfig(**base)


def msg(
    topic: str = "TopicA", body: bytes = b"hello", queue_id: int = 0, tags: str | None = None, **props: str
) -> MessageInner:
    properties = dict(props)
    if tags is not None:
        properties["TAGS"] = tags
    return MessageInner(topic, body, queue_id=queue_id, properties=properties, born_host=("10.0.0.7", 5555))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_store(tmp_path: Path, clock: ManualClock) -> Iterator[StoreFactory]:
    stores: list[MessageStore] = []

    def factory(
        path: Path | None = None, start: bool = True, clock: Clock = clock, **overrides: Any
    ) -> MessageStore:
        store = MessageStore(path or tmp_path / "store", small_config(**overrides), clock)
        if start:
            store.start()
        stores.append(store)
        return store

    yield factory
    for s in stores:
        if s.running:
            s.shutdown()
