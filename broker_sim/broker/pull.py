"""PULL_MESSAGE handling and long polling (RocketMQ's PullMessageProcessor + PullRequestHoldService).

A pull that finds nothing new and carries the SUSPEND bit is *held*: it is answered as soon as a message for
its queue is dispatched, or when its suspend timeout passes on the broker clock, whichever comes first. The
re-run of a held pull never suspends again, so every request gets exactly one answer.

Outcome table (reference §C): found → SUCCESS, next = offset + units scanned; queue empty/unknown at offset 0
→ PULL_NOT_FOUND next 0 (elsewhere PULL_OFFSET_MOVED); offset == max → PULL_NOT_FOUND (held if SUSPEND);
offset < min → PULL_OFFSET_MOVED next min; offset > max → PULL_OFFSET_MOVED next max (4.9.8's
``DefaultMessageStore.getMessage``; 4.9.0–4.9.3 answered next 0 while the min offset was 0); everything
scanned filtered out → PULL_RETRY_IMMEDIATELY. A slave moves no offset (``offsetCheckInSlave`` off, the
default): instead of PULL_OFFSET_MOVED it answers PULL_RETRY_IMMEDIATELY with the offset asked for and sends
the reader to the group's broker id (the master) — a slave that lacks part of a queue says so, not "move on".

Every reply names the node the client should read the queue from next (``suggestWhichBrokerId``, see
:meth:`PullMessageProcessor._suggest`): with ``slave_read_enable`` a slave when the read was slow (further
behind than the store's memory share), else the master.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_sim.common.errors import (
    BrokerResponseError,
    NoPermissionError,
    ServiceNotAvailableError,
    TopicNotExistError,
)
from broker_sim.common.message import SysFlag
from broker_sim.common.requests import PullMessageRequest, PullMessageResponse, ResponseCode
from broker_sim.common.scheduler import Handle
from broker_sim.store.errors import StoreNotRunningError
from broker_sim.store.results import DispatchRequest, GetMessageStatus

if TYPE_CHECKING:
    from broker_sim.broker.context import BrokerContext
    from broker_sim.broker.filtering import PullFilter

log = logging.getLogger(__name__)

MASTER_ID = 0  # MixAll.MASTER_ID

PullCallback = Callable[[PullMessageResponse | BaseException], None]

_CODES = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


@dataclass
class _Held:
    request: PullMessageRequest
    callback: PullCallback
    handle: Handle | None = None
    done: bool = False


class PullMessageProcessor:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], list[_Held]] = {}
        self._wakeups = ThreadPoolExecutor(4, thread_name_prefix="pull-wakeup")
        self.held_count = 0  # pulls that were suspended at least once (stats, tests)

    def shutdown(self) -> None:
        with self._lock:
            held = [h for hs in self._held.values() for h in hs]
            self._held.clear()
        for h in held:
            self._finish(h, None)
        self._wakeups.shutdown(wait=False, cancel_futures=True)

    # -- request --------------------------------------------------------------------------------------------

    def process(self, req: PullMessageRequest, callback: PullCallback) -> None:
        """Answer now through ``callback``, or hold the request and answer later (same callback, once)."""
        b = self.broker
        b.check_running()
        sg = b.groups.find(req.consumer_group)
        if not sg.consume_enable:
            raise NoPermissionError(f"subscription group [{req.consumer_group}] does not allow consumption")
        tc = b.topics.select(req.topic)
        if tc is None:
            raise TopicNotExistError(f"topic[{req.topic}] not exist, apply first please!")
        if not tc.readable:
            raise NoPermissionError(f"the topic[{req.topic}] pulling message is forbidden")
        if not 0 <= req.queue_id < tc.read_queue_nums:
            raise BrokerResponseError(
                f"queueId[{req.queue_id}] is illegal, topic:[{req.topic}] topicConfig.readQueueNums:"
                f"[{tc.read_queue_nums}]"
            )
        if req.sys_flag & SysFlag.PULL_COMMIT_OFFSET and req.commit_offset >= 0:
            b.commit_consumer_offset(req.consumer_group, req.topic, req.queue_id, req.commit_offset)
        if not req.sys_flag & SysFlag.PULL_SUSPEND:
            # A pull that will not be held sees what is already appended (see Broker.get_max_offset).
            b.store.wait_dispatched(1.0)
        try:
            resp = self.execute(req)
        except StoreNotRunningError:  # checked running above, then the store stopped: a shutdown or power cut
            raise ServiceNotAvailableError("broker is shutting down") from None
        if (
            resp.code == ResponseCode.PULL_NOT_FOUND
            and req.sys_flag & SysFlag.PULL_SUSPEND
            and req.suspend_timeout_ms > 0
        ):
            self._hold(req, callback)
            return
        callback(resp)

    def _filter(self, req: PullMessageRequest) -> PullFilter:
        expression, expression_type = req.subscription, str(req.expression_type)
        if not req.sys_flag & SysFlag.PULL_SUBSCRIPTION or expression is None:
            sub = self.broker.consumers.subscription(req.consumer_group, req.topic)
            expression = sub.sub_string if sub is not None else "*"
            expression_type = str(sub.expression_type) if sub is not None else "TAG"
        return self.broker.filters.for_pull(expression_type, expression)

    def execute(self, req: PullMessageRequest) -> PullMessageResponse:
        """One read of the store, mapped to a pull reply (no holding)."""
        b = self.broker
        store = b.store
        delayed_until = b.faults.queue_delayed_until(req.topic, req.queue_id)
        if delayed_until:
            lo = store.get_min_offset_in_queue(req.topic, req.queue_id)
            hi = store.get_max_offset_in_queue(req.topic, req.queue_id)
            return PullMessageResponse(
                ResponseCode.PULL_NOT_FOUND, req.queue_offset, lo, hi, broker_name=b.config.broker_name
            )
        flt = self._filter(req)
        result = store.get_message(
            req.consumer_group, req.topic, req.queue_id, req.queue_offset, req.max_msg_nums, flt.tag_codes,
            record_filter=flt.record,
        )  # fmt: skip
        status = result.status
        if status in (GetMessageStatus.NO_MESSAGE_IN_QUEUE, GetMessageStatus.NO_MATCHED_LOGIC_QUEUE):
            code = ResponseCode.PULL_NOT_FOUND if req.queue_offset == 0 else ResponseCode.PULL_OFFSET_MOVED
        else:
            code = _CODES[status]
        if code == ResponseCode.PULL_OFFSET_MOVED and not store.config.moves_readers:
            # "none correction": the reader keeps its offset and is sent to the group's broker (the master)
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
            suggest = b.groups.find(req.consumer_group).broker_id
        else:
            suggest = self._suggest(req.consumer_group, result.suggest_pulling_from_slave)
        return PullMessageResponse(
            code,
            result.next_begin_offset,
            result.min_offset,
            result.max_offset,
            records=[m.raw for m in result.messages],
            broker_name=b.config.broker_name,
            suggest_which_broker_id=suggest,
        )

    def _suggest(self, group: str, slow: bool) -> int:
        """``suggestWhichBrokerId`` as 4.9.8's PullMessageProcessor leaves it: with ``slaveReadEnable`` the
        group's ``whichBrokerWhenConsumeSlowly`` for a slow reader and its ``brokerId`` otherwise (on a
        master and on a slave alike, so a slave sends a reader that caught up back to the master); without
        it, always the master (the role-dependent value set before is overwritten by this step)."""
        if not self.broker.config.slave_read_enable:
            return MASTER_ID
        sg = self.broker.groups.find(group)
        return sg.which_broker_when_consume_slowly if slow else sg.broker_id

    # -- holding --------------------------------------------------------------------------------------------

    def _hold(self, req: PullMessageRequest, callback: PullCallback) -> None:
        b = self.broker
        held = _Held(req, callback)
        key = (req.topic, req.queue_id)
        timeout = req.suspend_timeout_ms if b.config.long_polling_enable else b.config.short_polling_time_ms
        delayed_until = b.faults.queue_delayed_until(req.topic, req.queue_id)
        if delayed_until:
            timeout = min(timeout, max(0, delayed_until - b.clock.now_ms()))
        with self._lock:
            self._held.setdefault(key, []).append(held)
            self.held_count += 1
        held.handle = b.scheduler.schedule(timeout, lambda: self._expire(key, held), name="pull-hold-timeout")
        # A message may have been dispatched between the read and the registration: look again.
        if b.store.get_max_offset_in_queue(req.topic, req.queue_id) > req.queue_offset and not delayed_until:
            self._wake(key, held)

    def _expire(self, key: tuple[str, int], held: _Held) -> None:
        self._wake(key, held)

    def _wake(self, key: tuple[str, int], held: _Held) -> None:
        with self._lock:
            if held.done:
                return
            held.done = True
            lst = self._held.get(key, [])
            if held in lst:
                lst.remove(held)
            if not lst:
                self._held.pop(key, None)
        if held.handle is not None:
            held.handle.cancel()
        try:
            self._wakeups.submit(self._answer, held)
        except RuntimeError:
            self._finish(held, None)

    def _answer(self, held: _Held) -> None:
        try:
            resp = self.execute(held.request)
        except StoreNotRunningError:  # woken as the store shut down (a power cut): the broker's going away
            self._finish(held, None)
            return
        except Exception as exc:
            self._finish(held, exc)
            return
        self._finish(held, resp)

    def _finish(self, held: _Held, result: PullMessageResponse | BaseException | None) -> None:
        if result is None:
            result = ServiceNotAvailableError("broker is shutting down")
        try:
            held.callback(result)
        except Exception:
            log.exception("pull callback failed for %s:%d", held.request.topic, held.request.queue_id)

    def on_dispatch(self, req: DispatchRequest) -> None:
        """Dispatch listener: a message reached topic/queue at ``consume_queue_offset``; wake its held
        pulls."""
        if not req.in_consume_queue:
            return
        key = (req.topic, req.queue_id)
        with self._lock:
            lst = self._held.get(key)
            if not lst:
                return
            ready = [h for h in lst if h.request.queue_offset <= req.consume_queue_offset]
        for h in ready:
            if not self.broker.faults.queue_delayed_until(req.topic, req.queue_id):
                self._wake(key, h)
