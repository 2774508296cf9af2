"""The name server's registry, as RocketMQ 4.9.8's ``RouteInfoManager`` keeps it: brokers register, routes
list every group with master and slave addresses, a silent or disconnected broker is dropped. Driven with the
controllable clock: two minutes pass in a microsecond."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_sim.clock import ManualClock
from broker_sim.namesrv.route_info import BROKER_EXPIRED_MS, Registration, RouteInfoManager


def reg(name: str, addr: str, broker_id: int = 0, *, version: int = 1, topics: dict[str, int] | None = None,
        ha: str = "") -> Registration:  # fmt: skip
    table = {t: {"topicName": t, "readQueueNums": n, "writeQueueNums": n, "perm": 6} for t, n in
             (topics if topics is not None else {"T": 4}).items()}  # fmt: skip
    return Registration("C", addr, name, broker_id, ha, table, {"counter": version, "timestamp": 0})


def addrs(route: dict[str, Any] | None) -> dict[str, dict[str, str]]:
    assert route is not None
    return {b["brokerName"]: b["brokerAddrs"] for b in route["brokerDatas"]}


def test_route_lists_every_group_with_its_master_and_slave() -> None:
    """RouteInfoManager.registerBroker/pickupTopicRouteData: one QueueData per group, BrokerData with every
    id; a slave learns its master's address and HA address from the registration result."""
    r = RouteInfoManager(ManualClock())
    r.register(reg("a", "h:1", ha="h:2"))
    r.register(reg("b", "h:3", topics={"T": 2}))
    result = r.register(reg("a", "h:5", 1))
    assert (result.master_addr, result.ha_server_addr) == ("h:1", "h:2")
    route = r.route("T")
    assert addrs(route) == {"a": {"0": "h:1", "1": "h:5"}, "b": {"0": "h:3"}}
    assert route is not None
    assert {q["brokerName"]: q["writeQueueNums"] for q in route["queueDatas"]} == {"a": 4, "b": 2}
    assert r.cluster_info()["clusterAddrTable"] == {"C": ["a", "b"]}
    assert r.topic_names("C") == ["T"] and r.topic_names("Other") == []


def test_a_broker_silent_for_120_s_is_dropped_and_its_group_goes_with_its_last_address() -> None:
    """RouteInfoManager.scanNotActiveBroker: BROKER_CHANNEL_EXPIRED_TIME = 120 s since the last
    registration; re-registering (every 30 s) keeps a broker alive."""
    clock = ManualClock()
    r = RouteInfoManager(clock)
    r.register(reg("a", "h:1"))
    r.register(reg("b", "h:3"))
    r.register(reg("a", "h:5", 1))
    for _ in range(4):  # a's master and b keep registering every 30 s; a's slave goes silent
        clock.advance(30)
        r.register(reg("a", "h:1"))
        r.register(reg("b", "h:3"))
        assert r.scan_not_active() == []
    clock.advance(ms=BROKER_EXPIRED_MS - 120_000 + 1)  # the slave's registration is now 120 s + 1 ms old
    assert r.scan_not_active() == ["h:5"]
    assert addrs(r.route("T")) == {"a": {"0": "h:1"}, "b": {"0": "h:3"}}
    clock.advance(121)
    assert sorted(r.scan_not_active()) == ["h:1", "h:3"]
    assert r.route("T") is None and r.cluster_info()["brokerAddrTable"] == {}


def test_a_group_whose_master_is_gone_keeps_its_queues_on_the_slave() -> None:
    """onChannelDestroy removes the closed broker only; the group's QueueData stays while an address is
    left, so consumers can still find the slave."""
    r = RouteInfoManager(ManualClock())
    master_conn, slave_conn = object(), object()
    r.register(reg("a", "h:1"), master_conn)
    r.register(reg("a", "h:5", 1), slave_conn)
    assert r.channel_closed(master_conn) == ["h:1"]
    assert addrs(r.route("T")) == {"a": {"1": "h:5"}}
    r.unregister("C", "h:5", "a", 1)  # UNREGISTER_BROKER at a clean shutdown
    assert r.route("T") is None


def test_queue_data_changes_only_with_a_new_data_version() -> None:
    """registerBroker rewrites a master's topics only if its DataVersion changed (or on first
    registration); a slave's topic table is never used."""
    r = RouteInfoManager(ManualClock())
    r.register(reg("a", "h:1", version=1, topics={"T": 4}))
    r.delete_topic("T")  # DELETE_TOPIC_IN_NAMESRV
    r.register(reg("a", "h:1", version=1, topics={"T": 4}))
    assert r.route("T") is None
    r.register(reg("a", "h:5", 1, version=9, topics={"T": 4, "S": 1}))
    assert r.route("S") is None
    r.register(reg("a", "h:1", version=2, topics={"T": 8}))
    route = r.route("T")
    assert route is not None and route["queueDatas"][0]["writeQueueNums"] == 8


def test_retry_topics_always_have_a_route_on_every_group_with_a_master() -> None:
    """G11: a clustering push consumer subscribes to %RETRY%<group> before anything was sent back."""
    r = RouteInfoManager(ManualClock())
    assert r.route("%RETRY%G") is None
    r.register(reg("a", "h:1"))
    r.register(reg("b", "h:3"))
    route = r.route("%RETRY%G")
    assert route is not None and [q["readQueueNums"] for q in route["queueDatas"]] == [1, 1]
    assert r.route("Unknown") is None


events = st.lists(
    st.tuples(
        st.sampled_from(["register", "close", "unregister", "tick"]),
        st.sampled_from([("a", 0, "h:1"), ("a", 1, "h:2"), ("b", 0, "h:3"), ("b", 1, "h:4")]),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(events)
def test_two_name_servers_fed_the_same_registrations_agree(
    history: list[tuple[str, tuple[str, int, str]]],
) -> None:
    """Name servers never talk to each other: the same registrations, in the same order, give the same
    routes and cluster info (what lets a client ask any of them). Also: a route never names a group that
    has no live address, and every address in it has registered within 120 s."""
    clock = ManualClock()
    servers = [RouteInfoManager(clock), RouteInfoManager(clock)]
    last: dict[str, int] = {}
    for action, (name, bid, addr) in history:
        for r in servers:
            if action == "register":
                r.register(reg(name, addr, bid), addr)
            elif action == "close":
                r.channel_closed(addr)
            elif action == "unregister":
                r.unregister("C", addr, name, bid)
            else:
                r.scan_not_active()
        if action == "register":
            last[addr] = clock.now_ms()
        elif action == "tick":
            clock.advance(45)
        else:
            last.pop(addr, None)
        assert servers[0].route("T") == servers[1].route("T")
        assert servers[0].cluster_info() == servers[1].cluster_info()
        route = servers[0].route("T")
        for group in addrs(route).values() if route else []:
            assert group, "a route names a group without addresses"
            for a in group.values():
                assert a in last and clock.now_ms() - last[a] <= BROKER_EXPIRED_MS + 45_000
