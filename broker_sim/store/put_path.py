"""The put path of :class:`~broker_sim.store.message_store.MessageStore` (RocketMQ's ``putMessage``): refusals
as statuses, the delay rewrite, the append, the dispatcher wake-up and the SYNC_FLUSH / SYNC_MASTER waits.

Why a module of its own: it is the store's hot path and has two entries with one behaviour. The general
:meth:`PutPath.put_general` handles every case; when a store's puts only append and wake the dispatcher
(asynchronous dispatch, no replication) and the compiled codec is built,
:attr:`PutPath.put_message` is instead the compiled ``put_plain`` bound to the commit log — one C call per
put, no Python frame — which hands anything unusual (store stopped, disk full, a ``DELAY`` property, input
the encoder rejects, the commit-log lock busy) back to ``put_general``. Under SYNC_FLUSH on the system clock
the same call also waits for the flush on the compiled gate (:mod:`broker_sim.store.flush`).
``tests/broker_sim/store/test_codec.py`` checks that both entries give the same files and results.

Under SYNC_FLUSH a put does not wake the dispatcher itself: the group commit wakes it once per flush round
(before the ``fdatasync``, see :mod:`broker_sim.store.flush`), and the put waits for that round anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from broker_sim.store import codec
from broker_sim.store.commit_log import CommitLog
from broker_sim.store.config import FlushDiskType, StoreConfig
from broker_sim.store.dispatcher import Dispatcher
from broker_sim.store.errors import MessageIllegalError, PropertiesSizeExceededError
from broker_sim.store.expiry import ExpiryService
from broker_sim.store.flush import GroupCommitService, PyFlushGate
from broker_sim.store.ha.master import ReplicaResult
from broker_sim.store.ha.replication import Replication
from broker_sim.store.message_record import PROPERTY_DELAY, MessageInner, schedule_rewrite
from broker_sim.store.results import AppendMessageResult, PutMessageResult, PutMessageStatus

log = logging.getLogger(__name__)
_PUT_OK = PutMessageStatus.PUT_OK
_T = TypeVar("_T")
_Appended = AppendMessageResult | PutMessageResult
PutFn = Callable[[MessageInner], PutMessageResult]


class PutPath:
    __slots__ = (
        "commit_log", "config", "crashed", "dispatcher", "expiry", "group_commit", "put_message",
        "replication", "running", "sync",
    )  # fmt: skip

    def __init__(
        self,
        config: StoreConfig,
        commit_log: CommitLog,
        dispatcher: Dispatcher,
        group_commit: GroupCommitService,
        replication: Replication,
        expiry: ExpiryService,
    ) -> None:
        self.config = config
        self.commit_log = commit_log
        self.dispatcher = dispatcher
        self.group_commit = group_commit
        self.replication = replication
        self.expiry = expiry
        self.sync = config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self.running = False  # set by MessageStore.start/shutdown/crash; the compiled put reads it too
        self.crashed = False
        if self.sync:
            group_commit.before_round = dispatcher.wake
        rep = replication
        fast: PutFn | None = None
        if config.dispatch_async and rep.service is None and not rep.is_slave:
            fgate = group_commit.gate
            if not self.sync:
                fast = commit_log.plain_put(dispatcher.wake_event, self, expiry, self.put_general)
            elif not isinstance(fgate, PyFlushGate):  # the compiled gate: put and wait in one call
                sync = (fgate, config.sync_flush_timeout_ms / 1000, self.flush_outcome)
                fast = commit_log.plain_put(dispatcher.wake_event, self, expiry, self.put_general, sync)
        #: what MessageStore.put_message is: the compiled one-call put, or :meth:`put_general`
        self.put_message: PutFn = fast or self.put_general

    def refusal(self) -> PutMessageResult | None:
        if not self.running:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="store is not running")
        if self.expiry.disk_full:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="disk full")
        if self.replication.is_slave:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, remark="this broker is a slave")
        return None

    def put_general(self, msg: MessageInner) -> PutMessageResult:
        """Append one message (see MessageStore.put_message for the statuses)."""
        refusal = self.refusal()
        if refusal is not None:
            return refusal
        if PROPERTY_DELAY in msg.properties:
            try:
                msg = schedule_rewrite(msg, len(self.config.delay_levels_ms))
            except MessageIllegalError as exc:
                return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, remark=str(exc))
        result = self._append(self.commit_log.append, msg)
        if isinstance(result, PutMessageResult):
            return result
        if self.sync or not self.config.dispatch_async or self.replication.service is not None:
            return self._after_append(result)
        self.dispatcher.wake()  # the common ASYNC_FLUSH case, inlined: nothing to wait for
        return PutMessageResult(_PUT_OK, result)

    def put_messages(self, msgs: Sequence[MessageInner]) -> PutMessageResult:
        """Append several messages contiguously and atomically (see MessageStore.put_messages)."""
        refusal = self.refusal()
        if refusal is not None:
            return refusal
        if not msgs:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, remark="empty batch")
        levels = len(self.config.delay_levels_ms)
        try:
            batch = [schedule_rewrite(m, levels) if PROPERTY_DELAY in m.properties else m for m in msgs]
        except MessageIllegalError as exc:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, remark=str(exc))
        result = self._append(self.commit_log.append_batch, batch)
        return result if isinstance(result, PutMessageResult) else self._after_append(result)

    def flush_outcome(self, result: AppendMessageResult, flushed: bool) -> PutMessageResult:
        """The status of a SYNC_FLUSH put whose wait ended (compiled put: only when not simply PUT_OK)."""
        if self.crashed:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, result, "store crashed")
        if not flushed:
            return PutMessageResult(PutMessageStatus.FLUSH_DISK_TIMEOUT, result, "sync flush timed out")
        return PutMessageResult(_PUT_OK, result)

    def _append(self, fn: Callable[[_T], AppendMessageResult], arg: _T) -> _Appended:
        """``append(arg)``, with bad input and a failed segment creation turned into their statuses."""
        try:
            return fn(arg)
        except PropertiesSizeExceededError as exc:
            return PutMessageResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, remark=str(exc))
        except MessageIllegalError as exc:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, remark=str(exc))
        except OSError as exc:
            log.exception("cannot create a commit-log segment")
            return PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED, remark=str(exc))

    def _after_append(self, result: AppendMessageResult) -> PutMessageResult:
        if not self.config.dispatch_async:
            self.dispatcher.dispatch_pending()
        elif not self.sync:
            self.dispatcher.wake()  # under SYNC_FLUSH the flush round wakes it (module docstring)
        if self.sync:
            end = result.wrote_offset + result.wrote_bytes if result.msg_num == 1 else result.offsets[-1] + 1
            flushed = self.group_commit.wait_flushed(end, self.config.sync_flush_timeout_ms)
            if self.crashed or not flushed:
                return self.flush_outcome(result, flushed)
        replicated = self.replication.wait(result.wrote_offset + result.wrote_bytes)
        if replicated is not ReplicaResult.OK:
            return PutMessageResult(PutMessageStatus[replicated.value], result, "not on a slave")
        return PutMessageResult(_PUT_OK, result)


if codec.compiled is not None:
    codec.compiled.register_slots(PutPath, "put_path")  # running / crashed, read by the compiled put
    codec.compiled.register_slots(ExpiryService, "expiry")  # disk_full, read by the compiled put
