# Shared memory mappings of files that hold no file descriptor.
#
# Python's mmap.mmap keeps a dup() of the descriptor for the mapping's life (for size() and resize()).
# The ledger maps its active file and each Bloom sidecar of every partition: with mmap.mmap that was two
# descriptors a partition on top of the log's, and a broker at 1,024 descriptors could not create 250
# partitions. mmap(2) needs the descriptor only while it maps: FileMapping closes nothing and keeps
# nothing, so the caller closes its file as soon as the mapping is made.

from libc.errno cimport errno
from posix.mman cimport MAP_FAILED, MAP_SHARED, MS_SYNC, PROT_READ, PROT_WRITE, msync, munmap
from posix.mman cimport mmap as map_file
from posix.stat cimport fstat, struct_stat

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)


@cython.final
cdef class FileMapping:
    """The first ``length`` bytes (default: all) of the file open as ``fd``, mapped shared, read-only or
    ``writable``; the descriptor may be closed as soon as this returns.

    A buffer (``memoryview``, ``np.frombuffer``) of exactly ``len()`` bytes. ``close()`` unmaps it, and
    raises BufferError while buffers over it are exported (as ``mmap.mmap.close`` does: the mapping then
    goes with the last of them); after ``close`` every use raises ValueError. ``flush`` and ``madvise``
    also count as exports while they run without the GIL, so another thread cannot unmap under them.
    A mapping longer than the file is refused: a store or load past its end would be SIGBUS.
    """
    cdef uint8_t* data
    cdef Py_ssize_t length
    cdef Py_ssize_t exports
    cdef readonly bint writable

    def __cinit__(self, int fd, length=None, bint writable=False):
        cdef struct_stat status
        cdef void* mapped
        if fstat(fd, &status) != 0:
            raise OSError(errno, "fstat of a file to map failed")
        size = status.st_size if length is None else length
        if size <= 0 or size > status.st_size:
            raise ValueError(f"cannot map {size} bytes of a file of {status.st_size} bytes")
        mapped = map_file(NULL, <size_t>size, PROT_READ | (PROT_WRITE if writable else 0), MAP_SHARED, fd, 0)
        if mapped == MAP_FAILED:
            raise OSError(errno, "mmap failed")
        self.data, self.length, self.writable = <uint8_t*>mapped, size, writable

    def __len__(self):
        return self.length

    @property
    def closed(self):
        return self.data == NULL

    cdef uint8_t* claim(self) except NULL:
        """The mapping, counted as an export while a call uses it without the GIL (ValueError if closed)."""
        if self.data == NULL:
            raise ValueError("the file mapping is closed")
        self.exports += 1
        return self.data

    def __getbuffer__(self, Py_buffer* view, int flags):
        if self.data == NULL:
            raise ValueError("the file mapping is closed")
        PyBuffer_FillInfo(view, self, self.data, self.length, not self.writable, flags)   # BufferError: not writable
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1

    def flush(self):
        """msync: the mapping's writes reach the file on disk."""
        cdef uint8_t* data = self.claim()
        cdef int error = 0
        with nogil:
            if msync(data, self.length, MS_SYNC) != 0:
                error = errno
        self.exports -= 1
        if error:
            raise OSError(error, "msync failed")

    def madvise(self, int advice):
        """madvise(2) over the whole mapping (``mmap.MADV_*`` values)."""
        cdef uint8_t* data = self.claim()
        cdef int error = 0
        with nogil:
            if madvise(data, self.length, advice) != 0:
                error = errno
        self.exports -= 1
        if error:
            raise OSError(error, "madvise failed")

    def close(self):
        """Unmap now; BufferError while buffers over the mapping exist. Closing again does nothing."""
        if self.exports:
            raise BufferError("cannot close a file mapping while buffers over it exist")
        if self.data != NULL:
            munmap(self.data, self.length)
            self.data = NULL

    def __dealloc__(self):
        if self.data != NULL:        # exports hold a reference: none is left
            munmap(self.data, self.length)

    def __repr__(self):
        state = "closed" if self.data == NULL else ("writable" if self.writable else "read-only")
        return f"<FileMapping {self.length} bytes, {state}>"
