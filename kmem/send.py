"""Sends: bytes on their way to a socket, written a non-blocking write at a time (Kafka's ``Send``).

A send knows its ``size`` before its first byte goes out (a Kafka frame's size prefix needs it), and
``write_to(transport)`` makes progress without blocking: it returns the bytes written, 0 when the
transport is full. The transport (plaintext or TLS) decides how bytes move; a send only says which.

- ``BytesSend``: a bytes-like object (no copy).
- ``SequenceSend``: sends written back to back, e.g. a response header followed by per-partition records.
"""
from typing import Protocol, runtime_checkable


@runtime_checkable
class Send(Protocol):
    size: int
    remaining: int

    @property
    def completed(self) -> bool: ...

    def write_to(self, transport) -> int: ...


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
        written = transport.write([self._pending])
        self._pending = self._pending[written:]
        self.remaining -= written
        return written

    def __repr__(self):
        return f"<BytesSend {self.size - self.remaining}/{self.size} bytes>"


class SequenceSend:
    """Several sends written in order as one; ``size`` is their sum."""

    def __init__(self, sends):
        self._sends = [send if isinstance(send, Send) else BytesSend(send) for send in sends]
        self.size = sum(send.size for send in self._sends)
        self.remaining = self.size
        self._current = 0

    @property
    def completed(self):
        return self.remaining == 0

    def write_to(self, transport):
        written = 0
        while self._current < len(self._sends):
            send = self._sends[self._current]
            n = send.write_to(transport)
            written += n
            if not send.completed:
                break
            self._sends[self._current] = None      # let a written part's memory go
            self._current += 1
        self.remaining -= written
        return written

    def __repr__(self):
        return f"<SequenceSend {self.size - self.remaining}/{self.size} bytes in {len(self._sends)} parts>"
