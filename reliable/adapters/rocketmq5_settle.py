"""Settling a 5.x delivery whose receipt handle may be stale, for :mod:`reliable.adapters.rocketmq5`.

A receipt handle is stale once the message's invisible time ran out and a receive took it again (this
consumer's or another's): the broker then holds a newer handle and refuses the old one for an ack or a
change of invisible duration (``INVALID_RECEIPT_HANDLE``). ForwardMessageToDeadLetterQueue does not refuse
it: a 5.x proxy copies the message to ``%DLQ%{group}`` by the handle's commit-log offset and then acks with
the handle, ignoring that ack's failure. So forwarding on a stale handle made a DLQ copy and left the
message in flight; it came back, the guard dead-lettered it again (its row was DEAD by then) and the next
forward made another copy — one per stale forward, and a FIFO message group waited meanwhile.

:func:`dead_letter` therefore first renews the handle (a change of invisible duration, which only the
current handle survives; the client puts the new handle on the message) and forwards only on a current
handle: one DLQ copy per dead-lettered message. A stale handle is left alone: the receive that holds the
message now settles it (the guard answers it DEAD_LETTER again, and that forward is the copy). The Java
client retries a refused FIFO forward forever and the Python client loops on it; neither renews first.

:func:`ack` tells a stale handle from other failures, so a refusal that is expected — the handler outlived
the invisible time — is one WARNING line, not a traceback; the redelivery is the guard's duplicate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from reliable.adapters.rocketmq5_send import load_client
from reliable.errors import SendError

log = logging.getLogger("reliable.adapters.rocketmq5")

_STALE = (
    "its receipt handle is stale (its invisible time ran out and a receive took it again); the receive that "
    "holds it now settles it"
)


class ForwardRefusedError(SendError):
    """The broker refused ForwardMessageToDeadLetterQueue; ``code`` is the 5.x status code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def stale_handle(exc: BaseException) -> bool:
    """Whether ``exc`` is the broker's ``INVALID_RECEIPT_HANDLE`` (the client's ``BadRequestException``
    carries the status code as ``code``)."""
    _, pb = load_client()
    return bool(getattr(exc, "code", None) == pb.Code.INVALID_RECEIPT_HANDLE)


def forward_to_dlq(consumer: Any, message: Any, max_attempts: int = 0) -> None:
    """ForwardMessageToDeadLetterQueue for ``message`` on its handle as it is (the SimpleConsumer has no
    method for it). Use :func:`dead_letter`, which makes sure the handle is current first."""
    _, pb = load_client()
    req = pb.ForwardMessageToDeadLetterQueueRequest()
    req.group.name = consumer.consumer_group
    req.topic.name = message.topic
    req.receipt_handle = message.receipt_handle
    req.message_id = message.message_id
    req.delivery_attempt = message.delivery_attempt or 1
    req.max_delivery_attempts = max_attempts
    future = consumer.rpc_client.forward_message_to_dead_letter_queue_async(
        message.endpoints,
        req,
        metadata=consumer.sign(),
        timeout=consumer.client_configuration.request_timeout,
    )
    res = future.result()
    if res.status.code != pb.Code.OK:
        raise ForwardRefusedError(
            f"forward to DLQ refused: {res.status.code} {res.status.message}", int(res.status.code)
        )


def dead_letter(consumer: Any, message: Any, change: Callable[[Any, int], None], renew_s: int) -> bool:
    """Forward ``message`` to the DLQ if its receipt handle is current; True if forwarded, False if the handle
    was stale (nothing forwarded: the receive holding the message now dead-letters it). ``change`` is the
    consumer's change-invisible-duration call, ``renew_s`` how long the renewed handle keeps the message
    hidden while it is forwarded. Any other failure raises (the message comes back after its invisible
    time, or the caller retries)."""
    try:
        change(message, renew_s)
    except Exception as exc:
        if not stale_handle(exc):
            raise
        log.warning("%s not forwarded to the DLQ: %s", message.message_id, _STALE)
        return False
    forward_to_dlq(consumer, message)
    return True


def ack(consumer: Any, message: Any) -> bool:
    """Ack ``message``; False if the broker refused its handle as stale (a WARNING line: the message comes
    again and the guard answers that delivery as a duplicate). Any other failure raises."""
    try:
        consumer.ack(message)
    except Exception as exc:
        if not stale_handle(exc):
            raise
        log.warning("ack of %s refused: %s (as a duplicate of this one)", message.message_id, _STALE)
        return False
    return True
