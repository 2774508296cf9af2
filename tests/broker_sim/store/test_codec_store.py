"""The compiled append path and its pure-Python twin at the store level: a whole workload leaves the same
files, the one-call put equals the general put, the fallback runs when the extension is absent or switched
off (and the extension is built where CI runs), and the prefaulter keeps what is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker_sim.clock import ManualClock
from broker_sim.store import (
    FlushDiskType,
    MessageInner,
    MessageStore,
    PutMessageResult,
    PutMessageStatus,
    codec,
)
from broker_sim.store.results import DispatchRequest
from tests.broker_sim.store.conftest import needs_c, small_config
from tests.broker_sim.store.test_hot_paths import workload
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]


def run_workload(tmp: Path, impl: str) -> dict[str, Any]:
    store = MessageStore(
        tmp, small_config(dispatch_async=False, commit_log_file_size=16 * 1024), ManualClock()
    )
    store.commit_log.__init__(  # type: ignore[misc]
        tmp / "commitlog", 16 * 1024, store.config.max_message_size, store.store_host, store.clock, impl
    )
    store.start()
    results = [store.put_message(m) for m in workload(11)]
    batch = store.put_messages(workload(12)[:5])
    store.shutdown()
    files = {p.relative_to(tmp).as_posix(): p.read_bytes() for p in sorted(tmp.rglob("0*")) if p.is_file()}
    return {"results": [*results, batch], "files": files}


@needs_c
def test_store_files_are_identical_with_either_twin(tmp_path: Path) -> None:
    """A workload with every kind of record (tags, separators inside values, delays, transactions, segment
    rolls, a batch) leaves byte-identical commit-log and consume-queue files and equal results."""
    c = run_workload(tmp_path / "c", "c")
    py = run_workload(tmp_path / "py", "python")
    assert len(c["files"]) > 8 and c["files"] == py["files"]
    assert c["results"] == py["results"]
    assert all(r.status is PutMessageStatus.PUT_OK for r in c["results"])


def repeats() -> list[MessageInner]:
    """Runs of equal properties, hosts, topics and queues with changes in between: what the compiled put keeps
    from one put for the next (the properties bytes, queue keys, the last parsed address) must not leak."""
    same_ip = "".join(["10.0.0.", "7"])  # equal to the first address, another object
    hosts = [("10.0.0.7", 5555), ("10.0.0.8", 5555), (same_ip, 6000)]
    kinds: list[dict[str, str]] = [
        {"TAGS": "TagA"}, {"TAGS": "TagA"}, {"TAGS": "TagC"}, {"KEYS": "k"}, {},
        {"KEYS": "k" * 300, "TAGS": "TagB"},  # past the encoder's 256-byte properties buffer
        {"TAGS": "a\x01b", "KEYS": "k"},  # a separator inside a value: tags unknown, the dispatcher decodes
    ]  # fmt: skip
    out = []
    for i in range(150):
        m = MessageInner(
            ["TopicA", "TopicB"][i // 7 % 2], bytes([i % 256]) * (i * 13 % 500 + 1), queue_id=i // 3 % 3,
            properties=dict(kinds[i % len(kinds)]), born_host=hosts[i // 5 % 3],
            store_host=None if i % 6 else ("10.1.1.1", 10911),
        )  # fmt: skip
        out.append(m)
    return out


@needs_c
@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
@pytest.mark.parametrize("kind", ["workload", "repeats"])
def test_one_call_put_equals_general_put(tmp_path: Path, flush: FlushDiskType, kind: str) -> None:
    """The compiled ``put_plain`` (taken for puts on the system clock; under SYNC_FLUSH it also waits on the
    compiled flush gate; it encodes straight into the mapped segment) stores what the general path stores;
    only STORETIMESTAMP (bytes 56..63, read from the clock) may differ."""
    msgs = workload(13) if kind == "workload" else repeats()
    cfg = small_config(commit_log_file_size=16 * 1024, flush_disk_type=flush)
    stores = [MessageStore(tmp_path / name, cfg) for name in "ab"]
    stores[1].put_message = stores[1].put_path.put_general
    assert stores[0].put_message != stores[0].put_path.put_general
    # the compiled put is a builtin method bound to the log (no functools.partial in between)
    assert getattr(stores[0].put_message, "__self__", None) is stores[0].commit_log
    out = []
    for store in stores:
        seen: list[DispatchRequest] = []
        store.add_dispatch_listener(seen.append)
        store.start()
        rs = [store.put_message(m) for m in msgs if "DELAY" not in m.properties]
        assert store.wait_dispatched()
        if flush is FlushDiskType.SYNC_FLUSH:  # acknowledged means on disk
            assert store.commit_log.mfq.flushed_offset == store.max_phy_offset
        log = b"".join(mf.mm[: mf.wrote] for mf in store.commit_log.mfq.files)
        units = [store.consume_queue_units(t, q, 0, 1000) for t in ("TopicA", "TopicB") for q in range(3)]
        heard = [(d.topic, d.queue_id, d.commit_log_offset, d.tags_code, d.properties) for d in seen]
        out.append((rs, log, units, heard))
        store.shutdown()
    (ra, la, ua, ha), (rb, lb, ub, hb) = out

    def where(results: list[PutMessageResult]) -> list[tuple[object, ...]]:
        return [
            (r.status, a.wrote_offset, a.wrote_bytes, a.queue_offset, a.store_host, a.msg_num)
            for r in results
            if (a := r.append_result)
        ]

    assert where(ra) == where(rb) and len(where(ra)) == len(ra)
    assert len(la) == len(lb) > 0 and ua == ub
    assert ha == hb and len(ha) == len(ra)
    pos = 0
    while pos < len(la):
        size = int.from_bytes(la[pos : pos + 4], "big")
        if la[pos + 4 : pos + 8] == bytes.fromhex("CBD43194"):
            assert la[pos : pos + 8] == lb[pos : pos + 8]
            pos += 16 * 1024 - pos % (16 * 1024)  # a segment's BLANK tail: on to the next segment
            continue
        assert (
            la[pos : pos + 56] + la[pos + 64 : pos + size] == lb[pos : pos + 56] + lb[pos + 64 : pos + size]
        )
        pos += size


def run_python(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


PROBE = """
import tempfile, sys
{prelude}
from broker_sim.store import codec, MessageStore, MessageInner, StoreConfig
with tempfile.TemporaryDirectory() as d:
    s = MessageStore(d, StoreConfig(index_hash_slots=64, index_max_entries=32))
    s.start()
    r = s.put_message(MessageInner("T", b"body", properties={{"TAGS": "a"}}))
    s.wait_dispatched()
    got = s.get_message("g", "T", 0, 0, 1)
    s.shutdown()
print(codec.IMPL, s.commit_log.impl, r.status.name, got.messages[0].ext.body.decode())
"""


@pytest.mark.parametrize(
    ("prelude", "env"),
    [
        ("", {"BROKER_SIM_PURE_PYTHON": "1"}),
        ("sys.modules['broker_sim.store._codec'] = None  # as if the build had failed", {}),
    ],
)
def test_fallback_is_used_without_the_extension(prelude: str, env: dict[str, str]) -> None:
    assert run_python(PROBE.format(prelude=prelude), **env) == "python python PUT_OK body"


def test_extension_is_built_where_ci_runs() -> None:
    """``pip install -e .`` (``make install``) builds the extension; in CI a missing one is a failure."""
    if codec.compiled is None:
        if os.environ.get("CI") == "true":
            pytest.fail("broker_sim.store._codec was not built by the install")
        pytest.skip("the compiled codec is not built here")
    assert run_python(PROBE.format(prelude="")) == "c c PUT_OK body"


@pytest.mark.parametrize("impl", ["c", "python"])
def test_prefault_keeps_what_is_written(tmp_path: Path, impl: str) -> None:
    """Populating pages the writer is using must not change a byte (the prefault thread races appends)."""
    if impl == "c" and codec.compiled is None:
        pytest.skip("the compiled codec is not built here")
    from broker_sim.store.mapped_file import map_file

    mm, fd = map_file(tmp_path / "seg", 64 * 1024)
    try:
        mm[100:5000] = bytes(range(256)) * 19 + bytes(36)
        before = bytes(mm)
        assert codec.implementation(impl).populate(mm, 0, 64 * 1024)  # this kernel has MADV_POPULATE_WRITE
        assert codec.implementation(impl).populate(mm, 4097, 100)  # unaligned start
        assert bytes(mm) == before
    finally:
        mm.close()
        os.close(fd)


def test_prefaulter_runs_ahead_of_appends(tmp_path: Path) -> None:
    store = MessageStore(
        tmp_path, small_config(commit_log_file_size=256 * 1024, warm_mapped_file=True), ManualClock()
    )
    store.prefaulter.window = 64 * 1024
    store.start()
    try:
        for i in range(600):  # ≈ 3 segments
            assert (
                store.put_message(MessageInner("T", b"%06d" % i + bytes(400))).status
                is PutMessageStatus.PUT_OK
            )
        wait_until(lambda: store.prefaulter.populated >= store.max_phy_offset, what="the log populated")
        assert store.prefaulter.rounds >= 1
    finally:
        store.shutdown()
    again = MessageStore(tmp_path, small_config(commit_log_file_size=256 * 1024), ManualClock())
    again.start()
    try:
        assert again.look_message_by_offset(0).body[:6] == b"000000"  # type: ignore[union-attr]
        assert sum(again.get_max_offset_in_queue("T", q) for q in range(1)) == 600
    finally:
        again.shutdown()
