"""Store settings, with RocketMQ 4.x's defaults (``MessageStoreConfig``) unless a comment says otherwise.

Tests shrink the file sizes (KiBs) to force segment rolls, and inject ``disk_usage`` to drive expiry."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass, field

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
CQ_UNIT_SIZE = 20

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class FlushDiskType(enum.Enum):
    """When an append counts as written: after the OS has it (ASYNC) or after it is on disk (SYNC)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


def parse_delay_levels(spec: str) -> list[int]:
    """``"1s 5s 1m"`` → ``[1000, 5000, 60000]`` (level *n* is element *n-1*)."""
    out: list[int] = []
    for token in spec.split():
        unit = token[-1]
        if unit not in _UNIT_MS or not token[:-1].isdigit():
            raise ValueError(f"bad delay level {token!r} (expected e.g. 5s, 1m, 2h)")
        out.append(int(token[:-1]) * _UNIT_MS[unit])
    return out


def physical_memory_bytes() -> int:
    """The machine's physical memory (Java's ``StoreUtil.TOTAL_PHYSICAL_MEMORY_SIZE``); 24 GiB when the OS
    does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 24 * 1024**3


class BrokerRole(enum.Enum):
    """MessageStoreConfig.brokerRole: a master acknowledges sends at once (ASYNC) or after a slave has them
    (SYNC); a slave only replicates and refuses sends."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


@dataclass
class StoreConfig:
    """Everything the storage engine can be tuned with. All sizes in bytes, times in ms unless named."""

    # --- files ---
    commit_log_file_size: int = 1024 * 1024 * 1024  # mappedFileSizeCommitLog
    consume_queue_units: int = 300_000  # mappedFileSizeConsumeQueue / 20
    index_hash_slots: int = 5_000_000  # maxHashSlotNum
    index_max_entries: int = 20_000_000  # maxIndexNum
    message_index_enable: bool = True
    # --- messages ---
    max_message_size: int = 4 * 1024 * 1024
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    # --- flush ---
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_commit_log_ms: int = 500
    # ASYNC_FLUSH: a periodic flush writes the commit log only when this many 4 KiB pages are dirty
    # (flushCommitLogLeastPages), and whatever is dirty every thorough interval
    # (flushCommitLogThoroughInterval): a quiet broker's last seconds of messages are what a power cut takes
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1000
    sync_flush_timeout_ms: int = 5000
    # Fault hook, called by the flusher before every commit-log flush (a test blocks it to provoke
    # FLUSH_DISK_TIMEOUT). Not part of RocketMQ.
    before_flush: Callable[[], None] | None = None
    # RocketMQ's warmMapedFileEnable: the commit log just ahead of its write position is made ready.
    # ASYNC_FLUSH: its pages are populated off the put path (broker_sim/store/prefault.py); SYNC_FLUSH: its
    # blocks are written with zeros, so group-commit flushes allocate nothing (store/zero_ahead.py).
    # None (default): for ASYNC_FLUSH where the compiled extension's worker thread populates (the Python
    # thread measured slower end to end on the 2-core box, bench a1 −20 %); not for SYNC_FLUSH, where it
    # sends the disk ≈ 1.8× the bytes for ≈ 5–10 % more puts/s (docs/benchmarks/store.md, a2 ninth round).
    warm_mapped_file: bool | None = None
    # --- dispatch ---
    # True: a background dispatcher builds consume queues/index (RocketMQ's ReputMessageService, so a
    # message is readable a moment after its put returns). False: the put dispatches before returning.
    dispatch_async: bool = True
    # --- pull limits (maxTransferBytes/CountOnMessageInMemory) ---
    max_transfer_bytes: int = 256 * 1024
    max_transfer_count: int = 32
    max_filter_units: int = 16_000
    # --- what counts as "in memory" (accessMessageInMemoryMaxRatio × the machine's physical memory) ---
    access_message_in_memory_max_ratio: int = 40
    total_physical_memory_bytes: int = field(default_factory=lambda: physical_memory_bytes())
    # --- expiry (CleanCommitLogService) ---
    file_reserved_hours: float = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: float = 0.75
    disk_space_clean_forcibly_ratio: float = 0.85
    disk_space_warning_level_ratio: float = 0.90
    delete_files_batch_max: int = 10
    clean_resource_interval_ms: int = 10_000
    # Returns the used fraction (0..1) of the disk holding the store; None = measure with shutil.disk_usage.
    disk_usage: Callable[[], float] | None = None
    # --- replication (HAService) ---
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    #: offsetCheckInSlave: a SLAVE moves a reader's out-of-range offset as a master does (off: it leaves it
    #: alone and sends the reader to the master, so a slave behind its master never moves a consumer)
    offset_check_in_slave: bool = False
    #: a master's HA port (haListenPort; 0 = any free port); None = no replication service (a lone broker)
    ha_listen_port: int | None = None
    #: the host a master's HA port binds (None: the store host, which is also what is announced)
    ha_listen_host: str | None = None
    #: a slave's master HA address "host:port" (haMasterAddress); "" = learnt from the name server
    ha_master_address: str = ""
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    # --- recovery ---
    truncate_corrupt_middle: bool = False
    normal_recover_segments: int = 3
    delay_levels_ms: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.commit_log_file_size < 4096 or self.commit_log_file_size % 4096:
            raise ValueError("commit_log_file_size must be a positive multiple of 4096")
        if self.consume_queue_units < 1 or self.index_hash_slots < 1 or self.index_max_entries < 2:
            raise ValueError("consume_queue_units, index_hash_slots and index_max_entries must be positive")
        if not 0 < self.max_message_size < 2**31 - 1024:
            raise ValueError("max_message_size out of range")
        self.delay_levels_ms = parse_delay_levels(self.message_delay_level)

    @property
    def moves_readers(self) -> bool:
        """Whether this store gives a reader whose offset is out of range a new one
        (``nextOffsetCorrection``): a master does; a slave only with ``offset_check_in_slave``."""
        return self.broker_role is not BrokerRole.SLAVE or self.offset_check_in_slave

    def delete_hours(self) -> set[int]:
        """``"04"`` or ``"04;16"`` → ``{4, 16}`` (RocketMQ's ``deleteWhen``)."""
        return {int(h) for h in self.delete_when.split(";") if h.strip()}
