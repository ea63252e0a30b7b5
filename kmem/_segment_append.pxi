# A segment's append in one call: the batches' write and the index entries it makes (Kafka's LogSegment.append
# with OffsetIndex.append and TimeIndex.maybeAppend). The state an append changes lives in these classes, which
# kmem.broker.log.segment and kmem.broker.log.index subclass; Python keeps the files' other uses and the rare
# steps this calls back into (reserving blocks ahead, the error an out-of-place offset raises).


cdef inline bint _relative_fits(int64_t offset, int64_t base_offset) noexcept:
    # an offset a segment based at ``base_offset`` (never negative) and its indexes can hold: relative to the
    # base, an int32 (compared first, so that no subtraction overflows)
    return offset >= base_offset and offset - base_offset <= 0x7FFFFFFF


cdef class IndexCore:
    """An index's entries as its appends change them: their count, those written to the file (``_written``),
    those held after them (``_pending``, their rows in ``_pending_rows``) until they would pass
    ``pending_bytes``, the bytes from the file's start
    known to have blocks (``_reserved``) of its ``_length``, and its last entry's row (``_last``, or None)."""
    cdef public bytes _encoded_path
    cdef public int64_t base_offset, max_entries, entries, _written, _reserved, _length, pending_bytes
    cdef public object _last
    cdef public bytearray _pending
    cdef public list _pending_rows
    cdef readonly int entry_size

    @property
    def is_full(self):
        return self.entries >= self.max_entries

    cdef tuple _row(self, const unsigned char* p):
        raise NotImplementedError

    cpdef tuple _write_with(self, bytes entry):
        """The write of the entries held and then ``entry``, ``(path, bytes, position in the file)`` as
        ``_core.write_at`` and ``_core.append_segment`` take it."""
        return self._encoded_path, bytes(self._pending) + entry, self._written * self.entry_size

    cdef object _due_write(self, bytes entry):
        # The write an append adding ``entry`` makes (once the entries held would pass ``pending_bytes``),
        # or None when ``entry`` is only held: its blocks are reserved first (OSError on a full disk).
        cdef int64_t end
        if len(self._pending) + len(entry) > self.pending_bytes:
            return self._write_with(entry)
        end = (self.entries + 1) * self.entry_size
        if self._reserved < end <= self._length:
            (<object>self)._reserve(end)
        return None

    cpdef appended(self, bytes entry, bint written):
        """``entry`` is the index's last: ``written`` with the entries held, else held."""
        if len(entry) != self.entry_size:
            raise ValueError(f"an entry of this index has {self.entry_size} bytes, not {len(entry)}")
        row = self._row(entry)
        self.entries += 1
        self._last = row
        if written:
            self._all_written()
        else:
            self._pending.extend(entry)
            self._pending_rows.append(row)

    cpdef _all_written(self):
        self._written = self.entries
        self._reserved = max(self._reserved, self.entries * self.entry_size)
        del self._pending[:]
        del self._pending_rows[:]

    cdef object _corrupt(self, str message):
        from kmem.errors import CorruptIndexError
        return CorruptIndexError(f"{(<object>self).path}: {message}")


cdef class OffsetIndexCore(IndexCore):
    """The offset index's entries: ``relative offset i32 | file position i32``, offsets increasing."""

    def __cinit__(self, *args, **kwargs):
        self.entry_size = 8

    cdef tuple _row(self, const unsigned char* p):
        return be32(p), be32(p + 4)

    cpdef bytes entry(self, int64_t offset, int64_t position):
        """The entry an append of ``offset`` at ``position`` makes, checked: to write (``_due_write``) and
        report (``appended``)."""
        cdef unsigned char row[8]
        if self.entries >= self.max_entries:
            raise self._corrupt(f"attempt to append to a full index ({self.entries} entries)")
        if self._last is not None and offset <= self.base_offset + self._last[0]:
            raise self._corrupt(f"offset {offset} is not above the last indexed offset "
                                f"{self.base_offset + self._last[0]}")
        if not _relative_fits(offset, self.base_offset) or not 0 <= position <= 0x7FFFFFFF:
            raise self._corrupt(f"offset {offset} at position {position} does not fit an entry")
        put32(row, offset - self.base_offset)
        put32(row + 4, position)
        return PyBytes_FromStringAndSize(<char*>row, 8)


cdef class TimeIndexCore(IndexCore):
    """The time index's entries: ``timestamp i64 | relative offset i32``, an entry only when the segment's
    largest timestamp grew."""

    def __cinit__(self, *args, **kwargs):
        self.entry_size = 12

    cdef tuple _row(self, const unsigned char* p):
        return be64(p), be32(p + 8)

    cpdef object maybe_entry(self, int64_t timestamp, int64_t offset, bint skip_full_check=False):
        """The entry Kafka's ``maybeAppend`` makes for ``(timestamp, offset)``, checked, or None when
        ``timestamp`` is not above the last entry's."""
        cdef unsigned char row[12]
        if not skip_full_check and self.entries >= self.max_entries:
            raise self._corrupt("attempt to append to a full time index")
        if self._last is not None and offset < self.base_offset + self._last[1]:
            raise self._corrupt(f"offset {offset} is below the last indexed offset {self.base_offset + self._last[1]}")
        if timestamp <= (-1 if self._last is None else self._last[0]):
            return None
        if not _relative_fits(offset, self.base_offset):
            raise self._corrupt(f"offset {offset} does not fit an entry")
        put64(row, timestamp)
        put32(row + 8, offset - self.base_offset)
        return PyBytes_FromStringAndSize(<char*>row, 12)


cdef class SegmentCore:
    """A segment's state as its appends change it: its ``size`` and ``next_offset``, its largest timestamp and
    that record's offset, the bytes appended since its last index entry, where the last append began
    (``_last_append``, ``(offset, position)`` or None), the blocks reserved past its end (``_reserved_to``) and
    the end past which an append reserves more (``_reserve_at``), and its ``.log`` open as ``_fd`` (None for an
    older segment)."""
    cdef public object _fd, rolling_based_timestamp, _last_append
    cdef public int64_t base_offset, size, next_offset, max_timestamp_so_far, offset_of_max_timestamp
    cdef public int64_t bytes_since_last_index_entry, _reserved_to, _reserve_at
    cdef public OffsetIndexCore offset_index
    cdef public TimeIndexCore time_index

    def can_convert_to_relative_offset(self, int64_t offset):
        return _relative_fits(offset, self.base_offset)

    def append(self, int64_t largest_offset, int64_t largest_timestamp, int64_t offset_of_max_timestamp,
               pieces):
        """Write ``pieces`` (bytes-like views of whole batches, in order) at the end of the segment, with the
        index entries due once more than ``index.interval.bytes`` were appended since the last.

        All or nothing: when a write fails (a full disk), the file and both indexes are left as they were
        and the ``OSError`` is raised."""
        cdef Py_ssize_t size = 0
        cdef int64_t position = self.size, max_timestamp, offset_of_max
        cdef bint index_due
        cdef bytes offset_entry = None
        cdef object time_entry = None, offset_write = None, time_write = None
        for piece in pieces:
            size += len(piece)
        if not size:
            return
        if not _relative_fits(largest_offset, self.base_offset):
            from kmem.errors import CorruptIndexError
            raise CorruptIndexError(f"{(<object>self).log_path}: offset {largest_offset} does not fit this segment")
        if position + size > self._reserve_at:
            (<object>self)._reserve_ahead(position + size)
        max_timestamp, offset_of_max = self.max_timestamp_so_far, self.offset_of_max_timestamp
        if largest_timestamp > max_timestamp:
            max_timestamp, offset_of_max = largest_timestamp, offset_of_max_timestamp
        index_due = self.bytes_since_last_index_entry > (<object>self).config.index_interval_bytes
        writes = []
        if index_due:
            offset_entry = self.offset_index.entry(largest_offset, position)
            time_entry = self.time_index.maybe_entry(max_timestamp, offset_of_max)
            offset_write = self.offset_index._due_write(offset_entry)
            if time_entry is not None:
                time_write = self.time_index._due_write(time_entry)
            if offset_write is not None:
                writes.append(offset_write)
            if time_write is not None:
                writes.append(time_write)
        try:
            # the batches, then the entries due; on a failure the file is cut back and the indexes unchanged
            _append_segment(self._fd, pieces, position, writes)
        except OSError:
            (<object>self)._write_failed(position)
            raise
        if index_due:
            self.offset_index.appended(offset_entry, offset_write is not None)
            if time_entry is not None:
                self.time_index.appended(time_entry, time_write is not None)
        if position == 0:
            self.rolling_based_timestamp = largest_timestamp
        self._last_append = (self.next_offset, position)
        self.size += size
        self.next_offset = largest_offset + 1
        self.max_timestamp_so_far, self.offset_of_max_timestamp = max_timestamp, offset_of_max
        self.bytes_since_last_index_entry = size if index_due else self.bytes_since_last_index_entry + size
