"""Reading Kafka record data: ``MemoryRecords`` over a bytes-like object, its batches and records.

Nothing is copied until records are decoded: a ``MemoryRecords`` holds one memoryview and each
``RecordBatch`` is a (position, size) window into it with its header fields parsed.

Memory for records is bounded per batch. Decompression stops at ``max_decompressed_bytes``. Iterating
a batch makes ``DECODE_SLICE`` records and headers at a time (one record at least), as Kafka's record
iterator streams them; a single record with more than ``max_decompressed_bytes // RECORD_OBJECT_BYTES``
headers is refused, so that one record costs at most about ``max_decompressed_bytes``. ``records()``,
which makes them all, first counts them and refuses more than
``max_decompressed_bytes // RECORD_OBJECT_BYTES``: a 7-byte record costs about 200 bytes of Python
objects, so a 100 KB gzip batch of 9 M empty records would otherwise take 2 GB.
"""
import enum
import struct
import zlib
from typing import NamedTuple

from kmem import _core
from kmem.errors import CorruptRecordError
from kmem.records import codecs
from kmem.records.arguments import byte_view, check_int, check_limit

V2_HEADER = struct.Struct(">qiiBIhiqqqhii")     # the 61-byte v2 batch header
LEGACY_HEADER = struct.Struct(">qiIBb")         # offset, size, crc, magic, attributes
LOG_OVERHEAD = 12
ATTR_CODEC_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
NO_SEQUENCE = -1
INT32_MAX = 0x7FFFFFFF
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
DECODE_SLICE = 1024             # records and headers made into Python objects at a time while iterating
REPR_BATCHES = 1000             # batches counted by repr()
RECORD_OBJECT_BYTES = 256       # most memory of a record (Record, headers list, two ints) or of a header
                                # (tuple, key str), keys and values aside


def legacy_absolute_base(wrapper_offset, inner, position):
    """Absolute base of v1 inner offsets (relative to the first, gaps kept): the wrapper carries the
    absolute offset of the last inner message. A wrapper that was never assigned offsets (offset 0, as
    a producer writes it) leaves the inner offsets as they are, as the Python clients read it.

    ``inner`` is ``_core.scan_legacy_entries``' result. A base or an absolute offset outside int64 (which
    Kafka's longs would wrap) raises CorruptRecordError naming ``position``, the wrapper's byte position.
    """
    lowest, highest = inner.lowest, inner.highest
    base = max(wrapper_offset - inner.last, 0)
    if not (INT64_MIN <= base <= INT64_MAX and base + lowest >= INT64_MIN and base + highest <= INT64_MAX):
        raise CorruptRecordError(f"v1 wrapper offset {wrapper_offset} with inner offsets {lowest}..{highest} "
                                 "gives absolute offsets outside the int64 range", position)
    return base


class TimestampType(enum.IntEnum):
    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class ControlRecordType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


class Record(NamedTuple):
    """One record. ``headers`` is a list of ``(key str, value bytes or None)`` (always empty below v2)."""
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list


class RecordBatch:
    """One top-level entry of record data: a v2 batch, or a v0/v1 entry (a shallow message, which may
    wrap compressed inner messages).

    The attribute names follow Kafka's ``RecordBatch``. For legacy entries the v2-only fields read as
    Kafka does: no producer (-1), no sequence, not transactional, not a control batch.
    """

    __slots__ = ("_view", "position", "file_position", "size_in_bytes", "magic", "attributes", "crc",
                 "partition_leader_epoch",
                 "_base_offset", "_last_offset", "base_timestamp", "max_timestamp", "producer_id",
                 "producer_epoch", "base_sequence", "_count")

    def __init__(self, view, position, size, magic, file_position=None):
        self._view = view
        self.position = position        # in ``view``
        self.file_position = position if file_position is None else file_position   # in the file or source
        self.size_in_bytes = size
        self.magic = magic
        if magic == 2:
            (self._base_offset, _, self.partition_leader_epoch, _, self.crc, self.attributes, last_delta,
             self.base_timestamp, self.max_timestamp, self.producer_id, self.producer_epoch,
             self.base_sequence, self._count) = V2_HEADER.unpack_from(view, position)
            self._last_offset = self._base_offset + last_delta
            if self._count < 0:
                raise CorruptRecordError(f"negative record count {self._count}", self.file_position)
        else:
            offset, _, self.crc, _, self.attributes = LEGACY_HEADER.unpack_from(view, position)
            self._last_offset = offset
            self._base_offset = offset if self.compression == codecs.NONE else None
            self._count = 1 if self.compression == codecs.NONE else None
            self.partition_leader_epoch = -1
            self.max_timestamp = struct.unpack_from(">q", view, position + 18)[0] if magic == 1 else -1
            self.base_timestamp = self.max_timestamp
            self.producer_id, self.producer_epoch, self.base_sequence = -1, -1, NO_SEQUENCE

    def __repr__(self):
        return (f"<RecordBatch magic={self.magic} offsets={self.base_offset}..{self.last_offset} "
                f"codec={codecs.codec_name(self.compression)} at byte {self.file_position}>")

    @property
    def buffer(self):
        """The batch's bytes (a memoryview into the source, not a copy)."""
        return self._view[self.position:self.position + self.size_in_bytes]

    @property
    def compression(self):
        """The ``CompressionType`` (an IntEnum: ``CompressionType.GZIP == 1``); an id that names no codec
        (5-7 fit in the attribute bits) as a bare int."""
        return codecs.BY_ATTRIBUTE[self.attributes & ATTR_CODEC_MASK]

    @property
    def is_compressed(self):
        return self.compression != codecs.NONE

    @property
    def timestamp_type(self):
        if self.magic == 0:
            return TimestampType.NO_TIMESTAMP_TYPE
        return TimestampType.LOG_APPEND_TIME if self.attributes & ATTR_LOG_APPEND_TIME else TimestampType.CREATE_TIME

    @property
    def is_transactional(self):
        return self.magic == 2 and bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control_batch(self):
        return self.magic == 2 and bool(self.attributes & ATTR_CONTROL)

    @property
    def base_offset(self):
        """First offset. For a compressed legacy entry this decompresses it (as Kafka does)."""
        if self._base_offset is None:
            self._unwrap(codecs.MAX_DECOMPRESSED_BYTES)
        return self._base_offset

    @property
    def last_offset(self):
        """Base offset plus lastOffsetDelta; a sum outside int64 raises CorruptRecordError."""
        if not INT64_MIN <= self._last_offset <= INT64_MAX:
            raise CorruptRecordError(f"last offset {self._last_offset} (base offset {self._base_offset} + "
                                     f"lastOffsetDelta) is outside the int64 range", self.file_position)
        return self._last_offset

    @property
    def next_offset(self):
        return self.last_offset + 1

    @property
    def last_offset_delta(self):
        return self.last_offset - self.base_offset

    @property
    def last_sequence(self):
        """Sequence number of the last record (wrapping at 2**31 - 1 as Kafka), or -1 without one."""
        return self.sequence_of(self._last_offset)

    def sequence_of(self, offset):
        """Sequence number of the record at ``offset`` in this batch, or -1 when the batch has none."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + offset - self._base_offset) % (INT32_MAX + 1)

    @property
    def records_count(self):
        """Declared count (v2); for a compressed legacy entry, the inner messages (decompressing it)."""
        if self._count is None:
            self._unwrap(codecs.MAX_DECOMPRESSED_BYTES)
        return self._count

    def __len__(self):
        return self.records_count

    def compute_checksum(self):
        """The CRC this batch should carry: CRC-32C over [21, end) for v2, CRC-32 over [16, end) before."""
        if self.magic == 2:
            return _core.crc32c(self.buffer[21:])
        return zlib.crc32(self.buffer[16:])

    def is_valid(self):
        return self.compute_checksum() == self.crc

    def ensure_valid(self):
        """Raise CorruptRecordError when the stored CRC does not match the data."""
        computed = self.compute_checksum()
        if computed != self.crc:
            raise CorruptRecordError(f"record is corrupt (stored crc = {self.crc}, computed crc = {computed})",
                                     self.file_position)

    def records(self, max_decompressed_bytes=codecs.MAX_DECOMPRESSED_BYTES):
        """The batch's records as a list of ``Record``, decompressing at most ``max_decompressed_bytes``.

        A batch of more than ``max_decompressed_bytes // RECORD_OBJECT_BYTES`` records and headers
        (262,144 by default) raises ``CorruptRecordError`` like an oversized payload: iterate it instead.
        """
        check_limit("max_decompressed_bytes", max_decompressed_bytes)
        return list(self._records(max_decompressed_bytes, max_decompressed_bytes // RECORD_OBJECT_BYTES))

    def __iter__(self):
        """The records, made ``DECODE_SLICE`` records and headers at a time (decompression is bounded)."""
        return self._records(codecs.MAX_DECOMPRESSED_BYTES, None)

    @property
    def control_type(self):
        """For a control batch, the ``ControlRecordType`` (or raw int) of its marker record; else None, and None
        for an empty control batch (Kafka's cleaner keeps a marker emptied once its transaction is cleaned
        away: it marks nothing)."""
        if not self.is_control_batch or self.records_count == 0:
            return None
        marker = next(iter(self), None)
        if marker is None or marker.key is None or len(marker.key) < 4:
            raise CorruptRecordError("control record without a valid key", self.file_position)
        kind = struct.unpack_from(">h", marker.key, 2)[0]
        return ControlRecordType(kind) if kind in ControlRecordType._value2member_map_ else kind

    @property
    def coordinator_epoch(self):
        """For a transaction marker (a control batch), the coordinator epoch its value carries (Kafka's
        ``EndTransactionMarker``: version int16, coordinator epoch int32); -1 when the value is shorter;
        None for other batches."""
        if not self.is_control_batch:
            return None
        marker = next(iter(self), None)
        if marker is None or marker.value is None or len(marker.value) < 6:
            return -1
        return struct.unpack_from(">i", marker.value, 2)[0]

    def _records(self, limit, max_objects):
        if self.magic == 2:
            return self._v2_records(limit, max_objects)
        return self._legacy_records(limit, max_objects)

    def _check_objects(self, objects, max_objects):
        if max_objects is not None and objects > max_objects:
            raise CorruptRecordError(f"{objects} records and headers exceed the limit of {max_objects} for a "
                                     "list (iterate the batch instead)", self.file_position)

    def _v2_records(self, limit, max_objects):
        body = self._view[self.position + 61:self.position + self.size_in_bytes]
        base = self.file_position + 61
        if self.is_compressed:       # errors inside the payload name the batch
            body = codecs.decompress(self.compression, body, 2, limit, self.file_position)
            base = self.file_position
        if max_objects is not None:
            self._check_objects(_core.count_v2_objects(body, count=self._count, base=base), max_objects)
        log_append = self.timestamp_type == TimestampType.LOG_APPEND_TIME
        pos, left = 0, self._count
        while True:
            records, pos = _core.decode_v2_records(
                body, pos, count=left, max_objects=DECODE_SLICE, max_record_objects=limit // RECORD_OBJECT_BYTES,
                base_offset=self._base_offset, base_timestamp=self.base_timestamp, base=base)
            left -= len(records)
            if log_append:
                yield from (Record(o, self.max_timestamp, k, v, h) for o, _, k, v, h in records)
            else:
                yield from map(Record._make, records)
            if not left:
                return

    def inner_entries(self, max_decompressed_bytes=codecs.MAX_DECOMPRESSED_BYTES):
        """A compressed legacy entry's inner messages as ``RecordBatch`` views, each with its own CRC (Kafka's
        deep ``AbstractLegacyRecordBatch`` entries), in the order of its records; their offsets are as stored
        (relative for v1: the records carry the absolute ones)."""
        payload, _ = self._unwrap(max_decompressed_bytes)
        return MemoryRecords(payload).batches()

    def _unwrap(self, limit):
        """A compressed legacy entry's inner entries and the base added to their offsets; the record
        count and base offset are set on the way (Kafka reads them too by decompressing)."""
        ((offset, _, magic, _, _, _, value),) = _core.decode_legacy_entries(self.buffer, base=self.file_position)
        if value is None:
            raise CorruptRecordError("compressed legacy entry without a value", self.file_position)
        payload = codecs.decompress(self.compression, value, magic, limit, self.file_position)
        inner = _core.scan_legacy_entries(payload, base=self.file_position)
        if not inner.count:
            raise CorruptRecordError("compressed legacy entry with no inner messages", self.file_position)
        base = legacy_absolute_base(offset, inner, self.file_position) if magic == 1 else 0
        self._count, self._base_offset = inner.count, base + inner.first
        return payload, base

    def _legacy_records(self, limit, max_objects):
        if not self.is_compressed:
            ((offset, _, _, _, timestamp, key, value),) = _core.decode_legacy_entries(self.buffer,
                                                                                       base=self.file_position)
            yield Record(offset, timestamp, key, value, [])
            return
        payload, base = self._unwrap(limit)
        self._check_objects(self._count, max_objects)
        log_append = self.attributes & ATTR_LOG_APPEND_TIME
        pos = 0
        while pos < len(payload):
            for inner_offset, size, _, inner_attributes, timestamp, key, value in _core.decode_legacy_entries(
                    payload, base=self.file_position, pos=pos, max_entries=DECODE_SLICE):
                if inner_attributes & ATTR_CODEC_MASK:
                    raise CorruptRecordError("compressed entry nested inside a compressed entry", self.file_position)
                pos += size
                yield Record(base + inner_offset, self.max_timestamp if log_append else timestamp, key, value, [])


class MemoryRecords:
    """Kafka record data in memory: a sequence of v0/v1 entries and v2 batches, in any mix.

    Iterating yields ``RecordBatch`` views in order. A truncated trailing batch is ignored (as Kafka
    does, e.g. the end of a fetch response or the padding of a lazy down-conversion); a size below
    the minimum overhead or an unknown magic raises ``CorruptRecordError`` with the byte position.
    """

    def __init__(self, data):
        self._view = byte_view("data", data)

    def __repr__(self):
        """Size, batch count (up to ``REPR_BATCHES``) and first offset, read from batch headers only."""
        count, first, pos = 0, "", 0
        try:
            while count < REPR_BATCHES and (entry := _core.entry_at(self._view, pos)) is not None:
                if count == 0:
                    batch = RecordBatch(self._view, pos, *entry)
                    if batch._base_offset is not None:     # known without decompressing
                        first = f", first offset {batch._base_offset}"
                count += 1
                pos += entry[0]
            batches = f"{count}{'+' if count == REPR_BATCHES else ''} batches"
        except CorruptRecordError as e:
            batches = f"{count} batches, then corrupt data at byte {e.offset}"
        return f"<MemoryRecords {len(self._view)} bytes{first}, {batches}>"

    @property
    def buffer(self):
        return self._view

    @property
    def size_in_bytes(self):
        return len(self._view)

    def __len__(self):
        return len(self._view)

    def __bytes__(self):
        return bytes(self._view)

    def read(self, position, size):
        """A view of ``size`` bytes from ``position`` (fewer at the end), without copying."""
        check_int("position", position, 0, INT64_MAX)
        check_int("size", size, 0, INT64_MAX)
        return self._view[position:position + size]

    def __iter__(self):
        return self.batches()

    def batches(self, start=0):
        """Iterate batches from byte ``start``."""
        return self._batches(check_int("start", start, 0, len(self._view)))

    def _batches(self, pos):
        view = self._view
        while True:
            entry = _core.entry_at(view, pos)
            if entry is None:
                return
            size, magic = entry
            yield RecordBatch(view, pos, size, magic)
            pos += size

    def records(self):
        """Every record of every batch, in order."""
        for batch in self.batches():
            yield from batch

    @property
    def valid_bytes(self):
        """Bytes covered by complete batches (everything before a truncated tail)."""
        end = 0
        for batch in self.batches():
            end = batch.position + batch.size_in_bytes
        return end

    def ensure_valid(self):
        """Check the CRC of every batch; raises CorruptRecordError at the first bad one."""
        for batch in self.batches():
            batch.ensure_valid()
