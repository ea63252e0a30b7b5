# Lookups in producer-state snapshot entries (Kafka layout, KIP-1044 ledger).
#
# A snapshot is `version i16 | crc u32 | count i32` then `count` entries of 46 bytes, each starting with
# the big-endian producer id. Sorted files (kmem writes them so) are searched in two steps: `fences`
# (every stride-th id, in the heap) pick the stride, then `sorted_snapshot_find` reads and searches it. Files
# in Kafka's hash-map order are searched through `order`, a permutation of rows sorted by id. The
# active ledger file is unsorted and found through `RowTable`, an open-addressing table of row numbers
# keyed by the id (the id itself is read back from the entry, so a slot costs 4 bytes).

from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy
from libc.errno cimport errno
from posix.unistd cimport pread

cdef extern from "Python.h":
    PyObject* PyTuple_GET_ITEM(object, Py_ssize_t)      # borrowed
    bint PyLong_CheckExact(PyObject*)
    long long PyLong_AsLongLongAndOverflow(PyObject*, int*) except? -1
    void prefetch_slot "__builtin_prefetch"(const void* p, int rw) nogil

cdef enum:
    SNAPSHOT_HEADER = 10
    ENTRY_SIZE = 46


cdef inline int64_t row_pid(const uint8_t* entries, Py_ssize_t row) noexcept nogil:
    """The producer id of entry ``row``; ``entries`` points at the first entry (after any header)."""
    cdef uint64_t raw
    memcpy(&raw, entries + row * ENTRY_SIZE, 8)
    return <int64_t>kmem_bswap64(raw)


# The entry's fields: byte offsets, sizes and the smallest value each may hold (last_offset and
# current_txn_first_offset: -1 is Kafka's "none", lower values are refused by the ledger).
cdef Py_ssize_t[8] FIELD_AT = [0, 8, 10, 14, 22, 26, 34, 38]
cdef int[8] FIELD_SIZE = [8, 2, 4, 8, 4, 8, 4, 8]
cdef enum:
    LAST_SEQUENCE = 2
    LAST_OFFSET = 3
    OFFSET_DELTA = 4
    TXN_FIRST_OFFSET = 7


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
    refuse it (not 8 ints, a value out of its field's range, an offset below -1)."""
    if not isinstance(entry, tuple) or len(entry) != 8:
        return 1
    cdef int i, overflow
    cdef PyObject* item
    for i in range(8):
        item = PyTuple_GET_ITEM(entry, i)
        if not PyLong_CheckExact(item):                  # bool and other int subclasses too
            return 1
        fields[i] = PyLong_AsLongLongAndOverflow(item, &overflow)
        if overflow or not fits(fields[i], FIELD_SIZE[i]):
            return 1
    if fields[LAST_OFFSET] < -1 or fields[TXN_FIRST_OFFSET] < -1:
        return 1
    if fields[LAST_OFFSET] == -1:          # no batch: Kafka reads sequence -1 and offset delta 0
        fields[LAST_SEQUENCE] = -1
        fields[OFFSET_DELTA] = 0
    return 0


cdef inline int64_t load_be(const uint8_t* p, int size) noexcept nogil:
    cdef uint64_t value = 0
    cdef int i
    for i in range(size):
        value = (value << 8) | p[i]
    if size < 8 and value >> (8 * size - 1):        # sign-extend
        value |= (<uint64_t>-1) << (8 * size)
    return <int64_t>value


cdef object producer_entry_at(const uint8_t* p, object cls):
    """The entry at ``p`` as a ``cls`` (ProducerEntry) tuple, as Kafka reads it back (``kafka_view``)."""
    cdef int64_t fields[8]
    cdef int i
    for i in range(8):
        fields[i] = load_be(p + FIELD_AT[i], FIELD_SIZE[i])
    if fields[LAST_OFFSET] < 0:
        fields[LAST_SEQUENCE] = -1
        fields[LAST_OFFSET] = -1
        fields[OFFSET_DELTA] = 0
    if fields[TXN_FIRST_OFFSET] < -1:
        fields[TXN_FIRST_OFFSET] = -1
    return tuple.__new__(cls, (fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], fields[6],
                               fields[7]))


cdef enum:
    MAX_STRIDE = 128
    PREFETCH_AHEAD = 8


def sorted_snapshot_find(int fd, Py_ssize_t count, const int64_t[::1] fences, Py_ssize_t stride, long long pid,
                         cls):
    """The entry of ``pid`` (a ``cls``, as ``producer_entry_at``) in a sorted snapshot file, or None: the fences
    pick the stride, one ``pread`` of it, a binary search. False if the file is shorter than ``count``
    entries (it shrank)."""
    if stride < 1 or stride > MAX_STRIDE or fences.shape[0] != (count + stride - 1) // stride:
        raise ValueError("fences do not match the entries")
    if fences.shape[0] == 0:
        return None
    cdef uint8_t block[MAX_STRIDE * ENTRY_SIZE]
    cdef Py_ssize_t first, size, got, lo, hi, mid
    cdef int64_t found
    with nogil:
        first = last_fence_at_most(&fences[0], fences.shape[0], pid)
        if first >= 0:
            first *= stride
            size = min(stride, count - first) * ENTRY_SIZE
            got = pread(fd, block, size, SNAPSHOT_HEADER + first * ENTRY_SIZE)
    if first < 0:
        return None
    if got < 0:
        raise OSError(errno, "pread of a snapshot failed")
    if got != size:
        return False
    lo, hi = 0, size // ENTRY_SIZE
    while lo < hi:
        mid = lo + ((hi - lo) >> 1)
        found = row_pid(block, mid)
        if found == pid:
            return producer_entry_at(block + mid * ENTRY_SIZE, cls)
        if found < pid:
            lo = mid + 1
        else:
            hi = mid
    return None


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
    rows; a file that grows gets a new table), so probes stay short. Ids are read from the entries: the
    buffer is bound once (``bind``) and the per-entry calls work on it.
    """
    cdef uint32_t[::1] slots
    cdef uint64_t mask
    cdef readonly Py_ssize_t size      # rows indexed: rows 0 .. size - 1
    cdef const uint8_t[::1] bound      # the buffer put/put_many/find_many work on (see bind)
    cdef bint writable
    cdef Py_ssize_t rows               # whole rows in it
    cdef Py_ssize_t limit              # put adds no row at or past this count (see set_limit)

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

    def get(self, long long pid, cls):
        """The entry of ``pid`` in the bound buffer (a ``cls``, as ``producer_entry_at``), or None."""
        cdef Py_ssize_t row = self.find(pid)
        return None if row < 0 else producer_entry_at(&self.bound[0] + SNAPSHOT_HEADER + row * ENTRY_SIZE, cls)

    cpdef Py_ssize_t find(self, long long pid) except -2:
        """The bound buffer's row holding ``pid``, or -1."""
        self.check_bound()
        cdef uint64_t s = self.probe_start(pid)
        cdef uint32_t v
        cdef const uint8_t* entries = &self.bound[0] + SNAPSHOT_HEADER
        while True:
            v = self.slots[s]
            if v == 0:
                return -1
            if row_pid(entries, v - 1) == pid:          # rows < size <= the bound rows
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

    cdef Py_ssize_t upsert_row(self, int64_t pid, Py_ssize_t max_count) noexcept nogil:
        """The bound buffer's row holding ``pid``, else a new row (recorded here) if fewer than
        ``max_count`` are in use, else -1."""
        cdef const uint8_t* entries = &self.bound[0] + SNAPSHOT_HEADER
        cdef uint64_t s = self.probe_start(pid)
        cdef uint32_t v
        cdef Py_ssize_t row
        while True:
            v = self.slots[s]
            if v == 0:
                break
            if row_pid(entries, v - 1) == pid:
                return v - 1
            s = (s + 1) & self.mask
        if self.size >= max_count:
            return -1
        row = self.size
        self.slots[s] = <uint32_t>(row + 1)
        self.size += 1
        return row

    def bind(self, buffer, bint writable):
        """Keep ``data`` (the mapped file whose first ``size`` rows this table indexes) for ``find``,
        ``get``, ``find_many`` and, if ``writable``, ``put`` and ``put_many``, so those calls do not take
        the buffer each time. ``unbind`` lets the mapping close."""
        cdef const uint8_t[::1] data = buffer
        cdef uint8_t[::1] must_be_writable
        if writable:
            must_be_writable = buffer               # BufferError if it is not
        check_entries(data, self.size)
        cdef Py_ssize_t rows = (data.shape[0] - SNAPSHOT_HEADER) // ENTRY_SIZE
        if <uint64_t>(2 * rows) > self.mask + 1:
            raise ValueError("the row table is smaller than the entries")
        self.bound = data
        self.writable = writable
        self.rows = rows
        self.limit = rows

    def unbind(self):
        self.bound = None
        self.rows = self.limit = 0

    def set_limit(self, Py_ssize_t limit):
        """``put`` returns -1 rather than add a row at or past ``limit`` (at most the bound rows): the
        caller's decisions (its filter, growing the file, flushing) come before that row."""
        self.limit = max(0, min(limit, self.rows))

    cdef int check_bound(self, bint write=False) except -1:
        if self.bound is None:
            raise ValueError("no buffer bound")
        if write and not self.writable:
            raise ValueError("the bound buffer is read-only")
        return 0

    def put(self, entry):
        """Write ``entry`` (a ProducerEntry) into its row of the bound buffer, or a new row ``size`` (then
        the header's count becomes the new size, after the row is written). Returns the row; -1 if a new
        row is needed at the limit (``set_limit``); -2 if the entry must be refused (the caller says why)."""
        self.check_bound(True)
        cdef int64_t fields[8]
        if entry_fields(entry, fields):
            return -2
        cdef Py_ssize_t row = self.upsert_row(fields[0], self.limit)
        if row < 0:
            return -1
        cdef uint8_t* at = <uint8_t*>&self.bound[0] + SNAPSHOT_HEADER + row * ENTRY_SIZE
        cdef int i
        for i in range(8):
            store_be(at + FIELD_AT[i], fields[i], FIELD_SIZE[i])
        if row == self.size - 1:
            store_be(<uint8_t*>&self.bound[6], self.size, 4)          # a new row becomes visible only now
        return row

    def put_many(self, const uint8_t[::1] batch, Py_ssize_t max_count):
        """``put`` for each entry of ``batch`` (entries in the file layout, checked by the caller), in
        order, until one more would need a row past ``max_count`` (or the bound buffer's rows).
        Returns how many entries were written; the header's count follows each new row."""
        self.check_bound(True)
        if max_count > self.rows:
            max_count = self.rows
        cdef Py_ssize_t n = batch.shape[0] // ENTRY_SIZE, i = 0, row, ahead
        if n == 0:
            return 0
        cdef uint8_t* entries = <uint8_t*>&self.bound[0] + SNAPSHOT_HEADER
        cdef const uint8_t* source
        with nogil:
            while i < n:
                # The slots are far larger than the cache: fetch the slot of an id PREFETCH_AHEAD entries
                # on while this one is placed, so the misses overlap.
                ahead = i + PREFETCH_AHEAD
                if ahead < n:
                    prefetch_slot(&self.slots[0] + self.probe_start(row_pid(&batch[0], ahead)), 1)
                source = &batch[0] + i * ENTRY_SIZE
                row = self.upsert_row(row_pid(source, 0), max_count)
                if row < 0:
                    break
                memcpy(entries + row * ENTRY_SIZE, source, ENTRY_SIZE)
                if row == self.size - 1:
                    store_be(<uint8_t*>&self.bound[6], self.size, 4)
                i += 1
        return i

    def find_many(self, const int64_t[::1] pids, int64_t[::1] rows_out):
        """The bound buffer's row of each id (or -1) into ``rows_out``; returns how many were found."""
        self.check_bound()
        if rows_out.shape[0] != pids.shape[0]:
            raise ValueError("one output row per id")
        cdef Py_ssize_t i, found = 0
        cdef const uint8_t* entries = &self.bound[0] + SNAPSHOT_HEADER
        cdef uint64_t s
        cdef uint32_t v
        with nogil:
            for i in range(pids.shape[0]):
                if i + PREFETCH_AHEAD < pids.shape[0]:
                    prefetch_slot(&self.slots[0] + self.probe_start(pids[i + PREFETCH_AHEAD]), 0)
                rows_out[i] = -1
                s = self.probe_start(pids[i])
                while True:
                    v = self.slots[s]
                    if v == 0:
                        break
                    if row_pid(entries, v - 1) == pids[i]:      # rows < size <= the bound rows
                        rows_out[i] = v - 1
                        found += 1
                        break
                    s = (s + 1) & self.mask
        return found


def snapshot_search_many(const uint8_t[::1] data, Py_ssize_t count, const int64_t[::1] pids,
                         int64_t[::1] rows_out, const uint32_t[::1] order=None, const int64_t[::1] fences=None,
                         Py_ssize_t stride=0):
    """``snapshot_search`` for each id whose rows_out[i] is -1 (others are left): its row, or -1 still.

    With ``fences`` (as ``snapshot_search``) each search starts in its stride: one or two pages of the
    mapping touched per id instead of one per halving step."""
    check_entries(data, count)
    if rows_out.shape[0] != pids.shape[0]:
        raise ValueError("one output row per id")
    if order is not None and order.shape[0] != count:
        raise ValueError("order does not have one row per entry")
    if fences is not None and (stride < 1 or fences.shape[0] != (count + stride - 1) // stride):
        raise ValueError("fences do not match the entries")
    cdef bint fenced = fences is not None and fences.shape[0] > 0
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
            if fenced:
                lo = last_fence_at_most(&fences[0], fences.shape[0], pid)
                if lo < 0:
                    continue
                lo *= stride
                hi = min(lo + stride, count)
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
