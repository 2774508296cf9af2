"""One fixed-size, memory-mapped segment file, named by the 20-digit offset of its first byte.

Writers put bytes straight into :attr:`MappedFile.mm` (``struct.pack_into``/slice assignment, no syscalls);
``wrote`` is the end of valid data and ``flushed`` how much of it has been ``msync``-ed to disk. Files are
created sparse at full size, as RocketMQ pre-allocates them, so a torn write leaves zeros after it.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from broker_sim.store.errors import StoreLayoutError

NAME_DIGITS = 20


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

    def flush(self) -> int:
        """msync everything written but not yet flushed; returns the new flushed position."""
        wrote = self.wrote
        if wrote > self.flushed:
            os.fdatasync(self.fd)
            self.flushed = wrote
        return self.flushed

    def discard_unflushed(self) -> None:
        """Crash simulation: zero what a power cut would lose (written but never msync-ed)."""
        if self.wrote > self.flushed:
            self.mm[self.flushed : self.wrote] = bytes(self.wrote - self.flushed)
            self.flush_range(self.flushed, self.wrote)
        self.wrote = self.flushed

    def flush_range(self, start: int, end: int) -> None:
        if end > start:
            os.fdatasync(self.fd)

    def zero_from(self, pos: int) -> None:
        """Erase everything from ``pos`` to the end of the file (recovery's truncation) and persist it."""
        if pos < self.file_size:
            self.mm[pos:] = bytes(self.file_size - pos)
            self.flush_range(pos, self.file_size)
        self.wrote = self.flushed = pos

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
