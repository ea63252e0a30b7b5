"""v2 -> v1 down-conversion: kmem beside the peers a user would pick instead, in one run.

Peers decode each v2 batch and rebuild it as v1 with their own builders (what a Python proxy or broker
would do): aiokafka with its Cython record codecs, kafka-python in pure Python. Input: 100-record
batches, keys of 16 bytes, values of 100 B / 1 KiB / 10 KiB; 2 MiB of input (fits in the CPU cache) and,
for 1 KiB values, a 30 MB log as in issue 18 (does not); MB/s is of input bytes.

kmem converts compressed batches on up to ``workers.THREADS`` threads, so beside wall time (the best
round) the table gives CPU time (all threads, best of a few calls) and its ratio: wall-time gains need
idle cores, which the load average printed with the table tells.

    .venv/bin/pytest bench/bench_records.py        (prints a table of MB/s and ratios at the end)
"""
import functools
import os
import random
import time

import pytest
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder as AioLegacyBuilder
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.record import MemoryRecords as KafkaPythonMemoryRecords
from kafka.record.legacy_records import LegacyRecordBatchBuilder as KafkaPythonLegacyBuilder

from kmem.records import MemoryRecords, RecordsBuilder, down_convert, workers
from kmem.records import codecs

INPUT_BYTES = 2 << 20
CASES = {   # name: (value size, codec, input bytes)
    "none-100B": (100, "none", INPUT_BYTES),
    "none-1KiB": (1024, "none", INPUT_BYTES),
    "none-1KiB-30MB": (1024, "none", 30_000_000),
    "none-10KiB": (10240, "none", INPUT_BYTES),
    "gzip-1KiB": (1024, "gzip", INPUT_BYTES),
    "gzip-1KiB-30MB": (1024, "gzip", 30_000_000),
    "lz4-1KiB": (1024, "lz4", INPUT_BYTES),
}
RESULTS = {}     # (case, implementation) -> MB/s
CPU_RESULTS = {}     # (case, implementation) -> MB/s of CPU time


@functools.lru_cache(maxsize=2)
def make_input(value_size, codec, input_bytes=INPUT_BYTES):
    rng = random.Random(value_size)
    words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(500)]
    parts, size, offset = [], 0, 0
    while size < input_bytes:
        builder = RecordsBuilder(2, codec, base_offset=offset)
        for i in range(100):
            value = b" ".join(rng.choice(words) for _ in range(value_size // 5 + 1))[:value_size]
            builder.append(value, key=b"key-%012d" % (offset + i), timestamp=1_700_000_000_000 + offset + i)
        offset += 100
        batch = builder.build()
        parts.append(batch)
        size += len(batch)
    return b"".join(parts)


def data_records(data):
    return list(MemoryRecords(data).records())


def convert_kmem(data, codec):
    return down_convert(data, 1, 0).records.buffer


def kmem_into_buffer(data, codec):
    """kmem writing into one buffer reused across calls (a pooled one), as the design card has it."""
    buffer = bytearray(2 * len(data))
    return lambda data, codec: down_convert(data, 1, 0, out=buffer).records.buffer


def _rebuild(reader, builder_cls, codec):
    out = []
    while reader.has_next():
        batch = reader.next_batch()
        builder = builder_cls(1, codec, 1 << 30)
        for r in batch:
            builder.append(r.offset, r.timestamp, r.key, r.value)
        out.append(bytes(builder.build()))
    return b"".join(out)


def convert_aiokafka(data, codec):
    return _rebuild(AioMemoryRecords(data), AioLegacyBuilder, codec)


def convert_kafka_python(data, codec):
    return _rebuild(KafkaPythonMemoryRecords(data), KafkaPythonLegacyBuilder, codec)


IMPLEMENTATIONS = {"kmem": convert_kmem, "kmem out=": kmem_into_buffer, "aiokafka": convert_aiokafka,
                   "kafka-python": convert_kafka_python}


@pytest.fixture(scope="module", autouse=True)
def report(request):
    yield
    if not RESULTS:
        return
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    lines = ["", f"v2 -> v1 down-conversion, MB/s of input (ratio = kmem / peer); kmem threads: {workers.THREADS}, "
             f"load average {load} on {os.cpu_count()} CPUs",
             f"{'case':<16}{'kmem':>10}{'kmem out=':>10}{'aiokafka':>10}{'kafka-py':>10}{'x aiokafka':>12}"
             f"{'x kafka-py':>12}{'out= x aio':>12}{'kmem CPU':>10}{'aio CPU':>10}{'CPU x aio':>11}"]
    for case in CASES:
        row = [RESULTS.get((case, impl)) for impl in IMPLEMENTATIONS]
        row += [CPU_RESULTS.get((case, impl)) for impl in ("kmem", "aiokafka")]
        pairs = [(row[0], row[2]), (row[0], row[3]), (row[1], row[2]), (row[4], row[5])]
        speeds = ["".join(f"{v:>10.1f}" if v else f"{'-':>10}" for v in row[:4]),
                  "".join(f"{v:>10.1f}" if v else f"{'-':>10}" for v in row[4:])]
        ratios = [f"{a / b:>12.1f}" if (a and b) else f"{'-':>12}" for a, b in pairs]
        lines.append(f"{case:<16}{speeds[0]}{''.join(ratios[:3])}{speeds[1]}{ratios[3][1:]}")
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print("\n".join(lines))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES)
def test_down_convert_v2_to_v1(benchmark, timing, case, implementation):
    value_size, codec_name, input_bytes = CASES[case]
    data = make_input(value_size, codec_name, input_bytes)
    codec = codecs.codec_id(codec_name)
    convert = IMPLEMENTATIONS[implementation]
    if implementation == "kmem out=":
        convert = convert(data, codec)
    # the same records come out, whoever converts
    assert sum(1 for _ in MemoryRecords(convert(data, codec)).records()) == len(data_records(data))
    rounds = {"kmem": 20, "kmem out=": 20, "aiokafka": 10, "kafka-python": 2}[implementation]
    if input_bytes > INPUT_BYTES:
        rounds = max(1, rounds // 4)
    benchmark.group = f"v2->v1 {case}"
    benchmark.pedantic(convert, args=(data, codec), rounds=rounds, iterations=1, warmup_rounds=1)
    mb_per_s = len(data) / timing("min") / 1e6
    RESULTS[(case, implementation)] = mb_per_s
    benchmark.extra_info["input_MB_per_s"] = round(mb_per_s, 1)
    if benchmark.stats is not None and implementation in ("kmem", "aiokafka"):
        CPU_RESULTS[(case, implementation)] = len(data) / cpu_seconds(convert, data, codec, min(rounds, 5)) / 1e6


def cpu_seconds(convert, data, codec, calls):
    """The least CPU time (every thread of the process) one call took."""
    best = float("inf")
    for _ in range(calls):
        started = time.process_time()
        convert(data, codec)
        best = min(best, time.process_time() - started)
    return best
