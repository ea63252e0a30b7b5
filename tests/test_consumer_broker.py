"""kmem.consumer against ``kmem broker`` (kmem.broker.Broker), written by kafka-python: every record once
and in order, every codec, the KIP-81 bound with a backlog over 16 partitions, and a group whose
committed offsets a second member resumes from."""
import kafka
import pytest

from consumer_helpers import consume, read_slowly
from kmem.broker import Broker
from kmem.consumer import Consumer


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with Broker(str(tmp_path_factory.mktemp("logs")), port=0, num_partitions=16) as running:
        yield running


def produce(broker, topic, values, partitions, **config):
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap_servers, **config)
    for i, value in enumerate(values):
        producer.send(topic, value, key=b"%d" % i, partition=i % partitions)
    producer.flush()
    producer.close()


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
    records, peak = read_slowly(consumer, total)
    consumer.close()
    assert len({(r.partition, r.offset) for r in records}) == len(records) == total
    assert buffer_memory // 2 <= peak <= buffer_memory + (256 << 10) + (64 << 10)
    assert consumer.pool.outstanding_bytes == 0


def test_group_members_resume_at_the_committed_offsets(broker):
    topic, total = "grouped", 600
    produce(broker, topic, [b"g%d" % i for i in range(total)], 16)
    settings = dict(group_id="kmem-group", auto_offset_reset="earliest", enable_auto_commit=False,
                    buffer_memory=1 << 20, fetch_max_bytes=512 << 10, max_poll_records=50)
    with Consumer(broker.bootstrap_servers, **settings) as first:
        first.subscribe([topic])
        head = consume(first, 200)
        first.commit()
        committed = {tp: first.position(tp) for tp in {(r.topic, r.partition) for r in head}}
    with Consumer(broker.bootstrap_servers, **settings) as second:
        second.subscribe([topic])
        rest = consume(second, total - sum(committed.values()))
        assert second.poll(200) == []
    # the second member starts exactly where the first committed: nothing read twice, nothing skipped
    seen = [(r.partition, r.offset) for r in head if r.offset < committed[(r.topic, r.partition)]]
    seen += [(r.partition, r.offset) for r in rest]
    assert sorted(seen) == sorted((i % 16, i // 16) for i in range(total))
