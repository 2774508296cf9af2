"""A FastStream Kafka app behind the guard, end to end on Tansu, PostgreSQL and Redis.

What a user of ``@reliable_subscriber(rel, group=…, kafka=policy, subscriber=…)`` needs: every record's effect
applied once although the topic holds a duplicate and a handler fails once, under every ack policy the
subscriber accepts; a record that always fails goes through the retry topic to the DLT, and bad input (a
different body under a known id) to the DLT, each with its reason; the documented app, run as a script and
SIGKILLed mid-handler, losing nothing; a setting that would commit past unguarded records (ACK_FIRST's
auto-commit, ``batch=True``) refused before anything is consumed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from faststream import AckPolicy
from faststream.kafka import KafkaBroker
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select, text

from reliable import Envelope, Reliability
from reliable import constants as C
from reliable.adapters.kafka import RetryPolicy, ensure_topics
from reliable.adapters.kafka.aio import AioKafkaSender
from reliable.demo.tansu import Tansu
from reliable.errors import ConfigurationError
from reliable.integrations.faststream import reliable_subscriber
from reliable.integrations.faststream_kafka import error_pause_s, kafka_parser
from reliable.models import MessageLog
from reliable.sender import OutgoingMessage
from tests.adapters.kafka.helpers import (
    BAD_RECORDS,
    TIMEOUT_S,
    committed,
    effect_counts,
    effects,
    produce,
    read_all,
    with_ids,
)
from tests.adapters.kafka.test_kafka_aio import NOT_IDEMPOTENT

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.redis]
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "ack", [AckPolicy.ACK, AckPolicy.NACK_ON_ERROR, AckPolicy.REJECT_ON_ERROR, AckPolicy.MANUAL]
)
def test_a_faststream_kafka_subscriber_behind_the_guard_applies_each_record_once(
    tansu: Tansu, rel: Reliability, topic: str, group: str, ack: AckPolicy
) -> None:
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    failed_once: set[str] = set()
    broker = KafkaBroker(tansu.bootstrap, logger=None)

    async def on_order(env: Envelope, session: Any) -> None:
        await session.execute(
            effects.insert().values(message_id=env.message_id, consumer_group=group, position="-")
        )
        if env.message_id == "o-bad" or (env.message_id == "o-flaky" and "o-flaky" not in failed_once):
            failed_once.add(env.message_id or "")
            raise RuntimeError(f"boom {env.message_id}")  # rolled back; the guard answers RECONSUME_LATER

    counts: Counter[str] = Counter()
    sub = broker.subscriber(
        *policy.topics(topic),
        group_id=group,
        auto_offset_reset="earliest",
        session_timeout_ms=4000,
        heartbeat_interval_ms=300,
        fetch_max_wait_ms=50,
        ack_policy=ack,
        no_reply=True,
    )
    reliable_subscriber(rel, group=group, kafka=policy, subscriber=sub, counts=counts)(on_order)

    async def scenario() -> None:
        async with AioKafkaSender(tansu.bootstrap, config=NOT_IDEMPOTENT) as sender:
            for mid in ["o-1", "o-2", "o-1", "o-flaky", "o-bad"]:  # o-1 landed twice
                await sender.send(OutgoingMessage(mid, topic, b'{"amount": 1}'))
            await sender.send(OutgoingMessage("o-2", topic, b'{"amount": 999}'))  # a different body, known id
        try:
            async with broker:
                await broker.start()
                deadline = asyncio.get_running_loop().time() + TIMEOUT_S
                while counts["success"] + counts["duplicate"] < 4 or counts["dead_letter"] < 2:
                    assert asyncio.get_running_loop().time() < deadline, f"not settled: {counts}"
                    await asyncio.sleep(0.02)
        finally:
            await rel.aclose()

    asyncio.run(scenario())
    assert counts["duplicate"] == 1 and counts["retry_topic"] == 2  # o-flaky and o-bad, once each
    assert effect_counts(rel.engine, group) == {"o-1": 1, "o-2": 1, "o-flaky": 1}
    dead = read_all(tansu.bootstrap, f"{topic}.dlt", expect=2)
    reasons = {
        dict(m.headers())["message-id"]: dict(m.headers())[C.KAFKA_HEADER_REASON].decode() for m in dead
    }
    assert reasons.keys() == {b"o-2", b"o-bad"}
    assert reasons[b"o-2"].startswith("payload_mismatch")
    # the retry topic's delivery was the last: the guard gave up with it (journaled, the row DEAD)
    assert reasons[b"o-bad"].startswith("max_attempts: attempt 2/") and "boom o-bad" in reasons[b"o-bad"]
    assert "the broker's last delivery" in reasons[b"o-bad"]
    assert committed(tansu.bootstrap, group, topic, 1) == [6]


@pytest.mark.parametrize("bad", ["not-utf8-header", "broken-forwarding-headers"])
def test_an_undecodable_record_is_journaled_before_it_goes_to_the_dlt(
    tansu: Tansu, rel: Reliability, topic: str, group: str, bad: str
) -> None:
    """The consumer loops journal an undecodable record (the report counts it); the FastStream subscriber
    sent it to the DLT and wrote no row — and a header that is not UTF-8 never reached it: FastStream's own
    parser dropped the record, its offset committed (``kafka_parser`` hands it on)."""
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    if bad == "not-utf8-header":
        record = BAD_RECORDS[0]
    else:  # forwarding headers no copy of ours has
        broken = [(C.KAFKA_HEADER_ORIGINAL_TOPIC, topic.encode()), (C.KAFKA_HEADER_ATTEMPT, b"x")]
        record = (b"k-broken", b"v1", broken)
    produce(tansu.bootstrap, topic, [record, BAD_RECORDS[2]])
    broker = KafkaBroker(tansu.bootstrap, logger=None)

    async def on_order(env: Envelope, session: Any) -> None:
        await session.execute(
            effects.insert().values(message_id=env.message_id, consumer_group=group, position="-")
        )

    counts: Counter[str] = Counter()
    sub = broker.subscriber(
        *policy.topics(topic),
        group_id=group,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        parser=kafka_parser,
        ack_policy=AckPolicy.ACK,
        no_reply=True,
    )
    reliable_subscriber(rel, group=group, kafka=policy, subscriber=sub, counts=counts)(on_order)

    async def scenario() -> None:
        try:
            async with broker:
                await broker.start()
                deadline = asyncio.get_running_loop().time() + TIMEOUT_S
                while counts["success"] < 1 or counts["undecodable"] < 1:
                    assert asyncio.get_running_loop().time() < deadline, f"not settled: {counts}"
                    await asyncio.sleep(0.02)
        finally:
            await rel.aclose()

    asyncio.run(scenario())
    [dead] = read_all(tansu.bootstrap, f"{topic}.dlt", expect=1)
    assert dead.value() == b"v1"
    with rel.engine.connect() as conn:
        rows = conn.execute(
            select(
                MessageLog.message_id, MessageLog.queue_offset, MessageLog.outcome, MessageLog.reason
            ).where(MessageLog.consumer_group == group, MessageLog.outcome == "DEAD_LETTER")
        ).all()
    assert [(r.message_id, r.queue_offset) for r in rows] == [(f"undecodable:{topic}-0-0", 0)]
    assert rows[0].reason.startswith("bad_message: undecodable: ")


@pytest.mark.slow
def test_the_documented_app_run_as_a_script_and_killed_mid_handler_loses_no_record(
    tansu: Tansu,
    rel: Reliability,
    topic: str,
    group: str,
    postgres_url: str,
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    """The app of docs/getting-started.md §4.5, started from a script's top level (whose module holds
    ``KafkaBroker`` and ``KafkaMessage``), is SIGKILLed while a handler runs longer than aiokafka's
    auto-commit interval (5 s); restarted, it applies every record exactly once."""
    ids = [f"m{i}" for i in range(6)]
    ensure_topics(tansu.bootstrap, RetryPolicy(delays_s=(0.3,)).all_topics(topic))
    produce(tansu.bootstrap, topic, with_ids(ids))
    log = tmp_path / "app.log"
    argv = ["kafka", tansu.bootstrap, topic, group, postgres_url, redis_url, key_prefix]
    env = dict(os.environ, PYTHONPATH=str(ROOT), SLOW="m2", SLOW_S="8")

    def launch() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "aio" / "faststream_app.py"), *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def applied() -> dict[str, int]:
        with rel.engine.connect() as conn:
            q = "select message_id, count(*) from faststream_app_effects where grp = :g group by message_id"
            return {str(m): int(n) for m, n in conn.execute(text(q), {"g": group})}

    def wait_for(what: str, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while what not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)

    app = launch()
    try:
        wait_for("BEGIN m2", app)
        time.sleep(6.5)  # m2's handler still runs; an auto-commit interval has passed
        os.kill(app.pid, signal.SIGKILL)
        app.wait()
        app = launch()
        deadline = time.monotonic() + 2 * TIMEOUT_S
        while set(applied()) != set(ids):
            assert app.poll() is None and time.monotonic() < deadline, (applied(), log.read_text())
            time.sleep(0.2)
        time.sleep(1.0)  # anything applied twice would show by now
    finally:
        if app.poll() is None:
            os.kill(app.pid, signal.SIGKILL)
            app.wait()
    assert applied() == {m: 1 for m in ids}


@pytest.mark.parametrize("setting", ["default ack policy", "batch"])
def test_a_subscriber_that_would_commit_past_unguarded_records_is_refused_before_it_consumes(
    tansu: Tansu, rel: Reliability, topic: str, group: str, setting: str
) -> None:
    """FastStream's default ACK_FIRST turns on aiokafka's auto-commit (offsets committed while the handler
    runs); ``batch=True`` hands the guard a batch it cannot take. Either would move the group's offsets past
    records nothing journaled: refused when the function is registered, nothing committed."""
    policy = RetryPolicy(delays_s=(0.3,))
    ensure_topics(tansu.bootstrap, policy.all_topics(topic))
    produce(tansu.bootstrap, topic, with_ids(["b-1", "b-2"]))
    broker = KafkaBroker(tansu.bootstrap, logger=None)
    options: dict[str, Any] = {"no_reply": True, "auto_offset_reset": "earliest"}
    if setting == "batch":
        options.update(batch=True, ack_policy=AckPolicy.ACK)
    sub = broker.subscriber(*policy.topics(topic), group_id=group, **options)

    async def on_order(env: Envelope, session: Any) -> None:
        raise AssertionError("never called")

    expected = "drop batch=True" if setting == "batch" else "pass ack_policy=AckPolicy.ACK"
    with pytest.raises(ConfigurationError, match=expected):
        reliable_subscriber(rel, group=group, kafka=policy, subscriber=sub)(on_order)
    assert committed(tansu.bootstrap, group, topic, 1) == [-1001]  # no offset stored for the group


@given(st.integers(min_value=-3, max_value=10_000))
def test_the_wrappers_error_pause_never_makes_a_hot_loop_and_stays_bounded(in_a_row: int) -> None:
    """A lasting error (a retry copy the broker refuses) with ``RetryPolicy(delays_s=(0,))`` took the record
    again ~335 times a second, each a guard call and a traceback: the pause starts at the minimum, doubles
    per error in a row, and stops at the maximum."""
    pause = error_pause_s(in_a_row)
    assert C.KAFKA_ERROR_PAUSE_MIN_S <= pause <= C.KAFKA_ERROR_PAUSE_MAX_S
    if in_a_row >= 1:
        assert error_pause_s(in_a_row + 1) == min(pause * 2, C.KAFKA_ERROR_PAUSE_MAX_S)
    else:  # no error yet counts as the first
        assert pause == C.KAFKA_ERROR_PAUSE_MIN_S
