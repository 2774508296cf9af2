"""SYNC_FLUSH group commit and FLUSH_DISK_TIMEOUT; ASYNC_FLUSH leaves the put path alone."""

from __future__ import annotations

import threading

from broker_sim.clock import ManualClock
from broker_sim.store import FlushDiskType, PutMessageResult, PutMessageStatus
from tests.broker_sim.store.conftest import StoreFactory, msg


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
    tick = threading.Event()
    for _ in range(1000):
        if store.group_commit.waiting >= 16:
            break
        tick.wait(0.01)
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
