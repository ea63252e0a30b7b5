# Lookups in producer-state snapshot entries (Kafka layout, KIP-1044 ledger).
#
# A snapshot is `version i16 | crc u32 | count i32` then `count` entries of 46 bytes, each starting with
# the big-endian producer id. Sorted files (kmem writes them so) are searched in two steps: `fences`
# (every stride-th id, in the heap) pick the stride, then `sorted_snapshot_find` reads and searches it. Files
# in Kafka's hash-map order are searched through `order`, a permutation of rows sorted by id. The
# active ledger file is unsorted and found through `RowTable`, an open-addressing table of row numbers
# keyed by the id (the id itself is read back from the entry, so a slot costs 4 bytes).

from cpython.object cimport PyObject
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset
from libc.errno cimport EINTR, EIO, EMFILE, ENFILE, ENOENT, ENOMEM, EPERM, errno
from libc.string cimport strerror
from posix.fcntl cimport O_CLOEXEC, O_RDONLY, O_WRONLY, open as open_fd
from posix.unistd cimport close as close_fd, ftruncate, pread, pwrite
from posix.uio cimport iovec, pwritev
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    int pthread_mutex_init(pthread_mutex_t* mutex, const void* attributes)
    int pthread_mutex_destroy(pthread_mutex_t* mutex)
    int pthread_mutex_lock(pthread_mutex_t* mutex)
    int pthread_mutex_trylock(pthread_mutex_t* mutex)
    int pthread_mutex_unlock(pthread_mutex_t* mutex)

from cpython.pythread cimport PyThread_get_thread_ident

cdef extern from "Python.h":
    PyObject* PyTuple_GET_ITEM(object, Py_ssize_t)      # borrowed
    Py_ssize_t PyTuple_GET_SIZE(object)
    bint PyLong_CheckExact(PyObject*)
    long long PyLong_AsLongLongAndOverflow(PyObject*, int*) except? -1
    void prefetch_slot "__builtin_prefetch"(const void* p, int rw) nogil

cdef enum:
    SNAPSHOT_HEADER = 10
    ENTRY_SIZE = 46


cdef inline int64_t row_pid(const uint8_t* entries, Py_ssize_t row) noexcept nogil:
    """The producer id of entry ``row``; ``entries`` points at the first entry (after any header)."""
    cdef uint64_t raw
    memcpy(&raw, entries + row * ENTRY_SIZE, 8)
    return <int64_t>kmem_bswap64(raw)


# The entry's fields: byte offsets, sizes and the smallest value each may hold (last_offset and
# current_txn_first_offset: -1 is Kafka's "none", lower values are refused by the ledger).
cdef int[8] FIELD_SIZE = [8, 2, 4, 8, 4, 8, 4, 8]
cdef enum:
    LAST_SEQUENCE = 2
    LAST_OFFSET = 3
    OFFSET_DELTA = 4
    TIMESTAMP = 5
    TXN_FIRST_OFFSET = 7


cdef inline void store_be(uint8_t* p, int64_t value, int size) noexcept nogil:
    cdef int i
    for i in range(size - 1, -1, -1):
        p[i] = <uint8_t>(value & 0xFF)
        value >>= 8


cdef inline bint fits(int64_t value, int size) noexcept nogil:
    if size == 8:
        return True
    cdef int64_t limit = (<int64_t>1) << (8 * size - 1)
    return -limit <= value < limit


cdef int entry_fields(object entry, int64_t* fields) except -1:
    """The eight fields of a ProducerEntry (a tuple) as Kafka reads them back; 0, or 1 if the caller must
    refuse it (not 8 ints, a value out of its field's range, an offset below -1)."""
    # The C size, not len(): a subclass's __len__ would run Python code under the ledger's lock.
    if not isinstance(entry, tuple) or PyTuple_GET_SIZE(entry) != 8:
        return 1
    cdef int i, overflow
    cdef PyObject* item
    for i in range(8):
        item = PyTuple_GET_ITEM(entry, i)
        if not PyLong_CheckExact(item):                  # bool and other int subclasses too
            return 1
        fields[i] = PyLong_AsLongLongAndOverflow(item, &overflow)
        if overflow or not fits(fields[i], FIELD_SIZE[i]):
            return 1
    if fields[LAST_OFFSET] < -1 or fields[TXN_FIRST_OFFSET] < -1:
        return 1
    if fields[LAST_OFFSET] == -1:          # no batch: Kafka reads sequence -1 and offset delta 0
        fields[LAST_SEQUENCE] = -1
        fields[OFFSET_DELTA] = 0
    return 0


cdef extern from *:
    """
    static inline uint16_t kmem_bswap16(uint16_t x) { return __builtin_bswap16(x); }
    static inline uint32_t kmem_bswap32(uint32_t x) { return __builtin_bswap32(x); }
    """
    uint16_t kmem_bswap16(uint16_t x) nogil
    uint32_t kmem_bswap32(uint32_t x) nogil


cdef inline void store_entry(uint8_t* p, const int64_t* fields) noexcept nogil:
    """The eight fields (in their ranges) at ``p`` in the entry layout: big-endian, unrolled."""
    cdef uint64_t v64
    cdef uint32_t v32
    cdef uint16_t v16
    v64 = kmem_bswap64(<uint64_t>fields[0]); memcpy(p, &v64, 8)
    v16 = kmem_bswap16(<uint16_t>fields[1]); memcpy(p + 8, &v16, 2)
    v32 = kmem_bswap32(<uint32_t>fields[2]); memcpy(p + 10, &v32, 4)
    v64 = kmem_bswap64(<uint64_t>fields[3]); memcpy(p + 14, &v64, 8)
    v32 = kmem_bswap32(<uint32_t>fields[4]); memcpy(p + 22, &v32, 4)
    v64 = kmem_bswap64(<uint64_t>fields[5]); memcpy(p + 26, &v64, 8)
    v32 = kmem_bswap32(<uint32_t>fields[6]); memcpy(p + 34, &v32, 4)
    v64 = kmem_bswap64(<uint64_t>fields[7]); memcpy(p + 38, &v64, 8)


cdef inline int64_t load_be64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return <int64_t>kmem_bswap64(v)


cdef inline int32_t load_be32(const uint8_t* p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)
    return <int32_t>kmem_bswap32(v)


cdef inline int16_t load_be16(const uint8_t* p) noexcept nogil:
    cdef uint16_t v
    memcpy(&v, p, 2)
    return <int16_t>kmem_bswap16(v)


cdef inline void store_kafka_view(uint8_t* p) noexcept nogil:
    """Rewrite the entry at ``p`` as Kafka reads it back (``kafka_view``): no batch (last_offset < 0):
    sequence -1, offset -1, delta 0; current_txn_first_offset below -1: -1."""
    cdef int64_t fields[8]
    if load_be64(p + 14) >= 0 and load_be64(p + 38) >= -1:
        return
    row_fields(p, fields)
    store_entry(p, fields)


def entries_first_below(const uint8_t[::1] entries, Py_ssize_t at, long long floor):
    """The position of the first of ``entries`` (whole 46-byte entries) whose big-endian int64 field at
    byte ``at`` of the entry is below ``floor``, or -1."""
    if entries.shape[0] % ENTRY_SIZE or at < 0 or at > ENTRY_SIZE - 8:
        raise ValueError("not whole entries, or no int64 field at that byte")
    cdef Py_ssize_t i, found = -1
    with nogil:
        for i in range(entries.shape[0] // ENTRY_SIZE):
            if load_be64(&entries[0] + i * ENTRY_SIZE + at) < floor:
                found = i
                break
    return found


cdef inline void row_fields(const uint8_t* p, int64_t* fields) noexcept nogil:
    """The eight fields of the entry at ``p`` as Kafka reads them back (``kafka_view``)."""
    fields[0] = load_be64(p)
    fields[1] = load_be16(p + 8)
    fields[2] = load_be32(p + 10)
    fields[3] = load_be64(p + 14)
    fields[4] = load_be32(p + 22)
    fields[5] = load_be64(p + 26)
    fields[6] = load_be32(p + 34)
    fields[7] = load_be64(p + 38)
    if fields[LAST_OFFSET] < 0:
        fields[LAST_SEQUENCE] = -1
        fields[LAST_OFFSET] = -1
        fields[OFFSET_DELTA] = 0
    if fields[TXN_FIRST_OFFSET] < -1:
        fields[TXN_FIRST_OFFSET] = -1


cdef extern from *:
    """
    /* An instance of ``cls`` (a tuple subclass such as a NamedTuple) holding the ints ``fields``, not
       tracked by the garbage collector: a tuple of ints cannot be part of a cycle, and tracked ones made
       every collection walk all the entries a caller keeps (CPython untracks exact tuples of atoms
       itself, never subclasses). Allocated directly before Python 3.14; from 3.14, whose tuples cache
       their hash in the object, through tuple.__new__, which resets that cache. */
    static PyObject* kmem_entry_new(PyObject* cls, const int64_t* fields, Py_ssize_t n) {
        PyObject* entry;
        Py_ssize_t i;
    #if PY_VERSION_HEX < 0x030E0000
        entry = ((PyTypeObject*)cls)->tp_alloc((PyTypeObject*)cls, n);
        if (entry == NULL)
            return NULL;
        if (PyObject_GC_IsTracked(entry))
            PyObject_GC_UnTrack(entry);
        for (i = 0; i < n; i++) {
            PyObject* value = PyLong_FromLongLong(fields[i]);
            if (value == NULL) {
                Py_DECREF(entry);
                return NULL;
            }
            PyTuple_SET_ITEM(entry, i, value);
        }
    #else
        PyObject* items = PyTuple_New(n);
        PyObject* args;
        if (items == NULL)
            return NULL;
        for (i = 0; i < n; i++) {
            PyObject* value = PyLong_FromLongLong(fields[i]);
            if (value == NULL) {
                Py_DECREF(items);
                return NULL;
            }
            PyTuple_SET_ITEM(items, i, value);
        }
        args = PyTuple_Pack(1, items);
        Py_DECREF(items);
        if (args == NULL)
            return NULL;
        entry = PyTuple_Type.tp_new((PyTypeObject*)cls, args, NULL);
        Py_DECREF(args);
        if (entry != NULL && PyObject_GC_IsTracked(entry))
            PyObject_GC_UnTrack(entry);
    #endif
        return entry;
    }
    """
    object kmem_entry_new(object cls, const int64_t* fields, Py_ssize_t n)


cdef object entry_of_fields(const int64_t* fields, object cls):
    """``cls(*fields)`` for a tuple subclass ``cls`` (checked by the callers), cheaply: see kmem_entry_new."""
    return kmem_entry_new(cls, fields, 8)


cdef object producer_entry_at(const uint8_t* p, object cls):
    """The entry at ``p`` as a ``cls`` (ProducerEntry) tuple, as Kafka reads it back (``kafka_view``)."""
    if not isinstance(cls, type) or not issubclass(cls, tuple):
        raise TypeError(f"cls must be a tuple class such as ProducerEntry, not {cls!r}")
    cdef int64_t fields[8]
    row_fields(p, fields)
    return entry_of_fields(fields, cls)


cdef enum:
    MAX_STRIDE = 128
    PREFETCH_AHEAD = 8


DEF WINDOW = 16       # rows read around the interpolated position: 736 bytes, one or two pages


cdef int sorted_find_row(int fd, Py_ssize_t count, const int64_t* fences, Py_ssize_t n_fences,
                         Py_ssize_t stride, int64_t pid, uint8_t* out) noexcept nogil:
    """Copy the row of ``pid`` in a sorted snapshot file into ``out`` (46 bytes): 1, or 0 if absent, 2 if
    the file is shorter than ``count`` entries (it shrank), -1 if a read failed (``errno`` says why).
    The fences pick the stride, one ``pread`` brings it (or the window around the interpolated row), a
    binary search finds the row.

    Between two fences ids are usually spread evenly (Kafka hands producer ids out in blocks), so the
    id's row is first guessed by interpolation and only ``WINDOW`` rows around it are read; when the id
    lies outside them, the whole stride is read. Reading 5.9 KB of a file larger than the CPU cache cost
    ~2 us; the window ~0.5 us."""
    cdef uint8_t block[MAX_STRIDE * ENTRY_SIZE]
    cdef Py_ssize_t fence, first, rows, start = 0, size = 0, got = 0, lo, hi, mid
    cdef int64_t found
    cdef bint windowed = False
    fence = last_fence_at_most(fences, n_fences, pid)
    if fence < 0:
        return 0
    first = fence * stride
    rows = min(stride, count - first)
    if rows > 2 * WINDOW and fence + 1 < n_fences:
        # fences[fence] <= pid < fences[fence + 1], the id of row first + stride
        start = <Py_ssize_t>((<double>pid - <double>fences[fence]) /
                             (<double>fences[fence + 1] - <double>fences[fence]) * stride) - WINDOW // 2
        start = max(0, min(start, rows - WINDOW))
        size = WINDOW * ENTRY_SIZE
        got = pread(fd, block, size, SNAPSHOT_HEADER + (first + start) * ENTRY_SIZE)
        windowed = got == size and (start == 0 or row_pid(block, 0) <= pid) and \
            (start + WINDOW == rows or pid <= row_pid(block, WINDOW - 1))
    if not windowed and got == size:
        start, size = 0, rows * ENTRY_SIZE
        got = pread(fd, block, size, SNAPSHOT_HEADER + first * ENTRY_SIZE)
    if got < 0:
        return -1
    if got != size:
        return 2
    lo, hi = 0, size // ENTRY_SIZE
    while lo < hi:
        mid = lo + ((hi - lo) >> 1)
        found = row_pid(block, mid)
        if found == pid:
            memcpy(out, block + mid * ENTRY_SIZE, ENTRY_SIZE)
            return 1
        if found < pid:
            lo = mid + 1
        else:
            hi = mid
    return 0


cdef int check_fences(Py_ssize_t count, const int64_t[::1] fences, Py_ssize_t stride) except -1:
    if stride < 1 or stride > MAX_STRIDE or fences.shape[0] != (count + stride - 1) // stride:
        raise ValueError("fences do not match the entries")
    return 0


def sorted_snapshot_find(int fd, Py_ssize_t count, const int64_t[::1] fences, Py_ssize_t stride, long long pid,
                         cls):
    """The entry of ``pid`` (a ``cls``, as ``producer_entry_at``) in a sorted snapshot file, or None; False
    if the file is shorter than ``count`` entries (it shrank). See ``sorted_find_row``."""
    check_fences(count, fences, stride)
    cdef uint8_t row[ENTRY_SIZE]
    cdef int got, error = 0
    with nogil:
        got = sorted_find_row(fd, count, &fences[0] if fences.shape[0] else NULL, fences.shape[0], stride, pid, row)
        if got < 0:
            error = errno
    if got < 0:
        raise OSError(error, "pread of a snapshot failed")
    if got == 2:
        return False
    return producer_entry_at(row, cls) if got else None


cdef extern from *:
    """
    #include <fcntl.h>
    #ifndef O_NOATIME
    #define O_NOATIME 0
    #endif
    """
    enum: O_NOATIME


# --- the descriptors of recently searched sorted snapshots, shared by every index of the process ------------
#
# Opening a snapshot for each search cost more than the search (the path walk and a new open file: ~2 us of a
# ~3.5 us read). So the most recently searched snapshots keep their descriptor in one list for the process, at
# most `open_snapshots_limit` of them: a broker's descriptors stay bounded however many partitions it has. A
# search takes an entry under the mutex and reads through it without the lock; `users` counts those searches,
# and an entry evicted meanwhile is closed by the last of them, so no search reads a descriptor number that
# was closed (and perhaps reused for another file).

cdef struct OpenSnapshot:
    int fd
    int users                   # searches reading through fd now
    bint evicted                # out of the list: the last user closes fd
    OpenSnapshot** owner        # the SnapshotIndex field that points here, while listed
    OpenSnapshot* newer
    OpenSnapshot* older


cdef pthread_mutex_t open_snapshots_mutex
pthread_mutex_init(&open_snapshots_mutex, NULL)
cdef OpenSnapshot* newest_open = NULL
cdef OpenSnapshot* oldest_open = NULL
cdef Py_ssize_t open_snapshots_count = 0
cdef Py_ssize_t open_snapshots_limit = 32


cdef void list_newest(OpenSnapshot* entry) noexcept nogil:
    """Put ``entry`` first in the list (the mutex is held)."""
    global newest_open, oldest_open
    entry.newer, entry.older = NULL, newest_open
    if newest_open != NULL:
        newest_open.newer = entry
    else:
        oldest_open = entry
    newest_open = entry


cdef void unlist(OpenSnapshot* entry) noexcept nogil:
    """Take ``entry`` out of the list (the mutex is held)."""
    global newest_open, oldest_open
    if entry.newer != NULL:
        entry.newer.older = entry.older
    else:
        newest_open = entry.older
    if entry.older != NULL:
        entry.older.newer = entry.newer
    else:
        oldest_open = entry.newer
    entry.newer = entry.older = NULL


cdef void evict(OpenSnapshot* entry) noexcept nogil:
    """Drop ``entry`` from the list and its index (the mutex is held); its descriptor is closed now, or by
    the last search still reading through it."""
    global open_snapshots_count
    unlist(entry)
    entry.owner[0] = NULL
    entry.owner = NULL
    entry.evicted = True
    open_snapshots_count -= 1
    if entry.users == 0:
        close_fd(entry.fd)
        free(entry)


cdef void evict_beyond(Py_ssize_t limit) noexcept nogil:
    """Evict the least recently searched entries until at most ``limit`` are left (the mutex is held)."""
    while open_snapshots_count > limit:
        evict(oldest_open)


cdef OpenSnapshot* use_open(OpenSnapshot** slot) noexcept nogil:
    """The entry at ``slot`` counted as used (the caller calls ``done_with``), made the most recent; or NULL."""
    pthread_mutex_lock(&open_snapshots_mutex)
    cdef OpenSnapshot* entry = slot[0]
    if entry != NULL:
        entry.users += 1
        if entry != newest_open:
            unlist(entry)
            list_newest(entry)
    pthread_mutex_unlock(&open_snapshots_mutex)
    return entry


cdef void done_with(OpenSnapshot* entry) noexcept nogil:
    """A search through ``entry`` is over: close it if it was evicted meanwhile and no other search uses it."""
    pthread_mutex_lock(&open_snapshots_mutex)
    entry.users -= 1
    cdef bint last = entry.evicted and entry.users == 0
    pthread_mutex_unlock(&open_snapshots_mutex)
    if last:
        close_fd(entry.fd)
        free(entry)


def set_open_snapshots_limit(Py_ssize_t limit):
    """At most ``limit`` sorted snapshots keep a descriptor open between searches, in the whole process
    (0: every search opens its file); beyond it, the least recently searched are closed now."""
    global open_snapshots_limit
    if limit < 0:
        raise ValueError(f"the limit of open snapshots is at least 0: {limit}")
    with nogil:
        pthread_mutex_lock(&open_snapshots_mutex)
        open_snapshots_limit = limit
        evict_beyond(limit)
        pthread_mutex_unlock(&open_snapshots_mutex)


def open_snapshots():
    """(sorted snapshots keeping a descriptor open now, the limit)."""
    return open_snapshots_count, open_snapshots_limit


def forget_open_snapshots_in_child():
    """After ``fork``: a new mutex (another thread of the parent may have held it) and no entry; the child's
    copies of the descriptors are closed (searches of the parent's other threads do not run here)."""
    global newest_open, oldest_open, open_snapshots_count
    pthread_mutex_init(&open_snapshots_mutex, NULL)
    cdef OpenSnapshot* entry
    while newest_open != NULL:
        entry = newest_open
        newest_open = entry.older
        entry.owner[0] = NULL
        close_fd(entry.fd)
        free(entry)
    oldest_open, open_snapshots_count = NULL, 0


@cython.final
cdef class SnapshotIndex:
    """What the core needs to search one sorted snapshot file: its path, count and fences (every
    ``stride``-th id, in the heap). A search reads the file with ``pread`` through a descriptor kept in the
    process's list of recently searched snapshots (see ``set_open_snapshots_limit``), opening it when it is
    not there; so descriptors stay bounded however many indexes a broker keeps (one per snapshot of every
    partition), and a hot snapshot is not opened again for each search. The ledger retires an index before it
    deletes or replaces its file; a file deleted by someone else is read as it was through a kept descriptor
    until that is evicted (checking the link count at each search cost as much as the read). An id below the
    first fence is answered without a read.

    O_NOATIME where allowed (the file's owner): updating the access time cost a tenth of the read.
    ``retire``: the file is about to be deleted; its descriptor is closed and a search that then finds no
    file finds no entry (the ledger deletes a snapshot a newer one superseded; ``LedgerCore.read`` then looks
    in the newer one). ``close``: its descriptor is closed and later searches raise."""
    cdef bytes name                     # the path for open(2); None once closed
    cdef int flags
    cdef bint retired
    cdef bint keeps                     # may keep a descriptor: not retired nor closed (under the mutex)
    cdef OpenSnapshot* opened           # its entry in the list of open snapshots, or NULL (under the mutex)
    cdef Py_ssize_t count, stride
    cdef const int64_t[::1] fences
    cdef readonly object path           # for messages

    def __init__(self, path, Py_ssize_t count, const int64_t[::1] fences, Py_ssize_t stride):
        import os
        check_fences(count, fences, stride)
        name = os.fsencode(path)
        if b"\0" in name:
            raise ValueError(f"a path holds no NUL byte: {path!r}")
        self.name, self.path = name, os.fsdecode(name)
        self.count, self.fences, self.stride = count, fences, stride
        self.flags = O_RDONLY | O_CLOEXEC | O_NOATIME
        self.keeps = True

    def __dealloc__(self):
        self.drop(False)

    cdef void drop(self, bint retire) noexcept nogil:
        """Keep no descriptor from now on (and, ``retire``, find nothing where the file is gone)."""
        pthread_mutex_lock(&open_snapshots_mutex)
        self.keeps = False
        if retire:
            self.retired = True
        if self.opened != NULL:
            evict(self.opened)
        pthread_mutex_unlock(&open_snapshots_mutex)

    cdef int open_file(self, const char* path) noexcept nogil:
        """A new descriptor of the file, or -1 (``errno``)."""
        cdef int fd = open_fd(path, self.flags)
        if fd < 0 and errno == EPERM and self.flags & O_NOATIME:     # not the file's owner
            self.flags &= ~O_NOATIME
            fd = open_fd(path, self.flags)
        if fd < 0 and (errno == EMFILE or errno == ENFILE) and open_snapshots_count:
            # Out of descriptors: the list gives back what it keeps before the search fails.
            pthread_mutex_lock(&open_snapshots_mutex)
            evict_beyond(0)
            pthread_mutex_unlock(&open_snapshots_mutex)
            fd = open_fd(path, self.flags)
        return fd

    cdef OpenSnapshot* keep(self, int fd) noexcept nogil:
        """List ``fd`` as this index's descriptor, used by the caller's search; NULL when it is not kept (a
        limit of 0, retired or closed, or another search listed one meanwhile): the caller closes it."""
        global open_snapshots_count
        cdef OpenSnapshot* entry = NULL
        pthread_mutex_lock(&open_snapshots_mutex)
        if self.keeps and self.opened == NULL and open_snapshots_limit > 0:
            entry = <OpenSnapshot*>malloc(sizeof(OpenSnapshot))
            if entry != NULL:
                entry.fd, entry.users, entry.evicted, entry.owner = fd, 1, False, &self.opened
                list_newest(entry)
                self.opened = entry
                open_snapshots_count += 1
                evict_beyond(open_snapshots_limit)
        pthread_mutex_unlock(&open_snapshots_mutex)
        return entry

    cdef int find_row(self, int64_t pid, uint8_t* out) except -1:
        """``sorted_find_row`` on this file, through its kept descriptor or a new one."""
        cdef bytes name = self.name            # held while the GIL is released, even if closed meanwhile
        if name is None:
            from kmem.errors import IllegalStateError
            raise IllegalStateError("the snapshot is closed")
        cdef const char* path = name
        cdef Py_ssize_t n_fences = self.fences.shape[0]
        if n_fences == 0 or pid < self.fences[0]:
            return 0
        cdef const int64_t* fences = &self.fences[0]
        cdef int fd = -1, got = 0, error = 0
        cdef OpenSnapshot* entry
        with nogil:
            entry = use_open(&self.opened)
            if entry != NULL:
                fd = entry.fd
            if fd < 0:
                fd = self.open_file(path)
                if fd < 0:
                    error = errno
                else:
                    entry = self.keep(fd)
            if fd >= 0:
                got = sorted_find_row(fd, self.count, fences, n_fences, self.stride, pid, out)
                if got < 0:
                    error = errno
                if entry != NULL:
                    done_with(entry)
                else:
                    close_fd(fd)
        if fd < 0:
            if error == ENOENT and self.retired:
                return 0
            raise OSError(error, strerror(error).decode(), self.path)
        if got < 0:
            raise OSError(error, f"pread of snapshot {self.path} failed")
        return got

    def __repr__(self):
        return f"SnapshotIndex({self.path!r}, {self.count} entries)"

    def find(self, long long pid, cls):
        """The entry of ``pid`` (a ``cls``, as ``producer_entry_at``), None if absent, False if the file
        shrank."""
        cdef uint8_t row[ENTRY_SIZE]
        cdef int got = self.find_row(pid, row)
        if got == 2:
            return False
        return producer_entry_at(row, cls) if got else None

    def retire(self):
        self.drop(True)

    def close(self):
        self.drop(False)
        self.name = None


cdef inline Py_ssize_t last_fence_at_most(const int64_t* fences, Py_ssize_t n, int64_t pid) noexcept nogil:
    """The position of the last fence <= pid, or -1 when pid is below them all."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = lo + ((hi - lo) >> 1)
        if fences[mid] <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


cdef int check_entries(const uint8_t[::1] data, Py_ssize_t count) except -1:
    if count < 0 or data.shape[0] < SNAPSHOT_HEADER + count * ENTRY_SIZE:
        raise ValueError(f"{count} entries do not fit {data.shape[0]} bytes")
    return 0


def snapshot_search(const uint8_t[::1] data, Py_ssize_t count, long long pid, const uint32_t[::1] order=None,
                    const int64_t[::1] fences=None, Py_ssize_t stride=0):
    """The row of ``pid`` among ``count`` entries sorted by id (directly, or through ``order``), or -1.

    ``fences`` (in the heap) hold the id at every ``stride``-th sorted position: searching them first
    narrows the search of the mapped file to one stride of entries, a page or two, so few pages of the
    mapping are touched.
    """
    check_entries(data, count)
    if order is not None and order.shape[0] != count:
        raise ValueError("order does not have one row per entry")
    if fences is not None and (stride < 1 or fences.shape[0] != (count + stride - 1) // stride):
        raise ValueError("fences do not match the entries")
    cdef const uint8_t* base = &data[0] + SNAPSHOT_HEADER
    cdef bint direct = order is None
    cdef Py_ssize_t lo = 0, hi = count, mid, row, result = -1
    cdef int64_t found
    with nogil:
        if fences is not None:
            lo = last_fence_at_most(&fences[0], fences.shape[0], pid) if fences.shape[0] else -1
            if lo < 0:
                lo = hi = 0             # below the first id: nothing to search (lo -1 read row -1)
            else:
                lo = lo * stride
                hi = min(lo + stride, count)
        while lo < hi:
            mid = lo + ((hi - lo) >> 1)
            row = mid if direct else order[mid]
            if row >= count:        # a damaged order: never read outside the entries
                result = -2
                break
            found = row_pid(base, row)
            if found == pid:
                result = row
                break
            if found < pid:
                lo = mid + 1
            else:
                hi = mid
    if result == -2:
        raise ValueError(f"the order points outside the {count} entries")
    return result


def snapshot_sorted(const uint8_t[::1] data, Py_ssize_t count, const uint32_t[::1] order=None):
    """Whether the ids are strictly increasing (directly, or through ``order``)."""
    check_entries(data, count)
    if order is not None and order.shape[0] != count:
        return False
    cdef const uint8_t* base = &data[0] + SNAPSHOT_HEADER
    cdef bint direct = order is None, ok = True
    cdef Py_ssize_t i, row
    cdef int64_t previous = 0, current
    with nogil:
        for i in range(count):
            row = i if direct else order[i]
            if row >= count:
                ok = False
                break
            current = row_pid(base, row)
            if i > 0 and current <= previous:
                ok = False
                break
            previous = current
    return ok


def snapshot_fences(const uint8_t[::1] data, Py_ssize_t count, Py_ssize_t stride, const uint32_t[::1] order=None):
    """The ids at sorted positions 0, stride, 2 stride, ... (for ``snapshot_search``), as an int64 array."""
    check_entries(data, count)
    if stride < 1 or (order is not None and order.shape[0] != count):
        raise ValueError("bad stride or order")
    import numpy
    out = numpy.empty((count + stride - 1) // stride, numpy.int64)
    cdef int64_t[::1] fences = out
    cdef Py_ssize_t b, row
    for b in range(fences.shape[0]):
        row = b * stride if order is None else order[b * stride]
        if row >= count:
            raise ValueError(f"the order points outside the {count} entries")
        fences[b] = row_pid(&data[0] + SNAPSHOT_HEADER, row)
    return out


cdef inline uint64_t pid_slot(int64_t pid, uint64_t mask) noexcept nogil:
    cdef uint64_t h1, h2
    kmem_murmur3_pid(<uint64_t>pid, &h1, &h2)
    return h1 & mask


cdef uint32_t[::1] new_slots(Py_ssize_t max_rows):
    """Empty slots for a table of up to ``max_rows`` rows: a power of two, at least twice as many."""
    cdef uint64_t n = 16
    while n < <uint64_t>(2 * max_rows):
        n <<= 1
    import numpy
    return numpy.zeros(n, numpy.uint32)


@cython.final
cdef class RowTable:
    """Rows of an unsorted entry buffer by producer id: linear probing over 2^b slots of row + 1.

    The caller sizes it at twice the most rows it will hold (the active file's rows), so probes stay
    short; binding a larger buffer (the file grew) rebuilds the slots for it. Ids are read from the
    entries: the buffer is bound once (``bind``) and the per-entry calls work on it.
    """
    cdef uint32_t[::1] slots
    cdef uint64_t mask
    cdef readonly Py_ssize_t size      # rows indexed: rows 0 .. size - 1
    cdef const uint8_t[::1] bound      # the buffer put/put_many/find_many work on (see bind)
    cdef bint writable
    cdef Py_ssize_t rows               # whole rows in it
    cdef Py_ssize_t limit              # put adds no row at or past this count (see set_limit)
    cdef Py_ssize_t reservable_at      # the row count at which has_room may answer from limit (see set_limit)

    def __cinit__(self, Py_ssize_t max_rows):
        self.slots = new_slots(max_rows)
        self.mask = self.slots.shape[0] - 1
        self.size = 0
        self.reservable_at = -1         # until the owner's set_limit says otherwise

    cdef inline uint64_t probe_start(self, int64_t pid) noexcept nogil:
        return pid_slot(pid, self.mask)

    def get(self, long long pid, cls):
        """The entry of ``pid`` in the bound buffer (a ``cls``, as ``producer_entry_at``), or None."""
        cdef uint8_t row[ENTRY_SIZE]
        return producer_entry_at(row, cls) if self.copy_row(pid, row) else None

    cdef bint copy_row(self, int64_t pid, uint8_t* out) except -1:
        """Copy the bound buffer's row of ``pid`` into ``out`` (46 bytes): True, or False if absent."""
        cdef Py_ssize_t row = self.find(pid)
        if row < 0:
            return False
        memcpy(out, &self.bound[0] + SNAPSHOT_HEADER + row * ENTRY_SIZE, ENTRY_SIZE)
        return True

    cpdef Py_ssize_t find(self, long long pid) except -2:
        """The bound buffer's row holding ``pid``, or -1."""
        self.check_bound()
        cdef uint64_t s = self.probe_start(pid)
        cdef uint32_t v
        cdef const uint8_t* entries = &self.bound[0] + SNAPSHOT_HEADER
        while True:
            v = self.slots[s]
            if v == 0:
                return -1
            if row_pid(entries, v - 1) == pid:          # rows < size <= the bound rows
                return v - 1
            s = (s + 1) & self.mask

    def insert_rows(self, const uint8_t[::1] data, Py_ssize_t count):
        """Index rows 0 .. count - 1 of an empty table; returns None, or the first id found twice."""
        check_entries(data, count)
        if self.size:
            raise ValueError("row table is not empty")
        if <uint64_t>(2 * count) > self.mask + 1:
            raise ValueError("row table is full")
        cdef const uint8_t* entries = &data[0] + SNAPSHOT_HEADER
        cdef Py_ssize_t row
        cdef int64_t pid
        cdef uint64_t s
        cdef uint32_t v
        for row in range(count):
            pid = row_pid(entries, row)
            s = self.probe_start(pid)
            while True:
                v = self.slots[s]
                if v == 0:
                    break
                if row_pid(entries, v - 1) == pid:
                    return pid
                s = (s + 1) & self.mask
            self.slots[s] = <uint32_t>(row + 1)
            self.size += 1
        return None

    cdef Py_ssize_t upsert_row(self, int64_t pid, Py_ssize_t max_count) noexcept nogil:
        """The bound buffer's row holding ``pid``, else a new row (recorded here) if fewer than
        ``max_count`` are in use, else -1."""
        cdef const uint8_t* entries = &self.bound[0] + SNAPSHOT_HEADER
        cdef uint64_t s = self.probe_start(pid)
        cdef uint32_t v
        cdef Py_ssize_t row
        while True:
            v = self.slots[s]
            if v == 0:
                break
            if row_pid(entries, v - 1) == pid:
                return v - 1
            s = (s + 1) & self.mask
        if self.size >= max_count:
            return -1
        row = self.size
        self.slots[s] = <uint32_t>(row + 1)
        self.size += 1
        return row

    def bind(self, buffer, bint writable):
        """Keep ``data`` (the mapped file whose first ``size`` rows this table indexes) for ``find``,
        ``get``, ``find_many`` and, if ``writable``, ``put`` and ``put_many``, so those calls do not take
        the buffer each time. A buffer with more rows than the slots were sized for (the file grew) gets
        new slots, its first ``size`` rows indexed again; on failure nothing changed. ``unbind`` lets the
        mapping close."""
        cdef const uint8_t[::1] data = buffer
        cdef uint8_t[::1] must_be_writable
        if writable:
            must_be_writable = buffer               # BufferError if it is not
        check_entries(data, self.size)
        cdef Py_ssize_t rows = (data.shape[0] - SNAPSHOT_HEADER) // ENTRY_SIZE, row
        cdef uint32_t[::1] slots
        cdef uint64_t mask, s
        cdef const uint8_t* entries = &data[0] + SNAPSHOT_HEADER
        if <uint64_t>(2 * rows) > self.mask + 1:
            slots = new_slots(rows)
            mask = slots.shape[0] - 1
            with nogil:
                for row in range(self.size):        # ids known distinct: each takes the first free slot
                    if row + PREFETCH_AHEAD < self.size:    # the slots outgrow the cache: overlap misses
                        prefetch_slot(&slots[0] + pid_slot(row_pid(entries, row + PREFETCH_AHEAD), mask), 1)
                    s = pid_slot(row_pid(entries, row), mask)
                    while slots[s] != 0:
                        s = (s + 1) & mask
                    slots[s] = <uint32_t>(row + 1)
            self.slots, self.mask = slots, mask
        self.bound = data
        self.writable = writable
        self.rows = rows
        self.limit = rows

    def unbind(self):
        self.bound = None
        self.rows = self.limit = 0

    def set_limit(self, Py_ssize_t limit, Py_ssize_t reservable_at=-1):
        """``put`` returns -1 rather than add a row at or past ``limit`` (at most the bound rows): the
        caller's decisions (its filter, growing the file, flushing) come before that row. While the table
        holds ``reservable_at`` rows (-1: never), rows up to ``limit`` need none of those decisions, so
        ``has_room`` may answer from it alone."""
        self.limit = max(0, min(limit, self.rows))
        self.reservable_at = reservable_at

    cpdef bint has_room(self, Py_ssize_t count):
        """``count`` more rows fit before ``limit`` with nothing to decide first (see ``set_limit``)."""
        return self.size == self.reservable_at and count <= self.limit - self.size

    cdef int check_bound(self, bint write=False) except -1:
        if self.bound is None:
            raise ValueError("no buffer bound")
        if write and not self.writable:
            raise ValueError("the bound buffer is read-only")
        return 0

    def put(self, entry):
        """Write ``entry`` (a ProducerEntry) into its row of the bound buffer, or a new row ``size`` (then
        the header's count becomes the new size, after the row is written). Returns the row; -1 if a new
        row is needed at the limit (``set_limit``); -2 if the entry must be refused (the caller says why)."""
        return self.put_row(entry)

    cdef Py_ssize_t put_row(self, entry) except -4:
        """``put``."""
        self.check_bound(True)
        cdef int64_t fields[8]
        if entry_fields(entry, fields):
            return -2
        cdef Py_ssize_t row = self.upsert_row(fields[0], self.limit)
        if row < 0:
            return -1
        store_entry(<uint8_t*>&self.bound[0] + SNAPSHOT_HEADER + row * ENTRY_SIZE, fields)
        if row == self.size - 1:
            store_be(<uint8_t*>&self.bound[6], self.size, 4)          # a new row becomes visible only now
        return row

    def put_many(self, const uint8_t[::1] batch, Py_ssize_t max_count):
        """``put`` for each entry of ``batch`` (entries in the file layout, checked by the caller), in
        order, until one more would need a row past ``max_count`` (or the bound buffer's rows). Each is
        stored as Kafka reads it back (``kafka_view``), as ``put`` does. Returns how many entries were
        written; the header's count follows each new row."""
        self.check_bound(True)
        if max_count > self.rows:
            max_count = self.rows
        cdef Py_ssize_t n = batch.shape[0] // ENTRY_SIZE, i = 0, row, ahead
        if n == 0:
            return 0
        cdef uint8_t* entries = <uint8_t*>&self.bound[0] + SNAPSHOT_HEADER
        cdef const uint8_t* source
        with nogil:
            while i < n:
                # The slots are far larger than the cache: fetch the slot of an id PREFETCH_AHEAD entries
                # on while this one is placed, so the misses overlap.
                ahead = i + PREFETCH_AHEAD
                if ahead < n:
                    prefetch_slot(&self.slots[0] + self.probe_start(row_pid(&batch[0], ahead)), 1)
                source = &batch[0] + i * ENTRY_SIZE
                row = self.upsert_row(row_pid(source, 0), max_count)
                if row < 0:
                    break
                memcpy(entries + row * ENTRY_SIZE, source, ENTRY_SIZE)
                store_kafka_view(entries + row * ENTRY_SIZE)
                if row == self.size - 1:
                    store_be(<uint8_t*>&self.bound[6], self.size, 4)
                i += 1
        return i

    def find_many(self, const int64_t[::1] pids, int64_t[::1] rows_out):
        """The bound buffer's row of each id (or -1) into ``rows_out``; returns how many were found."""
        self.check_bound()
        if rows_out.shape[0] != pids.shape[0]:
            raise ValueError("one output row per id")
        cdef Py_ssize_t i, found = 0
        cdef const uint8_t* entries = &self.bound[0] + SNAPSHOT_HEADER
        cdef uint64_t s
        cdef uint32_t v
        with nogil:
            for i in range(pids.shape[0]):
                if i + PREFETCH_AHEAD < pids.shape[0]:
                    prefetch_slot(&self.slots[0] + self.probe_start(pids[i + PREFETCH_AHEAD]), 0)
                rows_out[i] = -1
                s = self.probe_start(pids[i])
                while True:
                    v = self.slots[s]
                    if v == 0:
                        break
                    if row_pid(entries, v - 1) == pids[i]:      # rows < size <= the bound rows
                        rows_out[i] = v - 1
                        found += 1
                        break
                    s = (s + 1) & self.mask
        return found


def snapshot_search_many(const uint8_t[::1] data, Py_ssize_t count, const int64_t[::1] pids,
                         int64_t[::1] rows_out, const uint32_t[::1] order=None, const int64_t[::1] fences=None,
                         Py_ssize_t stride=0):
    """``snapshot_search`` for each id whose rows_out[i] is -1 (others are left): its row, or -1 still.

    With ``fences`` (as ``snapshot_search``) each search starts in its stride: one or two pages of the
    mapping touched per id instead of one per halving step."""
    check_entries(data, count)
    if rows_out.shape[0] != pids.shape[0]:
        raise ValueError("one output row per id")
    if order is not None and order.shape[0] != count:
        raise ValueError("order does not have one row per entry")
    if fences is not None and (stride < 1 or fences.shape[0] != (count + stride - 1) // stride):
        raise ValueError("fences do not match the entries")
    cdef bint fenced = fences is not None and fences.shape[0] > 0
    cdef const uint8_t* base = &data[0] + SNAPSHOT_HEADER
    cdef bint direct = order is None, bad = False
    cdef Py_ssize_t i, lo, hi, mid, row, found = 0
    cdef int64_t at, pid
    with nogil:
        for i in range(pids.shape[0]):
            if rows_out[i] != -1:
                continue
            pid = pids[i]
            lo = 0
            hi = count
            if fenced:
                lo = last_fence_at_most(&fences[0], fences.shape[0], pid)
                if lo < 0:
                    continue
                lo *= stride
                hi = min(lo + stride, count)
            while lo < hi:
                mid = lo + ((hi - lo) >> 1)
                row = mid if direct else order[mid]
                if row >= count:
                    bad = True
                    break
                at = row_pid(base, row)
                if at == pid:
                    rows_out[i] = row
                    found += 1
                    break
                if at < pid:
                    lo = mid + 1
                else:
                    hi = mid
            if bad:
                break
    if bad:
        raise ValueError(f"the order points outside the {count} entries")
    return found


cdef extern from *:
    bint sub_overflow "__builtin_sub_overflow"(int64_t a, int64_t b, int64_t* result) nogil


cdef int64_t wall_clock_ms() noexcept nogil:
    """Milliseconds since the epoch, as ``time.time_ns() // 1_000_000``."""
    cdef timespec now
    clock_gettime(CLOCK_REALTIME, &now)
    return <int64_t>now.tv_sec * 1000 + now.tv_nsec // 1000000


@cython.final
cdef class LedgerLock:
    """A mutex the core takes without a Python call, usable from Python as a ``threading.Lock`` held by
    one thread at a time (``acquire``, ``release``, ``with``; released by the thread that took it).
    Taking it tries without waiting first and waits only with the GIL released, so a thread holding it
    can always get the GIL to finish. A pthread mutex: Python's own lock reads the clock on every
    acquire, a tenth of ``update``'s time."""
    cdef pthread_mutex_t mutex
    cdef unsigned long owner            # the holding thread's PyThread ident, 0 when free

    def __cinit__(self):
        if pthread_mutex_init(&self.mutex, NULL) != 0:
            raise MemoryError()

    def __dealloc__(self):
        pthread_mutex_destroy(&self.mutex)

    cdef inline int take(self) except -1:
        if pthread_mutex_trylock(&self.mutex) != 0:
            with nogil:
                pthread_mutex_lock(&self.mutex)
        self.owner = PyThread_get_thread_ident()
        return 0

    cdef inline int give(self) except -1:
        if self.owner != PyThread_get_thread_ident():      # a mutex is released by its holder only
            from kmem.errors import IllegalStateError
            raise IllegalStateError("release of a LedgerLock that this thread does not hold")
        self.owner = 0
        pthread_mutex_unlock(&self.mutex)
        return 0

    def acquire(self, bint blocking=True):
        """Take the lock (``blocking=False``: only if free); whether it was taken."""
        if blocking:
            self.take()
            return True
        if pthread_mutex_trylock(&self.mutex) != 0:
            return False
        self.owner = PyThread_get_thread_ident()
        return True

    def release(self):
        self.give()

    def locked(self):
        return self.owner != 0

    def __enter__(self):
        self.take()
        return True

    def __exit__(self, *exc):
        self.give()
        return False


@cython.final
cdef class ReadPath:
    """What a read searches after the active file, replaced whole, never changed in place: the row
    tables of active files being flushed (newest first), then each snapshot whose filter may hold the id
    (newest first). A snapshot is a ``SnapshotIndex`` (sorted files), or any object whose ``find(pid)``
    returns its entry or None (Kafka-ordered files)."""
    cdef tuple sealing
    cdef list filters, snapshots

    def __init__(self, tuple sealing, list filters, list snapshots):
        if len(filters) != len(snapshots):
            raise ValueError("one filter per snapshot")
        for table in sealing:
            if not isinstance(table, RowTable):
                raise TypeError(f"sealing holds RowTables, not {table!r}")
        for bloom in filters:
            if not isinstance(bloom, BloomBits):
                raise TypeError(f"filters holds BloomBits, not {bloom!r}")
        self.sealing, self.filters, self.snapshots = sealing, filters, snapshots

    cdef bint find(self, int64_t pid, int64_t* fields, object cls) except -1:
        """Fill ``fields`` (``kafka_view``) with the newest entry of ``pid`` here: True, or False."""
        cdef uint8_t row[ENTRY_SIZE]
        cdef int64_t idx[MAX_HASHES]
        cdef int64_t m = 0
        cdef int k = 0, got, j
        cdef Py_ssize_t i
        cdef BloomBits bloom
        cdef const uint8_t* bits
        for table in self.sealing:
            if (<RowTable>table).bound is None:
                raise_closed()
            if (<RowTable>table).copy_row(pid, row):
                row_fields(row, fields)
                return True
        for i in range(len(self.filters)):
            bloom = <BloomBits>self.filters[i]
            bloom.check(False)
            if bloom.m != m or bloom.k != k:        # another shape: other indices
                m, k = bloom.m, bloom.k
                pid_indices(<uint64_t>pid, m, k, idx)
            bits = &bloom.view[0]
            for j in range(k):                      # a sidecar outgrows the cache: fetch the k bytes together
                kmem_prefetch_w(bits + bit_byte(idx[j]), 0)
            if not test_indices(bits, idx, k):
                continue
            snapshot = self.snapshots[i]
            if type(snapshot) is SnapshotIndex:
                got = (<SnapshotIndex>snapshot).find_row(pid, row)
                if got == 2:
                    from kmem.errors import CorruptSnapshotError
                    raise CorruptSnapshotError(f"{(<SnapshotIndex>snapshot).path}: snapshot shrank while in use")
                if got:
                    row_fields(row, fields)
                    return True
            else:
                entry = snapshot.find(pid)
                if entry is not None:
                    if entry_fields(entry, fields):
                        raise ValueError(f"{snapshot!r} found an entry that is not one: {entry!r}")
                    return True
        return False


cdef int raise_closed() except -1:
    from kmem.errors import IllegalStateError
    raise IllegalStateError("the ledger is closed")


@cython.final
cdef class LedgerCore:
    """``PidLedger.update`` and ``PidLedger.read`` in one call each, on what the ledger ``publish``es.

    ``update(entry)``: under ``lock``, ``active.put`` (row ``-3`` when there is no active table: closed
    or read-only); an entry stored as given (a ``cls`` with a batch: ``last_offset`` >= 0) comes back as
    it is, anything else goes to ``decided(entry, row)``. A Python method would spend more on its
    ``with`` block and frame than the core spends on the put.

    ``read(pid)``: IllegalStateError once closed (``name`` says which ledger); the active table under
    ``lock``, then the ``ReadPath`` published with it (again from the start when it found nothing and
    another was published meanwhile: the snapshot it searched may be gone), then the expiry rule
    (producer_id_expiration_ms past the entry's timestamp and no open transaction: None).
    Ids that are not plain ints go through ``to_pid`` first (it raises or returns the int). ``clock``:
    None for the wall clock, else a callable returning milliseconds.
    """
    cdef readonly LedgerLock lock
    cdef RowTable active
    cdef ReadPath path
    cdef object cls, decided, to_pid, clock, expiration, name
    cdef int64_t expiration_ms
    cdef bint closed
    # reserve's: what the ledger decides when the active table has no room for the count, the lock that keeps
    # a flush out meanwhile, the most one reservation takes, and the last count reserved
    cdef public object reserve_decided, flush_lock
    cdef public Py_ssize_t max_reservation, reserved

    def __init__(self, cls, decided, to_pid, long long expiration_ms, clock=None, name="ledger"):
        if not issubclass(cls, tuple) or expiration_ms < 1:
            raise ValueError("cls must be a tuple class and expiration_ms positive")
        self.lock = LedgerLock()
        self.cls, self.decided, self.to_pid, self.clock, self.name = cls, decided, to_pid, clock, name
        self.expiration_ms, self.expiration = expiration_ms, expiration_ms
        self.path = ReadPath((), [], [])

    def publish(self, RowTable active, ReadPath path not None):
        """What ``update`` and ``read`` work on from now; the caller holds ``lock``, so that a read sees
        the active table and the read path of the same moment."""
        self.active, self.path = active, path

    def close(self):
        """Later calls raise IllegalStateError (the caller holds ``lock``)."""
        self.closed = True
        self.active, self.path = None, ReadPath((), [], [])

    @cython.always_allow_keywords(False)      # METH_O: no keyword parsing on the hot path
    def update(self, entry):
        cdef Py_ssize_t row
        cdef int overflow
        self.lock.take()
        try:
            row = -3 if self.active is None else self.active.put_row(entry)
        finally:
            self.lock.give()
        if row >= 0 and type(entry) is self.cls and \
                PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(entry, LAST_OFFSET), &overflow) >= 0:
            return entry
        return self.decided(entry, row)

    @cython.always_allow_keywords(False)
    def reserve(self, count):
        """``PidLedger.reserve``: a plain int count the active table has room for (``RowTable.has_room``) is
        recorded as ``reserved`` here, with ``flush_lock`` taken if free (else a flush is under way) and under
        ``lock``; anything else goes to ``reserve_decided(count)`` (a flush or growth first, the errors)."""
        cdef long long wanted = -1
        cdef int overflow = 1
        cdef bint done = False
        if PyLong_CheckExact(<PyObject*>count):
            wanted = PyLong_AsLongLongAndOverflow(<PyObject*>count, &overflow)
        if not overflow and 0 <= wanted <= self.max_reservation and not self.closed and self.flush_lock is not None \
                and self.flush_lock.acquire(False):
            try:
                self.lock.take()
                try:
                    if self.active is not None and self.active.has_room(wanted):
                        self.reserved = wanted
                        done = True
                finally:
                    self.lock.give()
            finally:
                self.flush_lock.release()
        if not done:
            self.reserve_decided(count)

    @cython.always_allow_keywords(False)
    def read(self, pid):
        cdef int64_t key = 0, now, age
        cdef int64_t fields[8]
        cdef int overflow = 1
        cdef uint8_t row[ENTRY_SIZE]
        cdef bint found = False
        cdef ReadPath path
        if PyLong_CheckExact(<PyObject*>pid):
            key = PyLong_AsLongLongAndOverflow(<PyObject*>pid, &overflow)
        if overflow:
            key = self.to_pid(pid)
        while True:
            self.lock.take()
            try:
                if self.closed:
                    from kmem.errors import IllegalStateError
                    raise IllegalStateError(f"{self.name} is closed")
                if self.active is not None:
                    found = self.active.copy_row(key, row)
                path = self.path
            finally:
                self.lock.give()
            if found:
                row_fields(row, fields)
                break
            if path.find(key, fields, self.cls):
                break
            if path is self.path:
                return None
            # A flush published a new read path meanwhile and may have deleted the snapshot searched
            # (the new one holds all it held): look again.
        if fields[TXN_FIRST_OFFSET] < 0:        # no open transaction: it may have expired
            if self.clock is None:
                now = wall_clock_ms()
            else:
                clock_now = self.clock()
                if not PyLong_CheckExact(<PyObject*>clock_now):
                    overflow = 1
                else:
                    now = PyLong_AsLongLongAndOverflow(<PyObject*>clock_now, &overflow)
                if overflow:                     # not an int64: Python's arithmetic decides
                    if clock_now - fields[TIMESTAMP] >= self.expiration:
                        return None
                    return entry_of_fields(fields, self.cls)
            if sub_overflow(now, fields[TIMESTAMP], &age):
                if now > fields[TIMESTAMP]:
                    return None
            elif age >= self.expiration_ms:
                return None
        return entry_of_fields(fields, self.cls)


# --- writing a sorted snapshot (the ledger's flush) ------------------------------------------------

cdef enum:
    WRITE_ROWS = 4096         # rows gathered per write: 188 KB, in the CPU cache while its CRC is taken


cdef inline uint64_t sort_key(const uint8_t* entries, Py_ssize_t row) noexcept nogil:
    """The id of ``row`` as an unsigned key in the ids' signed order."""
    return (<uint64_t>row_pid(entries, row)) ^ (<uint64_t>1 << 63)


def entries_id_order(const uint8_t[::1] entries):
    """(the rows of ``entries`` — whole 46-byte entries, no header — in increasing id order as a uint32
    array, the first id found twice or None).

    Ids that arrive in order (Kafka hands producer ids out in increasing blocks) cost one pass; others an
    LSD radix sort on the key bytes that differ (ids of one broker's blocks share their high bytes)."""
    import numpy
    cdef Py_ssize_t count = entries.shape[0] // ENTRY_SIZE, i
    if entries.shape[0] % ENTRY_SIZE:
        raise ValueError(f"{entries.shape[0]} bytes are not whole entries")
    if count >= <Py_ssize_t>0xFFFFFFFF:
        raise ValueError(f"{count} entries are more than a uint32 order can number")
    out = numpy.empty(count, numpy.uint32)
    if count == 0:
        return out, None
    cdef uint32_t[::1] order = out
    cdef const uint8_t* base = &entries[0]
    cdef bint ascending = True
    cdef uint64_t previous = 0, key
    cdef int64_t duplicate = 0
    cdef bint has_duplicate = False
    with nogil:
        for i in range(count):
            key = sort_key(base, i)
            order[i] = <uint32_t>i
            if i and key <= previous:
                ascending = False
            previous = key
    if not ascending:
        keys_array = numpy.empty(2 * count, numpy.uint64)
        spare_array = numpy.empty(count, numpy.uint32)
        radix_sort(base, count, keys_array, order, spare_array)
        with nogil:
            for i in range(1, count):
                if row_pid(base, order[i]) == row_pid(base, order[i - 1]):
                    duplicate = row_pid(base, order[i])
                    has_duplicate = True
                    break
    return out, (duplicate if has_duplicate else None)


cdef int radix_sort(const uint8_t* base, Py_ssize_t count, uint64_t[::1] keys, uint32_t[::1] order,
                    uint32_t[::1] spare) except -1:
    """Sort ``order`` (rows 0 .. count - 1) by key, stable: LSD, one byte a pass, skipping the bytes all
    keys share. ``keys`` has room for 2 * count keys, ``spare`` for count rows."""
    if keys.shape[0] < 2 * count or order.shape[0] < count or spare.shape[0] < count:
        raise ValueError("radix sort buffers too small")
    cdef Py_ssize_t counts[8][256]
    cdef Py_ssize_t i, b, d, total, position
    cdef uint64_t* src_keys = &keys[0]
    cdef uint64_t* dst_keys = &keys[0] + count
    cdef uint32_t* src_rows = &order[0]
    cdef uint32_t* dst_rows = &spare[0]
    with nogil:
        memset(counts, 0, sizeof(counts))
        for i in range(count):
            src_keys[i] = sort_key(base, i)
            src_rows[i] = <uint32_t>i
            for d in range(8):
                counts[d][(src_keys[i] >> (8 * d)) & 0xFF] += 1
        for d in range(8):
            if counts[d][(src_keys[0] >> (8 * d)) & 0xFF] == count:
                continue                    # every key has this byte: the pass would change nothing
            total = 0
            for b in range(256):            # bucket starts
                position = counts[d][b]
                counts[d][b] = total
                total += position
            for i in range(count):
                b = (src_keys[i] >> (8 * d)) & 0xFF
                position = counts[d][b]
                counts[d][b] += 1
                dst_keys[position] = src_keys[i]
                dst_rows[position] = src_rows[i]
            src_keys, dst_keys = dst_keys, src_keys
            src_rows, dst_rows = dst_rows, src_rows
        if src_rows != &order[0]:
            memcpy(&order[0], src_rows, count * sizeof(uint32_t))
    return 0


def write_snapshot_body(int fd, const uint8_t[::1] entries, const uint32_t[::1] order=None):
    """Write the snapshot bytes after the CRC field — the entry count, then the entries (through
    ``order``, rows of ``entries``, if given) — at offset 6 of ``fd`` (-1: write nothing), gathering,
    checksumming and writing a cache-sized piece at a time. Returns (their CRC-32C, the largest
    timestamp or None without entries, whether an entry has an open transaction)."""
    cdef Py_ssize_t count = entries.shape[0] // ENTRY_SIZE
    if entries.shape[0] % ENTRY_SIZE:
        raise ValueError(f"{entries.shape[0]} bytes are not whole entries")
    if count > 0x7FFFFFFF:
        raise ValueError(f"{count} entries do not fit a snapshot's count")
    if order is not None and order.shape[0] != count:
        raise ValueError("order does not have one row per entry")
    cdef uint8_t* buffer = <uint8_t*>malloc(WRITE_ROWS * ENTRY_SIZE)
    if buffer == NULL:
        raise MemoryError()
    cdef const uint8_t* base = &entries[0] if count else NULL
    cdef const uint32_t* rows = &order[0] if order is not None and count else NULL
    cdef uint8_t count_bytes[4]
    cdef uint32_t crc
    cdef uint32_t raw_count = kmem_bswap32(<uint32_t>count)
    cdef Py_ssize_t start = 0, n, i, row, offset = 6
    cdef int64_t max_timestamp = INT64_MIN, value
    cdef bint open_transaction = False, bad_row = False
    cdef int error = 0
    memcpy(count_bytes, &raw_count, 4)
    try:
        with nogil:
            crc = kmem_crc32c(0, count_bytes, 4, False)
            error = write_all(fd, count_bytes, 4, offset)
            offset += 4
            while start < count and not error:
                n = min(<Py_ssize_t>WRITE_ROWS, count - start)
                for i in range(n):
                    row = start + i if rows == NULL else rows[start + i]
                    if row >= count:
                        bad_row = True
                        break
                    if rows != NULL and i + PREFETCH_AHEAD < n:
                        prefetch_slot(base + <Py_ssize_t>rows[start + i + PREFETCH_AHEAD] * ENTRY_SIZE, 0)
                    memcpy(buffer + i * ENTRY_SIZE, base + row * ENTRY_SIZE, ENTRY_SIZE)
                    value = load_be64(buffer + i * ENTRY_SIZE + 26)
                    if value > max_timestamp:
                        max_timestamp = value
                    if load_be64(buffer + i * ENTRY_SIZE + 38) >= 0:
                        open_transaction = True
                if bad_row:
                    break
                crc = kmem_crc32c(crc, buffer, n * ENTRY_SIZE, False)
                error = write_all(fd, buffer, n * ENTRY_SIZE, offset)
                offset += n * ENTRY_SIZE
                start += n
    finally:
        free(buffer)
    if bad_row:
        raise ValueError(f"the order points outside the {count} entries")
    if error:
        raise OSError(error, "writing a snapshot failed")
    return crc, (max_timestamp if count else None), open_transaction


# --- merging sorted runs into a snapshot (the ledger's flush: every producer in each snapshot) ----------

cdef enum:
    MERGE_UNSORTED = -1           # merge errors besides an errno
    MERGE_TOO_MANY = -2


@cython.final
cdef class SnapshotMerge:
    """Writes the entries of a snapshot merged from ``sources`` sequences of entries sorted by producer
    id, given newest first: each producer's entry comes from the first source that holds it, as Kafka
    reads it back (``store_kafka_view``), and is left out when expired (no open transaction and a
    timestamp at or below ``expired_at``; None: none expires). Each written id goes into ``bloom`` (the
    snapshot's sidecar, writable) and every ``stride``-th into the fences.

    The caller feeds each source a run at a time: ``run()`` merges until some source's run is used up
    and returns that source (``feed`` it its next run, or an empty one when it has none left), or -1 once
    every source has ended and every entry is written. Entries go to ``fd`` from offset 10, a cache-sized
    piece at a time; ``finish()`` writes the count at offset 6 and returns the CRC the header needs. So
    the memory is one piece of output plus what the caller feeds, however many producers there are."""
    cdef int fd
    cdef Py_ssize_t sources, stride
    cdef list runs                      # per source: its (rows, order) being merged, kept alive
    cdef const uint8_t** rows
    cdef const uint32_t** orders
    cdef Py_ssize_t* counts
    cdef Py_ssize_t* positions
    cdef uint64_t* last_keys            # per source: the key it last gave, to check its order
    cdef bint* started                  # per source: whether it gave one
    cdef bint* ended
    cdef uint8_t* buffer
    cdef uint64_t* keys
    cdef Py_ssize_t buffered
    cdef BloomBits bloom
    cdef int64_t expired_at
    cdef bint expire
    cdef int64_t count, position, max_timestamp
    cdef uint32_t crc
    cdef bint open_transaction
    cdef int64_t* fences
    cdef Py_ssize_t fence_count, fence_capacity

    def __cinit__(self, int fd, Py_ssize_t sources, BloomBits bloom not None, expired_at=None,
                  Py_ssize_t stride=MAX_STRIDE):
        if sources < 0 or not 1 <= stride <= MAX_STRIDE:
            raise ValueError(f"bad merge of {sources} sources with fences every {stride} entries")
        bloom.check(True)
        self.fd, self.sources, self.stride, self.bloom = fd, sources, stride, bloom
        self.expire = expired_at is not None
        self.expired_at = expired_at if self.expire else 0
        self.runs = [None] * sources
        cdef Py_ssize_t slots = max(sources, 1)        # calloc(0) may be NULL
        self.rows = <const uint8_t**>calloc(slots, sizeof(uint8_t*))
        self.orders = <const uint32_t**>calloc(slots, sizeof(uint32_t*))
        self.counts = <Py_ssize_t*>calloc(slots, sizeof(Py_ssize_t))
        self.positions = <Py_ssize_t*>calloc(slots, sizeof(Py_ssize_t))
        self.last_keys = <uint64_t*>calloc(slots, sizeof(uint64_t))
        self.started = <bint*>calloc(slots, sizeof(bint))
        self.ended = <bint*>calloc(slots, sizeof(bint))
        self.buffer = <uint8_t*>malloc(WRITE_ROWS * ENTRY_SIZE)
        self.keys = <uint64_t*>malloc(WRITE_ROWS * sizeof(uint64_t))
        if not (self.rows and self.orders and self.counts and self.positions and self.last_keys and self.started
                and self.ended and self.buffer and self.keys):
            raise MemoryError()
        self.position = SNAPSHOT_HEADER
        self.max_timestamp = INT64_MIN

    def __dealloc__(self):
        free(self.rows)
        free(self.orders)
        free(self.counts)
        free(self.positions)
        free(self.last_keys)
        free(self.started)
        free(self.ended)
        free(self.buffer)
        free(self.keys)
        free(self.fences)

    def feed(self, Py_ssize_t source, const uint8_t[::1] rows, const uint32_t[::1] order=None):
        """The next run of ``source``: whole 46-byte entries in increasing id order (read through
        ``order``, rows of ``rows``, when given). An empty run ends the source."""
        if not 0 <= source < self.sources:
            raise IndexError(f"no source {source} among {self.sources}")
        if self.ended[source] or self.positions[source] < self.counts[source]:
            raise ValueError(f"source {source} is not waiting for a run")
        cdef Py_ssize_t n = rows.shape[0] // ENTRY_SIZE, i
        cdef bint outside = False
        if rows.shape[0] % ENTRY_SIZE:
            raise ValueError(f"{rows.shape[0]} bytes are not whole entries")
        if order is not None:
            if order.shape[0] != n:
                raise ValueError("order does not have one row per entry")
            with nogil:
                for i in range(n):
                    if order[i] >= n:
                        outside = True
                        break
            if outside:
                raise ValueError(f"the order points outside the {n} entries")
        self.runs[source] = (rows, order)
        self.rows[source] = &rows[0] if n else NULL
        self.orders[source] = &order[0] if order is not None and n else NULL
        self.counts[source], self.positions[source] = n, 0
        self.ended[source] = n == 0

    cdef inline const uint8_t* current(self, Py_ssize_t s) noexcept nogil:
        cdef Py_ssize_t row = self.positions[s]
        if self.orders[s] != NULL:
            row = self.orders[s][row]
        return self.rows[s] + row * ENTRY_SIZE

    def run(self):
        """Merge until a source needs its next run (returned) or everything is written (-1)."""
        cdef Py_ssize_t result
        cdef int error = 0
        self.bloom.check(True)
        self.bloom.queries += 1             # the filter cannot be closed under the loop
        try:
            with nogil:
                result = self.merge(&error)
        finally:
            self.bloom.queries -= 1
        if error == MERGE_UNSORTED:
            raise ValueError("a source's entries are not in increasing producer-id order")
        if error == MERGE_TOO_MANY:
            raise ValueError("more entries than a snapshot's count can hold")
        if error:
            raise OSError(error, "writing a snapshot failed")
        return result

    cdef Py_ssize_t merge(self, int* error) noexcept nogil:
        cdef Py_ssize_t s, best
        cdef uint64_t key, best_key = 0
        cdef const uint8_t* entry
        cdef uint8_t* out
        cdef int64_t* grown
        while True:
            best = -1
            for s in range(self.sources):
                if self.positions[s] == self.counts[s]:
                    if not self.ended[s]:
                        return s
                    continue
                key = sort_key(self.current(s), 0)
                if best < 0 or key < best_key:
                    best, best_key = s, key
            if best < 0:
                error[0] = self.write_buffered()
                return -1
            entry = self.current(best)
            for s in range(best, self.sources):         # an older source's entry of this id is superseded
                if self.positions[s] < self.counts[s] and sort_key(self.current(s), 0) == best_key:
                    if self.started[s] and best_key <= self.last_keys[s]:
                        error[0] = MERGE_UNSORTED
                        return -1
                    self.started[s], self.last_keys[s] = True, best_key
                    self.positions[s] += 1
            if self.expire and load_be64(entry + 38) < 0 and load_be64(entry + 26) <= self.expired_at:
                continue
            if self.count == 0x7FFFFFFF:
                error[0] = MERGE_TOO_MANY
                return -1
            out = self.buffer + self.buffered * ENTRY_SIZE
            memcpy(out, entry, ENTRY_SIZE)
            store_kafka_view(out)
            if load_be64(out + 26) > self.max_timestamp:
                self.max_timestamp = load_be64(out + 26)
            if load_be64(out + 38) >= 0:
                self.open_transaction = True
            if self.count % self.stride == 0:
                if self.fence_count == self.fence_capacity:
                    grown = <int64_t*>realloc(self.fences, (2 * self.fence_capacity + 64) * sizeof(int64_t))
                    if grown == NULL:
                        error[0] = ENOMEM
                        return -1
                    self.fences, self.fence_capacity = grown, 2 * self.fence_capacity + 64
                self.fences[self.fence_count] = row_pid(out, 0)
                self.fence_count += 1
            self.count += 1
            self.buffered += 1
            if self.buffered == WRITE_ROWS:
                error[0] = self.write_buffered()
                if error[0]:
                    return -1

    cdef int write_buffered(self) noexcept nogil:
        """Checksum, filter and write the entries buffered; 0 or the errno."""
        cdef Py_ssize_t n = self.buffered, i
        cdef int error
        if n == 0:
            return 0
        self.crc = kmem_crc32c(self.crc, self.buffer, n * ENTRY_SIZE, False)
        for i in range(n):
            self.keys[i] = <uint64_t>row_pid(self.buffer, i)
        add_keys(self.bloom.writable, self.keys, n, self.bloom.m, self.bloom.k)
        error = write_all(self.fd, self.buffer, n * ENTRY_SIZE, self.position)
        self.position += n * ENTRY_SIZE
        self.buffered = 0
        return error

    def finish(self):
        """Write the entry count at offset 6; returns (the count, the CRC-32C of the bytes from offset 6
        on, the largest timestamp or None without entries, whether an entry has an open transaction, the
        fences as an int64 array)."""
        import numpy
        cdef Py_ssize_t s
        for s in range(self.sources):
            if not self.ended[s] or self.buffered:
                raise ValueError("the merge has not ended: run() until it returns -1")
        cdef uint32_t raw_count = kmem_bswap32(<uint32_t>self.count)
        cdef uint8_t count_bytes[4]
        memcpy(count_bytes, &raw_count, 4)
        cdef int error = write_all(self.fd, count_bytes, 4, 6)
        if error:
            raise OSError(error, "writing a snapshot failed")
        crc = crc32c_combine_c(kmem_crc32c(0, count_bytes, 4, False), self.crc, self.count * ENTRY_SIZE)
        fences = numpy.empty(self.fence_count, numpy.int64)
        cdef int64_t[::1] view = fences
        if self.fence_count:
            memcpy(&view[0], self.fences, self.fence_count * sizeof(int64_t))
        return (self.count, crc, self.max_timestamp if self.count else None, self.open_transaction, fences)


cdef int write_all(int fd, const uint8_t* data, Py_ssize_t size, Py_ssize_t offset) noexcept nogil:
    """pwrite all of ``data`` at ``offset`` (nothing when fd is -1); 0, or the errno."""
    cdef Py_ssize_t done = 0, got
    if fd < 0:
        return 0
    while done < size:
        got = pwrite(fd, data + done, size - done, offset + done)
        if got < 0:
            if errno == EINTR:
                continue
            return errno
        done += got
    return 0
