# Rewriting records as the records section of one new v2 batch, a slice at a time: the loop of a broker
# rebuilding client batches in another codec or up-converting v0/v1 messages (Kafka's LogValidator).
# The caller decompresses the input a piece at a time and compresses each slice written, so neither
# the records nor the new section are ever whole in memory; what to rebuild is decided by the caller.


cdef inline bint v2_record_complete(const Cursor* c) noexcept nogil:
    """Whether the v2 record at c.p ends within the data (a malformed length counts: parsing reports it)."""
    cdef Cursor probe = c[0]
    cdef int64_t length
    if read_varlong(&probe, 5, &length) < 0:
        return probe.error != ERR_TRUNCATED
    return length < 0 or length <= probe.end - probe.p


cdef inline bint legacy_entry_complete(const Cursor* c) noexcept nogil:
    """Whether the v0/v1 entry at c.p ends within the data (a malformed size counts: parsing reports it)."""
    cdef int64_t size
    if c.end - c.p < LOG_OVERHEAD:
        return False
    size = be32(c.p + 8)
    return size < LEGACY_V0_OVERHEAD or size <= c.end - c.p - LOG_OVERHEAD


cdef inline unsigned char* put_bytes(unsigned char* p, const unsigned char* data, int64_t length) noexcept nogil:
    """A v2 field: varint length (-1 for null), then the bytes."""
    p = put_varint(p, length)
    if length > 0:
        memcpy(p, data, length)
        p += length
    return p


cdef Py_ssize_t headers_size(const Fields* f) noexcept nogil:
    """Bytes of a parsed record's headers written with canonical varints, or -1 when they no longer parse
    (parse_v2_record checked them: only data changed meanwhile, by another thread, does not)."""
    cdef Cursor h = Cursor(f.headers, f.headers_end, f.headers, OK, 0)
    cdef int64_t key_len = 0, value_len = 0, i
    cdef Py_ssize_t size = 0
    for i in range(f.header_count):
        if read_varlong(&h, 5, &key_len) < 0 or not 0 <= key_len <= h.end - h.p:
            return -1
        h.p += key_len
        if read_varlong(&h, 5, &value_len) < 0 or not -1 <= value_len <= h.end - h.p:
            return -1
        if value_len > 0:
            h.p += value_len
        size += field_size(key_len) + field_size(value_len)
    return size


cdef int append_record(Rewrite* rw, Cursor* c, const unsigned char* begin, const Fields* f,
                       int64_t timestamp) noexcept nogil:
    """Write a parsed record (from ``begin``) as the batch's next one: 0, or 1 when it does not fit the
    slice (rw.needed says its size), or -1 on an error."""
    cdef int64_t first, ts_delta, key_len = 0, value_len = 0, i
    cdef Py_ssize_t headers, body, size
    cdef unsigned char* p
    cdef const unsigned char* end
    cdef Cursor h
    if rw.records >= 0x7FFFFFFF:             # the record count is an int32
        return fail(c, ERR_TOO_MANY, begin)
    if timestamp < -1:
        timestamp = -1
    first = timestamp if rw.records == 0 else rw.first_timestamp
    if kmem_add_overflows(timestamp, -first, &ts_delta):      # first >= -1: its negation fits
        return fail(c, ERR_TIMESTAMP, begin)
    headers = headers_size(f)
    if headers < 0:
        return fail(c, ERR_CHANGED, begin)
    body = 1 + varint_size(ts_delta) + varint_size(rw.records) + field_size(f.key_len) + field_size(f.value_len) \
        + varint_size(f.header_count) + headers
    size = varint_size(body) + body
    if size > rw.capacity - rw.written:
        rw.needed = size
        return 1
    p = rw.out + rw.written
    end = p + size
    p = put_varint(p, body)
    p[0] = 0                                # attributes: unused
    p = put_varint(put_varint(p + 1, ts_delta), rw.records)
    p = put_bytes(put_bytes(p, f.key, f.key_len), f.value, f.value_len)
    p = put_varint(p, f.header_count)
    # The headers are read again: every length is checked again, so that data changed meanwhile (by
    # another thread) cannot make this read or write out of bounds.
    h = Cursor(f.headers, f.headers_end, f.headers, OK, 0)
    for i in range(f.header_count):
        if read_varlong(&h, 5, &key_len) < 0 or not 0 <= key_len <= h.end - h.p or field_size(key_len) > end - p:
            return fail(c, ERR_CHANGED, begin)
        p = put_bytes(p, h.p, key_len)
        h.p += key_len
        if read_varlong(&h, 5, &value_len) < 0 or not -1 <= value_len <= h.end - h.p \
                or field_size(value_len) > end - p:
            return fail(c, ERR_CHANGED, begin)
        p = put_bytes(p, h.p, value_len)
        if value_len > 0:
            h.p += value_len
    if p != end:
        return fail(c, ERR_CHANGED, begin)
    rw.written += size
    rw.records += 1
    rw.first_timestamp = first
    if timestamp > rw.max_timestamp:
        rw.max_timestamp = timestamp
    return 0


cdef int rewrite_records(Cursor* c, Rewrite* rw, bint final, int64_t* read) noexcept nogil:
    """Records from c.p until the slice is full, the section ends or, unless ``final``, the data ends
    within a record: 0, or 1 when a record is larger than the empty slice, or -1 on an error."""
    cdef Fields f
    cdef LegacyEntry e
    cdef const unsigned char* begin
    cdef int rc
    while rw.written < rw.slice_bytes:
        begin = c.p
        if rw.legacy:
            if c.p >= c.end or (not final and not legacy_entry_complete(c)):
                return 0
            if parse_legacy_entry(c, &e) < 0:
                return -1
            if e.attributes & ATTR_CODEC_MASK:
                return fail(c, ERR_NESTED, begin)
            rc = append_record(rw, c, begin, &e.fields, rw.log_append_time if rw.log_append else e.fields.timestamp)
        else:
            if rw.left == 0:
                return fail(c, ERR_COUNT, begin) if c.p < c.end else 0
            if c.p >= c.end:
                return fail(c, ERR_COUNT, begin) if final else 0
            if not final and not v2_record_complete(c):
                return 0
            if parse_v2_record(c, 0, rw.base_timestamp, &f) < 0:
                return -1
            rc = append_record(rw, c, begin, &f, rw.log_append_time if rw.log_append else f.timestamp)
            if rc == 0:
                rw.left -= 1
        if rc != 0:
            c.p = begin                     # it goes first in the next slice
            return -1 if rc < 0 else (1 if rw.written == 0 else 0)
        read[0] += 1
    return 0


cdef object new_slice(Py_ssize_t size):
    cdef PyObject* raw = new_bytearray(NULL, size)
    if raw == NULL:
        raise MemoryError(f"cannot allocate {size} bytes")
    result = <object>raw
    Py_DECREF(result)       # <object> took a reference of its own
    return result


cdef class RecordsRewriter:
    """Writes the records of v2 records sections and v0/v1 message sets as the records section of one
    new v2 batch, a slice at a time: consecutive offset deltas from 0, timestamp deltas from the first
    record's timestamp (a timestamp below -1 is written as -1), keys, values and headers byte for byte,
    lengths as canonical varints, attributes 0.

    ``start_v2`` or ``start_legacy`` begins a section (a batch's records, decompressed), then
    ``rewrite(data, pos, final=...)`` reads its records from ``data`` at ``pos`` (the section's bytes
    not read yet, or part of them) and returns ``(end position, records read, slice)``, a slice being
    the records written as a bytearray. A call stops once its slice holds ``slice_bytes`` (it holds one
    record at least), at the end of the section, or where the data ends within a record, which the next
    call is to be given again with more data after it; with ``final`` that is an error instead, as is a
    v2 section holding more or fewer records than its count. Errors raise CorruptRecordError naming
    ``base`` plus the position in ``data``. ``records``, ``first_timestamp`` (the base timestamp) and
    ``max_timestamp`` describe the batch written so far.
    """
    cdef Rewrite rw
    cdef readonly int64_t section_records

    def __init__(self, Py_ssize_t slice_bytes):
        if slice_bytes <= 0:
            raise ValueError("slice_bytes must be positive")
        self.rw.slice_bytes = slice_bytes
        self.rw.records = 0
        self.rw.first_timestamp = -1
        self.rw.max_timestamp = -1
        self.rw.legacy = True
        self.rw.log_append = False

    @property
    def records(self):
        return self.rw.records

    @property
    def first_timestamp(self):
        return self.rw.first_timestamp

    @property
    def max_timestamp(self):
        return self.rw.max_timestamp

    def start_v2(self, *, int64_t count, int64_t base_timestamp, bint log_append, int64_t log_append_time):
        """Begin a v2 records section of ``count`` records; ``log_append``: a LogAppendTime batch, whose
        records all take ``log_append_time`` (its max timestamp)."""
        if count < 0:
            raise ValueError("count must not be negative")
        self.rw.legacy, self.rw.left, self.rw.base_timestamp = False, count, base_timestamp
        self.rw.log_append, self.rw.log_append_time = log_append, log_append_time
        self.section_records = 0

    def start_legacy(self, *, bint log_append, int64_t log_append_time):
        """Begin v0/v1 messages (a wrapper's inner ones, or one uncompressed message); ``log_append``: a
        LogAppendTime wrapper, whose messages all take ``log_append_time``."""
        self.rw.legacy, self.rw.left = True, 0
        self.rw.log_append, self.rw.log_append_time = log_append, log_append_time
        self.section_records = 0

    def rewrite(self, const unsigned char[::1] data, Py_ssize_t pos, *, bint final, Py_ssize_t base=0):
        cdef Py_ssize_t n = data.shape[0]
        if pos < 0 or pos > n:
            raise IndexError("position outside the data")
        cdef const unsigned char* start = &data[0] if n else NULL
        cdef Cursor c = Cursor(start + pos, start + n, start, OK, 0)
        cdef int64_t read = 0
        cdef int rc
        out = new_slice(self.rw.slice_bytes)
        self.rw.out = <unsigned char*>PyByteArray_AS_STRING(out)
        self.rw.capacity, self.rw.written = self.rw.slice_bytes, 0
        while True:
            with nogil:
                rc = rewrite_records(&c, &self.rw, final, &read)
            if rc != 1:
                break
            PyByteArray_Resize(out, self.rw.needed)      # one record larger than a slice
            self.rw.out = <unsigned char*>PyByteArray_AS_STRING(out)
            self.rw.capacity = self.rw.needed
        self.rw.out = NULL
        if rc < 0:
            raise _corrupt(c.error, c.error_at, base)
        PyByteArray_Resize(out, self.rw.written)
        self.section_records += read
        return c.p - start, read, out
