"""``kmem handover kraft``: the cluster metadata a single Kafka 3.9 KRaft node (``process.roles=broker,controller``)
loads when it starts on a stopped kmem broker's log directory.

A KRaft node reads its topics from the ``__cluster_metadata`` log, not from the partition directories: without
it, every partition is a stray (``LogManager``'s KRaft rule). The hand-over writes, from what kmem keeps in the
log directory, one metadata snapshot as Kafka's ``RecordsSnapshotWriter`` lays it out (KIP-630): a
``SnapshotHeaderRecord`` control batch, record batches of ``MetadataRecordSerde`` frames (``FeatureLevelRecord``
metadata.version, a ``TopicRecord`` per topic with kmem's topic id, a ``PartitionRecord`` per partition with this
node as leader and sole replica, ``ConfigRecord`` per topic override, ``ProducerIdsRecord``,
``UserScramCredentialRecord``, ``AccessControlEntryRecord``), and a ``SnapshotFooterRecord`` control batch. It
goes to ``__cluster_metadata-0/<endOffset>-<epoch>.checkpoint`` beside the ``partition.metadata`` (Kafka's
``Uuid.METADATA_TOPIC_ID``) and ``quorum-state`` (``FileQuorumStateStore``, version 0: static voters,
kraft.version 0, so no ``KRaftVersionRecord``/``VotersRecord``) that ``KafkaMetadataLog`` and the
``RaftManager`` expect. ``meta.properties`` gets the node id (version 1, with ``directory.id``).

Everything is checked before anything is written; the metadata partition is built under a temporary name and
renamed into place, so a hand-over cut short leaves the directory as kmem opens it (kmem skips
``__cluster_metadata-0``; what an interrupted hand-over leaves is named as a deleted partition, which kmem and
Kafka remove when they start).
"""
import argparse
import contextlib
import fcntl
import json
import os
import shutil
import struct
import sys
import time
import uuid
from typing import NamedTuple

from kmem.admin.commands import whole_number
from kmem.broker.codes import LogError
from kmem.broker.log import checkpoints
from kmem.broker.log.config import BrokerConfig
from kmem.broker.log.manager import LOCK_FILE, METADATA_PARTITION, PARTITION_DIR, validate_topic_name
from kmem.durable import fsync_directory
from kmem.errors import ConfigError, IllegalStateError, KmemError
from kmem.protocol.codegen import encoder, uvarint
from kmem.protocol.schema import Message
from kmem.records.builders import build_records

METADATA_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"    # Kafka's Uuid.METADATA_TOPIC_ID
METADATA_VERSION = ("3.9-IV0", 21)              # MetadataVersion.IBP_3_9_IV0: its name and feature level
SNAPSHOT_EPOCH = 1                              # the leader epoch of the snapshot (and of quorum-state)
# The metadata partition is written, and an earlier one set aside, under the name of a partition deleted
# (``topic-partition.uniqueId-delete``): what an interrupted hand-over leaves, kmem and Kafka both remove at start.
SCRATCH = METADATA_PARTITION + ".{}-delete"
QUORUM_STATE = "quorum-state"
RECORDS_PER_BATCH = 1000                        # well under KafkaRaftClient's 8 MiB batches
CONTROL_SNAPSHOT_HEADER, CONTROL_SNAPSHOT_FOOTER = 3, 4     # ControlRecordType
METADATA_FRAME_VERSION = 1                      # MetadataRecordSerde (AbstractApiMessageSerde)
TOPIC_RESOURCE = 2                              # ConfigResource.Type.TOPIC
SCRAM_MECHANISMS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}     # ScramMechanism's types
COMPACTED_INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")   # Kafka always compacts them


def _schema(name, api_key, fields):
    """A metadata record's schema in the shape of Kafka's JSON (``metadata/.../common/metadata/*.json``): the
    fields as ``(name, type, versions, extra)``; every metadata record is flexible."""
    return Message({"name": name, "apiKey": api_key, "type": "metadata", "flexibleVersions": "0+",
                    "fields": [{"name": n, "type": t, "versions": v, **extra} for n, t, v, extra in fields]})


_INTS = "[]int32"
SCHEMAS = {
    "FeatureLevelRecord": (_schema("FeatureLevelRecord", 12, [
        ("Name", "string", "0+", {}), ("FeatureLevel", "int16", "0+", {})]), 0),
    "TopicRecord": (_schema("TopicRecord", 2, [("Name", "string", "0+", {}), ("TopicId", "uuid", "0+", {})]), 0),
    # version 1: Directories (KIP-858), what metadata.version 3.7-IV2 and later write without ELR
    "PartitionRecord": (_schema("PartitionRecord", 3, [
        ("PartitionId", "int32", "0+", {"default": "-1"}), ("TopicId", "uuid", "0+", {}),
        ("Replicas", _INTS, "0+", {}), ("Isr", _INTS, "0+", {}), ("RemovingReplicas", _INTS, "0+", {}),
        ("AddingReplicas", _INTS, "0+", {}), ("Leader", "int32", "0+", {"default": "-1"}),
        ("LeaderRecoveryState", "int8", "0+", {"default": "0", "taggedVersions": "0+", "tag": 0}),
        ("LeaderEpoch", "int32", "0+", {"default": "-1"}), ("PartitionEpoch", "int32", "0+", {"default": "-1"}),
        ("Directories", "[]uuid", "1+", {}),
        ("EligibleLeaderReplicas", _INTS, "2+", {"default": "null", "nullableVersions": "2+",
                                                 "taggedVersions": "2+", "tag": 1}),
        ("LastKnownElr", _INTS, "2+", {"default": "null", "nullableVersions": "2+", "taggedVersions": "2+",
                                       "tag": 2})]), 1),
    "ConfigRecord": (_schema("ConfigRecord", 4, [
        ("ResourceType", "int8", "0+", {}), ("ResourceName", "string", "0+", {}), ("Name", "string", "0+", {}),
        ("Value", "string", "0+", {"nullableVersions": "0+"})]), 0),
    "ProducerIdsRecord": (_schema("ProducerIdsRecord", 15, [
        ("BrokerId", "int32", "0+", {}), ("BrokerEpoch", "int64", "0+", {"default": "-1"}),
        ("NextProducerId", "int64", "0+", {})]), 0),
    "UserScramCredentialRecord": (_schema("UserScramCredentialRecord", 11, [
        ("Name", "string", "0+", {}), ("Mechanism", "int8", "0+", {}), ("Salt", "bytes", "0+", {}),
        ("StoredKey", "bytes", "0+", {}), ("ServerKey", "bytes", "0+", {}), ("Iterations", "int32", "0+", {})]), 0),
    "AccessControlEntryRecord": (_schema("AccessControlEntryRecord", 18, [
        ("Id", "uuid", "0+", {}), ("ResourceType", "int8", "0+", {}), ("ResourceName", "string", "0+", {}),
        ("PatternType", "int8", "0+", {}), ("Principal", "string", "0+", {}), ("Host", "string", "0+", {}),
        ("Operation", "int8", "0+", {}), ("PermissionType", "int8", "0+", {})]), 0),
    # read only, by kmem.admin.kraft_image (a Kafka node's metadata log deletes with them)
    "RemoveTopicRecord": (_schema("RemoveTopicRecord", 9, [("TopicId", "uuid", "0+", {})]), 0),
    "RemoveAccessControlEntryRecord": (_schema("RemoveAccessControlEntryRecord", 19, [("Id", "uuid", "0+", {})]), 0),
    # the control records' values (clients' common/message/Snapshot{Header,Footer}Record.json), version 0
    "SnapshotHeaderRecord": (_schema("SnapshotHeaderRecord", None, [
        ("Version", "int16", "0+", {}), ("LastContainedLogTimestamp", "int64", "0+", {})]), 0),
    "SnapshotFooterRecord": (_schema("SnapshotFooterRecord", None, [("Version", "int16", "0+", {})]), 0),
}
_ENCODERS = {}


def encode_message(record_type, **fields):
    """The body of ``record_type`` (a key of ``SCHEMAS``) with ``fields`` (snake_case), at the version written."""
    message, version = SCHEMAS[record_type]
    encode = _ENCODERS.get(record_type)
    if encode is None:
        encode = _ENCODERS[record_type] = encoder(message, version)
    buf = bytearray()
    encode(message.cls(**fields), buf, [])
    return bytes(buf)


def metadata_record(record_type, **fields):
    """A metadata record's value as ``MetadataRecordSerde`` frames it: frame version, api key and version as
    unsigned varints, then the body."""
    message, version = SCHEMAS[record_type]
    return (uvarint(METADATA_FRAME_VERSION) + uvarint(message.api_key) + uvarint(version)
            + encode_message(record_type, **fields))


def control_record(control_type, record_type, **fields):
    """``(key, value)`` of a KRaft control record: key ``version 0 | type``, value the body alone
    (``MessageUtil.toByteBuffer``; the record's version is its own ``Version`` field)."""
    return struct.pack(">hh", 0, control_type), encode_message(record_type, **fields)


class Partition(NamedTuple):
    number: int
    leader_epoch: int


class Topic(NamedTuple):
    name: str
    topic_id: str
    partitions: list
    configs: dict


class HandoverPlan(NamedTuple):
    """What a hand-over writes, read and checked from a stopped kmem broker's log directory."""
    log_dir: str
    node_id: int
    cluster_id: str
    directory_id: str
    meta_properties: dict       # meta.properties as it will be
    topics: list
    next_producer_id: int       # 0: kmem issued none
    scram: list                 # (mechanism, user, ScramCredential)
    acls: list                  # (uuid.UUID, AclBinding)

    @property
    def partition_count(self):
        return sum(len(topic.partitions) for topic in self.topics)


class HandoverRefused(ConfigError):
    """The log directory cannot be handed over: every reason, one a line. Nothing was written."""

    def __init__(self, log_dir, problems):
        self.problems = problems
        super().__init__(f"{log_dir} cannot be handed over to Kafka (nothing was written):\n"
                         + "\n".join(f"  {p}" for p in problems))


@contextlib.contextmanager
def locked(log_dir):
    """Hold the log directory's lock (a running kmem broker holds it): ``IllegalStateError`` when taken."""
    if not os.path.isdir(log_dir):
        raise ConfigError(f"log directory {log_dir} does not exist or is not a directory")
    path = os.path.join(log_dir, LOCK_FILE)
    existed = os.path.exists(path)
    with open(path, "ab") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IllegalStateError(f"log directory {log_dir} is in use by a running broker (it holds "
                                    f"{LOCK_FILE}): stop it first") from None
        try:
            yield
        finally:
            if not existed:             # a refused hand-over leaves no file behind
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def plan_handover(log_dir, node_id, cluster_id=None):
    """Read and check everything the hand-over moves; ``HandoverRefused`` lists every problem found."""
    from kmem.broker.security.authorizer import StandardAuthorizer
    from kmem.broker.security.credentials import ScramCredentialStore

    problems = []
    meta_path = os.path.join(log_dir, checkpoints.META_PROPERTIES)
    if not os.path.exists(meta_path):
        raise HandoverRefused(log_dir, [f"no {checkpoints.META_PROPERTIES}: not a kmem broker's log directory"])
    meta = checkpoints.read_properties(meta_path)
    if meta.get("version") != "1" or "cluster.id" not in meta:
        raise HandoverRefused(log_dir, [f"{meta_path}: expected version=1 and a cluster.id"])
    if cluster_id is not None:
        try:
            checkpoints.uuid_bytes(cluster_id, "--cluster-id")
        except checkpoints.CorruptCheckpointError as e:
            problems.append(str(e))
    directory_id = meta.get("directory.id") or checkpoints.random_uuid()
    new_meta = {"node.id": str(node_id), "directory.id": directory_id, "version": "1",
                "cluster.id": cluster_id or meta["cluster.id"]}
    topic_configs = _read_topic_configs(log_dir, problems)
    topics = _read_topics(log_dir, topic_configs, problems)
    next_producer_id = checkpoints.ProducerIdAllocator(log_dir).reserved_end
    store = ScramCredentialStore(log_dir)
    scram = [(m, user, store.get(m, user)) for m in SCRAM_MECHANISMS for user in store.users(m)]
    acls = []
    for acl_id, acl in StandardAuthorizer(log_dir).entries():
        try:
            acls.append((uuid.UUID(acl_id), acl))
        except ValueError:
            problems.append(f"ACL {acl_id!r}: its id is not a UUID")
    if problems:
        raise HandoverRefused(log_dir, problems)
    return HandoverPlan(log_dir, node_id, new_meta["cluster.id"], directory_id, new_meta, topics, next_producer_id,
                        scram, acls)


def _read_topic_configs(log_dir, problems):
    from kmem.broker.log.manager import read_topics_file

    try:
        configs = read_topics_file(log_dir)
    except checkpoints.CorruptCheckpointError as e:
        raise HandoverRefused(log_dir, [str(e)]) from None
    checked = {}
    broker = BrokerConfig()
    for topic, overrides in configs.items():
        try:
            broker.topic_config(overrides)
        except ConfigError as e:
            problems.append(f"topic {topic!r}: a config Kafka would refuse: {e}")
            continue
        checked[topic] = {name: str(value).lower() if isinstance(value, bool) else str(value)
                          for name, value in overrides.items() if value is not None}
    return checked


def _read_topics(log_dir, topic_configs, problems):
    """The topics of the partition directories, each with its id, partitions and leader epochs."""
    found = {}          # name -> {partition: (topic id, leader epoch)}
    for name in sorted(os.listdir(log_dir)):
        path = os.path.join(log_dir, name)
        match = PARTITION_DIR.fullmatch(name)
        if not match or not os.path.isdir(path) or name == METADATA_PARTITION:
            continue
        topic, number = match.group(1), int(match.group(2))
        try:
            validate_topic_name(topic)
        except LogError:
            problems.append(f"{name}: Kafka refuses the topic name {topic!r} (1 to 249 characters of "
                            "[a-zA-Z0-9._-], not '.' or '..')")
            continue
        try:
            topic_id = checkpoints.read_partition_metadata(os.path.join(path, checkpoints.PARTITION_METADATA))
            epochs = checkpoints.read_leader_epoch_checkpoint(os.path.join(path, checkpoints.LEADER_EPOCH_CHECKPOINT))
        except FileNotFoundError:
            problems.append(f"{name}: no {checkpoints.PARTITION_METADATA} (no topic id: Kafka would set the "
                            "partition aside as a stray)")
            continue
        except checkpoints.CorruptCheckpointError as e:
            problems.append(str(e))
            continue
        found.setdefault(topic, {})[number] = (topic_id, max((epoch for epoch, _ in epochs), default=0))
    topics, by_id = [], {}
    for name, partitions in found.items():
        ids = {topic_id for topic_id, _ in partitions.values()}
        if len(ids) > 1:
            problems.append(f"topic {name!r}: its partitions have different topic ids ({', '.join(sorted(ids))})")
            continue
        topic_id = ids.pop()
        if topic_id == METADATA_TOPIC_ID or topic_id == checkpoints.uuid_string(bytes(16)):
            problems.append(f"topic {name!r}: topic id {topic_id} is reserved by Kafka")
            continue
        if topic_id in by_id:
            problems.append(f"topics {by_id[topic_id]!r} and {name!r} have the same topic id {topic_id}")
            continue
        by_id[topic_id] = name
        if sorted(partitions) != list(range(len(partitions))):
            problems.append(f"topic {name!r}: partitions {sorted(partitions)} are not numbered 0 to "
                            f"{len(partitions) - 1}")
            continue
        configs = dict(topic_configs.get(name, {}))
        if name in COMPACTED_INTERNAL_TOPICS:
            configs.setdefault("cleanup.policy", "compact")
        topics.append(Topic(name, topic_id, [Partition(n, epoch) for n, (_, epoch) in sorted(partitions.items())],
                            configs))
    return topics


def metadata_records(plan):
    """The metadata records of the snapshot, in the order a controller's snapshot holds them (features first)."""
    node, directory = plan.node_id, uuid.UUID(bytes=checkpoints.uuid_bytes(plan.directory_id))
    yield metadata_record("FeatureLevelRecord", name="metadata.version", feature_level=METADATA_VERSION[1])
    for topic in plan.topics:
        topic_id = uuid.UUID(bytes=checkpoints.uuid_bytes(topic.topic_id))
        yield metadata_record("TopicRecord", name=topic.name, topic_id=topic_id)
        for partition in topic.partitions:
            yield metadata_record("PartitionRecord", partition_id=partition.number, topic_id=topic_id,
                                  replicas=[node], isr=[node], leader=node, leader_epoch=partition.leader_epoch,
                                  partition_epoch=0, directories=[directory])
        for name, value in sorted(topic.configs.items()):
            yield metadata_record("ConfigRecord", resource_type=TOPIC_RESOURCE, resource_name=topic.name, name=name,
                                  value=value)
    if plan.next_producer_id:
        yield metadata_record("ProducerIdsRecord", broker_id=node, broker_epoch=-1,
                              next_producer_id=plan.next_producer_id)
    for mechanism, user, credential in plan.scram:
        yield metadata_record("UserScramCredentialRecord", name=user, mechanism=SCRAM_MECHANISMS[mechanism],
                              salt=credential.salt, stored_key=credential.stored_key,
                              server_key=credential.server_key, iterations=credential.iterations)
    for acl_id, acl in plan.acls:
        yield metadata_record("AccessControlEntryRecord", id=acl_id, resource_type=int(acl.resource_type),
                              resource_name=acl.name, pattern_type=int(acl.pattern_type), principal=acl.principal,
                              host=acl.host, operation=int(acl.operation), permission_type=int(acl.permission))


def snapshot_bytes(plan, now_ms):
    """``(end offset, the snapshot file's bytes)``: header batch, metadata batches, footer batch, offsets from 0
    as ``RecordsSnapshotWriter`` numbers them, every batch at the snapshot's epoch. The end offset is that of a
    log which held the records at offsets 0 to n-1."""
    records = list(metadata_records(plan))
    batch = dict(timestamp=now_ms)
    out = [build_records([dict(zip(("key", "value"), control_record(
        CONTROL_SNAPSHOT_HEADER, "SnapshotHeaderRecord", version=0, last_contained_log_timestamp=now_ms)), **batch)],
        base_offset=0, control=True, partition_leader_epoch=SNAPSHOT_EPOCH)]
    offset = 1
    for start in range(0, len(records), RECORDS_PER_BATCH):
        chunk = records[start:start + RECORDS_PER_BATCH]
        out.append(build_records([{"value": value, **batch} for value in chunk], base_offset=offset,
                                 partition_leader_epoch=SNAPSHOT_EPOCH))
        offset += len(chunk)
    out.append(build_records([dict(zip(("key", "value"), control_record(
        CONTROL_SNAPSHOT_FOOTER, "SnapshotFooterRecord", version=0)), **batch)],
        base_offset=offset, control=True, partition_leader_epoch=SNAPSHOT_EPOCH))
    return len(records), b"".join(out)


def snapshot_file_name(end_offset, epoch):
    """Kafka's ``Snapshots.filenameFromSnapshotId``."""
    return f"{end_offset:020d}-{epoch:010d}.checkpoint"


def quorum_state(node_id):
    """``FileQuorumStateStore``'s version 0 document: no leader yet at the snapshot's epoch, this node the only
    voter (it elects itself at the next epoch when it starts)."""
    return json.dumps({"clusterId": "", "leaderId": -1, "leaderEpoch": SNAPSHOT_EPOCH, "votedId": -1,
                       "appliedOffset": 0, "currentVoters": [{"voterId": node_id}], "data_version": 0},
                      separators=(",", ":"))


def _write_synced(path, data):
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def write_handover(plan, now_ms=None):
    """Write the plan: the metadata partition built under a scratch name, fsynced, renamed into place;
    ``meta.properties`` replaced atomically. Returns the snapshot's path."""
    from kmem.admin import kraft_image     # it decodes with this module's schemas

    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    final = os.path.join(plan.log_dir, METADATA_PARTITION)
    staging = os.path.join(plan.log_dir, SCRATCH.format(uuid.uuid4().hex))
    end_offset, snapshot = snapshot_bytes(plan, now_ms)
    name = snapshot_file_name(end_offset, SNAPSHOT_EPOCH)
    os.mkdir(staging)
    try:
        _write_synced(os.path.join(staging, name), snapshot)
        _write_synced(os.path.join(staging, checkpoints.PARTITION_METADATA),
                      f"version: 0\ntopic_id: {METADATA_TOPIC_ID}".encode())
        _write_synced(os.path.join(staging, QUORUM_STATE), quorum_state(plan.node_id).encode())
        fsync_directory(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)      # a full disk keeps nothing
        raise
    meta_path = os.path.join(plan.log_dir, checkpoints.META_PROPERTIES)
    if checkpoints.read_properties(meta_path) != plan.meta_properties:
        checkpoints.write_properties(meta_path, plan.meta_properties)
    if os.path.exists(final):
        os.rename(final, os.path.join(plan.log_dir, SCRATCH.format(uuid.uuid4().hex)))
    os.rename(staging, final)
    fsync_directory(plan.log_dir)
    kraft_image.record_adopted(plan.log_dir)        # kmem's files agree with the snapshot: kmem opens them as they are
    remove_scratch(plan.log_dir)
    return os.path.join(final, name)


def remove_scratch(log_dir):
    """Remove the scratch directories of this or an interrupted hand-over."""
    prefix, suffix = SCRATCH.split("{}")
    for name in os.listdir(log_dir):
        if name.startswith(prefix) and name.endswith(suffix):
            shutil.rmtree(os.path.join(log_dir, name))


def check_metadata_partition(log_dir):
    """An existing ``__cluster_metadata-0`` may be replaced only if a hand-over wrote it: once a Kafka node ran,
    its metadata log holds what kmem's files do not (``IllegalStateError``)."""
    final = os.path.join(log_dir, METADATA_PARTITION)
    if not os.path.isdir(final):
        return
    written = [name for name in os.listdir(final)
               if name.endswith(".log") and os.path.getsize(os.path.join(final, name))]
    if written:
        raise IllegalStateError(f"{final} holds a Kafka node's metadata log ({written[0]}): a Kafka node has run on "
                                "this directory, and a hand-over would lose what it recorded")


def handover_kraft(log_dir, node_id, cluster_id=None):
    """Check, then write, the KRaft metadata of a stopped kmem broker's log directory; returns the plan."""
    log_dir = os.fspath(log_dir)
    with locked(log_dir):
        check_metadata_partition(log_dir)
        plan = plan_handover(log_dir, node_id, cluster_id)
        remove_scratch(log_dir)
        write_handover(plan)
    return plan


def server_properties(node_id, log_dir, listeners):
    """The ``server.properties`` lines of the Kafka node: ``listeners`` (``NAME://host:port,...``) as given, with
    a ``CONTROLLER`` listener on localhost:9093 when none is named so; the static single-voter quorum
    (``controller.quorum.voters``, KIP-595) on the controller listener; ``log.dirs`` this directory.
    ``ConfigError`` for a listener that is not ``NAME://host:port``."""
    items = [item.strip() for item in listeners.split(",") if item.strip()]
    parsed = {}
    for item in items:
        name, sep, address = item.partition("://")
        host, _, port = address.rpartition(":")
        if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"listener {item!r} is not NAME://HOST:PORT")
        parsed[name] = (host, port)
    if "CONTROLLER" not in parsed:
        items.append("CONTROLLER://localhost:9093")
        parsed["CONTROLLER"] = ("localhost", "9093")
    host, port = parsed["CONTROLLER"]
    broker_listener = next((name for name in parsed if name != "CONTROLLER"), "PLAINTEXT")
    return [
        "process.roles=broker,controller",
        f"node.id={node_id}",
        f"controller.quorum.voters={node_id}@{host or 'localhost'}:{port}",
        f"listeners={','.join(items)}",
        "controller.listener.names=CONTROLLER",
        f"inter.broker.listener.name={broker_listener}",
        f"listener.security.protocol.map={PROTOCOL_MAP}",
        f"log.dirs={os.path.abspath(log_dir)}",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
    ]


PARTITION_COUNT_SETTINGS = {"__consumer_offsets": "offsets.topic.num.partitions",
                            "__transaction_state": "transaction.state.log.num.partitions"}


def internal_topic_settings(plan):
    """The partition counts of the coordinators' topics kmem made: Kafka places a group or a transactional id
    by its hash modulo that count, so the node's setting has to agree with the topic."""
    return [f"{PARTITION_COUNT_SETTINGS[topic.name]}={len(topic.partitions)}"
            for topic in plan.topics if topic.name in PARTITION_COUNT_SETTINGS]


# Kafka's default map with the controller listener (config/kraft/server.properties); other names need an entry
PROTOCOL_MAP = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"


HANDOVER_DESCRIPTION = """\
Hand a stopped kmem broker's log directory over to Kafka: 'kmem handover kraft' writes the cluster
metadata a single Kafka 3.9 KRaft node (process.roles=broker,controller) loads at start, so that it
serves kmem's topics (with their ids, partitions, leader epochs and configs), producer ids, SCRAM users
and ACLs; then it prints the server.properties lines that node needs. Everything is checked first
(the broker stopped, every partition with a topic id, topic names and configs Kafka accepts): when a
check fails nothing is written."""

HANDOVER_EXIT_CODES = """\
exit codes:
  0  handed over: the server.properties lines are printed
  2  nothing written: a running broker, a bad argument, or what Kafka would refuse (each listed)"""


def add_command(commands):
    """Register ``kmem handover kraft`` on the ``kmem`` command's subparsers."""
    handover = commands.add_parser("handover", help="hand a stopped kmem broker's log directory over to Kafka",
                                   description=HANDOVER_DESCRIPTION, epilog=HANDOVER_EXIT_CODES,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    targets = handover.add_subparsers(dest="target", required=True)
    kraft = targets.add_parser("kraft", help="write the KRaft cluster metadata of a single Kafka 3.9 node",
                               description=HANDOVER_DESCRIPTION, epilog=HANDOVER_EXIT_CODES,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    kraft.add_argument("--log-dir", required=True, help="the stopped kmem broker's log directory")
    kraft.add_argument("--node-id", required=True, type=whole_number(0, 2**31 - 1), help="the Kafka node's node.id")
    kraft.add_argument("--cluster-id", help="the cluster id (default: meta.properties' cluster.id)")
    kraft.add_argument("--listeners", default="PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093",
                       help="the Kafka node's listeners, printed for server.properties (default: %(default)s)")
    handover.set_defaults(run=run)


def run(args):
    try:
        properties = server_properties(args.node_id, args.log_dir, args.listeners)
        plan = handover_kraft(args.log_dir, args.node_id, args.cluster_id)
    except (KmemError, OSError) as e:
        print(f"kmem handover: {e}", file=sys.stderr)
        return 2
    print(f"# {args.log_dir}: {len(plan.topics)} topics, {plan.partition_count} partitions, "
          f"{len(plan.scram)} SCRAM credentials, {len(plan.acls)} ACLs handed over to Kafka (metadata.version "
          f"{METADATA_VERSION[0]}); server.properties of the Kafka node:")
    for line in properties + internal_topic_settings(plan):
        print(line)
    return 0
