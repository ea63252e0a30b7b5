"""Checking a produce request's records and assigning their offsets, as Kafka's ``LogValidator`` and
``UnifiedLog.analyzeAndValidateRecords`` do, for a log whose message format is v2 (Kafka 3.x).

- Per batch, in order: a v2 batch from a client must have base offset 0 (INVALID_RECORD); a batch
  larger than ``max.message.bytes`` is MESSAGE_TOO_LARGE; a bad CRC or an unparsable batch is
  CORRUPT_MESSAGE; magic differing from the first batch's, an offset range that disagrees with the record
  count, a count of 0, a control batch or a negative sequence with a producer id from a client, and a
  compressed v2 batch that is not alone are INVALID_RECORD. A truncated trailing batch is dropped, as
  Kafka trims it; input without any complete batch is INVALID_RECORD. More bytes than ``segment.bytes``
  is RECORD_LIST_TOO_LARGE.
- v2 batches are written as they came, each behind a rewritten 61-byte header: base offset, partition
  leader epoch and, on a ``LogAppendTime`` topic, the timestamp type bit, the broker's time as max
  timestamp and the CRC. The records after the header are never copied: they are written from the
  request's buffer (a view of it).
- v0/v1 message sets are up-converted to one v2 batch with the same codec, their records getting
  consecutive offsets (and the broker's time on a ``LogAppendTime`` topic; v0 records have none).
  The converted batch must fit ``max.message.bytes`` too.
- A topic whose ``compression.type`` is a codec (``uncompressed``, ``gzip``, ``snappy``, ``lz4``,
  ``zstd``) rather than ``producer`` gets client batches of another codec rebuilt as one batch of that
  codec, as Kafka's ``LogValidator`` recompresses: same records, timestamps and headers, the first
  batch's producer id, epoch, base sequence and transactional flag. Control batches stay as they are.
"""
import struct
import time
from dataclasses import dataclass, field

from kmem import _core
from kmem.broker.codes import ErrorCode, LogError
from kmem.errors import CorruptRecordError, InvalidArgumentError
from kmem.records import MemoryRecords, RecordsBuilder, TimestampType, codecs
from kmem.records.arguments import byte_view
from kmem.records.batches import ATTR_LOG_APPEND_TIME, V2_HEADER

V2_HEADER_SIZE = V2_HEADER.size
CLIENT, REPLICATION, COORDINATOR = "client", "replication", "coordinator"


@dataclass
class BatchInfo:
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


@dataclass
class ValidatedRecords:
    pieces: list                       # bytes-like views to write in order
    batches: list                      # BatchInfo per written batch
    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time: int               # -1 on a CreateTime topic
    size: int = field(init=False)

    def __post_init__(self):
        self.size = sum(len(p) for p in self.pieces)


def _check_batch(batch, first, origin, max_message_bytes, batches_total):
    if batch.magic == 2 and origin == CLIENT and batch.base_offset != 0:
        raise LogError(ErrorCode.INVALID_RECORD,
                       f"the base offset of the record batch should be 0, but it is {batch.base_offset}")
    if batch.size_in_bytes > max_message_bytes:
        raise LogError(ErrorCode.MESSAGE_TOO_LARGE, f"the batch of {batch.size_in_bytes} bytes is larger than "
                                                    f"max.message.bytes = {max_message_bytes}")
    try:
        batch.ensure_valid()
    except CorruptRecordError as e:
        raise LogError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    if batch.magic != first.magic:
        raise LogError(ErrorCode.INVALID_RECORD, f"batch magic {batch.magic} is not the same as the first batch's "
                                                 f"magic {first.magic}")
    if batch.magic == 2:
        _check_records(batch)
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


def _check_records(batch):
    """Every record of a v2 batch must parse, exactly filling the batch (Kafka iterates them too)."""
    body = batch.buffer[V2_HEADER_SIZE:]
    try:
        if batch.is_compressed:
            body = codecs.decompress(batch.compression, body, 2, codecs.MAX_DECOMPRESSED_BYTES, batch.position)
        _core.count_v2_objects(body, count=batch.records_count, base=batch.position + V2_HEADER_SIZE)
    except CorruptRecordError as e:
        raise LogError(ErrorCode.INVALID_RECORD, f"found invalid record structure: {e}") from None


def validate_and_assign(records, *, next_offset, config, leader_epoch, origin=CLIENT, now_ms=None):
    """Validate ``records`` (a bytes-like object or ``MemoryRecords``) for an append at ``next_offset``
    to a log with ``config`` (a ``LogConfig``); returns ``ValidatedRecords`` or raises ``LogError``."""
    if origin not in (CLIENT, REPLICATION, COORDINATOR):
        raise InvalidArgumentError(f"origin must be {CLIENT!r}, {REPLICATION!r} or {COORDINATOR!r}: {origin!r}")
    view = records.buffer if isinstance(records, MemoryRecords) else byte_view("records", records)
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
    for batch in batches:
        _check_batch(batch, batches[0], origin, config.max_message_bytes, len(batches))
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    log_append_time = now if config.log_append_time else -1
    target = _target_codec(config.compression_type)
    first = batches[0]
    if first.magic == 2 and (target is None or origin == REPLICATION or first.is_control_batch
                             or all(batch.compression == target for batch in batches)):
        return _assign_in_place(batches, next_offset, leader_epoch, log_append_time)
    return _rebuild(batches, first.compression if target is None else target, next_offset, leader_epoch,
                    log_append_time, config.max_message_bytes)


def _target_codec(compression_type):
    """The codec a topic's ``compression.type`` imposes, or None for ``producer`` (keep the batch's)."""
    if compression_type == "producer":
        return None
    return codecs.codec_id("none" if compression_type == "uncompressed" else compression_type)


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
                               batch.control_type if batch.is_control_batch else None))
    return ValidatedRecords(pieces, infos, first_offset, next_offset - 1, max_timestamp, offset_of_max,
                            log_append_time)


def _rebuild(batches, codec, next_offset, leader_epoch, log_append_time, max_message_bytes):
    """One v2 batch of ``codec`` holding every record of ``batches``: magic 0/1 up-converted, or v2
    batches recompressed (keeping the first one's producer fields)."""
    first = batches[0]
    producer = {}
    if first.magic == 2 and first.producer_id >= 0:
        producer = {"producer_id": first.producer_id, "producer_epoch": first.producer_epoch,
                    "base_sequence": first.base_sequence, "transactional": first.is_transactional}
    if log_append_time >= 0:
        builder = RecordsBuilder(2, codec, TimestampType.LOG_APPEND_TIME, next_offset, log_append_time=log_append_time,
                                 partition_leader_epoch=leader_epoch, **producer)
    else:
        builder = RecordsBuilder(2, codec, base_offset=next_offset, partition_leader_epoch=leader_epoch, **producer)
    try:
        for batch in batches:
            for record in batch:
                builder.append(record.value, key=record.key, timestamp=max(record.timestamp, -1),
                               headers=record.headers)
    except CorruptRecordError as e:
        raise LogError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    data = builder.build()
    if len(data) > max_message_bytes:
        raise LogError(ErrorCode.MESSAGE_TOO_LARGE, f"the converted batch of {len(data)} bytes is larger than "
                                                    f"max.message.bytes = {max_message_bytes}")
    converted = next(MemoryRecords(data).batches())
    info = BatchInfo(converted.producer_id, converted.producer_epoch, converted.base_sequence,
                     converted.sequence_of(converted.last_offset), converted.base_offset, converted.last_offset,
                     converted.max_timestamp, converted.is_transactional, False)
    return ValidatedRecords([data], [info], converted.base_offset, converted.last_offset, converted.max_timestamp,
                            converted.last_offset if converted.max_timestamp >= 0 else -1, log_append_time)
