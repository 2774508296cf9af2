"""The sweeper after ``async def`` consumers behind RocketMQ 4.x push consumers (``broker-sim serve``): what
the broker lost in a power cut after one group consumed it is proven lost by the broker's offsets and re-sent
to the groups that lack it only, and the group that never consumes is an alarm, not a resend storm."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from reliable import Reliability
from reliable.adapters.broker_sim import BrokerSimProbe, BrokerSimSender
from reliable.models import MessageInbox, utcnow
from reliable.sweeper import FixedBackoff, Sweeper
from reliable.types import StubStatus
from tests.adapters.rmq4_aio_topology import (
    Instances,
    async_handler,
    broker_server,
    effect_counts,
    make_rel,
    stage,
    statuses,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
_slots = itertools.count(60)


@pytest.fixture
def rel(server_url: str, redis_url: str, key_prefix: str) -> Iterator[Reliability]:
    r = make_rel(server_url, redis_url, key_prefix, first_resend_delay_s=0)
    yield r
    r.close()


def resends(rel: Reliability, group: str) -> dict[str, int]:
    with Session(rel.engine) as s:
        rows = s.scalars(select(MessageInbox).where(MessageInbox.consumer_group == group))
        return {r.message_id: r.resend_count for r in rows if r.resend_count}


def test_lost_messages_go_to_the_lacking_group_only_and_the_idle_group_is_an_alarm(
    rel: Reliability, tmp_path: Path
) -> None:
    from broker_sim.client.producer import Producer

    server = broker_server(tmp_path, next(_slots) % 50, flush_interval_commit_log_ms="3600000")
    server.start()
    instances = Instances()
    try:
        lost = [f"l-{i}" for i in range(8)]
        stage(rel, server.address, lost)
        billing = async_handler(rel, "billing")
        instances.start(server.address, billing)
        wait_until(
            lambda: set(effect_counts(rel, "billing")) == set(lost), what="billing applied the first 8"
        )
        instances.stop_all()
        server.crash()  # power cut: the 8 were never flushed, the broker restarts without them
        server.start()
        kept = [f"k-{i}" for i in range(8)]  # they take the lost offsets again
        stage(rel, server.address, kept)
        instances.start(server.address, billing)
        instances.start(server.address, async_handler(rel, "audit"))
        wait_until(lambda: set(effect_counts(rel, "audit")) >= set(kept), what="audit applied the kept 8")
        wait_until(lambda: set(effect_counts(rel, "billing")) >= set(kept), what="billing applied the kept 8")

        producer = Producer(server.address, "aio4_sweeper")
        try:
            sweeper = Sweeper(
                rel,
                BrokerSimSender(producer),
                probe=BrokerSimProbe(instances.started[0].consumer.transport),
                backoff=FixedBackoff((0.5,)),
                max_sends=3,
            )
            summary = sweeper.run_once()
            wait_until(lambda: set(effect_counts(rel, "audit")) == set(lost) | set(kept), what="audit healed")
        finally:
            producer.shutdown()
        assert effect_counts(rel, "billing") == dict.fromkeys(lost + kept, 1)
        assert effect_counts(rel, "audit") == dict.fromkeys(lost + kept, 1)
        assert statuses(rel, "audit") == dict.fromkeys(lost + kept, StubStatus.CONFIRMED)
        assert set(resends(rel, "audit")) == set(lost)  # only what audit lacks …
        assert resends(rel, "billing") == {}  # … not what billing applied before the power cut
        # archive never consumed: its rows held and one alarm per queue, not a copy per row to %RETRY%archive
        # archive never consumed: a round after stuck_after holds its rows and raises one alarm per queue; the
        # next round raises none again and neither re-sends a copy per row to %RETRY%archive
        assert summary.never_consumed == 0 and resends(rel, "archive") == {}, summary  # young copies: queued
        later = utcnow() + dt.timedelta(seconds=rel.settings.stuck_after_s + 5)
        producer = Producer(server.address, "aio4_sweeper2")
        try:
            aged = Sweeper(
                rel,
                BrokerSimSender(producer),
                probe=BrokerSimProbe(instances.started[0].consumer.transport),
                max_sends=3,
                clock=lambda: later,
            )
            first, second = aged.run_once(), aged.run_once()
        finally:
            producer.shutdown()
        assert (first.never_consumed, first.resent, second.never_consumed, second.resent) == (4, 0, 0, 0)
        assert resends(rel, "archive") == {}
        assert statuses(rel, "archive") == dict.fromkeys(lost + kept, StubStatus.PENDING)
    finally:
        instances.stop_all()
        server.stop()
