"""Segments, roll-over with the BLANK marker, validation statuses, reads by physical offset."""

from __future__ import annotations

import struct
from pathlib import Path

from broker_sim.store import MessageStore, PutMessageStatus
from broker_sim.store.message_record import decode_record
from tests.broker_sim.store.conftest import StoreFactory, msg

BLANK_MAGIC = 0xCBD43194


def segments(store: MessageStore) -> list[Path]:
    return sorted((store.store_dir / "commitlog").iterdir())


def test_roll_over_with_records_straddling_the_end(make_store: StoreFactory) -> None:
    store = make_store()
    results = [store.put_message(msg(body=bytes([i]) * (300 + 37 * i), queue_id=0)) for i in range(40)]
    assert all(r.status is PutMessageStatus.PUT_OK for r in results)
    files = segments(store)
    assert len(files) >= 5
    assert [f.name for f in files] == [f"{i * 8192:020d}" for i in range(len(files))]
    assert all(f.stat().st_size == 8192 for f in files)
    # every full segment ends with "int32 remaining + BLANK magic" right after its last record
    by_file: dict[int, list[tuple[int, int]]] = {}
    for r in results:
        a = r.append_result
        assert a is not None
        assert a.wrote_offset // 8192 == (a.wrote_offset + a.wrote_bytes - 1) // 8192, (
            "record split across files"
        )
        by_file.setdefault(a.wrote_offset // 8192, []).append((a.wrote_offset, a.wrote_bytes))
    for idx, f in enumerate(files[:-1]):
        data = f.read_bytes()
        last_off, last_size = by_file[idx][-1]
        end = last_off + last_size - idx * 8192
        remaining, magic = struct.unpack_from(">iI", data, end)
        assert magic == BLANK_MAGIC and remaining == 8192 - end
        next_first_size = by_file[idx + 1][0][1]
        assert 8192 - end < next_first_size + 8  # the roll happened because the next record did not fit
    # each record reads back by physical offset, queue offsets are consecutive
    for i, r in enumerate(results):
        a = r.append_result
        assert a is not None
        ext = store.look_message_by_offset(a.wrote_offset)
        assert ext is not None and ext.body == bytes([i]) * (300 + 37 * i) and ext.queue_offset == i
        raw = store.select_one_message_by_offset(a.wrote_offset)
        assert raw is not None and len(raw) == a.wrote_bytes
        assert a.msg_id == f"7F00000100002A9F{a.wrote_offset:016X}"


def test_restart_continues_after_the_last_record(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store()
    for i in range(30):
        store.put_message(msg(body=b"z" * 400, queue_id=i % 3))
    end = store.max_phy_offset
    store.shutdown()
    again = make_store()
    assert again.recovery_report.abnormal is False
    assert again.max_phy_offset == end
    r = again.put_message(msg(body=b"next", queue_id=1))
    assert r.append_result is not None
    assert r.append_result.wrote_offset >= end - 8192  # in the last segment or the next one
    assert r.append_result.queue_offset == 10


def test_validation_statuses(make_store: StoreFactory) -> None:
    store = make_store(max_message_size=1000)
    assert store.put_message(msg(topic="bad topic")).status is PutMessageStatus.MESSAGE_ILLEGAL
    assert store.put_message(msg(topic="x" * 128)).status is PutMessageStatus.MESSAGE_ILLEGAL
    assert store.put_message(msg(body=b"x" * 1001)).status is PutMessageStatus.MESSAGE_ILLEGAL
    big = msg(P="v" * 40000)
    assert store.put_message(big).status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.put_message(msg(queue_id=-1)).status is PutMessageStatus.MESSAGE_ILLEGAL
    r = store.put_message(msg(body=b"x" * 1000))
    assert r.status is PutMessageStatus.PUT_OK and r.remark == ""
    assert store.max_phy_offset == r.append_result.wrote_bytes  # type: ignore[union-attr]
    store.shutdown()
    assert store.put_message(msg()).status is PutMessageStatus.SERVICE_NOT_AVAILABLE


def test_default_max_message_size_is_4_mib(make_store: StoreFactory) -> None:
    store = make_store(commit_log_file_size=16 * 1024 * 1024)
    ok = store.put_message(msg(body=b"x" * (4 * 1024 * 1024)))
    assert ok.status is PutMessageStatus.PUT_OK
    assert (
        store.put_message(msg(body=b"x" * (4 * 1024 * 1024 + 1))).status is PutMessageStatus.MESSAGE_ILLEGAL
    )


def test_batch_is_contiguous(make_store: StoreFactory) -> None:
    store = make_store()
    r = store.put_messages([msg(body=b"a"), msg(body=b"bb"), msg(body=b"ccc")])
    a = r.append_result
    assert r.status is PutMessageStatus.PUT_OK and a is not None
    assert a.msg_num == 3 and a.queue_offset == 0 and len(a.msg_ids) == 3
    bodies = [decode_record(store.select_one_message_by_offset(o) or b"").body for o in a.offsets]
    assert bodies == [b"a", b"bb", b"ccc"]
    assert a.offsets[1] == a.offsets[0] + len(store.select_one_message_by_offset(a.offsets[0]) or b"")
    bad = store.put_messages([msg(), msg(topic="no spaces")])
    assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL
    assert store.get_max_offset_in_queue("TopicA", 0) == 0 or store.wait_dispatched()
    assert store.wait_dispatched() and store.get_max_offset_in_queue("TopicA", 0) == 3
