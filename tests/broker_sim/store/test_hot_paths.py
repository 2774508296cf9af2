"""The shortcuts of the hot paths give the same answers as the general code they bypass.

* dispatch from append hints (:mod:`broker_sim.store.dispatcher`) vs dispatch from the log bytes: same
  consume-queue files, index answers and listener requests — including properties that do not survive a
  decode unchanged, delayed and transactional records, and segment rolls;
* ``get_message`` without a filter vs the same call with an accept-all predicate, across segment rolls and
  byte caps (the loop's reordered removal/segment checks must not change statuses or next offsets);
* a header field out of int32 range is MESSAGE_ILLEGAL, not a struct error;
* the one-call put keeps ``last_append`` (what the flusher checkpoints) right whether or not it can refill
  the tuple in place;
* the one-call put hands a message with a DELAY property to the general path (the schedule rewrite), wherever
  DELAY sits among the properties.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from broker_sim.clock import SystemClock
from broker_sim.store import MessageInner, MessageStore, PutMessageStatus, codec
from broker_sim.store import commit_log as commit_log_module
from broker_sim.store.config import SCHEDULE_TOPIC
from broker_sim.store.message_record import decode_record
from broker_sim.store.results import DispatchRequest
from tests.broker_sim.store.conftest import StoreFactory, msg


def workload(seed: int) -> list[MessageInner]:
    rnd = random.Random(seed)
    out = []
    for i in range(160):
        props: dict[str, str] = {"UNIQ_KEY": f"U{i:06d}"}
        kind = rnd.randrange(6)
        if kind == 0:
            props["TAGS"] = rnd.choice(["TagA", "TagB", ""])
        elif kind == 1:
            props["TAGS"] = "odd\x02TAGS\x01x"  # separators inside a value: decode differs from the dict
        elif kind == 2:
            props["DELAY"] = str(rnd.randint(1, 3))
        elif kind == 3:
            props["KEYS"] = f"k{i % 7} shared"
        m = MessageInner(
            rnd.choice(["TopicA", "TopicB"]), bytes(rnd.randrange(1, 600)), queue_id=rnd.randrange(3),
            properties=props, born_host=("10.0.0.7", 5555), sys_flag=rnd.choice([0, 0, 0, 0x4, 0x8, 0xC]),
        )  # fmt: skip
        out.append(m)
    return out


def run(make_store: StoreFactory, path: Path, hints: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(commit_log_module, "MAX_HINTS", 200_000 if hints else 0)
    store = make_store(path, dispatch_async=False, commit_log_file_size=16 * 1024)
    seen: list[DispatchRequest] = []
    store.add_dispatch_listener(seen.append)
    for m in workload(7):
        assert store.put_message(m).status is PutMessageStatus.PUT_OK
    assert store.dispatch_behind_bytes() == 0
    queries = {k: [s.phys_offset for s in store.query_message(t, k, 50).messages]
               for t in ("TopicA", "TopicB") for k in ("k3", "shared", "U000010")}  # fmt: skip
    store.shutdown()
    segments = sorted(p for p in (path / "consumequeue").rglob("0*") if p.is_file())
    files = {p.relative_to(path).as_posix(): p.read_bytes() for p in segments}
    return {"cq": files, "listeners": seen, "queries": queries}


def test_hinted_dispatch_equals_dispatch_from_log(
    make_store: StoreFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hinted = run(make_store, tmp_path / "hinted", True, monkeypatch)
    from_log = run(make_store, tmp_path / "log", False, monkeypatch)
    assert len(hinted["cq"]) > 4 and hinted["cq"] == from_log["cq"]
    assert len(hinted["listeners"]) == 160 and hinted["listeners"] == from_log["listeners"]
    assert any(hinted["queries"].values()) and hinted["queries"] == from_log["queries"]
    # "TAGS\x01odd\x02TAGS\x01x\x02" on disk decodes to TAGS=x: listeners see what the bytes say
    assert any(r.properties.get("TAGS") == "x" for r in hinted["listeners"])


def test_hints_are_dropped_by_recovery_after_crash(make_store: StoreFactory) -> None:
    store = make_store()
    store.dispatcher.stop()  # appends leave hints nobody consumes
    for i in range(20):
        store.put_message(msg(body=b"x%d" % i, tags="T"))
    assert len(store.commit_log.dispatch_hints) == 20
    store.crash()  # nothing was flushed: every record is gone
    store.start()
    assert len(store.commit_log.dispatch_hints) == 0
    store.put_message(msg(body=b"after", tags="T"))
    assert store.wait_dispatched()
    got = store.get_message("g", "TopicA", 0, 0, 32)
    assert [m.ext.body for m in got.messages] == [b"after"]


@pytest.mark.parametrize("transfer_bytes", [300, 5000, 256 * 1024])
def test_unfiltered_get_equals_per_unit_loop(make_store: StoreFactory, transfer_bytes: int) -> None:
    store: MessageStore = make_store(dispatch_async=False, max_transfer_bytes=transfer_bytes)
    rnd = random.Random(transfer_bytes)
    for i in range(120):
        store.put_message(msg(body=bytes(rnd.randrange(1, 400)), queue_id=i % 2, tags="T"))
    for queue_id in (0, 1):
        for offset in range(0, 62):
            for n in (1, 5, 32):
                fast = store.get_message("g", "TopicA", queue_id, offset, n)
                loop = store.get_message("g", "TopicA", queue_id, offset, n, lambda _: True)
                assert (fast.status, fast.next_begin_offset, fast.min_offset, fast.max_offset) == (
                    loop.status, loop.next_begin_offset, loop.min_offset, loop.max_offset,
                )  # fmt: skip
                assert [(m.raw, m.phys_offset, m.queue_offset, m.tags_code) for m in fast.messages] == [
                    (m.raw, m.phys_offset, m.queue_offset, m.tags_code) for m in loop.messages
                ]


def test_header_field_out_of_range_is_illegal(make_store: StoreFactory) -> None:
    store = make_store()
    bad = MessageInner("TopicA", b"x", flag=2**31, born_host=("10.0.0.7", 5555))
    assert store.put_message(bad).status is PutMessageStatus.MESSAGE_ILLEGAL
    assert store.put_message(msg()).status is PutMessageStatus.PUT_OK


def test_last_append_follows_every_put(make_store: StoreFactory) -> None:
    """``commit_log.last_append`` = (end of the log, store time of the newest record) after each put, across
    segment rolls; a tuple someone else holds is never changed under them (the compiled put refills the
    tuple in place only while the log alone holds it)."""
    store = make_store(clock=SystemClock(), commit_log_file_size=4096)
    cl = store.commit_log
    if codec.compiled is not None:  # the one-call put is taken on the system clock
        assert getattr(store.put_message, "__self__", None) is cl
    for i in range(60):
        held = cl.last_append if i % 2 else None
        snapshot = list(held) if held is not None else None  # tuple(held) would be held itself
        r = store.put_message(msg(body=b"x" * (i * 7 % 300 + 1), queue_id=i % 3, tags="T"))
        a = r.append_result
        assert r.status is PutMessageStatus.PUT_OK and a is not None
        assert cl.last_append == (a.wrote_offset + a.wrote_bytes, a.store_timestamp)
        assert cl.last_append[0] == store.max_phy_offset
        if held is not None:
            assert list(held) == snapshot
    assert len(cl.mfq.files) > 2


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"KEYS": "k" * 300},  # DELAY after the entry that overflows the compiled encoder's properties buffer
        {"A": "b", "B": "c"},
    ],
)
def test_delayed_put_goes_to_the_schedule_topic(make_store: StoreFactory, extra: dict[str, str]) -> None:
    store = make_store(clock=SystemClock())
    delay_key = "".join(["DEL", "AY"])  # equal to "DELAY", another object
    for key in ("DELAY", delay_key):
        r = store.put_message(msg(body=b"later", queue_id=1, tags="T", **extra, **{key: "2"}))
        a = r.append_result
        assert r.status is PutMessageStatus.PUT_OK and a is not None
        raw = store.commit_log.record_at(a.wrote_offset, a.wrote_bytes)
        assert raw is not None
        ext = decode_record(raw)
        assert (ext.topic, ext.queue_id) == (SCHEDULE_TOPIC, 1)
        assert (ext.properties["REAL_TOPIC"], ext.properties["REAL_QID"]) == ("TopicA", "1")
