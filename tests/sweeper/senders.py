"""Sender factories that ``reliable sweep --sender tests.sweeper.senders:NAME`` can import (CLI tests)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from reliable import Reliability
from reliable.sender import OutgoingMessage, SendReceipt
from tests.sweeper.helpers import QueueSender

#: what ``memory_sender`` accepted, for in-process CLI tests
MEMORY = QueueSender(queues=1, start=500)


def memory_sender(rel: Reliability) -> QueueSender:
    return MEMORY


class SlowFailingSender:
    """Refuses every message after ``RELIABLE_TEST_SEND_DELAY_S`` (a slow, broken broker), journaling each
    attempt's start and end to ``RELIABLE_TEST_SEND_LOG`` so a test can check that rounds never overlap."""

    def __init__(self) -> None:
        self.path = Path(os.environ["RELIABLE_TEST_SEND_LOG"])
        self.delay_s = float(os.environ.get("RELIABLE_TEST_SEND_DELAY_S", "0.3"))
        self.lock = threading.Lock()

    def _journal(self, what: str) -> None:
        with self.lock, self.path.open("a") as f:
            f.write(f"{what} {time.monotonic():.6f} {threading.get_ident()}\n")
            f.flush()

    def send(self, message: OutgoingMessage) -> SendReceipt:
        self._journal("start")
        time.sleep(self.delay_s)  # simulated broker latency, not synchronisation
        self._journal("end")
        raise ConnectionError("broker down")


def slow_failing_sender(rel: Reliability) -> SlowFailingSender:
    return SlowFailingSender()


def not_a_sender(rel: Reliability) -> object:
    return object()
