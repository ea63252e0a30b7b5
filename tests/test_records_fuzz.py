"""Fuzzing: mutated real batches into every reader, both down-conversions and the broker's validator
(rebuilding batches in another codec) give a kmem error or a result, never a crash, a hang, unbounded
memory or another exception type; what the validator rebuilds holds the records it was given; the core's
common case of the validator (``_core.assign_v2_batches``) answers edited and hostile records exactly as
the batch-by-batch validator does."""
import os
import struct
import tempfile
import tracemalloc
from datetime import timedelta
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from records_samples import scenario_batches

from kmem import _core
from kmem.broker.codes import ErrorCode, LogError
from kmem.broker.log.config import LogConfig
from kmem.broker.log.validator import CLIENT, COORDINATOR, REPLICATION, validate_each_batch, validate_and_assign
from kmem.errors import CorruptRecordError, KmemError
from kmem.records import (ControlRecordType, FileRecords, LazyDownConvertRecords, MemoryRecords, RecordsBuilder,
                          TimestampType, build_control_batch, build_records, down_convert, segment_file_name)
from kmem.records import codecs
from kmem.records.batches import V2_HEADER


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


# --- mutations of valid data that reach every parser ------------------------------------------------------
#
# Random edits of a compressed batch almost always end at the codec. These strategies edit the records
# *inside* the compression (the records section or the inner entries, then compress them with a valid
# CRC), the batch header's length, count and offset fields with extreme values, and the varints of v2
# records, then optionally flip bits or truncate the result.

INT64_EXTREMES = [0, 1, -1, 2, 0x7FFFFFFF, -0x80000000, (1 << 63) - 1, -(1 << 63), (1 << 62), -(1 << 62)]
VARINTS = [0, 1, -1, -2, 63, 64, 0x7FFFFFFF, -0x80000000, (1 << 40), (1 << 62), -(1 << 63)]
FUZZ_LIMIT = 1 << 20            # decompression limit of every entry point under fuzzing
FUZZ_PEAK = 24 * FUZZ_LIMIT     # most traced memory allowed for all of them on one input of a few KB


def zigzag(value, over_long=False):
    z = ((value << 1) ^ (value >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while z >= 0x80:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    if over_long:       # an 11-byte varint, longer than any Kafka field allows
        out[-1] |= 0x80
        out += b"\x80" * (11 - len(out)) + b"\0"
    return bytes(out)


def fuzz_rows(draw, headers):
    rows = []
    for i in range(draw(st.integers(1, 5))):
        key = draw(st.sampled_from([None, b"", b"key-%d" % i]))
        value = draw(st.sampled_from([None, b"", b"v" * draw(st.integers(1, 300))]))
        row_headers = [(b"h%d" % j, draw(st.sampled_from([None, b"", b"x"]))) for j in range(draw(st.integers(0, 3)))]
        rows.append((key, value, row_headers if headers else []))
    return rows


@st.composite
def edited_bytes(draw, data, int_fields=(), varints=False):
    """``data`` with 0-3 edits: a bit flip, a byte, an extreme int at one of ``int_fields`` ((format,
    position) pairs), a varint written over the bytes at a position, or a truncation."""
    data = bytearray(data)
    kinds = ["flip", "byte", "truncate"] + (["field"] if int_fields else []) + (["varint"] if varints else [])
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(kinds))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "field":
            fmt, at = draw(st.sampled_from(int_fields))
            width = struct.calcsize(fmt)
            if len(data) >= at + width:
                bits = 8 * width
                value = draw(st.sampled_from(INT64_EXTREMES)) % (1 << bits)
                struct.pack_into(fmt, data, at, value - (1 << bits) if value >= 1 << (bits - 1) else value)
        elif kind == "varint":
            encoded = zigzag(draw(st.sampled_from(VARINTS)), over_long=draw(st.booleans()))
            data[pos:pos + draw(st.integers(1, 3))] = encoded
    return bytes(data)


V2_FIELDS = [(">q", 0), (">i", 8), (">i", 23), (">q", 27), (">q", 35), (">i", 57), (">h", 21)]


@st.composite
def mutated_v2_batch(draw):
    """A v2 batch of any codec whose records section was edited before compression."""
    codec = draw(st.integers(0, 4))
    rows = fuzz_rows(draw, headers=True)
    section = _core.encode_v2_records([(i, i, k, v, h) for i, (k, v, h) in enumerate(rows)])
    section = draw(edited_bytes(section, varints=True))
    if codec:
        section = codecs.compress(codec, section, 2)
    header = bytearray(V2_HEADER.pack(draw(st.sampled_from(INT64_EXTREMES[:4] + [(1 << 63) - 3])),
                                      49 + len(section), 0, 2, 0, codec | draw(st.sampled_from([0, 0x08, 0x30])),
                                      len(rows) - 1, 1000, 1000 + len(rows), -1, -1, -1, len(rows)))
    batch = draw(edited_bytes(bytes(header), V2_FIELDS)) + section
    batch = bytearray(batch)
    if len(batch) >= 21:
        struct.pack_into(">I", batch, 17, _core.crc32c(bytes(batch[21:])))
    return draw(edited_bytes(bytes(batch)))


@st.composite
def mutated_legacy_entries(draw):
    """v0/v1 entries: uncompressed, or a wrapper of any legacy codec around edited inner entries."""
    magic = draw(st.integers(0, 1))
    codec = draw(st.integers(0, 3))
    rows = fuzz_rows(draw, headers=False)
    entries = [(i, 1000 + i, k, v) for i, (k, v, _) in enumerate(rows)]
    key_length = 26 if magic else 18
    fields = [(">q", 0), (">i", 8), (">i", key_length)] + ([(">q", 18)] if magic else [])
    if codec:
        inner = draw(edited_bytes(_core.encode_legacy_entries(magic, 0, entries), fields))
        wrapper_offset = draw(st.sampled_from(INT64_EXTREMES))
        data = _core.encode_legacy_entries(magic, codec, [(wrapper_offset, 1000, None,
                                                           codecs.compress(codec, inner, magic))])
    else:
        data = _core.encode_legacy_entries(magic, 0, entries)
    return draw(edited_bytes(data, fields))


fuzzed_records = st.lists(st.one_of(mutated_v2_batch(), mutated_legacy_entries()), min_size=1, max_size=3).map(
    b"".join)


class Sink:
    def __init__(self):
        self.size = 0

    def write(self, view):
        self.size += len(view)
        return len(view)


def only_kmem_errors(call):
    try:
        return call()
    except KmemError:
        return None


def int64(value):
    """``value`` when it is None or fits a Kafka long (what Spark's LongType and Java readers take)."""
    assert value is None or -(1 << 63) <= value < (1 << 63), value
    return value


def read_everything(records):
    for batch in records:
        for attribute in ("base_offset", "last_offset", "records_count", "last_sequence", "max_timestamp"):
            int64(only_kmem_errors(lambda: getattr(batch, attribute)))
        for attribute in ("timestamp_type", "control_type", "compression"):
            only_kmem_errors(lambda: getattr(batch, attribute))
        only_kmem_errors(batch.is_valid)
        for record in only_kmem_errors(lambda: batch.records(max_decompressed_bytes=FUZZ_LIMIT)) or ():
            int64(record.offset), int64(record.timestamp)
        only_kmem_errors(lambda: [int64(r.offset) for r in batch])
        repr(batch)


def exercise_entry_points(data, directory):
    only_kmem_errors(lambda: read_everything(MemoryRecords(data)))
    only_kmem_errors(lambda: MemoryRecords(data).valid_bytes)
    for to_magic in (0, 1, 2):
        only_kmem_errors(lambda: down_convert(data, to_magic, 2, max_decompressed_bytes=FUZZ_LIMIT))
    path = os.path.join(directory, segment_file_name(0))
    with open(path, "wb") as f:
        f.write(data)
    with FileRecords(path) as segment:
        only_kmem_errors(lambda: read_everything(segment))
        only_kmem_errors(lambda: segment.search_for_offset(3))
        for to_magic in (0, 1):
            def lazy_send():
                send = LazyDownConvertRecords(segment, to_magic, 1, chunk_size=100,
                                              max_decompressed_bytes=FUZZ_LIMIT).to_send()
                sink = Sink()
                while not send.completed:
                    send.write_to(sink)
                assert sink.size == send.size
            only_kmem_errors(lambda: lazy_send())


@settings(max_examples=400, deadline=timedelta(seconds=20), suppress_health_check=[HealthCheck.too_slow])
@given(fuzzed_records)
def test_edited_records_inside_every_codec_only_raise_kmem_errors_in_bounded_memory(data):
    with tempfile.TemporaryDirectory() as directory, \
            mock.patch.object(codecs, "MAX_DECOMPRESSED_BYTES", FUZZ_LIMIT):
        tracemalloc.start()
        try:
            exercise_entry_points(data, directory)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < FUZZ_PEAK


def _contents(records):
    """(key, value, headers, timestamp or -1) of every record, as rebuilding keeps them."""
    return [(r.key, r.value, r.headers, max(r.timestamp, -1)) for r in records]


@settings(max_examples=400, deadline=timedelta(seconds=20), suppress_health_check=[HealthCheck.too_slow])
@given(fuzzed_records, st.sampled_from(["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"]),
       st.sampled_from([CLIENT, COORDINATOR]))      # the coordinator's batches need not start at offset 0
def test_validator_rebuilds_edited_records_into_the_same_records_or_refuses_them(data, compression, origin):
    config = LogConfig(compression_type=compression)
    with mock.patch.object(codecs, "MAX_DECOMPRESSED_BYTES", FUZZ_LIMIT):
        tracemalloc.start()
        try:
            validated = validate_and_assign(data, next_offset=5, config=config, leader_epoch=0, origin=origin,
                                            now_ms=1)
        except LogError:        # the only exception: PartitionLog.append answers it with its code
            validated = None
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < FUZZ_PEAK
        if validated is None:
            return
        stored = MemoryRecords(b"".join(bytes(piece) for piece in validated.pieces))
        stored.ensure_valid()
        # kmem's readers refuse v1 inner offsets past int64, which rebuilding replaces (as Kafka does)
        given = only_kmem_errors(lambda: _contents(MemoryRecords(data).records()))
        assert given is None or _contents(stored.records()) == given



def test_a_coordinator_batch_whose_last_offset_passes_int64_is_corrupt_message():
    # found by the test above: base offset 2**63 - 3 with lastOffsetDelta 3
    data = (b"\x7f\xff\xff\xff\xff\xff\xff\xfd\x00\x00\x00M\x00\x00\x00\x00\x02\xb9V\x0c\xda\x00\x00\x00"
            b"\x00\x00\x03\x00\x00\x00\x00\x00\x00\x03\xe8\x00\x00\x00\x00\x00\x00\x03\xec\xff\xff\xff"
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x04\x0c\x00\x00\x00\x01\x01\x00"
            b"\x0c\x00\x02\x02\x01\x01\x00\x0c\x00\x04\x04\x01\x01\x00\x0c\x00\x06\x06\x01\x01\x00")
    with pytest.raises(LogError) as refused:
        validate_and_assign(data, next_offset=5, config=LogConfig(), leader_epoch=0, origin=COORDINATOR, now_ms=1)
    assert refused.value.code == ErrorCode.CORRUPT_MESSAGE


def _outcome(validate):
    """What a validation gives, to compare: the stored bytes and everything said of them, or the refusal."""
    try:
        validated = validate()
    except LogError as e:
        return e.code, str(e), e.record_errors
    return (b"".join(bytes(piece) for piece in validated.pieces), validated.batches, validated.first_offset,
            validated.last_offset, validated.max_timestamp, validated.offset_of_max_timestamp,
            validated.log_append_time, validated.size)


PRODUCER_FIELDS = [(">q", 43), (">h", 51), (">i", 53), (">q", 27), (">q", 35), (">h", 21), (">i", 8), (">i", 23),
                   (">i", 57), (">q", 0)]


@st.composite
def produced_batch(draw):
    """A v2 batch as producers send them (idempotent or transactional or neither, any codec, keys or none,
    timestamps around the broker's time of 1000), its header then maybe edited with its CRC made good."""
    producer_id = draw(st.sampled_from([-1, 0, 7]))
    builder = RecordsBuilder(2, draw(st.sampled_from(["none", "none", "none", "gzip", "lz4", "zstd"])),
                             producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                             base_sequence=draw(st.sampled_from([0, 0x7FFFFFFE])) if producer_id >= 0 else -1,
                             transactional=producer_id >= 0 and draw(st.booleans()))
    for i in range(draw(st.integers(1, 4))):
        builder.append(b"v" * draw(st.integers(0, 40)), key=draw(st.sampled_from([None, b"k%d" % i])),
                       timestamp=draw(st.sampled_from([-1, 400, 1000, 1100, 1200])))
    batch = bytearray(draw(edited_bytes(builder.build(), PRODUCER_FIELDS)))
    if len(batch) >= 21 and draw(st.booleans()):
        struct.pack_into(">I", batch, 17, _core.crc32c(bytes(batch[21:])))
    return bytes(batch)


FUZZ_CONFIGS = [LogConfig(), LogConfig(compression_type="lz4"), LogConfig(compression_type="uncompressed"),
                LogConfig(cleanup_policy="compact"), LogConfig(message_timestamp_type="LogAppendTime"),
                LogConfig(message_timestamp_before_max_ms=500, message_timestamp_after_max_ms=100),
                LogConfig(max_message_bytes=120), LogConfig(segment_bytes=150)]


@settings(max_examples=500, deadline=timedelta(seconds=20), suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(fuzzed_records, st.lists(produced_batch(), min_size=1, max_size=2).map(b"".join)),
       st.sampled_from(FUZZ_CONFIGS), st.sampled_from([CLIENT, COORDINATOR, REPLICATION]))
def test_the_core_common_case_answers_edited_records_as_the_batch_by_batch_validator(data, config, origin):
    with mock.patch.object(codecs, "MAX_DECOMPRESSED_BYTES", FUZZ_LIMIT):
        given = _outcome(lambda: validate_and_assign(data, next_offset=5, config=config, leader_epoch=3,
                                                     origin=origin, now_ms=1000))
        expected = _outcome(lambda: validate_each_batch(memoryview(data), 5, config, 3, origin, 1000))
    assert given == expected


def _produced(codec="none", producer_id=7, transactional=False, count=3, base_sequence=0, keys=True):
    builder = RecordsBuilder(2, codec, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                             base_sequence=base_sequence if producer_id >= 0 else -1, transactional=transactional)
    for i in range(count):
        builder.append(b"value-%d" % i, key=b"key-%d" % i if keys else None, timestamp=990 + i)
    return builder.build()


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("producer", ["plain", "idempotent", "transactional"])
@pytest.mark.parametrize("config", [LogConfig(), LogConfig(message_timestamp_type="LogAppendTime"),
                                    LogConfig(cleanup_policy="compact", message_timestamp_after_max_ms=100)],
                         ids=["default", "log-append-time", "compact-bounded"])
def test_produced_batches_take_the_core_common_case_and_get_what_the_batch_by_batch_validator_gives(codec, producer,
                                                                                                    config):
    data = _produced(codec, producer_id=-1 if producer == "plain" else 7, transactional=producer == "transactional")
    if codec == "none":             # Produce v3+ carries one batch; older ones and the coordinator's may carry more
        data += _produced(codec, producer_id=-1 if producer == "plain" else 7,
                          transactional=producer == "transactional", base_sequence=3)
    found, core_assign = [], _core.assign_v2_batches

    def assign(*args, **kwargs):
        found.append(core_assign(*args, **kwargs))
        return found[-1]
    with mock.patch.object(_core, "assign_v2_batches", assign):
        given = _outcome(lambda: validate_and_assign(data, next_offset=5, config=config, leader_epoch=3, now_ms=1000))
    # a compressed batch whose records each need checking is left to the batch-by-batch validator
    assert len(found) == 1 and (found[0] is None) == (codec != "none" and config.compact)
    assert given == _outcome(lambda: validate_each_batch(memoryview(data), 5, config, 3, CLIENT, 1000))
    stored = MemoryRecords(given[0])
    stored.ensure_valid()
    assert [r.offset for r in stored.records()] == list(range(5, 5 + len(list(MemoryRecords(data).records()))))


HEADER_INTS = [(">q", 0), (">i", 8), (">i", 12), (">i", 17), (">h", 21), (">i", 23), (">q", 27), (">q", 35),
               (">q", 43), (">h", 51), (">i", 53), (">i", 57)]
HOSTILE = [0, 1, -1, 2, 13, 14, 48, 49, 60, 61, 0x7FFFFFFF, -0x80000000, 1 << 20]


def _hostile_inputs():
    """Two idempotent batches, truncated at every byte, and with each header field of either set to each of
    ``HOSTILE`` (a CRC left stale, or made good so that the field itself is what is checked)."""
    first, second = _produced(), _produced(base_sequence=3)
    data = first + second
    for end in range(len(data)):
        yield data[:end]
    for start, end in ((0, len(first)), (len(first), len(data))):
        for fmt, position in HEADER_INTS:
            bits = 8 * struct.calcsize(fmt)
            for value in HOSTILE:
                edited = bytearray(data)
                struct.pack_into(fmt, edited, start + position, max(min(value, (1 << bits - 1) - 1), -(1 << bits - 1)))
                yield bytes(edited)
                struct.pack_into(">I", edited, start + 17, _core.crc32c(bytes(edited[start + 21:end])))
                yield bytes(edited)


@pytest.mark.parametrize("origin", [CLIENT, COORDINATOR, REPLICATION])
def test_hostile_headers_get_from_the_core_common_case_what_the_batch_by_batch_validator_gives(origin):
    config = LogConfig(cleanup_policy="compact", message_timestamp_before_max_ms=500)
    for data in _hostile_inputs():
        expected = _outcome(lambda: validate_each_batch(memoryview(data), 5, config, 3, origin, 1000))
        given = _outcome(lambda: validate_and_assign(data, next_offset=5, config=config, leader_epoch=3,
                                                     origin=origin, now_ms=1000))
        assert given == expected, data


def test_what_the_core_common_case_refuses_is_named_by_the_batch_by_batch_validator():
    data = bytearray(_produced())
    common = dict(next_offset=5, config=LogConfig(), leader_epoch=0, now_ms=1)

    def refusal(edit):
        edited = bytearray(data)
        edit(edited)
        struct.pack_into(">I", edited, 17, _core.crc32c(bytes(edited[21:])))
        with pytest.raises(LogError) as refused:
            validate_and_assign(bytes(edited), **common)
        return refused.value.code, str(refused.value)

    assert refusal(lambda b: struct.pack_into(">i", b, 57, -1)) == (
        ErrorCode.CORRUPT_MESSAGE, "CORRUPT_MESSAGE: negative record count -1 (at byte 0)")
    assert refusal(lambda b: struct.pack_into(">i", b, 57, 4)) == (
        ErrorCode.INVALID_RECORD, "INVALID_RECORD: found invalid record structure: batch record count does not match "
                                  "its records (at byte 118)")
    assert refusal(lambda b: struct.pack_into(">i", b, 8, len(b) - 11)) == (
        ErrorCode.INVALID_RECORD, "INVALID_RECORD: the records hold no complete record batch")
    assert refusal(lambda b: struct.pack_into(">i", b, 8, 13))[0] == ErrorCode.CORRUPT_MESSAGE
    assert refusal(lambda b: struct.pack_into(">i", b, 53, -1)) == (
        ErrorCode.INVALID_RECORD, "INVALID_RECORD: invalid sequence number -1 in record batch with producer id 7")


def _marker(control_type, key=None, value=None):
    """A transaction marker as the coordinator writes it, or with its record's key or value replaced."""
    marker = build_control_batch(control_type, 0, 7, 0, 1000, coordinator_epoch=4)
    if key is None and value is None:
        return marker
    section = _core.encode_v2_records([(0, 0, key, value, [])])
    header = bytearray(marker[:V2_HEADER.size])
    struct.pack_into(">i", header, 8, V2_HEADER.size - 12 + len(section))
    struct.pack_into(">I", header, 17, _core.crc32c(bytes(header[21:]) + section))
    return bytes(header) + section


def _empty_control_batch():
    """A control batch holding no record (Kafka's cleaner keeps a marker so emptied)."""
    header = bytearray(_marker(ControlRecordType.COMMIT)[:V2_HEADER.size])
    struct.pack_into(">i", header, 8, V2_HEADER.size - 12)
    struct.pack_into(">i", header, 23, -1)                  # last offset delta
    struct.pack_into(">i", header, 57, 0)                   # records
    struct.pack_into(">I", header, 17, _core.crc32c(bytes(header[21:])))
    return bytes(header)


@pytest.mark.parametrize("origin", [COORDINATOR, REPLICATION])
def test_transaction_markers_take_the_core_common_case_and_get_what_the_batch_by_batch_validator_gives(origin):
    markers = [_marker(ControlRecordType.COMMIT), _marker(ControlRecordType.ABORT),
               _marker(0, key=b"\0\0\0\0", value=b"\0\0"), _marker(0, key=b"\0\0\0\x05", value=b"\0\0\0\0\0\x09"),
               _marker(0, key=b"\0\0\xff\xfe", value=b"\0\0\xff\xff\xff\xfd"), _empty_control_batch()]
    unreadable = [_marker(0, key=b"\0\0"), _marker(0, key=None, value=b"\0\0\0\0\0\x01")]   # no type: INVALID_RECORD
    outcomes = []
    for data in markers + [markers[0] + markers[1]] + unreadable + [markers[0] + unreadable[0]]:
        found, core_assign = [], _core.assign_v2_batches

        def assign(*args, **kwargs):
            found.append(core_assign(*args, **kwargs))
            return found[-1]
        with mock.patch.object(_core, "assign_v2_batches", assign):
            given = _outcome(lambda: validate_and_assign(data, next_offset=5, config=LogConfig(), leader_epoch=3,
                                                         origin=origin, now_ms=1000))
        # the core reads a marker's type and coordinator epoch; one whose key says no type is left to the
        # batch-by-batch validator, which names the error
        assert (found[0] is None) == (len(outcomes) >= len(markers) + 1)
        assert given == _outcome(lambda: validate_each_batch(memoryview(data), 5, LogConfig(), 3, origin, 1000))
        outcomes.append(given)
    assert [[(b.is_control, b.control_type, b.coordinator_epoch) for b in outcome[1]] for outcome in outcomes[:7]] == [
        [(True, ControlRecordType.COMMIT, 4)], [(True, ControlRecordType.ABORT, 4)],
        [(True, ControlRecordType.ABORT, -1)], [(True, 5, 9)], [(True, -2, -3)], [(True, None, -1)],
        [(True, ControlRecordType.COMMIT, 4), (True, ControlRecordType.ABORT, 4)]]
    assert outcomes[7][0] == outcomes[8][0] == outcomes[9][0] == ErrorCode.INVALID_RECORD
