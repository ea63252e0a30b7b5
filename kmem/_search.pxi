# Lookups in producer-state snapshot entries (Kafka layout, KIP-1044 ledger).
#
# A snapshot is `version i16 | crc u32 | count i32` then `count` entries of 46 bytes, each starting with
# the big-endian producer id. Sorted files (kmem writes them so) are searched in two steps: `fences`
# (every stride-th id, in the heap) pick the stride, then `block_search` the stride's entries. Files
# in Kafka's hash-map order are searched through `order`, a permutation of rows sorted by id. The
# active ledger file is unsorted and found through `RowTable`, an open-addressing table of row numbers
# keyed by the id (the id itself is read back from the entry, so a slot costs 4 bytes).

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

DEF SNAPSHOT_HEADER = 10
DEF ENTRY_SIZE = 46


cdef inline int64_t row_pid(const uint8_t* entries, Py_ssize_t row) noexcept nogil:
    """The producer id of entry ``row``; ``entries`` points at the first entry (after any header)."""
    cdef uint64_t raw
    memcpy(&raw, entries + row * ENTRY_SIZE, 8)
    return <int64_t>kmem_bswap64(raw)


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
