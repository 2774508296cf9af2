"""The life cycle of a broker_sim service object (broker, producer, pull and push consumer).

Each starts once (``CREATED`` → ``RUNNING``) and ends once; a stopped one is not restarted — create a new
object, as RocketMQ's clients require. The end says how: a graceful ``SHUTDOWN``, or a simulated power cut
(``CRASHED``, the broker) or process kill (``KILLED``, the push consumer) that skips the graceful steps.
"""

from __future__ import annotations

import enum


class ServiceState(enum.Enum):
    CREATED = enum.auto()
    RUNNING = enum.auto()
    SHUTDOWN = enum.auto()
    CRASHED = enum.auto()
    KILLED = enum.auto()

    def __str__(self) -> str:
        """How an error message names it: ``consumer g is shutdown``."""
        return self.name.lower()
