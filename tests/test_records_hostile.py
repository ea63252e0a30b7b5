"""Hostile record data: decompression bombs made of headers, and offsets or timestamps beyond int64.

Each must end in ``CorruptRecordError`` naming the byte position, with memory bounded by the
decompression limit, from every entry point (reading, iterating, both down-conversions).
"""
import struct
import tracemalloc

import pytest
from records_samples import v2_batch_of

from kmem import _core
from kmem.errors import CorruptRecordError
from kmem.records import LazyDownConvertRecords, MemoryRecords, codecs, down_convert

INT64_MAX, INT64_MIN = (1 << 63) - 1, -(1 << 63)


def varint(value):
    """Kafka's zig-zag varint."""
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def v2_record(offset_delta=0, timestamp_delta=0, headers=0):
    """A v2 record with null key and value and ``headers`` headers of empty key and null value."""
    body = b"\0" + varint(timestamp_delta) + varint(offset_delta) + varint(-1) + varint(-1) + varint(headers) \
        + b"\0\x01" * headers
    return varint(len(body)) + body


def with_header(batch, fmt, position, value):
    """``batch`` with one header field replaced and its CRC-32C recomputed."""
    batch = bytearray(batch)
    struct.pack_into(fmt, batch, position, value)
    struct.pack_into(">I", batch, 17, _core.crc32c(bytes(batch[21:])))
    return bytes(batch)


@pytest.mark.parametrize("codec", [codecs.GZIP, codecs.ZSTD])
def test_record_with_millions_of_headers_is_refused_in_bounded_memory(codec):
    # 2 M empty headers: 4 MB of records in a few KB of gzip or zstd, which iterating used to turn into
    # 2 M tuples (over 150 MB) for the one record.
    batch = v2_batch_of(v2_record(headers=2_000_000), 1, codec)
    assert len(batch) < 20_000
    (read,) = MemoryRecords(batch)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="2000000 headers, more than the limit") as raised:
            next(iter(read))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert raised.value.offset == 0          # the record at the start of the decompressed section
    assert peak < 4 * codecs.MAX_DECOMPRESSED_BYTES // 8    # the 4 MB payload and little else
    with pytest.raises(CorruptRecordError):
        read.records()
    if codec == codecs.GZIP:    # headers are dropped below v2: the record down-converts, bounded by bytes
        assert [r.value for r in down_convert(batch, 1).records.records()] == [None]


def test_record_headers_up_to_the_limit_are_read():
    batch = v2_batch_of(v2_record(headers=1000), 1, codecs.GZIP)
    (record,) = MemoryRecords(batch).records()
    assert record.headers == [("", None)] * 1000


def test_v2_batch_whose_last_offset_overflows_int64():
    source = v2_batch_of(v2_record(0) + v2_record(1), 2)
    source = with_header(with_header(source, ">q", 0, INT64_MAX), ">i", 23, 1)    # base offset, lastOffsetDelta
    (batch,) = MemoryRecords(source)
    assert batch.base_offset == INT64_MAX
    for read in (lambda: batch.last_offset, lambda: batch.next_offset, lambda: batch.last_offset_delta):
        with pytest.raises(CorruptRecordError, match="outside the int64 range") as raised:
            read()
        assert raised.value.offset == 0
    with pytest.raises(CorruptRecordError, match="record offset is outside the int64 range") as raised:
        list(batch)
    assert raised.value.offset == 61 + 7      # the second record
    for to_magic in (0, 1):
        with pytest.raises(CorruptRecordError, match="outside the int64 range"):
            down_convert(source, to_magic)
        with pytest.raises(CorruptRecordError, match="outside the int64 range"):
            LazyDownConvertRecords(source, to_magic)


def test_v2_record_offset_below_int64_min_and_timestamp_overflow():
    below = with_header(v2_batch_of(v2_record(-1), 1), ">q", 0, INT64_MIN)
    with pytest.raises(CorruptRecordError, match="record offset is outside the int64 range"):
        list(MemoryRecords(below).records())
    late = with_header(v2_batch_of(v2_record(timestamp_delta=1), 1), ">q", 27, INT64_MAX)   # base timestamp
    with pytest.raises(CorruptRecordError, match="invalid timestamp"):
        list(MemoryRecords(late).records())
    for source in (below, late):
        with pytest.raises(CorruptRecordError):
            down_convert(source, 1)


def v1_wrapper(wrapper_offset, inner_offsets, codec=codecs.GZIP):
    inner = _core.encode_legacy_entries(1, 0, [(o, 1, None, b"v%d" % o) for o in inner_offsets])
    return _core.encode_legacy_entries(1, codec, [(wrapper_offset, 1, None, codecs.compress(codec, inner, 1))])


@pytest.mark.parametrize("inner_offsets", [[-5, -1], [0, 7, 3]])
def test_v1_wrapper_whose_absolute_offsets_overflow_int64(inner_offsets):
    # [-5, -1]: the base (wrapper - last inner offset) is past INT64_MAX; [0, 7, 3]: an inner offset above
    # the last one lands past it. Both used to raise OverflowError from the conversions.
    prefix = v1_wrapper(0, [0, 1])
    source = prefix + v1_wrapper(INT64_MAX, inner_offsets)
    batches = list(MemoryRecords(source))
    with pytest.raises(CorruptRecordError, match="outside the int64 range") as raised:
        batches[1].records()
    assert raised.value.offset == len(prefix)
    with pytest.raises(CorruptRecordError, match="outside the int64 range") as raised:
        down_convert(source, 0)
    assert raised.value.offset == len(prefix)
    with pytest.raises(CorruptRecordError, match="outside the int64 range"):
        list(LazyDownConvertRecords(source[len(prefix):], 0).chunks())


def test_v1_wrapper_at_int64_max_with_ordinary_inner_offsets_is_read():
    source = v1_wrapper(INT64_MAX, [0, 1, 2])
    assert [r.offset for r in MemoryRecords(source).records()] == [INT64_MAX - 2, INT64_MAX - 1, INT64_MAX]
    assert [r.offset for r in down_convert(source, 0).records.records()] == [INT64_MAX - 2, INT64_MAX - 1,
                                                                             INT64_MAX]


def v2_record_of(value):
    """A v2 record with a null key and ``value``."""
    body = b"\0" + varint(0) + varint(0) + varint(-1) + varint(len(value)) + value + varint(0)
    return varint(len(body)) + body


@pytest.mark.parametrize("size", [63, 64, 100, 8191, 8192])
def test_a_value_length_of_one_two_or_three_varint_bytes_is_read(size):
    # zig-zag 63 is one byte, 64 and 8191 two (read at once), 8192 three
    value = bytes(range(256)) * (size // 256) + bytes(size % 256)
    (record,) = MemoryRecords(v2_batch_of(v2_record_of(value), 1)).records()
    assert record.value == value and record.key is None


def test_a_two_byte_varint_cut_after_its_first_byte_is_refused():
    record = v2_record_of(b"v" * 100)           # its length and its value's length are two-byte varints
    assert record[1] < 0x80 <= record[0]
    body = record[2:]
    value_length_at = 4                         # after attributes, timestamp and offset deltas, the null key
    assert body[value_length_at] >= 0x80 and body[value_length_at + 1] < 0x80
    cut_in_length = record[:1]                  # the section ends inside the record's length
    cut_in_value_length = varint(value_length_at + 1) + body[:value_length_at + 1]    # the record ends inside it
    # named at the varint's first byte: the section starts at byte 61 of the batch
    for section, at in ((cut_in_length, 61), (cut_in_value_length, 61 + 1 + value_length_at)):
        with pytest.raises(CorruptRecordError, match="ends before the lengths it declares") as raised:
            list(MemoryRecords(v2_batch_of(section, 1)).records())
        assert raised.value.offset == at
