"""Client configuration defaults, topic creation and the broker probe (high watermark, lag).

The defaults are the settings reliable consumption depends on, not tuning: auto-commit off (the consumer loop
commits after the guard's final answer), ``read_committed`` (records of aborted transactions are never
handed to a handler), and an idempotent producer with ``acks=all`` (a retried send cannot duplicate or
reorder within a partition, and a send counts only once every in-sync replica has it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from reliable.errors import ConfigurationError

log = logging.getLogger("reliable.adapters.kafka")

#: what reliable consumption needs (see the module doc); a caller's ``config`` may override any of it
CONSUMER_DEFAULTS: Mapping[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
}
PRODUCER_DEFAULTS: Mapping[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 0,
}


def consumer_config(bootstrap: str, group: str, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    if not bootstrap:
        raise ConfigurationError("no Kafka bootstrap servers given")
    return {"bootstrap.servers": bootstrap, "group.id": group, **CONSUMER_DEFAULTS, **(config or {})}


def producer_config(bootstrap: str, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    if not bootstrap:
        raise ConfigurationError("no Kafka bootstrap servers given")
    return {"bootstrap.servers": bootstrap, **PRODUCER_DEFAULTS, **(config or {})}


def ensure_topics(
    bootstrap: str, topics: Iterable[str], partitions: int = 1, replication: int = 1, timeout_s: float = 10.0
) -> None:
    """Create the topics that do not exist yet (an existing topic is left as it is). A name given twice is
    created once: two groups' ``policy.all_topics(topic)`` both hold the topic, and the request naming it
    twice failed with a protocol error."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(t, partitions, replication) for t in dict.fromkeys(topics)], request_timeout=timeout_s
    )
    for _name, future in futures.items():
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise


class KafkaProbe:
    """The sweeper's view of the broker: partition high watermarks and a group's lag.

    ``max_offset`` implements :class:`reliable.sender.BrokerProbe`: the high watermark is one past the last
    record the partition holds (committed records only under ``read_committed``), so a stub sent to offset
    ``o`` with ``max_offset <= o`` is proven lost. Any error answers ``None`` ("cannot tell").
    """

    def __init__(
        self, bootstrap: str, *, timeout_s: float = 5.0, config: Mapping[str, Any] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.config = dict(config or {})
        # a consumer that never subscribes: it only asks for offsets, it never joins the group
        self._consumer = Consumer(consumer_config(bootstrap, "reliable-probe", config))
        self.timeout_s = timeout_s

    def max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        return self._watermarks(topic, queue_id)[1]

    def min_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int | None:
        """The partition's log start offset (low watermark): retention deleted the records below it
        (:class:`reliable.sender.RetentionProbe`)."""
        return self._watermarks(topic, queue_id)[0]

    def _watermarks(self, topic: str, queue_id: int) -> tuple[int | None, int | None]:
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, queue_id), timeout=self.timeout_s
            )
        except KafkaException as exc:
            log.warning("watermarks of %s-%d unknown: %s", topic, queue_id, exc)
            return None, None

        def known(offset: int | None) -> int | None:
            return int(offset) if offset is not None and offset >= 0 else None

        return known(low), known(high)

    def lag(self, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        """Records not yet committed by ``group``, per partition (``None``: unknown; no commit: from 0)."""
        tps = [TopicPartition(topic, p) for p in partitions]
        probe = Consumer(consumer_config(self.bootstrap, group, self.config))
        try:
            committed = {tp.partition: tp.offset for tp in probe.committed(tps, timeout=self.timeout_s)}
        except KafkaException as exc:
            log.warning("committed offsets of %s on %s unknown: %s", group, topic, exc)
            return {tp.partition: None for tp in tps}
        finally:
            probe.close()
        out: dict[int, int | None] = {}
        for tp in tps:
            high = self.max_offset(topic, tp.partition)
            done = committed.get(tp.partition, -1)
            out[tp.partition] = None if high is None else high - max(done if done is not None else 0, 0)
        return out

    def close(self) -> None:
        self._consumer.close()
