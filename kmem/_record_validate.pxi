# The common case of a Produce append in one pass (Kafka's LogValidator.assignOffsetsNonCompressed and
# validateMessagesAndAssignOffsetsCompressed, for batches kept as they came): every top-level entry a v2
# batch, each checked and given its offsets. Anything else, and any check that fails, is left to the Python
# validator, which reads the batches one by one and names the error as Kafka does.

cdef enum:
    # positions in the v2 batch header (Kafka's DefaultRecordBatch)
    V2_LENGTH = 8
    V2_LEADER_EPOCH = 12
    V2_MAGIC = 16
    V2_CRC = 17
    V2_ATTRIBUTES = 21
    V2_LAST_OFFSET_DELTA = 23
    V2_BASE_TIMESTAMP = 27
    V2_MAX_TIMESTAMP = 35
    V2_PRODUCER_ID = 43
    V2_PRODUCER_EPOCH = 51
    V2_BASE_SEQUENCE = 53
    V2_RECORDS_COUNT = 57
    ATTR_TRANSACTIONAL = 0x10
    LAST_CODEC = 4                  # zstd; 5-7 name no codec
    SEQUENCE_MODULUS = 0x80000000   # sequences wrap past Integer.MAX_VALUE


cdef struct BatchCheck:
    Py_ssize_t position
    Py_ssize_t size
    int64_t count
    int64_t last_delta
    int codec


cdef bint records_pass(const unsigned char* body, Py_ssize_t n, int64_t count, int64_t base_timestamp,
                       bint keyless, int64_t low, int64_t high) noexcept nogil:
    """Whether the ``count`` records of an uncompressed v2 section parse, exactly filling it, and each has a
    key when ``keyless`` and a timestamp of -1 or within ``[low, high]``."""
    cdef Cursor c = Cursor(body, body + n, body, OK, 0)
    cdef Fields f
    cdef int64_t i
    if count < 0 or count > n:      # every record takes at least one byte
        return False
    for i in range(count):
        if c.p >= c.end or parse_v2_record(&c, 0, base_timestamp, &f) < 0:
            return False
        if (keyless and f.key_len < 0) or (f.timestamp != -1 and not low <= f.timestamp <= high):
            return False
    return c.p == c.end


cdef bint batch_passes(const unsigned char* b, Py_ssize_t size, bint from_client, int64_t max_message_bytes,
                       int codec, bint keyless, int64_t low, int64_t high, BatchCheck* out) noexcept nogil:
    """The checks of the Python validator's ``_check_batch`` and ``_check_record_contents`` on one v2 batch of
    ``size`` bytes at ``b`` (at least a header), but the records of a compressed batch, which need its codec;
    False also for what the fast path does not take (a control batch from a client, which is refused, or a
    compressed one, a LogAppendTime batch, another codec than ``codec`` when it is not -1, a compressed batch
    where records are checked one by one)."""
    cdef int attributes = be16(b + V2_ATTRIBUTES)
    cdef int64_t base_offset = be64(b), last_offset, max_timestamp = be64(b + V2_MAX_TIMESTAMP)
    cdef int64_t last_delta = be32(b + V2_LAST_OFFSET_DELTA), count = be32(b + V2_RECORDS_COUNT)
    cdef bint compressed = (attributes & ATTR_CODEC_MASK) != 0
    if count < 0 or size > max_message_bytes or (from_client and base_offset != 0):
        return False
    if attributes & ATTR_LOG_APPEND_TIME or (attributes & ATTR_CODEC_MASK) > LAST_CODEC:
        return False
    if attributes & ATTR_CONTROL and (from_client or compressed):
        return False
    if codec >= 0 and (attributes & ATTR_CODEC_MASK) != codec:
        return False
    if <uint32_t>be32(b + V2_CRC) != kmem_crc32c(0, b + V2_ATTRIBUTES, size - V2_ATTRIBUTES, 0):
        return False
    if kmem_add_overflows(base_offset, last_delta, &last_offset):
        return False
    if from_client and (last_delta + 1 != count or count <= 0
                        or (be64(b + V2_PRODUCER_ID) >= 0 and be32(b + V2_BASE_SEQUENCE) < 0)):
        return False
    if max_timestamp != -1 and not low <= max_timestamp <= high:
        return False
    if compressed:
        if keyless or low != INT64_MIN or high != INT64_MAX:
            return False
    elif not records_pass(b + V2_HEADER, size - V2_HEADER, count, be64(b + V2_BASE_TIMESTAMP), keyless, low, high):
        return False
    out.size, out.count, out.last_delta, out.codec = size, count, last_delta, attributes & ATTR_CODEC_MASK
    return True


cdef class ValidatedRecords:
    """Records checked and given their offsets, ready to append (Kafka's ``LogAppendInfo`` before the write):
    ``pieces``, bytes-like objects to write in order, ``size`` bytes in all; ``batches``, a ``BatchInfo`` per
    batch; the first and last offsets; the largest timestamp and the offset of its batch's last record;
    ``log_append_time``, the broker's time given to the batches (-1 on a CreateTime topic)."""
    cdef public list pieces, batches
    cdef public int64_t first_offset, last_offset, max_timestamp, offset_of_max_timestamp, log_append_time
    cdef public Py_ssize_t size

    def __init__(self, list pieces not None, list batches not None, int64_t first_offset, int64_t last_offset,
                 int64_t max_timestamp, int64_t offset_of_max_timestamp, int64_t log_append_time):
        cdef Py_ssize_t size = 0
        for piece in pieces:
            size += len(piece)
        self.pieces, self.batches, self.size = pieces, batches, size
        self.first_offset, self.last_offset, self.max_timestamp = first_offset, last_offset, max_timestamp
        self.offset_of_max_timestamp, self.log_append_time = offset_of_max_timestamp, log_append_time


def timestamp_window(config, now):
    """``(lowest, highest)`` CreateTime timestamp a topic with ``config`` (a ``LogConfig``) takes at ``now``
    (KIP-937's ``message.timestamp.before.max.ms`` and ``after``), or None for any: a bound of Long.MAX_VALUE
    (the default) is none, and a LogAppendTime topic sets the time itself."""
    before, after = config.timestamp_before_max_ms, config.timestamp_after_max_ms
    if config.log_append_time or before == after == INT64_MAX:
        return None
    return (INT64_MIN if before == INT64_MAX else now - before), min(now + after, INT64_MAX)


def assign_common_case(data, int64_t next_offset, config, int32_t leader_epoch, origin, now, info_class):
    """``assign_v2_batches`` with what a topic's ``config`` (a ``LogConfig``) and the append's ``origin`` (the
    validator's ``"client"``, ``"replication"`` or ``"coordinator"``) and time ``now`` make of its arguments:
    the codec ``compression.type`` imposes and the timestamp window (neither for replication), the
    LogAppendTime, the key a compacted topic needs of a client's records."""
    cdef bint client = origin == "client", replication = origin == "replication"
    target = config.target_codec
    window = None if replication else timestamp_window(config, now)
    low, high = (INT64_MIN, INT64_MAX) if window is None else window
    return assign_v2_batches(data, next_offset=next_offset, leader_epoch=leader_epoch,
                             log_append_time=now if config.log_append_time else -1, from_client=client,
                             max_message_bytes=config.max_message_bytes, segment_bytes=config.segment_bytes,
                             codec=-1 if target is None or replication else target,
                             keyless=config.compact and client, low=low, high=high, info_class=info_class)


cdef int read_marker(const unsigned char* b, Py_ssize_t size, int* marker_type, int64_t* coordinator_epoch) \
        noexcept nogil:
    """The first record of a control batch of ``size`` bytes at ``b`` (its records checked): its key's type
    (Kafka's ``ControlRecordKey``: version int16, type int16) and its value's coordinator epoch (Kafka's
    ``EndTransactionMarker``: version int16, coordinator epoch int32; -1 when the value is shorter). -1 when the
    key is shorter than a type."""
    cdef Cursor c = Cursor(b + V2_HEADER, b + size, b, OK, 0)
    cdef Fields f
    if parse_v2_record(&c, 0, 0, &f) < 0 or f.key_len < 4:
        return -1
    marker_type[0] = be16(f.key + 2)
    coordinator_epoch[0] = be32(f.value + 2) if f.value_len >= 6 else -1
    return 0


cdef object _control_types = None


cdef dict _control_record_types():
    """``{value: ControlRecordType}``, the enum's own map (imported on first use: kmem.records imports this
    module)."""
    global _control_types
    if _control_types is None:
        from kmem.records.batches import ControlRecordType
        _control_types = ControlRecordType._value2member_map_
    return _control_types


def assign_v2_batches(data, *, int64_t next_offset, int32_t leader_epoch, int64_t log_append_time,
                      bint from_client, int64_t max_message_bytes, int64_t segment_bytes, int codec, bint keyless,
                      int64_t low, int64_t high, info_class):
    """The common case of a Produce append, checked and given offsets from ``next_offset`` in one call; None
    when the records need the Python validator (it then finds the same or names the error).

    Taken: records whose complete entries (a truncated tail is dropped) are all v2 batches, at most
    ``segment_bytes`` of them, no LogAppendTime batch among them (nor a control batch from a client, or a
    compressed one), each passing Kafka's checks:
    its size within ``max_message_bytes``, its CRC, its last offset within int64, its max timestamp and
    (uncompressed) every record's timestamp -1 or within ``[low, high]`` and every record's structure, a key
    on each when ``keyless``; ``from_client``: base offset 0, a count matching its offset range and above 0,
    a sequence with a producer id. A compressed batch must be alone and of ``codec`` (unless -1), and is taken
    only without ``keyless`` or bounds: its records are then the caller's to check.

    A control batch (from replication or the coordinator, uncompressed) is taken when its marker record says
    its type (Kafka's ``ControlRecordType`` in the key's int16 after the version), or when it holds no record.

    Returns ``(ValidatedRecords, compressed)``. Its pieces are per batch a new 61-byte bytearray
    header holding the assigned base offset, ``leader_epoch`` and, when ``log_append_time`` is not -1, the
    LogAppendTime bit, that time as max timestamp and the CRC they make, then a view of the batch's records in
    ``data``, unchanged. Its batches are ``info_class`` tuples (the validator's ``BatchInfo``: producer id,
    producer epoch, base sequence, last sequence, base offset, last offset, max timestamp, transactional,
    control, control type, coordinator epoch). A control batch's type is a ``ControlRecordType`` where it names
    one, else the int, and None for an empty batch; its coordinator epoch is the int32 after the version in its
    marker's value (Kafka's ``EndTransactionMarker``), -1 when the value is shorter or the batch empty. Other
    batches: None and -1.
    """
    cdef const unsigned char[::1] bytes_of = data
    cdef Py_ssize_t n = bytes_of.shape[0], pos = 0, size, i, kept = 0, capacity = 4
    cdef const unsigned char* start = &bytes_of[0] if n else NULL
    cdef BatchCheck* checks = NULL
    cdef BatchCheck* grown
    cdef bint taken = True, any_compressed = False
    cdef int64_t offset = next_offset, last_offset, batch_max, max_timestamp = -1, offset_of_max = -1
    cdef int64_t producer_id, base_sequence, last_sequence, coordinator_epoch
    cdef int attributes, marker_type
    cdef const unsigned char* b
    cdef unsigned char* h
    cdef uint32_t crc
    cdef Py_ssize_t body_bytes
    checks = <BatchCheck*>malloc(capacity * sizeof(BatchCheck))
    if checks == NULL:
        raise MemoryError()
    try:
        with nogil:
            while n - pos >= LOG_OVERHEAD:
                size = LOG_OVERHEAD + <int64_t>be32(start + pos + V2_LENGTH)
                if size < LOG_OVERHEAD + LEGACY_V0_OVERHEAD:
                    taken = False       # corrupt
                    break
                if size > n - pos:
                    break               # a truncated tail, dropped as Kafka does
                if size < V2_HEADER or start[pos + V2_MAGIC] != 2:
                    taken = False       # a legacy entry, or a corrupt one
                    break
                if kept == capacity:
                    capacity *= 2
                    grown = <BatchCheck*>realloc(checks, capacity * sizeof(BatchCheck))
                    if grown == NULL:
                        taken = False
                        break
                    checks = grown
                if not batch_passes(start + pos, size, from_client, max_message_bytes, codec, keyless, low, high,
                                    &checks[kept]):
                    taken = False
                    break
                checks[kept].position = pos
                any_compressed = any_compressed or checks[kept].codec != 0
                kept += 1
                pos += size
        if not taken or kept == 0 or pos > segment_bytes or (any_compressed and kept > 1):
            return None
        view = data if type(data) is memoryview else memoryview(data)
        pieces, batches = [], []
        for i in range(kept):
            b = start + checks[i].position
            if kmem_add_overflows(offset, checks[i].last_delta, &last_offset) or last_offset == INT64_MAX:
                return None
            header = PyByteArray_FromStringAndSize(<char*>b, V2_HEADER)
            h = <unsigned char*>PyByteArray_AS_STRING(header)
            put64(h, offset)
            put32(h + V2_LEADER_EPOCH, leader_epoch)
            batch_max = be64(b + V2_MAX_TIMESTAMP)
            if log_append_time >= 0:
                h[V2_ATTRIBUTES + 1] |= ATTR_LOG_APPEND_TIME
                put64(h + V2_MAX_TIMESTAMP, log_append_time)
                batch_max = log_append_time
                body_bytes = checks[i].size - V2_HEADER
                with nogil:             # the whole batch is checksummed again: other threads go on meanwhile
                    crc = kmem_crc32c(kmem_crc32c(0, h + V2_ATTRIBUTES, V2_HEADER - V2_ATTRIBUTES, 0),
                                      b + V2_HEADER, body_bytes, 0)
                put32(h + V2_CRC, crc)
            producer_id, base_sequence = be64(b + V2_PRODUCER_ID), be32(b + V2_BASE_SEQUENCE)
            last_sequence = -1 if base_sequence == -1 else \
                ((base_sequence + checks[i].last_delta) % SEQUENCE_MODULUS + SEQUENCE_MODULUS) % SEQUENCE_MODULUS
            if batch_max > max_timestamp:
                max_timestamp, offset_of_max = batch_max, last_offset
            attributes = be16(b + V2_ATTRIBUTES)
            control = bool(attributes & ATTR_CONTROL)
            control_type, coordinator_epoch = None, -1
            if control and checks[i].count:
                if read_marker(b, checks[i].size, &marker_type, &coordinator_epoch) < 0:
                    return None         # its key says no type: the validator names that
                control_type = _control_record_types().get(marker_type, marker_type)
            pieces.append(header)
            pieces.append(view[checks[i].position + V2_HEADER:checks[i].position + checks[i].size])
            batches.append(tuple.__new__(info_class, (
                producer_id, be16(b + V2_PRODUCER_EPOCH), base_sequence, last_sequence, offset, last_offset,
                batch_max, bool(attributes & ATTR_TRANSACTIONAL), control, control_type, coordinator_epoch)))
            offset = last_offset + 1
        return (ValidatedRecords(pieces, batches, next_offset, offset - 1, max_timestamp, offset_of_max,
                                 log_append_time), any_compressed)
    finally:
        free(checks)
