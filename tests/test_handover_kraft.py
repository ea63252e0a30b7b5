"""``kmem handover kraft``: the KRaft cluster metadata of a kmem log directory, read back by a reader written here
from Kafka 3.9's metadata JSON schemas (``metadata/src/main/resources/common/metadata/*.json``, the control records'
``clients/src/main/resources/common/message/Snapshot{Header,Footer}Record.json``) and the KIP-630 snapshot layout,
with the batch CRCs (CRC-32C of the ``crc32c`` package) Kafka checks; the refusals, which write nothing; a hand-over
killed half-way; and, when it is built, Kafka's own code (the kraft oracle of ``kafka-oracles``) as the judge."""
import errno
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import uuid

import crc32c
import pytest

from kmem.admin import handover
from kmem.broker.codes import ErrorCode, LogError
from kmem.broker.log import checkpoints
from kmem.broker.log.manager import LogManager
from kmem.broker.security.authorizer import AclBinding, StandardAuthorizer
from kmem.broker.security.credentials import ScramCredentialStore
from kmem.broker.security.scram import credential_from_password
from kmem.cli import main
from kmem.errors import IllegalStateError, KmemError
from kmem.records.builders import build_records

NODE = 3
ORACLE = os.environ.get("KRAFT_ORACLE", "/tmp/kraft-oracle/run-oracle")

# Kafka 3.9's schemas of what a hand-over writes, as in its JSON files (the "about" texts left out).
KAFKA_SCHEMAS = json.loads("""[
 {"apiKey": 12, "name": "FeatureLevelRecord", "fields": [
   {"name": "Name", "type": "string", "versions": "0+"}, {"name": "FeatureLevel", "type": "int16", "versions": "0+"}]},
 {"apiKey": 2, "name": "TopicRecord", "fields": [
   {"name": "Name", "type": "string", "versions": "0+"}, {"name": "TopicId", "type": "uuid", "versions": "0+"}]},
 {"apiKey": 3, "name": "PartitionRecord", "fields": [
   {"name": "PartitionId", "type": "int32", "versions": "0+", "default": "-1"},
   {"name": "TopicId", "type": "uuid", "versions": "0+"},
   {"name": "Replicas", "type": "[]int32", "versions": "0+"}, {"name": "Isr", "type": "[]int32", "versions": "0+"},
   {"name": "RemovingReplicas", "type": "[]int32", "versions": "0+"},
   {"name": "AddingReplicas", "type": "[]int32", "versions": "0+"},
   {"name": "Leader", "type": "int32", "versions": "0+", "default": "-1"},
   {"name": "LeaderRecoveryState", "type": "int8", "default": "0", "versions": "0+", "taggedVersions": "0+",
    "tag": 0},
   {"name": "LeaderEpoch", "type": "int32", "versions": "0+", "default": "-1"},
   {"name": "PartitionEpoch", "type": "int32", "versions": "0+", "default": "-1"},
   {"name": "Directories", "type": "[]uuid", "versions": "1+"},
   {"name": "EligibleLeaderReplicas", "type": "[]int32", "default": "null", "versions": "2+",
    "nullableVersions": "2+", "taggedVersions": "2+", "tag": 1},
   {"name": "LastKnownElr", "type": "[]int32", "default": "null", "versions": "2+", "nullableVersions": "2+",
    "taggedVersions": "2+", "tag": 2}]},
 {"apiKey": 4, "name": "ConfigRecord", "fields": [
   {"name": "ResourceType", "type": "int8", "versions": "0+"},
   {"name": "ResourceName", "type": "string", "versions": "0+"}, {"name": "Name", "type": "string", "versions": "0+"},
   {"name": "Value", "type": "string", "versions": "0+", "nullableVersions": "0+"}]},
 {"apiKey": 15, "name": "ProducerIdsRecord", "fields": [
   {"name": "BrokerId", "type": "int32", "versions": "0+"},
   {"name": "BrokerEpoch", "type": "int64", "versions": "0+", "default": "-1"},
   {"name": "NextProducerId", "type": "int64", "versions": "0+"}]},
 {"apiKey": 11, "name": "UserScramCredentialRecord", "fields": [
   {"name": "Name", "type": "string", "versions": "0+"}, {"name": "Mechanism", "type": "int8", "versions": "0+"},
   {"name": "Salt", "type": "bytes", "versions": "0+"}, {"name": "StoredKey", "type": "bytes", "versions": "0+"},
   {"name": "ServerKey", "type": "bytes", "versions": "0+"},
   {"name": "Iterations", "type": "int32", "versions": "0+"}]},
 {"apiKey": 18, "name": "AccessControlEntryRecord", "fields": [
   {"name": "Id", "type": "uuid", "versions": "0+"}, {"name": "ResourceType", "type": "int8", "versions": "0+"},
   {"name": "ResourceName", "type": "string", "versions": "0+"},
   {"name": "PatternType", "type": "int8", "versions": "0+"},
   {"name": "Principal", "type": "string", "versions": "0+"}, {"name": "Host", "type": "string", "versions": "0+"},
   {"name": "Operation", "type": "int8", "versions": "0+"}, {"name": "PermissionType", "type": "int8", "versions": "0+"}]},
 {"name": "SnapshotHeaderRecord", "fields": [
   {"name": "Version", "type": "int16", "versions": "0+"},
   {"name": "LastContainedLogTimestamp", "type": "int64", "versions": "0+"}]},
 {"name": "SnapshotFooterRecord", "fields": [{"name": "Version", "type": "int16", "versions": "0+"}]}
]""")
BY_API_KEY = {schema["apiKey"]: schema for schema in KAFKA_SCHEMAS if "apiKey" in schema}
BY_NAME = {schema["name"]: schema for schema in KAFKA_SCHEMAS}
FIXED = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q"}


def in_versions(text, version):
    return text is not None and version >= int(text.rstrip("+"))


class Reader:
    def __init__(self, data, pos=0):
        self.data, self.pos = data, pos

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError(f"{n} bytes wanted at {self.pos}, {len(self.data) - self.pos} left")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def fixed(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def uvarint(self):
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def varint(self):                   # zig-zag, the records' varints
        value = self.uvarint()
        return (value >> 1) ^ -(value & 1)


def decode_value(reader, kind):
    if kind in FIXED:
        return reader.fixed(FIXED[kind])
    if kind == "uuid":
        return checkpoints.uuid_string(reader.take(16))
    length = reader.uvarint() - 1       # compact string / bytes (every metadata record is flexible)
    if length < 0:
        return None
    raw = reader.take(length)
    return raw.decode() if kind == "string" else raw


def decode_struct(fields, version, reader):
    """A flexible struct of ``version``: the fields present, then the tagged fields."""
    out = {}
    for field in fields:
        if in_versions(field.get("taggedVersions"), version):
            out[field["name"]] = None if field.get("default") == "null" else int(field.get("default", 0))
        elif in_versions(field["versions"], version):
            if field["type"].startswith("[]"):
                count = reader.uvarint() - 1
                out[field["name"]] = None if count < 0 else [decode_value(reader, field["type"][2:])
                                                              for _ in range(count)]
            else:
                out[field["name"]] = decode_value(reader, field["type"])
    for _ in range(reader.uvarint()):
        tag, size = reader.uvarint(), reader.uvarint()
        field = next(f for f in fields if f.get("tag") == tag and in_versions(f.get("taggedVersions"), version))
        out[field["name"]] = decode_value(Reader(reader.take(size)), field["type"])
    return out


def read_batches(data):
    """``[(base offset, partition leader epoch, attributes, [(offset, key, value)])]`` of v2 batches, each CRC
    checked as Kafka's ``DefaultRecordBatch.ensureValid`` does."""
    batches, reader = [], Reader(data)
    while reader.pos < len(data):
        base_offset, length = reader.fixed(">q"), reader.fixed(">i")
        body = Reader(reader.take(length))
        epoch, magic, crc = body.fixed(">i"), body.fixed(">b"), body.fixed(">I")
        assert magic == 2
        assert crc32c.crc32c(body.data[body.pos:]) == crc, f"batch at {base_offset}: CRC mismatch"
        attributes, last_delta = body.fixed(">h"), body.fixed(">i")
        body.take(8 + 8)                                    # base and max timestamps
        producer_id, producer_epoch, base_sequence = body.fixed(">q"), body.fixed(">h"), body.fixed(">i")
        assert (producer_id, producer_epoch, base_sequence) == (-1, -1, -1)
        records = []
        for _ in range(body.fixed(">i")):
            record = Reader(body.take(body.varint()))
            record.take(1)
            record.varint()
            offset_delta = record.varint()
            key_length = record.varint()
            key = record.take(key_length) if key_length >= 0 else None
            value_length = record.varint()
            value = record.take(value_length) if value_length >= 0 else None
            assert record.varint() == 0 and record.pos == len(record.data)
            records.append((base_offset + offset_delta, key, value))
        assert body.pos == len(body.data) and records[-1][0] == base_offset + last_delta
        batches.append((base_offset, epoch, attributes, records))
    return batches


def read_snapshot(path):
    """``(header, footer, [(record name, version, fields)])`` of a KRaft snapshot file, its layout checked:
    a control batch with the header first, one with the footer last, metadata records between, offsets from 0."""
    batches = read_batches(open(path, "rb").read())
    end_offset, epoch = (int(part) for part in os.path.basename(path)[:-len(".checkpoint")].split("-"))
    assert all(batch_epoch == epoch for _, batch_epoch, _, _ in batches)
    offsets = [offset for *_, records in batches for offset, _, _ in records]
    assert offsets == list(range(len(offsets)))
    control = [attributes & 0x20 != 0 for _, _, attributes, _ in batches]
    assert control[0] and control[-1] and not any(control[1:-1])

    def control_record(batch, control_type, name):
        (_, key, value), = batch[3]
        assert struct.unpack(">hh", key) == (0, control_type)
        reader = Reader(value)
        decoded = decode_struct(BY_NAME[name]["fields"], 0, reader)
        assert reader.pos == len(value)
        return decoded

    header = control_record(batches[0], 3, "SnapshotHeaderRecord")
    footer = control_record(batches[-1], 4, "SnapshotFooterRecord")
    records = []
    for *_, batch_records in batches[1:-1]:
        for _, key, value in batch_records:
            assert key is None
            reader = Reader(value)
            frame, api_key, version = reader.uvarint(), reader.uvarint(), reader.uvarint()
            assert frame == 1
            schema = BY_API_KEY[api_key]
            records.append((schema["name"], version, decode_struct(schema["fields"], version, reader)))
            assert reader.pos == len(value)
    assert end_offset == len(records) and epoch >= 1
    return header, footer, records


def files_of(directory):
    """Every file under ``directory`` with its bytes: what a refused hand-over must leave as it was."""
    found = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = open(path, "rb").read() if name in files else None
    return found


def make_kmem_dir(log_dir):
    """A stopped kmem broker's directory: two topics (configs, records), producer ids, SCRAM users, an ACL."""
    with LogManager(log_dir) as logs:
        logs.create_topic("orders", 3, {"retention.ms": "86400000", "cleanup.policy": "compact"})
        logs.create_topic("events", 1)
        logs.get_partition("orders", 1).append(build_records([{"key": b"k", "value": b"v%d" % i} for i in range(3)]))
        issued = [logs.allocate_producer_id() for _ in range(5)]
    # orders-1 as a leader at epoch 4 since offset 2 left it
    checkpoints.write_leader_epoch_checkpoint(os.path.join(log_dir, "orders-1", checkpoints.LEADER_EPOCH_CHECKPOINT),
                                              [(0, 0), (4, 2)])
    ScramCredentialStore(log_dir).add("SCRAM-SHA-256", "alice", credential_from_password("SCRAM-SHA-256", "secret"))
    ScramCredentialStore(log_dir).add("SCRAM-SHA-512", "bob", credential_from_password("SCRAM-SHA-512", "secret2"))
    StandardAuthorizer(log_dir).create([AclBinding.of(2, "orders", 3, "User:alice", "*", 3, 3)])
    return issued


def topic_ids(log_dir):
    return {name.rsplit("-", 1)[0]: checkpoints.read_partition_metadata(os.path.join(log_dir, name,
                                                                                       checkpoints.PARTITION_METADATA))
            for name in os.listdir(log_dir) if name.endswith("-0") and name != handover.METADATA_PARTITION}


def the_snapshot(log_dir):
    metadata = os.path.join(log_dir, handover.METADATA_PARTITION)
    snapshots = [name for name in os.listdir(metadata) if name.endswith(".checkpoint")]
    assert len(snapshots) == 1
    return os.path.join(metadata, snapshots[0])


def test_the_snapshot_holds_every_topic_partition_config_producer_id_block_user_and_acl(tmp_path):
    log_dir = str(tmp_path / "kd")
    issued = make_kmem_dir(log_dir)
    ids = topic_ids(log_dir)
    directory_id = checkpoints.read_properties(os.path.join(log_dir, "meta.properties"))["directory.id"]

    handover.handover_kraft(log_dir, NODE)

    header, footer, records = read_snapshot(the_snapshot(log_dir))
    assert header["Version"] == 0 and header["LastContainedLogTimestamp"] > 0 and footer == {"Version": 0}
    by_type = {}
    for name, version, fields in records:
        by_type.setdefault(name, []).append((version, fields))
    assert by_type["FeatureLevelRecord"] == [(0, {"Name": "metadata.version", "FeatureLevel": 21})]
    assert {f["Name"]: f["TopicId"] for _, f in by_type["TopicRecord"]} == ids
    partitions = {(f["TopicId"], f["PartitionId"]): (v, f) for v, f in by_type["PartitionRecord"]}
    assert sorted(partitions) == sorted([(ids["orders"], p) for p in range(3)] + [(ids["events"], 0)])
    for (topic_id, number), (version, fields) in partitions.items():
        assert version == 1
        assert (fields["Replicas"], fields["Isr"], fields["Leader"], fields["Directories"]) == \
            ([NODE], [NODE], NODE, [directory_id])
        assert fields["RemovingReplicas"] == fields["AddingReplicas"] == []
        assert fields["LeaderRecoveryState"] == 0 and fields["PartitionEpoch"] == 0
        assert fields["LeaderEpoch"] == (4 if (topic_id, number) == (ids["orders"], 1) else 0)
    assert sorted((f["ResourceType"], f["ResourceName"], f["Name"], f["Value"]) for _, f in by_type["ConfigRecord"]) \
        == [(2, "orders", "cleanup.policy", "compact"), (2, "orders", "retention.ms", "86400000")]
    (_, producer_ids), = by_type["ProducerIdsRecord"]
    assert producer_ids["BrokerId"] == NODE and producer_ids["NextProducerId"] > max(issued)
    store = ScramCredentialStore(log_dir)
    assert sorted((f["Name"], f["Mechanism"], f["Salt"], f["StoredKey"], f["ServerKey"], f["Iterations"])
                  for _, f in by_type["UserScramCredentialRecord"]) == [
        (user, code, c.salt, c.stored_key, c.server_key, c.iterations)
        for user, code, c in (("alice", 1, store.get("SCRAM-SHA-256", "alice")),
                              ("bob", 2, store.get("SCRAM-SHA-512", "bob")))]
    (acl_id, acl), = StandardAuthorizer(log_dir).entries()
    assert [f for _, f in by_type["AccessControlEntryRecord"]] == [{
        "Id": checkpoints.uuid_string(uuid.UUID(acl_id).bytes), "ResourceType": 2, "ResourceName": "orders",
        "PatternType": 3, "Principal": "User:alice", "Host": "*", "Operation": 3, "PermissionType": 3}]

    metadata = os.path.join(log_dir, handover.METADATA_PARTITION)
    assert checkpoints.read_partition_metadata(os.path.join(metadata, "partition.metadata")) == "AAAAAAAAAAAAAAAAAAAAAQ"
    quorum = json.load(open(os.path.join(metadata, "quorum-state")))
    assert quorum["data_version"] == 0 and quorum["currentVoters"] == [{"voterId": NODE}]
    assert quorum["leaderEpoch"] >= int(os.path.basename(the_snapshot(log_dir))[21:31])
    meta = checkpoints.read_properties(os.path.join(log_dir, "meta.properties"))
    assert (meta["version"], meta["node.id"], meta["directory.id"]) == ("1", str(NODE), directory_id)


def test_the_internal_topics_stay_compacted(tmp_path):
    log_dir = str(tmp_path / "kd")
    with LogManager(log_dir) as logs:
        logs.create_topic("__consumer_offsets", 2)          # as an older kmem made it: no cleanup.policy

    handover.handover_kraft(log_dir, NODE)

    _, _, records = read_snapshot(the_snapshot(log_dir))
    assert [(f["ResourceName"], f["Name"], f["Value"]) for name, _, f in records if name == "ConfigRecord"] == \
        [("__consumer_offsets", "cleanup.policy", "compact")]


def test_the_command_prints_the_server_properties_of_the_kafka_node(tmp_path, capsys):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)

    assert main(["handover", "kraft", "--log-dir", log_dir, "--node-id", str(NODE),
                 "--listeners", "PLAINTEXT://0.0.0.0:9092,CONTROLLER://host1:9093"]) == 0

    lines = capsys.readouterr().out.splitlines()
    settings = dict(line.split("=", 1) for line in lines if not line.startswith("#"))
    assert settings["process.roles"] == "broker,controller"
    assert settings["node.id"] == str(NODE)
    assert settings["controller.quorum.voters"] == f"{NODE}@host1:9093"
    assert settings["controller.listener.names"] == "CONTROLLER"
    assert settings["listeners"] == "PLAINTEXT://0.0.0.0:9092,CONTROLLER://host1:9093"
    assert settings["log.dirs"] == os.path.abspath(log_dir)
    assert "2 topics, 4 partitions" in lines[0]
    assert "offsets.topic.num.partitions" not in settings


def test_the_coordinators_partition_counts_are_printed(tmp_path, capsys):
    log_dir = str(tmp_path / "kd")
    with LogManager(log_dir) as logs:
        logs.create_topic("__consumer_offsets", 7, {"cleanup.policy": "compact"})
        logs.create_topic("__transaction_state", 5, {"cleanup.policy": "compact"})

    assert main(["handover", "kraft", "--log-dir", log_dir, "--node-id", "1"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert "offsets.topic.num.partitions=7" in lines and "transaction.state.log.num.partitions=5" in lines


def test_a_new_cluster_id_goes_to_meta_properties(tmp_path):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    cluster_id = checkpoints.random_uuid()

    handover.handover_kraft(log_dir, NODE, cluster_id)

    assert checkpoints.read_properties(os.path.join(log_dir, "meta.properties"))["cluster.id"] == cluster_id


def test_kmem_still_opens_the_directory_and_serves_the_same_topics(tmp_path):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    with LogManager(log_dir) as logs:
        before = {name: (info.topic_id, info.partitions, dict(info.configs)) for name, info in logs.topics().items()}

    handover.handover_kraft(log_dir, 1)         # kmem's default node.id
    handover.handover_kraft(log_dir, 1)         # again: the earlier metadata partition is replaced

    with LogManager(log_dir) as logs:
        assert {name: (info.topic_id, info.partitions, dict(info.configs))
                for name, info in logs.topics().items()} == before
        assert logs.get_partition("orders", 1).log_end_offset == 3
    assert len(os.listdir(os.path.join(log_dir, handover.METADATA_PARTITION))) == 3


def test_kmem_creates_no_topic_named_as_the_metadata_log(tmp_path):
    with LogManager(tmp_path / "kd") as logs:
        with pytest.raises(LogError) as raised:
            logs.create_topic("__cluster_metadata", 1)
        assert raised.value.code == ErrorCode.INVALID_REQUEST
        assert logs.topics() == {}


def refuse(log_dir, expected):
    before = files_of(log_dir)
    with pytest.raises(KmemError) as raised:
        handover.handover_kraft(log_dir, NODE)
    assert expected in str(raised.value)
    assert files_of(log_dir) == before
    return raised.value


def test_refused_while_a_broker_holds_the_directory(tmp_path, capsys):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    with LogManager(log_dir):
        before = files_of(log_dir)
        assert isinstance(refuse(log_dir, "in use by a running broker"), IllegalStateError)
        assert main(["handover", "kraft", "--log-dir", log_dir, "--node-id", "1"]) == 2
        assert "in use by a running broker" in capsys.readouterr().err
        assert files_of(log_dir) == before


def test_refused_for_a_partition_without_a_topic_id(tmp_path):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    os.unlink(os.path.join(log_dir, "orders-2", "partition.metadata"))
    refuse(log_dir, "orders-2: no partition.metadata")


def test_refused_for_a_topic_name_kafka_refuses(tmp_path):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    os.mkdir(os.path.join(log_dir, "bad name-0"))
    checkpoints.write_partition_metadata(os.path.join(log_dir, "bad name-0", "partition.metadata"),
                                         checkpoints.random_uuid())
    refuse(log_dir, "Kafka refuses the topic name 'bad name'")


def test_refused_for_an_unknown_config(tmp_path):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    path = os.path.join(log_dir, "kmem-topics.json")
    configs = json.load(open(path))
    configs["orders"]["retention.millis"] = "1000"
    with open(path, "w") as file:
        json.dump(configs, file)
    refuse(log_dir, "retention.millis")


def test_refused_for_malformed_topic_configs(tmp_path):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    with open(os.path.join(log_dir, "kmem-topics.json"), "w") as file:
        json.dump({"orders": ["cleanup.policy"]}, file)
    refuse(log_dir, "expected {topic: {config: value}}")


def test_a_malformed_listener_writes_nothing(tmp_path, capsys):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    before = files_of(log_dir)

    assert main(["handover", "kraft", "--log-dir", log_dir, "--node-id", "1", "--listeners", "PLAINTEXT://host"]) == 2

    assert "listener 'PLAINTEXT://host' is not NAME://HOST:PORT" in capsys.readouterr().err
    assert files_of(log_dir) == before


def test_a_full_disk_half_way_leaves_nothing(tmp_path, monkeypatch):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    before = files_of(log_dir)
    written = []

    def write_until_full(path, data):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        written.append(path)
        real_write(path, data)
    real_write = handover._write_synced
    monkeypatch.setattr(handover, "_write_synced", write_until_full)

    with pytest.raises(OSError):
        handover.handover_kraft(log_dir, NODE)

    assert written and files_of(log_dir) == before


def test_refused_once_a_kafka_node_wrote_its_metadata_log(tmp_path):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    handover.handover_kraft(log_dir, NODE)
    with open(os.path.join(log_dir, handover.METADATA_PARTITION, "00000000000000000012.log"), "wb") as segment:
        segment.write(b"\0" * 100)
    refuse(log_dir, "a Kafka node has run on this directory")


KILLER = """
import os, signal, sys
from kmem.admin import handover
point, calls = sys.argv[2], [0]
def kill_at(function, nth):
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return function(*args, **kwargs)
    return wrapper
if point == "writing":          # the second file of the metadata partition
    handover._write_synced = kill_at(handover._write_synced, 2)
else:                           # the renames into place
    os.rename = kill_at(os.rename, 1 if point == "renaming" else 2)
handover.handover_kraft(sys.argv[1], 1)
"""


@pytest.mark.parametrize("point", ["writing", "renaming", "replacing"])
def test_a_handover_killed_half_way_leaves_a_directory_kmem_opens(tmp_path, point):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    if point == "replacing":    # an earlier hand-over's metadata partition is set aside, the new one not yet in
        handover.handover_kraft(log_dir, 1)
    with LogManager(log_dir) as logs:
        before = {name: (info.topic_id, info.partitions) for name, info in logs.topics().items()}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.run([sys.executable, "-c", KILLER, log_dir, point], env=env, capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert [name for name in os.listdir(log_dir) if name.endswith("-delete")]      # it was cut short

    with LogManager(log_dir) as logs:
        assert {name: (info.topic_id, info.partitions) for name, info in logs.topics().items()} == before
        assert logs.get_partition("orders", 1).log_end_offset == 3
    assert not [name for name in os.listdir(log_dir) if name.endswith("-delete")]

    handover.handover_kraft(log_dir, 1)
    _, _, records = read_snapshot(the_snapshot(log_dir))
    assert sorted(f["Name"] for name, _, f in records if name == "TopicRecord") == ["events", "orders"]


def test_a_thousand_partitions_hand_over(tmp_path):
    log_dir = tmp_path / "kd"
    with LogManager(log_dir):
        pass
    ids = {}
    for t in range(100):
        ids[f"topic-{t}"] = checkpoints.random_uuid()
        for p in range(10):
            (log_dir / f"topic-{t}-{p}").mkdir()
            (log_dir / f"topic-{t}-{p}" / "partition.metadata").write_text(f"version: 0\ntopic_id: {ids[f'topic-{t}']}")

    plan = handover.handover_kraft(log_dir, NODE)

    assert plan.partition_count == 1000
    _, _, records = read_snapshot(the_snapshot(str(log_dir)))
    assert {f["Name"]: f["TopicId"] for name, _, f in records if name == "TopicRecord"} == ids
    names = {topic_id: name for name, topic_id in ids.items()}
    assert sorted((names[f["TopicId"]], f["PartitionId"]) for name, _, f in records if name == "PartitionRecord") \
        == sorted((name, p) for name in ids for p in range(10))


@pytest.mark.skipif(not os.access(ORACLE, os.X_OK) or shutil.which("java") is None,
                    reason="the kraft oracle is not built (kafka-oracles/build-kraft.sh) or no Java runtime")
def test_kafka_loads_the_metadata_and_keeps_every_partition(tmp_path):
    log_dir = str(tmp_path / "kd")
    make_kmem_dir(log_dir)
    ids = topic_ids(log_dir)
    handover.handover_kraft(log_dir, NODE)

    result = subprocess.run([ORACLE, log_dir], capture_output=True, text=True, timeout=300)

    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    verdict = lines[-1]
    assert verdict["type"] == "verdict" and verdict["accepted"], result.stdout
    assert (verdict["strays"], verdict["faults"], verdict["fatal"], verdict["warnings"]) == ([], [], [], [])
    topics = {line["name"]: line for line in lines if line["type"] == "topic"}
    assert {name: topic["id"] for name, topic in topics.items()} == ids
    assert [p["leader_epoch"] for p in topics["orders"]["partitions"]] == [0, 4, 0]
    assert topics["orders"]["configs"] == {"cleanup.policy": "compact", "retention.ms": "86400000"}
    image, = [line for line in lines if line["type"] == "image"]
    assert image["metadata_version"] == "3.9-IV0"
    assert sorted(line["user"] for line in lines if line["type"] == "scram") == ["alice", "bob"]
    assert len([line for line in lines if line["type"] == "acl"]) == 1
    assert result.returncode == 0
