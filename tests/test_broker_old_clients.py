"""Old clients, the ones KIP-283 serves, forced on kafka-python and librdkafka: they produce (magic 0/1
message sets, which the broker stores as magic 2) and consume. Every client also decodes magic 2 from
any Fetch version, so a raw Fetch at v0-v3 checks what the broker actually serves: magic 0 for v0-1,
magic 1 for v2-3 (lazily down-converted), magic 2 as stored from v4."""
import pytest

from broker_helpers import RawConnection, entry_magics, fetch_raw, stored_batches, wait_for
from kmem.broker import Broker

COUNT = 20


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(tmp_path_factory.mktemp("old") / "logs") as running:
        yield running


def values(tag):
    return [f"{tag}-{i}".encode() for i in range(COUNT)]


PRODUCE, FETCH = 0, 1


def versions_used(broker, before, api_key):
    return {version for (key, version), count in broker.requests_served.items()
            if key == api_key and count > before.get((key, version), 0)}


def check_stored(broker, topic):
    batches = stored_batches(broker.log_dir, topic, 0)
    assert {magic for magic, *_ in batches} == {2}        # up-converted as Kafka 3.x stores them
    assert sorted(v for *_, batch_values in batches for v in batch_values) == sorted(values(topic))


@pytest.mark.parametrize("api_version, produce_version, fetch_version",
                         [((0, 10, 1), 2, 3), ((0, 10), 2, 2), ((0, 9), 1, 1), ((0, 8, 2), 0, 0)],
                         ids=["0.10.1", "0.10", "0.9", "0.8.2"])
def test_kafka_python_old_versions_produce_and_consume(broker, api_version, produce_version, fetch_version):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    before = dict(broker.requests_served)
    topic = "kp-" + "-".join(map(str, api_version))
    broker.logs.create_topic(topic)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, api_version=api_version,
                             enable_idempotence=False, compression_type="gzip")
    for value in values(topic):
        producer.send(topic, value, partition=0)
    producer.flush()
    producer.close()
    check_stored(broker, topic)

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, api_version=api_version,
                             auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
    consumer.assign([TopicPartition(topic, 0)])
    received = []

    def poll():
        for records in consumer.poll(200).values():
            received.extend(r.value for r in records)
        return len(received) >= COUNT
    wait_for(poll, f"kafka-python {api_version} to consume")
    consumer.close()
    assert received == values(topic)
    assert versions_used(broker, before, PRODUCE) == {produce_version}
    assert versions_used(broker, before, FETCH) == {fetch_version}


@pytest.mark.parametrize("fallback, produce_version, fetch_version", [("0.9.0", 1, 1), ("0.8.2", 0, 0)])
def test_librdkafka_without_api_version_request_produces_and_consumes(broker, fallback, produce_version,
                                                                       fetch_version):
    import confluent_kafka

    before = dict(broker.requests_served)
    topic = "rd-" + fallback.replace(".", "-")
    broker.logs.create_topic(topic)
    old = {"bootstrap.servers": broker.bootstrap_servers, "api.version.request": False,
           "broker.version.fallback": fallback}
    producer = confluent_kafka.Producer(dict(old, **{"compression.codec": "snappy"}))
    for value in values(topic):
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    check_stored(broker, topic)

    consumer = confluent_kafka.Consumer(dict(old, **{"group.id": "unused", "enable.auto.commit": False}))
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
    received = []

    def poll():
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            received.append(message.value())
        return len(received) >= COUNT
    wait_for(poll, f"librdkafka (fallback {fallback}) to consume")
    consumer.close()
    assert received == values(topic)
    assert versions_used(broker, before, PRODUCE) == {produce_version}
    assert versions_used(broker, before, FETCH) == {fetch_version}


@pytest.mark.parametrize("version, magic", [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (11, 2)])
def test_raw_fetch_gets_the_magic_of_its_version(broker, version, magic):
    from kafka import KafkaProducer

    topic = "raw-magic"
    if "raw-magic" not in broker.logs.topics():
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=50)
        for value in values(topic):
            producer.send(topic, value, partition=0)
        producer.flush()
        producer.close()
    with RawConnection(broker.bootstrap_servers) as connection:
        data = fetch_raw(connection, topic, version, offset=3)
    assert data.error_code == 0
    magics = entry_magics(data.records)
    assert magics and set(magics) == {magic}
    if magic < 2:          # uncompressed batches lose the records before the fetch offset when converted
        assert len(magics) == COUNT - 3
