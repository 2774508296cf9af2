"""Keeps the pages just ahead of the commit log's write position mapped, off the put path.

Why: a fresh segment is a sparse file, so the first copy into each 4 KiB page faults — the kernel allocates
and zeroes a page-cache page and reserves the block — and that fault happens inside the append, with the
commit-log lock and the GIL held (≈ 0.8–1.2 µs of a 1 KiB put, bench a1). RocketMQ's ``warmMappedFile`` and
``AllocateMappedFileService`` take the same cost off the put path by touching pages in advance. Here the
append only compares its end with :attr:`CommitLog.prefault_mark` and, once per half window, calls
``prefault_wake``, which asks the kernel to populate the next ``window`` bytes (``MADV_POPULATE_WRITE``).
With the extension built that call hands the range to the extension's own worker thread
(``_codec.populate_async``, a pthread that never takes the GIL) and returns; without it, it wakes a Python
thread of ours that calls :func:`broker_sim.store.codec.py_populate` (slower end to end on 2 cores: the
thread needs the GIL for every window). Page contents are not touched, so racing the writer is harmless;
where the kernel cannot do it we give up for good and appends fault as before.
"""

from __future__ import annotations

import functools
import logging
import mmap
import threading
from collections.abc import Callable

from broker_sim.store import codec
from broker_sim.store.commit_log import NO_PREFAULT, CommitLog

log = logging.getLogger(__name__)
WINDOW = 4 * 1024 * 1024


class Prefaulter:
    def __init__(self, commit_log: CommitLog, window: int = WINDOW) -> None:
        self.commit_log = commit_log
        self.window = window
        self.populated = 0  # absolute commit-log offset up to which pages were populated
        self.rounds = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        compiled = codec.compiled if commit_log.codec.populate is not codec.py_populate else None
        #: the compiled worker's calls (no thread of ours), or None: populate on our own thread
        self._async: Callable[[mmap.mmap, int, int], bool] | None = compiled and compiled.populate_async
        self._idle: Callable[[], None] | None = compiled and compiled.populate_idle

    @property
    def compiled(self) -> bool:
        """Whether the compiled worker populates (no thread of ours, no GIL hand-offs)."""
        return self._async is not None

    def start(self) -> None:
        self._stop.clear()
        self.populated = 0  # recovery may have cut the log below what an earlier run populated
        cl = self.commit_log
        cl.prefault_mark = 0  # the first append wakes us
        if self._async is not None:  # the compiled worker: the append itself hands it the next window
            cl.prefault_wake = functools.partial(self._submit, self._async)
            return
        cl.prefault_wake = self._wake.set
        self._thread = threading.Thread(target=self._run, name="broker_sim-prefault", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join (before segments are closed: a populate in progress holds the mapping)."""
        self.commit_log.prefault_mark = NO_PREFAULT
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._idle is not None:
            self._idle()  # the worker is done with every range handed over before

    def _submit(self, populate_async: Callable[[mmap.mmap, int, int], bool]) -> None:
        """``prefault_wake`` with the compiled worker: called by the append that reached the mark (commit-log
        lock held), hands the next window to the worker and returns."""
        if not self._round(populate_async):
            self.commit_log.prefault_wake = _nothing

    def _run(self) -> None:
        populate = self.commit_log.codec.populate
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stop.is_set() or not self._round(populate):
                break

    def _round(self, populate: Callable[[mmap.mmap, int, int], bool]) -> bool:
        """Populate the window ahead of the write position and move the mark; False: the kernel cannot."""
        cl = self.commit_log
        files = cl.mfq.files
        if not files:
            return True
        mf = files[-1]
        base, pos = mf.file_from_offset, mf.wrote
        start = max(self.populated - base, pos)
        end = min(mf.file_size, pos + self.window)
        if end > start:
            try:
                ok = populate(mf.mm, start, end - start)
            except (ValueError, BufferError):
                ok = True  # the segment was closed under us (shutdown races): try the next one
            if not ok:
                log.info("prefault: the kernel cannot populate mappings; appends will fault as before")
                cl.prefault_mark = NO_PREFAULT
                return False
            self.rounds += 1
        self.populated = base + end
        # wake again when the writer is half way through what is populated (or in the next segment)
        cl.prefault_mark = base + end - self.window // 2 if end < mf.file_size else base + mf.file_size
        return True


def _nothing() -> None:
    pass
