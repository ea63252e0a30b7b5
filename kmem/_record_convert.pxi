# The down-conversion loop (Kafka's RecordsUtil.downConvert, one run of batches at a time): what to
# do with each batch (skip, copy, convert, stop) is decided in kmem/records/convert.py and passed in
# as a table; this part only applies it.


cdef inline void start_conversion(Conversion* cv, int to_magic, int64_t first_offset, bint relative,
                                  unsigned char* out, Py_ssize_t capacity) noexcept nogil:
    cv.to_magic = to_magic
    cv.first_offset = first_offset
    cv.relative = relative
    cv.inner_base = 0
    cv.out = out
    cv.capacity = capacity
    cv.written = 0
    cv.records = 0
    cv.last_written_offset = -1
    cv.max_timestamp = -1


cpdef int64_t conversion_bound(int64_t section, int64_t count) noexcept nogil:
    """Most bytes the legacy entries of a v2 records section can take: a v2 record has at least 7 bytes
    (length, attributes, timestamp, offset, key length, value length, header count) where a legacy
    entry has a 34-byte overhead, so each grows by at most 27 bytes; count is capped by the section."""
    cdef int64_t records = section // 7
    if 0 <= count < records:
        records = count
    return section + 27 * records


cdef inline int emit(Cursor* c, Conversion* cv, int attributes, Fields* f) noexcept nogil:
    cdef Py_ssize_t size = legacy_size(cv.to_magic, f)
    if size > cv.capacity - cv.written:      # only if the input changed while being read twice
        return fail(c, ERR_CHANGED, c.p)
    if cv.records == 0 and cv.relative:
        cv.inner_base = f.offset
    cv.last_written_offset = f.offset
    if f.timestamp > cv.max_timestamp:
        cv.max_timestamp = f.timestamp
    cv.records += 1
    cv.written += write_legacy(cv.out + cv.written, cv.to_magic, attributes, f.offset - cv.inner_base, f)
    return 0


cdef int convert_v2_records(Cursor* c, int64_t count, int64_t base_offset, int64_t base_timestamp,
                            bint log_append, int64_t log_append_time, Conversion* cv) noexcept nogil:
    """The records of one v2 batch (c spans exactly its records) as legacy entries.

    log_append (a LogAppendTime batch): every record's timestamp is log_append_time (its maxTimestamp, -1
    included, as Kafka reads it) and v1 entries keep the LogAppendTime type.
    """
    cdef Fields f
    cdef int attributes = ATTR_LOG_APPEND_TIME if (log_append and cv.to_magic == 1) else 0
    cdef const unsigned char* begin = c.p
    cdef int64_t i
    for i in range(count):
        if c.p >= c.end:
            return fail(c, ERR_COUNT, begin)
        if parse_v2_record(c, base_offset, base_timestamp, &f) < 0:
            return -1
        if f.offset < cv.first_offset:
            continue
        if log_append:
            f.timestamp = log_append_time
        if cv.to_magic == 0:
            f.timestamp = -1
        elif f.timestamp < -1:
            return fail(c, ERR_TIMESTAMP, begin)     # v1 has no negative timestamps but -1 (none)
        if emit(c, cv, attributes, &f) < 0:
            return -1
    if c.p != c.end:
        return fail(c, ERR_COUNT, begin)
    return 0


cdef int convert_legacy_entries(Cursor* c, int64_t absolute_base, Conversion* cv) noexcept nogil:
    """Uncompressed legacy entries (c spans them exactly) rewritten as cv.to_magic entries.

    Only v1 -> v0 reaches here (a legacy batch at or below the target is copied), so timestamps and the
    timestamp type are dropped.
    """
    cdef LegacyEntry e
    while c.p < c.end:
        if parse_legacy_entry(c, &e) < 0:
            return -1
        if e.attributes & ATTR_CODEC_MASK:
            return fail(c, ERR_NESTED, c.p - e.size)
        if kmem_add_overflows(absolute_base, e.offset, &e.fields.offset):
            return fail(c, ERR_OFFSET, c.p - e.size)
        if e.fields.offset < cv.first_offset:
            continue
        e.fields.timestamp = -1
        if emit(c, cv, 0, &e.fields) < 0:
            return -1
    return 0


cdef int classify(Cursor* c, const unsigned char* actions, int64_t* total) noexcept nogil:
    """The action for the entry at c.p, ``actions[(magic * 8 + codec) * 2 + control flag]``, after Kafka's
    checks on its size and magic (-1 when they fail); ENTRY_STOP when no complete entry is left (a
    truncated trailing entry is ignored, as Kafka does)."""
    cdef const unsigned char* p = c.p
    cdef int64_t size
    cdef int magic, attributes, control = 0
    if c.end - p < LOG_OVERHEAD:
        return ENTRY_STOP
    size = be32(p + 8)
    if size < LEGACY_V0_OVERHEAD:
        return fail(c, ERR_ENTRY_SIZE, p)
    if size > c.end - p - LOG_OVERHEAD:
        return ENTRY_STOP
    total[0] = size + LOG_OVERHEAD
    magic = p[16]
    if magic > 2:
        return fail(c, ERR_MAGIC, p)
    if magic == 2:
        if total[0] < V2_HEADER:
            return fail(c, ERR_BATCH_SIZE, p)
        attributes = be16(p + 21)
        control = (attributes & ATTR_CONTROL) != 0
    else:
        attributes = p[17]
    return actions[(magic * 8 + (attributes & ATTR_CODEC_MASK)) * 2 + control]


cdef int plan_run(Cursor* c, const unsigned char* actions, Py_ssize_t* bound) noexcept nogil:
    """Advance c.p to the first entry to stop at, summing a bound on the output of those before it."""
    cdef int64_t total = 0
    cdef int action
    while True:
        action = classify(c, actions, &total)
        if action < 0:
            return -1
        if action == ENTRY_STOP:
            return 0
        if action == ENTRY_COPY:
            bound[0] += total
        elif action == ENTRY_CONVERT:
            bound[0] += conversion_bound(total - V2_HEADER, be32(c.p + 57)) if c.p[16] == 2 else total
        c.p += total


cdef int convert_run(Cursor* c, const unsigned char* actions, Conversion* cv, int64_t* source_bytes,
                     int64_t* uncompressed) noexcept nogil:
    """Copy or convert every entry of a planned run (c spans it exactly) into cv.out."""
    cdef int64_t total = 0, count, records_before
    cdef Py_ssize_t written_before
    cdef const unsigned char* p
    cdef Cursor inner
    cdef int action
    while c.p < c.end:
        p = c.p
        action = classify(c, actions, &total)
        if action < 0:
            return -1
        if action == ENTRY_STOP:
            return fail(c, ERR_CHANGED, p)
        if action == ENTRY_COPY:
            if total > cv.capacity - cv.written:
                return fail(c, ERR_CHANGED, p)
            memcpy(cv.out + cv.written, p, total)
            cv.written += total
            source_bytes[0] += total
        elif action == ENTRY_CONVERT:
            records_before = cv.records
            written_before = cv.written
            inner = Cursor(p + V2_HEADER, p + total, c.start, OK, 0)
            if p[16] == 2:
                count = be32(p + 57)
                if count < 0:
                    return fail(c, ERR_COUNT, p)
                convert_v2_records(&inner, count, be64(p), be64(p + 27), be16(p + 21) & ATTR_LOG_APPEND_TIME,
                                   be64(p + 35), cv)
            else:
                inner.p = p
                convert_legacy_entries(&inner, 0, cv)
            if inner.error != OK:
                return fail(c, inner.error, inner.start + inner.error_at)
            if cv.records > records_before:
                source_bytes[0] += total
                uncompressed[0] += cv.written - written_before
        c.p = p + total
    return 0


cdef extern from "Python.h":
    PyObject* new_bytearray "PyByteArray_FromStringAndSize"(const char* data, Py_ssize_t size)
    int PyByteArray_Resize(object bytearray, Py_ssize_t size) except -1
    char* PyByteArray_AS_STRING(object bytearray)


# Converted output is written into a bytearray sized by a safe bound and then cut to the bytes written.
# A bytearray rather than bytes: cutting bytes reallocates, so the allocator later sees a smaller block
# freed than the next bound asks for, and glibc then maps fresh (page-faulting) memory for every call;
# a bytearray keeps its block (it reallocates only below half), which made conversion of 100 B records
# 2.5x faster. The slack is at most 27 bytes per record.
cdef object fit_bytearray(PyObject* raw, Py_ssize_t size):
    """Take over ``raw`` (a new bytearray, at least ``size`` long) cut to ``size`` bytes."""
    result = <object>raw
    Py_DECREF(result)
    PyByteArray_Resize(result, size)
    return result


cdef class ConversionRun:
    """What run_down_conversion did: its output, the position it stopped at, records converted, source
    bytes kept and uncompressed bytes written."""
    cdef readonly object output
    cdef readonly Py_ssize_t stop
    cdef readonly int64_t records, source_bytes, written_bytes

    def __repr__(self):
        return (f"ConversionRun({len(self.output)} bytes, stop={self.stop}, records={self.records}, "
                f"source_bytes={self.source_bytes}, written_bytes={self.written_bytes})")


cdef ConversionRun conversion_run(object output, Py_ssize_t stop, int64_t records, int64_t source_bytes,
                                  int64_t written_bytes):
    cdef ConversionRun run = ConversionRun.__new__(ConversionRun)
    run.output, run.stop, run.records, run.source_bytes, run.written_bytes = (output, stop, records, source_bytes,
                                                                              written_bytes)
    return run


cdef class ConvertedEntries:
    """Entries written by convert_v2_section or convert_legacy_section: the bytes, records, the last
    offset and the highest timestamp written."""
    cdef readonly object entries
    cdef readonly int64_t records, last_offset, max_timestamp

    def __repr__(self):
        return (f"ConvertedEntries({len(self.entries)} bytes, records={self.records}, "
                f"last_offset={self.last_offset}, max_timestamp={self.max_timestamp})")

ACTION_TABLE_SIZE = 3 * 8 * 2      # magic, codec, control flag
ENTRY_ACTIONS = {"skip": ENTRY_SKIP, "copy": ENTRY_COPY, "convert": ENTRY_CONVERT, "stop": ENTRY_STOP}


def run_down_conversion(const unsigned char[::1] data, Py_ssize_t pos, *, const unsigned char[::1] actions,
                        int to_magic, int64_t first_offset):
    """Convert entries from ``pos`` to ``to_magic`` until the first one ``actions`` says to stop at.

    ``actions`` holds ACTION_TABLE_SIZE ENTRY_ACTIONS values, the one for an entry at
    ``(magic * 8 + codec) * 2 + control flag``. Records of converted entries below ``first_offset`` are
    dropped. Returns a ConversionRun: the output (a bytearray), the position stopped at (the end, a
    truncated trailing entry or an entry to stop at), records converted, source bytes kept and
    uncompressed bytes written. The run's batch headers are read first to bound its output, which is
    then written in one pass and cut to size.
    """
    cdef Py_ssize_t n = data.shape[0]
    if pos < 0 or pos > n:
        raise IndexError("position outside the data")
    if actions.shape[0] != ACTION_TABLE_SIZE:
        raise ValueError(f"actions must hold {ACTION_TABLE_SIZE} entries")
    if n == pos:
        return conversion_run(b"", pos, 0, 0, 0)
    cdef const unsigned char* start = &data[0]
    cdef const unsigned char* table = &actions[0]
    cdef Cursor c = Cursor(start + pos, start + n, start, OK, 0)
    cdef Py_ssize_t bound = 0
    cdef int64_t source_bytes = 0, uncompressed = 0
    cdef int rc
    with nogil:
        rc = plan_run(&c, table, &bound)
    if rc < 0:
        raise _corrupt(c.error, c.error_at)
    cdef Py_ssize_t stop = c.p - start
    cdef PyObject* raw = new_bytearray(NULL, bound)
    if raw == NULL:
        raise MemoryError(f"cannot allocate {bound} bytes")
    cdef Conversion cv
    start_conversion(&cv, to_magic, first_offset, False, <unsigned char*>PyByteArray_AS_STRING(<object>raw), bound)
    c = Cursor(start + pos, start + stop, start, OK, 0)
    with nogil:
        rc = convert_run(&c, table, &cv, &source_bytes, &uncompressed)
    if rc < 0:
        Py_XDECREF(raw)
        raise _corrupt(c.error, c.error_at)
    return conversion_run(fit_bytearray(raw, cv.written), stop, cv.records, source_bytes, uncompressed)


cdef _converted_entries(Cursor* c, Conversion* cv, PyObject* raw, int rc, Py_ssize_t base):
    if rc < 0:
        Py_XDECREF(raw)
        raise _corrupt(c.error, c.error_at, base)
    cdef ConvertedEntries result = ConvertedEntries.__new__(ConvertedEntries)
    result.entries = fit_bytearray(raw, cv.written)
    result.records, result.last_offset, result.max_timestamp = cv.records, cv.last_written_offset, cv.max_timestamp
    return result


def convert_v2_section(const unsigned char[::1] data, *, int64_t count, int64_t base_offset, int64_t base_timestamp,
                       bint log_append, int64_t log_append_time, int to_magic, bint relative, Py_ssize_t base=0):
    """A (decompressed) v2 records section of ``count`` records as uncompressed ``to_magic`` entries.

    ``log_append``: a LogAppendTime batch, whose records all take ``log_append_time``. ``relative``:
    offsets are written relative to the first record (v1 inner messages). Errors name ``base`` plus the
    position in ``data``. Returns ConvertedEntries(entries bytearray, records, last offset, max timestamp).
    """
    cdef Py_ssize_t n = data.shape[0]
    cdef const unsigned char* start = &data[0] if n else NULL
    cdef Cursor c = Cursor(start, start + n, start, OK, 0)
    cdef Py_ssize_t bound = conversion_bound(n, count)
    cdef PyObject* raw = new_bytearray(NULL, bound)
    if raw == NULL:
        raise MemoryError(f"cannot allocate {bound} bytes")
    cdef Conversion cv
    cdef int rc
    start_conversion(&cv, to_magic, INT64_MIN, relative, <unsigned char*>PyByteArray_AS_STRING(<object>raw), bound)
    with nogil:
        rc = convert_v2_records(&c, count, base_offset, base_timestamp, log_append, log_append_time, &cv)
    return _converted_entries(&c, &cv, raw, rc, base)


def convert_legacy_section(const unsigned char[::1] data, *, int64_t absolute_base, int to_magic, Py_ssize_t base=0):
    """Uncompressed legacy inner messages (a decompressed wrapper) as ``to_magic`` entries, their offsets
    made absolute by adding ``absolute_base``. Returns ConvertedEntries like convert_v2_section."""
    cdef Py_ssize_t n = data.shape[0]
    cdef const unsigned char* start = &data[0] if n else NULL
    cdef Cursor c = Cursor(start, start + n, start, OK, 0)
    cdef PyObject* raw = new_bytearray(NULL, n)
    if raw == NULL:
        raise MemoryError(f"cannot allocate {n} bytes")
    cdef Conversion cv
    cdef int rc
    start_conversion(&cv, to_magic, INT64_MIN, False, <unsigned char*>PyByteArray_AS_STRING(<object>raw), n)
    with nogil:
        rc = convert_legacy_entries(&c, absolute_base, &cv)
    return _converted_entries(&c, &cv, raw, rc, base)
