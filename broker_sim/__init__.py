"""broker_sim: a file-backed broker that behaves like RocketMQ 4.x (disk formats, wire protocol, client
behaviour), with a controllable clock and a fault injector. It never imports :mod:`reliable`."""

from __future__ import annotations

__all__: list[str] = []
