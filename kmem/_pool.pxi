# Pool accounting (KIP-72) and buffer reuse.
#
# Thread safety comes from the GIL: every state change below happens in C with no Python code running
# in between (Python hooks are called only after the state is consistent), so concurrent callers
# cannot observe or produce a half-updated pool.

cimport cython
from cpython.buffer cimport PyBuffer_FillInfo
from libc.stdlib cimport free
from posix.mman cimport MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_READ, PROT_WRITE, munmap
from posix.mman cimport mmap as map_file

cdef extern from *:
    """
    static inline int kmem_bit_length(unsigned long long x) {
        return x ? 64 - __builtin_clzll(x) : 0;
    }
    """
    int kmem_bit_length(unsigned long long x) nogil

cdef extern from *:
    """
    #include <stdlib.h>
    /* glibc serves large allocations with fresh mappings (page faults, zeroing) until it sees a mapped
       chunk freed; then it raises its mmap threshold to that size and serves them from the heap. A
       pool that keeps its large blocks never frees one, which would leave every large allocation in
       the process (a request handler's copies, say) on fresh mappings. So, once per new largest block
       size, free one block of that size straight away, as the process would without the pool. glibc
       stops adapting above 32 MiB (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit). Called with the GIL held. */
    static size_t kmem_largest_block_shown = 0;
    static void* kmem_malloc_block(size_t size) {
    #if defined(__GLIBC__)
        if (size > kmem_largest_block_shown && size <= ((size_t)32 << 20)) {
            void* volatile shown = malloc(size);    /* volatile: the pair must not be optimised away */
            free(shown);
            kmem_largest_block_shown = size;
        }
    #endif
        return malloc(size);
    }
    """
    void* kmem_malloc_block(size_t size) nogil

# Free blocks are kept in size classes: 64 bytes, then four classes per power of two. Every block holds
# exactly the bytes handed out, so the pool's bound covers its block memory (rounding blocks up to their
# class let a full pool hold up to 25% more), and a cached block is reused for a request of its size.
cdef enum:
    MIN_CLASS_BITS = 6
    NUM_CLASSES = 4 * (63 - MIN_CLASS_BITS) + 1


cdef inline int size_class(long long n) noexcept nogil:
    if n <= (1 << MIN_CLASS_BITS):
        return 0
    cdef int e = kmem_bit_length(<unsigned long long>(n - 1)) - 1     # 2**e < n <= 2**(e+1)
    cdef long long step = (<long long>1) << (e - 2)
    cdef long long j = (n - ((<long long>1) << e) + step - 1) // step   # 1..4
    return <int>((e - MIN_CLASS_BITS) * 4 + j)


cdef struct FreeBlock:     # stored inside the free block itself, so smaller blocks are never cached
    FreeBlock* next
    long long size


@cython.final
@cython.no_gc_clear     # __dealloc__ needs `pool` to credit a leaked buffer back
@cython.freelist(256)
cdef class PooledBuffer:
    """A writable buffer of exactly ``len(buf)`` bytes handed out by a pool.

    Its contents are undefined when handed out (memory is reused, not zeroed). After ``release`` the
    buffer refuses new exports; views taken before release keep the memory alive, and it is not reused
    while any of them exists.
    """
    cdef char* data
    cdef Py_ssize_t length
    cdef int exports
    cdef bint released
    cdef PoolCore pool
    cdef public object origin     # where it was allocated, when the pool records that (debug pools)

    def __len__(self):
        return self.length

    @property
    def released(self):
        return self.released

    def __getbuffer__(self, Py_buffer* view, int flags):
        if self.released:
            raise BufferError("buffer was released to its pool and may no longer be used")
        PyBuffer_FillInfo(view, self, self.data, self.length, 0, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1
        if self.exports == 0 and self.released and self.data != NULL:
            self.pool.free_block(self.data, self.length)    # detached at release: views still existed
            self.data = NULL

    def __repr__(self):
        state = "released" if self.released else "outstanding"
        return f"<PooledBuffer {self.length} bytes, {state}>"

    def __dealloc__(self):
        if self.pool is not None and not self.released:
            self.pool.reclaim(self)
        if self.data != NULL:
            self.pool.free_block(self.data, self.length)
            self.data = NULL


cdef class PoolCore:
    """Kafka's SimpleMemoryPool accounting plus a bounded cache of free blocks.

    ``available`` follows Kafka exactly (it may go negative when not strict). Outstanding blocks hold
    exactly the bytes handed out, and free blocks are cached only while cached plus outstanding bytes stay
    within ``cache_limit``, the most the pool may hand out at once, so reuse never raises the pool's
    memory bound.

    With ``mapped`` every block is its own private anonymous mapping, given back to the system when
    freed, instead of a chunk of malloc's heap. Blocks of varying sizes (fetch responses) freed in the
    heap leave holes that the next, slightly larger block does not fit, so the heap, and the process's
    RSS, grows beyond the pool by an amount that depends on the order of sizes (on timing); mapped
    blocks keep RSS at what the pool holds, for a page fault per page of each fresh block. Its cached
    blocks stay within ``size`` beside the outstanding ones, so its memory exceeds ``size`` only by what a
    non-strict pool over-allocates.
    """
    cdef readonly long long size
    cdef readonly long long max_single_allocation
    cdef readonly bint strict
    cdef readonly bint mapped
    cdef readonly long long available
    cdef readonly long long cache_limit
    cdef readonly long long cached_bytes
    cdef readonly long long outstanding_bytes
    cdef readonly long long outstanding_count
    cdef bint depleted              # refused since the last success or release (Kafka's sensor period)
    # What refused callers need available to succeed (their size when strict, else 1); 0: nobody waits.
    cdef long long smallest_waiting
    cdef long long largest_waiting
    cdef FreeBlock* free_lists[NUM_CLASSES]

    def __init__(self, long long size, long long max_single_allocation, bint strict=False, bint mapped=False):
        # Arguments are checked by the Python subclass first. Until this runs, every request is out of
        # range (and the free lists are empty: a new object's fields are zeroed).
        self.size = size
        self.max_single_allocation = max_single_allocation
        self.strict = strict
        self.mapped = mapped
        self.available = size
        # A mapped pool bounds the memory it maps: cached blocks fit within its size beside outstanding ones.
        self.cache_limit = size if strict or mapped else size + max_single_allocation - 1

    def __dealloc__(self):
        self.free_cached()

    cdef void free_cached(self) noexcept:
        cdef FreeBlock* block
        for c in range(NUM_CLASSES):
            while self.free_lists[c] != NULL:
                block = self.free_lists[c]
                self.free_lists[c] = block.next
                self.free_block(block, block.size)
        self.cached_bytes = 0

    @property
    def is_out_of_memory(self):
        return self.available <= 0

    def try_allocate(self, object size_bytes):
        """A buffer of exactly ``size_bytes`` bytes, or None when the pool cannot spare it now.

        A size outside ``[1, max_single_allocation]`` raises ``InvalidArgumentError``, as Kafka raises
        IllegalArgumentException."""
        cdef Py_ssize_t n = 0       # stays 0, out of range, for a non-integer
        if isinstance(size_bytes, int):
            try:
                n = size_bytes
            except OverflowError:
                pass                # beyond any pool: out of range too
        if n < 1 or n > self.max_single_allocation:
            raise _invalid_argument(
                f"size_bytes must be an integer in [1, {self.max_single_allocation}], not {size_bytes!r}")
        if not self.has_room(n):
            return None
        cdef PooledBuffer buf = PooledBuffer.__new__(PooledBuffer)    # may run the cyclic GC, hence the re-check
        if not self.has_room(n):
            return None
        cdef char* data = self.reuse_cached(n)
        if data == NULL:
            self.evict_for(n)
            data = self.new_block(n)
            if data == NULL:
                raise MemoryError(f"cannot allocate {n} bytes")
        self.available -= n
        self.outstanding_bytes += n
        self.outstanding_count += 1
        buf.data = data
        buf.length = n
        buf.pool = self
        if self.depleted:
            self.depleted = False
            self._depletion_ended()
        return buf

    cdef inline bint has_room(self, Py_ssize_t size_bytes):
        cdef long long needed = size_bytes if self.strict else 1
        if self.available >= needed:
            return True
        if self.smallest_waiting == 0 or needed < self.smallest_waiting:
            self.smallest_waiting = needed
        if needed > self.largest_waiting:
            self.largest_waiting = needed
        if not self.depleted:
            self.depleted = True
            self._depletion_started()
        return False

    def release(self, buf):
        """Give a buffer from ``try_allocate`` back. Foreign buffers and second releases are refused."""
        if type(buf) is not PooledBuffer:
            raise _invalid_argument(f"cannot release {type(buf).__name__}: not a buffer from this pool")
        cdef PooledBuffer b = <PooledBuffer>buf
        if b.pool is not self:
            raise _invalid_argument("cannot release a buffer allocated by another pool")
        if b.released:
            raise _invalid_argument("buffer was already released")
        self.give_back(b)
        self.announce_return()

    cdef inline announce_return(self):
        # Memory came back: it ends a depletion period, and wakes refused callers once one of them can
        # succeed. Waiters are forgotten only when all of them can, so a later release that ends the
        # shortage for the rest still wakes them (they do not retry on their own).
        if self.depleted:
            self.depleted = False
            self._depletion_ended()
        if self.largest_waiting and self.available >= self.smallest_waiting:
            if self.available >= self.largest_waiting:
                self.smallest_waiting = self.largest_waiting = 0
            self._memory_returned()

    cdef char* reuse_cached(self, long long n) noexcept:
        # The head of n's class when it has exactly n bytes; NULL otherwise. A larger head is freed: the
        # fresh block that follows may then take its place in the heap (trimming it instead would leave
        # its tail to fragment the heap).
        cdef int c = size_class(n)
        cdef FreeBlock* block = self.free_lists[c]
        if block == NULL or block.size < n:
            return NULL
        self.free_lists[c] = block.next
        self.cached_bytes -= block.size
        if block.size == n:
            return <char*>block
        self.free_block(block, block.size)
        return NULL

    cdef void give_back(self, PooledBuffer b) noexcept:
        b.released = True
        self.available += b.length
        self.outstanding_bytes -= b.length
        self.outstanding_count -= 1
        if b.exports:
            return      # views exist: the memory stays with the buffer until they are gone
        cdef FreeBlock* block
        if (b.length >= <Py_ssize_t>sizeof(FreeBlock)
                and self.cached_bytes + self.outstanding_bytes + b.length <= self.cache_limit):
            block = <FreeBlock*>b.data
            block.size = b.length
            block.next = self.free_lists[size_class(b.length)]
            self.free_lists[size_class(b.length)] = block
            self.cached_bytes += b.length
        else:
            self.free_block(b.data, b.length)
        b.data = NULL

    cdef void evict_for(self, long long n) noexcept:
        # A fresh block must not push cached + outstanding memory past the limit: free cached blocks,
        # largest classes first, until it fits (or the cache is empty).
        cdef FreeBlock* block
        cdef int c = NUM_CLASSES - 1
        while self.cached_bytes and self.cached_bytes + self.outstanding_bytes + n > self.cache_limit:
            while self.free_lists[c] == NULL:
                c -= 1
            block = self.free_lists[c]
            self.free_lists[c] = block.next
            self.cached_bytes -= block.size
            self.free_block(block, block.size)

    cdef char* new_block(self, long long n) noexcept:
        if not self.mapped:
            return <char*>kmem_malloc_block(n)
        cdef void* block = map_file(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        return NULL if block == MAP_FAILED else <char*>block

    cdef void free_block(self, void* block, long long n) noexcept:
        if self.mapped:
            munmap(block, n)
        else:
            free(block)

    cdef void reclaim(self, PooledBuffer b) noexcept:
        # A buffer garbage-collected without release: credit it back so the accounting never drifts.
        cdef Py_ssize_t length = b.length
        self.give_back(b)
        try:
            self._buffer_leaked(length, b.origin)
            self.announce_return()
        except BaseException:
            pass    # nothing can propagate out of a deallocation

    def trim(self):
        """Free every cached block; returns the bytes given back to the system allocator."""
        cdef long long freed = self.cached_bytes
        self.free_cached()
        return freed

    # Hooks for the Python subclass, called only on state transitions (never per allocation).
    def _depletion_started(self):
        pass

    def _depletion_ended(self):
        pass

    def _memory_returned(self):
        pass

    def _buffer_leaked(self, size_bytes, origin):
        pass


cdef _invalid_argument(str message):
    from kmem.errors import InvalidArgumentError
    return InvalidArgumentError(message)


def unfilled_bytearray(Py_ssize_t size):
    """A new bytearray of ``size`` bytes left as malloc gives them, for a buffer about to be read into whole:
    ``bytearray(size)`` zeroes them holding the GIL, which a megabyte-long request takes tens of microseconds
    of, every other network thread waiting (the GIL profile of bench/bench_network_threads.py)."""
    if size < 0:
        raise _invalid_argument(f"size must be >= 0, not {size}")
    return PyByteArray_FromStringAndSize(NULL, size)
