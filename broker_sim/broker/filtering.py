"""Which messages a subscription wants: tag codes checked on the consume queue, and for SQL92 subscriptions a
check of each message's properties (RocketMQ's ``ExpressionMessageFilter``: consume-queue stage, then
commit-log stage).

SQL92 needs ``enable_property_filter`` on the broker, as in RocketMQ (``BrokerConfig.enablePropertyFilter``,
off by default): without it CHECK_CLIENT_CONFIG and every SQL92 pull are refused with SYSTEM_ERROR "The broker
does not support consumer to filter message by SQL92", so a consumer learns at start that nothing would match
— never a silent empty queue. An expression that does not parse is SUBSCRIPTION_PARSE_FAILED.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from broker_sim.common.constants import parse_tag_expression
from broker_sim.common.errors import BrokerResponseError
from broker_sim.common.requests import ExpressionType, ResponseCode
from broker_sim.filter import Sql92Error, Sql92Filter, compile_sql92
from broker_sim.store.message_record import decode_record, tags_hash

RecordFilter = Callable[[bytes], bool]


@dataclass(frozen=True)
class PullFilter:
    """``tag_codes`` for the consume-queue stage (None: every unit), ``record`` for the commit-log stage."""

    tag_codes: frozenset[int] | None
    record: RecordFilter | None = None


class SubscriptionFilters:
    """Compiles subscriptions once (SQL92 expressions are cached by text) and refuses unsupported ones."""

    def __init__(self, enable_property_filter: bool) -> None:
        self.enable_property_filter = enable_property_filter
        self._sql: dict[str, Sql92Filter] = {}
        self._lock = threading.Lock()

    def check(self, expression_type: str, expression: str) -> None:
        """CHECK_CLIENT_CONFIG (46) for one subscription: return if the broker can serve it, else raise. A TAG
        subscription is always accepted (``ClientManageProcessor.checkClientConfig`` does not parse it)."""
        if expression_type in ("", ExpressionType.TAG):
            return
        self.for_pull(expression_type, expression)

    def for_pull(self, expression_type: str, expression: str) -> PullFilter:
        if expression_type in ("", ExpressionType.TAG):
            try:
                tags = parse_tag_expression(expression)
            except ValueError as exc:
                raise BrokerResponseError(str(exc), int(ResponseCode.SUBSCRIPTION_PARSE_FAILED)) from exc
            return PullFilter(None if tags is None else frozenset(tags_hash(t) for t in tags))
        if not self.enable_property_filter:
            raise BrokerResponseError(
                f"The broker does not support consumer to filter message by {expression_type} "
                "(start it with enable_property_filter=true)",
                int(ResponseCode.SYSTEM_ERROR),
            )
        if expression_type != ExpressionType.SQL92:
            raise BrokerResponseError(
                f"unknown expression type {expression_type!r} (TAG or SQL92)",
                int(ResponseCode.SUBSCRIPTION_PARSE_FAILED),
            )
        compiled = self._compile(expression)
        return PullFilter(None, lambda raw: compiled.matches(decode_record(raw).properties))

    def _compile(self, expression: str) -> Sql92Filter:
        with self._lock:
            compiled = self._sql.get(expression)
        if compiled is None:
            try:
                compiled = compile_sql92(expression)
            except Sql92Error as exc:
                raise BrokerResponseError(str(exc), int(ResponseCode.SUBSCRIPTION_PARSE_FAILED)) from exc
            with self._lock:
                self._sql[expression] = compiled
        return compiled
