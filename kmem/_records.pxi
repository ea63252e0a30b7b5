# Kafka record formats (SPEC.md §4, §5): checksums, varints, v2 record and legacy entry parsing with
# bounds checks, legacy entry writing, and the v2/v1 -> v1/v0 down-conversion loop.
#
# Every length read from the input is checked against the end of its region before it is used; the
# parsers return an error code plus the position where the problem was found, and the Python-facing
# functions turn those into CorruptRecordError. Policy (which batch to convert, codecs, stats) lives in
# kmem/records/.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_XDECREF
from libc.stdint cimport INT64_MAX, INT64_MIN, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy

# CRC-32 (legacy entries) and CRC-32C (v2 batches) are written here in C: zlib's CRC-32 runs at ~4 GB/s
# on one core, which would cap conversion at 1 KiB values, so on x86_64 with PCLMULQDQ the bulk is folded
# with carry-less multiplication (Intel's "Fast CRC Computation Using PCLMULQDQ", reflected constants)
# and zlib finishes the tail. CRC-32C uses SSE4.2 / ARMv8 CRC instructions when present and a portable
# slicing-by-8 table otherwise (rather than the `crc32c` package: no extra runtime dependency, and v2
# CRCs are only computed to build batches or verify them on request). CPU features are detected at run
# time with cpuid, so one x86_64 wheel serves every CPU; aarch64 builds use the instructions only when
# the compiler targets them (e.g. macOS arm64), else the tables. xxh32 is needed only for the 1-byte
# LZ4 frame header checksum.
cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    #include <string.h>
    #include <zlib.h>

    static uint32_t kmem_crc32c_table[8][256];
    static uint32_t kmem_crc32_table[256];     /* byte-wise CRC-32, for short inputs and tails */

    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    #define KMEM_X86 1
    #include <cpuid.h>
    #include <immintrin.h>
    static int kmem_has_pclmul = 0, kmem_has_sse42 = 0;

    /* CRC-32 of len bytes (len >= 64, a multiple of 16); crc and result are in zlib's inverted form. */
    __attribute__((target("pclmul,sse4.1")))
    static uint32_t kmem_crc32_fold(uint32_t crc, const unsigned char* buf, size_t len) {
        const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
        const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
        const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
        const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
        const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
        __m128i x1 = _mm_loadu_si128((const __m128i*)(buf + 0x00));
        __m128i x2 = _mm_loadu_si128((const __m128i*)(buf + 0x10));
        __m128i x3 = _mm_loadu_si128((const __m128i*)(buf + 0x20));
        __m128i x4 = _mm_loadu_si128((const __m128i*)(buf + 0x30));
        __m128i x5, x6, x7, x8;
        x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
        buf += 64;
        len -= 64;
        while (len >= 64) {     /* fold four 128-bit lanes by 512 bits */
            x5 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
            x6 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
            x7 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
            x8 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
            x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
            x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
            x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
            x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
            x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), _mm_loadu_si128((const __m128i*)(buf + 0x00)));
            x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), _mm_loadu_si128((const __m128i*)(buf + 0x10)));
            x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), _mm_loadu_si128((const __m128i*)(buf + 0x20)));
            x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), _mm_loadu_si128((const __m128i*)(buf + 0x30)));
            buf += 64;
            len -= 64;
        }
        /* fold the four lanes into one */
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x2), x5);
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x3), x5);
        x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x4), x5);
        while (len >= 16) {
            x5 = _mm_clmulepi64_si128(x1, k3k4, 0x00);
            x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11),
                                             _mm_loadu_si128((const __m128i*)buf)), x5);
            buf += 16;
            len -= 16;
        }
        /* 128 -> 64 bits, then Barrett reduction to 32 */
        x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
        x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
        x2 = _mm_srli_si128(x1, 4);
        x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5k0, 0x00), x2);
        x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
        x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, mask32), poly, 0x00);
        return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x1, x2), 1);
    }

    __attribute__((target("sse4.2")))
    static uint32_t kmem_crc32c_hw(uint32_t crc, const unsigned char* p, size_t n) {
        uint64_t c = ~crc;
        for (; n >= 8; p += 8, n -= 8) {
            uint64_t v;
            memcpy(&v, p, 8);
            c = _mm_crc32_u64(c, v);
        }
        uint32_t c32 = (uint32_t)c;
        for (; n; p++, n--) c32 = _mm_crc32_u8(c32, *p);
        return ~c32;
    }
    #elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
    #define KMEM_ARM_CRC 1
    #include <arm_acle.h>
    static uint32_t kmem_crc32_arm(uint32_t crc, const unsigned char* p, size_t n) {
        crc = ~crc;
        for (; n >= 8; p += 8, n -= 8) { uint64_t v; memcpy(&v, p, 8); crc = __crc32d(crc, v); }
        for (; n; p++, n--) crc = __crc32b(crc, *p);
        return ~crc;
    }
    static uint32_t kmem_crc32c_hw(uint32_t crc, const unsigned char* p, size_t n) {
        crc = ~crc;
        for (; n >= 8; p += 8, n -= 8) { uint64_t v; memcpy(&v, p, 8); crc = __crc32cd(crc, v); }
        for (; n; p++, n--) crc = __crc32cb(crc, *p);
        return ~crc;
    }
    #endif

    static void kmem_crc_init(void) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i, d = i;
            for (int k = 0; k < 8; k++) {
                c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
                d = (d >> 1) ^ (0xEDB88320u & (0u - (d & 1u)));
            }
            kmem_crc32c_table[0][i] = c;
            kmem_crc32_table[i] = d;
        }
        for (int i = 0; i < 256; i++)
            for (int t = 1; t < 8; t++) {
                uint32_t prev = kmem_crc32c_table[t - 1][i];
                kmem_crc32c_table[t][i] = (prev >> 8) ^ kmem_crc32c_table[0][prev & 0xFF];
            }
    #ifdef KMEM_X86
        unsigned int a, b, c, d;
        if (__get_cpuid(1, &a, &b, &c, &d)) {
            kmem_has_pclmul = (c & bit_PCLMUL) && (c & bit_SSE4_1);
            kmem_has_sse42 = (c & bit_SSE4_2) != 0;
        }
    #endif
    }

    static inline uint32_t kmem_le32(const unsigned char* p) {
        return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    }

    static uint32_t kmem_crc32c_sw(uint32_t crc, const unsigned char* p, size_t n) {
        const uint32_t (*T)[256] = (const uint32_t (*)[256])kmem_crc32c_table;
        crc = ~crc;
        while (n >= 8) {
            uint32_t lo = kmem_le32(p) ^ crc, hi = kmem_le32(p + 4);
            crc = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24]
                ^ T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
            p += 8;
            n -= 8;
        }
        while (n--) crc = (crc >> 8) ^ T[0][(crc ^ *p++) & 0xFF];
        return ~crc;
    }

    static uint32_t kmem_crc32c(uint32_t crc, const unsigned char* p, size_t n, int software) {
    #ifdef KMEM_X86
        if (kmem_has_sse42 && !software) return kmem_crc32c_hw(crc, p, n);
    #elif defined(KMEM_ARM_CRC)
        if (!software) return kmem_crc32c_hw(crc, p, n);
    #endif
        return kmem_crc32c_sw(crc, p, n);
    }

    static uint32_t kmem_crc32(uint32_t crc, const unsigned char* p, size_t n, int software) {
    #ifdef KMEM_X86
        if (n >= 64 && kmem_has_pclmul && !software) {
            size_t bulk = n & ~(size_t)15;
            crc = ~kmem_crc32_fold(~crc, p, bulk);
            p += bulk;
            n -= bulk;
        }
    #elif defined(KMEM_ARM_CRC)
        if (!software) return kmem_crc32_arm(crc, p, n);
    #endif
        if (n >= 64) return (uint32_t)crc32(crc, p, (uInt)n);
        crc = ~crc;      /* short: a table loop costs less than zlib's call and setup */
        for (; n; p++, n--) crc = (crc >> 8) ^ kmem_crc32_table[(crc ^ *p) & 0xFF];
        return ~crc;
    }

    /* xxh32 for inputs shorter than 16 bytes (the LZ4 frame descriptor): the short-input path only. */
    static uint32_t kmem_xxh32_short(const unsigned char* p, size_t n, uint32_t seed) {
        const uint32_t P1 = 2654435761u, P2 = 2246822519u, P3 = 3266489917u, P4 = 668265263u, P5 = 374761393u;
        uint32_t h = seed + P5 + (uint32_t)n;
        for (; n >= 4; p += 4, n -= 4) {
            h += kmem_le32(p) * P3;
            h = ((h << 17) | (h >> 15)) * P4;
        }
        for (; n; p++, n--) {
            h += (*p) * P5;
            h = ((h << 11) | (h >> 21)) * P1;
        }
        h ^= h >> 15; h *= P2; h ^= h >> 13; h *= P3; h ^= h >> 16;
        return h;
    }
    """
    void kmem_crc_init() nogil
    uint32_t kmem_crc32c(uint32_t crc, const unsigned char* p, size_t n, int software) nogil
    uint32_t kmem_crc32(uint32_t crc, const unsigned char* p, size_t n, int software) nogil
    uint32_t kmem_xxh32_short(const unsigned char* p, size_t n, uint32_t seed) nogil

kmem_crc_init()

DEF V2_HEADER = 61
DEF LOG_OVERHEAD = 12
DEF LEGACY_V0_OVERHEAD = 14     # crc, magic, attributes, key length, value length
DEF LEGACY_V1_OVERHEAD = 22     # ... plus the timestamp
DEF ATTR_CODEC_MASK = 0x07
DEF ATTR_LOG_APPEND_TIME = 0x08
DEF ATTR_CONTROL = 0x20

# Error codes of the nogil parsers; messages in _ERRORS.
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
}


cdef struct Cursor:
    const unsigned char* p
    const unsigned char* end
    const unsigned char* start     # of the whole buffer, for error positions
    int error
    Py_ssize_t error_at


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
    # A sum outside int64 is refused rather than wrapped (Kafka's Java longs would wrap silently).
    if (off_delta > 0 and base_offset > INT64_MAX - off_delta) or (off_delta < 0 and base_offset < INT64_MIN - off_delta):
        return fail(c, ERR_OFFSET, begin)
    if (ts_delta > 0 and base_timestamp > INT64_MAX - ts_delta) or (ts_delta < 0 and base_timestamp < INT64_MIN - ts_delta):
        return fail(c, ERR_TIMESTAMP, begin)
    f.offset = base_offset + off_delta
    f.timestamp = base_timestamp + ts_delta
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


cdef struct LegacyEntry:
    int64_t offset
    int64_t size            # of the whole entry, log overhead included
    int magic
    int attributes
    Fields fields


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


# --- down-conversion ---------------------------------------------------------------------------------

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
        if (e.offset > 0 and absolute_base > INT64_MAX - e.offset) or (e.offset < 0 and absolute_base < INT64_MIN - e.offset):
            return fail(c, ERR_OFFSET, c.p - e.size)
        e.fields.offset = absolute_base + e.offset
        if e.fields.offset < cv.first_offset:
            continue
        e.fields.timestamp = -1
        if emit(c, cv, 0, &e.fields) < 0:
            return -1
    return 0


# Why a run of entries stopped (run_down_conversion).
cdef enum:
    STOP_END = 0          # no complete entry left (the rest is a truncated trailing entry, or nothing)
    STOP_COMPRESSED = 1   # the next entry is compressed and needs converting in Python (codecs)
    STOP_ZSTD = 2         # the next entry is zstd-compressed v2 and the target is below v2

RUN_END = STOP_END
RUN_COMPRESSED = STOP_COMPRESSED
RUN_ZSTD = STOP_ZSTD

# What run_entries does with an entry.
cdef enum:
    ENTRY_SKIP = 0        # a control batch below v2
    ENTRY_COPY = 1        # at or below the target magic
    ENTRY_CONVERT = 2     # uncompressed, above the target
    ENTRY_STOP = 3        # truncated, compressed or zstd: the run ends before it


cdef int classify(Cursor* c, int to_magic, int64_t* total, int* reason) noexcept nogil:
    """What to do with the entry at c.p (Kafka's checks on its size and magic); -1 on corrupt data."""
    cdef const unsigned char* p = c.p
    cdef int64_t size
    cdef int magic, codec, attributes
    if c.end - p < LOG_OVERHEAD:
        reason[0] = STOP_END
        return ENTRY_STOP
    size = be32(p + 8)
    if size < LEGACY_V0_OVERHEAD:
        return fail(c, ERR_ENTRY_SIZE, p)
    if size > c.end - p - LOG_OVERHEAD:
        reason[0] = STOP_END     # truncated trailing entry: ignored, as Kafka does
        return ENTRY_STOP
    total[0] = size + LOG_OVERHEAD
    magic = p[16]
    if magic > 2:
        return fail(c, ERR_MAGIC, p)
    if magic == 2:
        if total[0] < V2_HEADER:
            return fail(c, ERR_BATCH_SIZE, p)
        attributes = be16(p + 21)
        codec = attributes & ATTR_CODEC_MASK
        if to_magic < 2 and attributes & ATTR_CONTROL:
            return ENTRY_SKIP
        if to_magic < 2 and codec == 4:
            reason[0] = STOP_ZSTD
            return ENTRY_STOP
    else:
        codec = p[17] & ATTR_CODEC_MASK
    if magic <= to_magic:
        return ENTRY_COPY
    if codec != 0:
        reason[0] = STOP_COMPRESSED
        return ENTRY_STOP
    return ENTRY_CONVERT


cdef int plan_run(Cursor* c, int to_magic, Py_ssize_t* bound, int* reason) noexcept nogil:
    """Advance c.p to the end of the run of entries that need no codec, summing a bound on its output."""
    cdef int64_t total = 0
    cdef int action
    while True:
        action = classify(c, to_magic, &total, reason)
        if action < 0:
            return -1
        if action == ENTRY_STOP:
            return 0
        if action == ENTRY_COPY:
            bound[0] += total
        elif action == ENTRY_CONVERT:
            bound[0] += conversion_bound(total - V2_HEADER, be32(c.p + 57)) if c.p[16] == 2 else total
        c.p += total


cdef int convert_run(Cursor* c, Conversion* cv, int64_t* source_bytes, int64_t* uncompressed) noexcept nogil:
    """Copy or convert every entry of a planned run (c spans it exactly) into cv.out."""
    cdef int64_t total = 0, count, records_before
    cdef Py_ssize_t written_before
    cdef const unsigned char* p
    cdef Cursor inner
    cdef int action, reason
    while c.p < c.end:
        p = c.p
        action = classify(c, cv.to_magic, &total, &reason)
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


cdef _corrupt(int code, Py_ssize_t at, Py_ssize_t base=0):
    from kmem.errors import CorruptRecordError
    return CorruptRecordError(_ERRORS.get(code, "corrupt record data"), base + at)


def run_down_conversion(const unsigned char[::1] data, Py_ssize_t pos, int to_magic, int64_t first_offset):
    """Convert the run of entries starting at ``pos`` that needs no codec.

    Returns ``(output bytearray, stop position, reason, records converted, source bytes kept, uncompressed
    bytes written)``; ``reason`` is RUN_END, RUN_COMPRESSED or RUN_ZSTD. The run's batch headers are
    read first to bound its output, which is then written in one pass and cut to size.
    """
    cdef Py_ssize_t n = data.shape[0]
    if pos < 0 or pos > n:
        raise IndexError("position outside the data")
    if n == pos:
        return b"", pos, RUN_END, 0, 0, 0
    cdef const unsigned char* start = &data[0]
    cdef Cursor c = Cursor(start + pos, start + n, start, OK, 0)
    cdef Py_ssize_t bound = 0
    cdef int64_t source_bytes = 0, uncompressed = 0
    cdef int reason = STOP_END, rc
    with nogil:
        rc = plan_run(&c, to_magic, &bound, &reason)
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
        rc = convert_run(&c, &cv, &source_bytes, &uncompressed)
    if rc < 0:
        Py_XDECREF(raw)
        raise _corrupt(c.error, c.error_at)
    return fit_bytearray(raw, cv.written), stop, reason, cv.records, source_bytes, uncompressed


def convert_records(const unsigned char[::1] data, int source_magic, int64_t count, int64_t base_offset,
                    int64_t base_timestamp, bint log_append, int64_t log_append_time, int to_magic, bint relative,
                    Py_ssize_t base=0):
    """The (decompressed) records of one batch as uncompressed ``to_magic`` entries.

    ``source_magic`` 2: ``data`` is a v2 records section of ``count`` records (``log_append``: a
    LogAppendTime batch, whose records all take ``log_append_time``). 0/1: ``data`` is legacy inner
    entries and ``base_offset`` is the absolute base added to their offsets. ``relative``: write
    offsets relative to the first record (v1 compressed inner entries). Returns ``(entries bytearray,
    records, last offset, max timestamp)``.
    """
    cdef Py_ssize_t n = data.shape[0]
    cdef const unsigned char* start = &data[0] if n else NULL
    cdef Cursor c = Cursor(start, start + n, start, OK, 0)
    cdef Py_ssize_t bound = conversion_bound(n, count) if source_magic == 2 else n
    cdef PyObject* raw = new_bytearray(NULL, bound)
    if raw == NULL:
        raise MemoryError(f"cannot allocate {bound} bytes")
    cdef Conversion cv
    cdef int rc
    start_conversion(&cv, to_magic, -(1LL << 62), relative, <unsigned char*>PyByteArray_AS_STRING(<object>raw), bound)
    with nogil:
        if source_magic == 2:
            rc = convert_v2_records(&c, count, base_offset, base_timestamp, log_append, log_append_time, &cv)
        else:
            rc = convert_legacy_entries(&c, base_offset, &cv)
    if rc < 0:
        Py_XDECREF(raw)
        raise _corrupt(c.error, c.error_at, base)
    return fit_bytearray(raw, cv.written), cv.records, cv.last_written_offset, cv.max_timestamp


# --- reading -------------------------------------------------------------------------------------------

def entry_at(const unsigned char[::1] data, Py_ssize_t pos):
    """``(size, magic)`` of the top-level entry at ``pos``, or None when no complete entry is left.

    Raises CorruptRecordError for a size below the minimum overhead or an unknown magic (Kafka's
    ByteBufferLogInputStream checks); a truncated trailing entry is not an error.
    """
    cdef Py_ssize_t n = data.shape[0]
    if pos < 0 or n - pos < LOG_OVERHEAD:
        return None
    cdef int64_t size = be32(&data[pos + 8])
    if size < LEGACY_V0_OVERHEAD:
        raise _corrupt(ERR_ENTRY_SIZE, pos)
    if size > n - pos - LOG_OVERHEAD:
        return None
    cdef int magic = data[pos + 16]
    if magic > 2:
        raise _corrupt(ERR_MAGIC, pos)
    if magic == 2 and size + LOG_OVERHEAD < V2_HEADER:
        raise _corrupt(ERR_BATCH_SIZE, pos)
    return LOG_OVERHEAD + size, magic


def decode_v2_records(const unsigned char[::1] data, Py_ssize_t pos, int64_t count, int64_t max_objects,
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


def count_v2_objects(const unsigned char[::1] data, int64_t count, Py_ssize_t base=0):
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


def decode_legacy_entries(const unsigned char[::1] data, Py_ssize_t base=0, Py_ssize_t pos=0,
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


def scan_legacy_entries(const unsigned char[::1] data, Py_ssize_t base=0):
    """``(count, first offset, last offset, lowest offset, highest offset)`` of the legacy entries
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
    return count, first, last, lowest, highest


# --- writing -------------------------------------------------------------------------------------------

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


# --- checksums -----------------------------------------------------------------------------------------

def crc32c(const unsigned char[::1] data, uint32_t value=0, bint software=False):
    """CRC-32C (Castagnoli) of ``data``, continuing from ``value`` (``software``: table path only)."""
    cdef Py_ssize_t n = data.shape[0]
    cdef uint32_t result
    if n == 0:
        return value
    with nogil:
        result = kmem_crc32c(value, &data[0], n, software)
    return result


def crc32(const unsigned char[::1] data, uint32_t value=0, bint software=False):
    """CRC-32 (IEEE, as zlib) of ``data``, continuing from ``value`` (``software``: zlib only)."""
    cdef Py_ssize_t n = data.shape[0]
    cdef uint32_t result
    if n == 0:
        return value
    with nogil:
        result = kmem_crc32(value, &data[0], n, software)
    return result


def xxh32_short(const unsigned char[::1] data, uint32_t seed=0):
    """xxHash32 of fewer than 16 bytes (LZ4 frame header checksums)."""
    if data.shape[0] >= 16:
        raise ValueError("xxh32_short takes fewer than 16 bytes")
    return kmem_xxh32_short(&data[0] if data.shape[0] else NULL, data.shape[0], seed)
