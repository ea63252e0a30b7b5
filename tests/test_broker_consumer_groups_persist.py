"""A KIP-848 consumer group's state in ``__consumer_offsets``: the records read back with Kafka 3.9's own JSON schemas
(``tests/data/kafka_schemas``, decoded generically here), a restart (clean, and SIGKILL over the wire) that keeps the
group epoch, the members, their epochs and their target and current assignments so that members carry on without
rejoining, tombstones when a member leaves and when the group is deleted (the log cleaner drops them), a failed
write that changes nothing, a damaged record skipped at load, ``kmem dump-log --offsets-decoder``, and Kafka's
own serde reading kmem's directory (the logdir oracle, when it is built)."""
import base64
import collections
import json
import logging
import os
import signal
import struct
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from broker_helpers import RawConnection, fail_appends, start_broker_process
from kmem.admin.coordinator_records import parse_offsets_record
from kmem.broker import LogManager
from kmem.broker.codes import ErrorCode
from kmem.broker.group.consumer_records import CURRENT_ASSIGNMENT, GroupEpoch, consumer_group_key, consumer_group_value
from kmem.broker.group.coordinator import GroupConfig, GroupCoordinator
from kmem.broker.group.offsets import OFFSETS_TOPIC, partition_for
from kmem.protocol import ApiKey, RequestHeader, messages
from test_broker_consumer_groups import H, Members
from test_broker_groups_coordinator import cleaning, join, stored_records
from test_dump_log import dump

Record = collections.namedtuple("Record", "offset key value")

SCHEMAS = Path(__file__).parent / "data" / "kafka_schemas"
RECORDS = ("ConsumerGroupMetadata", "ConsumerGroupPartitionMetadata", "ConsumerGroupMemberMetadata",
           "ConsumerGroupTargetAssignmentMetadata", "ConsumerGroupTargetAssignmentMember",
           "ConsumerGroupCurrentMemberAssignment")
ORACLE = os.environ.get("LOGDIR_ORACLE", "/tmp/logdir-oracle/run-oracle")


# -- a reader of Kafka's message schemas (the JSON the generated classes come from)

def schema(name):
    text = "".join(line for line in (SCHEMAS / f"{name}.json").open() if not line.lstrip().startswith("//"))
    return json.loads(text)


def in_versions(spec, version):
    if spec is None or spec == "none":
        return False
    if spec.endswith("+"):
        return version >= int(spec[:-1])
    low, _, high = spec.partition("-")
    return int(low) <= version <= int(high or low)


class SchemaReader:
    def __init__(self, data, version, flexible, structs):
        self.data, self.pos = bytes(data), 0
        self.version, self.flexible, self.structs = version, flexible, structs

    def take(self, n):
        assert 0 <= n and self.pos + n <= len(self.data), f"truncated at {self.pos} (+{n})"
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def uvarint(self):
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def length(self, fixed):
        return self.uvarint() - 1 if self.flexible else self.unpack(fixed)

    def struct(self, fields):
        out, tagged = {}, {}
        for field in fields:
            if not in_versions(field["versions"], self.version):
                continue
            if self.flexible and in_versions(field.get("taggedVersions"), self.version):
                tagged[field["tag"]] = field            # left out of ``out`` when absent (its default)
                continue
            out[field["name"]] = self.field(field)
        if self.flexible:
            for _ in range(self.uvarint()):
                tag, size = self.uvarint(), self.uvarint()
                end = self.pos + size
                # a tagged struct starts with a varint: 0 null, 1 present
                out[tagged[tag]["name"]] = self.field(tagged[tag]) if self.uvarint() else None
                assert self.pos == end
        return out

    def field(self, field):
        kind = field["type"]
        if kind.startswith("[]"):
            count = self.length(">i")
            return None if count < 0 else [self.value(kind[2:], field) for _ in range(count)]
        return self.value(kind, field)

    def value(self, kind, field):
        fixed = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q"}
        if kind in fixed:
            return self.unpack(fixed[kind])
        if kind == "uuid":
            return uuid.UUID(bytes=self.take(16))
        if kind == "string":
            size = self.length(">h")
            return None if size < 0 else self.take(size).decode()
        if kind == "bytes":
            size = self.length(">i")
            return None if size < 0 else self.take(size)
        return self.struct(field.get("fields") or self.structs[kind])


def decode(name, data):
    """``(version, fields)`` of ``data`` as the schema ``name`` reads it; every byte must be read."""
    spec = schema(name)
    version, = struct.unpack_from(">h", data)
    assert in_versions(spec["validVersions"], version), (name, version)
    structs = {s["name"]: s["fields"] for s in spec.get("commonStructs", [])}
    reader = SchemaReader(data[2:], version, in_versions(spec["flexibleVersions"], version), structs)
    fields = reader.struct(spec["fields"])
    assert reader.pos == len(reader.data), f"{name}: {len(reader.data) - reader.pos} bytes left"
    return version, fields


def consumer_records(log_dir, partition):
    """``[(record name, key fields, value fields or None)]`` of the consumer group records, in log order."""
    by_version = {int(schema(f"{name}Key")["validVersions"]): name for name in RECORDS}
    out = []
    for key, value in stored_records(log_dir, partition):
        version, = struct.unpack_from(">h", key)
        if version in by_version:
            name = by_version[version]
            _, key_fields = decode(f"{name}Key", key)
            out.append((name, key_fields, None if value is None else decode(f"{name}Value", value)[1]))
    return out


def latest(records, group_id="g"):
    """The latest value of each record of ``group_id``: {(record name, member id or None): fields}."""
    state = {}
    for name, key, value in records:
        if key["GroupId"] == group_id:
            if value is None:
                state.pop((name, key.get("MemberId")), None)
            else:
                state[(name, key.get("MemberId"))] = value
    return state


# -- a coordinator over a log directory, restarted at will

@pytest.fixture
def cluster(tmp_path):
    running = Cluster(tmp_path)
    yield running
    running.close()


class Cluster:
    """A coordinator over a log directory, restarted at will; ``members`` heartbeat in group "g"."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.logs = LogManager(log_dir, cleaning(log_cleaner_min_cleanable_ratio=0.01))
        self.logs.create_topic("t", 4)
        self.coordinator = GroupCoordinator(self.logs, GroupConfig(offsets_topic_partitions=3))
        self.members = Members(self.coordinator, self.logs)

    def restart(self):
        """A clean restart: the members keep the epochs they were given."""
        self.coordinator.close()
        self.logs.close()
        self.logs = LogManager(self.log_dir, cleaning(log_cleaner_min_cleanable_ratio=0.01))
        self.coordinator = GroupCoordinator(self.logs, GroupConfig(offsets_topic_partitions=3))
        self.members.coordinator = self.coordinator

    def records(self, group_id="g"):
        return consumer_records(self.log_dir, partition_for(group_id, 3))

    def close(self):
        self.coordinator.close()
        self.logs.close()


def described(members):
    group = members.describe()
    parts = lambda assignment: {p for tp in assignment.topic_partitions for p in tp.partitions}    # noqa: E731
    return (group.group_state, group.group_epoch, group.assignment_epoch,
            {m.member_id: (m.member_epoch, m.client_id, m.subscribed_topic_names, parts(m.assignment),
                           parts(m.target_assignment)) for m in group.members})


def reconciling(members):
    """a owns all four partitions, b joined: a is to revoke two (it stays at epoch 1), b waits for them."""
    members.join("a")
    members.join("b")
    _, kept = members.beat("a", {0, 1, 2, 3})
    return kept


def test_kafkas_schemas_read_what_kmem_writes(cluster):
    members = cluster.members
    members.join("a")
    first = len(cluster.records())
    members.join("b")
    # the records of b's join, in the order Kafka's GroupMetadataManager writes (and replays) them
    assert [(name, key.get("MemberId")) for name, key, _ in cluster.records()[first:]] == [
        ("ConsumerGroupMemberMetadata", "b"), ("ConsumerGroupMetadata", None),
        ("ConsumerGroupTargetAssignmentMember", "a"), ("ConsumerGroupTargetAssignmentMember", "b"),
        ("ConsumerGroupTargetAssignmentMetadata", None), ("ConsumerGroupCurrentMemberAssignment", "b")]
    _, kept = members.beat("a", {0, 1, 2, 3})
    state = latest(cluster.records())
    topic = members.topic_id
    assert state[("ConsumerGroupMetadata", None)] == {"Epoch": 2}
    assert state[("ConsumerGroupTargetAssignmentMetadata", None)] == {"AssignmentEpoch": 2}
    assert state[("ConsumerGroupPartitionMetadata", None)] == {"Topics": [
        {"TopicId": topic, "TopicName": "t", "NumPartitions": 4, "PartitionMetadata": []}]}
    assert state[("ConsumerGroupMemberMetadata", "a")] == {
        "InstanceId": None, "RackId": None, "ClientId": "c", "ClientHost": "/127.0.0.1",
        "SubscribedTopicNames": ["t"], "SubscribedTopicRegex": None, "RebalanceTimeoutMs": 30000,
        "ServerAssignor": None, "ClassicMemberMetadata": None}
    targets = {m: {p for tp in state[("ConsumerGroupTargetAssignmentMember", m)]["TopicPartitions"]
                   for p in tp["Partitions"]} for m in "ab"}
    assert targets == {"a": kept, "b": {0, 1, 2, 3} - kept}
    # a revokes at its epoch (MemberState UNREVOKED_PARTITIONS = 1); b is at the group's, waiting (UNRELEASED = 2)
    assert state[("ConsumerGroupCurrentMemberAssignment", "a")] == {
        "MemberEpoch": 1, "PreviousMemberEpoch": 0, "State": 1,
        "AssignedPartitions": [{"TopicId": topic, "Partitions": sorted(kept)}],
        "PartitionsPendingRevocation": [{"TopicId": topic, "Partitions": sorted({0, 1, 2, 3} - kept)}]}
    assert state[("ConsumerGroupCurrentMemberAssignment", "b")] == {
        "MemberEpoch": 2, "PreviousMemberEpoch": 0, "State": 2, "AssignedPartitions": [],
        "PartitionsPendingRevocation": []}
    # a heartbeat that changes nothing writes nothing
    count = len(cluster.records())
    members.beat("b", set())
    assert len(cluster.records()) == count


def test_a_restart_keeps_the_group_and_its_members_carry_on(cluster):
    members = cluster.members
    kept = reconciling(members)
    before = described(members)
    cluster.restart()
    members = cluster.members
    assert described(members) == before
    group = cluster.coordinator.consumer_groups.groups["g"]
    # sessions start afresh at load, on the timer (a's revocation deadline too)
    assert all(m.session_deadline > time.monotonic() + 40 for m in group.members.values())
    assert group.members["a"].revocation_deadline > time.monotonic() + 25 and group.timer_task.pending
    # the reconciliation goes on where it was: nothing moves before a revoked, then b gets the rest
    assert members.beat("b", set()) == (2, None)
    assert members.beat("a", kept) == (2, None)
    assert members.beat("b", set()) == (2, {0, 1, 2, 3} - kept)
    assert members.beat("b", {0, 1, 2, 3} - kept) == (2, None)
    assert described(members)[:3] == ("Stable", 2, 2)


def test_a_static_member_that_left_for_now_takes_its_partitions_back_after_a_restart(cluster):
    members = cluster.members
    members.join("s1", instance_id="i")
    members.beat("s1", {0, 1, 2, 3}, instance_id="i")
    assert members.send("s1", -2, instance_id="i").error_code == ErrorCode.NONE
    cluster.restart()
    assert described(cluster.members)[3] == {"s1": (-2, "c", ["t"], {0, 1, 2, 3}, {0, 1, 2, 3})}
    back = cluster.members.join("s2", instance_id="i")
    assert (back.error_code, back.member_epoch) == (ErrorCode.NONE, 1)
    assert {p for tp in back.assignment.topic_partitions for p in tp.partitions} == {0, 1, 2, 3}


def test_tombstones_when_a_member_leaves_and_the_group_is_deleted_and_the_cleaner_drops_them(cluster):
    members = cluster.members
    members.join("a")
    members.join("b")
    assert members.send("b", -1).error_code == ErrorCode.NONE
    leave = [(name, key.get("MemberId"), value) for name, key, value in cluster.records()][-4:]
    assert leave[:3] == [("ConsumerGroupCurrentMemberAssignment", "b", None),
                         ("ConsumerGroupTargetAssignmentMember", "b", None), ("ConsumerGroupMemberMetadata", "b", None)]
    assert leave[3][:2] == ("ConsumerGroupMetadata", None) and leave[3][2]["Epoch"] == 3
    assert members.send("a", -1).error_code == ErrorCode.NONE
    assert members.describe().group_state == "Empty"
    request = messages.DeleteGroupsRequest(groups_names=["g"])
    deleted = cluster.coordinator.delete_groups(RequestHeader(ApiKey.DELETE_GROUPS, 2, 1, "c"), request)
    assert deleted.results[0].error_code == ErrorCode.NONE
    # Kafka's createGroupTombstoneRecords, and no classic GroupMetadata tombstone
    assert [(name, value) for name, _, value in cluster.records()][-3:] == [
        ("ConsumerGroupTargetAssignmentMetadata", None), ("ConsumerGroupPartitionMetadata", None),
        ("ConsumerGroupMetadata", None)]
    assert latest(cluster.records()) == {}
    index = partition_for("g", 3)
    assert all(struct.unpack_from(">h", key)[0] != 2 for key, _ in stored_records(cluster.log_dir, index))
    partition = cluster.logs.get_partition(OFFSETS_TOPIC, index)
    partition.roll()
    now = int(time.time() * 1000)
    assert cluster.logs.cleaner.clean_filthiest(now)[0] == (OFFSETS_TOPIC, index)
    assert {value for _, _, value in cluster.records()} == {None}          # only tombstones, kept a while
    members.join("x")        # the group again, new: something to clean past delete.retention.ms
    partition.roll()
    assert cluster.logs.cleaner.clean_filthiest(now + 86_400_001)[0] == (OFFSETS_TOPIC, index)
    remaining = cluster.records()
    assert all(value is not None for _, _, value in remaining) and len(remaining) == len(latest(remaining)) == 6
    cluster.restart()
    assert described(cluster.members)[1:] == (1, 1, {"x": (1, "c", ["t"], {0, 1, 2, 3}, {0, 1, 2, 3})})


def test_an_emptied_group_goes_with_tombstones_at_the_retention_check(cluster):
    """Kafka's periodic cleanup (``cleanupGroupMetadata``) deletes an empty group without offsets: until then it
    stays, over a restart too."""
    members = cluster.members
    members.join("a")
    assert members.send("a", -1).error_code == ErrorCode.NONE
    cluster.restart()
    assert described(cluster.members)[:2] == ("Empty", 2)
    interval_ms = cluster.coordinator.config.offsets_retention_check_interval_ms
    cluster.coordinator.tick(time.monotonic() + interval_ms / 1000, time.time_ns() // 1_000_000 + interval_ms + 1)
    assert latest(cluster.records()) == {}
    assert [name for name, _, _ in cluster.records()][-3:] == [
        "ConsumerGroupTargetAssignmentMetadata", "ConsumerGroupPartitionMetadata", "ConsumerGroupMetadata"]
    cluster.restart()
    assert cluster.members.describe().error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_a_classic_join_takes_over_an_empty_consumer_group_and_its_records_go(cluster):
    members = cluster.members
    members.join("a")
    assert members.send("a", -1).error_code == ErrorCode.NONE
    assert latest(cluster.records()) != {}
    assert join(cluster.coordinator).error_code == ErrorCode.MEMBER_ID_REQUIRED      # a classic member (KIP-394)
    assert latest(cluster.records()) == {}
    cluster.restart()
    assert "g" not in cluster.coordinator.consumer_groups.groups


def test_a_failed_write_is_not_coordinator_and_leaves_the_group_as_the_log_has_it(cluster, monkeypatch):
    members = cluster.members
    members.join("a")
    before = described(members)
    fail_appends(monkeypatch, cluster.logs, OFFSETS_TOPIC, "result")
    refused = members.join("b")
    assert (refused.error_code, refused.member_epoch) == (ErrorCode.NOT_COORDINATOR, 0)
    assert described(members) == before
    assert members.send("a", -1).error_code == ErrorCode.NOT_COORDINATOR
    assert members.beat("a", {0, 1, 2, 3}) == (1, None)               # still a member, at its epoch
    # a session timeout whose fence cannot be written: the member stays, with a new session
    group = cluster.coordinator.consumer_groups.groups["g"]
    cluster.coordinator.consumer_groups.expire(group, time.monotonic() + 46)
    group = cluster.coordinator.consumer_groups.groups["g"]
    assert set(group.members) == {"a"} and group.members["a"].session_deadline > time.monotonic() + 40
    monkeypatch.undo()
    assert members.join("b").error_code == ErrorCode.NONE
    after = described(members)
    cluster.restart()
    assert described(cluster.members) == after


def test_a_damaged_record_is_skipped_at_load(cluster, caplog):
    members = cluster.members
    members.join("a")
    good = latest(cluster.records())[("ConsumerGroupCurrentMemberAssignment", "a")]
    key = consumer_group_key(CURRENT_ASSIGNMENT, "g", "a")
    assert cluster.coordinator._append("g", [(key, b"\x00\x00\x00\x00\x00\x07")]) == ErrorCode.NONE   # truncated
    assert cluster.coordinator._append("g", [(key, b"\x00\x05" + b"\x00" * 12)]) == ErrorCode.NONE    # version 5
    with caplog.at_level(logging.WARNING, logger="kmem.broker.group.coordinator"):
        cluster.restart()
    assert sum("skipping a record" in r.getMessage() for r in caplog.records) == 2
    assert "truncated" in caplog.text and "unknown ConsumerGroupCurrentMemberAssignment value version 5" in caplog.text
    group = cluster.coordinator.consumer_groups.groups["g"]
    assert (group.members["a"].epoch, group.members["a"].assigned) == (
        good["MemberEpoch"], {cluster.members.topic_id: frozenset(good["AssignedPartitions"][0]["Partitions"])})


def test_dump_log_prints_them_as_kafkas_offsets_decoder(cluster, capsys):
    cluster.members.join("a", instance_id="i", server_assignor="range")
    topic = base64.urlsafe_b64encode(cluster.members.topic_id.bytes).decode().rstrip("=")
    segment = next((cluster.log_dir / f"{OFFSETS_TOPIC}-{partition_for('g', 3)}").glob("*.log"))
    code, out, _ = dump(capsys, "--files", segment, "--offsets-decoder", "--skip-record-metadata")
    key = '| key: {"type":"%d","data":{"groupId":"g"%s}} payload: {"version":"0","data":'
    member = ',"memberId":"a"'
    assert code == 0 and [line for line in out if line.startswith("|")] == [
        key % (5, member) + '{"instanceId":"i","rackId":null,"clientId":"c","clientHost":"/127.0.0.1",'
        '"subscribedTopicNames":["t"],"subscribedTopicRegex":null,"rebalanceTimeoutMs":30000,"serverAssignor":"range",'
        '"classicMemberMetadata":null}}',
        key % (4, "") + '{"topics":[{"topicId":"%s","topicName":"t","numPartitions":4,"partitionMetadata":[]}]}}'
        % topic,
        key % (3, "") + '{"epoch":1}}',
        key % (7, member) + '{"topicPartitions":[{"topicId":"%s","partitions":[0,1,2,3]}]}}' % topic,
        key % (6, "") + '{"assignmentEpoch":1}}',
        key % (8, member) + '{"memberEpoch":1,"previousMemberEpoch":0,"state":0,"assignedPartitions":[{"topicId":'
        '"%s","partitions":[0,1,2,3]}],"partitionsPendingRevocation":[]}}' % topic]
    # Kafka's DumpLogSegmentsTest.testOffsetsMessageParser
    record = Record(0, consumer_group_key(3, "group"), consumer_group_value(GroupEpoch(10)))
    assert parse_offsets_record(record) == ('{"type":"3","data":{"groupId":"group"}}',
                                            '{"version":"0","data":{"epoch":10}}')
    assert parse_offsets_record(record._replace(value=None))[1] == "<DELETE>"
    assert parse_offsets_record(record._replace(key=struct.pack(">h", 32767) + record.key[2:])) == (
        "Unknown record type 32767 at offset 0, skipping.", None)
    damaged = parse_offsets_record(record._replace(value=b"\x00\x00\x01"))
    assert damaged[0].startswith("Error at offset 0, skipping.") and damaged[1] is None


# -- over the wire: SIGKILL

def test_a_member_carries_on_after_the_broker_is_killed(tmp_path):
    properties = tmp_path / "server.properties"
    properties.write_text("offsets.topic.num.partitions=3\n")
    log_dir = tmp_path / "logs"
    process, bootstrap = start_broker_process(log_dir, "--config", str(properties))
    try:
        with RawConnection(bootstrap) as connection:
            connection.call(ApiKey.CREATE_TOPICS, 4, messages.CreateTopicsRequest(topics=[
                messages.CreateTopicsRequest.CreatableTopic(name="t", num_partitions=2, replication_factor=1,
                                                            assignments=[], configs=[])], timeout_ms=10000,
                validate_only=False))
            joined = connection.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, H(
                group_id="g", member_id="m", member_epoch=0, rebalance_timeout_ms=1000, subscribed_topic_names=["t"],
                topic_partitions=[]))
            assert (joined.error_code, joined.member_epoch) == (ErrorCode.NONE, 1)
            owned = joined.assignment.topic_partitions
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    process, bootstrap = start_broker_process(log_dir, "--config", str(properties))
    try:
        with RawConnection(bootstrap) as connection:
            beat = connection.call(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, H(
                group_id="g", member_id="m", member_epoch=1, topic_partitions=[
                    H.TopicPartitions(topic_id=tp.topic_id, partitions=tp.partitions) for tp in owned]))
            assert (beat.error_code, beat.member_epoch) == (ErrorCode.NONE, 1)
            group = connection.call(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, messages.ConsumerGroupDescribeRequest(
                group_ids=["g"], include_authorized_operations=False)).groups[0]
            assert (group.group_state, group.group_epoch, [m.member_epoch for m in group.members]) == ("Stable", 1, [1])
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


# -- Kafka's own serde (the logdir oracle of /work/shared/kafka-oracles, when built)

@pytest.mark.skipif(not os.path.exists(ORACLE), reason="the logdir oracle is not built (kafka-oracles/build-logdir.sh)")
def test_kafkas_serde_reads_and_re_encodes_the_records(tmp_path):
    cluster = Cluster(tmp_path / "logs")
    try:
        kept = reconciling(cluster.members)
        cluster.members.join("s", instance_id="i")
        assert cluster.members.send("b", -1).error_code == ErrorCode.NONE
        cluster.members.beat("a", kept)
        written = len(cluster.records())
    finally:
        cluster.close()
    result = subprocess.run([ORACLE, str(tmp_path / "logs")], capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    index = partition_for("g", 3)
    # every record decoded by Kafka's CoordinatorRecordSerde (the consumer group's count as "other")...
    assert f"AGREE consumer-offsets.decode {OFFSETS_TOPIC}-{index} 0 OffsetCommit, 0 GroupMetadata, 0 tombstones, " \
           f"{written} other, 0 control batches decoded by CoordinatorRecordSerde" in lines, result.stdout
    # ...and re-encoded by it to the same bytes
    assert f"AGREE consumer-offsets.re-encode {OFFSETS_TOPIC}-{index} every key and value re-encodes to the same " \
           "bytes" in lines, result.stdout
    assert lines[-1].startswith("SUMMARY") and " disagree=0 " in lines[-1] + " ", result.stdout
