"""``kmem broker`` as a new user meets it through the admin and client APIs of kafka-python, aiokafka and
confluent-kafka (none written here): topic configs and partitions, DescribeCluster, DeleteRecords,
deleting groups and group offsets, produce to the internal topic, and a transactional producer, each
answered with Kafka's results and error codes. Where the broker keeps state, it is checked on disk and
after a restart too."""
import asyncio
import json
import os
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions
from confluent_kafka.admin import NewTopic as ConfluentNewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import ConfigResource as KafkaConfigResource
from kafka.admin import ConfigResourceType, NewTopic
from kafka.admin import NewPartitions as KafkaNewPartitions
from kafka.errors import GroupIdNotFoundError, InvalidConfigurationError, InvalidPartitionsError
from kafka.errors import KafkaError as KafkaPythonError
from kafka.structs import OffsetAndMetadata

from broker_helpers import TIMEOUT, RawConnection, produce_raw, stored_batches, wait_for
from kmem.broker import Broker
from kmem.records import RecordsBuilder

DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = "DYNAMIC_TOPIC_CONFIG", "DEFAULT_CONFIG"
INVALID_TOPIC_EXCEPTION = 17
GROUP_SUBSCRIBED_TO_TOPIC = 86
NONE, OUT_OF_ORDER_SEQUENCE_NUMBER = 0, 45
SETTINGS = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 3}


@pytest.fixture
def log_dir(tmp_path):
    return tmp_path / "logs"


@pytest.fixture
def broker(log_dir):
    with Broker(log_dir, properties=SETTINGS) as running:
        yield running


def results(futures):
    return {key: future.result(timeout=TIMEOUT) for key, future in futures.items()}


def kafka_python_admin(broker):
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=TIMEOUT * 1000)


def produce_values(broker, topic, partition, values):
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    try:
        return [producer.send(topic, value=v, partition=partition).get(TIMEOUT).offset for v in values]
    finally:
        producer.close()


def test_kafka_python_topic_configs_and_partitions_survive_a_restart(log_dir):
    with Broker(log_dir, properties=SETTINGS) as broker:
        admin = kafka_python_admin(broker)
        admin.create_topics([NewTopic("t", 2, 1, topic_configs={"retention.ms": "3600000",
                                                                 "cleanup.policy": "delete"})])
        admin.create_partitions({"t": KafkaNewPartitions(4)})
        assert broker.logs.topics()["t"].partitions == 4
        assert produce_values(broker, "t", 3, [b"in the new partition"]) == [0]
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({"t": KafkaNewPartitions(3)})

        described = admin.describe_configs([KafkaConfigResource(ConfigResourceType.TOPIC, "t")],
                                           config_filter="all")["topic"]["t"]
        assert described["retention.ms"]["value"] == "3600000"
        assert described["retention.ms"]["config_source"] == DYNAMIC_TOPIC_CONFIG
        assert (described["segment.bytes"]["value"], described["segment.bytes"]["config_source"]) == \
            (str(1 << 30), DEFAULT_CONFIG)

        # kafka-python sends IncrementalAlterConfigs (SET) to a broker that advertises it
        altered = admin.alter_configs([KafkaConfigResource(ConfigResourceType.TOPIC, "t",
                                                           configs={"retention.ms": "7200000"})])
        assert altered == {"topic": {"t": "OK"}}
        assert broker.logs.get_partition("t", 3).config.retention_ms == 7_200_000
        refused = admin.alter_configs([KafkaConfigResource(ConfigResourceType.TOPIC, "t",
                                                           configs={"retention.ms": "soon"})])["topic"]["t"]
        assert InvalidConfigurationError.__name__ in refused
        admin.close()
    with open(log_dir / "kmem-topics.json") as file:
        assert json.load(file)["t"] == {"retention.ms": "7200000", "cleanup.policy": "delete"}
    assert os.path.isdir(log_dir / "t-3")

    with Broker(log_dir, properties=SETTINGS) as broker:
        admin = kafka_python_admin(broker)
        described = admin.describe_configs([KafkaConfigResource(ConfigResourceType.TOPIC, "t")])["topic"]["t"]
        assert {name: entry["value"] for name, entry in described.items()} == \
            {"retention.ms": "7200000", "cleanup.policy": "delete"}
        assert [p["partition_index"] for p in admin.describe_topics(["t"])[0]["partitions"]] == [0, 1, 2, 3]
        admin.close()


def test_confluent_kafka_incremental_configs_cluster_and_partitions(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    broker.logs.create_topic("c", 2)
    results(admin.create_partitions([NewPartitions("c", 5)]))
    assert len(admin.list_topics(timeout=TIMEOUT).topics["c"].partitions) == 5

    topic = ConfigResource("topic", "c")
    results(admin.incremental_alter_configs([ConfigResource("topic", "c", incremental_configs=[
        ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET)])]))
    results(admin.incremental_alter_configs([ConfigResource("topic", "c", incremental_configs=[
        ConfigEntry("max.message.bytes", None, incremental_operation=AlterConfigOpType.DELETE)])]))
    entries = results(admin.describe_configs([topic]))[topic]
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == ("60000", 1)   # dynamic topic
    assert (entries["max.message.bytes"].value, entries["max.message.bytes"].source) == ("1048588", 5)  # default
    bad = admin.incremental_alter_configs([ConfigResource("topic", "c", incremental_configs=[
        ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.APPEND)])])[topic]
    with pytest.raises(KafkaException) as refused:
        bad.result(timeout=TIMEOUT)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG

    cluster = admin.describe_cluster().result(timeout=TIMEOUT)
    assert cluster.cluster_id == broker.logs.cluster_id
    assert [(n.id, f"{n.host}:{n.port}") for n in cluster.nodes] == [(broker.node_id, broker.bootstrap_servers)]
    assert cluster.controller.id == broker.node_id


def test_aiokafka_admin(broker):
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewPartitions as AioNewPartitions
    from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
    from aiokafka.admin.config_resource import ConfigResourceType as AioType

    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        await admin.start()
        try:
            broker.logs.create_topic("a", 1, {"max.message.bytes": 2000})
            await admin.create_partitions({"a": AioNewPartitions(2)})
            # aiokafka sends AlterConfigs: the overrides are replaced as a whole
            await admin.alter_configs([AioConfigResource(AioType.TOPIC, "a", configs={"retention.ms": "5000"})])
            [response] = await admin.describe_configs([AioConfigResource(AioType.TOPIC, "a")])
            cluster = await admin.describe_cluster()
            return response.resources[0], cluster
        finally:
            await admin.close()

    resource, cluster = asyncio.run(run())
    assert broker.logs.topics()["a"].partitions == 2
    error_code, _, _, name, entries = resource
    assert (error_code, name) == (0, "a")
    values = {entry[0]: entry[1] for entry in entries}
    assert (values["retention.ms"], values["max.message.bytes"]) == ("5000", "1048588")
    assert broker.logs.topics()["a"].configs == {"retention.ms": "5000"}
    assert cluster["controller_id"] == broker.node_id and cluster["cluster_id"] == broker.logs.cluster_id


def test_delete_records_moves_the_log_start_and_deletes_whole_segments(log_dir):
    with Broker(log_dir, properties=SETTINGS) as broker:
        broker.logs.create_topic("d", 1, {"segment.bytes": 200})      # about one record per segment
        produce_values(broker, "d", 0, [b"value-%d" % i for i in range(10)])
        segments_before = len(broker.logs.get_partition("d", 0).segments)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        deleted = results(admin.delete_records([TopicPartition("d", 0, 6)]))
        assert [r.low_watermark for r in deleted.values()] == [6]
        assert len(broker.logs.get_partition("d", 0).segments) < segments_before

        kafka_admin = kafka_python_admin(broker)
        with pytest.raises(KafkaPythonError):        # beyond the high watermark: OFFSET_OUT_OF_RANGE
            kafka_admin.delete_records({KafkaTopicPartition("d", 0): 11})
        kafka_admin.close()
    with Broker(log_dir, properties=SETTINGS) as broker:      # the log start offset was checkpointed
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                                 consumer_timeout_ms=TIMEOUT * 1000)
        partition = KafkaTopicPartition("d", 0)
        consumer.assign([partition])
        assert consumer.beginning_offsets([partition]) == {partition: 6}
        seen = []
        for record in consumer:
            seen.append((record.offset, record.value))
            if record.offset == 9:
                break
        consumer.close()
        assert seen == [(i, b"value-%d" % i) for i in range(6, 10)]


def test_no_client_appends_to_or_deletes_from_the_internal_topic(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    broker.logs.create_topic("x", 1)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id="g")
    consumer.commit({KafkaTopicPartition("x", 0): OffsetAndMetadata(0, "", -1)})    # creates the internal topic
    consumer.close()
    ends = {p: broker.logs.get_partition("__consumer_offsets", p).log_end_offset for p in range(3)}

    delivered = []
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce("__consumer_offsets", b"forged", partition=0, on_delivery=lambda e, m: delivered.append(e))
    producer.flush(TIMEOUT)
    assert [e.code() for e in delivered] == [KafkaError.TOPIC_EXCEPTION]

    # (kafka-python never sends one: its metadata leaves internal topics out)
    async def aiokafka_send():
        from aiokafka import AIOKafkaProducer
        aio = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        await aio.start()
        try:
            await aio.send_and_wait("__consumer_offsets", value=b"forged", partition=2)
        finally:
            await aio.stop()
    from aiokafka.errors import InvalidTopicError as AioInvalidTopicError
    with pytest.raises(AioInvalidTopicError):
        asyncio.run(aiokafka_send())

    deleted = admin.delete_records([TopicPartition("__consumer_offsets", 0, 0)])
    with pytest.raises(KafkaException) as refused:
        results(deleted)
    assert refused.value.args[0].code() == INVALID_TOPIC_EXCEPTION
    assert {p: broker.logs.get_partition("__consumer_offsets", p).log_end_offset for p in range(3)} == ends


def test_deleting_groups_and_group_offsets(log_dir):
    with Broker(log_dir, properties=SETTINGS) as broker:
        broker.logs.create_topic("subscribed", 1)
        broker.logs.create_topic("other", 1)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        kafka_admin = kafka_python_admin(broker)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "g",
                             "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        consumer.subscribe(["subscribed"])
        wait_for(lambda: consumer.poll(0.1) is None and consumer.assignment(), "the consumer's assignment")
        consumer.commit(offsets=[TopicPartition("subscribed", 0, 0), TopicPartition("other", 0, 0)],
                        asynchronous=False)

        with pytest.raises(KafkaException) as refused:
            results(admin.delete_consumer_groups(["g"]))
        assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP

        # OffsetDelete (KIP-496): a subscribed topic's offsets stay, another topic's go
        answer = kafka_admin.delete_group_offsets("g", [KafkaTopicPartition("subscribed", 0),
                                                        KafkaTopicPartition("other", 0)])
        assert {tp.topic: getattr(error, "errno", 0) for tp, error in answer.items()} == \
            {"subscribed": GROUP_SUBSCRIBED_TO_TOPIC, "other": 0}
        committed = kafka_admin.list_group_offsets("g")["g"]
        assert list(committed) == [KafkaTopicPartition("subscribed", 0)]
        consumer.close()

        results(admin.delete_consumer_groups(["g"]))
        with pytest.raises(KafkaException) as refused:
            results(admin.delete_consumer_groups(["g"]))
        assert refused.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND
        kafka_admin.close()
    with Broker(log_dir, properties=SETTINGS) as broker:      # the tombstones were written
        assert "g" not in broker.coordinator.groups
        kafka_admin = kafka_python_admin(broker)
        assert GroupIdNotFoundError.__name__ in kafka_admin.delete_groups(["g"])["g"]
        kafka_admin.close()


def test_transactional_producers_start_and_a_second_one_fences_the_first(broker):
    """InitProducerId with a transactional id, from each client: the same id again bumps the epoch."""
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "tx"})
    producer.init_transactions(TIMEOUT)
    first = broker.transactions._peek("tx")
    assert first.producer_epoch == 0
    kafka_producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, transactional_id="tx",
                                   max_block_ms=TIMEOUT * 1000)
    kafka_producer.init_transactions()
    assert (broker.transactions._peek("tx").producer_id, broker.transactions._peek("tx").producer_epoch) == (
        first.producer_id, 1)
    kafka_producer.close()
    producer.flush(0)

    from aiokafka import AIOKafkaProducer

    async def start_transactional():
        aio = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, transactional_id="tx3")
        try:
            await asyncio.wait_for(aio.start(), TIMEOUT)
        finally:
            await aio.stop()
    asyncio.run(start_transactional())
    assert broker.transactions._peek("tx3").producer_epoch == 0


def idempotent_batch(producer_id, sequence):
    builder = RecordsBuilder(2, "none", producer_id=producer_id, producer_epoch=0, base_sequence=sequence)
    builder.append(b"sequence %d" % sequence, timestamp=int(time.time() * 1000))
    return builder.build()


def test_an_expired_producer_is_kept_until_the_periodic_check(tmp_path):
    """producer.id.expiration.ms of 1 ms: Kafka still recognises a retried batch and checks sequences
    until its next removeExpiredProducers, producer.id.expiration.check.interval.ms later."""
    settings = {**SETTINGS, "producer.id.expiration.ms": 1, "producer.id.expiration.check.interval.ms": 3_600_000}
    with Broker(tmp_path / "logs", properties=settings) as broker, RawConnection(broker.bootstrap_servers) as raw:
        broker.logs.create_topic("e", 1)
        first = produce_raw(raw, "e", idempotent_batch(9, 0))
        retried = produce_raw(raw, "e", idempotent_batch(9, 0))
        assert (first.error_code, retried.error_code, retried.base_offset) == (NONE, NONE, first.base_offset)
        assert produce_raw(raw, "e", idempotent_batch(9, 5)).error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert broker.logs.get_partition("e", 0).log_end_offset == 1


def test_the_broker_forgets_expired_producers_every_check_interval(tmp_path):
    settings = {**SETTINGS, "producer.id.expiration.ms": 1, "producer.id.expiration.check.interval.ms": 20}
    with Broker(tmp_path / "logs", properties=settings) as broker, RawConnection(broker.bootstrap_servers) as raw:
        broker.logs.create_topic("e", 1)
        assert produce_raw(raw, "e", idempotent_batch(9, 0)).error_code == NONE
        # once a check ran, the producer is unknown and may start at any sequence
        wait_for(lambda: produce_raw(raw, "e", idempotent_batch(9, 5)).error_code == NONE,
                 "the producer's expiry at a periodic check")


def test_every_advertised_api_is_answered_at_its_newest_version(broker):
    """ApiVersions advertises only what is served: an empty request of each advertised API at its newest
    version is answered (with an error code when it names nothing), never a closed connection."""
    from kmem.protocol import ApiKey, decode_response, encode_request, message_class

    with RawConnection(broker.bootstrap_servers) as raw:
        raw.send_frame(encode_request(message_class(ApiKey.API_VERSIONS, "Request")(), 0, 1))
        _, versions = decode_response(raw.receive_frame(), ApiKey.API_VERSIONS, 0)
        advertised = {k.api_key: k.max_version for k in versions.api_keys}
        assert {ApiKey.CREATE_PARTITIONS, ApiKey.DESCRIBE_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS,
                ApiKey.DELETE_RECORDS, ApiKey.DESCRIBE_CLUSTER, ApiKey.DELETE_GROUPS} <= set(advertised)
        for correlation_id, (api_key, version) in enumerate(sorted(advertised.items()), 2):
            request = message_class(ApiKey(api_key), "Request")()
            if api_key == ApiKey.PRODUCE:
                request.acks = 1                 # acks=0 is never answered
            raw.send_frame(bytes(encode_request(request, version, correlation_id)))
            payload = raw.receive_frame()
            assert payload is not None, f"{ApiKey(api_key).name} v{version}: the broker closed the connection"
            header, _ = decode_response(payload, ApiKey(api_key), version)
            assert header.correlation_id == correlation_id


@pytest.mark.parametrize("topic_codec, producer_codec, stored_codec", [
    ("lz4", "gzip", 3), ("uncompressed", "snappy", 0), ("zstd", "none", 4), ("producer", "gzip", 1)])
def test_topic_compression_type_recompresses_what_producers_send(broker, topic_codec, producer_codec, stored_codec):
    """Kafka's LogValidator rebuilds a batch in the topic's codec: the records, headers, timestamps and
    the idempotent producer's fields survive, and consumers read the same records."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    results(admin.create_topics([ConfluentNewTopic("z", 1, 1, config={"compression.type": topic_codec})]))
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "enable.idempotence": True,
                         "compression.type": producer_codec, "linger.ms": 50})
    sent = [(None if i % 3 == 0 else b"key-%d" % i, None if i % 5 == 1 else b"value %d " % i + b"." * 100,
             [("h", b"%d" % i), ("null", None)], 1_700_000_000_000 + i) for i in range(20)]
    delivered = []
    for key, value, headers, timestamp in sent:
        producer.produce("z", value, key, partition=0, headers=headers, timestamp=timestamp,
                         on_delivery=lambda error, message: delivered.append(error))
    producer.flush(TIMEOUT)
    assert delivered == [None] * len(sent)

    stored = stored_batches(broker.log_dir, "z", 0)
    assert {compression for _, _, compression, _ in stored} == {stored_codec}
    assert all(producer_id >= 0 for _, producer_id, _, _ in stored)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                             consumer_timeout_ms=TIMEOUT * 1000)
    consumer.assign([KafkaTopicPartition("z", 0)])
    received = []
    for record in consumer:
        received.append((record.key, record.value, [(k, v) for k, v in record.headers], record.timestamp))
        if len(received) == len(sent):
            break
    consumer.close()
    assert received == sent


def test_admin_requests_kafka_refuses_are_refused_with_its_error_codes(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    broker.logs.create_topic("r", 1)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id="g")
    consumer.commit({KafkaTopicPartition("r", 0): OffsetAndMetadata(0, "", -1)})
    consumer.close()

    def error_of(future):
        with pytest.raises(KafkaException) as refused:
            future.result(timeout=TIMEOUT)
        return refused.value.args[0].code()

    assert error_of(admin.create_partitions([NewPartitions("__consumer_offsets", 10)])["__consumer_offsets"]) == \
        KafkaError.INVALID_REQUEST
    assert error_of(admin.create_partitions([NewPartitions("r", 2, replica_assignment=[[broker.node_id + 1]])])["r"]) \
        == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert error_of(admin.create_partitions([NewPartitions("nope", 2)])["nope"]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    results(admin.create_partitions([NewPartitions("r", 3)], validate_only=True))
    assert broker.logs.topics()["r"].partitions == 1

    unknown = ConfigResource("topic", "nope")
    assert error_of(admin.describe_configs([unknown])[unknown]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    # (librdkafka sends a broker's resource to that broker: a raw request asks this one for another)
    from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse
    resource = DescribeConfigsRequest.DescribeConfigsResource(resource_type=4, resource_name=str(broker.node_id + 1),
                                                               configuration_keys=None)
    with RawConnection(broker.bootstrap_servers) as raw:
        answer = raw.request(DescribeConfigsRequest(resources=[resource], include_synonyms=False),
                             DescribeConfigsResponse, 4)
    assert answer.results[0].error_code == KafkaError.INVALID_REQUEST
    this_broker = ConfigResource("broker", str(broker.node_id), incremental_configs=[
        ConfigEntry("num.partitions", "3", incremental_operation=AlterConfigOpType.SET)])
    assert error_of(admin.incremental_alter_configs([this_broker])[this_broker]) == KafkaError.INVALID_REQUEST
    entries = results(admin.describe_configs([ConfigResource("broker", str(broker.node_id))]))
    assert next(iter(entries.values()))["num.partitions"].value == "1"
    unknown_policy = ConfigResource("topic", "r", incremental_configs=[
        ConfigEntry("cleanup.policy", "shred", incremental_operation=AlterConfigOpType.SET)])
    assert error_of(admin.incremental_alter_configs([unknown_policy])[unknown_policy]) == KafkaError.INVALID_CONFIG


# Kafka 3.9 without an authorizer answers every operation AclEntry.supportedOperations lists (KIP-430)
TOPIC_OPERATIONS = {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
CLUSTER_OPERATIONS = {"CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
                      "IDEMPOTENT_WRITE"}
GROUP_OPERATIONS = {"READ", "DESCRIBE", "DELETE"}


def operation_names(operations):
    return None if operations is None else {operation.name for operation in operations}


def test_confluent_kafka_admin_gets_the_authorized_operations_only_when_asked(broker):
    from confluent_kafka import TopicCollection

    broker.logs.create_topic("ops", 1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "ops-group"})
    consumer.subscribe(["ops"])
    wait_for(lambda: consumer.poll(0.1) is None and consumer.assignment(), "the consumer's assignment")
    try:
        asked = admin.describe_topics(TopicCollection(["ops"]), include_authorized_operations=True)["ops"]
        assert operation_names(asked.result(timeout=TIMEOUT).authorized_operations) == TOPIC_OPERATIONS
        not_asked = admin.describe_topics(TopicCollection(["ops"]))["ops"]
        assert not_asked.result(timeout=TIMEOUT).authorized_operations is None

        asked = admin.describe_cluster(include_authorized_operations=True)
        assert operation_names(asked.result(timeout=TIMEOUT).authorized_operations) == CLUSTER_OPERATIONS
        assert admin.describe_cluster().result(timeout=TIMEOUT).authorized_operations is None

        # a group nobody knows is described as Dead without an error, so it gets them too, as in Kafka
        asked = results(admin.describe_consumer_groups(["ops-group", "no-group"], include_authorized_operations=True))
        assert {group: operation_names(d.authorized_operations) for group, d in asked.items()} == \
            {"ops-group": GROUP_OPERATIONS, "no-group": GROUP_OPERATIONS}
        not_asked = results(admin.describe_consumer_groups(["ops-group"]))["ops-group"]
        assert not_asked.authorized_operations is None
    finally:
        consumer.close()


def code_names(codes):            # kafka-python decodes a bit field to its set bits, the default to None
    from confluent_kafka.admin import AclOperation

    return None if codes is None else operation_names(AclOperation(code) for code in codes)


@pytest.mark.parametrize("version", [8, 10, 12])
def test_metadata_answers_cluster_operations_to_v8_to_10_and_topic_operations_from_v8(broker, version):
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    broker.logs.create_topic("ops", 1)
    topics = [MetadataRequest.MetadataRequestTopic(name=name) for name in ("ops", "missing")]
    with RawConnection(broker.bootstrap_servers) as raw:
        asked = raw.request(MetadataRequest(topics=topics, allow_auto_topic_creation=False,
                                            include_cluster_authorized_operations=True,
                                            include_topic_authorized_operations=True), MetadataResponse, version)
        not_asked = raw.request(MetadataRequest(topics=topics, allow_auto_topic_creation=False), MetadataResponse,
                                version, correlation_id=2)
    # Kafka answers the operations of a topic that does not exist too (it asks the authorizer by name),
    # but not of an unknown topic id
    assert {t.name: code_names(t.authorized_operations) for t in asked.topics} == \
        {"ops": TOPIC_OPERATIONS, "missing": TOPIC_OPERATIONS}
    assert [t.authorized_operations for t in not_asked.topics] == [None, None]
    if version >= 12:               # topic ids are served from v12, as in Kafka
        unknown_id = MetadataRequest.MetadataRequestTopic(name=None, topic_id=uuid.uuid4())
        with RawConnection(broker.bootstrap_servers) as raw:
            by_id = raw.request(MetadataRequest(topics=[unknown_id], allow_auto_topic_creation=False,
                                                include_topic_authorized_operations=True), MetadataResponse, version)
        assert [(t.error_code, t.authorized_operations) for t in by_id.topics] == [(KafkaError.UNKNOWN_TOPIC_ID, None)]
    if version <= 10:               # Metadata v11 dropped the cluster's field (KIP-700 moved it to DescribeCluster)
        assert code_names(asked.authorized_operations) == CLUSTER_OPERATIONS
        assert not_asked.authorized_operations is None


@pytest.mark.parametrize("version", [0, 1])
def test_describe_cluster_answers_the_cluster_operations_when_asked(broker, version):
    from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

    with RawConnection(broker.bootstrap_servers) as raw:
        asked = raw.request(DescribeClusterRequest(include_cluster_authorized_operations=True),
                            DescribeClusterResponse, version)
        not_asked = raw.request(DescribeClusterRequest(include_cluster_authorized_operations=False),
                                DescribeClusterResponse, version, correlation_id=2)
    assert (asked.error_code, code_names(asked.authorized_operations)) == (NONE, CLUSTER_OPERATIONS)
    assert (not_asked.error_code, not_asked.authorized_operations) == (NONE, None)


@pytest.mark.parametrize("endpoint_type,error", [(1, NONE), (2, 114), (3, 115)],
                         ids=["brokers", "controllers: MISMATCHED_ENDPOINT_TYPE", "unknown: UNSUPPORTED_ENDPOINT_TYPE"])
def test_describe_cluster_answers_an_endpoint_type_as_a_broker_listener_does(broker, endpoint_type, error):
    from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse

    with RawConnection(broker.bootstrap_servers) as raw:
        answer = raw.request(DescribeClusterRequest(endpoint_type=endpoint_type), DescribeClusterResponse, 1)
    assert answer.error_code == error
    assert (len(answer.brokers) == 1) == (error == NONE)
