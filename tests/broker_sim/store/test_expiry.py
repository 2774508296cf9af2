"""Expiry by age at the delete hour, by age at 75 %, forcibly at 85 %, writes rejected at 90 %."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from broker_sim.clock import ManualClock
from broker_sim.store import MessageStore, PutMessageStatus
from broker_sim.store.expiry import default_disk_usage
from tests.broker_sim.store.conftest import StoreFactory, msg

HOUR = 3600.0


def at_hour(hour: int) -> ManualClock:
    return ManualClock(int(dt.datetime(2026, 1, 5, hour, 30, tzinfo=dt.UTC).timestamp() * 1000))


def filled(make_store: StoreFactory, usage: list[float], n: int = 60) -> MessageStore:
    # the background pass would race the test's own run_expiry() once the clock jumps: push it out of reach
    store = make_store(disk_usage=lambda: usage[0], consume_queue_units=8, clean_resource_interval_ms=10**13)
    for i in range(n):
        store.put_message(msg(body=b"%d" % i + bytes(500), KEYS=f"k{i}"))
    store.dispatch_pending()
    return store


def segment_count(store: MessageStore) -> int:
    return len(list((store.store_dir / "commitlog").iterdir()))


def test_nothing_deleted_when_young_or_wrong_hour(make_store: StoreFactory, clock: ManualClock) -> None:
    clock.set(at_hour(10).now_ms())
    usage = [0.10]
    store = filled(make_store, usage)
    n = segment_count(store)
    clock.advance(100 * HOUR)  # old, but 14:30 is not the delete hour and the disk is fine
    clock.set(at_hour(14).now_ms() + 4 * 86_400_000)
    assert store.run_expiry().deleted_commit_log_files == []
    assert segment_count(store) == n


def test_age_rule_at_delete_hour(make_store: StoreFactory, clock: ManualClock) -> None:
    clock.set(at_hour(3).now_ms())
    usage = [0.10]
    store = filled(make_store, usage)
    n = segment_count(store)
    clock.set(at_hour(4).now_ms() + 86_400_000)  # next day 04:30: 25 h old, reserved 72 h
    assert store.run_expiry().deleted_commit_log_files == []
    clock.set(at_hour(4).now_ms() + 3 * 86_400_000)  # 73 h old
    rep = store.run_expiry()
    assert len(rep.deleted_commit_log_files) == n - 1  # the segment being written stays
    assert segment_count(store) == 1
    assert rep.min_phy_offset == store.min_phy_offset > 0
    assert rep.deleted_consume_queue_files > 0
    got = store.get_message("g", "TopicA", 0, 0, 32)
    assert (
        got.min_offset > 0
        and got.status.name == "OFFSET_TOO_SMALL"
        and got.next_begin_offset == got.min_offset
    )
    assert store.get_message("g", "TopicA", 0, got.min_offset, 32).status.name == "FOUND"
    assert store.query_message("TopicA", "k0").messages == []
    assert store.query_message("TopicA", "k59").messages


def test_age_rule_any_hour_above_75_percent(make_store: StoreFactory, clock: ManualClock) -> None:
    clock.set(at_hour(12).now_ms())
    usage = [0.80]
    store = filled(make_store, usage)
    assert store.run_expiry().deleted_commit_log_files == []  # full-ish, but nothing is 72 h old
    clock.advance(73 * HOUR)
    rep = store.run_expiry()
    assert rep.deleted_commit_log_files and not rep.clean_immediately and not rep.disk_full


def test_forcible_clean_above_85_percent(make_store: StoreFactory, clock: ManualClock) -> None:
    clock.set(at_hour(12).now_ms())
    usage = [0.86]
    store = filled(make_store, usage, n=200)
    n = segment_count(store)
    assert n > 11
    rep = store.run_expiry()  # young files, wrong hour: deleted anyway, oldest first, 10 per pass
    assert rep.clean_immediately and not rep.disk_full
    assert rep.deleted_commit_log_files == sorted(rep.deleted_commit_log_files)
    assert len(rep.deleted_commit_log_files) == 10 and segment_count(store) == n - 10
    assert store.put_message(msg()).status is PutMessageStatus.PUT_OK


def test_writes_rejected_above_90_percent(make_store: StoreFactory, clock: ManualClock) -> None:
    clock.set(at_hour(12).now_ms())
    usage = [0.95]
    store = filled(make_store, usage, n=10)
    rep = store.run_expiry()
    assert rep.disk_full and store.is_disk_full
    r = store.put_message(msg())
    assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and "disk full" in r.remark
    assert store.get_message("g", "TopicA", 0, 0, 32).messages  # reads still work
    usage[0] = 0.50
    store.run_expiry()
    assert store.put_message(msg()).status is PutMessageStatus.PUT_OK


def test_queue_rebuilt_after_head_expired_starts_mid_file(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    import shutil

    clock.set(at_hour(12).now_ms())
    usage = [0.86]
    store = filled(make_store, usage, n=100)
    store.run_expiry()
    first = store.look_message_by_offset(store.min_phy_offset)
    assert first is not None and first.queue_offset % 8 != 0, "pick n so the first survivor is mid-file"
    store.shutdown()
    shutil.rmtree(store.store_dir / "consumequeue")
    for _ in range(2):  # rebuilt from the log, then loaded from its files on a clean restart
        again = make_store(disk_usage=lambda: 0.1, consume_queue_units=8)
        assert again.get_min_offset_in_queue("TopicA", 0) == first.queue_offset
        assert again.get_max_offset_in_queue("TopicA", 0) == 100
        got = again.get_message("g", "TopicA", 0, first.queue_offset, 32)
        assert got.status.name == "FOUND" and got.messages[0].ext.body == first.body
        again.shutdown()


def test_default_disk_usage_measures_the_store_disk(tmp_path: Path) -> None:
    ratio = default_disk_usage(tmp_path)()
    assert 0.0 < ratio < 1.0
