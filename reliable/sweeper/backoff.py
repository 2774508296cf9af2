"""How long to wait before the next resend: a backoff policy plus an estimate of the consumer's backlog.

``resend_at = now + backoff(send_count) + backlog_estimate`` (DESIGN.md §3). The backoff spaces out attempts
for a message that keeps getting lost; the backlog estimate keeps the sweeper from re-sending a message that
is merely queued behind others the consumer has not reached yet.

Backoff specs (CLI ``--backoff`` / ``RELIABLE_SWEEP_BACKOFF``)::

    fixed:1s,5s,10s,30s,1m            the n-th send waits the n-th entry; the last entry repeats
                                      (default: RocketMQ's 18 delay levels 1s … 2h)
    exp:base=30s,factor=2,cap=1h,jitter=0.2,seed=7
                                      base·factor^(n-1), at most cap, then ×(1 ± jitter) from a seeded RNG
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from reliable import constants as C
from reliable.durations import parse_seconds
from reliable.sender import BrokerProbe
from reliable.sweeper.errors import SweeperConfigError


def parse_duration(text: str) -> float:
    """``"30s"``, ``"5m"``, ``"1h"``, ``"2d"``, ``"250ms"`` or a bare number of seconds → seconds."""
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise SweeperConfigError(str(exc)) from None


class BackoffPolicy(Protocol):
    """Delay after the ``send_count``-th send (1 = the producer's own send)."""

    def delay(self, send_count: int) -> dt.timedelta: ...


@dataclass(frozen=True, slots=True)
class FixedBackoff:
    """A list of delays like RocketMQ's ``messageDelayLevel``; past its end the last delay repeats."""

    delays_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.delays_s:
            raise SweeperConfigError("fixed backoff needs at least one delay")
        if any(d <= 0 for d in self.delays_s):
            # a zero delay would make a stub due again inside the round that just re-sent it
            raise SweeperConfigError("fixed backoff delays must be > 0")

    def delay(self, send_count: int) -> dt.timedelta:
        index = min(max(send_count, 1), len(self.delays_s)) - 1
        return dt.timedelta(seconds=self.delays_s[index])


class ExponentialBackoff:
    """``min(cap, base·factor^(n-1))`` scaled by a uniform factor in ``[1-jitter, 1+jitter]``.

    The jitter spreads the resends of a burst of lost messages over time instead of re-sending them in one
    spike; the RNG is seeded so a test (or an incident replay) sees the same delays.
    """

    def __init__(
        self, base_s: float, factor: float = 2.0, cap_s: float = 3600.0, jitter: float = 0.0, seed: int = 0
    ) -> None:
        if base_s <= 0 or cap_s <= 0:
            raise SweeperConfigError("exponential backoff: base and cap must be > 0")
        if factor < 1:
            raise SweeperConfigError("exponential backoff: factor must be >= 1")
        if not 0 <= jitter < 1:
            raise SweeperConfigError("exponential backoff: jitter must be in [0, 1)")
        self.base_s, self.factor, self.cap_s, self.jitter = base_s, factor, cap_s, jitter
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def delay(self, send_count: int) -> dt.timedelta:
        exponent = max(send_count, 1) - 1
        # compare in logs: factor**exponent overflows a float long after the cap has been reached
        if math.log(self.base_s) + exponent * math.log(self.factor) >= math.log(self.cap_s):
            raw = self.cap_s
        else:
            raw = min(self.cap_s, self.base_s * self.factor**exponent)
        with self._lock:
            scale = 1.0 + self._rng.uniform(-self.jitter, self.jitter) if self.jitter else 1.0
        return dt.timedelta(seconds=raw * scale)


def parse_backoff(spec: str) -> BackoffPolicy:
    """Build a policy from a ``fixed:`` or ``exp:`` spec (see the module docstring)."""
    kind, _, rest = spec.strip().partition(":")
    if kind == "fixed":
        return FixedBackoff(tuple(parse_duration(p) for p in rest.replace(" ", ",").split(",") if p))
    if kind in ("exp", "exponential"):
        opts: dict[str, str] = {}
        for part in filter(None, rest.split(",")):
            key, eq, value = part.partition("=")
            if not eq:
                raise SweeperConfigError(f"exponential backoff: expected key=value, got {part!r}")
            opts[key.strip()] = value.strip()
        unknown = set(opts) - {"base", "factor", "cap", "jitter", "seed"}
        if unknown:
            raise SweeperConfigError(f"exponential backoff: unknown option(s) {', '.join(sorted(unknown))}")
        try:
            return ExponentialBackoff(
                base_s=parse_duration(opts.get("base", "30s")),
                factor=float(opts.get("factor", "2")),
                cap_s=parse_duration(opts.get("cap", "1h")),
                jitter=float(opts.get("jitter", "0")),
                seed=int(opts.get("seed", "0")),
            )
        except ValueError as exc:
            raise SweeperConfigError(f"exponential backoff: {exc}") from None
    raise SweeperConfigError(f"unknown backoff {spec!r}: use fixed:1s,5s,… or exp:base=30s,factor=2,cap=1h")


def default_backoff() -> BackoffPolicy:
    return parse_backoff(C.DEFAULT_BACKOFF)


@dataclass(frozen=True)
class QueueProgress:
    """The ``consume_progress`` row of one (group, topic, queue); one object serves a whole batch, so the
    rate is computed once (``cached_property``)."""

    max_offset: int
    min_offset: int
    created_at: dt.datetime
    updated_at: dt.datetime
    received_count: int

    @functools.cached_property
    def rate_per_s(self) -> float | None:
        """Offsets the group advanced per second over the row's life; ``None`` if it cannot be told yet.

        Offsets (not ``received_count``) because the lag is measured in offsets: a tag filter that skips
        messages moves the consumer past them without a delivery.
        """
        elapsed = (self.updated_at - self.created_at).total_seconds()
        advanced = self.max_offset - self.min_offset
        if elapsed <= 0 or advanced <= 0:
            return None
        return advanced / elapsed


class BacklogEstimator:
    """``lag ÷ rate``: how long the consumer group needs to reach the message just sent.

    ``lag = broker next offset − (watermark + 1)``: the messages of that queue the group has not received.
    The broker's next offset comes from the :class:`~reliable.sender.BrokerProbe` when one is given and
    answers (and is not below the receipt's: an answer asked before the send); otherwise from the send
    receipt (``receipt offset + 1``), which is exactly the queue's end as our message saw it.
    No ``consume_progress`` row, or no measurable rate yet: the estimate is 0 — the verdict's offset rules
    (:mod:`reliable.sweeper.verdict`) still keep a queued message from being re-sent, the estimate only
    saves the sweeper from looking at it early. Capped at ``cap``.
    """

    def __init__(self, probe: BrokerProbe | None = None, cap_s: float = C.DEFAULT_BACKLOG_CAP_S) -> None:
        self.probe = probe
        self.cap_s = cap_s

    def estimate(
        self,
        progress: QueueProgress | None,
        topic: str,
        queue_id: int,
        receipt_offset: int | None,
        broker_name: str = "",
    ) -> dt.timedelta:
        if progress is None:
            return dt.timedelta(0)
        rate = progress.rate_per_s
        if rate is None:
            return dt.timedelta(0)
        ends = [self.probe.max_offset(topic, queue_id, broker_name) if self.probe is not None else None]
        ends.append(receipt_offset + 1 if receipt_offset is not None else None)
        # the queue's end is at least one past the copy just sent there (a probe answer may predate it)
        known = [end for end in ends if end is not None]
        if not known:
            return dt.timedelta(0)
        next_offset = max(known)
        lag = next_offset - (progress.max_offset + 1)
        if lag <= 0:
            return dt.timedelta(0)
        return dt.timedelta(seconds=min(self.cap_s, lag / rate))


def describe(policy: BackoffPolicy) -> str:
    """A short human form for the round log."""
    if isinstance(policy, FixedBackoff):
        return "fixed:" + ",".join(f"{d:g}s" for d in policy.delays_s)
    if isinstance(policy, ExponentialBackoff):
        p = policy
        return f"exp:base={p.base_s:g}s,factor={p.factor:g},cap={p.cap_s:g}s,jitter={p.jitter:g}"
    return type(policy).__name__


__all__: Sequence[str] = [
    "BacklogEstimator",
    "BackoffPolicy",
    "ExponentialBackoff",
    "FixedBackoff",
    "QueueProgress",
    "default_backoff",
    "describe",
    "parse_backoff",
    "parse_duration",
]
