"""Who is connected: subscription groups (``config/subscriptionGroup.json``), the consumer registry
(heartbeats,
client ids, subscriptions) and the producer registry (for transaction check-back).

A group's membership changes when a client id first heartbeats, unregisters, or stops heartbeating for
``channel_expired_ms`` (RocketMQ: 120 s). Each change is reported to the caller, which then tells every
member through its channel (NOTIFY_CONSUMER_IDS_CHANGED) so clients rebalance at once instead of waiting up
to 20 s for their periodic rebalance.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_sim.common.channels import ClientChannel
from broker_sim.common.constants import DEFAULT_MAX_RECONSUME_TIMES
from broker_sim.common.errors import SubscriptionGroupNotExistError
from broker_sim.common.json_file import read_json, write_json_atomic
from broker_sim.common.requests import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    MessageModel,
    SubscriptionData,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = DEFAULT_MAX_RECONSUME_TIMES
    notify_consumer_ids_changed_enable: bool = True
    #: the node a reader of this group is sent to when it is not slow (``brokerId``; 0 = the master)
    broker_id: int = 0
    #: the node a slow reader is sent to (``whichBrokerWhenConsumeSlowly``; 1 = the first slave)
    which_broker_when_consume_slowly: int = 1

    def to_json(self) -> dict[str, Any]:
        return {
            "groupName": self.group_name,
            "consumeEnable": self.consume_enable,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "retryQueueNums": self.retry_queue_nums,
            "retryMaxTimes": self.retry_max_times,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
            "brokerId": self.broker_id,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SubscriptionGroupConfig:
        return cls(
            str(d["groupName"]),
            bool(d.get("consumeEnable", True)),
            bool(d.get("consumeBroadcastEnable", True)),
            int(d.get("retryQueueNums", 1)),
            int(d.get("retryMaxTimes", DEFAULT_MAX_RECONSUME_TIMES)),
            bool(d.get("notifyConsumerIdsChangedEnable", True)),
            int(d.get("brokerId", 0)),
            int(d.get("whichBrokerWhenConsumeSlowly", 1)),
        )


class SubscriptionGroupManager:
    """Groups are auto-created on first use unless ``auto_create`` is off (RocketMQ's default is on)."""

    def __init__(self, path: Path, *, auto_create: bool = True, default_retry_max_times: int = 16) -> None:
        self.path = path
        self.auto_create = auto_create
        self.default_retry_max_times = default_retry_max_times
        self._lock = threading.Lock()
        self._table: dict[str, SubscriptionGroupConfig] = {}

    def load(self) -> None:
        data = read_json(self.path)
        if data:
            for d in data.get("subscriptionGroupTable", {}).values():
                sg = SubscriptionGroupConfig.from_json(d)
                self._table[sg.group_name] = sg

    def persist(self) -> None:
        with self._lock:
            data = {"subscriptionGroupTable": {k: v.to_json() for k, v in sorted(self._table.items())}}
        write_json_atomic(self.path, data)

    def find(self, group: str) -> SubscriptionGroupConfig:
        with self._lock:
            sg = self._table.get(group)
            if sg is None:
                if not self.auto_create:
                    raise SubscriptionGroupNotExistError(f"subscription group [{group}] does not exist")
                sg = SubscriptionGroupConfig(group, retry_max_times=self.default_retry_max_times)
                self._table[group] = sg
                created = True
            else:
                created = False
        if created:
            self.persist()
        return sg

    def update(self, sg: SubscriptionGroupConfig) -> None:
        with self._lock:
            self._table[sg.group_name] = sg
        self.persist()

    def groups(self) -> list[SubscriptionGroupConfig]:
        with self._lock:
            return sorted(self._table.values(), key=lambda g: g.group_name)


@dataclass
class ClientInfo:
    client_id: str
    channel: ClientChannel
    last_update_ms: int


@dataclass
class ConsumerGroupInfo:
    group_name: str
    consume_type: ConsumeType
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    subscriptions: dict[str, SubscriptionData] = field(default_factory=dict)
    clients: dict[str, ClientInfo] = field(default_factory=dict)


class ConsumerManager:
    def __init__(self, channel_expired_ms: int = 120_000) -> None:
        self.channel_expired_ms = channel_expired_ms
        self._lock = threading.Lock()
        self._groups: dict[str, ConsumerGroupInfo] = {}

    def register(self, client_id: str, data: ConsumerData, channel: ClientChannel, now_ms: int) -> bool:
        """Record a heartbeat; True when the group's membership changed (a new client id)."""
        with self._lock:
            info = self._groups.get(data.group_name)
            if info is None:
                info = ConsumerGroupInfo(
                    data.group_name, data.consume_type, data.message_model, data.consume_from_where
                )
                self._groups[data.group_name] = info
            info.consume_type, info.message_model = data.consume_type, data.message_model
            info.consume_from_where = data.consume_from_where
            for sub in data.subscriptions:
                info.subscriptions[sub.topic] = sub
            existing = info.clients.get(client_id)
            if existing is None:
                info.clients[client_id] = ClientInfo(client_id, channel, now_ms)
                return True
            existing.channel = channel
            existing.last_update_ms = now_ms
            return False

    def unregister(self, client_id: str, group: str) -> bool:
        with self._lock:
            info = self._groups.get(group)
            if info is None or info.clients.pop(client_id, None) is None:
                return False
            if not info.clients:
                del self._groups[group]
            return True

    def scan_expired(self, now_ms: int) -> list[str]:
        """Drop clients silent for longer than the expiry; returns the groups whose membership changed."""
        changed = []
        with self._lock:
            for name, info in list(self._groups.items()):
                dead = [
                    c
                    for c, ci in info.clients.items()
                    if now_ms - ci.last_update_ms > self.channel_expired_ms
                ]
                for c in dead:
                    log.warning("consumer %s of group %s expired (no heartbeat)", c, name)
                    del info.clients[c]
                if dead:
                    changed.append(name)
                if not info.clients:
                    del self._groups[name]
        return changed

    def group(self, group: str) -> ConsumerGroupInfo | None:
        with self._lock:
            return self._groups.get(group)

    def client_ids(self, group: str) -> list[str]:
        with self._lock:
            info = self._groups.get(group)
            return sorted(info.clients) if info else []

    def channels(self, group: str) -> list[ClientChannel]:
        with self._lock:
            info = self._groups.get(group)
            return [ci.channel for ci in info.clients.values()] if info else []

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        with self._lock:
            info = self._groups.get(group)
            return info.subscriptions.get(topic) if info else None

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)


class ProducerManager:
    def __init__(self, channel_expired_ms: int = 120_000) -> None:
        self.channel_expired_ms = channel_expired_ms
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, ClientInfo]] = {}

    def register(self, client_id: str, group: str, channel: ClientChannel, now_ms: int) -> None:
        with self._lock:
            self._groups.setdefault(group, {})[client_id] = ClientInfo(client_id, channel, now_ms)

    def unregister(self, client_id: str, group: str) -> None:
        with self._lock:
            clients = self._groups.get(group)
            if clients is not None:
                clients.pop(client_id, None)
                if not clients:
                    del self._groups[group]

    def remove_client(self, client_id: str) -> None:
        with self._lock:
            for group, clients in list(self._groups.items()):
                clients.pop(client_id, None)
                if not clients:
                    del self._groups[group]

    def scan_expired(self, now_ms: int) -> None:
        with self._lock:
            for group, clients in list(self._groups.items()):
                for cid in [
                    c for c, ci in clients.items() if now_ms - ci.last_update_ms > self.channel_expired_ms
                ]:
                    del clients[cid]
                if not clients:
                    del self._groups[group]

    def clients(self, group: str) -> list[ClientInfo]:
        with self._lock:
            return sorted(self._groups.get(group, {}).values(), key=lambda ci: ci.client_id)

    def any_channel(self, group: str) -> ClientChannel | None:
        with self._lock:
            clients = self._groups.get(group)
            if not clients:
                return None
            return next(iter(clients.values())).channel
