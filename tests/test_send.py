"""The Send seam: bytes, file regions, lazy down-conversion and sequences of them, written by the
transport (sendfile on a plain socket, bounded copies under TLS), and returned by SocketServer handlers."""
import asyncio
import io
import os
import random
import socket
import threading

import pytest

from kmem.errors import IllegalStateError, InvalidArgumentError
from kmem.network import NetworkSend, PlaintextTransport, SocketServer, TlsTransport
from kmem.records import FileRecords, LazyDownConvertRecords, RecordsBuilder, segment_file_name
from kmem.records.convert import down_convert
from kmem.protocol import SplicedSend
from kmem.send import (COPY_CHUNK, BytesSend, ChannelTransport, FileRegionSend, Send, SequenceSend, as_transport,
                       close_send)

from network_helpers import closed_by_peer, connect, frame, recv_exactly, recv_frame, request, tls_contexts  # noqa: F401


class PartialWrites:
    """An object with ``write`` that takes a random part of what it is given."""

    def __init__(self, seed=1):
        self.data = bytearray()
        self.rng = random.Random(seed)

    def write(self, view):
        n = self.rng.randint(0, len(view))
        self.data += view[:n]
        return n


def drain(send, channel, max_calls=1_000_000):
    for _ in range(max_calls):
        if send.completed:
            break
        send.write_to(channel)
    assert send.completed and send.remaining == 0
    assert send.write_to(channel) == 0
    return channel


def v2_records(batches=20, records_per_batch=5, value_size=300):
    out, offset = bytearray(), 0
    for _ in range(batches):
        builder = RecordsBuilder(2, "none", base_offset=offset)
        for i in range(records_per_batch):
            builder.append(os.urandom(value_size), key=b"k%d" % (offset + i), timestamp=offset + i)
        out += builder.build()
        offset += records_per_batch
    return bytes(out)


@pytest.fixture
def segment(tmp_path):
    data = v2_records()
    path = tmp_path / segment_file_name(0)
    path.write_bytes(data)
    return path, data


def test_every_send_kind_resumes_partial_writes(segment):
    path, data = segment
    with FileRecords(path) as records:
        sends = [BytesSend(b"header"), records.to_send(10, 5000), SequenceSend([]),
                 LazyDownConvertRecords(records, 1).to_send(), b"trailer"]
        whole = SequenceSend(sends)
        lazy_bytes = drain(LazyDownConvertRecords(records, 1).to_send(), io.BytesIO()).getvalue()
        assert all(isinstance(send, Send) for send in sends[:4]) and isinstance(whole, Send)
        assert whole.size == 6 + 5000 + 0 + len(lazy_bytes) + 7
        channel = drain(whole, PartialWrites())      # a lazy send reads its records: keep them open
    assert bytes(channel.data) == b"header" + data[10:5010] + lazy_bytes + b"trailer"


def test_file_region_goes_by_sendfile_on_a_plain_socket_and_by_bounded_copies_under_tls(
        segment, tls_contexts, monkeypatch):
    path, data = segment
    calls = []
    real_sendfile, real_pread = os.sendfile, os.pread
    monkeypatch.setattr(os, "sendfile", lambda *args: calls.append("sendfile") or real_sendfile(*args))
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: calls.append(n) or real_pread(fd, n, offset))
    server_context, client_context = tls_contexts
    for tls in (False, True):
        calls.clear()
        with socket.create_server(("127.0.0.1", 0)) as listener:
            received = []

            def read():
                with connect(listener.getsockname(), client_context if tls else None) as client:
                    received.append(recv_exactly(client, len(data)))

            reader = threading.Thread(target=read)
            reader.start()
            sock, _ = listener.accept()
            sock.setblocking(False)
            transport = PlaintextTransport(sock) if not tls else TlsTransport(sock, server_context, True)
            while not transport.ready:
                transport.handshake()
            with FileRecords(path) as records:
                send = records.to_send()
            # the file is closed: the send has its own descriptor
            while not send.completed:
                send.write_to(transport)
            reader.join()
            transport.close()
        assert received == [data]
        if tls:
            assert "sendfile" not in calls and max(calls) <= COPY_CHUNK
        else:
            assert set(calls) == {"sendfile"}


def test_raw_channels_are_seen_as_transports(segment):
    path, data = segment
    left, right = socket.socketpair()
    transport = PlaintextTransport(left)
    assert as_transport(transport) is transport
    assert isinstance(as_transport(left), ChannelTransport) and as_transport(left).channel is left
    with FileRecords(path) as records:
        channel = io.BytesIO()
        assert records.write_to(channel, 0, 100) == 100 and channel.getvalue() == data[:100]
    left.close()
    right.close()


def test_file_region_checks_its_arguments_and_the_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with open(path, "rb") as f:
        for position, count in ((-1, 10), (0, -1), (0, 1.5)):
            with pytest.raises(InvalidArgumentError):
                FileRegionSend(f, position, count)
        send = FileRegionSend(f, 90, 20)            # 10 bytes past the end of the file
        channel = io.BytesIO()
        assert send.write_to(channel) == 10
        with pytest.raises(IllegalStateError, match="ends early"):
            send.write_to(channel)


def test_file_region_closes_its_descriptor_when_written(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    before = len(os.listdir("/proc/self/fd"))
    with open(path, "rb") as f:
        send = FileRegionSend(f, 0, 100)
    assert len(os.listdir("/proc/self/fd")) == before + 1
    drain(send, io.BytesIO())
    assert len(os.listdir("/proc/self/fd")) == before


def test_sends_dropped_unfinished_release_their_descriptors_and_lazy_ones_their_records(segment):
    """``close_send``, as a connection that closes under its response calls it; a lazy send lets go of
    its source records once written too."""
    path, _ = segment
    before = len(os.listdir("/proc/self/fd"))
    with open(path, "rb") as f:
        regions = [FileRegionSend(f, 0, 1000) for _ in range(3)]
    lazy = LazyDownConvertRecords(FileRecords(path), 1, chunk_size=2048).to_send()
    framed = NetworkSend("c", SequenceSend([b"header", regions[0], SplicedSend(b"ab", [(1, regions[1])]), lazy]))
    spliced = SplicedSend(b"cd", [(1, regions[2])])
    assert len(os.listdir("/proc/self/fd")) == before + 4
    framed.write_to(PartialWrites())
    for send in (framed, spliced):
        close_send(send)
        close_send(send)                                   # idempotent
    assert len(os.listdir("/proc/self/fd")) == before
    written = LazyDownConvertRecords(FileRecords(path), 1, chunk_size=2048).to_send()
    drain(written, io.BytesIO())
    assert len(os.listdir("/proc/self/fd")) == before               # while the send itself is still referenced


def test_a_frame_too_large_for_its_size_prefix_is_refused():
    class Huge:
        size = remaining = 1 << 31
        completed = False

        def write_to(self, transport):
            return 0

    with pytest.raises(InvalidArgumentError, match="32-bit"):
        NetworkSend("c", Huge())


def eager_down_conversion(data, size):
    """The whole conversion at once, cut to the lazy send's size S (the test data converts to more)."""
    converted = bytes(down_convert(data, 1, 0).records.buffer)
    assert len(converted) >= size
    return converted[:size]


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_handlers_may_return_file_regions_and_lazy_sends(segment, tls, tls_contexts):
    path, data = segment
    server_context, client_context = tls_contexts if tls else (None, None)
    records = FileRecords(path)

    def handler(request):
        kind = bytes(request.payload)
        if kind == b"file":
            return SequenceSend([b"header", records.to_send()])
        if kind == b"lazy":
            return LazyDownConvertRecords(records, 1, chunk_size=2048).to_send()
        return bytes(request.payload)

    lazy_size = LazyDownConvertRecords(records, 1).size_in_bytes
    with SocketServer(handler, ssl_context=server_context, num_network_threads=1) as server:
        with connect(server.address, client_context) as sock:
            sock.sendall(frame(b"file") + frame(b"lazy") + frame(b"bytes"))
            assert recv_frame(sock) == b"header" + data
            assert recv_frame(sock) == eager_down_conversion(data, lazy_size)
            assert recv_frame(sock) == b"bytes"
    records.close()


class CompletionWatch:
    """A Send that records when its last byte was written."""

    def __init__(self, send, log):
        self.inner, self.log = send, log
        self.size = send.size

    @property
    def remaining(self):
        return self.inner.remaining

    @property
    def completed(self):
        return self.inner.completed

    def write_to(self, transport):
        written = self.inner.write_to(transport)
        if self.inner.completed:
            self.log.append("sent")
        return written


def test_one_request_in_flight_until_the_last_byte_of_a_send(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(os.urandom(8 << 20))          # far more than the socket buffers hold
    log = []

    def handler(request):
        log.append("handled")
        with FileRecords(path) as records:
            return CompletionWatch(records.to_send(), log)

    with SocketServer(handler, num_network_threads=1) as server:
        with connect(server.address) as sock:
            sock.sendall(frame(b"1") + frame(b"2"))
            for _ in range(2):
                assert len(recv_frame(sock)) == 8 << 20
    assert log == ["handled", "sent", "handled", "sent"]


@pytest.mark.parametrize("exception", [asyncio.CancelledError, KeyboardInterrupt, RuntimeError])
def test_a_send_that_raises_closes_its_connection_and_the_server_keeps_serving(exception, caplog):
    class Failing:
        size = remaining = 10
        completed = False

        def write_to(self, transport):
            raise exception("send failed")

    def handler(request):
        return Failing() if bytes(request.payload) == b"fail" else b"ok"

    with SocketServer(handler, num_network_threads=1) as server:
        for _ in range(2):
            with connect(server.address) as sock:
                sock.sendall(frame(b"fail"))
                assert closed_by_peer(sock)
        assert request(server.address, b"fine") == b"ok"
        assert server.processors[0].is_alive()
    assert "send failed" in caplog.text
    if exception not in (KeyboardInterrupt, SystemExit):    # those the selector re-raises to its caller
        assert "network processor" not in caplog.text       # the channel's error, not the processor's


class RecordingTransport:
    """A transport that takes everything and records each call's views."""

    def __init__(self):
        self.calls = []

    def write(self, views):
        self.calls.append([bytes(v) for v in views])
        return sum(len(v) for v in views)

    def send_file(self, fd, offset, count):
        self.calls.append(("file", count))
        return count


def test_a_frame_goes_out_in_one_vectored_write_per_run_of_bytes(tmp_path):
    """The size prefix with the header (and any bytes parts after it) in one write: one packet."""
    path = tmp_path / "region"
    path.write_bytes(b"r" * 100)
    body = SequenceSend([b"header", FileRegionSend(os.open(path, os.O_RDONLY), 0, 100), b"tail1", b"tail2"])
    send = NetworkSend("c", body)
    transport = RecordingTransport()
    assert send.write_to(transport) == send.size and send.completed
    assert transport.calls == [[(6 + 100 + 10).to_bytes(4, "big"), b"header"], ("file", 100),
                               [b"tail1", b"tail2"]]
    small = NetworkSend("c", b"answer")
    transport = RecordingTransport()
    small.write_to(transport)
    assert transport.calls == [[(6).to_bytes(4, "big"), b"answer"]]


def test_a_bytes_frame_taken_a_few_bytes_at_a_time_resumes_mid_view():
    """A bytes payload and its prefix go out as two views of one write; a write that takes part of a view resumes
    inside it, and a frame of no bytes is its prefix alone."""
    class Stingy(RecordingTransport):
        def write(self, views):
            joined = b"".join(bytes(v) for v in views)[:3]
            self.calls.append(joined)
            return len(joined)

    for payload in (bytearray(b"response bytes"), b"", memoryview(b"ab")):
        send, transport = NetworkSend("c", payload), Stingy()
        while not send.completed:
            send.write_to(transport)
        assert b"".join(transport.calls) == len(payload).to_bytes(4, "big") + bytes(payload)
        assert send.remaining == 0 and send.write_to(transport) == 0


def test_a_vectored_write_taken_in_part_resumes_mid_part():
    send = SequenceSend([b"abc", b"defg", b"hi"])

    class Stingy(RecordingTransport):
        def write(self, views):
            joined = b"".join(bytes(v) for v in views)[:2]
            self.calls.append(joined)
            return len(joined)

    transport = Stingy()
    while not send.completed:
        send.write_to(transport)
    assert b"".join(transport.calls) == b"abcdefghi" and send.remaining == 0
