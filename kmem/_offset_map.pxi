# The log cleaner's key map and its per-batch loops (Kafka's SkimpyOffsetMap and the record filter of
# LogCleaner.cleanInto): what to keep is decided by the caller (kmem.broker.log.cleaner), these only
# loop over a batch's records section.
#
# The map is one fixed buffer of slots, each a 16-byte hash of a key and the key's latest offset (24
# bytes, as Kafka's with MD5): memory never grows with the number of keys. The hash is
# MurmurHash3_x64_128 (seed 0), as strong against accidental collisions as MD5 for this purpose and far
# cheaper. Open addressing with linear probing from the hash's first 8 bytes; an all-zero hash marks an
# empty slot (a key hashing to zero is stored with its first byte set to 1).
#
# Every lookup lands on a random slot of a buffer of 100+ MiB and misses the caches (and the TLB): the loops
# hash the keys of a group of records and prefetch their slots before looking any up, so that the misses
# of a group overlap instead of queueing one by one.


cdef extern from *:
    """
    static inline uint64_t kmem_load64le(const unsigned char *p) {
        uint64_t v; memcpy(&v, p, 8);
    #if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }

    /* MurmurHash3_x64_128 of data[0:len], seed 0, written as h1 then h2 (little-endian). */
    static void kmem_murmur3_128(const unsigned char *data, Py_ssize_t len, unsigned char out[16]) {
        const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
        uint64_t h1 = 0, h2 = 0, k1, k2;
        Py_ssize_t blocks = len / 16, i;
        const unsigned char *tail = data + blocks * 16;
        for (i = 0; i < blocks; i++) {
            k1 = kmem_load64le(data + i * 16);
            k2 = kmem_load64le(data + i * 16 + 8);
            k1 *= c1; k1 = kmem_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
            h1 = kmem_rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
            k2 *= c2; k2 = kmem_rotl64(k2, 33); k2 *= c1; h2 ^= k2;
            h2 = kmem_rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
        }
        k1 = k2 = 0;
        switch (len & 15) {
        case 15: k2 ^= ((uint64_t)tail[14]) << 48; /* fall through */
        case 14: k2 ^= ((uint64_t)tail[13]) << 40; /* fall through */
        case 13: k2 ^= ((uint64_t)tail[12]) << 32; /* fall through */
        case 12: k2 ^= ((uint64_t)tail[11]) << 24; /* fall through */
        case 11: k2 ^= ((uint64_t)tail[10]) << 16; /* fall through */
        case 10: k2 ^= ((uint64_t)tail[9]) << 8; /* fall through */
        case 9: k2 ^= ((uint64_t)tail[8]);
                k2 *= c2; k2 = kmem_rotl64(k2, 33); k2 *= c1; h2 ^= k2; /* fall through */
        case 8: k1 ^= ((uint64_t)tail[7]) << 56; /* fall through */
        case 7: k1 ^= ((uint64_t)tail[6]) << 48; /* fall through */
        case 6: k1 ^= ((uint64_t)tail[5]) << 40; /* fall through */
        case 5: k1 ^= ((uint64_t)tail[4]) << 32; /* fall through */
        case 4: k1 ^= ((uint64_t)tail[3]) << 24; /* fall through */
        case 3: k1 ^= ((uint64_t)tail[2]) << 16; /* fall through */
        case 2: k1 ^= ((uint64_t)tail[1]) << 8; /* fall through */
        case 1: k1 ^= ((uint64_t)tail[0]);
                k1 *= c1; k1 = kmem_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        }
        h1 ^= (uint64_t)len; h2 ^= (uint64_t)len;
        h1 += h2; h2 += h1;
        h1 = kmem_fmix64(h1); h2 = kmem_fmix64(h2);
        h1 += h2; h2 += h1;
        memcpy(out, &h1, 8);
        memcpy(out + 8, &h2, 8);
    }
    """
    void kmem_murmur3_128(const unsigned char* data, Py_ssize_t length, unsigned char* out) nogil
    uint64_t kmem_load64le(const unsigned char* p) nogil

cdef enum:
    MAP_HASH = 16
    MAP_SLOT = 24           # hash, then the offset (native int64)
    MAP_GROUP = 8           # keys hashed and their slots prefetched before any is looked up


cdef inline void key_hash(const unsigned char* key, Py_ssize_t length, unsigned char* out) noexcept nogil:
    kmem_murmur3_128(key, length, out)
    if kmem_load64le(out) == 0 and kmem_load64le(out + 8) == 0:
        out[0] = 1          # all zero marks an empty slot


def murmur3_128(const unsigned char[::1] data not None):
    """The 16 bytes of MurmurHash3_x64_128 (seed 0) the map keys by: h1 then h2, little-endian."""
    cdef unsigned char out[MAP_HASH]
    kmem_murmur3_128(&data[0] if data.shape[0] else NULL, data.shape[0], out)
    return PyBytes_FromStringAndSize(<char*>out, MAP_HASH)


cdef class OffsetMap:
    """A fixed-size map from key hashes to offsets (Kafka's ``SkimpyOffsetMap``): ``memory // 24`` slots."""
    cdef unsigned char* _slots
    cdef readonly Py_ssize_t slots
    cdef readonly Py_ssize_t size
    cdef readonly int64_t latest_offset
    cdef readonly int64_t lookups, probes

    def __cinit__(self, Py_ssize_t memory):
        if memory < MAP_SLOT:
            raise ValueError(f"an offset map needs at least {MAP_SLOT} bytes (one slot), not {memory}")
        self.slots = memory // MAP_SLOT
        self._slots = <unsigned char*>calloc(self.slots, MAP_SLOT)
        if self._slots == NULL:
            raise MemoryError(f"cannot allocate an offset map of {memory} bytes")
        self.latest_offset = -1

    def __dealloc__(self):
        free(self._slots)

    @property
    def memory(self):
        """Bytes held by the slots."""
        return self.slots * MAP_SLOT

    def clear(self):
        """Empty the map (the buffer is kept)."""
        memset(self._slots, 0, self.slots * MAP_SLOT)
        self.size = 0
        self.latest_offset = -1
        self.lookups = self.probes = 0

    def update_latest_offset(self, int64_t offset):
        """The last offset the map covers: records above it are newer than anything mapped."""
        self.latest_offset = offset

    cdef inline Py_ssize_t _home(self, const unsigned char* hash_) noexcept nogil:
        """The slot where the probe for ``hash_`` starts."""
        return <Py_ssize_t>(kmem_load64le(hash_) % <uint64_t>self.slots)

    cdef unsigned char* _find(self, const unsigned char* hash_) noexcept nogil:
        """The slot holding ``hash_``, or the empty slot where it goes; NULL when the map is full without it."""
        cdef Py_ssize_t i = self._home(hash_), n
        cdef unsigned char* slot
        self.lookups += 1
        for n in range(self.slots):
            slot = self._slots + i * MAP_SLOT
            self.probes += 1
            if memcmp(slot, hash_, MAP_HASH) == 0:
                return slot
            if kmem_load64le(slot) == 0 and kmem_load64le(slot + 8) == 0:
                return slot
            i += 1
            if i == self.slots:
                i = 0
        return NULL

    cdef inline void _hash_and_prefetch(self, const unsigned char* key, Py_ssize_t length,
                                        unsigned char* hash_) noexcept nogil:
        """Hash a key and start loading the slot its probe starts at, for the lookup or update that follows."""
        key_hash(key, length, hash_)
        kmem_prefetch_w(self._slots + self._home(hash_) * MAP_SLOT, 1)

    cdef int _put_hash(self, const unsigned char* hash_, int64_t offset) noexcept nogil:
        cdef unsigned char* slot = self._find(hash_)
        if slot == NULL:
            return -1
        if kmem_load64le(slot) == 0 and kmem_load64le(slot + 8) == 0:
            memcpy(slot, hash_, MAP_HASH)
            self.size += 1
        memcpy(slot + MAP_HASH, &offset, 8)
        return 0

    cdef int64_t _get_hash(self, const unsigned char* hash_) noexcept nogil:
        cdef unsigned char* slot = self._find(hash_)
        cdef int64_t offset
        if slot == NULL or memcmp(slot, hash_, MAP_HASH) != 0:
            return -1
        memcpy(&offset, slot + MAP_HASH, 8)
        return offset

    cdef int _put(self, const unsigned char* key, Py_ssize_t length, int64_t offset) noexcept nogil:
        cdef unsigned char hash_[MAP_HASH]
        key_hash(key, length, hash_)
        return self._put_hash(hash_, offset)

    cdef int64_t _get(self, const unsigned char* key, Py_ssize_t length) noexcept nogil:
        cdef unsigned char hash_[MAP_HASH]
        key_hash(key, length, hash_)
        return self._get_hash(hash_)

    def put(self, const unsigned char[::1] key not None, int64_t offset):
        """Map ``key`` to ``offset``; OverflowError when every slot holds another key."""
        if self._put(&key[0] if key.shape[0] else NULL, key.shape[0], offset) < 0:
            raise OverflowError(f"the offset map is full ({self.slots} keys)")

    def get(self, const unsigned char[::1] key not None):
        """The offset mapped to ``key``, or -1."""
        return self._get(&key[0] if key.shape[0] else NULL, key.shape[0])

    def put_records(self, const unsigned char[::1] section not None, *, int64_t count, int64_t base_offset,
                    int64_t base_timestamp, int64_t start_offset, Py_ssize_t base=0):
        """Map the key of every record at or above ``start_offset`` in a v2 records section (``count``
        records, decompressed) to its offset; keyless records are skipped. Returns how many were mapped.
        The caller keeps room for ``count`` new keys (OverflowError otherwise, some records mapped)."""
        cdef Py_ssize_t n = section.shape[0]
        cdef const unsigned char* start = &section[0] if n else NULL
        cdef Cursor c = Cursor(start, start + n, start, OK, 0)
        cdef Fields f
        cdef unsigned char hashes[MAP_GROUP * MAP_HASH]
        cdef int64_t offsets[MAP_GROUP]
        cdef int64_t mapped = 0, i = 0
        cdef int rc = 0, grouped, g
        if count < 0 or count > n:
            raise _corrupt(ERR_COUNT, 0, base)
        with nogil:
            while i < count and rc == 0:
                grouped = 0
                while grouped < MAP_GROUP and i < count:
                    if c.p >= c.end or parse_v2_record(&c, base_offset, base_timestamp, &f) < 0:
                        rc = -1
                        break
                    i += 1
                    if f.key_len >= 0 and f.offset >= start_offset:
                        self._hash_and_prefetch(f.key, f.key_len, &hashes[grouped * MAP_HASH])
                        offsets[grouped] = f.offset
                        grouped += 1
                for g in range(grouped if rc == 0 else 0):
                    if self._put_hash(&hashes[g * MAP_HASH], offsets[g]) < 0:
                        rc = -2
                        break
                    mapped += 1
        if rc == -1:
            raise _corrupt(c.error or ERR_COUNT, c.error_at if c.error else c.p - start, base)
        if rc == -2:
            raise OverflowError(f"the offset map is full ({self.slots} keys)")
        if c.p != c.end:
            raise _corrupt(ERR_RECORD_SIZE, c.p - start, base)
        return mapped


cdef class FilteredRecords:
    """What ``filter_v2_records`` kept of a records section."""
    cdef readonly bytes section           # the kept records, ready to follow a batch header
    cdef readonly int64_t count, max_timestamp, offset_of_max_timestamp, first_timestamp
    cdef readonly bint has_tombstones     # a kept record has a null value

    def __repr__(self):
        return f"FilteredRecords(count={self.count}, {len(self.section)} bytes, tombstones={self.has_tombstones})"


def filter_v2_records(OffsetMap offset_map not None, const unsigned char[::1] section not None, *, int64_t count,
                      int64_t base_offset, int64_t base_timestamp, bint retain_deletes,
                      new_base_timestamp=None, Py_ssize_t base=0):
    """The records of a v2 section (``count`` records, decompressed) the cleaner keeps (Kafka's
    ``shouldRetainRecord``): every record above the map's latest offset; otherwise a keyed record whose
    offset is at least the one mapped to its key, and, unless ``retain_deletes``, that has a value. Kept
    records are copied byte for byte (their offset deltas stay: a batch keeps its base offset), or with
    their timestamp delta rewritten against ``new_base_timestamp`` (a batch given a delete horizon,
    KIP-534)."""
    cdef Py_ssize_t n = section.shape[0]
    cdef const unsigned char* start = &section[0] if n else NULL
    cdef Cursor c = Cursor(start, start + n, start, OK, 0)
    cdef Cursor r
    cdef Fields* f
    cdef Fields fields[MAP_GROUP]
    cdef const unsigned char* begins[MAP_GROUP]
    cdef const unsigned char* ends[MAP_GROUP]
    cdef unsigned char hashes[MAP_GROUP * MAP_HASH]
    cdef const unsigned char* begin
    cdef const unsigned char* end
    cdef int64_t i = 0, length, ts_delta, found, new_base = 0
    cdef bint rebase = new_base_timestamp is not None, keep
    cdef Py_ssize_t capacity, written = 0, tail
    cdef unsigned char* out
    cdef unsigned char* p
    cdef unsigned char attributes
    cdef int rc = 0, grouped, g
    cdef FilteredRecords result
    if count < 0 or count > n:
        raise _corrupt(ERR_COUNT, 0, base)
    if rebase:
        new_base = new_base_timestamp
    capacity = n + (count * 15 if rebase else 0) + 1      # a rewritten record grows by at most 15 bytes
    out = <unsigned char*>malloc(capacity)
    if out == NULL:
        raise MemoryError()
    result = FilteredRecords()
    result.count = 0
    result.max_timestamp = -1
    result.offset_of_max_timestamp = -1
    result.first_timestamp = -1
    result.has_tombstones = False
    try:
        with nogil:
            while i < count:
                grouped = 0
                while grouped < MAP_GROUP and i < count:
                    f = &fields[grouped]
                    begins[grouped] = c.p
                    if c.p >= c.end or parse_v2_record(&c, base_offset, base_timestamp, f) < 0:
                        rc = -1
                        break
                    i += 1
                    ends[grouped] = c.p
                    if f.offset <= offset_map.latest_offset and f.key_len >= 0:
                        offset_map._hash_and_prefetch(f.key, f.key_len, &hashes[grouped * MAP_HASH])
                    grouped += 1
                if rc < 0:
                    break
                for g in range(grouped):
                    f, begin, end = &fields[g], begins[g], ends[g]
                    if f.offset > offset_map.latest_offset:
                        keep = True
                    elif f.key_len < 0:
                        keep = False
                    else:
                        found = offset_map._get_hash(&hashes[g * MAP_HASH])
                        keep = f.offset >= found and (f.value_len >= 0 or retain_deletes)
                    if not keep:
                        continue
                    if not rebase:
                        memcpy(out + written, begin, end - begin)
                        written += end - begin
                    else:
                        # length, attributes, timestamp delta, then the rest as it was
                        r = Cursor(begin, end, start, OK, 0)
                        read_varlong(&r, 5, &length)
                        attributes = r.p[0]
                        r.p += 1
                        read_varlong(&r, 10, &ts_delta)
                        tail = end - r.p
                        ts_delta = f.timestamp - new_base
                        p = put_varint(out + written, 1 + varint_size(ts_delta) + tail)
                        p[0] = attributes
                        p = put_varint(p + 1, ts_delta)
                        memcpy(p, r.p, tail)
                        written = p + tail - out
                    if result.count == 0:
                        result.first_timestamp = f.timestamp
                    result.count += 1
                    if f.timestamp > result.max_timestamp:
                        result.max_timestamp = f.timestamp
                        result.offset_of_max_timestamp = f.offset
                    if f.value_len < 0:
                        result.has_tombstones = True
        if rc < 0:
            raise _corrupt(c.error or ERR_COUNT, c.error_at if c.error else c.p - start, base)
        if c.p != c.end:
            raise _corrupt(ERR_RECORD_SIZE, c.p - start, base)
        result.section = PyBytes_FromStringAndSize(<char*>out, written)
    finally:
        free(out)
    return result


def invalid_records(const unsigned char[::1] section not None, *, int64_t count, bint keyless,
                    int64_t base_timestamp, int64_t low, int64_t high, Py_ssize_t limit, Py_ssize_t base=0):
    """The first ``limit`` records of a v2 records section (``count`` records, decompressed) that Kafka's
    ``LogValidator`` refuses, as ``[(index, offset delta, timestamp, has a key)]``: one without a key when
    ``keyless`` (a compacted topic), or one whose timestamp (``base_timestamp`` plus its delta) is neither -1
    nor within ``[low, high]`` (KIP-937). The records are parsed until the ``limit``-th is found (every one
    when fewer are), their structure checked."""
    cdef Py_ssize_t n = section.shape[0]
    cdef const unsigned char* start = &section[0] if n else NULL
    cdef Cursor c = Cursor(start, start + n, start, OK, 0)
    cdef Fields f
    cdef int64_t i = 0
    cdef int rc = 0
    cdef bint hit = False
    if count < 0 or count > n:
        raise _corrupt(ERR_COUNT, 0, base)
    if limit <= 0:
        raise ValueError("limit must be positive")
    found = []
    while True:
        with nogil:
            while i < count:
                if c.p >= c.end or parse_v2_record(&c, 0, base_timestamp, &f) < 0:
                    rc = -1
                    break
                i += 1
                if (keyless and f.key_len < 0) or (f.timestamp != -1 and not low <= f.timestamp <= high):
                    hit = True
                    break
        if rc < 0:
            raise _corrupt(c.error or ERR_COUNT, c.error_at if c.error else c.p - start, base)
        if not hit:
            return found
        found.append((i - 1, f.offset, f.timestamp, f.key_len >= 0))
        if len(found) == limit:
            return found
        hit = False
