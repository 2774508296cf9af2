"""Root of every exception raised on purpose by :mod:`broker_sim` (subpackages derive their own from it)."""

from __future__ import annotations


class BrokerSimError(Exception):
    """Root of every broker_sim error."""
