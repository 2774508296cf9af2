"""The broker's client registry requests — HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP
(38), CHECK_CLIENT_CONFIG (46) — and the channel bookkeeping behind them (a closed connection, expired
heartbeats, NOTIFY_CONSUMER_IDS_CHANGED), as RocketMQ's ``ClientManageProcessor`` and
``ClientHousekeepingService``.

A service the Broker owns, as its other request families are (send, pull, send-back, transactions, admin);
the Broker's methods of the same names delegate here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker_sim.common.channels import ClientChannel
from broker_sim.common.constants import retry_topic
from broker_sim.common.requests import HeartbeatData, MessageModel, Perm, SubscriptionData

if TYPE_CHECKING:
    from broker_sim.broker.context import BrokerContext

log = logging.getLogger("broker_sim.broker")


class ClientManageService:
    def __init__(self, broker: BrokerContext) -> None:
        self._broker = broker

    def heartbeat(self, data: HeartbeatData, channel: ClientChannel) -> None:
        """HEART_BEAT (34): register producer/consumer groups; create ``%RETRY%`` topics of clustering groups;
        a membership change notifies the group's clients (NOTIFY_CONSUMER_IDS_CHANGED)."""
        self._broker.check_running()
        now = self._broker.clock.now_ms()
        for group in data.producer_groups:
            self._broker.producers.register(data.client_id, group, channel, now)
        for cd in data.consumers:
            sg = self._broker.groups.find(cd.group_name)
            if cd.message_model is MessageModel.CLUSTERING:
                self._broker.topics.create_in_send_back(
                    retry_topic(cd.group_name), sg.retry_queue_nums, int(Perm.READ_WRITE)
                )
            if (
                self._broker.consumers.register(data.client_id, cd, channel, now)
                and sg.notify_consumer_ids_changed_enable
            ):
                self.notify_ids_changed(cd.group_name)

    def unregister_client(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None:
        """UNREGISTER_CLIENT (35)."""
        if producer_group:
            self._broker.producers.unregister(client_id, producer_group)
        if consumer_group and self._broker.consumers.unregister(client_id, consumer_group):
            self.notify_ids_changed(consumer_group)

    def client_channel_closed(self, client_id: str) -> None:
        """The client's connection closed (a killed process): forget it at once, as RocketMQ's channel
        listener
        does, so its queues are rebalanced without waiting for the 120 s expiry. Its offsets are *not*
        committed: whatever it had not persisted is consumed again by the next owner."""
        for group in self._broker.consumers.groups():
            if self._broker.consumers.unregister(client_id, group):
                log.info("consumer %s of %s disconnected", client_id, group)
                self.notify_ids_changed(group)
        self._broker.producers.remove_client(client_id)

    def scan_not_active_channels(self) -> None:
        now = self._broker.clock.now_ms()
        for group in self._broker.consumers.scan_expired(now):
            self.notify_ids_changed(group)
        self._broker.producers.scan_expired(now)

    def notify_ids_changed(self, group: str) -> None:
        for ch in self._broker.consumers.channels(group):
            try:
                ch.notify_consumer_ids_changed(group)
            except Exception:
                log.exception("notify consumer ids changed to %s failed", ch.remote_address)

    def check_client_config(self, group: str, client_id: str, subscription: SubscriptionData) -> None:
        """CHECK_CLIENT_CONFIG (46, ``ClientManageProcessor.checkClientConfig``): a TAG subscription is fine;
        SQL92 needs ``enable_property_filter`` (else SYSTEM_ERROR) and an expression that parses (else
        SUBSCRIPTION_PARSE_FAILED). Consumers send it at start for every non-TAG subscription."""
        self._broker.check_running()
        self._broker.filters.check(str(subscription.expression_type), subscription.sub_string)

    def get_consumer_list_by_group(self, group: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP (38): client ids with a live heartbeat, sorted."""
        self._broker.check_running()
        return self._broker.consumers.client_ids(group)
