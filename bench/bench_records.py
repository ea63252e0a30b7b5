"""v2 -> v1 down-conversion: kmem beside the peers a user would pick instead, in one run.

Peers decode each v2 batch and rebuild it as v1 with their own builders (what a Python proxy or broker
would do): aiokafka with its Cython record codecs, kafka-python in pure Python. Input: 100-record
batches, keys of 16 bytes, values of 100 B / 1 KiB / 10 KiB; MB/s is of input bytes.

    .venv/bin/pytest bench/bench_records.py        (prints a table of MB/s and ratios at the end)
"""
import random

import pytest
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder as AioLegacyBuilder
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.record import MemoryRecords as KafkaPythonMemoryRecords
from kafka.record.legacy_records import LegacyRecordBatchBuilder as KafkaPythonLegacyBuilder

from kmem.records import MemoryRecords, RecordsBuilder, down_convert
from kmem.records import codecs

CASES = {   # name: (value size, codec)
    "none-100B": (100, "none"),
    "none-1KiB": (1024, "none"),
    "none-10KiB": (10240, "none"),
    "gzip-1KiB": (1024, "gzip"),
    "lz4-1KiB": (1024, "lz4"),
}
INPUT_BYTES = 2 << 20
RESULTS = {}     # (case, implementation) -> MB/s


def make_input(value_size, codec):
    rng = random.Random(value_size)
    words = [bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(500)]
    parts, size, offset = [], 0, 0
    while size < INPUT_BYTES:
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


IMPLEMENTATIONS = {"kmem": convert_kmem, "aiokafka": convert_aiokafka, "kafka-python": convert_kafka_python}


@pytest.fixture(scope="module", autouse=True)
def report(request):
    yield
    if not RESULTS:
        return
    lines = ["", "v2 -> v1 down-conversion, MB/s of input, best round (ratio = kmem / peer)",
             f"{'case':<12}{'kmem':>10}{'aiokafka':>10}{'kafka-py':>10}{'x aiokafka':>12}{'x kafka-py':>12}"]
    for case in CASES:
        row = [RESULTS.get((case, impl)) for impl in IMPLEMENTATIONS]
        cells = "".join(f"{v:>10.1f}" if v else f"{'-':>10}" for v in row)
        ratios = "".join(f"{row[0] / v:>12.1f}" if (row[0] and v) else f"{'-':>12}" for v in row[1:])
        lines.append(f"{case:<12}{cells}{ratios}")
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print("\n".join(lines))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES)
def test_down_convert_v2_to_v1(benchmark, timing, case, implementation):
    value_size, codec_name = CASES[case]
    data = make_input(value_size, codec_name)
    codec = codecs.codec_id(codec_name)
    convert = IMPLEMENTATIONS[implementation]
    # the same records come out, whoever converts
    assert sum(1 for _ in MemoryRecords(convert(data, codec)).records()) == len(data_records(data))
    rounds = {"kmem": 20, "aiokafka": 10, "kafka-python": 2}[implementation]
    benchmark.group = f"v2->v1 {case}"
    benchmark.pedantic(convert, args=(data, codec), rounds=rounds, iterations=1, warmup_rounds=1)
    mb_per_s = len(data) / timing("min") / 1e6
    RESULTS[(case, implementation)] = mb_per_s
    benchmark.extra_info["input_MB_per_s"] = round(mb_per_s, 1)
