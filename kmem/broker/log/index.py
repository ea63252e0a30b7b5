"""A segment's offset and time indexes, in Kafka's file layouts (``OffsetIndex``, ``TimeIndex``).

- ``<base>.index``: 8-byte entries ``relative offset i32 | file position i32`` (big-endian), offsets
  strictly increasing.
- ``<base>.timeindex``: 12-byte entries ``timestamp i64 | relative offset i32``, an entry only when the
  segment's largest timestamp grew.

The index of the active segment is preallocated (a sparse file) to ``segment.index.bytes`` rounded down
to whole entries, as Kafka does, and trimmed to its entries when the segment rolls or the log closes. An
index that cannot be trusted (length not a multiple of the entry size, offsets not increasing, entries
outside the segment) fails ``sanity_check`` and is rebuilt from the segment by the caller.

Entries are read and written with ``pread``/``pwrite``: lookups binary-search the file in the compiled core
(``_core.index_floor``: one read per step until the rows left fit in 8 KiB, then one read of them; about 12
reads for a full index) and keep nothing in memory but the last entry, which
answers a lookup at the tail without a read, and the entries not written yet. The files are opened for each
use and never kept open, so that a partition holds one descriptor (its active segment's log) however long
its log is: Kafka maps its indexes and closes their files for the same reason.

An append's entries are held in memory (``PENDING_BYTES``) and written together, with the append that fills
them (``_core.SegmentCore.append``, the file's write without the GIL): opening, writing and closing two files for
each append was a sixteenth of the broker's CPU under small records. Everything that reads the file or makes it durable
writes them first (``write_pending``: trims, syncs, checks, whole reads). Only the active segment holds
entries (a roll writes them), and a crash loses nothing else: the active segment of a log not closed cleanly
has its indexes rebuilt from its batches (``LogSegment.recover``), entries held or not, as its preallocated
files end in zero rows anyway.
Entries written by ``append``/``maybe_append`` (recovery and the cleaner) go to the file at once. The blocks
of the entries held are reserved (``posix_fallocate``, ``RESERVE_BYTES`` at a time) by the append that holds
the first of them: a full disk fails that append, as a write of its entry did, and never the roll, flush,
close, retention or deletion that writes them later. Where the platform has no ``posix_fallocate`` (macOS)
nothing is reserved, and that later write may fail on a full disk.
"""
import bisect
import contextlib
import os
import struct

import numpy as np

from kmem import _core
from kmem.errors import CorruptIndexError

NO_TIMESTAMP = -1
READ_ENTRIES = 8192        # entries read at a time by ``iter_entries``
PENDING_BYTES = 1024       # an index's entries held before they are written: 128 offset, 85 time entries
RESERVE_BYTES = 4096       # the blocks reserved at a time for the entries held
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class _Index:
    """An index file's reads, lookups and upkeep; its entries' state and appends are the core's
    (``_core.IndexCore``: the count, the entries held, the last entry)."""
    ENTRY = None           # struct of one entry
    KEY = 0                # field of the entry searched by lookup
    FIELDS = ()            # (byte position, width) of each field of an entry

    def __init__(self, path, base_offset, max_index_size, *, writable, read_only=False):
        """``read_only``: an index read offline (``kmem dump-log``), opened without write access and never
        created; ``writable`` then has no effect."""
        self.path = os.fspath(path)
        self._encoded_path = os.fsencode(self.path)
        self.base_offset = base_offset
        self.max_index_size = max_index_size - max_index_size % self.ENTRY.size
        self.max_entries = self.max_index_size // self.ENTRY.size
        self._access = os.O_RDONLY if read_only else os.O_RDWR
        self._pending, self._pending_rows = bytearray(), []     # entries after the file's ``_written``
        self.pending_bytes = PENDING_BYTES
        with self._file(0 if read_only else os.O_CREAT) as fd:
            self._length = os.fstat(fd).st_size
            self.entries = self._written = self._length // self.ENTRY.size
            self._reserved = self._written * self.ENTRY.size    # bytes from the start known to have blocks
            if writable and not read_only:
                self.resize(self.max_index_size)
            self._last = self._entry(fd, self.entries - 1) if self.entries else None

    @contextlib.contextmanager
    def _file(self, flags=0):
        # Opened for each use: a partition's only open descriptor is its active segment's log.
        fd = os.open(self.path, self._access | _CLOEXEC | flags, 0o644)
        try:
            yield fd
        finally:
            os.close(fd)

    def _entry(self, fd, n):
        return self.ENTRY.unpack(os.pread(fd, self.ENTRY.size, n * self.ENTRY.size))

    def iter_entries(self):
        """Every entry as stored (offsets relative to the base), in file order, ``READ_ENTRIES`` at a time."""
        self.write_pending()
        with self._file() as fd:
            for first in range(0, self.entries, READ_ENTRIES):
                count = min(READ_ENTRIES, self.entries - first)
                data = os.pread(fd, count * self.ENTRY.size, first * self.ENTRY.size)
                yield from self.ENTRY.iter_unpack(data[:len(data) - len(data) % self.ENTRY.size])

    def _reserve(self, end):
        """Allocate the file's blocks up to ``end`` bytes (past the length kmem gave the file, the write
        extends it and allocates them)."""
        if end <= self._reserved or end > self._length:
            return
        reserved = min(self._length, -(-end // RESERVE_BYTES) * RESERVE_BYTES)
        if hasattr(os, "posix_fallocate"):     # else (macOS) the later write allocates them
            with self._file() as fd:
                os.posix_fallocate(fd, self._reserved, reserved - self._reserved)
        self._reserved = reserved

    def _append_now(self, entry):
        """Write ``entry`` to the file now, after the entries held (recovery's and the cleaner's appends)."""
        _core.write_at(*self._write_with(entry))
        self.appended(entry, written=True)

    def write_pending(self):
        """Write the entries held to the file. Raises OSError (they stay held)."""
        if self._pending:
            _core.write_at(self._encoded_path, bytes(self._pending), self._written * self.ENTRY.size)
            self._all_written()

    def mark(self):
        """The index's state, to ``rewind`` to (the cleaner's, when a batch it wrote is taken back)."""
        return self.entries, self._last

    def rewind(self, mark):
        """Forget the entries added since ``mark`` (those written lie past the valid entries, as in a
        preallocated file)."""
        self.entries, self._last = mark
        self._written = min(self._written, self.entries)
        held = self.entries - self._written
        del self._pending[held * self.ENTRY.size:]
        del self._pending_rows[held:]

    def resize(self, size):
        """Make the file ``size`` bytes long (rounded down to whole entries), keeping the entries."""
        self.write_pending()
        size -= size % self.ENTRY.size
        entries = min(self.entries, size // self.ENTRY.size)
        with self._file() as fd:
            os.ftruncate(fd, size)
            self._length = size
            self._reserved = min(self._reserved, size)
            if entries != self.entries:
                self.entries = self._written = entries
                self._last = self._entry(fd, entries - 1) if entries else None

    def trim_to_valid_size(self):
        self.resize(self.entries * self.ENTRY.size)

    def reset(self):
        """Drop every entry; the file is preallocated again (Kafka's reset)."""
        with self._file() as fd:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, self.max_index_size)
        self._length, self._reserved = self.max_index_size, 0
        self.entries = self._written = 0
        self._last = None
        self._pending.clear()
        self._pending_rows.clear()

    def _search(self, key, field=None):
        """``(index, entry)`` of the last entry whose key (or ``field``) is at most ``key``, or ``(-1, None)``."""
        field = self.KEY if field is None else field
        if self._last is not None and self._last[field] <= key:      # a reader at the tail: no search
            return self.entries - 1, self._last
        held = self._pending_rows
        if held and held[0][field] <= key:
            index = bisect.bisect_right(held, key, key=lambda row: row[field]) - 1
            return self._written + index, held[index]
        if not self._written:
            return -1, None
        at, width = self.FIELDS[field]
        index, entry = _core.index_floor(self._encoded_path, self._written, self.ENTRY.size, at, width, key)
        if index == -2:
            raise CorruptIndexError(f"{self.path}: shorter than its {self._written} entries")
        return (index, self.ENTRY.unpack(entry)) if index >= 0 else (-1, None)

    def _entry_at(self, n):
        if n >= self._written:
            return self._pending_rows[n - self._written]
        with self._file() as fd:
            return self._entry(fd, n)

    def _entries_array(self, dtype):
        """The entries as a numpy array, and the file's length."""
        self.write_pending()
        with self._file() as fd:
            data = os.pread(fd, self.entries * self.ENTRY.size, 0)
            length = os.fstat(fd).st_size
        return np.frombuffer(data, dtype=dtype), length

    def _check_length(self, length):
        if length % self.ENTRY.size:
            raise CorruptIndexError(f"{self.path}: length {length} is not a multiple of {self.ENTRY.size}")

    def flush(self):
        self.write_pending()
        with self._file() as fd:
            os.fsync(fd)


class OffsetIndex(_Index, _core.OffsetIndexCore):
    """Sparse map from offsets to positions in the segment file."""
    ENTRY = struct.Struct(">ii")
    KEY = 0
    FIELDS = ((0, 4), (4, 4))

    @property
    def last_offset(self):
        return self.base_offset + self._last[0] if self._last else self.base_offset

    def append(self, offset, position):
        self._append_now(self.entry(offset, position))

    def lookup(self, offset):
        """``(offset, position)`` of the last entry at or below ``offset``; ``(base, 0)`` if none."""
        _, entry = self._search(offset - self.base_offset)
        if entry is None:
            return self.base_offset, 0
        relative, position = entry
        return self.base_offset + relative, position

    def fetch_upper_bound_offset(self, position):
        """Kafka's ``fetchUpperBoundOffset``: the offset of the first entry at or past ``position`` in the
        segment file (no record read up to ``position`` is at or past it), or None."""
        index, _ = self._search(position - 1, field=1)
        if index + 1 >= self.entries:
            return None
        return self.base_offset + self._entry_at(index + 1)[0]

    def sanity_check(self, segment_size):
        entries, length = self._entries_array([("offset", ">i4"), ("position", ">i4")])
        self._check_length(length)
        if not len(entries):
            return
        if entries["offset"][0] < 0 or (np.diff(entries["offset"]) <= 0).any():
            raise CorruptIndexError(f"{self.path}: offsets are not increasing from the base offset")
        if (np.diff(entries["position"]) <= 0).any() or entries["position"][-1] >= segment_size:
            raise CorruptIndexError(f"{self.path}: positions are not increasing inside the segment "
                                    f"of {segment_size} bytes")


class TimeIndex(_Index, _core.TimeIndexCore):
    """Sparse map from timestamps to offsets: an entry each time the segment's largest timestamp grew."""
    ENTRY = struct.Struct(">qi")
    KEY = 0
    FIELDS = ((0, 8), (8, 4))

    @property
    def last_entry(self):
        """``(timestamp, offset)`` of the last entry; ``(-1, base offset)`` when empty (Kafka's)."""
        if self._last is None:
            return NO_TIMESTAMP, self.base_offset
        return self._last[0], self.base_offset + self._last[1]

    def maybe_append(self, timestamp, offset, skip_full_check=False):
        """Append ``(timestamp, offset)`` if ``timestamp`` is above the last entry's (Kafka's maybeAppend)."""
        entry = self.maybe_entry(timestamp, offset, skip_full_check)
        if entry is not None:
            self._append_now(entry)

    def lookup(self, timestamp):
        """``(timestamp, offset)`` of the last entry at or below ``timestamp``; ``(-1, base)`` if none."""
        _, entry = self._search(timestamp)
        if entry is None:
            return NO_TIMESTAMP, self.base_offset
        stamp, relative = entry
        return stamp, self.base_offset + relative

    def sanity_check(self, next_offset):
        entries, length = self._entries_array([("timestamp", ">i8"), ("offset", ">i4")])
        self._check_length(length)
        if not len(entries):
            return
        if (np.diff(entries["timestamp"]) <= 0).any():
            raise CorruptIndexError(f"{self.path}: timestamps are not increasing")
        if entries["offset"][0] < 0 or (np.diff(entries["offset"]) < 0).any() \
                or self.base_offset + int(entries["offset"][-1]) >= max(next_offset, self.base_offset + 1):
            raise CorruptIndexError(f"{self.path}: offsets are decreasing or past the segment's end {next_offset}")
