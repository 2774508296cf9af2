"""A hypothesis-driven check of the whole store against a model: random puts (sizes straddling segment
ends), clean restarts and crashes under SYNC_FLUSH; afterwards every queue reads back exactly the model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_sim.clock import ManualClock
from broker_sim.store import FlushDiskType, GetMessageStatus, MessageStore
from tests.broker_sim.store.conftest import msg, small_config

ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 2), st.integers(0, 1500)),
        st.tuples(st.just("restart"), st.just(0), st.just(0)),
        st.tuples(st.just("crash"), st.just(0), st.just(0)),
    ),
    max_size=40,
)


def read_queue(store: MessageStore, queue_id: int) -> list[bytes]:
    out: list[bytes] = []
    offset = store.get_min_offset_in_queue("Model", queue_id)
    while True:
        got = store.get_message("g", "Model", queue_id, offset, 32)
        if got.status is not GetMessageStatus.FOUND:
            return out
        out.extend(m.ext.body for m in got.messages)
        offset = got.next_begin_offset


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_store_matches_model(operations: list[tuple[str, int, int]]) -> None:
    clock = ManualClock()
    cfg = small_config(flush_disk_type=FlushDiskType.SYNC_FLUSH, consume_queue_units=8)
    model: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        store = MessageStore(Path(tmp), cfg, clock)
        store.start()
        try:
            for n, (op, queue_id, size) in enumerate(operations):
                if op == "put":
                    body = b"%d:" % n + bytes([n % 256]) * size
                    r = store.put_message(msg(topic="Model", body=body, queue_id=queue_id, KEYS=f"k{n}"))
                    assert r.ok and r.append_result is not None
                    assert r.append_result.queue_offset == len(model[queue_id])
                    model[queue_id].append(body)
                else:
                    store.shutdown() if op == "restart" else store.crash()
                    store = MessageStore(Path(tmp), cfg, clock)
                    assert store.start().abnormal == (op == "crash")
            store.dispatch_pending()
            for q, bodies in model.items():
                assert store.get_max_offset_in_queue("Model", q) == len(bodies)
                assert read_queue(store, q) == bodies
            for n, (op, _, _) in enumerate(operations):
                if op == "put":
                    (found,) = store.query_message("Model", f"k{n}").messages
                    assert found.ext.body.startswith(b"%d:" % n)
        finally:
            store.shutdown()
