"""Transport layers: how a channel moves bytes over its socket (plaintext or TLS), non-blocking.

Both offer the same small surface: ``ready`` (handshake done), ``handshake()``, ``read_into(view)``
(bytes read, 0 when nothing is available now, ``EOFError`` when the peer closed), ``write(views)``
(bytes accepted now), ``send_file(fd, offset, count)`` (bytes of a file region sent now: the transport,
not the sender, chooses between ``os.sendfile`` and copying), ``has_bytes_buffered`` (bytes the transport
holds that the socket will not announce again), ``events`` (what to wait for while not ready) and
``close()``. The plaintext one is compiled (``kmem/_channel.pxi``): its reads and writes are every request's.
"""
import selectors
import ssl

from kmem._core import PlaintextTransport
from kmem.send import COPY_CHUNK, copy_file_once

__all__ = ["PlaintextTransport", "TlsTransport"]

# OpenSSL refuses a retried write unless it is the same length: writing fixed-size chunks keeps a retry
# after SSLWantWriteError identical. 16 KiB is one TLS record.
TLS_WRITE_CHUNK = 16 * 1024


class TlsTransport:
    """TLS over a non-blocking socket (Python's ``ssl``), the handshake driven by the selector.

    Decrypted bytes that OpenSSL holds after the socket was drained are reported by
    ``has_bytes_buffered`` so that the selector keeps reading them without waiting for the socket.
    """

    def __init__(self, sock, context, server_side, server_hostname=None):
        self.sock = context.wrap_socket(sock, server_side=server_side, server_hostname=server_hostname,
                                        do_handshake_on_connect=False)
        self.ready = False
        self.events = selectors.EVENT_READ | selectors.EVENT_WRITE

    def handshake(self):
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.events = selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            self.events = selectors.EVENT_WRITE
        else:
            self.ready = True
            self.events = 0

    @property
    def has_bytes_buffered(self):
        return self.ready and self.sock.pending() > 0

    def read_into(self, view):
        try:
            n = self.sock.recv_into(view)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
            return 0
        except ssl.SSLZeroReturnError:
            raise EOFError("TLS connection closed by peer") from None
        if n == 0 and len(view):
            raise EOFError("connection closed by peer")
        return n

    def write(self, views):
        written = 0
        for view in views:
            pos = 0
            while pos < view.nbytes:
                try:
                    n = self.sock.send(view[pos:pos + TLS_WRITE_CHUNK])
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                    return written
                pos += n
                written += n
        return written

    def send_file(self, fd, offset, count):
        """Copies of at most ``COPY_CHUNK`` bytes, one at a time, until the socket is full: TLS encrypts in
        user space, so ``sendfile`` would bypass it."""
        sent = 0
        while sent < count:
            wanted = min(count - sent, COPY_CHUNK)
            n = copy_file_once(self, fd, offset + sent, wanted)
            sent += n
            if n < wanted:
                break
        return sent

    def close(self):
        self.sock.close()
