"""down_convert against the scenarios Kafka tests RecordsUtil.downConvert with (MemoryRecordsBuilderTest,
LazyDownConversionRecordsTest), checked with three readers."""
import struct
import tracemalloc

import pytest
from records_samples import (CODECS, MINIMAL_RECORD, read_aiokafka, read_kafka_python, read_kmem, scenario_batches,
                             scenario_records, v2_batch_of)

from kmem import _core
from kmem.errors import CorruptRecordError, UnsupportedCompressionTypeError
from kmem.records import (ControlRecordType, LazyDownConvertRecords, MemoryRecords, RecordsBuilder, TimestampType,
                          build_control_batch, build_records, down_convert)
from kmem.records import codecs


def expected_rows(rows, to_magic, first_offset, compressed):
    kept = [r for r in rows if compressed or r[0] >= first_offset]
    return [(o, t if to_magic == 1 else -1, k, v, []) for o, t, k, v, _ in kept]


def assert_all_readers(data, expected, skip_aiokafka=False):
    assert read_kmem(data) == expected
    assert read_kafka_python(data) == expected
    if not skip_aiokafka:
        assert read_aiokafka(data) == expected


@pytest.mark.parametrize("first_offset", [0, 3, 10, 16, 25])
@pytest.mark.parametrize("to_magic", [0, 1, 2])
@pytest.mark.parametrize("codec", CODECS)
def test_kafka_scenario_every_codec_and_target(codec, to_magic, first_offset):
    source = scenario_batches(codec)
    if codec == "zstd" and to_magic < 2:
        with pytest.raises(UnsupportedCompressionTypeError,
                           match="Down-conversion of zstandard-compressed batches is not supported"):
            down_convert(source, to_magic, first_offset)
        return
    converted = down_convert(source, to_magic, first_offset)
    out = bytes(converted.records)
    if to_magic == 2:
        assert out == source                      # nothing above the target: copied byte for byte
        assert converted.stats.num_records_converted == 0
        return
    compressed = codec != "none"
    expected = expected_rows(scenario_records(), to_magic, first_offset, compressed)
    assert_all_readers(out, expected, skip_aiokafka=(to_magic == 0 and codec == "lz4"))
    batches = list(converted.records)
    assert all(b.magic == to_magic and b.compression == codecs.codec_id(codec) and b.is_valid() for b in batches)
    if compressed:      # one wrapper per source batch, at the offset of its last record
        assert [b.last_offset for b in batches] == [3, 15, 24]
    else:
        assert len(batches) == len(expected)
    assert converted.stats.num_records_converted == len(expected)
    assert converted.stats.temporary_memory_bytes >= len(source if compressed else b"") + len(out) - len(batches) * 40
    assert converted.stats.conversion_time_nanos > 0


def transactional_log():
    """Create-time and log-append-time data with an abort and a commit marker between them."""
    def batch(offset, timestamp_type=TimestampType.CREATE_TIME, codec="none", **kw):
        b = RecordsBuilder(2, codec, timestamp_type, base_offset=offset, producer_id=5, producer_epoch=0,
                           base_sequence=offset, transactional=True, **kw)
        b.append(b"a%d" % offset, key=b"k", timestamp=100 + offset, headers=[("h", b"x")])
        b.append(b"b%d" % offset, timestamp=200 + offset)
        return b.build()
    return lambda codec: (
        batch(0, codec=codec)
        + build_control_batch(ControlRecordType.ABORT, 2, 5, 0, timestamp=300)
        + batch(3, TimestampType.LOG_APPEND_TIME, codec=codec, log_append_time=5000)
        + build_control_batch(ControlRecordType.COMMIT, 5, 5, 0, timestamp=400)
        + batch(6, codec=codec))


@pytest.mark.parametrize("to_magic", [0, 1])
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
def test_markers_skipped_timestamp_types_kept(codec, to_magic):
    source = transactional_log()(codec)
    converted = down_convert(source, to_magic, 0)
    ts = (lambda t: t) if to_magic == 1 else (lambda t: -1)
    expected = [(0, ts(100), b"k", b"a0", []), (1, ts(200), None, b"b0", []),
                (3, ts(5000), b"k", b"a3", []), (4, ts(5000), None, b"b3", []),
                (6, ts(106), b"k", b"a6", []), (7, ts(206), None, b"b6", [])]
    assert_all_readers(bytes(converted.records), expected, skip_aiokafka=(to_magic == 0 and codec == "lz4"))
    types = {b.last_offset: b.timestamp_type for b in converted.records}
    if to_magic == 1:
        assert types[4] == TimestampType.LOG_APPEND_TIME and types[7] == TimestampType.CREATE_TIME
    else:
        assert set(types.values()) == {TimestampType.NO_TIMESTAMP_TYPE}
    assert bytes(down_convert(source, 2, 0).records) == source     # markers stay for v2 readers


@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_log_append_time_of_minus_one_keeps_its_type(codec):
    # The batch reads as LogAppendTime -1; -1 must not mean "no append time" (CreateTime with the create
    # timestamps). Kafka writes LogAppendTime entries of timestamp -1 and refuses any other negative.
    builder = RecordsBuilder(2, codec, TimestampType.LOG_APPEND_TIME, log_append_time=-1)
    builder.append(b"a", timestamp=1000)
    builder.append(b"b", timestamp=1005)
    source = builder.build()
    assert [r[1] for r in read_kmem(source)] == [-1, -1]
    converted = down_convert(source, 1)
    assert_all_readers(bytes(converted.records), [(0, -1, None, b"a", []), (1, -1, None, b"b", [])])
    assert {b.timestamp_type for b in converted.records} == {TimestampType.LOG_APPEND_TIME}
    invalid = bytearray(source)
    struct.pack_into(">q", invalid, 35, -5)                        # maxTimestamp
    struct.pack_into(">I", invalid, 17, _core.crc32c(bytes(invalid[21:])))
    with pytest.raises(CorruptRecordError, match="invalid timestamp"):
        down_convert(bytes(invalid), 1)


def test_conversion_that_would_outgrow_the_limit_is_refused_before_it_is_written():
    # 4.2 MB of 7-byte records (a ~4 KB gzip batch) would become 20 MB of 34-byte v1 entries
    n, limit = 600_000, 8 << 20
    source = v2_batch_of(MINIMAL_RECORD * n, n, codecs.GZIP)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="could exceed the limit of 8388608 bytes"):
            down_convert(source, 1, max_decompressed_bytes=limit)
        with pytest.raises(CorruptRecordError, match="could exceed the limit"):
            LazyDownConvertRecords(source, 0, chunk_size=16 << 10, max_decompressed_bytes=limit)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(MINIMAL_RECORD) * n, peak      # inflating the payload, not writing 5 times it
    small = v2_batch_of(MINIMAL_RECORD * 10_000, 10_000, codecs.GZIP)     # 340,000 bytes of v1 entries
    assert down_convert(small, 1, max_decompressed_bytes=340_000).stats.num_records_converted == 10_000
    with pytest.raises(CorruptRecordError, match="could exceed the limit"):
        down_convert(small, 1, max_decompressed_bytes=339_999)


def test_v0_mixed_with_v2_to_v1_first_offset_2():
    # KAFKA-8570: legacy batches below the target are copied while v2 batches are converted.
    v0 = build_records([b"zero", b"one"], magic=0)
    v2 = build_records([{"value": b"two", "timestamp": 20}, {"value": b"three", "timestamp": 30},
                        {"value": b"four", "timestamp": 40}], magic=2, base_offset=2)
    v0_later = build_records([b"five"], magic=0, base_offset=5)
    source = v0 + v2 + v0_later
    for first_offset, v2_rows in [(2, [(2, 20, None, b"two", []), (3, 30, None, b"three", []),
                                       (4, 40, None, b"four", [])]), (4, [(4, 40, None, b"four", [])])]:
        converted = down_convert(source, 1, first_offset)
        data = bytes(converted.records)
        assert data.startswith(v0) and data.endswith(v0_later)
        expected = [(0, -1, None, b"zero", []), (1, -1, None, b"one", [])] + v2_rows + [(5, -1, None, b"five", [])]
        assert_all_readers(data, expected)
        assert [b.magic for b in converted.records] == [0, 0] + [1] * len(v2_rows) + [0]
        assert converted.stats.num_records_converted == len(v2_rows)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
def test_v1_to_v0(codec):
    builder = RecordsBuilder(1, codec, base_offset=10)
    for offset in (10, 12, 13, 20):
        builder.append(b"v%d" % offset, key=b"k", timestamp=offset * 10, offset=offset)
    source = builder.build()
    converted = down_convert(source, 0, 13)
    rows = [(o, -1, b"k", b"v%d" % o, []) for o in (10, 12, 13, 20) if codec != "none" or o >= 13]
    assert_all_readers(bytes(converted.records), rows, skip_aiokafka=codec == "lz4")
    assert all(b.magic == 0 for b in converted.records)
    assert bytes(down_convert(source, 1, 13).records) == source


def test_empty_and_truncated_inputs():
    assert bytes(down_convert(b"", 1).records) == b""
    source = scenario_batches("none")
    truncated = source[:-7]
    converted = down_convert(truncated, 1, 0)
    assert [r[0] for r in read_kmem(bytes(converted.records))] == [0, 2, 3, 9, 11, 15]
    assert down_convert(source[:30], 0).stats.num_records_converted == 0


def test_batch_emptied_by_trimming_is_dropped():
    source = scenario_batches("none")
    converted = down_convert(source, 1, 11)
    assert [r[0] for r in read_kmem(bytes(converted.records))] == [11, 15, 16, 17, 22, 24]
    assert converted.stats.temporary_memory_bytes < len(source) + len(bytes(converted.records))


def test_accepts_memory_records_and_verifies_crc_on_request():
    source = bytearray(scenario_batches("gzip"))
    assert bytes(down_convert(MemoryRecords(bytes(source)), 1).records) == bytes(down_convert(source, 1).records)
    source[-2] ^= 0x55
    with pytest.raises(Exception) as info:
        down_convert(bytes(source), 1, verify_crc=True)
    assert "crc" in str(info.value)
