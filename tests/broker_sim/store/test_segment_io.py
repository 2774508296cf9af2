"""What a commit-log segment costs the disk: a flush writes what was appended since the last one, however
deep into the segment; under SYNC_FLUSH the blocks a flush lands on are already written; a restart does not
rewrite the segment's empty tail; the bytes after a recovered end read as zeros; a segment the writer has
left is read back with the kernel's readahead.

``write_bytes`` of ``/proc/self/io`` is what this process sent, or made dirty, for the disk: the page cache
accounts a whole folio each time a clean one is dirtied, so large folios around the write position show up
there exactly as they cost the disk (see broker_sim/store/mapped_file.py). Linux only, like the store.
"""

from __future__ import annotations

import mmap
import os
import resource
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_sim.store import FlushDiskType, MessageStore, PutMessageStatus
from broker_sim.store import mapped_file as mapped_file_module
from broker_sim.store.mapped_file import next_data
from tests.broker_sim.store.conftest import StoreFactory, msg

MiB = 1024 * 1024
PAGE = mmap.PAGESIZE
BODY = bytes(range(256)) * 4  # 1 KiB

pytestmark = pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")


def written() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


def roomy(**overrides: object) -> dict[str, object]:
    """Queue and index files large enough not to roll every few messages (the fixtures' are tiny)."""
    base: dict[str, object] = {
        "consume_queue_units": 300_000,
        "index_hash_slots": 4096,
        "index_max_entries": 100_000,
        "warm_mapped_file": False,  # populated pages ahead would be dirty: keep the count to the appends
    }
    base.update(overrides)
    return base


def fill(store: MessageStore, mib: int) -> None:
    batch = [msg(body=BODY, queue_id=0) for _ in range(64)]
    for _ in range(mib * 16):  # 64 KiB of bodies per batch
        assert store.put_messages(batch).status is PutMessageStatus.PUT_OK
    store.flush()


def commit_log_segments(store: MessageStore) -> list[Path]:
    return sorted((store.store_dir / "commitlog").iterdir())


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def bytes_on_disk(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def no_data_from(path: Path, offset: int) -> bool:
    """Whether the file holds only holes from ``offset`` on (no block allocated)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return next_data(fd, offset) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("restart_as", [None, FlushDiskType.SYNC_FLUSH])
def test_a_flush_deep_into_a_segment_writes_what_was_appended(
    make_store: StoreFactory, tmp_path: Path, restart_as: FlushDiskType | None
) -> None:
    """40 MiB into a 64 MiB segment, each one-message append + flush costs the disk a few pages, not the
    megabytes of a large folio around it; also when the store was restarted cold half-way (recovery read the
    segment from disk) and then runs SYNC_FLUSH, each put flushed on its own."""
    store = make_store(commit_log_file_size=64 * MiB, **roomy())
    fill(store, 24)
    if restart_as is not None:
        store.shutdown()
        for seg in commit_log_segments(store):  # as after a reboot: recovery reads the segment from disk
            evict(seg)
        store = make_store(commit_log_file_size=64 * MiB, **roomy(flush_disk_type=restart_as))
    fill(store, 16)
    rounds, before = 16, written()
    for i in range(rounds):
        assert store.put_message(msg(body=BODY + b"%d" % i)).status is PutMessageStatus.PUT_OK
        store.flush()
    per_round = (written() - before) / rounds
    # about 13 KiB: the commit log's page, a queue page, the index's slot and entry pages, the checkpoint
    assert per_round <= 32 * 1024, f"{per_round / 1024:.0f} KiB written per 1 KiB message"


def test_a_clean_restart_with_the_default_segment_size_does_not_write_its_empty_tail(
    make_store: StoreFactory,
) -> None:
    """The default 1 GiB segment holding a few messages: a restart writes next to nothing and the file stays
    sparse (before, recovery wrote zeros over the whole tail at every start: 1 GiB each time)."""
    store = make_store(commit_log_file_size=1024 * MiB, **roomy())
    for i in range(100):
        store.put_message(msg(body=BODY, KEYS=f"k{i}"))
    end = store.max_phy_offset
    store.shutdown()
    before = written()
    again = make_store(commit_log_file_size=1024 * MiB, **roomy())
    assert written() - before < MiB
    (seg,) = commit_log_segments(again)
    assert bytes_on_disk(seg) < 4 * MiB
    assert no_data_from(seg, -(-end // PAGE) * PAGE)
    assert again.max_phy_offset == end
    r = again.put_message(msg(body=b"after"))
    assert r.append_result is not None and r.append_result.wrote_offset == end


@pytest.mark.parametrize("punch", [True, False], ids=["hole punched", "file system that cannot punch"])
def test_bytes_after_a_recovered_end_read_as_zeros_and_stay_unallocated(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch, punch: bool
) -> None:
    """Garbage after the last whole record (a torn write, and stray bytes far down the segment) is cut: it
    reads back as zeros, a second crash cannot mistake it for records, and the cut allocates nothing where
    the file was a hole — also where the file system cannot punch holes and the cut overwrites instead."""
    if not punch:
        monkeypatch.setattr(mapped_file_module, "punch_hole", lambda fd, offset, length: False)
    size = 64 * MiB
    store = make_store(commit_log_file_size=size, **roomy())
    for i in range(20):
        store.put_message(msg(body=BODY, KEYS=f"k{i}"))
    end = store.max_phy_offset
    store.shutdown()
    (seg,) = commit_log_segments(store)
    stray = [end + 100, end + 3 * PAGE + 5, 40 * MiB + 7, size - 10]
    fd = os.open(seg, os.O_WRONLY)
    try:
        for off in stray:
            os.pwrite(fd, b"\xab" * 8, off)
        os.fsync(fd)
    finally:
        os.close(fd)
    (store.store_dir / "abort").touch()
    again = make_store(commit_log_file_size=size, **roomy())
    assert again.max_phy_offset == end and again.recovery_report.truncated_bytes > 0
    with open(seg, "rb") as f:
        for off in stray:
            f.seek(off)
            assert f.read(8) == bytes(8), f"stray bytes at {off} survived the cut"
    assert bytes_on_disk(seg) < MiB  # the 40 MiB and 64 MiB strays' blocks were holes before the garbage
    if punch:
        assert no_data_from(seg, -(-end // PAGE) * PAGE)
    assert again.put_message(msg(body=b"after")).status is PutMessageStatus.PUT_OK


def test_a_segment_the_writer_has_left_is_read_with_readahead(make_store: StoreFactory) -> None:
    """A consumer catching up on an older segment that is no longer cached: the kernel reads it ahead in
    large pieces, not one 4 KiB page per fault as it does (by our advice) where the writer appends."""
    size = 4 * MiB
    store = make_store(commit_log_file_size=size, **roomy())
    offsets = []
    for _ in range(size // 1024 + 512):  # a little more than one segment: the writer moves to the second
        r = store.put_message(msg(body=BODY))
        assert r.append_result is not None
        offsets.append(r.append_result.wrote_offset)
    store.flush()
    first = store.commit_log.mfq.files[0]
    assert store.commit_log.mfq.files[-1] is not first
    first.mm.madvise(mmap.MADV_DONTNEED)  # unmap it here and drop it from the page cache: a cold segment
    os.posix_fadvise(first.fd, 0, size, os.POSIX_FADV_DONTNEED)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
    for off in offsets:
        if off < size:
            assert store.select_one_message_by_offset(off) is not None
    reads = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - faults
    assert reads < size // PAGE // 8, f"{reads} disk reads for a {size // MiB} MiB segment"


def test_under_sync_flush_the_blocks_ahead_of_the_writer_are_already_written(
    make_store: StoreFactory,
) -> None:
    """A SYNC_FLUSH store asked to warm its segments writes zeros ahead of its write position (zero_ahead.py),
    so a group-commit flush allocates no blocks: at every put, the file holds data from the writer's page to
    half a window ahead, across segment rolls, and stays a hole beyond what was written ahead."""
    window = 128 * 1024
    sync = roomy(flush_disk_type=FlushDiskType.SYNC_FLUSH, warm_mapped_file=True)
    store = make_store(start=False, commit_log_file_size=512 * 1024, **sync)
    store.zero_ahead.window = window
    store.start()
    for i in range(1200):  # ≈ 1.6 segments
        assert store.put_message(msg(body=BODY[: 100 + i % 900])).status is PutMessageStatus.PUT_OK
        if i % 37:
            continue
        mf = store.commit_log.mfq.files[-1]
        page_end = -(-mf.wrote // PAGE) * PAGE
        want = min(mf.file_size, mf.wrote + window // 2)
        if page_end < want:
            assert os.lseek(mf.fd, page_end, os.SEEK_HOLE) >= want, f"put {i}: a hole right after the writer"
        ahead = store.zero_ahead.zeroed - mf.file_from_offset
        if ahead < mf.file_size:
            assert next_data(mf.fd, ahead) is None, f"put {i}: blocks allocated past the window"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(1, 24_000), min_size=1, max_size=60),
    batch_every=st.integers(2, 9),
)
def test_writing_zeros_ahead_never_touches_a_written_byte(
    make_store: StoreFactory, tmp_path: Path, sizes: list[int], batch_every: int
) -> None:
    """Whatever the record sizes, single puts and batches, rounds falling mid-page and segments rolling:
    every acknowledged record reads back as written, also after a restart."""
    store = make_store(
        path=tmp_path / uuid.uuid4().hex,
        start=False,
        commit_log_file_size=128 * 1024,
        **roomy(flush_disk_type=FlushDiskType.SYNC_FLUSH, warm_mapped_file=True),
    )
    store.zero_ahead.window = 3 * PAGE
    store.start()
    written: dict[int, bytes] = {}
    for n, size in enumerate(sizes):
        bodies = [bytes([n % 251 + 1]) * size]
        if n % batch_every == 0:
            bodies.append(bytes([n % 13 + 1]) * (size // 3 + 1))
        r = store.put_messages([msg(body=b) for b in bodies])
        assert r.status is PutMessageStatus.PUT_OK and r.append_result is not None
        written.update(zip(r.append_result.offsets, bodies, strict=True))
    assert store.zero_ahead.rounds > 0
    for reopened in (False, True):
        for off, body in written.items():
            got = store.look_message_by_offset(off)
            assert got is not None and got.body == body, f"record at {off} (after restart: {reopened})"
        store.shutdown()
        store = make_store(path=store.store_dir, commit_log_file_size=128 * 1024, **roomy())


def test_a_flush_of_a_segment_that_expiry_destroyed_is_a_no_op(tmp_path: Path) -> None:
    """The periodic flush walks the files while expiry destroys the oldest: a flush that reaches a destroyed
    segment has nothing to keep (it raised on the closed descriptor; the flush service logged an error)."""
    segment = mapped_file_module.MappedFile(tmp_path / f"{0:020d}", 64 * 1024)
    segment.mm[0:5] = b"hello"
    segment.wrote = 5
    segment.destroy()
    assert segment.flush() == 0
    segment.flush_range(0, 5)
    assert not segment.path.exists()
