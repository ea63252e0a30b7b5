# CRC-32 and CRC-32C (Kafka's Crc32 for v0/v1 messages, Crc32C for v2 batches) and the short xxHash32
# of LZ4 frame headers.

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
    static int kmem_has_pclmul = 0, kmem_has_sse42 = 0, kmem_has_vpclmul = 0;

    /* Fold constants (reflected, shifted left by one) are x^(D+32) and x^(D-32) mod P for a folding
       distance of D bits, low and high 64 bits; k5 is x^64 mod P. */
    #define KMEM_K128 _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL)

    /* The last step of every fold: x1 (the CRC state of the bytes before buf) folded over the len bytes
       at buf (a multiple of 16), then reduced to 32 bits (Barrett). */
    __attribute__((target("pclmul,sse4.1")))
    static inline uint32_t kmem_crc32_reduce(__m128i x1, const unsigned char* buf, size_t len) {
        const __m128i k3k4 = KMEM_K128;
        const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
        const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
        const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
        __m128i x2, x5;
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

    /* The same with 256-bit VPCLMULQDQ (AVX2): eight 128-bit lanes folded by 1024 bits per 128 bytes,
       about twice the 128-bit loop's speed. len >= 256, a multiple of 16. */
    __attribute__((target("vpclmulqdq,avx2,pclmul,sse4.1")))
    static uint32_t kmem_crc32_fold_wide(uint32_t crc, const unsigned char* buf, size_t len) {
        const __m256i k1024 = _mm256_set_epi64x(0x014a7fe880LL, 0x01e88ef372LL, 0x014a7fe880LL, 0x01e88ef372LL);
        const __m256i k256 = _mm256_set_epi64x(0x015a546366LL, 0x00f1da05aaLL, 0x015a546366LL, 0x00f1da05aaLL);
        const __m128i k3k4 = KMEM_K128;
        __m256i y1 = _mm256_loadu_si256((const __m256i*)(buf + 0x00));
        __m256i y2 = _mm256_loadu_si256((const __m256i*)(buf + 0x20));
        __m256i y3 = _mm256_loadu_si256((const __m256i*)(buf + 0x40));
        __m256i y4 = _mm256_loadu_si256((const __m256i*)(buf + 0x60));
        __m128i lo, hi;
        y1 = _mm256_xor_si256(y1, _mm256_setr_epi32((int)crc, 0, 0, 0, 0, 0, 0, 0));
        buf += 128;
        len -= 128;
    #define KMEM_FOLD256(y, k, next) _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128((y), (k), 0x00), \
                                                                         _mm256_clmulepi64_epi128((y), (k), 0x11)), (next))
        while (len >= 128) {
            y1 = KMEM_FOLD256(y1, k1024, _mm256_loadu_si256((const __m256i*)(buf + 0x00)));
            y2 = KMEM_FOLD256(y2, k1024, _mm256_loadu_si256((const __m256i*)(buf + 0x20)));
            y3 = KMEM_FOLD256(y3, k1024, _mm256_loadu_si256((const __m256i*)(buf + 0x40)));
            y4 = KMEM_FOLD256(y4, k1024, _mm256_loadu_si256((const __m256i*)(buf + 0x60)));
            buf += 128;
            len -= 128;
        }
        /* four registers into one (each 256 bits ahead of the last), then its two lanes into one */
        y2 = KMEM_FOLD256(y1, k256, y2);
        y3 = KMEM_FOLD256(y2, k256, y3);
        y4 = KMEM_FOLD256(y3, k256, y4);
    #undef KMEM_FOLD256
        lo = _mm256_castsi256_si128(y4);
        hi = _mm256_extracti128_si256(y4, 1);
        lo = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(lo, k3k4, 0x00), _mm_clmulepi64_si128(lo, k3k4, 0x11)),
                           hi);
        return kmem_crc32_reduce(lo, buf, len);
    }

    /* CRC-32 of len bytes (len >= 64, a multiple of 16); crc and result are in zlib's inverted form. */
    __attribute__((target("pclmul,sse4.1")))
    static uint32_t kmem_crc32_fold(uint32_t crc, const unsigned char* buf, size_t len) {
        const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
        const __m128i k3k4 = KMEM_K128;
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
        return kmem_crc32_reduce(x1, buf, len);
    }

    /* The crc32 instruction takes 3 cycles and can start one a cycle, so three CRCs of consecutive blocks of
       KMEM_CRC32C_BLOCK bytes run side by side (a 287 kB batch in about half the time of one stream); the
       second and third are joined to the first by the CRC state's linearity: state(A B) = state(A) * x^(8 |B|) ^ state(0, B), the product mod P
       read from kmem_crc32c_shift (set by kmem_crc_init), four lookups. */
    #define KMEM_CRC32C_BLOCK 8192
    static uint32_t kmem_crc32c_shift_table[4][256];

    static inline uint32_t kmem_crc32c_shift(uint32_t state) {
        return kmem_crc32c_shift_table[0][state & 0xFF] ^ kmem_crc32c_shift_table[1][(state >> 8) & 0xFF]
               ^ kmem_crc32c_shift_table[2][(state >> 16) & 0xFF] ^ kmem_crc32c_shift_table[3][state >> 24];
    }

    __attribute__((target("sse4.2")))
    static uint32_t kmem_crc32c_hw(uint32_t crc, const unsigned char* p, size_t n) {
        uint64_t c = ~crc;
        for (; n >= 3 * KMEM_CRC32C_BLOCK; p += 3 * KMEM_CRC32C_BLOCK, n -= 3 * KMEM_CRC32C_BLOCK) {
            uint64_t c1 = 0, c2 = 0;
            for (size_t i = 0; i < KMEM_CRC32C_BLOCK; i += 8) {
                uint64_t v0, v1, v2;
                memcpy(&v0, p + i, 8);
                memcpy(&v1, p + KMEM_CRC32C_BLOCK + i, 8);
                memcpy(&v2, p + 2 * KMEM_CRC32C_BLOCK + i, 8);
                c = _mm_crc32_u64(c, v0);
                c1 = _mm_crc32_u64(c1, v1);
                c2 = _mm_crc32_u64(c2, v2);
            }
            c = kmem_crc32c_shift(kmem_crc32c_shift((uint32_t)c) ^ (uint32_t)c1) ^ (uint32_t)c2;
        }
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

    /* a * b mod P in CRC-32C's reflected bit order (the coefficient of x^0 is the top bit) */
    static uint32_t kmem_crc32c_multiply(uint32_t a, uint32_t b) {
        uint32_t product = 0;
        for (uint32_t bit = 0x80000000u; bit; bit >>= 1) {
            if (a & bit) product ^= b;
            b = (b >> 1) ^ (0x82F63B78u & (0u - (b & 1u)));     /* b * x */
        }
        return product;
    }

    /* x^(8 length) mod P, by squaring x: what moves a CRC state past length bytes */
    static uint32_t kmem_crc32c_x8n(uint64_t length) {
        uint32_t power = 0x40000000u, shift = 0x80000000u;      /* x^1, x^0 */
        for (uint64_t bits = 8 * length; bits; bits >>= 1) {
            if (bits & 1) shift = kmem_crc32c_multiply(shift, power);
            power = kmem_crc32c_multiply(power, power);
        }
        return shift;
    }

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
        /* x^(8 KMEM_CRC32C_BLOCK)'s product with each byte of a state at each of its four places */
        uint32_t shift = kmem_crc32c_x8n(KMEM_CRC32C_BLOCK);
        for (int place = 0; place < 4; place++)
            for (uint32_t v = 0; v < 256; v++)
                kmem_crc32c_shift_table[place][v] = kmem_crc32c_multiply(v << (8 * place), shift);
        unsigned int a, b, c, d;
        if (__get_cpuid(1, &a, &b, &c, &d)) {
            kmem_has_pclmul = (c & bit_PCLMUL) && (c & bit_SSE4_1);
            kmem_has_sse42 = (c & bit_SSE4_2) != 0;
            /* 256-bit registers need the OS to save them (OSXSAVE, and XCR0's SSE and AVX state bits) */
            if (kmem_has_pclmul && (c & bit_OSXSAVE)) {
                unsigned int xcr0_lo, xcr0_hi;
                __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
                if ((xcr0_lo & 6) == 6 && __get_cpuid_count(7, 0, &a, &b, &c, &d))
                    kmem_has_vpclmul = (b & (1u << 5)) && (c & (1u << 10));     /* AVX2, VPCLMULQDQ */
            }
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
            crc = ~(n >= 256 && kmem_has_vpclmul ? kmem_crc32_fold_wide(~crc, p, bulk) : kmem_crc32_fold(~crc, p, bulk));
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
    uint32_t kmem_crc32c_multiply(uint32_t a, uint32_t b) nogil
    uint32_t kmem_crc32c_x8n(uint64_t length) nogil

kmem_crc_init()


def crc32c(const unsigned char[::1] data, uint32_t value=0, bint software=False):
    """CRC-32C (Castagnoli) of ``data``, continuing from ``value`` (``software``: table path only)."""
    cdef Py_ssize_t n = data.shape[0]
    cdef uint32_t result
    if n == 0:
        return value
    with nogil:
        result = kmem_crc32c(value, &data[0], n, software)
    return result


cdef uint32_t crc32c_combine_c(uint32_t first, uint32_t second, uint64_t second_length) noexcept nogil:
    """The CRC-32C of A + B from A's (``first``) and B's (``second``, of ``second_length`` bytes): A's
    CRC moved past B's length (times x^(8 len) modulo the polynomial) plus B's."""
    return kmem_crc32c_multiply(kmem_crc32c_x8n(second_length), first) ^ second


def crc32c_combine(uint32_t first, uint32_t second, uint64_t second_length):
    """``crc32c(a + b)`` from ``crc32c(a)``, ``crc32c(b)`` and ``len(b)``: for a header whose CRC'd
    content is known only after what follows it was written (a merged snapshot's entry count)."""
    return crc32c_combine_c(first, second, second_length)


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
