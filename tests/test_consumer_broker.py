"""kmem.consumer in assign mode against ``kmem broker`` (kmem.broker.Broker), written by kafka-python:
every record once and in order, every codec, the KIP-81 bound with a backlog over 16 partitions.
Group features need a group coordinator, which kmem broker does not serve: they are tested against
librdkafka's mock cluster (test_consumer_group.py)."""
import time

import kafka
import pytest

from kmem.consumer import Consumer

broker_module = pytest.importorskip("kmem.broker")
if not hasattr(broker_module, "Broker"):
    pytest.skip("kmem.broker.Broker is not in this tree", allow_module_level=True)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with broker_module.Broker(str(tmp_path_factory.mktemp("logs")), port=0, num_partitions=16) as running:
        yield running


def produce(broker, topic, values, partitions, **config):
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap_servers, **config)
    for i, value in enumerate(values):
        producer.send(topic, value, key=b"%d" % i, partition=i % partitions)
    producer.flush()
    producer.close()


def consume(consumer, count, timeout=30.0):
    records, deadline = [], time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        records += consumer.poll(100)
    return records


@pytest.mark.parametrize("codec", [None, "gzip", "lz4", "zstd"])
def test_assign_reads_what_kafka_python_wrote(broker, codec):
    topic = f"written-{codec}"
    values = [b"value-%d" % i * (i % 7 + 1) for i in range(2000)]
    produce(broker, topic, values, 16, compression_type=codec)
    with Consumer(broker.bootstrap_servers, auto_offset_reset="earliest", buffer_memory=1 << 20,
                  fetch_max_bytes=512 << 10) as consumer:
        consumer.assign([(topic, p) for p in range(16)])
        records = consume(consumer, len(values))
        assert consumer.poll(100) == []
    assert len(records) == len(values)
    for r in records:
        i = int(r.key)
        assert r.partition == i % 16 and r.value == values[i] and r.offset == i // 16


def test_pool_bound_on_a_backlog(broker):
    topic, total = "backlog", 16 * 400
    produce(broker, topic, [b"b" * 1024] * total, 16)
    buffer_memory = 512 << 10
    consumer = Consumer(broker.bootstrap_servers, auto_offset_reset="earliest", buffer_memory=buffer_memory,
                        fetch_max_bytes=256 << 10, max_poll_records=100)
    consumer.assign([(topic, p) for p in range(16)])
    records, peak = [], 0
    deadline = time.monotonic() + 60
    while len(records) < total and time.monotonic() < deadline:
        batch = consumer.poll(100)
        records += batch
        peak = max(peak, consumer.pool.outstanding_bytes)
        if batch:
            time.sleep(0.002)
    consumer.close()
    assert len({(r.partition, r.offset) for r in records}) == len(records) == total
    assert buffer_memory // 2 <= peak <= buffer_memory + (256 << 10) + (64 << 10)
    assert consumer.pool.outstanding_bytes == 0
