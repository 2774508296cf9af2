"""Kafka adapter on ``confluent-kafka``: a guarded consumer loop, a Sender, and the sweeper's broker probe.

``pip install 'reliable[kafka]'``. The client-independent parts (header codec, message id, retry routing)
live in :mod:`reliable.adapters.kafka_common` and the database offsets in
:mod:`reliable.adapters.kafka_offsets`; the asyncio flavour on ``aiokafka``
(:mod:`reliable.adapters.kafka.aio`, imported on its own so this package needs no aiokafka) shares them. See
docs/adapters.md, section Kafka, for the mapping and the settings that matter.
"""

from reliable.adapters.kafka.admin import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS, KafkaProbe, ensure_topics
from reliable.adapters.kafka.consumer import KafkaGuardedConsumer, to_record
from reliable.adapters.kafka.sender import KafkaSender, sweeper_sender
from reliable.adapters.kafka_common import RetryMode, RetryPolicy
from reliable.adapters.kafka_offsets import offsets_in_db

__all__ = [
    "CONSUMER_DEFAULTS",
    "PRODUCER_DEFAULTS",
    "KafkaGuardedConsumer",
    "KafkaProbe",
    "KafkaSender",
    "RetryMode",
    "RetryPolicy",
    "ensure_topics",
    "offsets_in_db",
    "sweeper_sender",
    "to_record",
]
