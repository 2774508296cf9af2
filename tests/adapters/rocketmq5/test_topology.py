"""A production topology on the 5.x adapter: one topic of 4 queues, a stub-first producer with inbox rows for
two consumer groups — a NORMAL one and a FIFO one whose messages come in message groups — and ``reliable``
consumers through the 5.x adapter, against broker_sim's gRPC front end on a manual clock.

What a user needs: each group applies each message once, and the FIFO group applies each message group's
messages in the order they were staged, a retried message included (no later one of its message group
overtakes it). A stub-first producer had no way to give a 5.x message its message group (the sender sent
every stub as a NORMAL message), so a FIFO group saw each message as a message group of its own and applied
a retried message after the ones staged behind it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from broker_sim.grpc.policy import GroupPolicy
from broker_sim.remoting.serve import BrokerSimServer
from reliable.adapters.rocketmq5 import retry_delay_s
from reliable.staged import DELAY_PROPERTY, MESSAGE_GROUP_PROPERTY
from tests.adapters.rocketmq5.conftest import TOPIC, GrpcBroker, GrpcBrokerFactory
from tests.adapters.rocketmq5.test_adapter import Worker, applied, inbox_status, journal, start
from tests.adapters.rocketmq5.test_adapter import db as db  # the fixture
from tests.adapters.rocketmq5.test_adapter import workers as workers  # the fixture
from tests.adapters.rocketmq5.test_fifo_adapter import applied_in_order
from tests.adapters.rocketmq5.test_fifo_adapter import ordered_db as ordered_db  # the fixture
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(240)]
#: fixed ports (name server, 4.x broker, gRPC) for a broker that restarts: its clients reconnect to them
PORTS = (16601, 16602, 16603)
#: the sweepers' max_unconfirmed_age (s): a 5.x-sent stub has no queue, so no probe proves it lost before
MAX_AGE_S = 600
AN_HOUR = 3600.0


@pytest.fixture
def tag() -> Iterator[str]:
    yield uuid.uuid4().hex[:6]


def stub_status(db: str, key: str) -> str | None:
    engine = create_engine(db)
    with engine.connect() as conn:
        status = conn.execute(
            text("SELECT status FROM message_stub WHERE message_id = :m"), {"m": key}
        ).scalar()
    engine.dispose()
    return None if status is None else str(status)


def produce(
    broker: GrpcBroker, db: str, workers: list[Worker], control: Path, groups: list[str],
    messages: list[tuple[str, str, str]],
) -> None:  # fmt: skip
    """Stage and send ``(message group, key, body)`` in order (``StubProducer`` + ``RocketMQ5Sender``)."""
    start(broker, db, workers, control, mode="produce", groups=groups,
          ids=[k for _, k, _ in messages], bodies={k: b for _, k, b in messages},
          properties={k: {MESSAGE_GROUP_PROPERTY: g} for g, k, _ in messages})  # fmt: skip


def test_a_stub_first_fifo_message_group_keeps_its_order_through_a_retry_and_each_group_applies_once(
    make_broker: GrpcBrokerFactory, ordered_db: str, workers: list[Worker], tmp_path: Path, tag: str
) -> None:
    """G1: A1 (fails once), A2, A3; G2: B1, B2 — staged in that order for a NORMAL and a FIFO group. The FIFO
    group applies A1, A2, A3 and B1, B2 in order (A1's retry holds G1 back, not G2); the NORMAL group applies
    every message once; every stub ends CONFIRMED."""
    normal, fifo = f"norm{tag}", f"fifo{tag}"
    broker = make_broker(groups={fifo: GroupPolicy(fifo=True)})
    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop
    a = [f"A{i}-{tag}" for i in (1, 2, 3)]
    b = [f"B{i}-{tag}" for i in (1, 2)]
    messages = [("G1", a[0], "flaky"), ("G2", b[0], "b1"), ("G1", a[1], "a2"), ("G2", b[1], "b2"),
                ("G1", a[2], "a3")]  # fmt: skip
    produce(broker, ordered_db, workers, tmp_path / "p", [normal, fifo], messages)
    for group in (normal, fifo):
        start(broker, ordered_db, workers, tmp_path / group, group=group, invisible_s=30, extend_every_s=0.2)
    wait_until(lambda: journal(ordered_db, a[0], fifo), what="the FIFO group's first attempt at A1")
    wait_until(lambda: journal(ordered_db, a[0], normal), what="the NORMAL group's first attempt at A1")
    wait_until(lambda: set(applied_in_order(ordered_db, fifo)) >= set(b), what="G2 applied meanwhile")
    backoff_ms = retry_delay_s(1) * 1000

    def fifo_waits_for_a1() -> bool:
        handles = pop.inflight(fifo, TOPIC).values()
        return bool(handles) and all(h.invisible_ms == backoff_ms for h in handles)

    wait_until(fifo_waits_for_a1, what="G1 waiting for A1's retry")
    assert applied_in_order(ordered_db, fifo) == b  # nothing of G1 overtook A1
    broker.advance(backoff_ms / 1000 + 1)
    wait_until(lambda: len(applied_in_order(ordered_db, fifo)) == 5, what="the FIFO group applies all five")
    wait_until(lambda: len(applied_in_order(ordered_db, normal)) == 5, what="the NORMAL group applies all")
    order = applied_in_order(ordered_db, fifo)
    assert [k for k in order if k in a] == a and [k for k in order if k in b] == b
    assert sorted(applied_in_order(ordered_db, normal)) == sorted(a + b)
    for key in a + b:
        assert len(applied(ordered_db, key)) == 2
        assert inbox_status(ordered_db, key, fifo) == inbox_status(ordered_db, key, normal) == "CONFIRMED"
        assert stub_status(ordered_db, key) == "CONFIRMED"


def test_a_delayed_stub_is_delivered_after_its_delay_and_applied_once_per_group(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path, tag: str
) -> None:
    """A stub staged with ``DELAY`` level 3 (10 s) for two groups: held back for its delay, then applied by
    each group once. The 5.x sender stamped the delivery time in milliseconds where the 5.1.2 client sends
    seconds, so the broker held the message a thousand times too long (until the year ~58000): never
    delivered, re-sent with the same stamp by the sweeper until it gave up."""
    normal, other = f"dnorm{tag}", f"doth{tag}"
    broker = make_broker(clock_start_ms=int(time.time() * 1000))  # the sender stamps wall-clock times
    key = f"D-{tag}"
    start(broker, db, workers, tmp_path / "p", mode="produce", groups=[normal, other], ids=[key],
          properties={key: {DELAY_PROPERTY: "3"}})  # fmt: skip
    for group in (normal, other):
        start(broker, db, workers, tmp_path / group, group=group)
    b = broker.server.broker
    assert b is not None
    assert sum(b.get_max_offset(TOPIC, q) for q in range(4)) == 0  # held back: nothing delivered yet
    assert applied(db, key) == []
    broker.advance(120)  # past the delay (10 s after a send made since the clock started)
    wait_until(lambda: len(applied(db, key)) == 2, what="both groups to apply the delayed stub")
    assert sorted(g for g, _ in applied(db, key)) == sorted([normal, other])
    assert stub_status(db, key) == "CONFIRMED"


def restart(broker: GrpcBroker) -> None:
    """Stop the broker (its gRPC front end, 4.x remoting and name server) and start it again on the same store
    directory, ports and clock, as an operator's stop/start of the process does."""
    config = broker.server.config
    broker.server.shutdown()
    broker.server = BrokerSimServer(config)
    broker.server.start()


def test_a_broker_restart_with_deliveries_in_flight_loses_nothing_and_keeps_fifo_order(
    make_broker: GrpcBrokerFactory, ordered_db: str, workers: list[Worker], tmp_path: Path, tag: str
) -> None:
    """Both groups are inside A1's handler (their receipt handles outstanding, B1 waiting in the same batch)
    when the broker stops and starts again on its directory: its in-flight state is gone, the consumers'
    handles with it. Each group still applies each message once, the FIFO group in each message group's
    order, every stub ends CONFIRMED, and what a fresh receive still gets is a copy already applied."""
    normal, fifo = f"rnorm{tag}", f"rfifo{tag}"
    broker = make_broker(groups={fifo: GroupPolicy(fifo=True)}, ports=PORTS)
    a = [f"RA{i}-{tag}" for i in (1, 2, 3)]
    b = [f"RB{i}-{tag}" for i in (1, 2)]
    messages = [("G1", a[0], "slow"), ("G2", b[0], "b1"), ("G1", a[1], "a2"), ("G2", b[1], "b2"),
                ("G1", a[2], "a3")]  # fmt: skip
    produce(broker, ordered_db, workers, tmp_path / "p", [normal, fifo], messages)
    for group in (normal, fifo):
        control = tmp_path / group
        start(broker, ordered_db, workers, control, group=group, invisible_s=30, extend_every_s=0.2)
        wait_until(lambda c=control: list(c.glob(f"started-{a[0]}-*")), what=f"{group} inside A1")  # type: ignore[misc]
    restart(broker)
    for group in (normal, fifo):
        (tmp_path / group / "release").touch()
    broker.advance(31)  # past any invisible time given before the restart
    for group in (normal, fifo):
        wait_until(lambda g=group: len(applied_in_order(ordered_db, g)) >= 5, what=f"{group} applies all")  # type: ignore[misc]
    order = applied_in_order(ordered_db, fifo)
    assert [k for k in order if k in a] == a and [k for k in order if k in b] == b
    for w in workers:
        w.stop()
    for group in (normal, fifo):
        assert sorted(applied_in_order(ordered_db, group)) == sorted(a + b)
        broker.advance(600)
        probe = broker.client()
        probe.call("simple", group=group, topic=TOPIC, await_s=1)
        # a copy whose acknowledgement the restart made void (its handle gone), and whose redelivery the
        # workers were stopped before answering, comes back once more: it must be one the group applied
        # already — the guard answers it as a duplicate — never a message nobody applied
        left = probe.call("receive", max=16, invisible_s=30)["messages"]
        assert {k for m in left for k in m["keys"]} <= set(a + b)
    for key in a + b:
        assert stub_status(ordered_db, key) == "CONFIRMED"


def sweep(
    broker: GrpcBroker, db: str, workers: list[Worker], control: Path, ahead_s: float
) -> dict[str, Any]:
    """One sweeper round over ``RocketMQ5Sender``, its clock ``ahead_s`` ahead; the round's summary."""
    w = start(broker, db, workers, control, mode="sweep", ahead_s=ahead_s, max_unconfirmed_age_s=MAX_AGE_S)
    w.stop()
    [summary] = json.loads(w.first_line)
    return dict(summary)


def test_a_group_that_never_consumes_raises_the_alarm_instead_of_resends_to_every_group(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path, tag: str
) -> None:
    """Stubs staged for a NORMAL group and a group that was never deployed. Past ``max_unconfirmed_age``
    the sweeper must not re-send them: over 5.x a resend lands on the shared topic, so the NORMAL group
    would take a copy of every message at every resend (DESIGN.md §3: a group that never consumed raises an
    alarm, not a resend storm) — the never-consumed alarm tells a person, and the NORMAL group's journal
    shows each message once."""
    normal, ghost = f"gnorm{tag}", f"ghost{tag}"
    broker = make_broker()
    keys = [f"N{i}-{tag}" for i in range(3)]
    start(broker, db, workers, tmp_path / "p", mode="produce", groups=[normal, ghost], ids=keys)
    start(broker, db, workers, tmp_path / normal, group=normal)
    wait_until(lambda: all(applied(db, k) for k in keys), what="the NORMAL group applies all")
    summary = sweep(broker, db, workers, tmp_path / "s", ahead_s=AN_HOUR)  # past stuck_after and the max age
    assert summary["resent"] == 0, summary
    assert summary["never_consumed"] >= 1, summary
    for key in keys:
        assert inbox_status(db, key, ghost) == "PENDING"
        assert [o for _, o in journal(db, key, normal)] == ["SUCCESS"]
