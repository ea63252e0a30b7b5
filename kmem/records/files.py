"""Kafka log segment files: ``FileRecords`` reads a slice of a ``<20-digit base offset>.log`` file
without loading it, and sends it (``to_send``) as a file region when no conversion is needed.
"""
import os
import re
import struct
from typing import NamedTuple

from kmem import _core
from kmem.errors import CorruptRecordError, InvalidArgumentError
from kmem.records.arguments import byte_view, check_int, check_long
from kmem.records.batches import INT64_MAX, LOG_OVERHEAD, MemoryRecords, RecordBatch
from kmem.send import FileRegionSend, as_transport

SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
READ_SIZE = 1 << 20     # bytes read per system call while iterating batches


def segment_file_name(base_offset):
    """Kafka's log segment name: the base offset zero-padded to 20 digits, then ``.log``."""
    return f"{check_int('base_offset', base_offset, 0, INT64_MAX):020d}.log"


def log_segments(directory):
    """``(base offset, path)`` of every segment in a partition directory (``<topic>-<partition>``),
    in offset order."""
    found = []
    for name in os.listdir(directory):
        match = SEGMENT_NAME.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def read_entries(source, position, max_read):
    """``(view, end position)`` of the complete entries of ``source`` (anything with ``read`` and
    ``size_in_bytes``) from ``position`` that fit in ``max_read`` bytes, or of the first entry alone when it
    is larger; None when no complete entry is left (a truncated trailing entry is ignored, as Kafka does).
    A corrupt entry (``CorruptRecordError``) is raised only once every entry before it was returned."""
    window = byte_view("data", source.read(position, max(max_read, LOG_OVERHEAD)))
    end = 0
    base = getattr(source, "start", 0) + position      # errors name the position in the file
    try:
        while (entry := _core.entry_at(window, end, base)) is not None:
            end += entry[0]
    except CorruptRecordError:
        if end == 0:
            raise
        # The entries before the bad one are returned; the next read starts at the bad one and raises.
    if end == 0:        # the first entry is larger than the window, or truncated
        if len(window) < LOG_OVERHEAD:
            return None
        total = LOG_OVERHEAD + struct.unpack_from(">i", window, 8)[0]
        if total > source.size_in_bytes - position:
            return None     # truncated: its declared size is not read (it may claim up to 2 GiB)
        window = byte_view("data", source.read(position, total))
        if _core.entry_at(window, 0) is None:
            return None
        end = total
    return window[:end], position + end


def write_once(channel, data):
    """One write of ``data`` to a transport, a socket (``send``) or any object with ``write``; 0 when it
    would block."""
    return as_transport(channel).write([memoryview(data)])


def _check_position(position, records):
    if isinstance(position, int) and not isinstance(position, bool) and position < 0:
        raise InvalidArgumentError(f"negative position {position} in {records!r}")
    check_int("position", position, 0, INT64_MAX)


class LogOffsetPosition(NamedTuple):
    """Where ``FileRecords.search_for_offset`` found a batch: its last offset, position and size."""
    offset: int
    position: int
    size: int


class FileRecords:
    """The bytes ``[start, end)`` of a log segment file, opened read-only.

    Iterating yields ``RecordBatch`` views (``position`` is the byte position in the file) without
    reading more than ``READ_SIZE`` (or one batch, if larger) at a time; a truncated trailing batch is
    ignored as Kafka does. ``slice`` shares the open file (close the original last). Use as a context
    manager or call ``close``.
    """

    def __init__(self, path, start=0, end=None, *, _fd=None, _file_size=None):
        self._owner, self._fd = False, None     # so that __del__ has nothing to close when a check fails
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise InvalidArgumentError(f"path must be a str or os.PathLike, not {type(path).__name__}") from None
        check_int("start", start, 0, INT64_MAX)
        if end is not None:
            check_int("end", end, 0, INT64_MAX)
        self._owner = _fd is None
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)) if _fd is None else _fd
        file_size = os.fstat(self._fd).st_size if _file_size is None else _file_size
        end = file_size if end is None else min(end, file_size)
        if not 0 <= start <= end:
            self.close()
            raise InvalidArgumentError(f"invalid slice [{start}, {end}) of {self.path} ({file_size} bytes)")
        self.start, self.end = start, end

    @classmethod
    def of_descriptor(cls, fd, path, start=0, end=None, *, file_size=None):
        """The records ``[start, end)`` of the file at ``path`` open as ``fd``, which they then own and close
        (also when the slice is refused): for a duplicate of a descriptor kept open, cheaper than opening the
        path again. ``file_size``: the file's size when the caller knows it (a segment it appends to), which
        spares an ``fstat``."""
        try:
            if file_size is not None:
                check_int("file_size", file_size, 0, INT64_MAX)
            records = cls(path, start, end, _fd=fd, _file_size=file_size)
        except BaseException:
            os.close(fd)
            raise
        records._owner = True
        return records

    @classmethod
    def open_segment(cls, directory, base_offset):
        return cls(os.path.join(directory, segment_file_name(base_offset)))

    def close(self):
        if self._owner and self._fd is not None:
            os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def __repr__(self):
        return f"<FileRecords {self.path} [{self.start}, {self.end})>"

    @property
    def size_in_bytes(self):
        return self.end - self.start

    def __len__(self):
        return self.size_in_bytes

    def fileno(self):
        return self._fd

    def slice(self, position, size=None):
        """The records ``[position, position + size)`` of this slice (positions relative to it)."""
        check_int("position", position, 0, INT64_MAX)
        if size is not None:
            check_int("size", size, 0, INT64_MAX)
        if position > self.size_in_bytes:
            raise InvalidArgumentError(f"invalid slice position {position} / size {size} of {self!r}")
        end = self.end if size is None else min(self.end, self.start + position + size)
        return FileRecords(self.path, self.start + position, end, _fd=self._fd)

    def read(self, position, size):
        """Up to ``size`` bytes from ``position`` (relative to the slice), never past its end."""
        _check_position(position, self)
        check_int("size", size, 0, INT64_MAX)
        size = max(0, min(size, self.size_in_bytes - position))
        return os.pread(self._fd, size, self.start + position) if size else b""

    def read_all(self):
        """The whole slice in memory, as ``MemoryRecords``."""
        return MemoryRecords(self.read(0, self.size_in_bytes))

    def __iter__(self):
        return self.batches()

    def batches(self, position=0):
        """``RecordBatch`` views from ``position`` (relative to the slice) on."""
        _check_position(position, self)
        return self._batches(position)

    def _batches(self, position):
        while (span := read_entries(self, position, READ_SIZE)) is not None:
            window, end = span
            pos = 0
            while pos < len(window):
                size, magic = _core.entry_at(window, pos)
                yield RecordBatch(window, pos, size, magic, self.start + position + pos)
                pos += size
            position = end

    def records(self):
        for batch in self.batches():
            yield from batch

    def search_for_offset(self, target_offset, starting_position=0):
        """The first batch at or after ``starting_position`` whose last offset is at least
        ``target_offset`` (Kafka's searchForOffsetWithSize), or None."""
        check_long("target_offset", target_offset)
        for batch in self.batches(starting_position):
            if batch.last_offset >= target_offset:
                return LogOffsetPosition(batch.last_offset, batch.file_position - self.start, batch.size_in_bytes)
        return None

    def to_send(self, position=0, length=None):
        """A ``FileRegionSend`` of up to ``length`` bytes from ``position`` (relative to the slice; to its
        end by default): the transport it is written to chooses ``os.sendfile`` (a plain socket) or
        bounded copies (TLS). It keeps its own descriptor: this object may be closed meanwhile."""
        _check_position(position, self)
        available = max(0, self.size_in_bytes - position)
        length = available if length is None else max(0, min(length, available))
        return FileRegionSend(self._fd, self.start + position, length)

    def into_send(self):
        """A ``FileRegionSend`` of the whole slice that takes over this object's own descriptor (no duplicate
        made); this object is closed. Records sharing another's descriptor (``slice``) make a ``to_send``."""
        if not self._owner or self._fd is None:
            return self.to_send()
        fd, self._fd = self._fd, None
        return FileRegionSend(fd, self.start, self.size_in_bytes, _adopt=True)

    def write_to(self, channel, position, length):
        """Send up to ``length`` bytes from ``position`` (relative to the slice); one write, returns the
        bytes written (0 when a non-blocking channel is full). ``channel``: a transport, a plain socket
        (``os.sendfile``, zero-copy), or a TLS socket or object with ``write`` (copies of at most
        ``kmem.send.COPY_CHUNK`` bytes). A shorthand for ``to_send(position, length).write_to(channel)``:
        keep the send to resume partial writes."""
        return self.to_send(position, length).write_to(channel)
