"""Sends: bytes on their way to a socket, written a non-blocking write at a time (Kafka's ``Send``).

A send knows its ``size`` before its first byte goes out (a Kafka frame's size prefix needs it), and
``write_to(transport)`` makes progress without blocking: it returns the bytes written, 0 when the
transport is full. The transport (plaintext or TLS) decides how bytes move; a send only says which.

- ``BytesSend``: a bytes-like object (no copy).
- ``FileRegionSend``: a region of a file: ``os.sendfile`` on a plain socket, bounded copies under TLS.
- ``SequenceSend``: sends written back to back, e.g. a response header followed by per-partition records.
- ``LazyDownConvertRecordsSend`` (``kmem.records``): records down-converted a chunk at a time (KIP-283).

A send that holds resources (a file descriptor, the source of a conversion) lets them go once completed
and on ``close()``: whoever drops a send unfinished (its connection closed) calls ``close_send``.

A transport has ``write(views)`` (bytes accepted now) and ``send_file(fd, offset, count)`` (bytes of the
file sent now); ``kmem.network``'s transports are such. ``write_to`` also accepts a plain socket, a TLS
socket (``ssl.SSLSocket``) or any object with ``write``, seen through ``as_transport``.
"""
import os
import socket
import ssl
from typing import Protocol, runtime_checkable

from kmem.errors import IllegalStateError, InvalidArgumentError

# The most bytes of a file region read per copy: what a send holds while a transport that cannot
# sendfile (TLS encrypts in user space) writes it.
COPY_CHUNK = 64 << 10
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


@runtime_checkable
class Send(Protocol):
    size: int
    remaining: int

    @property
    def completed(self) -> bool: ...

    def write_to(self, transport) -> int: ...


def close_send(send):
    """Release what an unfinished ``send`` holds: its ``close()``, for the sends that have one."""
    close = getattr(send, "close", None)
    if close is not None:
        close()


def sendfile_once(sock, fd, offset, count):
    """One ``os.sendfile`` of up to ``count`` bytes of ``fd`` from ``offset`` to a plain socket (zero-copy);
    0 when the socket is full."""
    try:
        sent = os.sendfile(sock.fileno(), fd, offset, count)
    except _WOULD_BLOCK:
        return 0
    if sent == 0 and count:
        raise IllegalStateError(f"file region ends early: nothing to send at byte {offset} of descriptor {fd}")
    return sent


def copy_file_once(transport, fd, offset, count):
    """A ``pread`` of at most ``COPY_CHUNK`` bytes written through ``transport.write``; the bytes it did not
    take are read again by the next call (the file does not change, so a TLS retry sees the same bytes)."""
    data = os.pread(fd, min(count, COPY_CHUNK), offset)
    if not data:
        raise IllegalStateError(f"file region ends early: nothing to read at byte {offset} of descriptor {fd}")
    return transport.write([memoryview(data)])


class ChannelTransport:
    """A plain socket, a TLS socket or an object with ``write`` (e.g. a file) as a transport: one
    ``send``/``write`` call per view. Only a plain socket gets ``sendfile``: an ``ssl.SSLSocket``'s
    descriptor is the TCP stream under the TLS session, where file bytes would go out unencrypted."""

    def __init__(self, channel):
        self.channel = channel

    def write(self, views):
        written = 0
        for view in views:
            try:
                n = (self.channel.send(view) if hasattr(self.channel, "send") else self.channel.write(view)) or 0
            except _WOULD_BLOCK:
                n = 0
            written += n
            if n < len(view):
                break
        return written

    def send_file(self, fd, offset, count):
        if type(self.channel) is socket.socket:
            return sendfile_once(self.channel, fd, offset, count)
        return copy_file_once(self, fd, offset, count)


def as_transport(channel):
    """``channel`` itself when it is a transport (has ``send_file``), else a ``ChannelTransport`` over it."""
    return channel if hasattr(channel, "send_file") else ChannelTransport(channel)


class BytesSend:
    """A bytes-like object sent as it is."""

    def __init__(self, data):
        self._pending = memoryview(data).cast("B")
        self.size = self._pending.nbytes
        self.remaining = self.size

    @property
    def completed(self):
        return self.remaining == 0

    def write_to(self, transport):
        if not self.remaining:
            return 0
        written = as_transport(transport).write([self._pending])
        self._advance(written)
        return written

    def _advance(self, count):
        self._pending = self._pending[count:]
        self.remaining -= count

    def __repr__(self):
        return f"<BytesSend {self.size - self.remaining}/{self.size} bytes>"


class FileRegionSend:
    """``count`` bytes of a file from byte ``position``, read only as they are written.

    ``file`` is a descriptor or an object with ``fileno()``; the send keeps a duplicate of the descriptor
    (closed once completed, or with the send), so the caller may close its file at once; with ``_adopt`` it
    keeps the descriptor itself, which it then owns (``FileRecords.into_send``). The transport
    sends the region with ``os.sendfile`` (plain sockets) or copies at most ``COPY_CHUNK`` bytes per call
    (TLS); a region past the end of the file raises ``IllegalStateError`` when reached.
    """

    _fd = None      # so that __del__ has nothing to close when __init__ fails

    def __init__(self, file, position, count, *, _adopt=False):
        fd = file if isinstance(file, int) else file.fileno()
        for name, value in (("position", position), ("count", count)):
            if not isinstance(value, int) or value < 0:
                if _adopt:
                    os.close(fd)
                raise InvalidArgumentError(f"file region {name} must be a non-negative integer, got {value!r}")
        self._fd = fd if _adopt else os.dup(fd)
        self._position = position
        self.size = self.remaining = count
        if not count:
            self.close()

    @property
    def completed(self):
        return self.remaining == 0

    def write_to(self, transport):
        if not self.remaining:
            return 0
        written = as_transport(transport).send_file(self._fd, self._position, self.remaining)
        self._position += written
        self.remaining -= written
        if not self.remaining:
            self.close()
        return written

    def close(self):
        """Close the duplicated descriptor (idempotent); done by itself once the region is written."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.close()

    def __repr__(self):
        return f"<FileRegionSend {self.size - self.remaining}/{self.size} bytes>"


class SequenceSend:
    """Several sends (or bytes-like objects) written in order as one; ``size`` is their sum. Consecutive
    bytes parts go out in one vectored write (a frame's size prefix with its header: one packet, not
    two), and a ``SequenceSend`` part is spliced in."""

    def __init__(self, sends):
        self._sends = []
        for send in sends:
            if isinstance(send, SequenceSend) and send.remaining == send.size:
                self._sends.extend(send._sends[send._current:])
            else:
                self._sends.append(send if hasattr(send, "write_to") else BytesSend(send))
        self.size = sum(send.size for send in self._sends)
        self.remaining = self.size
        self._current = 0

    @property
    def completed(self):
        return self.remaining == 0

    def write_to(self, transport):
        transport = as_transport(transport)
        written = 0
        while self._current < len(self._sends):
            send = self._sends[self._current]
            if isinstance(send, BytesSend):
                n, done = self._write_bytes_run(transport)
            else:
                n = send.write_to(transport)
                done = send.completed
            written += n
            if not done:
                break
            self._sends[self._current] = None      # let a written part's memory go
            self._current += 1
        self.remaining -= written
        return written

    def close(self):
        """Release the parts not yet written (idempotent)."""
        for index in range(self._current, len(self._sends)):
            close_send(self._sends[index])
            self._sends[index] = None
        self._current = len(self._sends)

    def _write_bytes_run(self, transport):
        """Write the bytes parts from the current one on in one call; ``(written, all of them written)``.
        The parts wholly written but the last are passed over here."""
        end = self._current
        while end < len(self._sends) and isinstance(self._sends[end], BytesSend):
            end += 1
        run = self._sends[self._current:end]
        written = transport.write([part._pending for part in run if part.remaining])
        left = written
        for part in run:
            step = min(left, part.remaining)
            part._advance(step)
            left -= step
            if part.remaining:
                return written, False
            if part is not run[-1]:
                self._sends[self._current] = None
                self._current += 1
        return written, True

    def __repr__(self):
        return f"<SequenceSend {self.size - self.remaining}/{self.size} bytes in {len(self._sends)} parts>"
