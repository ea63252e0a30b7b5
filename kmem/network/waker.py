"""``Waker``: lets any thread interrupt a ``selectors`` wait in the thread that owns it."""
import selectors
import socket


class Waker:
    """A socket pair registered with a selector; ``wakeup()`` makes its ``select`` return.

    ``wakeup`` is safe from any thread, also while (or after) the owning thread closes the waker: at
    shutdown the owner may close it between another thread's decision to wake it and the wakeup itself.
    """

    def __init__(self, selector):
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._closed = False
        self._pending = False       # a byte is in the pair, not yet drained: more wakeups need no write
        selector.register(self._reader, selectors.EVENT_READ, None)
        self.count = 0      # wakeups drained, for tests and diagnostics

    def owns(self, key):
        return key.fileobj is self._reader

    def wakeup(self):
        if self._closed or self._pending:
            return
        self._pending = True
        try:
            self._writer.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass        # a wakeup is already pending
        except OSError:
            # Closed by the owner meanwhile (EBADF, or EPIPE once the reader is gone): nobody to wake.
            if not self._closed:
                raise

    def drain(self):
        self.count += 1
        try:
            while self._reader.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        # After reading: a wakeup that skipped its write since then had its work queued before this
        # drain returned, so the owner sees it; cleared before reading, a wakeup could be swallowed.
        self._pending = False

    def close(self):
        self._closed = True
        self._reader.close()
        self._writer.close()
