"""DescribeLogDirs (every version Kafka 3.9 serves, 0-4) and DescribeTopicPartitions (KIP-966) on the wire, checked
against the partitions' files and Kafka's paging, with their ACL checks; and what Apache's Java AdminClient 3.9.1
(``describeLogDirs``, ``describeTopics``, which pages with DescribeTopicPartitions) and confluent-kafka's AdminClient
get from them."""
import glob
import os
import uuid

import pytest

from broker_helpers import RawConnection
from java_probes import KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256, start_probe, wheel_jar
from kmem.broker import Broker
from kmem.broker.apis.authorized import TOPIC_OPERATIONS
from kmem.broker.codes import ErrorCode
from kmem.broker.log.checkpoints import uuid_bytes
from kmem.broker.security.authorizer import Operation, PatternType, Permission, ResourceType
from kmem.protocol import ApiKey, SUPPORTED_VERSIONS, decode_response, encode_request, message_class
from kmem.records import build_records

ZERO_UUID = uuid.UUID(int=0)


def request_class(api_key):
    return message_class(api_key, "Request")


def call(raw, api_key, version, **fields):
    raw.send_frame(bytes(encode_request(request_class(api_key)(**fields), version, 7, client_id="describe-test")))
    payload = raw.receive_frame()
    assert payload is not None, "the broker closed the connection"
    header, body = decode_response(payload, api_key, version)
    assert header.correlation_id == 7
    return body


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    properties = {"log.segment.bytes": 2048, "max.request.partition.size.limit": 20}
    with Broker(tmp_path_factory.mktemp("describe-logs"), properties=properties) as running:
        logs = running.logs
        logs.create_topic("sizes", 3)
        for index, count in ((0, 40), (1, 1)):          # partition 0 rolls segments, partition 2 stays empty
            for n in range(count):
                logs.get_partition("sizes", index).append(
                    build_records([{"key": b"key-%d" % n, "value": b"value " * 20}]))
        logs.create_topic("wide", 25)
        logs.create_topic("other", 2)
        yield running


@pytest.fixture
def raw(broker):
    with RawConnection(broker.bootstrap_servers) as connection:
        yield connection


def file_sizes(log_dir, topic, partition):
    """What Kafka's ``UnifiedLog.size`` counts: the sizes of the partition's segment files."""
    return sum(os.path.getsize(path) for path in glob.glob(os.path.join(log_dir, f"{topic}-{partition}", "*.log")))


def log_dir_partitions(result):
    return {(topic.name, p.partition_index): p for topic in result.topics for p in topic.partitions}


# --- DescribeLogDirs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(SUPPORTED_VERSIONS[ApiKey.DESCRIBE_LOG_DIRS][1] + 1))
def test_every_version_reports_each_partitions_size_as_its_segment_files(raw, broker, version):
    assert len(glob.glob(os.path.join(broker.log_dir, "sizes-0", "*.log"))) > 1      # several segments counted
    response = call(raw, ApiKey.DESCRIBE_LOG_DIRS, version, topics=None)
    [result] = response.results
    assert result.error_code == ErrorCode.NONE
    assert result.log_dir == os.path.abspath(broker.log_dir)
    partitions = log_dir_partitions(result)
    assert set(partitions) >= {("sizes", i) for i in range(3)} | {("wide", i) for i in range(25)}
    for (topic, index), partition in partitions.items():
        assert partition.partition_size == file_sizes(broker.log_dir, topic, index), (topic, index)
        assert (partition.offset_lag, partition.is_future_key) == (0, False)
    assert partitions[("sizes", 0)].partition_size > partitions[("sizes", 1)].partition_size > 0
    assert partitions[("sizes", 2)].partition_size == 0
    if version >= 4:
        volume = os.statvfs(broker.log_dir)
        assert result.total_bytes == volume.f_blocks * volume.f_frsize
        assert 0 < result.usable_bytes <= result.total_bytes
    else:
        assert (result.total_bytes, result.usable_bytes) == (-1, -1)        # not on the wire before v4


def test_the_topics_filter_answers_only_the_partitions_asked_that_exist(raw, broker):
    Topic = request_class(ApiKey.DESCRIBE_LOG_DIRS).DescribableLogDirTopic
    response = call(raw, ApiKey.DESCRIBE_LOG_DIRS, 4, topics=[
        Topic(topic="sizes", partitions=[0, 2, 99]), Topic(topic="missing", partitions=[0]),
        Topic(topic="other", partitions=[])])
    [result] = response.results
    # as Kafka: no entry for an unknown partition, nor for a topic none of whose partitions is asked
    assert sorted(log_dir_partitions(result)) == [("sizes", 0), ("sizes", 2)]
    assert [topic.name for topic in result.topics] == ["sizes"]
    assert call(raw, ApiKey.DESCRIBE_LOG_DIRS, 4, topics=[]).results[0].topics == []


def test_a_log_dir_that_cannot_be_read_is_a_storage_error(broker, monkeypatch):
    def unreadable(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    monkeypatch.setattr(os, "statvfs", unreadable)
    admin = broker.admin
    response = admin.describe_log_dirs(None, request_class(ApiKey.DESCRIBE_LOG_DIRS)(topics=None))
    [result] = response.results
    assert (result.error_code, result.topics) == (ErrorCode.KAFKA_STORAGE_ERROR, [])
    assert response.error_code == ErrorCode.NONE


def test_both_apis_are_advertised(raw):
    response = call(raw, ApiKey.API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    served = {key.api_key: (key.min_version, key.max_version) for key in response.api_keys}
    assert served[ApiKey.DESCRIBE_LOG_DIRS] == (0, 4)
    assert served[ApiKey.DESCRIBE_TOPIC_PARTITIONS] == (0, 0)


# --- DescribeTopicPartitions ----------------------------------------------------------------------------------

def describe(raw, names, limit=2000, cursor=None):
    Request = request_class(ApiKey.DESCRIBE_TOPIC_PARTITIONS)
    return call(raw, ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, topics=[Request.TopicRequest(name=n) for n in names],
                response_partition_limit=limit,
                cursor=None if cursor is None else Request.Cursor(topic_name=cursor[0], partition_index=cursor[1]))


def pages(raw, names, limit):
    """Every page from the first to the one without a next cursor: [(topic, [partition index...])...] each."""
    walked, cursor = [], None
    for _ in range(100):
        response = describe(raw, names, limit, cursor)
        walked.append([(t.name, [p.partition_index for p in t.partitions]) for t in response.topics])
        if response.next_cursor is None:
            return walked
        cursor = (response.next_cursor.topic_name, response.next_cursor.partition_index)
    raise AssertionError("the cursor never ends")


def test_a_topic_is_described_as_metadata_describes_it(raw, broker):
    response = describe(raw, ["sizes"])
    [topic] = response.topics
    info = broker.logs.topics()["sizes"]
    assert (topic.error_code, topic.name, topic.is_internal) == (ErrorCode.NONE, "sizes", False)
    assert topic.topic_id == uuid.UUID(bytes=uuid_bytes(info.topic_id))
    assert topic.topic_authorized_operations == TOPIC_OPERATIONS
    node = broker.node_id
    assert [(p.partition_index, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes,
             p.eligible_leader_replicas, p.last_known_elr, p.offline_replicas) for p in topic.partitions] == \
        [(i, node, broker.logs.get_partition("sizes", i).leader_epoch, [node], [node], [], [], []) for i in range(3)]
    assert response.next_cursor is None


def test_the_cursor_walks_a_topic_of_many_partitions_in_pages(raw):
    assert pages(raw, ["wide", "other", "sizes"], 10) == [
        [("other", [0, 1]), ("sizes", [0, 1, 2]), ("wide", [0, 1, 2, 3, 4])],
        [("wide", list(range(5, 15)))], [("wide", list(range(15, 25)))]]
    # a page that ends where a topic ends points at the next topic's first partition
    response = describe(raw, ["other", "sizes"], 2)
    assert (response.next_cursor.topic_name, response.next_cursor.partition_index) == ("sizes", 0)
    every = [name for page in pages(raw, [], 7) for name, _ in page]
    assert {"other", "sizes", "wide"} <= set(every) and every == sorted(every)


@pytest.mark.parametrize("limit, described", [(2 ** 31 - 1, 20), (2000, 20), (0, 1), (-5, 1), (3, 3)])
def test_the_partition_limit_is_bounded_by_the_brokers_and_at_least_one(raw, limit, described):
    response = describe(raw, ["wide"], limit)
    [topic] = response.topics
    assert [p.partition_index for p in topic.partitions] == list(range(described))
    assert (response.next_cursor.topic_name, response.next_cursor.partition_index) == ("wide", described)


def test_unknown_topics_invalid_names_and_cursors_get_kafkas_codes(raw):
    response = describe(raw, ["missing", "sizes", "bad/name"])
    assert [(t.name, t.error_code, t.topic_id, t.partitions) for t in response.topics] == [
        ("bad/name", ErrorCode.INVALID_TOPIC_EXCEPTION, ZERO_UUID, []),
        ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ZERO_UUID, []),
        ("sizes", ErrorCode.NONE, response.topics[2].topic_id, response.topics[2].partitions)]
    # a cursor past a topic's end: the topic without partitions, then the rest
    response = describe(raw, ["sizes", "wide"], 2000, ("sizes", 50))
    assert [(t.name, len(t.partitions)) for t in response.topics] == [("sizes", 0), ("wide", 20)]
    # a cursor past every topic: nothing
    assert describe(raw, [], 2000, ("zzz", 0)).topics == []
    # Kafka's InvalidRequestException: every topic named is INVALID_REQUEST
    for cursor in (("other", 0), ("sizes", -1)):
        response = describe(raw, ["sizes", "wide"], 10, cursor)
        assert [(t.name, t.error_code, t.partitions) for t in response.topics] == \
            [("sizes", ErrorCode.INVALID_REQUEST, []), ("wide", ErrorCode.INVALID_REQUEST, [])]
    assert call(raw, ApiKey.METADATA, 12, topics=None).brokers        # the connection is still open


# --- with an authorizer ---------------------------------------------------------------------------------------

USERS = {"alice": "alice-secret", "admin": "admin-secret"}
SECURE = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
          "listener.name.sasl_plaintext.plain.sasl.jaas.config":
              "org.apache.kafka.common.security.plain.PlainLoginModule required " +
              " ".join(f'user_{name}="{password}"' for name, password in USERS.items()) + ";",
          "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
          "super.users": "User:admin"}


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("describe-acls"), properties=SECURE) as running:
        for name, partitions in (("a-denied", 2), ("b-seen", 3), ("c-denied", 1), ("d-seen", 4)):
            running.logs.create_topic(name, partitions)
        yield running


def sasl_connection(bootstrap, user):
    raw = RawConnection(bootstrap)
    assert call(raw, ApiKey.SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code == 0
    assert call(raw, ApiKey.SASL_AUTHENTICATE, 2, auth_bytes=f"\0{user}\0{USERS[user]}".encode()).error_code == 0
    return raw


@pytest.fixture(scope="module")
def alice(secure_broker):
    """alice may DESCRIBE the topics b-seen and d-seen, and nothing on the cluster."""
    admin = sasl_connection(secure_broker.bootstrap_servers, "admin")
    Creation = request_class(ApiKey.CREATE_ACLS).AclCreation
    created = call(admin, ApiKey.CREATE_ACLS, 3, creations=[Creation(
        resource_type=ResourceType.TOPIC, resource_name=name, resource_pattern_type=PatternType.LITERAL,
        principal="User:alice", host="*", operation=Operation.DESCRIBE, permission_type=Permission.ALLOW)
        for name in ("b-seen", "d-seen")])
    assert [r.error_code for r in created.results] == [0, 0]
    admin.close()
    raw = sasl_connection(secure_broker.bootstrap_servers, "alice")
    yield raw
    raw.close()


@pytest.mark.parametrize("version", range(5))
def test_describe_log_dirs_needs_describe_on_the_cluster(alice, version):
    response = call(alice, ApiKey.DESCRIBE_LOG_DIRS, version, topics=None)
    assert response.results == []
    assert response.error_code == (ErrorCode.CLUSTER_AUTHORIZATION_FAILED if version >= 3 else 0)


def test_describe_topic_partitions_filters_by_describe_before_the_limit(alice):
    DESCRIBE_BIT = 1 << Operation.DESCRIBE
    response = describe(alice, [])
    assert [(t.name, t.topic_authorized_operations) for t in response.topics] == \
        [("b-seen", DESCRIBE_BIT), ("d-seen", DESCRIBE_BIT)]
    # denied topics named are TOPIC_AUTHORIZATION_FAILED, with no id, and take no room in a page
    response = describe(alice, ["a-denied", "b-seen", "c-denied", "d-seen"], 4)
    assert [(t.name, t.error_code, t.topic_id, len(t.partitions)) for t in response.topics] == [
        ("b-seen", 0, response.topics[0].topic_id, 3), ("d-seen", 0, response.topics[1].topic_id, 1),
        ("a-denied", ErrorCode.TOPIC_AUTHORIZATION_FAILED, ZERO_UUID, 0),
        ("c-denied", ErrorCode.TOPIC_AUTHORIZATION_FAILED, ZERO_UUID, 0)]
    assert (response.next_cursor.topic_name, response.next_cursor.partition_index) == ("d-seen", 1)
    # a cursor on a denied topic: that topic refused, the later ones from their first partition
    response = describe(alice, ["c-denied", "d-seen"], 10, ("c-denied", 5))
    assert [(t.name, t.error_code, len(t.partitions)) for t in response.topics] == [
        ("d-seen", 0, 4), ("c-denied", ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)]
    # only denied topics, and every topic with the cursor past the allowed ones: nothing described
    assert [(t.name, t.error_code) for t in describe(alice, ["a-denied"]).topics] == \
        [("a-denied", ErrorCode.TOPIC_AUTHORIZATION_FAILED)]
    assert describe(alice, [], 10, ("d-seen0", 0)).topics == []


# --- Apache's Java AdminClient 3.9.1 and confluent-kafka's AdminClient ----------------------------------------

@pytest.fixture(scope="module")
def java_admin(tmp_path_factory):
    """Apache's Java AdminClient (tests/java/KafkaClientProbe.java), skipped without a JDK or the jars."""
    classpath = [wheel_jar(KAFKA_CLIENTS_JAR, KAFKA_CLIENTS_SHA256), wheel_jar("slf4j-api.jar")]
    running = start_probe(tmp_path_factory.mktemp("describe-probe"), "KafkaClientProbe.java", classpath)
    yield running
    running.close()


def test_java_describe_log_dirs_gets_each_replicas_size(broker, java_admin):
    answer = java_admin("log-dirs", broker.bootstrap_servers)
    log_dir = os.path.abspath(broker.log_dir)
    [described] = answer[str(broker.node_id)].items()
    assert described[0] == log_dir
    assert described[1]["error"] is None
    assert 0 < described[1]["usable"] <= described[1]["total"]           # v4: the volume's bytes
    replicas = described[1]["replicas"]
    expected = {f"{topic}-{index}": [file_sizes(log_dir, topic, index), 0, False]
                for topic, index in broker.logs.partitions()}
    assert replicas == expected
    assert replicas["sizes-0"][0] > 0


def test_java_describe_topics_pages_through_describe_topic_partitions(broker, java_admin):
    requests_before = broker.requests_served[(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0)]
    answer = java_admin("describe-topics", broker.bootstrap_servers, 10, "wide", "sizes", "missing")
    # 3 partitions of sizes and 25 of wide, 10 a page: at least 3 requests, and no partition lost or repeated
    assert broker.requests_served[(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0)] - requests_before >= 3
    node = broker.node_id
    for name, count in (("wide", 25), ("sizes", 3)):
        topic = answer[name]
        assert topic["id"] == broker.logs.topics()[name].topic_id        # Kafka's Uuid.toString, as stored
        assert topic["internal"] is False
        assert set(topic["operations"]) == {op.name for op in Operation if TOPIC_OPERATIONS >> op & 1}
        assert topic["partitions"] == [[i, node, [node], [node], [], []] for i in range(count)]
    assert answer["missing"]["error"] == "UnknownTopicOrPartitionException"


def test_confluent_kafka_describe_topics(broker):
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    futures = admin.describe_topics(TopicCollection(["wide", "missing"]), request_timeout=30)
    wide = futures["wide"].result(timeout=30)
    assert [(p.id, p.leader.id, [r.id for r in p.replicas], [r.id for r in p.isr]) for p in wide.partitions] == \
        [(i, broker.node_id, [broker.node_id], [broker.node_id]) for i in range(25)]
    with pytest.raises(Exception) as failure:
        futures["missing"].result(timeout=30)
    assert failure.value.args[0].code() == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
