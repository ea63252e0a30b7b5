"""Eager down-conversion of record data to magic 0 or 1, following Kafka's RecordsUtil.downConvert.

Per source batch, in order:

1. target < 2: control batches are skipped; a zstd batch raises ``UnsupportedCompressionTypeError``.
2. A batch at or below the target magic is copied byte for byte.
3. Otherwise records are kept when the batch is compressed or ``offset >= first_offset`` (trimming only
   uncompressed batches); a batch left empty is dropped.
4. Kept records are rewritten with the same codec and timestamp type and their exact offsets (gaps
   kept): one entry per record when uncompressed, one wrapper per source batch when compressed.

Runs of batches that need no codec are converted by one call into the compiled core, which measures the
exact output, allocates it once and writes it with the GIL released. The rules above are decided here
and handed to the core as a table (``ACTION_TABLES``); the core stops its run at each batch the table
says to stop at, and this module converts it: compressed batches are decompressed (bounded), converted
by the core, and recompressed here; gzip batches on a few threads (``workers``: libdeflate and zlib-ng
release the GIL), whose results are taken in input order, so the output is the same as one batch at a
time. zstd is refused.
"""
import time
from dataclasses import dataclass

from kmem import _core
from kmem.errors import CorruptRecordError, InvalidArgumentError, UnsupportedCompressionTypeError
from kmem.records import codecs, workers
from kmem.records.arguments import byte_view, check_bool, check_choice, check_limit, check_long
from kmem.records.batches import (ATTR_LOG_APPEND_TIME, LOG_OVERHEAD, V2_HEADER, MemoryRecords, RecordBatch,
                                  TimestampType, legacy_absolute_base)

ZSTD_DOWN_CONVERSION = "Down-conversion of zstandard-compressed batches is not supported"
LEGACY_OVERHEAD = (14, 22)     # bytes of a v0/v1 message after the log overhead, key and value excluded
#: Compressed batches go to a thread in groups of about this many bytes: larger groups cost less CPU in
#: hand-offs (snappy's per-block Python loop contends for the GIL), smaller ones split a lazy send's
#: 128 KiB chunk between two threads.
JOB_BYTES = 64 << 10


def entry_action(magic, codec, control, to_magic):
    """What the core's run does with a batch: the rules 1-3 above, for batches that need no codec."""
    if to_magic < 2 and magic == 2 and control:
        return "skip"
    if to_magic < 2 and magic == 2 and codec == codecs.ZSTD:
        return "stop"           # refused by down_convert
    if magic <= to_magic:
        return "copy"
    return "stop" if codec != codecs.NONE else "convert"     # a codec is needed: converted here


def entry_actions(to_magic):
    """``entry_action`` of every (magic, codec bits, control flag), laid out as the core reads it."""
    return bytes(_core.ENTRY_ACTIONS[entry_action(magic, codec, control, to_magic)]
                 for magic in range(3) for codec in range(8) for control in (False, True))


ACTION_TABLES = {to_magic: entry_actions(to_magic) for to_magic in (0, 1, 2)}


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


def _output_view(out):
    """``out`` as a flat writable unsigned-byte memoryview, or InvalidArgumentError."""
    try:
        view = memoryview(out)
    except TypeError:
        raise InvalidArgumentError(f"out must be a writable bytes-like object, not {type(out).__name__}") from None
    if view.readonly or not view.c_contiguous:
        raise InvalidArgumentError("out must be a writable contiguous buffer (a bytearray, a pooled buffer)")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _too_small(out, needed):
    return InvalidArgumentError(f"out holds {len(out)} bytes; the converted records need up to {needed}")


def down_convert(records, to_magic, first_offset=0, *, verify_crc=False,
                 max_decompressed_bytes=codecs.MAX_DECOMPRESSED_BYTES, gzip_level=codecs.GZIP_DEFAULT_LEVEL,
                 out=None):
    """Convert ``records`` (MemoryRecords, FileRecords or bytes-like) for a client reading ``to_magic``.

    Returns ``ConvertedRecords(records, stats)``. ``first_offset`` is the fetch offset: records of
    uncompressed batches below it are dropped. ``verify_crc`` checks every batch's CRC first. A truncated
    trailing batch is ignored; corrupt data raises ``CorruptRecordError`` naming its byte position.
    A compressed batch is refused the same way when its payload exceeds ``max_decompressed_bytes`` or
    its converted records could (up to 27 more bytes per record), so one batch costs at most twice that.
    Converted gzip batches are recompressed at ``gzip_level`` (KIP-390's ``compression.gzip.level``).
    gzip batches convert on up to ``workers.THREADS`` threads of the call's own (at most that many plus
    one groups of them given at a time), in the same order and to the same bytes as one by one.

    ``out``: a writable buffer (e.g. from a ``BufferPool``) to write the converted records into instead
    of a new bytearray; the result's records are then a view of its start. It must hold the uncompressed
    runs' bound (their v1/v0 size, up to 27 bytes per record more than written), else
    ``InvalidArgumentError`` says how many bytes are needed.
    """
    started = time.perf_counter_ns()
    check_choice("to_magic", to_magic, (0, 1, 2))
    check_long("first_offset", first_offset)
    check_bool("verify_crc", verify_crc)
    check_limit("max_decompressed_bytes", max_decompressed_bytes)
    check_choice("gzip_level", gzip_level, codecs.GZIP_LEVELS)
    output = _Output(None if out is None else _output_view(out))
    view = source_view(records)
    if verify_crc:
        MemoryRecords(view).ensure_valid()
    actions = ACTION_TABLES[to_magic]
    with workers.OrderedJobs(output.add_batches) as jobs:
        _convert_all(view, actions, to_magic, first_offset, max_decompressed_bytes, gzip_level, output, jobs)
    output.stats.conversion_time_nanos = time.perf_counter_ns() - started
    return ConvertedRecords(output.records(), output.stats)


def _convert_all(view, actions, to_magic, first_offset, limit, gzip_level, output, jobs):
    """Runs of batches needing no codec through the core; groups of the others to ``jobs``."""
    group, group_bytes, pos = [], 0, 0

    def give_group():
        nonlocal group, group_bytes
        batches, group, group_bytes = group, [], 0
        jobs.give(convert_compressed_batches, batches, to_magic, limit, gzip_level,
                  threaded=any(batch.compression == codecs.GZIP for batch in batches))

    try:
        while True:
            # A run's output goes after the batches still converting: while any is, it may only be empty.
            in_flight = bool(group) or jobs.pending
            run = _core.run_down_conversion(view, pos, actions=actions, to_magic=to_magic, first_offset=first_offset,
                                            out=output.room(in_flight))
            if in_flight and (run.output is None or run.output):
                if group:
                    give_group()
                jobs.finish()
                if run.output is None:      # it wrote nothing: again, with room
                    continue
            output.add_run(run)
            pos = run.stop
            entry = _core.entry_at(view, pos)
            if entry is None:       # the end, or a truncated trailing batch
                break
            batch = RecordBatch(view, pos, *entry)
            if batch.magic == 2 and batch.compression == codecs.ZSTD:
                raise UnsupportedCompressionTypeError(ZSTD_DOWN_CONVERSION)
            group.append(batch)
            group_bytes += batch.size_in_bytes
            if group_bytes >= JOB_BYTES:
                give_group()
            pos += batch.size_in_bytes
        if group:
            give_group()
        jobs.finish()
    except BaseException:
        # Batches before the error come first, as one at a time: their own error, if any, is raised.
        jobs.settle()
        convert_compressed_batches(group, to_magic, limit, gzip_level)
        raise


class _Output:
    """Where ``down_convert`` puts converted records, in input order: pieces joined at the end, or the
    caller's buffer; and the stats of what was converted."""

    def __init__(self, target):
        self.target, self.pieces, self.written = target, [], 0
        self.stats = RecordConversionStats()

    def room(self, in_flight):
        """The ``out`` for the core's next run: None (it allocates), or the buffer's free part, or none of
        it while batches before the run are converting (their sizes are not known yet)."""
        if self.target is None:
            return None
        return self.target[:0] if in_flight else self.target[self.written:]

    def add_run(self, run):
        if self.target is not None:
            if run.output is None:
                raise _too_small(self.target, self.written + run.written_bytes)
            self.written += run.output
        elif run.output:
            self.pieces.append(run.output)
        self.stats.num_records_converted += run.records
        self.stats.temporary_memory_bytes += run.source_bytes + run.written_bytes

    def add_batches(self, converted_batches):
        for batch, converted in converted_batches:
            if converted is None:
                continue
            converted_bytes, count, uncompressed = converted
            if self.target is None:
                self.pieces.append(converted_bytes)
            elif self.written + len(converted_bytes) > len(self.target):
                raise _too_small(self.target, self.written + len(converted_bytes))
            else:
                self.target[self.written:self.written + len(converted_bytes)] = converted_bytes
                self.written += len(converted_bytes)
            self.stats.num_records_converted += count
            self.stats.temporary_memory_bytes += batch.size_in_bytes + uncompressed

    def records(self):
        if self.target is not None:
            return MemoryRecords(self.target[:self.written])
        return MemoryRecords(self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces))


def convert_compressed_batches(batches, to_magic, limit, gzip_level):
    """``(batch, convert_compressed_batch(batch, ...))`` for each of ``batches``: one job for a thread."""
    return [(batch, convert_compressed_batch(batch, to_magic, limit, gzip_level)) for batch in batches]


def convert_compressed_batch(batch, to_magic, limit, gzip_level):
    """One compressed ``batch`` above ``to_magic`` rewritten as a single ``to_magic`` wrapper.

    Returns ``(bytes, records, uncompressed bytes written)``, or None when it holds no record.
    """
    pos, codec = batch.position, batch.compression
    log_append_batch = batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    log_append = to_magic == 1 and log_append_batch      # v1 keeps the timestamp type
    if batch.magic == 2:
        payload = codecs.decompress(codec, batch.buffer[V2_HEADER.size:], 2, limit, pos)
        # A 7-byte record becomes a 34-byte entry: the converted form is bounded like the payload.
        if _core.conversion_bound(len(payload), batch.records_count) > limit:
            raise CorruptRecordError(f"down-converted data could exceed the limit of {limit} bytes", pos)
        converted = _core.convert_v2_section(
            payload, count=batch.records_count, base_offset=batch.base_offset, base_timestamp=batch.base_timestamp,
            log_append=log_append_batch,
            log_append_time=batch.max_timestamp, to_magic=to_magic, relative=to_magic == 1, base=pos)
    else:
        # A v1 wrapper converted to v0: inner offsets become absolute (Kafka's AbstractLegacyRecordBatch).
        ((wrapper_offset, _, _, _, _, _, value),) = _core.decode_legacy_entries(batch.buffer, base=pos)
        payload = codecs.decompress(codec, value or b"", batch.magic, limit, pos)
        base = legacy_absolute_base(wrapper_offset, _core.scan_legacy_entries(payload, base=pos), pos)
        converted = _core.convert_legacy_section(payload, absolute_base=base, to_magic=0, base=pos)
    if converted.records == 0:
        return None
    wrapper_attributes = codec | (ATTR_LOG_APPEND_TIME if log_append else 0)
    timestamp = batch.max_timestamp if log_append else converted.max_timestamp
    wrapper = _core.encode_legacy_entries(to_magic, wrapper_attributes, [
        (converted.last_offset, timestamp, None, codecs.compress(codec, converted.entries, to_magic, gzip_level))])
    return wrapper, converted.records, len(converted.entries) + LOG_OVERHEAD + LEGACY_OVERHEAD[to_magic]
