"""Every Redis key, environment variable name and default of `reliable`, in one place.

Anything a deployer might need to grep for (a key pattern in Redis, an env var in a manifest) lives here so
there is exactly one spelling of it.
"""

from __future__ import annotations

import re
from typing import Final

# --- environment -----------------------------------------------------------------------------------------
ENV_PREFIX: Final = "RELIABLE_"
ENV_DB_URL: Final = "RELIABLE_DB_URL"
ENV_REDIS_URL: Final = "RELIABLE_REDIS_URL"

# --- Redis keys -----------------------------------------------------------------------------------------
DEFAULT_KEY_PREFIX: Final = "reliable"
#: ``{prefix}:{group}:{message_id}`` holds ``processing:{owner}`` while a worker runs the handler and
#: ``done`` after a commit. The group is part of the key because two groups consume the same message
#: independently.
LEASE_KEY_FORMAT: Final = "{prefix}:{group}:{message_id}"
LEASE_PROCESSING_PREFIX: Final = "processing:"
LEASE_DONE_VALUE: Final = "done"
#: the Sentinel service of a hand-built topology without one (a ``redis+sentinel://`` URL always names it)
DEFAULT_SENTINEL_SERVICE: Final = "mymaster"

# --- consumer guard defaults ----------------------------------------------------------------------------
DEFAULT_LEASE_MS: Final = 60_000  # how long a worker may hold a message before another may take it
DEFAULT_DONE_TTL_S: Final = 7 * 24 * 3600  # how long the Redis ``done`` marker short-circuits duplicates
#: a ``done`` marker is not waited for: it rides on the next acquire's pipeline, or a timer writes it at the
#: latest this long after the commit (until then a duplicate is answered by the database)
DONE_MARKER_FLUSH_MS: Final = 50
DEFAULT_MAX_ATTEMPTS: Final = 16  # RocketMQ's default maxReconsumeTimes
#: RocketMQ 4.x consumers' default maxReconsumeTimes (the C++ client's and broker_sim's): a delivery with
#: ``reconsume_times`` at this limit is the broker's last, its failure goes to ``%DLQ%{group}``
ROCKETMQ_MAX_RECONSUME_TIMES: Final = 16
DEFAULT_REDIS_SOCKET_TIMEOUT_S: Final = 0.5  # a slow Redis must not stall consumption: fall back to the DB

# --- producer / sweeper defaults ------------------------------------------------------------------------
DEFAULT_FIRST_RESEND_DELAY_S: Final = 60.0  # earliest resend after the first send
DEFAULT_MAX_SENDS: Final = 8
#: how far a sweeper's claim moves its rows' ``resend_at`` (reliable.sweeper.claim): well above a batch of
#: sends to a slow broker; the rows of a sweeper killed mid-batch wait this long
#: the FastStream Kafka wrapper's pause after its own error on a record (a failed copy publish or commit):
#: from the minimum, doubling per error in a row on the partition, up to the maximum
KAFKA_ERROR_PAUSE_MIN_S: Final = 1.0
KAFKA_ERROR_PAUSE_MAX_S: Final = 60.0
DEFAULT_CLAIM_TTL_S: Final = 300.0
#: the claim window's bounds: shorter leaves a batch no time to be probed and sent; longer leaves the rows of
#: a sweeper killed mid-batch waiting for it (an hour)
MIN_CLAIM_TTL_S: Final = 5.0
MAX_CLAIM_TTL_S: Final = 3600.0
#: a claimed batch starts no send in the last share of its claim window (another sweeper may take it then)
CLAIM_SEND_SHARE_REMAINING: Final = 0.2
PRODUCER_RECORD_TRIES: Final = (
    3  # tries to record a send result (a deadlock victim) before leaving it to the sweeper
)
PRODUCER_RECORD_BACKOFF_S: Final = 0.02  # × try number, between those tries
#: a broker call (a send, a probe) that failed after this long hung rather than was refused: the producer's
#: after-commit sends defer to the sweeper (reliable.send_breaker), the sweeper's round stops sending
#: (reliable.sweeper.resend.OutagePause) and stops probing that broker group (reliable.sweeper.triage)
SLOW_BROKER_CALL_S: Final = 1.0
#: how long the after-commit sends are left to the sweeper after one such failure
PRODUCER_SEND_RETRY_AFTER_S: Final = 10.0
#: after a failed read of the Redis leases (refused, or a socket timeout: Redis hung) a sweeper round treats
#: the leases as unknown for this long, then asks again (reliable.sweeper.leases.RoundLeases): a hung Redis
#: costs a round one timeout an interval, not one a batch, and Redis back mid-round is used again
SWEEP_LEASE_RETRY_AFTER_S: Final = 10.0
#: a sweeper round stops sending after this many failed resends in a row that were each slow (see above) …
SWEEP_PAUSE_AFTER_SLOW_FAILURES: Final = 2
#: … and stops sending to one route after this many failed there in a row; the rest wait for the next round
SWEEP_PAUSE_AFTER_FAILURES: Final = 3
DEFAULT_STUCK_AFTER_S: Final = 15 * 60
DEFAULT_LOG_RETENTION_S: Final = 7 * 24 * 3600
DEFAULT_SWEEP_BATCH: Final = 500
#: retention purge: log rows per delete transaction (small, so a batch holds little and commits fast) …
DEFAULT_PURGE_BATCH: Final = 2000
#: open rows voided per transaction when a consumer group is retired (reliable.sweeper.resolve)
DEFAULT_RETIRE_BATCH: Final = 500
#: DEAD rows revived per transaction by ``reliable stubs revive --group G --all-dead``
DEFAULT_REVIVE_BATCH: Final = 500
#: … and the share of wall time it may spend working: after a batch of t seconds it rests
#: t·(1 − duty)/duty (×up to PURGE_MAX_BACKOFF while batches get slower than its fastest one).
DEFAULT_PURGE_DUTY_CYCLE: Final = 0.5
PURGE_MAX_BACKOFF: Final = 4.0
#: RocketMQ's (and broker_sim's) largest body (``maxMessageSize``): a bigger one is refused at every send
ROCKETMQ_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
#: AMQP short strings (message id, header names and the like) hold at most this many bytes, not characters
AMQP_SHORT_STRING_BYTES: Final = 255
#: ``Session.info`` key of a guarded handler's session: the callables to run once the guard's transaction
#: has committed (the producer's sends of messages staged in that session)
SESSION_AFTER_COMMIT: Final = "reliable.after_guard_commit"
#: ``reliable stubs prune --older-than``: at least this (a copy delivered after its message was pruned is
#: applied again: RocketMQ keeps its commit log 72 h by default, Kafka's retention.ms is 7 days)
MIN_PRUNE_AGE_S: Final = 7 * 86400
#: the longest log retention (a century): a longer one failed every round's purge ("date value out of range")
MAX_RETENTION_S: Final = 100 * 365 * 86400
#: one sweep round purges at most this long; the next round goes on where the oldest rows are.
DEFAULT_PURGE_ROUND_BUDGET_S: Final = 60.0
#: pending stubs a round checks for "every group confirmed" (outbox.settle), walking on round by round.
DEFAULT_SETTLE_BATCH: Final = 1000
#: a group whose watermark on a queue has not moved this long while the broker holds messages beyond it
#: (and the group has PENDING rows there) has stopped consuming: the stalled-group alarm.
DEFAULT_STALL_AFTER_S: Final = 30 * 60
#: RabbitMQ: an ``x-reliable-seq`` (the sender's clock, µs) further ahead of the consumer's clock than this is
#: not taken as the delivery's position (one far-future number raised the group's watermark for good)
AMQP_SEQ_MAX_AHEAD_S: Final = 300
#: RabbitMQ queues have no offsets: the RabbitMQ senders' position (``x-reliable-seq``, journaled as
#: ``queue_offset``) is the sender's clock in µs since the epoch, never below this (2001-09-09). No broker
#: offset comes near it (10^15 messages in one queue), so a position at or above it is a *clock position*:
#: it orders sends, but the distance between two of them is time, not messages — the reconciliation report
#: computes no offset gaps and no lag from it (docs/reconcile.md)
AMQP_CLOCK_POSITION_MIN: Final = 10**15
#: ``stub_notification.message_id`` of a stall's notice rows: this prefix + a digest of the queue
STALL_KEY_PREFIX: Final = "~stall:"
#: the ``message_id`` of a never-consumed alarm's marker row: this prefix + the same digest of the queue
NEVER_CONSUMED_KEY_PREFIX: Final = "~never:"
#: the ``(message_id, consumer_group)`` of the Redis outage episode's notice rows (reliable/sweeper/
#: redis_outage.py): one outage of the guard's Redis as the sweepers' lease reads see it, no group's
REDIS_OUTAGE_KEY: Final = "~redis:leases"
REDIS_OUTAGE_GROUP: Final = ""

#: message property names a producer may not set: the brokers' own (RocketMQ's system properties but
#: ``DELAY``, which is the delay level on purpose; the id headers and delivery count of Kafka and RabbitMQ),
#: and every name under the prefixes reliable's adapters write their own headers with. Set by a producer,
#: ``KEYS`` replaced the message id, ``TAGS`` the tags, ``RETRY_TOPIC`` the topic the consumer saw, and a
#: handler that copied a retry delivery's ``reliable-*`` headers onto a follow-up message had every copy of
#: it dropped as another group's retry copy.
RESERVED_PROPERTIES: Final = frozenset(
    {
        "KEYS", "TAGS", "WAIT", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET",
        "MAX_OFFSET", "ORIGIN_MESSAGE_ID", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "RECONSUME_TIME",
        "CONSUME_START_TIME", "TRANSACTION_CHECK_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS", "SHARDING_KEY",
        "CLUSTER", "message-id", "x-message-id", "x-delivery-count", "x-death",
    }
)  # fmt: skip
RESERVED_PROPERTY_PREFIXES: Final = ("reliable-", "x-reliable-", "kafka.", "amqp.", "__")
#: topics the brokers keep for themselves (RocketMQ's retry and dead-letter topics): not a producer's to stage
SYSTEM_TOPIC_PREFIXES: Final = ("%RETRY%", "%DLQ%", "%SYS%")

#: reliable's own Alembic version table: the application's migrations, in the same database, keep theirs in
#: ``alembic_version`` (until 2026-11-28 both used that one, and whichever ran second failed for good)
ALEMBIC_VERSION_TABLE: Final = "reliable_alembic_version"
LEGACY_ALEMBIC_VERSION_TABLE: Final = "alembic_version"
#: the lock two processes migrating one database at once take in turn (PostgreSQL advisory key, MariaDB name)
MIGRATION_LOCK_KEY: Final = 0x72656C69  # "reli"
MIGRATION_LOCK_NAME: Final = "reliable_migrations"
MIGRATION_LOCK_TIMEOUT_S: Final = 600

# --- column sizes (contract with the migrations) --------------------------------------------------------
MESSAGE_ID_MAX: Final = 64
TOPIC_MAX: Final = 127  # RocketMQ: topic length is a signed byte
GROUP_MAX: Final = 255
TAGS_MAX: Final = 255
#: a RocketMQ brokerName (the broker group a queue belongs to); '' where the broker has no groups
BROKER_NAME_MAX: Final = 64
#: how long the RocketMQ 4.x adapter trusts a topic route when naming a queue's broker group (RocketMQ
#: clients refresh routes every 30 s)
ROUTE_CACHE_TTL_S: Final = 30.0

# --- resend sweeper (reliable.sweeper) ------------------------------------------------------------------
#: the backlog estimate never pushes a resend further out than this.
DEFAULT_BACKLOG_CAP_S: Final = 24 * 3600.0
#: a never-received copy with no broker probe answer (RabbitMQ has none) is re-sent once it is this old.
DEFAULT_MAX_UNCONFIRMED_AGE_S: Final = 24 * 3600.0
#: RocketMQ 4.x ``messageDelayLevel`` (1s … 2h): the default fixed backoff list.
#: RocketMQ 4.9's topic/group language (``Validators.PATTERN``): its senders refuse anything else at staging.
ROCKETMQ_NAME_PATTERN: Final = re.compile(r"^[%|a-zA-Z0-9_-]+$")
ROCKETMQ_DELAY_LEVELS: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: the same, in seconds
ROCKETMQ_DELAY_LEVELS_S: Final = tuple(
    int(d[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[d[-1]] for d in ROCKETMQ_DELAY_LEVELS.split()
)
DEFAULT_BACKOFF: Final = "fixed:" + ",".join(ROCKETMQ_DELAY_LEVELS.split())
DEFAULT_NOTIFY_TIMEOUT_S: Final = 10.0
#: how long letting go of a closed event loop's aiosqlite pool waits for its connections to close
AIOSQLITE_CLOSE_TIMEOUT_S: Final = 5.0
#: a sweeper delivering owed notices has them for this long (stub_notification.claimed_until): others skip
#: them meanwhile; a sweeper killed while delivering leaves them owed, delivered again after it. Longer
#: than a batch's delivery can take (one message per kind, each bounded by the notify timeout per step).
NOTIFY_CLAIM_TTL_S: Final = 300.0
#: a notice still owed after this many failed deliveries, or this long after it was raised, is logged at
#: ERROR (before: WARNING): the channel is down for good, or nobody delivers it (a channel dropped from the
#: configuration); the gauges ``reliable_sweeper_notices_owed`` and ``…_oldest_seconds`` show it meanwhile
NOTIFY_ESCALATE_ATTEMPTS: Final = 5
NOTIFY_ESCALATE_AGE_S: Final = 3600.0
NOTIFY_CHANNEL_LOG: Final = "log"
NOTIFY_CHANNEL_EMAIL: Final = "email"
NOTIFY_CHANNEL_WEBHOOK: Final = "webhook"
ENV_SWEEP_SENDER: Final = "RELIABLE_SWEEP_SENDER"  # MODULE:FACTORY, factory(rel) -> Sender
ENV_SWEEP_BACKOFF: Final = "RELIABLE_SWEEP_BACKOFF"
ENV_SMTP_HOST: Final = "RELIABLE_SMTP_HOST"
ENV_SMTP_PORT: Final = "RELIABLE_SMTP_PORT"
ENV_SMTP_STARTTLS: Final = "RELIABLE_SMTP_STARTTLS"
ENV_SMTP_SSL: Final = "RELIABLE_SMTP_SSL"
ENV_SMTP_USER: Final = "RELIABLE_SMTP_USER"
ENV_SMTP_PASSWORD: Final = "RELIABLE_SMTP_PASSWORD"
ENV_SMTP_FROM: Final = "RELIABLE_SMTP_FROM"
ENV_SMTP_TO: Final = "RELIABLE_SMTP_TO"  # comma-separated
ENV_WEBHOOK_URL: Final = "RELIABLE_WEBHOOK_URL"

# --- consumer guard (reliable.guard) ----------------------------------------------------------------------
#: after a Redis failure the guard stays on the database alone this long before trying Redis again.
DEFAULT_REDIS_RETRY_AFTER_S: Final = 1.0
#: a pooled database connection idle longer than this is pinged at checkout (reliable.pool_liveness); one in
#: use within it is checked with a non-blocking poll of its socket instead of a round trip.
POOL_PING_IDLE_S: Final = 5.0
#: logger of the per-decision structured line (message id, group, outcome, reason).
GUARD_LOGGER: Final = "reliable.guard"
#: times a guard work transaction chosen as a deadlock victim is run again at once (then: retry later)
GUARD_DEADLOCK_RETRIES: Final = 2

# --- asyncio flavour (reliable.aio_backends, reliable.guard.aio) ------------------------------------------
#: connections of one event loop's ``redis.asyncio`` pool; a task beyond it waits (up to the socket timeout,
#: then the guard continues on the database alone) instead of failing at once.
DEFAULT_ASYNC_REDIS_CONNECTIONS: Final = 64
#: how long closing a loop bridge (reliable.adapters.aio_bridge) waits for the guard calls still running
#: before it cancels them (each cancel costs its message an attempt); a guard call's own database and Redis
#: waits are bounded well below it.
BRIDGE_CLOSE_GRACE_S: Final = 30.0

# --- broker adapters (reliable.adapters.broker_sim / .rocketmq) --------------------------------------------
#: name server of broker-sim serve / RocketMQ for the adapters' ``sweeper_sender(rel)`` factories.
ENV_BROKER_SIM_NAMESRV: Final = "RELIABLE_BROKER_SIM_NAMESRV"
ENV_ROCKETMQ_NAMESRV: Final = "RELIABLE_ROCKETMQ_NAMESRV"
#: producer group of those factories' senders.
ENV_SENDER_GROUP: Final = "RELIABLE_SENDER_GROUP"
DEFAULT_NAMESRV: Final = "127.0.0.1:9876"
DEFAULT_SENDER_GROUP: Final = "reliable_sweeper"
#: RocketMQ 5.x (gRPC) endpoint ("host:port" of the proxy / broker-sim serve --grpc-port) for
#: ``reliable.adapters.rocketmq5:sweeper_sender``.
ENV_ROCKETMQ5_ENDPOINT: Final = "RELIABLE_ROCKETMQ5_ENDPOINT"
DEFAULT_ROCKETMQ5_ENDPOINT: Final = "127.0.0.1:8081"
#: queue id of a 5.x send receipt: the 5.x protocol reports the offset but not the queue (the proxy picks it)
UNKNOWN_QUEUE_ID: Final = -1
#: invisible duration the 5.x adapters receive with and keep extending while a handler runs
DEFAULT_ROCKETMQ5_INVISIBLE_S: Final = 60
#: a 5.x message whose invisible time could not be extended this many times in a row is not extended again
ROCKETMQ5_EXTEND_FAILURES: Final = 3
#: a 5.x consumer group's maximum delivery attempts unless its retry policy says otherwise (16 retries + 1)
ROCKETMQ5_MAX_DELIVERY_ATTEMPTS: Final = 17
#: RECONSUME_LATER backoff of the 5.x SimpleConsumer loop, by delivery attempt: RocketMQ's delay levels from
#: level 3, as a 4.x consumer's retries get
ROCKETMQ5_RETRY_BACKOFF: Final = "10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: broker URL and exchange of ``reliable.adapters.rabbitmq:sweeper_sender`` (routing key = the stub's topic).
ENV_RABBITMQ_URL: Final = "RELIABLE_RABBITMQ_URL"
ENV_RABBITMQ_EXCHANGE: Final = "RELIABLE_RABBITMQ_EXCHANGE"
#: the queue a resend targeted at one group goes to: a format with ``{group}`` and ``{topic}``
ENV_RABBITMQ_GROUP_QUEUE: Final = "RELIABLE_RABBITMQ_GROUP_QUEUE"
DEFAULT_RABBITMQ_GROUP_QUEUE: Final = "{group}"

# --- Kafka adapter (reliable.adapters.kafka, reliable.adapters.kafka_common) ------------------------------
#: header that carries the business message id (then the key, then ``topic-partition-offset``).
KAFKA_ID_HEADER: Final = "message-id"
#: headers the adapter writes on retry / dead-letter copies and on sends (all UTF-8 text).
KAFKA_HEADER_ORIGINAL_TOPIC: Final = "reliable-original-topic"
KAFKA_HEADER_ORIGINAL_PARTITION: Final = "reliable-original-partition"
KAFKA_HEADER_ORIGINAL_OFFSET: Final = "reliable-original-offset"
KAFKA_HEADER_ATTEMPT: Final = "reliable-attempt"
KAFKA_HEADER_REASON: Final = "reliable-reason"
KAFKA_HEADER_NOT_BEFORE: Final = "reliable-not-before-ms"
KAFKA_HEADER_TAGS: Final = "reliable-tags"
KAFKA_HEADER_SEND_COUNT: Final = "reliable-send-count"
KAFKA_HEADER_TARGET_GROUP: Final = "reliable-target-group"
#: RocketMQ's retry topics: ``%RETRY%{group}`` (4.x, broker_sim), and a 5.x group's pop retry topic
#: ``%RETRY%{group}_{topic}`` (``+`` on a broker with ``enableRetryTopicV2``) that revived messages come from
ROCKETMQ_RETRY_PREFIX: Final = "%RETRY%"
POP_RETRY_SEPARATOR_V1: Final = "_"
POP_RETRY_SEPARATOR_V2: Final = "+"
#: hex digits of the digest that ends a pop retry topic name too long for a topic column
POP_RETRY_DIGEST_CHARS: Final = 8
#: the user property a RocketMQ 5.x resend names the group it is meant for by (the copy goes to the topic)
ROCKETMQ5_TARGET_GROUP_PROPERTY: Final = "RELIABLE_TARGET_GROUP"
#: on a retry or dead-letter copy: the consumer group that forwarded it (another group on an unscoped retry
#: topic leaves it alone)
KAFKA_HEADER_RETRY_GROUP: Final = "reliable-retry-group"
#: envelope property the Kafka consumer loop sets on each record it guards: the highest next offset of the
#: record's partition that may be stored in the guard's transaction (an earlier record's answer is not final
#: yet — its retry copy unconfirmed, or its batch still open). Never taken from a record's wire headers.
KAFKA_COMMIT_FLOOR_PROPERTY: Final = "kafka.commit_floor"
#: ``{topic}.retry.{n}`` for the n-th retry hop, ``{topic}.dlt`` after the last.
KAFKA_RETRY_TOPIC_FORMAT: Final = "{topic}.retry.{n}"
KAFKA_DLT_TOPIC_FORMAT: Final = "{topic}.dlt"
#: seconds before each retry hop (non-blocking retry topics, or blocking pause-and-seek).
KAFKA_DEFAULT_RETRY_DELAYS_S: Final = (1.0, 10.0, 60.0)
#: bootstrap servers of ``reliable.adapters.kafka:sweeper_sender``.
ENV_KAFKA_BOOTSTRAP: Final = "RELIABLE_KAFKA_BOOTSTRAP"
