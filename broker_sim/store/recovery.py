"""Finding where the commit log really ends, and making queues and index agree with it.

* Clean start (no ``abort`` file): scan the last ``normal_recover_segments`` segments.
* Unclean start: scan from the newest segment whose first record is not newer than the checkpoint's
  smallest timestamp (everything after it may be torn or missing from queues/index).

Every record is verified (magic, TOTALSIZE, field lengths, PHYSICALOFFSET, body CRC). The scan stops at the
first record that fails, at zeros (never written), or at the end of the last segment. If valid records can
still be found *after* a failing one, it is a corrupt middle record: recovery raises
:class:`CorruptRecordError` (or, with ``truncate_corrupt_middle``, cuts there and reports it) instead of
silently dropping acknowledged data. Otherwise it is a torn tail: it is cut and reported.
"""

from __future__ import annotations

import logging

from broker_sim.store.commit_log import CommitLog
from broker_sim.store.errors import CorruptRecordError
from broker_sim.store.mapped_file import MappedFile
from broker_sim.store.message_record import BLANK, BLANK_MAGIC, HEADER, MESSAGE_MAGIC, verify_record
from broker_sim.store.results import RecoveryReport

log = logging.getLogger(__name__)
_TAIL_PROBE = 8 * 1024 * 1024  # how far past the cut we look for non-zero bytes to report


def _first_store_ts(mf: MappedFile) -> int | None:
    fields = HEADER.unpack_from(mf.mm, 0)
    if fields[1] != MESSAGE_MAGIC:
        return None
    return int(fields[10])


def choose_start(
    files: list[MappedFile], abnormal: bool, checkpoint_min_ts: int, normal_segments: int
) -> int:
    """Index of the first segment to scan."""
    if not files:
        return 0
    if not abnormal:
        return max(0, len(files) - normal_segments)
    if checkpoint_min_ts <= 0:
        return 0
    for i in range(len(files) - 1, -1, -1):
        ts = _first_store_ts(files[i])
        if ts is not None and ts <= checkpoint_min_ts:
            return i
    return 0


def _valid_after(files: list[MappedFile], seg: int, pos: int) -> int:
    """Bytes of sound records that can be found after a failing record at ``files[seg]`` offset ``pos``:
    the record following it by its declared size, or the first record of any later segment."""
    mf = files[seg]
    size, magic = BLANK.unpack_from(mf.mm, pos)
    if magic == MESSAGE_MAGIC and size >= 91 and pos + size + 91 <= mf.file_size:
        nxt = pos + size
        if verify_record(mf.mm, nxt, mf.file_size, mf.file_from_offset + nxt) is None:
            return int(BLANK.unpack_from(mf.mm, nxt)[0])
    for later in files[seg + 1 :]:
        if verify_record(later.mm, 0, later.file_size, later.file_from_offset) is None:
            return int(BLANK.unpack_from(later.mm, 0)[0])
    return 0


def scan_commit_log(cl: CommitLog, start: int, truncate_corrupt_middle: bool, report: RecoveryReport) -> int:
    """Verify records from segment ``start``; returns the offset where valid data ends."""
    files = cl.mfq.files
    if not files:
        return 0
    report.scanned_from = files[start].file_from_offset
    end = files[start].file_from_offset
    for seg in range(start, len(files)):
        mf = files[seg]
        mm, fsize, base = mf.mm, mf.file_size, mf.file_from_offset
        pos = 0
        while True:
            if pos + 8 > fsize:
                end = base + fsize
                break
            size, magic = BLANK.unpack_from(mm, pos)
            if magic == BLANK_MAGIC and size == fsize - pos:
                end = base + fsize  # end-of-segment marker: continue in the next segment
                break
            if size == 0 and magic == 0:
                end = base + pos
                if any(
                    verify_record(f.mm, 0, f.file_size, f.file_from_offset) is None for f in files[seg + 1 :]
                ):
                    _corrupt(base + pos, "hole of zeros", 1, truncate_corrupt_middle, report)
                return end
            reason = verify_record(mm, pos, fsize, base + pos)
            if reason is not None:
                after = _valid_after(files, seg, pos)
                if after:
                    _corrupt(base + pos, reason, after, truncate_corrupt_middle, report)
                else:
                    report.problems.append(f"torn tail at {base + pos}: {reason}; cut")
                    log.warning("recovery: torn commit-log tail at %d (%s): cut", base + pos, reason)
                return base + pos
            pos += size
    return end


def _corrupt(offset: int, reason: str, after: int, truncate: bool, report: RecoveryReport) -> None:
    if not truncate:
        raise CorruptRecordError(offset, reason, after)
    report.problems.append(f"CORRUPT MIDDLE RECORD at {offset}: {reason}; {after}+ valid bytes after it cut")
    log.error(
        "recovery: corrupt record at %d (%s) with valid data after it: cut as configured", offset, reason
    )


def count_dirty_bytes(cl: CommitLog, end: int) -> int:
    """Roughly how many written bytes lie past ``end`` (non-zero bytes in the probe window + later files)."""
    total = 0
    for mf in cl.mfq.files:
        if mf.end_offset <= end:
            continue
        local = max(0, end - mf.file_from_offset)
        window = mf.mm[local : min(mf.file_size, local + _TAIL_PROBE)]
        total += len(window.rstrip(b"\0"))
    return total
