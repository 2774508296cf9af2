"""Where a consumer keeps its progress.

Clustering: :class:`RemoteBrokerOffsetStore` — offsets live in memory, are committed to the broker every
``persist_consumer_offset_interval`` (5 s), piggy-backed on pulls, and on shutdown; the broker's
``consumerOffset.json`` is the truth a restarted or new member of the group resumes from.
Broadcasting: :class:`LocalFileOffsetStore` — every consumer has its own ``offsets.json`` on local disk
(``<dir>/<instance>/<group>/offsets.json``), because every consumer reads every message.

Whatever is in memory but not yet committed is exactly what a killed consumer re-reads.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from broker_sim.common.errors import BrokerResponseError, TransportError
from broker_sim.common.json_file import read_json, write_json_atomic
from broker_sim.common.message import MessageQueue
from broker_sim.common.transport import BrokerTransport

log = logging.getLogger(__name__)


class ReadOffsetType(enum.Enum):
    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


class OffsetStore(Protocol):
    def load(self) -> None: ...

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None: ...

    def read_offset(self, mq: MessageQueue, how: ReadOffsetType) -> int: ...

    def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...

    def persist(self, mq: MessageQueue) -> None: ...

    def remove_offset(self, mq: MessageQueue) -> None: ...

    def snapshot(self) -> dict[MessageQueue, int]: ...


class _MemoryTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.table: dict[MessageQueue, int] = {}

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        with self._lock:
            old = self.table.get(mq)
            if old is None or not increase_only or offset > old:
                self.table[mq] = offset

    def memory(self, mq: MessageQueue) -> int:
        with self._lock:
            return self.table.get(mq, -1)

    def remove_offset(self, mq: MessageQueue) -> None:
        with self._lock:
            self.table.pop(mq, None)

    def snapshot(self) -> dict[MessageQueue, int]:
        with self._lock:
            return dict(self.table)


class RemoteBrokerOffsetStore(_MemoryTable):
    def __init__(self, transport: BrokerTransport, group: str) -> None:
        super().__init__()
        self.transport = transport
        self.group = group

    def load(self) -> None:
        """Nothing to load: the broker holds the offsets."""

    def read_offset(self, mq: MessageQueue, how: ReadOffsetType) -> int:
        """-1: nothing known (new group for this queue); -2: the broker could not be asked."""
        if how is not ReadOffsetType.READ_FROM_STORE:
            off = self.memory(mq)
            if off >= 0 or how is ReadOffsetType.READ_FROM_MEMORY:
                return off
        try:
            found = self.transport.query_consumer_offset(self.group, mq.topic, mq.queue_id, mq.broker_name)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("query offset of %s for %s failed: %s", mq, self.group, exc)
            return -2
        if found is None:
            return -1
        self.update_offset(mq, found, False)
        return found

    def persist(self, mq: MessageQueue) -> None:
        off = self.memory(mq)
        if off < 0:
            return
        try:
            self.transport.update_consumer_offset(self.group, mq.topic, mq.queue_id, off, mq.broker_name)
        except (TransportError, BrokerResponseError) as exc:
            log.warning("commit offset %d of %s for %s failed: %s", off, mq, self.group, exc)

    def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        wanted = set(mqs)
        for mq, off in self.snapshot().items():
            if mq in wanted and off >= 0:
                try:
                    self.transport.update_consumer_offset(
                        self.group, mq.topic, mq.queue_id, off, mq.broker_name
                    )
                except (TransportError, BrokerResponseError) as exc:
                    log.warning("commit offset %d of %s for %s failed: %s", off, mq, self.group, exc)


class LocalFileOffsetStore(_MemoryTable):
    def __init__(self, base_dir: Path, instance: str, group: str) -> None:
        super().__init__()
        self.path = Path(base_dir) / instance.replace("/", "_").replace("@", "_") / group / "offsets.json"
        self.group = group

    def load(self) -> None:
        data = read_json(self.path)
        if not data:
            return
        for entry in data.get("offsetTable", []):
            mq = MessageQueue(str(entry["topic"]), str(entry["brokerName"]), int(entry["queueId"]))
            self.update_offset(mq, int(entry["offset"]), False)

    def read_offset(self, mq: MessageQueue, how: ReadOffsetType) -> int:
        if how is not ReadOffsetType.READ_FROM_STORE:
            off = self.memory(mq)
            if off >= 0 or how is ReadOffsetType.READ_FROM_MEMORY:
                return off
        data = read_json(self.path) or {}
        for entry in data.get("offsetTable", []):
            if (entry["topic"], entry["brokerName"], int(entry["queueId"])) == (
                mq.topic,
                mq.broker_name,
                mq.queue_id,
            ):
                off = int(entry["offset"])
                self.update_offset(mq, off, False)
                return off
        return -1

    def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        wanted = set(mqs)
        table = [
            {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": off}
            for mq, off in sorted(self.snapshot().items())
            if mq in wanted
        ]
        write_json_atomic(self.path, {"offsetTable": table})

    def persist(self, mq: MessageQueue) -> None:
        self.persist_all(self.snapshot().keys())
