"""kmem's record data against readers and builders nobody here wrote: kafka-python and aiokafka."""
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioDefaultBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder as AioLegacyBuilder
from kafka.record.default_records import DefaultRecordBatchBuilder as KpDefaultBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder as KpLegacyBuilder
from records_samples import CODECS, read_aiokafka, read_kafka_python, read_kmem

from kmem.records import MemoryRecords, RecordsBuilder, TimestampType, build_control_batch, down_convert
from kmem.records import codecs

CASES = [(magic, codec) for magic in (0, 1, 2) for codec in CODECS if not (codec == "zstd" and magic < 2)]


def sample_rows(magic, n=40):
    rows = []
    for i in range(n):
        offset = i * 3 + (i % 2)          # gaps
        key = None if i % 5 == 0 else b"key-%d" % i
        value = None if i % 7 == 3 else bytes([i % 251]) * (i * 37 % 2000)
        headers = [("h%d" % i, b"v" * (i % 3)), ("none", None)] if magic == 2 and i % 2 else []
        rows.append((offset, -1 if magic == 0 else 1_600_000_000_000 + i * 11, key, value, headers))
    return rows


def kmem_build(magic, codec, rows, **fields):
    builder = RecordsBuilder(magic, codec, base_offset=rows[0][0], **fields)
    for offset, timestamp, key, value, headers in rows:
        builder.append(value, key=key, timestamp=timestamp, headers=headers, offset=offset)
    return builder.build()


@pytest.mark.parametrize("magic, codec", CASES)
def test_clients_read_what_kmem_writes(magic, codec):
    rows = sample_rows(magic)
    data = kmem_build(magic, codec, rows) + kmem_build(magic, codec, rows[:5])
    expected = rows + rows[:5]
    assert read_kmem(data) == expected
    assert read_kafka_python(data) == expected
    if not (magic == 0 and codec == "lz4"):     # aiokafka checks the header checksum (see below)
        assert read_aiokafka(data) == expected


def test_magic0_lz4_broken_checksum_is_what_kafka_python_expects():
    # KAFKA-3160: kafka-python's magic 0 reader (like Kafka's) expects the pre-0.10 checksum;
    # aiokafka does not implement it and rejects such batches, as it would Kafka's own.
    data = kmem_build(0, "lz4", sample_rows(0))
    assert read_kafka_python(data) == sample_rows(0)
    with pytest.raises(Exception):
        read_aiokafka(data)


@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_clients_read_log_append_time(codec):
    rows = sample_rows(2, 5)
    for magic in (1, 2):
        data = kmem_build(magic, codec, [r if magic == 2 else r[:4] + ([],) for r in rows],
                          timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time=1234)
        for reader in (read_kmem, read_kafka_python, read_aiokafka):
            assert [r[1] for r in reader(data)] == [1234] * 5, reader


def test_clients_read_producer_fields_and_control_batches():
    rows = sample_rows(2, 3)
    data = kmem_build(2, "none", rows, producer_id=77, producer_epoch=4, base_sequence=10, transactional=True)
    data += build_control_batch(1, offset=rows[-1][0] + 1, producer_id=77, producer_epoch=4, timestamp=5)
    for reader_cls in (__import__("kafka.record", fromlist=["x"]).MemoryRecords,
                       __import__("aiokafka.record.memory_records", fromlist=["x"]).MemoryRecords):
        reader = reader_cls(data)
        batch = reader.next_batch()
        assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 4, 10)
        assert batch.is_transactional and not batch.is_control_batch
        assert reader.next_batch().is_control_batch


def _peer_builder(default_builder, legacy_builder):
    """A function building one batch of ``rows`` with a peer's own builders (kafka-python, aiokafka)."""
    def build(magic, codec, rows):
        if magic == 2:
            builder = default_builder(2, codec, 0, -1, -1, -1, 1 << 30)
            for offset, timestamp, key, value, headers in rows:
                builder.append(offset - rows[0][0], timestamp, key, value, headers)
        else:
            builder = legacy_builder(magic, codec, 1 << 30)
            for offset, timestamp, key, value, _ in rows:
                builder.append(offset - rows[0][0], None if magic == 0 else timestamp, key, value)
        return bytes(builder.build())
    return build


kafka_python_build = _peer_builder(KpDefaultBuilder, KpLegacyBuilder)
aiokafka_build = _peer_builder(AioDefaultBuilder, AioLegacyBuilder)


@pytest.mark.parametrize("build", [kafka_python_build, aiokafka_build])
@pytest.mark.parametrize("magic, codec", CASES)
def test_kmem_reads_what_clients_write(build, magic, codec):
    if build is aiokafka_build and magic == 0 and codec == "lz4":
        pytest.skip("aiokafka refuses to write lz4 for magic 0")
    rows = sample_rows(magic)
    data = build(magic, codecs.codec_id(codec), rows)
    # producers write batches starting at offset 0 (the broker assigns offsets)
    expected = [(o - rows[0][0],) + r[1:] for (o, *_), r in zip(rows, rows)]
    assert read_kmem(data) == expected
    assert all(batch.is_valid() for batch in MemoryRecords(data))
    # and the client's own reader agrees with kmem on its own bytes
    assert read_kafka_python(data) == expected


@pytest.mark.parametrize("to_magic", [0, 1])
@pytest.mark.parametrize("build", [kafka_python_build, aiokafka_build])
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
def test_clients_read_kmem_conversion_of_their_own_batches(to_magic, build, codec):
    rows = sample_rows(2)
    data = build(2, codecs.codec_id(codec), rows)
    converted = bytes(down_convert(data, to_magic, 0).records)
    expected = [(r[0] - rows[0][0], r[1] if to_magic else -1, r[2], r[3], []) for r in rows]
    assert read_kafka_python(converted) == expected
    if not (to_magic == 0 and codec == "lz4"):
        assert read_aiokafka(converted) == expected
    assert read_kmem(converted) == expected


@pytest.mark.parametrize("magic", [0, 1, 2])
def test_gzip_level_kip_390_is_honoured_and_read_by_the_clients(magic):
    rows = [(i, -1 if magic == 0 else 1000 + i, b"k%d" % i, b"hello kafka " * (i % 40 + 1), []) for i in range(60)]
    fastest, smallest = (kmem_build(magic, "gzip", rows, gzip_level=level) for level in (1, 9))
    assert len(fastest) > len(smallest)       # the level reached zlib
    assert kmem_build(magic, "gzip", rows) == kmem_build(magic, "gzip", rows, gzip_level=6)    # Kafka's default
    for data in (fastest, smallest):
        assert read_kmem(data) == read_kafka_python(data) == read_aiokafka(data) == rows
    if magic:
        converted = down_convert(kmem_build(2, "gzip", rows), magic - 1, gzip_level=1).records.buffer
        assert converted != down_convert(kmem_build(2, "gzip", rows), magic - 1).records.buffer
        assert read_kafka_python(converted) == read_aiokafka(converted) == read_kmem(converted)
        assert [r[3] for r in read_kmem(converted)] == [r[3] for r in rows]
