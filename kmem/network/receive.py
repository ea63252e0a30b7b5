"""Kafka's framing: every message is a 4-byte big-endian size followed by that many bytes.

``NetworkReceive`` reads one frame from a transport into pool memory, asking the pool once, when the size
prefix is complete, for exactly the payload's size; when the pool refuses, the receive waits and every
later read retries. ``NetworkSend`` writes one frame: the size prefix, then bytes or any ``Send``.
"""
from kmem.errors import InvalidArgumentError, InvalidReceiveError
from kmem.pool import NONE
from kmem.send import SequenceSend, as_transport, close_send

UNLIMITED = -1
SIZE_PREFIX_BYTES = 4
MAX_FRAME_SIZE = (1 << 31) - 1


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
    """One outgoing frame to ``destination``: the 4-byte size prefix, then ``payload`` (bytes-like or a
    ``Send``, whose ``size`` is the prefix). A bytes-like payload goes out with its prefix in one vectored
    write and no other object: most responses are a few hundred bytes, and this is each one's path. A
    ``Send`` follows the prefix as a ``SequenceSend`` part (its leading bytes join the prefix's write)."""

    __slots__ = ("destination", "size", "remaining", "_views", "_body")

    def __init__(self, destination, payload):
        is_send = hasattr(payload, "write_to")
        view = None if is_send else memoryview(payload).cast("B")
        length = payload.size if is_send else view.nbytes
        if length > MAX_FRAME_SIZE:
            raise InvalidArgumentError(f"a frame to {destination} cannot hold {length} bytes "
                                       f"(the size prefix is a signed 32-bit integer)")
        prefix = length.to_bytes(SIZE_PREFIX_BYTES, "big")
        self._views = None if is_send else [memoryview(prefix), view]
        self._body = SequenceSend([prefix, payload]) if is_send else None
        self.destination = destination
        self.size = self.remaining = SIZE_PREFIX_BYTES + length

    @property
    def completed(self):
        return self.remaining == 0

    def write_to(self, transport):
        if self._body is not None:
            written = self._body.write_to(transport)
        elif self._views:
            written = as_transport(transport).write(self._views)
            left = written
            while self._views and left >= self._views[0].nbytes:     # those written whole go
                left -= self._views.pop(0).nbytes
            if left:
                self._views[0] = self._views[0][left:]
        else:
            return 0
        self.remaining -= written
        return written

    def close(self):
        """Release what an unwritten body holds (idempotent)."""
        self._views = None
        body, self._body = self._body, None
        close_send(body)

    def __repr__(self):
        return f"<NetworkSend to {self.destination} {self.size - self.remaining}/{self.size} bytes>"
