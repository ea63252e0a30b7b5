# Writing v2 records sections and v0/v1 messages (Kafka's DefaultRecord.writeTo and
# LegacyRecord.write), sized in a first pass and written in a second.

cdef inline Py_ssize_t legacy_size(int magic, const Fields* f) noexcept nogil:
    cdef Py_ssize_t n = LOG_OVERHEAD + (LEGACY_V1_OVERHEAD if magic == 1 else LEGACY_V0_OVERHEAD)
    if f.key_len > 0:
        n += f.key_len
    if f.value_len > 0:
        n += f.value_len
    return n


cdef Py_ssize_t write_legacy(unsigned char* out, int magic, int attributes, int64_t offset,
                             const Fields* f) noexcept nogil:
    """Write one legacy entry (CRC included) and return its size."""
    cdef unsigned char* p = out + LOG_OVERHEAD + 4
    put64(out, offset)
    p[0] = magic
    p[1] = attributes
    p += 2
    if magic == 1:
        put64(p, f.timestamp)
        p += 8
    put32(p, f.key_len)
    p += 4
    if f.key_len > 0:
        memcpy(p, f.key, f.key_len)
        p += f.key_len
    put32(p, f.value_len)
    p += 4
    if f.value_len > 0:
        memcpy(p, f.value, f.value_len)
        p += f.value_len
    put32(out + 8, p - out - LOG_OVERHEAD)
    put32(out + LOG_OVERHEAD, kmem_crc32(0, out + 16, p - out - 16, 0))
    return p - out


cdef inline Py_ssize_t varint_size(int64_t v) noexcept nogil:
    cdef uint64_t z = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    cdef Py_ssize_t n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n


cdef inline unsigned char* put_varint(unsigned char* p, int64_t v) noexcept nogil:
    cdef uint64_t z = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    while z >= 0x80:
        p[0] = (z & 0x7F) | 0x80
        z >>= 7
        p += 1
    p[0] = <unsigned char>z
    return p + 1


cdef inline int64_t buffer_len(object b) except? -2:
    """Size of ``b``'s buffer, -1 for None: never len(), which a subclass can make lie."""
    cdef const unsigned char[::1] view
    if b is None:
        return -1
    view = b
    return view.shape[0]


cdef inline Py_ssize_t field_size(int64_t length) noexcept nogil:
    return varint_size(length) + (length if length > 0 else 0)


# The writers size their output in a first pass and fill it in a second. Every write of the second pass
# is bounded by the output's end: data that changed in between (a buffer resized, a headers iterable
# that yields something else) raises instead of writing past it.
cdef _changed():
    from kmem.errors import InvalidArgumentError
    return InvalidArgumentError("record data changed while being encoded")


cdef unsigned char* put_varint_within(unsigned char* p, const unsigned char* end, int64_t v) except NULL:
    if varint_size(v) > end - p:
        raise _changed()
    return put_varint(p, v)


cdef unsigned char* put_field(unsigned char* p, const unsigned char* end, object b) except NULL:
    """A v2 field, never past ``end``: varint length (-1 for None), then the bytes."""
    cdef const unsigned char[::1] view
    if b is None:
        return put_varint_within(p, end, -1)
    view = b
    p = put_varint_within(p, end, view.shape[0])
    if view.shape[0] > end - p:
        raise _changed()
    if view.shape[0]:
        memcpy(p, &view[0], view.shape[0])
    return p + view.shape[0]


def encode_v2_records(list records):
    """A v2 records section from ``(offset_delta, timestamp_delta, key, value, headers)`` tuples, where
    key/value are bytes-like or None and headers an iterable of ``(key bytes, value bytes-like or None)``."""
    cdef Py_ssize_t total = 0, body
    cdef int64_t off_delta, ts_delta, count
    cdef unsigned char* record_end
    bodies, counts = [], []
    for off_delta, ts_delta, key, value, headers in records:
        body = 1 + varint_size(ts_delta) + varint_size(off_delta) + field_size(buffer_len(key)) \
            + field_size(buffer_len(value))
        count = 0
        for hkey, hvalue in headers:
            if hkey is None:
                raise TypeError("a header key cannot be None")
            body += field_size(buffer_len(hkey)) + field_size(buffer_len(hvalue))
            count += 1
        body += varint_size(count)
        bodies.append(body)
        counts.append(count)
        total += varint_size(body) + body
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    cdef const unsigned char* end = p + total
    for (off_delta, ts_delta, key, value, headers), body, count in zip(records, bodies, counts):
        p = put_varint_within(p, end, body)
        if body > end - p:
            raise _changed()
        record_end = p + body
        p[0] = 0
        p = put_varint_within(put_varint_within(p + 1, record_end, ts_delta), record_end, off_delta)
        p = put_field(put_field(p, record_end, key), record_end, value)
        p = put_varint_within(p, record_end, count)
        for hkey, hvalue in headers:
            p = put_field(put_field(p, record_end, hkey), record_end, hvalue)
            count -= 1
        if p != record_end or count != 0:
            raise _changed()
    return out


def encode_legacy_entries(int magic, int attributes, list records):
    """Legacy entries from ``(offset, timestamp, key, value)`` tuples, all with ``attributes``."""
    cdef Fields f
    cdef Py_ssize_t total = 0
    cdef const unsigned char[::1] kview, vview
    cdef bytes empty = b""
    for offset, timestamp, key, value in records:
        f.key_len = buffer_len(key)
        f.value_len = buffer_len(value)
        total += legacy_size(magic, &f)
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    cdef const unsigned char* end = p + total
    for offset, timestamp, key, value in records:
        kview = empty if key is None else key
        vview = empty if value is None else value
        f.key_len = -1 if key is None else kview.shape[0]
        f.value_len = -1 if value is None else vview.shape[0]
        f.key = &kview[0] if kview.shape[0] else NULL
        f.value = &vview[0] if vview.shape[0] else NULL
        f.timestamp = timestamp
        if legacy_size(magic, &f) > end - p:
            raise _changed()
        p += write_legacy(p, magic, attributes, offset, &f)
    if p != end:
        raise _changed()
    return out


def v2_batch(section, int64_t first_offset, int32_t partition_leader_epoch, int16_t attributes,
             int32_t last_offset_delta, int64_t base_timestamp, int64_t max_timestamp, int64_t producer_id,
             int16_t producer_epoch, int32_t base_sequence, int32_t count):
    """A v2 batch (Kafka's DefaultRecordBatch): its 61-byte header, CRC-32C included, in front of ``section`` (a
    bytes-like records section, as written), in one bytes object."""
    cdef const unsigned char[::1] records = section
    cdef Py_ssize_t n = records.shape[0]
    out = PyBytes_FromStringAndSize(NULL, V2_HEADER + n)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    put64(p, first_offset)
    put32(p + V2_LENGTH, V2_HEADER - LOG_OVERHEAD + n)
    put32(p + V2_LEADER_EPOCH, partition_leader_epoch)
    p[V2_MAGIC] = 2
    p[V2_ATTRIBUTES] = (<uint16_t>attributes) >> 8
    p[V2_ATTRIBUTES + 1] = (<uint16_t>attributes) & 0xFF
    put32(p + V2_LAST_OFFSET_DELTA, last_offset_delta)
    put64(p + V2_BASE_TIMESTAMP, base_timestamp)
    put64(p + V2_MAX_TIMESTAMP, max_timestamp)
    put64(p + V2_PRODUCER_ID, producer_id)
    p[V2_PRODUCER_EPOCH] = (<uint16_t>producer_epoch) >> 8
    p[V2_PRODUCER_EPOCH + 1] = (<uint16_t>producer_epoch) & 0xFF
    put32(p + V2_BASE_SEQUENCE, base_sequence)
    put32(p + V2_RECORDS_COUNT, count)
    if n:
        memcpy(p + V2_HEADER, &records[0], n)
    put32(p + V2_CRC, kmem_crc32c(0, p + V2_ATTRIBUTES, V2_HEADER - V2_ATTRIBUTES + n, 0))
    return out
