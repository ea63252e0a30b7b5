"""gzip batches converting on threads: same bytes as one at a time, results in input order, bounded work in
flight, serial error precedence, threads that end with the conversion."""
import random
import threading
import tracemalloc

import pytest
from records_samples import read_aiokafka, read_kafka_python, read_kmem

from kmem.errors import CorruptRecordError, InvalidArgumentError, UnsupportedCompressionTypeError
from kmem.records import MemoryRecords, RecordsBuilder, build_control_batch, down_convert, workers
from kmem.records import codecs, convert


def mixed_log(codec, batches=40, seed=1):
    """v2 batches of ``codec`` from 1 to 400 records (small ones share a job, large ones get their own),
    with uncompressed batches and a commit marker among them."""
    rng = random.Random(seed)
    parts, offset = [], 0
    for i in range(batches):
        builder = RecordsBuilder(2, "none" if i % 9 == 4 else codec, base_offset=offset)
        for _ in range(rng.choice((1, 3, 40, 400))):
            builder.append(b"v%d " % offset + rng.randbytes(rng.randint(0, 300)), key=b"k%d" % (offset % 7),
                           timestamp=1_700_000_000_000 + offset)
            offset += 1
        parts.append(builder.build())
        if i % 13 == 6:
            parts.append(build_control_batch(1, offset=offset, producer_id=7, producer_epoch=0, timestamp=0))
            offset += 1
    return b"".join(parts)


def one_at_a_time(monkeypatch, *args, **kwargs):
    with monkeypatch.context() as m:
        m.setattr(workers, "THREADS", 1)
        return down_convert(*args, **kwargs)


@pytest.mark.parametrize("to_magic", [0, 1])
@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_threads_give_the_same_bytes_as_one_batch_at_a_time(monkeypatch, codec, to_magic):
    monkeypatch.setattr(workers, "THREADS", 3)
    source = mixed_log(codec)
    serial = one_at_a_time(monkeypatch, source, to_magic)
    parallel = down_convert(source, to_magic)
    assert bytes(parallel.records) == bytes(serial.records)
    assert parallel.stats.num_records_converted == serial.stats.num_records_converted
    assert parallel.stats.temporary_memory_bytes == serial.stats.temporary_memory_bytes
    rows = [(r.offset, r.timestamp if to_magic == 1 else -1, r.key, r.value, [])
            for batch in MemoryRecords(source) if not batch.is_control_batch for r in batch]
    assert read_kmem(parallel.records.buffer) == rows
    assert read_kafka_python(parallel.records.buffer) == rows
    if not (codec == "lz4" and to_magic == 0):     # aiokafka checks magic 0's LZ4 header the fixed way
        assert read_aiokafka(parallel.records.buffer) == rows


def test_threads_write_into_the_callers_buffer_in_input_order(monkeypatch):
    monkeypatch.setattr(workers, "THREADS", 3)
    source = mixed_log("gzip", seed=2)
    expected = bytes(one_at_a_time(monkeypatch, source, 1).records)
    out = bytearray(2 * len(source) + (1 << 20))
    assert bytes(down_convert(source, 1, out=out).records.buffer) == expected
    with pytest.raises(InvalidArgumentError, match="out holds"):
        down_convert(source, 1, out=bytearray(len(expected) // 2))


def corrupt_gzip_batch(offset, size=5000):
    builder = RecordsBuilder(2, "gzip", base_offset=offset)
    builder.append(random.Random(offset).randbytes(size))
    batch = bytearray(builder.build())
    batch[-8] ^= 0xFF                       # the gzip trailer's CRC-32 (the batch CRC is not checked)
    return bytes(batch)


def gzip_batches(offset, count):
    """Batches of random bytes: each larger than ``JOB_BYTES`` compressed, so each is a job of its own."""
    rng = random.Random(offset)
    parts = []
    for i in range(count):
        builder = RecordsBuilder(2, "gzip", base_offset=offset + i)
        builder.append(rng.randbytes(convert.JOB_BYTES + 1000))
        parts.append(builder.build())
    return b"".join(parts)


def test_the_first_bad_batch_in_input_order_is_the_one_reported(monkeypatch):
    monkeypatch.setattr(workers, "THREADS", 3)
    good = gzip_batches(0, 6)
    bad = corrupt_gzip_batch(6)
    zstd = RecordsBuilder(2, "zstd", base_offset=13)
    zstd.append(b"z")
    # a job of its own that fails, then a later group (a small bad batch and a good one) given while it runs
    big_bad = corrupt_gzip_batch(6, convert.JOB_BYTES + 1000)
    later_bad = gzip_batches(7, 3) + corrupt_gzip_batch(10) + gzip_batches(11, 3)
    for source in (good + bad + good, good + bad + gzip_batches(7, 6) + zstd.build(), good + big_bad + later_bad):
        with pytest.raises(CorruptRecordError) as parallel:
            down_convert(source, 1)
        with pytest.raises(CorruptRecordError) as serial:
            one_at_a_time(monkeypatch, source, 1)
        assert parallel.value.offset == serial.value.offset == len(good)
        assert str(parallel.value) == str(serial.value)
    with pytest.raises(UnsupportedCompressionTypeError):
        down_convert(good + gzip_batches(7, 6) + zstd.build(), 1)


def test_a_full_buffer_is_reported_before_a_bad_batch_after_it(monkeypatch):
    monkeypatch.setattr(workers, "THREADS", 3)
    source = gzip_batches(0, 3) + corrupt_gzip_batch(3) + gzip_batches(4, 4)
    first_two = sum(b.size_in_bytes for b in list(down_convert(gzip_batches(0, 3), 1).records)[:2])
    for converter in (down_convert, lambda *args, **kwargs: one_at_a_time(monkeypatch, *args, **kwargs)):
        with pytest.raises(InvalidArgumentError, match="out holds"):      # the third batch does not fit
            converter(source, 1, out=bytearray(first_two + 100))


def test_ordered_jobs_keep_at_most_threads_plus_one_in_flight_and_hand_results_back_in_order(monkeypatch):
    monkeypatch.setattr(workers, "THREADS", 3)
    rng = random.Random(3)
    taken, given_not_taken = [], 0
    most = 0

    def take(result):
        nonlocal given_not_taken
        given_not_taken -= 1
        taken.append(result)

    def job(i, data):       # uneven work, so that later jobs often end first
        codecs.compress(codecs.GZIP, data, 1)
        return i

    with workers.OrderedJobs(take) as jobs:
        for i in range(60):
            given_not_taken += 1
            jobs.give(job, i, bytes(rng.randrange(256) for _ in range(rng.choice((10, 200_000)))))
            most = max(most, given_not_taken)
        jobs.finish()
    assert taken == list(range(60))
    assert 1 < most <= workers.THREADS + 1


def test_memory_in_flight_is_a_few_batches_not_the_whole_input(monkeypatch):
    monkeypatch.setattr(workers, "THREADS", 2)
    batches = []
    for i in range(12):             # each inflates to 4 MiB and converts to 4 MiB more
        builder = RecordsBuilder(2, "gzip", base_offset=i)
        builder.append(bytes(4 << 20))
        batches.append(builder.build())
    source = b"".join(batches)

    def peak(convert):
        tracemalloc.start()
        try:
            convert()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    one_batch = peak(lambda: one_at_a_time(monkeypatch, batches[0], 1))
    all_batches = peak(lambda: down_convert(source, 1))
    assert all_batches < (workers.THREADS + 1) * one_batch < len(batches) * one_batch


def codec_threads():
    return [t for t in threading.enumerate() if t.name.startswith("kmem-codec") and t.is_alive()]


@pytest.mark.parametrize("codec, threaded", [("gzip", True), ("lz4", False), ("snappy", False)])
def test_threads_start_for_gzip_only_and_end_with_the_conversion(monkeypatch, codec, threaded):
    monkeypatch.setattr(workers, "THREADS", 2)
    seen = []
    real = workers.ThreadPoolExecutor

    def counted(*args, **kwargs):
        pool = real(*args, **kwargs)
        seen.append(pool)
        return pool

    monkeypatch.setattr(workers, "ThreadPoolExecutor", counted)
    source = mixed_log(codec, seed=4)
    converted = down_convert(source, 1)
    assert bool(seen) == threaded
    assert codec_threads() == []
    assert len(converted.records) == len(one_at_a_time(monkeypatch, source, 1).records)
    with pytest.raises(CorruptRecordError):
        down_convert(gzip_batches(0, 4) + corrupt_gzip_batch(4) + gzip_batches(5, 4), 1)
    assert codec_threads() == []
