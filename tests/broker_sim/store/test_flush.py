"""SYNC_FLUSH group commit and FLUSH_DISK_TIMEOUT; ASYNC_FLUSH leaves the put path alone."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from broker_sim.clock import ManualClock, SystemClock
from broker_sim.store import FlushDiskType, PutMessageResult, PutMessageStatus, codec
from tests.broker_sim.store.conftest import StoreFactory, msg
from tests.waiting import wait_until


def test_group_commit_shares_flushes(make_store: StoreFactory) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH, commit_log_file_size=1024 * 1024)
    gate = threading.Event()
    entered = threading.Event()

    def slow_first_flush() -> None:
        entered.set()
        gate.wait(10)  # hold the first flush until every producer has appended and is waiting

    store.group_commit.before_flush = slow_first_flush
    results: list[PutMessageResult] = []
    lock = threading.Lock()

    def producer(i: int) -> None:
        for j in range(5):
            r = store.put_message(msg(body=b"%d-%d" % (i, j), queue_id=i % 4))
            with lock:
                results.append(r)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    assert entered.wait(10)
    # the first round is stuck on the disk: every other producer appends and queues behind it
    wait_until(lambda: store.group_commit.waiting >= 16, what="16 puts waiting")
    assert store.group_commit.waiting == 16
    store.group_commit.before_flush = None
    gate.set()
    for t in threads:
        t.join(30)
    assert len(results) == 80 and all(r.status is PutMessageStatus.PUT_OK for r in results)
    assert store.group_commit.largest_group >= 8  # one flush served half the producers or more
    assert store.group_commit.flush_count < 80
    assert store.commit_log.mfq.flushed_offset == store.max_phy_offset


def test_flush_disk_timeout(make_store: StoreFactory, clock: ManualClock) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=5000)
    gate = threading.Event()

    def blocked_flush() -> None:
        gate.wait(10)

    store.group_commit.before_flush = blocked_flush
    out: list[PutMessageResult] = []
    t = threading.Thread(target=lambda: out.append(store.put_message(msg(body=b"late"))))
    t.start()
    # the put waits on the store's clock: move it past the timeout
    while t.is_alive() and not out:
        clock.advance(1)
        t.join(0.02)
    gate.set()
    t.join(10)
    (r,) = out
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and r.ok
    assert r.append_result is not None
    assert store.look_message_by_offset(r.append_result.wrote_offset).body == b"late"  # type: ignore[union-attr]


def test_async_put_does_not_wait_for_disk(make_store: StoreFactory) -> None:
    store = make_store()
    store.group_commit.before_flush = lambda: (_ for _ in ()).throw(AssertionError("no sync flush expected"))
    r = store.put_message(msg())
    assert r.status is PutMessageStatus.PUT_OK
    assert store.commit_log.mfq.flushed_offset == 0  # the manual clock has not reached the flush interval


@pytest.mark.parametrize("system_clock", [False, True], ids=["manual-clock", "system-clock"])
def test_group_commit_acknowledged_puts_survive_a_power_cut(
    make_store: StoreFactory, system_clock: bool
) -> None:
    """16 producers under SYNC_FLUSH; after a few hundred acknowledged puts the disk stops flushing (the
    power is going) while every producer has one more put appended and waiting; then the power cut. Every
    acknowledged put is back after recovery, byte for byte; the ones caught waiting were not acknowledged.
    On the system clock (with the extension built) puts take the compiled one-call put and flush gate."""
    clock = {"clock": SystemClock()} if system_clock else {}
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH, commit_log_file_size=64 * 1024, **clock)
    power_failing = threading.Event()

    def before_flush() -> None:
        if power_failing.is_set():
            raise OSError("power failing: the flush never completes")

    store.group_commit.before_flush = before_flush
    acked: list[tuple[int, int, bytes]] = []
    unacked: list[PutMessageResult] = []
    lock = threading.Lock()
    stop = threading.Event()

    def producer(i: int) -> None:
        j = 0
        while not stop.is_set():
            body = b"p%02d-%06d" % (i, j)
            r = store.put_message(msg(body=body, queue_id=i % 4))
            with lock:
                if r.status is PutMessageStatus.PUT_OK and r.append_result is not None:
                    acked.append((r.append_result.wrote_offset, r.append_result.wrote_bytes, body))
                else:
                    unacked.append(r)
                    return
            j += 1

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 300, what="300 acknowledged puts")
    power_failing.set()
    # every producer now has a put appended and waiting for a flush that fails
    wait_until(lambda: store.group_commit.waiting == 16, what="16 puts waiting")
    assert store.group_commit.largest_group > 1  # acknowledgements really came in groups
    store.crash()
    stop.set()
    for t in threads:
        t.join(30)
    assert len(unacked) == 16 and not any(r.ok and r.status is PutMessageStatus.PUT_OK for r in unacked)
    again = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH, commit_log_file_size=64 * 1024, **clock)
    assert again.recovery_report.abnormal
    for off, size, body in acked:
        ext = again.look_message_by_offset(off)
        assert ext is not None and ext.store_size == size and ext.body == body
    assert sum(again.get_max_offset_in_queue("TopicA", q) for q in range(4)) >= len(acked)


def test_flush_disk_timeout_on_the_system_clock(make_store: StoreFactory) -> None:
    """The compiled one-call put (system clock) reports a late flush as FLUSH_DISK_TIMEOUT, message stored."""
    store = make_store(
        flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout_ms=100, clock=SystemClock()
    )
    if codec.compiled is not None:
        assert store.put_message != store.put_path.put_general  # the compiled put is what runs
    gate = threading.Event()

    def hold_the_flush() -> None:
        gate.wait(10)

    store.group_commit.before_flush = hold_the_flush
    try:
        r = store.put_message(msg(body=b"late"))
    finally:
        gate.set()
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT and r.ok
    assert r.append_result is not None
    assert store.look_message_by_offset(r.append_result.wrote_offset).body == b"late"  # type: ignore[union-attr]
    assert store.group_commit.waiting == 0  # the late put withdrew


def test_async_flush_waits_for_four_dirty_pages_or_the_thorough_interval_as_rocketmq(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    """RocketMQ's FlushRealTimeService: every 500 ms, but only with 4 dirty 4 KiB pages; everything every
    10 s. A quiet broker's last puts are not on disk for up to 10 s — what a power cut takes."""
    store = make_store(commit_log_file_size=1024 * 1024)

    def flush_round() -> int:
        rounds = store.flusher.rounds
        clock.advance(ms=500)
        wait_until(lambda: store.flusher.rounds > rounds, what="a flusher round")
        return store.commit_log.mfq.flushed_offset

    def end_of(r: PutMessageResult) -> int:
        assert r.append_result is not None
        return r.append_result.wrote_offset + r.append_result.wrote_bytes

    first = end_of(store.put_message(msg(body=b"first")))
    assert flush_round() == first  # the first round is a thorough one (nothing flushed for 10 s)
    store.put_message(msg(body=b"q" * 100))
    assert [flush_round() for _ in range(2)] == [first, first]  # one dirty page: not yet
    big = end_of([store.put_message(msg(body=b"b" * 4000)) for _ in range(5)][-1])
    assert flush_round() == big  # 4 pages dirty: all of it flushed at once
    late = end_of(store.put_message(msg(body=b"late")))
    # rounds 5 to 20 (2.5 s to 10 s) leave it; round 21, 10 s after the first thorough flush, takes it
    assert [flush_round() for _ in range(17)] == [big] * 16 + [late]


def test_a_power_cut_takes_a_quiet_brokers_unflushed_puts(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(commit_log_file_size=1024 * 1024)
    r = store.put_message(msg(body=b"quiet"))
    assert r.status is PutMessageStatus.PUT_OK
    store.crash()
    again = make_store(commit_log_file_size=1024 * 1024)
    assert again.recovery_report.abnormal
    assert again.get_max_offset_in_queue("TopicA", 0) == 0  # acknowledged, never flushed: lost
