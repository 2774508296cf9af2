"""Topic configuration (``config/topics.json``): queue counts and permissions per topic.

Auto-creation is off by default: a send to an unknown topic fails with TOPIC_NOT_EXIST, which is what a
production cluster does and what catches typos. With ``auto_create_topic_enable`` the broker keeps RocketMQ's
``TBW102`` template topic (perm includes INHERIT) and a first send creates the topic with
``min(client's defaultTopicQueueNums, TBW102's queue count)`` queues.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from broker_sim.common.constants import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from broker_sim.common.errors import BrokerConfigError, InvalidTopicError, NoPermissionError
from broker_sim.common.json_file import read_json, write_json_atomic
from broker_sim.common.requests import Perm

_READ = int(Perm.READ)
_WRITE = int(Perm.WRITE)


@dataclass(frozen=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = int(Perm.READ_WRITE)
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {
            "topicName": d["topic_name"],
            "readQueueNums": d["read_queue_nums"],
            "writeQueueNums": d["write_queue_nums"],
            "perm": d["perm"],
            "topicSysFlag": d["topic_sys_flag"],
            "order": d["order"],
            "topicFilterType": "SINGLE_TAG",
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicConfig:
        return cls(
            str(d["topicName"]),
            int(d.get("readQueueNums", 4)),
            int(d.get("writeQueueNums", 4)),
            int(d.get("perm", 6)),
            int(d.get("topicSysFlag", 0)),
            bool(d.get("order", False)),
        )

    @property
    def readable(self) -> bool:
        return bool(self.perm & _READ)  # plain ints: IntFlag arithmetic is slow on the send path

    @property
    def writable(self) -> bool:
        return bool(self.perm & _WRITE)


class TopicConfigManager:
    def __init__(
        self,
        path: Path,
        *,
        default_queue_nums: int = 8,
        auto_create_topic_enable: bool = False,
        schedule_levels: int = 18,
    ) -> None:
        self.path = path
        self.default_queue_nums = default_queue_nums
        self.auto_create_topic_enable = auto_create_topic_enable
        self._lock = threading.RLock()
        self._table: dict[str, TopicConfig] = {}
        #: called after every change of the table (the name-server registration re-registers at once, as
        #: Java's ``registerBrokerAll`` after a topic is created or updated)
        self.on_change: Callable[[], object] | None = None
        system = [
            TopicConfig(SCHEDULE_TOPIC, schedule_levels, schedule_levels, int(Perm.READ_WRITE)),
            TopicConfig(TRANS_HALF_TOPIC, 1, 1, int(Perm.READ_WRITE)),
            TopicConfig(TRANS_OP_HALF_TOPIC, 1, 1, int(Perm.READ_WRITE)),
        ]
        if auto_create_topic_enable:
            system.append(
                TopicConfig(
                    AUTO_CREATE_TOPIC_KEY_TOPIC,
                    default_queue_nums,
                    default_queue_nums,
                    int(Perm.READ_WRITE | 1),
                )
            )
        for tc in system:
            self._table[tc.topic_name] = tc

    def load(self) -> None:
        data = read_json(self.path)
        if not data:
            return
        with self._lock:
            for d in data.get("topicConfigTable", {}).values():
                tc = TopicConfig.from_json(d)
                if tc.topic_name == AUTO_CREATE_TOPIC_KEY_TOPIC and not self.auto_create_topic_enable:
                    continue
                self._table[tc.topic_name] = tc

    def persist(self) -> None:
        with self._lock:
            data = {"topicConfigTable": {k: v.to_json() for k, v in sorted(self._table.items())}}
        write_json_atomic(self.path, data)

    def _changed(self) -> None:
        self.persist()
        if self.on_change is not None:
            self.on_change()

    def select(self, topic: str) -> TopicConfig | None:
        with self._lock:
            return self._table.get(topic)

    def topics(self) -> list[TopicConfig]:
        with self._lock:
            return sorted(self._table.values(), key=lambda t: t.topic_name)

    def update(self, tc: TopicConfig) -> TopicConfig:
        if tc.read_queue_nums < 1 or tc.write_queue_nums < 1 or tc.read_queue_nums > 1024:
            raise InvalidTopicError(f"topic {tc.topic_name}: queue counts must be within 1..1024")
        with self._lock:
            self._table[tc.topic_name] = tc
        self._changed()
        return tc

    def delete(self, topic: str) -> bool:
        with self._lock:
            found = self._table.pop(topic, None) is not None
        if found:
            self._changed()
        return found

    def create_in_send(
        self, topic: str, default_topic: str, client_queue_nums: int, sys_flag: int = 0
    ) -> TopicConfig | None:
        """RocketMQ's ``createTopicInSendMessageMethod``: inherit from the template topic if it allows it."""
        with self._lock:
            existing = self._table.get(topic)
            if existing is not None:
                return existing
            template = self._table.get(default_topic)
            if template is None or not template.perm & Perm.INHERIT:
                return None
            nums = max(1, min(client_queue_nums, template.write_queue_nums))
            tc = TopicConfig(topic, nums, nums, int(template.perm & ~Perm.INHERIT), sys_flag)
            self._table[topic] = tc
        self._changed()
        return tc

    def create_in_send_back(self, topic: str, queue_nums: int, perm: int) -> TopicConfig:
        """``%RETRY%`` / ``%DLQ%`` topics are created on first use, regardless of auto-creation."""
        with self._lock:
            existing = self._table.get(topic)
            if existing is not None:
                return existing
            tc = TopicConfig(topic, queue_nums, queue_nums, perm)
            self._table[topic] = tc
        self._changed()
        return tc

    def check_writable(self, tc: TopicConfig) -> None:
        if not tc.writable:
            raise NoPermissionError(f"the topic[{tc.topic_name}] sending message is forbidden")

    def with_perm(self, topic: str, perm: int) -> TopicConfig:
        tc = self.select(topic)
        if tc is None:
            raise BrokerConfigError(f"no topic {topic}")
        return self.update(replace(tc, perm=perm))
