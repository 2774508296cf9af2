"""Attribute names and span names: the OpenTelemetry messaging conventions plus `reliable`'s own.

Spelled here once so dashboards and tests grep one place. The ``messaging.*`` names follow the semantic
conventions for messaging spans (operation ``create`` on the producer, ``send`` for each hand-over to the
broker, ``process`` for each delivery the guard decides); ``reliable.*`` carries what only the guard knows —
the journal outcome, the reason and whether the delivery was a suppressed duplicate or fresh work.
"""

from __future__ import annotations

from typing import Final

SYSTEM: Final = "messaging.system"
OPERATION_NAME: Final = "messaging.operation.name"
OPERATION_TYPE: Final = "messaging.operation.type"
DESTINATION: Final = "messaging.destination.name"
PARTITION: Final = "messaging.destination.partition.id"
CONSUMER_GROUP: Final = "messaging.consumer.group.name"
MESSAGE_ID: Final = "messaging.message.id"
BODY_SIZE: Final = "messaging.message.body.size"
ROCKETMQ_KEYS: Final = "messaging.rocketmq.message.keys"
ROCKETMQ_TAG: Final = "messaging.rocketmq.message.tag"

#: the guard's verdict (reliable.decision): journal outcome, reason, broker result, duplicate flag
OUTCOME: Final = "reliable.outcome"
REASON: Final = "reliable.reason"
RESULT: Final = "reliable.result"
#: True: a suppressed duplicate (replayed answer, handler not run); False: fresh work or a retry of it
DUPLICATE: Final = "reliable.duplicate"
#: the broker's redelivery count (RocketMQ reconsumeTimes) of this delivery
RECONSUME_TIMES: Final = "reliable.reconsume_times"
#: the topic the delivery came from when it differs from the business topic (``%RETRY%billing``)
DELIVERED_TOPIC: Final = "reliable.delivered_topic"
#: the sweeper's send number of a resend (0 = the producer's own send)
SEND_COUNT: Final = "reliable.send_count"
RESEND: Final = "reliable.resend"
TARGET_GROUP: Final = "reliable.target_group"

OP_CREATE: Final = "create"
OP_SEND: Final = "send"
OP_PROCESS: Final = "process"

SWEEP_SPAN: Final = "reliable.sweep"
#: RoundSummary field → span attribute (``reliable.sweep.resent`` …)
SWEEP_PREFIX: Final = "reliable.sweep."
