"""Kafka's framing: every message is a 4-byte big-endian size followed by that many bytes.

``NetworkReceive`` reads one frame from a transport into pool memory, asking the pool once, when the size
prefix is complete, for exactly the payload's size; when the pool refuses, the receive waits and every
later read retries. ``NetworkSend`` writes one frame, resuming partial writes.
"""
from kmem.errors import InvalidReceiveError
from kmem.pool import NONE

UNLIMITED = -1
SIZE_PREFIX_BYTES = 4


class NetworkReceive:
    """One incoming size-prefixed frame.

    ``payload`` is the frame's bytes once ``complete`` (a ``PooledBuffer`` from a bounded pool, a
    ``bytearray`` from ``NONE``, ``b""`` for an empty frame). The owner must ``close()`` the receive when
    done with it: that is what gives the memory back to the pool.
    """

    __slots__ = ("source", "max_size", "pool", "payload", "_size", "_prefix", "_prefix_read", "_view", "_filled")

    def __init__(self, source, max_size=UNLIMITED, pool=NONE):
        self.source = source
        self.max_size = max_size
        self.pool = pool
        self.payload = None
        self._size = None
        self._prefix = bytearray(SIZE_PREFIX_BYTES)
        self._prefix_read = 0
        self._view = None
        self._filled = 0

    @property
    def size(self):
        """The payload size announced by the prefix, or ``None`` while the prefix is incomplete."""
        return self._size

    @property
    def memory_allocated(self):
        """True once the payload has memory (always true for an empty frame)."""
        return self.payload is not None

    @property
    def waiting_for_memory(self):
        return self._size is not None and self.payload is None

    @property
    def complete(self):
        return self.payload is not None and self._filled == self._size

    def read_from(self, transport):
        """Read what the transport has, up to the end of this frame; returns the bytes read.

        Raises ``InvalidReceiveError`` for a negative or oversized prefix (nothing is allocated then) and
        ``EOFError`` when the peer closed the connection.
        """
        read = 0
        if self._size is None:
            n = transport.read_into(memoryview(self._prefix)[self._prefix_read:])
            read += n
            self._prefix_read += n
            if self._prefix_read < SIZE_PREFIX_BYTES:
                return read
            self._size = self._check_size(int.from_bytes(self._prefix, "big", signed=True))
        if self.payload is None:
            if not self._allocate():
                return read
        while self._filled < self._size:
            n = transport.read_into(self._view[self._filled:])
            if n == 0:
                break
            self._filled += n
            read += n
        return read

    def _check_size(self, size):
        if size < 0:
            raise InvalidReceiveError(f"invalid receive from {self.source}: negative size {size}")
        if self.max_size != UNLIMITED and size > self.max_size:
            raise InvalidReceiveError(
                f"invalid receive from {self.source}: size {size} is larger than the maximum {self.max_size}")
        return size

    def _allocate(self):
        if self._size == 0:
            self.payload = b""
            return True
        buf = self.pool.try_allocate(self._size)
        if buf is None:
            return False
        self.payload = buf
        self._view = memoryview(buf)
        return True

    def close(self):
        """Give the payload's memory back to the pool (idempotent)."""
        if self._view is not None:
            self._view.release()    # a live view would keep the block out of the pool's reuse
            self._view = None
        payload, self.payload = self.payload, None
        if payload is not None and len(payload):
            self.pool.release(payload)

    def __repr__(self):
        return f"<NetworkReceive from {self.source} size={self._size} filled={self._filled}>"


class NetworkSend:
    """One outgoing frame: the size prefix, then the payload, written as far as the transport takes it."""

    __slots__ = ("destination", "size", "remaining", "_views")

    def __init__(self, destination, payload):
        body = memoryview(payload).cast("B")
        self.destination = destination
        self.size = SIZE_PREFIX_BYTES + body.nbytes
        self.remaining = self.size
        self._views = [memoryview(body.nbytes.to_bytes(SIZE_PREFIX_BYTES, "big")), body]

    @property
    def completed(self):
        return self.remaining == 0

    def write_to(self, transport):
        """Write what the transport accepts now; returns the bytes written."""
        written = transport.write(self._views)
        self.remaining -= written
        left = written
        while left:
            head = self._views[0]
            if left >= head.nbytes:
                left -= head.nbytes
                self._views.pop(0)
            else:
                self._views[0] = head[left:]
                left = 0
        while self._views and not self._views[0].nbytes:
            self._views.pop(0)     # an empty payload leaves an empty view behind
        return written

    def __repr__(self):
        return f"<NetworkSend to {self.destination} {self.size - self.remaining}/{self.size} bytes>"
