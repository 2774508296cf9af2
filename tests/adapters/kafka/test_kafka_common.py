"""The client-independent Kafka logic: header codec, message id, envelope, retry routing (no broker)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reliable import constants as C
from reliable.adapters.kafka_common import (
    IdSource,
    Record,
    RetryMode,
    RetryPolicy,
    UndecodableRecord,
    decode_headers,
    due_in_s,
    encode_headers,
    forward_headers,
    forwarded_by_another_group,
    last_attempt,
    message_id,
    raw_forward_headers,
    send_headers,
    to_envelope,
)
from reliable.adapters.kafka_steps import Action, AnswerBook, Step, next_step
from reliable.errors import ConfigurationError
from reliable.sender import OutgoingMessage
from reliable.types import ConsumeResult, Envelope

names = st.text(min_size=1, max_size=20)
texts = st.text(max_size=50)


@given(st.dictionaries(names, texts, max_size=8))
def test_text_headers_survive_encoding(headers: dict[str, str]) -> None:
    assert decode_headers(encode_headers(headers)) == headers


@given(st.binary(min_size=1, max_size=20))
def test_a_header_is_either_utf8_text_or_the_record_is_undecodable(raw: bytes) -> None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(UndecodableRecord, match="'h' is not UTF-8"):
            decode_headers([("h", raw)])
    else:
        assert decode_headers([("h", raw)]) == {"h": text}


def test_a_repeated_header_keeps_its_last_value_and_null_is_empty() -> None:
    assert decode_headers([("a", b"1"), ("a", b"2"), ("n", None)]) == {"a": "2", "n": ""}


def rec(key: bytes | None = None, headers: list[tuple[str, bytes | str | None]] | None = None) -> Record:
    return Record("orders.retry.1", 2, 41, key, b"v", headers or [])


@pytest.mark.parametrize(
    ("key", "headers", "allow", "expected"),
    [
        (b"k", [("message-id", b"h")], True, ("h", IdSource.HEADER)),
        (b"k", [("message-id", b"")], True, ("k", IdSource.KEY)),
        (b"k", [], False, ("k", IdSource.KEY)),
        (b"\xff", [], True, ("orders.retry.1-2-41", IdSource.POSITION)),
        (None, [], False, (None, IdSource.NONE)),
        # a retry copy without id: the position of the *original* record, the same on every hop
        (
            None,
            [
                (C.KAFKA_HEADER_ORIGINAL_TOPIC, b"orders"),
                (C.KAFKA_HEADER_ORIGINAL_PARTITION, b"0"),
                (C.KAFKA_HEADER_ORIGINAL_OFFSET, b"7"),
            ],
            True,
            ("orders-0-7", IdSource.POSITION),
        ),
    ],
)
def test_the_message_id_comes_from_the_header_then_the_key_then_the_position(
    key: bytes | None,
    headers: list[tuple[str, bytes | str | None]],
    allow: bool,
    expected: tuple[object, IdSource],
) -> None:
    r = rec(key, headers)
    assert message_id(r, decode_headers(r.headers), C.KAFKA_ID_HEADER, allow) == expected


def test_a_retry_delivery_keeps_its_original_topic_and_counts_its_attempts() -> None:
    original = Record("orders", 0, 7, b"k", b"body", [("message-id", b"m1"), ("x", b"y")], 1000)
    env0 = to_envelope(original)
    assert (env0.topic, env0.delivered_topic, env0.source_topic, env0.reconsume_times) == (
        "orders",
        None,
        "orders",
        0,
    )
    fwd = forward_headers(
        original, decode_headers(original.headers), env0, attempt=1, reason="boom", delay_s=2, now_s=100
    )
    assert fwd[C.KAFKA_HEADER_NOT_BEFORE] == "102000"
    copy = Record("orders.retry.1", 1, 3, b"k", b"body", encode_headers(fwd))
    env1 = to_envelope(copy)
    assert (env1.message_id, env1.topic, env1.delivered_topic, env1.queue_id, env1.queue_offset) == (
        "m1",
        "orders",
        "orders.retry.1",
        1,
        3,
    )
    assert env1.reconsume_times == 1 and env1.properties["x"] == "y"
    # the second hop still points at the first record, not at the retry copy
    fwd2 = forward_headers(copy, decode_headers(copy.headers), env1, attempt=2, reason="again", delay_s=0)
    assert (fwd2[C.KAFKA_HEADER_ORIGINAL_TOPIC], fwd2[C.KAFKA_HEADER_ORIGINAL_OFFSET]) == ("orders", "7")
    policy = RetryPolicy(delays_s=(2.0, 5.0))
    assert due_in_s(copy, fwd, policy, now_s=101) == pytest.approx(1.0)
    assert due_in_s(copy, fwd, policy, now_s=103) == 0.0
    # never longer than the policy's longest delay (a forged or skewed due time)
    assert due_in_s(copy, fwd, policy, now_s=0) == 5.0
    # a record on the business topic (or any other) that carries the header is due now: its headers were
    # copied by someone, it is no retry copy, and waiting held its whole partition
    on_topic = Record("orders", 1, 9, b"k", b"body", encode_headers(fwd))
    assert due_in_s(on_topic, fwd, policy, now_s=0) == 0.0
    elsewhere = Record("invoices", 0, 1, b"k", b"body", encode_headers(fwd))
    assert due_in_s(elsewhere, fwd, policy, now_s=0) == 0.0


def test_incomplete_forwarding_headers_make_the_record_undecodable() -> None:
    with pytest.raises(UndecodableRecord, match="forwarding headers"):
        to_envelope(rec(b"k", [(C.KAFKA_HEADER_ORIGINAL_TOPIC, b"orders"), (C.KAFKA_HEADER_ATTEMPT, b"x")]))


def test_an_undecodable_records_dead_letter_copy_keeps_its_bytes() -> None:
    r = rec(b"k", [("message-id", b"\xff"), (C.KAFKA_HEADER_REASON, b"old")])
    out = raw_forward_headers(r, "undecodable: bad")
    assert ("message-id", b"\xff") in out
    assert dict(out)[C.KAFKA_HEADER_REASON] == b"undecodable: bad"
    assert [k for k, _ in out].count(C.KAFKA_HEADER_REASON) == 1


@given(st.lists(st.floats(min_value=0, max_value=1e6), max_size=6), st.integers(min_value=1, max_value=10))
def test_each_failure_moves_one_retry_topic_further_then_to_the_dlt(
    delays: list[float], attempt: int
) -> None:
    policy = RetryPolicy(tuple(delays))
    hop = policy.after_failure("orders", attempt)
    if attempt <= len(delays):
        assert (hop.topic, hop.delay_s, hop.dead) == (f"orders.retry.{attempt}", delays[attempt - 1], False)
        assert hop.topic in policy.topics("orders")
    else:
        assert (hop.topic, hop.dead) == ("orders.dlt", True)
    assert policy.all_topics("orders")[-1] == "orders.dlt"


def test_a_scope_gives_each_group_its_own_retry_and_dead_letter_topics() -> None:
    policy = RetryPolicy((1.0,), scope="billing")
    assert policy.all_topics("orders") == ["orders", "orders.billing.retry.1", "orders.billing.dlt"]
    assert policy.after_failure("orders", 2).topic == "orders.billing.dlt"


def test_blocking_mode_subscribes_to_the_topic_alone_and_delays_are_checked() -> None:
    assert RetryPolicy((1.0, 2.0), RetryMode.BLOCKING).topics("orders") == ["orders"]
    with pytest.raises(ConfigurationError):
        RetryPolicy((1.0, -1.0))


@dataclass(frozen=True)
class _Answer:
    result: ConsumeResult
    reason: str | None = None
    detail: str | None = None
    duplicate: bool = False


def _env(reconsume_times: int = 0) -> Envelope:
    return Envelope(
        message_id="m", topic="orders", queue_id=0, queue_offset=5, body=b"", reconsume_times=reconsume_times
    )


def test_next_step_is_the_one_decision_of_every_kafka_loop() -> None:
    policy = RetryPolicy(delays_s=(1.0, 2.0))
    assert next_step(_Answer(ConsumeResult.SUCCESS, duplicate=True), _env(), policy, 0) == Action(
        Step.ACK, duplicate=True
    )
    dead = next_step(_Answer(ConsumeResult.DEAD_LETTER, "payload_mismatch", "sha"), _env(), policy, 0)
    assert (dead.step, dead.topic, dead.reason) == (Step.DEAD, "orders.dlt", "payload_mismatch: sha")
    first = next_step(RuntimeError("boom"), _env(), policy, 0)
    assert (first.step, first.topic, first.delay_s, first.attempt) == (Step.FORWARD, "orders.retry.1", 1.0, 1)
    assert "RuntimeError: boom" in first.reason
    last = next_step(_Answer(ConsumeResult.RECONSUME_LATER, "handler_failed"), _env(2), policy, 0)
    assert (last.step, last.topic, last.attempt) == (Step.DEAD, "orders.dlt", 3)
    assert last.reason.startswith("retries exhausted after 3 attempts")
    # not the record's fault: held in place with growing delays, never moved towards the DLT
    for held, delay in [(0, 1.0), (1, 2.0), (7, 2.0)]:
        hold = next_step(_Answer(ConsumeResult.RECONSUME_LATER, "lease_conflict"), _env(), policy, held)
        assert (hold.step, hold.delay_s) == (Step.HOLD, delay)
    blocking = RetryPolicy(delays_s=(1.0,), mode=RetryMode.BLOCKING)
    assert next_step(RuntimeError("x"), _env(), blocking, 0).step is Step.HOLD
    exhausted = next_step(RuntimeError("x"), _env(), blocking, 1, 1)
    assert (exhausted.step, exhausted.topic) == (Step.DEAD, "orders.dlt")


def test_an_outage_in_blocking_mode_holds_the_record_for_as_long_as_it_lasts() -> None:
    """A database outage or a lease conflict is not the record's fault: in blocking mode it holds the head
    record however long it lasts — never to the dead-letter topic (the record was never processed, and
    without a producer row nobody would deliver it again) — and it does not use up the handler's retries."""
    blocking = RetryPolicy(delays_s=(1.0, 2.0), mode=RetryMode.BLOCKING)
    book = AnswerBook()
    tp = ("orders", 0)
    down = _Answer(ConsumeResult.RECONSUME_LATER, "database_unavailable")
    steps = [book.step(tp, down, _env(), blocking) for _ in range(10)]
    assert {s.step for s in steps} == {Step.HOLD} and steps[-1].delay_s == 2.0
    failed = [book.step(tp, RuntimeError("boom"), _env(), blocking) for _ in range(3)]
    assert [s.step for s in failed] == [Step.HOLD, Step.HOLD, Step.DEAD]  # its own two retries, then the DLT
    assert failed[-1].reason.startswith("retries exhausted after 3 attempts")
    assert book.step(tp, _Answer(ConsumeResult.SUCCESS), _env(), blocking).step is Step.ACK
    assert (book.failures[tp], book.handler_failures[tp]) == (0, 0)


def test_both_senders_put_the_same_headers_on_a_stub() -> None:
    message = OutgoingMessage(
        "m-1", "orders", b"", tags="t", send_count=2, properties={"a": "b"}, target_group="billing"
    )
    assert dict(send_headers(message)) == {
        "a": b"b",
        C.KAFKA_ID_HEADER: b"m-1",
        C.KAFKA_HEADER_SEND_COUNT: b"2",
        C.KAFKA_HEADER_TAGS: b"t",
        C.KAFKA_HEADER_TARGET_GROUP: b"billing",
    }


def test_only_a_copy_another_group_forwarded_to_a_retry_topic_is_left_alone() -> None:
    """An unscoped retry topic is read by every group: a copy names the group that forwarded it, and only a
    copy that still sits on a retry topic is another group's business (a dead-letter copy replayed onto the
    original topic is everyone's again; a copy from before the header existed is handled as it was)."""
    original = Record("orders", 0, 7, b"k", b"body", [("message-id", b"m1")])
    env = to_envelope(original)
    fwd = forward_headers(original, {}, env, attempt=1, reason="boom", delay_s=0, group="billing")
    assert fwd[C.KAFKA_HEADER_RETRY_GROUP] == "billing"
    copy = Record("orders.retry.1", 0, 3, b"k", b"body", encode_headers(fwd))
    headers = decode_headers(copy.headers)
    policy = RetryPolicy(delays_s=(1.0, 2.0))
    assert forwarded_by_another_group(copy, headers, "audit", policy)
    assert not forwarded_by_another_group(copy, headers, "billing", policy)  # its own copy
    replayed = Record("orders", 0, 9, b"k", b"body", encode_headers(fwd))  # a DLT copy put back on the topic
    assert not forwarded_by_another_group(replayed, decode_headers(replayed.headers), "audit", policy)
    older = {k: v for k, v in headers.items() if k != C.KAFKA_HEADER_RETRY_GROUP}
    assert not forwarded_by_another_group(copy, older, "audit", policy)
    # a follow-up message on another topic that carries a retry delivery's headers (a handler copied them):
    # not a retry copy of anything — every copy of it was dropped, unjournaled
    follow_up = Record("invoices", 0, 1, b"k", b"body", encode_headers(fwd))
    assert not forwarded_by_another_group(follow_up, headers, "audit", policy)


def test_the_last_delivery_is_marked_last_attempt_by_the_records_or_the_heads_failures() -> None:
    policy = RetryPolicy(delays_s=(1.0, 2.0))
    assert [last_attempt(_env(n), policy).last_attempt for n in range(3)] == [False, False, True]
    blocking = RetryPolicy(delays_s=(1.0,), mode=RetryMode.BLOCKING)
    assert not last_attempt(_env(5), blocking).last_attempt  # the record's header does not count here
    assert [last_attempt(_env(0), blocking, failed).last_attempt for failed in range(3)] == [
        False,
        True,
        True,
    ]
    assert last_attempt(_env(0), RetryPolicy(delays_s=(), mode=RetryMode.BLOCKING)).last_attempt
    assert last_attempt(_env(0), RetryPolicy(delays_s=())).last_attempt  # no retry topic at all
