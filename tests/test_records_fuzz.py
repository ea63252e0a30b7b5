"""Fuzzing: mutated real batches into every reader and the converter give a kmem error or a result,
never a crash, a hang or another exception type."""
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records_samples import scenario_batches

from kmem import _core
from kmem.errors import CorruptRecordError, KmemError
from kmem.records import (ControlRecordType, MemoryRecords, RecordsBuilder, TimestampType, build_control_batch,
                          build_records, down_convert)
from kmem.records import codecs


def _legacy(magic, codec):
    builder = RecordsBuilder(magic, codec, base_offset=3)
    for i in range(4):
        builder.append(b"value-%d" % i * (i + 1), key=b"k%d" % i if i % 2 else None, timestamp=100 + i)
    return builder.build()


SEEDS = [scenario_batches(codec) for codec in ("none", "gzip", "snappy", "lz4", "zstd")]
SEEDS += [_legacy(magic, codec) for magic in (0, 1) for codec in ("none", "gzip", "snappy", "lz4")]
SEEDS.append(_legacy(0, "none") + build_control_batch(ControlRecordType.COMMIT, 7, 1, 0, 5)
             + scenario_batches("none")[:200] + _legacy(1, "gzip"))
_log_append = RecordsBuilder(2, "gzip", TimestampType.LOG_APPEND_TIME, log_append_time=9)
_log_append.append(b"x", headers=[("h", b"v")])
SEEDS.append(_log_append.build() + _legacy(1, "none"))

EXTREMES = [0, 1, -1, -2, 13, 14, 49, 61, 0x7FFFFFFF, -0x80000000, 1 << 20]


@st.composite
def mutated(draw):
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "int", "truncate", "insert", "byte"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "int" and len(data) >= pos + 4:
            struct.pack_into(">i", data, pos, draw(st.sampled_from(EXTREMES)))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


def exercise_readers(data):
    records = MemoryRecords(data)
    for batch in records:
        batch.is_valid()
        (batch.base_offset, batch.last_offset, batch.records_count, batch.timestamp_type, batch.last_sequence)
        for record in batch.records(max_decompressed_bytes=1 << 20):
            assert record.key is None or isinstance(record.key, bytes)
        batch.control_type
    records.valid_bytes


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), st.integers(0, 2), st.integers(-1, 30))
def test_mutated_batches_only_raise_kmem_errors(data, to_magic, first_offset):
    try:
        exercise_readers(data)
        readable = True
    except KmemError:
        readable = False
    try:
        converted = down_convert(data, to_magic, first_offset, max_decompressed_bytes=1 << 20)
    except KmemError:
        return
    # Batches at or below the target are copied unread (as Kafka does), so only readable input must
    # convert to readable output.
    try:
        exercise_readers(bytes(converted.records))
        assert all(b.magic <= to_magic for b in converted.records)
    except KmemError:
        assert not readable


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD]), st.binary(max_size=200),
       st.integers(0, 2))
def test_codecs_on_garbage(codec, payload, magic):
    for candidate in (payload, codecs.compress(codec, payload, 2)[:len(payload)]):
        try:
            codecs.decompress(codec, candidate, magic, limit=1 << 16)
        except KmemError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=50)), st.one_of(st.none(), st.binary(max_size=300)),
                          st.integers(-1, 2**40)), min_size=1, max_size=20),
       st.sampled_from(["none", "gzip", "snappy", "lz4"]), st.integers(0, 2), st.integers(0, 2))
def test_build_read_convert_round_trip(rows, codec, magic, to_magic):
    builder = RecordsBuilder(magic, codec, base_offset=5)
    for key, value, timestamp in rows:
        builder.append(value, key=key, timestamp=timestamp)
    data = builder.build()
    read = [(r.key, r.value) for r in MemoryRecords(data).records()]
    assert read == [(k, v) for k, v, _ in rows]
    converted = down_convert(data, to_magic, 0)
    assert [(r.key, r.value) for r in converted.records.records()] == read


def test_v2_timestamp_that_v1_cannot_hold_is_rejected_not_written():
    # found by the fuzzer: a base timestamp far below zero made down_convert write a v1 message
    # that v1 readers (kmem's and Kafka's) reject
    batch = bytearray(build_records([b"a", b"b"], magic=2, base_offset=0))
    struct.pack_into(">q", batch, 27, -(1 << 40))                 # baseTimestamp
    struct.pack_into(">I", batch, 17, _core.crc32c(bytes(batch[21:])))
    source = bytes(batch)
    MemoryRecords(source).ensure_valid()                          # a valid v2 batch, CRC and all
    assert [r.timestamp for r in MemoryRecords(source).records()] == [-(1 << 40)] * 2
    with pytest.raises(CorruptRecordError, match="invalid timestamp"):
        down_convert(source, 1)
    assert [r.value for r in down_convert(source, 0).records.records()] == [b"a", b"b"]   # v0: no timestamps
