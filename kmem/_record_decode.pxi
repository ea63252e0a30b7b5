# Decoding records into Python objects, and scanning them without making any.

cdef class LegacyScan:
    """What scan_legacy_entries found: the count of entries, the first and last offsets, and the lowest
    and highest (-1 when there is none)."""
    cdef readonly int64_t count, first, last, lowest, highest

    def __repr__(self):
        return (f"LegacyScan(count={self.count}, first={self.first}, last={self.last}, lowest={self.lowest}, "
                f"highest={self.highest})")

def entry_at(const unsigned char[::1] data, Py_ssize_t pos, Py_ssize_t base=0):
    """``(size, magic)`` of the top-level entry at ``pos``, or None when no complete entry is left.

    Raises CorruptRecordError for a size below the minimum overhead or an unknown magic (Kafka's
    ByteBufferLogInputStream checks), its position given as ``base + pos`` (where ``data`` starts in a file,
    say); a truncated trailing entry is not an error.
    """
    cdef Py_ssize_t n = data.shape[0]
    if pos < 0 or n - pos < LOG_OVERHEAD:
        return None
    cdef int64_t size = be32(&data[pos + 8])
    if size < LEGACY_V0_OVERHEAD:
        raise _corrupt(ERR_ENTRY_SIZE, pos, base)
    if size > n - pos - LOG_OVERHEAD:
        return None
    cdef int magic = data[pos + 16]
    if magic > 2:
        raise _corrupt(ERR_MAGIC, pos, base)
    if magic == 2 and size + LOG_OVERHEAD < V2_HEADER:
        raise _corrupt(ERR_BATCH_SIZE, pos, base)
    return LOG_OVERHEAD + size, magic


def decode_v2_records(const unsigned char[::1] data, Py_ssize_t pos, *, int64_t count, int64_t max_objects,
                      int64_t max_record_objects, int64_t base_offset, int64_t base_timestamp, Py_ssize_t base=0):
    """Records from byte ``pos`` of a v2 records section with ``count`` records left, as ``(offset,
    timestamp, key, value, headers)`` tuples (headers a list of ``(key str, value bytes or None)``).

    One call makes at most ``max_objects`` records and headers (but always one record), so that a big
    batch is decoded a slice at a time; a record with more than ``max_record_objects`` (itself plus its
    headers) raises CorruptRecordError before any of them is made. Returns ``(records, end position)``;
    decoding the last record checks that the section ends there.
    """
    cdef Py_ssize_t n = data.shape[0]
    if pos < 0 or pos > n:
        raise IndexError("position outside the data")
    cdef const unsigned char* start = &data[0] if n else NULL
    cdef const unsigned char* begin
    cdef Cursor c = Cursor(start + pos, start + n, start, OK, 0)
    cdef Cursor h
    cdef Fields f
    cdef int64_t klen = 0, vlen = 0, made = 0
    if count < 0 or count > n - pos:      # every record takes at least one byte
        raise _corrupt(ERR_COUNT, pos, base)
    result = []
    while count:
        begin = c.p
        if c.p >= c.end or parse_v2_record(&c, base_offset, base_timestamp, &f) < 0:
            raise _corrupt(c.error or ERR_COUNT, c.error_at if c.error else c.p - start, base)
        if 1 + f.header_count > max_record_objects:
            from kmem.errors import CorruptRecordError
            raise CorruptRecordError(f"record has {f.header_count} headers, more than the limit of "
                                     f"{max_record_objects - 1}", base + (begin - start))
        if made and made + 1 + f.header_count > max_objects:
            c.p = begin       # the next slice starts with this record
            break
        made += 1 + f.header_count
        count -= 1
        headers = []
        h = Cursor(f.headers, f.headers_end, start, OK, 0)
        for _ in range(f.header_count):
            read_varlong(&h, 5, &klen)       # validated by parse_v2_record
            hkey = (<const char*>h.p)[:klen].decode("utf-8", "replace")
            h.p += klen
            read_varlong(&h, 5, &vlen)
            headers.append((hkey, (<const char*>h.p)[:vlen] if vlen >= 0 else None))
            if vlen > 0:
                h.p += vlen
        result.append((f.offset, f.timestamp,
                       (<const char*>f.key)[:f.key_len] if f.key_len >= 0 else None,
                       (<const char*>f.value)[:f.value_len] if f.value_len >= 0 else None,
                       headers))
    if not count and c.p != c.end:
        raise _corrupt(ERR_COUNT, c.p - start, base)
    return result, c.p - start


def count_v2_objects(const unsigned char[::1] data, *, int64_t count, Py_ssize_t base=0):
    """Records plus headers of a v2 records section of ``count`` records (what decode_v2_records would
    make), checked as it checks them but without making any object."""
    cdef Py_ssize_t n = data.shape[0]
    cdef const unsigned char* start = &data[0] if n else NULL
    cdef Cursor c = Cursor(start, start + n, start, OK, 0)
    cdef Fields f
    cdef int64_t objects = 0, i
    cdef int rc = 0
    if count < 0 or count > n:
        raise _corrupt(ERR_COUNT, 0, base)
    with nogil:
        for i in range(count):
            if c.p >= c.end:
                rc = fail(&c, ERR_COUNT, c.p)
                break
            rc = parse_v2_record(&c, 0, 0, &f)
            if rc < 0:
                break
            objects += 1 + f.header_count
        if rc == 0 and c.p != c.end:
            rc = fail(&c, ERR_COUNT, c.p)
    if rc < 0:
        raise _corrupt(c.error, c.error_at, base)
    return objects


def decode_legacy_entries(const unsigned char[::1] data, *, Py_ssize_t base=0, Py_ssize_t pos=0,
                          Py_ssize_t max_entries=-1):
    """The complete legacy entries from byte ``pos`` (at most ``max_entries``; all when negative) as
    ``(offset, size, magic, attributes, timestamp, key, value)``; the entries must fill ``data`` exactly
    (inner entries of a compressed wrapper, or one entry)."""
    cdef Py_ssize_t n = data.shape[0]
    if pos < 0 or pos > n:
        raise IndexError("position outside the data")
    cdef const unsigned char* start = &data[0] if n else NULL
    cdef Cursor c = Cursor(start + pos, start + n, start, OK, 0)
    cdef LegacyEntry e
    result = []
    while c.p < c.end and max_entries != 0:
        if parse_legacy_entry(&c, &e) < 0:
            raise _corrupt(c.error, c.error_at, base)
        result.append((e.offset, e.size, e.magic, e.attributes, e.fields.timestamp,
                       (<const char*>e.fields.key)[:e.fields.key_len] if e.fields.key_len >= 0 else None,
                       (<const char*>e.fields.value)[:e.fields.value_len] if e.fields.value_len >= 0 else None))
        max_entries -= 1
    return result


def scan_legacy_entries(const unsigned char[::1] data, *, Py_ssize_t base=0):
    """LegacyScan(count, first offset, last offset, lowest offset, highest offset) of the legacy entries
    filling ``data`` (a wrapper's inner entries), checked as decode_legacy_entries checks them but
    without making objects; offsets are -1 when there is none."""
    cdef Py_ssize_t n = data.shape[0]
    cdef const unsigned char* start = &data[0] if n else NULL
    cdef Cursor c = Cursor(start, start + n, start, OK, 0)
    cdef LegacyEntry e
    cdef int64_t count = 0, first = -1, last = -1, lowest = -1, highest = -1
    cdef int rc = 0
    with nogil:
        while c.p < c.end:
            rc = parse_legacy_entry(&c, &e)
            if rc < 0:
                break
            if count == 0:
                first = lowest = highest = e.offset
            last = e.offset
            lowest = min(lowest, e.offset)
            highest = max(highest, e.offset)
            count += 1
    if rc < 0:
        raise _corrupt(c.error, c.error_at, base)
    cdef LegacyScan scan = LegacyScan.__new__(LegacyScan)
    scan.count, scan.first, scan.last, scan.lowest, scan.highest = count, first, last, lowest, highest
    return scan
