"""RocketMQ 5.x adapter for the official gRPC client (PyPI ``rocketmq-python-client``).

That client installs a top-level ``rocketmq`` package, as the 4.x client does, so this module is used from
a venv *without* the 4.x one (``pip install reliable[rocketmq5]``); it imports the client lazily.

* :func:`run_simple_consumer` — a SimpleConsumer loop: each message through the guard; ``SUCCESS`` → ack,
  ``RECONSUME_LATER`` → change the invisible duration to the retry backoff of its delivery attempt,
  ``DEAD_LETTER`` → ForwardMessageToDeadLetterQueue (the protocol carries no reason: the guard has journaled
  it in ``message_log``) on a handle renewed first, so a stale one makes no DLQ copy
  (:mod:`reliable.adapters.rocketmq5_settle`).
* :class:`GuardedListener` — the same for a PushConsumer. ``RECONSUME_LATER`` answers ``FAILURE``, so the
  client applies the *consumer group's* retry policy that the broker sent in the Telemetry settings (the
  client overrides any other invisible duration); ``DEAD_LETTER`` forwards to the DLQ itself (and, in a FIFO
  group, answers ``SUCCESS``: on ``FAILURE`` the client retries the finished message and its stale handle
  forever, holding up the message group).
* Both keep the message invisible while a long handler runs (:class:`InvisibilityExtender`: a change of
  invisible duration every ``extend_every_s``), so the broker does not hand it to another consumer
  mid-handler; the SimpleConsumer loop extends its whole received batch from the start, so a message
  waiting behind a slow one is not handed out either. A handler that dies with its process stops extending
  and the messages come back after one invisible duration.
* :class:`RocketMQ5Sender` — the :class:`~reliable.sender.Sender` of ``StubProducer`` and the sweeper. A 5.x
  send reports the offset but **not the queue** (the proxy, not the client, picks it), so receipts carry
  ``queue_id = UNKNOWN_QUEUE_ID`` and ``broker_name = ""``; a targeted resend cannot name
  ``%RETRY%{group}`` through 5.x either, so it goes to the topic and the other groups' guards absorb the
  copy.
* :class:`RocketMQ5Probe` — the loss probe: the protocol's ``QueryOffset(END)`` is a queue's max offset.
  Without a stub's queue it cannot prove a 5.x-sent stub lost, so for those the sweeper's
  ``max_unconfirmed_age`` is what re-sends (docs/adapters.md).

The sender and the probe live in :mod:`reliable.adapters.rocketmq5_send` (re-exported here).

Envelope: ``message_id`` = the message's one *key* (several keys are no id: the client keeps them as a set),
else the 5.x message id; ``broker_name``/``queue_id``/``queue_offset`` from the receipt handle (RocketMQ's
handle layout names them — fields 5, 6, 7; the client drops the system properties that carry them), so a
delivery's queue is (topic, broker group, queue id) as on 4.x; ``reconsume_times`` = delivery attempt − 1.
A message the broker revived into the group's pop retry topic (handle field 4, see
:mod:`reliable.adapters.rocketmq5_handle`) has ``delivered_topic`` = that topic (``%RETRY%{group}_{topic}``)
and ``revived`` set: its queue and offset are the retry topic's, never the topic's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from reliable import constants as C
from reliable.adapters.rocketmq5_fifo import LocalRuns, hold_back, message_group
from reliable.adapters.rocketmq5_handle import parse_handle, pop_retry_topic
from reliable.adapters.rocketmq5_send import RocketMQ5Probe, RocketMQ5Sender, sweeper_sender
from reliable.adapters.rocketmq5_send import load_client as _client
from reliable.adapters.rocketmq5_settle import ack, dead_letter, forward_to_dlq
from reliable.errors import ConfigurationError
from reliable.sweeper.backoff import parse_duration
from reliable.types import ConsumeResult, Envelope

log = logging.getLogger("reliable.adapters.rocketmq5")

__all__ = [
    "GuardedListener",
    "InvisibilityExtender",
    "RocketMQ5Probe",
    "RocketMQ5Sender",
    "check_timing",
    "consume_one",
    "forward_to_dlq",
    "guarded_push_consumer",
    "retry_delay_s",
    "run_simple_consumer",
    "settle",
    "sweeper_sender",
    "to_envelope",
]

Handler = Callable[[Envelope], ConsumeResult]
_RETRY_BACKOFF_S = tuple(parse_duration(t) for t in C.ROCKETMQ5_RETRY_BACKOFF.split())


def retry_delay_s(attempt: int) -> int:
    """RECONSUME_LATER backoff after the ``attempt``-th delivery, in whole seconds (the protocol's unit)."""
    return int(_RETRY_BACKOFF_S[min(max(attempt, 1), len(_RETRY_BACKOFF_S)) - 1])


def to_envelope(
    message: Any,
    max_attempts: int = C.ROCKETMQ5_MAX_DELIVERY_ATTEMPTS,
    attempt: int | None = None,
    *,
    group: str | None = None,
) -> Envelope:
    """A 5.x ``rocketmq.Message`` as received, as an :class:`~reliable.types.Envelope`.

    The id is the message's one key, else its 5.x message id. Several keys are no id: the client keeps them
    as a set (any order), and picking one made two orders sharing a customer key one message — the second
    acknowledged as the first's duplicate, never applied. Such a message has no id here, so the guard
    dead-letters it with the reason. ``max_attempts`` is the group's maximum delivery attempts (its
    subscription's retry policy; 17 unless set): the delivery at it is the broker's last
    (``last_attempt``), so a handler failure there ends the group's row ``DEAD`` with a person told — the
    broker dead-letters the message after it, and the row stayed ``PENDING`` for the sweeper to re-send.
    ``attempt`` overrides the message's delivery attempt (a FIFO push client's local runs: see
    :class:`~reliable.adapters.rocketmq5_fifo.LocalRuns`). ``group``: the consuming group, which names the
    pop retry topic a revived message comes from (``ConfigurationError`` for such a message without it)."""
    keys = sorted(message.keys or ())
    where = parse_handle(message.receipt_handle)
    delivered = None
    if where.revived:
        if not group:
            raise ConfigurationError(
                f"message {message.message_id} comes from a pop retry topic: to_envelope(group=...) must "
                "name the consumer group (else it is journaled at another message's position)"
            )
        delivered = pop_retry_topic(group, message.topic, where.topic_type)
    attempt = attempt if attempt is not None else message.delivery_attempt or 1
    if len(keys) > 1:
        log.error("message %s has %d keys %s: not one id, dead-lettered", message.message_id, len(keys), keys)
        message_id = None
    else:
        message_id = keys[0] if keys else (message.message_id or None)
    properties = dict(message.properties or {})
    return Envelope(
        message_id=message_id,
        topic=message.topic,
        queue_id=where.queue_id,
        queue_offset=where.queue_offset,
        body=bytes(message.body),
        keys=" ".join(keys) or None,
        tags=message.tag or None,
        reconsume_times=max(0, attempt - 1),
        properties=properties,
        delivered_topic=delivered,
        broker_name=where.broker_name[: C.BROKER_NAME_MAX],
        last_attempt=attempt >= max_attempts,
        target_group=properties.get(C.ROCKETMQ5_TARGET_GROUP_PROPERTY) or None,
        revived=where.revived,
    )


def check_timing(invisible_s: int, every_s: float) -> None:
    """The extension must come before the invisible time runs out, or another consumer gets the message."""
    if not 0 < every_s < invisible_s:
        raise ConfigurationError(
            f"extend every {every_s} s: must be more often than the invisible duration ({invisible_s} s)"
        )


class InvisibilityExtender:
    """Keeps received messages invisible until each is settled (use as a context manager).

    Every ``every_s`` it changes the invisible duration of each message not yet settled to ``invisible_s``
    from now; the client puts the new receipt handle on the message, so the final ack / retry uses the
    current one. ``change`` is the consumer's change-invisible-duration call
    (``SimpleConsumer.change_invisible_duration``). A whole received batch is extended from the start: a
    message waiting behind a slow one would otherwise become visible again and go to another consumer while
    it is still queued here. :meth:`settled` stops extending one message (waiting for a change of it in
    progress), before it is acknowledged or retried."""

    def __init__(
        self,
        change: Callable[[Any, int], None],
        messages: Any | Sequence[Any],
        invisible_s: int,
        every_s: float,
    ) -> None:
        check_timing(invisible_s, every_s)
        self.change = change
        self.pending: list[Any] = list(messages) if isinstance(messages, list | tuple) else [messages]
        self.invisible_s, self.every_s = invisible_s, every_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rmq5-extend", daemon=True)
        self.extensions = 0

    def _run(self) -> None:
        failures: dict[int, int] = {}
        while not self._stop.wait(self.every_s):
            with self._lock:
                for message in list(self.pending):
                    try:
                        self.change(message, self.invisible_s)
                        self.extensions += 1
                        failures.pop(id(message), None)
                    except Exception:
                        n = failures[id(message)] = failures.get(id(message), 0) + 1
                        if n == 1:
                            log.exception("could not extend the invisible time of %s", message.message_id)
                        if n >= C.ROCKETMQ5_EXTEND_FAILURES:
                            # its handle is stale (it became visible, another consumer has it): a traceback
                            # every extend_every_s until the handler ended said nothing new; the guard
                            # decides whichever copy settles first
                            log.warning("stopped extending %s after %d failed changes", message.message_id, n)
                            self.pending.remove(message)

    def settled(self, message: Any) -> None:
        """Stop extending ``message`` (it is about to be acknowledged, retried or dead-lettered)."""
        with self._lock:
            self.pending = [m for m in self.pending if m is not message]

    def __enter__(self) -> InvisibilityExtender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _decide(handler: Handler, env: Envelope) -> ConsumeResult:
    try:
        return handler(env)
    except Exception:
        log.exception("handler raised on %s; reconsume later", env.message_id)
        return ConsumeResult.RECONSUME_LATER


def consume_one(
    consumer: Any,
    message: Any,
    handler: Handler,
    invisible_s: int,
    extend_every_s: float,
    max_attempts: int = C.ROCKETMQ5_MAX_DELIVERY_ATTEMPTS,
) -> ConsumeResult:
    """One SimpleConsumer message through ``handler`` with its invisible time extended meanwhile, then
    ack / retry later / dead-letter as the result says. Returns the result."""
    with InvisibilityExtender(consumer.change_invisible_duration, message, invisible_s, extend_every_s):
        result = _decide(handler, to_envelope(message, max_attempts, group=consumer.consumer_group))
    settle(consumer, message, result, invisible_s)
    return result


def settle(
    consumer: Any, message: Any, result: ConsumeResult, invisible_s: int = C.DEFAULT_ROCKETMQ5_INVISIBLE_S
) -> None:
    """Ack, retry later or dead-letter one SimpleConsumer message as ``result`` says. A stale receipt handle
    (:mod:`~reliable.adapters.rocketmq5_settle`) is a WARNING line for an ack and a dead letter: the receive
    holding the message now settles it. Dead-lettering renews the handle for ``invisible_s`` first."""
    if result is ConsumeResult.SUCCESS:
        ack(consumer, message)
    elif result is ConsumeResult.RECONSUME_LATER:
        consumer.change_invisible_duration(message, retry_delay_s(message.delivery_attempt or 1))
    else:
        dead_letter(consumer, message, consumer.change_invisible_duration, invisible_s)


def run_simple_consumer(
    consumer: Any,
    handler: Handler,
    stop: threading.Event,
    *,
    batch: int = 16,
    invisible_s: int = C.DEFAULT_ROCKETMQ5_INVISIBLE_S,
    extend_every_s: float | None = None,
    max_attempts: int = C.ROCKETMQ5_MAX_DELIVERY_ATTEMPTS,
) -> int:
    """Receive and handle until ``stop`` is set (a started ``rocketmq.SimpleConsumer``); returns how many
    messages were handled. A failed ack / change leaves the message to come back after its invisible time
    (the guard absorbs the redelivery). ``max_attempts``: the group's maximum delivery attempts
    (:func:`to_envelope`). Once a message of a FIFO message group is to be retried, the batch's later
    messages of that group are given back unhandled to come again after it (they overtook it)."""
    every = extend_every_s if extend_every_s is not None else invisible_s / 3
    check_timing(invisible_s, every)
    handled = 0
    while not stop.is_set():
        try:
            messages = consumer.receive(batch, invisible_s)
        except Exception:
            log.exception("receive failed; retrying")
            stop.wait(1.0)
            continue
        with InvisibilityExtender(consumer.change_invisible_duration, messages, invisible_s, every) as ext:
            retrying: dict[str, int] = {}  # FIFO message group -> retry delay of its failed message
            for message in messages:
                group = message_group(message)
                if group in retrying:
                    ext.settled(message)
                    hold_back(consumer, message, retrying[group])
                    continue
                result = _decide(handler, to_envelope(message, max_attempts, group=consumer.consumer_group))
                ext.settled(message)
                if group is not None and result is ConsumeResult.RECONSUME_LATER:
                    retrying[group] = retry_delay_s(message.delivery_attempt or 1)
                try:
                    settle(consumer, message, result, invisible_s)
                except Exception:
                    log.exception(
                        "could not settle %s; it comes back after its invisible time", message.message_id
                    )
                handled += 1
    return handled


class GuardedListener:
    """A PushConsumer ``MessageListener`` running the guard (pass an instance as ``message_listener``).

    Build it before the consumer (``listener.consumer = push_consumer`` once created): dead-lettering and the
    invisible-time extension need the consumer. Push deliveries are invisible for the broker's default
    (``invisible_s``, 60 s on broker_sim and the 5.x proxy); the extension uses the client's
    ``_change_invisible_duration``, the call its own retry path makes."""

    def __init__(
        self, handler: Handler, *, invisible_s: int = C.DEFAULT_ROCKETMQ5_INVISIBLE_S,
        extend_every_s: float | None = None, max_attempts: int | None = None,
    ) -> None:  # fmt: skip
        self.handler = handler
        #: the group's maximum deliveries; None: the retry policy the broker gave the consumer (its settings)
        self.max_attempts = max_attempts
        self._mismatch_told = False
        self._runs = LocalRuns()
        self.invisible_s = invisible_s
        self.extend_every_s = extend_every_s if extend_every_s is not None else invisible_s / 3
        check_timing(invisible_s, self.extend_every_s)
        self.consumer: Any = None

    def consume(self, message: Any) -> Any:
        rocketmq, _ = _client()
        if self.consumer is None:
            raise ConfigurationError("GuardedListener.consumer is not set (use guarded_push_consumer)")
        change = self.consumer._change_invisible_duration
        fifo = bool(getattr(self.consumer, "fifo", False))
        group = self.consumer.consumer_group
        env = self._fifo_envelope(message) if fifo else to_envelope(message, self._attempts(), group=group)
        with InvisibilityExtender(change, message, self.invisible_s, self.extend_every_s):
            result = _decide(self.handler, env)
        if fifo and (result is not ConsumeResult.RECONSUME_LATER or env.last_attempt):
            self._runs.forget(message)  # the delivery ends here: consumed, dead-lettered or the client's last
        if result is ConsumeResult.SUCCESS:
            return rocketmq.ConsumeResult.SUCCESS
        if result is ConsumeResult.DEAD_LETTER:
            try:
                dead_letter(self.consumer, message, change, self.invisible_s)
            except Exception:
                log.exception("forward of %s to the DLQ failed; retry later", message.message_id)
                return rocketmq.ConsumeResult.FAILURE
            if fifo:
                # FIFO: FAILURE makes the client run the message again locally, then dead-letter it itself
                # with the handle the forward just finished (or a stale one: dead_letter forwarded nothing),
                # retried forever — a DLQ copy per try on a proxy, the message group and shutdown stuck
                # behind it. SUCCESS: the client acks, the broker refuses the finished (or stale) handle, the
                # client drops the message and goes on with the message group.
                return rocketmq.ConsumeResult.SUCCESS
        return rocketmq.ConsumeResult.FAILURE

    def _fifo_envelope(self, message: Any) -> Envelope:
        """A FIFO client runs a failed message again itself, its delivery attempt unchanged, and after the
        policy's max attempts forwards it to the DLQ: the guard's last attempt is that last local run (it
        stayed PENDING with nobody told). The attempt is the larger of the broker's delivery attempt and
        the local run; the last is at the guard's maximum or the client's, whichever comes first."""
        told = policy_max_attempts(self.consumer)
        limit = min(self._attempts(), told) if told is not None else self._attempts()
        run = self._runs.start(message)
        attempt = max(message.delivery_attempt or 1, run)
        return to_envelope(message, limit, attempt=attempt, group=self.consumer.consumer_group)

    def _attempts(self) -> int:
        """The group's maximum deliveries: the broker's policy as the client received it, unless given."""
        told = policy_max_attempts(self.consumer)
        if self.max_attempts is None:
            return told or C.ROCKETMQ5_MAX_DELIVERY_ATTEMPTS
        if told is not None and told != self.max_attempts and not self._mismatch_told:
            self._mismatch_told = True
            log.warning(
                "GuardedListener(max_attempts=%d) but the broker's retry policy for this group allows %d"
                " deliveries: the guard's last attempt follows max_attempts (unset: the broker's)",
                self.max_attempts,
                told,
            )
        return self.max_attempts


def policy_max_attempts(consumer: Any) -> int | None:
    """The maximum deliveries of the retry policy the broker's settings gave a started ``PushConsumer``
    (the client keeps it privately; it forwards it itself when dead-lettering), or None if it has none."""
    consumption = getattr(consumer, "_PushConsumer__consumption", None)
    attempts = getattr(getattr(consumption, "backoff_policy", None), "max_attempts", None)
    return attempts if isinstance(attempts, int) and attempts > 0 else None


def guarded_push_consumer(config: Any, group: str, topic: str, handler: Handler, **kw: Any) -> Any:
    """A started PushConsumer of ``group`` on ``topic`` whose listener is :class:`GuardedListener`."""
    rocketmq, _ = _client()
    listener = GuardedListener(
        handler, **{k: kw.pop(k) for k in ("invisible_s", "extend_every_s", "max_attempts") if k in kw}
    )
    consumer = rocketmq.PushConsumer(config, group, listener, {topic: rocketmq.FilterExpression()}, **kw)
    listener.consumer = consumer
    consumer.startup()
    return consumer
