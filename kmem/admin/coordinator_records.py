"""The records of the coordinators' topics as text, as Kafka's ``kafka-dump-log.sh`` prints them with
``--offsets-decoder`` (``DumpLogSegments.OffsetsMessageParser``: JSON of Kafka's generated converters, the
consumer protocol's subscriptions and assignments decoded) and ``--transaction-log-decoder``
(``TransactionLog.formatRecordKeyAndValue``). The schemas are the coordinators' own
(``kmem.broker.group.offsets``, ``kmem.broker.txn.state_log``)."""
import base64
import json
import struct
import uuid

from kmem.broker.group.consumer_records import NO_CLASSIC_MEMBER_METADATA, read_consumer_group_value
from kmem.broker.group.offsets import (
    CONSUMER_GROUP_KEY_VERSIONS, _Reader, read_group_value, read_key, read_offset_value,
)
from kmem.broker.txn import state_log
from kmem.broker.txn.metadata import STATE_NAMES
from kmem.errors import CorruptRecordError

CONSUMER_PROTOCOL = "consumer"


def _json(node):
    """Jackson's compact JSON, as Kafka's tool prints its nodes."""
    return json.dumps(node, separators=(",", ":"), ensure_ascii=False)


def parse_offsets_record(record):
    """``(key, payload)`` text of a ``__consumer_offsets`` record (Kafka's ``OffsetsMessageParser``): each as
    ``{"type"|"version": "<version>", "data": {...}}`` with the fields of that version, ``<DELETE>`` for a
    tombstone; a record that cannot be decoded gives an ``Error at offset ...`` key instead."""
    if record.key is None:
        return (f"Failed to decode message at offset {record.offset} using offset topic decoder (message had a "
                "missing key)"), None
    try:
        version = _version(record.key, "key")
        if version not in range(CONSUMER_GROUP_KEY_VERSIONS.stop):     # a share group's (KIP-932)...
            return f"Unknown record type {version} at offset {record.offset}, skipping.", None
        kind, *fields = read_key(record.key)
        if kind == "consumer":
            return consumer_group_record_json(*fields, record.value)
        if kind == "offset":
            key = {"group": fields[0], "topic": fields[1], "partition": fields[2]}
        else:
            key = {"group": fields[0]}
        if record.value is None:
            payload = "<DELETE>"
        elif kind == "offset":
            payload = _json(offset_commit_value_json(record.value))
        else:
            payload = _json(group_metadata_value_json(record.value))
    except CorruptRecordError as exc:
        return f"Error at offset {record.offset}, skipping. {exc}", None
    return _json({"type": str(version), "data": key}), payload


def consumer_group_record_json(version, group_id, member_id, value):
    """A KIP-848 consumer group's record (``kmem.broker.group.consumer_records``) as Kafka's generated JSON
    converters print it: fields in camelCase, topic ids as Kafka's ``Uuid.toString``, bytes in base64, a tagged
    field at its default left out."""
    fields = {"groupId": group_id} if member_id is None else {"groupId": group_id, "memberId": member_id}
    key = _json({"type": str(version), "data": fields})
    if value is None:
        return key, "<DELETE>"
    data = _fields_json(read_consumer_group_value(version, value))
    return key, _json({"version": str(_version(value, "value")), "data": data})


def _fields_json(value):
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {_camel_case(name): _fields_json(item) for name, item in zip(value._fields, value)
                if item != NO_CLASSIC_MEMBER_METADATA}
    if isinstance(value, list):
        return [_fields_json(item) for item in value]
    if isinstance(value, uuid.UUID):
        return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def _camel_case(name):
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def _version(data, part):
    if len(data) < 2:
        raise CorruptRecordError(f"the {part} is too short for its version ({len(data)} bytes)")
    return struct.unpack_from(">h", data)[0]


def offset_commit_value_json(value):
    version = _version(value, "value")
    commit = read_offset_value(value)
    data = {"offset": commit.offset}
    if version >= 3:
        data["leaderEpoch"] = commit.leader_epoch
    data["metadata"] = commit.metadata
    data["commitTimestamp"] = commit.commit_timestamp
    if version == 1:
        data["expireTimestamp"] = commit.expire_timestamp
    return {"version": str(version), "data": data}


def group_metadata_value_json(value):
    """A ``GroupMetadataValue`` as Kafka's tool prints it: a consumer group's subscriptions and assignments
    decoded (ConsumerProtocol), their bytes in base64 when they do not decode."""

    version = _version(value, "value")
    group = read_group_value(value)
    data = {"protocolType": group.protocol_type, "generation": group.generation, "protocol": group.protocol,
            "leader": group.leader}
    if version >= 2:
        data["currentStateTimestamp"] = group.state_timestamp
    members = []
    for member in group.members:
        fields = {"memberId": member.member_id}
        if version >= 3:
            fields["groupInstanceId"] = member.group_instance_id
        fields.update(clientId=member.client_id, clientHost=member.client_host)
        if version >= 1:
            fields["rebalanceTimeout"] = member.rebalance_timeout_ms
        fields["sessionTimeout"] = member.session_timeout_ms
        consumer = group.protocol_type == CONSUMER_PROTOCOL
        fields["subscription"] = _embedded(member.subscription, consumer and _subscription_json)
        fields["assignment"] = _embedded(member.assignment, consumer and _assignment_json)
        members.append(fields)
    data["members"] = members
    return {"version": str(version), "data": data}


def _embedded(data, decode):
    """ConsumerProtocol bytes decoded by ``decode``, else (another protocol, or bytes that do not decode) base64."""
    if decode:
        try:
            return decode(_ProtocolReader(data, "consumer protocol"))
        except CorruptRecordError:
            pass
    return base64.b64encode(data).decode()


def _subscription_json(reader):
    """Kafka's ``ConsumerProtocolSubscription`` (versions 0-3; a later one read as 3, as Kafka's consumer does)."""
    version = min(reader.i16(), 3)
    data = {"topics": reader.array(reader.string), "userData": reader.nullable_bytes()}
    if version >= 1:
        data["ownedPartitions"] = reader.array(reader.topic_partitions)
    if version >= 2:
        data["generationId"] = reader.i32()
    if version >= 3:
        data["rackId"] = reader.string(nullable=True)
    return data


def _assignment_json(reader):
    reader.i16()
    return {"assignedPartitions": reader.array(reader.topic_partitions), "userData": reader.nullable_bytes()}


class _ProtocolReader(_Reader):
    """The ConsumerProtocol's arrays and nullable bytes (its versions are not flexible)."""

    def array(self, read_one):
        count = self.i32()
        if not 0 <= count <= len(self.view) - self.pos:
            raise CorruptRecordError(f"{self.what}: bad array length {count} at byte {self.pos - 4}")
        return [read_one() for _ in range(count)]

    def nullable_bytes(self):
        size = self.i32()
        return None if size == -1 else base64.b64encode(bytes(self._take(size))).decode()

    def topic_partitions(self):
        return {"topic": self.string(), "partitions": self.array(self.i32)}


def parse_transaction_record(record):
    """``(key, payload)`` text of a ``__transaction_state`` record (Kafka's
    ``TransactionLog.formatRecordKeyAndValue``)."""
    try:
        if record.key is None:
            raise CorruptRecordError("a record without a key")
        version = _version(record.key, "key")
        if version != state_log.KEY_VERSION:
            return f"unknown::version={version}", None
        key = f"transaction_metadata::transactionalId={state_log.read_key(record.key)}"
        value = state_log.read_value(record.value)
    except CorruptRecordError as exc:
        return f"Error at offset {record.offset}, skipping. {exc}", None
    if value is None:
        return key, "<DELETE>"
    partitions = ",".join(f"{topic}-{partition}" for topic, partition in sorted(value.partitions))
    return key, (f"producerId:{value.producer_id},producerEpoch:{value.producer_epoch},"
                 f"state={STATE_NAMES[value.state]},partitions=[{partitions}],"
                 f"txnLastUpdateTimestamp={value.last_update_ms},txnTimeoutMs={value.timeout_ms}")
