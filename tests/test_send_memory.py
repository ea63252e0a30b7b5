"""The memory a response holds while it is written is what its Send keeps, whatever the response's size:
a 256 MiB segment answered by a SocketServer handler, as a lazy down-conversion (one chunk at a time)
or as a file region (sendfile, or one bounded copy at a time under TLS), over plaintext and TLS.

Memory is measured with tracemalloc from the client's side of an in-process server: every buffer a send
holds (converted chunks, copies of the file) is a Python object; the client reads into one preallocated
buffer. The bytes received are compared, by CRC, with what an eager write of the same send produces.
"""
import tracemalloc
import zlib

import pytest

from kmem.network import SocketServer
from kmem.records import FileRecords, LazyDownConvertRecords, segment_file_name
from kmem.send import COPY_CHUNK, SequenceSend

from network_helpers import connect, frame, recv_exactly, recv_frame, tls_contexts  # noqa: F401
from test_records_lazy_memory import write_v2_log

SEGMENT_BYTES = 256 << 20
CHUNK = 128 << 10
CONSTANT = 64 << 10         # the server's per-request objects, the client's small reads
HEADER = b"response header"


@pytest.fixture(scope="module")
def big_segment(tmp_path_factory):
    path = write_v2_log(tmp_path_factory.mktemp("send-memory") / segment_file_name(0), SEGMENT_BYTES)
    yield path
    path.unlink()       # pytest keeps old tmp dirs: do not leave 256 MiB behind


class CrcSink:
    def __init__(self):
        self.crc, self.size = 0, 0

    def write(self, view):
        self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)
        return len(view)


def make_send(records, kind):
    if kind == "lazy":
        return LazyDownConvertRecords(records, 1, chunk_size=CHUNK).to_send()
    return SequenceSend([HEADER, records.to_send()])


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
@pytest.mark.parametrize("kind", ["lazy", "file"])
def test_response_memory_is_what_the_send_keeps(big_segment, kind, tls, tls_contexts):
    server_context, client_context = tls_contexts if tls else (None, None)
    with FileRecords(big_segment) as records:
        eager = CrcSink()
        send = make_send(records, kind)
        while not send.completed:
            send.write_to(eager)
        del send

        def handler(request):
            return make_send(records, kind) if bytes(request.payload) == b"fetch" else b"warm"

        buffer = memoryview(bytearray(1 << 20))
        with SocketServer(handler, ssl_context=server_context, num_network_threads=1, num_io_threads=1) as server:
            with connect(server.address, client_context, timeout=60) as sock:
                sock.sendall(frame(b"warm"))     # connection, TLS session and threads set up before measuring
                assert recv_frame(sock) == b"warm"
                tracemalloc.start()
                try:
                    start = tracemalloc.get_traced_memory()[0]
                    sock.sendall(frame(b"fetch"))
                    size = int.from_bytes(recv_exactly(sock, 4), "big")
                    received, crc = 0, 0
                    while received < size:
                        n = sock.recv_into(buffer, min(len(buffer), size - received))
                        assert n, "connection closed mid-response"
                        crc = zlib.crc32(buffer[:n], crc)
                        received += n
                    peak = tracemalloc.get_traced_memory()[1] - start
                finally:
                    tracemalloc.stop()
    assert size == eager.size >= SEGMENT_BYTES - (1 << 20) and crc == eager.crc     # whole 1 MiB blocks
    kept = 2 * CHUNK if kind == "lazy" else 2 * COPY_CHUNK
    assert peak < kept + CONSTANT, f"{peak} bytes held by a {size}-byte response"
