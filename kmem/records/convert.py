"""Eager down-conversion of record data to magic 0 or 1, following Kafka's RecordsUtil.downConvert.

Per source batch, in order (SPEC.md §5):

1. target < 2: control batches are skipped; a zstd batch raises ``UnsupportedCompressionTypeError``.
2. A batch at or below the target magic is copied byte for byte.
3. Otherwise records are kept when the batch is compressed or ``offset >= first_offset`` (trimming only
   uncompressed batches); a batch left empty is dropped.
4. Kept records are rewritten with the same codec and timestamp type and their exact offsets (gaps
   kept): one entry per record when uncompressed, one wrapper per source batch when compressed.

Runs of batches that need no codec are converted by one call into the compiled core, which measures the
exact output, allocates it once and writes it with the GIL released; compressed batches are decompressed
(bounded), converted by the core, and recompressed here.
"""
import time
from dataclasses import dataclass

from kmem import _core
from kmem.errors import CorruptRecordError, UnsupportedCompressionTypeError
from kmem.records import codecs
from kmem.records.arguments import byte_view, check_bool, check_choice, check_limit, check_long
from kmem.records.batches import ATTR_LOG_APPEND_TIME, LOG_OVERHEAD, V2_HEADER, MemoryRecords, legacy_absolute_base

ZSTD_DOWN_CONVERSION = "Down-conversion of zstandard-compressed batches is not supported"
LEGACY_OVERHEAD = (14, 22)     # bytes of a v0/v1 message after the log overhead, key and value excluded


@dataclass
class RecordConversionStats:
    """Kafka's RecordConversionStats: memory used while converting (source batches kept plus the
    uncompressed bytes written), records rewritten, and time taken."""
    temporary_memory_bytes: int = 0
    num_records_converted: int = 0
    conversion_time_nanos: int = 0

    def add(self, other):
        self.temporary_memory_bytes += other.temporary_memory_bytes
        self.num_records_converted += other.num_records_converted
        self.conversion_time_nanos += other.conversion_time_nanos


@dataclass(frozen=True)
class ConvertedRecords:
    records: MemoryRecords
    stats: RecordConversionStats


def source_view(records):
    """The bytes behind ``records``: MemoryRecords, FileRecords (read whole) or any bytes-like object."""
    if isinstance(records, MemoryRecords):
        return records.buffer
    if hasattr(records, "read_all"):
        return records.read_all().buffer
    return byte_view("records", records)


def down_convert(records, to_magic, first_offset=0, *, verify_crc=False,
                 max_decompressed_bytes=codecs.MAX_DECOMPRESSED_BYTES):
    """Convert ``records`` (MemoryRecords, FileRecords or bytes-like) for a client reading ``to_magic``.

    Returns ``ConvertedRecords(records, stats)``. ``first_offset`` is the fetch offset: records of
    uncompressed batches below it are dropped. ``verify_crc`` checks every batch's CRC first. A truncated
    trailing batch is ignored; corrupt data raises ``CorruptRecordError`` naming its byte position.
    A compressed batch is refused the same way when its payload exceeds ``max_decompressed_bytes`` or
    its converted records could (up to 27 more bytes per record), so one batch costs at most twice that.
    """
    started = time.perf_counter_ns()
    check_choice("to_magic", to_magic, (0, 1, 2))
    check_long("first_offset", first_offset)
    check_bool("verify_crc", verify_crc)
    check_limit("max_decompressed_bytes", max_decompressed_bytes)
    view = source_view(records)
    if verify_crc:
        MemoryRecords(view).ensure_valid()
    pieces, stats = [], RecordConversionStats()
    pos = 0
    while True:
        out, pos, reason, count, kept, uncompressed = _core.run_down_conversion(view, pos, to_magic, first_offset)
        if out:
            pieces.append(out)
        stats.num_records_converted += count
        stats.temporary_memory_bytes += kept + uncompressed
        if reason == _core.RUN_END:
            break
        if reason == _core.RUN_ZSTD:
            raise UnsupportedCompressionTypeError(ZSTD_DOWN_CONVERSION)
        size, magic = _core.entry_at(view, pos)
        converted = convert_compressed_batch(view, pos, size, magic, to_magic, max_decompressed_bytes)
        if converted is not None:
            out, count, uncompressed = converted
            pieces.append(out)
            stats.num_records_converted += count
            stats.temporary_memory_bytes += size + uncompressed
        pos += size
    stats.conversion_time_nanos = time.perf_counter_ns() - started
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return ConvertedRecords(MemoryRecords(data), stats)


def convert_compressed_batch(view, pos, size, magic, to_magic, limit):
    """One compressed batch above ``to_magic`` rewritten as a single ``to_magic`` wrapper.

    Returns ``(bytes, records, uncompressed bytes written)``, or None when it holds no record.
    """
    if magic == 2:
        (base_offset, _, _, _, _, attributes, _, base_timestamp, max_timestamp, _, _, _,
         count) = V2_HEADER.unpack_from(view, pos)
        codec = attributes & 0x07
        log_append = bool(attributes & ATTR_LOG_APPEND_TIME)
        payload = codecs.decompress(codec, view[pos + V2_HEADER.size:pos + size], 2, limit, pos)
        # A 7-byte record becomes a 34-byte entry: the converted form is bounded like the payload.
        if _core.conversion_bound(len(payload), count) > limit:
            raise CorruptRecordError(f"down-converted data could exceed the limit of {limit} bytes", pos)
        entries, n, last, max_written = _core.convert_records(
            payload, 2, count, base_offset, base_timestamp, log_append, max_timestamp, to_magic, to_magic == 1, pos)
    else:
        # A v1 wrapper converted to v0: inner offsets become absolute (SPEC.md §4).
        ((wrapper_offset, _, _, attributes, _, _, value),) = _core.decode_legacy_entries(view[pos:pos + size], pos)
        codec = attributes & 0x07
        log_append = False      # v0 has no timestamp type
        payload = codecs.decompress(codec, value or b"", magic, limit, pos)
        base = legacy_absolute_base(wrapper_offset, _core.scan_legacy_entries(payload, pos), pos)
        entries, n, last, max_written = _core.convert_records(payload, 1, 0, base, -1, False, -1, 0, False, pos)
    if n == 0:
        return None
    wrapper_attributes = codec
    if to_magic == 1 and log_append:
        wrapper_attributes |= ATTR_LOG_APPEND_TIME
    timestamp = max_timestamp if log_append else max_written
    wrapper = _core.encode_legacy_entries(to_magic, wrapper_attributes, [
        (last, timestamp, None, codecs.compress(codec, entries, to_magic))])
    return wrapper, n, len(entries) + LOG_OVERHEAD + LEGACY_OVERHEAD[to_magic]
