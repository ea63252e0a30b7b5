"""Topic configs as Kafka 3.9's ``LogConfig`` defines them: every one is accepted, with Kafka's types,
ranges and valid values (what Kafka refuses is INVALID_CONFIG), kept, and described with Kafka's defaults,
types, synonyms and, when asked, documentation; KIP-937's timestamp bounds are enforced on produce."""
import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import KafkaProducer
from kafka.errors import InvalidTimestampError
from kafka.protocol.admin import (
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
)

from broker_helpers import TIMEOUT, RawConnection
from kmem.broker import Broker, BrokerConfig, ErrorCode, LogManager
from kmem.errors import ConfigError
from kmem.records import RecordsBuilder

SETTINGS = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 3}
TOPIC, BROKER = 2, 4                               # ConfigResource types
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG, STATIC_BROKER_CONFIG = 1, 5, 4
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
INT64_MAX = 2**63 - 1
HOUR_MS = 3_600_000

# Kafka 3.9's LogConfig: name -> (ConfigDef type, default, broker synonym or None)
KAFKA_TOPIC_CONFIGS = {
    "cleanup.policy": (LIST, "delete", "log.cleanup.policy"),
    "compression.gzip.level": (INT, "-1", "compression.gzip.level"),
    "compression.lz4.level": (INT, "9", "compression.lz4.level"),
    "compression.type": (STRING, "producer", "compression.type"),
    "compression.zstd.level": (INT, "3", "compression.zstd.level"),
    "delete.retention.ms": (LONG, "86400000", "log.cleaner.delete.retention.ms"),
    "file.delete.delay.ms": (LONG, "60000", "log.segment.delete.delay.ms"),
    "flush.messages": (LONG, str(INT64_MAX), "log.flush.interval.messages"),
    "flush.ms": (LONG, str(INT64_MAX), "log.flush.interval.ms"),
    "follower.replication.throttled.replicas": (LIST, "", None),
    "index.interval.bytes": (INT, "4096", "log.index.interval.bytes"),
    "leader.replication.throttled.replicas": (LIST, "", None),
    "local.retention.bytes": (LONG, "-2", "log.local.retention.bytes"),
    "local.retention.ms": (LONG, "-2", "log.local.retention.ms"),
    "max.compaction.lag.ms": (LONG, str(INT64_MAX), "log.cleaner.max.compaction.lag.ms"),
    "max.message.bytes": (INT, "1048588", "message.max.bytes"),
    "message.downconversion.enable": (BOOLEAN, "true", "log.message.downconversion.enable"),
    "message.format.version": (STRING, "3.0-IV1", "log.message.format.version"),
    "message.timestamp.after.max.ms": (LONG, str(INT64_MAX), "log.message.timestamp.after.max.ms"),
    "message.timestamp.before.max.ms": (LONG, str(INT64_MAX), "log.message.timestamp.before.max.ms"),
    "message.timestamp.difference.max.ms": (LONG, str(INT64_MAX), "log.message.timestamp.difference.max.ms"),
    "message.timestamp.type": (STRING, "CreateTime", "log.message.timestamp.type"),
    "min.cleanable.dirty.ratio": (DOUBLE, "0.5", "log.cleaner.min.cleanable.ratio"),
    "min.compaction.lag.ms": (LONG, "0", "log.cleaner.min.compaction.lag.ms"),
    "min.insync.replicas": (INT, "1", "min.insync.replicas"),
    "preallocate": (BOOLEAN, "false", "log.preallocate"),
    "remote.log.copy.disable": (BOOLEAN, "false", None),
    "remote.log.delete.on.disable": (BOOLEAN, "false", None),
    "remote.storage.enable": (BOOLEAN, "false", None),
    "retention.bytes": (LONG, "-1", "log.retention.bytes"),
    "retention.ms": (LONG, "604800000", "log.retention.ms"),
    "segment.bytes": (INT, "1073741824", "log.segment.bytes"),
    "segment.index.bytes": (INT, "10485760", "log.index.size.max.bytes"),
    "segment.jitter.ms": (LONG, "0", "log.roll.jitter.ms"),
    "segment.ms": (LONG, "604800000", "log.roll.ms"),
    "unclean.leader.election.enable": (BOOLEAN, "false", "unclean.leader.election.enable"),
}


def text(value):
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs", properties=SETTINGS) as running:
        yield running


def describe(broker, resource_type, name, documentation=True):
    resource = DescribeConfigsRequest.DescribeConfigsResource(resource_type=resource_type, resource_name=name,
                                                               configuration_keys=None)
    with RawConnection(broker.bootstrap_servers) as raw:
        answer = raw.request(DescribeConfigsRequest(resources=[resource], include_synonyms=True,
                                                    include_documentation=documentation),
                             DescribeConfigsResponse, 4)
    [result] = answer.results
    assert result.error_code == ErrorCode.NONE
    return {c.name: c for c in result.configs}


def alter(broker, name, configs, version=1):
    """AlterConfigs (the topic's overrides replaced as a whole); returns the error code and message."""
    Resource = AlterConfigsRequest.AlterConfigsResource
    request = AlterConfigsRequest(validate_only=False, resources=[Resource(
        resource_type=TOPIC, resource_name=name,
        configs=[Resource.AlterableConfig(name=k, value=v) for k, v in configs.items()])])
    with RawConnection(broker.bootstrap_servers) as raw:
        [result] = raw.request(request, AlterConfigsResponse, version).responses
    return result.error_code, result.error_message


# --- names, values and defaults ---------------------------------------------------------------------------

def test_every_kafka_topic_config_is_known_with_kafkas_default():
    defaults = BrokerConfig().topic_config().properties()
    assert {name: text(value) for name, value in defaults.items()} == \
        {name: default for name, (_, default, _) in KAFKA_TOPIC_CONFIGS.items()}


@pytest.mark.parametrize("name, value, effective", [
    ("delete.retention.ms", "1000", 1000),
    ("min.compaction.lag.ms", "5", 5),
    ("max.compaction.lag.ms", "1", 1),
    ("min.cleanable.dirty.ratio", " 0.25 ", 0.25),
    ("min.cleanable.dirty.ratio", "1", 1.0),
    ("file.delete.delay.ms", "0", 0),
    ("flush.messages", "1", 1),
    ("flush.ms", "0", 0),
    ("preallocate", "TRUE", True),
    ("unclean.leader.election.enable", "true", True),
    ("message.format.version", "0.10.0.0", "0.10.0.0"),       # deprecated, ignored, but a version Kafka reads
    ("message.format.version", "2.8.1", "2.8.1"),
    ("message.format.version", "3.0-IV1", "3.0-IV1"),
    ("message.format.version", "0.10.1-IV2", "0.10.1-IV2"),
    ("message.timestamp.before.max.ms", "0", 0),
    ("message.timestamp.after.max.ms", "3600000", 3_600_000),
    ("message.timestamp.difference.max.ms", "60000", 60_000),
    ("message.timestamp.type", " LogAppendTime ", "LogAppendTime"),
    ("compression.gzip.level", "-1", -1),
    ("compression.gzip.level", "9", 9),
    ("compression.lz4.level", "17", 17),
    ("compression.zstd.level", "-131072", -131072),
    ("compression.zstd.level", "22", 22),
    ("leader.replication.throttled.replicas", "*", "*"),
    ("follower.replication.throttled.replicas", "0:1 , 1:1", "0:1,1:1"),
    ("remote.storage.enable", "false", False),
    ("remote.log.copy.disable", "true", True),
    ("remote.log.delete.on.disable", "true", True),
    ("local.retention.ms", "-2", -2),
    ("local.retention.bytes", "1000", 1000),
    ("cleanup.policy", " delete ", "delete"),
    ("segment.ms", "+100", 100),
])
def test_kafkas_topic_configs_are_accepted(name, value, effective):
    assert BrokerConfig().topic_config({name: value}).properties()[name] == effective


@pytest.mark.parametrize("configs", [
    {"delete.retention.ms": "-1"}, {"min.compaction.lag.ms": "-1"}, {"max.compaction.lag.ms": "0"},
    {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},         # Kafka's validateValues
    {"min.cleanable.dirty.ratio": "1.5"}, {"min.cleanable.dirty.ratio": "half"},
    {"min.cleanable.dirty.ratio": "nan"}, {"file.delete.delay.ms": "-1"}, {"flush.messages": "0"},
    {"flush.ms": "-1"}, {"preallocate": "yes"}, {"unclean.leader.election.enable": "1"},
    {"message.format.version": "0.7"}, {"message.format.version": "4.0"}, {"message.format.version": "3.10"},
    {"message.format.version": "latest"}, {"message.timestamp.before.max.ms": "-1"},
    {"message.timestamp.after.max.ms": "1.5"}, {"message.timestamp.difference.max.ms": "-1"},
    {"message.timestamp.type": "createtime"}, {"compression.gzip.level": "0"}, {"compression.gzip.level": "10"},
    {"compression.lz4.level": "0"}, {"compression.lz4.level": "18"}, {"compression.zstd.level": "23"},
    {"compression.zstd.level": "-131073"}, {"leader.replication.throttled.replicas": "0-1"},
    {"follower.replication.throttled.replicas": "*,0:1"}, {"remote.storage.enable": "true"},
    {"local.retention.ms": "-3"}, {"local.retention.bytes": "x"}, {"remote.log.copy.disable": "no"},
    {"cleanup.policy": "compaction"}, {"cleanup.policy": "delete,forever"}, {"cleanup.policy": ""},
    {"cleanup.policy": "delete,,delete"}, {"segment.ms": "1_000"}, {"retention.ms": "1e3"},
    {"no.such.config": "1"}, {"Retention.ms": "1000"},
])
def test_values_kafka_refuses_are_refused_naming_the_config(configs):
    with pytest.raises(ConfigError) as refused:
        BrokerConfig().topic_config(configs)
    assert any(name in str(refused.value) for name in configs)


# --- on the wire ------------------------------------------------------------------------------------------

def test_create_topics_and_alter_configs_accept_kafkas_configs_and_describe_them(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    created = admin.create_topics([NewTopic("t", 1, 1, config={
        "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.1", "cleanup.policy": "delete"})])
    created["t"].result(timeout=TIMEOUT)
    assert broker.logs.topics()["t"].configs == {
        "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.1", "cleanup.policy": "delete"}
    refused = admin.create_topics([NewTopic("u", 1, 1, config={"delete.retention.ms": "-5"})])["u"]
    with pytest.raises(KafkaException) as raised:
        refused.result(timeout=TIMEOUT)
    assert raised.value.args[0].code() == ErrorCode.INVALID_CONFIG and "u" not in broker.logs.topics()

    assert alter(broker, "t", {"message.format.version": "0.10.0.0", "retention.ms": "60000"}) == (ErrorCode.NONE,
                                                                                                    None)
    assert broker.logs.topics()["t"].configs == {"message.format.version": "0.10.0.0", "retention.ms": "60000"}
    code, message = alter(broker, "t", {"delete.retention.ms": "1000", "cleanup.policy": "compacted"})
    assert code == ErrorCode.INVALID_CONFIG and "cleanup.policy" in message
    code, message = alter(broker, "t", {"delete.retention.msec": "1000"})
    assert code == ErrorCode.INVALID_CONFIG and "delete.retention.msec" in message
    assert broker.logs.topics()["t"].configs == {"message.format.version": "0.10.0.0", "retention.ms": "60000"}

    topic = ConfigResource("topic", "t", incremental_configs=[
        ConfigEntry("follower.replication.throttled.replicas", "0:1", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("preallocate", "true", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([topic])[topic].result(timeout=TIMEOUT)
    entries = admin.describe_configs([ConfigResource("topic", "t")])
    described = next(iter(entries.values())).result(timeout=TIMEOUT)
    assert {name: (e.value, e.source) for name, e in described.items() if e.source == DYNAMIC_TOPIC_CONFIG} == {
        "message.format.version": ("0.10.0.0", 1), "retention.ms": ("60000", 1),
        "follower.replication.throttled.replicas": ("0:1", 1), "preallocate": ("true", 1)}
    assert set(described) == set(KAFKA_TOPIC_CONFIGS)


def test_describe_configs_gives_kafkas_types_synonyms_and_documentation(broker):
    broker.logs.create_topic("t", 1, {"delete.retention.ms": "1000", "remote.log.copy.disable": "true"})
    described = describe(broker, TOPIC, "t")
    assert set(described) == set(KAFKA_TOPIC_CONFIGS)
    for name, (config_type, default, synonym) in KAFKA_TOPIC_CONFIGS.items():
        entry = described[name]
        assert entry.config_type == config_type, name
        assert entry.documentation and len(entry.documentation) > 40, name
        synonyms = [(s.name, s.value, s.source) for s in entry.synonyms]
        defaults = [(synonym, default, DEFAULT_CONFIG)] if synonym else []
        if name in ("delete.retention.ms", "remote.log.copy.disable"):
            assert entry.config_source == DYNAMIC_TOPIC_CONFIG
            assert synonyms == [(name, entry.value, DYNAMIC_TOPIC_CONFIG)] + defaults, name
        else:
            assert (entry.config_source, entry.value, synonyms) == (DEFAULT_CONFIG, default, defaults), name
    assert "tombstone" in described["delete.retention.ms"].documentation
    assert "tiered storage" in described["remote.log.copy.disable"].documentation

    assert all(c.documentation is None for c in describe(broker, TOPIC, "t", documentation=False).values())
    brokers = describe(broker, BROKER, str(broker.node_id))
    assert brokers["num.partitions"].config_type == INT and brokers["log.cleanup.policy"].config_type == LIST
    undocumented = [name for name, c in brokers.items() if not c.documentation]
    assert not undocumented and "partitions" in brokers["num.partitions"].documentation


# --- KIP-937: timestamps out of bounds are refused --------------------------------------------------------

NOW = 1_700_000_000_000


def records_at(*timestamps, magic=2):
    builder = RecordsBuilder(magic, "none")
    for timestamp in timestamps:
        builder.append(b"v", timestamp=timestamp)
    return builder.build()


@pytest.mark.parametrize("configs, timestamps, magic, refused", [
    ({"message.timestamp.after.max.ms": "60000"}, [NOW + 60_000], 2, False),
    ({"message.timestamp.after.max.ms": "60000"}, [NOW + 60_001], 2, True),
    ({"message.timestamp.after.max.ms": "60000"}, [NOW, NOW + HOUR_MS], 2, True),     # the batch's largest
    ({"message.timestamp.before.max.ms": "60000"}, [NOW - 60_000], 2, False),
    ({"message.timestamp.before.max.ms": "60000"}, [NOW - 60_001, NOW], 2, True),     # the batch's first
    ({"message.timestamp.before.max.ms": "60000"}, [NOW - HOUR_MS], 1, True),         # a v1 message's own
    ({"message.timestamp.before.max.ms": "0", "message.timestamp.after.max.ms": "0"}, [-1], 2, False),
    ({"message.timestamp.difference.max.ms": "60000"}, [NOW + HOUR_MS], 2, True),     # deprecated, still used
    ({"message.timestamp.difference.max.ms": "60000"}, [NOW - HOUR_MS], 2, True),
    ({"message.timestamp.difference.max.ms": "60000", "message.timestamp.before.max.ms": str(2 * HOUR_MS)},
     [NOW - HOUR_MS], 2, False),                                                     # ... unless overridden
    ({"message.timestamp.after.max.ms": "0", "message.timestamp.type": "LogAppendTime"}, [NOW + HOUR_MS], 2,
     False),
    ({}, [NOW + 100 * 365 * 24 * HOUR_MS], 2, False),
])
def test_timestamps_beyond_the_topics_bounds_are_invalid_timestamp(tmp_path, configs, timestamps, magic, refused):
    with LogManager(tmp_path) as logs:
        logs.create_topic("t", 1, configs)
        result = logs.get_partition("t", 0).append(records_at(*timestamps, magic=magic), now_ms=NOW)
        assert result.error_code == (ErrorCode.INVALID_TIMESTAMP if refused else ErrorCode.NONE)
        assert logs.get_partition("t", 0).log_end_offset == (0 if refused else len(timestamps))


def test_a_producer_with_a_clock_an_hour_ahead_is_refused(broker):
    broker.logs.create_topic("t", 1, {"message.timestamp.after.max.ms": "60000"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, retries=0)
    try:
        now = time.time_ns() // 1_000_000
        assert producer.send("t", b"on time", partition=0, timestamp_ms=now).get(TIMEOUT).offset == 0
        with pytest.raises(InvalidTimestampError):
            producer.send("t", b"from the future", partition=0, timestamp_ms=now + HOUR_MS).get(TIMEOUT)
    finally:
        producer.close()
    assert broker.logs.get_partition("t", 0).log_end_offset == 1
