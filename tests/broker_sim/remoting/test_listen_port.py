"""``listen_port``: a port for a server that binds it later, or restarts on it, that no outgoing connection of
the machine can take in between (a cluster start once failed three times in a row with "address already in
use": another broker's connection had drawn the port chosen for the next one as its ephemeral port)."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_sim.common import net
from broker_sim.common.net import LISTEN_FLOOR, ephemeral_range, listen_port, listen_ranges


def test_ports_are_outside_the_ephemeral_range_free_and_never_handed_out_twice() -> None:
    """Outside the range is what makes the port safe: the kernel gives outgoing connections local ports from
    the ephemeral range only, so no client connection on this machine can take one of these."""
    low, high = ephemeral_range()
    ports = [listen_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(LISTEN_FLOOR <= p < 65536 and not low <= p <= high for p in ports)
    for p in ports[:20]:  # free when handed out: a server can bind it now
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def _five_ports_four_taken() -> tuple[range, list[socket.socket]]:
    """Five consecutive ports outside the ephemeral range, the first four bound by real listeners here."""
    for _ in range(50):
        base = listen_port()
        span = range(base, base + 5)
        if any(p in net._handed_out for p in span[1:]) or span.stop > 65536:
            continue
        held: list[socket.socket] = []
        try:
            for p in span[:4]:
                held.append(socket.create_server(("127.0.0.1", p)))
        except OSError:
            for s in held:
                s.close()
            continue
        return span, held
    pytest.fail("no five free consecutive ports found")


def test_a_taken_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four of the five ports it may choose from have a server on them: it finds the fifth, every time."""
    span, held = _five_ports_four_taken()
    try:
        monkeypatch.setattr(net, "listen_ranges", lambda _ephemeral: [span])
        assert listen_port() == span[4]
        # all five handed out or taken now: it falls back to the kernel's choice rather than repeat one
        assert listen_port() not in span
    finally:
        for s in held:
            s.close()


def test_without_room_outside_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "ephemeral_range", lambda: (1024, 65535))
    port = listen_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@given(low=st.integers(1024, 65535), width=st.integers(0, 64000))
def test_spans_never_overlap_the_ephemeral_range(low: int, width: int) -> None:
    high = min(65535, low + width)
    for span in listen_ranges((low, high)):
        assert len(span) >= 1000 and span.start >= LISTEN_FLOOR and span.stop <= 65536
        assert span.stop <= low or span.start > high
