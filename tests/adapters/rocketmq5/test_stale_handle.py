"""A 5.x consumer settling a message whose receipt handle went stale: its invisible time ran out while the
handler ran and another receive took it, so the broker has a newer handle for it.

What a user needs: a message the guard dead-letters lands in ``%DLQ%{group}`` exactly once, its row ends
``DEAD`` with a person told once, and its FIFO message group goes on. A proxy forwards on any handle (by the
message's commit-log offset) and only its ack part fails on a stale one, so forwarding on the stale handle
made a DLQ copy while the message stayed in flight — it came back, the guard dead-lettered it again (its
row was DEAD) and the forward made a second copy. Now the consumer first renews the handle (a change of
invisible duration, which a stale handle fails) and forwards only on a handle that is current; a stale one
is left to the receive that holds the message now. For a handler that succeeded, the ack refused on a
stale handle is a WARNING line, not a traceback, and the effect still happens once (the guard's done marker).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from broker_sim.grpc.policy import GroupPolicy
from reliable.models import utcnow
from reliable.sweeper.giveup import tell_unreported
from tests.adapters.rocketmq5.conftest import TOPIC, GrpcBrokerFactory
from tests.adapters.rocketmq5.test_adapter import Worker, applied, inbox_status, journal, send, start
from tests.adapters.rocketmq5.test_adapter import db as db  # the fixture
from tests.adapters.rocketmq5.test_adapter import workers as workers  # the fixture
from tests.adapters.rocketmq5.test_fifo_adapter import dlq_count, send_fifo
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(240)]
#: the workers' invisible duration; their own extension (real seconds) never comes during a test
INVISIBLE_S, EXTEND_EVERY_S = 300, 200.0


def told(db: str, key: str, group: str) -> int:
    """How many DEAD notices the sweeper's give-up step gives for ``key`` now (it tells a row once)."""
    engine = create_engine(db)
    with engine.begin() as conn:
        notices = tell_unreported(conn, now=utcnow(), limit=10_000)
    engine.dispose()
    return sum(1 for n in notices if n.message_id == key and n.consumer_group == group)


@pytest.mark.parametrize("mode", ["simple", "push"])
def test_a_message_dead_lettered_on_a_stale_handle_lands_in_the_dlq_once_and_its_group_goes_on(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path, mode: str
) -> None:
    """K's handler outlives its invisible time; another receive takes K (a newer handle) and holds it.
    K's handler then fails for the last time: the guard ends the row DEAD and answers DEAD_LETTER on the
    stale handle. Once the other receive lets K go, K comes back and is dead-lettered on a current handle.
    Before: two DLQ copies (the stale forward's and that one). Now: one; K2 behind K in its message group is
    applied; the row is DEAD and told once."""
    tag = uuid.uuid4().hex[:6]
    group, key, after, control = f"stale{mode[0]}{tag}", f"K-{tag}", f"K2-{tag}", tmp_path / "c"
    broker = make_broker(groups={group: GroupPolicy(fifo=True)})
    start(broker, db, workers, control, group=group, mode=mode, guard_max_attempts=1,
          invisible_s=INVISIBLE_S, extend_every_s=EXTEND_EVERY_S)  # fmt: skip
    send_fifo(broker, "G1", (key, "slow-poison"), (after, "after"))
    wait_until(lambda: list(control.glob(f"started-{key}-*")), what="K's handler to start")
    assert broker.server.grpc is not None
    pop = broker.server.grpc.pop
    [first] = pop.inflight(group, TOPIC).values()
    broker.advance(INVISIBLE_S + 1)  # past the push deliveries' 60 s (no renewal past it) and the 300 s
    if mode == "simple":  # the worker is in K's handler: another consumer takes K
        thief = broker.client()
        thief.call("simple", group=group, topic=TOPIC, await_s=1)
        [taken] = thief.call("receive", max=1, invisible_s=30)["messages"]
        assert taken["keys"] == [key] and taken["attempt"] == 2
    else:  # the push client's own receive takes K again (it waits behind the run in its message group)
        wait_until(
            lambda: [h.serial for h in pop.inflight(group, TOPIC).values()] not in ([], [first.serial]),
            what="K received again",
        )
    (control / "release").touch()  # K fails; the guard gives up on it (max_attempts 1)
    wait_until(lambda: inbox_status(db, key, group) == "DEAD", what="K's row DEAD")
    wait_until(lambda: len(journal(db, key, group)) >= 1, what="K's DEAD_LETTER journal row")
    broker.advance(31)  # simple: the other receive's handle runs out and K comes back to the worker
    wait_until(lambda: applied(db, after), what="K2, behind K in its message group")
    wait_until(lambda: dlq_count(broker, group) >= 1, what="K's DLQ copy")
    assert [o for _, o in journal(db, key, group)] == ["DEAD_LETTER", "DEAD_LETTER"]
    assert dlq_count(broker, group) == 1
    assert applied(db, key) == []
    assert told(db, key, group) == 1 and told(db, key, group) == 0


def test_an_ack_refused_on_a_stale_handle_is_logged_as_such_and_the_effect_happens_once(
    make_broker: GrpcBrokerFactory, db: str, workers: list[Worker], tmp_path: Path
) -> None:
    """Non-FIFO SimpleConsumer: the handler outlives its invisible time and succeeds; meanwhile another
    receive took the message. The ack on the stale handle is refused: one WARNING line that says so (it was
    a traceback under "could not settle"), and the redelivery is a duplicate — applied once."""
    tag = uuid.uuid4().hex[:6]
    group, key, control = f"stack{tag}", f"A-{tag}", tmp_path / "c"
    broker = make_broker()
    worker = start(broker, db, workers, control, group=group, invisible_s=INVISIBLE_S,
                   extend_every_s=EXTEND_EVERY_S)  # fmt: skip
    send(broker, "slow", key)
    wait_until(lambda: list(control.glob(f"started-{key}-*")), what="the handler to start")
    broker.advance(INVISIBLE_S + 1)
    thief = broker.client()
    thief.call("simple", group=group, topic=TOPIC, await_s=1)
    [taken] = thief.call("receive", max=1, invisible_s=30)["messages"]
    assert taken["keys"] == [key]
    (control / "release").touch()
    wait_until(lambda: applied(db, key), what="the application")
    broker.advance(31)  # the other receive's handle runs out: the message comes back, a duplicate
    wait_until(lambda: len(journal(db, key, group)) >= 2, what="the redelivery's journal row")
    assert [o for _, o in journal(db, key, group)] == ["SUCCESS", "DUPLICATE"]
    assert len(applied(db, key)) == 1
    worker.stop()
    text = (control / "workers.log").read_text()
    assert "receipt handle is stale" in text
    assert "could not settle" not in text and "Traceback" not in text
