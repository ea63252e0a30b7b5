# Declarations shared by the parts of kmem._core (cimported automatically by _core.pyx), so that the
# parts can be included in any order.

from libc.stdint cimport int64_t

# Kafka's record layouts (DefaultRecordBatch, LegacyRecord)
cdef enum:
    V2_HEADER = 61
    LOG_OVERHEAD = 12             # offset and size before every batch or message
    LEGACY_V0_OVERHEAD = 14       # crc, magic, attributes, key length, value length
    LEGACY_V1_OVERHEAD = 22       # ... plus the timestamp
    ATTR_CODEC_MASK = 0x07
    ATTR_LOG_APPEND_TIME = 0x08
    ATTR_CONTROL = 0x20

# Error codes of the nogil record parsers; messages in _ERRORS (_record_format.pxi).
cdef enum:
    OK = 0
    ERR_TRUNCATED = 1
    ERR_VARINT = 2
    ERR_RECORD_SIZE = 3
    ERR_KEY_LENGTH = 4
    ERR_VALUE_LENGTH = 5
    ERR_HEADER_COUNT = 6
    ERR_HEADER_KEY = 7
    ERR_HEADER_VALUE = 8
    ERR_COUNT = 9
    ERR_ENTRY_SIZE = 10
    ERR_MAGIC = 11
    ERR_TIMESTAMP = 12
    ERR_NESTED = 13
    ERR_BATCH_SIZE = 14
    ERR_CHANGED = 15
    ERR_OFFSET = 16
    ERR_TOO_MANY = 17

# What the down-conversion loop does with a batch, looked up in the table its caller passes.
cdef enum:
    ENTRY_SKIP = 0        # dropped (a control batch below v2)
    ENTRY_COPY = 1        # copied byte for byte (at or below the target magic)
    ENTRY_CONVERT = 2     # rewritten by the core (uncompressed, above the target)
    ENTRY_STOP = 3        # the run ends before it (it needs a codec, or is refused)


cdef struct Cursor:
    const unsigned char* p
    const unsigned char* end
    const unsigned char* start     # of the whole buffer, for error positions
    int error
    Py_ssize_t error_at


cdef struct Fields:
    int64_t offset                 # absolute
    int64_t timestamp
    const unsigned char* key
    int64_t key_len                # -1 = null
    const unsigned char* value
    int64_t value_len
    const unsigned char* headers   # v2: first header byte
    int64_t header_count
    const unsigned char* headers_end


cdef struct LegacyEntry:
    int64_t offset
    int64_t size            # of the whole entry, log overhead included
    int magic
    int attributes
    Fields fields


cdef struct Conversion:
    int to_magic
    int64_t first_offset            # records below it are dropped (uncompressed sources only)
    bint relative                   # offsets written relative to the first record (v1 compressed inner)
    int64_t inner_base              # subtracted from written offsets
    unsigned char* out
    Py_ssize_t capacity
    Py_ssize_t written
    int64_t records
    int64_t last_written_offset
    int64_t max_timestamp


cdef struct Rewrite:
    unsigned char* out              # the slice being written
    Py_ssize_t capacity
    Py_ssize_t written
    Py_ssize_t slice_bytes          # a slice ends once it holds this much
    Py_ssize_t needed               # size of a record larger than an empty slice's capacity
    int64_t records                 # records written: the next offset delta
    int64_t first_timestamp         # the batch's base timestamp
    int64_t max_timestamp
    bint legacy                     # the section being read: v0/v1 messages, else a v2 records section
    int64_t left                    # v2: records the section still holds
    int64_t base_timestamp          # v2: the section's batch's
    bint log_append                 # records take log_append_time (a LogAppendTime batch or wrapper)
    int64_t log_append_time
