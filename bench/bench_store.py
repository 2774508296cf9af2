"""broker_sim storage benchmarks a1–a3: our store against a baseline measured in the same run.

a1   appends/s under ASYNC_FLUSH, consume-queue dispatch included (the run waits until every record is
     dispatched; messages carry TAGS, the index is off so the work matches the baseline) ÷ a bare loop
     writing the same pre-encoded record bytes into an mmap plus one 20-byte unit into a second mmap.
     "a1+idx" repeats it with a UNIQ_KEY per message and the index on (RocketMQ's default). target ≥ 0.5
a1'  the same appends ÷ ``persistqueue.Queue`` (file queue) putting the same bodies.  target ≥ 20×
a2   SYNC_FLUSH appends/s with 16 producer threads ÷ one thread doing write + fdatasync per record (what
     a store without group commit would do).                                         target ≥ 4×
     Measured at the start of a fresh segment and, with ``--sync-at MiB`` (default 40), that far into one
     (what a broker that has run a while sees: the page cache's folios there were once megabytes each).
a3   sequential consume (get_message: queue lookup + record read, 32 per call) ÷ reading the same records
     one slice each from the mapped commit-log file, offsets known in advance.          target ≥ 0.3

``python -m bench store`` (or ``.venv/bin/python -m bench.bench_store --n 50000``).
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker_sim.store import FlushDiskType, MessageInner, MessageStore, StoreConfig
from broker_sim.store.message_record import encode_record

TOPIC = "BenchTopic"
QUEUES = 4
UNIT = struct.Struct(">qiq")


def messages(n: int, body_size: int, keys: bool = True) -> list[MessageInner]:
    body = bytes(range(256)) * (body_size // 256) + bytes(body_size % 256)
    out = []
    for i in range(n):
        props = {"TAGS": "TagA"}
        if keys:
            props["UNIQ_KEY"] = f"7F0000010A2B18B4AAC2{i:012X}"
        out.append(
            MessageInner(TOPIC, body, queue_id=i % QUEUES, properties=props, born_host=("10.0.0.2", 5000))
        )
    return out


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def new_store(root: Path, name: str, **cfg: object) -> MessageStore:
    store = MessageStore(root / name, StoreConfig(**cfg))  # type: ignore[arg-type]
    store.start()
    return store


# ------------------------------------------------------------------------------------------------ a1
def ours_append(store: MessageStore, msgs: list[MessageInner]) -> float:
    def run() -> None:
        put = store.put_message
        for m in msgs:
            put(m)
        if not store.wait_dispatched(600):
            raise RuntimeError("dispatch did not finish")

    return len(msgs) / timed(run)


def bare_mmap(root: Path, msgs: list[MessageInner]) -> float:
    records = [
        encode_record(m, i // QUEUES, 0, 0, b"\x7f\x00\x00\x01\x00\x00\x2a\x9f") for i, m in enumerate(msgs)
    ]
    total = sum(len(r) for r in records)
    for stale in ("bare.log", "bare.cq"):
        (root / stale).unlink(missing_ok=True)  # fresh sparse files each run, like a new segment
    fd = os.open(root / "bare.log", os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, total + 4096)
    log = mmap.mmap(fd, total + 4096)
    fd2 = os.open(root / "bare.cq", os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd2, len(records) * 20)
    cq = mmap.mmap(fd2, len(records) * 20)

    def run() -> None:
        pos = 0
        pack = UNIT.pack_into
        for i, rec in enumerate(records):
            n = len(rec)
            log[pos : pos + n] = rec
            pack(cq, i * 20, pos, n, 2598919)
            pos += n

    rate = len(records) / timed(run)
    log.close()
    cq.close()
    os.close(fd)
    os.close(fd2)
    return rate


def persist_queue(root: Path, msgs: list[MessageInner]) -> float:
    import persistqueue

    q = persistqueue.Queue(str(root / "pq"))

    def run() -> None:
        for m in msgs:
            q.put(m.body)

    return len(msgs) / timed(run)


# ------------------------------------------------------------------------------------------------ a2
def ours_sync(
    root: Path, msgs: list[MessageInner], threads: int, name: str, at_mib: int = 0
) -> tuple[float, int, float]:
    """SYNC_FLUSH puts/s of ``threads`` producers sharing ``msgs``, starting ``at_mib`` MiB into the segment
    (written beforehand in batches, untimed), the flush rounds they took and the bytes sent to the disk per
    put."""
    store = new_store(root, name, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    batch = msgs[:64]
    while store.max_phy_offset < at_mib * 1024 * 1024:
        store.put_messages(batch)
    rounds_before, wrote_before = store.group_commit.flush_count, disk_writes()
    per = len(msgs) // threads
    barrier = threading.Barrier(threads + 1)

    def producer(k: int) -> None:
        barrier.wait()
        for m in msgs[k * per : (k + 1) * per]:
            store.put_message(m)

    ts = [threading.Thread(target=producer, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    t0 = time.perf_counter()
    barrier.wait()
    for t in ts:
        t.join()
    rate = per * threads / (time.perf_counter() - t0)
    flushes = store.group_commit.flush_count - rounds_before
    wrote = disk_writes() - wrote_before
    store.shutdown()
    return rate, flushes, wrote / (per * threads)


def disk_writes() -> int:
    """Bytes this process has sent (or made dirty) for the disk so far: ``write_bytes`` of /proc/self/io."""
    try:
        with open("/proc/self/io") as f:
            for row in f:
                if row.startswith("write_bytes:"):
                    return int(row.split()[1])
    except OSError:
        pass  # not Linux: the figure is printed as 0
    return 0


def raw_fdatasync(root: Path, msgs: list[MessageInner]) -> float:
    records = [encode_record(m, 0, 0, 0, b"\x7f\x00\x00\x01\x00\x00\x2a\x9f") for m in msgs]
    (root / "raw.log").unlink(missing_ok=True)
    fd = os.open(root / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def run() -> None:
        for rec in records:
            os.write(fd, rec)
            os.fdatasync(fd)

    rate = len(records) / timed(run)
    os.close(fd)
    return rate


# ------------------------------------------------------------------------------------------------ a3
def ours_consume(store: MessageStore) -> tuple[float, int]:
    count = 0

    def run() -> None:
        nonlocal count
        for q in range(QUEUES):
            offset = 0
            while True:
                r = store.get_message("bench", TOPIC, q, offset, 32)
                if not r.messages:
                    break
                count += len(r.messages)
                offset = r.next_begin_offset

    elapsed = timed(run)
    return count / elapsed, count


def bare_read(store: MessageStore) -> float:
    spots: list[tuple[int, int]] = []
    for q in range(QUEUES):
        cq = store.find_consume_queue(TOPIC, q)
        spots.extend((unit[0], unit[1]) for unit in (cq.get(i) for i in range(cq.max_offset)) if unit)
    spots.sort()
    path = store.commit_log.mfq.files[0].path
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def run() -> None:
        for off, size in spots:
            mm[off : off + size]

    rate = len(spots) / timed(run)
    mm.close()
    return rate


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_store")
    ap.add_argument("--n", type=int, default=50_000, help="messages per a1/a3 run")
    ap.add_argument("--sync-n", type=int, default=4000, help="messages per a2 run")
    ap.add_argument("--sync-at", type=int, default=40, help="a2 again this many MiB into a segment (0: not)")
    ap.add_argument("--runs", type=int, default=3, help="attempts per measurement (best is kept)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--only", default="a1,a2,a3", help="comma-separated families to run (a1 includes a1')")
    args = ap.parse_args(argv)
    only = {f.strip() for f in args.only.split(",") if f.strip()}
    if not only or only - {"a1", "a2", "a3"}:
        ap.error(f"--only takes a1, a2, a3; got {args.only!r}")
    root = Path(tempfile.mkdtemp(prefix="bench_store_", dir=args.dir))
    try:
        return _run(root, args.n, args.sync_n, args.sync_at, args.runs, only)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def line(name: str, ours: float, base_name: str, base: float, target: str, extra: str = "") -> None:
    ratio = ours / base if base else float("nan")
    print(f"{name:<14} ours {ours:10.0f} msg/s{extra}   {base_name} {base:10.0f} msg/s   ratio {ratio:7.3f}"
          f"   (target {target})")  # fmt: skip


def _run(root: Path, n: int, sync_n: int, sync_at: int, runs: int, only: set[str]) -> int:
    print(f"broker_sim store benchmarks, n={n}, best of {runs} interleaved runs, scratch {root}")
    if "a1" in only:
        _a1(root, n, runs)
    if "a3" in only:
        _a3(root, n, runs)
    if "a2" in only:
        _a2(root, sync_n, runs, sync_at)
    return 0


def _a1(root: Path, n: int, runs: int) -> None:
    for size in (1024, 128):
        msgs = messages(n, size)
        plain_msgs = messages(n, size, keys=False)
        ours = base = ours_plain = pq = 0.0
        for k in range(runs):  # interleave ours and baselines so load spikes hit both
            store = new_store(root, f"a1-{size}-{k}")
            ours = max(ours, ours_append(store, msgs))
            store.shutdown()
            shutil.rmtree(root / f"a1-{size}-{k}")
            base = max(base, bare_mmap(root, msgs))
            plain = new_store(root, f"a1p-{size}-{k}", message_index_enable=False)
            ours_plain = max(ours_plain, ours_append(plain, plain_msgs))
            plain.shutdown()
            shutil.rmtree(root / f"a1p-{size}-{k}")
            pq = max(pq, persist_queue(root, msgs[: min(n, 20_000)]))
            shutil.rmtree(root / "pq", ignore_errors=True)
        line(f"a1 {size} B", ours_plain, "bare mmap", base, ">= 0.5 at 1 KiB")
        line(f"a1+idx {size} B", ours, "bare mmap", base, "none: + UNIQ_KEY, index on")
        line(f"a1' {size} B", ours_plain, "persist-queue", pq, ">= 20")


def _a3(root: Path, n: int, runs: int) -> None:
    store = new_store(root, "a3")
    ours_append(store, messages(n, 1024))
    rate = bare = 0.0
    count = 0
    for _ in range(runs):
        r, count = ours_consume(store)
        rate, bare = max(rate, r), max(bare, bare_read(store))
    line("a3 1024 B", rate, "bare read", bare, ">= 0.3", f" ({count} msgs)")
    store.shutdown()


def _a2(root: Path, sync_n: int, runs: int, at_mib: int) -> None:
    msgs = messages(sync_n, 1024)
    places = [0, at_mib] if at_mib else [0]
    best = dict.fromkeys(places, (0.0, 0, 0.0))
    raw = 0.0
    for k in range(max(1, runs - 1)):
        for at in places:
            best[at] = max(best[at], ours_sync(root, msgs, 16, f"sync-{k}-{at}", at))
        raw = max(raw, raw_fdatasync(root, msgs[: max(500, sync_n // 4)]))
    for at, (ours_s, flushes, per_put) in best.items():
        name = f"a2 1024 B @{at}M" if at else "a2 1024 B"
        extra = f" (16 threads, {flushes} flushes/{sync_n} puts, {per_put / 1024:.1f} KiB to disk/put)"
        line(name, ours_s, "write+fdatasync", raw, ">= 4", extra)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
