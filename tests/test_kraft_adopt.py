"""kmem broker opens a Kafka 3.9 KRaft node's log directory: the topics (ids, partition counts, configs), producer
ids, SCRAM users and ACLs come from ``__cluster_metadata-0`` (the newest snapshot, then the metadata log after it),
checked with confluent-kafka's clients. The "Kafka directory" is a kmem directory handed over (``kmem handover
kraft``) whose kmem files naming topics are then removed, so that only Kafka's metadata names them."""
import glob
import logging
import os
import re
import shutil
import struct
import subprocess
import time
import uuid

import pytest

from broker_helpers import RawConnection, consume_to_end, produce_raw, wait_for
from kmem.admin import handover, kraft_image
from kmem.broker import Broker
from kmem.broker.log import checkpoints
from kmem.broker.log.manager import TOPICS_FILE
from kmem.broker.security.authorizer import AclBinding, StandardAuthorizer
from kmem.broker.security.credentials import ScramCredentialStore
from kmem.broker.security.scram import credential_from_password
from kmem.protocol import ApiKey, decode_response, encode_request, message_class
from kmem.protocol.codegen import uvarint
from kmem.records.batches import MemoryRecords
from kmem.records.builders import build_records

GROUP = "adopters"
TIMEOUT = 30


def admin(broker):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def kmem_dir(log_dir):
    """A kmem broker's directory: two topics with records and configs, a committed offset, a SCRAM user, an ACL."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    with Broker(log_dir) as broker:
        broker.logs.create_topic("orders", 3, {"retention.ms": "86400000", "cleanup.policy": "compact"})
        broker.logs.create_topic("events", 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True})
        for n in range(6):
            producer.produce("orders", key=b"k%d" % n, value=b"v%d" % n, partition=n % 3)
        producer.produce("events", value=b"e")
        assert producer.flush(TIMEOUT) == 0
        del producer                # closed while the broker runs
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": GROUP})
        consumer.commit(offsets=[TopicPartition("orders", 1, 2)], asynchronous=False)
        consumer.close()
        node_id = broker.node_id
    ScramCredentialStore(log_dir).add("SCRAM-SHA-256", "alice", credential_from_password("SCRAM-SHA-256", "secret"))
    StandardAuthorizer(log_dir).create([AclBinding.of(2, "orders", 3, "User:alice", "*", 3, 3)])
    return node_id


def served(broker):
    """What a client sees: ``{topic: (id, partition count, configs set on the topic, records)}`` of the user
    topics, and the group's committed offset of orders-1."""
    from confluent_kafka import Consumer, TopicCollection, TopicPartition
    from confluent_kafka.admin import ConfigResource, ConfigSource
    client = admin(broker)
    names = sorted(name for name in client.list_topics(timeout=TIMEOUT).topics if not name.startswith("__"))
    described = client.describe_topics(TopicCollection(names), request_timeout=TIMEOUT)
    configs = client.describe_configs([ConfigResource("topic", name) for name in names], request_timeout=TIMEOUT)
    topics = {}
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": GROUP,
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10,
                         "topic.metadata.refresh.fast.interval.ms": 10})
    for resource, future in configs.items():
        name = resource.name
        description = described[name].result(timeout=TIMEOUT)
        records = []
        for p in range(len(description.partitions)):
            low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=TIMEOUT)
            consumer.assign([TopicPartition(name, p, low)])
            for _ in range(high - low):
                message = consumer.poll(TIMEOUT)
                assert message is not None and message.error() is None
                records.append((p, message.offset(), message.key(), message.value()))
        overrides = {k: c.value for k, c in future.result(timeout=TIMEOUT).items()
                     if c.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}
        topic_id = description.topic_id
        topics[name] = (checkpoints.uuid_string(struct.pack(">qq", topic_id.get_most_significant_bits(),
                                                            topic_id.get_least_significant_bits())),
                        len(description.partitions), overrides, records)
    committed = consumer.committed([TopicPartition("orders", 1)], timeout=TIMEOUT)[0].offset
    consumer.close()
    return topics, committed


def drop_kmem_files(log_dir):
    """Leave only Kafka's metadata to name the topics: no kmem-topics.json, no partition.metadata, no mark of
    an adoption."""
    os.unlink(os.path.join(log_dir, TOPICS_FILE))
    os.unlink(os.path.join(log_dir, kraft_image.ADOPTED_FILE))
    for path in glob.glob(os.path.join(log_dir, "*-*", checkpoints.PARTITION_METADATA)):
        if handover.METADATA_PARTITION not in path:
            os.unlink(path)


@pytest.fixture(scope="module")
def handed_over(tmp_path_factory):
    """(a kmem directory handed over to Kafka, what kmem served before), made once for the module."""
    log_dir = tmp_path_factory.mktemp("handed-over")
    node_id = kmem_dir(log_dir)
    with Broker(log_dir) as broker:
        before = served(broker)
    handover.handover_kraft(log_dir, node_id)
    return log_dir, before


@pytest.fixture
def kafka_dir(handed_over, tmp_path):
    """(a Kafka node's directory made from a kmem one: a copy of ``handed_over`` without kmem's files naming
    topics, what kmem served before the hand-over)."""
    template, before = handed_over
    log_dir = tmp_path / "kafka"
    shutil.copytree(template, log_dir)
    drop_kmem_files(log_dir)
    return log_dir, before


def snapshot_end(log_dir):
    end, _, _ = kraft_image.newest_snapshot(os.path.join(log_dir, handover.METADATA_PARTITION))
    return end


def append_metadata_log(log_dir, batches_of_values, base=None):
    """A metadata log segment from ``base`` (the snapshot's end by default), each list of record values one batch;
    returns its path."""
    offset = base = snapshot_end(log_dir) if base is None else base
    data = b""
    for values in batches_of_values:
        data += build_records([{"value": value} for value in values], base_offset=offset,
                              partition_leader_epoch=2)
        offset += len(values)
    path = os.path.join(log_dir, handover.METADATA_PARTITION, f"{base:020d}.log")
    with open(path, "wb") as file:
        file.write(data)
    return path


def test_the_round_trip_serves_the_same_topics_ids_configs_records_and_offsets(kafka_dir):
    tmp_path, before = kafka_dir
    assert not os.path.exists(tmp_path / TOPICS_FILE)
    with Broker(tmp_path) as broker:
        assert served(broker) == before
        with RawConnection(broker.bootstrap_servers) as raw:        # Metadata v12 names each topic's id
            raw.send_frame(bytes(encode_request(message_class(ApiKey.METADATA, "Request")(topics=None), 12, 7)))
            metadata = decode_response(raw.receive_frame(), ApiKey.METADATA, 12)[1]
        assert {t.name: (checkpoints.uuid_string(t.topic_id.bytes), len(t.partitions)) for t in metadata.topics
                if t.name in before[0]} == {name: topic[:2] for name, topic in before[0].items()}
    assert before[0]["orders"][1:3] == (3, {"retention.ms": "86400000", "cleanup.policy": "compact"})
    assert before[1] == 2
    with Broker(tmp_path) as broker:               # the next start reads kmem's own files again
        assert served(broker) == before
    assert kraft_image.needs_adoption(tmp_path) is False


def test_producer_ids_scram_users_and_acls_are_adopted(kafka_dir):
    tmp_path, _ = kafka_dir
    issued_end = checkpoints.ProducerIdAllocator(tmp_path).reserved_end
    credential = ScramCredentialStore(tmp_path).get("SCRAM-SHA-256", "alice")
    acls = [acl for _, acl in StandardAuthorizer(tmp_path).entries()]
    for path in (tmp_path / checkpoints.PRODUCER_ID_BLOCK, ScramCredentialStore(tmp_path).path,
                 StandardAuthorizer(tmp_path).path):
        os.unlink(path)
    with Broker(tmp_path) as broker:
        assert broker.logs.allocate_producer_id() >= issued_end > 0
    assert ScramCredentialStore(tmp_path).all_users() == ["alice"]
    assert ScramCredentialStore(tmp_path).get("SCRAM-SHA-256", "alice") == credential
    assert [acl for _, acl in StandardAuthorizer(tmp_path).entries()] == acls


def later_records(image_before, topic_id):
    """A metadata log after the snapshot: a new topic of two partitions with a config, orders' retention.ms
    changed and cleanup.policy deleted, events removed, and two records kmem does not serve."""
    events = uuid.UUID(bytes=checkpoints.uuid_bytes(image_before["events"][0]))
    added = uuid.UUID(bytes=checkpoints.uuid_bytes(topic_id))
    record = handover.metadata_record
    return [
        [record("TopicRecord", name="added", topic_id=added)]
        + [record("PartitionRecord", partition_id=p, topic_id=added, replicas=[0, 1, 2], isr=[0, 1, 2], leader=0,
                  leader_epoch=0, partition_epoch=0, directories=[uuid.UUID(int=0)] * 3) for p in range(2)]
        + [record("ConfigRecord", resource_type=handover.TOPIC_RESOURCE, resource_name="added",
                  name="max.message.bytes", value="2048")],
        [record("ConfigRecord", resource_type=handover.TOPIC_RESOURCE, resource_name="orders", name="retention.ms",
                value="3600000"),
         record("ConfigRecord", resource_type=handover.TOPIC_RESOURCE, resource_name="orders",
                name="cleanup.policy", value=None),
         record("RemoveTopicRecord", topic_id=events),
         uvarint(1) + uvarint(17) + uvarint(0) + b"\x00"],        # a kind kmem has no schema for
    ]


def test_the_metadata_log_after_the_snapshot_is_applied_in_order(kafka_dir, caplog):
    tmp_path, (before, _) = kafka_dir
    added_id = checkpoints.random_uuid()
    append_metadata_log(tmp_path, later_records(before, added_id))
    with caplog.at_level(logging.INFO, logger="kmem.admin.kraft_image"), Broker(tmp_path) as broker:
        topics, committed = served(broker)
    assert topics == {
        "orders": (before["orders"][0], 3, {"retention.ms": "3600000"}, before["orders"][3]),
        "added": (added_id, 2, {"max.message.bytes": "2048"}, [])}
    assert committed == 2
    unserved = [r.getMessage() for r in caplog.records if "not served by kmem" in r.getMessage()]
    assert len(unserved) == 2
    assert any("PartitionRecord with replicas beyond a single leader not served by kmem, ignored: 2 records" in line
               for line in unserved)
    assert any("metadata record of api key 17 not served by kmem, ignored: 1 record" in line
               for line in unserved)
    assert [name for name in os.listdir(tmp_path) if name.startswith("events-0.")] != []    # set aside, not lost


def test_a_torn_metadata_log_tail_ends_the_log_at_the_last_whole_batch(kafka_dir, caplog):
    tmp_path, (before, _) = kafka_dir
    path = append_metadata_log(tmp_path, later_records(before, checkpoints.random_uuid()))
    with open(path, "r+b") as file:            # the second batch cut short
        file.truncate(os.path.getsize(path) - 5)
    with caplog.at_level(logging.WARNING), Broker(tmp_path) as broker:
        topics = broker.logs.topics()
    assert {name for name in topics if not name.startswith("__")} == {"added", "events", "orders"}
    assert dict(topics["orders"].configs) == {"retention.ms": "86400000", "cleanup.policy": "compact"}
    assert any("torn or corrupt" in r.getMessage() for r in caplog.records)


def test_a_corrupt_batch_in_the_metadata_log_ends_the_log_before_it(kafka_dir):
    tmp_path, (before, _) = kafka_dir
    path = append_metadata_log(tmp_path, later_records(before, checkpoints.random_uuid()))
    with open(path, "r+b") as file:            # a byte of the first batch's records flipped: its CRC fails
        file.seek(70)
        byte = file.read(1)
        file.seek(70)
        file.write(bytes([byte[0] ^ 0xFF]))
    image = kraft_image.read_image(tmp_path)
    assert {name for name in image.topics if not name.startswith("__")} == set(before)
    assert image.end_offset == snapshot_end(tmp_path)


def test_a_corrupt_snapshot_stops_the_start_with_a_clear_error(kafka_dir):
    tmp_path, _ = kafka_dir
    snapshot = glob.glob(str(tmp_path / handover.METADATA_PARTITION / "*.checkpoint"))[0]
    with open(snapshot, "r+b") as file:
        file.seek(200)
        byte = file.read(1)
        file.seek(200)
        file.write(bytes([byte[0] ^ 0xFF]))
    listing = sorted(set(os.listdir(tmp_path)) - {".lock"})
    with pytest.raises(kraft_image.CorruptMetadataError, match="metadata snapshot is corrupt"):
        Broker(tmp_path).start()
    assert sorted(set(os.listdir(tmp_path)) - {".lock"}) == listing          # nothing adopted, nothing set aside


def test_kmem_opens_a_directory_it_handed_over_by_its_own_files(handed_over, tmp_path, caplog):
    shutil.copytree(handed_over[0], tmp_path, dirs_exist_ok=True)
    with caplog.at_level(logging.INFO, logger="kmem.admin.kraft_image"), Broker(tmp_path) as broker:
        broker.logs.create_topic("after", 1)
    assert not [r for r in caplog.records if "adopted" in r.getMessage()]
    with Broker(tmp_path) as broker:
        assert "after" in broker.logs.topics()


@pytest.mark.parametrize("value", [b"", b"\x01", b"\x02\x02\x00", b"\x01\xff\xff\xff\xff\xff\xff", None])
def test_a_malformed_metadata_record_ends_the_log_before_its_batch(kafka_dir, value, caplog):
    tmp_path, (before, _) = kafka_dir
    append_metadata_log(tmp_path, [[value]])
    with caplog.at_level(logging.WARNING):
        image = kraft_image.read_image(tmp_path)
    assert {name for name in image.topics if not name.startswith("__")} == set(before)
    assert image.end_offset == snapshot_end(tmp_path)
    assert any("torn or corrupt" in r.getMessage() for r in caplog.records)


def test_partitions_after_a_gap_are_not_served(kafka_dir, caplog):
    tmp_path, (before, _) = kafka_dir
    gapped = uuid.uuid4()
    append_metadata_log(tmp_path, [[handover.metadata_record("TopicRecord", name="gapped", topic_id=gapped)]
                                   + [handover.metadata_record("PartitionRecord", partition_id=p, topic_id=gapped,
                                                               replicas=[0], isr=[0], leader=0, leader_epoch=0,
                                                               partition_epoch=0, directories=[uuid.UUID(int=0)])
                                      for p in (0, 1, 2**31 - 1)]])
    with caplog.at_level(logging.WARNING, logger="kmem.admin.kraft_image"):
        assert kraft_image.read_image(tmp_path).topic_partitions()["gapped"][1] == 2
    assert any("partitions [2147483647]" in r.getMessage() for r in caplog.records)


def new_topic_records(name, topic_id, partitions=1):
    return [handover.metadata_record("TopicRecord", name=name, topic_id=topic_id)] + [
        handover.metadata_record("PartitionRecord", partition_id=p, topic_id=topic_id, replicas=[0], isr=[0], leader=0,
                                 leader_epoch=0, partition_epoch=0, directories=[uuid.UUID(int=0)])
        for p in range(partitions)]


def test_the_batch_holding_the_snapshot_end_is_replayed_whole(kafka_dir):
    """Kafka's MetadataLoader replays the whole log batch holding the snapshot's end offset, records before that
    offset included: here the TopicRecord one offset below the end."""
    tmp_path, (before, _) = kafka_dir
    added = uuid.uuid4()
    append_metadata_log(tmp_path, [new_topic_records("added", added)], base=snapshot_end(tmp_path) - 1)
    image = kraft_image.read_image(tmp_path)
    assert image.topic_partitions()["added"] == (checkpoints.uuid_string(added.bytes), 1)
    assert image.end_offset == snapshot_end(tmp_path) + 1


def test_a_partition_of_a_topic_never_created_in_the_snapshot_stops_the_start(kafka_dir):
    """Kafka's MetadataDelta faults on it and drops the snapshot; kmem refuses to guess the topics."""
    tmp_path, _ = kafka_dir
    snapshot = glob.glob(str(tmp_path / handover.METADATA_PARTITION / "*.checkpoint"))[0]
    with open(snapshot, "rb") as file:
        end = list(MemoryRecords(file.read()).batches())[-1].next_offset
    with open(snapshot, "ab") as file:
        file.write(build_records([{"value": value} for value in new_topic_records("orphan", uuid.uuid4())[1:]],
                                 base_offset=end))
    listing = sorted(set(os.listdir(tmp_path)) - {".lock"})
    with pytest.raises(kraft_image.CorruptMetadataError, match="PartitionRecord of topic id .* no TopicRecord"):
        Broker(tmp_path).start()
    assert sorted(set(os.listdir(tmp_path)) - {".lock"}) == listing


def test_a_partition_of_a_topic_never_created_ends_the_metadata_log_before_its_batch(kafka_dir, caplog):
    tmp_path, (before, _) = kafka_dir
    append_metadata_log(tmp_path, [new_topic_records("fine", uuid.uuid4()),
                                   new_topic_records("orphan", uuid.uuid4())[1:]])
    with caplog.at_level(logging.WARNING):
        image = kraft_image.read_image(tmp_path)
    assert {name for name in image.topics if not name.startswith("__")} == set(before) | {"fine"}
    assert any("torn or corrupt" in r.getMessage() and "no TopicRecord" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("snapshot", [True, False])
def test_metadata_offsets_in_neither_the_snapshot_nor_the_log_stop_the_start(kafka_dir, snapshot):
    """Kafka's "Inconsistent snapshot state": a log starting after the snapshot's end (or, without one, after 0)."""
    tmp_path, _ = kafka_dir
    end = snapshot_end(tmp_path)
    append_metadata_log(tmp_path, [new_topic_records("late", uuid.uuid4())], base=end + 3)
    if not snapshot:
        for path in glob.glob(str(tmp_path / handover.METADATA_PARTITION / "*.checkpoint")):
            os.unlink(path)
    listing = sorted(set(os.listdir(tmp_path)) - {".lock"})
    missing = f"{end if snapshot else 0} to {end + 2}"
    with pytest.raises(kraft_image.CorruptMetadataError, match=f"metadata offsets {missing} are in neither"):
        Broker(tmp_path).start()
    assert sorted(set(os.listdir(tmp_path)) - {".lock"}) == listing


def test_idempotent_and_transactional_producers_keep_their_state_across_the_round_trip(tmp_path):
    """A producer's sequence and an open transaction, left by kmem and read back from the directory as Kafka's:
    the retried batch is answered with its first offset, and the open transaction holds the last stable offset
    until its transactional id is initialised again, which aborts it."""
    from confluent_kafka import Producer
    from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

    log_dir = tmp_path / "kafka"
    # stamped now: a producer whose last timestamp is older than producer.id.expiration.ms is dropped at load
    retried = build_records([{"value": b"once", "timestamp": int(time.time() * 1000)}], producer_id=4242,
                            producer_epoch=0, base_sequence=0)

    def last_stable_offset(broker):
        request = ListOffsetsRequest(replica_id=-1, isolation_level=1, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name="payments", partitions=[
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1)])])
        with RawConnection(broker.bootstrap_servers) as raw:
            return raw.request(request, ListOffsetsResponse, 2).topics[0].partitions[0].offset

    with Broker(log_dir) as broker:
        broker.logs.create_topic("payments", 1)
        with RawConnection(broker.bootstrap_servers) as raw:
            first = produce_raw(raw, "payments", retried)
        assert first.error_code == 0
        transactional = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "payer"})
        transactional.init_transactions(TIMEOUT)
        transactional.begin_transaction()
        transactional.produce("payments", value=b"pending", partition=0)
        assert transactional.flush(TIMEOUT) == 0
        open_at = broker.logs.get_partition("payments", 0).log_end_offset - 1
        assert last_stable_offset(broker) == open_at
        node_id = broker.node_id
    del transactional                   # its transaction stays open: the broker is gone
    handover.handover_kraft(log_dir, node_id)
    drop_kmem_files(log_dir)

    with Broker(log_dir) as broker:
        assert kraft_image.needs_adoption(log_dir) is False
        end = broker.logs.get_partition("payments", 0).log_end_offset
        with RawConnection(broker.bootstrap_servers) as raw:
            again = produce_raw(raw, "payments", retried)
        assert (again.error_code, again.base_offset) == (0, first.base_offset)
        assert broker.logs.get_partition("payments", 0).log_end_offset == end
        assert last_stable_offset(broker) == open_at
        successor = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "payer"})
        successor.init_transactions(TIMEOUT)           # fences the old epoch and aborts its transaction
        wait_for(lambda: last_stable_offset(broker) > open_at, "the aborted transaction to leave the LSO")
        assert [value for *_, value in consume_to_end(broker.bootstrap_servers, "payments")] == [b"once"]
        del successor


SELFTEST = os.path.join(os.path.dirname(os.environ.get("KRAFT_ORACLE", "/tmp/kraft-oracle/run-oracle")), "run-selftest")


@pytest.fixture(scope="module")
def kafka_written(tmp_path_factory):
    """The directories the KRaft oracle's self-test writes with Kafka 3.9's own RecordsSnapshotWriter,
    BatchBuilder and LogSegment (kafka-oracles/build-kraft.sh), node id 1."""
    output = subprocess.run([SELFTEST, "--keep"], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path_factory.mktemp("selftest")).stdout
    assert "SELFTEST PASS" in output, output[-2000:]
    kept = re.search(r"^kept: (.+)$", output, re.M).group(1)
    yield kept
    shutil.rmtree(kept, ignore_errors=True)


@pytest.mark.skipif(not os.access(SELFTEST, os.X_OK) or shutil.which("java") is None,
                    reason="the kraft oracle is not built (kafka-oracles/build-kraft.sh) or no Java runtime")
@pytest.mark.parametrize("scenario, served", [
    ("A", {"t1": (2, {"cleanup.policy": "compact"}), "t2": (1, {})}),
    ("B", {"t1": (2, {"cleanup.policy": "compact"}), "t3": (1, {"retention.ms": "1000"})}),
    ("C8", {"t1": (2, {"cleanup.policy": "compact"}), "t2": (1, {}), "t3": (1, {"retention.ms": "5000"})}),
    ("C1", "metadata snapshot is corrupt"),
    ("C2", "no TopicRecord created"),
    ("C5", "metadata offsets 0 to 4 are in neither"),
])
def test_kmem_serves_what_kafka_loads_from_directories_kafka_wrote(kafka_written, tmp_path, scenario, served):
    """What Kafka's MetadataLoader makes of each scenario (the self-test asserts it): the same topics, partition
    counts and configs, or no start where Kafka does not load the metadata."""
    log_dir = tmp_path / scenario
    shutil.copytree(os.path.join(kafka_written, scenario), log_dir)
    if isinstance(served, str):
        with pytest.raises(kraft_image.CorruptMetadataError, match=served):
            Broker(log_dir, properties={"node.id": 1}).start()
        return
    with Broker(log_dir, properties={"node.id": 1}) as broker:
        assert {name: (topic.partitions, dict(topic.configs)) for name, topic in broker.logs.topics().items()
                if not name.startswith("__")} == served
