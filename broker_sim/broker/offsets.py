"""Committed consumer offsets (``config/consumerOffset.json``), RocketMQ's ConsumerOffsetManager.

The file is ``{"offsetTable": {"<topic>@<group>": {"<queueId>": nextOffset}}}``: the value is the next offset
the group will consume, i.e. what a restarted consumer resumes from. Commits only touch memory; the table is
persisted every ``flush_consumer_offset_interval`` (5 s on the clock) and at shutdown, which is one of the
windows in which a broker crash rewinds consumers.
"""

from __future__ import annotations

import threading
from pathlib import Path

from broker_sim.common.json_file import read_json, write_json_atomic

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._table: dict[str, dict[int, int]] = {}

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    def load(self) -> None:
        data = read_json(self.path)
        if not data:
            return
        with self._lock:
            self._table = {
                key: {int(q): int(o) for q, o in queues.items()}
                for key, queues in data.get("offsetTable", {}).items()
            }

    def persist(self) -> None:
        with self._lock:
            data = {
                "offsetTable": {
                    k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(self._table.items())
                }
            }
        write_json_atomic(self.path, data)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self._table.setdefault(self.key(topic, group), {})[queue_id] = offset

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group has never committed for this queue."""
        with self._lock:
            return self._table.get(self.key(topic, group), {}).get(queue_id, -1)

    def snapshot(self) -> dict[str, dict[int, int]]:
        """The whole table, ``"<topic>@<group>" -> {queue id: offset}`` (GET_ALL_CONSUMER_OFFSET)."""
        with self._lock:
            return {k: dict(v) for k, v in self._table.items()}

    def put_all(self, table: dict[str, dict[int, int]]) -> None:
        """A slave takes its master's table over, entry by entry (SlaveSynchronize.syncConsumerOffset:
        ``offsetTable.putAll``); entries only the slave has are kept."""
        with self._lock:
            for key, queues in table.items():
                self._table[key] = dict(queues)

    def table(self, group: str, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self._table.get(self.key(topic, group), {}))

    def topics_of_group(self, group: str) -> list[str]:
        with self._lock:
            return sorted(
                k.rsplit(TOPIC_GROUP_SEPARATOR, 1)[0]
                for k in self._table
                if k.endswith(TOPIC_GROUP_SEPARATOR + group)
            )

    def groups_of_topic(self, topic: str) -> list[str]:
        with self._lock:
            return sorted(
                k.rsplit(TOPIC_GROUP_SEPARATOR, 1)[1]
                for k in self._table
                if k.rsplit(TOPIC_GROUP_SEPARATOR, 1)[0] == topic
            )

    def groups(self) -> list[str]:
        with self._lock:
            return sorted({k.rsplit(TOPIC_GROUP_SEPARATOR, 1)[1] for k in self._table})

    def remove_topic(self, topic: str) -> None:
        with self._lock:
            for k in [k for k in self._table if k.rsplit(TOPIC_GROUP_SEPARATOR, 1)[0] == topic]:
                del self._table[k]
