"""Admin operations (the ``mqadmin`` side of the broker): topics, consumer progress and lag, message lookup.

These read the store directly and ignore topic permissions and consumer offsets (an operator looks into any
queue, e.g. a ``%DLQ%`` topic, without a group), which is why they are not request handlers of the consumer
path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker_sim.broker.topics import TopicConfig
from broker_sim.common.constants import dlq_topic, retry_topic
from broker_sim.common.convert import to_client
from broker_sim.common.errors import BrokerResponseError, InvalidTopicError, TopicNotExistError
from broker_sim.common.message import MessageExt, MessageQueue, decode_offset_msg_id
from broker_sim.common.requests import Perm, QueueProgress
from broker_sim.store.results import GetMessageStatus

if TYPE_CHECKING:
    from broker_sim.broker.clients import ConsumerManager
    from broker_sim.broker.config import BrokerConfig
    from broker_sim.broker.offsets import ConsumerOffsetManager
    from broker_sim.broker.topics import TopicConfigManager
    from broker_sim.store.message_store import MessageStore


class AdminService:
    """The broker's admin requests; the Broker owns one (``broker.admin``) and exposes its methods."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        consumers: ConsumerManager,
        config: BrokerConfig,
        check_running: Callable[[], None],
    ) -> None:
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.consumers = consumers
        self.config = config
        self.check_running = check_running

    # -- topics ---------------------------------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        queue_nums: int = 8,
        *,
        read_queue_nums: int | None = None,
        write_queue_nums: int | None = None,
        perm: int = int(Perm.READ_WRITE),
        order: bool = False,
    ) -> TopicConfig:
        """Create or update a topic (``mqadmin updateTopic``)."""
        from broker_sim.store.errors import MessageIllegalError
        from broker_sim.store.message_record import check_topic

        try:
            check_topic(topic)
        except MessageIllegalError as exc:
            raise InvalidTopicError(str(exc)) from exc
        tc = TopicConfig(
            topic,
            read_queue_nums if read_queue_nums is not None else queue_nums,
            write_queue_nums if write_queue_nums is not None else queue_nums,
            perm,
            0,
            order,
        )
        return self.topics.update(tc)

    def delete_topic(self, topic: str) -> bool:
        """Forget a topic's config and consumer offsets (its stored messages expire with their files)."""
        self.offsets.remove_topic(topic)
        return self.topics.delete(topic)

    def topic_list(self) -> list[TopicConfig]:
        return self.topics.topics()

    # -- progress -------------------------------------------------------------------------------------------

    def consumer_progress(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """Per queue: broker max offset, the group's committed offset, and the lag (``consumerProgress``)."""
        topics = (
            [topic] if topic else sorted(set(self.offsets.topics_of_group(group)) | self._subscribed(group))
        )
        out = []
        for t in topics:
            tc = self.topics.select(t)
            nums = tc.read_queue_nums if tc is not None else 0
            committed = self.offsets.table(group, t)
            for qid in sorted(set(range(nums)) | set(committed)):
                hi = self.store.get_max_offset_in_queue(t, qid)
                cons = committed.get(qid, -1)
                ts = 0
                if 0 <= cons < hi:
                    ts = self.store.get_message_store_timestamp(t, qid, cons)
                out.append(QueueProgress(MessageQueue(t, self.config.broker_name, qid), hi, max(cons, 0), ts))
        return out

    def query_consume_queue(
        self, topic: str, queue_id: int, index: int, count: int
    ) -> tuple[list[tuple[int, int, int, int]], int, int]:
        """QUERY_CONSUME_QUEUE (321): units ``(queueOffset, commitLogOffset, size, tagsCode)`` from
        ``index``, with the queue's min and max offset."""
        self.check_running()
        if self.topics.select(topic) is None:
            raise TopicNotExistError(f"topic[{topic}] not exist")
        self.store.wait_dispatched(1.0)
        units = self.store.consume_queue_units(topic, queue_id, index, min(count, 1000))
        lo = self.store.get_min_offset_in_queue(topic, queue_id)
        return units, lo, self.store.get_max_offset_in_queue(topic, queue_id)

    def _subscribed(self, group: str) -> set[str]:
        info = self.consumers.group(group)
        return set(info.subscriptions) if info else set()

    # -- messages -------------------------------------------------------------------------------------------

    def view_message_by_id(self, offset_msg_id: str) -> MessageExt:
        """VIEW_MESSAGE_BY_ID (33): the message at the commit-log offset encoded in an offset message id."""
        self.check_running()
        try:
            _, offset = decode_offset_msg_id(offset_msg_id)
        except ValueError as exc:
            raise BrokerResponseError(f"bad message id {offset_msg_id!r}: {exc}") from exc
        return self.view_message_by_offset(offset)

    def view_message_by_offset(self, commit_log_offset: int) -> MessageExt:
        ext = self.store.look_message_by_offset(commit_log_offset)
        if ext is None:
            raise BrokerResponseError(f"no message at commit-log offset {commit_log_offset}")
        return to_client(ext, self.config.broker_name)

    def query_message_by_key(self, topic: str, key: str, max_num: int = 64) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` among their KEYS or as UNIQ_KEY, newest first."""
        self.check_running()
        if self.topics.select(topic) is None:
            raise TopicNotExistError(f"topic[{topic}] not exist")
        self.store.wait_dispatched(2.0)  # admin reads see every acknowledged send (the index is built async)
        result = self.store.query_message(topic, key, max_num)
        return [to_client(sel.ext, self.config.broker_name) for sel in result.messages]

    def messages(
        self, topic: str, queue_id: int = 0, offset: int = 0, max_num: int = 10_000
    ) -> list[MessageExt]:
        """Read a queue directly (admin/tests: ignores permissions and consumer offsets)."""
        self.check_running()
        self.store.wait_dispatched(2.0)
        out: list[MessageExt] = []
        while len(out) < max_num:
            r = self.store.get_message("ADMIN", topic, queue_id, offset, min(32, max_num - len(out)))
            if r.status is GetMessageStatus.OFFSET_TOO_SMALL:
                offset = r.next_begin_offset
                continue
            if r.status is not GetMessageStatus.FOUND:
                if r.status in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING):
                    offset = r.next_begin_offset
                    continue
                break
            out.extend(to_client(sel.ext, self.config.broker_name) for sel in r.messages)
            offset = r.next_begin_offset
        return out

    def retry_messages(self, group: str) -> list[MessageExt]:
        tc = self.topics.select(retry_topic(group))
        n = tc.read_queue_nums if tc else 0
        return [m for q in range(n) for m in self.messages(retry_topic(group), q)]

    def dlq_messages(self, group: str) -> list[MessageExt]:
        """Everything dead-lettered for ``group`` (a consumer of ``%DLQ%{group}`` sees them too)."""
        return self.messages(dlq_topic(group), 0) if self.topics.select(dlq_topic(group)) else []

    def persist_all(self) -> None:
        """Write consumer offsets and topic/group config now (they are otherwise written every 5 s / on
        change)."""
        self.offsets.persist()
        self.topics.persist()
