"""An ordered run of equal-size :class:`MappedFile` segments covering one logical byte space (the commit
log, or one consume queue). Finds the segment holding an offset in O(1), creates the next one on demand,
flushes, truncates and deletes from the head for expiry. It also tells the kernel which segment is being
appended to (no readahead there) and which ones are only read any more (see mapped_file.py for why)."""

from __future__ import annotations

from pathlib import Path

from broker_sim.store.errors import StoreLayoutError
from broker_sim.store.mapped_file import NAME_DIGITS, MappedFile, file_name, fsync_dir


class MappedFileQueue:
    __slots__ = ("directory", "file_size", "files")

    def __init__(self, directory: Path, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.files: list[MappedFile] = []

    def load(self) -> None:
        """Map every existing segment (positions are set later by recovery; readahead stays on for its scan,
        until :meth:`start_appending`); reject gaps and odd names."""
        if not self.directory.is_dir():
            return
        names = sorted(p.name for p in self.directory.iterdir() if p.is_file())
        for name in names:
            if len(name) != NAME_DIGITS or not name.isdigit():
                continue  # temp files and the like are not segments
            mf = MappedFile(self.directory / name, self.file_size)
            if self.files and mf.file_from_offset != self.files[-1].end_offset:
                raise StoreLayoutError(f"gap before {mf.path}")
            if mf.file_from_offset % self.file_size:
                raise StoreLayoutError(f"{mf.path} does not start on a {self.file_size}-byte boundary")
            mf.wrote = mf.flushed = self.file_size
            self.files.append(mf)

    # ---------------------------------------------------------------------------------------- lookups
    @property
    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        """End of written data (next append position)."""
        if not self.files:
            return 0
        last = self.files[-1]
        return last.file_from_offset + last.wrote

    @property
    def flushed_offset(self) -> int:
        for mf in reversed(self.files):
            if mf.flushed:
                return mf.file_from_offset + mf.flushed
        return self.files[0].file_from_offset if self.files else 0

    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        """The segment whose byte range holds ``offset`` (None if deleted or not yet created)."""
        files = self.files
        if not files:
            return None
        idx = offset // self.file_size - files[0].file_from_offset // self.file_size
        if 0 <= idx < len(files):
            return files[idx]
        return None

    # ---------------------------------------------------------------------------------------- growth
    def create(self, start_offset: int) -> MappedFile:
        """Map a new segment starting at ``start_offset`` (must follow the last one)."""
        if self.files and start_offset != self.files[-1].end_offset:
            raise StoreLayoutError(f"new segment at {start_offset} does not follow {self.files[-1].path}")
        self.directory.mkdir(parents=True, exist_ok=True)
        mf = MappedFile(self.directory / file_name(start_offset), self.file_size)
        if self.files:
            self.files[-1].advise_reading()
        self.files.append(mf)
        mf.advise_appending()
        return mf

    def start_appending(self) -> None:
        """Recovery has set the positions: appends go to the last segment from its write position on."""
        if self.files:
            self.files[-1].advise_appending()

    def file_for_write(self, offset: int) -> MappedFile:
        """The segment holding ``offset``, creating segments up to it (consume queues write by position)."""
        if not self.files:
            return self.create(offset - offset % self.file_size)
        while offset >= self.files[-1].end_offset:
            last = self.files[-1]
            last.wrote = self.file_size
            self.create(last.end_offset)
        mf = self.find(offset)
        if mf is None:
            raise StoreLayoutError(f"offset {offset} lies before the first segment of {self.directory}")
        return mf

    # ---------------------------------------------------------------------------------------- flush
    def flush(self, least_pages: int = 0) -> int:
        """msync every segment with unflushed bytes — with ``least_pages``, only a segment holding at least
        that many unflushed OS pages (or full: see :meth:`MappedFile.able_to_flush`); returns the flushed end
        offset."""
        for mf in self.files:
            if mf.able_to_flush(least_pages):
                mf.flush()
        return self.flushed_offset

    def discard_unflushed(self) -> None:
        for mf in self.files:
            mf.discard_unflushed()

    # ---------------------------------------------------------------------------------------- shrink
    def truncate(self, offset: int) -> None:
        """Drop everything at or after ``offset``: later segments are deleted, the one holding it zeroed."""
        keep: list[MappedFile] = []
        for mf in self.files:
            if mf.file_from_offset + self.file_size <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                mf.zero_from(offset - mf.file_from_offset)
                keep.append(mf)
            else:
                mf.destroy()
        if len(keep) != len(self.files):
            fsync_dir(self.directory)
        self.files = keep
        self.start_appending()

    def delete_first(self, count: int) -> list[MappedFile]:
        """Remove the ``count`` oldest segments (never the last, which is still being written)."""
        count = min(count, len(self.files) - 1)
        gone = self.files[:count]
        for mf in gone:
            mf.destroy()
        self.files = self.files[count:]
        if gone:
            fsync_dir(self.directory)
        return gone

    def delete_all(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files = []

    def close(self) -> None:
        for mf in self.files:
            mf.close()
