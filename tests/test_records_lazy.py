"""FileRecords, lazy chunked down-conversion (KIP-283) and its send, and the broker's fetch rules."""
import gc
import io
import os
import random
import socket
import struct
import sys
import threading
import tracemalloc

import pytest
from network_helpers import tls_contexts  # noqa: F401  (fixture)
from records_samples import read_aiokafka, read_kafka_python, read_kmem

from kmem.errors import ConfigError, CorruptRecordError, InvalidArgumentError, UnsupportedCompressionTypeError
from kmem.records import (ControlRecordType, FetchError, FileRecords, LazyDownConvertRecords, MemoryRecords,
                          RecordsBuilder, build_control_batch, build_records, down_convert, fetch_magic,
                          log_segments, plan_fetch, segment_file_name)
from kmem.records import files


def write_segment(directory, base_offset, data):
    path = directory / segment_file_name(base_offset)
    path.write_bytes(data)
    return path


def big_value_log(codec, batches=6, records=10, value_size=1024, first_offset=0):
    """v2 batches of ``records`` 1 KiB values each, with offset gaps, some headers."""
    data, offset = b"", first_offset
    for b in range(batches):
        builder = RecordsBuilder(2, codec, base_offset=offset)
        for i in range(records):
            builder.append(bytes([65 + (b + i) % 26]) * value_size, key=b"k%d" % offset, timestamp=1000 + offset,
                           headers=[("h", b"x")] if i % 3 == 0 else (), offset=offset)
            offset += 1 + (i % 3 == 2)
        data += builder.build()
    return data


def send_all(lazy, max_write=None, rng=None):
    """Drive the send into an in-memory channel that accepts at most ``max_write`` bytes per write."""
    class Channel:
        def __init__(self):
            self.data = bytearray()
            self.writes = 0

        def write(self, view):
            n = len(view) if max_write is None else min(len(view), rng.randint(1, max_write))
            self.data += view[:n]
            self.writes += 1
            return n

    send, channel = lazy.to_send(), Channel()
    calls = 0
    while not send.completed:
        send.write_to(channel)
        calls += 1
        assert calls < 10_000_000
    assert send.write_to(channel) == 0
    assert channel.writes == calls          # one write per call
    return bytes(channel.data), send


# --- FileRecords ---------------------------------------------------------------------------------------

def test_file_records_iterates_like_memory_records(tmp_path, monkeypatch):
    data = build_records([b"a", b"b"], magic=0) + big_value_log("gzip", 2) + big_value_log("none", 2, first_offset=50)
    path = write_segment(tmp_path, 0, data + big_value_log("none", 1)[:40])      # a truncated trailing batch
    monkeypatch.setattr(files, "READ_SIZE", 300)             # batches larger than a read
    with FileRecords(path) as fr:
        assert fr.size_in_bytes == len(data) + 40
        got = [(b.file_position, b.size_in_bytes, b.base_offset, b.last_offset) for b in fr]
        want = [(b.position, b.size_in_bytes, b.base_offset, b.last_offset) for b in MemoryRecords(data)]
        assert got == want
        assert read_kmem(fr.read_all().buffer) == read_kmem(data)
        assert [tuple(r) for r in fr.records()] == [tuple(r) for r in MemoryRecords(data).records()]
        assert all(b.is_valid() for b in fr)


def test_file_records_slice_and_search(tmp_path):
    data = big_value_log("none", 4)
    batches = list(MemoryRecords(data))
    with FileRecords(write_segment(tmp_path, 0, data)) as fr:
        second = batches[1]
        found = fr.search_for_offset(second.base_offset + 1)
        assert found == (second.last_offset, second.position, second.size_in_bytes)
        assert fr.search_for_offset(batches[-1].last_offset + 1) is None
        part = fr.slice(second.position, second.size_in_bytes + batches[2].size_in_bytes)
        assert [b.base_offset for b in part] == [second.base_offset, batches[2].base_offset]
        assert part.search_for_offset(0) == (second.last_offset, 0, second.size_in_bytes)
        with pytest.raises(InvalidArgumentError):
            fr.slice(-1)
    with pytest.raises(InvalidArgumentError):
        FileRecords(tmp_path / segment_file_name(0), start=10, end=5)


def test_file_records_sendfile_to_nonblocking_socket(tmp_path):
    data = big_value_log("lz4", 8)
    fr = FileRecords(write_segment(tmp_path, 0, data))
    left, right = socket.socketpair()
    left.setblocking(False)
    received = bytearray()
    reader = threading.Thread(target=lambda: [received.extend(chunk) for chunk in iter(lambda: right.recv(65536), b"")])
    reader.start()
    position = 0
    while position < fr.size_in_bytes:
        position += fr.write_to(left, position, fr.size_in_bytes - position)
    left.close()
    reader.join()
    right.close()
    assert bytes(received) == data
    channel = io.BytesIO()
    assert fr.write_to(channel, 10, 100) == 100 and channel.getvalue() == data[10:110]
    fr.close()


def test_file_records_write_to_tls_socket_goes_through_tls(tmp_path, tls_contexts):
    # sendfile would write the file's bytes in clear under the TLS session (the peer sees garbage)
    server_context, client_context = tls_contexts
    data = big_value_log("none", 8)
    listener = socket.create_server(("127.0.0.1", 0))
    received = bytearray()

    def client():
        with client_context.wrap_socket(socket.create_connection(listener.getsockname()),
                                        server_hostname="localhost") as sock:
            while len(received) < len(data) and (chunk := sock.recv(65536)):
                received.extend(chunk)

    reader = threading.Thread(target=client)
    reader.start()
    accepted, _ = listener.accept()
    fr = FileRecords(write_segment(tmp_path, 0, data))
    with server_context.wrap_socket(accepted, server_side=True) as tls, fr:
        position = 0
        while position < fr.size_in_bytes:
            position += fr.write_to(tls, position, fr.size_in_bytes - position)
        reader.join()
    listener.close()
    assert bytes(received) == data


def test_file_records_truncated_huge_entry_is_not_read(tmp_path):
    # a corrupt size near 2 GiB at the end of a 64 MiB segment: found truncated from its header alone
    good = big_value_log("none", 2)
    path = tmp_path / segment_file_name(0)
    with open(path, "wb") as f:
        f.write(good + struct.pack(">qiIB", 99, 0x7FFFFFF0, 0, 2))
        f.truncate(len(good) + (64 << 20))
    tracemalloc.start()
    try:
        with FileRecords(path) as fr:
            assert [b.base_offset for b in fr] == [b.base_offset for b in MemoryRecords(good)]
            assert [b.base_offset for b in fr.slice(len(good))] == []
            lazy = LazyDownConvertRecords(fr, 1, 0, chunk_size=16 << 10)
            converted = b"".join(bytes(chunk) for chunk, _ in lazy.chunks())
            assert converted == bytes(down_convert(good, 1).records)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_file_records_refuses_negative_positions(tmp_path):
    with FileRecords(write_segment(tmp_path, 0, b"OUTSIDE-" + big_value_log("none", 1))) as whole:
        part = whole.slice(8)
        for call in (lambda: part.read(-8, 8), lambda: part.write_to(io.BytesIO(), -8, 8),
                     lambda: list(part.batches(-8)), lambda: part.search_for_offset(0, -8)):
            with pytest.raises(InvalidArgumentError, match="negative position"):
                call()


def test_file_records_missing_file_raises_cleanly(tmp_path, monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(FileNotFoundError):
        FileRecords(tmp_path / "missing.log")
    gc.collect()
    assert unraisable == []


def test_log_segments_in_offset_order(tmp_path):
    for base in (200, 0, 31):
        write_segment(tmp_path, base, b"")
    (tmp_path / "00000000000000000000.index").write_bytes(b"")
    assert [(b, os.path.basename(p)) for b, p in log_segments(tmp_path)] == [
        (0, "00000000000000000000.log"), (31, "00000000000000000031.log"), (200, "00000000000000000200.log")]
    assert FileRecords.open_segment(tmp_path, 31).size_in_bytes == 0


def test_file_records_corrupt_size_names_file_position(tmp_path):
    data = bytearray(big_value_log("none", 2))
    second = list(MemoryRecords(bytes(data)))[1].position
    struct.pack_into(">i", data, second + 8, 3)
    with FileRecords(write_segment(tmp_path, 0, bytes(data))) as fr:
        with pytest.raises(CorruptRecordError) as info:
            list(fr)
        assert info.value.offset == second


# --- committed size S ------------------------------------------------------------------------------------

def test_size_is_max_of_input_and_first_converted_batch():
    small = build_records([b"x"] * 20, magic=2)           # v1 is larger than v2 for tiny records
    lazy = LazyDownConvertRecords(small, 1, 0)
    assert lazy.size_in_bytes == len(bytes(down_convert(small, 1).records)) > len(small)
    big = big_value_log("gzip", 3)
    lazy = LazyDownConvertRecords(big, 0, 0)
    assert lazy.size_in_bytes == len(big)


def test_size_only_markers_and_empty():
    markers = build_control_batch(ControlRecordType.COMMIT, 0, 1, 0, 5) + build_control_batch(0, 1, 1, 0, 5)
    lazy = LazyDownConvertRecords(markers, 1, 0)
    assert lazy.size_in_bytes == 12
    data, send = send_all(lazy)
    assert data[:8] == b"\xff" * 8 and len(data) == 12
    assert read_kafka_python(data) == read_aiokafka(data) == read_kmem(data) == []
    assert LazyDownConvertRecords(b"", 1, 0).size_in_bytes == 0
    assert LazyDownConvertRecords(markers[:30], 1, 0).size_in_bytes == 0
    assert send_all(LazyDownConvertRecords(b"", 1, 0))[0] == b""


def test_commit_marker_at_fetch_offset_emits_every_batch_once():
    # Upstream bug: the cached first chunk made the iterator skip the marker instead of the data batch,
    # so the first data batch was sent twice.
    log = build_control_batch(ControlRecordType.COMMIT, 10, 1, 0, 5) + big_value_log("none", 3, first_offset=11)
    for chunk_size in (1, 1 << 10, 128 << 10):
        lazy = LazyDownConvertRecords(log, 1, 10, chunk_size=chunk_size)
        data, send = send_all(lazy)
        eager = down_convert(log, 1, 10)
        offsets = [r[0] for r in read_kmem(data)]
        assert len(offsets) == len(set(offsets))
        assert read_kmem(data) == read_kmem(eager.records.buffer)[:len(offsets)]


def test_zstd_first_batch_raises_like_kafka():
    with pytest.raises(UnsupportedCompressionTypeError, match="zstandard"):
        LazyDownConvertRecords(big_value_log("zstd", 1), 1, 0)


def test_zstd_batch_after_first_chunk_pads_instead_of_raising(caplog):
    # Kafka's send: S is committed, so the rest is an overflow batch and the client fetches again from
    # the zstd batch (which then fails at construction)
    before = big_value_log("none", 3)
    log = before + big_value_log("zstd", 1, first_offset=100) + big_value_log("none", 1, first_offset=200)
    eager = bytes(down_convert(before, 1).records)
    for chunk_size in (1, len(before) // 2):
        lazy = LazyDownConvertRecords(log, 1, 0, chunk_size=chunk_size)
        with caplog.at_level("INFO", logger="kmem.records.lazy"):
            data, send = send_all(lazy)
        assert len(data) == lazy.size_in_bytes
        got = read_kmem(data)
        assert got and got == read_kmem(eager)[:len(got)] == read_kafka_python(data)
        assert "zstd" in caplog.text
    with pytest.raises(UnsupportedCompressionTypeError):
        LazyDownConvertRecords(log[len(before):], 1, 0)


def test_records_can_be_sent_again():
    # Kafka's iterator converts again from the first batch once the cached first chunk is used
    log = build_control_batch(ControlRecordType.COMMIT, 0, 1, 0, 5) + big_value_log("gzip", 3, first_offset=1)
    lazy = LazyDownConvertRecords(log, 1, 0, chunk_size=1 << 10)
    eager = bytes(down_convert(log, 1).records)
    expected = read_kmem(eager[:lazy.size_in_bytes])        # output beyond S is cut
    assert len(expected) > 10
    early, late = lazy.to_send(), lazy.to_send()        # both made before anything is written
    for _ in range(2):
        assert read_kmem(send_all(lazy)[0]) == expected
    assert b"".join(bytes(chunk) for chunk, _ in lazy.chunks()) == eager
    for send in (late, early):
        channel = io.BytesIO()
        while not send.completed:
            send.write_to(channel)
        assert read_kmem(channel.getvalue()) == expected


# --- Kafka's lazy-conversion matrix ----------------------------------------------------------------------

MATRIX = [(codec, to_magic, overflow) for codec in ("none", "gzip", "snappy", "lz4")
          for to_magic in (0, 1) for overflow in (False, True)]


@pytest.mark.parametrize("codec, to_magic, overflow", MATRIX)
def test_lazy_send_matrix(codec, to_magic, overflow):
    log = big_value_log(codec, batches=5)
    if overflow:      # a fetch cut in the middle of a batch: S covers bytes that convert to nothing
        log += big_value_log(codec, batches=1, first_offset=10_000)[:1500]
    complete = log[:MemoryRecords(log).valid_bytes]
    eager = bytes(down_convert(complete, to_magic, 0).records)
    expected_records = read_kmem(eager)
    size = LazyDownConvertRecords(log, to_magic, 0).size_in_bytes
    max_batch = max(b.size_in_bytes for b in MemoryRecords(log))
    rng = random.Random(size)
    for chunk_size in sorted({16 << 10, size, size - 1, size // 4, max_batch + 1, 1}):
        lazy = LazyDownConvertRecords(log, to_magic, 0, chunk_size=chunk_size)
        assert lazy.size_in_bytes == size
        data, send = send_all(lazy, max_write=4096, rng=rng)
        assert len(data) == size
        shared = min(size, len(eager))
        assert data[:shared] == eager[:shared]
        if len(eager) < size:       # padded: every reader sees all records and stops at the overflow
            assert data[len(eager):len(eager) + 8] == b"\xff" * 8
            got = expected_records
            assert send.stats.num_records_converted == len(expected_records)
        else:                       # cut: readers see the batches that fit in S
            got = read_kmem(MemoryRecords(eager[:size]).buffer)
            assert 0 < len(got) <= len(expected_records)
        assert read_kmem(data) == got
        assert read_kafka_python(data) == got
        if not (to_magic == 0 and codec == "lz4"):      # aiokafka has no KAFKA-3160 support
            assert read_aiokafka(data) == got


def test_lazy_send_from_file_through_socket(tmp_path):
    log = big_value_log("none", batches=40)
    fr = FileRecords(write_segment(tmp_path, 0, log))
    lazy = LazyDownConvertRecords(fr, 1, 5, chunk_size=16 << 10)
    send = lazy.to_send()
    left, right = socket.socketpair()
    left.setblocking(False)
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    received = bytearray()
    reader = threading.Thread(target=lambda: [received.extend(c) for c in iter(lambda: right.recv(4096), b"")])
    reader.start()
    while not send.completed:
        send.write_to(left)
    left.close()
    reader.join()
    right.close()
    eager = bytes(down_convert(fr, 1, 5).records)
    assert len(received) == lazy.size_in_bytes
    assert read_kafka_python(received) == read_kmem(MemoryRecords(eager[:len(received)]).buffer)
    fr.close()


# --- broker rules ------------------------------------------------------------------------------------------

def test_fetch_versions_map_to_magic():
    assert [fetch_magic(v) for v in range(6)] == [0, 0, 1, 1, 2, 2]
    assert plan_fetch(0) == (FetchError.NONE, 0)
    assert plan_fetch(3) == (FetchError.NONE, 1)
    assert plan_fetch(4) == (FetchError.NONE, None)
    assert plan_fetch(1, log_magic=0) == (FetchError.NONE, None)
    assert plan_fetch(1, log_magic=1) == (FetchError.NONE, 0)


def test_downconversion_switch_topic_over_broker():
    off, on = {"message.downconversion.enable": "false"}, {"message.downconversion.enable": True}
    broker_off = {"log.message.downconversion.enable": "false"}
    assert plan_fetch(3, topic_config=off).error == FetchError.UNSUPPORTED_VERSION
    assert plan_fetch(3, broker_config=broker_off).error == FetchError.UNSUPPORTED_VERSION
    assert plan_fetch(3, topic_config=on, broker_config=broker_off) == (FetchError.NONE, 1)
    assert plan_fetch(4, topic_config=off) == (FetchError.NONE, None)      # nothing to convert
    assert plan_fetch(3, topic_config=off, is_follower=True) == (FetchError.NONE, None)
    with pytest.raises(ConfigError):
        plan_fetch(3, topic_config={"message.downconversion.enable": "maybe"})


def test_zstd_needs_fetch_10():
    assert plan_fetch(9, topic_compression="zstd").error == FetchError.UNSUPPORTED_COMPRESSION_TYPE
    assert plan_fetch(3, topic_compression="zstd").error == FetchError.UNSUPPORTED_COMPRESSION_TYPE
    assert plan_fetch(10, topic_compression="zstd") == (FetchError.NONE, None)
    assert plan_fetch(9, topic_compression="zstd", is_follower=True) == (FetchError.NONE, None)
