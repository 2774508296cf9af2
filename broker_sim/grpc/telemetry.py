"""The Telemetry stream: one long-lived bidirectional call per client and endpoint.

The client writes its *settings* (type, subscription or publishing topics); the server answers with the
settings that apply (for a consumer group: retry policy, FIFO, long-polling time, from :mod:`.policy`).
The server writes commands whenever it needs to: here ``recover_orphaned_transaction_command``, the 5.x
form of the transaction check-back. 5.x producers have no producer group, so a producer is registered
with the Broker under one synthetic group per topic it publishes (:func:`convert.producer_group`), and the
Broker's own check-back (``TransactionService``) reaches it through :class:`TelemetryChannel`, which
implements the Broker's :class:`~broker_sim.broker.api.ClientChannel`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker_sim.broker.api import HeartbeatData
from broker_sim.client.message import MessageExt, Prop
from broker_sim.common.channels import CheckTransactionStateRequest
from broker_sim.grpc.convert import producer_group, to_pb_message
from broker_sim.grpc.policy import GroupPolicies
from broker_sim.grpc.protocol import Protocol

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

log = logging.getLogger("broker_sim.grpc.telemetry")

_CLOSED = object()


class TelemetryChannel:
    """The server → client half of one Telemetry stream."""

    def __init__(self, pb: Protocol, client_id: str, peer: str) -> None:
        self.pb = pb
        self.client_id = client_id
        self.peer = peer
        self.outbound: queue.Queue[Any] = queue.Queue()
        self.topics: tuple[str, ...] = ()  # topics a producer publishes

    @property
    def remote_address(self) -> str:
        return self.peer

    def send(self, command: Any) -> None:
        self.outbound.put(command)

    def close(self) -> None:
        self.outbound.put(_CLOSED)

    def commands(self) -> Iterator[Any]:
        while True:
            item = self.outbound.get()
            if item is _CLOSED:
                return
            yield item

    def check_transaction_state(
        self, producer_group: str, request: CheckTransactionStateRequest, message: MessageExt
    ) -> None:
        real = replace(message, topic=message.properties.get(Prop.REAL_TOPIC, message.topic))
        cmd = self.pb.service.TelemetryCommand()
        cmd.recover_orphaned_transaction_command.message.CopyFrom(to_pb_message(self.pb, real))
        cmd.recover_orphaned_transaction_command.transaction_id = request.offset_msg_id
        self.send(cmd)

    def notify_consumer_ids_changed(self, consumer_group: str) -> None:
        """5.x consumers do not rebalance; nothing to tell."""


class TelemetryHub:
    def __init__(self, pb: Protocol, broker: Broker, policies: GroupPolicies, long_polling_s: int) -> None:
        self.pb = pb
        self.broker = broker
        self.policies = policies
        self.long_polling_s = long_polling_s
        self._lock = threading.Lock()
        self._channels: dict[str, TelemetryChannel] = {}

    def open(self, client_id: str, peer: str) -> TelemetryChannel:
        channel = TelemetryChannel(self.pb, client_id, peer)
        with self._lock:
            old = self._channels.get(client_id)
            self._channels[client_id] = channel
        if old is not None:
            old.close()
        return channel

    def close(self, channel: TelemetryChannel) -> None:
        """The stream ended. Unregister the client only if this was its current stream: a client that
        rebuilt its stream must keep the registration the new one made."""
        with self._lock:
            current = self._channels.get(channel.client_id) is channel
            if current:
                del self._channels[channel.client_id]
        channel.close()
        if current and self.broker.running:
            self.broker.client_channel_closed(channel.client_id)

    def is_open(self, client_id: str) -> bool:
        """Whether the client has a Telemetry stream open (the 5.x sign of a live client)."""
        with self._lock:
            return client_id in self._channels

    def open_clients(self) -> set[str]:
        with self._lock:
            return set(self._channels)

    def heartbeat(self, client_id: str) -> None:
        """Keep a producer's registration alive (5.x heartbeats carry no topics; the settings did)."""
        with self._lock:
            channel = self._channels.get(client_id)
        if channel is not None and channel.topics:
            self._register(channel)

    def _register(self, channel: TelemetryChannel) -> None:
        groups = tuple(producer_group(t) for t in channel.topics)
        self.broker.heartbeat(HeartbeatData(channel.client_id, producer_groups=groups), channel)

    def on_command(self, channel: TelemetryChannel, cmd: Any) -> None:
        """One command written by the client; settings are answered, other results only logged."""
        if not cmd.HasField("settings"):
            log.debug("telemetry from %s: %s", channel.client_id, cmd.WhichOneof("command"))
            return
        settings = self.pb.definition.Settings()
        settings.CopyFrom(cmd.settings)
        if settings.HasField("publishing"):
            channel.topics = tuple(t.name for t in settings.publishing.topics)
            self._register(channel)
            self._publishing(settings)
        elif settings.HasField("subscription"):
            self._subscription(settings)
        reply = self.pb.service.TelemetryCommand()
        reply.status.code = self.pb.definition.OK
        reply.status.message = "OK"
        reply.settings.CopyFrom(settings)
        channel.send(reply)

    def _publishing(self, settings: Any) -> None:
        settings.publishing.max_body_size = 4 * 1024 * 1024
        settings.publishing.validate_message_type = True
        policy = settings.backoff_policy
        policy.max_attempts = 3
        policy.exponential_backoff.initial.nanos = 10_000_000
        policy.exponential_backoff.max.seconds = 1
        policy.exponential_backoff.multiplier = 2.0

    def _subscription(self, settings: Any) -> None:
        group = self.policies.get(settings.subscription.group.name)
        settings.subscription.fifo = group.fifo
        settings.subscription.receive_batch_size = 32
        if not settings.subscription.long_polling_timeout.seconds:
            settings.subscription.long_polling_timeout.seconds = self.long_polling_s
        settings.backoff_policy.max_attempts = group.max_attempts
        for delay in group.backoff_s:
            d = settings.backoff_policy.customized_backoff.next.add()
            d.seconds, d.nanos = int(delay), round((delay % 1) * 1e9)
