"""Consume queues: the 20-byte units parsed from raw bytes, the dispatcher, get_message's statuses."""

from __future__ import annotations

import struct
from pathlib import Path

from broker_sim.clock import ManualClock
from broker_sim.store import DispatchRequest, GetMessageStatus, MessageInner, MessageStore, tags_hash
from broker_sim.store.message_record import java_string_hash
from tests.broker_sim.store.conftest import StoreFactory, msg


def raw_units(store: MessageStore, topic: str, queue_id: int) -> list[tuple[int, int, int]]:
    """Every written unit of a queue, parsed straight from its files (not through the store's decoder)."""
    qdir = store.store_dir / "consumequeue" / topic / str(queue_id)
    out: list[tuple[int, int, int]] = []
    for f in sorted(qdir.iterdir()):
        data = f.read_bytes()
        assert len(data) == 16 * 20 and int(f.name) == len(out) * 20
        for pos in range(0, len(data), 20):
            unit = struct.unpack_from(">qiq", data, pos)
            if unit[1] > 0:
                out.append(unit)
    return out


def test_units_match_records(make_store: StoreFactory) -> None:
    store = make_store()
    puts = [store.put_message(msg(body=b"m%d" % i, queue_id=i % 2, tags=["TagA", "TagB", ""][i % 3]))
            for i in range(50)]  # fmt: skip
    assert store.wait_dispatched()
    store.flush()
    units = raw_units(store, "TopicA", 0)
    expected = [(p.append_result.wrote_offset, p.append_result.wrote_bytes,  # type: ignore[union-attr]
                 java_string_hash(["TagA", "TagB", ""][i % 3]) if i % 3 != 2 else 0)
                for i, p in enumerate(puts) if i % 2 == 0]  # fmt: skip
    assert units == expected
    assert len(list((store.store_dir / "consumequeue" / "TopicA" / "0").iterdir())) == 2  # 25 units, 16/file
    assert store.get_max_offset_in_queue("TopicA", 0) == 25
    assert store.get_min_offset_in_queue("TopicA", 0) == 0
    assert store.get_commit_log_offset_in_queue("TopicA", 1, 3) == puts[7].append_result.wrote_offset  # type: ignore[union-attr]


def test_get_message_statuses(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.get_message("g", "TopicA", 0, 0, 32).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
    nxt = store.get_message("g", "TopicA", 0, 5, 32)
    assert (nxt.status, nxt.next_begin_offset) == (GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0)
    for i in range(20):
        store.put_message(msg(body=b"%d" % i, tags="A" if i % 4 == 0 else "B"))
    store.dispatch_pending()
    got = store.get_message("g", "TopicA", 0, 0, 32)
    # one read stays within one queue file (16 units)
    assert (got.status, got.next_begin_offset, got.min_offset, got.max_offset) == (
        GetMessageStatus.FOUND,
        16,
        0,
        20,
    )
    assert [m.ext.body for m in got.messages] == [b"%d" % i for i in range(16)]
    assert [m.queue_offset for m in got.messages] == list(range(16))
    assert got.body() == b"".join(
        store.select_one_message_by_offset(m.phys_offset) or b"" for m in got.messages
    )
    few = store.get_message("g", "TopicA", 0, 3, 2)
    assert (len(few.messages), few.next_begin_offset) == (2, 5)
    only_a = store.get_message("g", "TopicA", 0, 1, 32, {tags_hash("A")})
    assert [m.ext.body for m in only_a.messages] == [b"4", b"8", b"12"] and only_a.next_begin_offset == 16
    by_pred = store.get_message("g", "TopicA", 0, 16, 32, lambda code: code == tags_hash("A"))
    assert [m.ext.body for m in by_pred.messages] == [b"16"]
    none = store.get_message("g", "TopicA", 0, 17, 32, {tags_hash("A")})
    assert (none.status, none.next_begin_offset) == (GetMessageStatus.NO_MATCHED_MESSAGE, 20)
    one = store.get_message("g", "TopicA", 0, 20, 32)
    assert (one.status, one.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 20)
    bad = store.get_message("g", "TopicA", 0, 25, 32)
    assert (bad.status, bad.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 20)  # 4.9.8: max


def test_batch_limits(make_store: StoreFactory) -> None:
    store = make_store(commit_log_file_size=1024 * 1024, consume_queue_units=1000, max_transfer_bytes=5000)
    for _ in range(100):
        store.put_message(msg(body=b"x" * 1000))
    store.dispatch_pending()
    assert len(store.get_message("g", "TopicA", 0, 0, 64).messages) == 4  # 256 KiB cap shrunk to 5000 B
    store2 = make_store(path=store.store_dir.parent / "s2", consume_queue_units=1000)
    for _ in range(100):
        store2.put_message(msg(body=b"x"))
    store2.dispatch_pending()
    assert (
        len(store2.get_message("g", "TopicA", 0, 0, 64).messages) == 32
    )  # maxTransferCountOnMessageInMemory


def test_transaction_half_and_rollback_get_no_unit(make_store: StoreFactory) -> None:
    store = make_store()
    seen: list[DispatchRequest] = []
    store.add_dispatch_listener(seen.append)
    normal = store.put_message(msg(body=b"normal"))
    store.put_message(_with_flag(msg(body=b"half"), 0x4))
    store.put_message(_with_flag(msg(body=b"rollback"), 0xC))
    commit = store.put_message(_with_flag(msg(body=b"commit"), 0x8))
    assert store.wait_dispatched()
    assert normal.append_result is not None and commit.append_result is not None
    assert [u[0] for u in raw_units_after_flush(store)] == [normal.append_result.wrote_offset,
                                                           commit.append_result.wrote_offset]  # fmt: skip
    assert commit.append_result.queue_offset == 1
    assert [r.in_consume_queue for r in seen] == [True, False, False, True]


def _with_flag(m: MessageInner, flag: int) -> MessageInner:
    m.sys_flag = flag
    return m


def raw_units_after_flush(store: MessageStore) -> list[tuple[int, int, int]]:
    store.flush()
    return raw_units(store, "TopicA", 0)


def test_offset_by_time_and_store_times(make_store: StoreFactory, clock: ManualClock) -> None:
    store = make_store()
    t0 = clock.now_ms()
    for i in range(10):
        store.put_message(msg(body=b"%d" % i))
        clock.advance(1)
    store.dispatch_pending()
    assert store.get_earliest_message_time("TopicA", 0) == t0
    assert store.get_message_store_timestamp("TopicA", 0, 4) == t0 + 4000
    assert store.get_offset_in_queue_by_time("TopicA", 0, t0 + 4000) == 4
    assert store.get_offset_in_queue_by_time("TopicA", 0, t0 + 4500) == 5
    assert store.get_offset_in_queue_by_time("TopicA", 0, 0) == 0
    assert store.get_offset_in_queue_by_time("TopicA", 0, t0 + 10**7) == 10
    assert store.get_earliest_message_time("Nope", 0) == -1


def test_delay_rewrite_puts_delivery_time_in_tags_code(make_store: StoreFactory, clock: ManualClock) -> None:
    store = make_store()
    r = store.put_message(msg(topic="Orders", queue_id=2, DELAY="3"))
    store.dispatch_pending()
    assert r.append_result is not None
    ext = store.look_message_by_offset(r.append_result.wrote_offset)
    assert ext is not None and ext.topic == "SCHEDULE_TOPIC_XXXX" and ext.queue_id == 2
    assert ext.properties["REAL_TOPIC"] == "Orders" and ext.properties["REAL_QID"] == "2"
    store.flush()
    (unit,) = raw_units(store, "SCHEDULE_TOPIC_XXXX", 2)
    assert unit[2] == clock.now_ms() + 10_000  # level 3 = 10 s
    capped = store.put_message(msg(topic="Orders", DELAY="99"))
    assert capped.append_result is not None
    assert store.look_message_by_offset(capped.append_result.wrote_offset).queue_id == 17  # type: ignore[union-attr]
    store.set_tags_code_hook(lambda topic, props, ts: 42 if topic == "Hooked" else None)
    store.put_message(msg(topic="Hooked", tags="X"))
    store.dispatch_pending()
    assert store.get_message("g", "Hooked", 0, 0, 1).messages[0].tags_code == 42


def test_listener_errors_are_counted_not_fatal(make_store: StoreFactory) -> None:
    store = make_store()

    def boom(req: DispatchRequest) -> None:
        raise RuntimeError("listener bug")

    store.add_dispatch_listener(boom)
    store.put_message(msg())
    store.put_message(msg())
    assert store.wait_dispatched()
    assert store.dispatcher.listener_errors == 2
    assert store.get_max_offset_in_queue("TopicA", 0) == 2


def test_rebuild_queues_from_commit_log(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store()
    for i in range(30):
        store.put_message(msg(body=b"%d" % i, queue_id=i % 3, tags="T"))
    store.shutdown()
    before = raw_units(store, "TopicA", 1)
    import shutil

    shutil.rmtree(store.store_dir / "consumequeue")
    again = make_store()
    assert again.recovery_report.redispatched == 30
    again.flush()
    assert raw_units(again, "TopicA", 1) == before
    assert again.put_message(msg(queue_id=1)).append_result.queue_offset == 10  # type: ignore[union-attr]
