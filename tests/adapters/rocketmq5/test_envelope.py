"""The 5.x adapter's pure parts: the Envelope of a received message, and the extension timing check."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from broker_sim.grpc.receipt import ReceiptHandle
from reliable import constants as C
from reliable.adapters.rocketmq5 import InvisibilityExtender, check_timing, retry_delay_s, to_envelope
from reliable.errors import ConfigurationError
from tests.waiting import wait_until


def received(**kw: object) -> SimpleNamespace:
    """What the 5.x client's ``Message`` exposes after a receive (the attributes the adapter reads)."""
    handle = ReceiptHandle(0, 1, 30_000, "broker-b", 3, 41, 9000, 7).encode()
    base = {"keys": {"order-9"}, "message_id": "01ABC", "topic": "orders", "receipt_handle": handle,
            "body": b"{}", "tag": "paid", "delivery_attempt": 3, "properties": {"trace": "x"}}  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_envelope_of_a_5x_delivery() -> None:
    env = to_envelope(received())
    assert (env.message_id, env.topic, env.queue_id, env.queue_offset) == ("order-9", "orders", 3, 41)
    assert env.broker_name == "broker-b"  # the handle names the broker group: the queue's identity
    assert (env.tags, env.keys, env.reconsume_times, dict(env.properties)) == (
        "paid",
        "order-9",
        2,
        {"trace": "x"},
    )


def test_a_resend_labelled_for_a_group_names_it_in_the_envelope() -> None:
    labelled = to_envelope(received(properties={C.ROCKETMQ5_TARGET_GROUP_PROPERTY: "billing"}))
    assert (labelled.target_group, to_envelope(received()).target_group) == ("billing", None)


def test_envelope_falls_back_to_the_message_id_and_an_unknown_position() -> None:
    env = to_envelope(received(keys=set(), receipt_handle="opaque"))
    assert (env.message_id, env.broker_name, env.queue_id, env.queue_offset) == ("01ABC", "", -1, -1)


def test_several_keys_are_no_id_and_the_guard_dead_letters_the_message() -> None:
    """Two orders sharing a customer key (keys {order-1, cust-7} and {order-2, cust-7}) were both message
    ``cust-7``: the second acknowledged as the first's duplicate, never applied. The client keeps keys as a
    set, so no rule can pick "the" id: the message has none, and the guard dead-letters it."""
    env = to_envelope(received(keys={"order-1", "cust-7"}))
    assert env.message_id is None and env.keys == "cust-7 order-1"


def test_the_delivery_at_the_groups_max_attempts_is_the_last() -> None:
    assert [to_envelope(received(delivery_attempt=n)).last_attempt for n in (1, 16, 17, 18)] == [
        False,
        False,
        True,
        True,
    ]
    assert [to_envelope(received(delivery_attempt=n), max_attempts=3).last_attempt for n in (2, 3)] == [
        False,
        True,
    ]


def test_retry_backoff_follows_rocketmq_delay_levels_from_level_3() -> None:
    assert [retry_delay_s(n) for n in (1, 2, 3, 16, 40)] == [10, 30, 60, 7200, 7200]


def test_extension_must_come_before_the_invisible_time_runs_out() -> None:
    check_timing(30, 10)
    for every in (30, 45, 0):
        with pytest.raises(ConfigurationError):
            check_timing(30, every)


def test_a_message_whose_invisible_time_cannot_be_extended_is_given_up_after_three_tries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Once a handle is stale (the message became visible, another consumer has it) every change fails: a
    traceback every ``extend_every_s`` until the handler ended (25 in 5 s). One traceback, a warning when it
    gives up on the message, and the other messages are still extended."""
    calls: list[str] = []

    def change(message: SimpleNamespace, invisible_s: int) -> None:
        calls.append(message.message_id)
        if message.message_id == "stale":
            raise RuntimeError("40013 receipt handle is stale")

    stale, fine = received(message_id="stale"), received(message_id="fine")
    with InvisibilityExtender(change, [stale, fine], 30, 0.01) as ext:
        wait_until(
            lambda: stale not in ext.pending and calls.count("fine") >= 5, what="the stale one dropped"
        )
    assert calls.count("stale") == 3 and fine in ext.pending
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and any("stopped extending stale" in r.getMessage() for r in caplog.records)


def test_local_runs_count_each_delivery_and_forget_what_is_over() -> None:
    """A FIFO push client's local retries keep the message id and delivery attempt (the handle changes with
    every extension); a redelivery by the broker is counted afresh; old deliveries do not pile up."""
    from reliable.adapters.rocketmq5_fifo import LocalRuns

    runs = LocalRuns(max_tracked=2)
    first = received(delivery_attempt=1)
    assert [runs.start(first), runs.start(received(delivery_attempt=1, receipt_handle="new"))] == [1, 2]
    assert runs.start(received(delivery_attempt=2)) == 1  # the broker delivered it again
    runs.forget(first)
    assert runs.start(first) == 1
    runs.start(received(message_id="other"))
    assert len(runs) == 2
    env = to_envelope(received(delivery_attempt=1), max_attempts=3, attempt=3)
    assert (env.reconsume_times, env.last_attempt) == (2, True)
