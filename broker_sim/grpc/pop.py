"""Pop consumption (RocketMQ 5.x): receive → invisible for a while → ack, or delivered again.

5.x consumers do not own queues or commit offsets; they *pop*: the broker hands out messages of any queue
and hides each for its invisible duration. An ack (by receipt handle) finishes it; if none arrives in time
it becomes visible again and the next receive delivers it with ``delivery_attempt + 1``. A consumer may
extend or shorten the time (ChangeInvisibleDuration: a new handle, the old one is void) or give up
(ForwardMessageToDeadLetterQueue). Past the group's ``max_attempts`` the broker itself moves the message to
``%DLQ%{group}`` instead of delivering it again.

State per (group, topic, queue): ``floor`` — the smallest offset not yet acked, committed as the group's
consumer offset (so ``broker-sim admin consumer progress`` and a 4.x ``GET_MAX_OFFSET``-based loss probe
see the same position) — plus the acked offsets above it and the latest delivery of each in-flight offset.
Messages are read from the same store the remoting front end writes (``MessageStore.get_message``, as the
Broker's own transaction check does: no permission check, no long-poll hold). FIFO groups deliver a
message group's next message only after the earlier one is acked (or dead-lettered) — within one receive
too: a batch carrying a message group's next messages behind one that then fails lets a consumer apply
them first — and other message groups of the queue are not held up.

Limits (stated in docs/rocketmq5.md): in-flight state is memory only — after a broker restart delivery
resumes at the committed floor with attempt 1 (at-least-once; already-acked messages above the floor come
again); a brand-new group starts at the queue's first offset.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from broker_sim.broker.api import ConsumerSendMsgBackRequest
from broker_sim.client.message import MessageExt
from broker_sim.common.convert import to_client
from broker_sim.grpc.policy import GroupPolicies
from broker_sim.grpc.receipt import InvalidReceiptHandleError, ReceiptHandle
from broker_sim.store.results import GetMessageStatus

if TYPE_CHECKING:
    from broker_sim.broker.broker import Broker

log = logging.getLogger("broker_sim.grpc.pop")

#: the user property that carries a 5.x FIFO message group through the store
MESSAGE_GROUP = "__SHARDINGKEY"
#: at most this many unacked messages are looked at per queue and receive (acked ones are skipped unread)
SCAN_LIMIT = 2048
_PULL_BATCH = 32


@dataclass(frozen=True)
class Delivery:
    message: MessageExt
    handle: ReceiptHandle
    attempt: int


@dataclass
class _Inflight:
    handle: ReceiptHandle
    attempt: int
    #: client id of a push consumer whose delivery the broker renews while that client is connected
    owner: str | None = None
    first_retrieve_ms: int = 0


@dataclass
class _QueueState:
    floor: int
    acked: set[int] = field(default_factory=set)
    inflight: dict[int, _Inflight] = field(default_factory=dict)


class PopService:
    def __init__(self, broker: Broker, policies: GroupPolicies) -> None:
        self.broker = broker
        self.policies = policies
        self._lock = threading.RLock()  # dispatch listeners may run on the putting thread
        self._changed = threading.Condition(self._lock)
        self._queues: dict[tuple[str, str, int], _QueueState] = {}
        self._serial = itertools.count(1)
        self._rotation = itertools.count()
        self.dead_lettered = 0
        self.renew_rounds = 0
        #: a FIFO receive carries at most one message of a message group (the next one waits for its ack).
        #: False: a receive may carry a message group's run in queue order, as an Apache broker's orderly
        #: pop does (it holds the whole queue until the batch is settled) — for testing that consumers keep
        #: a message group's order within a batch
        self.fifo_one_per_message_group = True

    def start(self) -> None:
        self.broker.store.add_dispatch_listener(lambda _req: self.wake())

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` real seconds or until a message arrives or is acked."""
        with self._changed:
            self._changed.wait(timeout_s)

    # -- receive ----------------------------------------------------------------------------------------

    def pop(
        self, group: str, topic: str, max_n: int, invisible_ms: int, tags: frozenset[str] | None = None,
        owner: str | None = None,
    ) -> list[Delivery]:  # fmt: skip
        """Up to ``max_n`` visible messages of ``topic`` for ``group``; ``tags`` None = every tag. With
        ``owner`` (an auto-renew receive) the deliveries are renewed by :meth:`renew` while it is alive."""
        tc = self.broker.topics.select(topic)
        if tc is None:
            return []
        n = tc.read_queue_nums
        start = next(self._rotation)
        out: list[Delivery] = []
        for i in range(n):
            if len(out) >= max_n:
                break
            queue_id = (start + i) % n
            out.extend(self._pop_queue(group, topic, queue_id, max_n - len(out), invisible_ms, tags, owner))
        return out

    def _state(self, group: str, topic: str, queue_id: int) -> _QueueState:
        key = (group, topic, queue_id)
        st = self._queues.get(key)
        if st is None:
            committed = self.broker.query_consumer_offset(group, topic, queue_id)
            floor = committed if committed is not None else self.broker.get_min_offset(topic, queue_id)
            st = self._queues[key] = _QueueState(floor)
        return st

    def _pop_queue(
        self,
        group: str,
        topic: str,
        queue_id: int,
        max_n: int,
        invisible_ms: int,
        tags: frozenset[str] | None,
        owner: str | None,
    ) -> list[Delivery]:
        policy = self.policies.get(group)
        out: list[Delivery] = []
        with self._lock:
            st = self._state(group, topic, queue_id)
            now = self.broker.clock.now_ms()
            offset, scanned = st.floor, 0
            blocked: set[str] = set()  # FIFO message groups with an earlier message still unfinished
            while len(out) < max_n and scanned < SCAN_LIMIT:
                while offset in st.acked:  # acked above the floor: nothing to read there
                    offset += 1
                r = self.broker.store.get_message(group, topic, queue_id, offset, _PULL_BATCH, None)
                if r.status is GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset > offset:
                    offset = r.next_begin_offset  # expired from the store: nothing left to deliver there
                    self._advance(st, group, topic, queue_id, to=offset)
                    continue
                if r.status is not GetMessageStatus.FOUND:
                    break
                for sel in r.messages:
                    if sel.queue_offset in st.acked:
                        continue
                    scanned += 1
                    if len(out) >= max_n:
                        break
                    msg = to_client(sel.ext, self.broker.config.broker_name)
                    delivery = self._consider(st, msg, group, policy.fifo, blocked, tags, now, invisible_ms)
                    if delivery is not None:
                        st.inflight[delivery.handle.queue_offset].owner = owner
                        out.append(delivery)
                if r.next_begin_offset <= offset:
                    break
                offset = r.next_begin_offset
        return out

    def _consider(
        self, st: _QueueState, msg: MessageExt, group: str, fifo: bool, blocked: set[str],
        tags: frozenset[str] | None, now: int, invisible_ms: int,
    ) -> Delivery | None:  # fmt: skip
        o = msg.queue_offset
        if o < st.floor or o in st.acked:
            return None
        message_group = msg.properties.get(MESSAGE_GROUP) or f"#{o}"
        if fifo and message_group in blocked:
            return None
        previous = st.inflight.get(o)
        if previous is not None and previous.handle.expires_ms > now:
            blocked.add(message_group)
            return None
        if tags is not None and (msg.tags or "") not in tags:
            self._finish(st, group, msg.topic, msg.queue_id, o)  # not for this group: nothing to deliver
            return None
        attempt = previous.attempt + 1 if previous is not None else 1
        if attempt > self.policies.get(group).max_attempts:
            self._dead_letter(st, group, msg.topic, msg.queue_id, o, msg.commit_log_offset, attempt - 1)
            return None
        handle = ReceiptHandle(
            st.floor, now, invisible_ms, self.broker.config.broker_name, msg.queue_id, o,
            msg.commit_log_offset, next(self._serial),
        )  # fmt: skip
        st.inflight[o] = _Inflight(handle, attempt, first_retrieve_ms=now)
        if fifo and self.fifo_one_per_message_group:
            blocked.add(message_group)  # its next message waits for this one, in this receive too
        return Delivery(msg, handle, attempt)

    # -- ack, change invisible duration, dead letter -------------------------------------------------------

    def _current(
        self, group: str, topic: str, text: str, check_expiry: bool
    ) -> tuple[_QueueState, _Inflight]:
        handle = ReceiptHandle.decode(text)
        st = self._state(group, topic, handle.queue_id)
        fl = st.inflight.get(handle.queue_offset)
        if fl is None or fl.handle.serial != handle.serial:
            raise InvalidReceiptHandleError("the receipt handle is stale: acked, extended or redelivered")
        if check_expiry and fl.handle.expires_ms <= self.broker.clock.now_ms():
            raise InvalidReceiptHandleError("the receipt handle has expired")
        return st, fl

    def ack(self, group: str, topic: str, text: str) -> None:
        with self._changed:
            st, fl = self._current(group, topic, text, check_expiry=True)
            self._finish(st, group, topic, fl.handle.queue_id, fl.handle.queue_offset)
            self._changed.notify_all()

    def change_invisible(self, group: str, topic: str, text: str, invisible_ms: int) -> ReceiptHandle:
        """A new handle invisible for ``invisible_ms`` from now; the next delivery is attempt + 1."""
        with self._changed:
            st, fl = self._current(group, topic, text, check_expiry=True)
            h = fl.handle
            new = ReceiptHandle(
                h.start_offset, self.broker.clock.now_ms(), invisible_ms, h.broker_name, h.queue_id,
                h.queue_offset, h.commit_log_offset, next(self._serial),
            )  # fmt: skip
            st.inflight[h.queue_offset] = _Inflight(new, fl.attempt)
            self._changed.notify_all()
            return new

    def forward_to_dlq(self, group: str, topic: str, text: str) -> bool:
        """What the 5.x proxy does: the message is copied to ``%DLQ%{group}`` by the handle's commit-log
        offset whatever the handle's state, then acked with the handle — an ack that fails (the handle
        expired, or the message was delivered again meanwhile) is ignored and the forward still answers OK.
        So a stale handle makes a DLQ copy and leaves the delivery in flight: it comes back and is forwarded
        again (broker_sim used to refuse a stale handle here, which hid that from the 5.x adapter's
        tests). Returns whether the delivery was finished. A malformed handle: InvalidReceiptHandleError."""
        handle = ReceiptHandle.decode(text)
        with self._changed:
            try:
                st, fl = self._current(group, topic, text, check_expiry=True)
            except InvalidReceiptHandleError as exc:
                self._copy_to_dlq(group, topic, handle.commit_log_offset)
                log.warning("%s: forwarded on a stale handle, the delivery stays in flight (%s)", group, exc)
                return False
            h = fl.handle
            self._dead_letter(st, group, topic, h.queue_id, h.queue_offset, h.commit_log_offset, fl.attempt)
            self._changed.notify_all()
            return True

    def _dead_letter(
        self, st: _QueueState, group: str, topic: str, queue_id: int, offset: int, clog: int, attempts: int
    ) -> None:
        self._copy_to_dlq(group, topic, clog)
        log.warning("%s %s:%d@%d dead-lettered after %d attempts", group, topic, queue_id, offset, attempts)
        self._finish(st, group, topic, queue_id, offset)

    def _copy_to_dlq(self, group: str, topic: str, clog: int) -> None:
        self.broker.consumer_send_msg_back(
            ConsumerSendMsgBackRequest(group, clog, delay_level=-1, origin_topic=topic)
        )
        self.dead_lettered += 1

    def _finish(self, st: _QueueState, group: str, topic: str, queue_id: int, offset: int) -> None:
        st.inflight.pop(offset, None)
        st.acked.add(offset)
        floor = st.floor
        while floor in st.acked:
            st.acked.discard(floor)
            floor += 1
        if floor != st.floor:
            self._advance(st, group, topic, queue_id, to=floor)

    def _advance(self, st: _QueueState, group: str, topic: str, queue_id: int, to: int) -> None:
        st.floor = to
        st.acked = {o for o in st.acked if o >= to}
        self.broker.commit_consumer_offset(group, topic, queue_id, to)

    # -- auto-renew (push consumers) ---------------------------------------------------------------------

    def renew(self, alive: Callable[[str], bool], ahead_ms: int, slice_ms: int, max_ms: int) -> int:
        """Extend push-consumer deliveries that expire within ``ahead_ms`` by ``slice_ms``, while their
        client is connected and for at most ``max_ms`` in all (the 5.x proxy's renewal). The receipt handle
        the client holds stays valid (same serial). Returns how many were renewed."""
        renewed = 0
        with self._changed:
            now = self.broker.clock.now_ms()
            for st in self._queues.values():
                for fl in st.inflight.values():
                    h = fl.handle
                    if (
                        fl.owner is None
                        or not now < h.expires_ms <= now + ahead_ms
                        or now - fl.first_retrieve_ms >= max_ms
                        or not alive(fl.owner)
                    ):
                        continue
                    fl.handle = replace(h, retrieve_ms=now, invisible_ms=slice_ms)
                    renewed += 1
            self.renew_rounds += 1
        return renewed

    # -- inspection (tests, admin) -----------------------------------------------------------------------

    def inflight(self, group: str, topic: str) -> dict[tuple[int, int], ReceiptHandle]:
        """``(queue_id, offset) → current handle`` of every unacked delivered message."""
        with self._lock:
            return {
                (qid, o): fl.handle
                for (g, t, qid), st in self._queues.items()
                if g == group and t == topic
                for o, fl in st.inflight.items()
            }
