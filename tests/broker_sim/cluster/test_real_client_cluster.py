"""The real RocketMQ client (PyPI ``rocketmq`` 0.4.4, C++ client 1.2.x) against two broker groups behind one
name server: it reads the route's two QueueDatas, sends round robin over all 8 queues of both groups, and
its push consumer's rebalance takes every group's queues (C++ ``TopicPublishInfo``, ``Rebalance``; Java
``MQClientInstance.topicRouteData2TopicPublishInfo`` / ``topicRouteData2TopicSubscribeInfo``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clusters import ClusterFactory
from tests.waiting import wait_until

pytest.importorskip("rocketmq.client")

from tests.broker_sim.remoting.test_real_client import run_worker


def test_real_client_sends_and_consumes_over_two_groups(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = cluster(namesrvs=1, topics={"RealT": 4})
    ns = c.namesrv_addrs[0]
    events = run_worker("produce", ns, {"topic": "RealT", "count": 24}, tmp_path)
    sent = [e for e in events if e["event"] == "sent"]
    assert len(sent) == 24 and all(e["status"] == 0 for e in sent)

    def stored(name: str) -> list[bytes]:
        broker = c.brokers[name].broker
        assert broker is not None
        return [m.body for q in range(4) for m in broker.messages("RealT", q)]

    assert wait_until(lambda: len(stored("broker-a")) + len(stored("broker-b")) == 24)
    # both groups' queues are in the producer's route: the C++ client spreads the sends over all 8 queues (an
    # exact 12/12 split is not promised: a send it retries, e.g. after a slow answer, moves to the next queue)
    assert len(stored("broker-a")) >= 6 and len(stored("broker-b")) >= 6
    events = run_worker("push", ns, {"topic": "RealT", "expect": 24, "group": "RealCG"}, tmp_path)
    bodies = {e["body"] for e in events if e["event"] == "delivery"}
    assert bodies == {f"m{i}" for i in range(24)}
