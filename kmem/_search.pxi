# Lookups in producer-state snapshot entries (Kafka layout, KIP-1044 ledger).
#
# A snapshot is `version i16 | crc u32 | count i32` then `count` entries of 46 bytes, each starting with
# the big-endian producer id. Sorted files (kmem writes them so) are searched in two steps: `fences`
# (every stride-th id, in the heap) pick the stride, then `block_search` the stride's entries. Files
# in Kafka's hash-map order are searched through `order`, a permutation of rows sorted by id. The
# active ledger file is unsorted and found through `RowTable`, an open-addressing table of row numbers
# keyed by the id (the id itself is read back from the entry, so a slot costs 4 bytes).

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

DEF SNAPSHOT_HEADER = 10
DEF ENTRY_SIZE = 46


cdef inline int64_t row_pid(const uint8_t* entries, Py_ssize_t row) noexcept nogil:
    """The producer id of entry ``row``; ``entries`` points at the first entry (after any header)."""
    cdef uint64_t raw
    memcpy(&raw, entries + row * ENTRY_SIZE, 8)
    return <int64_t>kmem_bswap64(raw)


# The entry's fields: byte offsets, sizes and the smallest value each may hold (last_offset and
# current_txn_first_offset: -1 is Kafka's "none", lower values are refused by the ledger).
cdef Py_ssize_t[8] FIELD_AT = [0, 8, 10, 14, 22, 26, 34, 38]
cdef int[8] FIELD_SIZE = [8, 2, 4, 8, 4, 8, 4, 8]
DEF LAST_SEQUENCE = 2
DEF LAST_OFFSET = 3
DEF OFFSET_DELTA = 4
DEF TXN_FIRST_OFFSET = 7


cdef inline void store_be(uint8_t* p, int64_t value, int size) noexcept nogil:
    cdef int i
    for i in range(size - 1, -1, -1):
        p[i] = <uint8_t>(value & 0xFF)
        value >>= 8


cdef inline bint fits(int64_t value, int size) noexcept nogil:
    if size == 8:
        return True
    cdef int64_t limit = (<int64_t>1) << (8 * size - 1)
    return -limit <= value < limit


cdef int entry_fields(object entry, int64_t* fields) except -1:
    """The eight fields of a ProducerEntry (a tuple) as Kafka reads them back; 0, or 1 if the caller must
    refuse it (not 8 integers, a value out of its field's range, an offset below -1)."""
    if not isinstance(entry, tuple) or len(entry) != 8:
        return 1
    cdef int i
    for i in range(8):
        value = entry[i]
        if not isinstance(value, int) or isinstance(value, bool):
            return 1
        try:
            fields[i] = value
        except OverflowError:
            return 1
        if not fits(fields[i], FIELD_SIZE[i]):
            return 1
    if fields[LAST_OFFSET] < -1 or fields[TXN_FIRST_OFFSET] < -1:
        return 1
    if fields[LAST_OFFSET] == -1:          # no batch: Kafka reads sequence -1 and offset delta 0
        fields[LAST_SEQUENCE] = -1
        fields[OFFSET_DELTA] = 0
    return 0


cdef inline Py_ssize_t last_fence_at_most(const int64_t* fences, Py_ssize_t n, int64_t pid) noexcept nogil:
    """The position of the last fence <= pid, or -1 when pid is below them all."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = lo + ((hi - lo) >> 1)
        if fences[mid] <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


cdef int check_entries(const uint8_t[::1] data, Py_ssize_t count) except -1:
    if count < 0 or data.shape[0] < SNAPSHOT_HEADER + count * ENTRY_SIZE:
        raise ValueError(f"{count} entries do not fit {data.shape[0]} bytes")
    return 0


def snapshot_search(const uint8_t[::1] data, Py_ssize_t count, long long pid, const uint32_t[::1] order=None,
                    const int64_t[::1] fences=None, Py_ssize_t stride=0):
    """The row of ``pid`` among ``count`` entries sorted by id (directly, or through ``order``), or -1.

    ``fences`` (in the heap) hold the id at every ``stride``-th sorted position: searching them first
    narrows the search of the mapped file to one stride of entries, a page or two, so few pages of the
    mapping are touched.
    """
    check_entries(data, count)
    if order is not None and order.shape[0] != count:
        raise ValueError("order does not have one row per entry")
    if fences is not None and (stride < 1 or fences.shape[0] != (count + stride - 1) // stride):
        raise ValueError("fences do not match the entries")
    cdef const uint8_t* base = &data[0] + SNAPSHOT_HEADER
    cdef bint direct = order is None
    cdef Py_ssize_t lo = 0, hi = count, mid, row, result = -1
    cdef int64_t found
    with nogil:
        if fences is not None:
            lo = last_fence_at_most(&fences[0], fences.shape[0], pid) if fences.shape[0] else -1
            if lo < 0:
                hi = 0                  # below the first id
            else:
                lo = lo * stride
                hi = min(lo + stride, count)
        while lo < hi:
            mid = lo + ((hi - lo) >> 1)
            row = mid if direct else order[mid]
            if row >= count:        # a damaged order: never read outside the entries
                result = -2
                break
            found = row_pid(base, row)
            if found == pid:
                result = row
                break
            if found < pid:
                lo = mid + 1
            else:
                hi = mid
    if result == -2:
        raise ValueError(f"the order points outside the {count} entries")
    return result


def fence_block(const int64_t[::1] fences, long long pid):
    """Which stride of a sorted snapshot may hold ``pid``: the last fence <= pid, or -1."""
    if fences.shape[0] == 0:
        return -1
    return last_fence_at_most(&fences[0], fences.shape[0], pid)


def block_search(const uint8_t[::1] block, long long pid):
    """The position of ``pid`` among whole sorted entries in ``block`` (no header), or -1."""
    cdef Py_ssize_t lo = 0, hi = block.shape[0] // ENTRY_SIZE, mid
    cdef int64_t found
    if hi == 0:
        return -1
    cdef const uint8_t* entries = &block[0]
    while lo < hi:
        mid = lo + ((hi - lo) >> 1)
        found = row_pid(entries, mid)
        if found == pid:
            return mid
        if found < pid:
            lo = mid + 1
        else:
            hi = mid
    return -1


def snapshot_sorted(const uint8_t[::1] data, Py_ssize_t count, const uint32_t[::1] order=None):
    """Whether the ids are strictly increasing (directly, or through ``order``)."""
    check_entries(data, count)
    if order is not None and order.shape[0] != count:
        return False
    cdef const uint8_t* base = &data[0] + SNAPSHOT_HEADER
    cdef bint direct = order is None, ok = True
    cdef Py_ssize_t i, row
    cdef int64_t previous = 0, current
    with nogil:
        for i in range(count):
            row = i if direct else order[i]
            if row >= count:
                ok = False
                break
            current = row_pid(base, row)
            if i > 0 and current <= previous:
                ok = False
                break
            previous = current
    return ok


def snapshot_fences(const uint8_t[::1] data, Py_ssize_t count, Py_ssize_t stride, const uint32_t[::1] order=None):
    """The ids at sorted positions 0, stride, 2 stride, ... (for ``snapshot_search``), as an int64 array."""
    check_entries(data, count)
    if stride < 1 or (order is not None and order.shape[0] != count):
        raise ValueError("bad stride or order")
    import numpy
    out = numpy.empty((count + stride - 1) // stride, numpy.int64)
    cdef int64_t[::1] fences = out
    cdef Py_ssize_t b, row
    for b in range(fences.shape[0]):
        row = b * stride if order is None else order[b * stride]
        if row >= count:
            raise ValueError(f"the order points outside the {count} entries")
        fences[b] = row_pid(&data[0] + SNAPSHOT_HEADER, row)
    return out


@cython.final
cdef class RowTable:
    """Rows of an unsorted entry buffer by producer id: linear probing over 2^b slots of row + 1.

    The table never grows: the caller sizes it at twice the most rows it will hold (the active file's
    capacity), so probes stay short. Ids are read from the entries, which must outlive the calls.
    """
    cdef uint32_t[::1] slots
    cdef uint64_t mask
    cdef readonly Py_ssize_t size

    def __cinit__(self, Py_ssize_t max_rows):
        cdef uint64_t n = 16
        while n < <uint64_t>(2 * max_rows):
            n <<= 1
        import numpy
        self.slots = numpy.zeros(n, numpy.uint32)
        self.mask = n - 1
        self.size = 0

    cdef inline uint64_t probe_start(self, int64_t pid) noexcept nogil:
        cdef uint64_t h1, h2
        kmem_murmur3_pid(<uint64_t>pid, &h1, &h2)
        return h1 & self.mask

    def find(self, const uint8_t[::1] data, long long pid):
        """The row holding ``pid``, or -1."""
        cdef uint64_t s = self.probe_start(pid)
        cdef uint32_t v
        cdef Py_ssize_t limit = (data.shape[0] - SNAPSHOT_HEADER) // ENTRY_SIZE
        while True:
            v = self.slots[s]
            if v == 0:
                return -1
            if v - 1 >= limit:
                raise ValueError(f"row {v - 1} is outside the entries")
            if row_pid(&data[0] + SNAPSHOT_HEADER, v - 1) == pid:
                return v - 1
            s = (s + 1) & self.mask

    def insert_rows(self, const uint8_t[::1] data, Py_ssize_t count):
        """Index rows 0 .. count - 1 of an empty table; returns None, or the first id found twice."""
        check_entries(data, count)
        if self.size:
            raise ValueError("row table is not empty")
        if <uint64_t>(2 * count) > self.mask + 1:
            raise ValueError("row table is full")
        cdef const uint8_t* entries = &data[0] + SNAPSHOT_HEADER
        cdef Py_ssize_t row
        cdef int64_t pid
        cdef uint64_t s
        cdef uint32_t v
        for row in range(count):
            pid = row_pid(entries, row)
            s = self.probe_start(pid)
            while True:
                v = self.slots[s]
                if v == 0:
                    break
                if row_pid(entries, v - 1) == pid:
                    return pid
                s = (s + 1) & self.mask
            self.slots[s] = <uint32_t>(row + 1)
            self.size += 1
        return None

    def insert(self, long long pid, uint32_t row):
        """Record that ``row`` holds ``pid`` (not present yet)."""
        if <uint64_t>(2 * (self.size + 1)) > self.mask + 1:
            raise ValueError("row table is full")
        cdef uint64_t s = self.probe_start(pid)
        while self.slots[s] != 0:
            s = (s + 1) & self.mask
        self.slots[s] = row + 1
        self.size += 1

    cdef Py_ssize_t upsert_row(self, uint8_t* entries, Py_ssize_t count, Py_ssize_t rows, int64_t pid) noexcept nogil:
        """The row holding ``pid``, else ``count`` (now recorded as its row) if ``count < rows``, else -1."""
        cdef uint64_t s = self.probe_start(pid)
        cdef uint32_t v
        while True:
            v = self.slots[s]
            if v == 0:
                break
            if row_pid(entries, v - 1) == pid:
                return v - 1
            s = (s + 1) & self.mask
        if count >= rows:
            return -1
        self.slots[s] = <uint32_t>(count + 1)
        self.size += 1
        return count

    cdef int check_rows(self, const uint8_t[::1] data, Py_ssize_t count) except -1:
        check_entries(data, count)
        if <uint64_t>(2 * ((data.shape[0] - SNAPSHOT_HEADER) // ENTRY_SIZE)) > self.mask + 1:
            raise ValueError("the row table is smaller than the entries")
        return 0

    def put(self, uint8_t[::1] data, entry, Py_ssize_t count):
        """Write ``entry`` (a ProducerEntry) into its row, or a new row ``count`` (then the header's count
        becomes count + 1, after the row). Returns the row; -1 if a new row is needed but the buffer is
        full; -2 if the entry must be refused (the caller says why)."""
        self.check_rows(data, count)
        cdef int64_t fields[8]
        if entry_fields(entry, fields):
            return -2
        cdef uint8_t* entries = &data[0] + SNAPSHOT_HEADER
        cdef Py_ssize_t rows = (data.shape[0] - SNAPSHOT_HEADER) // ENTRY_SIZE
        cdef Py_ssize_t row = self.upsert_row(entries, count, rows, fields[0])
        if row < 0:
            return -1
        cdef int i
        for i in range(8):
            store_be(entries + row * ENTRY_SIZE + FIELD_AT[i], fields[i], FIELD_SIZE[i])
        if row == count:
            store_be(&data[6], count + 1, 4)          # the row becomes visible only now
        return row

    def put_many(self, uint8_t[::1] data, const uint8_t[::1] batch, Py_ssize_t count, Py_ssize_t max_count):
        """``put`` for each entry of ``batch`` (entries in the file layout, checked by the caller), in
        order, until one more would need a row past ``max_count`` (at most the buffer's rows).

        Returns (entries consumed, new count); the header's count is written after each new row."""
        self.check_rows(data, count)
        cdef Py_ssize_t rows = (data.shape[0] - SNAPSHOT_HEADER) // ENTRY_SIZE
        if max_count > rows:
            max_count = rows
        cdef Py_ssize_t n = batch.shape[0] // ENTRY_SIZE, i = 0, row
        cdef uint8_t* entries = &data[0] + SNAPSHOT_HEADER
        cdef const uint8_t* source
        if n == 0:
            return 0, count
        with nogil:
            while i < n:
                source = &batch[0] + i * ENTRY_SIZE
                row = self.upsert_row(entries, count, max_count, row_pid(source, 0))
                if row < 0:
                    break
                memcpy(entries + row * ENTRY_SIZE, source, ENTRY_SIZE)
                if row == count:
                    count += 1
                    store_be(&data[6], count, 4)
                i += 1
        return i, count

    def find_many(self, const uint8_t[::1] data, const int64_t[::1] pids, int64_t[::1] rows_out):
        """``find`` for each id: rows_out[i] = its row, or -1."""
        if rows_out.shape[0] != pids.shape[0]:
            raise ValueError("one output row per id")
        cdef Py_ssize_t limit = (data.shape[0] - SNAPSHOT_HEADER) // ENTRY_SIZE, i, found = 0
        if limit < 0 or pids.shape[0] == 0:
            rows_out[:] = -1
            return 0
        cdef const uint8_t* entries = &data[0] + SNAPSHOT_HEADER
        cdef uint64_t s
        cdef uint32_t v
        cdef bint bad = False
        with nogil:
            for i in range(pids.shape[0]):
                rows_out[i] = -1
                s = self.probe_start(pids[i])
                while True:
                    v = self.slots[s]
                    if v == 0:
                        break
                    if v - 1 >= limit:
                        bad = True
                        break
                    if row_pid(entries, v - 1) == pids[i]:
                        rows_out[i] = v - 1
                        found += 1
                        break
                    s = (s + 1) & self.mask
        if bad:
            raise ValueError("a row is outside the entries")
        return found


def snapshot_search_many(const uint8_t[::1] data, Py_ssize_t count, const int64_t[::1] pids,
                         int64_t[::1] rows_out, const uint32_t[::1] order=None):
    """``snapshot_search`` for each id whose rows_out[i] is -1 (others are left): its row, or -1 still."""
    check_entries(data, count)
    if rows_out.shape[0] != pids.shape[0]:
        raise ValueError("one output row per id")
    if order is not None and order.shape[0] != count:
        raise ValueError("order does not have one row per entry")
    cdef const uint8_t* base = &data[0] + SNAPSHOT_HEADER
    cdef bint direct = order is None, bad = False
    cdef Py_ssize_t i, lo, hi, mid, row, found = 0
    cdef int64_t at, pid
    with nogil:
        for i in range(pids.shape[0]):
            if rows_out[i] != -1:
                continue
            pid = pids[i]
            lo = 0
            hi = count
            while lo < hi:
                mid = lo + ((hi - lo) >> 1)
                row = mid if direct else order[mid]
                if row >= count:
                    bad = True
                    break
                at = row_pid(base, row)
                if at == pid:
                    rows_out[i] = row
                    found += 1
                    break
                if at < pid:
                    lo = mid + 1
                else:
                    hi = mid
            if bad:
                break
    if bad:
        raise ValueError(f"the order points outside the {count} entries")
    return found
