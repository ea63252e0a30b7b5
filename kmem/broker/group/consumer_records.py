"""The records of a KIP-848 consumer group in ``__consumer_offsets``, byte for byte as Kafka 3.9 writes them
(its ``ConsumerGroup*Key`` and ``ConsumerGroup*Value`` schemas; ``CoordinatorRecordHelpers`` builds them):

====  =========================================  ======================  ==========================================
 key  record                                     key fields              value (version 0)
====  =========================================  ======================  ==========================================
   3  ConsumerGroupMetadata                      group                   the group epoch
   4  ConsumerGroupPartitionMetadata             group                   the subscribed topics: id, name, partitions
   5  ConsumerGroupMemberMetadata                group | member id       the member's subscription and client
   6  ConsumerGroupTargetAssignmentMetadata      group                   the target assignment's epoch
   7  ConsumerGroupTargetAssignmentMember        group | member id       the member's target partitions
   8  ConsumerGroupCurrentMemberAssignment       group | member id       its epochs, state and partitions
====  =========================================  ======================  ==========================================

Keys are not flexible (``i16 version | string group [| string member id]``); values are ``i16 0`` and then
flexible (KIP-482: compact strings and arrays, each struct ending with its tagged fields). A null value is a
tombstone. Values are NamedTuples named after Kafka's fields (``kmem dump-log`` prints them in camelCase).
"""
from typing import NamedTuple

from kmem.broker.group.offsets import (
    CONSUMER_MEMBER_KEY_VERSIONS, OFFSETS_TOPIC, FlexibleReader, FlexibleWriter, versioned_reader,
)

GROUP_EPOCH, PARTITION_METADATA, MEMBER, TARGET_EPOCH, TARGET_MEMBER, CURRENT_ASSIGNMENT = range(3, 9)
VALUE_VERSION = 0
RECORD_NAMES = {GROUP_EPOCH: "ConsumerGroupMetadata", PARTITION_METADATA: "ConsumerGroupPartitionMetadata",
                MEMBER: "ConsumerGroupMemberMetadata", TARGET_EPOCH: "ConsumerGroupTargetAssignmentMetadata",
                TARGET_MEMBER: "ConsumerGroupTargetAssignmentMember",
                CURRENT_ASSIGNMENT: "ConsumerGroupCurrentMemberAssignment"}


class GroupEpoch(NamedTuple):
    epoch: int


class PartitionRacks(NamedTuple):
    partition: int
    racks: list


class TopicMetadata(NamedTuple):
    topic_id: object               # uuid.UUID
    topic_name: str
    num_partitions: int
    partition_metadata: list       # [PartitionRacks]; empty when no broker has a rack


class PartitionMetadata(NamedTuple):
    topics: list                   # [TopicMetadata]


class SupportedProtocol(NamedTuple):
    name: str
    metadata: bytes


class ClassicMemberMetadata(NamedTuple):
    session_timeout_ms: int
    supported_protocols: list      # [SupportedProtocol]


# A member record's tagged field 0 left out reads as this default; Kafka 3.9 writes a member of the consumer
# protocol with the field present and null (``newMemberSubscriptionRecord``), as kmem does.
NO_CLASSIC_MEMBER_METADATA = ClassicMemberMetadata(0, [])


class MemberMetadata(NamedTuple):
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: list
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic_member_metadata: ClassicMemberMetadata | None = None    # tagged field 0: a classic member's


class TargetEpoch(NamedTuple):
    assignment_epoch: int


class TopicPartitions(NamedTuple):
    topic_id: object               # uuid.UUID
    partitions: list


class TargetMember(NamedTuple):
    topic_partitions: list         # [TopicPartitions]


class CurrentAssignment(NamedTuple):
    member_epoch: int
    previous_member_epoch: int
    state: int                     # Kafka's MemberState: 0 stable, 1 unrevoked, 2 unreleased partitions
    assigned_partitions: list      # [TopicPartitions]
    partitions_pending_revocation: list


VALUE_TYPES = {GROUP_EPOCH: GroupEpoch, PARTITION_METADATA: PartitionMetadata, MEMBER: MemberMetadata,
               TARGET_EPOCH: TargetEpoch, TARGET_MEMBER: TargetMember, CURRENT_ASSIGNMENT: CurrentAssignment}


def topic_partitions(assignment):
    """``{topic uuid: partitions}`` as ``[TopicPartitions]``, in a stable order."""
    return [TopicPartitions(topic, sorted(parts))
            for topic, parts in sorted(assignment.items(), key=lambda item: str(item[0])) if parts]


def consumer_group_key(version, group_id, member_id=None):
    w = FlexibleWriter()
    w.i16(version)
    w.string(group_id)
    if version in CONSUMER_MEMBER_KEY_VERSIONS:
        w.string(member_id)
    return w.value()


def consumer_group_value(value):
    """The bytes of one of the values above (its type tells the record)."""
    w = FlexibleWriter()
    w.i16(VALUE_VERSION)
    _write_struct(w, value)
    return w.value()


def _write_struct(w, value):
    if isinstance(value, (GroupEpoch, TargetEpoch)):
        w.i32(value[0])
    elif isinstance(value, PartitionMetadata):
        w.compact_array(value.topics, lambda topic: _write_struct(w, topic))
    elif isinstance(value, TopicMetadata):
        w.uuid(value.topic_id)
        w.compact_string(value.topic_name)
        w.i32(value.num_partitions)
        w.compact_array(value.partition_metadata, lambda racks: _write_struct(w, racks))
    elif isinstance(value, PartitionRacks):
        w.i32(value.partition)
        w.compact_array(value.racks, w.compact_string)
    elif isinstance(value, MemberMetadata):
        for text in value[:4]:
            w.compact_string(text)
        w.compact_array(value.subscribed_topic_names, w.compact_string)
        w.compact_string(value.subscribed_topic_regex)
        w.i32(value.rebalance_timeout_ms)
        w.compact_string(value.server_assignor)
        if value.classic_member_metadata != NO_CLASSIC_MEMBER_METADATA:
            _write_classic_member(w, value.classic_member_metadata)
            return
    elif isinstance(value, TargetMember):
        w.compact_array(value.topic_partitions, lambda tp: _write_struct(w, tp))
    elif isinstance(value, TopicPartitions):
        w.uuid(value.topic_id)
        w.compact_array(value.partitions, w.i32)
    elif isinstance(value, CurrentAssignment):
        w.i32(value.member_epoch)
        w.i32(value.previous_member_epoch)
        w.parts.append(value.state.to_bytes(1, "big", signed=True))
        for partitions in value[3:]:
            w.compact_array(partitions, lambda tp: _write_struct(w, tp))
    else:
        raise TypeError(f"not a consumer group record value: {value!r}")
    w.no_tagged_fields()


def _write_classic_member(w, classic):
    """Tagged field 0 (the only one), its struct after a presence varint: 0 null, 1 present."""
    body = FlexibleWriter()
    if classic is None:
        body.uvarint(0)
    else:
        body.uvarint(1)
        body.i32(classic.session_timeout_ms)

        def protocol(item):
            body.compact_string(item.name)
            body.compact_bytes(item.metadata)
            body.no_tagged_fields()
        body.compact_array(classic.supported_protocols, protocol)
        body.no_tagged_fields()
    data = body.value()
    w.uvarint(1)
    w.uvarint(0)
    w.uvarint(len(data))
    w.parts.append(data)


def read_consumer_group_value(version, value):
    """The value of the record of key ``version``; ``CorruptRecordError`` for bytes that do not decode."""
    r, _ = versioned_reader(value, OFFSETS_TOPIC, f"{RECORD_NAMES[version]} value", (VALUE_VERSION,), FlexibleReader)
    return _read_struct(r, VALUE_TYPES[version])


def _read_struct(r, kind):
    if kind in (GroupEpoch, TargetEpoch):
        result = kind(r.i32())
    elif kind is PartitionMetadata:
        result = kind(r.compact_array(lambda: _read_struct(r, TopicMetadata)))
    elif kind is TopicMetadata:
        result = kind(r.uuid(), r.compact_string(), r.i32(), r.compact_array(lambda: _read_struct(r, PartitionRacks)))
    elif kind is PartitionRacks:
        result = kind(r.i32(), r.compact_array(r.compact_string))
    elif kind is MemberMetadata:
        texts = [r.compact_nullable_string(), r.compact_nullable_string(), r.compact_string(), r.compact_string()]
        result = kind(*texts, r.compact_array(r.compact_string), r.compact_nullable_string(), r.i32(),
                      r.compact_nullable_string())
        classic = r.tagged_fields().get(0)
        return result._replace(classic_member_metadata=NO_CLASSIC_MEMBER_METADATA if classic is None else
                               _classic_member(classic, r.what))
    elif kind is TargetMember:
        result = kind(r.compact_array(lambda: _read_struct(r, TopicPartitions)))
    elif kind is TopicPartitions:
        result = kind(r.uuid(), r.compact_array(r.i32))
    else:
        epoch, previous = r.i32(), r.i32()
        state = int.from_bytes(r._take(1), "big", signed=True)
        result = kind(epoch, previous, state, *(r.compact_array(lambda: _read_struct(r, TopicPartitions))
                                                 for _ in range(2)))
    r.skip_tagged_fields()
    return result


def _classic_member(data, what):
    r = FlexibleReader(data, f"{what} ClassicMemberMetadata")
    if r.uvarint() == 0:
        return None
    session_timeout_ms = r.i32()

    def protocol():
        name, metadata = r.compact_string(), r.compact_bytes()
        r.skip_tagged_fields()
        return SupportedProtocol(name, metadata)
    protocols = r.compact_array(protocol)
    r.skip_tagged_fields()
    return ClassicMemberMetadata(session_timeout_ms, protocols)
