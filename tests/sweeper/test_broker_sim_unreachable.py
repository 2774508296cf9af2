"""The sweeper against broker_sim broker groups that do not answer.

Found by a cluster test with one master hung (SIGSTOP) or dead:

* the loss probe's failures were logged at DEBUG only, so the rows of that group were reported ``held``
  round after round and nothing said that their loss could not be proved — now one WARNING per broker group
  per minute, and a counter (``reliable_sweeper_probe_failures{broker_name}``);
* ``sweeper_sender``'s producer went round-robin over the groups, so every second resend waited out the hung
  master's send timeout — now it avoids a group that failed (RocketMQ's ``sendLatencyFaultEnable``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from broker_sim.client.producer import Producer
from broker_sim.common.errors import RequestTimeoutError
from broker_sim.common.requests import TopicRouteData
from broker_sim.common.transport import BrokerTransport
from broker_sim.remoting.cluster_process import ClusterProcess
from reliable import constants as C
from reliable.adapters import broker_sim as adapter
from reliable.adapters.broker_sim import BrokerSimProbe, ProbeWarnings
from reliable.errors import SendError
from reliable.sender import OutgoingMessage
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
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    probe = BrokerSimProbe(cast(BrokerTransport, _HungBrokers()), ProbeWarnings(60.0, clock))
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


@pytest.fixture
def hung_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterProcess]:
    """Two broker groups in their own processes, broker-a's master stopped (SIGSTOP) for the test, and the
    sweeper's sender configured for that cluster."""
    with ClusterProcess(
        tmp_path, brokers=2, slaves=0, extra=(f"--set=topics={json.dumps({TOPIC: 2})}",)
    ) as c:
        monkeypatch.setenv(C.ENV_BROKER_SIM_NAMESRV, c.namesrv)
        proc = c.node("broker-a").process.proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            yield c
        finally:
            os.kill(proc.pid, signal.SIGCONT)


@pytest.mark.slow
def test_the_sweepers_sender_moves_its_resends_off_a_hung_broker_group(hung_a: ClusterProcess) -> None:
    sender = adapter.sweeper_sender(None)
    producer = sender.producer
    assert isinstance(producer, Producer)
    producer.send_msg_timeout_ms = 500  # 3 s by default: the test need not wait that long per timeout
    try:
        outcomes: list[str] = []
        for i in range(6):
            try:
                receipt = sender.send(OutgoingMessage(f"m-{i}", TOPIC, b"x", send_count=1))
            except SendError:
                outcomes.append("timeout")
            else:
                outcomes.append(receipt.broker_name)
        # one send at most waits for the hung group; round-robin would time out on every second one
        assert outcomes.count("timeout") <= 1, outcomes
        assert set(outcomes) <= {"timeout", "broker-b"}, outcomes
    finally:
        producer.shutdown()
