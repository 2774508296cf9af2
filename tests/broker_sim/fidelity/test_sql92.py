"""SQL92 subscriptions: RocketMQ 4.9.8's selector grammar (``filter/parser/SelectorParser.jj``), its
evaluation rules (``ComparisonExpression``, ``LogicExpression``, ``UnaryExpression``), and the broker's
policy (``ClientManageProcessor.checkClientConfig``, ``PullMessageProcessor``: refused with SYSTEM_ERROR
unless ``enablePropertyFilter``; SUBSCRIPTION_PARSE_FAILED for a bad expression) — never a silent no-match."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_sim import (
    Broker,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageSelector,
    Producer,
    PullConsumer,
    PushConsumer,
)
from broker_sim.common.errors import BrokerResponseError, MQClientError
from broker_sim.common.requests import ExpressionType, PullStatus, ResponseCode, SubscriptionData
from broker_sim.filter import Sql92Error, compile_sql92, parse, render
from broker_sim.filter.sql92 import Between, Compare, Const, In, IsNull, Logic, Node, Prop, Unary
from broker_sim.filter.values import Num
from broker_sim.remoting import BrokerSimServer, RemotingTransport, ServeConfig
from tests.waiting import wait_until

from .conftest import SMALL_STORE

PROPS = {"a": "6", "b": "x", "c": "2.5", "flag": "true", "neg": "-3"}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("a > 5", True),  # String "6" vs Integer 5: Integer.valueOf("6") (__compare, convert on)
        ("a = 6", True),
        ("a <> 6", False),
        ("a BETWEEN 1 AND 6", True),
        ("a NOT BETWEEN 1 AND 6", False),
        ("c > 2", False),  # "2.5" is not an Integer: NumberFormatException → not matched
        ("c > 2.0", True),  # Double.valueOf("2.5")
        ("b IN ('x', 'y')", True),
        ("b NOT IN ('x', 'y')", False),
        ("missing IS NULL", True),
        ("b IS NOT NULL", True),
        ("missing > 1", False),  # unknown, not TRUE
        ("NOT (missing > 1)", False),  # NOT unknown is unknown
        ("missing > 1 OR a = 6", True),
        ("missing > 1 AND a = 6", False),
        ("flag = TRUE", True),  # Boolean.valueOf("true")
        ("b = 'x' AND (a < 10 OR a > 100)", True),
        ("neg < -2", True),
        ("b > 'a'", False),  # two strings with '>': compared as doubles, "x" is none → not matched
        ("a >= 6 and b = 'x'", True),  # keywords in any case
        ("b", False),  # a property as a condition: boolean cast of a string is FALSE
        ("a = 6 -- trailing comment", True),
    ],
)
def test_evaluation_follows_java(expression: str, expected: bool) -> None:
    assert compile_sql92(expression).matches(PROPS) is expected


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "a >",
        "a = 1 AND",
        "a IN (1, 2)",  # IN takes string literals only
        "'x' IN ('x')",  # IN needs a property on its left
        "a BETWEEN 5 AND 1",  # createBetween: low must be <= high
        "a = 0.0",  # createFloat rejects values below Double.MIN_VALUE
        "5",  # not a boolean expression
        "a = 99999999999999999999",  # beyond a long
        "a CONTAINS 'x'",  # 5.x only
        "a = 'open",
    ],
)
def test_invalid_expressions_are_refused(expression: str) -> None:
    with pytest.raises(Sql92Error):
        parse(expression)


# -- round trip ----------------------------------------------------------------------------------------------

names = st.from_regex(r"[a-z_$][a-z0-9_$]{0,6}", fullmatch=True).filter(
    lambda s: s.upper() not in {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"}
)
strings = st.text(st.characters(blacklist_categories=["Cs"]), max_size=8)
numbers = st.one_of(
    st.integers(0, 2**31 - 1).map(lambda v: Num("int", v)),
    st.integers(2**31, 2**63 - 1).map(lambda v: Num("long", v)),
    st.floats(min_value=1e-300, max_value=1e300).map(lambda v: Num("double", v)),
)


def ordered_bounds(between: Between) -> bool:
    """``low <= high`` for a generated BETWEEN, whose bounds are ``numbers.map(Const)``."""
    low, high = between.low, between.high
    assert isinstance(low, Const) and isinstance(low.value, Num)
    assert isinstance(high, Const) and isinstance(high.value, Num)
    return low.value.value <= high.value.value


values: st.SearchStrategy[Node] = st.one_of(
    names.map(Prop), strings.map(Const), numbers.map(Const), numbers.map(lambda n: Unary("-", Const(n)))
)
conditions: st.SearchStrategy[Node] = st.recursive(
    st.one_of(
        st.builds(Compare, st.sampled_from(["=", "<>", ">", ">=", "<", "<="]), values, values),
        st.builds(Between, names.map(Prop), numbers.map(Const), numbers.map(Const), st.booleans()).filter(
            ordered_bounds
        ),
        st.builds(In, names.map(Prop), st.lists(strings, min_size=1, max_size=3).map(tuple), st.booleans()),
        st.builds(IsNull, values, st.booleans()),
        st.sampled_from([Const(True), Const(False), Const(None)]),
    ),
    lambda inner: st.one_of(
        st.builds(Logic, st.sampled_from(["AND", "OR"]), inner, inner),
        inner.map(lambda n: Unary("NOT", n)),
    ),
    max_leaves=8,
)


@settings(deadline=None, max_examples=300)
@given(conditions)
def test_render_parse_round_trip(tree: Node) -> None:
    """Any tree the grammar can express renders to text that parses back to the same tree."""
    assert parse(render(tree)) == tree


@settings(deadline=None, max_examples=200)
@given(conditions, st.dictionaries(names, st.sampled_from(["1", "-7", "2.5", "x", "true", ""]), max_size=4))
def test_evaluation_is_total(tree: Node, props: dict[str, str]) -> None:
    """Evaluating never raises: a Java evaluation error is a non-match, never a crash of the pull."""
    assert compile_sql92(render(tree)).matches(props) in (True, False)


# -- the broker's policy -------------------------------------------------------------------------------------


@pytest.fixture
def filtering_broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "store", topics={"T": 1}, enable_property_filter=True, **SMALL_STORE).start()
    yield b
    b.shutdown()


def _send(broker: Broker) -> None:
    p = Producer(broker, "P")
    for i in range(10):
        p.send(Message("T", f"m{i}".encode(), properties={"n": str(i), "kind": "even" if i % 2 else "odd"}))
    p.shutdown()


def test_pull_with_sql92_returns_only_matching_messages(filtering_broker: Broker) -> None:
    """ExpressionMessageFilter.isMatchedByCommitLog: each message's properties are evaluated."""
    _send(filtering_broker)
    pc = PullConsumer(filtering_broker, "G").start()
    (mq,) = pc.fetch_subscribe_message_queues("T")
    result = pc.pull(mq, MessageSelector.by_sql("n BETWEEN 3 AND 7 AND kind = 'even'"), 0)
    assert result.status is PullStatus.FOUND
    assert [m.body for m in result.msgs] == [b"m3", b"m5", b"m7"]
    assert result.next_begin_offset == 10
    pc.shutdown()


def test_push_consumer_with_sql92(filtering_broker: Broker) -> None:
    seen: list[bytes] = []

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        seen.extend(m.body for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(filtering_broker, "G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    c.subscribe("T", MessageSelector.by_sql("n > 7"), listener).start()
    _send(filtering_broker)
    wait_until(lambda: sorted(seen) == [b"m8", b"m9"], what="the two matching messages")
    c.shutdown()


def test_sql92_refused_loudly_without_property_filter(tmp_path: Path) -> None:
    """enablePropertyFilter is false by default (BrokerConfig 4.9.8): CHECK_CLIENT_CONFIG answers
    SYSTEM_ERROR, so the push consumer fails at start; a pull answers SYSTEM_ERROR too."""
    b = Broker(tmp_path / "store", topics={"T": 1}, **SMALL_STORE).start()
    try:
        c = PushConsumer(b, "G").subscribe("T", MessageSelector.by_sql("n > 7"), lambda msgs: None)
        with pytest.raises(MQClientError, match="does not support consumer to filter message by SQL92"):
            c.start()
        pc = PullConsumer(b, "G2").start()
        (mq,) = pc.fetch_subscribe_message_queues("T")
        with pytest.raises(BrokerResponseError) as err:
            pc.pull(mq, MessageSelector.by_sql("n > 7"), 0)
        assert err.value.code == ResponseCode.SYSTEM_ERROR
        pc.shutdown()
    finally:
        b.shutdown()


def test_unparsable_sql92_is_subscription_parse_failed(filtering_broker: Broker) -> None:
    c = PushConsumer(filtering_broker, "G").subscribe("T", MessageSelector.by_sql("n >"), lambda msgs: None)
    with pytest.raises(MQClientError) as err:
        c.start()
    cause = err.value.__cause__
    assert isinstance(cause, BrokerResponseError) and cause.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


def test_check_client_config_and_sql92_pull_over_tcp(tmp_path: Path) -> None:
    """CHECK_CLIENT_CONFIG (46) and a PULL_MESSAGE with expressionType SQL92 over the remoting protocol."""
    server = BrokerSimServer(
        ServeConfig(
            store_dir=tmp_path / "store", namesrv_port=0, broker_port=0,
            broker_config={"topics": {"T": 1}, "enable_property_filter": True},
        )
    )  # fmt: skip
    server.start()
    try:
        _send_to(server.namesrv_address)
        t = RemotingTransport(server.namesrv_address)
        t.check_client_config("G", "c1", SubscriptionData("T", "n < 2", 0, ExpressionType.SQL92))
        with pytest.raises(BrokerResponseError) as err:
            t.check_client_config("G", "c1", SubscriptionData("T", "n <", 0, ExpressionType.SQL92))
        assert err.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        t.close()
        pc = PullConsumer(server.namesrv_address, "G").start()
        (mq,) = pc.fetch_subscribe_message_queues("T")
        result = pc.pull(mq, MessageSelector.by_sql("n < 2"), 0)
        assert [m.body for m in result.msgs] == [b"m0", b"m1"]
        pc.shutdown()
    finally:
        server.shutdown()


def _send_to(address: str) -> None:
    p = Producer(address, "P")
    for i in range(4):
        p.send(Message("T", f"m{i}".encode(), properties={"n": str(i)}))
    p.shutdown()
