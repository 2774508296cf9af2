"""One fixed-size, memory-mapped segment file, named by the 20-digit offset of its first byte.

Writers put bytes straight into :attr:`MappedFile.mm` (``struct.pack_into``/slice assignment, no syscalls);
``wrote`` is the end of valid data and ``flushed`` how much of it has been ``msync``-ed to disk. Files are
created sparse at full size, as RocketMQ pre-allocates them, so a torn write leaves zeros after it.

Why the part still to be written is advised ``MADV_RANDOM`` (:meth:`MappedFile.advise_appending`): a fault
on a mapped page goes through the kernel's readahead, and with large page-cache folios (ext4 on Linux 6.x)
a run of sequential faults — an append — makes readahead hand out ever larger folios (measured here: 4 KiB
at the start of a fresh segment, 2 MiB from 40 MiB on). Dirty state is kept per folio, so a flush deep into
a segment writes whole folios for the few KiB appended since the last one: 40 MiB in, SYNC_FLUSH group
commit sent ≈ 130 KiB to the disk per 1 KiB put and ran ≈ 3.7 k puts/s against ≈ 14 k at the start. Without
readahead each fault brings one 4 KiB page and a flush writes what was appended. A segment the writer has
left gets ``MADV_NORMAL`` back (:meth:`MappedFile.advise_reading`): consumers catching up read it in order.

Why recovery's truncation punches a hole (:meth:`MappedFile.zero_from`): the bytes after the recovered end
must read as zeros, and writing zeros through the mapping to the end of a 1 GiB segment — what this did
before — allocated a 1 GiB buffer and wrote 1 GiB at every start, clean or not. ``fallocate(PUNCH_HOLE)``
frees the blocks instead (the file stays sparse, pages read back as zeros); where a file system cannot punch,
only the data extents holding non-zero bytes are overwritten.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_sim.store.errors import StoreLayoutError

NAME_DIGITS = 20
PAGE = mmap.PAGESIZE
#: what RocketMQ counts a periodic flush's dirty pages in (MappedFile.OS_PAGE_SIZE), whatever the machine's
OS_PAGE_SIZE = 4 * 1024
LARGEST_FOLIO = 2 * 1024 * 1024  # the largest page-cache folio on x86-64 (a PMD)
ZERO_CHUNK = 1024 * 1024  # the compare-and-zero fallback of zero_from works in pieces this large
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def file_name(offset: int) -> str:
    return f"{offset:0{NAME_DIGITS}d}"


def fsync_dir(path: Path) -> None:
    """Make a create/rename/unlink in ``path`` durable (the directory entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def map_file(path: Path, size: int, must_match: bool = False) -> tuple[mmap.mmap, int]:
    """Open (creating sparse if needed) and map ``path``; returns the map and an fd kept for fdatasync.

    Flushing goes through ``os.fdatasync(fd)`` rather than ``mmap.flush()``: both write back the pages
    dirtied through the shared mapping, but only the former releases the GIL, so producers keep appending
    while a flush waits on the disk — which is what makes group commit and async flushing pay off."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        actual = os.fstat(fd).st_size
        if must_match and actual not in (0, size):
            raise StoreLayoutError(f"{path} is {actual} bytes, expected {size}")
        if actual != size:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size, access=mmap.ACCESS_WRITE), fd
    except BaseException:
        os.close(fd)
        raise


def _libc(name: str, argtypes: list[type[ctypes._SimpleCData[Any]]]) -> Callable[..., int] | None:
    """The C library's ``name`` with its argument types, or None where there is none (not glibc/Linux: the
    callers fall back)."""
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    call: Callable[..., int] = fn
    return call


_fallocate = _libc("fallocate64", [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64])
_sync_file_range = _libc("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])
_SYNC_FILE_RANGE_WRITE = 0x02


def _errno_error() -> OSError:
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err))


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Start writing ``[offset, offset + length)`` back to disk without waiting (Linux ``sync_file_range``
    with ``SYNC_FILE_RANGE_WRITE``: data only, no durability promise); False where it is not available."""
    if _sync_file_range is None:
        return False
    if _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE) != 0:
        raise _errno_error()
    return True


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free ``[offset, offset + length)`` of the file (it reads back as zeros, the size is kept); False where
    the platform or the file system cannot, so the caller overwrites instead."""
    if _fallocate is None:
        return False
    if _fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, offset, length) == 0:
        return True
    if ctypes.get_errno() in (errno.EOPNOTSUPP, errno.ENOSYS):
        return False
    raise _errno_error()


def next_data(fd: int, offset: int) -> int | None:
    """Where the first block at or after ``offset`` that is allocated or cached dirty starts (``SEEK_DATA``);
    None when only holes follow."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return None
        raise


def zero_data_extents(mm: mmap.mmap, fd: int, start: int, end: int) -> None:
    """Make ``mm[start:end]`` zeros, writing only pieces of data extents that hold a non-zero byte (holes and
    zero pieces are left alone): ``zero_from`` where no hole can be punched."""
    pos = start
    while pos < end:
        data = next_data(fd, pos)
        if data is None or data >= end:
            return
        stop = min(end, os.lseek(fd, data, os.SEEK_HOLE))
        for a in range(data, stop, ZERO_CHUNK):
            b = min(stop, a + ZERO_CHUNK)
            if mm[a:b].strip(b"\0"):
                mm[a:b] = bytes(b - a)
        pos = stop


class MappedFile:
    __slots__ = ("fd", "file_from_offset", "file_size", "flushed", "mm", "path", "wrote")

    def __init__(self, path: Path, file_size: int) -> None:
        name = path.name
        if len(name) != NAME_DIGITS or not name.isdigit():
            raise StoreLayoutError(f"{path} is not named by a 20-digit offset")
        self.path = path
        self.file_size = file_size
        self.file_from_offset = int(name)
        existed = path.exists()
        self.mm, self.fd = map_file(path, file_size, must_match=existed)
        if not existed:
            fsync_dir(path.parent)
        self.wrote = 0
        self.flushed = 0

    @property
    def end_offset(self) -> int:
        """Physical offset just past the file."""
        return self.file_from_offset + self.file_size

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote

    def is_full(self) -> bool:
        return self.wrote >= self.file_size

    def able_to_flush(self, least_pages: int) -> bool:
        """RocketMQ's rule for a periodic flush: a full segment always; else at least ``least_pages`` OS pages
        written since the last flush (0: any byte)."""
        if self.is_full():
            return self.wrote > self.flushed
        if least_pages > 0:
            return self.wrote // OS_PAGE_SIZE - self.flushed // OS_PAGE_SIZE >= least_pages
        return self.wrote > self.flushed

    def flush(self) -> int:
        """msync everything written but not yet flushed; returns the new flushed position."""
        wrote = self.wrote
        if wrote > self.flushed and self._datasync():
            self.flushed = wrote
        return self.flushed

    def _datasync(self) -> bool:
        """``fdatasync`` the file; False if it was destroyed (expired) or closed, before or during the call.

        The flush service runs beside expiry: a segment that expiry destroys while a periodic flush walks the
        queue's files has nothing left to keep (the flush used to fail on the descriptor ``-1`` that
        :meth:`destroy` leaves, logging an error)."""
        fd = self.fd
        if fd < 0:
            return False
        try:
            os.fdatasync(fd)
        except OSError:
            if self.fd < 0:  # destroyed while the call ran: the descriptor went with the file
                return False
            raise
        return True

    def discard_unflushed(self) -> None:
        """Crash simulation: zero what a power cut would lose (written but never msync-ed)."""
        if self.wrote > self.flushed:
            self.mm[self.flushed : self.wrote] = bytes(self.wrote - self.flushed)
            self.flush_range(self.flushed, self.wrote)
        self.wrote = self.flushed

    def flush_range(self, start: int, end: int) -> None:
        if end > start:
            self._datasync()

    def zero_from(self, pos: int) -> None:
        """Erase everything from ``pos`` to the end of the file (recovery's truncation) and persist it: the
        rest of ``pos``'s page through the mapping, the whole pages after it by punching a hole (see the
        module docstring). A tail reading as zeros already (a clean shutdown's) is left alone, unsynced."""
        if pos < self.file_size:
            page_end = min(self.file_size, -(-pos // PAGE) * PAGE)
            changed = bool(self.mm[pos:page_end].strip(b"\0"))
            if changed:
                self.mm[pos:page_end] = bytes(page_end - pos)
            if page_end < self.file_size and next_data(self.fd, page_end) is not None:
                changed = True
                if not punch_hole(self.fd, page_end, self.file_size - page_end):
                    zero_data_extents(self.mm, self.fd, page_end, self.file_size)
            if changed:
                os.fsync(self.fd)  # the freed blocks are metadata, which fdatasync may leave for later
        self.wrote = self.flushed = pos

    def advise_appending(self) -> None:
        """The writer works here now: no readahead from ``wrote`` on (module docstring). Pages already cached
        around the write position — recovery's scan read ahead past it — may sit in large folios, so from the
        start of the largest folio that can hold ``wrote`` on they are unmapped and dropped from the page
        cache (clean ones; the written ones among them are read back as single pages when needed)."""
        start = self.wrote - self.wrote % PAGE
        if start >= self.file_size:
            return
        self.mm.madvise(mmap.MADV_RANDOM, start, self.file_size - start)
        drop = self.wrote - self.wrote % LARGEST_FOLIO
        self.mm.madvise(mmap.MADV_DONTNEED, drop, self.file_size - drop)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, drop, self.file_size - drop, os.POSIX_FADV_DONTNEED)

    def advise_reading(self) -> None:
        """The writer has left this segment: readers get the kernel's readahead back."""
        self.mm.madvise(mmap.MADV_NORMAL)

    def read(self, pos: int, size: int) -> bytes:
        return self.mm[pos : pos + size]

    def close(self) -> None:
        if not self.mm.closed:
            self.mm.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def destroy(self) -> None:
        """Unlink the file. The mapping is left to the garbage collector so that a reader holding this
        segment (a pull racing expiry) still reads valid memory instead of a closed map."""
        self.path.unlink(missing_ok=True)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __repr__(self) -> str:
        return f"MappedFile({self.path.name}, wrote={self.wrote}, flushed={self.flushed})"
