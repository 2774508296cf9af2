"""Transactional producer: half message → local transaction → commit/rollback, and the broker's check-back.

``send_message_in_transaction(msg, arg)`` stores a half message (invisible to consumers), runs
``executor(msg, arg)``, and reports its answer with END_TRANSACTION. UNKNOW (or an executor that raises)
leaves
the message half; the broker then asks ``checker(msg_ext)`` every check interval until it gets COMMIT or
ROLLBACK, at most 15 times.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from broker_sim.client.producer import Producer
from broker_sim.common.channels import CheckTransactionStateRequest
from broker_sim.common.errors import BrokerResponseError, SendFailedError, TransportError
from broker_sim.common.message import (
    LocalTransactionState,
    Message,
    MessageExt,
    Prop,
    SendStatus,
    TransactionSendResult,
    decode_offset_msg_id,
)
from broker_sim.common.requests import EndTransactionRequest, TransactionType

log = logging.getLogger(__name__)

TransactionExecutor = Callable[[Message, Any], LocalTransactionState]
TransactionChecker = Callable[[MessageExt], LocalTransactionState]

_TYPES = {
    LocalTransactionState.COMMIT_MESSAGE: TransactionType.COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: TransactionType.ROLLBACK,
    LocalTransactionState.UNKNOW: TransactionType.NOT_TYPE,
}


class TransactionProducer(Producer):
    def __init__(
        self,
        broker_or_address: object,
        group: str,
        executor: TransactionExecutor,
        checker: TransactionChecker,
        **kwargs: Any,
    ) -> None:
        self.executor = executor
        self.checker = checker
        self.checks_answered = 0
        super().__init__(broker_or_address, group, **kwargs)

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        if msg.delay_time_level > 0:
            raise SendFailedError("a transactional message cannot be delayed")
        msg.properties[Prop.TRAN_MSG] = "true"
        msg.properties[Prop.PRODUCER_GROUP] = self.group
        result = self.send(msg)
        state = LocalTransactionState.ROLLBACK_MESSAGE
        if result.status is SendStatus.SEND_OK:
            try:
                state = self.executor(msg, arg)
            except Exception:
                log.exception("local transaction of %s raised; state unknown until check-back", result.msg_id)
                state = LocalTransactionState.UNKNOW
            if not isinstance(state, LocalTransactionState):
                state = LocalTransactionState.UNKNOW
        _, commit_log_offset = decode_offset_msg_id(result.offset_msg_id)
        self._end(
            EndTransactionRequest(
                self.group,
                result.offset_msg_id,
                result.transaction_id or result.msg_id,
                result.queue_offset,
                commit_log_offset,
                _TYPES[state],
                broker_name=result.broker_name or "",
            )
        )
        return TransactionSendResult(
            result.status,
            result.msg_id,
            result.queue_id,
            result.queue_offset,
            result.offset_msg_id,
            result.topic,
            result.broker_name,
            result.transaction_id,
            state,
        )

    def _end(self, req: EndTransactionRequest) -> None:
        try:
            self.transport.end_transaction(req)
        except (TransportError, BrokerResponseError) as exc:
            # END_TRANSACTION is oneway in RocketMQ: a lost one is what check-back is for.
            log.warning("end transaction %s failed: %s (the broker will check back)", req.transaction_id, exc)

    def check_transaction_state(
        self, producer_group: str, request: CheckTransactionStateRequest, message: MessageExt
    ) -> None:
        """Broker → client: answer on a background thread, as RocketMQ's checkExecutor does."""
        if self._executor is None:
            return

        def answer() -> None:
            try:
                state = self.checker(message)
            except Exception:
                log.exception("transaction checker raised for %s", request.msg_id)
                state = LocalTransactionState.UNKNOW
            self.checks_answered += 1
            self._end(
                EndTransactionRequest(
                    self.group,
                    request.offset_msg_id,
                    request.transaction_id,
                    request.tran_state_table_offset,
                    request.commit_log_offset,
                    _TYPES.get(state, TransactionType.NOT_TYPE),
                    True,
                )
            )

        try:
            self._executor.submit(answer)
        except RuntimeError:
            log.info(
                "producer %s is shutting down; transaction check for %s ignored", self.group, request.msg_id
            )
