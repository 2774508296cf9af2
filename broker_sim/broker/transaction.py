"""Transactional (half) messages: RocketMQ's TransactionalMessageService and its check-back.

``send`` with the PREPARED flag stores the message on ``RMQ_SYS_TRANS_HALF_TOPIC`` (REAL_TOPIC/REAL_QID kept),
where no consumer reads it. END_TRANSACTION COMMIT stores a copy on the real topic (sysFlag COMMIT) and
ROLLBACK does not; both write an *op* record (body = the half message's queue offset) on
``RMQ_SYS_TRANS_OP_HALF_TOPIC`` so the half message is never checked again. Every
``transaction_check_interval_ms`` (60 s on the broker clock) the checker walks the half queue from its saved
progress: a half message older than ``transaction_timeout_ms`` without an op is put back with
TRANSACTION_CHECK_TIMES + 1 and its producer group is asked (CHECK_TRANSACTION_STATE); after
``transaction_check_max`` (15) checks it is discarded (logged and counted).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from broker_sim.common.channels import CheckTransactionStateRequest
from broker_sim.common.constants import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from broker_sim.common.convert import to_client
from broker_sim.common.errors import BrokerResponseError
from broker_sim.common.message import Prop, SysFlag
from broker_sim.common.requests import EndTransactionRequest, TransactionType
from broker_sim.store.message_record import MessageExt as Stored
from broker_sim.store.message_record import MessageInner, host_bytes, offset_msg_id
from broker_sim.store.results import GetMessageStatus, PutMessageResult

if TYPE_CHECKING:
    from broker_sim.broker.context import BrokerContext

log = logging.getLogger(__name__)

CHECK_GROUP = "CID_RMQ_SYS_TRANS"
#: how long (real time) a check round waits for the dispatcher to catch up before it reads the half queue
_DISPATCH_WAIT_S = 5.0
OP_TAG = "d"


class TransactionService:
    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self._lock = threading.Lock()
        self._ops: set[int] = set()  # half-queue offsets that have an op record
        self._op_read = 0
        self._ended: set[str] = set()  # UNIQ_KEYs already committed/rolled back (a late answer for a copy)
        self.checks_sent = 0
        self.discarded = 0
        self.committed = 0
        self.rolled_back = 0

    def start(self) -> None:
        b = self.broker
        interval = b.config.transaction_check_interval_ms
        b.scheduler.schedule_periodic(interval, interval, self.check, name="transaction-check")

    # -- half messages --------------------------------------------------------------------------------------

    def half_message(self, inner: MessageInner) -> MessageInner:
        """The copy actually stored for a prepared send: half topic, queue 0, readable by nobody."""
        props = dict(inner.properties)
        props[Prop.REAL_TOPIC] = inner.topic
        props[Prop.REAL_QID] = str(inner.queue_id)
        return MessageInner(
            topic=TRANS_HALF_TOPIC, body=inner.body, queue_id=0, flag=inner.flag, properties=props,
            sys_flag=inner.sys_flag & ~SysFlag.TRANSACTION_MASK, born_timestamp=inner.born_timestamp,
            born_host=inner.born_host, store_host=inner.store_host, reconsume_times=inner.reconsume_times,
        )  # fmt: skip

    def end(self, req: EndTransactionRequest) -> None:
        b = self.broker
        if req.commit_or_rollback is TransactionType.NOT_TYPE:
            log.info(
                "transaction %s of %s: state unknown, left for check-back",
                req.transaction_id,
                req.producer_group,
            )
            return
        half = b.store.look_message_by_offset(req.commit_log_offset)
        if half is None or half.topic != TRANS_HALF_TOPIC:
            raise BrokerResponseError(f"no half message at commit-log offset {req.commit_log_offset}")
        if half.properties.get(Prop.PRODUCER_GROUP) not in (None, req.producer_group):
            raise BrokerResponseError("the producer group is not the one that sent the half message")
        with self._lock:
            if half.queue_offset in self._ops:
                log.info("transaction at half offset %d already ended; ignored", half.queue_offset)
                return
        key = half.uniq_key or str(half.commit_log_offset)
        with self._lock:
            already = key in self._ended
            self._ended.add(key)
        if already:
            log.info("transaction %s already ended; the answer for a check copy only closes the copy", key)
        elif req.commit_or_rollback is TransactionType.COMMIT:
            self._commit(half)
        else:
            self.rolled_back += 1
        self._write_op(half.queue_offset)

    def _commit(self, half: Stored) -> None:
        props = dict(half.properties)
        topic = props.pop(Prop.REAL_TOPIC, "")
        qid = int(props.pop(Prop.REAL_QID, "0"))
        props.pop(Prop.TRANSACTION_CHECK_TIMES, None)
        inner = MessageInner(
            topic=topic, body=half.body, queue_id=qid, flag=half.flag, properties=props,
            sys_flag=(half.sys_flag & ~SysFlag.TRANSACTION_MASK) | SysFlag.TRANSACTION_COMMIT,
            born_timestamp=half.born_timestamp, born_host=half.born_host, store_host=half.store_host,
            reconsume_times=half.reconsume_times, prepared_transaction_offset=half.commit_log_offset,
        )  # fmt: skip
        self._put(inner, "commit")
        self.committed += 1

    def _write_op(self, half_queue_offset: int) -> None:
        op = MessageInner(
            topic=TRANS_OP_HALF_TOPIC, body=str(half_queue_offset).encode(), properties={Prop.TAGS: OP_TAG},
            born_timestamp=self.broker.clock.now_ms(),
        )  # fmt: skip
        self._put(op, "op")
        with self._lock:
            self._ops.add(half_queue_offset)

    def _put(self, inner: MessageInner, what: str) -> PutMessageResult:
        result = self.broker.store.put_message(inner)
        if not result.ok:
            raise BrokerResponseError(
                f"transaction {what} could not be stored: {result.status.value} {result.remark}"
            )
        return result

    # -- check-back -----------------------------------------------------------------------------------------

    def _load_ops(self) -> None:
        store = self.broker.store
        while True:
            r = store.get_message(CHECK_GROUP, TRANS_OP_HALF_TOPIC, 0, self._op_read, 32, None)
            if r.status is not GetMessageStatus.FOUND:
                if r.status is GetMessageStatus.OFFSET_TOO_SMALL:
                    self._op_read = r.next_begin_offset
                    continue
                return
            for sel in r.messages:
                try:
                    with self._lock:
                        self._ops.add(int(sel.ext.body))
                except ValueError:
                    log.error("op record at %d has a non-numeric body", sel.phys_offset)
            self._op_read = r.next_begin_offset

    def check(self) -> None:
        """One check round (runs every ``transaction_check_interval_ms``; tests may call it directly)."""
        b = self.broker
        if not b.store.running:
            return
        # The round reads the half and op queues, which the dispatcher fills a moment after each put: wait for
        # it, so a round sees every half message, put-back copy and op stored before it began (a copy put
        # back by the previous round and not yet dispatched would otherwise be skipped for a whole interval).
        if not b.store.wait_dispatched(_DISPATCH_WAIT_S):
            log.warning(
                "transaction check: the dispatcher is behind by %d bytes", b.store.dispatch_behind_bytes()
            )
        self._load_ops()
        progress = max(0, b.offsets.query_offset(CHECK_GROUP, TRANS_HALF_TOPIC, 0))
        hi = b.store.get_max_offset_in_queue(TRANS_HALF_TOPIC, 0)
        now = b.clock.now_ms()
        cfg = b.config
        while progress < hi:
            r = b.store.get_message(CHECK_GROUP, TRANS_HALF_TOPIC, 0, progress, 32, None)
            if r.status is GetMessageStatus.OFFSET_TOO_SMALL:
                progress = r.next_begin_offset
                continue
            if r.status is not GetMessageStatus.FOUND:
                break
            stop = False
            for sel in r.messages:
                with self._lock:
                    done = sel.queue_offset in self._ops
                if not done:
                    half = sel.ext
                    if now - half.store_timestamp < cfg.transaction_timeout_ms:
                        stop = True
                        break
                    self._check_one(half)
                progress = sel.queue_offset + 1
            if stop:
                break
        b.offsets.commit_offset(CHECK_GROUP, TRANS_HALF_TOPIC, 0, progress)

    def _check_one(self, half: Stored) -> None:
        b = self.broker
        times = int(half.properties.get(Prop.TRANSACTION_CHECK_TIMES, "0"))
        if times >= b.config.transaction_check_max:
            self.discarded += 1
            log.warning(
                "half message %s of %s checked %d times without an answer; discarded",
                half.uniq_key, half.properties.get(Prop.PRODUCER_GROUP), times,
            )  # fmt: skip
            return
        props = dict(half.properties)
        props[Prop.TRANSACTION_CHECK_TIMES] = str(times + 1)
        again = MessageInner(
            topic=TRANS_HALF_TOPIC, body=half.body, queue_id=0, flag=half.flag, properties=props,
            sys_flag=half.sys_flag, born_timestamp=half.born_timestamp, born_host=half.born_host,
            store_host=half.store_host, reconsume_times=half.reconsume_times,
        )  # fmt: skip
        put = self._put(again, "check put-back")
        assert put.append_result is not None
        copy_offset = put.append_result.wrote_offset
        copy = b.store.look_message_by_offset(copy_offset)
        group = half.properties.get(Prop.PRODUCER_GROUP, "")
        channel = b.producers.any_channel(group)
        if channel is None or copy is None:
            log.info("no live producer of group %s to check transaction %s", group, half.uniq_key)
            return
        request = CheckTransactionStateRequest(
            msg_id=half.uniq_key or "",
            transaction_id=half.uniq_key,
            offset_msg_id=offset_msg_id(host_bytes(copy.store_host), copy_offset),
            tran_state_table_offset=copy.queue_offset,
            commit_log_offset=copy_offset,
        )
        # AbstractTransactionalMessageCheckListener.sendCheckMessage: the producer sees the message on its
        # real topic and queue (REAL_TOPIC / REAL_QID), not on the half topic, with store size 0.
        message = to_client(copy, b.config.broker_name)
        message.topic = copy.properties.get(Prop.REAL_TOPIC, message.topic)
        message.queue_id = int(copy.properties.get(Prop.REAL_QID, message.queue_id))
        message.store_size = 0
        self.checks_sent += 1
        try:
            channel.check_transaction_state(group, request, message)
        except Exception:
            log.exception("check-back to %s failed", channel.remote_address)
