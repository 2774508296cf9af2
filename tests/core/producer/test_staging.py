"""The stub-first producer against real SQLite, PostgreSQL and MariaDB: staging with the business write,
sending after the commit, failures and crashes between the two, bad input, voiding.

The sender is an in-process implementation of the ``Sender`` protocol that records what it was given (the
broker side is exercised for real in tests/adapters); everything that touches a database is real.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from reliable import Reliability, StubProducer, StubStatus
from reliable.errors import (
    DuplicateMessageIdError,
    InvalidMessageError,
    InvalidStubStateError,
    ReliableError,
    StubNotFoundError,
)
from reliable.models import MessageStub, metadata
from reliable.producer import SendOutcome, StagedMessage, payload_hash, validate_message
from reliable.sender import OutgoingMessage, SendReceipt
from tests.conftest import _ensure_clean_schema
from tests.core.producer.support import DELAY_S, T0, Clock, RecordingSender, inbox, orders, stub


def test_stage_commits_with_business_write_and_sends_after_commit(
    rel: Reliability, producer: StubProducer, sender: RecordingSender, clock: Clock
) -> None:
    with rel.session() as s:
        s.execute(orders.insert().values(id=1, item="book"))
        staged = producer.stage(s, "order-1", "orders", b'{"id": 1}', tags="created")
        assert sender.sent == []  # nothing leaves before the commit
        clock.now = T0 + dt.timedelta(seconds=5)
    assert [m.message_id for m in sender.sent] == ["order-1"]
    out = sender.sent[0]
    assert (out.topic, out.body, out.target_group, out.tags, out.send_count) == (
        "orders",
        b'{"id": 1}',
        None,  # a send to the topic: every subscribed group gets it
        "created",
        0,
    )
    # the default group's inbox row, PENDING, due when the stub is
    assert inbox(rel, "order-1") == {"billing": (StubStatus.PENDING, T0 + dt.timedelta(seconds=5 + DELAY_S))}
    row = stub(rel, "order-1")
    assert row is not None
    assert row.status is StubStatus.PENDING
    assert row.payload_hash == payload_hash(b'{"id": 1}') == staged.payload_hash
    assert (row.send_count, row.queue_id, row.queue_offset, row.last_error) == (1, 3, 100, None)
    assert row.created_at == T0
    assert row.last_sent_at == T0 + dt.timedelta(seconds=5)
    assert row.resend_at == T0 + dt.timedelta(seconds=5 + DELAY_S)


def test_rolled_back_transaction_sends_nothing(
    rel: Reliability, producer: StubProducer, sender: RecordingSender
) -> None:
    with pytest.raises(RuntimeError), rel.session() as s:
        s.execute(orders.insert().values(id=2, item="pen"))
        producer.stage(s, "order-2", "orders", b"x")
        raise RuntimeError("business rule failed")
    assert sender.sent == []
    assert stub(rel, "order-2") is None
    with rel.session() as s:
        assert s.execute(select(orders)).all() == []


def test_session_reused_after_rollback_does_not_send_the_rolled_back_stub(
    rel: Reliability, producer: StubProducer, sender: RecordingSender
) -> None:
    with Session(rel.engine) as s:
        s.begin()
        producer.stage(s, "gone", "orders", b"1")
        s.rollback()
        s.begin()
        producer.stage(s, "kept", "orders", b"2")
        s.commit()
    assert [m.message_id for m in sender.sent] == ["kept"]


def test_savepoint_rollback_drops_only_what_it_staged(
    rel: Reliability, producer: StubProducer, sender: RecordingSender
) -> None:
    with rel.session() as s:
        producer.stage(s, "outer", "orders", b"1")
        with pytest.raises(RuntimeError), s.begin_nested():
            producer.stage(s, "inner", "orders", b"2")
            raise RuntimeError("inner step failed")
    assert [m.message_id for m in sender.sent] == ["outer"]
    assert stub(rel, "inner") is None


def test_transaction_with_a_rolled_back_savepoint_skips_its_stub(
    producer: StubProducer, sender: RecordingSender
) -> None:
    with producer.transaction() as tx:
        tx.stage("t-1", "orders", b"1")
        with pytest.raises(RuntimeError), tx.session.begin_nested():
            tx.stage("t-2", "orders", b"2")
            raise RuntimeError("inner step failed")
    assert [(r.message_id, r.outcome) for r in tx.results] == [
        ("t-1", SendOutcome.SENT),
        ("t-2", SendOutcome.SKIPPED),
    ]
    assert [m.message_id for m in sender.sent] == ["t-1"]


def test_transaction_whose_block_rolled_back_does_not_send_what_the_rollback_removed(
    producer: StubProducer, sender: RecordingSender
) -> None:
    """The block staged a message, its own business write failed, it caught that and rolled the session back
    (SQLAlchemy raises nothing at the exit): the rolled-back message was sent, and the consumer applied an
    order that never existed."""
    with producer.transaction() as tx:
        tx.stage("gone", "orders", b"1")
        tx.session.rollback()
    assert [(r.message_id, r.outcome) for r in tx.results] == [("gone", SendOutcome.SKIPPED)]
    assert sender.sent == []
    assert stub(producer.rel, "gone") is None


@pytest.mark.parametrize("mode", ["conditional_savepoint", "create_savepoint", "rollback_only"])
def test_a_session_joined_to_an_outer_transaction_sends_nothing_before_that_commits(
    rel: Reliability, producer: StubProducer, sender: RecordingSender, mode: str
) -> None:
    """``Session(bind=connection)`` inside ``connection.begin()`` (the pattern of test suites and of
    frameworks that own the transaction): the session's commit commits nothing. The message was sent there,
    and when the outer transaction rolled back the consumer applied a message that never existed. It is left
    for the sweeper, which sends it once it is committed."""
    with rel.engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode=mode) as s:  # type: ignore[arg-type]
            producer.stage(s, "joined", "orders", b"1")
            s.commit()
        assert sender.sent == []
        outer.rollback()
    assert stub(rel, "joined") is None
    with rel.engine.connect() as conn:
        outer = conn.begin()
        with Session(bind=conn, join_transaction_mode=mode) as s:  # type: ignore[arg-type]
            producer.stage(s, "joined-2", "orders", b"1")
            s.commit()
        outer.commit()
    assert sender.sent == []
    row = stub(rel, "joined-2")
    assert row is not None and row.status is StubStatus.PENDING and row.send_count == 0  # the sweeper's


def test_a_session_joined_through_per_table_binds_sends_nothing_before_the_outer_commit(
    rel: Reliability, producer: StubProducer, sender: RecordingSender
) -> None:
    """The same with ``binds={table: connection}`` (multi-database applications): ``session.bind`` is
    ``None`` there, and the check that only looked at it sent the message before the outer rollback."""
    with rel.engine.connect() as conn:
        outer = conn.begin()
        with Session(binds={t: conn for t in metadata.tables.values()}) as s:
            producer.stage(s, "bound", "orders", b"1")
            s.commit()
        assert sender.sent == []
        outer.rollback()
    assert stub(rel, "bound") is None


def test_two_producers_in_one_session_use_their_own_senders(
    rel: Reliability, producer: StubProducer, sender: RecordingSender, clock: Clock
) -> None:
    other_sender = RecordingSender()
    other = StubProducer(rel, other_sender, default_group="audit", clock=clock)
    with rel.session() as s:
        producer.stage(s, "a-1", "orders", b"1")
        other.stage(s, "b-1", "audit", b"2")
    assert [m.message_id for m in sender.sent] == ["a-1"]
    assert [m.message_id for m in other_sender.sent] == ["b-1"]


def test_failed_send_leaves_stub_pending_for_the_sweeper(
    rel: Reliability, producer: StubProducer, sender: RecordingSender, clock: Clock
) -> None:
    sender.broken = True
    with rel.session() as s:
        producer.stage(s, "order-3", "orders", b"x")
    row = stub(rel, "order-3")
    assert row is not None
    assert row.status is StubStatus.PENDING
    assert row.queue_offset is None and row.queue_id is None
    assert row.send_count == 1  # attempted: a lost ACK may still have delivered it
    assert row.last_error == "ConnectionError: broker unreachable"
    assert row.resend_at == T0  # due at the sweeper's next pass

    sender.broken = False
    clock.now = T0 + dt.timedelta(seconds=1)
    [result] = producer.send_staged(_restage(row))
    assert result.outcome is SendOutcome.SENT
    assert sender.sent[0].send_count == 1  # the second hand-over says so
    row = stub(rel, "order-3")
    assert row is not None
    assert (row.send_count, row.queue_offset, row.last_error) == (2, 100, None)


def _restage(row: MessageStub) -> StagedMessage:
    assert row.payload_hash is not None
    return StagedMessage(row.message_id, row.topic, row.content, ("billing",), row.tags, row.payload_hash)


def test_crash_between_commit_and_send_leaves_a_row_the_sweeper_selects(
    rel: Reliability, producer: StubProducer, sender: RecordingSender
) -> None:
    with rel.session() as s:
        producer.stage(s, "order-4", "orders", b"x", send_on_commit=False)
    assert sender.sent == []
    with rel.session() as s:
        due = s.scalars(
            select(MessageStub.message_id).where(
                MessageStub.status == StubStatus.PENDING,
                MessageStub.resend_at <= T0 + dt.timedelta(seconds=DELAY_S),
                MessageStub.queue_offset.is_(None),
            )
        ).all()
    assert due == ["order-4"]


def test_transaction_context_manager_sends_after_commit_and_not_after_error(
    rel: Reliability, producer: StubProducer, sender: RecordingSender
) -> None:
    with producer.transaction() as tx:
        tx.session.execute(orders.insert().values(id=5, item="cup"))
        tx.stage("order-5", "orders", b"a")
        tx.stage("order-6", "orders", b"b", groups=["audit"])
        assert sender.sent == []
    assert [r.outcome for r in tx.results] == [SendOutcome.SENT, SendOutcome.SENT]
    assert [m.message_id for m in sender.sent] == ["order-5", "order-6"]
    assert list(inbox(rel, "order-5")) == ["billing"] and list(inbox(rel, "order-6")) == ["audit"]

    with pytest.raises(KeyError), producer.transaction() as tx2:
        tx2.stage("order-7", "orders", b"c")
        raise KeyError("boom")
    assert tx2.results == []
    assert len(sender.sent) == 2
    assert stub(rel, "order-7") is None


def test_publish_is_stub_plus_send(rel: Reliability, producer: StubProducer, sender: RecordingSender) -> None:
    result = producer.publish("p-1", "orders", b"hello", tags="t")
    assert result.outcome is SendOutcome.SENT
    assert result.receipt == SendReceipt(3, 100, "b-1")
    row = stub(rel, "p-1")
    assert row is not None and row.send_count == 1 and row.tags == "t"


def test_duplicate_message_id_is_a_typed_error(producer: StubProducer, sender: RecordingSender) -> None:
    producer.publish("dup", "orders", b"1")
    with pytest.raises(DuplicateMessageIdError):
        producer.publish("dup", "orders", b"1")
    assert len(sender.sent) == 1


@pytest.mark.parametrize(
    ("message_id", "topic", "group", "tags"),
    [
        ("", "orders", "g", None),
        ("   ", "orders", "g", None),
        ("x" * 65, "orders", "g", None),
        ("k\x00A", "orders", "g", None),  # PostgreSQL: a DataError at flush, untyped
        ("k\ud800", "orders", "g", None),  # no driver can encode it
        ("ok", "", "g", None),
        ("ok", "has space", "g", None),
        ("ok", "no spaces allowed", "g", None),
        ("ok", "t" * 128, "g", None),
        ("ok", "orders", "", None),
        ("ok", "orders", "g/x", None),
        ("ok", "orders", "g", "a||b"),
        ("ok", "orders", "g", "t" * 256),
        # RocketMQ's KEYS separates keys with spaces: "order 1" and "order 2" were both message "order"
        ("order 1", "orders", "g", None),
        ("order\t3", "orders", "g", None),
        ("order\u30001", "orders", "g", None),
        ("k\x01", "orders", "g", None),
        # the brokers' own topics: a send there fails, or lands where no subscriber of the topic reads
        ("ok", "%RETRY%billing", "g", None),
        ("ok", "%DLQ%billing", "g", None),
        # tags: a str (an int raised TypeError, a list was stored as '{a}'), no property separator (tags
        # "t\x02KEYS\x01victim" were delivered as message "victim"), no NUL, no lone surrogate
        ("ok", "orders", "g", 5),
        ("ok", "orders", "g", ["a"]),
        ("ok", "orders", "g", b"x"),
        ("ok", "orders", "g", "t\x02KEYS\x01victim"),
        ("ok", "orders", "g", "t\x00"),
        ("ok", "orders", "g", "t\ud800"),
    ],
)
def test_invalid_input_raises_before_anything_is_written(
    sqlite_url: str, message_id: str, topic: str, group: str, tags: object
) -> None:
    """Validation is backend-independent, so this table of cases runs on SQLite only."""
    _ensure_clean_schema(sqlite_url)
    with Reliability(sqlite_url) as rel:
        producer = StubProducer(rel, RecordingSender())
        with pytest.raises(InvalidMessageError), rel.session() as s:
            producer.stage(s, message_id, topic, b"x", groups=[group], tags=tags)  # type: ignore[arg-type]
        with rel.session() as s:
            assert s.scalar(select(MessageStub.message_id)) is None


@pytest.mark.parametrize(
    "name",
    [
        "KEYS",
        "TAGS",
        "RETRY_TOPIC",
        "UNIQ_KEY",
        "message-id",
        "reliable-retry-group",
        "x-reliable-seq",
        "__x",
    ],
)
def test_a_property_name_a_broker_or_an_adapter_reserves_is_refused(
    rel: Reliability, sender: RecordingSender, name: str
) -> None:
    """Set by a producer, ``KEYS`` replaced the message id on RocketMQ, ``TAGS`` the tags, ``RETRY_TOPIC``
    the topic the consumer saw (and moved the watermark of a retry topic), and a ``reliable-*`` header copied
    from a retry delivery made every copy of a follow-up message another group's, dropped unjournaled."""
    producer = StubProducer(rel, sender, default_group="g")
    with pytest.raises(InvalidMessageError, match="reserved"), rel.session() as s:
        producer.stage(s, "p-1", "orders", b"x", properties={name: "v"})
    with rel.session() as s:
        producer.stage(s, "p-2", "orders", b"x", properties={"DELAY": "1", "origin": "shop\n2"})
    assert [m.message_id for m in sender.sent] == ["p-2"]
    with pytest.raises(InvalidMessageError, match="separators"), rel.session() as s:
        producer.stage(s, "p-3", "orders", b"x", properties={"origin": "a\x01KEYS"})


def test_a_fifo_message_that_is_also_delayed_fails_the_stage_not_every_send(
    rel: Reliability, sender: RecordingSender
) -> None:
    """A RocketMQ 5.x message is FIFO (its ``MESSAGE_GROUP``) or delayed, never both: the client refuses every
    send of such a stub, which the sweeper would re-send until a person was told. The stage refuses it."""
    producer = StubProducer(rel, sender, default_group="g")
    with pytest.raises(InvalidMessageError, match="FIFO message cannot be delayed"), rel.session() as s:
        producer.stage(s, "f-1", "orders", b"x", properties={"MESSAGE_GROUP": "G1", "DELAY": "3"})
    with rel.session() as s:
        producer.stage(s, "f-2", "orders", b"x", properties={"MESSAGE_GROUP": "G1"})
    assert [(m.message_id, dict(m.properties)) for m in sender.sent] == [("f-2", {"MESSAGE_GROUP": "G1"})]


class _Limited(RecordingSender):
    max_body_bytes = 10
    short_string_bytes = 8


@pytest.mark.parametrize(
    ("message_id", "body", "tags", "properties"),
    [
        ("ok", b"x" * 11, None, {}),  # over the broker's largest body
        ("ééééé", b"x", None, {}),  # 5 characters, 10 bytes: an AMQP short string counts bytes
        ("ok", b"x", "t" * 9, {}),
        ("ok", b"x", None, {"ééééé": "v"}),
    ],
)
def test_what_the_senders_broker_refuses_fails_the_stage_not_every_send(
    rel: Reliability, message_id: str, body: bytes, tags: str | None, properties: dict[str, str]
) -> None:
    """Accepted, such a message committed with the business write, every send failed (a 5 MiB body on
    RocketMQ, a 256-byte id on RabbitMQ), and a person heard of it only when the sweeper gave up."""
    producer = StubProducer(rel, _Limited(), default_group="g")
    with pytest.raises(InvalidMessageError, match="broker takes at most"), rel.session() as s:
        producer.stage(s, message_id, "orders", body, tags=tags, properties=properties)
    assert stub(rel, message_id) is None


def test_the_brokers_say_their_limits() -> None:
    from reliable.adapters.broker_sim import BrokerSimSender
    from reliable.adapters.rabbitmq import RabbitMQSender
    from reliable.adapters.rabbitmq_aio import AioRabbitMQSender
    from reliable.aio_producer import GreenletSender

    assert BrokerSimSender.max_body_bytes == 4 * 1024 * 1024
    assert RabbitMQSender.short_string_bytes == AioRabbitMQSender.short_string_bytes == 255
    wrapped = GreenletSender(AioRabbitMQSender("amqp://guest:guest@127.0.0.1/%2F"))
    assert getattr(wrapped, "short_string_bytes", None) == 255  # the async producer checks through it
    assert getattr(wrapped, "name_pattern", None) is None


def test_body_must_be_bytes_and_group_must_be_known(rel: Reliability, sender: RecordingSender) -> None:
    no_default = StubProducer(rel, sender)
    with rel.session() as s:
        with pytest.raises(InvalidMessageError, match="consumer group"):
            no_default.stage(s, "a", "orders", b"x")
        with pytest.raises(InvalidMessageError, match="bytes"):
            no_default.stage(s, "a", "orders", "text", groups=["g"])  # type: ignore[arg-type]
        with pytest.raises(InvalidMessageError, match="list"):
            no_default.stage(s, "a", "orders", b"x", groups="g")
    assert issubclass(InvalidMessageError, ReliableError)


def test_void_pending_and_refuse_confirmed(
    rel: Reliability, producer: StubProducer, sender: RecordingSender
) -> None:
    with rel.session() as s:
        staged = producer.stage(s, "v-1", "orders", b"x", send_on_commit=False)
    producer.void("v-1")
    producer.void("v-1")  # voiding twice is a no-op, not an error
    row = stub(rel, "v-1")
    assert row is not None and row.status is StubStatus.VOIDED and row.resend_at is None
    assert inbox(rel, "v-1") == {"billing": (StubStatus.VOIDED, None)}  # consumers skip it too
    [result] = producer.send_staged(staged)
    assert result.outcome is SendOutcome.SKIPPED
    assert sender.sent == []

    producer.publish("v-2", "orders", b"y")
    with rel.session() as s:
        s.execute(
            update(MessageStub).where(MessageStub.message_id == "v-2").values(status=StubStatus.CONFIRMED)
        )
    with pytest.raises(InvalidStubStateError):
        producer.void("v-2")
    with pytest.raises(StubNotFoundError):
        producer.void("never-staged")


def test_send_result_is_recorded_even_if_the_consumer_confirmed_first(rel: Reliability, clock: Clock) -> None:
    class ConfirmingSender:
        """A broker and consumer so fast the stub is CONFIRMED before the producer records the receipt."""

        def send(self, message: OutgoingMessage) -> SendReceipt:
            with rel.session() as s:
                s.execute(
                    update(MessageStub)
                    .where(MessageStub.message_id == message.message_id)
                    .values(status=StubStatus.CONFIRMED, confirmed_at=clock())
                )
            return SendReceipt(0, 7)

    fast = StubProducer(rel, ConfirmingSender(), default_group="g", clock=clock)
    assert fast.publish("fast-1", "orders", b"x").outcome is SendOutcome.SENT
    row = stub(rel, "fast-1")
    assert row is not None
    assert (row.status, row.send_count, row.queue_offset) == (StubStatus.CONFIRMED, 1, 7)


@settings(max_examples=200, deadline=None)
@given(
    message_id=st.text(min_size=0, max_size=80),
    topic=st.text(alphabet=st.sampled_from("ab_-%|.Z9 "), min_size=0, max_size=130),
)
def test_validation_accepts_exactly_the_documented_language(message_id: str, topic: str) -> None:
    # any text a column holds as it is and RocketMQ's KEYS carries as one key: not empty, at most 64
    # characters, no whitespace, no control character (NUL included), no lone surrogate
    encodable = message_id.encode("utf-8", "surrogatepass").decode("utf-8", "replace") == message_id
    plain = not any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in message_id)
    ok_id = 0 < len(message_id) <= 64 and encodable and plain
    ok_topic = (
        0 < len(topic) <= 127
        and all(c.isascii() and (c.isalnum() or c in "._-%|") for c in topic)
        and not topic.startswith(("%RETRY%", "%DLQ%", "%SYS%"))
    )
    try:
        validate_message(message_id, topic, ["group"], None)
    except InvalidMessageError:
        assert not (ok_id and ok_topic)
    else:
        assert ok_id and ok_topic


def test_after_commit_failure_never_reaches_the_caller_and_is_counted(
    sqlite_url: str, tmp_path: Path, sender: RecordingSender
) -> None:
    """The producer's own database access fails after the caller committed: logged, counted, left to sweep."""
    from prometheus_client import REGISTRY

    def hook_errors() -> float:  # retried, then given up: logged and counted, never raised to the caller
        sample = REGISTRY.get_sample_value("reliable_producer_record_failures_total", {"outcome": "given_up"})
        return sample or 0.0

    _ensure_clean_schema(sqlite_url)
    with Reliability(sqlite_url) as rel, Reliability(f"sqlite:///{tmp_path / 'no-schema.db'}") as broken:
        producer = StubProducer(broken, sender, default_group="g")
        before = hook_errors()
        with rel.session() as s:
            producer.stage(s, "h-1", "orders", b"x")  # staged through the caller's (working) session
        assert hook_errors() == before + 1
        # it was sent, but the receipt could not be recorded: the sweeper will send it again (a duplicate the
        # consumer guard suppresses), never lose it
        assert [m.message_id for m in sender.sent] == ["h-1"]
        row = stub(rel, "h-1")
        assert row is not None and row.status is StubStatus.PENDING and row.queue_offset is None
        assert row.send_count == 0
