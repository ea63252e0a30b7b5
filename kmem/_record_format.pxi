# Reading Kafka's record formats: big-endian and varint fields, and one v2 record (Kafka's
# DefaultRecord) or one v0/v1 message (Kafka's LegacyRecord) at a time.
#
# Every length read from the input is checked against the end of its region before it is used; the
# parsers return an error code plus the position where the problem was found, and the Python-facing
# functions turn those into CorruptRecordError. The layouts' constants, error codes and structs are
# declared in _core.pxd.

# An int64 sum outside int64 is refused rather than wrapped (Kafka's Java longs would wrap silently);
# the compilers' checked add costs one flag test per record.
cdef extern from *:
    """
    #include <stdint.h>
    #if defined(__GNUC__) || defined(__clang__)
    #define kmem_add_overflows(a, b, out) __builtin_add_overflow((a), (b), (out))
    #else
    static int kmem_add_overflows(int64_t a, int64_t b, int64_t* out) {
        if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return 1;
        *out = a + b;
        return 0;
    }
    #endif
    """
    bint kmem_add_overflows(int64_t a, int64_t b, int64_t* out) noexcept nogil


# Error codes of the nogil parsers; messages in _ERRORS.
_ERRORS = {
    ERR_TRUNCATED: "record data ends before the lengths it declares",
    ERR_VARINT: "varint is too long",
    ERR_RECORD_SIZE: "record length does not match its fields",
    ERR_KEY_LENGTH: "invalid key length",
    ERR_VALUE_LENGTH: "invalid value length",
    ERR_HEADER_COUNT: "invalid header count",
    ERR_HEADER_KEY: "invalid header key length",
    ERR_HEADER_VALUE: "invalid header value length",
    ERR_COUNT: "batch record count does not match its records",
    ERR_ENTRY_SIZE: "entry size is smaller than the minimum record overhead",
    ERR_MAGIC: "unknown magic byte",
    ERR_TIMESTAMP: "invalid timestamp",
    ERR_NESTED: "compressed entry nested inside a compressed entry",
    ERR_BATCH_SIZE: "v2 batch is smaller than its 61-byte header",
    ERR_CHANGED: "record data changed while being converted",
    ERR_OFFSET: "record offset is outside the int64 range",
    ERR_TOO_MANY: "more records than one v2 batch holds (2**31 - 1)",
}


cdef inline int fail(Cursor* c, int code, const unsigned char* where) noexcept nogil:
    if c.error == OK:
        c.error = code
        c.error_at = where - c.start
    return -1


cdef inline int64_t be64(const unsigned char* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return <int64_t>v


cdef inline int32_t be32(const unsigned char* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3])


cdef inline int16_t be16(const unsigned char* p) noexcept nogil:
    return <int16_t>((p[0] << 8) | p[1])


cdef inline void put64(unsigned char* p, int64_t v) noexcept nogil:
    cdef uint64_t u = <uint64_t>v
    cdef int i
    for i in range(8):
        p[7 - i] = <unsigned char>(u & 0xFF)
        u >>= 8


cdef inline void put32(unsigned char* p, int64_t v) noexcept nogil:
    cdef uint32_t u = <uint32_t>v
    p[0] = u >> 24
    p[1] = (u >> 16) & 0xFF
    p[2] = (u >> 8) & 0xFF
    p[3] = u & 0xFF


cdef inline int read_varlong(Cursor* c, int max_bytes, int64_t* out) noexcept nogil:
    """Zig-zag varint of at most max_bytes (5 for int32, 10 for int64); Kafka's truncation of extra bits."""
    cdef uint64_t raw = 0
    cdef int shift = 0
    cdef const unsigned char* begin = c.p
    cdef unsigned char b
    if c.p < c.end and c.p[0] < 0x80:     # one byte: most lengths and deltas of a record
        b = c.p[0]
        c.p += 1
        out[0] = (b >> 1) ^ -(<int64_t>(b & 1))
        return 0
    if c.p + 1 < c.end and c.p[1] < 0x80:     # two bytes: a 100 B record's length and its value's
        raw = (c.p[0] & 0x7F) | (<uint64_t>c.p[1] << 7)
        c.p += 2
        out[0] = <int64_t>(raw >> 1) ^ -(<int64_t>(raw & 1))
        return 0
    while True:
        if c.p >= c.end:
            return fail(c, ERR_TRUNCATED, begin)
        if shift >= 7 * max_bytes:
            return fail(c, ERR_VARINT, begin)
        b = c.p[0]
        c.p += 1
        if shift < 64:
            raw |= (<uint64_t>(b & 0x7F)) << shift
        shift += 7
        if not (b & 0x80):
            break
    if max_bytes == 5:
        raw = <uint32_t>raw
    out[0] = <int64_t>(raw >> 1) ^ -(<int64_t>(raw & 1))
    return 0


cdef int parse_v2_record(Cursor* c, int64_t base_offset, int64_t base_timestamp, Fields* f) noexcept nogil:
    """One v2 record at c.p, advancing past it. Kafka's DefaultRecord.readFrom checks."""
    cdef const unsigned char* begin = c.p
    cdef int64_t length, ts_delta, off_delta, n, i
    if read_varlong(c, 5, &length) < 0:
        return -1
    if length < 0 or length > c.end - c.p:
        return fail(c, ERR_RECORD_SIZE if length < 0 else ERR_TRUNCATED, begin)
    cdef Cursor r = Cursor(c.p, c.p + length, c.start, OK, 0)
    if r.p >= r.end:
        return fail(c, ERR_RECORD_SIZE, begin)
    r.p += 1    # attributes: unused by Kafka
    if read_varlong(&r, 10, &ts_delta) < 0 or read_varlong(&r, 5, &off_delta) < 0:
        return fail(c, r.error, r.start + r.error_at)
    if kmem_add_overflows(base_offset, off_delta, &f.offset):
        return fail(c, ERR_OFFSET, begin)
    if kmem_add_overflows(base_timestamp, ts_delta, &f.timestamp):
        return fail(c, ERR_TIMESTAMP, begin)
    if read_varlong(&r, 5, &f.key_len) < 0:
        return fail(c, r.error, r.start + r.error_at)
    if f.key_len < -1 or f.key_len > r.end - r.p:
        return fail(c, ERR_KEY_LENGTH, begin)
    f.key = r.p
    if f.key_len > 0:
        r.p += f.key_len
    if read_varlong(&r, 5, &f.value_len) < 0:
        return fail(c, r.error, r.start + r.error_at)
    if f.value_len < -1 or f.value_len > r.end - r.p:
        return fail(c, ERR_VALUE_LENGTH, begin)
    f.value = r.p
    if f.value_len > 0:
        r.p += f.value_len
    if read_varlong(&r, 5, &f.header_count) < 0:
        return fail(c, r.error, r.start + r.error_at)
    if f.header_count < 0:
        return fail(c, ERR_HEADER_COUNT, begin)
    f.headers = r.p
    for i in range(f.header_count):
        if read_varlong(&r, 5, &n) < 0:
            return fail(c, r.error, r.start + r.error_at)
        if n < 0 or n > r.end - r.p:
            return fail(c, ERR_HEADER_KEY, begin)
        r.p += n
        if read_varlong(&r, 5, &n) < 0:
            return fail(c, r.error, r.start + r.error_at)
        if n < -1 or n > r.end - r.p:
            return fail(c, ERR_HEADER_VALUE, begin)
        if n > 0:
            r.p += n
    f.headers_end = r.p
    if r.p != r.end:
        return fail(c, ERR_RECORD_SIZE, begin)
    c.p = r.end
    return 0


cdef int parse_legacy_entry(Cursor* c, LegacyEntry* e) noexcept nogil:
    """One complete v0/v1 entry at c.p (the caller checked that the whole entry is present)."""
    cdef const unsigned char* begin = c.p
    cdef const unsigned char* p = c.p
    cdef const unsigned char* end
    cdef int64_t size
    if c.end - p < LOG_OVERHEAD:
        return fail(c, ERR_TRUNCATED, begin)
    size = be32(p + 8)
    if size < LEGACY_V0_OVERHEAD:
        return fail(c, ERR_ENTRY_SIZE, begin)
    if size > c.end - p - LOG_OVERHEAD:
        return fail(c, ERR_TRUNCATED, begin)
    end = p + LOG_OVERHEAD + size
    e.offset = be64(p)
    e.size = LOG_OVERHEAD + size
    e.magic = p[16]
    e.attributes = p[17]
    e.fields.offset = e.offset
    e.fields.header_count = 0
    p += 18
    if e.magic == 1:
        if size < LEGACY_V1_OVERHEAD:
            return fail(c, ERR_ENTRY_SIZE, begin)
        e.fields.timestamp = be64(p)
        if e.fields.timestamp < -1:
            return fail(c, ERR_TIMESTAMP, begin)
        p += 8
    elif e.magic == 0:
        e.fields.timestamp = -1
    else:
        return fail(c, ERR_MAGIC, begin)
    e.fields.key_len = be32(p)
    p += 4
    if e.fields.key_len < -1 or e.fields.key_len > end - p - 4:
        return fail(c, ERR_KEY_LENGTH, begin)
    e.fields.key = p
    if e.fields.key_len > 0:
        p += e.fields.key_len
    e.fields.value_len = be32(p)
    p += 4
    if e.fields.value_len < -1 or e.fields.value_len > end - p:
        return fail(c, ERR_VALUE_LENGTH, begin)
    e.fields.value = p
    if e.fields.value_len > 0:
        p += e.fields.value_len
    if p != end:
        return fail(c, ERR_RECORD_SIZE, begin)
    c.p = end
    return 0


cdef _corrupt(int code, Py_ssize_t at, Py_ssize_t base=0):
    from kmem.errors import CorruptRecordError
    return CorruptRecordError(_ERRORS.get(code, "corrupt record data"), base + at)
