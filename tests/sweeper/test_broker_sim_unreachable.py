"""The sweeper against broker_sim broker groups that do not answer.

Found by a cluster test with one master hung (SIGSTOP) or dead:

* the loss probe's failures were logged at DEBUG only, so the rows of that group were reported ``held``
  round after round and nothing said that their loss could not be proved — now one WARNING per broker group
  per minute, and a counter (``reliable_sweeper_probe_failures{broker_name}``).
"""

from __future__ import annotations

import logging
from typing import cast

import pytest

from broker_sim.common.errors import RequestTimeoutError
from broker_sim.common.requests import TopicRouteData
from broker_sim.common.transport import BrokerTransport
from reliable.adapters import broker_sim as adapter
from reliable.adapters.broker_sim import BrokerSimProbe, ProbeWarnings
from reliable.sweeper import metrics

TOPIC = "UnreachT"


class _HungBrokers:
    """The part of a transport the probe uses, for brokers that never answer."""

    def get_max_offset(self, topic: str, queue_id: int, broker_name: str = "") -> int:
        raise RequestTimeoutError(f"request 30 to {broker_name}: no reply in time")

    def get_route(self, topic: str) -> TopicRouteData:
        raise RequestTimeoutError("name server: no reply in time")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def failures(broker_name: str) -> float:
    return float(metrics.PROBE_FAILURES.labels(broker_name)._value.get())


def test_a_failing_probe_warns_once_a_minute_per_broker_group_and_counts_every_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = _Clock()
    monkeypatch.setattr(adapter, "PROBE_WARNINGS", ProbeWarnings(60.0, clock))
    probe = BrokerSimProbe(cast(BrokerTransport, _HungBrokers()))
    before = {name: failures(name) for name in ("broker-a", "broker-b")}

    def round_of_rows() -> list[str]:
        """Eight rows' questions (5 on broker-a, 3 on broker-b): the warnings they logged."""
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="reliable.adapters.broker_sim"):
            for queue_id in range(5):
                assert probe.max_offset(TOPIC, queue_id, "broker-a") is None
            for queue_id in range(3):
                assert probe.max_offset(TOPIC, queue_id, "broker-b") is None
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    first = round_of_rows()
    assert len(first) == 2, first
    assert "broker group broker-a does not answer" in first[0] and "cannot be proved" in first[0]
    assert "broker group broker-b does not answer" in first[1]
    clock.now += 30
    assert round_of_rows() == []  # the same minute: DEBUG only
    clock.now += 30
    assert len(round_of_rows()) == 2  # a minute on, still down: said again
    assert failures("broker-a") - before["broker-a"] == 15
    assert failures("broker-b") - before["broker-b"] == 9
