"""The compiled prefault worker (``populate_async`` / ``populate_idle``) against the Python ``populate``, and
when a store warms its segments by default."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_sim.clock import ManualClock
from broker_sim.store import FlushDiskType, MessageInner, MessageStore, PutMessageStatus, codec
from broker_sim.store.mapped_file import map_file
from tests.broker_sim.store.conftest import needs_c, small_config
from tests.waiting import wait_until

SIZE = 512 * 1024


def allocated(fd: int) -> int:
    """Bytes the file has on disk after a flush."""
    os.fdatasync(fd)
    return os.fstat(fd).st_blocks * 512


def python_populate(mm: object, start: int, length: int) -> bool:
    return codec.py_populate(mm, start, length)  # type: ignore[arg-type]


def compiled_populate(mm: object, start: int, length: int) -> bool:
    ok: bool = codec.compiled.populate_async(mm, start, length)
    return ok


@pytest.mark.parametrize(
    "populate", [python_populate, pytest.param(compiled_populate, marks=needs_c)], ids=["python", "worker"]
)
@pytest.mark.parametrize(("start", "length"), [(0, SIZE), (4097, 100_000), (SIZE - 10, 1_000)])
def test_worker_populates_like_python(
    tmp_path: Path, populate: Callable[[object, int, int], bool], start: int, length: int
) -> None:
    """Same bytes afterwards (populating changes nothing) and the same pages written out: the range rounded
    down to its page and cut at the end of the mapping."""
    mm, fd = map_file(tmp_path / "seg", SIZE)
    try:
        mm[200:6000] = bytes(range(256)) * 22 + bytes(168)
        os.fdatasync(fd)
        before, blocks = bytes(mm), os.fstat(fd).st_blocks * 512
        assert populate(mm, start, length)
        lo, hi = start - start % 4096, min(SIZE, start + length)
        expect = blocks + hi - lo - max(0, min(hi, 8192) - lo)  # pages 0 and 1 were written already
        wait_until(
            lambda: allocated(fd) >= expect, what=f"{expect} bytes allocated"
        )  # the worker runs on its own
        assert bytes(mm) == before
    finally:
        if codec.compiled is not None:
            codec.compiled.populate_idle()
        mm.close()
        os.close(fd)


@needs_c
def test_idle_drops_the_waiting_range_and_lets_the_segment_close(tmp_path: Path) -> None:
    mm, fd = map_file(tmp_path / "seg", 8 * 1024 * 1024)
    try:
        for _ in range(20):  # keep a range waiting behind a running one
            assert codec.compiled.populate_async(mm, 0, len(mm))
        codec.compiled.populate_idle()
    finally:
        mm.close()  # no buffer of the mapping is held by the worker
        os.close(fd)


@needs_c
def test_worker_races_writer_without_changing_bytes(tmp_path: Path) -> None:
    mm, fd = map_file(tmp_path / "seg", 4 * 1024 * 1024)
    try:
        chunk = bytes(range(256)) * 4
        for pos in range(0, len(mm), len(chunk)):
            if pos % (256 * 1024) == 0:
                assert codec.compiled.populate_async(mm, pos, 512 * 1024)
            mm[pos : pos + len(chunk)] = chunk
        codec.compiled.populate_idle()
        assert bytes(mm) == chunk * (len(mm) // len(chunk))
    finally:
        mm.close()
        os.close(fd)


@pytest.mark.parametrize("warm", [None, True])
@pytest.mark.parametrize("flush", [FlushDiskType.ASYNC_FLUSH, FlushDiskType.SYNC_FLUSH])
def test_async_stores_populate_with_the_worker_and_sync_stores_asked_to_warm_write_zeros_ahead(
    tmp_path: Path, flush: FlushDiskType, warm: bool | None
) -> None:
    """Populated pages are dirty, so a SYNC_FLUSH store would write them at its next flush: asked to warm, it
    writes the blocks ahead with zeros instead (zero_ahead.py), and by default it does neither; an
    ASYNC_FLUSH store populates, by default where the worker can."""
    config = small_config(commit_log_file_size=256 * 1024, flush_disk_type=flush, warm_mapped_file=warm)
    store = MessageStore(tmp_path, config)
    store.prefaulter.window = store.zero_ahead.window = 64 * 1024
    store.start()
    try:
        for i in range(600):  # ≈ 3 segments
            put = store.put_message(MessageInner("T", b"%06d" % i + bytes(400)))
            assert put.status is PutMessageStatus.PUT_OK
        sync = flush is FlushDiskType.SYNC_FLUSH
        populate = not sync and (warm is True or codec.compiled is not None)
        if populate and codec.compiled is None:  # the Python thread populates on its own time
            wait_until(lambda: store.prefaulter.rounds > 0, what="a prefault round")
        assert (store.prefaulter.rounds > 0) is populate
        assert (store.zero_ahead.rounds > 0) is (sync and warm is True)
        if populate and codec.compiled is not None:  # handed over on the append itself: nothing to wait for
            assert store.prefaulter.populated >= store.max_phy_offset
    finally:
        store.shutdown()


def test_python_thread_still_used_when_asked(tmp_path: Path) -> None:
    """warm_mapped_file=True without the compiled worker (or BROKER_SIM_PURE_PYTHON=1): the Python thread."""
    store = MessageStore(tmp_path, small_config(warm_mapped_file=True), ManualClock())
    store.start()
    try:
        assert store.put_message(MessageInner("T", b"x" * 100)).status is PutMessageStatus.PUT_OK
        wait_until(lambda: store.prefaulter.rounds >= 1, what="a prefault round")
    finally:
        store.shutdown()
