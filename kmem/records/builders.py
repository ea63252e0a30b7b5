"""Building record data: v2 batches and v0/v1 entries, with every codec, and control batches.

A builder collects records in memory and ``build()`` writes them in one pass in the compiled core.
"""
import struct

from kmem import _core
from kmem.errors import InvalidArgumentError
from kmem.records import codecs
from kmem.records.arguments import (INT16, INT32, check_bool, check_choice, check_int, check_long,
                                    check_optional_bytes)
from kmem.records.batches import (ATTR_CONTROL, ATTR_LOG_APPEND_TIME, ATTR_TRANSACTIONAL, INT32_MAX, INT64_MAX,
                                  ControlRecordType, TimestampType)


RECORD_FIELDS = frozenset(("value", "key", "timestamp", "headers", "offset"))


class RecordsBuilder:
    """Builds one v2 batch, or for magic 0/1 one compressed wrapper or a run of uncompressed entries.

    >>> b = RecordsBuilder(magic=2, compression="lz4", base_offset=100, producer_id=7, producer_epoch=0,
    ...                    base_sequence=0)
    >>> b.append(b"value", key=b"key", timestamp=1_700_000_000_000, headers=[("h", b"1")])
    100
    >>> data = b.build()      # bytes; MemoryRecords(data) reads it back

    ``gzip_level`` is KIP-390's ``compression.gzip.level`` (1-9, Kafka's default 6), used with gzip.
    Offsets default to consecutive numbers from ``base_offset``; explicit offsets may leave gaps but must
    increase. ``timestamp_type=LOG_APPEND_TIME`` requires ``log_append_time`` (the broker's clock):
    every record then reads with that timestamp. Headers exist only in v2.
    """

    def __init__(self, magic=2, compression="none", timestamp_type=TimestampType.CREATE_TIME, base_offset=0, *,
                 log_append_time=None, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                 transactional=False, control=False, partition_leader_epoch=-1,
                 gzip_level=codecs.GZIP_DEFAULT_LEVEL):
        self.magic = check_choice("magic", magic, (0, 1, 2))
        self.compression = codecs.codec_id(compression)
        if self.compression == codecs.ZSTD and magic < 2:
            raise InvalidArgumentError("zstd compression requires magic 2")
        if timestamp_type not in (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME) \
                or isinstance(timestamp_type, bool):
            raise InvalidArgumentError(f"timestamp_type must be CREATE_TIME or LOG_APPEND_TIME, not {timestamp_type!r}")
        self.timestamp_type = TimestampType(timestamp_type) if magic else TimestampType.NO_TIMESTAMP_TYPE
        if self.timestamp_type == TimestampType.LOG_APPEND_TIME and log_append_time is None:
            raise InvalidArgumentError("LOG_APPEND_TIME needs log_append_time")
        if log_append_time is not None:
            check_long("log_append_time", log_append_time)
        check_long("base_offset", base_offset)
        check_long("producer_id", producer_id)
        check_int("producer_epoch", producer_epoch, *INT16)
        check_int("base_sequence", base_sequence, *INT32)
        check_bool("transactional", transactional)
        check_bool("control", control)
        check_int("partition_leader_epoch", partition_leader_epoch, *INT32)
        self.gzip_level = check_choice("gzip_level", gzip_level, codecs.GZIP_LEVELS)
        if magic < 2 and (transactional or control or producer_id != -1):
            raise InvalidArgumentError(f"magic {magic} has no producer, transactional or control fields")
        self.log_append_time = log_append_time
        self.base_offset = base_offset
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.transactional = transactional
        self.control = control
        self.partition_leader_epoch = partition_leader_epoch
        self._records = []     # (offset, timestamp, key, value, headers)

    def __len__(self):
        return len(self._records)

    @property
    def next_offset(self):
        return self._records[-1][0] + 1 if self._records else self.base_offset

    def append(self, value, key=None, timestamp=-1, headers=(), offset=None):
        """Add a record; returns its offset. ``headers``: ``(str or bytes key, bytes or None value)``."""
        check_optional_bytes("value", value)
        check_optional_bytes("key", key)
        check_long("timestamp", timestamp)
        if offset is None:
            offset = self.next_offset
        elif check_long("offset", offset) < self.next_offset:
            raise InvalidArgumentError(f"offset {offset} is not above the previous offset {self.next_offset - 1}")
        if self.magic == 2 and self._records and offset - self._records[0][0] > INT32_MAX:
            # v2 offset deltas are int32
            raise InvalidArgumentError(f"offset {offset} is more than 2**31 - 1 past the batch's first offset "
                                       f"{self._records[0][0]}")
        if headers and self.magic < 2:
            raise InvalidArgumentError(f"magic {self.magic} does not support record headers")
        if self.magic > 0 and timestamp < -1:
            raise InvalidArgumentError(f"invalid timestamp {timestamp}")
        encoded = []
        try:
            for k, v in headers:
                if k is None:
                    raise InvalidArgumentError("a header key cannot be None")
                if not isinstance(k, str):
                    check_optional_bytes("header key", k)
                encoded.append((k.encode() if isinstance(k, str) else bytes(k),
                                check_optional_bytes("header value", v)))
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(f"headers must be (str or bytes key, bytes or None value) pairs: {e}") from None
        if offset > INT64_MAX:
            raise InvalidArgumentError(f"offset {offset} is past the int64 range")
        self._records.append((offset, timestamp, key, value, encoded))
        return offset

    def build(self):
        """The built bytes (empty when no record was appended)."""
        if not self._records:
            return b""
        return self._build_v2() if self.magic == 2 else self._build_legacy()

    def _timestamps(self):
        if self.timestamp_type == TimestampType.LOG_APPEND_TIME:
            return [self.log_append_time] * len(self._records)
        return [r[1] for r in self._records]

    def _build_v2(self):
        first_offset, base_timestamp = self._records[0][0], self._records[0][1]
        section = _core.encode_v2_records([(o - first_offset, t - base_timestamp, k, v, h)
                                           for o, t, k, v, h in self._records])
        if self.compression:
            section = codecs.compress(self.compression, section, 2, self.gzip_level)
        attributes = self.compression
        if self.timestamp_type == TimestampType.LOG_APPEND_TIME:
            attributes |= ATTR_LOG_APPEND_TIME
        if self.transactional:
            attributes |= ATTR_TRANSACTIONAL
        if self.control:
            attributes |= ATTR_CONTROL
        return _core.v2_batch(section, first_offset, self.partition_leader_epoch, attributes,
                              self._records[-1][0] - first_offset, base_timestamp, max(self._timestamps()),
                              self.producer_id, self.producer_epoch, self.base_sequence, len(self._records))

    def _build_legacy(self):
        log_append = self.timestamp_type == TimestampType.LOG_APPEND_TIME
        attributes = ATTR_LOG_APPEND_TIME if log_append else 0
        timestamps = self._timestamps()
        if not self.compression:
            return _core.encode_legacy_entries(self.magic, attributes, [
                (o, t, k, v) for (o, _, k, v, _), t in zip(self._records, timestamps)])
        first_offset = self._records[0][0]
        relative = first_offset if self.magic == 1 else 0
        inner = _core.encode_legacy_entries(self.magic, attributes, [
            (o - relative, t, k, v) for (o, t, k, v, _) in self._records])
        wrapper_timestamp = self.log_append_time if log_append else max(timestamps)
        return _core.encode_legacy_entries(self.magic, attributes | self.compression, [
            (self._records[-1][0], wrapper_timestamp, None, codecs.compress(self.compression, inner, self.magic,
                                                                          self.gzip_level))])


def build_coordinator_records(entries, timestamp, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                              transactional=False):
    """One uncompressed v2 batch of ``[(key, value or None)]`` records, all at ``timestamp``: a coordinator's
    own records (``__consumer_offsets``, ``__transaction_state``). Unlike ``build_records`` nothing is checked:
    the coordinator made every field, and it writes on the path of the request that waits for them. No entries:
    empty bytes, as ``build_records`` gives."""
    if not entries:
        return b""
    section = _core.encode_v2_records([(delta, 0, key, value, ()) for delta, (key, value) in enumerate(entries)])
    return _core.v2_batch(section, 0, -1, ATTR_TRANSACTIONAL if transactional else 0, len(entries) - 1, timestamp,
                          timestamp, producer_id, producer_epoch, base_sequence, len(entries))


def build_records(records, magic=2, compression="none", base_offset=0, **batch_fields):
    """One batch (or legacy run) from ``records``: an iterable of values, or of dicts with keys
    ``value``, ``key``, ``timestamp``, ``headers``, ``offset`` (all optional but ``value``).
    ``batch_fields`` go to ``RecordsBuilder``."""
    builder = RecordsBuilder(magic, compression, base_offset=base_offset, **batch_fields)
    for record in records:
        if isinstance(record, dict):
            unknown = set(record) - RECORD_FIELDS
            if unknown:
                raise InvalidArgumentError(f"unknown record fields {sorted(unknown)}; expected {sorted(RECORD_FIELDS)}")
            builder.append(**record)
        else:
            builder.append(record)
    return builder.build()


def build_control_batch(control_type, offset, producer_id, producer_epoch, timestamp, coordinator_epoch=0,
                        partition_leader_epoch=-1):
    """A v2 transaction marker batch (one control record: key ``version 0 | type``, value
    ``version 0 | coordinator epoch``), as a transaction coordinator writes it."""
    if control_type not in ControlRecordType._value2member_map_ or isinstance(control_type, bool):
        raise InvalidArgumentError(f"control_type must be a ControlRecordType, not {control_type!r}")
    check_int("coordinator_epoch", coordinator_epoch, *INT32)
    check_long("offset", offset)
    check_long("producer_id", producer_id)
    check_int("producer_epoch", producer_epoch, *INT16)
    if check_long("timestamp", timestamp) < -1:
        raise InvalidArgumentError(f"invalid timestamp {timestamp}")
    check_int("partition_leader_epoch", partition_leader_epoch, *INT32)
    key, value = struct.pack(">hh", 0, int(control_type)), struct.pack(">hi", 0, coordinator_epoch)
    section = _core.encode_v2_records([(0, 0, key, value, ())])
    return _core.v2_batch(section, offset, partition_leader_epoch, ATTR_TRANSACTIONAL | ATTR_CONTROL, 0, timestamp,
                          timestamp, producer_id, producer_epoch, -1, 1)
