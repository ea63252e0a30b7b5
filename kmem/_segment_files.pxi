# Reads of a log segment's files on the fetch path (Kafka's OffsetIndex.lookup, LogSegment.translateOffset):
# the loops of small preads, each a system call, run here without the GIL; and an append's writes on the
# produce path (LogSegment.append): the batches, then the index entries, whose files are opened for them (a
# partition keeps no index descriptor open), and the blocks an active segment reserves ahead of them.
#
# Index entries are big-endian: `.index` rows are (relative offset i32, position i32), `.timeindex` rows
# (timestamp i64, relative offset i32). A batch starts `base offset i64 | length i32 | epoch or crc i32 |
# magic i8`; a v2 batch's last offset delta is the i32 at byte 23.

DEF READ_WINDOW = 8192    # bytes read at once: the heads between two index entries, mostly; 1,024 index rows

cdef inline int64_t _big_endian(const uint8_t* p, int width) noexcept nogil:
    cdef uint64_t value = 0
    cdef int i
    for i in range(width):
        value = (value << 8) | p[i]
    if width == 4:
        return <int32_t>value
    return <int64_t>value


cdef Py_ssize_t _pread_fully(int fd, uint8_t* into, Py_ssize_t size, int64_t position) noexcept nogil:
    """Bytes read (fewer only at the file's end), or -1 with errno set."""
    cdef Py_ssize_t done = 0, got
    while done < size:
        got = pread(fd, into + done, size - done, position + done)
        if got < 0:
            if errno == EINTR:
                continue
            return -1
        if got == 0:
            break
        done += got
    return done


cdef int _write_file_at(const char* name, const unsigned char* p, Py_ssize_t size, int64_t position) noexcept nogil:
    """Open the existing file ``name``, write ``size`` bytes at ``position`` and close it; 0, or an errno."""
    cdef Py_ssize_t done = 0, put
    cdef int error = 0
    cdef int fd = open_fd(name, O_WRONLY | O_CLOEXEC)
    if fd < 0:
        return errno
    while done < size:
        put = pwrite(fd, p + done, size - done, position + done)
        if put < 0:
            if errno == EINTR:
                continue
            error = errno
            break
        done += put
    if close_fd(fd) < 0 and not error and errno != EINTR:
        error = errno
    return error


def write_at(bytes path, const unsigned char[::1] data, int64_t position):
    """Write ``data`` at ``position`` of the existing file at ``path``: opened, written whole and closed,
    without the GIL. Raises OSError (the file as it was, or with part of ``data`` written past ``position``)."""
    cdef const char* name = path
    cdef const unsigned char* p = &data[0] if data.shape[0] else NULL
    cdef Py_ssize_t size = data.shape[0]
    cdef int error
    with nogil:
        error = _write_file_at(name, p, size, position)
    if error:
        raise OSError(error, strerror(error).decode(), path.decode(errors="surrogateescape"))


cdef extern from *:
    """
    #include <fcntl.h>
    #include <errno.h>
    /* Blocks for [offset, offset + length) of a file, its size unchanged: 0, or an errno (EOPNOTSUPP where
       the platform or the file system has no such reservation). */
    static int kmem_reserve_blocks(int fd, int64_t offset, int64_t length) {
    #ifdef FALLOC_FL_KEEP_SIZE
        int result;
        do {
            result = fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)length);
        } while (result < 0 && errno == EINTR);
        return result < 0 ? errno : 0;
    #else
        (void)fd; (void)offset; (void)length;
        return EOPNOTSUPP;
    #endif
    }
    """
    int kmem_reserve_blocks(int fd, int64_t offset, int64_t length) nogil


def reserve_blocks(int fd, int64_t offset, int64_t length):
    """Allocate the blocks of ``[offset, offset + length)`` of the file open as ``fd`` without changing its size
    (Linux's ``fallocate`` with ``FALLOC_FL_KEEP_SIZE``), without the GIL. Returns 0, or the errno of the
    failure (EOPNOTSUPP where the platform or the file system cannot): a reservation is never required."""
    if offset < 0 or length <= 0:
        raise ValueError(f"cannot reserve {length} bytes at {offset}")
    cdef int error
    with nogil:
        error = kmem_reserve_blocks(fd, offset, length)
    return error


DEF WRITE_VECTORS = 1024      # IOV_MAX on Linux: the pieces one pwritev takes


def append_segment(int fd, pieces, int64_t position, index_entries=()):
    """Write ``pieces`` (bytes-like objects, in order) at ``position`` of the segment file open as ``fd``, then each
    of ``index_entries`` (``(index file path, entry bytes, position in that file)``; each file opened for it),
    without the GIL. All or nothing: when a write fails the segment file is cut back to ``position`` (an index
    entry written before lies past its index's valid entries) and OSError is raised; else returns the bytes
    written."""
    return _append_segment(fd, pieces, position, index_entries)


cdef int64_t _append_segment(int fd, pieces, int64_t position, index_entries) except -1:
    cdef Py_ssize_t count = len(pieces), held = 0, index_count = len(index_entries), i, first = 0, n
    cdef Py_ssize_t offset = 0, got, failed_entry = -1
    cdef int64_t done = 0, total = 0
    cdef int error = 0
    cdef Py_buffer* views = <Py_buffer*>calloc(count + index_count + 1, sizeof(Py_buffer))
    cdef iovec vectors[WRITE_VECTORS]
    cdef const char** names = <const char**>calloc(index_count + 1, sizeof(char*))
    cdef int64_t* index_positions = <int64_t*>calloc(index_count + 1, sizeof(int64_t))
    paths = [entry[0] for entry in index_entries]
    try:
        if views == NULL or names == NULL or index_positions == NULL:
            raise MemoryError()
        for i in range(count):
            PyObject_GetBuffer(pieces[i], &views[held], PyBUF_SIMPLE)
            held += 1
            total += views[i].len
        for i in range(index_count):
            path, entry, at = index_entries[i]
            index_positions[i] = at
            if type(path) is not bytes:
                raise TypeError(f"an index file's path must be bytes, not {type(path).__name__}")
            names[i] = <const char*>PyBytes_AS_STRING(path)
            PyObject_GetBuffer(entry, &views[held], PyBUF_SIMPLE)
            held += 1
        with nogil:
            while done < total:
                n = 0
                while first + n < count and n < WRITE_VECTORS:
                    vectors[n].iov_base = <char*>views[first + n].buf + (offset if n == 0 else 0)
                    vectors[n].iov_len = views[first + n].len - (offset if n == 0 else 0)
                    n += 1
                got = pwritev(fd, vectors, <int>n, position + done)
                if got < 0:
                    if errno == EINTR:
                        continue
                    error = errno
                    break
                if got == 0:
                    error = EIO         # no progress and no error: never loop on it
                    break
                done += got
                offset += got           # past the pieces written whole
                while first < count and offset >= views[first].len:
                    offset -= views[first].len
                    first += 1
            if not error:
                for i in range(index_count):
                    error = _write_file_at(names[i], <const unsigned char*>views[count + i].buf,
                                           views[count + i].len, index_positions[i])
                    if error:
                        failed_entry = i
                        break
            if error:
                ftruncate(fd, position)         # leave no partial batch behind
        if error and failed_entry >= 0:
            raise OSError(error, strerror(error).decode(), paths[failed_entry].decode(errors="surrogateescape"))
        if error:
            raise OSError(error, strerror(error).decode())
        return done
    finally:
        for i in range(held):
            PyBuffer_Release(&views[i])
        free(views)
        free(names)
        free(index_positions)


def index_floor(bytes path, Py_ssize_t entries, Py_ssize_t entry_size, Py_ssize_t field_at, int field_width,
                int64_t key):
    """``(row, its bytes)`` of the last of an index file's first ``entries`` rows (``entry_size`` bytes each,
    sorted by the signed big-endian field of ``field_width`` bytes, 4 or 8, at ``field_at``) whose field is at
    most ``key``; ``(-1, None)`` when none is, ``(-2, None)`` when the file is shorter than ``entries`` rows.
    The file at ``path`` is opened, binary-searched one ``pread`` of a row per step until the rows left fit in
    ``READ_WINDOW`` bytes, which are read at once and searched in memory, and closed. Raises OSError when it
    cannot be opened or read."""
    if field_width not in (4, 8) or entry_size <= 0 or entry_size > 64 or field_at < 0 \
            or field_at + field_width > entry_size or entries < 0:
        raise ValueError(f"index row of {entry_size} bytes cannot hold a {field_width}-byte field at {field_at}")
    cdef const char* name = path
    cdef uint8_t window[READ_WINDOW]
    cdef uint8_t found_row[64]
    cdef const uint8_t* row = window
    cdef Py_ssize_t low = 0, high = entries - 1, mid, found = -1, got = 0, first = 0, wanted
    cdef bint in_window = False
    cdef int fd, error = 0
    with nogil:
        fd = open_fd(name, O_RDONLY | O_CLOEXEC)
        if fd < 0:
            error = errno
        else:
            while low <= high:
                if not in_window and high - low < READ_WINDOW // entry_size:       # no product to overflow
                    wanted = (high - low + 1) * entry_size
                    got = _pread_fully(fd, window, wanted, <int64_t>low * entry_size)
                    if got != wanted:
                        error = errno if got < 0 else 0
                        break
                    first, in_window = low, True
                mid = low + (high - low) // 2
                if in_window:
                    row = window + (mid - first) * entry_size
                else:
                    got = _pread_fully(fd, window, entry_size, <int64_t>mid * entry_size)
                    if got != entry_size:
                        error = errno if got < 0 else 0
                        break
                    row = window
                if _big_endian(row + field_at, field_width) <= key:
                    found, low = mid, mid + 1
                    memcpy(found_row, row, entry_size)
                else:
                    high = mid - 1
            close_fd(fd)
    if error:
        raise OSError(error, strerror(error).decode(), path.decode(errors="surrogateescape"))
    if low <= high:
        return -2, None
    if found < 0:
        return -1, None
    return found, PyBytes_FromStringAndSize(<char*>found_row, entry_size)


cdef struct _Scan:
    # what a scan of batch heads found, and the window of the file its last read holds
    int64_t position          # the batch found, or -1: none; -2: a read failed (errno set)
    int64_t size              # its bytes
    Py_ssize_t got            # bytes of its head in the window (at most the head size asked)
    int64_t window_at
    Py_ssize_t window_got


cdef _Scan _scan_heads(int fd, uint8_t* window, int64_t position, int64_t end, int64_t offset,
                       Py_ssize_t head_size) noexcept nogil:
    """The first complete batch between ``position`` and ``end`` whose last offset is at least ``offset``; the
    file is read ``READ_WINDOW`` bytes at a time into ``window`` and the heads found there walked without
    another read (the scan from an index entry crosses about ``index.interval.bytes`` of small batches)."""
    cdef _Scan scan
    cdef const uint8_t* head
    cdef int64_t last_offset, available
    cdef bint window_read = False
    scan.position, scan.window_at, scan.window_got = -1, 0, 0
    while end - position >= 12:
        # a new window unless this head lies whole in the last one, or the file ended within it
        if not window_read or position + head_size > scan.window_at + scan.window_got \
                and scan.window_got == READ_WINDOW:
            scan.window_got = _pread_fully(fd, window, READ_WINDOW, position)
            if scan.window_got < 0:
                scan.position = -2
                return scan
            scan.window_at, window_read = position, True
        available = scan.window_at + scan.window_got - position     # negative past the end of a file cut short
        scan.got = 0 if available < 0 else (available if available < head_size else head_size)
        if scan.got <= 16:
            break
        head = window + (position - scan.window_at)
        scan.size = 12 + _big_endian(head + 8, 4)
        if position + scan.size > end or scan.size < (61 if head[16] == 2 else 26):
            break
        if scan.got < (scan.size if scan.size < head_size else head_size):
            break               # the file ends before the batch's head: shorter than the segment thinks
        last_offset = _big_endian(head, 8)
        if head[16] == 2:
            last_offset += _big_endian(head + 23, 4)
        if last_offset >= offset:
            scan.position = position
            return scan
        position += scan.size
    return scan


cdef _raise_read_failed():
    raise OSError(errno, f"pread of a segment failed: {strerror(errno).decode()}")


def first_batch_reaching(int fd, int64_t position, int64_t end, int64_t offset, Py_ssize_t head_size):
    """``(position, head)`` of the first complete batch of a segment file between ``position`` and ``end`` whose
    last offset is at least ``offset``, ``head`` its first ``head_size`` bytes (at least 61; fewer for a smaller
    batch at the file's end); None when no complete batch before ``end`` reaches it. A batch whose length is
    below its format's header (a damaged tail, never a validated one), or whose head the file cuts short, ends
    the scan. Raises OSError when a read fails."""
    if head_size < 61 or head_size > 256:
        raise ValueError(f"a batch head of {head_size} bytes cannot be read")
    cdef uint8_t window[READ_WINDOW]
    cdef _Scan scan
    with nogil:
        scan = _scan_heads(fd, window, position, end, offset, head_size)
    if scan.position == -2:
        _raise_read_failed()
    if scan.position < 0:
        return None
    return scan.position, PyBytes_FromStringAndSize(<char*>window + (scan.position - scan.window_at), scan.got)


def fetch_slice(int fd, int64_t position, int64_t end, int64_t offset, int64_t max_end, int64_t max_bytes,
                bint min_one_message, Py_ssize_t copy_below):
    """What a fetch at ``offset`` reads of a segment file (Kafka's ``LogSegment.read``): ``(position, size,
    data)`` of the slice from the first complete batch between ``position`` and ``end`` whose last offset reaches
    ``offset`` (found as ``first_batch_reaching`` finds it), of at most ``max_bytes`` (or that batch whole, when
    larger, with ``min_one_message``) and ending by ``max_end``; ``size`` is 0 or less when nothing fits. ``data``
    is the slice's bytes when it is shorter than ``copy_below`` (from the scan's own read when it holds them, so
    a small read at the tail costs one ``pread``; fewer where the file ends), else None: the caller sends it from
    the file. None when no batch reaches ``offset``. Raises OSError when a read fails."""
    if copy_below < 0:
        raise ValueError(f"cannot copy below {copy_below} bytes")
    cdef uint8_t window[READ_WINDOW]
    cdef _Scan scan
    cdef int64_t size, wanted = max_bytes
    cdef Py_ssize_t got
    with nogil:
        scan = _scan_heads(fd, window, position, end, offset, 61)
    if scan.position == -2:
        _raise_read_failed()
    if scan.position < 0:
        return None
    if min_one_message and scan.size > wanted:
        wanted = scan.size
    size = max_end - scan.position
    if wanted < size:
        size = wanted
    if size <= 0 or size >= copy_below:
        return scan.position, size, None
    if scan.position + size <= scan.window_at + scan.window_got:
        return scan.position, size, PyBytes_FromStringAndSize(
            <char*>window + (scan.position - scan.window_at), size)
    data = PyBytes_FromStringAndSize(NULL, size)
    cdef uint8_t* into = <uint8_t*>PyBytes_AS_STRING(data)
    with nogil:
        got = _pread_fully(fd, into, size, scan.position)
    if got < 0:
        _raise_read_failed()
    return scan.position, size, data if got == size else data[:got]
