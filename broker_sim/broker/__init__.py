"""The broker: request-level API over the store (see :mod:`broker_sim.broker.broker` and
:mod:`broker_sim.common.requests`)."""

from __future__ import annotations

from broker_sim.broker.broker import Broker
from broker_sim.broker.config import BrokerConfig

__all__ = ["Broker", "BrokerConfig"]
