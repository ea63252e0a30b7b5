"""KIP-283's chunk-size table on this machine, and the memory of eager vs lazy down-conversion.

A segment of v2 batches (10 records of 1 KiB values each) is converted to v1 and delivered through a
loopback TCP socket to a reader thread. The lazy send converts one chunk per call; the eager path
converts everything with ``down_convert`` first and then sends it. MB/s are of bytes delivered.

    .venv/bin/pytest bench/bench_records_lazy.py        (prints both tables at the end)
"""
import os
import select
import socket
import threading
import time
import tracemalloc

import pytest

from kmem.records import FileRecords, LazyDownConvertRecords, RecordsBuilder, down_convert, segment_file_name
from kmem.records.files import write_once

LOG_BYTES = 64 << 20
CHUNK_SIZES = [16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]
KIP_283 = {16 << 10: 137, 32 << 10: 167, 64 << 10: 182, 128 << 10: 198, 256 << 10: 181, 512 << 10: 180,
           1 << 20: 177, "eager": 179}
THROUGHPUT = {}
MEMORY = {}


def write_log(path, total_bytes):
    offset = 0
    with open(path, "wb") as f:
        while f.tell() < total_bytes:
            builder = RecordsBuilder(2, "none", base_offset=offset)
            for i in range(10):
                builder.append(bytes([97 + (offset + i) % 26]) * 1024, key=b"%016d" % (offset + i),
                               timestamp=1_700_000_000_000 + offset + i)
            f.write(builder.build())
            offset += 10
    return path


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    path = write_log(tmp_path_factory.mktemp("log") / segment_file_name(0), LOG_BYTES)
    yield path
    os.remove(path)


class LoopbackReader:
    """A TCP connection on 127.0.0.1 whose far end a thread drains, counting bytes."""

    def __init__(self):
        server = socket.create_server(("127.0.0.1", 0))
        self.sender = socket.create_connection(server.getsockname())
        self.receiver, _ = server.accept()
        server.close()
        self.sender.setblocking(False)
        self.received = 0
        self.thread = threading.Thread(target=self._drain)
        self.thread.start()

    def _drain(self):
        sink = bytearray(1 << 20)
        while (n := self.receiver.recv_into(sink)) > 0:
            self.received += n

    def finish(self):
        self.sender.close()
        self.thread.join()
        self.receiver.close()
        return self.received


def wait_writable(sock):
    select.select([], [sock], [], 1.0)


def deliver_lazy(path, chunk_size):
    reader = LoopbackReader()
    with FileRecords(path) as records:
        send = LazyDownConvertRecords(records, 1, 0, chunk_size=chunk_size).to_send()
        while not send.completed:
            if send.write_to(reader.sender) == 0:
                wait_writable(reader.sender)
    return reader.finish()


def deliver_eager(path):
    reader = LoopbackReader()
    with FileRecords(path) as records:
        pending = down_convert(records, 1, 0).records.buffer
    while pending:
        written = write_once(reader.sender, pending)
        if written == 0:
            wait_writable(reader.sender)
        pending = pending[written:]
    return reader.finish()


@pytest.fixture(scope="module", autouse=True)
def report(request):
    yield
    lines = ["", f"v2 -> v1 through a loopback socket, 1 KiB messages, {LOG_BYTES >> 20} MiB log",
             f"{'chunk':>8}{'kmem MB/s':>12}{'KIP-283 MB/s':>14}"]
    for key in CHUNK_SIZES + ["eager"]:
        if key in THROUGHPUT:
            name = key if key == "eager" else f"{key >> 10}K"
            lines.append(f"{name:>8}{THROUGHPUT[key]:>12.0f}{KIP_283[key]:>14}")
    if MEMORY:
        lines += ["", "extra memory (tracemalloc peak, MiB) while converting and sending",
                  f"{'log MiB':>8}{'eager':>10}{'lazy 128K':>11}"]
        for size in sorted(MEMORY):
            lines.append(f"{size >> 20:>8}{MEMORY[size]['eager'] / 2**20:>10.1f}{MEMORY[size]['lazy'] / 2**20:>11.2f}")
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print("\n".join(lines))


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES + ["eager"])
def test_chunk_size_throughput(benchmark, timing, log_path, chunk_size):
    if chunk_size == "eager":
        run = lambda: deliver_eager(log_path)          # noqa: E731
    else:
        run = lambda: deliver_lazy(log_path, chunk_size)    # noqa: E731
    benchmark.group = "lazy down-conversion through loopback"
    delivered = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    assert delivered >= os.path.getsize(log_path)
    THROUGHPUT[chunk_size] = delivered / timing("min") / 1e6
    benchmark.extra_info["MB_per_s"] = round(THROUGHPUT[chunk_size], 1)


def traced_peak(action):
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        action()
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("log_mib", [8, 32, 64])
def test_eager_memory_grows_lazy_does_not(benchmark, log_path, log_mib):
    with FileRecords(log_path, 0, log_mib << 20) as part:
        path_part = log_path.with_name(f"part-{log_mib}.log")
        path_part.write_bytes(part.read(0, part.size_in_bytes))
    started = time.perf_counter()
    eager = traced_peak(lambda: deliver_eager(path_part))
    lazy = traced_peak(lambda: deliver_lazy(path_part, 128 << 10))
    MEMORY[log_mib << 20] = {"eager": eager, "lazy": lazy}
    benchmark.extra_info.update(eager_peak_bytes=eager, lazy_peak_bytes=lazy)
    benchmark.pedantic(lambda: None, rounds=1)
    os.remove(path_part)
    assert time.perf_counter() - started < 600
