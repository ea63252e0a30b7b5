# Bloom filters over producer ids (KIP-1044), bit-compatible with commons-collections 4.5.0.
#
# Key: the producer id as 8 big-endian bytes. (h1, h2) = MurmurHash3_x64_128 of the key, seed 0
# (commons-codec's hash128x64). Indices come from commons-collections' EnhancedDoubleHasher(h1, h2).
#
# The bitmap is kept in the `.bloom` sidecar's own layout everywhere, in memory as on disk: Java longs
# written big-endian, bit i in long i >> 6 at bit i & 63. Within that layout bit i sits in byte
# (i >> 3) ^ 7 at bit i & 7, so one set of loops serves heap filters and memory-mapped sidecars, and a
# filter is written to disk without converting anything.

from libc.stdint cimport int64_t, uint8_t, uint64_t
from cpython.number cimport PyNumber_Index
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cdef extern from *:
    """
    static inline uint64_t kmem_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

    static inline uint64_t kmem_fmix64(uint64_t k) {
        k ^= k >> 33;
        k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33;
        k *= 0xc4ceb9fe1a85ec53ULL;
        k ^= k >> 33;
        return k;
    }

    /* MurmurHash3_x64_128 of the 8 bytes big-endian(pid), seed 0. An 8-byte key has no full 16-byte
       block: it is all "tail", loaded little-endian into k1, which is the byte-swapped pid. */
    static inline void kmem_murmur3_pid(uint64_t pid, uint64_t *out1, uint64_t *out2) {
        uint64_t k1 = __builtin_bswap64(pid);
        uint64_t h1, h2 = 0;
        k1 *= 0x87c37b91114253d5ULL;
        k1 = kmem_rotl64(k1, 31);
        k1 *= 0x4cf5ad432745937fULL;
        h1 = k1;
        h1 ^= 8;
        h2 ^= 8;
        h1 += h2;
        h2 += h1;
        h1 = kmem_fmix64(h1);
        h2 = kmem_fmix64(h2);
        h1 += h2;
        h2 += h1;
        *out1 = h1;
        *out2 = h2;
    }
    """
    uint64_t kmem_bswap64 "__builtin_bswap64"(uint64_t x) nogil
    int kmem_popcount64 "__builtin_popcountll"(uint64_t x) nogil
    void kmem_prefetch_w "__builtin_prefetch"(const void* p, int rw) nogil
    void kmem_murmur3_pid(uint64_t pid, uint64_t* out1, uint64_t* out2) nogil


# The longest k accepted: keeps the per-key index buffer on the stack. Far above any useful shape
# (k = 20 already means p ~ 1e-6).
cdef enum:
    MAX_HASHES = 1024

cdef inline Py_ssize_t bit_byte(int64_t i) noexcept nogil:
    return <Py_ssize_t>((i >> 3) ^ 7)


@cython.cdivision(True)     # m >= 1: every caller checked the shape
cdef inline void hasher_indices(uint64_t initial, uint64_t increment, int64_t m, int k,
                                int64_t* out) noexcept nogil:
    """commons-collections 4.5.0's EnhancedDoubleHasher: index = initial mod m, inc = increment mod m;
    then for i = 1 .. k - 1: index -= inc, inc -= i, both wrapped into [0, m). When k >= m, commons
    restarts i at 0 each time it reaches m. For m = 1 its counter starts at m and never restarts, which
    sends indices out of range from the fourth on (Java throws); restarting once i >= m keeps every
    index 0 there and changes nothing for m >= 2, where i never passes m."""
    cdef int64_t index = <int64_t>(initial % <uint64_t>m)
    cdef int64_t inc = <int64_t>(increment % <uint64_t>m)
    cdef int64_t i = 1
    cdef int j
    out[0] = index
    for j in range(1, k):
        index -= inc
        index += m & (index >> 63)      # wrap without a branch: these signs are random
        out[j] = index
        inc -= i
        inc += m & (inc >> 63)
        i += 1
        if i >= m:
            i = 0


cdef inline void pid_indices(uint64_t pid, int64_t m, int k, int64_t* out) noexcept nogil:
    cdef uint64_t h1, h2
    kmem_murmur3_pid(pid, &h1, &h2)
    hasher_indices(h1, h2, m, k, out)


cdef inline int set_pid(uint8_t* bits, uint64_t pid, int64_t m, int k) noexcept nogil:
    """Set the bits of ``pid``; returns how many were clear before (so callers can track cardinality)."""
    cdef int64_t idx[MAX_HASHES]
    pid_indices(pid, m, k, idx)
    cdef int j, newly = 0
    cdef uint8_t mask
    for j in range(k):
        mask = <uint8_t>(1 << (idx[j] & 7))
        newly += (bits[bit_byte(idx[j])] & mask) == 0
        bits[bit_byte(idx[j])] |= mask
    return newly


cdef inline bint test_indices(const uint8_t* bits, const int64_t* idx, int k) noexcept nogil:
    cdef int j
    for j in range(k):
        if not (bits[bit_byte(idx[j])] >> (idx[j] & 7)) & 1:
            return False
    return True


cdef inline bint test_pid(const uint8_t* bits, uint64_t pid, int64_t m, int k) noexcept nogil:
    cdef int64_t idx[MAX_HASHES]
    pid_indices(pid, m, k, idx)
    return test_indices(bits, idx, k)


# Batch adds work in groups: all indices of a group are computed and their cache lines prefetched
# before any bit is set, so the random accesses of a group overlap instead of queueing one by one.
cdef enum:
    GROUP = 8
    GROUP_MAX_HASHES = 32

cdef void add_keys(uint8_t* bits, const uint64_t* keys, Py_ssize_t n, int64_t m, int k) noexcept nogil:
    cdef int64_t idx[GROUP * GROUP_MAX_HASHES]
    cdef Py_ssize_t start = 0, g, size
    cdef int j
    if k > GROUP_MAX_HASHES:
        for start in range(n):
            set_pid(bits, keys[start], m, k)
        return
    while start < n:
        size = min(GROUP, n - start)
        for g in range(size):
            pid_indices(keys[start + g], m, k, &idx[g * k])
            for j in range(k):
                kmem_prefetch_w(&bits[bit_byte(idx[g * k + j])], 1)
        for j in range(size * k):
            bits[bit_byte(idx[j])] |= <uint8_t>(1 << (idx[j] & 7))
        start += size


cdef uint64_t pid_key(object pid) except? 0:
    """The 64 key bits of a producer id given as a Python int (or numpy integer)."""
    try:
        return <uint64_t>(<long long>PyNumber_Index(pid))     # Index: no silent truncation of floats
    except (OverflowError, TypeError):
        from kmem.errors import InvalidArgumentError
        raise InvalidArgumentError(f"a producer id is a signed 64-bit integer, not {pid!r}") from None


def murmur3_pid(pid):
    """(h1, h2): the two unsigned 64-bit halves of MurmurHash3_x64_128(big-endian pid, seed 0)."""
    cdef uint64_t h1, h2
    kmem_murmur3_pid(pid_key(pid), &h1, &h2)
    return h1, h2


def bloom_hasher_indices(uint64_t initial, uint64_t increment, long long m, int k):
    """The k indices EnhancedDoubleHasher(initial, increment) gives in m bits (duplicates kept)."""
    if m < 1 or k < 1 or k > MAX_HASHES:
        raise ValueError(f"bad shape m={m} k={k}")
    cdef int64_t idx[MAX_HASHES]
    hasher_indices(initial, increment, m, k, idx)
    return [idx[j] for j in range(k)]


BLOOM_MAX_HASHES = MAX_HASHES


cdef class BloomBits:
    """m bits in the sidecar layout over a caller's buffer, k hashes per producer id.

    The base of ``kmem.bloom.BloomFilter``, which checks the shape and the buffer and then calls
    ``_attach``: a bytes-like object of exactly ceil(m / 64) * 8 bytes (writable, or read-only for a
    memory-mapped sidecar). ``_detach`` drops the buffer view so a memory map can be closed; every
    later call raises. ``queries`` counts the GIL-free loops running over the bits: ``_detach`` refuses
    while any runs, since unmapping under one would crash the process.
    """
    cdef const uint8_t[::1] view
    cdef uint8_t* writable     # NULL for read-only buffers
    cdef int64_t m
    cdef int k
    cdef bint attached
    cdef Py_ssize_t queries

    def __cinit__(self, *args, **kwargs):
        self.attached = False

    def _attach(self, buffer, long long m, int k):
        if m < 1 or k < 1 or k > MAX_HASHES:
            raise ValueError(f"bad shape m={m} k={k}")
        cdef const uint8_t[::1] view = buffer
        if view.shape[0] != ((m + 63) >> 6) << 3:
            raise ValueError(f"bitmap of {view.shape[0]} bytes does not fit {m} bits")
        self.view = view
        self.m = m
        self.k = k
        self.writable = NULL if memoryview(buffer).readonly else <uint8_t*>&view[0]
        self.attached = True

    def _detach(self):
        if self.queries:
            from kmem.errors import IllegalStateError
            raise IllegalStateError("the filter is being queried by another thread; close it afterwards")
        self.attached = False
        self.writable = NULL
        self.view = None

    cdef int check(self, bint write) except -1:
        if not self.attached:
            from kmem.errors import IllegalStateError
            raise IllegalStateError("the filter is closed")
        if write and self.writable == NULL:
            from kmem.errors import IllegalStateError
            raise IllegalStateError("the filter is read-only (a memory-mapped sidecar)")
        return 0

    def add(self, pid):
        """Set the k bits of ``pid``; returns the number of bits that were clear (0: maybe present)."""
        cdef uint64_t key = pid_key(pid)
        self.check(True)
        return set_pid(self.writable, key, self.m, self.k)

    def __contains__(self, pid):
        cdef uint64_t key = pid_key(pid)
        self.check(False)
        return test_pid(&self.view[0], key, self.m, self.k)

    def _add_keys(self, const uint64_t[::1] keys):
        """Set the bits of every id in ``keys`` (int64 ids viewed as uint64)."""
        self.check(True)
        cdef Py_ssize_t n = keys.shape[0]
        self.queries += 1
        try:
            with nogil:
                add_keys(self.writable, &keys[0] if n else NULL, n, self.m, self.k)
        finally:
            self.queries -= 1

    def _contains_keys(self, const uint64_t[::1] keys, uint8_t[::1] out):
        """out[i] = 1 if keys[i] may be in the filter, else 0."""
        self.check(False)
        if out.shape[0] != keys.shape[0]:
            raise ValueError("output length differs from the number of keys")
        cdef Py_ssize_t n = keys.shape[0], i
        cdef const uint8_t* bits = &self.view[0]
        self.queries += 1
        try:
            with nogil:
                for i in range(n):
                    out[i] = test_pid(bits, keys[i], self.m, self.k)
        finally:
            self.queries -= 1

    def cardinality(self):
        """The number of set bits."""
        self.check(False)
        cdef Py_ssize_t words = self.view.shape[0] >> 3, w
        cdef const uint8_t* bits = &self.view[0]
        cdef uint64_t word
        cdef long long total = 0
        self.queries += 1
        try:
            with nogil:
                for w in range(words):
                    memcpy(&word, bits + (w << 3), 8)
                    total += kmem_popcount64(word)
        finally:
            self.queries -= 1
        return total

    def _merge_bits(self, BloomBits other):
        """OR ``other``'s bits (same m) into these."""
        self.check(True)
        other.check(False)
        if other.m != self.m:
            raise ValueError("bitmaps of different sizes")
        cdef Py_ssize_t n = self.view.shape[0], i
        cdef uint8_t* dst = self.writable
        cdef const uint8_t* src = &other.view[0]
        self.queries += 1
        other.queries += 1
        try:
            with nogil:
                for i in range(n):
                    dst[i] |= src[i]
        finally:
            self.queries -= 1
            other.queries -= 1
