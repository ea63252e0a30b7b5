"""Log compaction seen by clients: a record without a key to a compacted topic is refused per partition
with INVALID_RECORD as Kafka 3.9 refuses it, and ``cleanup.policy`` changed from ``delete`` to ``compact``
and back with IncrementalAlterConfigs and AlterConfigs, the broker's cleaner thread compacting the topic
meanwhile; a policy Kafka does not know is INVALID_CONFIG."""
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource as PeerConfigResource, ConfigResourceType
from kafka.errors import InvalidRecordError

from broker_helpers import TIMEOUT, consume_to_end, wait_for
from kmem.broker import Broker, ErrorCode

# the cleaner thread looks for work every 10 ms rather than every 15 s, so a test waits for it briefly
SETTINGS = {"group.initial.rebalance.delay.ms": 0, "log.cleaner.backoff.ms": 10}


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "logs", properties=SETTINGS) as running:
        yield running


def produce(broker, records, **config):
    """Produce ``[(partition, key, value)]`` with confluent-kafka; returns each one's delivery report as
    ``(error or None, offset)``, in order."""
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, **config})
    reports = [None] * len(records)

    def deliver(index):
        return lambda error, message: reports.__setitem__(index, (error, message.offset()))
    for index, (partition, key, value) in enumerate(records):
        producer.produce("t", key=key, value=value, partition=partition, on_delivery=deliver(index))
    assert producer.flush(TIMEOUT) == 0
    return reports


def test_a_record_without_a_key_to_a_compacted_topic_is_refused_per_partition(broker):
    broker.logs.create_topic("t", 2, {"cleanup.policy": "compact"})
    # confluent-kafka: the records of one request, linger.ms gathering them; the keyless one fails alone
    reports = produce(broker, [(0, None, b"no key"), (1, b"k", b"v")], **{"linger.ms": 100})
    error, _ = reports[0]
    assert (error.code(), error.retriable(), error.fatal()) == (KafkaError.INVALID_RECORD, False, False)
    assert error.code() == ErrorCode.INVALID_RECORD == 87
    assert reports[1] == (None, 0)

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=100, retries=0)
    try:
        refused = producer.send("t", value=b"no key", partition=0)
        accepted = producer.send("t", key=b"k", value=b"w", partition=1)
        producer.flush(TIMEOUT)
        with pytest.raises(InvalidRecordError) as raised:
            refused.get(TIMEOUT)
        assert raised.value.errno == 87 and "without key" in str(raised.value)
        assert accepted.get(TIMEOUT).offset == 1
    finally:
        producer.close()
    assert [broker.logs.get_partition("t", p).log_end_offset for p in (0, 1)] == [0, 2]


def alter_policy(broker, how, policy):
    """Set the topic's ``cleanup.policy``; returns the error code of the answer."""
    if how == "IncrementalAlterConfigs":
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        topic = ConfigResource("topic", "t", incremental_configs=[
            ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)])
        try:
            admin.incremental_alter_configs([topic])[topic].result(timeout=TIMEOUT)
        except KafkaException as e:
            return e.args[0].code()
        return ErrorCode.NONE
    # kafka-python's admin client sends AlterConfigs (the whole set of the topic's overrides) when told
    # not to use the incremental request, and answers "OK" or the error it maps the code to
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        answers = admin.alter_configs([PeerConfigResource(ConfigResourceType.TOPIC, "t", {
            "cleanup.policy": policy, "segment.bytes": "1024"})], incremental=False)
    finally:
        admin.close()
    answer = answers["topic"]["t"]
    return ErrorCode.NONE if answer == "OK" else next(c for c in ErrorCode if f"[Error {int(c)}]" in answer)


def read_all(broker):
    """``[(offset, key, value)]`` of partition 0 from its start, read with confluent-kafka."""
    return [(offset, key, value) for _, offset, key, value in consume_to_end(broker.bootstrap_servers, "t",
                                                                             **{"fetch.wait.max.ms": 10})]


@pytest.mark.parametrize("how", ["IncrementalAlterConfigs", "AlterConfigs"])
def test_cleanup_policy_from_delete_to_compact_and_back(broker, how):
    broker.logs.create_topic("t", 1, {"cleanup.policy": "delete", "segment.bytes": "1024"})
    partition = broker.logs.get_partition("t", 0)
    updates = [(0, b"key-%d" % (i % 7), b"value-%03d" % i) for i in range(300)]
    updates.insert(100, (0, None, b"written before the topic was compacted"))
    reports = produce(broker, updates, **{"batch.num.messages": 8})
    written = [(offset, key, value) for (_, key, value), (error, offset) in zip(updates, reports) if error is None]
    assert len(written) == len(updates) and read_all(broker) == written

    assert alter_policy(broker, how, "shred") == ErrorCode.INVALID_CONFIG
    assert broker.logs.topics()["t"].configs["cleanup.policy"] == "delete" and not partition.config.compact

    assert alter_policy(broker, how, "compact") == ErrorCode.NONE
    assert broker.logs.topics()["t"].configs["cleanup.policy"] == "compact"
    end = partition.active.base_offset                  # the active segment is never cleaned
    assert end > 0 and len(partition.segments) > 8
    wait_for(lambda: broker.logs.cleaner.first_dirty_offset("t", 0) >= end, "the cleaner to clean the topic")
    latest = {key: (offset, key, value) for offset, key, value in written if offset < end and key is not None}
    assert read_all(broker) == sorted(latest.values()) + [w for w in written if w[0] >= end]
    [(error, _)] = produce(broker, [(0, None, b"no key")])
    assert error.code() == KafkaError.INVALID_RECORD

    assert alter_policy(broker, how, "delete") == ErrorCode.NONE
    assert broker.logs.topics()["t"].configs["cleanup.policy"] == "delete" and not partition.config.compact
    more = produce(broker, [(0, None, b"keyless again")] + [(0, b"key-0", b"%d" % i) for i in range(60)],
                   **{"batch.num.messages": 8})
    assert all(error is None for error, _ in more)
    before = read_all(broker)
    assert partition.active.base_offset > more[0][1]    # the records just written are past the active segment
    while broker.logs.cleaner.clean_filthiest() is not None:    # whatever else is due (nothing of "t")
        pass
    assert broker.logs.cleaner.first_dirty_offset("t", 0) == end and read_all(broker) == before
