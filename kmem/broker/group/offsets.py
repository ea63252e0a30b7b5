"""The records of Kafka's ``__consumer_offsets`` topic, byte for byte (Kafka 3.9's ``OffsetCommitKey``,
``OffsetCommitValue``, ``GroupMetadataKey`` and ``GroupMetadataValue`` schemas), and the partition a
group's records go to.

- key version 0/1: an offset commit, ``group | topic | partition``; its value (versions 0-3) holds the
  offset, the leader epoch (v3), the metadata, the commit timestamp and the expire timestamp (v1 only).
  Written as Kafka 3.9 writes them: value v1 when the commit carries a retention time, v3 otherwise.
- key version 2: a group's metadata, ``group``; its value (versions 0-3, v3 written) holds the protocol
  type, generation, protocol, leader, the state timestamp and every member with its subscription and
  assignment.
- key versions 3-8: a KIP-848 consumer group's records (``kmem.broker.group.consumer_records``), whose values
  are flexible (``FlexibleReader``, ``FlexibleWriter``: KIP-482's compact types and tagged fields).
- a null value is a tombstone: the offset (or the whole group) is gone.
- a transaction's offset commits (TxnOffsetCommit) are the same records in a transactional batch, committed
  or aborted by their producer's marker (a control batch) later in the partition.

Strings are ``i16 length | UTF-8``, nullable ones with length -1 for null; bytes are ``i32 length | data``.
"""
import functools
import struct
import uuid
from typing import NamedTuple

from kmem.errors import CorruptRecordError

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
GROUP_METADATA_VALUE_VERSION = 3
# KIP-848's: ConsumerGroupMetadataKey (3), ...PartitionMetadataKey (4), ...MemberMetadataKey (5),
# ...TargetAssignmentMetadataKey (6), ...TargetAssignmentMemberKey (7), ...CurrentMemberAssignmentKey (8)
CONSUMER_GROUP_KEY_VERSIONS = range(3, 9)
CONSUMER_MEMBER_KEY_VERSIONS = (5, 7, 8)       # group | member id; the others are group only

INT64_MAX = (1 << 63) - 1          # the latest timestamp a record holds

_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


@functools.lru_cache(maxsize=1 << 16)      # a group's or transactional id's, asked for at each of its writes
def java_string_hash(text):
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id, partitions):
    """``Utils.abs(groupId.hashCode) % offsets.topic.num.partitions``: Kafka's ``partitionFor``
    (``Utils.abs`` maps Integer.MIN_VALUE to 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class OffsetAndMetadata(NamedTuple):
    offset: int
    leader_epoch: int              # -1 when unknown
    metadata: str
    commit_timestamp: int
    expire_timestamp: int          # -1: expires by offsets.retention.minutes
    # not in the record: the offset of the batch holding it in __consumer_offsets, which orders a transaction's
    # offsets against other commits when its marker comes (Kafka's CommitRecordMetadataAndOffset); -1 unwritten
    log_offset: int = -1


class MemberRecord(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


class GroupRecord(NamedTuple):
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    state_timestamp: int           # -1 when unknown
    members: list


class _Writer:
    def __init__(self):
        self.parts = []

    def i16(self, v):
        self.parts.append(_I16.pack(v))

    def i32(self, v):
        self.parts.append(_I32.pack(v))

    def i64(self, v):
        self.parts.append(_I64.pack(v))

    def string(self, v):
        if v is None:
            self.parts.append(_I16.pack(-1))
            return
        data = v.encode()
        self.parts.append(_I16.pack(len(data)) + data)

    def bytes_(self, v):
        self.parts.append(_I32.pack(len(v)) + bytes(v))

    def value(self):
        return b"".join(self.parts)


class _Reader:
    def __init__(self, data, what):
        self.view = memoryview(data)
        self.pos = 0
        self.what = what

    def _take(self, n):
        if n < 0 or self.pos + n > len(self.view):
            raise CorruptRecordError(f"{self.what}: truncated at byte {self.pos} (needs {n} more bytes)")
        chunk = self.view[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def i16(self):
        return _I16.unpack(self._take(2))[0]

    def i32(self):
        return _I32.unpack(self._take(4))[0]

    def i64(self):
        return _I64.unpack(self._take(8))[0]

    def string(self, nullable=False):
        size = self.i16()
        if size == -1 and nullable:
            return None
        try:
            return bytes(self._take(size)).decode()
        except UnicodeDecodeError:
            raise CorruptRecordError(f"{self.what}: a string at byte {self.pos - size} is not UTF-8") from None

    def bytes_(self):
        return bytes(self._take(self.i32()))


class FlexibleReader(_Reader):
    """The compact types of flexible versions (KIP-482)."""

    def uvarint(self):
        value = shift = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptRecordError(f"{self.what}: a varint at byte {self.pos} is too long")

    def compact_string(self):
        size = self.uvarint() - 1
        try:
            return bytes(self._take(size)).decode()
        except UnicodeDecodeError:
            raise CorruptRecordError(f"{self.what}: a string at byte {self.pos - size} is not UTF-8") from None

    def compact_nullable_string(self):
        if self._peek_null():
            return None
        return self.compact_string()

    def compact_bytes(self):
        return bytes(self._take(self.uvarint() - 1))

    def compact_array(self, read_one):
        """A compact array of ``read_one()`` (its length bounded by the bytes left: no huge allocation)."""
        count = self.uvarint() - 1
        if not 0 <= count <= len(self.view) - self.pos:
            raise CorruptRecordError(f"{self.what}: bad array length {count} at byte {self.pos}")
        return [read_one() for _ in range(count)]

    def uuid(self):
        return uuid.UUID(bytes=bytes(self._take(16)))

    def _peek_null(self):
        if self.pos < len(self.view) and self.view[self.pos] == 0:
            self.pos += 1
            return True
        return False

    def tagged_fields(self):
        """``{tag: bytes}`` of a struct's tagged fields."""
        fields = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            fields[tag] = bytes(self._take(self.uvarint()))
        return fields

    def skip_tagged_fields(self):
        self.tagged_fields()


class FlexibleWriter(_Writer):
    """The compact types of flexible versions (KIP-482); every struct is written without tagged fields."""

    def uvarint(self, v):
        out = bytearray()
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        out.append(v)
        self.parts.append(bytes(out))

    def compact_string(self, v):
        if v is None:
            self.uvarint(0)
            return
        data = v.encode()
        self.uvarint(len(data) + 1)
        self.parts.append(data)

    def compact_bytes(self, v):
        self.uvarint(len(v) + 1)
        self.parts.append(bytes(v))

    def compact_array(self, items, write_one):
        self.uvarint(len(items) + 1)
        for item in items:
            write_one(item)

    def uuid(self, v):
        self.parts.append(v.bytes)

    def no_tagged_fields(self):
        self.parts.append(b"\0")


def offset_commit_key(group_id, topic, partition):
    w = _Writer()
    w.i16(OFFSET_COMMIT_KEY_VERSION)
    w.string(group_id)
    w.string(topic)
    w.i32(partition)
    return w.value()


def offset_commit_value(offset):
    """Value v1 when the commit has an expire timestamp (OffsetCommit v1-4 with a retention time), else v3."""
    w = _Writer()
    legacy = offset.expire_timestamp >= 0
    w.i16(1 if legacy else 3)
    w.i64(offset.offset)
    if not legacy:
        w.i32(offset.leader_epoch)
    w.string(offset.metadata)
    w.i64(offset.commit_timestamp)
    if legacy:
        w.i64(offset.expire_timestamp)
    return w.value()


def group_metadata_key(group_id):
    w = _Writer()
    w.i16(GROUP_METADATA_KEY_VERSION)
    w.string(group_id)
    return w.value()


def group_metadata_value(group):
    w = _Writer()
    w.i16(GROUP_METADATA_VALUE_VERSION)
    w.string(group.protocol_type)
    w.i32(group.generation)
    w.string(group.protocol)
    w.string(group.leader)
    w.i64(group.state_timestamp)
    w.i32(len(group.members))
    for m in group.members:
        w.string(m.member_id)
        w.string(m.group_instance_id)
        w.string(m.client_id)
        w.string(m.client_host)
        w.i32(m.rebalance_timeout_ms)
        w.i32(m.session_timeout_ms)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
    return w.value()


def versioned_reader(data, topic, part, versions, reader=_Reader):
    """``(reader, version)`` of a record's key or value ``data`` of ``topic`` (``part``: "key", "offset commit
    value"...), past its version; ``CorruptRecordError`` without data or for a version not in ``versions``."""
    if data is None:
        raise CorruptRecordError(f"{topic}: a record without a {part}")
    r = reader(data, f"{topic} {part}")
    version = r.i16()
    if version not in versions:
        raise CorruptRecordError(f"{topic}: unknown {part} version {version}")
    return r, version


def read_key(key):
    """``("offset", group, topic, partition)``, ``("group", group)`` or, for a KIP-848 consumer group's records
    (``kmem.broker.group.consumer_records``), ``("consumer", key version, group, member id or None)``;
    ``CorruptRecordError`` otherwise."""
    r, version = versioned_reader(key, OFFSETS_TOPIC, "key", range(CONSUMER_GROUP_KEY_VERSIONS.stop))
    if version == 2:
        return "group", r.string()
    if version in CONSUMER_GROUP_KEY_VERSIONS:
        return "consumer", version, r.string(), r.string() if version in CONSUMER_MEMBER_KEY_VERSIONS else None
    return "offset", r.string(), r.string(), r.i32()


def read_offset_value(value):
    r, version = versioned_reader(value, OFFSETS_TOPIC, "offset commit value", range(4))
    offset = r.i64()
    leader_epoch = r.i32() if version >= 3 else -1
    metadata = r.string()
    commit_timestamp = r.i64()
    expire_timestamp = r.i64() if version == 1 else -1
    return OffsetAndMetadata(offset, leader_epoch, metadata, commit_timestamp, expire_timestamp)


def read_group_value(value):
    r, version = versioned_reader(value, OFFSETS_TOPIC, "group metadata value", range(4))
    protocol_type = r.string()
    generation = r.i32()
    protocol = r.string(nullable=True)
    leader = r.string(nullable=True)
    state_timestamp = r.i64() if version >= 2 else -1
    members = []
    for _ in range(r.i32()):
        member_id = r.string()
        instance_id = r.string(nullable=True) if version >= 3 else None
        client_id, client_host = r.string(), r.string()
        rebalance_timeout = r.i32() if version >= 1 else -1
        session_timeout = r.i32()
        if version == 0:
            rebalance_timeout = session_timeout
        members.append(MemberRecord(member_id, instance_id, client_id, client_host, rebalance_timeout,
                                    session_timeout, r.bytes_(), r.bytes_()))
    return GroupRecord(protocol_type, generation, protocol, leader, state_timestamp, members)
