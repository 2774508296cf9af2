"""Index files parsed from raw bytes, key queries newest first within a time range, rolling when full."""

from __future__ import annotations

import struct
from pathlib import Path

from broker_sim.clock import ManualClock
from broker_sim.store import FlushDiskType, MessageStore
from broker_sim.store.message_record import java_string_hash
from tests.broker_sim.store.conftest import StoreFactory, msg

SLOTS, ENTRIES = 64, 32


def parse_index(path: Path) -> tuple[tuple[int, ...], list[int], dict[int, tuple[int, int, int, int]]]:
    data = path.read_bytes()
    assert len(data) == 40 + SLOTS * 4 + ENTRIES * 20
    header = struct.unpack_from(">qqqqii", data, 0)
    slots = list(struct.unpack_from(f">{SLOTS}i", data, 40))
    entries = {n: struct.unpack_from(">iqii", data, 40 + SLOTS * 4 + n * 20) for n in range(1, header[5])}
    return header, slots, entries


def key_hash(key: str) -> int:
    h = abs(java_string_hash(key))
    return 0 if h > 2**31 - 1 else h


def index_files(store: MessageStore) -> list[Path]:
    return sorted((store.store_dir / "index").iterdir())


def test_index_layout(make_store: StoreFactory, clock: ManualClock) -> None:
    store = make_store()
    t0 = clock.now_ms()
    offsets = []
    for i in range(5):
        r = store.put_message(msg(body=b"%d" % i, KEYS=f"order-{i} shared", UNIQ_KEY=f"U{i}"))
        offsets.append(r.append_result.wrote_offset)  # type: ignore[union-attr]
        clock.advance(2)
    store.dispatch_pending()
    store.flush()
    (path,) = index_files(store)
    assert len(path.name) == 17 and path.name.isdigit()
    header, slots, entries = parse_index(path)
    begin_ts, end_ts, begin_phy, end_phy, used_slots, count = header
    assert (begin_ts, end_ts, begin_phy, end_phy, count) == (t0, t0 + 8000, offsets[0], offsets[-1], 16)
    assert used_slots == len({s for s in slots if s})
    # walk the chain of "TopicA#shared" from its slot: newest first, 2 s apart
    h = key_hash("TopicA#shared")
    n = slots[h % SLOTS]
    chain = []
    while n:
        kh, phy, diff, prev = entries[n]
        if kh == h:
            chain.append((phy, diff))
        n = prev
    assert chain == [(offsets[i], 2 * i) for i in reversed(range(5))]
    # entry order per record: UNIQ_KEY first, then each KEYS token
    assert [entries[n][0] for n in (1, 2, 3)] == [key_hash("TopicA#U0"), key_hash("TopicA#order-0"),
                                                   key_hash("TopicA#shared")]  # fmt: skip


def test_query_by_key_newest_first_within_time_range(make_store: StoreFactory, clock: ManualClock) -> None:
    store = make_store(index_max_entries=1000)
    t0 = clock.now_ms()
    for i in range(10):
        store.put_message(msg(body=b"%d" % i, KEYS="k"))
        store.put_message(msg(topic="Other", body=b"o%d" % i, KEYS="k"))
        clock.advance(10)
    store.dispatch_pending()
    found = store.query_message("TopicA", "k", 100)
    assert [m.ext.body for m in found.messages] == [b"%d" % i for i in reversed(range(10))]
    assert store.query_message("TopicA", "k", 3).messages[0].ext.body == b"9"
    assert len(store.query_message("TopicA", "k", 3).messages) == 3
    window = store.query_message("TopicA", "k", 100, t0 + 20_000, t0 + 50_000)
    assert [m.ext.body for m in window.messages] == [b"5", b"4", b"3", b"2"]
    assert store.query_message("TopicA", "nope", 10).messages == []
    assert found.index_last_update_timestamp == t0 + 90_000


def test_roll_when_full(make_store: StoreFactory, clock: ManualClock) -> None:
    store = make_store()
    for i in range(40):  # two keys each → 80 entries, 31 per file
        store.put_message(msg(body=b"%d" % i, KEYS=f"key{i}", UNIQ_KEY=f"u{i}"))
        clock.advance(0.001)
    store.dispatch_pending()
    store.flush()
    files = index_files(store)
    assert len(files) == 3
    counts = [parse_index(f)[0][5] for f in files]
    assert counts[:2] == [ENTRIES, ENTRIES]
    assert sum(c - 1 for c in counts) == 80
    for i in (0, 17, 39):
        (m,) = store.query_message("TopicA", f"key{i}", 5).messages
        assert m.ext.body == b"%d" % i
        assert store.query_message("TopicA", f"u{i}", 5).messages[0].ext.body == b"%d" % i


def test_index_rebuilt_after_crash(make_store: StoreFactory) -> None:
    store = make_store(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    for i in range(20):
        store.put_message(msg(body=b"%d" % i, KEYS=f"key{i}"))
    store.crash()
    again = make_store()
    assert again.recovery_report.abnormal
    for i in range(20):
        assert [m.ext.body for m in again.query_message("TopicA", f"key{i}").messages] == [b"%d" % i]
