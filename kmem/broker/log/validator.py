"""Checking a produce request's records and assigning their offsets, as Kafka's ``LogValidator`` and
``UnifiedLog.analyzeAndValidateRecords`` do, for a log whose message format is v2 (Kafka 3.x).

- Per batch, in order: a v2 batch from a client must have base offset 0 (INVALID_RECORD); a batch
  larger than ``max.message.bytes`` is MESSAGE_TOO_LARGE; a bad CRC or an unparsable batch is
  CORRUPT_MESSAGE; magic differing from the first batch's, an offset range that disagrees with the record
  count, a count of 0, a control batch or a negative sequence with a producer id from a client, a
  control batch whose marker key is not one (Kafka's ``ControlRecordType.parse``), and a compressed v2
  batch that is not alone are INVALID_RECORD. A truncated trailing batch is dropped, as
  Kafka trims it; input without any complete batch is INVALID_RECORD. More bytes than ``segment.bytes``
  is RECORD_LIST_TOO_LARGE.
- Per record, as Kafka's ``LogValidator.validateRecord``: on a compacted topic (``cleanup.policy`` holding
  ``compact``) a record without a key from a client is INVALID_RECORD; on a CreateTime topic (KIP-937) a
  record (not from replication) whose timestamp, unless -1, lies more than ``message.timestamp.before.max.ms``
  before the broker's time or more than ``message.timestamp.after.max.ms`` after it is INVALID_TIMESTAMP, as
  is a batch saying LogAppendTime on a LogAppendTime topic or without a time on a CreateTime one. The first
  batch holding such records is refused naming each by its index in the batch (KIP-467's ``record_errors``,
  Kafka's ``RecordValidationException``; at most ``MAX_RECORD_ERRORS``): INVALID_TIMESTAMP if any timestamp
  is among them, else INVALID_RECORD. v2 batches are scanned by the core in one pass; a CreateTime v2
  batch's max timestamp, kept as it came, must be within the bounds too.
- v2 batches are written as they came, each behind a rewritten 61-byte header: base offset, partition
  leader epoch and, on a ``LogAppendTime`` topic, the timestamp type bit, the broker's time as max
  timestamp and the CRC. The records after the header are never copied: they are written from the
  request's buffer (a view of it).
- The common case, v2 batches kept as they came (no LogAppendTime batch among them, no compressed control
  batch), is checked and given its offsets by one core call, ``_core.assign_v2_batches``, as Kafka's
  ``LogValidator`` does it in one pass; anything else, and records failing any check, are read one batch
  at a time as above, which names the error.
- v0/v1 message sets are up-converted to one v2 batch with the same codec, their records getting
  consecutive offsets (and the broker's time on a ``LogAppendTime`` topic; v0 records have none).
  The converted batch must fit ``max.message.bytes`` too.
- A topic whose ``compression.type`` is a codec (``uncompressed``, ``gzip``, ``snappy``, ``lz4``,
  ``zstd``) rather than ``producer`` gets client batches of another codec rebuilt as one batch of that
  codec, as Kafka's ``LogValidator`` recompresses: same records, timestamps and headers, the first
  batch's producer id, epoch, base sequence and transactional flag. Control batches stay as they are.

Rebuilding (recompressing or up-converting) streams: each batch's payload is decompressed a piece at a
time (``codecs.decompress_chunks``), its records are rewritten by the core a slice of
``REBUILD_SLICE_BYTES`` at a time (``_core.RecordsRewriter``: records are never made into objects) and
each slice is compressed as it comes (``codecs.compressor``). After every slice the output so far is
checked against ``max.message.bytes`` (MESSAGE_TOO_LARGE) and the decompressed bytes of a batch against
``codecs.MAX_DECOMPRESSED_BYTES`` (CORRUPT_MESSAGE, as is corrupt v0/v1 data); records that do not parse
are INVALID_RECORD. Nothing is written until the whole batch is built.

Memory of one rebuild, beyond the request's own bytes, stays below
``2.25 × max.message.bytes + H + 2 × R + REBUILD_OVERHEAD_BYTES``:

- ``2.25 × max.message.bytes``: the output so far (checked after every compressed slice, in a buffer
  reserving up to an eighth more), and a v0/v1 wrapper's compressed value (the batch fits
  ``max.message.bytes``);
- ``H``, the decompressed input held: the piece being rewritten and the next one (gzip:
  ``codecs.CHUNK_BYTES`` each; xerial snappy and Kafka's lz4 frame: a block each), or for zstd, raw
  snappy and lz4 frames of linked blocks, which come whole, the payload's buffer: under 4 × the payload
  (it grows 4x at a time) and at most ``MAX_DECOMPRESSED_BYTES + 1``;
- ``R``, the largest record, held while split between two pieces and once rewritten (at most
  ``MAX_DECOMPRESSED_BYTES``);
- ``REBUILD_OVERHEAD_BYTES``: the slices in flight (``REBUILD_SLICE_BYTES`` each), the codecs' state and
  the reserve of the buffer holding a split record.

A batch decompresses to at most ``MAX_DECOMPRESSED_BYTES``, so at worst (one record that large) the peak
is below ``2.25 × max.message.bytes + 3 × MAX_DECOMPRESSED_BYTES + REBUILD_OVERHEAD_BYTES``; a batch of
small records in gzip or lz4 costs about ``max.message.bytes`` plus a few MiB, however many it holds.
"""
import contextlib
import itertools
import struct
import time
from typing import NamedTuple

from kmem import _core
from kmem.broker.codes import ErrorCode, LogError, RecordValidationError
from kmem.broker.log.index import NO_TIMESTAMP
from kmem.errors import CorruptRecordError, DecompressionLimitError, InvalidArgumentError
from kmem.records import MemoryRecords, codecs
from kmem.records.arguments import byte_view
from kmem.records.batches import (ATTR_LOG_APPEND_TIME, ATTR_TRANSACTIONAL, INT32_MAX, INT64_MAX, INT64_MIN,
                                  NO_SEQUENCE, V2_HEADER, RecordBatch, TimestampType)

V2_HEADER_SIZE = V2_HEADER.size
CLIENT, REPLICATION, COORDINATOR = "client", "replication", "coordinator"
#: Records rewritten (and handed to the compressor) at a time while rebuilding a batch.
REBUILD_SLICE_BYTES = 256 << 10
#: Allowance for the slices, pieces and codec state of a rebuild (zstd's compressor takes a few MiB).
REBUILD_OVERHEAD_BYTES = 16 << 20
#: At most this many records of a refused batch are named (KIP-467's ``record_errors``, librdkafka's default
#: ``batch.num.messages``). Kafka names every one, but a batch may decompress to millions of records, and the
#: answer grows with them; the records past these fail unnamed, with the rest of the batch.
MAX_RECORD_ERRORS = 10_000


class BatchInfo(NamedTuple):
    """What producer-state bookkeeping needs of one written batch."""
    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    is_transactional: bool
    is_control: bool
    control_type: int | None = None
    coordinator_epoch: int = -1         # a transaction marker's


#: Records checked and given their offsets (the core's class: the common case makes it in the core).
ValidatedRecords = _core.ValidatedRecords


def _check_batch(batch, first, origin, max_message_bytes, batches_total, check_records):
    if batch.magic == 2 and origin == CLIENT and batch.base_offset != 0:
        raise LogError(ErrorCode.INVALID_RECORD,
                       f"the base offset of the record batch should be 0, but it is {batch.base_offset}")
    if batch.size_in_bytes > max_message_bytes:
        raise LogError(ErrorCode.MESSAGE_TOO_LARGE, f"the batch of {batch.size_in_bytes} bytes is larger than "
                                                    f"max.message.bytes = {max_message_bytes}")
    try:
        batch.ensure_valid()
        batch.last_offset           # base offset + lastOffsetDelta within int64 (any origin's batch is read so)
    except CorruptRecordError as e:
        raise LogError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    if batch.magic != first.magic:
        raise LogError(ErrorCode.INVALID_RECORD, f"batch magic {batch.magic} is not the same as the first batch's "
                                                 f"magic {first.magic}")
    if batch.magic == 2:
        if check_records:       # else rebuilding reads every record
            _check_records(batch)
        if batch.is_control_batch:
            _control_type(batch)
        if batch.is_compressed and batches_total > 1:
            raise LogError(ErrorCode.INVALID_RECORD, "compressed outer record has more than one batch")
        if origin == CLIENT:
            count, span = batch.records_count, batch.last_offset - batch.base_offset + 1
            if span <= 0:
                raise LogError(ErrorCode.INVALID_RECORD, f"batch has an invalid offset range "
                                                         f"[{batch.base_offset}, {batch.last_offset}]")
            if count <= 0:
                raise LogError(ErrorCode.INVALID_RECORD, f"invalid reported count for record batch: {count}")
            if span != count:
                raise LogError(ErrorCode.INVALID_RECORD, f"inconsistent batch offset range [{batch.base_offset}, "
                                                         f"{batch.last_offset}] and count of records {count}")
            if batch.is_control_batch:
                raise LogError(ErrorCode.INVALID_RECORD, "clients are not allowed to write control records")
            if batch.producer_id >= 0 and batch.base_sequence < 0:
                raise LogError(ErrorCode.INVALID_RECORD, f"invalid sequence number {batch.base_sequence} in record "
                                                         f"batch with producer id {batch.producer_id}")


def _control_type(batch):
    """A control batch's ``control_type``; a marker record that does not say one is INVALID_RECORD."""
    try:
        return batch.control_type
    except CorruptRecordError as e:
        raise LogError(ErrorCode.INVALID_RECORD, str(e)) from None


def _check_records(batch):
    """Every record of a v2 batch must parse, exactly filling the batch (Kafka iterates them too)."""
    body = batch.buffer[V2_HEADER_SIZE:]
    try:
        if batch.is_compressed:
            body = codecs.decompress(batch.compression, body, 2, codecs.MAX_DECOMPRESSED_BYTES, batch.position)
        _core.count_v2_objects(body, count=batch.records_count, base=batch.position + V2_HEADER_SIZE)
    except DecompressionLimitError as e:
        raise LogError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    except CorruptRecordError as e:
        raise LogError(ErrorCode.INVALID_RECORD, f"found invalid record structure: {e}") from None


def _check_record_contents(batches, compact, window, log_append_topic):
    """Kafka's ``LogValidator.validateRecord`` of each batch in turn: on a compacted topic every record needs a
    key (INVALID_RECORD); on a CreateTime topic every timestamp but -1 must lie within ``window``,
    ``(lowest, highest)`` (KIP-937, INVALID_TIMESTAMP; None: any); a batch may not say LogAppendTime where the
    broker does not set its time instead (INVALID_TIMESTAMP). The first batch holding such records raises
    ``RecordValidationError`` naming them (KIP-467)."""
    for batch in batches:
        compact_batch = compact and not batch.is_control_batch
        wrong_type = _wrong_timestamp_type(batch, log_append_topic)
        with _unreadable_as_log_error(batch):
            invalid = _invalid_records(batch, compact_batch, window, wrong_type)
            if not invalid and batch.magic == 2:
                _check_max_timestamp(batch, window)
        if invalid:
            _raise_record_errors(invalid, compact_batch, window, wrong_type)


@contextlib.contextmanager
def _unreadable_as_log_error(batch):
    """Records of ``batch`` that cannot be read as Kafka answers them: CORRUPT_MESSAGE past the decompression
    limit or in a v0/v1 entry, INVALID_RECORD for a v2 batch's record structure."""
    try:
        yield
    except DecompressionLimitError as e:
        raise LogError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    except CorruptRecordError as e:
        if batch.magic == 2:
            raise LogError(ErrorCode.INVALID_RECORD, f"found invalid record structure: {e}") from None
        raise LogError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None


def _wrong_timestamp_type(batch, log_append_topic):
    """Kafka's ``LogValidator.validateTimestamp``: a LogAppendTime batch (whose records all read with its
    max timestamp) sent to a LogAppendTime topic, or to a CreateTime topic without a time."""
    return batch.timestamp_type == TimestampType.LOG_APPEND_TIME and (log_append_topic
                                                                      or batch.max_timestamp == NO_TIMESTAMP)


def _outside(timestamp, low, high):
    return timestamp != NO_TIMESTAMP and not low <= timestamp <= high


def _check_max_timestamp(batch, window):
    """Kafka sets a CreateTime batch's max timestamp from its records; kept here as it came (it goes to the
    time index), it must be within ``window`` too (INVALID_TIMESTAMP)."""
    if window is not None and _outside(batch.max_timestamp, *window):
        raise LogError(ErrorCode.INVALID_TIMESTAMP, f"the max timestamp {batch.max_timestamp} of the batch is out of "
                                                    f"range: it should be within [{window[0]}, {window[1]}]")


def _invalid_records(batch, compact, window, wrong_type):
    """``[(index in the batch, offset, timestamp, has a key)]`` of the first ``MAX_RECORD_ERRORS`` records of
    ``batch`` that ``_check_record_contents`` refuses (every one when ``wrong_type``): found by the core in a v2
    batch; read one by one in a v0/v1 entry, or in a batch whose records' time is refused."""
    if not (compact or window or wrong_type):
        return []
    low, high = window or (INT64_MIN, INT64_MAX)
    log_append = batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    if batch.magic == 2 and not wrong_type and not (log_append and _outside(batch.max_timestamp, low, high)):
        if log_append:                  # its records read with its max timestamp, which is taken
            low, high = INT64_MIN, INT64_MAX
        body = batch.buffer[V2_HEADER_SIZE:]
        if batch.is_compressed:
            body = codecs.decompress(batch.compression, body, 2, codecs.MAX_DECOMPRESSED_BYTES, batch.position)
        return [(index, batch.base_offset + delta, timestamp, has_key) for index, delta, timestamp, has_key
                in _core.invalid_records(body, count=batch.records_count, keyless=compact, limit=MAX_RECORD_ERRORS,
                                         base_timestamp=batch.base_timestamp, low=low, high=high)]
    refused = ((index, record.offset, record.timestamp, record.key is not None) for index, record in enumerate(batch)
               if compact and record.key is None or wrong_type or _outside(record.timestamp, low, high))
    return list(itertools.islice(refused, MAX_RECORD_ERRORS))


def _raise_record_errors(invalid, compact, window, wrong_type):
    """Kafka's ``processRecordErrors`` for the records ``_invalid_records`` found (a keyless one named for its
    key, as Kafka checks that first): INVALID_TIMESTAMP when a timestamp is among them, else INVALID_RECORD,
    each record's message and the summary worded as Kafka's."""
    record_errors, untimely = [], False
    for index, offset, timestamp, has_key in invalid:
        if compact and not has_key:
            record_errors.append((index, "Compacted topic cannot accept message without key"))
        elif wrong_type:
            untimely = True
            record_errors.append((index, f"Invalid timestamp type in message with offset {offset}. Producer should "
                                         f"not set timestamp type to LogAppendTime."))
        else:
            untimely = True
            record_errors.append((index, f"Timestamp {timestamp} of message with offset {offset} is out of range. "
                                         f"The timestamp should be within [{window[0]}, {window[1]}]"))
    record_errors = tuple(record_errors)
    if untimely:
        raise RecordValidationError(ErrorCode.INVALID_TIMESTAMP,
                                    "One or more records have been rejected due to invalid timestamp", record_errors)
    shown = ", ".join(f"RecordError(batchIndex={index}, message='{message}')" for index, message in record_errors[:3])
    raise RecordValidationError(ErrorCode.INVALID_RECORD,
                                f"One or more records have been rejected due to {len(record_errors)} record errors "
                                f"in total, and only showing the first three errors at most: [{shown}]", record_errors)


def validate_and_assign(records, *, next_offset, config, leader_epoch, origin=CLIENT, now_ms=None):
    """Validate ``records`` (a bytes-like object or ``MemoryRecords``) for an append at ``next_offset``
    to a log with ``config`` (a ``LogConfig``); returns ``ValidatedRecords`` or raises ``LogError``."""
    if origin not in (CLIENT, REPLICATION, COORDINATOR):
        raise InvalidArgumentError(f"origin must be {CLIENT!r}, {REPLICATION!r} or {COORDINATOR!r}: {origin!r}")
    view = records.buffer if isinstance(records, MemoryRecords) else byte_view("records", records)
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return (_assign_common_case(view, next_offset, config, leader_epoch, origin, now)
            or validate_each_batch(view, next_offset, config, leader_epoch, origin, now))


def _assign_common_case(view, next_offset, config, leader_epoch, origin, now):
    """``ValidatedRecords`` of v2 batches kept as they came, checked and given offsets by one core call
    (``_core.assign_common_case``), as ``validate_each_batch`` would make them; None for anything it leaves
    to ``validate_each_batch``: other records, and any that fail a check (it names the error)."""
    found = _core.assign_common_case(view, next_offset, config, leader_epoch, origin, now, BatchInfo)
    return None if found is None else finish_common_case(view, found)


def finish_common_case(view, found):
    """The ``ValidatedRecords`` of what ``_core.assign_common_case`` found in ``view``, a compressed batch's records
    checked (its codec is Python's)."""
    validated, compressed = found
    if compressed:          # alone
        _check_records(RecordBatch(view, 0, validated.size, 2))
    return validated


def validate_each_batch(view, next_offset, config, leader_epoch, origin, now):
    """``validate_and_assign`` reading the batches one by one: every case, every error named."""
    try:
        batches = list(MemoryRecords(view).batches())
    except CorruptRecordError as e:
        raise LogError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    if not batches:
        raise LogError(ErrorCode.INVALID_RECORD, "the records hold no complete record batch")
    valid_bytes = batches[-1].position + batches[-1].size_in_bytes
    if valid_bytes > config.segment_bytes:
        raise LogError(ErrorCode.RECORD_LIST_TOO_LARGE, f"{valid_bytes} bytes of records are more than "
                                                        f"segment.bytes = {config.segment_bytes}")
    target = config.target_codec
    first = batches[0]
    in_place = first.magic == 2 and (target is None or origin == REPLICATION or first.is_control_batch
                                     or all(batch.compression == target for batch in batches))
    for batch in batches:
        _check_batch(batch, first, origin, config.max_message_bytes, len(batches), in_place)
    if origin != REPLICATION:
        _check_record_contents(batches, config.compact and origin == CLIENT, _core.timestamp_window(config, now),
                               config.log_append_time)
    log_append_time = now if config.log_append_time else -1
    if in_place:
        return _assign_in_place(batches, next_offset, leader_epoch, log_append_time)
    if target is None and not isinstance(first.compression, codecs.CompressionType):
        raise LogError(ErrorCode.CORRUPT_MESSAGE, f"unknown compression codec {first.compression}")
    return _rebuild(batches, first.compression if target is None else target, next_offset, leader_epoch,
                    log_append_time, config.max_message_bytes)


def _assign_in_place(batches, next_offset, leader_epoch, log_append_time):
    pieces, infos = [], []
    max_timestamp, offset_of_max = -1, -1
    first_offset = next_offset
    for batch in batches:
        header = bytearray(batch.buffer[:V2_HEADER_SIZE])
        last_delta = batch.last_offset - batch.base_offset
        base = next_offset
        struct.pack_into(">q", header, 0, base)
        struct.pack_into(">i", header, 12, leader_epoch)
        batch_max = batch.max_timestamp
        if log_append_time >= 0:
            attributes = struct.unpack_from(">h", header, 21)[0] | ATTR_LOG_APPEND_TIME
            struct.pack_into(">h", header, 21, attributes)
            struct.pack_into(">q", header, 35, log_append_time)
            batch_max = log_append_time
            body = batch.buffer[V2_HEADER_SIZE:]
            struct.pack_into(">I", header, 17, _core.crc32c(body, _core.crc32c(memoryview(header)[21:])))
        pieces.append(header)
        pieces.append(batch.buffer[V2_HEADER_SIZE:])
        next_offset = base + last_delta + 1
        if batch_max > max_timestamp:
            max_timestamp, offset_of_max = batch_max, next_offset - 1
        infos.append(BatchInfo(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                               batch.sequence_of(batch.last_offset), base, next_offset - 1, batch_max,
                               batch.is_transactional, batch.is_control_batch,
                               batch.control_type if batch.is_control_batch else None,
                               batch.coordinator_epoch if batch.is_control_batch else -1))
    return ValidatedRecords(pieces, infos, first_offset, next_offset - 1, max_timestamp, offset_of_max,
                            log_append_time)


def _rebuild(batches, codec, next_offset, leader_epoch, log_append_time, max_message_bytes):
    """One v2 batch of ``codec`` holding every record of ``batches``: magic 0/1 up-converted, or v2
    batches recompressed (keeping the first one's producer fields); built as the module docstring says."""
    rewriter = _core.RecordsRewriter(REBUILD_SLICE_BYTES)
    compressor = codecs.compressor(codec)
    payload = bytearray()

    def add(compressed):
        payload.extend(compressed)
        if V2_HEADER_SIZE + len(payload) > max_message_bytes:
            raise LogError(ErrorCode.MESSAGE_TOO_LARGE, f"the rebuilt batch is larger than max.message.bytes = "
                                                        f"{max_message_bytes} ({rewriter.records} records in)")

    def add_slice(records):
        view = memoryview(records)
        for i in range(0, len(view), REBUILD_SLICE_BYTES):     # a record larger than a slice, in slices
            add(compressor.compress(view[i:i + REBUILD_SLICE_BYTES]))

    for batch in batches:
        with _unreadable_as_log_error(batch):
            _rewrite_batch(batch, rewriter, add_slice)
    add(compressor.flush())
    return _rebuilt_batch(batches[0], codec, rewriter, payload, next_offset, leader_epoch, log_append_time)


def _rewrite_batch(batch, rewriter, add_slice):
    """Rewrite ``batch``'s records through ``rewriter``, decompressing its payload a piece at a time."""
    if batch.magic == 2:
        rewriter.start_v2(count=batch.records_count, base_timestamp=batch.base_timestamp,
                          log_append=bool(batch.attributes & ATTR_LOG_APPEND_TIME),
                          log_append_time=batch.max_timestamp)
        body = batch.buffer[V2_HEADER_SIZE:]
        if not batch.is_compressed:
            _rewrite_pieces(rewriter, [body], add_slice, batch.position + V2_HEADER_SIZE)
            return
        pieces = codecs.decompress_chunks(batch.compression, body, 2, codecs.MAX_DECOMPRESSED_BYTES, batch.position)
        _rewrite_pieces(rewriter, pieces, add_slice, batch.position)
        return
    if not batch.is_compressed:      # one v0/v1 message, with its own timestamp
        rewriter.start_legacy(log_append=False, log_append_time=-1)
        _rewrite_pieces(rewriter, [batch.buffer], add_slice, batch.position)
        return
    ((_, _, _, _, _, _, value),) = _core.decode_legacy_entries(batch.buffer, base=batch.position)
    if value is None:
        raise CorruptRecordError("compressed legacy entry without a value", batch.position)
    rewriter.start_legacy(log_append=bool(batch.attributes & ATTR_LOG_APPEND_TIME),
                          log_append_time=batch.max_timestamp)
    pieces = codecs.decompress_chunks(batch.compression, value, batch.magic, codecs.MAX_DECOMPRESSED_BYTES,
                                      batch.position)
    _rewrite_pieces(rewriter, pieces, add_slice, batch.position)
    if not rewriter.section_records:
        raise CorruptRecordError("compressed legacy entry with no inner messages", batch.position)


def _rewrite_pieces(rewriter, pieces, add_slice, base):
    """Rewrite the section ``pieces`` join to, holding back only a record split between two pieces;
    ``base`` is the section's position, for errors."""
    pending = bytearray()       # the section's bytes from ``base`` on that are not rewritten yet
    pieces = iter(pieces)
    piece = next(pieces, None)
    while piece is not None:
        following = next(pieces, None)      # None: the last piece is final (not copied when it is whole)
        if pending:
            pending += piece
            data = pending
        else:
            data = memoryview(piece)
        used = _rewrite_slices(rewriter, data, following is None, add_slice, base)
        base += used
        if data is pending:
            del pending[:used]
        else:
            pending = bytearray(data[used:])
        piece = following
    _rewrite_slices(rewriter, pending, True, add_slice, base)      # no pieces at all: the count is checked


def _rewrite_slices(rewriter, data, final, add_slice, base):
    """Rewrite the records of ``data`` a slice at a time; returns the bytes used (records split at its end
    are left unless ``final``)."""
    pos = 0
    while True:
        pos, read, records = rewriter.rewrite(data, pos, final=final, base=base)
        if records:
            add_slice(records)
        if not read:
            return pos


def _rebuilt_batch(first, codec, rewriter, payload, next_offset, leader_epoch, log_append_time):
    """The ``ValidatedRecords`` of the batch ``rewriter`` wrote and ``payload`` holds (compressed)."""
    count = rewriter.records
    if not count:
        raise LogError(ErrorCode.INVALID_RECORD, "the records hold no record")
    producer_id, producer_epoch, base_sequence, transactional = -1, -1, NO_SEQUENCE, False
    if first.magic == 2 and first.producer_id >= 0:
        producer_id, producer_epoch, base_sequence = first.producer_id, first.producer_epoch, first.base_sequence
        transactional = first.is_transactional
    attributes = codec | (ATTR_LOG_APPEND_TIME if log_append_time >= 0 else 0) \
        | (ATTR_TRANSACTIONAL if transactional else 0)
    max_timestamp = log_append_time if log_append_time >= 0 else rewriter.max_timestamp
    header = bytearray(V2_HEADER.pack(next_offset, V2_HEADER_SIZE - 12 + len(payload), leader_epoch, 2, 0, attributes,
                                      count - 1, rewriter.first_timestamp, max_timestamp, producer_id, producer_epoch,
                                      base_sequence, count))
    struct.pack_into(">I", header, 17, _core.crc32c(payload, _core.crc32c(memoryview(header)[21:])))
    last_offset = next_offset + count - 1
    last_sequence = NO_SEQUENCE if base_sequence == NO_SEQUENCE else (base_sequence + count - 1) % (INT32_MAX + 1)
    info = BatchInfo(producer_id, producer_epoch, base_sequence, last_sequence, next_offset, last_offset,
                     max_timestamp, transactional, False)
    return ValidatedRecords([header, payload], [info], next_offset, last_offset, max_timestamp,
                            last_offset if max_timestamp >= 0 else -1, log_append_time)
