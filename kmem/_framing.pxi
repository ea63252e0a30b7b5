# Kafka's framing on a connection (kmem.network.receive): a 4-byte big-endian size, then that many bytes.
#
# A receive and a send run for every request on a network thread, a few steps each; compiled, they are the
# same objects to Python without an interpreted frame per step. What they decide stays as it was in Python:
# the pool is asked once per frame, the transport moves the bytes, errors are kmem.errors'.

NETWORK_UNLIMITED = -1
NETWORK_SIZE_PREFIX_BYTES = 4
NETWORK_MAX_FRAME_SIZE = (1 << 31) - 1


cdef Py_ssize_t _read_into(transport, view) except -1:
    """``transport.read_into(view)``: a C call for the usual plaintext transport."""
    if type(transport) is PlaintextTransport:
        return (<PlaintextTransport>transport).read_into(view)
    return transport.read_into(view)


@cython.final
cdef class NetworkReceive:
    """One incoming size-prefixed frame.

    ``payload`` is the frame's bytes once ``complete`` (a ``PooledBuffer`` from a bounded pool, a
    ``bytearray`` from ``NONE``, ``b""`` for an empty frame). The owner must ``close()`` the receive when
    done with it: that is what gives the memory back to the pool.
    """

    cdef readonly object source
    cdef public long long max_size
    cdef readonly object pool
    cdef public object payload
    cdef long long _size            # -1 while the prefix is incomplete
    cdef bytearray _prefix
    cdef Py_ssize_t _prefix_read
    cdef object _view
    cdef long long _filled

    def __init__(self, source, max_size=NETWORK_UNLIMITED, pool=None):
        if pool is None:
            from kmem.pool import NONE as pool
        self.source = source
        self.max_size = max_size
        self.pool = pool
        self.payload = None
        self._size = -1
        self._prefix = bytearray(NETWORK_SIZE_PREFIX_BYTES)
        self._prefix_read = 0
        self._view = None
        self._filled = 0

    @property
    def size(self):
        """The payload size announced by the prefix, or ``None`` while the prefix is incomplete."""
        return None if self._size < 0 else self._size

    @property
    def memory_allocated(self):
        """True once the payload has memory (always true for an empty frame)."""
        return self.payload is not None

    @property
    def waiting_for_memory(self):
        return self.is_waiting_for_memory()

    cdef inline bint is_waiting_for_memory(self):
        return self._size >= 0 and self.payload is None

    @property
    def complete(self):
        return self.is_complete()

    cdef inline bint is_complete(self):
        return self.payload is not None and self._filled == self._size

    cpdef Py_ssize_t read_from(self, transport) except -1:
        """Read what the transport has, up to the end of this frame; returns the bytes read.

        Raises ``InvalidReceiveError`` for a negative or oversized prefix (nothing is allocated then) and
        ``EOFError`` when the peer closed the connection.
        """
        cdef Py_ssize_t n, read = 0
        cdef const unsigned char* p
        if self._size < 0:
            n = _read_into(transport, self._prefix if self._prefix_read == 0
                           else memoryview(self._prefix)[self._prefix_read:])
            read += n
            self._prefix_read += n
            if self._prefix_read < NETWORK_SIZE_PREFIX_BYTES:
                return read
            if len(self._prefix) != NETWORK_SIZE_PREFIX_BYTES:    # it went to the transport unlocked
                from kmem.errors import IllegalStateError
                raise IllegalStateError(f"the transport of {self.source} resized the size prefix's buffer")
            p = <const unsigned char*>PyByteArray_AS_STRING(self._prefix)
            self._size = self._checked_size(<int32_t>be32(p))
        if self.payload is None:
            if not self._allocate():
                return read
        while self._filled < self._size:
            n = _read_into(transport, self._view if self._filled == 0 else self._view[self._filled:])
            if n == 0:
                break
            self._filled += n
            read += n
        return read

    cdef long long _checked_size(self, long long size) except -1:
        if size < 0:
            from kmem.errors import InvalidReceiveError
            raise InvalidReceiveError(f"invalid receive from {self.source}: negative size {size}")
        if self.max_size != NETWORK_UNLIMITED and size > self.max_size:
            from kmem.errors import InvalidReceiveError
            raise InvalidReceiveError(
                f"invalid receive from {self.source}: size {size} is larger than the maximum {self.max_size}")
        return size

    cdef bint _allocate(self) except -1:
        if self._size == 0:
            self.payload = b""
            return True
        buf = self.pool.try_allocate(self._size)
        if buf is None:
            return False
        self.payload = buf
        self._view = memoryview(buf)
        return True

    cpdef close(self):
        """Give the payload's memory back to the pool (idempotent)."""
        if self._view is not None:
            self._view.release()    # a live view would keep the block out of the pool's reuse
            self._view = None
        payload, self.payload = self.payload, None
        if payload is not None and len(payload):
            self.pool.release(payload)

    def __repr__(self):
        return f"<NetworkReceive from {self.source} size={self.size} filled={self._filled}>"


@cython.final
cdef class NetworkSend:
    """One outgoing frame to ``destination``: the 4-byte size prefix, then ``payload`` (bytes-like or a
    ``Send``, whose ``size`` is the prefix). A bytes-like payload goes out with its prefix in one vectored
    write and no other object: most responses are a few hundred bytes, and this is each one's path. A
    ``Send`` follows the prefix as a ``SequenceSend`` part (its leading bytes join the prefix's write)."""

    cdef readonly object destination
    cdef readonly object size
    cdef readonly object remaining
    cdef list _views
    cdef object _body

    def __init__(self, destination, payload):
        is_send = hasattr(payload, "write_to")
        view = None if is_send else memoryview(payload).cast("B")
        length = payload.size if is_send else view.nbytes
        if length > NETWORK_MAX_FRAME_SIZE:
            from kmem.errors import InvalidArgumentError
            raise InvalidArgumentError(f"a frame to {destination} cannot hold {length} bytes "
                                       f"(the size prefix is a signed 32-bit integer)")
        prefix = length.to_bytes(NETWORK_SIZE_PREFIX_BYTES, "big")
        if is_send:
            from kmem.send import SequenceSend
            self._body = SequenceSend([prefix, payload])
        else:
            self._views = [memoryview(prefix), view]
        self.destination = destination
        self.size = self.remaining = NETWORK_SIZE_PREFIX_BYTES + length

    @property
    def completed(self):
        return self.remaining == 0

    cpdef write_to(self, transport):
        cdef Py_ssize_t left
        views = self._views
        if self._body is not None:
            written = self._body.write_to(transport)
        elif views:
            if type(transport) is PlaintextTransport:       # the usual one: a C call
                written = (<PlaintextTransport>transport).write(views)
            else:
                if not hasattr(transport, "send_file"):     # a socket or a channel: seen as a transport
                    from kmem.send import as_transport
                    transport = as_transport(transport)
                written = transport.write(views)
            left = written
            while views and left >= views[0].nbytes:        # those written whole go
                left -= views.pop(0).nbytes
            if left:
                views[0] = views[0][left:]
        else:
            return 0
        self.remaining -= written
        return written

    def close(self):
        """Release what an unwritten body holds (idempotent)."""
        self._views = None
        body, self._body = self._body, None
        if body is not None:
            from kmem.send import close_send
            close_send(body)

    def __repr__(self):
        return f"<NetworkSend to {self.destination} {self.size - self.remaining}/{self.size} bytes>"
