"""The client's coalescing writer: whatever mix of queued and direct writes, every frame reaches the peer once
and in the order it was handed over; runs of posted frames leave in fewer writes than frames; a failed write
closes the writer and reports once."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_sim.remoting.frame_writer import RUN, FrameWriter, WriterClosedError
from tests.broker_sim.remoting.conftest import wait_until


class CountingSocket:
    """A real socket whose ``sendall`` calls are counted (what the writer saves is system calls)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.writes = 0

    def sendall(self, data: bytes) -> None:
        self.writes += 1
        self.sock.sendall(data)


def read_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    sock.settimeout(10)
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "peer closed early"
        out += chunk
    return bytes(out)


def frame(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=3 * RUN))
def test_every_frame_arrives_once_in_hand_over_order(direct: list[bool]) -> None:
    a, b = socket.socketpair()
    errors: list[OSError] = []
    writer = FrameWriter(a, "test-writer", errors.append)
    try:
        for i, d in enumerate(direct):
            (writer.write if d else writer.post)(frame(i))
        got = read_exactly(b, sum(len(frame(i)) for i in range(len(direct))))
        assert got == b"".join(frame(i) for i in range(len(direct)))
        assert errors == []
    finally:
        writer.close()
        a.close()
        b.close()


def test_a_run_of_posted_frames_leaves_in_fewer_writes_than_frames() -> None:
    a, b = socket.socketpair()
    counting = CountingSocket(a)
    writer = FrameWriter(counting, "test-writer", lambda exc: None)
    n = 10 * RUN
    try:
        for i in range(n):
            writer.post(frame(i))
        assert read_exactly(b, n * len(frame(0))) == b"".join(frame(i) for i in range(n))
        assert counting.writes <= n // RUN + 1
    finally:
        writer.close()
        a.close()
        b.close()


def test_a_lone_posted_frame_is_written_without_another_call() -> None:
    a, b = socket.socketpair()
    writer = FrameWriter(a, "test-writer", lambda exc: None)
    try:
        writer.post(frame(7))  # fewer than RUN: the writer thread sends it
        assert read_exactly(b, len(frame(7))) == frame(7)
    finally:
        writer.close()
        a.close()
        b.close()


def test_a_failed_write_reports_once_and_closes_the_writer() -> None:
    a, b = socket.socketpair()
    b.close()
    errors: list[OSError] = []
    reported = threading.Event()

    def on_error(exc: OSError) -> None:
        errors.append(exc)
        reported.set()

    writer = FrameWriter(a, "test-writer", on_error)
    try:
        with pytest.raises(OSError):
            for _ in range(1000):  # the first writes may still land in the socket buffer
                writer.write(b"x" * 65536)
        assert wait_until(reported.is_set)
        with pytest.raises(WriterClosedError):
            writer.post(frame(1))
        with pytest.raises(WriterClosedError):
            writer.write(frame(1))
        assert len(errors) == 1
    finally:
        writer.close()
        a.close()


def test_a_closed_writer_refuses_frames() -> None:
    a, b = socket.socketpair()
    writer = FrameWriter(a, "test-writer", lambda exc: None)
    try:
        writer.close()
        with pytest.raises(WriterClosedError):
            writer.post(frame(1))
        with pytest.raises(WriterClosedError):
            writer.write(frame(1))
    finally:
        a.close()
        b.close()
